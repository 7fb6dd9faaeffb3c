// The hierarchical GPU forms' pure part (collectives/hierarchy.h): host groups and
// rails from the ranks' hosts, which calls take the form, and how reductions split.
#include "collectives/hierarchy.h"

#include <gtest/gtest.h>

#include <cstring>

namespace loom::collectives {
namespace {

// Hosts interleaved in rank order (ranks 0 and 2 on host A, 1 and 3 on B): host order is
// that of each host's first rank, local order that of the ranks within it.
TEST(Hierarchy, GroupsAndRailsFollowTheHosts) {
  const std::vector<uint64_t> hosts = {0xA, 0xB, 0xA, 0xB};
  Hierarchy h;
  std::string why;
  ASSERT_TRUE(findHierarchy(hosts, 2, &h, &why)) << why;
  EXPECT_EQ(h.hosts, 2);
  EXPECT_EQ(h.local, 2);
  EXPECT_EQ(h.hostIndex, 0);
  EXPECT_EQ(h.localIndex, 1);
  EXPECT_EQ(h.localRanks, (std::vector<int>{0, 2}));
  EXPECT_EQ(h.railRanks, (std::vector<int>{2, 3}));
  EXPECT_EQ(h.hostOf, (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(h.localOf, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(h.hostRanks, (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  ASSERT_TRUE(findHierarchy(hosts, 1, &h, &why)) << why;
  EXPECT_EQ(h.localRanks, (std::vector<int>{1, 3}));
  EXPECT_EQ(h.railRanks, (std::vector<int>{0, 1}));
}

// Every rank of 4 hosts x 8 ranks sees the same groups: each rank is in exactly one host
// group and one rail, and the two meet only in itself.
TEST(Hierarchy, EveryRankAgrees) {
  std::vector<uint64_t> hosts;
  for (int r = 0; r < 32; ++r) hosts.push_back(100 + r / 8);
  for (int r = 0; r < 32; ++r) {
    Hierarchy h;
    std::string why;
    ASSERT_TRUE(findHierarchy(hosts, r, &h, &why)) << why;
    EXPECT_EQ(h.hosts, 4);
    EXPECT_EQ(h.local, 8);
    EXPECT_EQ(h.localRanks[h.localIndex], r);
    EXPECT_EQ(h.railRanks[h.hostIndex], r);
    for (int k = 0; k < 4; ++k) EXPECT_EQ(h.railRanks[k], 8 * k + r % 8);
  }
}

TEST(Hierarchy, NoneWhereTheHostsDoNotAllowIt) {
  Hierarchy h;
  std::string why;
  EXPECT_FALSE(findHierarchy({1, 1, 1, 1}, 0, &h, &why));
  EXPECT_NE(why.find("one host"), std::string::npos) << why;
  EXPECT_FALSE(findHierarchy({1, 2, 3}, 0, &h, &why));
  EXPECT_NE(why.find("one rank per host"), std::string::npos) << why;
  EXPECT_FALSE(findHierarchy({1, 1, 2, 2, 2}, 4, &h, &why));
  EXPECT_NE(why.find("different numbers"), std::string::npos) << why;
  EXPECT_FALSE(findHierarchy({1, 2}, 5, &h, &why));
}

TEST(Hierarchy, WhichCallsTakeIt) {
  Hierarchy h;
  std::string why;
  ASSERT_TRUE(findHierarchy({1, 1, 2, 2}, 0, &h, &why));
  const AlgoRequest any;
  EXPECT_EQ(hierDecline(CollType::kAllReduce, 4, h, any), nullptr);
  EXPECT_NE(hierDecline(CollType::kAllReduce, 5, h, any), nullptr);  // parts must be equal
  EXPECT_EQ(hierDecline(CollType::kBroadcast, 5, h, any), nullptr);
  EXPECT_EQ(hierDecline(CollType::kReduce, 5, h, any), nullptr);
  EXPECT_EQ(hierDecline(CollType::kAllGather, 5, h, any), nullptr);
  EXPECT_EQ(hierDecline(CollType::kReduceScatter, 5, h, any), nullptr);
  EXPECT_NE(hierDecline(CollType::kAllToAll, 4, h, any), nullptr);
  // Hosts interleaved in rank order: all-gather and reduce-scatter keep the flat form.
  Hierarchy mixed;
  ASSERT_TRUE(findHierarchy({1, 2, 1, 2}, 0, &mixed, &why));
  EXPECT_EQ(hierDecline(CollType::kAllReduce, 4, mixed, any), nullptr);
  EXPECT_NE(hierDecline(CollType::kAllGather, 4, mixed, any), nullptr);
  EXPECT_NE(hierDecline(CollType::kReduceScatter, 4, mixed, any), nullptr);
  // LOOM_ALGO: "ring" alone (the flat ring) and "^hier" leave it out; "hier" and lists
  // naming it keep it.
  for (const char* text : {"ring", "^hier", "tree", "Ring,Tree"}) {
    auto a = AlgoRequest::parse(text);
    ASSERT_TRUE(a.isOk());
    EXPECT_NE(hierDecline(CollType::kAllReduce, 4, h, a.value()), nullptr) << text;
  }
  for (const char* text : {"hier", "HIER,ring", "^nvls", "^tree"}) {
    auto a = AlgoRequest::parse(text);
    ASSERT_TRUE(a.isOk());
    EXPECT_EQ(hierDecline(CollType::kAllReduce, 4, h, a.value()), nullptr) << text;
  }
}

// Point-to-point exchanges split by where the peer is from 512 KiB a message (an
// all-to-all's block), at every size where LOOM_ALGO names hier, never where it leaves hier
// out; the all-to-all only where the ranks go host by host.
TEST(Hierarchy, PointToPointSplitsByMessageSize) {
  Hierarchy h, mixed;
  std::string why;
  ASSERT_TRUE(findHierarchy({1, 1, 2, 2}, 0, &h, &why));
  ASSERT_TRUE(findHierarchy({1, 2, 1, 2}, 0, &mixed, &why));
  EXPECT_TRUE(ranksHostByHost(h));
  EXPECT_FALSE(ranksHostByHost(mixed));
  const size_t big = kHierP2pMeshBytes, small = kHierP2pMeshBytes - 1;
  for (const char* text : {"", "^tree"}) {
    auto a = AlgoRequest::parse(text);
    ASSERT_TRUE(a.isOk());
    EXPECT_EQ(hierP2pDecline(CollType::kSendRecv, h, a.value(), 0), nullptr) << text;
    EXPECT_EQ(hierP2pDecline(CollType::kAllToAll, h, a.value(), big), nullptr) << text;
    EXPECT_NE(hierP2pDecline(CollType::kAllToAll, h, a.value(), small), nullptr) << text;
    EXPECT_NE(hierP2pDecline(CollType::kAllToAll, mixed, a.value(), big), nullptr) << text;
    EXPECT_TRUE(hierP2pOverMesh(big, a.value())) << text;
    EXPECT_FALSE(hierP2pOverMesh(small, a.value())) << text;
    EXPECT_FALSE(hierP2pOverMesh(0, a.value())) << text;
  }
  for (const char* text : {"hier", "ring,hier"}) {
    auto a = AlgoRequest::parse(text);
    ASSERT_TRUE(a.isOk());
    EXPECT_EQ(hierP2pDecline(CollType::kSendRecv, h, a.value(), 0), nullptr) << text;
    EXPECT_EQ(hierP2pDecline(CollType::kAllToAll, h, a.value(), 4), nullptr) << text;
    EXPECT_EQ(hierP2pDecline(CollType::kSendRecv, mixed, a.value(), 0), nullptr) << text;
    EXPECT_NE(hierP2pDecline(CollType::kAllToAll, mixed, a.value(), big), nullptr) << text;
    EXPECT_NE(hierP2pDecline(CollType::kAllReduce, h, a.value(), big), nullptr) << text;
    EXPECT_TRUE(hierP2pOverMesh(1, a.value())) << text;
  }
  for (const char* text : {"^hier", "ring"}) {
    auto a = AlgoRequest::parse(text);
    ASSERT_TRUE(a.isOk());
    EXPECT_NE(hierP2pDecline(CollType::kSendRecv, h, a.value(), 0), nullptr) << text;
    EXPECT_NE(hierP2pDecline(CollType::kAllToAll, h, a.value(), big), nullptr) << text;
  }
}

// The gate's question: does a group hold a message for the mesh? Both ranks of a host of
// two ranks answer alike for the same exchange (a message and its receive have one size).
TEST(Hierarchy, MeshWorkOfAGroupIsTheSameOnBothRanksOfAHost) {
  std::vector<Hierarchy> h(4);
  std::string why;
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(findHierarchy({1, 1, 2, 2}, r, &h[r], &why));
  auto msg = [](bool send, int peer, size_t count) {
    Operation o;
    o.type = CollType::kSendRecv;
    o.isSend = send;
    o.root = peer;
    o.count = count;
    o.dtype = DataType::kUint8;
    return o;
  };
  const AlgoRequest any;
  const size_t big = kHierP2pMeshBytes, small = 4096;
  // Rank 0 and rank 1 (one host) swap one message of each size; rank 2 is another host's.
  for (size_t size : {small, big}) {
    const std::vector<Operation> g0 = {msg(true, 1, size), msg(false, 1, size), msg(true, 2, big),
                                       msg(false, 2, big)};
    const std::vector<Operation> g1 = {msg(true, 0, size), msg(false, 0, size)};
    const bool w0 = hierP2pMeshWork(g0, 0, g0.size(), 0, h[0], any);
    const bool w1 = hierP2pMeshWork(g1, 0, g1.size(), 1, h[1], any);
    EXPECT_EQ(w0, size == big) << size;
    EXPECT_EQ(w0, w1) << size;
  }
  // Messages to itself and to other hosts never go over the mesh; empty ones neither.
  const std::vector<Operation> g = {msg(true, 0, big), msg(false, 0, big), msg(true, 3, big),
                                    msg(true, 1, 0)};
  EXPECT_FALSE(hierP2pMeshWork(g, 0, g.size(), 0, h[0], any));
  // LOOM_ALGO=hier: any size.
  auto hier = AlgoRequest::parse("hier");
  ASSERT_TRUE(hier.isOk());
  const std::vector<Operation> tiny = {msg(true, 1, 8)};
  EXPECT_TRUE(hierP2pMeshWork(tiny, 0, 1, 0, h[0], hier.value()));
  EXPECT_FALSE(hierP2pMeshWork(tiny, 0, 1, 0, h[0], any));
}

TEST(Hierarchy, ReductionsSplitBetweenTheLevels) {
  EXPECT_EQ(splitReduction(RedKind::kSum).first, RedKind::kSum);
  EXPECT_EQ(splitReduction(RedKind::kMax).second, RedKind::kMax);
  EXPECT_EQ(splitReduction(RedKind::kProd).first, RedKind::kProd);
  // The scale applies to each input once: in the host; the division to the final sum once:
  // across the hosts.
  EXPECT_EQ(splitReduction(RedKind::kPreMulSum).first, RedKind::kPreMulSum);
  EXPECT_EQ(splitReduction(RedKind::kPreMulSum).second, RedKind::kSum);
  EXPECT_EQ(splitReduction(RedKind::kSumPostDiv).first, RedKind::kSum);
  EXPECT_EQ(splitReduction(RedKind::kSumPostDiv).second, RedKind::kSumPostDiv);
}

// Applies 2D copies as cudaMemcpy2DAsync would, on host memory.
void applyCopies(const std::vector<BlockCopy2D>& copies, const std::vector<int>& src,
                 std::vector<int>* dst) {
  const auto* s = reinterpret_cast<const char*>(src.data());
  auto* d = reinterpret_cast<char*>(dst->data());
  for (const BlockCopy2D& c : copies) {
    ASSERT_LE(c.width, c.srcPitch);
    ASSERT_LE(c.width, c.dstPitch);
    for (size_t row = 0; row < c.height; ++row) {
      const size_t from = c.srcOffset + row * c.srcPitch, to = c.dstOffset + row * c.dstPitch;
      ASSERT_LE(from + c.width, src.size() * sizeof(int));
      ASSERT_LE(to + c.width, dst->size() * sizeof(int));
      std::memcpy(d + to, s + from, c.width);
    }
  }
}

// The GPU all-gather and reduce-scatter (collectives/device/cuda_executor_hier.cc), step by
// step on host memory: the rail's step, the host's step, and the copies between rank and
// local order; every rank ends with the flat collective's result. Host counts and ranks
// per host of 1 to 4, blocks of 1 and 3 elements.
TEST(Hierarchy, GpuAllGatherAndReduceScatterReorderBlocks) {
  for (int H = 1; H <= 4; ++H) {
    for (int G = 1; G <= 4; ++G) {
      for (size_t count : {size_t{1}, size_t{3}}) {
        const int n = H * G;
        const size_t block = count * sizeof(int);
        auto value = [&](int rank, size_t i) { return rank * 1000 + int(i) + 1; };
        // All-gather. Rail step: rank (h, l) gets (h', l) for every h', by host.
        std::vector<std::vector<int>> rail(n), host(n);
        for (int h = 0; h < H; ++h) {
          for (int l = 0; l < G; ++l) {
            for (int h2 = 0; h2 < H; ++h2) {
              for (size_t i = 0; i < count; ++i) rail[h * G + l].push_back(value(h2 * G + l, i));
            }
          }
        }
        // Host step: every local rank's rail buffer, by local index.
        for (int h = 0; h < H; ++h) {
          for (int l = 0; l < G; ++l) {
            for (int l2 = 0; l2 < G; ++l2) {
              const auto& r = rail[h * G + l2];
              host[h * G + l].insert(host[h * G + l].end(), r.begin(), r.end());
            }
          }
        }
        for (int r = 0; r < n; ++r) {
          std::vector<int> out(size_t(n) * count, -1);
          applyCopies(hierBlockOrderCopies(H, G, block, /*toRankOrder=*/true), host[r], &out);
          for (int k = 0; k < n; ++k) {
            for (size_t i = 0; i < count; ++i)
              ASSERT_EQ(out[k * count + i], value(k, i)) << H << "x" << G << " rank " << r;
          }
        }
        // Reduce-scatter: rank k's input block j (for rank j) is input(k, j, i).
        auto input = [&](int k, int j, size_t i) { return k * 100 + j * 10 + int(i); };
        std::vector<std::vector<int>> local(n);  // each rank's input in local order
        for (int k = 0; k < n; ++k) {
          std::vector<int> in(size_t(n) * count);
          for (int j = 0; j < n; ++j) {
            for (size_t i = 0; i < count; ++i) in[j * count + i] = input(k, j, i);
          }
          local[k].assign(in.size(), -1);
          applyCopies(hierBlockOrderCopies(H, G, block, /*toRankOrder=*/false), in, &local[k]);
        }
        // Host step (the mesh's reduce-scatter of H x count a rank): rank (h, l) gets the
        // sum over its host's ranks of their block l.
        std::vector<std::vector<int>> railIn(n, std::vector<int>(size_t(H) * count, 0));
        for (int h = 0; h < H; ++h) {
          for (int l = 0; l < G; ++l) {
            for (int l2 = 0; l2 < G; ++l2) {
              for (size_t j = 0; j < size_t(H) * count; ++j)
                railIn[h * G + l][j] += local[h * G + l2][l * H * count + j];
            }
          }
        }
        // Rail step (reduce-scatter of count a rank over the rail): rank (h, l) gets the
        // sum over the hosts of their block h.
        for (int h = 0; h < H; ++h) {
          for (int l = 0; l < G; ++l) {
            for (size_t i = 0; i < count; ++i) {
              int got = 0;
              for (int h2 = 0; h2 < H; ++h2) got += railIn[h2 * G + l][h * count + i];
              int want = 0;
              for (int k = 0; k < n; ++k) want += input(k, h * G + l, i);
              ASSERT_EQ(got, want) << H << "x" << G << " rank " << h * G + l << " element " << i;
            }
          }
        }
      }
    }
  }
}

TEST(Hierarchy, MessagesNameTheCommunicatorsRanks) {
  EXPECT_EQ(hierRanksText({4, 5, 6}), "communicator rank 4, 5, 6 for i = 0, 1, 2");
}

// LOOM_ALGO=hier asks nothing of the flat forms (the host tuner, the flat network form);
// lists that name others keep them.
TEST(Hierarchy, HierAloneAsksNothingOfTheFlatForms) {
  auto req = [](const char* t) { return AlgoRequest::parse(t).value(); };
  EXPECT_FALSE(req("hier").withoutHier().set());
  EXPECT_TRUE(req("hier").allows(AlgoName::kHier));
  EXPECT_TRUE(req("hier,ring").withoutHier().set());
  EXPECT_FALSE(req("hier,ring").withoutHier().allows(AlgoName::kTree));
  EXPECT_TRUE(req("^hier").withoutHier().set());
  EXPECT_TRUE(req("ring").withoutHier().set());
  EXPECT_FALSE(req("").withoutHier().set());
}

TEST(Hierarchy, TheRailGetsOnlyARingOrTreeChoice) {
  auto req = [](const char* t) { return AlgoRequest::parse(t).value(); };
  EXPECT_FALSE(railRequest(req("hier")).set());
  EXPECT_FALSE(railRequest(req("")).set());
  EXPECT_FALSE(railRequest(req("hier,ring,tree")).set());
  EXPECT_TRUE(railRequest(req("hier,ring")).set());
  EXPECT_FALSE(railRequest(req("hier,ring")).allows(AlgoName::kTree));
  EXPECT_TRUE(railRequest(req("^tree")).set());
  EXPECT_TRUE(railRequest(req("^tree")).allows(AlgoName::kRing));
}

}  // namespace
}  // namespace loom::collectives
