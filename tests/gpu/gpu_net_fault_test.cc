// A host that dies in the middle of GPU collectives over the network: two copies of this
// binary, each a host of its own (LOOM_HOST_ID) on GPU 0, loop all-reduces of 16 MiB of
// device memory; the test kills one with SIGKILL after a few seconds of them. The other
// must report ncclRemoteError naming the dead rank (from the call or from
// ncclCommGetAsyncError) well within LOOM_TIMEOUT_MS, its stream must be released, and
// ncclCommAbort must return. Without CUDA MPS the two processes take turns on the GPU,
// which makes it slow but not wrong.
//
// Needs one GPU; skips with the reason where there is none.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/support/free_port.h"

namespace {

using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// An all-reduce of `count` floats of rank + 1 on `comm`, checked: every element must be
// 1 + 2 + ... + nranks.
void checkedAllReduce(ncclComm_t comm, float* buf, size_t count, cudaStream_t stream) {
  int rank = 0, n = 0;
  ASSERT_EQ(ncclCommUserRank(comm, &rank), ncclSuccess);
  ASSERT_EQ(ncclCommCount(comm, &n), ncclSuccess);
  std::vector<float> host(count, static_cast<float>(rank + 1));
  ASSERT_EQ(
      cudaMemcpyAsync(buf, host.data(), count * sizeof(float), cudaMemcpyHostToDevice, stream),
      cudaSuccess);
  ASSERT_EQ(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, stream), ncclSuccess)
      << ncclGetLastError(comm);
  ASSERT_EQ(
      cudaMemcpyAsync(host.data(), buf, count * sizeof(float), cudaMemcpyDeviceToHost, stream),
      cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const float want = static_cast<float>(n * (n + 1) / 2);
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(host[i], want) << "element " << i;
}

// Mode "revoke" of OneRank: rank 0 enqueues an all-reduce that rank 1 never joins and
// revokes its communicator while the kernel waits; the stream must come back and the
// communicator be quiescent. Rank 1 revokes its own once rank 0 has, and the two split
// the revoked parent and check an all-reduce on the new communicator.
void revokeThenSplit(int rank, ncclComm_t comm) {
  const size_t count = 1 << 20;
  float* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, count * sizeof(float)), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  checkedAllReduce(comm, buf, count, stream);  // the network path is set up
  if (rank == 0) {
    ASSERT_EQ(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, stream), ncclSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "the lone all-reduce ended";
    const auto t0 = Clock::now();
    EXPECT_EQ(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), ncclSuccess) << ncclGetLastError(comm);
    const double revokeMs = msSince(t0);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::printf("rank 0: the revoke returned in %.0f ms with the stream released\n", revokeMs);
    EXPECT_LT(revokeMs, 5000.0);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    EXPECT_EQ(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT), ncclSuccess) << ncclGetLastError(comm);
  }
  ncclResult_t state = ncclInternalError;
  EXPECT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
  EXPECT_EQ(state, ncclSuccess);
  ncclComm_t sub = nullptr;
  ASSERT_EQ(ncclCommSplit(comm, 0, rank, &sub, nullptr), ncclSuccess) << ncclGetLastError(comm);
  checkedAllReduce(sub, buf, count, stream);
  std::printf("rank %d: the split of the revoked communicator ran a checked all-reduce\n", rank);
  std::fflush(stdout);
  EXPECT_EQ(ncclCommDestroy(sub), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  cudaStreamDestroy(stream);
  cudaFree(buf);
}

// One rank (run by the tests below through the environment): all-reduces until one
// fails, then says how it failed and how long the abort took. Exit 0: the failure was a
// remote error naming the other rank; 3: the loop ran out without a failure.
TEST(GpuNetFault, OneRank) {
  const char* rankText = std::getenv("LOOM_TEST_FAULT_RANK");
  if (!rankText) GTEST_SKIP() << "run by the GpuNetFault tests below";
  const int rank = std::atoi(rankText);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);  // from LOOM_COMM_ID
  ncclComm_t comm;
  ASSERT_EQ(ncclCommInitRank(&comm, 2, id, rank), ncclSuccess) << ncclGetLastError(nullptr);
  // "early": rank 1 goes before any connection exists (they are made at the first call).
  const char* mode = std::getenv("LOOM_TEST_FAULT_MODE");
  if (rank == 1 && mode && std::string(mode) == "early") _exit(0);
  if (mode && std::string(mode) == "revoke") return revokeThenSplit(rank, comm);
  const size_t count = 4 << 20;
  float* buf = nullptr;
  ASSERT_EQ(cudaMalloc(&buf, count * sizeof(float)), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  std::printf("rank %d: looping\n", rank);
  std::fflush(stdout);
  const auto end = Clock::now() + std::chrono::seconds(60);
  auto lastGood = Clock::now();
  ncclResult_t failed = ncclSuccess;
  std::string how;
  long calls = 0;
  while (Clock::now() < end && failed == ncclSuccess) {
    ncclResult_t rc = ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, stream);
    if (rc != ncclSuccess) {
      failed = rc;
      how = "the call";
      break;
    }
    // The stream must come back whatever happened to the peer.
    if (cudaStreamSynchronize(stream) != cudaSuccess) {
      how = "cudaStreamSynchronize";
      failed = ncclUnhandledCudaError;
      break;
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    if (async != ncclSuccess) {
      failed = async;
      how = "ncclCommGetAsyncError";
      break;
    }
    ++calls;
    lastGood = Clock::now();
  }
  const double afterGood = msSince(lastGood);
  const std::string msg = ncclGetLastError(comm);
  const auto abortStart = Clock::now();
  ncclCommAbort(comm);
  std::printf(
      "rank %d: %ld calls; %s reported %s %.0f ms after the last good call: %s; abort took %.0f "
      "ms\n",
      rank, calls, how.c_str(), ncclGetErrorString(failed), afterGood, msg.c_str(),
      msSince(abortStart));
  std::fflush(stdout);
  ASSERT_NE(failed, ncclSuccess) << "the loop ended without a failure";
  EXPECT_EQ(failed, ncclRemoteError);
  EXPECT_NE(msg.find("rank " + std::to_string(1 - rank)), std::string::npos) << msg;
}

