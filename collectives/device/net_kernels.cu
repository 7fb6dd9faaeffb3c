// The network executor's kernel (see net.h for the protocol, net_fifo.h for the FIFOs).
//
// Thread 0 of a block does the waiting and the counting; every thread moves data
// (reduceCopy). The counters are page-locked host memory the GPU maps, the slots too or
// GPU memory that the NIC reads and writes (GPUDirect RDMA): loads with acquire at system
// scope for what the proxy writes, and the block's barrier followed by thread 0's system
// fence and release store before a slot is handed on.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#ifdef LOOM_NET_TRACE
#include <unistd.h>

#include <cstdio>
#include <ctime>
#endif

#include "collectives/device/net.h"
#include "collectives/device/reduce_copy_device.cuh"

namespace loom::collectives::device {

namespace {

using namespace detail;
using transport::net::Fifo;
using transport::net::fifoHead;
using transport::net::FifoHeader;
using transport::net::fifoHeadIs;
using transport::net::fifoHeadSize;
using transport::net::fifoWord;
using transport::net::fifoWords;

#ifdef LOOM_NET_TRACE
// A diagnostic build's timeline (-DLOOM_NET_TRACE): thread 0 of each block stamps events
// with the GPU's global timer in shared memory; at the end each block writes one record
// (dumpNetTrace writes them out; scripts/bench/net_trace_report.py reads them).
constexpr unsigned kTraceMax = 1u << 15;
constexpr int kTraceEvents = 32;  // 16 for the first phase, 16 for the later ones
__device__ unsigned long long gTrace[kTraceMax][kTraceEvents];
__device__ unsigned gTraceN;
__device__ unsigned long long* traceStamps() {
  __shared__ unsigned long long s[kTraceEvents];
  return s;
}
__device__ int& tracePhase() {
  __shared__ int p;
  return p;
}
__device__ __forceinline__ void trace(int ev) {
  if (threadIdx.x == 0) traceStamps()[(tracePhase() > 0 ? 16 : 0) + ev] = globalTimer();
}
__device__ void traceSetPhase(int p) {
  if (threadIdx.x == 0) tracePhase() = p;
}
__device__ void traceBegin() {
  if (threadIdx.x != 0) return;
  for (int i = 0; i < kTraceEvents; ++i) traceStamps()[i] = 0;
  tracePhase() = 0;
  traceStamps()[1] = globalTimer();
}
__device__ void traceEnd() {
  if (threadIdx.x != 0) return;
  traceStamps()[6] = globalTimer();
  traceStamps()[0] = blockIdx.x;
  const unsigned i = atomicAdd(&gTraceN, 1u);
  if (i < kTraceMax)
    for (int e = 0; e < kTraceEvents; ++e) gTrace[i][e] = traceStamps()[e];
}
#else
__device__ __forceinline__ void trace(int) {}
__device__ __forceinline__ void traceSetPhase(int) {}
__device__ __forceinline__ void traceBegin() {}
__device__ __forceinline__ void traceEnd() {}
#endif

__device__ __forceinline__ uint32_t loadAcquire32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The kernel's own counters are read and written through volatile accesses: blocks on
// other multiprocessors wrote them in earlier phases (or kernels), and an ordinary load
// could be served from this multiprocessor's L1, which is not coherent.
__device__ __forceinline__ uint64_t vload(const uint64_t& v) {
  return *reinterpret_cast<const volatile uint64_t*>(&v);
}
__device__ __forceinline__ void vstore(uint64_t& v, uint64_t x) {
  *reinterpret_cast<volatile uint64_t*>(&v) = x;
}

__device__ __forceinline__ char* slotOf(const Fifo& f, uint64_t seq) {
  return f.slots + (seq % f.nslots) * f.slotBytes;
}

// The first failure of any block is the kernel's; later ones keep the first.
__device__ void raise(const NetContext& c, int code, int peer) {
  if (atomicCAS(c.errorFlag, 0, code) == 0) *c.errorPeer = peer;
  __threadfence_system();
}

// One waiter's patience (thread 0): every 1024 polls it checks the abort flag, another
// block's failure, the clock and, where it waits on a FIFO, whether the proxy closed it
// (each of these reads crosses PCIe: read on every poll, they would double the wait for
// a small message's slot).
struct Patience {
  uint64_t spins = 0;
  uint64_t start = 0;
  const uint32_t* closed;
  __device__ explicit Patience(const uint32_t* closedFlag = nullptr) : closed(closedFlag) {}
  __device__ bool exhausted(const NetContext& c, int peer) {
    if ((++spins & 1023) != 0) return false;
    if (closed && loadAcquire32(closed) != 0) {
      raise(c, kNetErrorClosed, peer);
      return true;
    }
    if (*c.abortFlag) {
      raise(c, kNetErrorAborted, -1);
      return true;
    }
    if (*reinterpret_cast<volatile int*>(c.errorFlag) != 0) return true;
    const uint64_t now = globalTimer();
    if (start == 0) {
      start = now;
    } else if (c.timeoutNs && now - start > c.timeoutNs) {
      raise(c, kNetErrorTimeout, peer);
      return true;
    }
    return false;
  }
};

// Message `seq`'s head on FIFO f, once there (one load over PCIe a poll), checked against
// the size expected; false on failure.
__device__ bool awaitHead(const NetContext& c, const Fifo& f, uint64_t seq, int peer,
                          size_t bytes) {
  Patience patience(&f.header->closed);
  uint64_t head;
  while (!fifoHeadIs(head = loadAcquire(&f.header->head[seq % f.nslots]), seq)) {
    trace(8);
    if (patience.exhausted(c, peer)) return false;
  }
  trace(9);
  if (fifoHeadSize(head) != bytes) {
    raise(c, kNetErrorMismatch, peer);
    return false;
  }
  return true;
}

// Every thread: its share of a small message's tagged words, into `out` (shared memory),
// once each has its tag; false on failure (this thread's wait, or another's).
__device__ bool gatherSmall(const NetContext& c, const Fifo& f, uint64_t seq, int peer,
                            size_t bytes, uint32_t* out, unsigned from, unsigned stride) {
  const uint64_t* words = f.header->ll[seq % f.nslots];
  const uint32_t n = fifoWords(bytes);
  Patience patience(&f.header->closed);
  for (uint32_t i = from; i < n; i += stride) {
    uint64_t w;
    while (!fifoHeadIs(w = *reinterpret_cast<const volatile uint64_t*>(&words[i]), seq)) {
      if (patience.exhausted(c, peer)) return false;
    }
    out[i] = static_cast<uint32_t>(w);
  }
  return true;
}

// Every thread: its share of a small message from `in` (shared memory) as tagged words,
// each one 8-byte store; no fence, since each word carries its own tag.
__device__ void scatterSmall(const Fifo& f, uint64_t seq, size_t bytes, const uint32_t* in) {
  uint64_t* words = f.header->ll[seq % f.nslots];
  const uint32_t n = fifoWords(bytes);
  for (uint32_t i = threadIdx.x; i < n; i += blockDim.x) {
    *reinterpret_cast<volatile uint64_t*>(&words[i]) = fifoWord(seq, in[i]);
  }
}

// Thread 0: a free slot of link `link` (towards `peer`); null on failure.
// `seq` is the message's number (the link's `sent`).
__device__ char* awaitSend(const NetContext& c, int link, int peer, uint64_t seq) {
  const Fifo& f = c.sendFifos[link];
  NetPeerCounters& k = c.counters[link];
  Patience patience(&f.header->closed);
  while (seq - vload(k.sendDone) >= f.nslots) {
    vstore(k.sendDone, loadAcquire(&f.header->done));
    if (seq - vload(k.sendDone) < f.nslots) break;
    if (patience.exhausted(c, peer)) return nullptr;
  }
  return slotOf(f, seq);
}

// Thread 0: message `seq` of link `link` is posted with `bytes`: a slot's after the
// block's barrier and a system fence (which make the block's writes to it visible to the
// proxy), a small one's tagged words without either.
__device__ void postSend(const NetContext& c, int link, size_t bytes, uint64_t seq) {
  const Fifo& f = c.sendFifos[link];
  vstore(c.counters[link].sent, seq + 1);
  uint64_t* head = &f.header->head[seq % f.nslots];
  if (f.isSmall(bytes)) {
    *reinterpret_cast<volatile uint64_t*>(head) = fifoHead(seq, bytes);
  } else {
    storeRelease(head, fifoHead(seq, bytes));
  }
}

// Thread 0, after the block's barrier: the slot of `link` has been read.
// `seq` is the message's number (the link's `consumed` when the piece began).
__device__ void releaseRecv(const NetContext& c, int link, uint64_t seq) {
  vstore(c.counters[link].consumed, seq + 1);
  storeRelease(&c.recvFifos[link].header->done, seq + 1);
}

// Every block of a lane waits here between its phases (their steps may read what
// earlier ones wrote). False when the kernel failed meanwhile.
__device__ bool laneBarrier(const NetContext& c, int lane, unsigned blocks) {
  __shared__ int ok;
  unsigned* b = c.barrier + 2 * lane;
  __syncthreads();
  if (threadIdx.x == 0) {
    ok = 1;
    volatile unsigned* gen = b + 1;
    const unsigned g = *gen;
    __threadfence();
    if (atomicAdd(b, 1u) == blocks - 1) {
      b[0] = 0;
      __threadfence();
      atomicAdd(b + 1, 1u);
    } else {
      Patience patience;
      while (*gen == g) {
        if (patience.exhausted(c, -1)) {
          ok = 0;
          break;
        }
      }
    }
    __threadfence();
  }
  __syncthreads();
  return ok != 0;
}

// Bit j: receive j of the step is from a FIFO that takes small messages as tagged words;
// bit 8 + j: send j (Fifo::small; whether a piece is small also depends on its size).
__device__ uint32_t smallFifos(const NetContext& c, const NetStep& st) {
  const int base = st.lane * c.nranks;
  uint32_t m = 0;
  for (int j = 0; j < st.nrecv; ++j) m |= uint32_t(c.recvFifos[base + st.recvPeers[j]].small) << j;
  for (int j = 0; j < st.nsend; ++j)
    m |= uint32_t(c.sendFifos[base + st.sendPeers[j]].small) << (8 + j);
  return m;
}
constexpr uint32_t kHintPhases = 2;

template <typename E>
struct StepRun {
  using S = typename E::Storage;
  const NetContext& c;
  const NetCall& a;
  const Op<E>& op;
  bool reduces;

