// reduce_scatter_perf: ncclReduceScatter. The size is each rank's input; each rank receives
// size/n. algbw counts the input bytes; busbw = algbw * (n-1)/n.
#include "perf_tests/specs.h"

namespace loom::perf {
namespace {

CollCounts counts(size_t count, int nranks) {
  const size_t per = count / static_cast<size_t>(nranks);
  return {per * static_cast<size_t>(nranks), per, per, 0, per};
}

// Output element j of rank r is the reduction of element r*per + j.
Source expect(const RankLayout& l, size_t j) {
  return Source::reduce(static_cast<size_t>(l.rank) * l.paramCount + j);
}

ncclResult_t run(const RunArgs& a) {
  return a.nccl->reduceScatter(a.sendbuff, a.recvbuff, a.count, a.type, a.op, a.comm, a.stream);
}

}  // namespace

const CollectiveSpec kReduceScatterSpec = {
    .program = "reduce_scatter_perf",
    .name = "ReduceScatter",
    .hasOp = true,
    .hasRoot = false,
    .checkInPlace = true,
    .counts = counts,
    .algFactor = factorRanks,
    .busFactor = factorRing,
    .expect = expect,
    .run = run,
};

}  // namespace loom::perf
