// Every collective on device memory through the C API: two (or more) GPUs driven from
// one thread (ncclCommInitAll + groups, as nccl-tests' -g N runs), all types and ops,
// in-place and out-of-place, counts from 0 to several pipeline rounds, unaligned
// buffers, Send/Recv, a CUDA graph replayed 1000 times, and a peer that never comes (the
// kernel times out instead of hanging). Device buffers over the network (P2P off, other
// hosts) are gpu_network_test's.
//
// Skips with a reason where fewer GPUs are present (CI has none).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/datatype.h"
#include "common/log.h"
#include "tests/gpu/collective_check.h"
#include "tests/gpu/gpu_test_util.h"

namespace {

using loom::DataType;
using namespace loom::test;  // collective_check.h

TEST(GpuCollectives, EveryCollectiveTypeAndOp) {
  REQUIRE_GPUS(2);
  Ranks R(2);
  EXPECT_EQ(everyCollectiveTypeAndOp(R), 0u);
}

TEST(GpuCollectives, LargeCountsSpanManyRounds) {
  REQUIRE_GPUS(2);
  Ranks R(2);
  // 40 M floats: 160 MB, many pipeline rounds per block; and an odd count.
  for (Coll c : {Coll::kAllReduce, Coll::kReduceScatter, Coll::kAllGather, Coll::kBroadcast,
                 Coll::kReduce, Coll::kAllToAll}) {
    EXPECT_EQ(runAndCheck(R, c, DataType::kFloat32, ncclSum, (size_t{40} << 20) + 7, false, 0), 0u)
        << collName(c);
  }
  EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, DataType::kBfloat16, ncclMax, (size_t{96} << 20) + 3,
                        true, 0),
            0u);
}

TEST(GpuCollectives, ZeroCountAndUnalignedBuffers) {
  REQUIRE_GPUS(2);
  Ranks R(2);
  for (Coll c : {Coll::kAllReduce, Coll::kReduceScatter, Coll::kAllGather, Coll::kBroadcast,
                 Coll::kReduce, Coll::kAllToAll}) {
    EXPECT_EQ(runAndCheck(R, c, DataType::kFloat32, ncclSum, 0, false, 0), 0u);
    for (DataType t :
         {DataType::kInt8, DataType::kFloat16, DataType::kFloat32, DataType::kFloat64}) {
      size_t es = loom::dataTypeSize(t);
      EXPECT_EQ(runAndCheck(R, c, t, ncclSum, 100003, false, es), 0u) << collName(c);
      EXPECT_EQ(runAndCheck(R, c, t, ncclSum, 100003, true, 3 * es), 0u) << collName(c);
    }
  }
}

TEST(GpuCollectives, PreMulSumHostAndDeviceScalars) {
  REQUIRE_GPUS(2);
  Ranks R(2);
  for (DataType t : kAllTypes) {
    std::vector<char> two(8);
    loom::storeFromDouble(t, two.data(), 0, 2.0);
    for (bool onDevice : {false, true}) {
      std::vector<ncclRedOp_t> ops(2);
      std::vector<void*> scalars(2, nullptr);
      for (int r = 0; r < 2; ++r) {
        void* s = two.data();
        ncclScalarResidence_t res = ncclScalarHostImmediate;
        if (onDevice) {
          cudaSetDevice(r);
          cudaMalloc(&scalars[r], 8);
          cudaMemcpy(scalars[r], two.data(), 8, cudaMemcpyHostToDevice);
          cudaDeviceSynchronize();  // see upload()
          s = scalars[r];
          res = ncclScalarDevice;
        }
        NCCL_OK(
            ncclRedOpCreatePreMulSum(&ops[r], s, static_cast<ncclDataType_t>(t), res, R.comms[r]));
      }
      ASSERT_EQ(ops[0], ops[1]);
      for (Coll c : {Coll::kAllReduce, Coll::kReduceScatter, Coll::kReduce}) {
        EXPECT_EQ(runAndCheck(R, c, t, ops[0], 4099, false, 0, onDevice), 0u) << collName(c);
      }
      for (int r = 0; r < 2; ++r) {
        ncclRedOpDestroy(ops[r], R.comms[r]);
        if (scalars[r]) {
          cudaSetDevice(r);
          cudaFree(scalars[r]);
        }
      }
    }
  }
}

TEST(GpuCollectives, SendRecvGroups) {
  REQUIRE_GPUS(2);
  Ranks R(2);
  const int n = R.n();
  for (size_t count : {size_t{1}, size_t{1000}, size_t{3} << 20}) {
    std::vector<std::unique_ptr<DeviceBuffer>> a, b, self;
    for (int r = 0; r < n; ++r) {
      a.push_back(std::make_unique<DeviceBuffer>(r, count * 4));
      b.push_back(std::make_unique<DeviceBuffer>(r, count * 4));
      self.push_back(std::make_unique<DeviceBuffer>(r, count * 4));
      upload(r, a[r]->ptr, makeInput(DataType::kInt32, r, count, ncclSum));
    }
    // Each rank sends to the next, receives from the previous, and sends itself a copy.
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      NCCL_OK(ncclSend(a[r]->ptr, count, ncclInt32, (r + 1) % n, R.comms[r], R.streams[r]));
      NCCL_OK(ncclRecv(b[r]->ptr, count, ncclInt32, (r + n - 1) % n, R.comms[r], R.streams[r]));
      NCCL_OK(ncclSend(a[r]->ptr, count, ncclInt32, r, R.comms[r], R.streams[r]));
      NCCL_OK(ncclRecv(self[r]->ptr, count, ncclInt32, r, R.comms[r], R.streams[r]));
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    R.sync();
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(download(r, b[r]->ptr, count * 4),
                makeInput(DataType::kInt32, (r + n - 1) % n, count, ncclSum));
      EXPECT_EQ(download(r, self[r]->ptr, count * 4),
                makeInput(DataType::kInt32, r, count, ncclSum));
    }
  }
}

