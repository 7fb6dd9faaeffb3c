// The mesh executor's kernels (see mesh.h for the protocol).
//
// Reads top to bottom: the counters and their waits, the pulled kernels' data loop, one
// function per collective, and the kernel with its launcher (the element traits and the
// block-wide data mover `reduceCopy` are in reduce_copy_device.cuh). One kernel is
// instantiated per element type; the collective and the reduction are uniform run-time
// branches.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "collectives/device/mesh.h"
#include "collectives/device/reduce_copy_device.cuh"

namespace loom::collectives::device {

namespace {

using namespace detail;  // the element traits, counters and reduceCopy

// ---- Programmatic dependent launch (sm_90+; MeshContext::pdl). ----
// With `pdl` a kernel is launched so that it may be scheduled before the kernel ahead of
// it on the stream has finished: as soon as every block of that one has let it
// (releaseStreamSuccessor) or exited. So every kernel's first act is to wait until the
// kernel ahead of it has completed and its memory is visible (PTX griddepcontrol.wait; it
// returns at once when nothing is pending, as without `pdl`). While it waits, the early
// grid holds its blocks' SM slots, which work on other streams could use: so a long kernel
// lets its successor in only near its end (the pulled all-reduce after its data, before
// the leave handshake), and only short ones at their start (LL, the barrier, the chunk
// counters). What it saves is the launch latency between two calls on one stream. A
// caller's kernel launched the same way behind ours is under the same rule: nothing of
// ours is visible to it before its own wait.
__device__ __forceinline__ void awaitStreamPredecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void releaseStreamSuccessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// ---- Counters. ----

__device__ __forceinline__ uint64_t* readyFlag(char* window, int from, int block, int maxBlocks) {
  return reinterpret_cast<uint64_t*>(window + (size_t(from) * maxBlocks + block) * kFlagStride);
}
__device__ __forceinline__ uint64_t* ackFlag(char* window, int to, int block, int maxBlocks) {
  return reinterpret_cast<uint64_t*>(window +
                                     (size_t(kMaxRanks + to) * maxBlocks + block) * kFlagStride);
}
__device__ __forceinline__ char* slotPtr(const Geometry& g, char* window, int from, int block,
                                         uint64_t seq) {
  size_t index = size_t(block) * g.slots + size_t(seq % g.slots);
  return window + g.senderSlotsOffset(from) + index * g.slotBytes;
}

__device__ __forceinline__ void storeLL(char* p, uint64_t a, uint64_t b) {
  asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(p), "l"(a), "l"(b) : "memory");
}
__device__ __forceinline__ void loadLL(const char* p, uint64_t* a, uint64_t* b) {
  asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];"
               : "=l"(*a), "=l"(*b)
               : "l"(p)
               : "memory");
}
__device__ __forceinline__ char* llRegion(const Geometry& g, char* window, int from, int block,
                                          int parity) {
  return window + g.flagBytes() + ((size_t(from) * kLLBlocks + block) * 2 + parity) * kLLRegion;
}

__device__ __forceinline__ char* ll128Region(const Geometry& g, char* window, int from, int block,
                                             int parity) {
  return window + g.ll128Offset() +
         ((size_t(from) * kLLBlocks + block) * 2 + parity) * size_t(g.ll128Lines) * kLL128Line;
}

// Per-block channel state, in shared memory.
struct Block {
  uint64_t sent[kMaxRanks];
  uint64_t recvd[kMaxRanks];
  int fail;
};

// One waiter's patience: every `mask + 1` polls it checks the host's abort flag and the
// clock, and on abort or timeout leaves the reason in the error flag and says to stop.
struct Patience {
  uint64_t spins = 0;
  uint64_t start = 0;
  __device__ bool exhausted(const MeshContext& c, uint64_t mask) {
    if ((++spins & mask) != 0) return false;
    if (*c.abortFlag) {
      atomicCAS(c.errorFlag, 0, kMeshErrorAborted);
      __threadfence_system();
      return true;
    }
    uint64_t now = globalTimer();
    if (start == 0) {
      start = now;
    } else if (c.timeoutNs && now - start > c.timeoutNs) {
      atomicCAS(c.errorFlag, 0, kMeshErrorTimeout);
      __threadfence_system();
      return true;
    }
    return false;
  }
};

// One thread. Spins until *flag >= target; gives up on abort or timeout.
__device__ bool waitAtLeast(const MeshContext& c, const uint64_t* flag, uint64_t target) {
  Patience patience;
  while (loadAcquire(flag) < target) {
    if (patience.exhausted(c, 1023)) return false;
  }
  return true;
}

// Block-wide. The slot the next message to `to` goes into, once the receiver has freed it.
// On a failed wait every thread of the block returns null together (the vote is part of
// the barrier, so no thread can read a flag another is about to change).
__device__ char* acquireSend(const MeshContext& c, Block& B, int to) {
  int bad = 0;
  if (threadIdx.x == 0) {
    uint64_t s = B.sent[to];
    if (s + 1 > uint64_t(c.geo.slots)) {
      uint64_t need = s + 1 - c.geo.slots;
      bad = !waitAtLeast(c, ackFlag(c.windows[c.rank], to, blockIdx.x, c.geo.maxBlocks), need);
    }
  }
  if (__syncthreads_or(bad)) {
    if (threadIdx.x == 0) B.fail = 1;
    return nullptr;
  }
  return slotPtr(c.geo, c.windows[to], c.rank, blockIdx.x, B.sent[to]);
}

__device__ void commitSend(const MeshContext& c, Block& B, int to) {
  __syncthreads();
  if (threadIdx.x == 0 && !B.fail) {
    // The barrier orders the block's stores before thread 0's; the release store at
    // system scope makes them visible to the peer before the counter.
    B.sent[to] += 1;
    storeRelease(readyFlag(c.windows[to], c.rank, blockIdx.x, c.geo.maxBlocks), B.sent[to]);
  }
}

__device__ const char* acquireRecv(const MeshContext& c, Block& B, int from) {
  int bad = 0;
  if (threadIdx.x == 0) {
    bad = !waitAtLeast(c, readyFlag(c.windows[c.rank], from, blockIdx.x, c.geo.maxBlocks),
                       B.recvd[from] + 1);
  }
  if (__syncthreads_or(bad)) {
    if (threadIdx.x == 0) B.fail = 1;
    return nullptr;
  }
  return slotPtr(c.geo, c.windows[c.rank], from, blockIdx.x, B.recvd[from]);
}

__device__ void releaseRecv(const MeshContext& c, Block& B, int from) {
  __syncthreads();
  if (threadIdx.x == 0 && !B.fail) {
    B.recvd[from] += 1;
    storeRelease(ackFlag(c.windows[from], c.rank, blockIdx.x, c.geo.maxBlocks), B.recvd[from]);
  }
}

