// broadcast_perf: ncclBroadcast from each root asked for. busbw = algbw.
#include "perf_tests/specs.h"

namespace loom::perf {
namespace {

CollCounts counts(size_t count, int) {
  return {count, count, count, 0, 0};
}

Source expect(const RankLayout& l, size_t j) {
  return Source::copy(l.root, j);
}

ncclResult_t run(const RunArgs& a) {
  return a.nccl->broadcast(a.sendbuff, a.recvbuff, a.count, a.type, a.root, a.comm, a.stream);
}

}  // namespace

const CollectiveSpec kBroadcastSpec = {
    .program = "broadcast_perf",
    .name = "Broadcast",
    .hasOp = false,
    .hasRoot = true,
    .checkInPlace = true,
    .counts = counts,
    .algFactor = factorOne,
    .busFactor = factorOne,
    .expect = expect,
    .run = run,
};

}  // namespace loom::perf
