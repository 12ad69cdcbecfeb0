#!/usr/bin/env bash
# An Open vSwitch bridge whose own sFlow and IPFIX exporters feed Telemark's collector: an
# independent, real exporter for integration tests (run as root):
#
#   host A ── a0 ═══ PREFIXpa ── [br-PREFIX] ── PREFIXpb ═══ b0 ── host B
#   ns PREFIXa            (host namespace)                ns PREFIXb
#   10.33.0.1/24                                          10.33.0.2/24
#
# No openvswitch kernel module is needed: the bridge runs on OvS's userspace datapath. Each veth
# is an ordinary "system" port that ovs-vswitchd reads and writes through AF_PACKET sockets from
# its main thread: no PMD thread, nothing busy-polls, and the daemon idles at 0% CPU.
# ovsdb-server and ovs-vswitchd are private to this run: database, sockets, pid and log files all
# live in /tmp/PREFIX-ovs and the environment points every OvS tool there, so nothing touches a
# system OvS. The daemons stay in the host namespace, so the exporters reach a collector that
# listens on the host's 127.0.0.1.
#
# The bridge forwards with two OpenFlow rules (pa → pb, pb → pa) instead of MAC learning: host B
# never answers, so a learning switch would flood A's flow to its own internal port as well and
# report two output ports for it. The hosts have static neighbour entries (no ARP) and no IPv6,
# so the only frames on the bridge are the ones a test sends. Every veth computes checksums in
# software (tx offload off): otherwise a frame read off the veth through AF_PACKET keeps a
# partial UDP checksum and host B drops it.
#
# Every name begins with PREFIX (at most 12 letters, digits or _; "br-PREFIX" is an interface
# name, 15 characters at most), so runs do not collide, with one exception: the userspace
# datapath of type netdev owns a tap device named "ovs-netdev", so only one run with
# OVS_DATAPATH=netdev can be up on a machine at a time. OVS_DATAPATH=dummy runs the very same
# userspace datapath code registered under another name (ovs-vswitchd --enable-dummy), whose
# internal ports are not kernel devices; the veths stay real. Use it to run several at once.
#
#   ovs.sh PREFIX up                 build it (replaces an old one of the same PREFIX)
#   ovs.sh PREFIX hosts              only the two hosts and their veths, no OvS: PREFIXpa and
#                                    PREFIXpb are left for another switch to join (replaces an
#                                    old testbed of the same PREFIX; `down` removes it)
#   ovs.sh PREFIX sflow PORT RATE    sFlow to 127.0.0.1:PORT: 1-in-RATE packet sampling at
#                                    ingress, 128-byte headers, port counters every 10 s
#   ovs.sh PREFIX ipfix PORT RATE [in|out|both]
#                                    IPFIX to 127.0.0.1:PORT: 1-in-RATE packet sampling, at
#                                    ingress only by default, observation domain 1, a flow cache
#                                    of 4096 flows exported every 2 s while active
#                                    (IPFIX_CACHE_FLOWS, IPFIX_ACTIVE_TIMEOUT below)
#   ovs.sh PREFIX down               stop both daemons, remove the bridge, the namespaces, the
#                                    veths and the state directory
#
#   OVS_DATAPATH=netdev|dummy        userspace datapath flavour for `up` (default netdev)
#   IPFIX_CACHE_FLOWS=N              `ipfix`: the flow cache's room (default 4096)
#   IPFIX_ACTIVE_TIMEOUT=S           `ipfix`: seconds between exports of an active flow
#                                    (default 2); both 0: no cache, one record per sampled
#                                    packet (the cost paper's "IPFIX without cache")
#
# What OvS sends (Open vSwitch 3.1):
# - sFlow v5, agent 127.0.0.1: one flow sample per sampled packet, taken at ingress, with the
#   raw sampled header and sampling_rate RATE; frame length includes 4 bytes of FCS; interfaces
#   are host ifindexes of PREFIXpa/PREFIXpb. Counter samples carry records 2, 1004, 1005 and 1
#   (tshark 4.0 cannot parse 1004/1005 and calls the rest malformed).
# - IPFIX: packetDeltaCount is already scaled by RATE (each sampled packet counts RATE); no
#   options record gives the sampling interval (the only options template, in observation
#   domain 0, is exportingProcessId + notSentPacketTotalCount). The ~50 templates go out with
#   the first export after traffic was sampled, then only every 600 s. Every record is
#   exported about 2 s after its flow-cache entry was opened (flowEndReason 2, active timeout).
# - Both exporters send on connected UDP sockets: while nothing listens on the port, every
#   other datagram is lost to ECONNREFUSED, templates included. Start the collector first.
# - IPFIX `in` samples each packet once where it enters the bridge (flowDirection 0); `out`
#   once per output port (flowDirection 1, with egressInterface); `both`, OvS's own default,
#   reports every flow twice, once each way, doubling the counts.
set -euo pipefail

