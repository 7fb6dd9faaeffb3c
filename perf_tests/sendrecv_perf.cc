// sendrecv_perf: every rank sends to rank+1 and receives from rank-1 (a ring shift), both in
// one group. busbw = algbw.
#include "perf_tests/specs.h"

namespace loom::perf {
namespace {

CollCounts counts(size_t count, int) {
  return {count, count, count, 0, 0};
}

Source expect(const RankLayout& l, size_t j) {
  return Source::copy((l.rank - 1 + l.nranks) % l.nranks, j);
}

ncclResult_t run(const RunArgs& a) {
  const int next = (a.rank + 1) % a.nranks;
  const int prev = (a.rank - 1 + a.nranks) % a.nranks;
  ncclResult_t r = a.nccl->groupStart();
  if (r != ncclSuccess) return r;
  const ncclResult_t s = a.nccl->send(a.sendbuff, a.count, a.type, next, a.comm, a.stream);
  const ncclResult_t v =
      s == ncclSuccess ? a.nccl->recv(a.recvbuff, a.count, a.type, prev, a.comm, a.stream) : s;
  r = a.nccl->groupEnd();
  return v != ncclSuccess ? v : r;
}

}  // namespace

const CollectiveSpec kSendRecvSpec = {
    .program = "sendrecv_perf",
    .name = "SendRecv",
    .hasOp = false,
    .hasRoot = false,
    .checkInPlace = true,
    .counts = counts,
    .algFactor = factorOne,
    .busFactor = factorOne,
    .expect = expect,
    .run = run,
};

}  // namespace loom::perf
