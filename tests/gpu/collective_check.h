// What the GPU collective tests share: device buffers, ranks of one process with their
// streams, inputs whose exact results are known, and runAndCheck, which runs one
// collective on every rank and compares every output element with the reference.
#pragma once

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
#include "tests/gpu/gpu_test_util.h"

namespace loom::test {

// Ranks that share a GPU (MoreRanksThanGpusShareThem) each use a few streams, and CUDA
// maps a process's streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 unless
// set): past that, one rank's kernel can queue behind a peer's, which waits for it. Set
// before any CUDA call (a value already in the environment is kept), so for every test of
// this binary: more queues only take away false dependencies between streams.
[[maybe_unused]] inline const int kConnectionsSet = setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0);

struct DeviceBuffer {
  DeviceBuffer(int dev, size_t bytes) : dev(dev), bytes(bytes) {
    cudaSetDevice(dev);
    cudaMalloc(&ptr, bytes + 64);
    cudaMemset(ptr, 0xA5, bytes + 64);  // poison: unwritten output shows
    cudaDeviceSynchronize();            // before any non-blocking stream touches it (see upload())
  }
  ~DeviceBuffer() {
    cudaSetDevice(dev);
    cudaFree(ptr);
  }
  char* at(size_t offset) { return static_cast<char*>(ptr) + offset; }
  int dev;
  size_t bytes;
  void* ptr = nullptr;
};

struct Ranks {
  // `settings`: environment variables set while the communicators are created (loom reads
  // them at init), then unset. `devices`: rank r's GPU (default: GPU r).
  explicit Ranks(int n, std::initializer_list<std::pair<const char*, const char*>> settings = {},
                 std::vector<int> devices = {})
      : comms(n), streams(n), devs(std::move(devices)) {
    if (devs.empty()) {
      for (int r = 0; r < n; ++r) devs.push_back(r);
    }
    for (const auto& [name, value] : settings) setenv(name, value, 1);
    EXPECT_EQ(ncclCommInitAll(comms.data(), n, devs.data()), ncclSuccess)
        << ncclGetLastError(nullptr);
    for (const auto& [name, value] : settings) unsetenv(name);
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(dev(r));
      cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking);
    }
  }
  ~Ranks() {
    for (size_t r = 0; r < comms.size(); ++r) {
      cudaSetDevice(dev(static_cast<int>(r)));
      cudaStreamSynchronize(streams[r]);
      cudaStreamDestroy(streams[r]);
      ncclCommDestroy(comms[r]);
    }
    for (auto& p : pool) p.reset();
  }
  void sync() {
    for (size_t r = 0; r < comms.size(); ++r) {
      cudaSetDevice(dev(static_cast<int>(r)));
      EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    }
  }
  int n() const { return static_cast<int>(comms.size()); }
  int dev(int rank) const { return devs[rank]; }
  // Buffers reused across calls (kind 0: input, 1: output), poisoned before each use.
  char* buffer(int rank, int kind, size_t bytes) {
    auto& slot = pool[rank * 2 + kind];
    if (!slot || slot->bytes < bytes) slot = std::make_unique<DeviceBuffer>(dev(rank), bytes);
    cudaSetDevice(dev(rank));
    cudaMemset(slot->ptr, 0xA5, slot->bytes + 64);
    cudaDeviceSynchronize();
    return static_cast<char*>(slot->ptr);
  }
  std::unique_ptr<DeviceBuffer> pool[16];
  bool anyOrder = false;  // see tolerance()
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  std::vector<int> devs;
};

// Small integers: exact in every type (fp8 included) for sums and products of a few ranks.
inline double valueFor(int rank, size_t i, ncclRedOp_t op) {
  if (op == ncclProd) return ((rank + i) % 3 == 0) ? 2 : 1;
  return static_cast<double>((rank * 3 + i) % 4) + 1;  // 1..4
}

inline std::vector<char> makeInput(DataType t, int rank, size_t count, ncclRedOp_t op,
                                   size_t salt = 0) {
  std::vector<char> v(count * loom::dataTypeSize(t));
  for (size_t i = 0; i < count; ++i)
    loom::storeFromDouble(t, v.data(), i, valueFor(rank, i + salt, op));
  return v;
}

inline double combine(ncclRedOp_t op, double a, double b) {
  switch (op) {
    case ncclProd: return a * b;
    case ncclMax: return std::max(a, b);
    case ncclMin: return std::min(a, b);
    default: return a + b;
  }
}

