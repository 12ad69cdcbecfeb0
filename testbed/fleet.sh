#!/usr/bin/env bash
# A throw-away Kafka broker (KRaft, one node, from the jars testbed/kafka/fetch.sh fetches) and
# PostgreSQL 15 server (Debian's postgresql, run as the postgres user: needs root) on this
# host, then a telemark command against them; both are stopped at exit.
#
#   sudo bash testbed/fleet.sh sim --hosts 10,100,1000,10000 --collectors 1,3   # docs/scale.md
#   sudo bash testbed/fleet.sh bench-flows --rates 100000                       # docs/flows.md
#
# `sim` is given --brokers and --db, `bench-flows` --postgres; anything else runs as given.
#
# TELEMARK (default target/release/telemark) is the binary run; KAFKA_CPU / PG_CPU pin the
# broker and the server to cores (default: not pinned).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
telemark="${TELEMARK:-$here/../target/release/telemark}"
pgbin=/usr/lib/postgresql/15/bin
[ -x "$pgbin/initdb" ] || { echo "fleet.sh: PostgreSQL 15 is missing (apt-get install postgresql)" >&2; exit 1; }
bash "$here/kafka/fetch.sh"
cmd="${1:?usage: fleet.sh sim|bench-flows|COMMAND [ARGS]}"
shift
dir="$(mktemp -d /tmp/tm-fleet.XXXXXX)"
# The server's socket directory: the postgres user's alone (root's clients get in all the same).
chown postgres "$dir"
chmod 700 "$dir"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
kport=$(free_port); cport=$(free_port); pport=$(free_port)
pin() { if [ -n "${1:-}" ]; then echo "taskset -c $1"; fi; }

cleanup() {
    local rc=$?
    set +e
    if [ -n "${cpid:-}" ]; then kill "$cpid" 2>/dev/null; wait "$cpid" 2>/dev/null; fi
    if [ -n "${kpid:-}" ]; then kill "$kpid" 2>/dev/null; wait "$kpid" 2>/dev/null; fi
    runuser -u postgres -- "$pgbin/pg_ctl" -D "$dir/pg" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    exit "$rc"
}
trap cleanup EXIT
trap "exit 143" INT TERM

# PostgreSQL: its own socket directory and port, no TCP listener.
runuser -u postgres -- "$pgbin/initdb" -D "$dir/pg" -U postgres --auth=trust -E UTF8 \
    --locale=C.UTF-8 >/dev/null
runuser -u postgres -- $(pin "${PG_CPU:-}") "$pgbin/pg_ctl" -D "$dir/pg" -l "$dir/pg.log" -w \
    -o "-k $dir -p $pport -c listen_addresses=''" start >/dev/null
psql -h "$dir" -p "$pport" -U postgres -d postgres -qAt -c 'CREATE DATABASE telemark'

# Kafka.
cat > "$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$kport,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$kport
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/kafka
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
EOF
java_cp=(java -Xmx1g -cp "$here/kafka/libs/*" "-Dlog4j2.configurationFile=$here/kafka/log4j2.properties")
"${java_cp[@]}" kafka.tools.StorageTool format -t tmfleetsimcluster0001 -c "$dir/server.properties" \
    >/dev/null
$(pin "${KAFKA_CPU:-}") "${java_cp[@]}" kafka.Kafka "$dir/server.properties" > "$dir/kafka.log" 2>&1 &
kpid=$!
for i in $(seq 1 120); do
    (exec 3<>"/dev/tcp/127.0.0.1/$kport") 2>/dev/null && break
    if [ "$i" = 120 ] || ! kill -0 "$kpid" 2>/dev/null; then
        echo "fleet.sh: the broker did not come up:" >&2
        tail -20 "$dir/kafka.log" >&2
        exit 1
    fi
    sleep 0.5
done

host=$(printf %s "$dir" | sed 's|/|%2F|g')
url="postgresql://postgres@$host:$pport/telemark"
case "$cmd" in
    sim) "$telemark" sim --brokers "127.0.0.1:$kport" --db "$url" "$@" & ;;
    bench-flows) "$telemark" bench-flows --postgres "$url" "$@" & ;;
    *) "$telemark" "$cmd" "$@" & ;;
esac
cpid=$!
wait "$cpid"