// The pulled kernels' data loop for two sources (2 ranks) and at most two destinations,
// aligned, no pre-op: U vectors per thread and step, the next step's loads issued before
// this step's results are stored, so every thread keeps loads in flight while it stores.
// On 2 x H200 it took the two-shot all-reduce from 36.4 to 35.0 µs at 8 MiB and from 112.6
// to 109.6 at 32 MiB (docs/perf/h200x2.md, session 10). Anything else: reduceCopyN.
template <typename E, int U>
__device__ __noinline__ void reduceCopy2Pipelined(const Io& io, const Op<E>& op, size_t n) {
  using S = typename E::Storage;
  using C = typename E::Compute;
  constexpr int kPer = 16 / sizeof(S);
  union Pack {
    uint4 v;
    S e[kPer];
  };
  const size_t nvec = n / kPer;
  const uint4* s0 = reinterpret_cast<const uint4*>(io.srcs[0]);
  const uint4* s1 = reinterpret_cast<const uint4*>(io.srcs[1]);
  uint4* d0 = reinterpret_cast<uint4*>(io.dsts[0]);
  uint4* d1 = io.ndst > 1 ? reinterpret_cast<uint4*>(io.dsts[1]) : nullptr;
  const size_t stride = blockDim.x;
  const bool post = io.post;
  auto combine = [&](uint4 x, uint4 y) {
    Pack a, b, r;
    a.v = x;
    b.v = y;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      C acc = rounded<E>(op.combine(E::load(a.e[k]), E::load(b.e[k])));
      if (post) acc = op.post(acc);
      r.e[k] = E::store(acc);
    }
    return r.v;
  };
  size_t i = threadIdx.x;
  uint4 a[U], b[U];
  bool have = i + (U - 1) * stride < nvec;
  if (have) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      a[u] = s0[i + u * stride];
      b[u] = s1[i + u * stride];
    }
  }
  while (have) {
    const size_t j = i + U * stride;
    const bool next = j + (U - 1) * stride < nvec;
    uint4 na[U], nb[U];
    if (next) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        na[u] = s0[j + u * stride];
        nb[u] = s1[j + u * stride];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint4 r = combine(a[u], b[u]);
      d0[i + u * stride] = r;
      if (d1) d1[i + u * stride] = r;
    }
    if (next) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        a[u] = na[u];
        b[u] = nb[u];
      }
    }
    i = j;
    have = next;
  }
  for (; i < nvec; i += stride) {
    const uint4 r = combine(s0[i], s1[i]);
    d0[i] = r;
    if (d1) d1[i] = r;
  }
  for (size_t k = nvec * kPer + threadIdx.x; k < n; k += stride) reduceElems<E>(io, op, k);
}

// reduceCopy for the pulled kernels: the pipelined loop where it applies (2 vectors a step
// below 64 KiB a block, so that a block's piece still takes two steps; 4 above).
template <typename E>
__device__ void pulledReduceCopy(const Io& io, const Op<E>& op, size_t n) {
  using S = typename E::Storage;
  uintptr_t bits = reinterpret_cast<uintptr_t>(io.srcs[0]) |
                   reinterpret_cast<uintptr_t>(io.srcs[1]) |
                   reinterpret_cast<uintptr_t>(io.dsts[0]) |
                   (io.ndst > 1 ? reinterpret_cast<uintptr_t>(io.dsts[1]) : 0);
  if (io.nsrc != 2 || io.ndst > 2 || io.preMask != 0 || (bits & 15) != 0) {
    reduceCopy<E>(io, op, n);
  } else if (n * sizeof(S) < 64 * 1024) {
    reduceCopy2Pipelined<E, 2>(io, op, n);
  } else {
    reduceCopy2Pipelined<E, 4>(io, op, n);
  }
}

// ---- Collectives. Every rank derives the same tiles from the same arguments. ----

template <typename E>
struct Run {
  using S = typename E::Storage;
  const MeshContext& c;
  const MeshCall& a;
  Block& B;
  Op<E> op;
  size_t tile;                   // elements per message
  const P2pList* p2p = nullptr;  // kSendRecv only

  __device__ const char* in(size_t elem) const {
    return static_cast<const char*>(a.in) + elem * sizeof(S);
  }
  __device__ char* out(size_t elem) const { return static_cast<char*>(a.out) + elem * sizeof(S); }
  __device__ int peer(int i) const { return (c.rank + i) % c.nranks; }  // i in [1, nranks)

  // A reduction over every rank's contribution in rank order: our own (`own`, pre-op
  // applied) and each peer's next message. False when a wait failed.
  __device__ bool rankOrderSources(Io* red, const char* own) {
    red->nsrc = c.nranks;
    red->preMask = 1u << c.rank;
    red->post = true;
    for (int p = 0; p < c.nranks; ++p) {
      red->srcs[p] = p == c.rank ? own : acquireRecv(c, B, p);
      if (!red->srcs[p]) return false;
    }
    return true;
  }
  __device__ static size_t tileLen(size_t t, size_t tile, size_t len) {
    size_t begin = t * tile;
    return begin >= len ? 0 : min(tile, len - begin);
  }

  // Every rank's whole input to every rank, then the same reduction in rank order.
  __device__ void allReduceOneShot() {
    size_t ntiles = (a.count + tile - 1) / tile;
    for (size_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
      size_t off = t * tile, n = tileLen(t, tile, a.count);
      Io send;
      send.srcs[0] = in(off);
      send.nsrc = 1;
      send.preMask = 1;
      for (int i = 1; i < c.nranks; ++i) {
        char* d = acquireSend(c, B, peer(i));
        if (!d) return;
        send.dsts[send.ndst++] = d;
      }
      reduceCopy<E>(send, op, n);
      for (int i = 1; i < c.nranks; ++i) commitSend(c, B, peer(i));
      Io red;
      if (!rankOrderSources(&red, in(off))) return;
      red.dsts[red.ndst++] = out(off);
      reduceCopy<E>(red, op, n);
      for (int i = 1; i < c.nranks; ++i) releaseRecv(c, B, peer(i));
    }
  }

