// The hierarchical GPU forms across hosts (collectives/hierarchy.h): two copies of
// this binary, each a host of its own (LOOM_HOST_ID) holding two ranks on GPU 0
// (LOOM_P2P_SHARE_GPU=1 lets them form a GPU mesh there), four ranks in all. All-reduce,
// broadcast, reduce, all-gather and reduce-scatter take the hierarchical form (mesh in the
// host, the network between the rails), and all-to-all and send/receive go to the host's
// ranks over the mesh and to the other host's over the network. Every result is
// checked against the host's answer on small integers (exact in every type used), in place
// and out of place, for every root; a CUDA graph of a hierarchical all-reduce is replayed
// with its output poisoned between replays, and each rank driven from a thread of its own
// (the perf binaries' -t). The children's logs must show the form.
//
// Needs one GPU; skips with the reason where there is none. Without CUDA MPS the two
// processes take turns on the GPU, which makes it slow but not wrong.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/datatype.h"
#include "common/socket.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/support/free_port.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kHosts = 2, kLocal = 2, kRanks = kHosts * kLocal;

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Rank r's input element i: a small positive integer, so every sum, product and maximum
// of four is exact in float, bfloat16 (sums and maxima only), int32 and double.
double inputValue(int r, size_t i) {
  return double((i * 7 + size_t(r) * 13) % 17 + 1);
}

enum class Coll { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter };
const char* collName(Coll c) {
  switch (c) {
    case Coll::kAllReduce: return "all_reduce";
    case Coll::kBroadcast: return "broadcast";
    case Coll::kReduce: return "reduce";
    case Coll::kAllGather: return "all_gather";
    case Coll::kReduceScatter: return "reduce_scatter";
  }
  return "?";
}

double combine(ncclRedOp_t op, const double* v, bool integer) {
  double acc = v[0];
  for (int r = 1; r < kRanks; ++r) {
    switch (op) {
      case ncclSum:
      case ncclAvg: acc += v[r]; break;
      case ncclProd: acc *= v[r]; break;
      case ncclMax: acc = std::max(acc, v[r]); break;
      case ncclMin: acc = std::min(acc, v[r]); break;
      default: break;
    }
  }
  if (op == ncclAvg) acc = integer ? double(int64_t(acc) / kRanks) : acc / kRanks;
  return acc;
}

// The two ranks of this host (global ranks base, base + 1) and their streams.
struct Host {
  int base = 0;
  ncclComm_t comms[kLocal] = {};
  cudaStream_t streams[kLocal] = {};
};