// More messages to one peer in one group than a channel has slots, in both directions,
// and a collective between a Send and its Recv in the same group.
TEST(GpuCollectives, ManySendsToOnePeerAndMixedGroups) {
  REQUIRE_GPUS(2);
  Ranks R(2);
  const int k = 9;
  const size_t count = 300007;
  std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> a(2), b(2);
  for (int r = 0; r < 2; ++r) {
    for (int m = 0; m < k; ++m) {
      a[r].push_back(std::make_unique<DeviceBuffer>(r, count * 4));
      b[r].push_back(std::make_unique<DeviceBuffer>(r, count * 4));
      upload(r, a[r][m]->ptr, makeInput(DataType::kInt32, r, count, ncclSum, m * 11));
    }
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    for (int m = 0; m < k; ++m)
      NCCL_OK(ncclSend(a[r][m]->ptr, count, ncclInt32, 1 - r, R.comms[r], R.streams[r]));
    for (int m = 0; m < k; ++m)
      NCCL_OK(ncclRecv(b[r][m]->ptr, count, ncclInt32, 1 - r, R.comms[r], R.streams[r]));
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  R.sync();
  for (int r = 0; r < 2; ++r) {
    for (int m = 0; m < k; ++m) {
      EXPECT_EQ(download(r, b[r][m]->ptr, count * 4),
                makeInput(DataType::kInt32, 1 - r, count, ncclSum, m * 11))
          << "rank " << r << " message " << m;
    }
  }
  // Send, AllReduce, Recv in one group.
  DeviceBuffer x0(0, 4096), x1(1, 4096);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    void* x = r == 0 ? x0.ptr : x1.ptr;
    NCCL_OK(ncclSend(a[r][0]->ptr, count, ncclInt32, 1 - r, R.comms[r], R.streams[r]));
    NCCL_OK(ncclAllReduce(x, x, 1000, ncclInt32, ncclSum, R.comms[r], R.streams[r]));
    NCCL_OK(ncclRecv(b[r][1]->ptr, count, ncclInt32, 1 - r, R.comms[r], R.streams[r]));
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  R.sync();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(download(r, b[r][1]->ptr, count * 4),
              makeInput(DataType::kInt32, 1 - r, count, ncclSum, 0));
  }
}

TEST(GpuCollectives, GraphReplayedThousandTimes) {
  REQUIRE_GPUS(2);
  Ranks R(2);
  size_t bad = 0;
  replayAllReduceGraph(R, 1000, 50, &bad);
  EXPECT_EQ(bad, 0u);
}

// Each all-reduce, reduce and reduce-scatter form forced over sizes it would not get by default.
TEST(GpuCollectives, ForcedAllReduceForms) {
  REQUIRE_GPUS(2);
  const char* forms[][2] = {{"LOOM_ALGO", "twoshot"},
                            {"LOOM_ALGO", "oneshot"},
                            {"LOOM_PROTO", "ll"},
                            {"LOOM_PROTO", "simple"}};
  for (auto& f : forms) {
    Ranks R(2, {{f[0], f[1]}});
    for (DataType t :
         {DataType::kInt8, DataType::kFloat16, DataType::kFloat32, DataType::kFloat64}) {
      for (size_t count : {size_t{1}, size_t{7}, size_t{4097}, size_t{16381}}) {
        EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, t, ncclSum, count, false, 0), 0u)
            << f[0] << "=" << f[1];
        EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, t, ncclMax, count, true, 0), 0u)
            << f[0] << "=" << f[1];
        // LOOM_ALGO picks the reduce form too (oneshot: direct to the root).
        EXPECT_EQ(runAndCheck(R, Coll::kReduce, t, ncclSum, count, false, 0, false, 0), 0u)
            << f[0] << "=" << f[1];
        EXPECT_EQ(runAndCheck(R, Coll::kReduce, t, ncclMin, count, true, 0, false, 1), 0u)
            << f[0] << "=" << f[1];
        EXPECT_EQ(runAndCheck(R, Coll::kReduceScatter, t, ncclSum, count, false, 0), 0u)
            << f[0] << "=" << f[1];
        EXPECT_EQ(runAndCheck(R, Coll::kReduceScatter, t, ncclMax, count, true, 0), 0u)
            << f[0] << "=" << f[1];
      }
      EXPECT_EQ(runAndCheck(R, Coll::kReduce, t, ncclSum, 5 << 20, false, 0), 0u)
          << f[0] << "=" << f[1];
      EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, t, ncclSum, 3 << 20, false, 0), 0u)
          << f[0] << "=" << f[1];
      // The LL region's edge (1 MiB per peer; LOOM_PROTO=ll fills it), and one element less.
      const size_t edge = (size_t{1} << 20) / loom::dataTypeSize(t);
      for (size_t count : {edge, edge - 1}) {
        EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, t, ncclSum, count, false, 0), 0u)
            << f[0] << "=" << f[1];
        EXPECT_EQ(runAndCheck(R, Coll::kReduceScatter, t, ncclSum, count, true, 0), 0u)
            << f[0] << "=" << f[1];
        EXPECT_EQ(runAndCheck(R, Coll::kReduce, t, ncclMax, count, false, 0, false, 0), 0u)
            << f[0] << "=" << f[1];
      }
    }
  }
}

// The LL128 forms (LOOM_PROTO=ll128 from 0 bytes up to the region's 8 MiB per peer): every
// type and op, partial and whole lines, the region's edge, unaligned and in place.
TEST(GpuCollectives, LL128EveryTypeOpAndEdge) {
  REQUIRE_GPUS(2);
  Ranks R(2, {{"LOOM_PROTO", "ll128"}});
  const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  for (DataType t : kAllTypes) {
    const size_t es = loom::dataTypeSize(t);
    for (ncclRedOp_t op : ops) {
      for (Coll c : {Coll::kAllReduce, Coll::kReduce, Coll::kReduceScatter}) {
        for (size_t count : {size_t{1}, size_t{15}, size_t{241}, size_t{70001}}) {
          EXPECT_EQ(runAndCheck(R, c, t, op, count, false, 0), 0u);
          EXPECT_EQ(runAndCheck(R, c, t, op, count, true, es), 0u);
        }
      }
    }
    // 8 MiB per peer (the region holds 128 x 560 x 120 bytes = 8.2 MiB) and past a block's
    // 16 KiB, and the root 0.
    for (size_t count :
         {(size_t{8} << 20) / es, (size_t{8} << 20) / es - 1, (size_t{16} << 10) / es + 1}) {
      EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, t, ncclSum, count, false, 0), 0u) << count;
      EXPECT_EQ(runAndCheck(R, Coll::kReduceScatter, t, ncclMax, count, true, 0), 0u) << count;
      EXPECT_EQ(runAndCheck(R, Coll::kReduce, t, ncclSum, count, false, 3 * es, false, 0), 0u)
          << count;
    }
  }
}