// How far an average over n ranks on a floating-point type may be from `want`, the exact
// value: the kernels multiply each input by 1/n and sum, rounding to the type at every
// step. Exact for 2 ranks (the inputs are small integers; halves are exact in every type),
// which every 2-rank test keeps checking exactly; from 3 ranks, n units of the type's
// epsilon relative to `want`. Integers and the other ops must match exactly.
// `anyOrder`: the ranks' contributions are combined in the algorithm's order, not rank
// order (the network forms: a ring, recursive doubling): from 3 ranks, sums on the
// narrow floating-point types may then round differently from the reference, within
// the same bound.
inline double tolerance(DataType t, ncclRedOp_t op, int n, double want, bool anyOrder = false) {
  const bool summed = op == ncclAvg || (anyOrder && op == ncclSum);
  if (!summed || !loom::isFloatType(t) || n <= 2) return 0;
  double eps = 0;
  switch (t) {
    case DataType::kFloat16: eps = std::ldexp(1.0, -10); break;
    case DataType::kBfloat16: eps = std::ldexp(1.0, -7); break;
    case DataType::kFloat32: eps = std::ldexp(1.0, -23); break;
    case DataType::kFloat64: eps = std::ldexp(1.0, -52); break;
    case DataType::kFloat8e4m3: eps = std::ldexp(1.0, -3); break;
    case DataType::kFloat8e5m2: eps = std::ldexp(1.0, -2); break;
    default: break;
  }
  return n * eps * std::fabs(want);
}

// Reduction of element i over n ranks, as the op defines it (premul scalar 2 per rank),
// in rank order and rounded to the type after each operation, as the kernels do. That
// only matters from 3 ranks on fp8 e5m2, whose values near 8 are 8, 10 and 12: 4 + 3 + 2
// is 8 there. (Kernels that combine in another order meet fp8 with more than 2 ranks
// only in ncclAvg, whose tolerance on fp8 is wide: see tolerance().)
inline double reduced(DataType t, ncclRedOp_t op, int n, size_t i, bool premul, size_t salt = 0) {
  double acc = 0;
  char cell[8];  // one element of any type
  for (int r = 0; r < n; ++r) {
    double x = valueFor(r, i + salt, op);
    if (premul) x *= 2;
    acc = r == 0 ? x : combine(op, acc, x);
    loom::storeFromDouble(t, cell, 0, acc);
    acc = loom::loadAsDouble(t, cell, 0);
  }
  if (op == ncclAvg) acc = loom::isFloatType(t) ? acc / n : std::floor(acc / n);
  return acc;
}

// The bytes of a float sum over n ranks of `count` elements (makeInput's values).
inline std::vector<char> floatSums(int n, size_t count) {
  std::vector<char> want(count * 4);
  for (size_t i = 0; i < count; ++i) {
    loom::storeFromDouble(DataType::kFloat32, want.data(), i,
                          reduced(DataType::kFloat32, ncclSum, n, i, false));
  }
  return want;
}

