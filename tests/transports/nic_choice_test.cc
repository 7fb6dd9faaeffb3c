// Which NIC a GPU uses (transports/net/nic_choice.h): the nearest on the PCI tree, rails
// among equals, anything when nothing is on PCI.
#include "transports/net/nic_choice.h"

#include <gtest/gtest.h>

namespace loom::transport::net {
namespace {

const std::string kRoot0 = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0";
const std::string kRoot1 = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0";

TEST(ChooseNic, NearestOnThePciTree) {
  // GPU behind the same switch as mlx5_1, another root than mlx5_0.
  const std::string gpu = kRoot1 + "/0000:82:00.0/0000:83:00.0";
  NicChoice c =
      chooseNic(gpu, {kRoot0 + "/0000:02:00.0/0000:03:00.0", kRoot1 + "/0000:82:01.0/0000:84:00.0"},
                {"mlx5_0", "mlx5_1"}, 0);
  EXPECT_EQ(c.dev, 1);
  EXPECT_NE(c.why.find("nearest"), std::string::npos) << c.why;
}

TEST(ChooseNic, RailsAmongEquallyNear) {
  const std::vector<std::string> nics = {kRoot0 + "/0000:05:00.0", kRoot0 + "/0000:06:00.0"};
  const std::string gpu = kRoot0 + "/0000:07:00.0";
  EXPECT_EQ(chooseNic(gpu, nics, {"a", "b"}, 0).dev, 0);
  EXPECT_EQ(chooseNic(gpu, nics, {"a", "b"}, 1).dev, 1);
  EXPECT_EQ(chooseNic(gpu, nics, {"a", "b"}, 2).dev, 0);
}

TEST(ChooseNic, NothingOnPciStillGivesOne) {
  NicChoice c = chooseNic("", {"", ""}, {"lo", "veth0"}, 3);
  EXPECT_EQ(c.dev, 1);
  EXPECT_NE(c.why.find("unknown"), std::string::npos) << c.why;
  EXPECT_EQ(chooseNic("", {}, {}, 0).dev, 0);
}

}  // namespace
}  // namespace loom::transport::net
