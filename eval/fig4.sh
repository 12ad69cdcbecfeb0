#!/usr/bin/env bash
# Regenerates docs/eval/fig4.csv and the two figures (loss paper, Fig. 4a and 4b).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run --release -q -p telemark -- eval accuracy --out docs/eval --seeds 30 --reorder 0,33
python3 -c 'import matplotlib' 2>/dev/null || python3 -m pip install --quiet matplotlib
python3 eval/fig4.py docs/eval
