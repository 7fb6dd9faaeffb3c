// Buffer registration between processes (ncclCommRegister on a GPU mesh whose ranks are
// two processes): the registered all-reduce (two-shot in place or into a registered
// output, one-shot otherwise),
// reduce, and the copies (all-gather, broadcast, all-to-all through the copy engines) give
// exact results, and so does a call that cannot take a registered form (one rank's input
// unregistered); a buffer
// deregistered, freed and allocated again is mapped anew; a CUDA graph of a registered
// call replays. The test starts two copies of this binary, one rank each, and checks from
// their logs (LOOM_DEBUG=INFO) that the registered forms ran.
//
// Skips with a reason where fewer than two GPUs are present (CI has none).
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

#include "tests/gpu/gpu_test_util.h"

namespace {

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Small integers, so sums of two ranks are exact in float.
float valueFor(int rank, size_t i, int salt) {
  return static_cast<float>((i * 7 + rank * 3 + salt) % 13 + 1);
}

TEST(GpuRegistration, TwoProcesses) {
  REQUIRE_GPUS(2);
  ncclUniqueId id;
  NCCL_OK(ncclGetUniqueId(&id));
  std::string hex;
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    char b[3];
    std::snprintf(b, sizeof(b), "%02x", static_cast<unsigned char>(id.internal[i]));
    hex += b;
  }
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int r = 0; r < 2; ++r) {
    logs.push_back("/tmp/loom_registration_" + std::to_string(getpid()) + "_" + std::to_string(r) +
                   ".log");
    std::string why;
    const pid_t pid = loom::test::spawnSelf(
        "GpuRegistration.OneRank",
        {"LOOM_TEST_REGISTRATION_RANK=" + std::to_string(r), "LOOM_TEST_REGISTRATION_ID=" + hex,
         "LOOM_DEBUG=INFO", "LOOM_DEBUG_SUBSYS=COLL", "LOOM_TIMEOUT_MS=30000",
         // the copies below use 16 MiB blocks
         "LOOM_P2P_CE_PULL_BYTES=16777216"},
        logs[r], &why);
    ASSERT_GT(pid, 0) << why;
    pids.push_back(pid);
  }
  // Both must end, within three minutes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(3);
  std::vector<int> status(2, -1);
  for (int left = 2; left > 0;) {
    for (int r = 0; r < 2; ++r) {
      if (status[r] != -1) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = st;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < 2; ++r) {
        if (status[r] == -1) kill(pids[r], SIGKILL);
      }
      ADD_FAILURE() << "a rank did not finish within 3 minutes";
      for (int r = 0; r < 2; ++r) {
        if (status[r] == -1) waitpid(pids[r], &status[r], 0);
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (int r = 0; r < 2; ++r) {
    const std::string log = readFile(logs[r]);
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0)
        << "rank " << r << " ended with status " << status[r] << "; its output:\n"
        << log;
    // The registered forms ran exactly where OneRank expects them: from the second call
    // after registering (the first activates the post board) 3 all-reduces, one into an
    // output registered by rank 0 only, 2 into outputs both registered (two-shot), 6
    // reduces, the in-place call (two-shot), not the one with rank 0's input unregistered,
    // the captured all-reduce, then 2 of each after rank 0 registered a new allocation.
    EXPECT_EQ(count(log, "pulled one-shot all-reduce"), 7u) << "rank " << r << ":\n" << log;
    EXPECT_EQ(count(log, "pulled two-shot all-reduce:"), 2u) << "rank " << r << ":\n" << log;
    EXPECT_EQ(count(log, "pulled two-shot all-reduce in place"), 1u) << "rank " << r << ":\n"
                                                                     << log;
    // 2 all-gathers, an all-to-all and 2 broadcasts through the copy engines.
    EXPECT_EQ(count(log, "registered inputs pulled between processes"), 5u) << "rank " << r << ":\n"
                                                                            << log;
    EXPECT_EQ(count(log, "pulled one-shot reduce"), 8u) << "rank " << r << ":\n" << log;
    // Rank 0 maps rank 1's first allocation and its registered output; rank 1 maps both of
    // rank 0's inputs in turn and its output.
    EXPECT_EQ(count(log, "mapped rank " + std::to_string(1 - r) + "'s registered allocation"),
              r == 0 ? 2u : 3u)
        << "rank " << r << ":\n"
        << log;
    EXPECT_NE(log.find("[  PASSED  ] 1 test"), std::string::npos) << "rank " << r << ":\n" << log;
    std::remove(logs[r].c_str());
  }
}

// A pageable copy may still be landing when cudaMemcpy returns, and it is not ordered with
// the non-blocking stream the calls use: wait for the device.
void upload(float* dst, int rank, size_t count, int salt) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = valueFor(rank, i, salt);
  cudaMemcpy(dst, v.data(), count * sizeof(float), cudaMemcpyHostToDevice);
  cudaDeviceSynchronize();
}

