// Command-line options of the perf binaries: nccl-tests' flags plus --memory, --json and
// --compare.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nccl.h"
#include "perf_tests/harness/types.h"

namespace loom::perf {

enum class MemoryKind { kAuto, kHost, kDevice };

struct Options {
  int nThreads = 1;                                  // -t
  int nGpus = 1;                                     // -g: ranks per thread
  size_t minBytes = 32 << 20;                        // -b
  size_t maxBytes = 32 << 20;                        // -e
  size_t stepBytes = 1 << 20;                        // -i
  size_t stepFactor = 1;                             // -f (>1 multiplies, otherwise -i adds)
  int iters = 20;                                    // -n
  int warmupIters = 1;                               // -w
  int aggIters = 1;                                  // -m
  int runCycles = 1;                                 // -N (0: forever)
  int check = 1;                                     // -c: check iterations (0: no check)
  std::optional<OpKind> op = OpKind::kSum;           // -o (nullopt: all)
  std::optional<ncclDataType_t> type = ncclFloat32;  // -d (nullopt: all)
  int root = 0;                                      // -r (-1: every root)
  int average = 1;                                   // -a: 0 rank 0, 1 average, 2 min, 3 max
  bool blocking = false;                             // -z
  int graphLaunches = 0;                  // -G: capture the timed calls, launch them this often
  bool parallelInit = false;              // -p
  int registration = 0;                   // -R: 0 none, 1 ncclCommRegister, 2 window (symmetric)
  bool reportCputime = false;             // -C
  bool reportTimestamps = false;          // -S
  int timeoutSec = 0;                     // -T (0: none)
  bool streamNull = false;                // -y
  MemoryKind memory = MemoryKind::kAuto;  // --memory host|device
  std::string jsonPath;                   // --json FILE (also -J FILE)
  bool compareNccl = false;               // --compare nccl[=PATH]: also measure a second NCCL
  std::string compareNcclPath;            // its PATH; empty: search (see nccl_api.h)
};

struct ParseResult {
  Options options;
  bool help = false;               // -h: print usage() and exit 0
  std::string error;               // non-empty: say it, print usage, exit non-zero
  std::vector<std::string> notes;  // things accepted but not supported, to print as "# ..."
};

// Parses argv[1..argc). Pure: reads no environment and prints nothing.
ParseResult parseArgs(int argc, const char* const* argv);
// The usage text (program name substituted).
std::string usage(std::string_view program);

// "1M", "64K", "2G", "1.5k", "100" -> bytes (binary units); nullopt when malformed or negative.
std::optional<size_t> parseSize(std::string_view text);
// Parses a whole decimal/hex/octal integer (strtol base 0); nullopt on junk.
std::optional<long long> parseInteger(std::string_view text);

// The sizes the benchmark runs: from min, times factor (when > 1) or plus stepBytes, while
// <= max. A 0 start steps to 1 under a factor; a 0 step runs one size.
std::vector<size_t> sizeSequence(size_t minBytes, size_t maxBytes, size_t stepBytes,
                                 size_t stepFactor);
// Warm-up sizes: min, doubling, while <= max (nccl-tests' warm-up walk).
std::vector<size_t> warmupSizes(size_t minBytes, size_t maxBytes);

}  // namespace loom::perf
