// scatter_perf: ncclScatter from each root asked for, where the library has it (NCCL >= 2.28,
// loom; NcclApi::scatter is null otherwise), otherwise grouped ncclSend/ncclRecv. The size is
// the root's whole buffer; each rank receives size/n. algbw counts the root's bytes;
// busbw = algbw * (n-1)/n.
#include "perf_tests/specs.h"

namespace loom::perf {
namespace {

CollCounts counts(size_t count, int nranks) {
  const size_t per = count / static_cast<size_t>(nranks);
  return {per * static_cast<size_t>(nranks), per, per, 0, per};
}

// Output element j of rank r is element r*per + j of the root's input.
Source expect(const RankLayout& l, size_t j) {
  if (l.paramCount == 0) return Source::unchecked();
  return Source::copy(l.root, static_cast<size_t>(l.rank) * l.paramCount + j);
}

ncclResult_t run(const RunArgs& a) {
  if (a.nccl->scatter != nullptr) {
    return a.nccl->scatter(a.sendbuff, a.recvbuff, a.count, a.type, a.root, a.comm, a.stream);
  }
  const size_t bytes = a.count * typeInfo(a.type).size;
  ncclResult_t r = a.nccl->groupStart();
  if (r != ncclSuccess) return r;
  ncclResult_t first = ncclSuccess;
  for (int peer = 0; a.rank == a.root && peer < a.nranks && first == ncclSuccess; ++peer) {
    first = a.nccl->send(static_cast<const char*>(a.sendbuff) + peer * bytes, a.count, a.type, peer,
                         a.comm, a.stream);
  }
  if (first == ncclSuccess)
    first = a.nccl->recv(a.recvbuff, a.count, a.type, a.root, a.comm, a.stream);
  r = a.nccl->groupEnd();
  return first != ncclSuccess ? first : r;
}

}  // namespace

const CollectiveSpec kScatterSpec = {
    .program = "scatter_perf",
    .name = "Scatter",
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
