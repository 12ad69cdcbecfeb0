#!/usr/bin/env bash
# Regenerates docs/cost-study.md and docs/eval/cost-study.csv: what sFlow, IPFIX and Telemark's
# own measurements cost the Telemark agent and Open vSwitch (userspace datapath), after "The
# cost of measuring with sFlow and IPFIX". Run as root on an otherwise idle machine with at
# least 2 cores; needs iperf3, flowgrind, nftables, ethtool and Open vSwitch. Arguments go to
# eval/cost_study.py (--seconds, --rounds, --switches, --configs, --out, --binary; --help).
# It builds target/release/telemark first; NO_BUILD=1 (or no cargo on root's PATH) uses it as
# it is.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${NO_BUILD:-}" ] && command -v cargo >/dev/null; then
    cargo build --release -q -p telemark
fi
exec python3 eval/cost_study.py "$@"
