#include "perf_tests/harness/format.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "perf_tests/harness/collective.h"
#include "perf_tests/harness/version.h"

namespace loom::perf {
namespace {

std::string printfString(const char* format, ...) __attribute__((format(printf, 1, 2)));

std::string printfString(const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, format, args);
  va_end(args);
  return out;
}

// Characters of one time/algbw/busbw/#wrong group ("  %7s  %6s  %6s  %6s").
constexpr size_t kGroupWidth = 33;

std::string centered(std::string_view text, size_t width) {
  const size_t left = text.size() < width ? (width - text.size()) / 2 : 0;
  std::string out(left, ' ');
  out += text;
  if (out.size() < width) out.resize(width, ' ');
  return out;
}

}  // namespace

std::string formatNumber(double value, int width) {
  // Digits before the decimal point (0 below 1), as nccl-tests counts them.
  int power = 0;
  for (double bound = 1; value >= bound && power < 40; bound *= 10) power++;
  if (power < width - 2) return printfString("%*.2f", width, value);
  if (power < width - 1) return printfString("%*.1f", width, value);
  if (power < width + 1) return printfString("%*.0f", width, value);
  if (width >= 7) return printfString("%*.1e", width, value);
  return printfString("%*.0e", width, value);
}

std::string formatRunHeader(const Options& o, std::string_view program, int libraryVersion) {
  std::string s;
  s += printfString("# loom perf tests version %s nccl-headers=%d nccl-library=%d\n",
                    kPerfTestsVersion, NCCL_VERSION_CODE, libraryVersion);
  s += printfString("# Collective test starting: %.*s\n", static_cast<int>(program.size()),
                    program.data());
  const bool byFactor = o.stepFactor > 1;
  s += printfString(
      "# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d "
      "agg iters: %d validation: %d graph: %d\n",
      o.nThreads, o.nGpus, static_cast<long>(o.minBytes), static_cast<long>(o.maxBytes),
      static_cast<long>(byFactor ? o.stepFactor : o.stepBytes), byFactor ? "factor" : "bytes",
      o.warmupIters, o.iters, o.aggIters, o.check, o.graphLaunches);
  if (o.blocking) {
    s += "# Blocking Enabled: wait for completion and barrier after each collective \n";
  }
  if (o.parallelInit) {
    s += "# Parallel Init Enabled: threads call into NcclInitRank concurrently \n";
  }
  return s;
}

std::string formatDeviceLine(int rank, int group, int pid, std::string_view host, int device,
                             std::string_view busId, std::string_view name) {
  return printfString("#  Rank %2d Group %2d Pid %6d on %10.*s device %2d [%.*s] %.*s\n", rank,
                      group, pid, static_cast<int>(host.size()), host.data(), device,
                      static_cast<int>(busId.size()), busId.data(), static_cast<int>(name.size()),
                      name.data());
}

std::string formatTableHeader(bool reportCputime, bool reportTimestamps, bool compare) {
  const char* tsLabel = reportTimestamps ? "timestamp" : "";
  const int tsPad = reportTimestamps ? 19 : 0;
  const char* tsFormat = reportTimestamps ? "%Y-%m-%d %H:%M:%S" : "";
  const char* time = reportCputime ? "cputime" : "time";
  std::string s = "#\n";
  if (compare) {
    s += "# NCCL columns: the same calls on the --compare library; ratio = loom busbw / NCCL "
         "busbw (> 1: loom is faster)\n#\n";
  }
  std::string groups = printfString(
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          ",
      "", "", "", "", "");
  std::string names;
  std::string units;
  if (compare) {
    // Loom's two groups end after the 52 characters of the row start and two groups.
    groups.resize(52 + 2 * kGroupWidth, ' ');
    groups += centered("NCCL out-of-place", kGroupWidth) + centered("NCCL in-place", kGroupWidth);
    for (int i = 0; i < 2; ++i) {
      names += printfString("  %7s  %6s  %6s  %6s", time, "busbw", "#wrong", "ratio");
      units += printfString("  %7s  %6s  %6s  %6s", "(us)", "(GB/s)", "", "");
    }
  }
  s += groups + "\n";
  s += printfString("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s%s %*s\n",
                    "size", "count", "type", "redop", "root", time, "algbw", "busbw", "#wrong",
                    time, "algbw", "busbw", "#wrong", names.c_str(), tsPad, tsLabel);
  s += printfString("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s%s %*s\n",
                    "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)",
                    "(GB/s)", "(GB/s)", "", units.c_str(), tsPad, tsFormat);
  return s;
}

