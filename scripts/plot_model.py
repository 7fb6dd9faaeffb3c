#!/usr/bin/env python3
"""scripts/plot_model.py SCALE.csv OUT.png [TITLE]

Draws `loom-model --scale` output: all-reduce bus bandwidth of 1 GiB (left) and time of
8 B (right) against the host count, one line per algorithm (dashed: not built yet), the
tuner's pick marked (the model's fastest where the file has no tuner column, or where the
tuner is the GPU mesh planner, which loom-model does not ask), and in black the `loom` rows
where the file has them: the tuner's pick priced where loom runs it (for GPU buffers across
hosts, the network executor's fabric, not the NVLink-inside one of the other lines). Needs
matplotlib (Debian: python3-matplotlib)."""
import csv
import sys
from collections import defaultdict

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_model.py: needs matplotlib (apt-get install python3-matplotlib)")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rows = list(csv.DictReader(open(sys.argv[1])))
    title = sys.argv[3] if len(sys.argv) > 3 else "cost model"
    series = defaultdict(list)  # (bytes, algo) -> [(hosts, value, built, picked)]
    # Per (hosts, bytes): whether the tuner was asked (some row has tuner=1).
    asked = {(r["hosts"], r["bytes"]) for r in rows if r.get("tuner") == "1"}
    for r in rows:
        mark = r["tuner"] if (r["hosts"], r["bytes"]) in asked else r["picked"]
        b = int(r["bytes"])
        v = float(r["busbw_gbps"]) if b > 8 else float(r["us"])
        series[(b, r["algo"])].append((int(r["hosts"]), v, r["built"] == "1", mark == "1"))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, b, label in ((axes[0], 1 << 30, "all_reduce 1 GiB: busbw (GB/s)"),
                         (axes[1], 8, "all_reduce 8 B: time (µs)")):
        for (sb, algo), pts in sorted(series.items()):
            if sb != b:
                continue
            pts.sort()
            xs = [p[0] for p in pts]
            ys = [p[1] for p in pts]
            built = pts[0][2]
            if algo == "loom":
                ax.plot(xs, ys, "k-", marker="x", ms=5, lw=1.5, label="loom (the pick, where it runs)")
                continue
            line, = ax.plot(xs, ys, "-" if built else "--", label=algo + ("" if built else " (not built)"))
            picked = [(p[0], p[1]) for p in pts if p[3]]
            if picked:
                ax.plot([p[0] for p in picked], [p[1] for p in picked], "o", color=line.get_color(), ms=4)
        ax.set_xscale("log", base=2)
        if b == 8:
            ax.set_yscale("log")
        ax.set_xlabel("hosts")
        ax.set_title(label, fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title + " (dots: the tuner's pick)", fontsize=11)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print(f"plot_model.py: wrote {sys.argv[2]}")


if __name__ == "__main__":
    main()