  __device__ char* at(uint8_t buffer, uint64_t offset) const {
    switch (static_cast<Buffer>(buffer)) {
      case Buffer::kInput:
        return const_cast<char*>(static_cast<const char*>(a.in)) + offset * sizeof(S);
      case Buffer::kOutput: return static_cast<char*>(a.out) + offset * sizeof(S);
      case Buffer::kAbsolute: return reinterpret_cast<char*>(offset);
      default: return nullptr;
    }
  }

  // A piece of at most kFifoSmallBytes, combined as reduceCopy would (the same sources in
  // the same order, the pre-op on this rank's own, the post-op at the end, rounding at each
  // step; a single source without either is copied bit for bit, where reduceCopy's tail
  // goes through E::load and E::store, which may change a NaN's bits) but with every
  // pointer in a register or shared memory: reduceCopy's Io lives in local memory and it is
  // not inlined, and building the Io, the call and reading it back took 2.6-3.1 us for 8
  // bytes on an H100 (2026-12-07; 1.0 us with this), most of a small step's work.
  __device__ void combineTiny(const NetStep& st, const char* src, char* dst,
                              const char* const* recv, char* const* send, uint64_t elems,
                              bool placed) const {
    using C = typename E::Compute;
    const bool useRecv = reduces || !src;
    const bool preSrc = reduces && !st.srcPartial;
    const bool post = reduces && st.final != 0;
    const int nsrc = (src ? 1 : 0) + (useRecv ? st.nrecv : 0);
    if (nsrc == 0 || (!dst && st.nsend == 0)) return;
    // One source and nothing to apply: which one.
    const S* only = nullptr;
    if (nsrc == 1 && !post) {
      if (src && !preSrc) only = reinterpret_cast<const S*>(src);
      if (!src) only = reinterpret_cast<const S*>(recv[0]);
    }
    for (uint64_t i = threadIdx.x; i < elems; i += blockDim.x) {
      S v;
      if (only) {
        v = only[i];
      } else {
        C acc{};
        bool any = false;
        auto add = [&](C x) {
          acc = any ? rounded<E>(op.combine(acc, x)) : x;
          any = true;
        };
        auto addSrc = [&] {
          C x = E::load(reinterpret_cast<const S*>(src)[i]);
          if (preSrc) x = rounded<E>(op.pre(x));
          add(x);
        };
        if (src && !placed) addSrc();
        if (useRecv) {
          for (int j = 0; j < st.nrecv; ++j) {
            if (placed && j == st.srcAt) addSrc();
            add(E::load(reinterpret_cast<const S*>(recv[j])[i]));
          }
        }
        if (placed && st.srcAt == st.nrecv) addSrc();
        if (post) acc = op.post(acc);
        v = E::store(acc);
      }
      if (dst) reinterpret_cast<S*>(dst)[i] = v;
      for (int j = 0; j < st.nsend; ++j) reinterpret_cast<S*>(send[j])[i] = v;
    }
  }

