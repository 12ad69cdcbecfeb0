#!/usr/bin/env bash
# The loss paper's Fig. 3 bus in network namespaces (run as root):
#
#   A ── [sw-b] ── u1 ══(tbf)══ u2 ── [sw-f] ── G
#                  │            │
#                  C            E
#
# Hosts A, C, E, G; Telemark switches B and F (namespaces tm-b, tm-f: two bare veth ports each,
# forwarded by `telemark agent`); underlay Linux bridges u1 and u2 (monitoring off), both in
# namespace tm-u so one nftables table sees both ends of the link between them. That link
# u1-l → u2-l is shaped by a tbf qdisc, so background traffic C → E congests it for the probe
# flow A → G. nftables (bridge family) counts the probe flow into and out of the link, the
# kernel's ground truth, in one atomic read; `loss N` drops N per mille of the probe flow at
# random where it leaves the link.
#
#   testbed.sh up [TBF_RATE]     build it (default rate 20mbit); replaces an old one
#   testbed.sh down              remove every tm-* namespace (and with them every link)
#   testbed.sh loss PERMILLE     random loss of the probe flow on u1 → u2 (0: none)
#   testbed.sh truth             JSON: probe packets into/out of the link, random drops, tbf drops
#   testbed.sh iperf-server / iperf-client SECONDS RATE   background traffic C → E with iperf3
set -euo pipefail

NS="tm-a tm-b tm-c tm-e tm-f tm-g tm-u"
PROBE_PORT=${PROBE_PORT:-5201}
BG_PORT=${BG_PORT:-5202}
declare -A MAC=([a]=02:00:00:00:00:01 [c]=02:00:00:00:00:03 [e]=02:00:00:00:00:05 [g]=02:00:00:00:00:07)
declare -A IP=([a]=10.0.0.1 [c]=10.0.0.3 [e]=10.0.0.5 [g]=10.0.0.7)

x() { ip netns exec "$@"; }

down() {
    for n in $NS; do
        ip netns pids "$n" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip netns del "$n" 2>/dev/null || true
    done
}

link() { # link NS1 DEV1 NS2 DEV2
    ip link add "$2" netns "$1" type veth peer name "$4" netns "$3"
    x "$1" ip link set "$2" up
    x "$3" ip link set "$4" up
}

up() {
    local rate=${1:-20mbit}
    down
    for n in $NS; do
        ip netns add "$n"
        x "$n" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
        x "$n" ip link set lo up
    done
    link tm-a a0 tm-b b-a
    link tm-b b-u tm-u u1-b
    link tm-c c0 tm-u u1-c
    link tm-u u1-l tm-u u2-l
    link tm-e e0 tm-u u2-e
    link tm-u u2-f tm-f f-u
    link tm-f f-g tm-g g0
    for h in a c e g; do
        x "tm-$h" ip link set "${h}0" address "${MAC[$h]}"
        x "tm-$h" ip addr add "${IP[$h]}/24" dev "${h}0"
        # Checksums are computed in software, so frames leaving through AF_PACKET are whole.
        x "tm-$h" ethtool -K "${h}0" tx off >/dev/null 2>&1 || true
        for o in a c e g; do
            [ "$o" = "$h" ] || x "tm-$h" ip neigh replace "${IP[$o]}" lladdr "${MAC[$o]}" dev "${h}0" nud permanent
        done
    done
    for u in u1 u2; do
        x tm-u ip link add "$u" type bridge
        x tm-u ip link set "$u" up
    done
    for p in u1-b u1-c u1-l; do x tm-u ip link set "$p" master u1; done
    for p in u2-l u2-e u2-f; do x tm-u ip link set "$p" master u2; done
    # Static forwarding, so nothing floods (no host answers the probe flow).
    x tm-u bridge fdb replace "${MAC[a]}" dev u1-b master static
    x tm-u bridge fdb replace "${MAC[c]}" dev u1-c master static
    x tm-u bridge fdb replace "${MAC[e]}" dev u1-l master static
    x tm-u bridge fdb replace "${MAC[g]}" dev u1-l master static
    x tm-u bridge fdb replace "${MAC[a]}" dev u2-l master static
    x tm-u bridge fdb replace "${MAC[c]}" dev u2-l master static
    x tm-u bridge fdb replace "${MAC[e]}" dev u2-e master static
    x tm-u bridge fdb replace "${MAC[g]}" dev u2-f master static
    # A short queue (5 ms): what it holds shifts loss in time between where packets are dropped
    # (entering it) and where a downstream switch sees the gap (leaving it).
    x tm-u tc qdisc add dev u1-l root tbf rate "$rate" burst 32kbit latency "${TBF_LATENCY:-5ms}"
    x tm-u nft -f - <<NFT
table bridge tm {
    counter probe_in {}
    counter probe_out {}
    counter random_drop {}
    counter all_in {}
    chain post { type filter hook postrouting priority 0; oifname "u1-l" counter name all_in; oifname "u1-l" udp dport $PROBE_PORT counter name probe_in; }
    chain pre { type filter hook prerouting priority 0; iifname "u2-l" udp dport $PROBE_PORT counter name probe_out; }
    chain lossy { type filter hook forward priority 0; }
}
NFT
}

loss() {
    local n=${1:?permille}
    x tm-u nft flush chain bridge tm lossy
    if [ "$n" -gt 0 ]; then
        x tm-u nft add rule bridge tm lossy iifname "u2-l" udp dport "$PROBE_PORT" numgen random mod 1000 '<' "$n" counter name random_drop drop
    fi
}

truth() { # one netlink dump for all three counters, then the qdisc
    local t q t0 t1
    t0=$(date +%s%N)
    t=$(x tm-u nft -j list counters table bridge tm)
    t1=$(date +%s%N)
    q=$(x tm-u tc -j -s qdisc show dev u1-l)
    python3 - "$t" "$q" "$t0" "$t1" <<'PY'
import json, sys
c = {o["counter"]["name"]: o["counter"]["packets"] for o in json.loads(sys.argv[1])["nftables"] if "counter" in o}
q = json.loads(sys.argv[2])[0]
c["tbf_drops"] = q.get("drops", 0)
c["backlog"] = q.get("qlen", 0)
c["t_ns"] = (int(sys.argv[3]) + int(sys.argv[4])) // 2  # about when nft read the counters
c["read_ns"] = int(sys.argv[4]) - int(sys.argv[3])  # how long the read took: its uncertainty
print(json.dumps(c))
PY
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) down ;;
    loss) shift; loss "$@" ;;
    truth) truth ;;
    iperf-server) x tm-e iperf3 -s -D -p "$BG_PORT" -1 >/dev/null ;;
    iperf-client) x tm-c iperf3 -c "${IP[e]}" -p "$BG_PORT" -u -l 1400 -t "${2:?seconds}" -b "${3:-30M}" >/dev/null ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
esac
