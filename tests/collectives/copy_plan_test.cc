// The copy-engine plans (collectives/device/copy_plan.h) carried out with memcpy on host
// buffers: every rank's copies run, then every output is compared with what the
// collective defines. Runs without a GPU.
#include "collectives/device/copy_plan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace loom::collectives::device {
namespace {

uint8_t valueAt(int rank, size_t i) {
  return static_cast<uint8_t>(rank * 37 + i * 11 + 1);
}

struct Case {
  MeshKind kind;
  int nranks;
  int root;
  size_t block;
  bool inPlace;
  bool pull = false;  // planPulls (between processes) instead of planCopies
};

// Runs the plans of every rank; returns the number of wrong output bytes.
size_t runPlans(const Case& c) {
  const int n = c.nranks;
  const size_t inBytes = c.kind == MeshKind::kAllToAll ? c.block * n : c.block;
  const size_t outBytes = c.kind == MeshKind::kBroadcast ? c.block : c.block * n;
  std::vector<std::vector<uint8_t>> out(n, std::vector<uint8_t>(outBytes, 0xA5));
  std::vector<std::vector<uint8_t>> in(n, std::vector<uint8_t>(inBytes));
  std::vector<RankBuffers> all(n);
  for (int r = 0; r < n; ++r) {
    uint8_t* src = in[r].data();
    if (c.inPlace) src = out[r].data() + (c.kind == MeshKind::kAllGather ? r * c.block : 0);
    for (size_t i = 0; i < inBytes; ++i) src[i] = valueAt(r, i);
    all[r].in = src;
    all[r].out = out[r].data();
  }
  EXPECT_TRUE(copyPlanSafe(c.kind, n, c.root, c.block, all.data()));
  // Every rank's plan is made before any copy runs, as on the GPUs (pointers only).
  std::vector<std::vector<CopyStep>> plans;
  std::vector<const void*> inputs(n);
  for (int r = 0; r < n; ++r) inputs[r] = all[r].in;
  for (int r = 0; r < n; ++r) {
    if (c.pull) {
      EXPECT_TRUE(pullSafe(c.kind, r, n, c.root, c.block, all[r].in, all[r].out));
      plans.push_back(planPulls(c.kind, r, n, c.root, c.block, inputs.data(), all[r].out));
      for (const CopyStep& s : plans.back()) {  // a rank writes only its own output
        auto d = static_cast<const uint8_t*>(s.dst);
        EXPECT_TRUE(d >= out[r].data() && d + s.bytes <= out[r].data() + outBytes);
      }
    } else {
      plans.push_back(planCopies(c.kind, r, n, c.root, c.block, all.data()));
    }
  }
  for (int r = 0; r < n; ++r) {
    for (const CopyStep& s : plans[r]) {
      EXPECT_EQ(s.bytes, c.block);
      EXPECT_NE(s.dst, s.src);
      std::memcpy(s.dst, s.src, s.bytes);
    }
  }
  size_t wrong = 0;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < outBytes; ++i) {
      uint8_t want = 0;
      switch (c.kind) {
        case MeshKind::kBroadcast: want = valueAt(c.root, i); break;
        case MeshKind::kAllGather:
          want = valueAt(static_cast<int>(i / c.block), i % c.block);
          break;
        case MeshKind::kAllToAll:
          want = valueAt(static_cast<int>(i / c.block), r * c.block + i % c.block);
          break;
        default: break;
      }
      wrong += out[r][i] != want;
    }
  }
  return wrong;
}