usage() {
    echo "usage: ovs.sh PREFIX up|hosts|down|sflow PORT RATE|ipfix PORT RATE [in|out|both]" >&2
    exit 2
}

[ $# -ge 2 ] || usage
P=$1
CMD=$2
shift 2

if [ ${#P} -gt 12 ] || ! [[ $P =~ ^[A-Za-z0-9_]+$ ]]; then
    echo "ovs.sh: PREFIX must be 1 to 12 letters, digits or _" >&2
    exit 2
fi

DIR=/tmp/$P-ovs
BR=br-$P
NSA=${P}a
NSB=${P}b
PA=${P}pa
PB=${P}pb
IP_A=10.33.0.1
IP_B=10.33.0.2
MAC_A=02:33:00:00:00:01
MAC_B=02:33:00:00:00:02
DP=${OVS_DATAPATH:-netdev}

# Keep every OvS tool away from the system's /var/run/openvswitch, /etc/openvswitch, ...
export OVS_RUNDIR=$DIR OVS_LOGDIR=$DIR OVS_DBDIR=$DIR OVS_SYSCONFDIR=$DIR

vsctl() { timeout 30 ovs-vsctl --db="unix:$DIR/db.sock" --timeout=25 "$@"; }
ofctl() { timeout 30 ovs-ofctl "$@"; }
x() { local n=$1; shift; timeout 20 ip netns exec "$n" "$@"; }

# alive PID: the process runs (a zombie that init has not reaped yet does not count).
alive() {
    local state
    state=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

# stop NAME: ask the daemon to exit, then make sure its process is gone.
stop() {
    local pidfile=$DIR/$1.pid ctl=$DIR/$1.ctl pid
    [ -f "$pidfile" ] || return 0
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [ -S "$ctl" ]; then
        # --cleanup: ovs-vswitchd also deletes its datapath and the bridge's internal port.
        if [ "$1" = ovs-vswitchd ]; then
            timeout 10 ovs-appctl -t "$ctl" exit --cleanup >/dev/null 2>&1 || true
        else
            timeout 10 ovs-appctl -t "$ctl" exit >/dev/null 2>&1 || true
        fi
    fi
    [ -n "$pid" ] || return 0
    for _ in $(seq 50); do
        alive "$pid" || return 0
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
}

down() {
    stop ovs-vswitchd
    stop ovsdb-server
    for n in "$NSA" "$NSB"; do
        ip netns pids "$n" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip netns del "$n" 2>/dev/null || true # takes its veth pair along
    done
    for d in "$PA" "$PB" "$BR"; do
        ip link del "$d" 2>/dev/null || true
    done
    rm -rf "$DIR"
}

# fail WHY: say why `up` (or `hosts`) failed, with the end of ovs-vswitchd's log; tear down; exit.
fail() {
    trap - ERR
    echo "ovs.sh: $P $CMD failed: $1" >&2
    tail -n 20 "$DIR/ovs-vswitchd.log" >&2 2>/dev/null || true
    down
    exit 1
}

host() { # host NS DEV PEER IP MAC
    ip netns add "$1"
    x "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    x "$1" ip link set lo up
    ip link add "$2" netns "$1" type veth peer name "$3"
    x "$1" ip link set "$2" address "$5"
    x "$1" ip addr add "$4/24" dev "$2"
    x "$1" ethtool -K "$2" tx off >/dev/null
    x "$1" ip link set "$2" up
    # The host side only carries frames between the namespace and ovs-vswitchd.
    sysctl -qw "net.ipv6.conf.$3.disable_ipv6=1" 2>/dev/null || true
    timeout 10 ethtool -K "$3" tx off >/dev/null
    ip link set "$3" up
}

# hosts: the two namespaces, their veths and static neighbours (run with the ERR trap set).
hosts() {
    host "$NSA" a0 "$PA" "$IP_A" "$MAC_A"
    host "$NSB" b0 "$PB" "$IP_B" "$MAC_B"
    x "$NSA" ip neigh replace "$IP_B" lladdr "$MAC_B" dev a0 nud permanent
    x "$NSB" ip neigh replace "$IP_A" lladdr "$MAC_A" dev b0 nud permanent
}

up() {
    local extra=()
    case "$DP" in
    netdev)
        if ip link show ovs-netdev >/dev/null 2>&1; then
            echo "ovs.sh: another userspace datapath of type netdev is running (device ovs-netdev" \
                "exists); only one can; use OVS_DATAPATH=dummy for runs in parallel" >&2
            exit 1
        fi
        ;;
    dummy) extra=(--enable-dummy) ;;
    *)
        echo "ovs.sh: OVS_DATAPATH must be netdev or dummy" >&2
        exit 2
        ;;
    esac
    down
    # A half-built testbed is torn down again rather than left running.
    trap 'fail "a command failed"' ERR
    mkdir -p "$DIR"
    timeout 20 ovsdb-tool create "$DIR/conf.db" /usr/share/openvswitch/vswitch.ovsschema
    timeout 20 ovsdb-server "$DIR/conf.db" -vconsole:off --remote="punix:$DIR/db.sock" \
        --unixctl="$DIR/ovsdb-server.ctl" --pidfile="$DIR/ovsdb-server.pid" \
        --log-file="$DIR/ovsdb-server.log" --no-chdir --detach
    vsctl --no-wait init
    # One handler and one revalidator thread are plenty for a test's few flows.
    vsctl --no-wait set Open_vSwitch . other_config:n-handler-threads=1 \
        other_config:n-revalidator-threads=1
    timeout 20 ovs-vswitchd "unix:$DIR/db.sock" "${extra[@]}" -vconsole:off \
        --unixctl="$DIR/ovs-vswitchd.ctl" --pidfile="$DIR/ovs-vswitchd.pid" \
        --log-file="$DIR/ovs-vswitchd.log" --no-chdir --detach

    hosts

    # fail_mode=secure: only our flows forward, OvS never falls back to MAC learning. The
    # bridge's own internal port stays down. ovs-vsctl waits until ovs-vswitchd has applied
    # the change, so the ports exist when it returns.
    vsctl -- add-br "$BR" -- set Bridge "$BR" datapath_type="$DP" fail_mode=secure \
        -- add-port "$BR" "$PA" -- set Interface "$PA" ofport_request=1 \
        -- add-port "$BR" "$PB" -- set Interface "$PB" ofport_request=2
    local port ofport
    for port in "$PA" "$PB"; do
        ofport=$(vsctl get Interface "$port" ofport)
        if ! [ "$ofport" -gt 0 ] 2>/dev/null; then
            fail "port $port did not come up (ofport $ofport)"
        fi
    done
    ofctl del-flows "$BR"
    ofctl add-flow "$BR" "in_port=1,actions=output:2"
    ofctl add-flow "$BR" "in_port=2,actions=output:1"
    trap - ERR
}

port_rate() { # port_rate PORT RATE
    if ! [[ ${1:-} =~ ^[0-9]+$ && ${2:-} =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ] || [ "$1" -gt 65535 ] \
        || [ "$2" -lt 1 ]; then
        usage
    fi
}

case "$CMD" in
up)
    [ $# -eq 0 ] || usage
    up
    ;;
hosts)
    [ $# -eq 0 ] || usage
    down
    trap 'fail "a command failed"' ERR
    hosts
    trap - ERR
    ;;
down)
    [ $# -eq 0 ] || usage
    down
    ;;
sflow)
    [ $# -eq 2 ] || usage
    port_rate "$@"
    vsctl -- --id=@s create sFlow agent=lo target="\"127.0.0.1:$1\"" header=128 \
        sampling="$2" polling=10 -- set Bridge "$BR" sflow=@s >/dev/null
    ;;
ipfix)
    [ $# -eq 2 ] || [ $# -eq 3 ] || usage
    port_rate "$1" "$2"
    case "${3:-in}" in
    in) sample_in=true sample_out=false ;;
    out) sample_in=false sample_out=true ;;
    both) sample_in=true sample_out=true ;;
    *) usage ;;
    esac
    # OvS before 3.2 (Debian 12 has 3.1) reads both keys negated, so there "true" turns the
    # sampling off (fixed upstream by "bridge: Fix unexpected values for IPFIX
    # enable-input/output-sampling"). Write whatever this version needs to mean what we want.
    version=$(timeout 10 ovs-vswitchd --version | sed -n '1s/.* //p')
    if [ "$(printf '%s\n' 3.2.0 "$version" | sort -V | head -n 1)" != 3.2.0 ]; then
        sample_in=$([ $sample_in = true ] && echo false || echo true)
        sample_out=$([ $sample_out = true ] && echo false || echo true)
    fi
    cache_flows=${IPFIX_CACHE_FLOWS:-4096}
    active_timeout=${IPFIX_ACTIVE_TIMEOUT:-2}
    if ! [[ $cache_flows =~ ^[0-9]+$ && $active_timeout =~ ^[0-9]+$ ]]; then
        echo "ovs.sh: IPFIX_CACHE_FLOWS and IPFIX_ACTIVE_TIMEOUT must be whole numbers" >&2
        exit 2
    fi
    vsctl -- --id=@i create IPFIX targets="\"127.0.0.1:$1\"" sampling="$2" obs_domain_id=1 \
        cache_active_timeout="$active_timeout" cache_max_flows="$cache_flows" \
        other_config:enable-input-sampling="$sample_in" \
        other_config:enable-output-sampling="$sample_out" \
        -- set Bridge "$BR" ipfix=@i >/dev/null
    ;;
*) usage ;;
esac
