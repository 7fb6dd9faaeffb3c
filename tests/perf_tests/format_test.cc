#include "perf_tests/harness/format.h"

#include <gtest/gtest.h>

namespace loom::perf {
namespace {

TEST(FormatNumber, NcclTestsWidthRules) {
  EXPECT_EQ(formatNumber(19.01, 7), "  19.01");
  EXPECT_EQ(formatNumber(0.0, 7), "   0.00");
  EXPECT_EQ(formatNumber(1234.567, 7), "1234.57");
  EXPECT_EQ(formatNumber(12345.6, 7), "12345.6");
  EXPECT_EQ(formatNumber(123456.7, 7), " 123457");
  EXPECT_EQ(formatNumber(1234567.0, 7), "1234567");
  EXPECT_EQ(formatNumber(12345678.0, 7), "1.2e+07");
  EXPECT_EQ(formatNumber(0.004, 6), "  0.00");
  EXPECT_EQ(formatNumber(123.456, 6), "123.46");
  EXPECT_EQ(formatNumber(1234.5, 6), "1234.5");
  EXPECT_EQ(formatNumber(12345.6, 6), " 12346");
  EXPECT_EQ(formatNumber(1e7, 6), " 1e+07");
  EXPECT_EQ(formatNumber(1.0 / 0.0, 7).size(), 7u);  // no endless digit count
}

TEST(FormatRow, ColumnsAndWidths) {
  EXPECT_EQ(formatRowStart(8, 2, "float", "sum", -1),
            "           8             2     float     sum      -1");
  EXPECT_EQ(formatRowStart(33554432, 8388608, "bfloat16", "none", 3),
            "    33554432       8388608  bfloat16    none       3");
  EXPECT_EQ(formatRowResult(19.01, 0.0004, 0.0007, true, 0), "    19.01    0.00    0.00       0");
  EXPECT_EQ(formatRowResult(1523.4, 22.03, 38.55, true, 12), "  1523.40   22.03   38.55      12");
  EXPECT_EQ(formatRowResult(5.5, 1.5, 2.25, false, 0), "     5.50    1.50    2.25    N/A");
  // Row = 5 + 2 x 4 columns; the header's widths line up with it.
  const std::string row = formatRowStart(8, 2, "float", "sum", -1) +
                          formatRowResult(1, 1, 1, true, 0) + formatRowResult(1, 1, 1, true, 0);
  EXPECT_EQ(row.size(), 118u);
}

TEST(FormatHeader, TableHeaderLines) {
  const std::string h = formatTableHeader(false, false);
  // Lines as nccl-tests 2.17 prints them (its printf formats, evaluated).
  EXPECT_EQ(h, std::string("#\n") +
                   "#                                                              out-of-place    "
                   "                   in-place          \n" +
                   "#       size         count      type   redop    root     time   algbw   busbw  "
                   "#wrong     time   algbw   busbw  #wrong \n" +
                   "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)  "
                   "           (us)  (GB/s)  (GB/s)         \n");
  EXPECT_NE(formatTableHeader(true, false).find("cputime"), std::string::npos);
  EXPECT_NE(formatTableHeader(false, true).find("timestamp"), std::string::npos);
}

TEST(FormatHeader, RunHeader) {
  Options o;
  o.nGpus = 4;
  o.minBytes = 8;
  o.maxBytes = 128 << 20;
  o.stepFactor = 2;
  const std::string h = formatRunHeader(o, "all_reduce_perf", 22809);
  EXPECT_EQ(h,
            "# loom perf tests version 0.1.0 nccl-headers=22809 nccl-library=22809\n"
            "# Collective test starting: all_reduce_perf\n"
            "# nThread 1 nGpus 4 minBytes 8 maxBytes 134217728 step: 2(factor) warmup iters: 1 "
            "iters: 20 agg iters: 1 validation: 1 graph: 0\n");
  o.stepFactor = 1;
  o.blocking = true;
  o.parallelInit = true;
  const std::string b = formatRunHeader(o, "x", 1);
  EXPECT_NE(b.find("step: 1048576(bytes)"), std::string::npos);
  EXPECT_NE(b.find("# Blocking Enabled"), std::string::npos);
  EXPECT_NE(b.find("# Parallel Init Enabled"), std::string::npos);
}

TEST(FormatHeader, DeviceLine) {
  EXPECT_EQ(formatDeviceLine(3, 0, 4242, "node1", 1, "0000:18:00.0", "NVIDIA H200"),
            "#  Rank  3 Group  0 Pid   4242 on      node1 device  1 [0000:18:00.0] NVIDIA H200\n");
  EXPECT_EQ(formatDeviceLine(0, 0, 7, "h", -1, "host", "host memory"),
            "#  Rank  0 Group  0 Pid      7 on          h device -1 [host] host memory\n");
}

TEST(FormatFooter, Lines) {
  EXPECT_EQ(formatFooter(0, 12.5, -1, "all_reduce_perf"),
            "# Out of bounds values : 0 OK\n"
            "# Avg bus bandwidth    : 12.5 \n"
            "#\n"
            "# Collective test concluded: all_reduce_perf\n"
            "#\n");
  const std::string failed = formatFooter(2, 1.0, 10.0, "p");
  EXPECT_NE(failed.find("# Out of bounds values : 2 FAILED\n"), std::string::npos);
  EXPECT_NE(failed.find("# Avg bus bandwidth    : 1 FAILED\n"), std::string::npos);
  EXPECT_NE(formatFooter(0, 9.5, 10.0, "p").find(": 9.5 OK\n"), std::string::npos);
}

TEST(FormatCompare, ColumnsLineUpWithTheHeader) {
  const std::string h = formatTableHeader(false, false, /*compare=*/true);
  EXPECT_NE(h.find("ratio = loom busbw / NCCL busbw"), std::string::npos) << h;
  EXPECT_NE(h.find("NCCL out-of-place"), std::string::npos);
  EXPECT_NE(h.find("NCCL in-place"), std::string::npos);
  // The header without --compare is unchanged (nccl-tests' layout).
  EXPECT_EQ(formatTableHeader(false, false, false), formatTableHeader(false, false));

  Measurement loom{10.0, 2.0, 3.0, true, 0};
  Measurement nccl{5.0, 4.0, 6.0, true, 0};
  EXPECT_EQ(formatCompareResult(loom, nccl), "     5.00    6.00       0    0.50");
  nccl.checked = false;
  nccl.algBw = 0;
  EXPECT_EQ(formatCompareResult(loom, nccl), "     5.00    6.00     N/A     N/A");
  nccl = {1.0, 1.0, 1.0, true, 7};
  EXPECT_EQ(formatCompareResult(loom, nccl), "     1.00    1.00       7    2.00");

  // Each header line's column names end where the row's columns end.
  const std::string row = formatRowStart(8, 2, "float", "sum", -1) +
                          formatRowResult(1, 1, 1, true, 0) + formatRowResult(1, 1, 1, true, 0) +
                          formatCompareResult(loom, nccl) + formatCompareResult(loom, nccl);
  const size_t names = h.find("#       size");
  ASSERT_NE(names, std::string::npos);
  const std::string namesLine = h.substr(names, h.find('\n', names) - names);
  EXPECT_EQ(namesLine.find_last_not_of(' ') + 1, row.size()) << namesLine << "\n" << row;
}

TEST(FormatCompare, Footer) {
  CompareSummary c;
  c.errors = 0;
  c.avgBusBw = 10;
  c.avgRatio = 1.25;
  c.geomeanRatio = 1.1;
  EXPECT_EQ(formatFooter(0, 12.5, -1, "all_reduce_perf", &c),
            "# Out of bounds values : 0 OK\n"
            "# Avg bus bandwidth    : 12.5 \n"
            "# NCCL out of bounds values : 0 OK\n"
            "# NCCL avg bus bandwidth    : 10\n"
            "# loom/NCCL busbw ratio     : 1.25 (of the averages), 1.1 (geometric mean over rows)\n"
            "#\n"
            "# Collective test concluded: all_reduce_perf\n"
            "#\n");
  c.errors = 3;
  EXPECT_NE(formatFooter(0, 1, -1, "p", &c).find("NCCL out of bounds values : 3 FAILED"),
            std::string::npos);
}

TEST(CombineTimes, AverageModes) {
  const double t[] = {4, 1, 7};
  EXPECT_EQ(combineTimes(t, 3, 0), 4);
  EXPECT_EQ(combineTimes(t, 3, 1), 4);
  EXPECT_EQ(combineTimes(t, 3, 2), 1);
  EXPECT_EQ(combineTimes(t, 3, 3), 7);
}

}  // namespace
}  // namespace loom::perf