  // LL one-shot: block b carries bytes [b * kLLPayload, ...) of what each rank sends each
  // peer (an all-reduce or reduce: its whole input; a reduce-scatter, whose input is
  // count elements per rank: the peer's part) as (4 data bytes, 4 flag bytes) words, the
  // flag being the block's call count. Receivers poll the words themselves: no fence, no
  // counter, no reply. As a reduce (kReduceLL) only the root writes the result. Every
  // block of every rank sends to and waits for every peer, since that is what keeps a
  // rank from overwriting a buffer (one of two, by call parity) that a peer has not read
  // yet: block b's words of call s + 2 follow the peer's words of call s + 1, which the
  // peer sent after its call s had read everything.
  __device__ void allReduceLL() {
    const bool scatter = a.kind == MeshKind::kReduceScatterLL;
    const size_t bytes = a.count * sizeof(S);
    const bool writes = !(a.kind == MeshKind::kReduceLL && c.rank != a.root);
    const size_t begin = size_t(blockIdx.x) * kLLPayload;
    if (begin >= bytes) return;
    const size_t len = min(kLLPayload, bytes - begin);
    uint64_t* seqSlot = c.state + c.geo.llSeqIndex(blockIdx.x);
    const uint64_t seq = *seqSlot + 1;
    // 1 .. 2^32-1, never the 0 of a buffer nothing has written yet.
    const uint64_t flag = (((seq - 1) % 0xffffffffull) + 1) << 32;
    const int parity = int(seq & 1);
    const size_t chunks = (len + 7) / 8;
    constexpr int kPer = 8 / sizeof(S);
    union Chunk {
      uint64_t u;
      uint32_t w[2];
      S e[kPer];
    };
    // Rank r's share of our input: all of it, or (reduce-scatter) its part.
    auto share = [&](int r) {
      return static_cast<const char*>(a.in) + (scatter ? size_t(r) * bytes : 0) + begin;
    };
    auto loadOwn = [&](const char* base, size_t j) {
      Chunk v;
      v.u = 0;
      const char* src = base + j * 8;
      size_t n = min(size_t(8), len - j * 8);
      if (n == 8 && (reinterpret_cast<uintptr_t>(src) & 7) == 0) {
        v.u = *reinterpret_cast<const uint64_t*>(src);
      } else {
        for (size_t k = 0; k < n; ++k) reinterpret_cast<char*>(&v)[k] = src[k];
      }
#pragma unroll
      for (int k = 0; k < kPer; ++k) v.e[k] = E::store(rounded<E>(op.pre(E::load(v.e[k]))));
      return v;
    };
    for (size_t j = threadIdx.x; j < chunks; j += blockDim.x) {
      Chunk v;
      for (int i = 1; i < c.nranks; ++i) {
        if (scatter || i == 1) v = loadOwn(share(peer(i)), j);
        char* dst = llRegion(c.geo, c.windows[peer(i)], c.rank, blockIdx.x, parity) + j * 16;
        storeLL(dst, flag | v.w[0], flag | v.w[1]);
      }
    }
    bool failed = false;
    for (size_t j = threadIdx.x; j < chunks && !failed; j += blockDim.x) {
      Chunk parts[kMaxRanks];
      for (int p = 0; p < c.nranks && !failed; ++p) {
        if (p == c.rank) {
          parts[p] = loadOwn(share(c.rank), j);
          continue;
        }
        const char* src = llRegion(c.geo, c.windows[c.rank], p, blockIdx.x, parity) + j * 16;
        uint64_t x, y;
        Patience patience;
        while (true) {
          loadLL(src, &x, &y);
          if ((x & 0xffffffff00000000ull) == flag && (y & 0xffffffff00000000ull) == flag) break;
          if (patience.exhausted(c, 4095)) {
            failed = true;
            break;
          }
        }
        parts[p].w[0] = uint32_t(x);
        parts[p].w[1] = uint32_t(y);
      }
      if (failed) break;
      if (!writes) continue;
      Chunk res;
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        typename E::Compute acc = E::load(parts[0].e[k]);
        for (int p = 1; p < c.nranks; ++p)
          acc = rounded<E>(op.combine(acc, E::load(parts[p].e[k])));
        res.e[k] = E::store(op.post(acc));
      }
      char* dst = static_cast<char*>(a.out) + begin + j * 8;
      const size_t n = min(size_t(8), len - j * 8);
      if (n == 8 && (reinterpret_cast<uintptr_t>(dst) & 7) == 0) {
        *reinterpret_cast<uint64_t*>(dst) = res.u;
      } else {
        for (size_t k = 0; k < n; ++k) dst[k] = reinterpret_cast<char*>(&res)[k];
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) *seqSlot = seq;
  }