std::string formatRowStart(size_t bytes, size_t count, std::string_view typeName,
                           std::string_view opName, int root) {
  const std::string rootText = printfString("%6i", root);
  return printfString("%12li  %12li  %8.*s  %6.*s  %6s", static_cast<long>(bytes),
                      static_cast<long>(count), static_cast<int>(typeName.size()), typeName.data(),
                      static_cast<int>(opName.size()), opName.data(), rootText.c_str());
}

std::string formatRowResult(double timeUsec, double algBw, double busBw, bool checked,
                            int64_t wrong) {
  const std::string t = formatNumber(timeUsec, 7);
  const std::string a = formatNumber(algBw, 6);
  const std::string b = formatNumber(busBw, 6);
  if (checked) {
    return printfString("  %7s  %6s  %6s  %6g", t.c_str(), a.c_str(), b.c_str(),
                        static_cast<double>(wrong));
  }
  return printfString("  %7s  %6s  %6s    N/A", t.c_str(), a.c_str(), b.c_str());
}

std::string formatCompareResult(const Measurement& loom, const Measurement& compared) {
  const std::string t = formatNumber(compared.timeUsec, 7);
  const std::string b = formatNumber(compared.busBw, 6);
  const std::string wrong =
      compared.checked ? printfString("%6g", static_cast<double>(compared.wrong)) : "   N/A";
  const double ratio = bandwidthRatio(loom.algBw, compared.algBw);
  const std::string r = std::isfinite(ratio) ? printfString("%6.2f", ratio) : "   N/A";
  return printfString("  %7s  %6s  %6s  %6s", t.c_str(), b.c_str(), wrong.c_str(), r.c_str());
}

std::string formatFooter(int64_t errors, double avgBusBw, double minBw, std::string_view program,
                         const CompareSummary* compare) {
  const char* bwVerdict = minBw < 0 ? "" : (avgBusBw < minBw * 0.9 ? "FAILED" : "OK");
  std::string s;
  s += printfString("# %-20s : %lld %s\n", "Out of bounds values", static_cast<long long>(errors),
                    errors ? "FAILED" : "OK");
  s += printfString("# %-20s : %g %s\n", "Avg bus bandwidth", avgBusBw, bwVerdict);
  if (compare != nullptr) {
    s += printfString("# %-25s : %lld %s\n", "NCCL out of bounds values",
                      static_cast<long long>(compare->errors), compare->errors ? "FAILED" : "OK");
    s += printfString("# %-25s : %g\n", "NCCL avg bus bandwidth", compare->avgBusBw);
    s += printfString("# %-25s : %.3g (of the averages), %.3g (geometric mean over rows)\n",
                      "loom/NCCL busbw ratio", compare->avgRatio, compare->geomeanRatio);
  }
  s += "#\n";
  s += printfString("# Collective test concluded: %.*s\n", static_cast<int>(program.size()),
                    program.data());
  s += "#\n";
  return s;
}

double combineTimes(const double* values, size_t n, int average) {
  if (n == 0) return 0;
  switch (average) {
    case 0: return values[0];
    case 2: return *std::min_element(values, values + n);
    case 3: return *std::max_element(values, values + n);
    default: {
      double sum = 0;
      for (size_t i = 0; i < n; ++i) sum += values[i];
      return sum / static_cast<double>(n);
    }
  }
}

}  // namespace loom::perf
