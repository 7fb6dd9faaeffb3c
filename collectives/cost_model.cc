#include "collectives/cost_model.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "collectives/tuner.h"

namespace loom::collectives::model {

namespace {

// ceil(log2(n)) for n >= 1.
int log2Ceil(int n) {
  int d = 0;
  while ((1 << d) < n) ++d;
  return d;
}

bool powerOfTwo(int n) {
  return n > 0 && (n & (n - 1)) == 0;
}

// The terms of one estimate, added up as the algorithm's schedule goes.
struct Sum {
  const Fabric& f;
  Estimate e;
  Sum(const Fabric& fabric, Algo a) : f(fabric) {
    e.algo = a;
    e.latencyUs = f.baseUs;
  }
  // `intra` steps between ranks of a host, `inter` steps between hosts.
  void steps(int intra, int inter) {
    e.steps += intra + inter;
    e.latencyUs += intra * f.intra.latencyUs + inter * f.inter.latencyUs;
  }
  // Bytes that the busiest link of each class carries; the slower of the two sets the
  // time (the schedule keeps both busy at once: pieces pipeline).
  void bytes(double intraBytes, double interBytes) {
    double t = 0;
    if (intraBytes > 0 && f.intra.gbps > 0) t = std::max(t, intraBytes / f.intra.bytesPerUs());
    if (interBytes > 0 && f.inter.gbps > 0) t = std::max(t, interBytes / f.inter.bytesPerUs());
    e.bandwidthUs += t;
  }
  // Bytes one rank sends through the network backend (Estimate::netBytes).
  void net(double rankBytes) { e.netBytes += rankBytes; }
  Estimate done(bool built) {
    e.us = e.latencyUs + e.bandwidthUs;
    e.built = built;
    return e;
  }
};

// A ring over all ranks, ranks of a host adjacent: of its n hops per turn, `hosts` cross
// between hosts when there is more than one. A collective that goes `turns` times
// around (moving `share` of S through every rank each time) has turns * (n - 1) steps,
// of which turns * (hosts - 1) cost the inter-host latency (NCCL's count:
// src/graph/tuning.cc). Every byte a rank sends crosses its intra link or, at the host's
// edge, the NICs; the rings' crossings together carry one rank's share per host.
Estimate ring(const Fabric& f, Algo a, double S, int turns) {
  const int n = f.nranks(), H = f.hosts;
  Sum s(f, a);
  const int inter = H > 1 ? turns * (H - 1) : 0;
  s.steps(turns * (n - 1) - inter, inter);
  const double perRank = turns * double(n - 1) / n * S;
  s.bytes(f.ranksPerHost > 1 ? perRank : 0, H > 1 ? perRank : 0);
  s.net(perRank);
  return s.done(true);
}

// How many tree edges cross the NICs of the busiest host, the n ranks numbered host by
// host, G to a host, placed in the trees as the tree schedules place them
// (collectives/schedule.h). `rooted`: the tree of broadcast and reduce rooted at rank 0,
// counting for each host the edges of the busier direction (a broadcast sends down each
// edge, a reduce up). Else both trees of the all-reduce's double binary tree, counting
// every edge that leaves the host (each carries half the buffer each way). With one rank
// per host: 2 (an inner rank's two children) and 4 (inner in one tree, a leaf in the
// other). With several, the in-order labels keep only some of the low edges inside a
// host: 4 x 2 ranks puts 6 across the busiest host's NICs, not 4. O(n log n) the first
// time for each (n, G); the last few answers are kept, so the tuner's calls allocate
// nothing.
int treeHostCrossings(int n, int G, bool rooted) {
  struct Answer {
    int n = 0, G = 0;
    bool rooted = false;
    int crossings = 0;
  };
  thread_local Answer kept[8];
  thread_local int next = 0;
  for (const Answer& a : kept) {
    if (a.n == n && a.G == G && a.rooted == rooted) return a.crossings;
  }
  int most = 0;
  const int H = n / G;
  for (int h = 0; h < H; ++h) {
    int out = 0, in = 0, leaving = 0;
    for (int r = h * G; r < (h + 1) * G; ++r) {
      if (rooted) {
        const TreeLinks t = binaryTree(rootedTreePosition(r, n, 0), n);
        if (t.parent >= 0 && rootedTreeRank(t.parent, n, 0) / G != h) ++in;
        for (int c = 0; c < t.nchildren; ++c)
          if (rootedTreeRank(t.children[c], n, 0) / G != h) ++out;
        continue;
      }
      for (int tree = 0; tree < 2; ++tree) {
        const TreeLinks t = binaryTree(doubleTreePosition(tree, r, n), n);
        if (t.parent >= 0 && doubleTreeRank(tree, t.parent, n) / G != h) ++leaving;
        for (int c = 0; c < t.nchildren; ++c)
          if (doubleTreeRank(tree, t.children[c], n) / G != h) ++leaving;
      }
    }
    most = std::max(most, rooted ? std::max(in, out) : leaving);
  }
  kept[next] = {n, G, rooted, most};
  next = (next + 1) % 8;
  return most;
}

// The double binary tree over all ranks (in-order labels on the ring order): depth
// ceil(log2 n); the edges of the lowest log2(ranksPerHost) levels join ranks of one host,
// the others cross hosts. All-reduce goes up and down (2 * depth steps) and moves about
// 2S through every rank (each rank is inner in one tree, a leaf in the other, each tree
// carrying S/2); through the busiest host's NICs, S/2 for each tree edge that leaves it.
Estimate tree(const Fabric& f, double S) {
  const int n = f.nranks();
  const int depth = log2Ceil(n);
  const int low = std::min(depth, log2Ceil(f.ranksPerHost));
  Sum s(f, Algo::kTree);
  if (f.hostTree && f.hosts > 1 && f.ranksPerHost > 1) {
    // A chain of G ranks inside each host under its member of the trees across the hosts:
    // 2 (G - 1) steps inside and 2 ceil(log2 H) across, up and down; through a host's
    // NICs, S/2 for each edge of the host-level trees that leaves it (S on 2 hosts, 1.5S
    // on 3, 2S from 4); a rank of a chain moves 2S through its links inside. Measured
    // 1.2-1.3 x this at 4 MiB on 4 and 8 hosts of 2 ranks (docs/perf/cost_model.md).
    s.steps(2 * (f.ranksPerHost - 1), 2 * log2Ceil(f.hosts));
    s.bytes(2 * S, treeHostCrossings(f.hosts, 1, false) * S / 2);
    return s.done(true);
  }
  s.steps(2 * low, 2 * (depth - low));
  const double inter = f.hosts > 1 ? treeHostCrossings(n, f.ranksPerHost, false) * S / 2 : 0;
  s.bytes(f.ranksPerHost > 1 ? 2 * S : 0, inter);
  s.net(2 * S);
  return s.done(true);
}

// Every rank sends `perPeer` bytes to each other rank at once, `phases` times: one step
// each (the inter-host latency when any peer is remote). A host's NICs carry what its
// ranks send to the other hosts' ranks.
Estimate direct(const Fabric& f, Algo a, double perPeer, int phases, bool built) {
  const int n = f.nranks(), G = f.ranksPerHost, H = f.hosts;
  Sum s(f, a);
  s.steps(H > 1 ? 0 : phases, H > 1 ? phases : 0);
  s.e.latencyUs += phases * (n - 2) * f.messageUs;
  const double intraBytes = phases * (G - 1) * perPeer;
  const double interBytes = phases * double(G) * (n - G) * perPeer;
  s.bytes(intraBytes, interBytes);
  s.net(phases * double(n - 1) * perPeer);
  return s.done(built);
}

// Recursive doubling: log2(n) exchanges of the whole buffer; the first log2(G) between
// ranks of a host, the rest across hosts, where every rank of a host sends at once.
Estimate doubling(const Fabric& f, double S) {
  const int G = f.ranksPerHost;
  const int low = log2Ceil(G), high = log2Ceil(f.hosts);
  Sum s(f, Algo::kDoubling);
  s.steps(low, high);
  s.e.bandwidthUs += low > 0 && f.intra.gbps > 0 ? low * S / f.intra.bytesPerUs() : 0;
  s.e.bandwidthUs += high > 0 && f.inter.gbps > 0 ? high * G * S / f.inter.bytesPerUs() : 0;
  s.net((low + high) * S);
  return s.done(true);
}

// GPU buffers: the hierarchical forms run their in-host mesh passes and the rail's call
// one after the other on the caller's stream (collectives/device/cuda_executor_hier.cc),
// so their times add up. The rail is a network executor of one rank per host
// (netExecutorFabric(f, rail)); it runs the fastest of its built forms there, one-shot
// aside (it has no GPU form over the network).
Estimate railEstimate(CollType type, double bytes, const Fabric& f) {
  const Fabric rail = netExecutorFabric(f, /*rail=*/true);
  if (type == CollType::kBroadcast) {
    // The rail's broadcast follows the tuner's rule, not the model.
    const size_t b = static_cast<size_t>(bytes);
    Estimate e;
    estimate(type, broadcastRuleTakesTree(b, rail.nranks()) ? Algo::kTree : Algo::kChain, b, rail,
             &e);
    return e;
  }
  Estimate best;
  bool any = false;
  for (Algo a : kAllAlgos) {
    Estimate e;
    if (a == Algo::kOneShot || !estimate(type, a, static_cast<size_t>(bytes), rail, &e) || !e.built)
      continue;
    if (!any || e.us < best.us) best = e;
    any = true;
  }
  return best;
}

Estimate meshEstimate(CollType type, double bytes, const Fabric& f) {
  Fabric host = f;
  host.hosts = 1;
  Estimate e;
  estimate(type, Algo::kMeshOneShot, static_cast<size_t>(bytes), host, &e);
  return e;
}

// The passes of a GPU hierarchical form, in order, as one estimate.
Estimate sequence(std::initializer_list<Estimate> passes) {
  Estimate out;
  out.algo = Algo::kHierarchical;
  for (const Estimate& p : passes) {
    out.us += p.us;
    out.latencyUs += p.latencyUs;
    out.bandwidthUs += p.bandwidthUs;
    out.steps += p.steps;
    out.stageUs += p.stageUs;  // (each pass staged already: netBytes stays 0)
  }
  return out;
}

// GPU buffers over a staged network path (Fabric::stage): the kernels copy every byte a rank
// sends or receives through host memory, a piece at a time on each of the call's lanes,
// while the wire carries the pieces before. The two overlap, so the bandwidth term becomes
// the slower of the wire and the copies, plus, for each step, the first piece's copy or
// wire time (whichever is shorter), which nothing overlaps: a pipeline of k pieces a step
// takes (k - 1) x max(copy, wire) + copy + wire. A step is taken as those two stages: the
// pass that reads a received piece also writes the next step's send, and the last step's
// copy out of host memory is left out. The wire is one rank's share of its host's NICs.
// `bytes` as estimate() takes them.
void staged(CollType type, size_t bytes, const Fabric& f, Estimate* e) {
  const Staging& st = f.stage;
  if (!st.on() || e->netBytes <= 0 || e->steps <= 0 || !(f.gpuNetwork || (f.gpu && f.hosts > 1)))
    return;
  const int n = f.nranks();
  const int lanes = netLanes(type, bytes, n, st.maxLanes);
  const double rate = st.rate(lanes) * 1e3;  // bytes per us, every lane together
  const double wire =
      f.hosts > 1 ? f.inter.bytesPerUs() / std::max(1, f.ranksPerHost) : f.intra.bytesPerUs();
  if (rate <= 0 || wire <= 0) return;
  const double laneStep = e->netBytes / e->steps / lanes;  // one lane's bytes a step
  // (The executor cuts an all-gather's or reduce-scatter's pieces from a rank's block.)
  const bool blocked = type == CollType::kAllGather || type == CollType::kReduceScatter;
  const size_t cut = (blocked ? bytes / size_t(n) : bytes) / size_t(lanes);
  const double piece = std::min(laneStep, double(netPieceBytes(type, cut, n, st.slotBytes)));
  const double copy = piece / (rate / lanes), carried = piece / (wire / lanes);
  const double before = e->bandwidthUs;
  e->bandwidthUs = std::max(before, e->netBytes / rate) + e->steps * std::min(copy, carried);
  e->stageUs += e->bandwidthUs - before;
  e->us = e->latencyUs + e->bandwidthUs;
}

// Split rail: reduce-scatter inside each host, then ranksPerHost rings across hosts at
// once (one per rail, each on S / ranksPerHost), then all-gather inside each host. For
// host buffers (hierAllReduce) the three phases pipeline in pieces (as UCC's split_rail
// does), so the busier of the two link classes sets the bandwidth term, as for every other
// algorithm. For GPU buffers they run one after the other, the rail's all-reduce in
// whichever form its executor takes (ring, tree, recursive doubling).
Estimate hierarchical(const Fabric& f, double S) {
  const int G = f.ranksPerHost, H = f.hosts;
  if (f.gpu) {
    return sequence({meshEstimate(CollType::kReduceScatter, S, f),
                     railEstimate(CollType::kAllReduce, S / G, f),
                     meshEstimate(CollType::kAllGather, S, f)});
  }
  Sum s(f, Algo::kHierarchical);
  s.steps(2 * (G - 1), 2 * (H - 1));
  s.bytes(2.0 * (G - 1) / G * S, 2.0 * (H - 1) / H * S);
  return s.done(true);
}

// Hierarchical all-gather (host buffers): a ring across the hosts per rail, then a ring
// inside each host per host's blocks. The reduce-scatter is its mirror, the same bytes: a
// ring inside the host per host's blocks whose last step is also the rail ring's, so H - 1
// of its H (G - 1) steps cross hosts. GPU buffers: the rail's call on S / G of output (or
// input), and the mesh pass on S, one after the other (the 2D copies between rank and
// local order, at device memory speed, are left out).
Estimate hierarchicalGather(const Fabric& f, double S, bool scatter) {
  const int G = f.ranksPerHost, H = f.hosts;
  if (f.gpu) {
    const CollType t = scatter ? CollType::kReduceScatter : CollType::kAllGather;
    return scatter ? sequence({meshEstimate(t, S, f), railEstimate(t, S / G, f)})
                   : sequence({railEstimate(t, S / G, f), meshEstimate(t, S, f)});
  }
  Sum s(f, Algo::kHierarchical);
  if (scatter) {
    s.steps(H * (G - 1) - (H - 1), H - 1);
  } else {
    s.steps(H * (G - 1), H - 1);
  }
  s.bytes(double(G - 1) / G * S, double(H - 1) / H * S);
  return s.done(true);
}

// GPU buffers, broadcast: either the whole buffer over the root's rail, then from each
// host's rank on it to the others over the mesh; or split over every rail: the root's host
// passes the buffer to its ranks over the mesh, each rail carries its G-th across the
// hosts, and each other host's ranks gather the parts over the mesh. Reduce is the mirror
// of each (mesh reduce, or mesh reduce-scatter; the rail's reduce; on the root's host a
// mesh all-gather of the parts). The split form sends S/G through each NIC instead of S
// through one, for one more pass. Host buffers have neither.
Estimate hierarchicalRooted(const Fabric& f, double S, bool reduce, bool split) {
  const int G = f.ranksPerHost;
  if (split) {
    return reduce ? sequence({meshEstimate(CollType::kReduceScatter, S, f),
                              railEstimate(CollType::kReduce, S / G, f),
                              meshEstimate(CollType::kAllGather, S, f)})
                  : sequence({meshEstimate(CollType::kBroadcast, S, f),
                              railEstimate(CollType::kBroadcast, S / G, f),
                              meshEstimate(CollType::kAllGather, S, f)});
  }
  return reduce ? sequence({meshEstimate(CollType::kReduce, S, f),
                            railEstimate(CollType::kReduce, S, f)})
                : sequence({railEstimate(CollType::kBroadcast, S, f),
                            meshEstimate(CollType::kBroadcast, S, f)});
}

Estimate hierarchicalRooted(const Fabric& f, double S, bool reduce) {
  const Estimate whole = hierarchicalRooted(f, S, reduce, false);
  const Estimate split = hierarchicalRooted(f, S, reduce, true);
  return split.us < whole.us ? split : whole;
}

// Broadcast and reduce: a chain streams S through every rank once, n - 1 hops; the tree
// reaches every rank in depth hops, inner ranks sending (or receiving) twice.
// GPU all-to-all split by host (cuda_executor_hier.cc runSplitAllToAll, blocks of 512 KiB
// and more, or where LOOM_ALGO names hier): one mesh all-to-all of the host's G blocks, then every
// other host's block as one step of network sends (each rank to its n - G remote peers at once; a
// host's NICs carry G (n - G) blocks), one after the other.
Estimate hierarchicalAllToAll(const Fabric& f, double S) {
  const int n = f.nranks(), G = f.ranksPerHost;
  const double block = S / n;
  Sum remote(f, Algo::kHierarchical);
  remote.e.latencyUs = 0;  // the call's base is the mesh pass's
  remote.steps(0, 1);
  remote.e.latencyUs += (n - G - 1) * f.messageUs;
  remote.bytes(0, double(G) * (n - G) * block);
  remote.net((n - G) * block);
  Estimate network = remote.done(true);
  staged(CollType::kAllToAll, static_cast<size_t>(S), f, &network);
  return sequence({meshEstimate(CollType::kAllToAll, G * block, f), network});
}

Estimate chain(const Fabric& f, Algo a, double S) {
  const int n = f.nranks(), H = f.hosts;
  Sum s(f, a);
  const int inter = H > 1 ? H - 1 : 0;
  s.steps(n - 1 - inter, inter);
  s.bytes(f.ranksPerHost > 1 ? S : 0, H > 1 ? S : 0);
  s.net(S);
  return s.done(true);
}

Estimate rootedTree(const Fabric& f, double S) {
  const int n = f.nranks();
  const int depth = log2Ceil(n);
  const int low = std::min(depth, log2Ceil(f.ranksPerHost));
  Sum s(f, Algo::kTree);
  s.steps(low, depth - low);
  // Two ranks: one edge, no inner rank.
  const double moved = n > 2 ? 2 * S : S;
  const double inter = f.hosts > 1 ? treeHostCrossings(n, f.ranksPerHost, true) * S : 0;
  s.bytes(f.ranksPerHost > 1 ? moved : 0, inter);
  s.net(moved);
  return s.done(true);
}

}  // namespace

bool broadcastRuleTakesTree(size_t bytes, int nranks) {
  // Measured with GPU buffers against NCCL (docs/perf/crosshost.md).
  return bytes < 256 * 1024 && nranks > 4;
}

bool hierSplitsRails(CollType type, size_t bytes, const Fabric& f) {
  if (!f.gpu || f.hosts <= 1 || f.ranksPerHost <= 1) return false;
  if (type != CollType::kBroadcast && type != CollType::kReduce) return false;
  const bool reduce = type == CollType::kReduce;
  const double S = static_cast<double>(bytes);
  return hierarchicalRooted(f, S, reduce, true).us < hierarchicalRooted(f, S, reduce, false).us;
}

bool hierRootedEstimate(CollType type, size_t bytes, const Fabric& f, bool split, Estimate* out) {
  if (!f.gpu || f.hosts <= 1 || f.ranksPerHost <= 1) return false;
  if (type != CollType::kBroadcast && type != CollType::kReduce) return false;
  *out = hierarchicalRooted(f, static_cast<double>(bytes), type == CollType::kReduce, split);
  return true;
}

const char* algoName(Algo a) {
  switch (a) {
    case Algo::kRing: return "ring";
    case Algo::kTree: return "tree";
    case Algo::kChain: return "chain";
    case Algo::kDirect: return "direct";
    case Algo::kDoubling: return "doubling";
    case Algo::kOneShot: return "oneshot";
    case Algo::kHierarchical: return "hierarchical";
    case Algo::kMeshOneShot: return "mesh-oneshot";
    case Algo::kMeshTwoShot: return "mesh-twoshot";
  }
  return "?";
}

namespace {

bool unstagedEstimate(CollType type, Algo a, size_t bytes, const Fabric& f, Estimate* out) {
  const int n = f.nranks();
  const double S = static_cast<double>(bytes);
  if (n <= 1) {
    if (a != Algo::kRing) return false;
    *out = Sum(f, Algo::kRing).done(true);
    return true;
  }
  // The in-host mesh forms: GPUs of one host, through peer memory (collectives/device/mesh_plan.h);
  // there the mesh forms are the only ones.
  const bool mesh = f.gpu && f.hosts == 1;
  const bool meshAlgo = a == Algo::kMeshOneShot || a == Algo::kMeshTwoShot;
  if (mesh != meshAlgo) return false;
  switch (type) {
    case CollType::kAllReduce:
      switch (a) {
        case Algo::kMeshOneShot: *out = direct(f, a, S, 1, true); return true;
        case Algo::kMeshTwoShot: *out = direct(f, a, S / n, 2, true); return true;
        case Algo::kRing: *out = ring(f, a, S, 2); return true;
        case Algo::kTree:
          if (n <= 2) return false;
          *out = tree(f, S);
          return true;
        case Algo::kDirect: *out = direct(f, a, S / n, 2, n - 1 <= kMaxStepPeers); return true;
        case Algo::kDoubling:
          if (!powerOfTwo(n)) return false;
          *out = doubling(f, S);
          return true;
        // GPU buffers across hosts: on up to kMaxStepPeers + 1 ranks (oneShotAllReduce, a
        // step with every peer). Above kOneShotMaxBytes the tuner never runs it.
        case Algo::kOneShot:
          *out = direct(f, a, S, 1,
                        (!f.gpu || (f.hosts > 1 && n - 1 <= kMaxStepPeers)) &&
                            S * (n - 1) <= double(kOneShotMaxBytes));
          return true;
        case Algo::kHierarchical:
          if (f.hosts <= 1 || f.ranksPerHost <= 1) return false;
          *out = hierarchical(f, S);
          return true;
        default: return false;
      }
    case CollType::kAllGather:
    case CollType::kReduceScatter:
      switch (a) {
        case Algo::kMeshOneShot: *out = direct(f, a, S / n, 1, true); return true;
        case Algo::kRing: *out = ring(f, a, S, 1); return true;
        // Built on 3 and 4 ranks for GPU buffers over the network and for host buffers
        // across hosts of one rank (the tuner's bounds).
        case Algo::kDirect:
          *out = direct(f, a, S / n, 1,
                        (f.gpuNetwork || (!f.gpu && f.hosts > 1 && f.ranksPerHost == 1)) && n > 2 &&
                            n - 1 <= kMaxStepPeers);
          return true;
        case Algo::kHierarchical:
          if (f.hosts <= 1 || f.ranksPerHost <= 1) return false;
          *out = hierarchicalGather(f, S, type == CollType::kReduceScatter);
          return true;
        default: return false;
      }
    case CollType::kBroadcast:
      switch (a) {
        case Algo::kMeshOneShot: *out = direct(f, a, S / (n - 1), 1, true); return true;
        case Algo::kChain: *out = chain(f, a, S); return true;
        case Algo::kTree: *out = rootedTree(f, S); return true;
        case Algo::kHierarchical:
          if (!f.gpu || f.hosts <= 1 || f.ranksPerHost <= 1) return false;
          *out = hierarchicalRooted(f, S, /*reduce=*/false);
          return true;
        default: return false;
      }
    case CollType::kReduce:
      switch (a) {
        case Algo::kMeshOneShot: *out = direct(f, a, S / (n - 1), 1, true); return true;
        case Algo::kTree: *out = rootedTree(f, S); return true;
        case Algo::kChain: *out = chain(f, a, S); return true;
        case Algo::kHierarchical:
          if (!f.gpu || f.hosts <= 1 || f.ranksPerHost <= 1) return false;
          *out = hierarchicalRooted(f, S, /*reduce=*/true);
          return true;
        default: return false;
      }
    case CollType::kAllToAll:
      if (a == Algo::kHierarchical) {
        if (!f.gpu || f.hosts <= 1 || f.ranksPerHost <= 1) return false;
        *out = hierarchicalAllToAll(f, S);
        return true;
      }
      if (a != (mesh ? Algo::kMeshOneShot : Algo::kDirect)) return false;
      *out = direct(f, a, S / n, 1, true);
      return true;
    case CollType::kSendRecv:
      if (a != (mesh ? Algo::kMeshOneShot : Algo::kDirect)) return false;
      *out = direct(f, a, S / n, 1, true);
      return true;
  }
  return false;
}

}  // namespace

double Staging::rate(int lanes) const {
  constexpr int kCounts[4] = {1, 2, 4, 8};
  lanes = std::clamp(lanes, 1, 8);
  for (int i = 0; i < 3; ++i) {
    if (lanes <= kCounts[i + 1]) {
      const double t = double(lanes - kCounts[i]) / (kCounts[i + 1] - kCounts[i]);
      return gbps[i] + t * (gbps[i + 1] - gbps[i]);
    }
  }
  return gbps[3];
}

bool estimate(CollType type, Algo a, size_t bytes, const Fabric& f, Estimate* out) {
  if (!unstagedEstimate(type, a, bytes, f, out)) return false;
  staged(type, bytes, f, out);
  return true;
}

std::vector<Estimate> estimates(CollType type, size_t bytes, const Fabric& f) {
  std::vector<Estimate> out;
  for (Algo a : kAllAlgos) {
    Estimate e;
    if (estimate(type, a, bytes, f, &e)) out.push_back(e);
  }
  return out;
}

Estimate fastest(const std::vector<Estimate>& list) {
  const Estimate* best = nullptr;
  for (const Estimate& e : list) {
    if (e.built && (!best || e.us < best->us)) best = &e;
  }
  return best ? *best : Estimate{};
}

double busGBs(CollType type, size_t bytes, int nranks, double us) {
  if (us <= 0) return 0;
  const double algbw = static_cast<double>(bytes) / (us * 1e3);
  const double n = nranks;
  switch (type) {
    case CollType::kAllReduce: return algbw * 2 * (n - 1) / n;
    case CollType::kAllGather:
    case CollType::kReduceScatter:
    case CollType::kAllToAll: return algbw * (n - 1) / n;
    default: return algbw;
  }
}

// The constants below are docs/cost-model.md's table; change them there too.
Fabric hostMemoryFabric(int hosts, int ranksPerHost, double netGbps) {
  Fabric f;
  f.hosts = hosts;
  f.ranksPerHost = ranksPerHost;
  f.intra = {4.0, 5.6};  // shm: 8 B and 128 MiB all-reduce, 4 ranks
  f.inter = {20.0, std::min(netGbps > 0 ? netGbps : 2.0, 2.0)};  // loopback TCP, 4 ranks
  f.baseUs = 1.0;
  f.messageUs = 5.0;
  f.gpu = false;
  f.hostTree = true;
  f.intraName = "shm";
  f.interName = "tcp";
  return f;
}

Fabric gpuFabric(int hosts, int gpusPerHost, double intraGbps, double nicGbps, NetPath path) {
  Fabric f;
  f.hosts = hosts;
  f.ranksPerHost = gpusPerHost;
  f.intra = {3.0, intraGbps};  // NVLink mesh: a flag round trip per step
  f.baseUs = 2.0;
  f.messageUs = 1.0;
  if (path == NetPath::kRdma) {
    f.inter = {12.0, nicGbps};  // not measured (no RDMA NIC lent): near NCCL's IB figures
  } else {
    // Sockets, measured with GPU buffers on one H200, processes as hosts under MPS
    // (scripts/model_check_gpu.sh, 2026-12-03 20:30 UTC, all-reduce 8 and 64 B): ring,
    // direct and recursive doubling at 2 and 4 hosts, 30-150 us, fit within 18 % by 29 us
    // a step (the kernel's flags through mapped host memory, the proxy's wake-ups, the
    // sockets) and 8 us a further message of a step, on the same 2 us a call.
    f.inter = {29.0, nicGbps};
    if (hosts > 1) f.messageUs = 8.0;
    // Each GPU's kernels copy through page-locked host memory: 1, 2, 4 and 8 blocks writing
    // and reading 1 MiB pieces at once, one process on one H100 (bench/gpu_staging_probe,
    // 2026-12-06 15:05 UTC).
    f.stage.gbps[0] = 5.8;
    f.stage.gbps[1] = 11.3;
    f.stage.gbps[2] = 17.5;
    f.stage.gbps[3] = 22.8;
  }
  f.gpu = true;
  f.intraName = "nvlink";
  f.interName = path == NetPath::kRdma ? "rdma" : "net";
  return f;
}

Fabric netExecutorFabric(const Fabric& comm, bool rail) {
  Fabric f = comm;
  f.gpu = false;  // no mesh forms among the executor's ranks
  f.gpuNetwork = comm.gpu;
  f.hostTree = false;  // its tree is the one over all ranks (treeAllReduce)
  const LinkCost share = {comm.inter.latencyUs, comm.inter.gbps / std::max(1, comm.ranksPerHost)};
  if (rail) {
    f.ranksPerHost = 1;
    f.inter = share;
  } else {
    f.intra = share;
  }
  f.intraName = f.interName;
  return f;
}

}  // namespace loom::collectives::model