  // Streams the step piece by piece; false on failure (the reason is in errorFlag). Small
  // pieces (Fifo::isSmall) arrive and leave as tagged words, through shared memory.
  __device__ bool run(const NetStep& st, uint64_t pieceElems, uint32_t fifoSmall) {
    __shared__ const char* recv[kMaxStepPeers];
    __shared__ char* send[kMaxStepPeers];
    __shared__ uint64_t recvSeq[kMaxStepPeers];
    __shared__ uint64_t sendSeq[kMaxStepPeers];
    __shared__ __align__(16) uint32_t smallIn[kMaxStepPeers][transport::net::kFifoSmallWords];
    __shared__ __align__(16) uint32_t smallOut[kMaxStepPeers][transport::net::kFifoSmallWords];
    __shared__ int bad;
    const uint64_t pieces = (st.count + pieceElems - 1) / pieceElems;
    for (uint64_t p = 0; p < pieces; ++p) {
      const uint64_t first = p * pieceElems;
      const uint64_t elems = min(pieceElems, st.count - first);
      const size_t bytes = elems * sizeof(S);
      const int base = st.lane * c.nranks;
      // Which of this piece's messages are small (the same answer in every thread).
      const bool tiny = bytes <= transport::net::kFifoSmallBytes;
      const unsigned smallRecvs = tiny ? fifoSmall & 0xffu : 0;
      const unsigned smallSends = tiny ? fifoSmall >> 8 : 0;
      trace(13);
      if (threadIdx.x == 0) {
        bad = 0;
        for (int j = 0; j < st.nrecv && !bad; ++j) {
          const int link = base + st.recvPeers[j];
          const Fifo& f = c.recvFifos[link];
          recvSeq[j] = vload(c.counters[link].consumed);
          if (smallRecvs & (1u << j)) {
            recv[j] = reinterpret_cast<const char*>(smallIn[j]);  // gathered below
          } else {
            bad = !awaitHead(c, f, recvSeq[j], st.recvPeers[j], bytes);
            recv[j] = slotOf(f, recvSeq[j]);
          }
        }
        for (int j = 0; j < st.nsend && !bad; ++j) {
          const int link = base + st.sendPeers[j];
          sendSeq[j] = vload(c.counters[link].sent);
          send[j] = awaitSend(c, link, st.sendPeers[j], sendSeq[j]);
          bad = send[j] == nullptr;
          if (smallSends & (1u << j)) send[j] = reinterpret_cast<char*>(smallOut[j]);
        }
        trace(2);
      }
      __syncthreads();
      if (bad) return false;
      if (smallRecvs) {
        // The words by every thread but the last few; the last ones check the heads (the
        // size), so that a message of another size fails instead of waiting.
        const unsigned workers = blockDim.x - kMaxStepPeers;
        bool ok = true;
        for (int j = 0; j < st.nrecv && ok; ++j) {
          if (!(smallRecvs & (1u << j))) continue;
          const Fifo& f = c.recvFifos[base + st.recvPeers[j]];
          if (threadIdx.x < workers) {
            ok = gatherSmall(c, f, recvSeq[j], st.recvPeers[j], bytes, smallIn[j], threadIdx.x,
                             workers);
          } else if (threadIdx.x == workers + j) {
            ok = awaitHead(c, f, recvSeq[j], st.recvPeers[j], bytes);
          }
        }
        // (Not through `bad`: a warp that had not yet read it after the first barrier
        // would return alone.)
        if (__syncthreads_or(!ok)) return false;
        trace(4);
        // The words are in shared memory: their slots are free again. The last warp says
        // so (its system fence then overlaps the first warps' reduction).
        if (threadIdx.x == blockDim.x - 1) {
          for (int j = 0; j < st.nrecv; ++j) {
            if (smallRecvs & (1u << j)) releaseRecv(c, base + st.recvPeers[j], recvSeq[j]);
          }
        }
      }
      const char* src = st.srcBuffer ? at(st.srcBuffer, st.srcOffset) + first * sizeof(S) : nullptr;
      char* dst = st.dstBuffer ? at(st.dstBuffer, st.dstOffset) + first * sizeof(S) : nullptr;
      // The source first, or at st.srcAt among what arrived (a rank-ordered sum).
      const bool placed = reduces && src && st.srcAt <= st.nrecv;
      if (tiny) {
        combineTiny(st, src, dst, recv, send, elems, placed);
      } else {
        Io io;
        auto addSrc = [&] {
          if (reduces && !st.srcPartial) io.preMask |= 1u << io.nsrc;
          io.srcs[io.nsrc++] = src;
        };
        if (src && !placed) addSrc();
        if (reduces || !src) {
          for (int j = 0; j < st.nrecv; ++j) {
            if (placed && j == st.srcAt) addSrc();
            io.srcs[io.nsrc++] = recv[j];
          }
        }
        if (placed && st.srcAt == st.nrecv) addSrc();
        io.post = reduces && st.final != 0;
        if (dst) io.dsts[io.ndst++] = dst;
        for (int j = 0; j < st.nsend; ++j) io.dsts[io.ndst++] = send[j];
        if (io.nsrc > 0 && io.ndst > 0 && elems > 0) reduceCopy<E, true>(io, op, elems);
      }
      trace(10);
      __syncthreads();
      for (int j = 0; j < st.nsend; ++j) {
        if (smallSends & (1u << j))
          scatterSmall(c.sendFifos[base + st.sendPeers[j]], sendSeq[j], bytes, smallOut[j]);
      }
      if (threadIdx.x == 0) {
        trace(7);
        const unsigned allSends = (1u << st.nsend) - 1;
        if ((smallSends & allSends) != allSends) __threadfence_system();
        for (int j = 0; j < st.nsend; ++j) postSend(c, base + st.sendPeers[j], bytes, sendSeq[j]);
        trace(3);
        for (int j = 0; j < st.nrecv; ++j) {
          if (!(smallRecvs & (1u << j))) releaseRecv(c, base + st.recvPeers[j], recvSeq[j]);
        }
        trace(5);
      }
      // Until every thread has written its words, sendSeq and smallOut stay this piece's.
      if (smallSends) __syncthreads();
    }
    return true;
  }
};

template <typename E>
__global__ void __launch_bounds__(512)
    netKernel(const __grid_constant__ NetContext c, const __grid_constant__ NetCall a) {
  traceBegin();
  const NetPlanHeader* plan =
      a.inlineWords ? reinterpret_cast<const NetPlanHeader*>(a.inlinePlan) : a.plan;
  // This block's lane, and its place among the lane's blocks.
  const NetLane* lanes = netLanes(plan);
  int lane = 0;
  while (lane + 1 < int(plan->nlanes) && blockIdx.x >= lanes[lane + 1].firstBlock) ++lane;
  const NetLane L = lanes[lane];
  const uint32_t b = blockIdx.x - L.firstBlock;
  const NetPhase* phases = netPhases(plan) + L.firstPhase;
  const NetStep* steps = netSteps(plan);
  const bool reduces = plan->reduces != 0;
  const uint64_t pieceElems = plan->pieceElems;
  // Launched with programmatic dependent launch (launchNet), this kernel may start while
  // the stream's previous kernel ends. Until griddepcontrol.wait it reads only what no
  // kernel writes: its parameters, its plan and the FIFO table (written before the
  // launch). Then it lets the stream's next kernel start likewise (only then: a kernel
  // that starts early waits for one kernel, not for a chain of them).
  // Meanwhile: which FIFOs of the first phases' steps take small messages as tagged words
  // (later phases read theirs when they come), and thread 0 fetches the start of its
  // first step's source into L2 (not L1, which the previous kernel's writes would not
  // reach: L2 is where they land).
  // The first two phases' steps are copied here too (onto the thread's stack: run()
  // indexes their peers, so they do not stay in registers). Read after the wait, the phase
  // and then its step took 2.3 us between the wait and the step's start (trace events 12
  // to 13; one H100, 2026-12-07), 1.3 us read from the copies; the reads before the wait
  // took 1.3 us longer, hidden where this kernel starts early (programmatic dependent
  // launch, the default) and not otherwise. Why the reads after the wait were that slow
  // (L1 emptied by the wait, say) is not established.
  uint32_t fifoSmall[kHintPhases] = {};
  NetStep early0, early1;
  const bool has0 = L.nphases > 0 && b < phases[0].nsteps;
  const bool has1 = L.nphases > 1 && b < phases[1].nsteps;
  if (has0) {
    early0 = steps[phases[0].firstStep + b];
    fifoSmall[0] = smallFifos(c, early0);
  }
  if (has1) {
    early1 = steps[phases[1].firstStep + b];
    fifoSmall[1] = smallFifos(c, early1);
  }
  if (has0) {
    const NetStep& st0 = early0;
    const char* src = nullptr;
    switch (static_cast<Buffer>(st0.srcBuffer)) {
      case Buffer::kInput:
        src = static_cast<const char*>(a.in) + st0.srcOffset * sizeof(typename E::Storage);
        break;
      case Buffer::kOutput:
        src = static_cast<const char*>(a.out) + st0.srcOffset * sizeof(typename E::Storage);
        break;
      case Buffer::kAbsolute: src = reinterpret_cast<const char*>(st0.srcOffset); break;
      default: break;
    }
    if (src && threadIdx.x == 0) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(src));
    }
  }
  trace(11);
  // From here on: the counters and the buffers, which earlier work of the stream wrote.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  trace(12);
  Op<E> op{a.red, typename E::Compute(1), typename E::Compute(a.divisor ? a.divisor : 1)};
  if (a.red == RedKind::kPreMulSum) op.scalar = scalarFor<E>(a.scalar, a.scalarDevice);
  StepRun<E> run{c, a, op, reduces};
  for (uint32_t p = 0; p < L.nphases; ++p) {
    traceSetPhase(p);
    if (p == 0 ? has0 : p == 1 ? has1 : b < phases[p].nsteps) {
      const NetStep st = p == 0 ? early0 : p == 1 ? early1 : steps[phases[p].firstStep + b];
      const uint32_t hint = p == 0 ? fifoSmall[0] : p == 1 ? fifoSmall[1] : smallFifos(c, st);
      if (!run.run(st, pieceElems, hint)) break;
    }
    if (p + 1 < L.nphases && L.blocks > 1 && !laneBarrier(c, lane, L.blocks)) break;
  }
  traceEnd();
}

