// all_reduce_perf: ncclAllReduce. busbw = algbw * 2(n-1)/n.
#include "perf_tests/specs.h"

namespace loom::perf {
namespace {

CollCounts counts(size_t count, int) {
  return {count, count, count, 0, 0};
}

Source expect(const RankLayout&, size_t j) {
  return Source::reduce(j);
}

ncclResult_t run(const RunArgs& a) {
  return a.nccl->allReduce(a.sendbuff, a.recvbuff, a.count, a.type, a.op, a.comm, a.stream);
}

}  // namespace

const CollectiveSpec kAllReduceSpec = {
    .program = "all_reduce_perf",
    .name = "AllReduce",
    .hasOp = true,
    .hasRoot = false,
    .checkInPlace = true,
    .counts = counts,
    .algFactor = factorOne,
    .busFactor = factorAllReduce,
    .expect = expect,
    .run = run,
};

}  // namespace loom::perf
