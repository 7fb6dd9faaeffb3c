// The network executor's kernel: runs a plan (net_plan.h) on device buffers, moving every
// piece through the FIFOs of transports/net/net_fifo.h, which the proxy carries over the
// network. One CUDA block per step of a phase; the phases one after another (a barrier
// of the grid between them). Each piece of a step: wait for every peer's slot to
// arrive and for a free slot towards every peer it sends to, combine the sources (its own
// data, and what arrived) into the destinations (its output, and the slots it sends),
// then hand the slots on. Everything happens on the caller's stream; the host is not
// involved after the launch, so a launch captured in a CUDA graph replays as it is.
//
// The kernel is the only writer of a send FIFO's `posted` and a receive FIFO's `done`;
// it keeps its own copies of them (and the last `done` it saw of each send FIFO) in
// device memory, so a piece reads host memory only for what the proxy writes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/device/net_plan.h"
#include "common/datatype.h"
#include "nccl.h"  // cudaStream_t
#include "transports/net/net_fifo.h"

namespace loom::collectives::device {

// Codes the kernel leaves in NetContext::errorFlag (the first failure wins).
inline constexpr int kNetErrorAborted = 1;   // ncclCommAbort
inline constexpr int kNetErrorTimeout = 2;   // a wait went past LOOM_TIMEOUT_MS
inline constexpr int kNetErrorClosed = 3;    // the proxy closed a FIFO this kernel waited on
inline constexpr int kNetErrorMismatch = 4;  // a piece arrived with another size than expected

// Per link, the kernel's own counters (device memory).
struct NetPeerCounters {
  uint64_t sent = 0;      // slots posted to the send FIFO towards the peer
  uint64_t sendDone = 0;  // the proxy's `done` of that FIFO, as last read
  uint64_t consumed = 0;  // slots of the receive FIFO from the peer released
  uint64_t pad = 0;
};

// Connections are indexed by link: lane * nranks + peer (net_plan.h's NetLink).
struct NetContext {
  const transport::net::Fifo* sendFifos = nullptr;  // [kNetMaxLanes * nranks] (device memory)
  const transport::net::Fifo* recvFifos = nullptr;
  NetPeerCounters* counters = nullptr;  // [kNetMaxLanes * nranks] (device memory)
  unsigned* barrier = nullptr;          // per lane 2 words: arrivals, generation (device memory)
  int nranks = 1;
  const volatile int* abortFlag = nullptr;  // host-mapped: set by ncclCommAbort
  int* errorFlag = nullptr;                 // host-mapped: a kNetError* code
  int* errorPeer = nullptr;                 // host-mapped: the peer it concerns, or -1
  uint64_t timeoutNs = 0;                   // 0: wait forever
  int rank = 0;
  int threads = 512;
};

// A plan this small travels in the kernel's parameters (NetCall::inlinePlan): the kernel
// reads it from the parameter bank instead of device memory, and a send/receive's plan
// needs no upload ahead of its kernel.
inline constexpr size_t kNetInlinePlanWords = 48;

struct NetCall {
  DataType type = DataType::kFloat32;
  RedKind red = RedKind::kSum;
  double scalar = 1.0;                 // PreMulSum (host value)
  const void* scalarDevice = nullptr;  // PreMulSum with ncclScalarDevice: read by the kernel
  uint64_t divisor = 1;                // SumPostDiv
  const void* in = nullptr;
  void* out = nullptr;
  const NetPlanHeader* plan = nullptr;  // device memory (unless inlined)
  uint32_t blocks = 1;                  // plan->blocks, as the host knows it
  uint32_t inlineWords = 0;             // the plan's words in inlinePlan (0: at `plan`)
  uint64_t inlinePlan[kNetInlinePlanWords] = {};
};

// Enqueues the plan on `stream`, with programmatic dependent launch where `pdl` (and the
// driver takes it). Returns a cudaError_t value (0: success).
int launchNet(const NetContext& ctx, const NetCall& call, cudaStream_t stream, bool pdl);
// Loads the network kernel for every element type now (as preloadMeshKernels, mesh.h).
int preloadNetKernels();
#ifdef LOOM_NET_TRACE
void dumpNetTrace(const char* path);
#endif

}  // namespace loom::collectives::device