// Starts the two ranks (OneRank) with `mode`; their pids, and the logs they write.
void spawnRanks(const std::string& mode, std::vector<pid_t>* pids, std::vector<std::string>* logs) {
  const std::string address = loom::test::freeLoopbackAddress();
  for (int r = 0; r < 2; ++r) {
    logs->push_back("/tmp/loom_net_fault_" + std::to_string(getpid()) + "_" + std::to_string(r) +
                    ".log");
    std::string why;
    const pid_t pid = loom::test::spawnSelf(
        "GpuNetFault.OneRank",
        {"LOOM_TEST_FAULT_RANK=" + std::to_string(r), "LOOM_COMM_ID=" + address,
         "LOOM_HOST_ID=fault-host-" + std::to_string(r), "LOOM_TIMEOUT_MS=20000",
         "LOOM_TEST_FAULT_MODE=" + mode},
        logs->back(), &why);
    ASSERT_GT(pid, 0) << why;
    pids->push_back(pid);
  }
}

// Waits up to `limitMs` for `pid`; its wait status (-1: killed at the limit).
int waitFor(pid_t pid, double limitMs, Clock::time_point from) {
  int status = -1;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (msSince(from) > limitMs) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status;
}

TEST(GpuNetFault, PeerKilledMidCollective) {
  REQUIRE_GPUS(1);
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  spawnRanks("loop", &pids, &logs);
  // Both looping, then a few seconds of calls, then rank 1 dies.
  const auto setupDeadline = Clock::now() + std::chrono::seconds(60);
  while (readFile(logs[0]).find("looping") == std::string::npos ||
         readFile(logs[1]).find("looping") == std::string::npos) {
    if (Clock::now() > setupDeadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::seconds(3));
  kill(pids[1], SIGKILL);
  const auto killed = Clock::now();
  waitpid(pids[1], nullptr, 0);
  const int status = waitFor(pids[0], 60000, killed);
  if (status == -1) ADD_FAILURE() << "rank 0 did not end within 60 s of rank 1's death";
  const double tookMs = msSince(killed);
  const std::string log = readFile(logs[0]);
  std::printf("rank 0 ended %.0f ms after rank 1 was killed; its output:\n%s\n", tookMs,
              log.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  // Well within LOOM_TIMEOUT_MS (20 s): the dead peer's sockets close at once.
  EXPECT_LT(tookMs, 10000.0);
  for (const auto& l : logs) unlink(l.c_str());
}

// Rank 1 ends right after init, before the first call made any connection: rank 0's
// first call must fail once its proxy learns the peer is gone (about a second), not at
// LOOM_TIMEOUT_MS (20 s).
TEST(GpuNetFault, PeerGoneBeforeConnections) {
  REQUIRE_GPUS(1);
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  const auto start = Clock::now();
  spawnRanks("early", &pids, &logs);
  waitpid(pids[1], nullptr, 0);
  const int status = waitFor(pids[0], 60000, start);
  const std::string log = readFile(logs[0]);
  std::printf("rank 0 ended %.0f ms after the start; its output:\n%s\n", msSince(start),
              log.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_LT(msSince(start), 15000.0);
  for (const auto& l : logs) unlink(l.c_str());
}

// ncclCommRevoke on GPU buffers across hosts (revokeThenSplit).
TEST(GpuNetFault, RevokeStopsAWaitingKernelAndTheParentSplits) {
  REQUIRE_GPUS(1);
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  const auto start = Clock::now();
  spawnRanks("revoke", &pids, &logs);
  int status[2];
  for (int r = 0; r < 2; ++r) status[r] = waitFor(pids[r], 60000, start);
  for (int r = 0; r < 2; ++r) {
    const std::string log = readFile(logs[r]);
    std::printf("rank %d's output:\n%s\n", r, log.c_str());
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) << "status " << status[r];
    EXPECT_NE(log.find("ran a checked all-reduce"), std::string::npos);
    unlink(logs[r].c_str());
  }
}

}  // namespace