TEST(CopyPlan, PullsBetweenProcesses) {
  for (int n = 1; n <= 8; ++n) {
    for (size_t block : {size_t{1}, size_t{7}, size_t{4096}}) {
      for (bool inPlace : {false, true}) {
        for (int root = 0; root < n; ++root) {
          EXPECT_EQ(runPlans({MeshKind::kBroadcast, n, root, block, inPlace, true}), 0u)
              << n << " " << block;
        }
        EXPECT_EQ(runPlans({MeshKind::kAllGather, n, 0, block, inPlace, true}), 0u)
            << n << " " << block;
      }
      EXPECT_EQ(runPlans({MeshKind::kAllToAll, n, 0, block, false, true}), 0u) << n << " " << block;
    }
  }
  // Layouts a pull could break: an all-to-all in place, an all-gather whose input is not
  // its own block of the output.
  std::vector<uint8_t> buf(64);
  EXPECT_FALSE(pullSafe(MeshKind::kAllToAll, 0, 2, 0, 16, buf.data(), buf.data()));
  EXPECT_FALSE(pullSafe(MeshKind::kAllGather, 1, 2, 0, 16, buf.data(), buf.data()));
  EXPECT_TRUE(pullSafe(MeshKind::kAllGather, 1, 2, 0, 16, buf.data() + 16, buf.data()));
  EXPECT_TRUE(
      pullSafe(MeshKind::kBroadcast, 1, 2, 0, 16, buf.data() + 8, buf.data()));  // not the root
  EXPECT_FALSE(pullSafe(MeshKind::kBroadcast, 0, 2, 0, 16, buf.data() + 8, buf.data()));
}

TEST(CopyPlan, EveryRankCountLayoutAndRoot) {
  for (int n = 1; n <= 8; ++n) {
    for (size_t block : {size_t{1}, size_t{7}, size_t{4096}}) {
      for (bool inPlace : {false, true}) {
        for (int root = 0; root < n; ++root) {
          EXPECT_EQ(runPlans({MeshKind::kBroadcast, n, root, block, inPlace}), 0u)
              << n << " " << block;
        }
        EXPECT_EQ(runPlans({MeshKind::kAllGather, n, 0, block, inPlace}), 0u) << n << " " << block;
      }
      EXPECT_EQ(runPlans({MeshKind::kAllToAll, n, 0, block, false}), 0u) << n << " " << block;
    }
  }
}

TEST(CopyPlan, PeersFirstAndOnlyTheRootBroadcasts) {
  std::vector<uint8_t> in0(64), out0(64), in1(64), out1(64), in2(64), out2(64);
  RankBuffers all[3] = {
      {in0.data(), out0.data()}, {in1.data(), out1.data()}, {in2.data(), out2.data()}};
  auto steps = planCopies(MeshKind::kBroadcast, 1, 3, 1, 64, all);
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[0].peer, 2);
  EXPECT_EQ(steps[1].peer, 0);
  EXPECT_EQ(steps[2].peer, 1);  // the local copy last
  EXPECT_TRUE(planCopies(MeshKind::kBroadcast, 0, 3, 1, 64, all).empty());
  EXPECT_TRUE(planCopies(MeshKind::kAllReduceTwoShot, 0, 3, 1, 64, all).empty());
  EXPECT_TRUE(planCopies(MeshKind::kAllGather, 0, 3, 0, 0, all).empty());
}

TEST(CopyPlan, OverlapsThatPushesWouldBreakAreRefused) {
  std::vector<uint8_t> buf(4096);
  // All-to-all in place: a peer's push could land before our block left.
  RankBuffers a2a[2] = {{buf.data(), buf.data()}, {buf.data() + 2048, buf.data() + 2048}};
  EXPECT_FALSE(copyPlanSafe(MeshKind::kAllToAll, 2, 0, 512, a2a));
  // All-gather with the input inside the output but not at the rank's own block.
  RankBuffers ag[2] = {{buf.data() + 512, buf.data()}, {buf.data() + 3072, buf.data() + 2048}};
  EXPECT_FALSE(copyPlanSafe(MeshKind::kAllGather, 2, 0, 512, ag));
  RankBuffers agOk[2] = {{buf.data(), buf.data()}, {buf.data() + 2560, buf.data() + 2048}};
  EXPECT_TRUE(copyPlanSafe(MeshKind::kAllGather, 2, 0, 512, agOk));
  // Broadcast: only the root's input matters.
  RankBuffers bc[2] = {{buf.data(), buf.data() + 100}, {buf.data() + 2048, buf.data() + 2048}};
  EXPECT_FALSE(copyPlanSafe(MeshKind::kBroadcast, 2, 0, 512, bc));
  // With rank 1 as the root, rank 0's overlapping buffers are not read: fine.
  EXPECT_TRUE(copyPlanSafe(MeshKind::kBroadcast, 2, 1, 512, bc));
  EXPECT_FALSE(copyPlanSafe(MeshKind::kAllReduceOneShot, 2, 0, 512, agOk));
}

}  // namespace
}  // namespace loom::collectives::device
