// all_gather_perf: ncclAllGather. The size is the gathered buffer; each rank sends size/n.
// algbw counts the gathered bytes; busbw = algbw * (n-1)/n.
#include "perf_tests/specs.h"

namespace loom::perf {
namespace {

CollCounts counts(size_t count, int nranks) {
  const size_t per = count / static_cast<size_t>(nranks);
  return {per, per * static_cast<size_t>(nranks), per, per, 0};
}

// Output element j is element j % per of rank j / per's input.
Source expect(const RankLayout& l, size_t j) {
  if (l.paramCount == 0) return Source::unchecked();
  return Source::copy(static_cast<int>(j / l.paramCount), j % l.paramCount);
}

ncclResult_t run(const RunArgs& a) {
  return a.nccl->allGather(a.sendbuff, a.recvbuff, a.count, a.type, a.comm, a.stream);
}

}  // namespace

const CollectiveSpec kAllGatherSpec = {
    .program = "all_gather_perf",
    .name = "AllGather",
    .hasOp = false,
    .hasRoot = false,
    .checkInPlace = true,
    .counts = counts,
    .algFactor = factorRanks,
    .busFactor = factorRing,
    .expect = expect,
    .run = run,
};

}  // namespace loom::perf
