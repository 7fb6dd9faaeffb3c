// Ranks sharing a GPU (LOOM_P2P_SHARE_GPU, transports/p2p/p2p_window.h): when the mesh
// allows it, how many ranks share one, and the block cap every rank computes alike.
// Host code only: a peer on the same GPU needs no CUDA call to be judged.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "transports/p2p/p2p_window.h"

namespace loom::transport::p2p {
namespace {

GpuIdentity gpu(int rank, const char* bus, int pid, int sms = 132, uint64_t host = 7) {
  GpuIdentity g;
  g.rank = rank;
  g.device = 0;
  g.process = uint64_t(pid);
  g.reachable = 1;
  g.sms = sms;
  g.hostHash = host;
  std::snprintf(g.busId, sizeof(g.busId), "%s", bus);
  return g;
}

TEST(SharedGpu, SameProcessMaySharePeersInOtherProcessesMayNot) {
  std::vector<GpuIdentity> all = {gpu(0, "0000:06:00.0", 10), gpu(1, "0000:06:00.0", 10),
                                  gpu(2, "0000:06:00.0", 10)};
  GpuIdentity self = all[0];
  checkReachable(&self, all, true);
  EXPECT_EQ(self.reachable, 1) << self.why;

  self = all[0];
  checkReachable(&self, all, false);
  EXPECT_EQ(self.reachable, 0);
  EXPECT_NE(std::string(self.why).find("uses the same GPU"), std::string::npos) << self.why;

  all[2].process = 11;  // a rank of another process on the same GPU
  self = all[0];
  checkReachable(&self, all, true);
  EXPECT_EQ(self.reachable, 0);
  EXPECT_NE(std::string(self.why).find("from another process"), std::string::npos) << self.why;
}

TEST(SharedGpu, RanksPerGpuAndTheBlockCap) {
  // No sharing: no cap.
  std::vector<GpuIdentity> own = {gpu(0, "0000:06:00.0", 10), gpu(1, "0000:07:00.0", 10)};
  EXPECT_EQ(ranksPerGpu(own), 1);
  EXPECT_EQ(sharedGpuBlockCap(own), 0);
  // 8 ranks on one 132-SM GPU: 132 / 9 = 14 blocks each.
  std::vector<GpuIdentity> one;
  for (int r = 0; r < 8; ++r) one.push_back(gpu(r, "0000:06:00.0", 10));
  EXPECT_EQ(ranksPerGpu(one), 8);
  EXPECT_EQ(sharedGpuBlockCap(one), 14);
  // 3 ranks on one GPU and 2 on another, the second smaller: the most per GPU and the
  // fewest SMs set the cap, so every rank computes the same.
  std::vector<GpuIdentity> two = {gpu(0, "0000:06:00.0", 10), gpu(1, "0000:07:00.0", 10, 108),
                                  gpu(2, "0000:06:00.0", 10), gpu(3, "0000:07:00.0", 10, 108),
                                  gpu(4, "0000:06:00.0", 10)};
  EXPECT_EQ(ranksPerGpu(two), 3);
  EXPECT_EQ(sharedGpuBlockCap(two), 27);  // 108 / 4
  // The same bus id on two hosts is two GPUs.
  std::vector<GpuIdentity> hosts = {gpu(0, "0000:06:00.0", 10, 132, 1),
                                    gpu(1, "0000:06:00.0", 10, 132, 2)};
  EXPECT_EQ(ranksPerGpu(hosts), 1);
  // At least one block, however many ranks share a GPU.
  std::vector<GpuIdentity> tiny;
  for (int r = 0; r < 8; ++r) tiny.push_back(gpu(r, "0000:06:00.0", 10, 4));
  EXPECT_EQ(sharedGpuBlockCap(tiny), 1);
}

}  // namespace
}  // namespace loom::transport::p2p