inline std::vector<char> download(int dev, const void* p, size_t bytes) {
  std::vector<char> v(bytes);
  cudaSetDevice(dev);
  if (bytes) {
    EXPECT_EQ(cudaMemcpy(v.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return v;
}

// A copy from pageable memory may return before its DMA has landed, and the collectives
// run on non-blocking streams that do not wait for the legacy stream: wait for the device,
// or a rank's kernel may read its input (or a peer's) half written.
inline void upload(int dev, void* p, const std::vector<char>& v) {
  cudaSetDevice(dev);
  if (!v.empty()) {
    EXPECT_EQ(cudaMemcpy(p, v.data(), v.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

enum class Coll { kAllReduce, kReduce, kReduceScatter, kAllGather, kBroadcast, kAllToAll };
inline const char* collName(Coll c) {
  switch (c) {
    case Coll::kAllReduce: return "AllReduce";
    case Coll::kReduce: return "Reduce";
    case Coll::kReduceScatter: return "ReduceScatter";
    case Coll::kAllGather: return "AllGather";
    case Coll::kBroadcast: return "Broadcast";
    case Coll::kAllToAll: return "AlltoAll";
  }
  return "?";
}

// Runs one collective on every rank and checks every output element. Returns the
// number of wrong values (and reports the first few).
inline size_t runAndCheck(Ranks& R, Coll coll, DataType t, ncclRedOp_t op, size_t count,
                          bool inPlace, size_t misalign, bool premulDevice = false, int root = 1) {
  const int n = R.n();
  const size_t es = loom::dataTypeSize(t);
  const bool premul = op >= ncclNumOps;  // caller created a PreMulSum op (scalar 2)
  size_t inCount = count, outCount = count;
  if (coll == Coll::kReduceScatter) inCount = count * n;
  if (coll == Coll::kAllGather) outCount = count * n;
  if (coll == Coll::kAllToAll) inCount = outCount = count * n;
  root = root % n;
  std::vector<std::vector<char>> hostIn(n);
  std::vector<const void*> send(n);
  std::vector<void*> recv(n);
  for (int r = 0; r < n; ++r) {
    hostIn[r] = makeInput(t, r, inCount, premul ? ncclSum : op);
    char* out = R.buffer(r, 1, std::max(outCount, inCount) * es + misalign);
    char* in = R.buffer(r, 0, inCount * es + misalign);
    recv[r] = out + misalign;
    if (inPlace) {
      size_t off = coll == Coll::kAllGather ? r * count * es : 0;
      send[r] = out + misalign + off;
    } else {
      send[r] = in + misalign;
    }
    upload(R.dev(r), const_cast<void*>(send[r]), hostIn[r]);
  }
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ncclDataType_t dt = static_cast<ncclDataType_t>(t);
    ncclResult_t res = ncclSuccess;
    switch (coll) {
      case Coll::kAllReduce:
        res = ncclAllReduce(send[r], recv[r], count, dt, op, R.comms[r], R.streams[r]);
        break;
      case Coll::kReduce:
        res = ncclReduce(send[r], recv[r], count, dt, op, root, R.comms[r], R.streams[r]);
        break;
      case Coll::kReduceScatter:
        res = ncclReduceScatter(send[r], recv[r], count, dt, op, R.comms[r], R.streams[r]);
        break;
      case Coll::kAllGather:
        res = ncclAllGather(send[r], recv[r], count, dt, R.comms[r], R.streams[r]);
        break;
      case Coll::kBroadcast:
        res = ncclBroadcast(send[r], recv[r], count, dt, root, R.comms[r], R.streams[r]);
        break;
      case Coll::kAllToAll:
        res = ncclAlltoAll(send[r], recv[r], count, dt, R.comms[r], R.streams[r]);
        break;
    }
    EXPECT_EQ(res, ncclSuccess) << ncclGetLastError(nullptr);
  }
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  R.sync();
  size_t wrong = 0;
  std::vector<char> first;  // rank 0's output: an all-reduce's or all-gather's is every rank's
  for (int r = 0; r < n; ++r) {
    if (coll == Coll::kReduce && r != root) continue;
    std::vector<char> got = download(R.dev(r), recv[r], outCount * es);
    if (coll == Coll::kAllReduce || coll == Coll::kAllGather) {
      if (r == 0) {
        first = got;
      } else if (got != first) {
        ADD_FAILURE() << collName(coll) << " " << loom::dataTypeName(t) << " op " << op << " count "
                      << count << ": rank " << r << "'s result differs from rank 0's";
        ++wrong;
      }
    }
    for (size_t i = 0; i < outCount; ++i) {
      double want = 0;
      switch (coll) {
        case Coll::kAllReduce:
        case Coll::kReduce: want = reduced(t, op, n, i, premul); break;
        case Coll::kReduceScatter: want = reduced(t, op, n, r * count + i, premul); break;
        case Coll::kAllGather: want = valueFor(static_cast<int>(i / count), i % count, op); break;
        case Coll::kBroadcast: want = valueFor(root, i, op); break;
        case Coll::kAllToAll:
          want = valueFor(static_cast<int>(i / count), r * count + i % count, op);
          break;
      }
      double have = loom::loadAsDouble(t, got.data(), i);
      const double tol =
          premul && !R.anyOrder ? 0 : tolerance(t, premul ? ncclSum : op, n, want, R.anyOrder);
      if (have != want && !(std::fabs(have - want) <= tol)) {
        if (wrong < 3) {
          ADD_FAILURE() << collName(coll) << " " << loom::dataTypeName(t) << " op " << op
                        << " count " << count << (inPlace ? " in-place" : "") << " misalign "
                        << misalign << (premulDevice ? " (device scalar)" : "") << ": rank " << r
                        << " element " << i << " is " << have << ", want " << want;
        }
        ++wrong;
      }
    }
  }
  return wrong;
}

inline const DataType kAllTypes[] = {
    DataType::kInt8,    DataType::kUint8,    DataType::kInt32,      DataType::kUint32,
    DataType::kInt64,   DataType::kUint64,   DataType::kFloat16,    DataType::kFloat32,
    DataType::kFloat64, DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2};

// Captures, on each rank's stream on its own (one thread, so without a group), a graph of
// a small all-reduce (the LL path) and a larger one (counters and slots), replays it
// `replays` times with the outputs poisoned in between, and checks both outputs every
// `checkEvery` replays and after the last. `bad` counts the outputs found wrong.
// Every collective, type and op (ops on the reducing ones), counts 1, 13 and 70001, in
// place and not. Returns the wrong values found.
inline size_t everyCollectiveTypeAndOp(Ranks& R) {
  const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  size_t wrong = 0;
  for (DataType t : kAllTypes) {
    for (ncclRedOp_t op : ops) {
      for (Coll c : {Coll::kAllReduce, Coll::kReduce, Coll::kReduceScatter}) {
        for (size_t count : {size_t{1}, size_t{13}, size_t{70001}}) {
          wrong += runAndCheck(R, c, t, op, count, false, 0);
          wrong += runAndCheck(R, c, t, op, count, true, 0);
        }
      }
    }
    for (Coll c : {Coll::kAllGather, Coll::kBroadcast, Coll::kAllToAll}) {
      for (size_t count : {size_t{1}, size_t{13}, size_t{70001}}) {
        wrong += runAndCheck(R, c, t, ncclSum, count, false, 0);
        wrong += runAndCheck(R, c, t, ncclSum, count, true, 0);
      }
    }
  }
  return wrong;
}

// Max and min on special values (common/minmax.h's rule: NaN from either side gives NaN,
// -0 is below +0), every floating type, all-reduce, reduce-scatter and reduce, checked
// against the host kernels (loom::reduce, which follow the same rule) on every rank, and
// the all-reduce's result bitwise equal on every rank. kCounting: element i of rank r holds
// value number (i / 8^r) % 8 of the list below, so each of its 8^n combinations (up to 4
// ranks) appears once `count` reaches 8^n. kMixed: a hash of (i, r) picks the value, so
// every rank's value changes from element to element (a short count still mixes them all).
// `count` past the small-message forms too. Returns the wrong values found.
enum class SpecialPattern { kCounting, kMixed };
inline size_t maxMinOnSpecialValues(Ranks& R, size_t count,
                                    SpecialPattern pattern = SpecialPattern::kCounting) {
  const double nan = std::nan(""), inf = HUGE_VAL;
  const double vals[] = {nan, inf, -inf, 0.0, -0.0, 1.0, -1.0, 2.5};
  const int n = R.n();
  size_t wrong = 0;
  for (DataType t : kAllTypes) {
    if (!loom::isFloatType(t)) continue;
    const size_t es = loom::dataTypeSize(t);
    for (ncclRedOp_t op : {ncclMax, ncclMin}) {
      const loom::RedOp rop{op == ncclMax ? loom::RedKind::kMax : loom::RedKind::kMin};
      for (Coll coll : {Coll::kAllReduce, Coll::kReduceScatter, Coll::kReduce}) {
        const size_t inCount = coll == Coll::kReduceScatter ? count * n : count;
        std::vector<std::vector<char>> in(n);
        for (int r = 0; r < n; ++r) {
          in[r].resize(inCount * es);
          size_t stride = 1;
          for (int q = 0; q < r; ++q) stride *= 8;
          for (size_t i = 0; i < inCount; ++i) {
            uint64_t pick = (i / stride) % 8;
            if (pattern == SpecialPattern::kMixed) {
              uint64_t z = i * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(r + 1);
              z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
              z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
              pick = (z ^ (z >> 31)) % 8;
            }
            loom::storeFromDouble(t, in[r].data(), i, vals[pick]);
          }
        }
        // The reference: rank order on the host.
        std::vector<char> want = in[0];
        for (int r = 1; r < n; ++r)
          loom::reduce(t, rop, want.data(), want.data(), in[r].data(), inCount);
        const int root = n - 1;
        std::vector<void*> src(n), out(n);
        for (int r = 0; r < n; ++r) {
          src[r] = R.buffer(r, 0, inCount * es);
          out[r] = R.buffer(r, 1, inCount * es);
          upload(R.dev(r), src[r], in[r]);
        }
        EXPECT_EQ(ncclGroupStart(), ncclSuccess);
        for (int r = 0; r < n; ++r) {
          const auto dt = static_cast<ncclDataType_t>(t);
          ncclResult_t res = ncclSuccess;
          switch (coll) {
            case Coll::kAllReduce:
              res = ncclAllReduce(src[r], out[r], count, dt, op, R.comms[r], R.streams[r]);
              break;
            case Coll::kReduceScatter:
              res = ncclReduceScatter(src[r], out[r], count, dt, op, R.comms[r], R.streams[r]);
              break;
            default:
              res = ncclReduce(src[r], out[r], count, dt, op, root, R.comms[r], R.streams[r]);
              break;
          }
          EXPECT_EQ(res, ncclSuccess) << ncclGetLastError(nullptr);
        }
        EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
        R.sync();
        std::vector<char> first;
        for (int r = 0; r < n; ++r) {
          if (coll == Coll::kReduce && r != root) continue;
          const std::vector<char> got = download(R.dev(r), out[r], count * es);
          if (coll == Coll::kAllReduce && r == 0) first = got;
          if (coll == Coll::kAllReduce && r > 0 && got != first) {
            ADD_FAILURE() << collName(coll) << " " << loom::dataTypeName(t) << " op " << op
                          << ": rank " << r << "'s result is not bitwise rank 0's";
            ++wrong;
          }
          const size_t base = coll == Coll::kReduceScatter ? r * count : 0;
          for (size_t i = 0; i < count; ++i) {
            const double have = loom::loadAsDouble(t, got.data(), i);
            const double ref = loom::loadAsDouble(t, want.data(), base + i);
            const bool ok = std::isnan(ref) ? std::isnan(have)
                                            : std::memcmp(got.data() + i * es,
                                                          want.data() + (base + i) * es, es) == 0;
            if (!ok) {
              if (wrong < 5) {
                ADD_FAILURE() << collName(coll) << " " << loom::dataTypeName(t) << " op " << op
                              << " count " << count << ": rank " << r << " element " << i << " is "
                              << have << (std::signbit(have) ? " (sign set)" : "") << ", want "
                              << ref << (std::signbit(ref) ? " (sign set)" : "");
              }
              ++wrong;
            }
          }
        }
      }
    }
  }
  return wrong;
}

inline void replayAllReduceGraph(Ranks& R, int replays, int checkEvery, size_t* bad) {
  const int n = R.n();
  const size_t count = 300001;  // several blocks, odd
  const size_t small = 1001;
  std::vector<std::unique_ptr<DeviceBuffer>> in, out, out2;
  std::vector<cudaGraphExec_t> execs(n);
  for (int r = 0; r < n; ++r) {
    in.push_back(std::make_unique<DeviceBuffer>(R.dev(r), count * 4));
    out.push_back(std::make_unique<DeviceBuffer>(R.dev(r), count * 4));
    out2.push_back(std::make_unique<DeviceBuffer>(R.dev(r), small * 4));
    upload(R.dev(r), in[r]->ptr, makeInput(DataType::kFloat32, r, count, ncclSum));
  }
  for (int r = 0; r < n; ++r) {
    cudaSetDevice(R.dev(r));
    cudaGraph_t g;
    CUDA_OK(cudaStreamBeginCapture(R.streams[r], cudaStreamCaptureModeRelaxed));
    NCCL_OK(ncclAllReduce(in[r]->ptr, out2[r]->ptr, small, ncclFloat32, ncclSum, R.comms[r],
                          R.streams[r]));
    NCCL_OK(ncclAllReduce(in[r]->ptr, out[r]->ptr, count, ncclFloat32, ncclSum, R.comms[r],
                          R.streams[r]));
    CUDA_OK(cudaStreamEndCapture(R.streams[r], &g));
    CUDA_OK(cudaGraphInstantiate(&execs[r], g, 0));
    cudaGraphDestroy(g);
  }
  const std::vector<char> want = floatSums(n, count);
  const std::vector<char> head(want.begin(), want.begin() + small * 4);
  for (int it = 0; it < replays; ++it) {
    for (int r = 0; r < n; ++r) {
      cudaSetDevice(R.dev(r));
      cudaMemsetAsync(out[r]->ptr, 0xFF, count * 4, R.streams[r]);  // poison between replays
      cudaMemsetAsync(out2[r]->ptr, 0xFF, small * 4, R.streams[r]);
      CUDA_OK(cudaGraphLaunch(execs[r], R.streams[r]));
    }
    R.sync();
    if (it % checkEvery == 0 || it == replays - 1) {
      for (int r = 0; r < n; ++r) {
        *bad += download(R.dev(r), out[r]->ptr, count * 4) != want;
        *bad += download(R.dev(r), out2[r]->ptr, small * 4) != head;
      }
    }
  }
  for (int r = 0; r < n; ++r) cudaGraphExecDestroy(execs[r]);
}

// Rank r's GPU for n ranks: round-robin over the GPUs there are (ranks share them where
// there are fewer, with LOOM_P2P_SHARE_GPU).
inline std::vector<int> roundRobinDevices(int n) {
  std::vector<int> d;
  for (int r = 0; r < n; ++r) d.push_back(r % gpuCount());
  return d;
}

}  // namespace loom::test
