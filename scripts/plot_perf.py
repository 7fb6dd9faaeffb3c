#!/usr/bin/env python3
"""Plot or tabulate the --json output of the perf binaries (loom against NCCL).

Reads one or more JSON files written by all_reduce_perf and friends (`-J FILE`), usually
run with `--compare nccl` so that each row also holds NVIDIA NCCL's figures, and

  * writes a PNG with one panel per collective: bus bandwidth (GB/s) against message size
    (log2 axis), loom solid and NCCL dashed, a colour per way of running (`-g 2`,
    `mpirun -np 2`, from each report's config), and under it the ratio loom / NCCL, or
  * with --table, prints a markdown table per input (size, loom time and busbw, NCCL time and
    busbw, loom/NCCL ratio) for pasting into docs/.

    python3 scripts/plot_perf.py --out docs/perf/h200x2_busbw.png --title "2 x H200" \\
        all_reduce.json all_gather.json
    python3 scripts/plot_perf.py --table all_reduce.json

Rows of the same size (several -N cycles, or every root with -r -1) are averaged. Files
holding several types or ops (-d all, -o all) give one series per type and op. Only the
plotting needs matplotlib (imported when plotting); parsing and --table need nothing beyond
the standard library, so they run (and are tested) anywhere.
"""

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

PLACEMENTS = ("out_of_place", "in_place")


@dataclass
class Figures:
    """One library's measurement of one row: time in microseconds, bandwidths in GB/s."""

    time_us: float
    alg_bw: float
    bus_bw: float
    nwrong: Optional[int]  # None: not checked


@dataclass
class Point:
    """One message size of a series, averaged over the rows of that size."""

    size: int
    loom: Figures
    nccl: Optional[Figures]

    @property
    def ratio(self) -> Optional[float]:
        """loom busbw / NCCL busbw (from algbw, as the binaries compute it), or None."""
        if self.nccl is None or not self.nccl.alg_bw > 0:
            return None
        return self.loom.alg_bw / self.nccl.alg_bw


@dataclass
class Series:
    """The rows of one file with one type, op and placement, by size."""

    source: str  # the file it came from
    collective: str  # "all_reduce" (the program name without "_perf")
    dtype: str
    redop: str
    placement: str
    nranks: Optional[int]
    nccl_version: Optional[int]  # the compared library's, when there was one
    points: List[Point] = field(default_factory=list)
    mode: str = ""  # how it ran: "-g 2", "mpirun -np 2"

    @property
    def has_nccl(self) -> bool:
        return any(p.nccl is not None for p in self.points)


def _close_truncated(text: str) -> dict:
    """Parses a report whose run died mid-way: the binaries flush after every row, so the text
    ends inside "results". Keeps the rows that are whole and closes the list and the object."""
    match = re.search(r'"results"\s*:\s*\[', text)
    if match is None:
        raise ValueError("no results list")
    end = len(text)
    for _ in range(64):  # a row closes a few objects; a whole one is a few '}' back at most
        end = text.rfind("}", match.end(), end)
        if end < 0:
            break
        try:
            return json.loads(text[: end + 1] + "]}")
        except json.JSONDecodeError:
            pass
    return json.loads(text[: match.end()] + "]}")  # not even one whole row


