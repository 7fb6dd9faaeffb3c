// Device buffers over the network (collectives/device/net_executor.h): 2, 3 and 4 ranks of
// one process with P2P off (LOOM_P2P_DISABLE=1), round-robin over the GPUs there are (all
// on GPU 0 on a one-GPU machine), so every byte goes through the kernels' FIFOs, the proxy
// and loopback sockets. Every collective, type and op; counts from one element to many
// pieces; unaligned buffers; PreMulSum with device scalars; Send/Recv groups; a CUDA graph
// replayed 1000 times; a call that returns before its peers arrive; a peer that never
// comes (the kernel times out).
//
// Needs one GPU; skips with the reason where there is none.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <chrono>
#include <string>
#include <vector>

#include "common/datatype.h"
#include "common/log.h"
#include "tests/gpu/collective_check.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

using loom::DataType;
using namespace loom::test;  // collective_check.h

class OverTheNetwork : public ::testing::TestWithParam<int> {
 protected:
  static std::vector<int> devices() { return roundRobinDevices(GetParam()); }
};

// The ranks' contributions combine in the algorithm's order (see tolerance()).
#define NETWORK_RANKS(R, ...)                                                 \
  REQUIRE_GPUS(1);                                                            \
  Ranks R(GetParam(), {{"LOOM_P2P_DISABLE", "1"}, ##__VA_ARGS__}, devices()); \
  R.anyOrder = true

TEST_P(OverTheNetwork, EveryCollectiveTypeAndOp) {
  NETWORK_RANKS(R);
  EXPECT_EQ(everyCollectiveTypeAndOp(R), 0u);
}

// NaN, +-Inf and +-0 through max and min (common/minmax.h): the host's answer on every rank.
// 200 elements: pieces of at most 1 KiB for the 1- to 4-byte types (the kernel's small-piece
// combine, combineTiny). The counting pattern covers every pair of special values on 2 ranks
// only (on 3 and 4 the last ranks' values are the list's first few within 200 elements); the
// mixed pattern varies every rank's value from element to element.
TEST_P(OverTheNetwork, MaxMinOnSpecialValues) {
  NETWORK_RANKS(R);
  for (size_t count : {size_t{200}, size_t{4099}, (size_t{1} << 20) + 5}) {
    EXPECT_EQ(maxMinOnSpecialValues(R, count), 0u) << "count " << count;
  }
  EXPECT_EQ(maxMinOnSpecialValues(R, 200, SpecialPattern::kMixed), 0u) << "count 200, mixed";
}

TEST_P(OverTheNetwork, LargeCountsAndUnalignedBuffers) {
  NETWORK_RANKS(R);
  for (Coll c : {Coll::kAllReduce, Coll::kReduceScatter, Coll::kAllGather, Coll::kBroadcast,
                 Coll::kReduce, Coll::kAllToAll}) {
    EXPECT_EQ(runAndCheck(R, c, DataType::kFloat32, ncclSum, (size_t{4} << 20) + 7, false, 0), 0u)
        << collName(c);
    EXPECT_EQ(runAndCheck(R, c, DataType::kFloat32, ncclSum, 0, false, 0), 0u) << collName(c);
    for (DataType t : {DataType::kInt8, DataType::kFloat16, DataType::kFloat64}) {
      const size_t es = loom::dataTypeSize(t);
      EXPECT_EQ(runAndCheck(R, c, t, ncclSum, 100003, false, es), 0u) << collName(c);
      EXPECT_EQ(runAndCheck(R, c, t, ncclSum, 100003, true, 3 * es), 0u) << collName(c);
    }
    for (int root = 0; root < R.n(); ++root) {
      EXPECT_EQ(runAndCheck(R, c, DataType::kInt32, ncclMax, 5003, false, 0, false, root), 0u)
          << collName(c);
    }
  }
}

// Recursive doubling forced, in many pieces (its rounds pipeline over them: a phase sends one
// piece while the one before arrives, in every round at once). 3 ranks take the ring.
TEST_P(OverTheNetwork, RecursiveDoublingInManyPieces) {
  NETWORK_RANKS(R, {"LOOM_ALGO", "doubling"}, {"LOOM_CHUNK_BYTES", "65536"});
  for (size_t count : {size_t{1}, size_t{16383}, size_t{100003}, (size_t{4} << 20) + 7}) {
    EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, DataType::kFloat32, ncclSum, count, false, 0), 0u)
        << "count " << count;
    EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, DataType::kInt32, ncclMax, count, true, 4), 0u)
        << "count " << count << " in place";
  }
}

