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
