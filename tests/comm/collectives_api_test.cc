// Every collective through the C API on host memory, with ranks as threads of one
// process (ncclCommInitAll + groups, as nccl-tests' -g N runs) for several rank counts,
// types, ops, counts, and in-place and out-of-place buffers.
//
// Inputs are per-rank, per-index values; the reference reduces them in rank order with
// the same element arithmetic (exact for integers, a bound for floats).
#include <gtest/gtest.h>
#include <nccl.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/datatype.h"

namespace {

using loom::DataType;

struct Comms {
  explicit Comms(int n) : comms(n) {
    EXPECT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  }
  ~Comms() {
    for (auto c : comms) ncclCommDestroy(c);
  }
  std::vector<ncclComm_t> comms;
};

double valueFor(int rank, size_t i, ncclRedOp_t op, DataType t) {
  if (op == ncclProd) return ((rank + i) % 3 == 0) ? 2 : 1;     // products stay small
  double v = static_cast<double>((rank * 7 + i * 3) % 11) + 1;  // 1..11, never all equal
  if (t == DataType::kFloat8e4m3 || t == DataType::kFloat8e5m2)
    v = static_cast<double>((rank + i) % 4) + 1;
  return v;
}

// Tolerance for floats: the rank-order reference and the ring's order differ.
double tolerance(DataType t, double magnitude, int n) {
  double eps = 0;
  switch (t) {
    case DataType::kFloat16: eps = 1.0 / 1024; break;
    case DataType::kBfloat16: eps = 1.0 / 128; break;
    case DataType::kFloat8e4m3: eps = 1.0 / 8; break;
    case DataType::kFloat8e5m2: eps = 1.0 / 4; break;
    case DataType::kFloat32: eps = 1.2e-7; break;
    case DataType::kFloat64: eps = 2.3e-16; break;
    default: return 0;
  }
  return 2.0 * n * eps * magnitude + 1e-12;
}

struct Reference {
  // expected[r] for rank r's output.
  std::vector<std::vector<char>> expected;
};

// Reduces rank inputs in rank order into `out` (count elements) with loom's kernels.
std::vector<char> reduceRef(DataType t, ncclRedOp_t op, int n,
                            const std::vector<std::vector<char>>& ins, size_t offset,
                            size_t count) {
  const size_t es = loom::dataTypeSize(t);
  loom::RedOp rop;
  switch (op) {
    case ncclSum: rop.kind = loom::RedKind::kSum; break;
    case ncclProd: rop.kind = loom::RedKind::kProd; break;
    case ncclMax: rop.kind = loom::RedKind::kMax; break;
    case ncclMin: rop.kind = loom::RedKind::kMin; break;
    default:
      if (loom::isFloatType(t)) {
        rop.kind = loom::RedKind::kPreMulSum;
        rop.scalar = 1.0 / n;
      } else {
        rop.kind = loom::RedKind::kSumPostDiv;
        rop.divisor = n;
      }
  }
  std::vector<char> acc(count * es), tmp(count * es);
  if (count == 0) return acc;
  loom::applyPreOp(t, rop, acc.data(), ins[0].data() + offset * es, count);
  for (int r = 1; r < n; ++r) {
    loom::applyPreOp(t, rop, tmp.data(), ins[r].data() + offset * es, count);
    loom::reduce(t, rop, acc.data(), acc.data(), tmp.data(), count);
  }
  loom::applyPostOp(t, rop, acc.data(), acc.data(), count);
  return acc;
}

void expectClose(DataType t, const char* got, const char* want, size_t count, int n,
                 const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < count && bad < 5; ++i) {
    double g = loom::loadAsDouble(t, got, i), w = loom::loadAsDouble(t, want, i);
    double tol = tolerance(t, std::fabs(w) * n + 1, n);
    if (!(std::fabs(g - w) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " is " << g << ", expected " << w;
      ++bad;
    }
  }
}

enum class Coll {
  kAllReduce,
  kReduce,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kGather,
  kScatter
};

const char* collName(Coll c) {
  switch (c) {
    case Coll::kAllReduce: return "AllReduce";
    case Coll::kReduce: return "Reduce";
    case Coll::kBroadcast: return "Broadcast";
    case Coll::kAllGather: return "AllGather";
    case Coll::kReduceScatter: return "ReduceScatter";
    case Coll::kAllToAll: return "AllToAll";
    case Coll::kGather: return "Gather";
    case Coll::kScatter: return "Scatter";
  }
  return "?";
}

void runCase(Comms& cm, Coll coll, DataType t, ncclRedOp_t op, size_t count, bool inPlace,
             int root) {
  const int n = static_cast<int>(cm.comms.size());
  const size_t es = loom::dataTypeSize(t);
  size_t inCount = count, outCount = count;
  if (coll == Coll::kAllGather || coll == Coll::kGather) outCount = count * n;
  if (coll == Coll::kReduceScatter || coll == Coll::kScatter) inCount = count * n;
  if (coll == Coll::kAllToAll) inCount = outCount = count * n;
  std::vector<std::vector<char>> ins(n), outs(n);
  for (int r = 0; r < n; ++r) {
    ins[r].resize(inCount * es + 1);
    for (size_t i = 0; i < inCount; ++i)
      loom::storeFromDouble(t, ins[r].data(), i, valueFor(r, i, op, t));
    outs[r].assign(std::max(inCount, outCount) * es + 1, static_cast<char>(0x5a));  // poison
  }
  // In-place buffers follow NCCL's layouts.
  std::vector<const void*> send(n);
  std::vector<void*> recv(n);
  for (int r = 0; r < n; ++r) {
    if (inPlace) {
      size_t at = 0;
      if (coll == Coll::kAllGather || coll == Coll::kGather) at = r * count;
      std::memcpy(outs[r].data() + at * es, ins[r].data(), inCount * es);
      send[r] = outs[r].data() + at * es;
      recv[r] = outs[r].data();
      if (coll == Coll::kReduceScatter || coll == Coll::kScatter)
        recv[r] = outs[r].data() + r * count * es;
    } else {
      send[r] = ins[r].data();
      recv[r] = outs[r].data();
    }
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  auto dt = static_cast<ncclDataType_t>(t);
  for (int r = 0; r < n; ++r) {
    ncclComm_t c = cm.comms[r];
    ncclResult_t res = ncclSuccess;
    switch (coll) {
      case Coll::kAllReduce:
        res = ncclAllReduce(send[r], recv[r], count, dt, op, c, nullptr);
        break;
      case Coll::kReduce:
        res = ncclReduce(send[r], recv[r], count, dt, op, root, c, nullptr);
        break;
      case Coll::kBroadcast:
        res = ncclBroadcast(send[r], recv[r], count, dt, root, c, nullptr);
        break;
      case Coll::kAllGather: res = ncclAllGather(send[r], recv[r], count, dt, c, nullptr); break;
      case Coll::kReduceScatter:
        res = ncclReduceScatter(send[r], recv[r], count, dt, op, c, nullptr);
        break;
      case Coll::kAllToAll: res = ncclAlltoAll(send[r], recv[r], count, dt, c, nullptr); break;
      case Coll::kGather: res = ncclGather(send[r], recv[r], count, dt, root, c, nullptr); break;
      case Coll::kScatter: res = ncclScatter(send[r], recv[r], count, dt, root, c, nullptr); break;
    }
    ASSERT_EQ(res, ncclSuccess) << ncclGetLastError(c);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  std::string what = std::string(collName(coll)) + " " + loom::dataTypeName(t) + " op " +
                     std::to_string(op) + " n=" + std::to_string(n) +
                     " count=" + std::to_string(count) + (inPlace ? " in-place" : " out-of-place");
  for (int r = 0; r < n; ++r) {
    const char* got = static_cast<const char*>(recv[r]);
    switch (coll) {
      case Coll::kAllReduce: {
        auto want = reduceRef(t, op, n, ins, 0, count);
        expectClose(t, got, want.data(), count, n, what + " rank " + std::to_string(r));
        break;
      }
      case Coll::kReduce:
        if (r == root) {
          auto want = reduceRef(t, op, n, ins, 0, count);
          expectClose(t, got, want.data(), count, n, what);
        }
        break;
      case Coll::kReduceScatter: {
        auto want = reduceRef(t, op, n, ins, r * count, count);
        expectClose(t, got, want.data(), count, n, what + " rank " + std::to_string(r));
        break;
      }
      case Coll::kBroadcast:
        ASSERT_EQ(0, std::memcmp(got, ins[root].data(), count * es)) << what << " rank " << r;
        break;
      case Coll::kAllGather:
        for (int q = 0; q < n; ++q) {
          ASSERT_EQ(0, std::memcmp(got + q * count * es, ins[q].data(), count * es))
              << what << " block " << q;
        }
        break;
      case Coll::kAllToAll:
        for (int q = 0; q < n; ++q) {
          ASSERT_EQ(0,
                    std::memcmp(got + q * count * es, ins[q].data() + r * count * es, count * es))
              << what << " rank " << r << " block " << q;
        }
        break;
      case Coll::kGather:
        for (int q = 0; r == root && q < n; ++q) {
          ASSERT_EQ(0, std::memcmp(got + q * count * es, ins[q].data(), count * es))
              << what << " block " << q;
        }
        break;
      case Coll::kScatter:
        ASSERT_EQ(0, std::memcmp(got, ins[root].data() + r * count * es, count * es))
            << what << " rank " << r;
        break;
    }
  }
}

class ApiCollectives : public ::testing::TestWithParam<int> {};

TEST_P(ApiCollectives, AllCollectivesFloatAndInt) {
  const int n = GetParam();
  Comms cm(n);
  for (Coll coll : {Coll::kAllReduce, Coll::kReduce, Coll::kBroadcast, Coll::kAllGather,
                    Coll::kReduceScatter, Coll::kAllToAll, Coll::kGather, Coll::kScatter}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1009}, size_t{300007}}) {
      for (bool inPlace : {false, true}) {
        for (DataType t : {DataType::kFloat32, DataType::kInt32}) {
          runCase(cm, coll, t, ncclSum, count, inPlace, n - 1);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST_P(ApiCollectives, EveryTypeAndOp) {
  const int n = GetParam();
  Comms cm(n);
  for (int t = 0; t < loom::kNumDataTypes; ++t) {
    for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
      runCase(cm, Coll::kAllReduce, static_cast<DataType>(t), op, 1031, false, 0);
      runCase(cm, Coll::kReduceScatter, static_cast<DataType>(t), op, 67, true, 0);
      runCase(cm, Coll::kReduce, static_cast<DataType>(t), op, 129, false, n / 2);
      if (HasFatalFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ApiCollectives, ::testing::Values(1, 2, 3, 4, 7));

TEST(ApiCollectives, TreeAndRingAgreeOnLargeCounts) {
  for (const char* algo : {"ring", "tree"}) {
    setenv("LOOM_ALGO", algo, 1);
    Comms cm(5);
    runCase(cm, Coll::kAllReduce, DataType::kInt64, ncclSum, 3000017, false, 0);
    runCase(cm, Coll::kAllReduce, DataType::kFloat64, ncclSum, 1000003, true, 0);
    unsetenv("LOOM_ALGO");
  }
}

// Every collective over TCP, where sockets send results straight from user memory
// (in place too, where a buffer is both read and written), for counts of one piece and
// of many, and of 0 (one empty message around the ring).
TEST(ApiCollectives, AllCollectivesOverTcp) {
  setenv("LOOM_TRANSPORTS", "tcp", 1);
  for (int n : {3, 4}) {
    Comms cm(n);
    for (Coll coll : {Coll::kAllReduce, Coll::kReduce, Coll::kBroadcast, Coll::kAllGather,
                      Coll::kReduceScatter, Coll::kAllToAll}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{1009}, size_t{300007}}) {
        for (bool inPlace : {false, true}) {
          runCase(cm, coll, DataType::kFloat32, ncclSum, count, inPlace, n - 1);
          runCase(cm, coll, DataType::kFloat32, ncclAvg, count, inPlace, 0);
          runCase(cm, coll, DataType::kInt32, ncclAvg, count, inPlace, 0);
          if (HasFatalFailure()) break;
        }
      }
    }
  }
  unsetenv("LOOM_TRANSPORTS");
}

// Over TCP, a step that forwards what it receives unchanged (all-gather, broadcast, the
// all-reduce's gather half) has its pieces land straight in the output: many pieces per
// step (past the claim depth), in place and not, rings and trees, 1- and 4-byte types.
TEST(ApiCollectives, TcpReceivesIntoUserMemory) {
  setenv("LOOM_TRANSPORTS", "tcp", 1);
  for (const char* algo : {"ring", "tree"}) {
    setenv("LOOM_ALGO", algo, 1);
    Comms cm(4);
    for (Coll coll : {Coll::kAllReduce, Coll::kAllGather, Coll::kBroadcast, Coll::kReduceScatter}) {
      for (bool inPlace : {false, true}) {
        runCase(cm, coll, DataType::kFloat32, ncclSum, 2000003, inPlace, 1);
        runCase(cm, coll, DataType::kInt8, ncclMax, 1000003, inPlace, 3);
        if (HasFatalFailure()) break;
      }
    }
  }
  unsetenv("LOOM_ALGO");
  unsetenv("LOOM_TRANSPORTS");
}

// An all-reduce of 1031 elements of every type with every op, out of place.
void allReduceEveryTypeAndOp(Comms& cm) {
  for (int t = 0; t < loom::kNumDataTypes; ++t) {
    for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
      runCase(cm, Coll::kAllReduce, static_cast<DataType>(t), op, 1031, false, 0);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

// Direct all-reduce (the tuner's choice over sockets for 3-4 ranks), forced over shared
// memory too: every type and op, in and out of place, one piece and many.
TEST(ApiCollectives, DirectAllReduceEveryOp) {
  setenv("LOOM_ALGO", "direct", 1);
  for (const char* transports : {"shm", "tcp"}) {
    setenv("LOOM_TRANSPORTS", transports, 1);
    for (int n : {3, 4}) {
      Comms cm(n);
      allReduceEveryTypeAndOp(cm);
      for (bool inPlace : {false, true}) {
        for (size_t count : {size_t{1}, size_t{2}, size_t{300007}}) {
          runCase(cm, Coll::kAllReduce, DataType::kFloat32, ncclAvg, count, inPlace, 0);
          runCase(cm, Coll::kAllReduce, DataType::kInt32, ncclSum, count, inPlace, 0);
        }
      }
    }
  }
  unsetenv("LOOM_TRANSPORTS");
  unsetenv("LOOM_ALGO");
}

// Recursive doubling (the tuner's choice for small all-reduces over sockets), forced at
// every size, over shared memory and over TCP: every type and op, in and out of place,
// several pieces; and the result is bitwise the same on every rank.
TEST(ApiCollectives, DoublingAllReduceEveryOpAndBitwiseEqual) {
  setenv("LOOM_ALGO", "doubling", 1);
  for (const char* transports : {"shm", "tcp"}) {
    setenv("LOOM_TRANSPORTS", transports, 1);
    for (int n : {4, 8}) {
      Comms cm(n);
      allReduceEveryTypeAndOp(cm);
      for (bool inPlace : {false, true}) {
        runCase(cm, Coll::kAllReduce, DataType::kFloat32, ncclSum, 300007, inPlace, 0);
        runCase(cm, Coll::kAllReduce, DataType::kInt32, ncclSum, 1, inPlace, 0);
      }
      const size_t count = 4099;
      std::vector<std::vector<float>> in(n, std::vector<float>(count)),
          out(n, std::vector<float>(count));
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < count; ++i)
          in[r][i] = 1.0f / static_cast<float>(r * 13 + i % 31 + 3);
      }
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(ncclAllReduce(in[r].data(), out[r].data(), count, ncclFloat32, ncclSum,
                                cm.comms[r], nullptr),
                  ncclSuccess);
      }
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
      for (int r = 1; r < n; ++r) {
        EXPECT_EQ(0, std::memcmp(out[r].data(), out[0].data(), count * sizeof(float)))
            << transports << " n=" << n << ": rank " << r << " differs from rank 0";
      }
    }
  }
  unsetenv("LOOM_TRANSPORTS");
  unsetenv("LOOM_ALGO");
}

// Recursive halving (reduce-scatter) and doubling (all-gather), forced: over shared memory
// and over TCP, 4 and 8 ranks, every type and op, in and out of place, counts of 0, one
// element, one piece and many.
TEST(ApiCollectives, HalvingScatterAndDoublingGather) {
  setenv("LOOM_ALGO", "doubling", 1);
  for (const char* transports : {"shm", "tcp"}) {
    setenv("LOOM_TRANSPORTS", transports, 1);
    for (int n : {4, 8}) {
      Comms cm(n);
      for (int t = 0; t < loom::kNumDataTypes; ++t) {
        for (ncclRedOp_t op : {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg}) {
          runCase(cm, Coll::kReduceScatter, static_cast<DataType>(t), op, 67, false, 0);
          if (HasFatalFailure()) return;
        }
        runCase(cm, Coll::kAllGather, static_cast<DataType>(t), ncclSum, 67, false, 0);
      }
      for (bool inPlace : {false, true}) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{1009}, size_t{300007}}) {
          runCase(cm, Coll::kReduceScatter, DataType::kFloat32, ncclSum, count, inPlace, 0);
          runCase(cm, Coll::kReduceScatter, DataType::kInt32, ncclAvg, count, inPlace, 0);
          runCase(cm, Coll::kAllGather, DataType::kFloat32, ncclSum, count, inPlace, 0);
          runCase(cm, Coll::kAllGather, DataType::kInt8, ncclSum, count, inPlace, 0);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
  unsetenv("LOOM_TRANSPORTS");
  unsetenv("LOOM_ALGO");
}

TEST(ApiCollectives, PreMulSum) {
  const int n = 3;
  Comms cm(n);
  float scalar = 0.5f;
  std::vector<ncclRedOp_t> ops(n);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&ops[r], &scalar, ncclFloat32, ncclScalarHostImmediate,
                                       cm.comms[r]),
              ncclSuccess);
  }
  const size_t count = 513;
  std::vector<std::vector<float>> in(n, std::vector<float>(count)),
      out(n, std::vector<float>(count));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) in[r][i] = static_cast<float>(r + i % 5 + 1);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ncclAllReduce(in[r].data(), out[r].data(), count, ncclFloat32, ops[r], cm.comms[r],
                            nullptr),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += 0.5f * in[q][i];
      ASSERT_FLOAT_EQ(out[r][i], want);
    }
    EXPECT_EQ(ncclRedOpDestroy(ops[r], cm.comms[r]), ncclSuccess);
    EXPECT_EQ(ncclRedOpDestroy(ops[r], cm.comms[r]), ncclInvalidArgument);
  }
}

