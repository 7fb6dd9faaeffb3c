// One rank of a randomized soak (scripts/soak.sh starts the ranks): every rank draws the
// same sequence of calls from one seed (collective, data type, reduction, count from 0 to
// about 2 M elements, root, in place or not, and now and then several calls in one group)
// and checks each result against what the inputs make it, element by element. Inputs are
// small positive integers, a function of the rank, the call and the index, so every sum,
// product, maximum and minimum is exact in every type; only ncclAvg on floats is compared
// within a bound (1e-6 relative for float, 1e-12 for double). Before a call the output is
// poisoned; after an out-of-place call the input must be unchanged.
//
//   loom_soak_check [--seconds S] [--calls N] [--seed X] [--max-count C]
//                   [--memory host|device] [--device D]
//
// With `--memory device` (a build with CUDA) the buffers are GPU memory on `--device D`
// (default 0), the calls on one stream, the results copied back to be checked.
//
// Stops after N calls or S seconds (the ranks vote every 8 calls), whichever comes first.
// Rank 0 prints progress every 10 s and a summary per collective at the end. A wrong
// element or a failed call prints the call's number and parameters (the seed and the
// number reproduce it) and exits 1.
#include <loom/launch.h>
#include <nccl.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/datatype.h"

#ifdef LOOM_SOAK_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

enum Coll {
  kAllReduce,
  kReduce,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kGather,
  kScatter,
  kSendRecv,
  kColls
};
const char* const kCollNames[kColls] = {"all_reduce", "reduce",         "broadcast",
                                        "all_gather", "reduce_scatter", "alltoall",
                                        "gather",     "scatter",        "sendrecv"};

struct TypeInfo {
  ncclDataType_t type;
  size_t size;
  const char* name;
  bool isFloat;
};
const std::array<TypeInfo, 6> kTypes = {{{ncclUint8, 1, "uint8", false},
                                         {ncclInt32, 4, "int32", false},
                                         {ncclInt64, 8, "int64", false},
                                         {ncclUint64, 8, "uint64", false},
                                         {ncclFloat32, 4, "float", true},
                                         {ncclFloat64, 8, "double", true}}};
constexpr int kMaxGroup = 4;  // calls in one group, at most

enum Op { kSum, kProd, kMax, kMin, kAvg, kPreMul, kOps };
const char* const kOpNames[kOps] = {"sum", "prod", "max", "min", "avg", "premulsum(2)"};

// One call of the sequence, the same on every rank.
struct Call {
  long index = 0;
  Coll coll = kAllReduce;
  const TypeInfo* type = nullptr;
  Op op = kSum;
  size_t count = 0;
  int root = 0;
  int shift = 0;  // send/recv: to rank + shift, from rank - shift
  bool inPlace = false;
  std::vector<unsigned char> send, recv;  // host copies (what is checked)
  unsigned char* dsend = nullptr;         // GPU buffers, with --memory device
  unsigned char* drecv = nullptr;
  ncclRedOp_t ncclOp = ncclSum;
};

// Input element i of `rank` for call `index`: small positive integers (1 or 2 for products,
// so that they stay exact in every type for up to 7 ranks of uint8 and 30 of int32).
int64_t value(const Call& c, int rank, size_t i) {
  const uint64_t h = static_cast<uint64_t>(rank) * 7 + i * 13 + static_cast<uint64_t>(c.index) * 3;
  return c.op == kProd ? 1 + static_cast<int64_t>(h % 2) : 1 + static_cast<int64_t>(h % 11);
}

// Element i of a buffer of type `t`, through the library's own element access.
void put(const TypeInfo& t, unsigned char* base, size_t i, int64_t v) {
  loom::storeFromDouble(static_cast<loom::DataType>(t.type), base, i, static_cast<double>(v));
}
double get(const TypeInfo& t, const unsigned char* base, size_t i) {
  return loom::loadAsDouble(static_cast<loom::DataType>(t.type), base, i);
}

