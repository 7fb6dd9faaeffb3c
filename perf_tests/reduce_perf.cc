// reduce_perf: ncclReduce to each root asked for. Only the root's output is defined (and
// checked). busbw = algbw.
#include "perf_tests/specs.h"

namespace loom::perf {
namespace {

CollCounts counts(size_t count, int) {
  return {count, count, count, 0, 0};
}

Source expect(const RankLayout& l, size_t j) {
  return l.rank == l.root ? Source::reduce(j) : Source::unchecked();
}

ncclResult_t run(const RunArgs& a) {
  return a.nccl->reduce(a.sendbuff, a.recvbuff, a.count, a.type, a.op, a.root, a.comm, a.stream);
}

}  // namespace

const CollectiveSpec kReduceSpec = {
    .program = "reduce_perf",
    .name = "Reduce",
    .hasOp = true,
    .hasRoot = true,
    .checkInPlace = true,
    .counts = counts,
    .algFactor = factorOne,
    .busFactor = factorOne,
    .expect = expect,
    .run = run,
};

}  // namespace loom::perf