// Runs one call on both local ranks and checks both outputs; the number of wrong elements.
size_t runAndCheck(Host& h, Coll c, loom::DataType t, ncclRedOp_t op, size_t count, bool inPlace,
                   int root) {
  const size_t es = loom::dataTypeSize(t);
  const bool integer = t == loom::DataType::kInt32;
  size_t inCount = count, outCount = count;
  if (c == Coll::kAllGather) outCount = count * kRanks;
  if (c == Coll::kReduceScatter) inCount = count * kRanks;
  const size_t bufCount = std::max(inCount, outCount);
  char* bufs[kLocal][2] = {};
  for (int l = 0; l < kLocal; ++l) {
    const int r = h.base + l;
    std::vector<char> host(inCount * es);
    for (size_t i = 0; i < inCount; ++i) loom::storeFromDouble(t, host.data(), i, inputValue(r, i));
    cudaMalloc(&bufs[l][0], bufCount * es + 64);
    cudaMalloc(&bufs[l][1], bufCount * es + 64);
    cudaMemset(bufs[l][0], 0xA5, bufCount * es + 64);
    cudaMemset(bufs[l][1], 0xA5, bufCount * es + 64);
    char* in = bufs[l][0];
    if (inPlace && c == Coll::kAllGather) in = bufs[l][0] + size_t(r) * count * es;
    cudaMemcpy(in, host.data(), inCount * es, cudaMemcpyHostToDevice);
  }
  cudaDeviceSynchronize();
  const auto dt = static_cast<ncclDataType_t>(t);
  ncclGroupStart();
  for (int l = 0; l < kLocal; ++l) {
    const int r = h.base + l;
    char* out = inPlace ? bufs[l][0] : bufs[l][1];
    const char* in = bufs[l][0];
    if (inPlace && c == Coll::kAllGather) in = out + size_t(r) * count * es;
    if (inPlace && c == Coll::kReduceScatter) out = bufs[l][0] + size_t(r) * count * es;
    switch (c) {
      case Coll::kAllReduce: ncclAllReduce(in, out, count, dt, op, h.comms[l], h.streams[l]); break;
      case Coll::kBroadcast:
        ncclBroadcast(in, out, count, dt, root, h.comms[l], h.streams[l]);
        break;
      case Coll::kReduce:
        // NCCL reads no output on the other ranks: they pass none.
        ncclReduce(in, r == root ? out : nullptr, count, dt, op, root, h.comms[l], h.streams[l]);
        break;
      case Coll::kAllGather: ncclAllGather(in, out, count, dt, h.comms[l], h.streams[l]); break;
      case Coll::kReduceScatter:
        ncclReduceScatter(in, out, count, dt, op, h.comms[l], h.streams[l]);
        break;
    }
  }
  if (ncclGroupEnd() != ncclSuccess) {
    ADD_FAILURE() << collName(c) << ": " << ncclGetLastError(nullptr);
    return 1;
  }
  size_t wrong = 0;
  for (int l = 0; l < kLocal; ++l) {
    if (cudaStreamSynchronize(h.streams[l]) != cudaSuccess) {
      ADD_FAILURE() << "stream of rank " << h.base + l << " failed";
      return 1;
    }
  }
  for (int l = 0; l < kLocal; ++l) {
    const int r = h.base + l;
    if (c == Coll::kReduce && r != root) continue;
    const char* out = inPlace ? bufs[l][0] : bufs[l][1];
    if (inPlace && c == Coll::kReduceScatter) out = bufs[l][0] + size_t(r) * count * es;
    std::vector<char> got(outCount * es);
    cudaMemcpy(got.data(), out, outCount * es, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < outCount; ++i) {
      double want = 0;
      double v[kRanks];
      switch (c) {
        case Coll::kAllReduce:
        case Coll::kReduce:
          for (int k = 0; k < kRanks; ++k) v[k] = inputValue(k, i);
          want = combine(op, v, integer);
          break;
        case Coll::kBroadcast: want = inputValue(root, i); break;
        case Coll::kAllGather: want = inputValue(int(i / count), i % count); break;
        case Coll::kReduceScatter:
          for (int k = 0; k < kRanks; ++k) v[k] = inputValue(k, size_t(r) * count + i);
          want = combine(op, v, integer);
          break;
      }
      const double g = loom::loadAsDouble(t, got.data(), i);
      if (g != want) {
        if (wrong < 3) {
          ADD_FAILURE() << collName(c) << " " << loom::dataTypeName(t) << " op " << op << " count "
                        << count << (inPlace ? " in place" : "") << " root " << root << ": rank "
                        << r << " element " << i << " is " << g << ", not " << want;
        }
        ++wrong;
      }
    }
  }
  for (int l = 0; l < kLocal; ++l) {
    cudaFree(bufs[l][0]);
    cudaFree(bufs[l][1]);
  }
  return wrong;
}

// A captured all-reduce of both local ranks, replayed with the output poisoned between
// replays: the wrong elements over every replay.
size_t graphReplays(Host& h, size_t count, int replays) {
  float* in[kLocal];
  float* out[kLocal];
  for (int l = 0; l < kLocal; ++l) {
    std::vector<float> host(count);
    for (size_t i = 0; i < count; ++i) host[i] = float(inputValue(h.base + l, i));
    cudaMalloc(&in[l], count * 4);
    cudaMalloc(&out[l], count * 4);
    cudaMemcpy(in[l], host.data(), count * 4, cudaMemcpyHostToDevice);
  }
  cudaGraph_t graphs[kLocal];
  cudaGraphExec_t execs[kLocal];
  for (int l = 0; l < kLocal; ++l)
    cudaStreamBeginCapture(h.streams[l], cudaStreamCaptureModeRelaxed);
  ncclGroupStart();
  for (int l = 0; l < kLocal; ++l)
    ncclAllReduce(in[l], out[l], count, ncclFloat32, ncclSum, h.comms[l], h.streams[l]);
  const ncclResult_t rc = ncclGroupEnd();
  bool captured = rc == ncclSuccess;
  for (int l = 0; l < kLocal; ++l) {  // every capture ends, whatever happened
    graphs[l] = nullptr;
    captured = cudaStreamEndCapture(h.streams[l], &graphs[l]) == cudaSuccess && captured;
  }
  for (int l = 0; l < kLocal && captured; ++l)
    captured = cudaGraphInstantiate(&execs[l], graphs[l], 0) == cudaSuccess;
  if (!captured) {
    ADD_FAILURE() << "capture failed: " << ncclGetLastError(nullptr) << " / "
                  << cudaGetErrorString(cudaGetLastError());
    return 1;
  }
  size_t wrong = 0;
  std::vector<float> got(count);
  for (int k = 0; k < replays; ++k) {
    for (int l = 0; l < kLocal; ++l) {
      cudaMemsetAsync(out[l], 0xA5, count * 4, h.streams[l]);
      cudaGraphLaunch(execs[l], h.streams[l]);
    }
    if (k % 25 != 24) continue;
    for (int l = 0; l < kLocal; ++l) {
      cudaStreamSynchronize(h.streams[l]);
      cudaMemcpy(got.data(), out[l], count * 4, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < count; ++i) {
        double v[kRanks];
        for (int r = 0; r < kRanks; ++r) v[r] = inputValue(r, i);
        if (got[i] != float(combine(ncclSum, v, false))) ++wrong;
      }
    }
  }
  for (int l = 0; l < kLocal; ++l) {
    cudaStreamSynchronize(h.streams[l]);
    cudaGraphExecDestroy(execs[l]);
    cudaGraphDestroy(graphs[l]);
    cudaFree(in[l]);
    cudaFree(out[l]);
  }
  return wrong;
}