#ifdef LOOM_NET_TRACE
__global__ void traceClockKernel(volatile int* go, volatile unsigned long long* out) {
  while (*go == 0) {
  }
  *out = globalTimer();
}
#endif

}  // namespace

#ifdef LOOM_NET_TRACE
void dumpNetTrace(const char* path) {
  static unsigned long long h[kTraceMax][kTraceEvents];
  unsigned n = 0;
  cudaMemcpyFromSymbol(&n, gTraceN, sizeof(n));
  n = n < kTraceMax ? n : kTraceMax;
  cudaMemcpyFromSymbol(h, gTrace, sizeof(unsigned long long) * kTraceEvents * n);
  FILE* f = fopen(path, "w");
  if (!f) return;
  // Clock: the GPU stamps its timer when the host sets `go` (host time t0); the host
  // sees the stamp at t1. The GPU timer's value lies between t0 and t1 in host time.
  int* go = nullptr;
  unsigned long long* out = nullptr;
  cudaHostAlloc(&go, sizeof(int), cudaHostAllocMapped);
  cudaHostAlloc(&out, sizeof(unsigned long long), cudaHostAllocMapped);
  for (int k = 0; k < 5; ++k) {
    *(volatile int*)go = 0;
    *(volatile unsigned long long*)out = 0;
    traceClockKernel<<<1, 1>>>(go, out);
    usleep(20000);
    timespec a, b;
    clock_gettime(CLOCK_REALTIME, &a);
    *(volatile int*)go = 1;
    while (*(volatile unsigned long long*)out == 0) {
    }
    clock_gettime(CLOCK_REALTIME, &b);
    cudaDeviceSynchronize();
    fprintf(f, "clock %lld %llu %lld\n", a.tv_sec * 1000000000ll + a.tv_nsec, *out,
            b.tv_sec * 1000000000ll + b.tv_nsec);
  }
  for (unsigned i = 0; i < n; ++i) {
    fprintf(f, "k");
    for (int e = 0; e < kTraceEvents; ++e) fprintf(f, " %llu", h[i][e]);
    fprintf(f, "\n");
  }
  fclose(f);
  cudaFreeHost(go);
  cudaFreeHost(out);
}
#endif