// Broadcast, all-gather and all-to-all through the copy engines (ranks of one process
// whose calls meet in one group), from one byte per copy up: every layout, root and
// alignment the kernels are tested with.
TEST(GpuCollectives, CopyEngineCollectives) {
  REQUIRE_GPUS(2);
  Ranks R(2, {{"LOOM_P2P_CE_BYTES", "1"}});
  for (Coll c : {Coll::kAllGather, Coll::kBroadcast, Coll::kAllToAll}) {
    for (DataType t :
         {DataType::kInt8, DataType::kFloat16, DataType::kFloat32, DataType::kFloat64}) {
      size_t es = loom::dataTypeSize(t);
      for (size_t count : {size_t{1}, size_t{13}, size_t{70001}, (size_t{8} << 20) + 5}) {
        for (int root : {0, 1}) {
          EXPECT_EQ(runAndCheck(R, c, t, ncclSum, count, false, 0, false, root), 0u) << collName(c);
          EXPECT_EQ(runAndCheck(R, c, t, ncclSum, count, true, 0, false, root), 0u) << collName(c);
          EXPECT_EQ(runAndCheck(R, c, t, ncclSum, count, true, 3 * es, false, root), 0u)
              << collName(c);
          if (c != Coll::kBroadcast) break;
        }
      }
    }
  }
}

// The pulled all-reduce of ranks of one process (above the LL limit and up to
// LOOM_P2P_PULL_BYTES; the two-shot form, in place and not): every type and op, aligned
// and not, in place and not interleaved. (The one-shot form: PoolBuffersInOneProcess.)
TEST(GpuCollectives, PulledAllReduceEveryTypeAndOp) {
  REQUIRE_GPUS(2);
  Ranks R(2);
  for (DataType t : kAllTypes) {
    const size_t es = loom::dataTypeSize(t);
    for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
      for (size_t count : {size_t{300001}, (size_t{3} << 20) + 5}) {
        if (count > 300001 && t != DataType::kInt8 && t != DataType::kBfloat16 &&
            t != DataType::kFloat32)
          continue;
        EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, t, op, count, false, 0), 0u)
            << loom::dataTypeName(t);
        EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, t, op, count, true, 0), 0u)
            << loom::dataTypeName(t);
        EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, t, op, count, false, es), 0u)
            << loom::dataTypeName(t);
        // In place, at an offset of one element too.
        EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, t, op, count, true, es), 0u)
            << loom::dataTypeName(t);
      }
    }
  }
}

// A reduce whose non-root passes no output (NCCL allows it), both roots, through the
// kernels (1.2 MB) and the copy engines (4 MiB).
TEST(GpuCollectives, ReduceWithoutNonRootOutput) {
  REQUIRE_GPUS(2);
  Ranks R(2);
  for (size_t count : {size_t{300001}, size_t{1} << 20}) {
    std::vector<std::unique_ptr<DeviceBuffer>> in, out;
    for (int r = 0; r < 2; ++r) {
      in.push_back(std::make_unique<DeviceBuffer>(r, count * 4));
      out.push_back(std::make_unique<DeviceBuffer>(r, count * 4));
      upload(r, in[r]->ptr, makeInput(DataType::kFloat32, r, count, ncclSum));
    }
    for (int root = 0; root < 2; ++root) {
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      for (int r = 0; r < 2; ++r) {
        NCCL_OK(ncclReduce(in[r]->ptr, r == root ? out[r]->ptr : nullptr, count, ncclFloat32,
                           ncclSum, root, R.comms[r], R.streams[r]));
      }
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
      R.sync();
      std::vector<char> got = download(root, out[root]->ptr, count * 4);
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) {
        bad += loom::loadAsDouble(DataType::kFloat32, got.data(), i) !=
               reduced(DataType::kFloat32, ncclSum, 2, i, false);
      }
      EXPECT_EQ(bad, 0u) << "count " << count << ", root " << root;
    }
  }
}

// What the library logs (LOOM_DEBUG=INFO, subsystem COLL) while one of these lives: how a
// test sees which form a call took.
class FormLog {
 public:
  FormLog() {
    setenv("LOOM_DEBUG", "INFO", 1);
    setenv("LOOM_DEBUG_SUBSYS", "COLL", 1);
    loom::log::reload();
    ::testing::internal::CaptureStderr();
  }
  ~FormLog() { text(); }
  // Lines that contain `what` (the capture ends at the first call).
  size_t lines(const std::string& what) {
    const std::string& t = text();
    size_t n = 0;
    for (size_t at = t.find(what); at != std::string::npos; at = t.find(what, at + 1)) ++n;
    return n;
  }

 private:
  const std::string& text() {
    if (!done_) {
      text_ = ::testing::internal::GetCapturedStderr();
      unsetenv("LOOM_DEBUG");
      unsetenv("LOOM_DEBUG_SUBSYS");
      loom::log::reload();
      done_ = true;
    }
    return text_;
  }
  std::string text_;
  bool done_ = false;
};

// The two-shot reduce of ranks of one process (LOOM_P2P_TWOSHOT_REDUCE_BYTES): rank r
// reduces part r of every input and stores it into the root's output. 2 ranks on two GPUs
// where there are two, and on GPUs shared (LOOM_P2P_SHARE_GPU) where there are fewer than
// ranks. Every type and op (ncclAvg on floats is a PreMulSum, which keeps the other
// forms), every root, in place and not, aligned and not, non-roots without an output, and
// a CUDA graph of one replayed 50 times.
class TwoShotReduce : public ::testing::TestWithParam<int> {};