// A captured all-gather replayed with eager all-gathers of other data between the replays,
// on the same streams, nothing waited for in between (both take the network executor's
// scratch memory in turn), every output poisoned before it is written and checked. Then a
// captured reduce-scatter the same way. The wrong elements.
size_t graphBesideEager(Host& h, size_t count, int replays) {
  constexpr int kBufs = 4;  // graph in, graph out, eager in, eager out
  struct Buffers {
    float* p[kLocal][kBufs] = {};
    ~Buffers() {
      for (auto& rank : p) {
        for (float* q : rank) cudaFree(q);
      }
    }
  } b;
  const size_t total = count * kRanks;
  for (int l = 0; l < kLocal; ++l) {
    std::vector<float> graphIn(total), eagerIn(total);
    for (size_t i = 0; i < total; ++i) {
      graphIn[i] = float(inputValue(h.base + l, i));
      eagerIn[i] = float(inputValue(h.base + l, i + 5));
    }
    for (float*& q : b.p[l]) {
      if (cudaMalloc(&q, total * 4) != cudaSuccess) {
        ADD_FAILURE() << "cudaMalloc: " << cudaGetErrorString(cudaGetLastError());
        return 1;
      }
    }
    cudaMemcpy(b.p[l][0], graphIn.data(), total * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(b.p[l][2], eagerIn.data(), total * 4, cudaMemcpyHostToDevice);
  }
  size_t wrong = 0;
  std::vector<float> got(total);
  for (Coll c : {Coll::kAllGather, Coll::kReduceScatter}) {
    auto issue = [&](int in, int out) {
      if (ncclGroupStart() != ncclSuccess) return false;
      for (int l = 0; l < kLocal; ++l) {
        if (c == Coll::kAllGather) {
          ncclAllGather(b.p[l][in], b.p[l][out], count, ncclFloat32, h.comms[l], h.streams[l]);
        } else {
          ncclReduceScatter(b.p[l][in], b.p[l][out], count, ncclFloat32, ncclSum, h.comms[l],
                            h.streams[l]);
        }
      }
      return ncclGroupEnd() == ncclSuccess;
    };
    cudaGraph_t graphs[kLocal];
    cudaGraphExec_t execs[kLocal];
    for (int l = 0; l < kLocal; ++l)
      cudaStreamBeginCapture(h.streams[l], cudaStreamCaptureModeRelaxed);
    bool captured = issue(0, 1);
    for (int l = 0; l < kLocal; ++l) {
      graphs[l] = nullptr;
      captured = cudaStreamEndCapture(h.streams[l], &graphs[l]) == cudaSuccess && captured;
    }
    for (int l = 0; l < kLocal && captured; ++l)
      captured = cudaGraphInstantiate(&execs[l], graphs[l], 0) == cudaSuccess;
    if (!captured) {
      ADD_FAILURE() << collName(c) << " capture failed: " << ncclGetLastError(nullptr);
      return 1;
    }
    const size_t outCount = c == Coll::kAllGather ? total : count;
    for (int k = 0; k < replays; ++k) {
      for (int l = 0; l < kLocal; ++l) {
        cudaMemsetAsync(b.p[l][1], 0xA5, outCount * 4, h.streams[l]);
        cudaGraphLaunch(execs[l], h.streams[l]);
        cudaMemsetAsync(b.p[l][3], 0xA5, outCount * 4, h.streams[l]);
      }
      if (!issue(2, 3)) {
        ADD_FAILURE() << collName(c) << " eager call: " << ncclGetLastError(nullptr);
        return 1;
      }
      if (k % 10 != 9) continue;
      for (int l = 0; l < kLocal; ++l) {
        const int rank = h.base + l;
        cudaStreamSynchronize(h.streams[l]);
        for (int which : {1, 3}) {
          const size_t shift = which == 1 ? 0 : 5;  // the eager input's values
          cudaMemcpy(got.data(), b.p[l][which], outCount * 4, cudaMemcpyDeviceToHost);
          for (size_t i = 0; i < outCount; ++i) {
            double want = 0;
            if (c == Coll::kAllGather) {
              want = inputValue(int(i / count), i % count + shift);
            } else {
              for (int r = 0; r < kRanks; ++r)
                want += inputValue(r, size_t(rank) * count + i + shift);
            }
            if (got[i] != float(want)) {
              if (wrong < 3) {
                ADD_FAILURE() << collName(c) << (which == 1 ? " replay " : " eager call ") << k
                              << ": rank " << rank << " element " << i << " is " << got[i]
                              << ", not " << want;
              }
              ++wrong;
            }
          }
        }
      }
    }
    for (int l = 0; l < kLocal; ++l) {
      cudaStreamSynchronize(h.streams[l]);
      cudaGraphExecDestroy(execs[l]);
      cudaGraphDestroy(graphs[l]);
    }
  }
  return wrong;
}

// Each local rank's input (inputValue, `count` floats) and output buffers on the GPU,
// freed at the end of the scope.
struct RankBuffers {
  float* in[kLocal] = {};
  float* out[kLocal] = {};
  ~RankBuffers() {
    for (int l = 0; l < kLocal; ++l) {
      cudaFree(in[l]);
      cudaFree(out[l]);
    }
  }
  // False (with a failure added) where an allocation or the upload failed.
  bool fill(const Host& h, size_t count) {
    for (int l = 0; l < kLocal; ++l) {
      std::vector<float> host(count);
      for (size_t i = 0; i < count; ++i) host[i] = float(inputValue(h.base + l, i));
      if (cudaMalloc(&in[l], count * 4) != cudaSuccess ||
          cudaMalloc(&out[l], count * 4) != cudaSuccess ||
          cudaMemcpy(in[l], host.data(), count * 4, cudaMemcpyHostToDevice) != cudaSuccess) {
        ADD_FAILURE() << "buffers of rank " << h.base + l << ": "
                      << cudaGetErrorString(cudaGetLastError());
        return false;
      }
    }
    return true;
  }
};

// As the perf binaries warm up: every size from 8 bytes to 64 MiB, three calls of each
// collective issued back to back (a group per call, nothing waited for between them),
// then the last results checked. Each size is new to the network plans, and the larger
// ones to the connections of further lanes; made while earlier calls' kernels wait for each
// other, they may stall the GPU (the hierarchical all_reduce_perf -g 2 stopped during such
// a warm-up on 2026-12-05). The wrong elements.
size_t backToBack(Host& h) {
  constexpr size_t kMaxCount = size_t{16} << 20;  // floats
  RankBuffers b;
  if (!b.fill(h, kMaxCount)) return 1;
  float** in = b.in;
  float** out = b.out;
  size_t wrong = 0;
  std::vector<float> got(kMaxCount);
  // All-gather and reduce-scatter move kRanks blocks of `count`: up to kMaxCount / kRanks.
  for (size_t count = 2; count <= kMaxCount && wrong == 0; count *= 2) {
    for (Coll c : {Coll::kAllReduce, Coll::kBroadcast, Coll::kAllGather, Coll::kReduceScatter}) {
      const bool blocks = c == Coll::kAllGather || c == Coll::kReduceScatter;
      if (blocks && count * kRanks > kMaxCount) continue;
      for (int k = 0; k < 3; ++k) {
        if (ncclGroupStart() != ncclSuccess) return 1;
        for (int l = 0; l < kLocal; ++l) {
          switch (c) {
            case Coll::kAllReduce:
              ncclAllReduce(in[l], out[l], count, ncclFloat32, ncclSum, h.comms[l], h.streams[l]);
              break;
            case Coll::kBroadcast:
              ncclBroadcast(in[l], out[l], count, ncclFloat32, 1, h.comms[l], h.streams[l]);
              break;
            case Coll::kAllGather:
              ncclAllGather(in[l], out[l], count, ncclFloat32, h.comms[l], h.streams[l]);
              break;
            default:
              ncclReduceScatter(in[l], out[l], count, ncclFloat32, ncclSum, h.comms[l],
                                h.streams[l]);
              break;
          }
        }
        if (ncclGroupEnd() != ncclSuccess) {
          ADD_FAILURE() << collName(c) << " of " << count << " floats, call " << k << ": "
                        << ncclGetLastError(nullptr);
          return 1;
        }
      }
      const size_t outCount = c == Coll::kAllGather ? count * kRanks : count;
      for (int l = 0; l < kLocal; ++l) {
        const int rank = h.base + l;
        if (cudaStreamSynchronize(h.streams[l]) != cudaSuccess) {
          ADD_FAILURE() << "stream of rank " << rank << " failed at " << collName(c) << " of "
                        << count << " floats";
          return 1;
        }
        cudaMemcpy(got.data(), out[l], outCount * 4, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < outCount; ++i) {
          double v[kRanks];
          double want = 0;
          switch (c) {
            case Coll::kAllReduce:
              for (int r = 0; r < kRanks; ++r) v[r] = inputValue(r, i);
              want = combine(ncclSum, v, false);
              break;
            case Coll::kBroadcast: want = inputValue(1, i); break;
            case Coll::kAllGather: want = inputValue(int(i / count), i % count); break;
            default:
              for (int r = 0; r < kRanks; ++r) v[r] = inputValue(r, size_t(rank) * count + i);
              want = combine(ncclSum, v, false);
              break;
          }
          if (got[i] != float(want)) {
            if (wrong < 3) {
              ADD_FAILURE() << collName(c) << " back to back, " << count << " floats: rank " << rank
                            << " element " << i << " is " << got[i] << ", not " << want;
            }
            ++wrong;
          }
        }
      }
    }
  }
  return wrong;
}

// As the perf binaries' -t 2 drives its ranks: a thread per local rank, each calling on
// its own communicator with no group around the two, sizes new to every plan (3 x 2^k
// floats, 24 B to 48 MiB, two calls each), each thread waiting only for its own stream
// before it checks. A rank whose thread makes a plan or a connection may then do so while
// the other rank's kernel of the same call already waits for it (the group's prepare step
// does not cover this). The wrong elements, or 1 for a call that failed.
size_t threadPerRank(Host& h) {
  constexpr size_t kMaxCount = size_t{3} << 22;
  RankBuffers b;
  if (!b.fill(h, kMaxCount)) return 1;
  size_t wrong[kLocal] = {};
  // One thread's failure stops the other at its next size (its calls would wait for the
  // failed rank); the other host's ranks then fail by LOOM_TIMEOUT_MS, not hang.
  std::atomic<bool> failed{false};
  auto body = [&](int l) {
    const int rank = h.base + l;
    cudaSetDevice(0);
    std::vector<float> got(kMaxCount);
    struct Stop {
      std::atomic<bool>& failed;
      size_t& wrong;
      ~Stop() {
        if (wrong != 0) failed = true;
      }
    } stop{failed, wrong[l]};
    for (size_t count = 6; count <= kMaxCount && wrong[l] == 0 && !failed; count *= 2) {
      for (int k = 0; k < 2; ++k) {
        if (ncclAllReduce(b.in[l], b.out[l], count, ncclFloat32, ncclSum, h.comms[l],
                          h.streams[l]) != ncclSuccess) {
          ADD_FAILURE() << "rank " << rank << ", its own thread: all_reduce of " << count
                        << " floats: " << ncclGetLastError(h.comms[l]);
          wrong[l] = 1;
          return;
        }
      }
      if (cudaStreamSynchronize(h.streams[l]) != cudaSuccess ||
          cudaMemcpy(got.data(), b.out[l], count * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
        ADD_FAILURE() << "rank " << rank << ", its own thread: stream failed at " << count
                      << " floats: " << cudaGetErrorString(cudaGetLastError());
        wrong[l] = 1;
        return;
      }
      for (size_t i = 0; i < count; ++i) {
        double v[kRanks];
        for (int r = 0; r < kRanks; ++r) v[r] = inputValue(r, i);
        if (got[i] != float(combine(ncclSum, v, false))) {
          if (wrong[l] < 3) {
            ADD_FAILURE() << "rank " << rank << ", its own thread, " << count << " floats: element "
                          << i << " is " << got[i];
          }
          ++wrong[l];
        }
      }
    }
  };
  std::vector<std::thread> threads;
  for (int l = 0; l < kLocal; ++l) threads.emplace_back(body, l);
  for (auto& t : threads) t.join();
  return wrong[0] + wrong[1];
}

// Point to point across the hosts, split by where the peer is (LOOM_ALGO=hier: the host's
// ranks over the mesh, the other host's over the network; without it, messages of 512 KiB
// and more): an all-to-all, in place and not; every rank sending a block to every rank
// (itself too) in one group of both local ranks' sends and receives; every rank sending
// its whole buffer to the next rank and receiving the previous one's into the same buffer,
// as nccl-tests' sendrecv does in place (rank 1 then sends over the network what rank 0
// overwrites over the mesh); and every rank sending every rank a block as two messages, a
// small one and then one over 512 KiB (by default the host's ranks get the first over the
// network and the second over the mesh, and must still match them in order). Rank r's
// block for rank q holds inputValue(r, q x block + i). The wrong elements, or 1 for a call
// that failed.
size_t pointToPoint(Host& h) {
  size_t wrong = 0;
  const size_t kBig = (size_t{512} << 10) / 4 + 5;  // floats: just over 512 KiB
  const char* names[] = {"all_to_all", "all_to_all in place", "send/recv", "send/recv in place",
                         "send/recv, a small and a large message a peer"};
  for (size_t count : {size_t{1}, size_t{1000}, size_t{100003}, size_t{1} << 20}) {
    for (int mode = 0; mode < 5; ++mode) {
      const bool inPlace = mode == 1 || mode == 3;
      const size_t block = mode == 4 ? count + kBig : count;
      RankBuffers b;
      if (!b.fill(h, block * kRanks)) return 1;
      if (ncclGroupStart() != ncclSuccess) return 1;
      for (int l = 0; l < kLocal; ++l) {
        float* out = inPlace ? b.in[l] : b.out[l];
        if (mode < 2) {
          ncclAlltoAll(b.in[l], out, count, ncclFloat32, h.comms[l], h.streams[l]);
          continue;
        }
        if (mode == 3) {
          const int rank = h.base + l;
          ncclSend(b.in[l], count * kRanks, ncclFloat32, (rank + 1) % kRanks, h.comms[l],
                   h.streams[l]);
          ncclRecv(b.in[l], count * kRanks, ncclFloat32, (rank + kRanks - 1) % kRanks, h.comms[l],
                   h.streams[l]);
          continue;
        }
        for (int q = 0; q < kRanks; ++q) {
          float* in = b.in[l] + size_t(q) * block;
          float* to = b.out[l] + size_t(q) * block;
          const size_t first = mode == 4 ? count : block;
          ncclSend(in, first, ncclFloat32, q, h.comms[l], h.streams[l]);
          ncclRecv(to, first, ncclFloat32, q, h.comms[l], h.streams[l]);
          if (mode == 4) {
            ncclSend(in + first, kBig, ncclFloat32, q, h.comms[l], h.streams[l]);
            ncclRecv(to + first, kBig, ncclFloat32, q, h.comms[l], h.streams[l]);
          }
        }
      }
      if (ncclGroupEnd() != ncclSuccess) {
        ADD_FAILURE() << names[mode] << " of " << count << " floats: " << ncclGetLastError(nullptr);
        return 1;
      }
      std::vector<float> got(block * kRanks);
      for (int l = 0; l < kLocal; ++l) {
        const int rank = h.base + l;
        if (cudaStreamSynchronize(h.streams[l]) != cudaSuccess ||
            cudaMemcpy(got.data(), inPlace ? b.in[l] : b.out[l], got.size() * 4,
                       cudaMemcpyDeviceToHost) != cudaSuccess) {
          ADD_FAILURE() << "rank " << rank << ": stream failed after point to point of " << count
                        << " floats: " << cudaGetErrorString(cudaGetLastError());
          return 1;
        }
        for (size_t e = 0; e < got.size(); ++e) {
          const int q = mode == 3 ? (rank + kRanks - 1) % kRanks : int(e / block);
          const float want =
              float(mode == 3 ? inputValue(q, e) : inputValue(q, size_t(rank) * block + e % block));
          if (got[e] != want) {
            if (wrong < 3) {
              ADD_FAILURE() << names[mode] << ", " << count << " floats: rank " << rank
                            << " element " << e << " (from rank " << q << ") is " << got[e]
                            << ", not " << want;
            }
            ++wrong;
          }
        }
      }
    }
  }
  return wrong;
}

// One host (run by GpuHier.TwoHostsOfTwoRanks through the environment).
TEST(GpuHier, OneHost) {
  const char* hostText = std::getenv("LOOM_TEST_HIER_HOST");
  if (!hostText) GTEST_SKIP() << "run by GpuHier.TwoHostsOfTwoRanks";
  Host h;
  h.base = std::atoi(hostText) * kLocal;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  // The streams before the communicators, as the perf binaries make them (CUDA gives a
  // process's streams its hardware queues in turn).
  for (auto& s : h.streams) CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);  // from LOOM_COMM_ID
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int l = 0; l < kLocal; ++l) ncclCommInitRank(&h.comms[l], kRanks, id, h.base + l);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  if (std::getenv("LOOM_TEST_HIER_P2P_ONLY")) {  // GpuHier.PointToPointByDefault
    EXPECT_EQ(pointToPoint(h), 0u);
    for (int l = 0; l < kLocal; ++l) {
      cudaStreamDestroy(h.streams[l]);
      EXPECT_EQ(ncclCommDestroy(h.comms[l]), ncclSuccess);
    }
    std::printf("host %d: done\n", h.base / kLocal);
    return;
  }
  // First, while every plan and every lane's connection is still to be made.
  EXPECT_EQ(backToBack(h), 0u);
  using loom::DataType;
  // Counts: 8 bytes, odd (all-reduce then declines the form), a few pieces, many pieces.
  const size_t counts[] = {2, 4099, 100002, (size_t{4} << 20) + 2};
  for (size_t count : counts) {
    for (bool inPlace : {false, true}) {
      EXPECT_EQ(runAndCheck(h, Coll::kAllReduce, DataType::kFloat32, ncclSum, count, inPlace, 0),
                0u);
    }
  }
  for (DataType t : {DataType::kInt32, DataType::kBfloat16, DataType::kFloat64}) {
    for (ncclRedOp_t op : {ncclSum, ncclMax, ncclMin, ncclAvg}) {
      EXPECT_EQ(runAndCheck(h, Coll::kAllReduce, t, op, 100002, false, 0), 0u);
    }
  }
  EXPECT_EQ(runAndCheck(h, Coll::kAllReduce, DataType::kInt32, ncclProd, 5000, true, 0), 0u);
  // ncclAvg on floats: 1/4 of each input in the host, summed across.
  EXPECT_EQ(runAndCheck(h, Coll::kAllReduce, DataType::kFloat32, ncclAvg, 100002, true, 0), 0u);
  // Odd counts keep the buffer whole on the root's rail; even ones that the model prices so
  // split it over both rails (model::hierSplitsRails: from a few KiB here).
  for (int root = 0; root < kRanks; ++root) {
    for (size_t count :
         {size_t{3}, size_t{100001}, (size_t{2} << 20) + 1, size_t{100002}, size_t{2} << 20}) {
      for (bool inPlace : {false, true}) {
        EXPECT_EQ(
            runAndCheck(h, Coll::kBroadcast, DataType::kFloat32, ncclSum, count, inPlace, root),
            0u);
        EXPECT_EQ(runAndCheck(h, Coll::kReduce, DataType::kFloat32, ncclSum, count, inPlace, root),
                  0u);
      }
    }
    for (size_t count : {size_t{7777}, size_t{77778}}) {
      EXPECT_EQ(runAndCheck(h, Coll::kReduce, DataType::kInt32, ncclAvg, count, false, root), 0u);
      EXPECT_EQ(runAndCheck(h, Coll::kReduce, DataType::kFloat32, ncclMax, count, false, root), 0u);
    }
  }
  for (Coll c : {Coll::kAllGather, Coll::kReduceScatter}) {
    for (size_t count : {size_t{1}, size_t{100001}, (size_t{1} << 20) + 3}) {
      for (bool inPlace : {false, true})
        EXPECT_EQ(runAndCheck(h, c, DataType::kFloat32, ncclSum, count, inPlace, 0), 0u);
    }
  }
  for (DataType t : {DataType::kInt32, DataType::kBfloat16, DataType::kFloat64}) {
    for (ncclRedOp_t op : {ncclSum, ncclMax, ncclAvg})
      EXPECT_EQ(runAndCheck(h, Coll::kReduceScatter, t, op, 5003, false, 0), 0u);
  }
  EXPECT_EQ(graphReplays(h, (size_t{1} << 20) + 2, 200), 0u);
  EXPECT_EQ(graphBesideEager(h, (size_t{1} << 18) + 3, 50), 0u);
  EXPECT_EQ(threadPerRank(h), 0u);
  EXPECT_EQ(pointToPoint(h), 0u);
  for (int l = 0; l < kLocal; ++l) {
    cudaStreamDestroy(h.streams[l]);
    EXPECT_EQ(ncclCommDestroy(h.comms[l]), ncclSuccess);
  }
  std::printf("host %d: done\n", h.base / kLocal);
}