// Recursive doubling (all-gather) and halving (reduce-scatter) forced, a piece and many, in
// place and not, off alignment: on 4 ranks a block's steps one hop apart on a binomial tree;
// 2 and 3 ranks take the ring.
TEST_P(OverTheNetwork, DoublingGatherAndHalvingScatter) {
  NETWORK_RANKS(R, {"LOOM_ALGO", "doubling"}, {"LOOM_CHUNK_BYTES", "65536"});
  for (Coll c : {Coll::kAllGather, Coll::kReduceScatter}) {
    for (size_t count : {size_t{1}, size_t{16383}, (size_t{1} << 20) + 7}) {
      EXPECT_EQ(runAndCheck(R, c, DataType::kFloat32, ncclSum, count, false, 0), 0u)
          << collName(c) << ", count " << count;
      EXPECT_EQ(runAndCheck(R, c, DataType::kInt32, ncclMax, count, true, 4), 0u)
          << collName(c) << ", count " << count << " in place";
      EXPECT_EQ(runAndCheck(R, c, DataType::kFloat16, ncclAvg, count, false, 2), 0u)
          << collName(c) << ", count " << count << ", avg";
    }
  }
}

// The double binary tree forced (the tuner takes it
// where the cost model prices it under the ring, at many ranks), in many
// pieces: both trees' reductions stream up while the results of two blocks before stream
// down. On 2 ranks it is the ring.
TEST_P(OverTheNetwork, TreeAllReduceInManyPieces) {
  NETWORK_RANKS(R, {"LOOM_ALGO", "tree"}, {"LOOM_CHUNK_BYTES", "65536"});
  for (size_t count : {size_t{1}, size_t{16383}, size_t{100003}, (size_t{4} << 20) + 7}) {
    EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, DataType::kFloat32, ncclSum, count, false, 0), 0u)
        << "count " << count;
    EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, DataType::kInt32, ncclMax, count, true, 4), 0u)
        << "count " << count << " in place";
    EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, DataType::kFloat16, ncclAvg, count, false, 2), 0u)
        << "count " << count << ", avg";
  }
}

// Reduce in both of its forms, forced: the cost model takes the chain or the tree by size
// and rank count, so the default reaches only some of each. Every root, a piece and many,
// in place and not, float sum, int max and average.
TEST_P(OverTheNetwork, ReduceAsChainAndAsTree) {
  for (const char* algo : {"chain", "tree"}) {
    NETWORK_RANKS(R, {"LOOM_ALGO", algo});
    for (int root = 0; root < R.n(); ++root) {
      for (size_t count : {size_t{1}, size_t{4099}, (size_t{2} << 20) + 3}) {
        EXPECT_EQ(runAndCheck(R, Coll::kReduce, DataType::kFloat32, ncclSum, count, false, 0, false,
                              root),
                  0u)
            << algo << ", root " << root << ", count " << count;
        EXPECT_EQ(
            runAndCheck(R, Coll::kReduce, DataType::kInt32, ncclMax, count, true, 4, false, root),
            0u)
            << algo << ", root " << root << ", count " << count << " in place";
        EXPECT_EQ(runAndCheck(R, Coll::kReduce, DataType::kFloat16, ncclAvg, count, false, 2, false,
                              root),
                  0u)
            << algo << ", root " << root << ", count " << count << ", avg";
      }
    }
  }
}

