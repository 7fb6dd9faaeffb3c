#!/usr/bin/env python3
"""Tests of scripts/plot_perf.py: parsing and tables on made-up reports and, when
PERF_COMPARE_JSON names one, on a report that all_reduce_perf --compare wrote (ctest sets it);
the plot itself only where matplotlib is installed."""

import importlib.util
import json
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "plot_perf.py")
spec = importlib.util.spec_from_file_location("plot_perf", SCRIPT)
plot_perf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_perf)

try:
    import matplotlib  # noqa: F401  pylint: disable=unused-import
    HAVE_MATPLOTLIB = True
except ImportError:
    HAVE_MATPLOTLIB = False


def measurement(time, bw, nwrong=0):
    return {"time": time, "alg_bw": bw, "bus_bw": bw * 1.5, "nwrong": nwrong}


def row(size, loom_time, nccl_time=None, dtype="float", redop="sum"):
    r = {"size": size, "count": size // 4, "type": dtype, "redop": redop, "root": -1,
         "out_of_place": measurement(loom_time, size / loom_time / 1e3),
         "in_place": measurement(loom_time * 2, size / loom_time / 2e3)}
    if nccl_time is not None:
        r["nccl_out_of_place"] = measurement(nccl_time, size / nccl_time / 1e3)
        r["nccl_in_place"] = measurement(nccl_time, size / nccl_time / 1e3)
    return r


def report(rows, program="all_reduce_perf", compare=True):
    r = {"version": 1, "program": program, "collective": "AllReduce",
         "config": {"nranks": 4}, "results": rows}
    if compare:
        r["compare"] = {"library": "nccl", "path": "/x/libnccl.so.2", "nccl_version": 22807}
    return r


def write(tmp, name, obj, text=None):
    path = os.path.join(tmp, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text if text is not None else json.dumps(obj))
    return path


class ParseTest(unittest.TestCase):
    def test_sizes_and_ratio(self):
        series = plot_perf.series_from_report(
            report([row(1024, 10.0, 20.0), row(8, 5.0, 4.0)]), "a.json")
        self.assertEqual(len(series), 1)
        s = series[0]
        self.assertEqual(s.collective, "all_reduce")
        self.assertEqual(s.nranks, 4)
        self.assertEqual(s.nccl_version, 22807)
        self.assertEqual([p.size for p in s.points], [8, 1024])  # sorted
        self.assertAlmostEqual(s.points[1].ratio, 2.0)  # NCCL twice as slow
        self.assertAlmostEqual(s.points[0].ratio, 0.8)
        self.assertAlmostEqual(s.points[1].loom.time_us, 10.0)

    def test_repeated_sizes_are_averaged_and_in_place_is_selectable(self):
        rows = [row(64, 10.0, 10.0), row(64, 30.0, 10.0)]
        s = plot_perf.series_from_report(report(rows), "a.json")[0]
        self.assertEqual(len(s.points), 1)
        self.assertAlmostEqual(s.points[0].loom.time_us, 20.0)
        s = plot_perf.series_from_report(report(rows), "a.json", "in_place")[0]
        self.assertAlmostEqual(s.points[0].loom.time_us, 40.0)

    def test_without_compare_there_is_no_nccl(self):
        s = plot_perf.series_from_report(report([row(64, 10.0)], compare=False), "a.json")[0]
        self.assertFalse(s.has_nccl)
        self.assertIsNone(s.points[0].ratio)
        self.assertIn("| 64B | 10.0 |", plot_perf.markdown_tables([s]))

    def test_one_series_per_type_and_op(self):
        rows = [row(8, 1.0, 1.0, "float", "sum"), row(8, 1.0, 1.0, "half", "max")]
        series = plot_perf.series_from_report(report(rows), "a.json")
        self.assertEqual([(s.dtype, s.redop) for s in series], [("float", "sum"), ("half", "max")])
        self.assertEqual(plot_perf.series_labels(series),
                         ["all_reduce float sum", "all_reduce half max"])
        other = plot_perf.series_from_report(report([row(8, 1.0)], "all_gather_perf"), "b.json")
        self.assertEqual(plot_perf.series_labels(other + series[:1]), ["all_gather", "all_reduce"])

    def test_labels_name_the_file_only_when_needed(self):
        with tempfile.TemporaryDirectory() as tmp:
            a = write(tmp, "run1.json", report([row(8, 1.0, 1.0)]))
            b = write(tmp, "run2.json", report([row(8, 1.0, 1.0)]))
            c = write(tmp, "ag.json", report([row(8, 1.0, 1.0)], program="all_gather_perf"))
            series = plot_perf.load_series([a, b, c])
        self.assertEqual(plot_perf.series_labels(series),
                         ["all_reduce (run1)", "all_reduce (run2)", "all_gather"])

    def test_truncated_report_keeps_whole_rows(self):
        text = json.dumps(report([row(8, 1.0, 1.0), row(16, 1.0, 1.0)]))
        cut = text[: text.rfind('{"size": 16')] + '{"size": 16, "cou'
        with tempfile.TemporaryDirectory() as tmp:
            path = write(tmp, "cut.json", None, cut)
            series = plot_perf.load_series([path])
            self.assertEqual([p.size for p in series[0].points], [8])
            bad = write(tmp, "bad.json", None, "not json")
            with self.assertRaises(ValueError):
                plot_perf.load_series([bad])

    def test_size_labels_and_ticks(self):
        self.assertEqual([plot_perf.format_size(s) for s in (8, 1024, 1536, 1 << 20, 1 << 30)],
                         ["8B", "1K", "1.5K", "1M", "1G"])
        ticks = plot_perf.size_ticks([8, 1 << 30])
        self.assertLessEqual(len(ticks), 12)
        self.assertEqual(ticks[0], 8)
        self.assertTrue(all(t & (t - 1) == 0 for t in ticks))

    def test_table(self):
        s = plot_perf.series_from_report(report([row(1 << 20, 100.0, 200.0)]), "a.json")
        table = plot_perf.markdown_tables(s)
        self.assertIn("| size | loom time (us) | loom busbw (GB/s) | NCCL time (us) | "
                      "NCCL busbw (GB/s) | loom / NCCL |", table)
        self.assertIn("| 1M | 100.0 | 15.73 | 200.0 | 7.86 | 2.00 |", table)
        self.assertIn("NCCL 22807", table)

    def test_main_needs_something_to_do(self):
        with self.assertRaises(SystemExit):
            plot_perf.main(["x.json"])
        self.assertEqual(plot_perf.main(["--table", "/nonexistent.json"]), 1)


