#!/usr/bin/env bash
# Regenerates docs/eval/fig5.csv and docs/eval/fig5.png (loss paper, Fig. 5): the probe flow's
# packets lost per second, as Telemark detected them and as the kernel counted them, over
# several runs of the live congestion experiment. Needs root (network namespaces).
#   eval/fig5.sh [RUNS] [BEFORE BACKGROUND AFTER]      default: 3 runs of 15s 30s 15s
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
before=${2:-15s} background=${3:-30s} after=${4:-15s}
cargo build --release -q -p telemark
out=docs/eval
mkdir -p "$out"
echo "run,t,background,kernel_lost,telemark_lost,tbf_drops" > "$out/fig5.csv"
for r in $(seq 1 "$runs"); do
    j=$(mktemp)
    ./target/release/telemark demo --no-wait --before "$before" --background "$background" \
        --after "$after" --json "$j" --listen 127.0.0.1:19902 >/dev/null
    python3 - "$j" "$r" >> "$out/fig5.csv" <<'PY'
import json, sys
o = json.load(open(sys.argv[1]))
for s in o["seconds"]:
    print(f'{sys.argv[2]},{s["t"]},{int(s["background"])},{s["truth_lost"]},{s["detected_lost"]},{s["tbf_drops"]}')
PY
    rm -f "$j"
done
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install --quiet matplotlib
python3 eval/fig5.py "$out"