// The reduction of element i over every rank's input at offset `at` + i, as the type
// holds it (uint8 wraps: its sums and products are taken modulo 256).
double reduced(const Call& c, int nranks, size_t at) {
  int64_t acc = value(c, 0, at);
  for (int r = 1; r < nranks; ++r) {
    const int64_t v = value(c, r, at);
    switch (c.op) {
      case kProd: acc *= v; break;
      case kMax: acc = std::max(acc, v); break;
      case kMin: acc = std::min(acc, v); break;
      default: acc += v; break;
    }
  }
  if (c.op == kPreMul) acc *= 2;
  if (c.type->type == ncclUint8) acc &= 0xff;
  if (c.op == kAvg) return static_cast<double>(acc) / nranks;
  return static_cast<double>(acc);
}

bool matches(const Call& c, double got, double want) {
  if (c.op != kAvg) return got == want;
  const double bound = c.type->type == ncclFloat32 ? 1e-6 : 1e-12;
  return std::fabs(got - want) <= bound * std::fabs(want);
}

std::string describe(const Call& c) {
  char text[200];
  std::snprintf(text, sizeof(text), "call %ld: %s %s %s, count %zu, root %d, shift %d, %s", c.index,
                kCollNames[c.coll], c.type->name, kOpNames[c.op], c.count, c.root, c.shift,
                c.inPlace ? "in place" : "out of place");
  return text;
}

struct Soak {
  ncclComm_t comm = nullptr;
  int rank = 0, n = 0;
  uint64_t seed = 1;
  size_t maxCount = size_t{1} << 21;
  std::array<long, kColls> calls{};
  std::array<double, kColls> bytes{};
  bool device = false;
  cudaStream_t stream = nullptr;
  std::vector<unsigned char*> pool;  // per call of a group: its send and its receive buffer
  size_t poolBytes = 0;

  ~Soak() {
#ifdef LOOM_SOAK_CUDA
    for (unsigned char* p : pool) cudaFree(p);
    if (stream) cudaStreamDestroy(stream);
#endif
  }

  // GPU memory for a group of up to `calls` calls of at most maxCount elements of 8 bytes
  // (the largest type), the stream, on `dev`; false with a message where that fails.
  bool openDevice(int dev, int calls) {
#ifdef LOOM_SOAK_CUDA
    poolBytes = maxCount * 8 + 64;
    bool ok = cudaSetDevice(dev) == cudaSuccess &&
              cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess;
    for (int i = 0; ok && i < 2 * calls; ++i) {
      void* p = nullptr;
      ok = cudaMalloc(&p, poolBytes) == cudaSuccess;
      pool.push_back(static_cast<unsigned char*>(p));
    }
    if (!ok)
      std::fprintf(stderr, "soak: GPU %d: %s\n", dev, cudaGetErrorString(cudaGetLastError()));
    return ok;
#else
    (void)dev;
    (void)calls;
    std::fprintf(stderr, "soak: --memory device needs a build with CUDA\n");
    return false;
#endif
  }

