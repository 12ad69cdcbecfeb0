#!/usr/bin/env bash
# Regenerates docs/eval/kafka-throughput.txt, the figures of docs/kafka.md, "Throughput": a
# one-node Kafka broker (KRaft, the jars of testbed/kafka) pinned to cpu 1, and
# `telemark bench-kafka` pinned to cpu 0; then, as root, the agent's fast-path cost with its
# Kafka export on and off (`telemark bench-live --kafka`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash testbed/kafka/fetch.sh
cargo build --release -q -p telemark
libs=$PWD/testbed/kafka/libs
t=$(mktemp -d)
broker=
cleanup() {
    [ -n "$broker" ] && kill "$broker" 2>/dev/null && wait "$broker" 2>/dev/null
    rm -rf "$t"
}
trap cleanup EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ctl=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$t/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$ctl
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$ctl
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$t/data
num.partitions=4
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
java_=(java -Xmx1g -cp "$libs/*" "-Dlog4j2.configurationFile=$PWD/testbed/kafka/log4j2.properties")
"${java_[@]}" kafka.tools.StorageTool format -t tmkafkaeval00000000001 -c "$t/server.properties" >/dev/null
taskset -c 1 "${java_[@]}" kafka.Kafka "$t/server.properties" >"$t/broker.log" 2>&1 &
broker=$!
for _ in $(seq 100); do
    if "${java_[@]}" org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$port" --list >/dev/null 2>&1; then
        break
    fi
    sleep 1
done
mkdir -p docs/eval
{
    echo "# telemark bench-kafka --brokers 127.0.0.1:PORT --cpu 0 (broker on cpu 1), $(date -u +%F)"
    ./target/release/telemark bench-kafka --brokers "127.0.0.1:$port" --cpu 0 ${BENCH_KAFKA_ARGS:-}
    if [ "$(id -u)" = 0 ]; then
        echo
        echo "# telemark bench-live --kafka 127.0.0.1:PORT (agent's fast path, Kafka export on and off)"
        ./target/release/telemark bench-live --kafka "127.0.0.1:$port"
    fi
} | tee docs/eval/kafka-throughput.txt