TEST_P(OverTheNetwork, PreMulSumHostAndDeviceScalars) {
  NETWORK_RANKS(R);
  const int n = R.n();
  for (DataType t :
       {DataType::kInt32, DataType::kFloat16, DataType::kFloat32, DataType::kBfloat16}) {
    std::vector<char> two(8);
    loom::storeFromDouble(t, two.data(), 0, 2.0);
    for (bool onDevice : {false, true}) {
      std::vector<ncclRedOp_t> ops(n);
      std::vector<void*> scalars(n, nullptr);
      for (int r = 0; r < n; ++r) {
        void* s = two.data();
        ncclScalarResidence_t res = ncclScalarHostImmediate;
        if (onDevice) {
          cudaSetDevice(R.dev(r));
          cudaMalloc(&scalars[r], 8);
          cudaMemcpy(scalars[r], two.data(), 8, cudaMemcpyHostToDevice);
          cudaDeviceSynchronize();
          s = scalars[r];
          res = ncclScalarDevice;
        }
        NCCL_OK(
            ncclRedOpCreatePreMulSum(&ops[r], s, static_cast<ncclDataType_t>(t), res, R.comms[r]));
      }
      // 1 and 200 elements: pieces of at most 1 KiB (the kernel's small-piece combine).
      for (Coll c : {Coll::kAllReduce, Coll::kReduceScatter, Coll::kReduce}) {
        for (size_t count : {size_t{1}, size_t{200}, size_t{4099}}) {
          EXPECT_EQ(runAndCheck(R, c, t, ops[0], count, false, 0, onDevice), 0u)
              << collName(c) << " count " << count;
        }
      }
      for (int r = 0; r < n; ++r) {
        ncclRedOpDestroy(ops[r], R.comms[r]);
        if (scalars[r]) {
          cudaSetDevice(R.dev(r));
          cudaFree(scalars[r]);
        }
      }
    }
  }
}

// Each rank sends three messages to the next rank and one to itself, and receives as
// many: several messages between two ranks in one group go in order.
TEST_P(OverTheNetwork, SendRecvGroups) {
  NETWORK_RANKS(R);
  const int n = R.n();
  const int k = 3;
  for (size_t count : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
    std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> a(n), b(n);
    std::vector<std::unique_ptr<DeviceBuffer>> self;
    for (int r = 0; r < n; ++r) {
      for (int m = 0; m < k; ++m) {
        a[r].push_back(std::make_unique<DeviceBuffer>(R.dev(r), count * 4));
        b[r].push_back(std::make_unique<DeviceBuffer>(R.dev(r), count * 4));
        upload(R.dev(r), a[r][m]->ptr, makeInput(DataType::kInt32, r, count, ncclSum, m * 7));
      }
      self.push_back(std::make_unique<DeviceBuffer>(R.dev(r), count * 4));
    }
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      for (int m = 0; m < k; ++m) {
        NCCL_OK(ncclSend(a[r][m]->ptr, count, ncclInt32, (r + 1) % n, R.comms[r], R.streams[r]));
        NCCL_OK(
            ncclRecv(b[r][m]->ptr, count, ncclInt32, (r + n - 1) % n, R.comms[r], R.streams[r]));
      }
      NCCL_OK(ncclSend(a[r][0]->ptr, count, ncclInt32, r, R.comms[r], R.streams[r]));
      NCCL_OK(ncclRecv(self[r]->ptr, count, ncclInt32, r, R.comms[r], R.streams[r]));
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    R.sync();
    for (int r = 0; r < n; ++r) {
      for (int m = 0; m < k; ++m) {
        EXPECT_EQ(download(R.dev(r), b[r][m]->ptr, count * 4),
                  makeInput(DataType::kInt32, (r + n - 1) % n, count, ncclSum, m * 7))
            << "rank " << r << " message " << m << " count " << count;
      }
      EXPECT_EQ(download(R.dev(r), self[r]->ptr, count * 4),
                makeInput(DataType::kInt32, r, count, ncclSum));
    }
  }
}

TEST_P(OverTheNetwork, GraphReplayedThousandTimes) {
  NETWORK_RANKS(R);
  size_t bad = 0;
  replayAllReduceGraph(R, 1000, 50, &bad);
  EXPECT_EQ(bad, 0u);
}

