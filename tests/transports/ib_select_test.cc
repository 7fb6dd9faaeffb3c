// The ib backend's pure choices (transports/net/ib/ib_select.h): LOOM_IB_HCA's syntax,
// the GID a port uses and what the message says when there is none, port speeds, and
// the words for failed completions.
#include "transports/net/ib/ib_select.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

namespace loom::transport::net::ib {
namespace {

TEST(HcaFilter, PrefixesPortsExclusionAndExactNames) {
  EXPECT_TRUE(HcaFilter::parse("").matches("mlx5_0", 1));
  HcaFilter f = HcaFilter::parse("mlx5_0:1,mlx5_1");
  EXPECT_TRUE(f.matches("mlx5_0", 1));
  EXPECT_FALSE(f.matches("mlx5_0", 2));
  EXPECT_TRUE(f.matches("mlx5_1", 2));
  EXPECT_TRUE(f.matches("mlx5_10", 1)) << "a prefix";
  EXPECT_FALSE(f.matches("mlx4_0", 1));
  HcaFilter x = HcaFilter::parse("^mlx5_3");
  EXPECT_FALSE(x.matches("mlx5_3", 1));
  EXPECT_TRUE(x.matches("mlx5_2", 1));
  HcaFilter e = HcaFilter::parse("=mlx5_1");
  EXPECT_TRUE(e.matches("mlx5_1", 1));
  EXPECT_FALSE(e.matches("mlx5_10", 1));
  HcaFilter xe = HcaFilter::parse("^=mlx5_1:1");
  EXPECT_FALSE(xe.matches("mlx5_1", 1));
  EXPECT_TRUE(xe.matches("mlx5_1", 2));
  EXPECT_TRUE(xe.matches("mlx5_10", 1));
}

Gid gid(int index, const char* text, Gid::Type type) {
  Gid g;
  g.index = index;
  inet_pton(AF_INET6, text, g.raw);
  g.type = type;
  return g;
}

TEST(ChooseGid, RoceV2Ipv4FirstThenTheBestOther) {
  using T = Gid::Type;
  std::vector<Gid> table = {gid(0, "fe80::1", T::kRoceV1), gid(1, "fe80::1", T::kRoceV2),
                            gid(2, "::ffff:10.0.0.1", T::kRoceV1),
                            gid(3, "::ffff:10.0.0.1", T::kRoceV2)};
  EXPECT_EQ(chooseGid(table, false, -1, "d").index, 3);
  table.pop_back();
  GidChoice c = chooseGid(table, false, -1, "mlx5_0 port 1");
  EXPECT_EQ(c.index, 1) << "RoCE v2 link-local beats v1 IPv4";
  EXPECT_NE(c.why.find("no RoCE v2 GID with an IPv4 address"), std::string::npos) << c.why;
  EXPECT_NE(c.why.find("2: ::ffff:10.0.0.1 RoCE v1"), std::string::npos) << c.why;
  table.push_back(gid(5, "2001:db8::5", T::kRoceV2));
  EXPECT_EQ(chooseGid(table, false, -1, "d").index, 5) << "global before link-local";
}

TEST(ChooseGid, ForcedIndexAndInfiniband) {
  using T = Gid::Type;
  std::vector<Gid> table = {gid(0, "fe80::1", T::kRoceV1), gid(3, "::ffff:10.0.0.1", T::kRoceV2)};
  EXPECT_EQ(chooseGid(table, false, 0, "d").index, 0);
  GidChoice bad = chooseGid(table, false, 7, "mlx5_0 port 1");
  EXPECT_EQ(bad.index, -1);
  EXPECT_NE(bad.why.find("LOOM_IB_GID_INDEX=7 is not a populated GID"), std::string::npos)
      << bad.why;
  EXPECT_NE(bad.why.find("3: ::ffff:10.0.0.1 RoCE v2"), std::string::npos) << bad.why;
  EXPECT_EQ(chooseGid({}, false, -1, "d").index, -1);
  EXPECT_EQ(chooseGid({gid(0, "fe80::2", T::kIb)}, true, -1, "d").index, 0);
  EXPECT_EQ(chooseGid({}, true, -1, "d").index, -1);
}

TEST(PortSpeed, WidthTimesLaneRate) {
  EXPECT_EQ(portSpeedMbps(2, 128), 400000);  // 4x NDR
  EXPECT_EQ(portSpeedMbps(2, 64), 200000);   // 4x HDR
  EXPECT_EQ(portSpeedMbps(1, 32), 25000);    // 1x EDR
  EXPECT_EQ(portSpeedMbps(3, 32), 0);
}

TEST(ExplainCompletion, NamesPeerQueuePairAndLikelyCause) {
  std::string m = explainCompletion(IBV_WC_RETRY_EXC_ERR, "transport retry counter exceeded",
                                    "rank 3", 1234, "mlx5_0");
  EXPECT_NE(m.find("rank 3"), std::string::npos);
  EXPECT_NE(m.find("queue pair 1234"), std::string::npos);
  EXPECT_NE(m.find("LOOM_IB_TIMEOUT"), std::string::npos);
  EXPECT_NE(m.find("GID"), std::string::npos);
}

}  // namespace
}  // namespace loom::transport::net::ib