@unittest.skipUnless(os.environ.get("PERF_COMPARE_JSON"), "PERF_COMPARE_JSON not set")
class CompareRunTest(unittest.TestCase):
    """A report written by all_reduce_perf --compare nccl=... (see CMakeLists.txt)."""

    def setUp(self):
        self.path = os.environ["PERF_COMPARE_JSON"]
        self.report = plot_perf.load_report(self.path)

    def test_every_row_has_both_libraries(self):
        rows = self.report["results"]
        self.assertGreater(len(rows), 0)
        for r in rows:
            for key in ("out_of_place", "in_place", "nccl_out_of_place", "nccl_in_place"):
                self.assertEqual(r[key]["nwrong"], 0, (r["size"], key))
            self.assertIn("out_of_place", r["bus_bw_ratio"])
        self.assertEqual(self.report["nccl_out_of_bounds"]["count"], 0)
        self.assertIn("bandwidth", self.report["nccl_average_bus_bandwidth"])

    def test_series_and_table(self):
        series = plot_perf.load_series([self.path])
        self.assertEqual(len(series), 1)
        s = series[0]
        self.assertEqual(s.collective, "all_reduce")
        self.assertTrue(s.has_nccl)
        self.assertEqual([p.size for p in s.points],
                         sorted({r["size"] for r in self.report["results"]}))
        for p, r in zip(s.points, self.report["results"]):
            expected = r["bus_bw_ratio"]["out_of_place"]
            if expected is not None:
                self.assertAlmostEqual(p.ratio, expected, places=5)
        table = plot_perf.markdown_tables(series)
        self.assertEqual(table.count("\n| "), len(s.points) + 2)  # header, rule, a row per size

    @unittest.skipUnless(HAVE_MATPLOTLIB, "matplotlib is not installed")
    def test_plot_writes_a_png(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "busbw.png")
            self.assertEqual(plot_perf.main(["--out", out, "--title", "host", self.path]), 0)
            with open(out, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    unittest.main()
