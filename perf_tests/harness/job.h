// State shared by the runner (set-up, ranks, teardown) and the benchmark loop.
#pragma once

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
#include "perf_tests/harness/team.h"

namespace loom::perf {

struct RankState {
  int rank = 0;
  int device = -1;  // CUDA device, or -1 on host memory
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* send = nullptr;  // maxBytes each
  void* recv = nullptr;
  std::vector<char> scratch;  // device memory: host copy for filling and checking
  void* sendHandle = nullptr;  // -R 1
  void* recvHandle = nullptr;
  ncclWindow_t sendWindow = nullptr;  // -R 2
  ncclWindow_t recvWindow = nullptr;
};

struct ThreadState {
  int thread = 0;
  bool isMain = false;  // thread 0 of process 0: prints and writes JSON
  std::vector<RankState> ranks;
  // Filled by the benchmark loop on the main thread.
  int64_t errors = 0;
  double busBwSum = 0;
  int busBwCount = 0;
};

struct Job {
  const CollectiveSpec* spec = nullptr;
  Options options;
  Mpi* mpi = nullptr;
  Memory* memory = nullptr;
  Team* team = nullptr;
  JsonReport* json = nullptr;  // open on the main process only
  int nprocs = 1;
  int proc = 0;
  int nranks = 1;
  std::string host;
  // Watchdog heartbeat (steady-clock nanoseconds of the last progress).
  std::atomic<int64_t> lastProgressNs{0};
};

// Records progress for the -T watchdog.
void heartbeat(Job& job);

// Prints "<host>: Test failure: <message>" and ends the job (every process under MPI).
[[noreturn]] void fatal(const Job& job, const std::string& message);
// Same for a failed NCCL call, with ncclGetLastError's text.
[[noreturn]] void ncclFatal(const Job& job, ncclResult_t result, const char* call,
                            const char* file, int line);

#define LOOM_PERF_NCCL(job, call)                                                \
  do {                                                                           \
    const ncclResult_t loomPerfResult_ = (call);                                 \
    if (loomPerfResult_ != ncclSuccess) {                                        \
      ::loom::perf::ncclFatal((job), loomPerfResult_, #call, __FILE__, __LINE__); \
    }                                                                            \
  } while (0)

#define LOOM_PERF_CHECK(job, call)                        \
  do {                                                    \
    const std::string loomPerfError_ = (call);            \
    if (!loomPerfError_.empty()) {                        \
      ::loom::perf::fatal((job), loomPerfError_);         \
    }                                                     \
  } while (0)

// Runs every test of the job on this thread's ranks (bench.cc).
void runThreadTests(Job& job, ThreadState& thread);

}  // namespace loom::perf