// Sum of both ranks' inputs; `what` names the call in failures.
void expectSum(const float* out, size_t count, int salt, const std::string& what) {
  std::vector<float> got(count);
  ASSERT_EQ(cudaMemcpy(got.data(), out, count * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  size_t wrong = 0, first = count;
  for (size_t i = 0; i < count; ++i) {
    if (got[i] != valueFor(0, i, salt) + valueFor(1, i, salt)) {
      if (first == count) first = i;
      ++wrong;
    }
  }
  EXPECT_EQ(wrong, 0u) << what << ": first wrong element " << first << " = "
                       << (first < count ? got[first] : 0.f);
}

// One rank of TwoProcesses (skips when run on its own).
TEST(GpuRegistration, OneRank) {
  const char* rankText = std::getenv("LOOM_TEST_REGISTRATION_RANK");
  const char* idText = std::getenv("LOOM_TEST_REGISTRATION_ID");
  if (!rankText || !idText) GTEST_SKIP() << "runs as one rank of GpuRegistration.TwoProcesses";
  const int rank = std::atoi(rankText);
  ncclUniqueId id;
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    unsigned b = 0;
    std::sscanf(idText + 2 * i, "%2x", &b);
    id.internal[i] = static_cast<char>(b);
  }
  CUDA_OK(cudaSetDevice(rank));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, 2, id, rank));
  const size_t big = size_t(64) << 20;  // bytes
  float *a = nullptr, *out = nullptr, *c = nullptr, *d = nullptr;
  CUDA_OK(cudaMalloc(&a, big));
  CUDA_OK(cudaMalloc(&out, big));
  CUDA_OK(cudaMalloc(&c, big));
  CUDA_OK(cudaMalloc(&d, big));
  auto sync = [&] { ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess); };

  // Nothing registered: the kernels.
  size_t n = (8 << 20) / sizeof(float);
  upload(a, rank, n, 1);
  NCCL_OK(ncclAllReduce(a, out, n, ncclFloat32, ncclSum, comm, s));
  sync();
  expectSum(out, n, 1, "unregistered all-reduce");

  // Both register `a` (one range inside the allocation, another covering it); rank 1
  // registers the whole of it as a window, which loom takes as the same registration.
  void *ha = nullptr, *ha2 = nullptr;
  ncclWindow_t window = nullptr;
  if (rank == 0) {
    NCCL_OK(ncclCommRegister(comm, a, big, &ha));
  } else {
    NCCL_OK(ncclCommWindowRegister(comm, a, big, &window, NCCL_WIN_COLL_SYMMETRIC));
  }
  NCCL_OK(ncclCommRegister(comm, a + 16, 4096, &ha2));
  void* bogus = reinterpret_cast<void*>(0x1234);
  EXPECT_EQ(ncclCommDeregister(comm, bogus), ncclInvalidArgument);
  // The first call after registering still runs unregistered (the board activates there),
  // then every size the pulled forms take, at an offset of one float.
  for (size_t bytes : {size_t(2) << 20, size_t(8) << 20, size_t(64) << 20, size_t(8) << 20}) {
    n = bytes / sizeof(float) - 1;
    upload(a + 1, rank, n, int(bytes >> 20));
    NCCL_OK(ncclAllReduce(a + 1, out, n, ncclFloat32, ncclSum, comm, s));
    sync();
    expectSum(out, n, int(bytes >> 20), "registered all-reduce of " + std::to_string(bytes));
  }
  // Outputs in registered memory too: the two-shot form out of place, once both ranks
  // registered theirs (before that, the one-shot form).
  void* hd = nullptr;
  for (int both : {0, 1}) {
    if (rank == both) {
      NCCL_OK(ncclCommRegister(comm, d, big, &hd));
    }
    for (size_t bytes : {size_t(8) << 20, size_t(2) << 20}) {
      n = bytes / sizeof(float) - 1;
      upload(a + 1, rank, n, 40 + both);
      NCCL_OK(ncclAllReduce(a + 1, d + 1, n, ncclFloat32, ncclSum, comm, s));
      sync();
      expectSum(d + 1, n, 40 + both, "all-reduce into registered output, " + std::to_string(bytes));
      if (!both) break;
    }
  }
  // Reduce to each root; the other's output is not written.
  for (int root : {0, 1}) {
    for (size_t bytes : {size_t(2) << 20, size_t(16) << 20, size_t(64) << 20}) {
      n = bytes / sizeof(float);
      upload(a, rank, n, root + 3);
      CUDA_OK(cudaMemset(out, 0, bytes));
      CUDA_OK(cudaDeviceSynchronize());
      NCCL_OK(ncclReduce(a, out, n, ncclFloat32, ncclSum, root, comm, s));
      sync();
      if (rank == root) {
        expectSum(out, n, root + 3, "registered reduce to " + std::to_string(root));
      } else {
        std::vector<float> got(16);
        cudaMemcpy(got.data(), out, sizeof(float) * got.size(), cudaMemcpyDeviceToHost);
        for (float g : got) EXPECT_EQ(g, 0.f) << "reduce wrote a non-root's output";
      }
    }
  }
  // The copies pull from the registered inputs with the copy engines (16 MiB blocks):
  // all-gather out of place and in place, broadcast from each root, all-to-all.
  {
    const size_t blk = (16 << 20) / sizeof(float);
    auto expectBlocks = [&](const float* buf, int salt, bool toAll, const std::string& what) {
      std::vector<float> got(2 * blk);
      ASSERT_EQ(cudaMemcpy(got.data(), buf, got.size() * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
      size_t wrong = 0;
      for (int p = 0; p < 2; ++p) {
        for (size_t i = 0; i < blk; ++i) {
          // all-gather: block p is rank p's input; all-to-all: rank p's block `rank`.
          const float want = valueFor(p, (toAll ? rank * blk : 0) + i, salt);
          wrong += got[p * blk + i] != want;
        }
      }
      EXPECT_EQ(wrong, 0u) << what;
    };
    upload(a, rank, blk, 30);
    NCCL_OK(ncclAllGather(a, out, blk, ncclFloat32, comm, s));
    sync();
    expectBlocks(out, 30, false, "registered all-gather");
    upload(a + rank * blk, rank, blk, 31);  // in place: our block of the (registered) output
    NCCL_OK(ncclAllGather(a + rank * blk, a, blk, ncclFloat32, comm, s));
    sync();
    expectBlocks(a, 31, false, "registered all-gather in place");
    upload(a, rank, 2 * blk, 32);
    NCCL_OK(ncclAlltoAll(a, out, blk, ncclFloat32, comm, s));
    sync();
    expectBlocks(out, 32, true, "registered all-to-all");
    for (int root : {0, 1}) {
      upload(a, rank, blk, 33 + root);
      CUDA_OK(cudaMemset(out, 0, blk * sizeof(float)));
      CUDA_OK(cudaDeviceSynchronize());
      NCCL_OK(ncclBroadcast(a, out, blk, ncclFloat32, root, comm, s));
      sync();
      std::vector<float> got(blk);
      ASSERT_EQ(cudaMemcpy(got.data(), out, blk * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
      size_t wrong = 0;
      for (size_t i = 0; i < blk; ++i) wrong += got[i] != valueFor(root, i, 33 + root);
      EXPECT_EQ(wrong, 0u) << "registered broadcast from " << root;
    }
  }
  // In place: the two-shot form (each rank reduces its part and stores it into both buffers).
  n = (8 << 20) / sizeof(float);
  upload(a, rank, n, 5);
  NCCL_OK(ncclAllReduce(a, a, n, ncclFloat32, ncclSum, comm, s));
  sync();
  expectSum(a, n, 5, "in-place all-reduce on registered memory");
  // Only rank 1's input is registered: the kernels on both.
  void* hc = nullptr;
  if (rank == 1) {
    NCCL_OK(ncclCommRegister(comm, c, big, &hc));
  }
  float* in = rank == 1 ? c : out;
  float* res = rank == 1 ? out : c;
  upload(in, rank, n, 6);
  NCCL_OK(ncclAllReduce(in, res, n, ncclFloat32, ncclSum, comm, s));
  sync();
  expectSum(res, n, 6, "all-reduce with one rank's input unregistered");
  // A CUDA graph of a registered all-reduce, replayed with new inputs.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  NCCL_OK(ncclAllReduce(a, out, n, ncclFloat32, ncclSum, comm, s));
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int k = 0; k < 5; ++k) {
    upload(a, rank, n, 20 + k);
    CUDA_OK(cudaGraphLaunch(exec, s));
    sync();
    expectSum(out, n, 20 + k, "graph replay " + std::to_string(k));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  // Rank 0 lets go of `a`, frees it and registers a new allocation: mapped anew.
  if (rank == 0) {
    NCCL_OK(ncclCommDeregister(comm, ha));
    NCCL_OK(ncclCommDeregister(comm, ha2));
    CUDA_OK(cudaFree(a));
    CUDA_OK(cudaMalloc(&a, big));
    NCCL_OK(ncclCommRegister(comm, a, big, &ha));
  }
  for (int k = 0; k < 2; ++k) {
    upload(a, rank, n, 7 + k);
    NCCL_OK(ncclAllReduce(a, out, n, ncclFloat32, ncclSum, comm, s));
    NCCL_OK(ncclReduce(a, c, n, ncclFloat32, ncclSum, 0, comm, s));
    sync();
    expectSum(out, n, 7 + k, "all-reduce after re-registration");
    if (rank == 0) expectSum(c, n, 7 + k, "reduce after re-registration");
  }
  NCCL_OK(ncclCommDeregister(comm, hd));
  if (rank == 0) {
    NCCL_OK(ncclCommDeregister(comm, ha));
  } else {
    NCCL_OK(ncclCommWindowDeregister(comm, window));
    NCCL_OK(ncclCommDeregister(comm, ha2));
    NCCL_OK(ncclCommDeregister(comm, hc));
  }
  NCCL_OK(ncclCommDestroy(comm));
  cudaFree(a);
  cudaFree(out);
  cudaFree(c);
  cudaFree(d);
  cudaStreamDestroy(s);
}

}  // namespace