// Gather and scatter to a root that is not the last rank, and their argument checks
// (named by the call, before any message of their group is queued).
TEST(ApiCollectives, GatherScatterRootsAndErrors) {
  const int n = 3;
  Comms cm(n);
  for (int root = 0; root < n; ++root) {
    runCase(cm, Coll::kGather, DataType::kInt32, ncclSum, 1001, false, root);
    runCase(cm, Coll::kScatter, DataType::kFloat64, ncclSum, 1001, true, root);
    if (HasFatalFailure()) return;
  }
  std::vector<int> buf(3 * 8, 1);
  EXPECT_EQ(ncclGather(buf.data(), buf.data(), 8, ncclInt32, n, cm.comms[0], nullptr),
            ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(cm.comms[0])).find("ncclGather: root 3 out of range"),
            std::string::npos)
      << ncclGetLastError(cm.comms[0]);
  EXPECT_EQ(ncclScatter(nullptr, buf.data(), 8, ncclInt32, 0, cm.comms[0], nullptr),
            ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(cm.comms[0])).find("ncclScatter: sendbuff is NULL"),
            std::string::npos)
      << ncclGetLastError(cm.comms[0]);
  // The ranks other than the root pass no buffer on the side they do not use.
  std::vector<std::vector<int>> mine(n, std::vector<int>(8)), got(n, std::vector<int>(8, -1));
  std::vector<int> all(n * 8, -1);
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < 8; ++i) mine[r][i] = 10 * r + i;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ncclGather(mine[r].data(), r == 1 ? all.data() : nullptr, 8, ncclInt32, 1,
                         cm.comms[r], nullptr),
              ncclSuccess)
        << ncclGetLastError(cm.comms[r]);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ncclScatter(r == 1 ? all.data() : nullptr, got[r].data(), 8, ncclInt32, 1,
                          cm.comms[r], nullptr),
              ncclSuccess)
        << ncclGetLastError(cm.comms[r]);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < n; ++r) EXPECT_EQ(got[r], mine[r]) << "rank " << r;
}

