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

// One rank (run by the test below through the environment): all-reduces until one
// fails, then says how it failed and how long the abort took. Exit 0: the failure was a
// remote error naming the other rank; 3: the loop ran out without a failure.
TEST(GpuNetFault, OneRank) {
  const char* rankText = std::getenv("LOOM_TEST_FAULT_RANK");
  if (!rankText) GTEST_SKIP() << "run by GpuNetFault.PeerKilledMidCollective";
  const int rank = std::atoi(rankText);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);  // from LOOM_COMM_ID
  ncclComm_t comm;
  ASSERT_EQ(ncclCommInitRank(&comm, 2, id, rank), ncclSuccess) << ncclGetLastError(nullptr);
  // "early": rank 1 goes before any connection exists (they are made at the first call).
  const char* mode = std::getenv("LOOM_TEST_FAULT_MODE");
  if (rank == 1 && mode && std::string(mode) == "early") _exit(0);
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

}  // namespace