  // Whether any rank's time is up (a max all-reduce, in the soak's memory).
  bool vote(bool up, bool* any) {
    int mine = up ? 1 : 0, all = 0;
#ifdef LOOM_SOAK_CUDA
    if (device) {
      int* d = reinterpret_cast<int*>(pool[0]);
      if (cudaMemcpyAsync(d, &mine, sizeof(int), cudaMemcpyHostToDevice, stream) != cudaSuccess ||
          ncclAllReduce(d, d, 1, ncclInt32, ncclMax, comm, stream) != ncclSuccess ||
          cudaMemcpyAsync(&all, d, sizeof(int), cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
          cudaStreamSynchronize(stream) != cudaSuccess) {
        return false;
      }
      *any = all != 0;
      return true;
    }
#endif
    if (ncclAllReduce(&mine, &all, 1, ncclInt32, ncclMax, comm, nullptr) != ncclSuccess) {
      return false;
    }
    *any = all != 0;
    return true;
  }

  // With --memory device: the call's buffers (slot `slot` of the pool) get the host copies.
  bool upload(Call& c, int slot) {
#ifdef LOOM_SOAK_CUDA
    if (!device) return true;
    c.dsend = pool[2 * slot];
    c.drecv = pool[2 * slot + 1];
    // On the soak's stream, before the call: a cudaMemcpy from pageable memory may return
    // before its copy has landed, and the legacy stream it runs on does not order with a
    // non-blocking one (a late poison copy then overwrote results).
    return cudaMemcpyAsync(c.dsend, c.send.data(), c.send.size(), cudaMemcpyHostToDevice, stream) ==
               cudaSuccess &&
           cudaMemcpyAsync(c.drecv, c.recv.data(), c.recv.size(), cudaMemcpyHostToDevice, stream) ==
               cudaSuccess;
#else
    (void)c;
    (void)slot;
    return !device;
#endif
  }

  // After the stream has run the group: the host copies get what the GPU buffers hold.
  bool download(Call& c) {
#ifdef LOOM_SOAK_CUDA
    if (!device) return true;
    return cudaMemcpyAsync(c.send.data(), c.dsend, c.send.size(), cudaMemcpyDeviceToHost, stream) ==
               cudaSuccess &&
           cudaMemcpyAsync(c.recv.data(), c.drecv, c.recv.size(), cudaMemcpyDeviceToHost, stream) ==
               cudaSuccess &&
           cudaStreamSynchronize(stream) == cudaSuccess;
#else
    (void)c;
    return !device;
#endif
  }

  // The send and receive sizes (elements) of `c` on this rank.
  void sizes(const Call& c, size_t* sendElems, size_t* recvElems) const {
    const size_t k = c.count, all = k * static_cast<size_t>(n);
    switch (c.coll) {
      case kAllGather:
        *sendElems = k;
        *recvElems = all;
        break;
      case kReduceScatter:
        *sendElems = all;
        *recvElems = k;
        break;
      case kAllToAll:
        *sendElems = all;
        *recvElems = all;
        break;
      case kGather:
        *sendElems = k;
        *recvElems = rank == c.root ? all : 0;
        break;
      case kScatter:
        *sendElems = rank == c.root ? all : 0;
        *recvElems = k;
        break;
      default:
        *sendElems = k;
        *recvElems = k;
        break;
    }
  }

  Call draw(long index) const {
    std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(index));
    Call c;
    c.index = index;
    c.coll = static_cast<Coll>(rng() % kColls);
    c.type = &kTypes[rng() % kTypes.size()];
    const bool reduces = c.coll == kAllReduce || c.coll == kReduce || c.coll == kReduceScatter;
    c.op = reduces ? static_cast<Op>(rng() % kOps) : kSum;
    // ncclAvg and the pre-multiplied sum are taken on floats here (integer averages round).
    if (!c.type->isFloat && (c.op == kAvg || c.op == kPreMul)) c.op = kSum;
    if (c.op == kProd && n > (c.type->type == ncclUint8 ? 7 : 30)) c.op = kMax;
    // Counts: none, a few, up to 4 Ki, up to 256 Ki, up to maxCount (whole buffers of
    // n blocks stay under 8 times that).
    const unsigned cls = rng() % 100;
    const size_t cap =
        c.coll == kAllReduce || c.coll == kReduce || c.coll == kBroadcast || c.coll == kSendRecv
            ? maxCount
            : std::max<size_t>(1, maxCount / static_cast<size_t>(n));
    const size_t top = cls < 3 ? 0 : cls < 25 ? 16 : cls < 50 ? 4096 : cls < 82 ? 262144 : cap;
    c.count = top == 0 ? 0 : 1 + rng() % std::min(top, cap);
    c.root = static_cast<int>(rng() % static_cast<uint64_t>(n));
    c.shift = static_cast<int>(rng() % static_cast<uint64_t>(n));
    c.inPlace = c.coll != kAllToAll && rng() % 3 == 0;
    return c;
  }