def load_report(path: str) -> dict:
    """The parsed JSON of one report (a truncated one is closed after its last whole row)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as first:
        try:
            return _close_truncated(text)
        except (ValueError, json.JSONDecodeError):
            raise ValueError(f"{path}: not a perf-test JSON report ({first})") from None


def _figures(obj: Optional[dict]) -> Optional[Figures]:
    if not obj:
        return None
    time = obj.get("time", obj.get("cpu_time"))
    if time is None:
        return None
    return Figures(float(time), float(obj.get("alg_bw") or 0.0), float(obj.get("bus_bw") or 0.0),
                   obj.get("nwrong"))


def _mean(figures: List[Figures]) -> Figures:
    n = len(figures)
    checked = [f.nwrong for f in figures if f.nwrong is not None]
    return Figures(sum(f.time_us for f in figures) / n, sum(f.alg_bw for f in figures) / n,
                   sum(f.bus_bw for f in figures) / n, sum(checked) if checked else None)


def collective_name(report: dict) -> str:
    program = report.get("program") or ""
    if program.endswith("_perf"):
        return program[: -len("_perf")]
    return program or str(report.get("collective", "?")).lower()


def run_mode(config: dict) -> str:
    """How the binary ran, as its command line says it: "-g 2", "-t 2 -g 1", "mpirun -np 2 -R 1"."""
    nprocs = config.get("nprocs") or 1
    registered = " -R 1" if config.get("local_register") else ""
    if nprocs > 1:
        return f"mpirun -np {nprocs}{registered}"
    threads, gpus = config.get("nthreads") or 1, config.get("ngpus") or 1
    return (f"-t {threads} " if threads > 1 else "") + f"-g {gpus}{registered}"


def series_from_report(report: dict, source: str, placement: str = "out_of_place") -> List[Series]:
    """The series of one report for one placement, in the order their rows first appear."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}")
    compare = report.get("compare") or {}
    config = report.get("config") or {}
    groups: Dict[Tuple[str, str], Dict[int, Tuple[List[Figures], List[Figures]]]] = {}
    for row in report.get("results", []):
        loom = _figures(row.get(placement))
        if loom is None:
            continue
        nccl = _figures(row.get("nccl_" + placement))
        sizes = groups.setdefault((row.get("type", "?"), row.get("redop", "?")), {})
        loom_list, nccl_list = sizes.setdefault(int(row["size"]), ([], []))
        loom_list.append(loom)
        if nccl is not None:
            nccl_list.append(nccl)
    out = []
    for (dtype, redop), sizes in groups.items():
        s = Series(source=source, collective=collective_name(report), dtype=dtype, redop=redop,
                   placement=placement, nranks=config.get("nranks"),
                   nccl_version=compare.get("nccl_version"), mode=run_mode(config))
        for size in sorted(sizes):
            loom_list, nccl_list = sizes[size]
            s.points.append(Point(size, _mean(loom_list), _mean(nccl_list) if nccl_list else None))
        out.append(s)
    return out


def load_series(paths: List[str], placement: str = "out_of_place") -> List[Series]:
    series = []
    for path in paths:
        series.extend(series_from_report(load_report(path), path, placement))
    return series