TEST_P(TwoShotReduce, EveryTypeOpAndRoot) {
  REQUIRE_GPUS(1);
  const int n = GetParam(), have = gpuCount();
  Ranks R(n,
          {{"LOOM_P2P_TWOSHOT_REDUCE_BYTES", "67108864"},
           {"LOOM_P2P_SHARE_GPU", n > have ? "1" : "0"},
           {"LOOM_TIMEOUT_MS", "60000"}},
          roundRobinDevices(n));
  FormLog log;
  size_t calls = 0;
  for (DataType t : kAllTypes) {
    const size_t es = loom::dataTypeSize(t);
    for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
      // Past the LL limit (1 MiB a peer on 2 ranks) at every element size, odd counts.
      for (size_t count : {size_t{1300001} / es | 1, (size_t{3} << 20) + 5}) {
        if (count > 1300001 && t != DataType::kInt8 && t != DataType::kFloat32) continue;
        for (int k = 0; k < 4; ++k) {
          const bool inPlace = k & 1;
          const size_t misalign = k & 2 ? es : 0;
          const int root = (k + static_cast<int>(count)) % n;
          EXPECT_EQ(runAndCheck(R, Coll::kReduce, t, op, count, inPlace, misalign, false, root), 0u)
              << n << " ranks on " << have << " GPU(s), " << loom::dataTypeName(t) << " op " << op
              << " count " << count << (inPlace ? " in place" : "") << " misalign " << misalign
              << " root " << root;
          ++calls;
        }
      }
    }
  }
  // Non-roots without an output (NCCL allows it).
  const size_t count = (size_t{2} << 20) + 1;
  std::vector<std::unique_ptr<DeviceBuffer>> in, out;
  for (int r = 0; r < n; ++r) {
    in.push_back(std::make_unique<DeviceBuffer>(R.dev(r), count * 4));
    out.push_back(std::make_unique<DeviceBuffer>(R.dev(r), count * 4));
    upload(R.dev(r), in[r]->ptr, makeInput(DataType::kFloat32, r, count, ncclSum));
  }
  for (int root = 0; root < n; ++root) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      NCCL_OK(ncclReduce(in[r]->ptr, r == root ? out[r]->ptr : nullptr, count, ncclFloat32, ncclSum,
                         root, R.comms[r], R.streams[r]));
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    R.sync();
    std::vector<char> got = download(R.dev(root), out[root]->ptr, count * 4);
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i) {
      bad += loom::loadAsDouble(DataType::kFloat32, got.data(), i) !=
             reduced(DataType::kFloat32, ncclSum, n, i, false);
    }
    EXPECT_EQ(bad, 0u) << "root " << root;
  }
  // In a CUDA graph per rank (the calls in one group, so that the form applies), replayed
  // with the root's output poisoned in between.
  const int root = n - 1;
  std::vector<cudaGraphExec_t> execs(n);
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(R.dev(r));
    CUDA_OK(cudaStreamBeginCapture(R.streams[r], cudaStreamCaptureModeRelaxed));
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    NCCL_OK(ncclReduce(in[r]->ptr, out[r]->ptr, count, ncclFloat32, ncclSum, root, R.comms[r],
                       R.streams[r]));
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(R.dev(r));
    cudaGraph_t g;
    CUDA_OK(cudaStreamEndCapture(R.streams[r], &g));
    CUDA_OK(cudaGraphInstantiate(&execs[r], g, 0));
    cudaGraphDestroy(g);
  }
  const std::vector<char> want = floatSums(n, count);
  size_t badReplays = 0;
  for (int it = 0; it < 50; ++it) {
    cudaSetDevice(R.dev(root));
    cudaMemsetAsync(out[root]->ptr, 0xFF, count * 4, R.streams[root]);
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(R.dev(r));
      CUDA_OK(cudaGraphLaunch(execs[r], R.streams[r]));
    }
    R.sync();
    if (it % 10 == 9) badReplays += download(R.dev(root), out[root]->ptr, count * 4) != want;
  }
  for (int r = 0; r < n; ++r) cudaGraphExecDestroy(execs[r]);
  EXPECT_EQ(badReplays, 0u) << "replays of a captured reduce";
  // Every rank logs each call that took the form: all but the float averages, the calls
  // without outputs, and the captured one.
  const size_t floatAvg = 6 /* float types */ * 4 /* one count each */ + 4 /* float's second */;
  EXPECT_EQ(log.lines("two-shot reduce"), size_t(n) * (calls - floatAvg + n + 1));
}