  // Fills the input and poisons the output; the input is inside the output when in place.
  void prepare(Call& c) {
    size_t sendElems, recvElems;
    sizes(c, &sendElems, &recvElems);
    const TypeInfo& t = *c.type;
    c.recv.assign(std::max<size_t>(recvElems, 1) * t.size, 0xa5);
    c.send.assign(std::max<size_t>(sendElems, 1) * t.size, 0);
    for (size_t i = 0; i < sendElems; ++i) put(t, c.send.data(), i, value(c, rank, i));
    if (c.inPlace) inputInPlace(c, sendElems);
    if (c.op == kPreMul) {
      double two = 2.0;
      float twoF = 2.0f;
      void* scalar = t.type == ncclFloat32 ? static_cast<void*>(&twoF) : static_cast<void*>(&two);
      ncclRedOpCreatePreMulSum(&c.ncclOp, scalar, t.type, ncclScalarHostImmediate, comm);
    } else {
      const ncclRedOp_t ops[kOps] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, ncclSum};
      c.ncclOp = ops[c.op];
    }
  }

  // In place: the input goes where the call reads it inside the output buffer.
  void inputInPlace(Call& c, size_t sendElems) {
    const size_t b = c.type->size, k = c.count;
    switch (c.coll) {
      case kAllGather: std::memcpy(c.recv.data() + rank * k * b, c.send.data(), k * b); break;
      case kGather:
        if (rank == c.root) std::memcpy(c.recv.data() + rank * k * b, c.send.data(), k * b);
        break;
      case kReduceScatter:
      case kScatter: break;  // the output lies inside the input: the call reads `send`
      default: std::memcpy(c.recv.data(), c.send.data(), sendElems * b); break;
    }
  }

  // The buffers the call is given: on the GPU (`onDevice`, with --memory device) or the
  // host copies.
  void buffers(Call& c, bool onDevice, const void** in, void** out) {
    const size_t b = c.type->size, k = c.count;
    unsigned char* send = onDevice ? c.dsend : c.send.data();
    unsigned char* recv = onDevice ? c.drecv : c.recv.data();
    *in = send;
    *out = recv;
    if (!c.inPlace) return;
    switch (c.coll) {
      case kAllGather: *in = recv + rank * k * b; break;
      case kGather:
        if (rank == c.root) *in = recv + rank * k * b;
        break;
      case kReduceScatter: *out = send + rank * k * b; break;
      case kScatter:
        if (rank == c.root) *out = send + rank * k * b;
        break;
      default: *in = recv; break;
    }
  }

  ncclResult_t issue(Call& c) {
    const void* in;
    void* out;
    buffers(c, device, &in, &out);
    const ncclDataType_t t = c.type->type;
    const size_t k = c.count;
    switch (c.coll) {
      case kAllReduce: return ncclAllReduce(in, out, k, t, c.ncclOp, comm, stream);
      case kReduce: return ncclReduce(in, out, k, t, c.ncclOp, c.root, comm, stream);
      case kBroadcast: return ncclBroadcast(in, out, k, t, c.root, comm, stream);
      case kAllGather: return ncclAllGather(in, out, k, t, comm, stream);
      case kReduceScatter: return ncclReduceScatter(in, out, k, t, c.ncclOp, comm, stream);
      case kAllToAll: return ncclAlltoAll(in, out, k, t, comm, stream);
      case kGather: return ncclGather(in, out, k, t, c.root, comm, stream);
      case kScatter: return ncclScatter(in, out, k, t, c.root, comm, stream);
      default: {
        ncclGroupStart();
        ncclSend(in, k, t, (rank + c.shift) % n, comm, stream);
        ncclRecv(out, k, t, (rank + n - c.shift) % n, comm, stream);
        return ncclGroupEnd();
      }
    }
  }

  // What element i of the output must be; NaN where the output is not defined here.
  double want(const Call& c, size_t i) const {
    const size_t k = c.count;
    switch (c.coll) {
      case kAllReduce: return reduced(c, n, i);
      case kReduce: return rank == c.root ? reduced(c, n, i) : NAN;
      case kBroadcast: return static_cast<double>(value(c, c.root, i));
      case kAllGather:
      case kGather: return static_cast<double>(value(c, static_cast<int>(i / k), i % k));
      case kReduceScatter: return reduced(c, n, rank * k + i);
      case kAllToAll:
        return static_cast<double>(value(c, static_cast<int>(i / k), rank * k + i % k));
      case kScatter: return static_cast<double>(value(c, c.root, rank * k + i));
      default: return static_cast<double>(value(c, (rank + n - c.shift) % n, i));
    }
  }

  bool check(Call& c) {
    if (c.op == kPreMul) ncclRedOpDestroy(c.ncclOp, comm);
    size_t sendElems, recvElems;
    sizes(c, &sendElems, &recvElems);
    const void* in;
    void* out;
    buffers(c, /*onDevice=*/false, &in, &out);
    const TypeInfo& t = *c.type;
    // Reduce-scatter and scatter write one block, wherever it lies; the others their
    // receive size (none on a gather's other ranks).
    const size_t outElems = c.coll == kReduceScatter || c.coll == kScatter ? c.count : recvElems;
    const unsigned char* o = static_cast<const unsigned char*>(out);
    for (size_t i = 0; i < outElems; ++i) {
      const double w = want(c, i);
      if (std::isnan(w)) break;
      const double g = get(t, o, i);
      if (!matches(c, g, w)) {
        std::fprintf(stderr, "rank %d: %s: element %zu is %.17g, not %.17g (seed %llu)\n", rank,
                     describe(c).c_str(), i, g, w, static_cast<unsigned long long>(seed));
        return false;
      }
    }
    // Out of place, the input stays as it was.
    if (!c.inPlace) {
      for (size_t i = 0; i < sendElems; ++i) {
        if (get(t, c.send.data(), i) != static_cast<double>(value(c, rank, i))) {
          std::fprintf(stderr, "rank %d: %s: input element %zu was changed (seed %llu)\n", rank,
                       describe(c).c_str(), i, static_cast<unsigned long long>(seed));
          return false;
        }
      }
    }
    ++calls[c.coll];
    bytes[c.coll] += static_cast<double>(c.count * t.size);
    return true;
  }
};

}  // namespace

