// State shared by the runner (set-up, ranks, teardown) and the benchmark loop.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "nccl.h"
#include "perf_tests/harness/args.h"
#include "perf_tests/harness/collective.h"
#include "perf_tests/harness/json.h"
#include "perf_tests/harness/memory.h"
#include "perf_tests/harness/mpi_support.h"
#include "perf_tests/harness/nccl_api.h"
#include "perf_tests/harness/team.h"

namespace loom::perf {

// The libraries a run measures: Job::libraries[0] is the linked one (loom's), [1] the one
// --compare loaded (NVIDIA's NCCL), when asked for. Both run on the same buffers and streams.
constexpr size_t kMaxLibraries = 2;

// One rank's objects in one library.
struct LibraryRank {
  ncclComm_t comm = nullptr;
  void* sendHandle = nullptr;  // -R 1
  void* recvHandle = nullptr;
  ncclWindow_t sendWindow = nullptr;  // -R 2
  ncclWindow_t recvWindow = nullptr;
};

struct RankState {
  int rank = 0;
  int device = -1;  // CUDA device, or -1 on host memory
  cudaStream_t stream = nullptr;
  void* send = nullptr;  // maxBytes each
  void* recv = nullptr;
  std::vector<char> scratch;                   // device memory: host copy for filling and checking
  std::array<LibraryRank, kMaxLibraries> lib;  // indexed like Job::libraries
};

// One library's totals over the run, kept by the benchmark loop on the main thread.
struct LibraryTotals {
  int64_t errors = 0;   // measurements with a nonzero #wrong
  double busBwSum = 0;  // over every measurement
  int busBwCount = 0;
  double logRatioSum = 0;  // compared library only: sum of log(loom / it) over measurements
  int ratioCount = 0;
};

struct ThreadState {
  int thread = 0;
  bool isMain = false;  // thread 0 of process 0: prints and writes JSON
  std::vector<RankState> ranks;
  std::array<LibraryTotals, kMaxLibraries> totals;  // indexed like Job::libraries
};

// What a job is doing, for the -T watchdog's message: which step, in which library, at which
// size. Kept as relaxed atomics, set as the job moves from step to step (not per call). One
// record per process: with -t, the thread that moved last wrote it.
enum class Phase : int {
  kStart,    // before the communicators
  kInit,     // making communicators (ncclCommInitRank / InitAll)
  kWarmUp,   // warm-up calls and their completion
  kPrepare,  // filling input buffers
  kLaunch,   // enqueuing timed calls
  kWait,     // waiting for the stream(s) to finish the calls
  kCheck,    // the checked call and reading its result back
  kBarrier,  // waiting for the other ranks between steps
  kFinish,   // deregistering and destroying communicators
};

struct Where {
  std::atomic<int> phase{static_cast<int>(Phase::kStart)};
  std::atomic<int> lib{-1};  // index into Job::libraries, -1 where none applies
  std::atomic<size_t> bytes{0};
  std::atomic<int> inPlace{0};
};

struct Job {
  const CollectiveSpec* spec = nullptr;
  Options options;
  Mpi* mpi = nullptr;
  Memory* memory = nullptr;
  Team* team = nullptr;
  JsonReport* json = nullptr;             // open on the main process only
  std::vector<const NcclApi*> libraries;  // [0] linked (loom), [1] --compare's, if any
  int nprocs = 1;
  int proc = 0;
  int nranks = 1;
  std::string host;
  // Watchdog heartbeat: bumped at every step of progress (a counter, not a clock read: the
  // timed loop bumps it once per call).
  std::atomic<uint64_t> progress{0};
  Where where;
};

// Records where the job is (see Where); `lib` -1 leaves the library and size as they are,
// `inPlace` -1 the placement.
void setWhere(Job& job, Phase phase, int lib = -1, size_t bytes = 0, int inPlace = -1);
// "loom AllReduce, 8 B out of place: waiting for the stream to finish the calls", or as much
// of that as is known.
std::string describeWhere(const Job& job);

// Records progress for the -T watchdog.
void heartbeat(Job& job);

// Prints "<host>: Test failure: <message>" and ends the job (every process under MPI).
[[noreturn]] void fatal(const Job& job, const std::string& message);
// Same for a failed call into `nccl`, with its error string and ncclGetLastError's text; a
// call into the --compare library says which library failed.
[[noreturn]] void ncclFatal(const Job& job, const NcclApi& nccl, ncclResult_t result,
                            const char* call, const char* file, int line);

// Calls `call` (an expression on the NcclApi `nccl`) and ends the job if it fails.
#define LOOM_PERF_NCCL(job, nccl, call)                                                   \
  do {                                                                                    \
    const ncclResult_t loomPerfResult_ = (call);                                          \
    if (loomPerfResult_ != ncclSuccess) {                                                 \
      ::loom::perf::ncclFatal((job), (nccl), loomPerfResult_, #call, __FILE__, __LINE__); \
    }                                                                                     \
  } while (0)

#define LOOM_PERF_CHECK(job, call)                \
  do {                                            \
    const std::string loomPerfError_ = (call);    \
    if (!loomPerfError_.empty()) {                \
      ::loom::perf::fatal((job), loomPerfError_); \
    }                                             \
  } while (0)

// Runs every test of the job on this thread's ranks (bench.cc).
void runThreadTests(Job& job, ThreadState& thread);

}  // namespace loom::perf