INSTANTIATE_TEST_SUITE_P(GpuCollectives, TwoShotReduce, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

// Max and min on NaN, +-Inf and +-0 (common/minmax.h), through the mesh's kernels: 2, 3
// and 4 ranks, on GPUs of their own where there are enough, sharing them otherwise. Every
// floating type; a count for the small-message forms and one past them.
class MaxMinSpecialValues : public ::testing::TestWithParam<int> {};

TEST_P(MaxMinSpecialValues, MatchTheHostOnEveryRank) {
  REQUIRE_GPUS(1);
  const int n = GetParam(), have = gpuCount();
  Ranks R(n, {{"LOOM_P2P_SHARE_GPU", n > have ? "1" : "0"}, {"LOOM_TIMEOUT_MS", "60000"}},
          roundRobinDevices(n));
  for (size_t count : {size_t{4099}, (size_t{1} << 20) + 5}) {
    EXPECT_EQ(maxMinOnSpecialValues(R, count), 0u)
        << n << " ranks on " << have << " GPU(s), count " << count;
  }
}

INSTANTIATE_TEST_SUITE_P(GpuCollectives, MaxMinSpecialValues, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

// Buffers from a stream-ordered pool (cudaMallocAsync) are not mapped by peer access (a
// copy between GPUs into or out of one fails): the pulled all-reduce and the copy engines
// must leave them to the kernels. A cudaMalloc input with a pool output takes the pulled
// one-shot form (each rank writes only its own output).
TEST(GpuCollectives, PoolBuffersInOneProcess) {
  REQUIRE_GPUS(2);
  Ranks R(2);
  const int n = R.n();
  const size_t count = (size_t{1} << 20) + 3;  // 4 MiB of floats: the pulled range
  std::vector<void*> in(n), out(n), ag(n), out1(n);
  std::vector<std::unique_ptr<DeviceBuffer>> plain;
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(r);
    CUDA_OK(cudaMallocAsync(&in[r], count * 4, R.streams[r]));
    CUDA_OK(cudaMallocAsync(&out[r], count * 4, R.streams[r]));
    CUDA_OK(cudaMallocAsync(&ag[r], count * 4 * n, R.streams[r]));
    CUDA_OK(cudaMallocAsync(&out1[r], count * 4, R.streams[r]));
    CUDA_OK(cudaStreamSynchronize(R.streams[r]));
    upload(r, in[r], makeInput(DataType::kFloat32, r, count, ncclSum));
    plain.push_back(std::make_unique<DeviceBuffer>(r, count * 4));
    upload(r, plain[r]->ptr, makeInput(DataType::kFloat32, r, count, ncclSum));
  }
  Ranks C(2, {{"LOOM_P2P_CE_BYTES", "4096"}});  // (read at init: the next communicators)
  for (Ranks* rk : {&R, &C}) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      NCCL_OK(
          ncclAllReduce(in[r], out[r], count, ncclFloat32, ncclSum, rk->comms[r], R.streams[r]));
      NCCL_OK(ncclAllGather(in[r], ag[r], count, ncclFloat32, rk->comms[r], R.streams[r]));
      NCCL_OK(ncclAllReduce(plain[r]->ptr, out1[r], count, ncclFloat32, ncclSum, rk->comms[r],
                            R.streams[r]));
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    R.sync();
    for (int r = 0; r < n; ++r) {
      for (void* o : {out[r], out1[r]}) {
        std::vector<char> got = download(r, o, count * 4);
        size_t bad = 0;
        for (size_t i = 0; i < count; ++i) {
          bad += loom::loadAsDouble(DataType::kFloat32, got.data(), i) !=
                 reduced(DataType::kFloat32, ncclSum, n, i, false);
        }
        EXPECT_EQ(bad, 0u) << "rank " << r << (o == out1[r] ? " (one-shot)" : "");
      }
      std::vector<char> all = download(r, ag[r], count * 4 * n);
      for (int p = 0; p < n; ++p) {
        EXPECT_EQ(std::memcmp(all.data() + p * count * 4,
                              makeInput(DataType::kFloat32, p, count, ncclSum).data(), count * 4),
                  0)
            << "rank " << r << " block " << p;
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(r);
    cudaFreeAsync(in[r], R.streams[r]);
    cudaFreeAsync(out[r], R.streams[r]);
    cudaFreeAsync(ag[r], R.streams[r]);
    cudaFreeAsync(out1[r], R.streams[r]);
    cudaStreamSynchronize(R.streams[r]);
  }
}

// The chunked all-reduce and reduce (copy engines, ranks of one process), with chunks of
// 64 KiB so that every call has many and each slot is reused within a call and across
// calls: every type and op, in place and not, aligned and not, every root; a user's
// PreMulSum (left to the kernels) in between; several in one group with a copy-engine
// all-gather and a kernel all-reduce; and under graph capture (the kernels then).
TEST(GpuCollectives, ChunkedAllReduceAndReduce) {
  REQUIRE_GPUS(2);
  Ranks R(2, {{"LOOM_P2P_CE_REDUCE_BYTES", "1"},
              {"LOOM_P2P_CE_ALLREDUCE_BYTES", "1"},
              {"LOOM_P2P_CE_SCRATCH_BYTES", "131072"}});  // 2 slots of 64 KiB per peer
  for (DataType t : kAllTypes) {
    const size_t es = loom::dataTypeSize(t);
    for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
      // 32770 floats: rank 0's segment has two chunks and rank 1's one.
      for (size_t count : {size_t{1}, size_t{13}, size_t{32770}, size_t{70001}, size_t{300001}}) {
        const std::string what = std::string(loom::dataTypeName(t)) + " op " + std::to_string(op) +
                                 " count " + std::to_string(count);
        EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, t, op, count, false, 0), 0u) << what;
        EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, t, op, count, true, es), 0u) << what;
        if (count < 70001) continue;
        EXPECT_EQ(runAndCheck(R, Coll::kReduce, t, op, count, false, es, false, 0), 0u) << what;
        EXPECT_EQ(runAndCheck(R, Coll::kReduce, t, op, count, true, 0, false, 1), 0u) << what;
      }
    }
  }
  const int n = R.n();
  std::vector<ncclRedOp_t> premul(n);
  for (int r = 0; r < n; ++r) {
    float two = 2.0f;
    NCCL_OK(ncclRedOpCreatePreMulSum(&premul[r], &two, ncclFloat32, ncclScalarHostImmediate,
                                     R.comms[r]));
  }
  // Every rank's handle has the same value; runAndCheck passes rank 0's to all.
  EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, DataType::kFloat32, premul[0], 300001, false, 0), 0u);
  for (int r = 0; r < n; ++r) NCCL_OK(ncclRedOpDestroy(premul[r], R.comms[r]));

  const size_t count = 250007, small = 1000;
  std::vector<std::unique_ptr<DeviceBuffer>> in, a, b, ag, k;
  for (int r = 0; r < n; ++r) {
    in.push_back(std::make_unique<DeviceBuffer>(r, count * 4));
    a.push_back(std::make_unique<DeviceBuffer>(r, count * 4));
    b.push_back(std::make_unique<DeviceBuffer>(r, count * 4));
    ag.push_back(std::make_unique<DeviceBuffer>(r, count * 4 * n));
    k.push_back(std::make_unique<DeviceBuffer>(r, small * 4));
    upload(r, in[r]->ptr, makeInput(DataType::kFloat32, r, count, ncclSum));
  }
  // b holds a reduce to rank 1: checked there only.
  auto checkAll = [&](const char* what) {
    for (int r = 0; r < n; ++r) {
      std::vector<char> ga = download(r, a[r]->ptr, count * 4),
                        gb = download(r, b[r]->ptr, count * 4);
      std::vector<char> gk = download(r, k[r]->ptr, small * 4),
                        gg = download(r, ag[r]->ptr, count * 4 * n);
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) {
        const double want = reduced(DataType::kFloat32, ncclSum, n, i, false);
        bad += loom::loadAsDouble(DataType::kFloat32, ga.data(), i) != want;
        if (r == 1) bad += loom::loadAsDouble(DataType::kFloat32, gb.data(), i) != want;
        if (i < small) bad += loom::loadAsDouble(DataType::kFloat32, gk.data(), i) != want;
      }
      for (int p = 0; p < n; ++p) {
        bad += std::memcmp(gg.data() + p * count * 4,
                           makeInput(DataType::kFloat32, p, count, ncclSum).data(), count * 4) != 0;
      }
      EXPECT_EQ(bad, 0u) << what << ", rank " << r;
    }
  };
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      NCCL_OK(ncclAllReduce(in[r]->ptr, a[r]->ptr, count, ncclFloat32, ncclSum, R.comms[r],
                            R.streams[r]));
      NCCL_OK(ncclAllGather(in[r]->ptr, ag[r]->ptr, count, ncclFloat32, R.comms[r], R.streams[r]));
      NCCL_OK(ncclAllReduce(in[r]->ptr, k[r]->ptr, small, ncclFloat32, ncclSum, R.comms[r],
                            R.streams[r]));
      NCCL_OK(ncclReduce(in[r]->ptr, b[r]->ptr, count, ncclFloat32, ncclSum, 1, R.comms[r],
                         R.streams[r]));
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    R.sync();
    checkAll("one group");
  }
  // Captured: every rank's stream in its own capture (no group), so the kernels run it.
  std::vector<cudaGraphExec_t> execs(n);
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(r);
    cudaGraph_t g;
    CUDA_OK(cudaStreamBeginCapture(R.streams[r], cudaStreamCaptureModeRelaxed));
    NCCL_OK(ncclAllReduce(in[r]->ptr, a[r]->ptr, count, ncclFloat32, ncclSum, R.comms[r],
                          R.streams[r]));
    CUDA_OK(cudaStreamEndCapture(R.streams[r], &g));
    CUDA_OK(cudaGraphInstantiate(&execs[r], g, 0));
    cudaGraphDestroy(g);
  }
  for (int it = 0; it < 3; ++it) {
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(r);
      cudaMemsetAsync(a[r]->ptr, 0xFF, count * 4, R.streams[r]);
      CUDA_OK(cudaGraphLaunch(execs[r], R.streams[r]));
    }
    R.sync();
    checkAll("graph replay");
  }
  for (int r = 0; r < n; ++r) cudaGraphExecDestroy(execs[r]);
}

