// alltoall_perf: ncclAlltoAll where the library has it (NCCL >= 2.28, loom; NcclApi::alltoAll
// is null otherwise), otherwise grouped ncclSend/ncclRecv to every peer. The size is each
// rank's whole buffer; the count column is the per-peer count. algbw counts the whole buffer;
// busbw = algbw * (n-1)/n. In-place results are not defined (as in nccl-tests): #wrong prints
// N/A.
#include "perf_tests/specs.h"

namespace loom::perf {
namespace {

CollCounts counts(size_t count, int nranks) {
  const size_t per = count / static_cast<size_t>(nranks);
  return {per * static_cast<size_t>(nranks), per * static_cast<size_t>(nranks), per, 0, 0};
}

// Output chunk p of rank r is chunk r of rank p's input.
Source expect(const RankLayout& l, size_t j) {
  if (l.paramCount == 0) return Source::unchecked();
  const size_t peer = j / l.paramCount;
  return Source::copy(static_cast<int>(peer),
                      static_cast<size_t>(l.rank) * l.paramCount + j % l.paramCount);
}

ncclResult_t runPointToPoint(const RunArgs& a) {
  const size_t bytes = a.count * typeInfo(a.type).size;
  ncclResult_t r = a.nccl->groupStart();
  if (r != ncclSuccess) return r;
  ncclResult_t first = ncclSuccess;
  for (int peer = 0; peer < a.nranks && first == ncclSuccess; ++peer) {
    const char* send = static_cast<const char*>(a.sendbuff) + peer * bytes;
    char* recv = static_cast<char*>(a.recvbuff) + peer * bytes;
    first = a.nccl->send(send, a.count, a.type, peer, a.comm, a.stream);
    if (first == ncclSuccess) first = a.nccl->recv(recv, a.count, a.type, peer, a.comm, a.stream);
  }
  r = a.nccl->groupEnd();
  return first != ncclSuccess ? first : r;
}

ncclResult_t run(const RunArgs& a) {
  if (a.nccl->alltoAll != nullptr) {
    return a.nccl->alltoAll(a.sendbuff, a.recvbuff, a.count, a.type, a.comm, a.stream);
  }
  return runPointToPoint(a);
}

}  // namespace

const CollectiveSpec kAllToAllSpec = {
    .program = "alltoall_perf",
    .name = "AlltoAll",
    .hasOp = false,
    .hasRoot = false,
    .checkInPlace = false,
    .counts = counts,
    .algFactor = factorRanks,
    .busFactor = factorRing,
    .expect = expect,
    .run = run,
};

}  // namespace loom::perf
