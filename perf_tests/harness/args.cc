#include "perf_tests/harness/args.h"

#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace loom::perf {
namespace {

struct Flag {
  char code;  // the short flag, or for long-only flags a code of our own
  std::string_view longName;
  bool longOnly = false;  // no short form
};

// nccl-tests' long names, plus ours. -M is nccl-tests' memory report, so our --memory, --json
// and --compare have no short form.
constexpr std::array<Flag, 27> kFlags = {{
    {'t', "nthreads"},     {'g', "ngpus"},          {'b', "minbytes"},
    {'e', "maxbytes"},     {'i', "stepbytes"},      {'f', "stepfactor"},
    {'n', "iters"},        {'m', "agg_iters"},      {'w', "warmup_iters"},
    {'N', "run_cycles"},   {'p', "parallel_init"},  {'c', "check"},
    {'o', "op"},           {'d', "datatype"},       {'r', "root"},
    {'z', "blocking"},     {'y', "stream_null"},    {'T', "timeout"},
    {'G', "cudagraph"},    {'C', "report_cputime"}, {'S', "report_timestamps"},
    {'a', "average"},      {'R', "local_register"}, {'J', "output_file"},
    {'M', "memory", true}, {'j', "json", true},     {'K', "compare", true},
}};

// Returns the short name of a flag token ("-b", "--minbytes", "--minbytes=8"), with any
// inline value; 0 when unknown.
char lookup(std::string_view token, std::optional<std::string_view>* inlineValue) {
  if (token.size() >= 2 && token[0] == '-' && token[1] == '-') {
    std::string_view name = token.substr(2);
    const size_t eq = name.find('=');
    if (eq != std::string_view::npos) {
      *inlineValue = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name == "help") return 'h';
    for (const Flag& f : kFlags) {
      if (f.longName == name) return f.code;
    }
    return 0;
  }
  if (token.size() >= 2 && token[0] == '-') {
    const char c = token[1];
    if (c == 'h') return 'h';
    for (const Flag& f : kFlags) {
      if (f.code == c && !f.longOnly) {
        if (token.size() > 2) *inlineValue = token.substr(2);
        return c;
      }
    }
  }
  return 0;
}

bool setInt(std::string_view value, int minValue, int* out) {
  const auto v = parseInteger(value);
  if (!v || *v < minValue || *v > std::numeric_limits<int>::max()) return false;
  *out = static_cast<int>(*v);
  return true;
}

bool setBool(std::string_view value, bool* out) {
  const auto v = parseInteger(value);
  if (!v || *v < 0) return false;
  *out = *v != 0;
  return true;
}

// Applies one flag. Returns an error message, or "" when fine.
std::string apply(char flag, std::string_view value, ParseResult* result) {
  Options& o = result->options;
  auto bad = [&](const char* what) {
    return std::string("invalid value '") + std::string(value) + "' for " + what;
  };
  switch (flag) {
    case 't': return setInt(value, 1, &o.nThreads) ? "" : bad("-t (nthreads, >= 1)");
    case 'g': return setInt(value, 1, &o.nGpus) ? "" : bad("-g (ngpus, >= 1)");
    case 'b': {
      const auto v = parseSize(value);
      if (!v) return bad("-b (minbytes)");
      o.minBytes = *v;
      return "";
    }
    case 'e': {
      const auto v = parseSize(value);
      if (!v) return bad("-e (maxbytes)");
      o.maxBytes = *v;
      return "";
    }
    case 'i': {
      const auto v = parseSize(value);
      if (!v) return bad("-i (stepbytes)");
      o.stepBytes = *v;
      return "";
    }
    case 'f': {
      const auto v = parseInteger(value);
      if (!v || *v < 0) return bad("-f (stepfactor)");
      o.stepFactor = static_cast<size_t>(*v);
      return "";
    }
    case 'n': return setInt(value, 1, &o.iters) ? "" : bad("-n (iters, >= 1)");
    case 'w': return setInt(value, 0, &o.warmupIters) ? "" : bad("-w (warmup_iters)");
    case 'm': return setInt(value, 1, &o.aggIters) ? "" : bad("-m (agg_iters, >= 1)");
    case 'N': return setInt(value, 0, &o.runCycles) ? "" : bad("-N (run_cycles)");
    case 'c': return setInt(value, 0, &o.check) ? "" : bad("-c (check)");
    case 'p': return setBool(value, &o.parallelInit) ? "" : bad("-p (parallel_init)");
    case 'z': return setBool(value, &o.blocking) ? "" : bad("-z (blocking)");
    case 'y': return setBool(value, &o.streamNull) ? "" : bad("-y (stream_null)");
    case 'C': return setBool(value, &o.reportCputime) ? "" : bad("-C (report_cputime)");
    case 'S': return setBool(value, &o.reportTimestamps) ? "" : bad("-S (report_timestamps)");
    case 'T': return setInt(value, 0, &o.timeoutSec) ? "" : bad("-T (timeout, seconds)");
    case 'G': return setInt(value, 0, &o.graphLaunches) ? "" : bad("-G (cudagraph)");
    case 'a': {
      int v = 0;
      if (!setInt(value, 0, &v) || v > 3) return bad("-a (average: 0 rank0, 1 avg, 2 min, 3 max)");
      o.average = v;
      return "";
    }
    case 'R': {
      int v = 0;
      if (!setInt(value, 0, &v) || v > 2) return bad("-R (local_register: 0, 1 or 2)");
      o.registration = v;
      return "";
    }
    case 'r': {
      const auto v = parseInteger(value);
      if (!v || *v < -1 || *v > std::numeric_limits<int>::max()) return bad("-r (root, >= -1)");
      o.root = static_cast<int>(*v);
      return "";
    }
    case 'o':
      if (value == "all") {
        o.op.reset();
        return "";
      }
      if (const auto op = parseOpName(value)) {
        o.op = *op;
        return "";
      }
      return bad("-o (op: sum, prod, max, min, avg, mulsum, all)");
    case 'd':
      if (value == "all") {
        o.type.reset();
        return "";
      }
      if (const auto t = parseTypeName(value)) {
        o.type = *t;
        return "";
      }
      return bad(
          "-d (datatype: int8, uint8, int32, uint32, int64, uint64, half, float, double, "
          "bfloat16, f8e4m3, f8e5m2, all)");
    case 'M':
      if (value == "host") {
        o.memory = MemoryKind::kHost;
      } else if (value == "device") {
        o.memory = MemoryKind::kDevice;
      } else if (value == "auto") {
        o.memory = MemoryKind::kAuto;
      } else {
        return bad("--memory (host, device or auto)");
      }
      return "";
    case 'K': {
      // "nccl" searches the usual places; "nccl=PATH" names the file.
      const std::string_view library = value.substr(0, value.find('='));
      if (library != "nccl") return bad("--compare (nccl or nccl=/path/to/libnccl.so.2)");
      o.compareNccl = true;
      o.compareNcclPath.clear();
      if (library.size() < value.size()) {
        o.compareNcclPath = std::string(value.substr(library.size() + 1));
        if (o.compareNcclPath.empty()) return bad("--compare (nccl=PATH needs a path)");
      }
      return "";
    }
    case 'j':
    case 'J':
      if (value.empty()) return bad("--json (a file name)");
      o.jsonPath = std::string(value);
      return "";
    default: return "unknown flag";
  }
}

}  // namespace