// The chunked all-reduce cuts each peer's scratch into 4 slots (with the default 256 MiB)
// and reduce into 2: calls that alternate must wait for the other layout's chunks first.
// 64 KiB chunks, so each call goes round the slots several times.
TEST(GpuCollectives, ChunkedLayoutsAlternate) {
  REQUIRE_GPUS(2);
  Ranks R(2, {{"LOOM_P2P_CE_REDUCE_BYTES", "1"},
              {"LOOM_P2P_CE_ALLREDUCE_BYTES", "1"},
              {"LOOM_P2P_CE_CHUNK_BYTES", "65536"}});
  for (DataType t : {DataType::kInt8, DataType::kFloat32, DataType::kFloat64}) {
    const size_t es = loom::dataTypeSize(t);
    for (size_t count : {size_t{300001}, (size_t{2} << 20) + 7}) {
      const std::string what =
          std::string(loom::dataTypeName(t)) + " count " + std::to_string(count);
      EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, t, ncclSum, count, false, 0), 0u) << what;
      EXPECT_EQ(runAndCheck(R, Coll::kReduce, t, ncclSum, count, false, es, false, 1), 0u) << what;
      EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, t, ncclMax, count, true, es), 0u) << what;
      EXPECT_EQ(runAndCheck(R, Coll::kAllReduce, t, ncclSum, count, false, 0), 0u) << what;
      EXPECT_EQ(runAndCheck(R, Coll::kReduce, t, ncclMin, count, true, 0, false, 0), 0u) << what;
    }
  }
}

// Copy-engine collectives mixed with kernel ones in one group, and captured (both ranks'
// streams in one group) in CUDA graphs replayed with the outputs poisoned in between.
TEST(GpuCollectives, CopyEngineGroupsAndGraphs) {
  REQUIRE_GPUS(2);
  Ranks R(2, {{"LOOM_P2P_CE_BYTES", "4096"}});
  const int n = R.n();
  const size_t count = (size_t{3} << 20) + 1;  // floats: above the threshold
  const size_t small = 100;                    // below it: the kernels
  std::vector<std::unique_ptr<DeviceBuffer>> in, ag, bc, ar, big;
  for (int r = 0; r < n; ++r) {
    in.push_back(std::make_unique<DeviceBuffer>(r, count * 4));
    ag.push_back(std::make_unique<DeviceBuffer>(r, count * 4 * n));
    bc.push_back(std::make_unique<DeviceBuffer>(r, count * 4));
    ar.push_back(std::make_unique<DeviceBuffer>(r, small * 4));
    big.push_back(std::make_unique<DeviceBuffer>(r, count * 4));
    upload(r, in[r]->ptr, makeInput(DataType::kFloat32, r, count, ncclSum));
  }
  auto issue = [&]() {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      NCCL_OK(ncclAllGather(in[r]->ptr, ag[r]->ptr, count, ncclFloat32, R.comms[r], R.streams[r]));
      NCCL_OK(ncclAllReduce(in[r]->ptr, ar[r]->ptr, small, ncclFloat32, ncclSum, R.comms[r],
                            R.streams[r]));
      NCCL_OK(
          ncclBroadcast(in[r]->ptr, bc[r]->ptr, count, ncclFloat32, 1, R.comms[r], R.streams[r]));
      NCCL_OK(ncclAllReduce(in[r]->ptr, big[r]->ptr, count, ncclFloat32, ncclSum, R.comms[r],
                            R.streams[r]));
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  };
  auto check = [&]() {
    size_t bad = 0;
    for (int r = 0; r < n; ++r) {
      std::vector<char> got = download(r, ag[r]->ptr, count * 4 * n);
      for (int p = 0; p < n; ++p) {
        bad += std::memcmp(got.data() + p * count * 4,
                           makeInput(DataType::kFloat32, p, count, ncclSum).data(), count * 4) != 0;
      }
      bad += download(r, bc[r]->ptr, count * 4) != makeInput(DataType::kFloat32, 1, count, ncclSum);
      std::vector<char> arGot = download(r, ar[r]->ptr, small * 4);
      for (size_t i = 0; i < small; ++i) {
        bad += loom::loadAsDouble(DataType::kFloat32, arGot.data(), i) !=
               reduced(DataType::kFloat32, ncclSum, n, i, false);
      }
      std::vector<char> bigGot = download(r, big[r]->ptr, count * 4);
      for (size_t i = 0; i < count; ++i) {
        bad += loom::loadAsDouble(DataType::kFloat32, bigGot.data(), i) !=
               reduced(DataType::kFloat32, ncclSum, n, i, false);
      }
    }
    return bad;
  };
  issue();
  R.sync();
  EXPECT_EQ(check(), 0u);
  // The same group captured on both streams.
  std::vector<cudaGraph_t> graphs(n);
  std::vector<cudaGraphExec_t> execs(n);
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(r);
    CUDA_OK(cudaStreamBeginCapture(R.streams[r], cudaStreamCaptureModeRelaxed));
  }
  issue();
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(r);
    CUDA_OK(cudaStreamEndCapture(R.streams[r], &graphs[r]));
    CUDA_OK(cudaGraphInstantiate(&execs[r], graphs[r], 0));
    cudaGraphDestroy(graphs[r]);
  }
  size_t bad = 0;
  for (int it = 0; it < 200; ++it) {
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(r);
      cudaMemsetAsync(ag[r]->ptr, 0xFF, count * 4 * n, R.streams[r]);
      cudaMemsetAsync(bc[r]->ptr, 0xFF, count * 4, R.streams[r]);
      cudaMemsetAsync(ar[r]->ptr, 0xFF, small * 4, R.streams[r]);
      cudaMemsetAsync(big[r]->ptr, 0xFF, count * 4, R.streams[r]);
      CUDA_OK(cudaGraphLaunch(execs[r], R.streams[r]));
    }
    R.sync();
    if (it % 40 == 0 || it == 199) bad += check();
  }
  EXPECT_EQ(bad, 0u);
  for (int r = 0; r < n; ++r) cudaGraphExecDestroy(execs[r]);
}