// Nothing waits on the host: rank 0's call returns while its peers have not called yet,
// and the result is right once they have.
TEST_P(OverTheNetwork, CallReturnsBeforePeersArrive) {
  NETWORK_RANKS(R);
  const int n = R.n();
  EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, DataType::kFloat32, ncclSum, 1 << 20, false, 0), 0u);
  const size_t count = 1 << 20;
  std::vector<std::unique_ptr<DeviceBuffer>> in, out;
  for (int r = 0; r < n; ++r) {
    in.push_back(std::make_unique<DeviceBuffer>(R.dev(r), count * 4));
    out.push_back(std::make_unique<DeviceBuffer>(R.dev(r), count * 4));
    upload(R.dev(r), in[r]->ptr, makeInput(DataType::kFloat32, r, count, ncclSum));
  }
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(R.dev(r));
    NCCL_OK(ncclAllReduce(in[r]->ptr, out[r]->ptr, count, ncclFloat32, ncclSum, R.comms[r],
                          R.streams[r]));
    if (r == 0) {
      // Its kernel cannot have finished: rank 1 has not called.
      EXPECT_EQ(cudaStreamQuery(R.streams[0]), cudaErrorNotReady);
    }
  }
  R.sync();
  const std::vector<char> want = floatSums(n, count);
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(download(R.dev(r), out[r]->ptr, count * 4), want) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(GpuNetwork, OverTheNetwork, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

#if LOOM_HAVE_VERBS
// GPUDirect RDMA's data path over the emulated RDMA devices (LOOM_IB_EMULATE=roce,gdr): the
// FIFOs' slots in GPU memory, registered through dma-buf where the driver exports it (else
// as peer memory), the emulated NIC copying with CUDA in place of DMA; with `forceFlush`
// (LOOM_NET_FORCE_FLUSH=1) every receive flushed as on GPUs that need it.
void gpuDirectOverTheEmulation(bool forceFlush) {
  // The network executor's INFO line says where the slots went.
  setenv("LOOM_DEBUG", "INFO", 1);
  setenv("LOOM_DEBUG_SUBSYS", "NET", 1);
  loom::log::reload();
  ::testing::internal::CaptureStderr();
  Ranks R(2,
          {{"LOOM_P2P_DISABLE", "1"},
           {"LOOM_NET", "ib"},
           {"LOOM_IB_EMULATE", "roce,gdr"},
           {"LOOM_NET_FORCE_FLUSH", forceFlush ? "1" : "0"}},
          roundRobinDevices(2));
  const std::string log = ::testing::internal::GetCapturedStderr();
  unsetenv("LOOM_DEBUG");
  unsetenv("LOOM_DEBUG_SUBSYS");
  loom::log::reload();
  EXPECT_NE(log.find("the NIC reads and writes the FIFOs' slots in GPU memory"), std::string::npos)
      << log;
  if (forceFlush) {
    EXPECT_NE(log.find("each receive flushed"), std::string::npos) << log;
  }
  R.anyOrder = true;
  EXPECT_EQ(everyCollectiveTypeAndOp(R), 0u);
  for (Coll c : {Coll::kAllReduce, Coll::kAllGather, Coll::kBroadcast, Coll::kAllToAll}) {
    EXPECT_EQ(runAndCheck(R, c, DataType::kFloat32, ncclSum, (size_t{4} << 20) + 7, false, 0), 0u)
        << collName(c);
  }
}

TEST(GpuNetwork, IbEmulatedGpuDirect) {
  REQUIRE_GPUS(1);
  gpuDirectOverTheEmulation(false);
}

TEST(GpuNetwork, IbEmulatedGpuDirectFlushed) {
  REQUIRE_GPUS(1);
  gpuDirectOverTheEmulation(true);
}
#endif

// Connections made, then only rank 0 calls: its kernel gives up after LOOM_TIMEOUT_MS,
// the stream is released, and the error names the peer and the timeout.
TEST(GpuNetwork, MissingPeerTimesOutInsteadOfHanging) {
  REQUIRE_GPUS(1);
  Ranks R(2, {{"LOOM_P2P_DISABLE", "1"}, {"LOOM_TIMEOUT_MS", "2000"}}, roundRobinDevices(2));
  EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, DataType::kFloat32, ncclSum, 1000, false, 0), 0u);
  DeviceBuffer buf(R.dev(0), 1 << 20);
  cudaSetDevice(R.dev(0));
  const auto start = std::chrono::steady_clock::now();
  NCCL_OK(ncclAllReduce(buf.ptr, buf.ptr, 1000, ncclFloat32, ncclSum, R.comms[0], R.streams[0]));
  EXPECT_EQ(cudaStreamSynchronize(R.streams[0]), cudaSuccess);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 1.5);
  EXPECT_LT(waited, 10.0);
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(R.comms[0], &async), ncclSuccess);
  EXPECT_EQ(async, ncclRemoteError);
  EXPECT_NE(ncclAllReduce(buf.ptr, buf.ptr, 1000, ncclFloat32, ncclSum, R.comms[0], R.streams[0]),
            ncclSuccess);
  const std::string msg = ncclGetLastError(nullptr);
  EXPECT_NE(msg.find("LOOM_TIMEOUT_MS"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
}

}  // namespace
