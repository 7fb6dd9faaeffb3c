#include "collectives/device/mesh_plan.h"

#include <algorithm>

namespace loom::collectives::device {

FlagForm MeshLimits::flagForm(size_t bytes) const {
  // LL up to its limit unless LOOM_ALGO asks for two-shot; LL128 above it up to its own
  // limit unless LOOM_ALGO says anything.
  if (bytes <= llLimit && !forceTwoShot) return FlagForm::kLL;
  if (bytes <= ll128Limit && !algoRestricts) return FlagForm::kLL128;
  return FlagForm::kNone;
}

bool MeshLimits::pastFlagForms(size_t bytes) const {
  return !algoRestricts && bytes > std::max(llLimit, ll128Limit);
}

bool MeshLimits::chunkedSize(CollType type, size_t bytes) const {
  if (!pastFlagForms(bytes)) return false;
  if (type == CollType::kReduce) return bytes >= chunkReduceMin;
  return type == CollType::kAllReduce && bytes >= chunkAllReduceMin;
}

// From LOOM_P2P_CE_PULL_BYTES, and where measured faster than the kernels (2 x H200,
// session 9, one or two runs, busbw GB/s, pulls / kernels): all-gather up to 256 MiB a
// block (16 MiB 259 / 248, 128 MiB 337 / 314; 256 MiB not measured; 512 MiB 346-350 /
// 352-353, 4 GiB 350 / 364), broadcast up to 1 GiB (16 MiB 260 / 251, 1 GiB 379 / 368; not
// measured above), all-to-all at any size (16 MiB 255 / 226, 1 GiB 351 / 337, 4 GiB 351 /
// 351). Pulls top out near 350 GB/s where the copy engines' pushes reach 390. Measured on
// 2 ranks only: with more, each rank's pulls would queue on one stream, so they stay off
// there (as the other forms measured on 2 ranks only).
bool MeshLimits::pullCopyWins(MeshKind kind, size_t block) const {
  if (nranks != 2 || block < cePullMin) return false;
  if (kind == MeshKind::kAllGather) return block <= (size_t(256) << 20);
  if (kind == MeshKind::kBroadcast) return block <= (size_t(1) << 30);
  return kind == MeshKind::kAllToAll;
}

bool meshNeedsLL128(const MeshSizes& sizes, Proto proto) {
  return proto == Proto::kLL128 ||
         (sizes.ll128Bytes > 0 && proto != Proto::kSimple && proto != Proto::kLL);
}

MeshLimits resolveMeshLimits(const MeshSizes& s, const AlgoRequest& algo, Proto proto, int nranks,
                             size_t ll128Capacity, int sharedBlocks) {
  MeshLimits m;
  m.nranks = nranks;
  m.algo = algo;
  m.proto = proto;
  using A = AlgoName;
  const bool two = algo.allows(A::kTwoShot) || algo.allows(A::kRing) || algo.allows(A::kTree);
  const bool one = algo.allows(A::kOneShot), direct = algo.allows(A::kDirect);
  // "hier" alone (the hierarchical form across hosts, whose in-host part is this mesh)
  // says nothing here.
  const bool none = !two && !one && !direct && algo.allows(A::kHier);
  m.anyTwoShot = two || none;
  m.algoRestricts = algo.set() && !none &&
                    !(one && direct && algo.allows(A::kTwoShot) && algo.allows(A::kRing) &&
                      algo.allows(A::kTree));
  m.forceOneShot = m.algoRestricts && one && !two;
  m.forceTwoShot = m.algoRestricts && two && !one;
  m.forceReduceDirect = m.algoRestricts && (direct || one) && !two;
  m.forceReduceTwoStage = m.algoRestricts && two && !direct && !one;
  // LL: one-shot with the flags inside the data, for small messages (LOOM_PROTO=simple
  // turns it off, LOOM_PROTO=ll uses it up to the region's size). The limit counts what
  // a rank sends each peer: an all-reduce's or reduce's input, a reduce-scatter's part
  // per rank. By default the whole region (1 MiB) on 2 ranks, measured there against the
  // next forms (docs/perf/h200x2.md: at 1 MiB all-reduce 12.4 against 15.5 us, reduce
  // 11.6 against 16.1, a 2 MiB reduce-scatter 12.7-12.9 against 17.4-17.5), 256 KiB above
  // (unmeasured).
  const size_t region = kLLBlocks * kLLPayload;
  m.llLimit = proto == Proto::kSimple || proto == Proto::kLL128 ? 0
              : proto == Proto::kLL                             ? region
                                    : static_cast<size_t>(std::min<uint64_t>(s.llBytes, region));
  // LL128 above the LL limit (LOOM_PROTO=ll128: from 0; simple and ll turn it off).
  m.ll128Limit = proto == Proto::kSimple || proto == Proto::kLL ? 0
                 : proto == Proto::kLL128
                     ? ll128Capacity
                     : static_cast<size_t>(std::min<uint64_t>(s.ll128Bytes, ll128Capacity));
  if (sharedBlocks > 0) {
    m.llLimit = std::min(m.llLimit, size_t(sharedBlocks) * kLLPayload);
    m.ll128Limit = std::min(m.ll128Limit, size_t(sharedBlocks) * 16 * 1024);
  }
  auto size = [](uint64_t v) { return static_cast<size_t>(std::min<uint64_t>(v, SIZE_MAX)); };
  m.oneShotMax = size(s.oneShotBytes);
  m.ceMin = size(s.ceBytes);
  m.reduceDirectMax = size(s.reduceDirectBytes);
  m.pullMax = size(s.pullBytes);
  m.pullReduceMax = size(s.pullReduceBytes);
  m.twoShotReduceMax = size(s.twoShotReduceBytes);
  m.cePullMin = size(s.cePullBytes);
  m.chunkReduceMin = size(s.chunkReduceBytes);
  m.chunkAllReduceMin = size(s.chunkAllReduceBytes);
  m.chunkSize = size(s.chunkSize);
  // Slots per peer; a chunk is a multiple of 64 KiB.
  const size_t grain = 64 * 1024;
  m.chunkMax =
      nranks > 1 ? size(s.scratchBytes) / (kChunkSlots * size_t(nranks - 1)) / grain * grain : 0;
  // No chunked forms where ranks share a GPU (LOOM_P2P_SHARE_GPU, a testing mode): 2 ranks
  // on one H200 (reduce_perf -g 2 -b 8 -e 256M -c 1) passed a 2 MiB chunked reduce and then
  // waited until LOOM_TIMEOUT_MS in the 16 MiB one, 2 runs of 2, the tree before the mesh
  // planner too; 16 MiB alone passed. Not diagnosed; the chunked forms were measured and
  // checked on 2 GPUs only (its copies between ranks are then copies between devices).
  if (m.chunkMax == 0 || sharedBlocks > 0) m.chunkReduceMin = m.chunkAllReduceMin = SIZE_MAX;
  m.allReduceSlots =
      kChunkSlots * m.chunkMax / 4 >= kChunkAllReduceBytes ? 4 : static_cast<int>(kChunkSlots);
  return m;
}

namespace {

MeshKind allReduceKind(const MeshLimits& m, size_t bytes, const char** why) {
  switch (m.flagForm(bytes)) {
    case FlagForm::kLL:
      *why = m.proto == Proto::kLL ? "LOOM_PROTO=ll" : "size <= LOOM_P2P_LL_BYTES";
      return MeshKind::kAllReduceLL;
    case FlagForm::kLL128: *why = "size <= LOOM_P2P_LL128_BYTES"; return MeshKind::kAllReduceLL128;
    case FlagForm::kNone: break;
  }
  if (m.forceOneShot) {
    *why = "LOOM_ALGO=oneshot";
    return MeshKind::kAllReduceOneShot;
  }
  if (m.forceTwoShot) {
    *why = "LOOM_ALGO asks for two-shot (ring and tree map to it on a GPU mesh)";
    return MeshKind::kAllReduceTwoShot;
  }
  // (A name LOOM_ALGO leaves out is not chosen by size either, where another is allowed.)
  if (bytes <= m.oneShotMax && (m.algo.allows(AlgoName::kOneShot) || !m.anyTwoShot)) {
    *why = "size <= LOOM_P2P_ONESHOT_BYTES (one synchronisation, same bytes for 2 ranks)";
    return MeshKind::kAllReduceOneShot;
  }
  *why = "size > LOOM_P2P_ONESHOT_BYTES (each rank reduces 1/n of the data)";
  return MeshKind::kAllReduceTwoShot;
}

// The LL forms while each rank's part (what it sends each peer) fits their limits.
MeshKind reduceScatterKind(const MeshLimits& m, size_t part, const char** why) {
  switch (m.flagForm(part)) {
    case FlagForm::kLL:
      *why = m.proto == Proto::kLL ? "LOOM_PROTO=ll" : "part per rank <= LOOM_P2P_LL_BYTES";
      return MeshKind::kReduceScatterLL;
    case FlagForm::kLL128:
      *why = "part per rank <= LOOM_P2P_LL128_BYTES";
      return MeshKind::kReduceScatterLL128;
    case FlagForm::kNone: break;
  }
  *why = "the reduce-scatter kernels";
  return MeshKind::kReduceScatter;
}

// Small ones through the LL all-reduce with only the root writing; then every input
// straight to the root (one stage; with 2 ranks the same bytes on the link), or
// reduce-scatter then gather to the root (each rank reduces 1/n, so the root's links do
// not carry every rank's whole input).
MeshKind reduceKind(const MeshLimits& m, size_t bytes, const char** why) {
  switch (m.flagForm(bytes)) {
    case FlagForm::kLL:
      *why = m.proto == Proto::kLL
                 ? "LOOM_PROTO=ll"
                 : "size <= LOOM_P2P_LL_BYTES (the LL all-reduce, only the root writes)";
      return MeshKind::kReduceLL;
    case FlagForm::kLL128:
      *why = "size <= LOOM_P2P_LL128_BYTES (the LL128 all-reduce, only the root writes)";
      return MeshKind::kReduceLL128;
    case FlagForm::kNone: break;
  }
  if (m.forceReduceDirect) {
    *why = "LOOM_ALGO asks for one stage (direct to the root)";
    return MeshKind::kReduceDirect;
  }
  if (m.forceReduceTwoStage) {
    *why = "LOOM_ALGO asks for two stages (reduce-scatter + gather)";
    return MeshKind::kReduce;
  }
  if (m.nranks == 2 && bytes <= m.reduceDirectMax &&
      (m.algo.allows(AlgoName::kDirect) || !m.anyTwoShot)) {
    *why = "2 ranks and size <= LOOM_P2P_REDUCE_DIRECT_BYTES";
    return MeshKind::kReduceDirect;
  }
  *why = m.nranks == 2 ? "size > LOOM_P2P_REDUCE_DIRECT_BYTES" : "more than 2 ranks";
  return MeshKind::kReduce;
}

}  // namespace

MeshKind meshKind(const MeshLimits& m, CollType type, size_t bytes, const char** why) {
  *why = "the one direct form on a GPU mesh";
  switch (type) {
    case CollType::kAllReduce: return allReduceKind(m, bytes, why);
    case CollType::kAllGather: return MeshKind::kAllGather;
    case CollType::kBroadcast: return MeshKind::kBroadcast;
    case CollType::kReduceScatter: return reduceScatterKind(m, bytes, why);
    case CollType::kReduce: return reduceKind(m, bytes, why);
    case CollType::kAllToAll: return MeshKind::kAllToAll;
    case CollType::kSendRecv: break;
  }
  return MeshKind::kSendRecv;
}

namespace {

bool copyKind(MeshKind k) {
  return k == MeshKind::kBroadcast || k == MeshKind::kAllGather || k == MeshKind::kAllToAll;
}

}  // namespace

const char* meshRouteName(MeshRoute r) {
  switch (r) {
    case MeshRoute::kKernel: return "kernel";
    case MeshRoute::kPulledReduce: return "pulled reduce";
    case MeshRoute::kChunked: return "chunked";
    case MeshRoute::kRegisteredPull: return "registered pull";
    case MeshRoute::kPulledAllReduce: return "pulled all-reduce";
    case MeshRoute::kPulledOneShot: return "pulled one-shot";
    case MeshRoute::kRegisteredCopies: return "registered copies";
    case MeshRoute::kCopyEngines: return "copy engines";
  }
  return "?";
}

bool routeMayDecline(MeshRoute r) {
  return r == MeshRoute::kChunked || r == MeshRoute::kRegisteredPull ||
         r == MeshRoute::kRegisteredCopies;
}

bool meshNeedsPeerFacts(const MeshLimits& m, CollType type, size_t bytes) {
  const bool copies =
      type == CollType::kAllGather || type == CollType::kBroadcast || type == CollType::kAllToAll;
  return (type == CollType::kReduce && m.twoShotReduceSize(bytes)) || m.chunkedSize(type, bytes) ||
         (type == CollType::kAllReduce && m.pullSize(bytes)) || (copies && bytes >= m.ceMin);
}

MeshPlan planMeshCall(const MeshLimits& m, const MeshCallFacts& f) {
  MeshPlan p;
  p.kind = meshKind(m, f.type, f.bytes, &p.why);
  auto add = [&p](MeshRoute r, const char* why) { p.steps[p.nsteps++] = {r, why}; };
  auto done = [&p] { return p.nsteps > 0 && !routeMayDecline(p.steps[p.nsteps - 1].route); };
  const bool reduce = f.type == CollType::kReduce, allReduce = f.type == CollType::kAllReduce;
  const bool peers = f.peersKnown;
  // Mid-size reduce, every rank's buffers known (ranks of this process): rank r reduces
  // part r of every input and stores it into the root's output, so every rank's SMs and
  // both directions of its links carry a share (the two-shot all-reduce, less the stores
  // into the other outputs). No pre-op, as the pulled all-reduce. The root's output must
  // not overlap any input but its own, and that only as the same buffer (each element is
  // then read and written by one thread).
  if (reduce && m.twoShotReduceSize(f.bytes) && f.builtinOp && peers && f.inMapped && f.outMapped &&
      f.rootOutputApart) {
    add(MeshRoute::kPulledReduce, "ranks of one process, size <= LOOM_P2P_TWOSHOT_REDUCE_BYTES");
  }
  // Large all-reduce and reduce, every rank's buffers known and none in a graph capture:
  // the copy engines move the data in chunks, kernels reduce them locally. A user's
  // PreMulSum scalar may differ between ranks, so only ncclAvg's (1/n) is applied there.
  // Peers write into an all-reduce's outputs, so those must be mapped; a reduce's output
  // is written by the root's own kernel only (the others' may even be null, as NCCL allows).
  if (!done() && m.chunkedSize(f.type, f.bytes) && f.plainOp && peers && f.inMapped &&
      !f.captured && (f.outMapped || reduce)) {
    add(MeshRoute::kChunked, reduce ? "ranks of one process, size >= LOOM_P2P_CE_REDUCE_BYTES"
                                    : "ranks of one process, size >= LOOM_P2P_CE_ALLREDUCE_BYTES");
  }
  // Ranks in several processes, memory registered: an all-reduce or reduce reads the
  // peers' inputs where they lie when every rank whose input is read posted a registered
  // one. No pre-op in the pulled kernel: not for PreMulSum (ncclAvg on floats included).
  if (!done() && f.board && f.builtinOp &&
      ((allReduce && m.pullSize(f.bytes)) ||
       (reduce && m.pastFlagForms(f.bytes) && f.bytes <= m.pullReduceMax))) {
    add(MeshRoute::kRegisteredPull, allReduce ? "registered buffers, size <= LOOM_P2P_PULL_BYTES"
                                              : "registered inputs, size <= "
                                                "LOOM_P2P_PULL_REDUCE_BYTES");
  }
  // Mid-size all-reduce, every rank's buffers known: each rank reduces its part from every
  // input and stores it into every output (two-shot), or, where the outputs cannot be
  // written from here (a stream-ordered pool's), reads every input and writes only its own
  // output (one-shot, out of place only). No pre-op, so not for PreMulSum: those keep the
  // slot kernels.
  if (!done() && allReduce && m.pullSize(f.bytes) && f.builtinOp && peers && f.inMapped) {
    if (f.outMapped && (f.outputsApart || f.allInPlace)) {
      add(MeshRoute::kPulledAllReduce,
          f.allInPlace ? "ranks of one process, in place, size <= LOOM_P2P_PULL_BYTES"
                       : "ranks of one process, out of place, size <= LOOM_P2P_PULL_BYTES");
    } else if (f.outputsApart) {
      add(MeshRoute::kPulledOneShot,
          "ranks of one process, out of place, output not mapped, size <= LOOM_P2P_PULL_BYTES");
    }
  }
  // Copies only, ranks in several processes, inputs registered: each rank's copy engine
  // pulls its own output together from the inputs where they lie, between two barriers.
  if (!done() && f.board && copyKind(p.kind) && m.pullCopyWins(p.kind, f.bytes)) {
    add(MeshRoute::kRegisteredCopies,
        "registered inputs pulled between processes, size >= LOOM_P2P_CE_PULL_BYTES");
  }
  // Copies only, every rank's buffers known (ranks of this process): the copy engines,
  // each copy moving one rank's block.
  if (!done() && copyKind(p.kind) && f.bytes >= m.ceMin && peers && f.inMapped && f.outMapped &&
      f.copyPlanSafe) {
    add(MeshRoute::kCopyEngines,
        "every rank's buffers known in this group, size >= LOOM_P2P_CE_BYTES");
  }
  if (!done()) add(MeshRoute::kKernel, p.why);
  return p;
}

const char* meshP2pUnordered(const P2pList& ops, const std::vector<MeshRange>& selfRecvs) {
  auto overlap = [](uintptr_t a, size_t n, uintptr_t b, size_t m) {
    return n > 0 && m > 0 && a < b + m && b < a + n;
  };
  for (int i = 0; i < ops.nops; ++i) {
    const P2pOp& s = ops.ops[i];
    if (!s.isSend) continue;
    const uintptr_t a = reinterpret_cast<uintptr_t>(s.buffer);
    for (const MeshRange& r : selfRecvs) {
      if (overlap(a, s.bytes, r.start, r.bytes))
        return "a receive from this rank itself overwrites a send to a peer before it leaves";
    }
    for (int j = 0; j < ops.nops; ++j) {
      const P2pOp& r = ops.ops[j];
      if (r.isSend) continue;
      const uintptr_t b = reinterpret_cast<uintptr_t>(r.buffer);
      if (!overlap(a, s.bytes, b, r.bytes)) continue;
      if (a != b || s.bytes != r.bytes)
        return "a send and a receive overlap without being the same buffer of the same size";
      if (s.seq > r.seq)
        return "a receive overwrites a send's buffer at an earlier step than the send's";
    }
  }
  return nullptr;
}

}  // namespace loom::collectives::device