std::optional<long long> parseInteger(std::string_view text) {
  if (text.empty()) return std::nullopt;
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 0);
  if (errno != 0 || end == s.c_str() || *end != '\0') return std::nullopt;
  return v;
}

std::optional<size_t> parseSize(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::string s(text);
  double units = 1;
  switch (s.back()) {
    case 'G':
    case 'g': units = 1024.0 * 1024 * 1024; break;
    case 'M':
    case 'm': units = 1024.0 * 1024; break;
    case 'K':
    case 'k': units = 1024.0; break;
    default: break;
  }
  if (units != 1) s.pop_back();
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end == s.c_str() || *end != '\0' || !(v >= 0) || std::isinf(v)) {
    return std::nullopt;
  }
  const double bytes = v * units;
  if (bytes >= 18446744073709551615.0) return std::nullopt;
  return static_cast<size_t>(bytes);
}

ParseResult parseArgs(int argc, const char* const* argv) {
  ParseResult result;
  for (int i = 1; i < argc; ++i) {
    const std::string_view token = argv[i];
    std::optional<std::string_view> value;
    const char flag = lookup(token, &value);
    if (flag == 0) {
      result.error = "unknown option '" + std::string(token) + "'";
      return result;
    }
    if (flag == 'h') {
      result.help = true;
      return result;
    }
    if (!value) {
      if (i + 1 >= argc) {
        result.error = "option '" + std::string(token) + "' needs a value";
        return result;
      }
      value = std::string_view(argv[++i]);
    }
    const std::string error = apply(flag, *value, &result);
    if (!error.empty()) {
      result.error = error;
      return result;
    }
  }
  const Options& o = result.options;
  if (o.minBytes > o.maxBytes) {
    result.error = "invalid sizes for 'minbytes' and 'maxbytes': " + std::to_string(o.minBytes) +
                   " > " + std::to_string(o.maxBytes);
  } else if (o.graphLaunches > 0 && o.blocking) {
    // A blocking call waits for its stream, which a stream being captured cannot do.
    result.error = "-G (cudagraph) cannot be combined with -z 1 (blocking)";
  } else if (o.graphLaunches > 0 && o.streamNull) {
    result.error =
        "-G (cudagraph) cannot be combined with -y 1 (the default stream cannot be captured)";
  }
  return result;
}