int preloadNetKernels() {
  int e = 0;
  for (int t = 0; t < kNumDataTypes; ++t) {
    const int k = withElement(static_cast<DataType>(t), [](auto el) {
      cudaFuncAttributes fa{};
      return static_cast<int>(cudaFuncGetAttributes(&fa, netKernel<decltype(el)>));
    });
    e = e ? e : k;
  }
  return e;
}

int launchNet(const NetContext& ctx, const NetCall& call, cudaStream_t stream, bool pdl) {
  const unsigned blocks = std::max<uint32_t>(1, call.blocks);
  const unsigned threads = static_cast<unsigned>(std::clamp(ctx.threads, 64, 512)) / 32 * 32;
  return withElement(call.type, [&](auto e) {
    // Programmatic dependent launch: the kernel may start (and read its plan) while the
    // stream's previous kernel ends, which hides most of the gap between two calls. A
    // driver that refuses it gets a plain launch, from then on.
    static std::atomic<bool> driverTakesPdl{true};
    if (pdl && driverTakesPdl.load(std::memory_order_relaxed)) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(blocks);
      cfg.blockDim = dim3(threads);
      cfg.stream = stream;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      const cudaError_t e0 = cudaLaunchKernelEx(&cfg, netKernel<decltype(e)>, ctx, call);
      if (e0 == cudaSuccess) return 0;
      if (e0 != cudaErrorNotSupported && e0 != cudaErrorInvalidValue) return static_cast<int>(e0);
      cudaGetLastError();
      driverTakesPdl.store(false, std::memory_order_relaxed);
    }
    netKernel<decltype(e)><<<blocks, threads, 0, stream>>>(ctx, call);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace loom::collectives::device