  // The LL forms through the LL128 region: block b carries bytes [b * tile, ...) of what
  // each rank sends each peer, in 128-byte lines of 120 data bytes and the block's call
  // count as the flag. A warp moves kU groups of 4 lines per step, lane l holding bytes
  // [16 (l % 8), +16) of line l / 8 of a group (lane 7 of each 8: 8 data bytes, then the
  // flag); every store and load of a line is one instruction of the 8 lanes that hold it,
  // so a reader that sees the flag sees the line. Same exchange (every block with every
  // peer, every call) and the same call counts as allReduceLL, so the same double-buffer
  // argument holds.
  __device__ void allReduceLL128() {
    const bool scatter = a.kind == MeshKind::kReduceScatterLL128;
    const size_t bytes = a.count * sizeof(S);
    const bool writes = !(a.kind == MeshKind::kReduceLL128 && c.rank != a.root);
    const size_t tileBytes = tile * sizeof(S);
    const size_t begin = size_t(blockIdx.x) * tileBytes;
    if (begin >= bytes) return;
    const size_t len = min(tileBytes, bytes - begin);
    const size_t lines = (len + kLL128Data - 1) / kLL128Data;
    uint64_t* seqSlot = c.state + c.geo.llSeqIndex(blockIdx.x);
    const uint64_t seq = *seqSlot + 1;  // the flag: never the 0 of a line nothing wrote
    const int parity = int(seq & 1);
    const int lane = threadIdx.x & 31;
    const int part = lane & 7;
    const bool flagLane = part == 7;
    const size_t want = flagLane ? 8 : 16;  // data bytes this lane carries per line
    constexpr int kU = 2;
    const size_t step = size_t(blockDim.x >> 5) * 4 * kU;
    constexpr int kPer = 16 / sizeof(S);
    union Pack {
      uint64_t u[2];
      S e[kPer];
    };
    auto share = [&](int r) {
      return static_cast<const char*>(a.in) + (scatter ? size_t(r) * bytes : 0) + begin;
    };
    // This lane's data bytes at `pos` of the block's part of `base`, pre-op applied (zeros
    // past the end).
    auto load = [&](const char* base, size_t pos) {
      Pack v;
      v.u[0] = v.u[1] = 0;
      if (pos < len) {
        const size_t n = min(want, len - pos);
        const char* src = base + pos;
        const uintptr_t at = reinterpret_cast<uintptr_t>(src);
        if (n == 16 && (at & 15) == 0) {
          uint4 w = *reinterpret_cast<const uint4*>(src);
          v.u[0] = (uint64_t(w.y) << 32) | w.x;
          v.u[1] = (uint64_t(w.w) << 32) | w.z;
        } else if (n >= 8 && (at & 7) == 0) {
          v.u[0] = reinterpret_cast<const uint64_t*>(src)[0];
          if (n == 16)
            v.u[1] = reinterpret_cast<const uint64_t*>(src)[1];
          else
            for (size_t k = 8; k < n; ++k) reinterpret_cast<char*>(&v)[k] = src[k];
        } else {
          for (size_t k = 0; k < n; ++k) reinterpret_cast<char*>(&v)[k] = src[k];
        }
      }
#pragma unroll
      for (int k = 0; k < kPer; ++k) v.e[k] = E::store(rounded<E>(op.pre(E::load(v.e[k]))));
      return v;
    };
    // A warp's step: kU groups of 4 lines. Sends run one step ahead of receives, so the
    // peer's lines of a step have usually landed when the step is read.
    auto lineOf = [&](size_t l0, int u) { return l0 + size_t(u) * 4 + size_t(lane >> 3); };
    auto posOf = [&](size_t line) { return line * kLL128Data + size_t(part) * 16; };
    auto send = [&](size_t l0) {
      Pack v[kU];
      for (int i = 1; i < c.nranks; ++i) {
        if (scatter || i == 1) {
#pragma unroll
          for (int u = 0; u < kU; ++u) v[u] = load(share(peer(i)), posOf(lineOf(l0, u)));
        }
        char* dst =
            ll128Region(c.geo, c.windows[peer(i)], c.rank, blockIdx.x, parity) + size_t(part) * 16;
        __syncwarp();
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const size_t line = lineOf(l0, u);
          if (line < lines) storeLL(dst + line * kLL128Line, v[u].u[0], flagLane ? seq : v[u].u[1]);
        }
      }
    };
    // Combines every rank's lines of the step in rank order and writes the result. False
    // (the whole warp alike) when a wait failed.
    auto receive = [&](size_t l0) {
      typename E::Compute acc[kU][kPer];
      for (int p = 0; p < c.nranks; ++p) {
        Pack x[kU];
        if (p == c.rank) {
#pragma unroll
          for (int u = 0; u < kU; ++u) x[u] = load(share(c.rank), posOf(lineOf(l0, u)));
        } else {
          const char* src =
              ll128Region(c.geo, c.windows[c.rank], p, blockIdx.x, parity) + size_t(part) * 16;
          Patience patience;
          while (true) {
            bool ready = true;
            __syncwarp();
#pragma unroll
            for (int u = 0; u < kU; ++u) {
              const size_t line = lineOf(l0, u);
              x[u].u[0] = x[u].u[1] = 0;
              if (line < lines) {
                loadLL(src + line * kLL128Line, &x[u].u[0], &x[u].u[1]);
                ready = ready && (!flagLane || x[u].u[1] == seq);
              }
            }
            if (__all_sync(0xffffffffu, ready)) break;
            if (__any_sync(0xffffffffu, patience.exhausted(c, 4095))) return false;
          }
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
#pragma unroll
          for (int k = 0; k < kPer; ++k) {
            typename E::Compute v = E::load(x[u].e[k]);
            acc[u][k] = p == 0 ? v : rounded<E>(op.combine(acc[u][k], v));
          }
        }
      }
      if (!writes) return true;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const size_t pos = posOf(lineOf(l0, u));
        if (pos >= len) continue;
        Pack res;
#pragma unroll
        for (int k = 0; k < kPer; ++k) res.e[k] = E::store(op.post(acc[u][k]));
        char* dst = static_cast<char*>(a.out) + begin + pos;
        const size_t n = min(want, len - pos);
        const uintptr_t at = reinterpret_cast<uintptr_t>(dst);
        if (n == 16 && (at & 15) == 0) {
          *reinterpret_cast<uint4*>(dst) = make_uint4(uint32_t(res.u[0]), uint32_t(res.u[0] >> 32),
                                                      uint32_t(res.u[1]), uint32_t(res.u[1] >> 32));
        } else if (n == 8 && (at & 7) == 0) {
          *reinterpret_cast<uint64_t*>(dst) = res.u[0];
        } else {
          for (size_t k = 0; k < n; ++k) dst[k] = reinterpret_cast<char*>(&res)[k];
        }
      }
      return true;
    };
    const size_t first = size_t(threadIdx.x >> 5) * 4 * kU;
    if (first < lines) send(first);
    for (size_t l0 = first; l0 < lines; l0 += step) {
      if (l0 + step < lines) send(l0 + step);
      if (!receive(l0)) break;
    }
    __syncthreads();
    if (threadIdx.x == 0) *seqSlot = seq;
  }

  // Reduce-scatter of shares, then the owner's result to every rank (all-reduce), to
  // the root (reduce) or to its own output only (reduce-scatter).
  __device__ void reduceThenGather() {
    const bool rs = a.kind == MeshKind::kReduceScatter;
    const bool toAll = a.kind == MeshKind::kAllReduceTwoShot;
    const bool toRoot = a.kind == MeshKind::kReduce;
    const size_t vec = 16 / sizeof(S);
    const size_t share = rs ? a.count : ((a.count + c.nranks - 1) / c.nranks + vec - 1) / vec * vec;
    auto partBegin = [&](int p) { return size_t(p) * share; };
    auto partLen = [&](int p) -> size_t {
      if (rs) return a.count;
      size_t b = size_t(p) * share;
      return b >= a.count ? 0 : min(share, a.count - b);
    };
    size_t ntiles = (share + tile - 1) / tile;
    for (size_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
      // Scatter: each peer's share of this tile, pre-op applied, into its window.
      for (int i = 1; i < c.nranks; ++i) {
        int p = peer(i);
        size_t n = tileLen(t, tile, partLen(p));
        if (n == 0) continue;
        Io io;
        io.srcs[0] = in(partBegin(p) + t * tile);
        io.nsrc = 1;
        io.preMask = 1;
        io.dsts[0] = acquireSend(c, B, p);
        if (!io.dsts[0]) return;
        io.ndst = 1;
        reduceCopy<E>(io, op, n);
        commitSend(c, B, p);
      }
      // Reduce our share, writing the result where it goes.
      size_t n = tileLen(t, tile, partLen(c.rank));
      if (n > 0) {
        Io red;
        if (!rankOrderSources(&red, in(partBegin(c.rank) + t * tile))) return;
        if (rs) {
          red.dsts[red.ndst++] = out(t * tile);
        } else if (!toRoot || c.rank == a.root) {
          red.dsts[red.ndst++] = out(partBegin(c.rank) + t * tile);
        }
        if (toAll) {
          for (int i = 1; i < c.nranks; ++i) {
            char* d = acquireSend(c, B, peer(i));
            if (!d) return;
            red.dsts[red.ndst++] = d;
          }
        } else if (toRoot && c.rank != a.root) {
          char* d = acquireSend(c, B, a.root);
          if (!d) return;
          red.dsts[red.ndst++] = d;
        }
        reduceCopy<E>(red, op, n);
        if (toAll) {
          for (int i = 1; i < c.nranks; ++i) commitSend(c, B, peer(i));
        } else if (toRoot && c.rank != a.root) {
          commitSend(c, B, a.root);
        }
        for (int i = 1; i < c.nranks; ++i) releaseRecv(c, B, peer(i));
      }
      // Gather: the other owners' results.
      if (toAll || (toRoot && c.rank == a.root)) {
        for (int i = 1; i < c.nranks; ++i) {
          int p = peer(i);
          size_t m = tileLen(t, tile, partLen(p));
          if (m == 0) continue;
          Io io;
          io.srcs[0] = acquireRecv(c, B, p);
          if (!io.srcs[0]) return;
          io.nsrc = 1;
          io.dsts[0] = out(partBegin(p) + t * tile);
          io.ndst = 1;
          reduceCopy<E>(io, op, m);
          releaseRecv(c, B, p);
        }
      }
    }
  }

  // Reduce with every rank's input going straight to the root: for 2 ranks the same
  // bytes on the link as reduce-scatter + gather, in one pipeline stage instead of two.
  __device__ void reduceDirect() {
    size_t ntiles = (a.count + tile - 1) / tile;
    for (size_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
      size_t off = t * tile, n = tileLen(t, tile, a.count);
      if (c.rank != a.root) {
        Io send;
        send.srcs[0] = in(off);
        send.nsrc = 1;
        send.preMask = 1;
        send.dsts[0] = acquireSend(c, B, a.root);
        if (!send.dsts[0]) return;
        send.ndst = 1;
        reduceCopy<E>(send, op, n);
        commitSend(c, B, a.root);
      } else {
        Io red;
        if (!rankOrderSources(&red, in(off))) return;
        red.dsts[red.ndst++] = out(off);
        reduceCopy<E>(red, op, n);
        for (int i = 1; i < c.nranks; ++i) releaseRecv(c, B, peer(i));
      }
    }
  }

  // All-gather, broadcast and all-to-all: copies only.
  __device__ void copies() {
    const bool ag = a.kind == MeshKind::kAllGather;
    const bool bc = a.kind == MeshKind::kBroadcast;
    size_t ntiles = (a.count + tile - 1) / tile;
    for (size_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
      size_t off = t * tile, n = tileLen(t, tile, a.count);
      if (ag || (bc && c.rank == a.root)) {
        Io io;
        io.srcs[0] = in(off);
        io.nsrc = 1;
        for (int i = 1; i < c.nranks; ++i) {
          char* d = acquireSend(c, B, peer(i));
          if (!d) return;
          io.dsts[io.ndst++] = d;
        }
        char* own = ag ? out(size_t(c.rank) * a.count + off) : out(off);
        if (own != io.srcs[0]) io.dsts[io.ndst++] = own;
        reduceCopy<E>(io, op, n);
        for (int i = 1; i < c.nranks; ++i) commitSend(c, B, peer(i));
      }
      if (a.kind == MeshKind::kAllToAll) {
        for (int i = 1; i < c.nranks; ++i) {
          int p = peer(i);
          Io io;
          io.srcs[0] = in(size_t(p) * a.count + off);
          io.nsrc = 1;
          io.dsts[0] = acquireSend(c, B, p);
          if (!io.dsts[0]) return;
          io.ndst = 1;
          reduceCopy<E>(io, op, n);
          commitSend(c, B, p);
        }
        if (a.in != a.out) {
          Io io;
          io.srcs[0] = in(size_t(c.rank) * a.count + off);
          io.nsrc = 1;
          io.dsts[0] = out(size_t(c.rank) * a.count + off);
          io.ndst = 1;
          reduceCopy<E>(io, op, n);
        }
      }
      if (ag || a.kind == MeshKind::kAllToAll || (bc && c.rank != a.root)) {
        for (int i = 1; i < c.nranks; ++i) {
          int p = peer(i);
          if (bc && p != a.root) continue;
          Io io;
          io.srcs[0] = acquireRecv(c, B, p);
          if (!io.srcs[0]) return;
          io.nsrc = 1;
          io.dsts[0] = bc ? out(off) : out(size_t(p) * a.count + off);
          io.ndst = 1;
          reduceCopy<E>(io, op, n);
          releaseRecv(c, B, p);
        }
      }
    }
  }

  // Grouped Send/Recv, in bytes (E is uint8). Each call has its own tile size (from its
  // byte count, known to both ends) and tile t goes to block t % gridDim.x, the grid
  // being the same on every rank. Within a tile index, step j sends the j-th message to
  // each peer, then receives the j-th message from each peer: at most one message per
  // peer is posted before the receives, so no number of calls per peer can fill the
  // slots on both sides and deadlock.
  __device__ void sendRecv() {
    size_t ntiles = 0;
    int steps = 0;
    for (int k = 0; k < p2p->nops; ++k) {
      const P2pOp& o = p2p->ops[k];
      size_t tb = p2pTileBytes(o.bytes, c.geo.maxBlocks, c.geo.slotBytes);
      ntiles = max(ntiles, (o.bytes + tb - 1) / tb);
      steps = max(steps, o.seq + 1);
    }
    for (size_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
      for (int j = 0; j < steps; ++j) {
        for (int pass = 1; pass >= 0; --pass) {
          for (int k = 0; k < p2p->nops; ++k) {
            const P2pOp& o = p2p->ops[k];
            if (o.seq != j || o.isSend != pass || o.peer == c.rank) continue;
            const size_t tb = p2pTileBytes(o.bytes, c.geo.maxBlocks, c.geo.slotBytes);
            size_t n = tileLen(t, tb, o.bytes);
            if (n == 0) continue;
            Io io;
            io.nsrc = 1;
            io.ndst = 1;
            if (o.isSend) {
              io.srcs[0] = static_cast<const char*>(o.buffer) + t * tb;
              io.dsts[0] = acquireSend(c, B, o.peer);
              if (!io.dsts[0]) return;
            } else {
              io.srcs[0] = acquireRecv(c, B, o.peer);
              if (!io.srcs[0]) return;
              io.dsts[0] = static_cast<char*>(o.buffer) + t * tb;
            }
            reduceCopy<E>(io, op, n);
            if (o.isSend)
              commitSend(c, B, o.peer);
            else
              releaseRecv(c, B, o.peer);
          }
        }
      }
    }
  }
};

