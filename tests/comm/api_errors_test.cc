// Errors through the C API that must say what happened to whoever asks, and no more:
// ncclGetLastError from a thread that made no failing call (PyTorch's watchdog), a
// PreMulSum op used with the wrong type (an argument error, not a broken communicator),
// an invalid call inside a group (ncclGroupEnd fails too), and a misspelt LOOM_ALGO.
#include <gtest/gtest.h>
#include <nccl.h>
#include <stdlib.h>

#include <string>
#include <thread>
#include <vector>

namespace {

std::vector<ncclComm_t> hostComms(int n) {
  std::vector<ncclComm_t> comms(n, nullptr);
  EXPECT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  return comms;
}

TEST(ApiErrors, LastErrorReachesAnotherThread) {
  setenv("LOOM_TIMEOUT_MS", "500", 1);
  auto comms = hostComms(2);
  unsetenv("LOOM_TIMEOUT_MS");
  std::vector<float> buf(1000, 1.0f);
  // Rank 1 never calls: rank 0's call fails at the timeout, in this thread.
  EXPECT_NE(
      ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, comms[0], nullptr),
      ncclSuccess);
  std::string seen;
  std::thread watchdog([&] {
    ncclResult_t async = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(comms[0], &async), ncclSuccess);
    EXPECT_NE(async, ncclSuccess);
    seen = ncclGetLastError(comms[0]);
  });
  watchdog.join();
  EXPECT_NE(seen.find("rank 0"), std::string::npos) << "'" << seen << "'";
  EXPECT_NE(seen.find("LOOM_TIMEOUT_MS"), std::string::npos) << "'" << seen << "'";
  for (auto c : comms) ncclCommAbort(c);
}

TEST(ApiErrors, PreMulSumOfAnotherTypeIsAnArgumentErrorOnly) {
  auto comms = hostComms(2);
  std::vector<ncclRedOp_t> ops(2);
  float two = 2.0f;
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(
        ncclRedOpCreatePreMulSum(&ops[r], &two, ncclFloat32, ncclScalarHostImmediate, comms[r]),
        ncclSuccess);
  }
  std::vector<int32_t> ibuf(10, 1);
  EXPECT_EQ(
      ncclAllReduce(ibuf.data(), ibuf.data(), ibuf.size(), ncclInt32, ops[0], comms[0], nullptr),
      ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comms[0])).find("created for"), std::string::npos);
  // The communicator still works: a valid call on both ranks.
  std::vector<std::vector<float>> f(2, std::vector<float>(100, 1.5f));
  std::vector<ncclResult_t> res(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      res[r] = ncclAllReduce(f[r].data(), f[r].data(), f[r].size(), ncclFloat32, ops[r], comms[r],
                             nullptr);
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(res[r], ncclSuccess) << ncclGetLastError(comms[r]);
    EXPECT_EQ(f[r][0], 6.0f);  // 2 * 1.5 on each of 2 ranks
  }
  for (auto c : comms) ncclCommDestroy(c);
}

TEST(ApiErrors, InvalidCallInAGroupFailsTheGroup) {
  auto comms = hostComms(1);
  std::vector<float> buf(10, 1.0f);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32,
                          static_cast<ncclRedOp_t>(99), comms[0], nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(
      ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, comms[0], nullptr),
      ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidArgument);
  // The next group is a fresh one.
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(
      ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, comms[0], nullptr),
      ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  for (auto c : comms) ncclCommDestroy(c);
}

}  // namespace

// A misspelt LOOM_ALGO fails the communicator's init with a message that names it, on
// host memory as on GPUs (one parser, collectives/algo_request.h), instead of failing each
// call later (host) or being ignored (GPU mesh).
TEST(ApiErrors, UnknownAlgorithmFailsInitNamingIt) {
  setenv("LOOM_ALGO", "ring,warp", 1);
  std::vector<ncclComm_t> comms(2, nullptr);
  const ncclResult_t r = ncclCommInitAll(comms.data(), 2, nullptr);
  unsetenv("LOOM_ALGO");
  EXPECT_EQ(r, ncclInvalidArgument);
  const std::string said = ncclGetLastError(nullptr);
  EXPECT_NE(said.find("'warp'"), std::string::npos) << said;
  EXPECT_NE(said.find("LOOM_ALGO"), std::string::npos) << said;
  for (auto c : comms) {
    if (c) ncclCommDestroy(c);
  }
}