// More than 2 GPUs (issue 5's 4- and 8-GPU machines; a mesh takes up to 8): 3 of them,
// then every GPU of the machine, in one communicator each. Every collective, 1-, 2-, 4-
// and 8-byte types, sum, max and avg, one element to several pipeline rounds, in place
// and not, the first and the last rank as root. Skipped on 2-GPU machines.
TEST(GpuCollectives, MoreThanTwoGpus) {
  const int have = gpuCount();
  if (have < 3) GTEST_SKIP() << "needs 3 or more GPUs, this machine has " << have;
  std::vector<int> sizes = {3};
  if (std::min(have, 8) > 3) sizes.push_back(std::min(have, 8));
  for (int n : sizes) {
    Ranks R(n);
    for (Coll c : {Coll::kAllReduce, Coll::kReduce, Coll::kReduceScatter, Coll::kAllGather,
                   Coll::kBroadcast, Coll::kAllToAll}) {
      const bool reduces = c == Coll::kAllReduce || c == Coll::kReduce || c == Coll::kReduceScatter;
      for (DataType t :
           {DataType::kInt8, DataType::kFloat16, DataType::kFloat32, DataType::kFloat64}) {
        for (ncclRedOp_t op : {ncclSum, ncclMax, ncclAvg}) {
          if (!reduces && op != ncclSum) continue;
          for (size_t count : {size_t{1}, size_t{13}, size_t{70001}, (size_t{1} << 20) + 5}) {
            for (bool inPlace : {false, true}) {
              const int root = inPlace ? 0 : n - 1;
              EXPECT_EQ(runAndCheck(R, c, t, op, count, inPlace, 0, false, root), 0u)
                  << n << " GPUs, " << collName(c) << " " << loom::dataTypeName(t) << " op " << op
                  << " count " << count << (inPlace ? " in place" : "");
            }
          }
        }
      }
    }
  }
}

// More ranks than GPUs (LOOM_P2P_SHARE_GPU): the mesh's kernels for 3, 4 and 8 ranks, which
// 2-GPU machines cannot run otherwise, checked on however many GPUs there are (ranks
// round-robin over them; one GPU is enough). Every collective and form by size: LL,
// LL128 (forced), the slot kernels, and the copy-engine forms of ranks of one process.
// Correctness only: ranks that share a GPU share its SMs.
class MoreRanksThanGpusShareThem : public ::testing::TestWithParam<int> {
 protected:
  static std::vector<int> devices() { return roundRobinDevices(GetParam()); }
};

TEST_P(MoreRanksThanGpusShareThem, EveryCollectiveAndForm) {
  REQUIRE_GPUS(1);
  const int have = gpuCount();
  const int n = GetParam();
  for (const char* proto : {"", "ll128"}) {
    Ranks R(n, {{"LOOM_P2P_SHARE_GPU", "1"}, {"LOOM_PROTO", proto}, {"LOOM_TIMEOUT_MS", "60000"}},
            devices());
    for (Coll c : {Coll::kAllReduce, Coll::kReduce, Coll::kReduceScatter, Coll::kAllGather,
                   Coll::kBroadcast, Coll::kAllToAll}) {
      const bool reduces = c == Coll::kAllReduce || c == Coll::kReduce || c == Coll::kReduceScatter;
      if (*proto && !reduces) continue;  // LL128 carries the reducing collectives only
      for (DataType t :
           {DataType::kInt8, DataType::kFloat16, DataType::kFloat32, DataType::kFloat64}) {
        for (ncclRedOp_t op : {ncclSum, ncclMax, ncclAvg}) {
          if (!reduces && op != ncclSum) continue;
          for (size_t count : {size_t{1}, size_t{13}, size_t{70001}, (size_t{1} << 20) + 5,
                               (size_t{9} << 20) + 3}) {
            if (count > (size_t{1} << 21) && (t != DataType::kFloat32 || op != ncclSum)) continue;
            for (bool inPlace : {false, true}) {
              const int root = inPlace ? 0 : n - 1;
              EXPECT_EQ(runAndCheck(R, c, t, op, count, inPlace, 0, false, root), 0u)
                  << n << " ranks on " << have << " GPU(s)" << (*proto ? ", LL128" : "") << ", "
                  << collName(c) << " " << loom::dataTypeName(t) << " op " << op << " count "
                  << count << (inPlace ? " in place" : "");
            }
          }
        }
      }
    }
  }
}

