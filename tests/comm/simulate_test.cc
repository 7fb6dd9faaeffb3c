// ncclGroupSimulateEnd: the cost model's time for a group's calls, which do not run
// (PyTorch 2.11 links it to plan overlap).
#include <gtest/gtest.h>
#include <nccl.h>

#include <cmath>
#include <string>
#include <vector>

namespace {

struct Comms {
  std::vector<ncclComm_t> c;
  explicit Comms(int n) : c(n, nullptr) {
    EXPECT_EQ(ncclCommInitAll(c.data(), n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  }
  ~Comms() {
    for (auto x : c) ncclCommDestroy(x);
  }
};

// The estimate of one all-reduce per rank of `count` floats; the buffers stay as they were.
float simulate(Comms& comms, size_t count) {
  std::vector<std::vector<float>> bufs(comms.c.size(), std::vector<float>(count, 3.0f));
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  for (size_t r = 0; r < comms.c.size(); ++r) {
    EXPECT_EQ(ncclAllReduce(bufs[r].data(), bufs[r].data(), count, ncclFloat32, ncclSum, comms.c[r],
                            nullptr),
              ncclSuccess);
  }
  EXPECT_EQ(ncclGroupSimulateEnd(&info), ncclSuccess) << ncclGetLastError(nullptr);
  for (const auto& b : bufs) EXPECT_EQ(b.front(), 3.0f) << "a simulated call ran";
  return info.estimatedTime;
}

TEST(Simulate, EstimatesAGroupWithoutRunningIt) {
  Comms comms(4);
  const float small = simulate(comms, 2), large = simulate(comms, 1 << 22);
  EXPECT_TRUE(std::isfinite(small));
  EXPECT_GT(small, 0.0f);
  EXPECT_GT(large, small * 10);
  // The group is closed and the communicators work: a real all-reduce of known data.
  std::vector<std::vector<float>> bufs(4, std::vector<float>(1000));
  for (int r = 0; r < 4; ++r)
    for (size_t i = 0; i < 1000; ++i) bufs[r][i] = static_cast<float>(r + i % 5);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(ncclAllReduce(bufs[r].data(), bufs[r].data(), 1000, ncclFloat32, ncclSum, comms.c[r],
                            nullptr),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < 4; ++r)
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(bufs[r][i], static_cast<float>(6 + 4 * (i % 5)));
}

// Misuse fails with a message; inside a group it fails the group too, as any invalid call
// there does (ncclGroupEnd then returns the first error).
TEST(Simulate, BadUseIsAnErrorThatSaysWhy) {
  ncclSimInfo_t info = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_EQ(ncclGroupSimulateEnd(&info), ncclInvalidUsage);  // no group
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("without a matching ncclGroupStart"),
            std::string::npos);

  ncclSimInfo_t raw{};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(&raw),
            ncclInvalidArgument);  // not initialized: the group stays open
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("NCCL_SIM_INFO_INITIALIZER"),
            std::string::npos);
  EXPECT_EQ(ncclGroupSimulateEnd(nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);

  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(&info), ncclInvalidUsage);  // nested: the group stays open
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("outermost"), std::string::npos);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(&info), ncclInvalidUsage);

  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupSimulateEnd(&info), ncclSuccess);  // an empty group takes no time
  EXPECT_EQ(info.estimatedTime, 0.0f);
}

}  // namespace
