#include "collectives/tuner.h"

#include <strings.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "collectives/algo_request.h"
#include "collectives/cost_model.h"
#include "collectives/hierarchy.h"
#include "collectives/operation.h"

namespace loom::collectives {

namespace {

// The fabric the tuner prices when its caller names none: one class of link for every
// pair of ranks, 10 us and 4 GB/s a hop (for ring against tree only their ratio matters).
const model::Fabric& flatFabric(int n) {
  thread_local model::Fabric f;
  f.hosts = 1;
  f.ranksPerHost = n;
  f.intra = {10.0, 4.0};
  f.inter = f.intra;
  f.baseUs = 0;
  return f;
}

// Broadcast and reduce: the pipelined chain or the binary tree, as LOOM_ALGO forces one
// (chain, or ring as its alias; ^chain leaves it out), else whichever the cost model prices
// lower on the request's fabric (the chain where it cannot price them, and on 2 ranks,
// where the two are one schedule). LOOM_ALGO naming neither (an all-reduce form) leaves
// the choice to the model.
void chooseChainOrTree(CollType type, const CollRequest& req, const AlgoRequest& forced,
                       size_t bytes, TunerChoice* c) {
  const bool chain = forced.allows(AlgoName::kChain) || forced.names(AlgoName::kRing);
  const bool tree = forced.allows(AlgoName::kTree);
  if (chain != tree) {
    c->algo = chain ? Algorithm::kChain : Algorithm::kTree;
    c->reason = "forced by LOOM_ALGO";
    return;
  }
  if (req.nranks <= 2) {
    c->algo = Algorithm::kChain;
    c->reason = "pipelined chain (on 2 ranks the tree is the same)";
    return;
  }
  const model::Fabric& f = req.fabric ? *req.fabric : flatFabric(req.nranks);
  model::Estimate ce, te;
  const bool priced = model::estimate(type, model::Algo::kChain, bytes, f, &ce) &&
                      model::estimate(type, model::Algo::kTree, bytes, f, &te);
  const double ch = priced ? ce.us : 0, t = priced ? te.us : 1;
  c->algo = t < ch ? Algorithm::kTree : Algorithm::kChain;
  c->reason = "cost model";
  c->flatName = "chain";
  c->ringUs = ch;
  c->treeUs = t;
}

}  // namespace

std::string TunerChoice::text() const {
  if (hierUs >= 0) {
    char estimates[96];
    std::snprintf(estimates, sizeof(estimates), ": flat %.1f us, hierarchical %.1f us", flatUs,
                  hierUs);
    return std::string(reason) + estimates;
  }
  if (ringUs < 0) return reason;
  char estimates[96];
  std::snprintf(estimates, sizeof(estimates), ": %s %.1f us, tree %.1f us", flatName, ringUs,
                treeUs);
  return std::string(reason) + estimates;
}

Result<TunerChoice> chooseAlgorithm(const CollRequest& req, const std::string& forced) {
  LOOM_ASSIGN_OR_RETURN(const AlgoRequest parsed, AlgoRequest::parse(forced));
  return chooseAlgorithm(req, parsed);
}

namespace {

model::Algo modelAlgo(Algorithm a) {
  switch (a) {
    case Algorithm::kTree: return model::Algo::kTree;
    case Algorithm::kChain: return model::Algo::kChain;
    case Algorithm::kDirect: return model::Algo::kDirect;
    case Algorithm::kDoubling: return model::Algo::kDoubling;
    case Algorithm::kOneShot: return model::Algo::kOneShot;
    case Algorithm::kHier: return model::Algo::kHierarchical;
    default: return model::Algo::kRing;
  }
}

}  // namespace

Result<TunerChoice> chooseAlgorithm(const CollRequest& req, const AlgoRequest& forced) {
  using A = AlgoName;
  const bool hierAllowed = forced.allows(A::kHier);
  const bool hierFits = (req.type == CollType::kAllReduce || req.type == CollType::kAllGather ||
                         req.type == CollType::kReduceScatter) &&
                        req.hier;
  if (hierFits && forced.onlyOf(A::kHier, A::kRing, A::kTree, A::kDirect, A::kDoubling, A::kOneShot,
                                A::kTwoShot)) {
    TunerChoice c;
    c.algo = Algorithm::kHier;
    c.reason = "forced by LOOM_ALGO";
    return c;
  }
  // The flat forms read LOOM_ALGO without "hier" (a request of hier alone asks nothing of
  // them); copied only where it names hier, so that choosing allocates nothing otherwise.
  AlgoRequest stripped;
  const AlgoRequest* flatForced = &forced;
  if (forced.set() && hierAllowed) {
    stripped = forced.withoutHier();
    flatForced = &stripped;
  }
  LOOM_ASSIGN_OR_RETURN(TunerChoice c, chooseFlatAlgorithm(req, *flatForced));
  if (!hierFits || !hierAllowed) return c;
  // The hierarchical form where the cost model prices it under the flat form the rules
  // chose, on the communicator's fabric; never for the small messages that the one-shot
  // and recursive doubling take.
  if (!req.fabric || c.algo == Algorithm::kOneShot ||
      (c.algo == Algorithm::kDoubling &&
       req.count * req.elemSize * (req.nranks - 1) <= kOneShotMaxBytes)) {
    return c;
  }
  // All-gather: not below 16 KiB a rank, where its passes inside the host cost more than
  // the model's steps say. Network namespaces with 2 ranks each, 1 Gb/s links, on the
  // 2-core machine (2026-12-04, docs/perf/cost_model.md): 2 hosts at 16 KiB a rank 273 us
  // against the ring's 410; 4 hosts at 8 KiB 769 against 509, at 2 B 780 against 410.
  // Reduce-scatter, its mirror, likewise.
  const bool perRank = req.type != CollType::kAllReduce;
  if (perRank && req.count * req.elemSize < 16 * 1024) return c;
  // The model prices an all-gather by its output, a reduce-scatter by its input.
  const size_t bytes = req.count * req.elemSize * (perRank ? static_cast<size_t>(req.nranks) : 1);
  model::Estimate flat, hier;
  if (!model::estimate(req.type, modelAlgo(c.algo), bytes, *req.fabric, &flat) ||
      !model::estimate(req.type, model::Algo::kHierarchical, bytes, *req.fabric, &hier) ||
      !(hier.us < flat.us)) {
    return c;
  }
  c.algo = Algorithm::kHier;
  c.reason = "cost model: hierarchical under the flat form";
  c.flatUs = flat.us;
  c.hierUs = hier.us;
  return c;
}

Result<TunerChoice> chooseFlatAlgorithm(const CollRequest& req, const AlgoRequest& forced) {
  TunerChoice c;
  const size_t bytes = req.count * req.elemSize;
  const int n = req.nranks;
  switch (req.type) {
    case CollType::kAllReduce: {
      // Small messages: every rank sends its input to every other at once and reduces
      // locally in rank order (one hop instead of 2(n-1); n-1 times the data). Over
      // sockets, where each message costs a trip through the network stack, recursive
      // doubling's log2(n) messages per rank beat one-shot's n-1 despite the extra hops:
      // 4 ranks on 2 cores over loopback TCP, 8 bytes, 5 interleaved runs: median 55 us
      // (47-61) against 71 (54-78) for one-shot.
      const bool small = n > 1 && bytes * (n - 1) <= kOneShotMaxBytes;
      const bool doubling = n > 2 && (n & (n - 1)) == 0 && forced.allows(AlgoName::kDoubling);
      // Forced, recursive doubling runs on 2 ranks too (one exchange of the whole buffer).
      const bool doublingFits = n >= 2 && (n & (n - 1)) == 0 && forced.allows(AlgoName::kDoubling);
      const bool oneShot = n > 1 && forced.allows(AlgoName::kOneShot);
      if (small && doubling && (req.network || !oneShot)) {
        c.algo = Algorithm::kDoubling;
        c.reason =
            req.network ? "small message over sockets: recursive doubling" : "forced by LOOM_ALGO";
        break;
      }
      if (small && oneShot) {
        c.algo = Algorithm::kOneShot;
        c.reason = "small message: one-shot";
        break;
      }
      // twoshot (the GPU mesh's name) is the ring here: reduce-scatter, then all-gather.
      bool ring = forced.allows(AlgoName::kRing) || forced.names(AlgoName::kTwoShot);
      bool tree = forced.allows(AlgoName::kTree) && n > 2;
      // Over sockets with few ranks, direct reduce-scatter and all-gather: two hops a
      // block instead of 2(n-1), and no dependence on which ranks share a core. 4 ranks
      // on 2 cores over loopback TCP, 3 interleaved runs against the ring: 128 KiB
      // 383-402 us against 656-1058, 512 KiB 506-531 against 515-700, 2 MiB 2.6-3.5 ms
      // against 3.6-3.7, 8 MiB 10.5-13.7 against 15.3-17.6, 64 MiB 85-87 against 93-145.
      // Over shared memory the ring stays ahead (512 KiB 113-116 us against 131-134).
      const bool direct = n > 2 && n - 1 <= kMaxStepPeers && forced.allows(AlgoName::kDirect);
      if (direct && (req.network || (!ring && !tree))) {
        c.algo = Algorithm::kDirect;
        c.reason = req.network ? "sockets, few ranks: direct reduce-scatter and all-gather"
                               : "forced by LOOM_ALGO";
        break;
      }
      if (doublingFits && !ring && !tree) {
        c.algo = Algorithm::kDoubling;
        c.reason = "forced by LOOM_ALGO";
        break;
      }
      if (ring && tree) {
        const model::Fabric& f = req.fabric ? *req.fabric : flatFabric(n);
        model::Estimate re, te, de;
        const bool priced =
            model::estimate(CollType::kAllReduce, model::Algo::kRing, bytes, f, &re) &&
            model::estimate(CollType::kAllReduce, model::Algo::kTree, bytes, f, &te);
        const double r = priced ? re.us : 0, t = priced ? te.us : 1;
        c.algo = t < r ? Algorithm::kTree : Algorithm::kRing;
        c.reason = "cost model";
        c.ringUs = r;
        c.treeUs = t;
        // Over sockets, recursive doubling past the small-message bound where the model
        // prices it under both: the bound counts one-shot's n-1 copies, doubling sends
        // log2(n), so with thousands of ranks an 8-byte all-reduce would otherwise fall to
        // the tree at twice doubling's steps (16,384 ranks: 284 against 143 us modelled).
        if (priced && req.network && doubling &&
            model::estimate(CollType::kAllReduce, model::Algo::kDoubling, bytes, f, &de) &&
            de.us < std::min(r, t)) {
          c.algo = Algorithm::kDoubling;
          c.reason = "cost model: recursive doubling under ring and tree";
        }
      } else if (tree) {
        c.algo = Algorithm::kTree;
        c.reason = "forced by LOOM_ALGO";
      } else {
        c.algo = Algorithm::kRing;
        c.reason = ring && forced.set() ? "forced by LOOM_ALGO" : "ring is the only choice";
        if (!ring) c.reason = "no allowed algorithm fits this rank count; using ring";
      }
      break;
    }
    case CollType::kBroadcast: {
      bool chain = forced.allows(AlgoName::kChain) || forced.allows(AlgoName::kRing);
      bool tree = forced.allows(AlgoName::kTree);
      // A pipelined chain moves each byte once per link at full bandwidth; a tree halves
      // the hops but sends twice from inner nodes. Host buffers across hosts: the cost model
      // weighs the two on the communicator's fabric (network namespaces, 1 Gb/s,
      // 2026-12-05: at 8 hosts and 64 KiB the chain took half the tree's time, where the
      // rule below took the tree). Inside one host, and GPU buffers: chain for large, tree
      // for small, as measured (GPU buffers against NCCL).
      if (!req.device && req.fabric) {
        chooseChainOrTree(CollType::kBroadcast, req, forced, bytes, &c);
        break;
      }
      if (tree && (!chain || model::broadcastRuleTakesTree(bytes, n))) {
        c.algo = Algorithm::kTree;
        c.reason = chain ? "small message over many ranks" : "forced by LOOM_ALGO";
      } else {
        c.algo = Algorithm::kChain;
        c.reason = "pipelined chain";
      }
      break;
    }
    case CollType::kReduce:
      // Each link of a pipelined chain carries the buffer once; the tree's inner ranks take
      // in two buffers for one sent on, in log2(n) hops instead of n - 1. Host buffers,
      // network namespaces, 1 rank each, 1 Gb/s (docs/perf/cost_model.md, 2026-12-05): from
      // 64 KiB at 4 and 8 hosts the chain took 0.37-0.50 of the tree's time; over shared
      // memory (4 and 8 ranks, 64 KiB - 32 MiB) it was level or ahead. GPU buffers, processes
      // as hosts on one H100 (docs/perf/crosshost.md, 2026-12-07): at 16 and 128 MiB on 3
      // and 4 hosts the chain took 0.44-0.80 of the tree's time (at 2 MiB 0.81-1.18), and
      // the model weighs the two there as well.
      chooseChainOrTree(CollType::kReduce, req, forced, bytes, &c);
      break;
    case CollType::kAllGather:
    case CollType::kReduceScatter: {
      // Recursive doubling (all-gather) or halving (reduce-scatter), where their trees fit:
      // only where LOOM_ALGO names it and none of the ring, the direct form and hier (one
      // reading each on 4 GPU hosts, 2026-12-08: not ahead of the ring or direct; the cost
      // model has no price for it to weigh against hier). On 2 ranks it is the ring.
      if (n > 2 && binomialTreesFit(n) && forced.names(AlgoName::kDoubling) &&
          forced.onlyOf(AlgoName::kDoubling, AlgoName::kRing, AlgoName::kDirect, AlgoName::kHier)) {
        c.algo = Algorithm::kDoubling;
        c.reason = "forced by LOOM_ALGO";
        break;
      }
      // Over the network, few ranks: every rank sends each block to its owner at once, one
      // step instead of the ring's n - 1. GPU buffers: kDirectAllGatherMaxBytes and
      // kDirectReduceScatterMaxBytes say where; host buffers across hosts of one rank each:
      // from kDirectHostMinBytes a rank. LOOM_ALGO=direct: any size on up to 4 ranks.
      const bool direct =
          req.network && n > 2 && n - 1 <= kMaxStepPeers && forced.allows(AlgoName::kDirect);
      const bool ring = forced.allows(AlgoName::kRing);
      const bool takes =
          req.device
              ? (req.type == CollType::kAllGather ? n == 3 || bytes <= kDirectAllGatherMaxBytes
                                                  : n == 3 && bytes <= kDirectReduceScatterMaxBytes)
              : req.fabric && req.fabric->ranksPerHost == 1 && bytes >= kDirectHostMinBytes;
      if (direct && (!ring || takes)) {
        c.algo = Algorithm::kDirect;
        c.reason = ring ? "3 or 4 ranks over the network: direct, one step" : "forced by LOOM_ALGO";
        break;
      }
      c.algo = Algorithm::kRing;
      c.reason = forced.names(AlgoName::kDirect) && !direct
                     ? "ring (the direct form runs on 3 or 4 ranks over the network)"
                     : "ring";
      break;
    }
    case CollType::kAllToAll:
    case CollType::kSendRecv:
      c.algo = Algorithm::kDirect;
      c.reason = "direct exchange";
      break;
  }
  return c;
}

Result<TunerChoice> chooseNetAlgorithm(CollRequest req, const AlgoRequest& forced) {
  req.network = true;
  req.device = true;
  LOOM_ASSIGN_OR_RETURN(TunerChoice c, chooseAlgorithm(req, forced));
  const int n = req.nranks;
  const size_t bytes = req.count * req.elemSize;
  // A small all-reduce on 3 ranks: one hop with every peer (oneShotAllReduce), where the
  // direct form takes two. On 4 ranks recursive doubling (two exchanges of the whole
  // buffer, one peer each) stays ahead of one-shot's three peers at once, and on 2 it is
  // that one exchange already; LOOM_ALGO=oneshot runs it on 3 or 4.
  const bool small = bytes * size_t(std::max(1, n - 1)) <= kOneShotMaxBytes;
  if (req.type == CollType::kAllReduce && small && n > 2 && n - 1 <= kMaxStepPeers &&
      forced.allows(AlgoName::kOneShot) && c.algo == Algorithm::kOneShot) {
    c.reason =
        "small message, few ranks: one-shot (every input to every rank, added in rank order)";
    return c;
  }
  if (req.type == CollType::kAllReduce && n == 2 && c.algo == Algorithm::kRing &&
      bytes <= kTwoRankDoublingMaxBytes && forced.allows(AlgoName::kDoubling)) {
    c.algo = Algorithm::kDoubling;
    c.reason =
        "2 ranks, up to 256 KiB: recursive doubling (one exchange, where the ring takes two)";
    return c;
  }
  // 4 ranks above 2 MiB: the ring, where the direct form was chosen (not where LOOM_ALGO
  // names direct, alone or in a list).
  if (req.type == CollType::kAllReduce && n == 4 && c.algo == Algorithm::kDirect &&
      bytes > kDirectAllReduceMaxBytes4 && !forced.names(AlgoName::kDirect) &&
      forced.allows(AlgoName::kRing)) {
    c.algo = Algorithm::kRing;
    c.reason =
        "4 ranks, more than 2 MiB: ring (the direct form's 3 connections at once fall behind)";
    return c;
  }
  if (c.algo != Algorithm::kOneShot) return c;
  // One-shot over the network runs on 3 or 4 ranks only: the next form LOOM_ALGO leaves in.
  if (n > 1 && (n & (n - 1)) == 0 && forced.allows(AlgoName::kDoubling)) {
    c.algo = Algorithm::kDoubling;
    c.reason = "small message (one-shot over the network takes 3 or 4 ranks): recursive doubling";
  } else if (n - 1 <= kMaxStepPeers && forced.allows(AlgoName::kDirect)) {
    c.algo = Algorithm::kDirect;
    c.reason = "small message (one-shot over the network takes 3 or 4 ranks): direct";
  } else if (!forced.allows(AlgoName::kRing) && n > 2 && forced.allows(AlgoName::kTree)) {
    c.algo = Algorithm::kTree;
    c.reason = "small message (one-shot over the network takes 3 or 4 ranks): tree";
  } else {
    c.algo = Algorithm::kRing;
    c.reason = forced.allows(AlgoName::kRing)
                   ? "small message (one-shot over the network takes 3 or 4 ranks): ring"
                   : "ring (one-shot over the network takes 3 or 4 ranks; LOOM_ALGO leaves "
                     "nothing else that runs here)";
  }
  return c;
}

TunerChoice chooseDeviceHier(CollType type, size_t bytes, const model::Fabric* f,
                             const AlgoRequest& forced, const AlgoRequest& flatForced,
                             bool partsEven) {
  TunerChoice c;
  c.algo = Algorithm::kRing;
  if (!forced.allows(AlgoName::kHier)) {
    c.reason = "LOOM_ALGO leaves out hier";
    return c;
  }
  if (forced.names(AlgoName::kHier)) {
    c.algo = Algorithm::kHier;
    c.reason = "forced by LOOM_ALGO";
    return c;
  }
  if (!f || f->hosts < 2 || f->ranksPerHost < 2) {
    c.reason = "no fabric to price the hierarchical form on";
    return c;
  }
  // Point to point splits by host by message size, not by this model (hierP2pDecline).
  if (type == CollType::kAllToAll || type == CollType::kSendRecv) {
    c.reason = "point-to-point exchanges split by host by message size (512 KiB and more)";
    return c;
  }
  const model::Fabric flatFabric = model::netExecutorFabric(*f, /*rail=*/false);
  CollRequest req;
  req.type = type;
  req.elemSize = 4;
  req.nranks = f->nranks();
  const bool perRank = type == CollType::kAllGather || type == CollType::kReduceScatter;
  req.count = std::max<size_t>(1, bytes / req.elemSize / (perRank ? req.nranks : 1));
  req.fabric = &flatFabric;
  auto flat = chooseNetAlgorithm(req, flatForced);
  model::Estimate fe, he;
  // Broadcast and reduce split over the rails only where the count divides (splitsRails).
  const bool whole = !partsEven && (type == CollType::kBroadcast || type == CollType::kReduce);
  if (!flat.isOk() || !model::estimate(type, modelAlgo(flat->algo), bytes, flatFabric, &fe) ||
      !(whole ? model::hierRootedEstimate(type, bytes, *f, /*split=*/false, &he)
              : model::estimate(type, model::Algo::kHierarchical, bytes, *f, &he))) {
    c.reason = "the cost model cannot price both forms";
    return c;
  }
  c.algo = he.us <= fe.us ? Algorithm::kHier : flat->algo;
  c.reason = he.us <= fe.us ? "cost model: hierarchical under the flat form"
                            : "cost model: the flat form under the hierarchical";
  c.flatUs = fe.us;
  c.hierUs = he.us;
  return c;
}

size_t hostPieceBytes(CollType type, size_t bytes, int nranks, size_t slotBytes, bool network) {
  // Every hop costs a wake-up of the receiving rank; where ranks outnumber cores that is
  // tens of microseconds, so fewer, larger pieces win. Measured on the 2-core VM, 4 ranks,
  // all-reduce (blocks of 4 pieces against blocks of nranks x total/(4 nranks), the earlier
  // rule): 512 KiB over shm 135-141 us against 214-229, over TCP 0.94-1.35 ms against
  // 1.26-1.47; 2 MiB over shm 0.75-1.07 ms against 0.98-1.52.
  size_t total = bytes;
  if (type == CollType::kAllGather || type == CollType::kReduceScatter) {
    total *= static_cast<size_t>(nranks);
  }
  // Chains and trees that stream one step through every hop (broadcast, reduce) keep
  // several pieces in flight instead.
  const bool streams = type == CollType::kBroadcast || type == CollType::kReduce;
  size_t want = total / (static_cast<size_t>(std::max(nranks, 1)) * (streams ? 4 : 1));
  // Over sockets all-reduce, all-gather and reduce-scatter pipeline better in pieces of at
  // most 128 KiB: the kernel copies a piece into and out of the sockets while the next is
  // reduced. 4 ranks over loopback TCP on the 2-core VM (2026-11-30, interleaved runs): all-reduce
  // 8 MiB 8.0-9.1 ms against 9.5-11.2 with the 256 KiB slots (6 runs), 2-32 MiB 10-37 % faster (3
  // runs); all-gather 2-32 MiB faster in every run; reduce-scatter faster in 2 of 3. Over shared
  // memory the same pieces were slower (512 KiB - 8 MiB, 5-46 % in 2 runs of 3), and broadcast and
  // reduce over TCP were mixed, so those keep theirs.
  if (network && !streams) want = std::min<size_t>(want, 128 * 1024);
  want = std::max<size_t>(want, 16 * 1024);
  want = (want + 63) / 64 * 64;
  return std::min(slotBytes, want);
}

size_t netPieceBytes(CollType type, size_t bytes, int nranks, size_t slotBytes) {
  const size_t piece = hostPieceBytes(type, bytes, nranks, slotBytes, /*network=*/false);
  // Broadcast and reduce stream their pieces through every hop, and on this path each
  // piece costs flag and proxy round trips that pieces below 256 KiB do not earn back by
  // pipelining. Measured on one H200, processes as hosts under MPS (2026-12-02,
  // LOOM_CHUNK_BYTES sweeps, docs/perf/crosshost.md): 2 hosts, reduce 128 KiB - 2 MiB
  // 34-163 us with 256 KiB pieces against 76-220 with the quarter-step rule (16-128 KiB),
  // broadcast 20-123 against 64-240; 4 hosts likewise (reduce 256 KiB 136 against 369 us).
  if (type == CollType::kBroadcast || type == CollType::kReduce) {
    return std::min(slotBytes, std::max<size_t>(piece, 256 * 1024));
  }
  return piece;
}

int netLanes(CollType type, size_t bytes, int nranks, int maxLanes) {
  // Each lane at least kMinLaneBytes of each ring step: smaller ones cost more in flags and
  // proxy round trips than they gain in parallel copies.
  constexpr size_t kMinLaneBytes = 256 * 1024;
  if (type == CollType::kAllToAll) return 1;
  const size_t stepBytes = bytes / static_cast<size_t>(std::max(1, nranks));
  return static_cast<int>(
      std::clamp<size_t>(stepBytes / kMinLaneBytes, 1, static_cast<size_t>(std::max(1, maxLanes))));
}

Schedule buildSchedule(const CollRequest& req, Algorithm algo) {
  const int r = req.rank, n = req.nranks;
  // The chains of host buffers follow the topology's ring (each host's ranks together,
  // however the launcher placed them: the cost model counts H - 1 host crossings); GPU
  // buffers keep rank order, as measured.
  const std::vector<int>* hostRing = req.device ? nullptr : req.ring;
  switch (req.type) {
    case CollType::kAllReduce:
      // One-shot: GPU buffers combine in the schedule (up to kMaxStepPeers peers); host
      // buffers gather every input and add them in place (the host executor).
      if (algo == Algorithm::kOneShot) {
        return req.device && n - 1 <= kMaxStepPeers ? oneShotAllReduce(r, n, req.count)
                                                    : directAllGather(r, n, req.count);
      }
      if (algo == Algorithm::kDoubling) return doublingAllReduce(r, n, req.count, req.pieceElems);
      if (algo == Algorithm::kDirect) return directAllReduce(r, n, req.count, req.pieceElems);
      if (algo == Algorithm::kHier && req.hier)
        return hierAllReduce(*req.hier, req.count, req.pieceElems);
      // Host buffers on hosts of several ranks: the trees across the hosts, chains inside.
      if (algo == Algorithm::kTree && !req.device && req.hier)
        return hostTreeAllReduce(*req.hier, req.count, req.pieceElems, true);
      return algo == Algorithm::kTree ? treeAllReduce(r, n, req.count, req.pieceElems,
                                                      /*lagResults=*/true)
                                      : ringAllReduce(r, n, req.count, req.pieceElems, req.ring);
    case CollType::kAllGather:
      if (algo == Algorithm::kDirect) return directAllGather(r, n, req.count);
      if (algo == Algorithm::kDoubling) return doublingAllGather(r, n, req.count, req.pieceElems);
      if (algo == Algorithm::kHier && req.hier)
        return hierAllGather(*req.hier, req.count, req.pieceElems);
      return ringAllGather(r, n, req.count, req.pieceElems, req.ring);
    case CollType::kReduceScatter:
      if (algo == Algorithm::kDirect) return directReduceScatter(r, n, req.count, req.pieceElems);
      if (algo == Algorithm::kDoubling)
        return halvingReduceScatter(r, n, req.count, req.pieceElems);
      if (algo == Algorithm::kHier && req.hier)
        return hierReduceScatter(*req.hier, req.count, req.pieceElems);
      return ringReduceScatter(r, n, req.count, req.pieceElems, req.ring);
    case CollType::kBroadcast:
      return algo == Algorithm::kTree ? treeBroadcast(r, n, req.count, req.root)
                                      : chainBroadcast(r, n, req.count, req.root, hostRing);
    case CollType::kReduce:
      return algo == Algorithm::kChain ? chainReduce(r, n, req.count, req.root, hostRing)
                                       : treeReduce(r, n, req.count, req.root);
    case CollType::kAllToAll: return directAllToAll(r, n, req.count);
    case CollType::kSendRecv: return Schedule{};
  }
  return Schedule{};
}

CollRequest requestFor(const Operation& op, int nranks, int rank) {
  CollRequest req;
  req.type = op.type;
  req.count = op.count;
  req.elemSize = dataTypeSize(op.dtype);
  req.nranks = nranks;
  req.rank = rank;
  req.root = op.root;
  return req;
}

bool tunerPick(CollType type, size_t bytes, const model::Fabric& f, model::Algo* algo,
               std::string* reason) {
  const int n = f.nranks();
  if (f.gpu && f.hosts == 1) {
    if (reason) *reason = "GPUs of one host: the mesh planner's size limits decide";
    return false;
  }
  CollRequest req;
  req.type = type;
  req.elemSize = 4;
  req.nranks = n;
  const bool perRank = type == CollType::kAllGather || type == CollType::kReduceScatter ||
                       type == CollType::kAllToAll;
  req.count = std::max<size_t>(1, bytes / req.elemSize / (perRank ? n : 1));
  req.network = f.hosts > 1;
  // As the callers ask: the communicator, for host buffers, with its own fabric across
  // hosts (the flat one inside a host); the GPU network executor with its own
  // (netExecutorFabric: the flat form, every pair of ranks through the network backend).
  model::Fabric executorFabric;
  if (f.hosts > 1 && !f.gpu) req.fabric = &f;
  if (f.hosts > 1 && f.gpu) {
    executorFabric = model::netExecutorFabric(f, /*rail=*/false);
    req.fabric = &executorFabric;
  }
  // GPU buffers across hosts of several GPUs: the hierarchical form where the model prices
  // it under the flat one (chooseDeviceHier, as the GPU executor asks).
  if (f.gpu && f.hosts > 1 && f.ranksPerHost > 1 && type != CollType::kAllToAll) {
    const AlgoRequest none;
    const TunerChoice c = chooseDeviceHier(type, bytes, &f, none, none);
    if (c.algo == Algorithm::kHier) {
      *algo = model::Algo::kHierarchical;
      if (reason) *reason = c.text();
      return true;
    }
  }
  // Host buffers take the hierarchical forms where every host has several ranks.
  Hierarchy h;
  if (!f.gpu && f.hosts > 1 && f.ranksPerHost > 1) {
    std::vector<uint64_t> hostKeys(n);
    for (int r = 0; r < n; ++r) hostKeys[r] = static_cast<uint64_t>(r / f.ranksPerHost);
    std::string why;
    if (findHierarchy(hostKeys, 0, &h, &why)) req.hier = &h;
  }
  const AlgoRequest none;
  auto c = f.gpu ? chooseNetAlgorithm(req, none) : chooseAlgorithm(req, none);
  if (!c.isOk()) {
    if (reason) *reason = c.status().message();
    return false;
  }
  *algo = type == CollType::kAllToAll ? model::Algo::kDirect : modelAlgo(c->algo);
  if (reason) *reason = c->text();
  return true;
}

bool tunerEstimate(CollType type, size_t bytes, const model::Fabric& f, model::Estimate* e) {
  model::Algo algo{};
  if (!tunerPick(type, bytes, f, &algo)) return false;
  const model::Fabric where = f.gpu && f.hosts > 1 && algo != model::Algo::kHierarchical
                                  ? model::netExecutorFabric(f, /*rail=*/false)
                                  : f;
  return model::estimate(type, algo, bytes, where, e);
}

}  // namespace loom::collectives
