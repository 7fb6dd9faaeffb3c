// gather_perf: ncclGather to each root asked for, where the library has it (NCCL >= 2.28,
// loom; NcclApi::gather is null otherwise), otherwise grouped ncclSend/ncclRecv. The size
// is the gathered buffer; each rank sends size/n. Only the root's output is defined (and
// checked). algbw counts the gathered bytes; busbw = algbw * (n-1)/n.
#include "perf_tests/specs.h"

namespace loom::perf {
namespace {

CollCounts counts(size_t count, int nranks) {
  const size_t per = count / static_cast<size_t>(nranks);
  return {per, per * static_cast<size_t>(nranks), per, per, 0};
}

// The root's output element j is element j % per of rank j / per's input.
Source expect(const RankLayout& l, size_t j) {
  if (l.paramCount == 0 || l.rank != l.root) return Source::unchecked();
  return Source::copy(static_cast<int>(j / l.paramCount), j % l.paramCount);
}

ncclResult_t run(const RunArgs& a) {
  if (a.nccl->gather != nullptr) {
    return a.nccl->gather(a.sendbuff, a.recvbuff, a.count, a.type, a.root, a.comm, a.stream);
  }
  const size_t bytes = a.count * typeInfo(a.type).size;
  ncclResult_t r = a.nccl->groupStart();
  if (r != ncclSuccess) return r;
  ncclResult_t first = ncclSuccess;
  for (int peer = 0; a.rank == a.root && peer < a.nranks && first == ncclSuccess; ++peer) {
    first = a.nccl->recv(static_cast<char*>(a.recvbuff) + peer * bytes, a.count, a.type, peer,
                         a.comm, a.stream);
  }
  if (first == ncclSuccess)
    first = a.nccl->send(a.sendbuff, a.count, a.type, a.root, a.comm, a.stream);
  r = a.nccl->groupEnd();
  return first != ncclSuccess ? first : r;
}

}  // namespace

const CollectiveSpec kGatherSpec = {
    .program = "gather_perf",
    .name = "Gather",
    .hasOp = false,
    .hasRoot = true,
    .checkInPlace = true,
    .counts = counts,
    .algFactor = factorRanks,
    .busFactor = factorRing,
    .expect = expect,
    .run = run,
};

}  // namespace loom::perf
