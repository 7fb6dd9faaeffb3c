// What a perf binary tells the harness about its collective. One small .cc per binary
// (perf_tests/<name>_perf.cc) defines one CollectiveSpec; the harness does the rest.
#pragma once

#include <cstddef>

#include "nccl.h"
#include "perf_tests/harness/nccl_api.h"
#include "perf_tests/harness/values.h"

namespace loom::perf {

// Element counts for a test of `count` elements (size / type size) over `nranks` ranks, as
// nccl-tests defines them: what each rank sends and receives, the count argument of the call,
// and (per rank, multiplied by the rank) where the in-place send and receive buffers start
// inside the receive buffer.
struct CollCounts {
  size_t sendCount = 0;
  size_t recvCount = 0;
  size_t paramCount = 0;
  size_t sendInplaceOffset = 0;
  size_t recvInplaceOffset = 0;
};

// One call of the collective on one rank. Buffers are already offset for in-place runs.
struct RunArgs {
  const NcclApi* nccl = nullptr;  // the library to call (loom's, or --compare's)
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;  // CollCounts::paramCount
  ncclDataType_t type = ncclFloat32;
  ncclRedOp_t op = ncclSum;
  int root = 0;
  int rank = 0;
  int nranks = 1;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

struct CollectiveSpec {
  const char* program;  // "all_reduce_perf"
  const char* name;     // "AllReduce"
  bool hasOp;           // runs reduction operations (otherwise redop prints "none")
  bool hasRoot;         // runs per root (otherwise root prints -1)
  bool checkInPlace;    // false where in-place results are not defined (alltoall): "N/A"
  CollCounts (*counts)(size_t count, int nranks);
  // algbw = paramCount * typeSize * algFactor / time; busbw = algbw * busFactor.
  double (*algFactor)(int nranks);
  double (*busFactor)(int nranks);
  // Where rank `layout.rank`'s output element j comes from (see values.h). Every rank's
  // input element i holds inputValue(rank, i) over its CollCounts::sendCount elements.
  ExpectFn expect;
  // Issues the collective through args.nccl; for host memory it returns when complete.
  ncclResult_t (*run)(const RunArgs& args);
};

struct Bandwidth {
  double algBw = 0;  // GB/s (1e9 bytes)
  double busBw = 0;
};

// loom's bus bandwidth over the compared library's for the same call: their algbw ratio
// (equal to the busbw ratio, and defined on one rank too, where busbw is 0). NaN when the
// compared bandwidth is not positive.
double bandwidthRatio(double algBw, double comparedAlgBw);

// nccl-tests' bandwidths for a call of paramCount elements taking `seconds`.
Bandwidth computeBandwidth(const CollectiveSpec& spec, size_t paramCount, size_t typeSize,
                           double seconds, int nranks);

// Common factors.
inline double factorOne(int) {
  return 1.0;
}
inline double factorRanks(int nranks) {
  return static_cast<double>(nranks);
}
// (n-1)/n: allgather, reducescatter, alltoall.
inline double factorRing(int nranks) {
  return static_cast<double>(nranks - 1) / static_cast<double>(nranks);
}
// 2(n-1)/n: allreduce.
inline double factorAllReduce(int nranks) {
  return 2.0 * static_cast<double>(nranks - 1) / static_cast<double>(nranks);
}

}  // namespace loom::perf
