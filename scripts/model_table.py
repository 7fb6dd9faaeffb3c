#!/usr/bin/env python3
"""scripts/model_table.py MEASURED.csv PREDICTED.csv RATE_MBIT [TITLE DESCRIPTION]

The markdown table of scripts/model_check.sh: for each host count and size, every
algorithm's measured time beside the cost model's prediction, the tuner's own choice
(LOOM_ALGO unset) against the measured fastest, the form the tuner takes (loom-model's
`tuner` column) at its forced time, and a summary of how far the model is off. TITLE and
DESCRIPTION replace the host-memory heading and its paragraph (the GPU check,
scripts/model_check_gpu.sh). Standard library only."""
import csv
import sys
from collections import defaultdict


def size_text(b):
    for unit, name in ((1 << 20, "MiB"), (1 << 10, "KiB")):
        if b >= unit and b % unit == 0:
            return f"{b // unit} {name}"
    return f"{b} B"


def main():
    measured_path, predicted_path, rate = sys.argv[1], sys.argv[2], sys.argv[3]
    measured = {}  # (hosts, bytes, label) -> us
    wrong = 0
    with open(measured_path) as f:
        for row in csv.DictReader(f):
            # A key measured in several rounds (scripts/model_check_gpu.sh ROUNDS) keeps its
            # best round: each form's time in its fastest launch, so that one slow launch
            # does not decide which form is fastest.
            key = (int(row["nranks"]), int(row["bytes"]), row["label"])
            us = float(row["us_per_call"])
            measured[key] = min(us, measured.get(key, us))
            wrong += int(row["wrong"])
    predicted = {}  # (ranks, bytes, algo) -> (us, built, picked)
    tuner = {}  # (ranks, bytes) -> the algorithm the tuner takes (loom-model's `tuner` column)
    per_host = {}  # ranks -> ranks per host
    colls = set()
    with open(predicted_path) as f:
        for row in csv.DictReader(f):
            # Keyed by the rank count, as the measurements are; the model's "hierarchical"
            # is LOOM_ALGO=hier.
            n = int(row["hosts"]) * int(row["ranks_per_host"])
            per_host[n] = int(row["ranks_per_host"])
            algo = "hier" if row["algo"] == "hierarchical" else row["algo"]
            colls.add(row["coll"])
            predicted[(n, int(row["bytes"]), algo)] = (
                float(row["us"]), row["built"] == "1", row["picked"] == "1")
            if row.get("tuner") == "1":
                tuner[(n, int(row["bytes"]))] = algo
    algos = ["ring", "tree", "chain", "direct", "doubling", "oneshot", "hier"]
    hosts = sorted({k[0] for k in measured})
    sizes = sorted({k[1] for k in measured})
    if len(sys.argv) > 5:
        print(f"# {sys.argv[4]}\n")
        print(sys.argv[5] + "\n")
    else:
        what = {"all_reduce": "all-reduces", "all_gather": "all-gathers",
                "reduce_scatter": "reduce-scatters", "reduce": "reduces",
                "broadcast": "broadcasts"}.get(
            next(iter(colls)) if len(colls) == 1 else "", "collectives")
        print(f"# The cost model against measured host-memory {what}, {rate} Mb/s links\n")
        print("Network namespaces as hosts (one rank each unless the heading says more), every "
              "link shaped to "
              f"{rate} Mb/s both ways (tc tbf); float sum; time per call, the slowest rank's mean. "
              "Each cell: measured / predicted µs (prediction error). `default`: LOOM_ALGO unset, "
              "the tuner's choice. Written by scripts/model_check.sh.\n")
    print(f"Wrong values: {wrong}.\n")
    errors_big = []  # |error| of every prediction from 1 MiB
    tuner_ok = tuner_all = 0
    model_ok = model_all = 0
    form_ok = form_all = 0  # the tuner's form at its forced time, as the model's pick is judged
    for h in hosts:
        cols = [a for a in algos if any((h, b, a) in measured for b in sizes)]
        g = per_host.get(h, 1)
        print(f"## {h // g} hosts x {g} ranks\n" if g > 1 else f"## {h} hosts\n")
        print("| size | " + " | ".join(cols) + " | default | fastest measured | default within 10 % "
              "| tuner's form | model's pick |")
        print("| --- | " + " | ".join("---" for _ in cols) + " | --- | --- | --- | --- | --- |")
        for b in sizes:
            cells = []
            times = {}
            for a in cols:
                m = measured.get((h, b, a))
                p = predicted.get((h, b, a))
                if m is None or p is None:
                    cells.append("")
                    continue
                if not p[1]:  # not built at this size: LOOM_ALGO ran something else
                    cells.append(f"{m:.4g} (ran another: not built at this size)")
                    continue
                times[a] = m
                err = (p[0] - m) / m
                if b >= 1 << 20:
                    errors_big.append(abs(err))
                cells.append(f"{m:.4g} / {p[0]:.4g} ({err * 100:+.0f} %)")
            d = measured.get((h, b, "default"))
            fastest = min(times, key=times.get) if times else ""
            within = ""
            if d is not None and times:
                ok = d <= times[fastest] * 1.10
                tuner_all += 1
                tuner_ok += ok
                within = "yes" if ok else f"**no** ({d / times[fastest]:.2f} ×)"
            form = tuner.get((h, b), "")
            if form in times:
                form_all += 1
                form_ok += times[form] <= times[fastest] * 1.10
            pick = [a for a in cols if predicted.get((h, b, a), (0, False, False))[2]]
            pick = pick[0] if pick else ""
            if pick and times:
                model_all += 1
                model_ok += times.get(pick, float("inf")) <= times[fastest] * 1.10
            print(f"| {size_text(b)} | " + " | ".join(cells) +
                  f" | {'' if d is None else f'{d:.4g}'} | {fastest} | {within} | {form} | {pick} |")
        print()
    print("## Summary\n")
    if errors_big:
        inside = sum(e <= 0.25 for e in errors_big)
        print(f"- Predictions from 1 MiB within 25 % of measured: {inside} of {len(errors_big)} "
              f"(largest error {max(errors_big) * 100:.0f} %).")
    print(f"- The tuner's choice within 10 % of the measured fastest: {tuner_ok} of {tuner_all}.")
    if form_all:
        print(f"- The tuner's form at its own forced time (as the model's pick is judged) within "
              f"10 % of the measured fastest: {form_ok} of {form_all}.")
    print(f"- The model's fastest within 10 % of the measured fastest: {model_ok} of {model_all}.")


if __name__ == "__main__":
    main()
