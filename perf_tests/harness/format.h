// The text the perf binaries print, column for column as nccl-tests 2.17 prints it.
// Every function returns the text (with its trailing newline where the line ends), so the
// runner prints it and the tests compare it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "perf_tests/harness/args.h"
#include "perf_tests/harness/json.h"

namespace loom::perf {

// nccl-tests' number format: fits `value` in `width` characters with 2, 1 or 0 decimals, then
// in exponent notation.
std::string formatNumber(double value, int width);

// "# loom perf tests version ... nccl-headers=N nccl-library=N", "# Collective test starting",
// the nThread/nGpus/... line, the blocking / parallel-init lines, and "#".
std::string formatRunHeader(const Options& options, std::string_view program, int libraryVersion);
// "#  Rank %2d Group %2d Pid %6d on %10s device %2d [busid] name".
std::string formatDeviceLine(int rank, int group, int pid, std::string_view host, int device,
                             std::string_view busId, std::string_view name);
// "#", the two-level column header and the units line. `compare` (--compare) adds, after
// loom's in-place columns, "NCCL out-of-place" and "NCCL in-place" groups of time, busbw,
// #wrong and ratio (loom busbw / NCCL busbw), preceded by a line that says so.
std::string formatTableHeader(bool reportCputime, bool reportTimestamps, bool compare = false);
// "%12li  %12li  %8s  %6s  %6i": size, count, type, redop, root.
std::string formatRowStart(size_t bytes, size_t count, std::string_view typeName,
                           std::string_view opName, int root);
// "  %7s  %6s  %6s  %6g" (or "    N/A" for #wrong when not checked): time, algbw, busbw, wrong.
std::string formatRowResult(double timeUsec, double algBw, double busBw, bool checked,
                            int64_t wrong);
inline std::string formatRowResult(const Measurement& m) {
  return formatRowResult(m.timeUsec, m.algBw, m.busBw, m.checked, m.wrong);
}
// "  %7s  %6s  %6s  %6s": the compared library's time, busbw and #wrong (or N/A), then
// bandwidthRatio(loom, compared) with two decimals (N/A when undefined).
std::string formatCompareResult(const Measurement& loom, const Measurement& compared);
// "# Out of bounds values : N OK|FAILED", "# Avg bus bandwidth    : X [OK|FAILED]", then with
// --compare (compare not null) "# NCCL out of bounds values : N OK|FAILED", "# NCCL avg bus
// bandwidth : X" and "# loom/NCCL busbw ratio : R (average), G (geometric mean)", then "#",
// "# Collective test concluded: program". minBw < 0: not checked.
std::string formatFooter(int64_t errors, double avgBusBw, double minBw, std::string_view program,
                         const CompareSummary* compare = nullptr);

// Combines per-rank times as -a says: 0 first, 1 mean, 2 min, 3 max. (Pure reference of what
// the runner does across threads and processes.)
double combineTimes(const double* values, size_t n, int average);

}  // namespace loom::perf
