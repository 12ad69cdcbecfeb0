#!/usr/bin/env python3
"""Draws docs/eval/fig5.png from docs/eval/fig5.csv (made by eval/fig5.sh)."""
import csv
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/eval")
runs = defaultdict(list)
for r in csv.DictReader(open(out / "fig5.csv")):
    runs[int(r["run"])].append((int(r["t"]), int(r["background"]), int(r["kernel_lost"]), int(r["telemark_lost"])))
f, ax = plt.subplots(figsize=(8, 3.6))
for i, (run, pts) in enumerate(sorted(runs.items())):
    pts.sort()
    t = [p[0] for p in pts]
    ax.plot(t, [p[2] for p in pts], color=f"C{i}", lw=2.5, alpha=0.35, label=f"run {run}: kernel (nftables, tbf)")
    ax.plot(t, [p[3] for p in pts], color=f"C{i}", ls="--", marker=".", ms=4, label=f"run {run}: Telemark")
    bg = [p[0] for p in pts if p[1]]
    if i == 0 and bg:
        ax.axvspan(min(bg), max(bg) + 1, color="grey", alpha=0.1, label="background traffic on")
ax.set_xlabel("time (s)")
ax.set_ylabel("probe packets lost per second")
ax.grid(alpha=0.3)
ax.legend(fontsize=7, ncol=2)
ax.set_title("Fig. 5: probe flow loss under congestion, detected vs ground truth", fontsize=10)
f.tight_layout()
f.savefig(out / "fig5.png", dpi=110)
print(f"wrote {out / 'fig5.png'}")