TEST(ApiCollectives, SendRecvRingAndSelf) {
  const int n = 4;
  Comms cm(n);
  const size_t count = 200003;
  std::vector<std::vector<int>> in(n, std::vector<int>(count)), out(n, std::vector<int>(count, -1)),
      self(n, std::vector<int>(count, -1));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) in[r][i] = r * 100000 + static_cast<int>(i);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ncclSend(in[r].data(), count, ncclInt32, (r + 1) % n, cm.comms[r], nullptr),
              ncclSuccess);
    ASSERT_EQ(ncclRecv(out[r].data(), count, ncclInt32, (r + n - 1) % n, cm.comms[r], nullptr),
              ncclSuccess);
    ASSERT_EQ(ncclSend(in[r].data(), count, ncclInt32, r, cm.comms[r], nullptr), ncclSuccess);
    ASSERT_EQ(ncclRecv(self[r].data(), count, ncclInt32, r, cm.comms[r], nullptr), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(out[r], in[(r + n - 1) % n]) << "rank " << r;
    EXPECT_EQ(self[r], in[r]) << "rank " << r;
  }
}

// In place, as nccl-tests' sendrecv runs it: every rank sends its buffer to the next and
// receives the previous one's into the same buffer, over shared memory and over TCP, many
// pieces long. The receives land while the sends still read; each send must see its
// rank's own bytes (the soak found it: the sends read bytes already overwritten).
TEST(ApiCollectives, SendRecvInPlace) {
  const int n = 4;
  const size_t count = size_t{1} << 21;
  for (const char* transports : {"", "tcp"}) {
    if (*transports) setenv("LOOM_TRANSPORTS", transports, 1);
    Comms cm(n);
    for (int round = 0; round < 3; ++round) {
      std::vector<std::vector<int>> buf(n, std::vector<int>(count));
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i) buf[r][i] = r * 10000000 + round + static_cast<int>(i);
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ(ncclSend(buf[r].data(), count, ncclInt32, (r + 1) % n, cm.comms[r], nullptr),
                  ncclSuccess);
        ASSERT_EQ(ncclRecv(buf[r].data(), count, ncclInt32, (r + n - 1) % n, cm.comms[r], nullptr),
                  ncclSuccess);
      }
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
      for (int r = 0; r < n; ++r) {
        const int from = (r + n - 1) % n;
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(buf[r][i], from * 10000000 + round + static_cast<int>(i))
              << (*transports ? transports : "default transports") << ", round " << round
              << ": rank " << r << " element " << i;
        }
      }
    }
    unsetenv("LOOM_TRANSPORTS");
  }
}

