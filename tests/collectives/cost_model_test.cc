// collectives/cost_model.h: the model's shape (monotonic where it must be, the crossovers
// where they must fall), and that the tuner's ring-against-tree choice is the model's.
#include "collectives/cost_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "collectives/fabric.h"
#include "collectives/tuner.h"
#include "topology/topology.h"

namespace loom::collectives::model {
namespace {

double us(CollType t, Algo a, size_t bytes, const Fabric& f) {
  Estimate e;
  EXPECT_TRUE(estimate(t, a, bytes, f, &e)) << algoName(a);
  return e.us;
}

Fabric dgx(int hosts) {
  return gpuFabric(hosts, 8, 450, 400, NetPath::kRdma);
}

const CollType kTypes[] = {CollType::kAllReduce, CollType::kAllGather, CollType::kReduceScatter,
                           CollType::kBroadcast, CollType::kReduce,    CollType::kAllToAll};

// The tree's bytes through a host's NICs are counted on the trees as built: one rank per
// host sends 2S (inner in one tree, a leaf in the other); the tree over all ranks in order
// (GPU buffers) puts 6 edges of S/2 across the busiest host's link at 4 hosts of 2 ranks
// (the netns check measured 1.7 x the ring there before host buffers took the host tree);
// the host tree of host buffers 2S, and S on 2 hosts; the rooted tree's inner ranks send
// S to each of two children.
TEST(CostModel, TreeCountsTheEdgesLeavingAHost) {
  const double S = 64 << 20;
  auto interBytes = [&](CollType t, const Fabric& f) {
    Estimate e;
    EXPECT_TRUE(estimate(t, Algo::kTree, size_t(S), f, &e));
    return e.bandwidthUs * f.inter.bytesPerUs();
  };
  auto inOrder = [](Fabric f) {
    f.hostTree = false;
    return f;
  };
  EXPECT_NEAR(interBytes(CollType::kAllReduce, hostMemoryFabric(8, 1, 0.125)), 2 * S, 1);
  EXPECT_NEAR(interBytes(CollType::kAllReduce, inOrder(hostMemoryFabric(4, 2, 0.125))), 3 * S, 1);
  EXPECT_NEAR(interBytes(CollType::kAllReduce, inOrder(hostMemoryFabric(2, 2, 0.125))), 2 * S, 1);
  EXPECT_NEAR(interBytes(CollType::kAllReduce, hostMemoryFabric(4, 2, 0.125)), 2 * S, 1);
  EXPECT_NEAR(interBytes(CollType::kAllReduce, hostMemoryFabric(2, 2, 0.125)), S, 1);
  EXPECT_NEAR(interBytes(CollType::kBroadcast, hostMemoryFabric(8, 1, 0.125)), 2 * S, 1);
  EXPECT_NEAR(interBytes(CollType::kReduce, hostMemoryFabric(2, 1, 0.125)), S, 1);
  // Asked again (the answers are kept), the same.
  EXPECT_NEAR(interBytes(CollType::kAllReduce, inOrder(hostMemoryFabric(4, 2, 0.125))), 3 * S, 1);
  // The host tree's steps: a chain of G inside, ceil(log2 H) levels across, up and down.
  Estimate e;
  ASSERT_TRUE(estimate(CollType::kAllReduce, Algo::kTree, 8, hostMemoryFabric(16, 4, 0.125), &e));
  EXPECT_EQ(e.steps, 2 * 3 + 2 * 4);
}

// GPU buffers: the hierarchical all-reduce's passes run one after the other (mesh
// reduce-scatter, the rail's all-reduce of S/G, mesh all-gather), so the estimate is their
// sum, the rail in its fastest built form on the rail's own fabric: at 256 hosts an 8-byte
// call takes far fewer than the ring's 2 x 255 steps between hosts.
TEST(CostModel, GpuHierarchicalAddsItsPasses) {
  const double S = 1 << 30;
  const Fabric f = dgx(2);
  Estimate h;
  ASSERT_TRUE(estimate(CollType::kAllReduce, Algo::kHierarchical, size_t(S), f, &h));
  EXPECT_TRUE(h.built);
  const Fabric host = dgx(1);
  const Fabric rail = netExecutorFabric(f, /*rail=*/true);
  double railUs = 1e300;
  for (Algo a : {Algo::kRing, Algo::kDirect, Algo::kDoubling}) {
    Estimate e;
    if (estimate(CollType::kAllReduce, a, size_t(S / 8), rail, &e) && e.built)
      railUs = std::min(railUs, e.us);
  }
  const double want = us(CollType::kReduceScatter, Algo::kMeshOneShot, size_t(S), host) + railUs +
                      us(CollType::kAllGather, Algo::kMeshOneShot, size_t(S), host);
  EXPECT_NEAR(h.us, want, 1e-6 * want);
  Estimate small;
  ASSERT_TRUE(estimate(CollType::kAllReduce, Algo::kHierarchical, 8, dgx(256), &small));
  EXPECT_LT(small.latencyUs, 2 * 255 * dgx(256).inter.latencyUs / 4);
}

// More bytes never take less time, on any algorithm, collective or fabric.
TEST(CostModel, TimeGrowsWithBytes) {
  for (const Fabric& f :
       {hostMemoryFabric(4, 1, 0.125), hostMemoryFabric(1, 4, 0), dgx(1), dgx(2), dgx(64)}) {
    for (CollType t : kTypes) {
      for (Algo a : kAllAlgos) {
        double last = 0;
        for (size_t b = 8; b <= (size_t(1) << 32); b *= 4) {
          Estimate e;
          if (!estimate(t, a, b, f, &e)) break;
          EXPECT_GE(e.us, last) << collTypeName(t) << " " << algoName(a) << " " << b;
          EXPECT_NEAR(e.us, e.latencyUs + e.bandwidthUs, 1e-9);
          last = e.us;
        }
      }
    }
  }
}

// More hosts never make a call faster, and every collective has a built form.
TEST(CostModel, TimeGrowsWithHostsAndEveryCollectiveHasABuiltForm) {
  for (CollType t : kTypes) {
    for (size_t b : {size_t(8), size_t(1) << 20, size_t(1) << 30}) {
      double last = 0;
      for (int h = 2; h <= 4096; h *= 2) {
        const Estimate best = fastest(estimates(t, b, dgx(h)));
        EXPECT_TRUE(best.built);
        EXPECT_GT(best.us, 0);
        EXPECT_GE(best.us, last * 0.999) << collTypeName(t) << " " << b << " " << h;
        last = best.us;
      }
    }
  }
}

// The latency terms: a ring of n ranks pays 2(n-1) steps for all-reduce, of which
// 2(hosts-1) cross hosts; the tree 2 ceil(log2 n).
TEST(CostModel, StepCounts) {
  Estimate e;
  ASSERT_TRUE(estimate(CollType::kAllReduce, Algo::kRing, 8, dgx(4), &e));
  EXPECT_EQ(e.steps, 2 * 31);
  const Fabric f = dgx(4);
  EXPECT_NEAR(e.latencyUs, f.baseUs + 2 * 3 * f.inter.latencyUs + (62 - 6) * f.intra.latencyUs,
              1e-9);
  ASSERT_TRUE(estimate(CollType::kAllReduce, Algo::kTree, 8, dgx(4), &e));
  EXPECT_EQ(e.steps, 2 * 5);
  ASSERT_TRUE(estimate(CollType::kAllGather, Algo::kRing, 8, dgx(4), &e));
  EXPECT_EQ(e.steps, 31);
  // No tree on 2 ranks, no doubling on 3, no mesh form across hosts or network form inside.
  EXPECT_FALSE(estimate(CollType::kAllReduce, Algo::kTree, 8, hostMemoryFabric(2, 1, 0), &e));
  EXPECT_FALSE(estimate(CollType::kAllReduce, Algo::kDoubling, 8, hostMemoryFabric(3, 1, 0), &e));
  EXPECT_FALSE(estimate(CollType::kAllReduce, Algo::kMeshOneShot, 8, dgx(2), &e));
  EXPECT_FALSE(estimate(CollType::kAllReduce, Algo::kRing, 8, dgx(1), &e));
}

// Large messages: the ring's bandwidth term is the bus at the NICs' speed, so its busbw
// approaches the slower of the GPU links and the network; small ones favour few steps.
TEST(CostModel, RingBusBandwidthApproachesTheSlowerLink) {
  const size_t big = size_t(16) << 30;
  EXPECT_NEAR(
      busGBs(CollType::kAllReduce, big, 16, us(CollType::kAllReduce, Algo::kRing, big, dgx(2))),
      400, 4);
  const Fabric slow = hostMemoryFabric(4, 1, 0.125);
  EXPECT_NEAR(
      busGBs(CollType::kAllReduce, big, 4, us(CollType::kAllReduce, Algo::kRing, big, slow)), 0.125,
      0.002);
}

// The crossovers: across hosts the tree wins small all-reduces (log steps) and the ring
// large ones; recursive doubling beats the ring at 8 B and loses at 1 GiB (it moves log2 n
// times the buffer).
TEST(CostModel, Crossovers) {
  const Fabric f = dgx(64);
  EXPECT_LT(us(CollType::kAllReduce, Algo::kTree, 8, f),
            us(CollType::kAllReduce, Algo::kRing, 8, f));
  EXPECT_LT(us(CollType::kAllReduce, Algo::kDoubling, 8, f),
            us(CollType::kAllReduce, Algo::kRing, 8, f));
  const size_t big = size_t(1) << 30;
  EXPECT_GT(us(CollType::kAllReduce, Algo::kDoubling, big, f),
            us(CollType::kAllReduce, Algo::kRing, big, f));
  // A flat fabric (one link class): the ring overtakes the tree somewhere between 8 B
  // and 1 GiB, and the tuner switches where the model does.
  Fabric flat = hostMemoryFabric(1, 8, 0);
  flat.intra = {10.0, 4.0};
  size_t cross = 0;
  for (size_t b = 8; b <= big; b *= 2) {
    if (us(CollType::kAllReduce, Algo::kRing, b, flat) <
        us(CollType::kAllReduce, Algo::kTree, b, flat)) {
      cross = b;
      break;
    }
  }
  ASSERT_GT(cross, 8u);
  ASSERT_LT(cross, big);
  for (size_t b : {cross / 2, cross}) {
    CollRequest req;
    req.type = CollType::kAllReduce;
    req.count = b / 4;
    req.nranks = 8;
    req.fabric = &flat;
    auto c = chooseAlgorithm(req, "ring,tree");
    ASSERT_TRUE(c.isOk());
    EXPECT_EQ(c->algo, b == cross ? Algorithm::kRing : Algorithm::kTree) << b;
  }
}

// The split-rail form for GPU buffers takes fewer steps than the flat ring across many
// hosts of many GPUs, and is the fastest form there at 1 MiB.
TEST(CostModel, GpuHierarchicalTakesFewerStepsAtScale) {
  const Fabric f = dgx(512);
  Estimate h, r;
  ASSERT_TRUE(estimate(CollType::kAllReduce, Algo::kHierarchical, 1 << 20, f, &h));
  ASSERT_TRUE(estimate(CollType::kAllReduce, Algo::kRing, 1 << 20, f, &r));
  EXPECT_TRUE(h.built);
  EXPECT_LT(h.steps, r.steps);
  EXPECT_EQ(fastest(estimates(CollType::kAllReduce, 1 << 20, f)).algo, Algo::kHierarchical);
}

// GPU broadcast and reduce: the root's rail carries the whole buffer across the hosts and
// the mesh passes it on inside each (or the mirror), one pass after the other; or the
// buffer is split over every rail, with a mesh pass more. The split form wins for large
// buffers (S/G through each NIC instead of S through one) and loses for small ones (one
// more pass). Host buffers have neither.
TEST(CostModel, GpuHierarchicalBroadcastAndReduceAddTheirPasses) {
  const Fabric f = dgx(4);
  const Fabric host = dgx(1);
  const Fabric rail = netExecutorFabric(f, /*rail=*/true);
  // The rail's reduce is the cheaper of chain and tree; its broadcast follows the tuner's
  // rule (4 hosts: the chain at every size).
  auto railUs = [&](CollType t, size_t b) {
    if (t == CollType::kBroadcast) return us(t, Algo::kChain, b, rail);
    return std::min(us(t, Algo::kChain, b, rail), us(t, Algo::kTree, b, rail));
  };
  for (CollType t : {CollType::kBroadcast, CollType::kReduce}) {
    const bool reduce = t == CollType::kReduce;
    for (size_t b : {size_t(8), size_t(1) << 30}) {
      Estimate h, none;
      ASSERT_TRUE(estimate(t, Algo::kHierarchical, b, f, &h));
      EXPECT_TRUE(h.built);
      const double whole = railUs(t, b) + us(t, Algo::kMeshOneShot, b, host);
      const double split = us(reduce ? CollType::kReduceScatter : CollType::kBroadcast,
                              Algo::kMeshOneShot, b, host) +
                           railUs(t, b / 8) + us(CollType::kAllGather, Algo::kMeshOneShot, b, host);
      EXPECT_NEAR(h.us, std::min(whole, split), 1e-6 * h.us) << collTypeName(t) << " " << b;
      EXPECT_EQ(hierSplitsRails(t, b, f), split < whole) << collTypeName(t) << " " << b;
      EXPECT_FALSE(estimate(t, Algo::kHierarchical, b, hostMemoryFabric(4, 2, 0.125), &none));
    }
    EXPECT_FALSE(hierSplitsRails(t, 8, f));
    EXPECT_TRUE(hierSplitsRails(t, size_t(1) << 30, f));
  }
  EXPECT_FALSE(hierSplitsRails(CollType::kAllReduce, size_t(1) << 30, f));
}

// The all-to-all split by host (LOOM_ALGO=hier): the host's blocks over the mesh, then the
// other hosts' over the NICs, one after the other. On 2 x 8 H100 with 8 NICs the NICs'
// share (8 of every 15 blocks) dominates and the flat form overlaps the two, so the model
// prices the split above it; the tuner never picks it (it runs only where named).
TEST(CostModel, GpuAllToAllSplitByHostAddsItsPasses) {
  const Fabric f = dgx(2);
  const Fabric host = dgx(1);
  const size_t b = size_t(128) << 20;
  const double block = double(b) / 16;
  Estimate h, none;
  ASSERT_TRUE(estimate(CollType::kAllToAll, Algo::kHierarchical, b, f, &h));
  EXPECT_TRUE(h.built);
  const double mesh = us(CollType::kAllToAll, Algo::kMeshOneShot, size_t(8 * block), host);
  const double remote = f.inter.latencyUs + 7 * f.messageUs + 8 * 8 * block / f.inter.bytesPerUs();
  EXPECT_NEAR(h.us, mesh + remote, 1e-6 * h.us);
  Estimate flat;
  ASSERT_TRUE(tunerEstimate(CollType::kAllToAll, b, f, &flat));
  EXPECT_EQ(flat.algo, Algo::kDirect);
  EXPECT_GT(h.us, flat.us);
  EXPECT_FALSE(estimate(CollType::kAllToAll, Algo::kHierarchical, b, dgx(1), &none));
  EXPECT_FALSE(
      estimate(CollType::kAllToAll, Algo::kHierarchical, b, hostMemoryFabric(2, 2, 1), &none));
}

// Host buffers: the hierarchical all-reduce is built (hierAllReduce), and across hosts of
// several ranks behind one slow NIC it wins for large messages, where each host sends
// 2 (H-1)/H of the buffer through its NIC instead of the ring's 2 (n-1)/n.
TEST(CostModel, HierarchicalHostAllReduceWinsLargeAcrossSlowNics) {
  const Fabric f = hostMemoryFabric(2, 4, 0.125);  // 2 hosts x 4 ranks, 1 Gb/s each
  Estimate h, r;
  ASSERT_TRUE(estimate(CollType::kAllReduce, Algo::kHierarchical, 16 << 20, f, &h));
  ASSERT_TRUE(estimate(CollType::kAllReduce, Algo::kRing, 16 << 20, f, &r));
  EXPECT_TRUE(h.built);
  EXPECT_LT(h.us, r.us);
  // On 2 hosts the host tree sends S through each NIC too, in as many steps across: the
  // two tie there (measured so at 2 x 2 over 1 Gb/s, docs/perf/cost_model.md).
  const Algo best = fastest(estimates(CollType::kAllReduce, 16 << 20, f)).algo;
  EXPECT_TRUE(best == Algo::kHierarchical || best == Algo::kTree) << algoName(best);
  EXPECT_EQ(fastest(estimates(CollType::kAllReduce, 16 << 20, hostMemoryFabric(4, 4, 0.125))).algo,
            Algo::kHierarchical);
  EXPECT_NE(fastest(estimates(CollType::kAllReduce, 8, f)).algo, Algo::kHierarchical);
  // All-gather and reduce-scatter (mirrors, the same terms): each host sends (H-1)/H of
  // the whole through its NIC instead of the ring's (n-1)/n.
  for (CollType t : {CollType::kAllGather, CollType::kReduceScatter}) {
    Estimate g;
    ASSERT_TRUE(estimate(t, Algo::kHierarchical, 16 << 20, f, &g));
    ASSERT_TRUE(estimate(t, Algo::kRing, 16 << 20, f, &r));
    EXPECT_TRUE(g.built);
    EXPECT_LT(g.us, r.us);
  }
}

// The fabric of a recorded DGX H100 topology: 8 GPUs on NVSwitch, 8 NICs of 400 Gb/s.
// The GPU network executor's fabric: its in-host pairs cross the network backend too, and
// a rail has one rank a host on its share of the host's NICs. On it the tuner takes the
// tree where the model prices it under the ring: at 16 hosts of 8 and 1 GiB the flat
// fabric's ratios kept the ring (2026-12-05, docs/perf/cost_model.md).
TEST(CostModel, NetworkExecutorFabric) {
  const Fabric comm = dgx(16);
  const Fabric flat = netExecutorFabric(comm, false);
  EXPECT_FALSE(flat.gpu);
  EXPECT_EQ(flat.nranks(), comm.nranks());
  EXPECT_DOUBLE_EQ(flat.intra.gbps, 50);  // 400 GB/s of NICs over 8 GPUs
  EXPECT_DOUBLE_EQ(flat.intra.latencyUs, comm.inter.latencyUs);
  EXPECT_DOUBLE_EQ(flat.inter.gbps, 400);
  const Fabric rail = netExecutorFabric(comm, true);
  auto ringOrTree = AlgoRequest::parse("ring,tree");
  ASSERT_TRUE(ringOrTree.isOk());
  EXPECT_EQ(rail.hosts, 16);
  EXPECT_EQ(rail.ranksPerHost, 1);
  EXPECT_DOUBLE_EQ(rail.inter.gbps, 50);
  for (const Fabric* f : {&flat, &rail}) {
    for (size_t b = 8; b <= (size_t(1) << 30); b *= 8) {
      CollRequest req;
      req.type = CollType::kAllReduce;
      req.count = b / 4;
      req.nranks = f->nranks();
      req.fabric = f;
      auto c = chooseNetAlgorithm(req, *ringOrTree);
      ASSERT_TRUE(c.isOk());
      const bool treeCheaper = us(CollType::kAllReduce, Algo::kTree, b, *f) <
                               us(CollType::kAllReduce, Algo::kRing, b, *f);
      EXPECT_EQ(c->algo, treeCheaper ? Algorithm::kTree : Algorithm::kRing)
          << (f == &rail ? "rail " : "flat ") << b << " B: " << c->text();
    }
  }
}

// GPU buffers over sockets are staged through host memory (Fabric::stage): the rate of
// 1, 2, 4 and 8 blocks, linear between them; the lanes a call takes (netLanes, the
// executor's rule); and the bandwidth term as the slower of the wire and the copies plus
// each step's first piece. RDMA and host buffers are not staged.
TEST(CostModel, StagingRateAndLanes) {
  Staging s;
  EXPECT_FALSE(s.on());
  s.gbps[0] = 4;
  s.gbps[1] = 8;
  s.gbps[2] = 12;
  s.gbps[3] = 20;
  EXPECT_DOUBLE_EQ(s.rate(1), 4);
  EXPECT_DOUBLE_EQ(s.rate(3), 10);
  EXPECT_DOUBLE_EQ(s.rate(6), 16);
  EXPECT_DOUBLE_EQ(s.rate(8), 20);
  EXPECT_DOUBLE_EQ(s.rate(64), 20);
  EXPECT_DOUBLE_EQ(s.rate(0), 4);
  EXPECT_EQ(netLanes(CollType::kAllReduce, 8, 2, 4), 1);
  EXPECT_EQ(netLanes(CollType::kAllReduce, 1 << 20, 2, 4), 2);  // 512 KiB a step
  EXPECT_EQ(netLanes(CollType::kAllReduce, 16 << 20, 2, 4), 4);
  EXPECT_EQ(netLanes(CollType::kAllReduce, 16 << 20, 2, 8), 8);
  EXPECT_EQ(netLanes(CollType::kAllGather, 3 << 20, 3, 8), 4);  // 1 MiB blocks
  EXPECT_EQ(netLanes(CollType::kAllToAll, 1 << 30, 4, 8), 1);
}

TEST(CostModel, StagingPricesTheCopiesThroughHostMemory) {
  Fabric sockets = gpuFabric(2, 1, 0, 10, NetPath::kSockets);
  ASSERT_TRUE(sockets.stage.on());
  const Fabric rdma = gpuFabric(2, 1, 0, 10, NetPath::kRdma);
  EXPECT_FALSE(rdma.stage.on());
  EXPECT_FALSE(hostMemoryFabric(2, 1, 1).stage.on());
  Fabric bare = sockets;
  bare.stage = Staging{};
  // 2 hosts, ring all-reduce of 16 MiB: 2 steps, each rank sends 16 MiB, 4 lanes, pieces
  // of 1 MiB (each lane's 2 MiB of a step in two).
  sockets.stage.gbps[0] = 2;
  sockets.stage.gbps[1] = 3;
  sockets.stage.gbps[2] = 5;  // slower than the 10 GB/s wire
  sockets.stage.gbps[3] = 6;
  const size_t S = 16 << 20;
  Estimate staged, unstaged;
  ASSERT_TRUE(estimate(CollType::kAllReduce, Algo::kRing, S, sockets, &staged));
  ASSERT_TRUE(estimate(CollType::kAllReduce, Algo::kRing, S, bare, &unstaged));
  EXPECT_DOUBLE_EQ(staged.netBytes, double(S));
  EXPECT_DOUBLE_EQ(unstaged.stageUs, 0);
  const double piece = 1 << 20;
  const double copy = piece / (5e3 / 4), wire = piece / (10e3 / 4);
  EXPECT_NEAR(staged.bandwidthUs, S / 5e3 + 2 * std::min(copy, wire), 1e-6);
  EXPECT_NEAR(staged.stageUs, staged.bandwidthUs - unstaged.bandwidthUs, 1e-6);
  EXPECT_DOUBLE_EQ(staged.latencyUs, unstaged.latencyUs);
  // Faster copies than the wire: the wire's time and the first pieces.
  for (double& g : sockets.stage.gbps) g *= 10;
  ASSERT_TRUE(estimate(CollType::kAllReduce, Algo::kRing, S, sockets, &staged));
  EXPECT_NEAR(staged.bandwidthUs, unstaged.bandwidthUs + 2 * std::min(piece / (50e3 / 4), wire),
              1e-6);
  // Never faster than unstaged, and slower as the copies slow, for every collective and size.
  for (CollType t : kTypes) {
    for (size_t b = 8; b <= (size_t(1) << 28); b *= 16) {
      Fabric slow = sockets;
      for (double& g : slow.stage.gbps) g /= 20;
      for (const Estimate& e : estimates(t, b, bare)) {
        Estimate fast, slowE;
        ASSERT_TRUE(estimate(t, e.algo, b, sockets, &fast));
        ASSERT_TRUE(estimate(t, e.algo, b, slow, &slowE));
        EXPECT_GE(fast.us, e.us - 1e-9) << algoName(e.algo) << " " << b;
        EXPECT_GE(slowE.us, fast.us - 1e-9) << algoName(e.algo) << " " << b;
      }
    }
  }
  // The in-host mesh forms cross no network: not staged.
  const Fabric host = gpuFabric(1, 8, 450, 10, NetPath::kSockets);
  Estimate mesh;
  ASSERT_TRUE(estimate(CollType::kAllReduce, Algo::kMeshTwoShot, S, host, &mesh));
  EXPECT_DOUBLE_EQ(mesh.stageUs, 0);
}

TEST(CostModel, FabricOfADgxTopology) {
  auto r = topology::readXmlFile(std::string(LOOM_FIXTURES) + "/dgx_h100.xml");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  auto g = topology::Graph::build(r->system);
  ASSERT_TRUE(g.isOk());
  FabricOptions o;
  o.hosts = 4;
  std::string why;
  const Fabric f = fabricOf(*g, o, &why);
  EXPECT_EQ(f.ranksPerHost, 8);
  EXPECT_EQ(f.hosts, 4);
  EXPECT_TRUE(f.gpu);
  EXPECT_NEAR(f.inter.gbps, 400, 1e-9);
  EXPECT_GT(f.intra.gbps, 100);
  EXPECT_NE(why.find("8 NIC"), std::string::npos) << why;
  o.hostMemory = true;
  o.netGbps = 0.125;
  const Fabric h = fabricOf(*g, o);
  EXPECT_FALSE(h.gpu);
  EXPECT_EQ(h.ranksPerHost, 1);
  EXPECT_NEAR(h.inter.gbps, 0.125, 1e-12);
}

}  // namespace
}  // namespace loom::collectives::model
