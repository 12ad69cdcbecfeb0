#!/usr/bin/env bash
# A chain of three Telemark switches with a routed hop, in network namespaces (run as root):
#
#   A ── [s1] ── link 1 ── [s2] ── router R ── link 2 ── [s3] ── G
#
# Host A sends UDP flows to G's network through R. s1, s2 and s3 are namespaces with two bare
# veth ports each, forwarded by `telemark agent` (s1 marks). Links 1 and 2 are Linux bridges
# in one namespace (L), where nftables (bridge family) counts every flow into and out of each
# link, and drops a share of chosen flows at random (`numgen random`): the ground truth of
# what each link lost. R routes (it rewrites MACs and TTL and keeps the DSCP). G does not own
# the destination address, so it drops the flows quietly (no replies).
#
# Every name begins with PREFIX, so runs in parallel do not collide.
#
#   chain.sh PREFIX up "SPORT ..."      build it, with counters for the flows of these ports
#   chain.sh PREFIX down                remove it
#   chain.sh PREFIX loss LINK PERMILLE "SPORT ..."   drop that share of these flows on link 1 or 2
#   chain.sh PREFIX truth               JSON: per source port (and "all" UDP), per link:
#                                       packets in, out, dropped
set -euo pipefail

P=${1:?prefix}
shift
NS="a s1 s2 r s3 g l"
declare -A MAC=([a]=02:00:00:00:01:01 [r1]=02:00:00:00:01:fe [r2]=02:00:00:00:02:fe [g]=02:00:00:00:02:01)
DST=10.9.2.7 # routed to G, owned by no one

x() { local n=$1; shift; ip netns exec "$P$n" "$@"; }

down() {
    for n in $NS; do
        ip netns pids "$P$n" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip netns del "$P$n" 2>/dev/null || true
    done
}

link() { # link NS1 DEV1 NS2 DEV2
    ip link add "$2" netns "$P$1" type veth peer name "$4" netns "$P$3"
    x "$1" ip link set "$2" up
    x "$3" ip link set "$4" up
}

up() {
    local sports=${1-}
    down
    for n in $NS; do
        ip netns add "$P$n"
        x "$n" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
        x "$n" ip link set lo up
    done
    link a a0 s1 s1a
    link s1 s1b l l1a
    link l l1b s2 s2a
    link s2 s2b r r1
    link r r2 l l2a
    link l l2b s3 s3a
    link s3 s3b g g0
    x a ip link set a0 address "${MAC[a]}"
    x a ethtool -K a0 tx off >/dev/null 2>&1 || true
    x g ip link set g0 address "${MAC[g]}"
    x g ip addr add 10.9.2.1/24 dev g0
    x r ip link set r1 address "${MAC[r1]}"
    x r ip link set r2 address "${MAC[r2]}"
    x r ip addr add 10.9.1.254/24 dev r1
    x r ip addr add 10.9.2.254/24 dev r2
    x r sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.send_redirects=0
    x r ip neigh replace "$DST" lladdr "${MAC[g]}" dev r2 nud permanent
    for b in 1 2; do
        x l ip link add "br$b" type bridge
        x l ip link set "br$b" up
        x l ip link set "l${b}a" master "br$b"
        x l ip link set "l${b}b" master "br$b"
    done
    {
        echo "table bridge tm {"
        for b in 1 2; do
            echo "  counter in${b}_all {}"
            echo "  counter out${b}_all {}"
            for s in $sports; do
                echo "  counter in${b}_$s {}"
                echo "  counter out${b}_$s {}"
                echo "  counter drop${b}_$s {}"
            done
        done
        # Into a link: forwarded from its upstream port (before the drop); out of it: leaving
        # through its downstream port.
        echo "  chain count_in { type filter hook forward priority -10;"
        for b in 1 2; do
            echo "    iifname l${b}a meta l4proto udp counter name in${b}_all"
            for s in $sports; do
                echo "    iifname l${b}a udp sport $s counter name in${b}_$s"
            done
        done
        echo "  }"
        echo "  chain lossy { type filter hook forward priority 0; }"
        echo "  chain count_out { type filter hook postrouting priority 0;"
        for b in 1 2; do
            echo "    oifname l${b}b meta l4proto udp counter name out${b}_all"
            for s in $sports; do
                echo "    oifname l${b}b udp sport $s counter name out${b}_$s"
            done
        done
        echo "  }"
        echo "}"
    } | x l nft -f -
}

loss() {
    local b=${1:?link} n=${2:?permille} sports=${3:?source ports}
    for s in $sports; do
        x l nft add rule bridge tm lossy iifname "l${b}a" udp sport "$s" \
            numgen random mod 1000 '<' "$n" counter name "drop${b}_$s" drop
    done
}

truth() {
    x l nft -j list counters table bridge tm | python3 -c '
import json, sys
out = {}
for o in json.load(sys.stdin)["nftables"]:
    c = o.get("counter")
    if c:
        what, sport = c["name"].split("_")
        out.setdefault(sport, {})[what] = c["packets"]
print(json.dumps(out))'
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) down ;;
    loss) shift; loss "$@" ;;
    truth) truth ;;
    *) sed -n '2,19p' "$0"; exit 2 ;;
esac