def format_size(size: int) -> str:
    """8 -> "8B", 1024 -> "1K", 1536 -> "1.5K", 2**30 -> "1G" (binary units)."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            value = size / scale
            text = f"{value:.0f}" if value == int(value) else f"{value:.3g}"
            return text + unit
    return f"{size}B"


def _time(v: float) -> str:
    return f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _bw(v: float) -> str:
    """Two decimals from 1 GB/s up, three significant digits below (small sizes)."""
    if v >= 1 or v <= 0:
        return f"{v:.2f}"
    return f"{v:.{2 - math.floor(math.log10(v))}f}"


def series_labels(series: List[Series]) -> List[str]:
    """A name per series: the collective, then type and op where one collective has series of
    several, then the file where several series would otherwise read the same."""
    kinds: Dict[str, set] = {}
    for s in series:
        kinds.setdefault(s.collective, set()).add((s.dtype, s.redop))
    names = [f"{s.collective} {s.dtype} {s.redop}" if len(kinds[s.collective]) > 1 else
             s.collective for s in series]
    out = []
    for s, name in zip(series, names):
        if names.count(name) > 1:
            name += f" ({os.path.splitext(os.path.basename(s.source))[0]})"
        out.append(name)
    return out


def markdown_tables(series: List[Series]) -> str:
    """A markdown table per series (for --table)."""
    parts = []
    for s, label in zip(series, series_labels(series)):
        ranks = f"{s.nranks} ranks, " if s.nranks else ""
        nccl = f", NCCL {s.nccl_version}" if s.nccl_version else ""
        parts.append(f"### {label}\n\n{ranks}{s.dtype} {s.redop}, "
                     f"{s.placement.replace('_', '-')}{nccl} (from `{s.source}`)\n")
        parts.append("| size | loom time (us) | loom busbw (GB/s) | NCCL time (us) | "
                     "NCCL busbw (GB/s) | loom / NCCL |")
        parts.append("| ---: | ---: | ---: | ---: | ---: | ---: |")
        for p in s.points:
            nccl_cells = [_time(p.nccl.time_us), _bw(p.nccl.bus_bw)] if p.nccl else ["—", "—"]
            ratio = f"{p.ratio:.2f}" if p.ratio is not None else "—"
            cells = [format_size(p.size), _time(p.loom.time_us), _bw(p.loom.bus_bw), *nccl_cells,
                     ratio]
            parts.append("| " + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts)


def size_ticks(sizes: List[int], max_ticks: int = 12) -> List[int]:
    """Powers of two spanning the sizes, thinned to at most max_ticks."""
    lo = int(math.floor(math.log2(max(min(sizes), 1))))
    hi = int(math.ceil(math.log2(max(max(sizes), 1))))
    step = max(1, math.ceil((hi - lo + 1) / max_ticks))
    return [1 << k for k in range(lo, hi + 1, step)]


def plot(series: List[Series], out: str, title: str) -> None:
    """Writes the plot to `out` (PNG): one panel per collective, loom (solid) against NCCL
    (dashed) in bus bandwidth, one colour per way of running it (`-g 2`, `mpirun -np 2`),
    and under each panel the ratio loom / NCCL. Needs matplotlib."""
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    collectives: List[str] = []
    for s in series:
        if s.collective not in collectives:
            collectives.append(s.collective)
    modes: List[str] = []
    for s in series:
        if s.mode not in modes:
            modes.append(s.mode)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ncols = min(4, len(collectives))
    nrows = (len(collectives) + ncols - 1) // ncols
    fig, axes = plt.subplots(2 * nrows, ncols, figsize=(4.2 * ncols, 4.6 * nrows), squeeze=False,
                             gridspec_kw={"height_ratios": [3, 1] * nrows})
    for k, coll in enumerate(collectives):
        top, bottom = axes[2 * (k // ncols)][k % ncols], axes[2 * (k // ncols) + 1][k % ncols]
        sizes: List[int] = []
        for s in (s for s in series if s.collective == coll):
            color = colors[modes.index(s.mode) % len(colors)]
            kind = f" {s.dtype} {s.redop}" if len({(t.dtype, t.redop) for t in series if t.collective == coll}) > 1 else ""
            points = [p for p in s.points if p.size > 0]
            sizes.extend(p.size for p in points)
            top.plot([p.size for p in points], [p.loom.bus_bw for p in points], color=color, linestyle="-",
                     marker="o", markersize=2, label=f"loom {s.mode}{kind}")
            nccl = [p for p in points if p.nccl is not None]
            if nccl:
                top.plot([p.size for p in nccl], [p.nccl.bus_bw for p in nccl], color=color, linestyle="--",
                         marker="s", markersize=2, label=f"NCCL {s.mode}{kind}")
                ratio = [p for p in nccl if p.ratio is not None]
                bottom.plot([p.size for p in ratio], [p.ratio for p in ratio], color=color, marker="o",
                            markersize=2)
        bottom.axhline(1.0, color="gray", linewidth=0.8)
        top.set_title(coll)
        top.set_ylim(bottom=0)
        top.grid(True, alpha=0.3)
        bottom.grid(True, alpha=0.3)
        bottom.set_ylim(bottom=0)
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            if sizes:
                ticks = size_ticks(sizes, max_ticks=6)
                ax.set_xticks(ticks)
                ax.set_xticklabels([format_size(t) for t in ticks] if ax is bottom else [], fontsize="x-small")
                ax.minorticks_off()
        if k % ncols == 0:
            top.set_ylabel("busbw (GB/s)")
            bottom.set_ylabel("loom / NCCL")
        top.legend(fontsize="x-small")
    for k in range(len(collectives), nrows * ncols):
        axes[2 * (k // ncols)][k % ncols].axis("off")
        axes[2 * (k // ncols) + 1][k % ncols].axis("off")
    placement = " / ".join(p.replace("_", "-") for p in sorted({s.placement for s in series}))
    fig.suptitle(f"{title} ({placement}; x: bytes per rank)" if title else placement)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="plot_perf.py",
        description="Plot (PNG) or tabulate (markdown) perf-test --json reports, loom vs NCCL.")
    parser.add_argument("files", nargs="+", metavar="JSON", help="reports written with -J/--json")
    parser.add_argument("--out", help="PNG file to write")
    parser.add_argument("--title", default="", help="plot title")
    parser.add_argument("--table", action="store_true",
                        help="print a markdown table per input to stdout")
    parser.add_argument("--placement", choices=PLACEMENTS, default="out_of_place",
                        help="which columns to use (default: out_of_place)")
    args = parser.parse_args(argv)
    if not args.out and not args.table:
        parser.error("nothing to do: give --out FILE.png and/or --table")
    try:
        series = load_series(args.files, args.placement)
    except (OSError, ValueError, KeyError) as e:
        print(f"plot_perf.py: {e}", file=sys.stderr)
        return 1
    if not series:
        print("plot_perf.py: no result rows in " + ", ".join(args.files), file=sys.stderr)
        return 1
    if args.table:
        sys.stdout.write(markdown_tables(series))
    if args.out:
        try:
            plot(series, args.out, args.title)
        except ImportError as e:
            print(f"plot_perf.py: --out needs matplotlib ({e}); --table works without it",
                  file=sys.stderr)
            return 1
        print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