std::vector<size_t> sizeSequence(size_t minBytes, size_t maxBytes, size_t stepBytes,
                                 size_t stepFactor) {
  std::vector<size_t> sizes;
  size_t size = minBytes;
  while (size <= maxBytes) {
    sizes.push_back(size);
    size_t next;
    if (stepFactor > 1) {
      next = size == 0 ? 1 : size * stepFactor;
      if (size != 0 && next / stepFactor != size) break;  // overflow
    } else {
      if (stepBytes == 0) break;
      next = size + stepBytes;
      if (next < size) break;
    }
    size = next;
  }
  return sizes;
}

std::vector<size_t> warmupSizes(size_t minBytes, size_t maxBytes) {
  return sizeSequence(minBytes, maxBytes, 0, 2);
}

std::string usage(std::string_view program) {
  std::string u = "USAGE: " + std::string(program) + " \n";
  const char* lines[] = {
      "[-t,--nthreads <num threads>]",
      "[-g,--ngpus <ranks per thread>]",
      "[-b,--minbytes <min size in bytes, K/M/G suffixes>]",
      "[-e,--maxbytes <max size in bytes>]",
      "[-i,--stepbytes <increment size>]",
      "[-f,--stepfactor <increment factor>]",
      "[-n,--iters <iteration count>]",
      "[-m,--agg_iters <aggregated iteration count>]",
      "[-w,--warmup_iters <warmup iteration count>]",
      "[-N,--run_cycles <cycle count> run & print each cycle (default: 1; 0=infinite)]",
      "[-p,--parallel_init <0/1>]",
      "[-c,--check <check iteration count>]",
      "[-o,--op <sum/prod/min/max/avg/mulsum/all>]",
      "[-d,--datatype <nccltype/all>]",
      "[-r,--root <root> (-1: every root)]",
      "[-z,--blocking <0/1>]",
      "[-y,--stream_null <0/1>]",
      "[-T,--timeout <time in seconds>]",
      "[-G,--cudagraph <num graph launches>]",
      "[-C,--report_cputime <0/1>]",
      "[-S,--report_timestamps <0/1> report timestamps (default 0)]",
      "[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>]",
      "[-R,--local_register <0/1/2> enable local (1) or symmetric (2) buffer registration]",
      "[--memory <host/device/auto> buffers in host or device memory (default: device where a "
      "GPU is present)]",
      "[-J,--json,--output_file <file> write every row and the configuration as JSON]",
      "[--compare <nccl/nccl=PATH> also run every size on NVIDIA's NCCL (libnccl.so.2 from PATH, "
      "else $NCCL_HOME/lib, python's nvidia/nccl/lib, /usr/lib/x86_64-linux-gnu, "
      "/usr/local/cuda/lib64) and print its time, busbw and loom/NCCL ratio]",
      "[-h,--help]",
  };
  for (const char* line : lines) u += std::string("\t") + line + " \n";
  return u;
}

}  // namespace loom::perf
