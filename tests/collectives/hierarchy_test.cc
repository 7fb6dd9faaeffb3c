// The hierarchical GPU forms' pure part (collectives/hierarchy.h): host groups and
// rails from the ranks' hosts, which calls take the form, and how reductions split.
#include "collectives/hierarchy.h"

#include <gtest/gtest.h>

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
  EXPECT_NE(hierDecline(CollType::kAllGather, 4, h, any), nullptr);
  EXPECT_NE(hierDecline(CollType::kReduceScatter, 4, h, any), nullptr);
  EXPECT_NE(hierDecline(CollType::kAllToAll, 4, h, any), nullptr);
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