// A Send, a collective and the matching Recv in one group: the Send/Recv calls progress
// together (run as one batch), so neither rank waits for a Recv queued behind the
// collective. The messages are larger than a connection's FIFO.
TEST(ApiCollectives, SendThenCollectiveThenRecvInOneGroup) {
  const int n = 2;
  Comms cm(n);
  const size_t count = size_t{3} << 20;  // 12 MiB of int32
  std::vector<std::vector<int>> in(n, std::vector<int>(count)), out(n, std::vector<int>(count, -1));
  std::vector<std::vector<int>> x(n, std::vector<int>(1000)), y(n, std::vector<int>(1000, -1));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) in[r][i] = r * 7 + static_cast<int>(i % 1000003);
    for (size_t i = 0; i < 1000; ++i) x[r][i] = r + static_cast<int>(i);
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ncclSend(in[r].data(), count, ncclInt32, 1 - r, cm.comms[r], nullptr), ncclSuccess);
    ASSERT_EQ(
        ncclAllReduce(x[r].data(), y[r].data(), 1000, ncclInt32, ncclSum, cm.comms[r], nullptr),
        ncclSuccess);
    ASSERT_EQ(ncclRecv(out[r].data(), count, ncclInt32, 1 - r, cm.comms[r], nullptr), ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(out[r], in[1 - r]) << "rank " << r;
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(y[r][i], 1 + 2 * static_cast<int>(i));
  }
}

