#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <set>

#include "tests/topology/fixtures.h"

namespace loom::topology {
namespace {

using testing::buildGraph;
using testing::loadXml;

bool isPermutation(std::vector<int> v, int n) {
  std::sort(v.begin(), v.end());
  std::vector<int> want(n);
  std::iota(want.begin(), want.end(), 0);
  return v == want;
}

// Every rank reaches the root without cycles.
void expectValidTree(const TreeChannel& t, int n) {
  ASSERT_EQ(static_cast<int>(t.parent.size()), n);
  ASSERT_GE(t.root, 0);
  EXPECT_EQ(t.parent[t.root], -1);
  for (int r = 0; r < n; ++r) {
    int steps = 0, x = r;
    while (x != t.root && steps <= n) {
      x = t.parent[x];
      ASSERT_GE(x, 0) << "rank " << r << " does not reach the root";
      ++steps;
    }
    EXPECT_EQ(x, t.root);
  }
}

// The rings never ask more of a link than it carries.
void expectWithinCapacity(const Graph& g, const HostPlan& plan) {
  std::map<std::pair<int, int>, double> used;
  for (const auto& ring : plan.rings) {
    for (size_t i = 0; i < ring.size() && ring.size() > 1; ++i) {
      const Path& p = g.gpuToGpu(ring[i], ring[(i + 1) % ring.size()]);
      for (size_t k = 0; k + 1 < p.nodes.size(); ++k)
        used[{p.nodes[k], p.nodes[k + 1]}] += plan.channelBw;
    }
  }
  for (auto [edge, amount] : used) {
    double cap = 0;
    for (const Link& l : g.nodes()[edge.first].links)
      if (l.to == edge.second) cap = l.bw;
    EXPECT_LE(amount, cap + 1e-6) << g.nodeName(edge.first) << "->" << g.nodeName(edge.second);
  }
}

TEST(Search, DgxH100SingleHostRings) {
  System s = loadXml("dgx_h100.xml");
  Graph g = buildGraph(s);
  HostPlan plan = planHost(g, {}, {});
  EXPECT_GE(plan.rings.size(), 8u);
  EXPECT_DOUBLE_EQ(plan.channelBw, 30.0);
  EXPECT_EQ(plan.worstType, PathType::kNvl);
  EXPECT_NEAR(plan.channelBw * plan.rings.size(), 450.0, 1e-9);  // all of NVLink
  for (const auto& ring : plan.rings) EXPECT_TRUE(isPermutation(ring, 8));
  expectWithinCapacity(g, plan);

  ClusterView one{{s}};
  auto rings = searchRings(one);
  ASSERT_TRUE(rings.isOk()) << rings.status().message();
  EXPECT_EQ(rings->channels.size(), plan.rings.size());
  for (const auto& ch : rings->channels) {
    EXPECT_TRUE(isPermutation(ch.ranks, 8));
    EXPECT_TRUE(ch.netIn.empty());
  }
  auto trees = searchTrees(one);
  ASSERT_TRUE(trees.isOk());
  ASSERT_EQ(trees->channels.size(), rings->channels.size());
  for (const auto& t : trees->channels) {
    expectValidTree(t, 8);
    // A chain: every rank has at most one child.
    for (int r = 0; r < 8; ++r) EXPECT_LE(treeChildren(t, r).size(), 1u);
  }
}

TEST(Search, PcieServerCrossesSocketsTwicePerRing) {
  System s = loadXml("pcie_8gpu.xml");
  Graph g = buildGraph(s);
  HostPlan plan = planHost(g, {}, {});
  ASSERT_FALSE(plan.rings.empty());
  EXPECT_EQ(plan.worstType, PathType::kSys);
  EXPECT_DOUBLE_EQ(plan.channelBw * plan.rings.size(), 10.0);  // the UPI link is the limit
  for (const auto& ring : plan.rings) {
    ASSERT_TRUE(isPermutation(ring, 8));
    int crossings = 0;
    for (size_t i = 0; i < ring.size(); ++i)
      crossings += g.gpuToGpu(ring[i], ring[(i + 1) % 8]).type == PathType::kSys;
    EXPECT_EQ(crossings, 2);
  }
  expectWithinCapacity(g, plan);
}

TEST(Search, MeshUsesEveryDirection) {
  System s = loadXml("mesh_4gpu.xml");
  Graph g = buildGraph(s);
  HostPlan plan = planHost(g, {}, {});
  EXPECT_EQ(plan.worstType, PathType::kNvl);
  // Each GPU sends on 3 x 100 GB/s of NVLink; the rings use all of it.
  EXPECT_NEAR(plan.channelBw * plan.rings.size(), 300.0, 1e-9);
  expectWithinCapacity(g, plan);
}

TEST(Search, FlatVmRings) {
  System s = loadXml("flat_h200_vm.xml");
  Graph g = buildGraph(s);
  HostPlan plan = planHost(g, {}, {});
  EXPECT_NEAR(plan.channelBw * plan.rings.size(), 450.0, 1e-9);
  for (const auto& ring : plan.rings) EXPECT_TRUE(isPermutation(ring, 2));
}

TEST(Search, CpuOnlyHostHasNoRings) {
  ClusterView view{{loadXml("cpu_only_2nic.xml")}};
  auto rings = searchRings(view);
  ASSERT_TRUE(rings.isOk());
  EXPECT_TRUE(rings->channels.empty());
  auto trees = searchTrees(view);
  ASSERT_TRUE(trees.isOk());
  EXPECT_TRUE(trees->channels.empty());
}

TEST(Search, DgxClusterRingsUseTheClosestNics) {
  System s = loadXml("dgx_h100.xml");
  Graph g = buildGraph(s);
  const int hosts = 4;
  ClusterView view = replicateHost(s, hosts);
  auto rings = searchRings(view);
  ASSERT_TRUE(rings.isOk()) << rings.status().message();
  ASSERT_GE(rings->channels.size(), 8u);
  std::set<int> inNics, outNics;
  for (const auto& ch : rings->channels) {
    ASSERT_TRUE(isPermutation(ch.ranks, 8 * hosts));
    ASSERT_EQ(ch.netIn.size(), static_cast<size_t>(hosts));
    for (int h = 0; h < hosts; ++h) {
      // Host h's GPUs are contiguous in the ring, entering and leaving by their own NICs.
      std::vector<int> chain(ch.ranks.begin() + 8 * h, ch.ranks.begin() + 8 * (h + 1));
      for (int r : chain) EXPECT_EQ(r / 8, h);
      EXPECT_EQ(ch.netIn[h], g.closestNet(chain.front() % 8));
      EXPECT_EQ(ch.netOut[h], g.closestNet(chain.back() % 8));
    }
    inNics.insert(ch.netIn[0]);
    outNics.insert(ch.netOut[0]);
  }
  EXPECT_EQ(inNics.size(), 8u);  // every NIC carries traffic
  EXPECT_EQ(outNics.size(), 8u);
  EXPECT_GT(rings->channelBw, 0);
  EXPECT_LE(rings->channelBw, 30.0);
}

TEST(Search, DgxClusterDoubleBinaryTrees) {
  const int hosts = 5;
  ClusterView view = replicateHost(loadXml("dgx_h100.xml"), hosts);
  auto trees = searchTrees(view);
  ASSERT_TRUE(trees.isOk()) << trees.status().message();
  ASSERT_GE(trees->channels.size(), 2u);
  std::set<int> innerHosts[2];
  for (const auto& t : trees->channels) {
    expectValidTree(t, 8 * hosts);
    for (int r = 0; r < 8 * hosts; ++r) {
      int crossHostChildren = 0;
      for (int c : treeChildren(t, r)) crossHostChildren += c / 8 != r / 8;
      if (crossHostChildren > 0) innerHosts[t.crossHostTree].insert(r / 8);
      // Inside a host the tree is a chain.
      int sameHostChildren = 0;
      for (int c : treeChildren(t, r)) sameHostChildren += c / 8 == r / 8;
      EXPECT_LE(sameHostChildren, 1);
    }
  }
  for (int h : innerHosts[0])
    EXPECT_EQ(innerHosts[1].count(h), 0u) << "host " << h << " inner in both trees";
}

TEST(Search, DoubleBinaryTreeProperties) {
  for (int n = 1; n <= 300; ++n) {
    std::set<int> inner[2];
    for (int which = 0; which < 2; ++which) {
      std::vector<int> parent = doubleBinaryTree(n, which);
      ASSERT_EQ(static_cast<int>(parent.size()), n);
      int roots = 0;
      std::vector<int> children(n, 0);
      for (int i = 0; i < n; ++i) {
        if (parent[i] < 0) {
          ++roots;
        } else {
          ++children[parent[i]];
        }
      }
      ASSERT_EQ(roots, 1) << n;
      for (int i = 0; i < n; ++i) {
        EXPECT_LE(children[i], 2) << "n=" << n;
        if (children[i] > 0) inner[which].insert(i);
        int x = i, steps = 0;
        while (parent[x] >= 0 && steps++ <= n) x = parent[x];
        EXPECT_LE(steps, n);
      }
    }
    for (int i : inner[0]) EXPECT_EQ(inner[1].count(i), 0u) << "n=" << n << " node " << i;
  }
}

TEST(Search, IsDeterministic) {
  ClusterView view = replicateHost(loadXml("pcie_8gpu.xml"), 3);
  auto a = searchRings(view);
  auto b = searchRings(view);
  ASSERT_TRUE(a.isOk() && b.isOk());
  ASSERT_EQ(a->channels.size(), b->channels.size());
  for (size_t c = 0; c < a->channels.size(); ++c) {
    EXPECT_EQ(a->channels[c].ranks, b->channels[c].ranks);
    EXPECT_EQ(a->channels[c].netIn, b->channels[c].netIn);
  }
}

TEST(Search, UsesExplicitRanksAndSkipsUnrankedGpus) {
  System s = loadXml("mesh_4gpu.xml");
  // Only GPUs 1 and 3 take part, as ranks 1 and 0.
  forEachPci(s, [](PciNode& p, Cpu&) {
    if (!p.gpu) return;
    p.gpu->rank = p.gpu->dev == 1 ? 1 : p.gpu->dev == 3 ? 0 : -1;
  });
  auto rings = searchRings(ClusterView{{s}});
  ASSERT_TRUE(rings.isOk()) << rings.status().message();
  ASSERT_FALSE(rings->channels.empty());
  for (const auto& ch : rings->channels) EXPECT_TRUE(isPermutation(ch.ranks, 2));
}

TEST(Search, RejectsDuplicateRanks) {
  System s = loadXml("mesh_4gpu.xml");
  forEachPci(s, [](PciNode& p, Cpu&) {
    if (p.gpu) p.gpu->rank = 0;
  });
  auto rings = searchRings(ClusterView{{s}});
  ASSERT_FALSE(rings.isOk());
  EXPECT_NE(rings.status().message().find("repeats"), std::string::npos)
      << rings.status().message();
}

TEST(Search, ClusterViewMergesRanksOfOneHost) {
  System s = loadXml("mesh_4gpu.xml");
  // Two ranks on host A each see one GPU; a rank on host B sees everything.
  System a0 = s, a1 = s, b = s;
  for (System* v : {&a0, &a1}) v->setHostId("A");
  b.setHostId("B");
  auto keepOnly = [](System& v, const std::string& bus) {
    for (Cpu& c : v.cpus) {
      for (PciNode& sw : c.pcis) {
        sw.children.erase(std::remove_if(sw.children.begin(), sw.children.end(),
                                         [&](const PciNode& p) { return p.gpu && p.busId != bus; }),
                          sw.children.end());
      }
    }
  };
  keepOnly(a0, "0000:07:00.0");
  keepOnly(a1, "0000:87:00.0");
  auto view = buildClusterView({a0, b, a1});
  ASSERT_TRUE(view.isOk()) << view.status().message();
  ASSERT_EQ(view->hosts.size(), 2u);
  EXPECT_EQ(view->hosts[0].hostId(), "A");
  EXPECT_EQ(gpuCount(view->hosts[0]), 2);
  EXPECT_EQ(gpuCount(view->hosts[1]), 4);
  System noId = s;
  EXPECT_FALSE(buildClusterView({noId}).isOk());
}

}  // namespace
}  // namespace loom::topology