// Send/Recv groups (every rank to every rank, itself included, several messages to one
// peer) and a CUDA graph of two all-reduces replayed 200 times, with 3, 4 and 8 ranks on
// however many GPUs there are.
TEST_P(MoreRanksThanGpusShareThem, SendRecvAndGraphs) {
  REQUIRE_GPUS(1);
  const int n = GetParam();
  Ranks R(n, {{"LOOM_P2P_SHARE_GPU", "1"}, {"LOOM_TIMEOUT_MS", "60000"}}, devices());
  for (size_t count : {size_t{1}, size_t{1000}, size_t{300007}}) {
    // in[r]: rank r's message; out[r][p]: what rank r received from rank p.
    std::vector<std::unique_ptr<DeviceBuffer>> in;
    std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> out(n);
    for (int r = 0; r < n; ++r) {
      in.push_back(std::make_unique<DeviceBuffer>(R.dev(r), count * 4));
      upload(R.dev(r), in[r]->ptr, makeInput(DataType::kInt32, r, count, ncclSum));
      for (int p = 0; p < n; ++p)
        out[r].push_back(std::make_unique<DeviceBuffer>(R.dev(r), count * 4));
    }
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k < n; ++k) {
        const int to = (r + k) % n, from = (r + n - k) % n;
        NCCL_OK(ncclSend(in[r]->ptr, count, ncclInt32, to, R.comms[r], R.streams[r]));
        NCCL_OK(ncclRecv(out[r][from]->ptr, count, ncclInt32, from, R.comms[r], R.streams[r]));
      }
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    R.sync();
    for (int r = 0; r < n; ++r) {
      for (int p = 0; p < n; ++p) {
        EXPECT_EQ(download(R.dev(r), out[r][p]->ptr, count * 4),
                  makeInput(DataType::kInt32, p, count, ncclSum))
            << n << " ranks, count " << count << ": rank " << r << " from rank " << p;
      }
    }
  }
  size_t bad = 0;
  replayAllReduceGraph(R, 200, 25, &bad);
  EXPECT_EQ(bad, 0u) << n << " ranks";
}

// Send/receive in place over the mesh: one buffer of one size to send from and receive into
// (nccl-tests' sendrecv in place) is right; a receive that overwrites part of a send the
// kernel cannot order is refused with ncclInvalidUsage naming it (mesh_plan.h), not raced.
TEST_P(MoreRanksThanGpusShareThem, SendRecvInPlaceOrRefused) {
  REQUIRE_GPUS(1);
  const int n = GetParam();
  {
    Ranks R(n, {{"LOOM_P2P_SHARE_GPU", "1"}, {"LOOM_TIMEOUT_MS", "60000"}}, devices());
    for (size_t count : {size_t{1}, size_t{1000}, size_t{3} << 20}) {
      std::vector<std::unique_ptr<DeviceBuffer>> buf;
      for (int r = 0; r < n; ++r) {
        buf.push_back(std::make_unique<DeviceBuffer>(R.dev(r), count * 4));
        upload(R.dev(r), buf[r]->ptr, makeInput(DataType::kInt32, r, count, ncclSum));
      }
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      for (int r = 0; r < n; ++r) {
        NCCL_OK(ncclSend(buf[r]->ptr, count, ncclInt32, (r + 1) % n, R.comms[r], R.streams[r]));
        NCCL_OK(ncclRecv(buf[r]->ptr, count, ncclInt32, (r + n - 1) % n, R.comms[r], R.streams[r]));
      }
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
      R.sync();
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(download(R.dev(r), buf[r]->ptr, count * 4),
                  makeInput(DataType::kInt32, (r + n - 1) % n, count, ncclSum))
            << n << " ranks, count " << count << ": rank " << r;
      }
    }
  }
  // Every rank receives into the second half of what it sends and beyond: refused on all.
  Ranks R(n, {{"LOOM_P2P_SHARE_GPU", "1"}, {"LOOM_TIMEOUT_MS", "20000"}}, devices());
  const size_t count = 1 << 20;
  std::vector<std::unique_ptr<DeviceBuffer>> buf;
  for (int r = 0; r < n; ++r) {
    buf.push_back(std::make_unique<DeviceBuffer>(R.dev(r), 2 * count * 4));
    upload(R.dev(r), buf[r]->ptr, makeInput(DataType::kInt32, r, 2 * count, ncclSum));
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    char* p = static_cast<char*>(buf[r]->ptr);
    NCCL_OK(ncclSend(p, count, ncclInt32, (r + 1) % n, R.comms[r], R.streams[r]));
    NCCL_OK(ncclRecv(p + count * 2, count, ncclInt32, (r + n - 1) % n, R.comms[r], R.streams[r]));
  }
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("cannot order"), std::string::npos)
      << ncclGetLastError(nullptr);
}

INSTANTIATE_TEST_SUITE_P(GpuCollectives, MoreRanksThanGpusShareThem, ::testing::Values(3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

TEST(GpuCollectives, MissingPeerTimesOutInsteadOfHanging) {
  REQUIRE_GPUS(2);
  setenv("LOOM_TIMEOUT_MS", "2000", 1);
  std::vector<ncclComm_t> comms(2);
  NCCL_OK(ncclCommInitAll(comms.data(), 2, nullptr));
  unsetenv("LOOM_TIMEOUT_MS");
  DeviceBuffer buf(0, 1 << 20);
  cudaSetDevice(0);
  cudaStream_t s;
  cudaStreamCreate(&s);
  // Only rank 0 calls: its kernel waits for rank 1, then gives up.
  NCCL_OK(ncclAllReduce(buf.ptr, buf.ptr, 1000, ncclFloat32, ncclSum, comms[0], s));
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(comms[0], &async), ncclSuccess);
  EXPECT_EQ(async, ncclRemoteError);
  EXPECT_NE(ncclAllReduce(buf.ptr, buf.ptr, 1000, ncclFloat32, ncclSum, comms[0], s), ncclSuccess);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("LOOM_TIMEOUT_MS"), std::string::npos)
      << ncclGetLastError(nullptr);
  cudaStreamDestroy(s);
  for (auto c : comms) ncclCommAbort(c);
}

}  // namespace