template <typename E>
__device__ __forceinline__ void meshBody(const MeshContext& c, const MeshCall& a, size_t tile,
                                         const P2pList* p2p) {
  __shared__ Block B;
  if (isLL(a.kind)) releaseStreamSuccessor();  // short calls
  if (isLL(a.kind) || isLL128(a.kind)) {
    // No counters and no drain: the LL words and LL128 lines carry their own flags.
    Op<E> op{a.red, typename E::Compute(1), typename E::Compute(a.divisor ? a.divisor : 1)};
    if (a.red == RedKind::kPreMulSum) op.scalar = scalarFor<E>(a.scalar, a.scalarDevice);
    Run<E> run{c, a, B, op, tile};
    if (isLL(a.kind)) {
      run.allReduceLL();
    } else {
      run.allReduceLL128();
    }
    return;
  }
  uint64_t* state = c.state + size_t(blockIdx.x) * 2 * kMaxRanks;
  if (threadIdx.x < kMaxRanks) {
    B.sent[threadIdx.x] = state[threadIdx.x];
    B.recvd[threadIdx.x] = state[kMaxRanks + threadIdx.x];
  }
  if (threadIdx.x == 0) B.fail = 0;
  __syncthreads();
  if (!B.fail) {
    Op<E> op{a.red, typename E::Compute(1), typename E::Compute(a.divisor ? a.divisor : 1)};
    if (a.red == RedKind::kPreMulSum) op.scalar = scalarFor<E>(a.scalar, a.scalarDevice);
    Run<E> run{c, a, B, op, tile, p2p};
    switch (a.kind) {
      case MeshKind::kAllReduceOneShot: run.allReduceOneShot(); break;
      case MeshKind::kAllReduceTwoShot:
      case MeshKind::kReduceScatter:
      case MeshKind::kReduce: run.reduceThenGather(); break;
      case MeshKind::kReduceDirect: run.reduceDirect(); break;
      case MeshKind::kAllGather:
      case MeshKind::kBroadcast:
      case MeshKind::kAllToAll: run.copies(); break;
      case MeshKind::kSendRecv: run.sendRecv(); break;
      case MeshKind::kAllReduceLL:
      case MeshKind::kReduceLL:
      case MeshKind::kReduceScatterLL:
      case MeshKind::kAllReduceLL128:
      case MeshKind::kReduceLL128:
      case MeshKind::kReduceScatterLL128: break;  // handled above
    }
  }
  // Before the kernel ends, every message this block sent has been taken, so no peer
  // writes into this rank's window once the stream has passed the kernel.
  __syncthreads();
  if (threadIdx.x == 0 && !B.fail) {
    for (int p = 0; p < c.nranks; ++p) {
      if (p == c.rank || B.fail) continue;
      if (!waitAtLeast(c, ackFlag(c.windows[c.rank], p, blockIdx.x, c.geo.maxBlocks), B.sent[p])) {
        B.fail = 1;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x < kMaxRanks) {
    state[threadIdx.x] = B.sent[threadIdx.x];
    state[kMaxRanks + threadIdx.x] = B.recvd[threadIdx.x];
  }
}

template <typename E>
__global__ void __launch_bounds__(512) meshKernel(const __grid_constant__ MeshContext c,
                                                  const __grid_constant__ MeshCall a, size_t tile) {
  awaitStreamPredecessor();
  meshBody<E>(c, a, tile, nullptr);
}

__global__ void __launch_bounds__(512)
    p2pKernel(const __grid_constant__ MeshContext c, const __grid_constant__ MeshCall a,
              size_t tile, const __grid_constant__ P2pList p2p) {
  awaitStreamPredecessor();
  meshBody<Plain<uint8_t, uint32_t>>(c, a, tile, &p2p);
}

__device__ __forceinline__ uint64_t* barrierFlag(const MeshContext& c, int owner, int from) {
  return reinterpret_cast<uint64_t*>(c.windows[owner] + c.geo.barrierOffset() +
                                     size_t(from) * kFlagStride);
}

// This block's part of a reduction of `count` elements split over the grid (whole 16-byte
// vectors per block): out := the sources (one per rank, in rank order) combined, with the
// pre-op on those in `preMask` and the post-op.
template <typename E>
__device__ void reduceBlockPart(const MeshContext& c, const void* const* srcs, void* out,
                                size_t count, const Op<E>& op, unsigned preMask,
                                bool pulled = false) {
  using S = typename E::Storage;
  constexpr size_t vec = 16 / sizeof(S);
  const size_t per = ((count + gridDim.x - 1) / gridDim.x + vec - 1) / vec * vec;
  const size_t begin = size_t(blockIdx.x) * per;
  if (begin >= count) return;
  Io io;
  for (int r = 0; r < c.nranks; ++r)
    io.srcs[r] = static_cast<const char*>(srcs[r]) + begin * sizeof(S);
  io.nsrc = c.nranks;
  io.preMask = preMask;
  io.post = true;
  io.dsts[0] = static_cast<char*>(out) + begin * sizeof(S);
  io.ndst = 1;
  if (pulled) {
    pulledReduceCopy<E>(io, op, min(per, count - begin));
  } else {
    reduceCopy<E>(io, op, min(per, count - begin));
  }
}

// Block-wide: true in the block that finished last (counted in `done`; the caller resets
// it), after a fence that orders every block's work before what that block does next
// (system-wide with `system`: stores into peers' memory).
__device__ bool lastBlockDone(unsigned int* done, bool system) {
  __shared__ int last;
  __syncthreads();
  if (threadIdx.x == 0) {
    if (system) {
      __threadfence_system();
    } else {
      __threadfence();
    }
    last = atomicAdd(done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return false;
  __threadfence();
  return true;
}

// The pulled forms' two handshakes, on the barrier counters (the count the barrier kernel
// uses too): each call arrives at count + 1 and leaves at count + 2.
struct PullCall {
  uint64_t* seqSlot;
  unsigned int* done;
  uint64_t arrive, leave;
  __device__ explicit PullCall(const MeshContext& c)
      : seqSlot(c.state + c.geo.barrierSeqIndex()),
        done(reinterpret_cast<unsigned int*>(c.state + c.geo.pullDoneIndex())),
        arrive(*seqSlot + 1),
        leave(*seqSlot + 2) {}
  // Every block: announce us to each peer (thread p for rank p) and wait until each peer
  // arrived. Every block announces (the same value), so no block waits on one not yet
  // running. No fence before it (measured: a system fence here cost 0.6-1.3 µs a call):
  // what the peers read (our input) and write (our output) was last touched by work
  // ordered before this kernel, complete once its griddepcontrol.wait returns (at once
  // without PDL), and the peers reach it through our own memory; what peers stored into
  // our buffers in an earlier call was published by their leave, which our earlier kernel
  // acquired. The release store is cumulative over all of that.
  // False (every thread alike) when a wait failed: the error flag says why.
  __device__ bool arriveAll(const MeshContext& c) const {
    const int t = threadIdx.x;
    const bool peerThread = t < c.nranks && t != c.rank;
    if (peerThread) storeRelease(barrierFlag(c, t, c.rank), arrive);
    int bad = 0;
    if (peerThread) bad = !waitAtLeast(c, barrierFlag(c, c.rank, t), arrive);
    return !__syncthreads_or(bad);
  }
  // Every block, once done with the peers' memory: the last block to finish tells the
  // peers we are done (every block's loads, and with `stores` its stores into their
  // memory, come before) and waits until they are done with ours.
  __device__ void leaveAll(const MeshContext& c, bool stores) const {
    if (!lastBlockDone(done, stores)) return;
    const int t = threadIdx.x;
    if (t < c.nranks && t != c.rank) {
      storeRelease(barrierFlag(c, t, c.rank), leave);
      waitAtLeast(c, barrierFlag(c, c.rank, t), leave);
    }
    __syncthreads();
    if (t == 0) {
      *done = 0;
      *seqSlot = leave;
    }
  }
};

// launchPullAllReduce. Every block: arrive, reduce its part of every rank's input into our
// output, leave.
template <typename E>
__global__ void __launch_bounds__(512)
    pullAllReduceKernel(const __grid_constant__ MeshContext c, const __grid_constant__ MeshCall a,
                        const __grid_constant__ PullInputs p) {
  awaitStreamPredecessor();
  using C = typename E::Compute;
  const PullCall call(c);
  if (!call.arriveAll(c)) return;
  Op<E> op{a.red, C(1), C(a.divisor ? a.divisor : 1)};
  if (p.writer < 0 || p.writer == c.rank)
    reduceBlockPart<E>(c, p.inputs, a.out, a.count, op, 0, true);
  releaseStreamSuccessor();
  call.leaveAll(c, false);
}

// Elements [begin, begin + size) of part `q` of `count` split into `n` parts of whole
// 16-byte vectors, and of that part the piece of block `b` of `blocks`.
template <typename S>
__device__ void partPiece(size_t count, int n, int q, int b, int blocks, size_t* begin,
                          size_t* size) {
  constexpr size_t vec = 16 / sizeof(S);
  const size_t part = ((count + n - 1) / n + vec - 1) / vec * vec;
  const size_t p0 = min(count, size_t(q) * part), p1 = min(count, p0 + part);
  const size_t piece = ((p1 - p0 + blocks - 1) / blocks + vec - 1) / vec * vec;
  const size_t b0 = min(p1, p0 + size_t(b) * piece);
  *begin = b0;
  *size = min(p1, b0 + piece) - b0;
}

// launchPullTwoShot. Every block: arrive; reduce its piece of our part from every rank's
// input and store the result into every rank's output given (ours first); leave.
template <typename E>
__global__ void __launch_bounds__(512)
    pullTwoShotKernel(const __grid_constant__ MeshContext c, const __grid_constant__ MeshCall a,
                      const __grid_constant__ PullInputs p) {
  awaitStreamPredecessor();
  using S = typename E::Storage;
  using C = typename E::Compute;
  const PullCall call(c);
  if (!call.arriveAll(c)) return;
  Op<E> op{a.red, C(1), C(a.divisor ? a.divisor : 1)};
  size_t begin = 0, size = 0;
  partPiece<S>(a.count, c.nranks, c.rank, blockIdx.x, gridDim.x, &begin, &size);
  if (size > 0) {
    Io io;
    for (int r = 0; r < c.nranks; ++r)
      io.srcs[r] = static_cast<const char*>(p.inputs[r]) + begin * sizeof(S);
    io.nsrc = c.nranks;
    io.preMask = 0;
    io.post = true;
    io.ndst = 0;
    for (int k = 0; k < c.nranks; ++k) {
      const int r = (c.rank + k) % c.nranks;
      if (p.outputs[r]) io.dsts[io.ndst++] = static_cast<char*>(p.outputs[r]) + begin * sizeof(S);
    }
    if (io.ndst > 0) pulledReduceCopy<E>(io, op, size);
  }
  releaseStreamSuccessor();
  call.leaveAll(c, true);
}

// One block of 32 threads; thread p signals and waits for rank p.
__global__ void __launch_bounds__(32) barrierKernel(const __grid_constant__ MeshContext c) {
  awaitStreamPredecessor();
  releaseStreamSuccessor();  // one warp, a few microseconds
  uint64_t* count = c.state + c.geo.barrierSeqIndex();
  const uint64_t seq = *count + 1;
  const int p = threadIdx.x;
  if (p < c.nranks && p != c.rank) {
    // The stream's earlier work (a copy engine's writes into a peer, too) is complete
    // when this kernel starts; the fence and the release publish it before the counter.
    __threadfence_system();
    storeRelease(barrierFlag(c, p, c.rank), seq);
    waitAtLeast(c, barrierFlag(c, c.rank, p), seq);  // on failure the error flag says why
  }
  __syncwarp();
  if (p == 0) *count = seq;
}

// One warp; lane p signals and waits for rank p.
__global__ void __launch_bounds__(32)
    chunkFlagsKernel(const __grid_constant__ MeshContext c, const __grid_constant__ ChunkFlags f) {
  awaitStreamPredecessor();
  releaseStreamSuccessor();  // one warp
  const int p = threadIdx.x;
  if (p >= c.nranks || p == c.rank) return;
  if (f.signal[p]) {
    // The copies before this kernel on the stream are complete: publish them first.
    __threadfence_system();
    storeRelease(chunkFlag(c, p, kChunkReady, c.rank), f.signal[p]);
  }
  if (f.wait[p]) waitAtLeast(c, chunkFlag(c, c.rank, kChunkFree, p), f.wait[p]);
}

// Every block waits for the peers' copies (thread q for rank q), reduces its part; the
// last block to finish frees the peers' slots.
template <typename E>
__global__ void __launch_bounds__(512) chunkReduceKernel(const __grid_constant__ MeshContext c,
                                                         const __grid_constant__ ChunkReduce a) {
  awaitStreamPredecessor();
  using C = typename E::Compute;
  auto* done = reinterpret_cast<unsigned int*>(c.state + c.geo.chunkDoneIndex());
  const int t = threadIdx.x;
  const bool peerThread = t < c.nranks && t != c.rank;
  int bad = 0;
  if (peerThread && a.wait[t])
    bad = !waitAtLeast(c, chunkFlag(c, c.rank, kChunkReady, t), a.wait[t]);
  if (__syncthreads_or(bad)) return;  // the error flag says why; the call has failed

  Op<E> op{a.red, C(1), C(a.divisor ? a.divisor : 1)};
  if (a.red == RedKind::kPreMulSum) op.scalar = scalarFor<E>(a.scalar, nullptr);
  reduceBlockPart<E>(c, a.srcs, a.out, a.count, op,
                     a.red == RedKind::kPreMulSum ? (1u << c.nranks) - 1 : 0);
  // The last block: every block's reads of the slots come before the release.
  if (!lastBlockDone(done, false)) return;
  if (peerThread && a.signal[t]) {
    storeRelease(chunkFlag(c, t, kChunkFree, c.rank), a.signal[t]);
    if (a.freeMirror) storeRelease(a.freeMirror + t * kMaxRanks + c.rank, a.signal[t]);
  }
  if (t == 0) *done = 0;
}

// Launches `kernel` on `stream`, with programmatic stream serialization when `pdl` (see
// awaitStreamPredecessor); a cudaError_t value back. The kernels of the copy-engine forms
// (the barrier, the chunk counters and reductions) sit between copies, where there is no
// launch gap to hide, and measured slower with it (all_reduce 1-2 GiB with `-g 2`, 2 x H200,
// 2026-12-01: 370.4-374.5 GB/s against 373.1-375.8), so they launch plainly.
template <typename... Params, typename... Args>
int launchKernel(void (*kernel)(Params...), unsigned blocks, unsigned threads, cudaStream_t stream,
                 bool pdl, Args&&... args) {
  if (!pdl) {
    kernel<<<blocks, threads, 0, stream>>>(std::forward<Args>(args)...);
    return static_cast<int>(cudaGetLastError());
  }
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(threads);
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (e != cudaSuccess) cudaGetLastError();  // reported here, not by the next launch
  return static_cast<int>(e);
}

template <typename E>
int launchTyped(const MeshContext& ctx, const MeshCall& call, const LaunchShape& shape,
                cudaStream_t stream) {
  return launchKernel(meshKernel<E>, static_cast<unsigned>(shape.blocks),
                      static_cast<unsigned>(ctx.threads), stream, ctx.pdl, ctx, call,
                      shape.tileElems);
}

}  // namespace

const char* meshKindName(MeshKind kind) {
  switch (kind) {
    case MeshKind::kAllReduceOneShot: return "one-shot";
    case MeshKind::kAllReduceTwoShot: return "two-shot";
    case MeshKind::kAllGather: return "direct all-gather";
    case MeshKind::kBroadcast: return "direct broadcast";
    case MeshKind::kReduceScatter: return "direct reduce-scatter";
    case MeshKind::kReduce: return "reduce-scatter + gather to root";
    case MeshKind::kReduceDirect: return "direct reduce to root";
    case MeshKind::kAllToAll: return "direct all-to-all";
    case MeshKind::kSendRecv: return "direct send/recv";
    case MeshKind::kAllReduceLL: return "one-shot LL";
    case MeshKind::kReduceLL: return "one-shot LL reduce";
    case MeshKind::kReduceScatterLL: return "one-shot LL reduce-scatter";
    case MeshKind::kAllReduceLL128: return "one-shot LL128";
    case MeshKind::kReduceLL128: return "one-shot LL128 reduce";
    case MeshKind::kReduceScatterLL128: return "one-shot LL128 reduce-scatter";
  }
  return "?";
}

LaunchShape meshShape(const MeshContext& ctx, const MeshCall& call) {
  if (isLL(call.kind)) {
    LaunchShape s;
    size_t bytes = call.count * dataTypeSize(call.type);
    s.blocks =
        static_cast<int>(std::clamp<size_t>((bytes + kLLPayload - 1) / kLLPayload, 1, kLLBlocks));
    s.tileElems = kLLPayload / dataTypeSize(call.type);
    return s;
  }
  if (isLL128(call.kind)) {
    // At least 16 KiB per block, whole 8-byte words (so whole elements) per block.
    LaunchShape s;
    const size_t es = dataTypeSize(call.type);
    const size_t bytes = call.count * es;
    s.blocks = static_cast<int>(std::clamp<size_t>((bytes + 16383) / 16384, 1, kLLBlocks));
    const size_t per = ((bytes + s.blocks - 1) / s.blocks + 7) / 8 * 8;
    s.tileElems = std::max<size_t>(1, per / es);
    return s;
  }
  const size_t es = call.kind == MeshKind::kSendRecv ? 1 : dataTypeSize(call.type);
  // The largest part one block channel carries per tile index.
  size_t part = call.count;
  if (call.kind == MeshKind::kAllReduceTwoShot || call.kind == MeshKind::kReduce) {
    part = (call.count + ctx.nranks - 1) / ctx.nranks;
  }
  if (call.kind == MeshKind::kSendRecv) {
    // Every rank launches the same grid whatever its own calls are (see sendRecv()).
    LaunchShape s;
    s.blocks = ctx.geo.maxBlocks;
    s.tileElems = ctx.geo.slotBytes;
    return s;
  }
  const size_t bytes = part * es;
  const size_t slot = ctx.geo.slotBytes;
  const size_t minTile = 16 * 1024;
  // Spread mid sizes over all blocks, but never below minTile nor above one slot. The
  // direct reduce has one stage only: up to 4 tiles per block, so the root reduces one
  // tile while the next arrives.
  const size_t perBlock =
      call.kind == MeshKind::kReduceDirect ? size_t(ctx.geo.maxBlocks) * 4 : ctx.geo.maxBlocks;
  size_t tileBytes = (bytes + perBlock - 1) / perBlock;
  tileBytes = std::clamp(tileBytes, minTile, slot);
  tileBytes = tileBytes / 16 * 16;
  LaunchShape s;
  s.tileElems = std::max<size_t>(1, tileBytes / es);
  size_t tiles = (part + s.tileElems - 1) / s.tileElems;
  s.blocks = static_cast<int>(std::clamp<size_t>(tiles, 1, ctx.geo.maxBlocks));
  return s;
}

template <typename E>
int launchPullTyped(const MeshContext& ctx, const MeshCall& call, const PullInputs& in,
                    cudaStream_t stream) {
  using S = typename E::Storage;
  // Parts of at least 32 KiB, so small calls use few blocks.
  size_t blocks =
      std::clamp<size_t>(call.count * sizeof(S) / (32 * 1024), 1, size_t(ctx.geo.maxBlocks));
  if (in.writer >= 0 && in.writer != ctx.rank) blocks = 1;  // only arrives and waits
  return launchKernel(pullAllReduceKernel<E>, static_cast<unsigned>(blocks),
                      static_cast<unsigned>(ctx.threads), stream, ctx.pdl, ctx, call, in);
}

int launchPullAllReduce(const MeshContext& ctx, const MeshCall& call, const PullInputs& in,
                        cudaStream_t stream) {
  return withElement(call.type,
                     [&](auto e) { return launchPullTyped<decltype(e)>(ctx, call, in, stream); });
}

template <typename E>
int launchPullTwoShotTyped(const MeshContext& ctx, const MeshCall& call, const PullInputs& in,
                           cudaStream_t stream) {
  using S = typename E::Storage;
  // A block per 32 KiB of the whole buffer, so each block's piece of one part is 32 KiB / n.
  size_t blocks =
      std::clamp<size_t>(call.count * sizeof(S) / (32 * 1024), 1, size_t(ctx.geo.maxBlocks));
  return launchKernel(pullTwoShotKernel<E>, static_cast<unsigned>(blocks),
                      static_cast<unsigned>(ctx.threads), stream, ctx.pdl, ctx, call, in);
}

int launchPullTwoShot(const MeshContext& ctx, const MeshCall& call, const PullInputs& in,
                      cudaStream_t stream) {
  return withElement(call.type, [&](auto e) {
    return launchPullTwoShotTyped<decltype(e)>(ctx, call, in, stream);
  });
}

int launchChunkFlags(const MeshContext& ctx, const ChunkFlags& flags, cudaStream_t stream) {
  return launchKernel(chunkFlagsKernel, 1, 32, stream, false, ctx, flags);
}

int launchChunkReduce(const MeshContext& ctx, const ChunkReduce& chunk, cudaStream_t stream) {
  return withElement(chunk.type, [&](auto e) {
    using S = typename decltype(e)::Storage;
    // Parts of at least 64 KiB, up to the mesh's block count (the chunk is in local memory).
    const size_t most =
        chunk.maxBlocks > 0 ? std::min(chunk.maxBlocks, ctx.geo.maxBlocks) : ctx.geo.maxBlocks;
    size_t blocks = std::clamp<size_t>(chunk.count * sizeof(S) / (64 * 1024), 1, most);
    return launchKernel(chunkReduceKernel<decltype(e)>, static_cast<unsigned>(blocks),
                        static_cast<unsigned>(ctx.threads), stream, false, ctx, chunk);
  });
}

bool kernelsWaitForPredecessor() {
  // The kernels this device runs carry griddepcontrol.wait only when compiled for
  // compute_90 or later (a build for older GPUs runs on newer ones through its PTX).
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, barrierKernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return fa.ptxVersion >= 90;
}

namespace {
template <typename K>
int loadKernel(K kernel) {
  cudaFuncAttributes fa{};
  return static_cast<int>(cudaFuncGetAttributes(&fa, kernel));
}
}  // namespace

int preloadMeshKernels() {
  int e = 0;
  for (int k : {loadKernel(barrierKernel), loadKernel(chunkFlagsKernel), loadKernel(p2pKernel)})
    e = e ? e : k;
  for (int t = 0; t < kNumDataTypes; ++t) {
    const int k = withElement(static_cast<DataType>(t), [](auto el) {
      using E = decltype(el);
      int r = 0;
      for (int x : {loadKernel(meshKernel<E>), loadKernel(pullAllReduceKernel<E>),
                    loadKernel(pullTwoShotKernel<E>), loadKernel(chunkReduceKernel<E>)})
        r = r ? r : x;
      return r;
    });
    e = e ? e : k;
  }
  return e;
}

int launchMeshBarrier(const MeshContext& ctx, cudaStream_t stream) {
  return launchKernel(barrierKernel, 1, 32, stream, false, ctx);
}

int launchMesh(const MeshContext& ctx, const MeshCall& call, cudaStream_t stream,
               const P2pList* p2p) {
  LaunchShape shape = meshShape(ctx, call);
  if (call.kind == MeshKind::kSendRecv) {
    if (!p2p) return static_cast<int>(cudaErrorInvalidValue);
    return launchKernel(p2pKernel, static_cast<unsigned>(shape.blocks),
                        static_cast<unsigned>(ctx.threads), stream, ctx.pdl, ctx, call,
                        shape.tileElems, *p2p);
  }
  return withElement(call.type,
                     [&](auto e) { return launchTyped<decltype(e)>(ctx, call, shape, stream); });
}

}  // namespace loom::collectives::device