// More messages to one peer in one group than a channel has slots, both ways at once.
TEST(ApiCollectives, ManySendsToOnePeerInOneGroup) {
  const int n = 2, k = 9;
  Comms cm(n);
  const size_t count = 300007;
  std::vector<std::vector<std::vector<int>>> in(n), out(n);
  for (int r = 0; r < n; ++r) {
    for (int m = 0; m < k; ++m) {
      in[r].emplace_back(count);
      out[r].emplace_back(count, -1);
      for (size_t i = 0; i < count; ++i) in[r][m][i] = r * 1000 + m * 10 + static_cast<int>(i % 7);
    }
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    for (int m = 0; m < k; ++m) {
      ASSERT_EQ(ncclSend(in[r][m].data(), count, ncclInt32, 1 - r, cm.comms[r], nullptr),
                ncclSuccess);
    }
    for (int m = 0; m < k; ++m) {
      ASSERT_EQ(ncclRecv(out[r][m].data(), count, ncclInt32, 1 - r, cm.comms[r], nullptr),
                ncclSuccess);
    }
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    for (int m = 0; m < k; ++m)
      EXPECT_EQ(out[r][m], in[1 - r][m]) << "rank " << r << " message " << m;
  }
}

TEST(ApiCollectives, UnalignedBuffers) {
  const int n = 3;
  Comms cm(n);
  const size_t count = 10007;
  std::vector<std::vector<char>> in(n, std::vector<char>(count * 4 + 3)),
      out(n, std::vector<char>(count * 4 + 3));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) {
      int v = r + static_cast<int>(i % 13);
      std::memcpy(in[r].data() + 1 + i * 4, &v, 4);
    }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ncclAllReduce(in[r].data() + 1, out[r].data() + 3, count, ncclInt32, ncclMax,
                            cm.comms[r], nullptr),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (size_t i = 0; i < count; ++i) {
    int got;
    std::memcpy(&got, out[1].data() + 3 + i * 4, 4);
    ASSERT_EQ(got, n - 1 + static_cast<int>(i % 13));
  }
}

}  // namespace