// Runs GpuHier.OneHost as kHosts processes with `env` beside each one's own, and gives
// each host's log to `check` (after a failure is added where a host failed).
void runHosts(const std::vector<std::string>& env,
              const std::function<void(int host, const std::string& log)>& check) {
  const std::string address = loom::test::freeLoopbackAddress();
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int k = 0; k < kHosts; ++k) {
    logs.push_back("/tmp/loom_hier_" + std::to_string(getpid()) + "_" + std::to_string(k) + ".log");
    std::vector<std::string> all = {"LOOM_TEST_HIER_HOST=" + std::to_string(k),
                                    "LOOM_COMM_ID=" + address,
                                    "LOOM_HOST_ID=hier-host-" + std::to_string(k),
                                    "LOOM_P2P_SHARE_GPU=1",
                                    "LOOM_TIMEOUT_MS=60000",
                                    "LOOM_DEBUG=INFO",
                                    "LOOM_DEBUG_SUBSYS=INIT,COLL"};
    all.insert(all.end(), env.begin(), env.end());
    std::string why;
    const pid_t pid = loom::test::spawnSelf("GpuHier.OneHost", all, logs.back(), &why);
    ASSERT_GT(pid, 0) << why;
    pids.push_back(pid);
  }
  const auto start = Clock::now();
  for (int k = 0; k < kHosts; ++k) {
    int status = -1;
    while (waitpid(pids[k], &status, WNOHANG) != pids[k]) {
      if (Clock::now() - start > std::chrono::seconds(400)) {
        for (pid_t p : pids) kill(p, SIGKILL);
        waitpid(pids[k], &status, 0);
        status = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const std::string log = readFile(logs[k]);
    const bool passed = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
                        log.find("host " + std::to_string(k) + ": done") != std::string::npos;
    if (!passed) {
      ADD_FAILURE() << "host " << k << " failed (status " << status << "); the end of its log:\n"
                    << log.substr(log.size() > 8000 ? log.size() - 8000 : 0);
    }
    check(k, log);
    unlink(logs[k].c_str());
  }
}

TEST(GpuHier, TwoHostsOfTwoRanks) {
  REQUIRE_GPUS(1);
  runHosts({"LOOM_ALGO=hier"}, [](int k, const std::string& log) {
    // The forms it ran: the hierarchical one (LOOM_DEBUG=INFO says so per call).
    EXPECT_NE(log.find("hierarchical GPU forms: host"), std::string::npos) << "host " << k;
    for (const char* form :
         {"GPU AllReduce hierarchical", "GPU Broadcast hierarchical", "GPU Reduce hierarchical",
          "GPU AllGather hierarchical", "GPU ReduceScatter hierarchical"}) {
      EXPECT_NE(log.find(form), std::string::npos) << "host " << k << ": no \"" << form << "\"";
    }
    for (const char* split : {"GPU all-to-all", "with this host's ranks over the GPU mesh"}) {
      EXPECT_NE(log.find(split), std::string::npos) << "host " << k << ": no \"" << split << "\"";
    }
  });
}

// Without LOOM_ALGO: the host's ranks get messages of 512 KiB and more over the mesh, and
// smaller ones over the network, in the same groups.
TEST(GpuHier, PointToPointByDefault) {
  REQUIRE_GPUS(1);
  runHosts({"LOOM_TEST_HIER_P2P_ONLY=1"}, [](int k, const std::string& log) {
    EXPECT_NE(log.find("GPU all-to-all"), std::string::npos) << "host " << k;
    EXPECT_NE(log.find(" 0 send/receive message(s) with this host's ranks over the GPU mesh"),
              std::string::npos)
        << "host " << k << ": no group that sent everything over the network";
    EXPECT_NE(log.find(" 2 send/receive message(s) with this host's ranks over the GPU mesh"),
              std::string::npos)
        << "host " << k << ": no group that split by size";
  });
}

}  // namespace