int main(int argc, char** argv) {
  double seconds = 60;
  long maxCalls = -1;
  int dev = 0;
  Soak s;
  for (int a = 1; a < argc; a += 2) {
    const char* v = a + 1 < argc ? argv[a + 1] : nullptr;
    if (v && std::strcmp(argv[a], "--seconds") == 0) {
      seconds = std::atof(v);
    } else if (v && std::strcmp(argv[a], "--calls") == 0) {
      maxCalls = std::atol(v);
    } else if (v && std::strcmp(argv[a], "--seed") == 0) {
      s.seed = std::strtoull(v, nullptr, 0);
    } else if (v && std::strcmp(argv[a], "--max-count") == 0) {
      s.maxCount = std::max<size_t>(1, std::strtoull(v, nullptr, 0));
    } else if (v && std::strcmp(argv[a], "--memory") == 0 &&
               (std::strcmp(v, "host") == 0 || std::strcmp(v, "device") == 0)) {
      s.device = std::strcmp(v, "device") == 0;
    } else if (v && std::strcmp(argv[a], "--device") == 0) {
      dev = std::atoi(v);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--seconds S] [--calls N] [--seed X] [--max-count ELEMENTS] "
                   "[--memory host|device] [--device D]\n",
                   argv[0]);
      return 2;
    }
  }
  // The GPU first: the communicator is made for the device current at init.
  if (s.device && !s.openDevice(dev, kMaxGroup)) return 1;
  if (loomCommInitFromEnv(&s.comm) != ncclSuccess) {
    std::fprintf(stderr, "soak: init failed: %s\n", ncclGetLastError(nullptr));
    return 1;
  }
  ncclCommUserRank(s.comm, &s.rank);
  ncclCommCount(s.comm, &s.n);
  const auto start = std::chrono::steady_clock::now();
  auto lastReport = start;
  const auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  long index = 0;
  bool stop = false;
  while (maxCalls < 0 || index < maxCalls) {
    // Now and then several calls in one group (send/recv already is one).
    std::mt19937_64 rng(s.seed + 0x51ed27ull * static_cast<uint64_t>(index));
    const int inGroup = rng() % 8 == 0 ? 2 + static_cast<int>(rng() % (kMaxGroup - 1)) : 1;
    std::vector<Call> group;
    for (int g = 0; g < inGroup && (maxCalls < 0 || index < maxCalls); ++g) {
      group.push_back(s.draw(index++));
      s.prepare(group.back());
      if (!s.upload(group.back(), g)) {
        std::fprintf(stderr, "rank %d: copying call %ld's buffers to the GPU failed\n", s.rank,
                     index - 1);
        return 1;
      }
    }
    if (group.size() > 1) ncclGroupStart();
    ncclResult_t rc = ncclSuccess;
    for (Call& c : group) {
      if (rc == ncclSuccess) rc = s.issue(c);
    }
    if (group.size() > 1) {
      const ncclResult_t end = ncclGroupEnd();
      if (rc == ncclSuccess) rc = end;
    }
    if (rc != ncclSuccess) {
      std::fprintf(stderr, "rank %d: %s%s failed: %s (seed %llu)\n", s.rank,
                   describe(group.front()).c_str(),
                   group.size() > 1 ? " (the first of a group)" : "", ncclGetLastError(s.comm),
                   static_cast<unsigned long long>(s.seed));
      return 1;
    }
    for (Call& c : group) {
      if (!s.download(c)) {
        std::fprintf(stderr, "rank %d: %s: copying the results back from the GPU failed\n", s.rank,
                     describe(c).c_str());
        return 1;
      }
      if (!s.check(c)) return 1;
    }
    if (s.rank == 0 && std::chrono::steady_clock::now() - lastReport > std::chrono::seconds(10)) {
      lastReport = std::chrono::steady_clock::now();
      double total = 0;
      for (double b : s.bytes) total += b;
      std::printf("soak: %ld calls right in %.0f s (%.2f GB of buffers)\n", index, elapsed(),
                  total / 1e9);
      std::fflush(stdout);
    }
    // Every 8 calls the ranks agree on whether to stop: the first whose time is up says so.
    if (index % 8 < static_cast<long>(group.size())) {
      if (!s.vote(elapsed() >= seconds, &stop)) {
        std::fprintf(stderr, "rank %d: the stop vote failed: %s\n", s.rank,
                     ncclGetLastError(s.comm));
        return 1;
      }
      if (stop) break;
    }
  }
  if (s.rank == 0) {
    std::printf("soak: %d ranks, seed %llu, %ld calls in %.1f s, every result right\n", s.n,
                static_cast<unsigned long long>(s.seed), index, elapsed());
    std::printf("%-15s %8s %12s\n", "collective", "calls", "MB");
    for (int k = 0; k < kColls; ++k)
      std::printf("%-15s %8ld %12.1f\n", kCollNames[k], s.calls[k], s.bytes[k] / 1e6);
  }
  if (ncclCommDestroy(s.comm) != ncclSuccess) {
    std::fprintf(stderr, "rank %d: destroy failed\n", s.rank);
    return 1;
  }
  return 0;
}
