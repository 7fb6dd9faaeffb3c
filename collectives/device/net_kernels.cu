// The network executor's kernel (see net.h for the protocol, net_fifo.h for the FIFOs).
//
// Thread 0 of a block does the waiting and the counting; every thread moves data
// (reduceCopy). The counters are page-locked host memory the GPU maps, the slots too or
// GPU memory that the NIC reads and writes (GPUDirect RDMA): loads with acquire at system
// scope for what the proxy writes, and the block's barrier followed by thread 0's system
// fence and release store before a slot is handed on.
#include <cuda_runtime.h>

#include <algorithm>

#include "collectives/device/net.h"
#include "collectives/device/reduce_copy_device.cuh"

namespace loom::collectives::device {

namespace {

using namespace detail;
using transport::net::Fifo;
using transport::net::FifoHeader;

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

// Thread 0: the next slot of link `link` (from `peer`), once the proxy has it; null on
// failure.
__device__ const char* awaitRecv(const NetContext& c, int link, int peer, size_t bytes) {
  const Fifo& f = c.recvFifos[link];
  const uint64_t seq = vload(c.counters[link].consumed);
  Patience patience(&f.header->closed);
  while (loadAcquire(&f.header->posted) <= seq) {
    if (patience.exhausted(c, peer)) return nullptr;
  }
  const uint64_t got = *reinterpret_cast<volatile uint64_t*>(&f.header->sizes[seq % f.nslots]);
  if (got != bytes) {
    raise(c, kNetErrorMismatch, peer);
    return nullptr;
  }
  return slotOf(f, seq);
}

// Thread 0: a free slot of link `link` (towards `peer`); null on failure.
__device__ char* awaitSend(const NetContext& c, int link, int peer) {
  const Fifo& f = c.sendFifos[link];
  NetPeerCounters& k = c.counters[link];
  const uint64_t seq = vload(k.sent);
  Patience patience(&f.header->closed);
  while (seq - vload(k.sendDone) >= f.nslots) {
    vstore(k.sendDone, loadAcquire(&f.header->done));
    if (seq - vload(k.sendDone) < f.nslots) break;
    if (patience.exhausted(c, peer)) return nullptr;
  }
  return slotOf(f, seq);
}

// Thread 0, after the block's barrier and a system fence (which make the block's writes
// to the slot visible to the proxy): the slot of `link` is filled with `bytes`. The
// release store of `posted` orders the size before it.
__device__ void postSend(const NetContext& c, int link, size_t bytes) {
  const Fifo& f = c.sendFifos[link];
  NetPeerCounters& k = c.counters[link];
  const uint64_t seq = vload(k.sent);
  *reinterpret_cast<volatile uint64_t*>(&f.header->sizes[seq % f.nslots]) = bytes;
  vstore(k.sent, seq + 1);
  storeRelease(&f.header->posted, seq + 1);
}

// Thread 0, after the block's barrier: the slot of `link` has been read.
__device__ void releaseRecv(const NetContext& c, int link) {
  const Fifo& f = c.recvFifos[link];
  NetPeerCounters& k = c.counters[link];
  const uint64_t seq = vload(k.consumed) + 1;
  vstore(k.consumed, seq);
  storeRelease(&f.header->done, seq);
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

  // Streams the step piece by piece; false on failure (the reason is in errorFlag).
  __device__ bool run(const NetStep& st, uint64_t pieceElems) {
    __shared__ const char* recv[kMaxStepPeers];
    __shared__ char* send[kMaxStepPeers];
    __shared__ int bad;
    const uint64_t pieces = (st.count + pieceElems - 1) / pieceElems;
    for (uint64_t p = 0; p < pieces; ++p) {
      const uint64_t first = p * pieceElems;
      const uint64_t elems = min(pieceElems, st.count - first);
      const size_t bytes = elems * sizeof(S);
      const int base = st.lane * c.nranks;
      if (threadIdx.x == 0) {
        bad = 0;
        for (int j = 0; j < st.nrecv && !bad; ++j) {
          recv[j] = awaitRecv(c, base + st.recvPeers[j], st.recvPeers[j], bytes);
          bad = recv[j] == nullptr;
        }
        for (int j = 0; j < st.nsend && !bad; ++j) {
          send[j] = awaitSend(c, base + st.sendPeers[j], st.sendPeers[j]);
          bad = send[j] == nullptr;
        }
      }
      __syncthreads();
      if (bad) return false;
      Io io;
      const char* src = st.srcBuffer ? at(st.srcBuffer, st.srcOffset) + first * sizeof(S) : nullptr;
      char* dst = st.dstBuffer ? at(st.dstBuffer, st.dstOffset) + first * sizeof(S) : nullptr;
      if (src) io.srcs[io.nsrc++] = src;
      if (reduces || !src) {
        for (int j = 0; j < st.nrecv; ++j) io.srcs[io.nsrc++] = recv[j];
      }
      if (reduces && src && !st.srcPartial) io.preMask = 1;
      io.post = reduces && st.final != 0;
      if (dst) io.dsts[io.ndst++] = dst;
      for (int j = 0; j < st.nsend; ++j) io.dsts[io.ndst++] = send[j];
      if (io.nsrc > 0 && io.ndst > 0 && elems > 0) reduceCopy<E>(io, op, elems);
      __syncthreads();
      if (threadIdx.x == 0) {
        if (st.nsend > 0) __threadfence_system();
        for (int j = 0; j < st.nsend; ++j) postSend(c, base + st.sendPeers[j], bytes);
        for (int j = 0; j < st.nrecv; ++j) releaseRecv(c, base + st.recvPeers[j]);
      }
    }
    return true;
  }
};

template <typename E>
__global__ void __launch_bounds__(512)
    netKernel(const __grid_constant__ NetContext c, const __grid_constant__ NetCall a) {
  const NetPlanHeader* plan = a.plan;
  Op<E> op{a.red, typename E::Compute(1), typename E::Compute(a.divisor ? a.divisor : 1)};
  if (a.red == RedKind::kPreMulSum) op.scalar = scalarFor<E>(a.scalar, a.scalarDevice);
  StepRun<E> run{c, a, op, plan->reduces != 0};
  // This block's lane, and its place among the lane's blocks.
  const NetLane* lanes = netLanes(plan);
  int lane = 0;
  while (lane + 1 < int(plan->nlanes) && blockIdx.x >= lanes[lane + 1].firstBlock) ++lane;
  const NetLane L = lanes[lane];
  const uint32_t b = blockIdx.x - L.firstBlock;
  const NetPhase* phases = netPhases(plan) + L.firstPhase;
  const NetStep* steps = netSteps(plan);
  for (uint32_t p = 0; p < L.nphases; ++p) {
    const NetPhase ph = phases[p];
    if (b < ph.nsteps) {
      const NetStep st = steps[ph.firstStep + b];
      if (!run.run(st, plan->pieceElems)) break;
    }
    if (p + 1 < L.nphases && L.blocks > 1 && !laneBarrier(c, lane, L.blocks)) break;
  }
}

}  // namespace

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

int launchNet(const NetContext& ctx, const NetCall& call, cudaStream_t stream) {
  const unsigned blocks = std::max<uint32_t>(1, call.blocks);
  const unsigned threads = static_cast<unsigned>(std::clamp(ctx.threads, 64, 512)) / 32 * 32;
  return withElement(call.type, [&](auto e) {
    netKernel<decltype(e)><<<blocks, threads, 0, stream>>>(ctx, call);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace loom::collectives::device
