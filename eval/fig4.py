#!/usr/bin/env python3
"""Draws docs/eval/fig4a.png and fig4b.png from docs/eval/fig4.csv (made by `telemark eval`)."""
import csv
import sys
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/eval")
rows = list(csv.DictReader(open(out / "fig4.csv")))
series = defaultdict(list)
for r in rows:
    x = int(r["batches"]) if r["figure"] == "4a" else int(r["batch_size"])
    key = (r["figure"], int(r["reorder"]), r["against"], float(r["p"]))
    series[key].append((x, float(r["mean_rel_error"]), float(r["ci95"]) if r["ci95"] != "NaN" else 0.0))

reorders = sorted({k[1] for k in series})
for fig, xlabel in (("4a", "observed batches (B = 100)"), ("4b", "batch size B (25 batches)")):
    cols = [(ro, ag) for ro in reorders for ag in ("configured", "realised")]
    f, axes = plt.subplots(1, len(cols), figsize=(4.2 * len(cols), 3.6), sharey=False)
    for ax, (ro, ag) in zip(axes, cols):
        for p in (0.001, 0.01, 0.05, 0.1):
            pts = sorted(series.get((fig, ro, ag, p), []))
            if not pts:
                continue
            xs, ys, cs = zip(*pts)
            ax.errorbar(xs, ys, yerr=cs, marker="o", ms=3, capsize=2, label=f"p = {p * 100:g} %")
        title = "vs configured p" if ag == "configured" else "vs dropper's realised rate"
        ax.set_title(f"{title}\nreordering {ro} pkts" if ro else f"{title}\nno reordering", fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("relative error of p̂")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=-0.02)
    axes[0].legend(fontsize=8)
    f.suptitle(f"Fig. {fig}: mean relative error, 95 % CI over 30 seeds", fontsize=10)
    f.tight_layout()
    f.savefig(out / f"fig{fig}.png", dpi=110)
    print(f"wrote {out / f'fig{fig}.png'}")
