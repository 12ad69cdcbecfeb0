#!/usr/bin/env bash
# Regenerates docs/eval/int-prefilter.csv and the tables of docs/int.md, "Pre-filtering" (INT
# paper, Figs. 4 and 5): web, cache and hadoop traces of 200,000 INT packets from the burst
# model, one packet per burst and per gap (as the paper's) and one every 25 us, pre-filtered
# at the sink per threshold; the collector's capacity is measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p telemark
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
args=()
for m in web cache hadoop; do
    ./target/release/telemark gen --bursts "$m" --every period --out "$t/$m-per-period.pcap"
    ./target/release/telemark gen --bursts "$m" --every 25us --out "$t/$m-every-25us.pcap"
    args+=(--prefilter "$t/$m-per-period.pcap" --prefilter "$t/$m-every-25us.pcap")
done
mkdir -p docs/eval
./target/release/telemark bench-int "${args[@]}" --csv docs/eval/int-prefilter.csv
