// Device collectives for ranks whose GPUs all reach each other directly (one host,
// NVLink or PCIe peer-to-peer): the "mesh" executor.
//
// Every rank owns a window in its GPU's memory that every peer maps (transports/p2p).
// The window holds, for each (sender, block) pair, a ring of `slots` buffers and two
// 64-bit counters: `ready` (written by the sender when it filled a slot) and `ack`
// (in the sender's window, written by the receiver when it emptied one). Each CUDA
// block of a collective kernel owns one such channel per peer and direction, so blocks
// never wait on each other; a block pushes its tiles into the peers' slots with plain
// stores (release at system scope on the counter), and reduces or copies what arrived
// in its own window. Counters live in device memory and only grow, so a kernel
// captured in a CUDA graph can be replayed any number of times.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/datatype.h"
#include "common/host_device.h"
#include "nccl.h"  // cudaStream_t

namespace loom::collectives::device {

inline constexpr int kMaxRanks = 8;         // ranks of one mesh (one host)
inline constexpr int kMaxP2pOps = 32;       // Send/Recv calls of one group on one communicator
inline constexpr size_t kFlagStride = 128;  // bytes between counters (one per cache line)
// The LL ("low latency") region: small all-reduces send 4 bytes of data and a 4-byte
// flag in every 8-byte store, so the receiver needs no fence and no counter. Each block
// carries up to kLLPayload bytes per call to each peer, in one of two buffers chosen by
// the parity of its call count: at most kLLBlocks * kLLPayload (1 MiB) per peer and call.
inline constexpr int kLLBlocks = 128;
inline constexpr size_t kLLPayload = 8 * 1024;
inline constexpr size_t kLLRegion = 2 * kLLPayload;  // 8 bytes of data take 16 on the wire
// The LL128 region, for mid sizes: 128-byte lines of 120 data bytes and an 8-byte flag, each
// line stored by 8 threads of a warp in one instruction and read back the same way. NVLink
// delivers such a line whole (NCCL's LL128 protocol relies on the same), so a reader that
// sees the flag sees the line's data: no fence, no counter, 94 % of the bytes are data.
// The same kLLBlocks blocks and call counts as LL; Geometry::ll128Lines lines per block,
// peer and parity.
inline constexpr size_t kLL128Line = 128;
inline constexpr size_t kLL128Data = 120;

struct Geometry {
  int nranks = 0;
  int maxBlocks = 32;
  int slots = 4;
  size_t slotBytes = 256 * 1024;
  int ll128Lines = 0;  // LL128 lines per block, peer and parity (0: no LL128 region)

  LOOM_HOST_DEVICE size_t flagBytes() const {
    return 2 * size_t(kMaxRanks) * size_t(maxBlocks) * kFlagStride;
  }
  LOOM_HOST_DEVICE size_t llBytes() const { return size_t(nranks) * kLLBlocks * 2 * kLLRegion; }
  LOOM_HOST_DEVICE size_t ll128Offset() const { return flagBytes() + llBytes(); }
  LOOM_HOST_DEVICE size_t ll128Bytes() const {
    return size_t(nranks) * kLLBlocks * 2 * size_t(ll128Lines) * kLL128Line;
  }
  // The most an LL128 call carries to each peer.
  LOOM_HOST_DEVICE size_t ll128Capacity() const {
    return size_t(kLLBlocks) * size_t(ll128Lines) * kLL128Data;
  }
  // One counter per rank for the barriers around copy-engine collectives (copy_plan.h).
  LOOM_HOST_DEVICE size_t barrierOffset() const { return ll128Offset() + ll128Bytes(); }
  LOOM_HOST_DEVICE size_t barrierBytes() const { return size_t(kMaxRanks) * kFlagStride; }
  // Chunk counters of the copy-engine all-reduce and reduce (chunk_plan.h): per peer, how
  // many chunks it pushed into our scratch (`ready`), and how many of ours it has reduced
  // (`free`, so its scratch slot may be written again).
  LOOM_HOST_DEVICE size_t chunkFlagOffset() const { return barrierOffset() + barrierBytes(); }
  LOOM_HOST_DEVICE size_t chunkFlagBytes() const { return 2 * size_t(kMaxRanks) * kFlagStride; }
  LOOM_HOST_DEVICE size_t slotsOffset() const { return chunkFlagOffset() + chunkFlagBytes(); }
  // The slots for messages from one sender (every block's), and where rank `from`'s begin.
  LOOM_HOST_DEVICE size_t senderSlotsBytes() const {
    return size_t(maxBlocks) * size_t(slots) * slotBytes;
  }
  LOOM_HOST_DEVICE size_t senderSlotsOffset(int from) const {
    return slotsOffset() + size_t(from) * senderSlotsBytes();
  }
  LOOM_HOST_DEVICE size_t windowBytes() const { return senderSlotsOffset(nranks); }
  // Per-rank private counters: sent and received per block and peer, then the LL call
  // count per LL block, then the barrier count.
  LOOM_HOST_DEVICE size_t llSeqIndex(int block) const {
    return 2 * size_t(kMaxRanks) * size_t(maxBlocks) + block;
  }
  LOOM_HOST_DEVICE size_t barrierSeqIndex() const { return llSeqIndex(0) + kLLBlocks; }
  // Blocks of a pulled all-reduce that finished (the last one resets it).
  LOOM_HOST_DEVICE size_t pullDoneIndex() const { return barrierSeqIndex() + 1; }
  // Blocks of a chunk reduction that finished (the last one resets it).
  LOOM_HOST_DEVICE size_t chunkDoneIndex() const { return pullDoneIndex() + 1; }
  LOOM_HOST_DEVICE size_t stateBytes() const { return (chunkDoneIndex() + 1) * sizeof(uint64_t); }
};

enum class MeshKind : int {
  kAllReduceOneShot = 0,
  kAllReduceTwoShot = 1,
  kAllGather = 2,
  kBroadcast = 3,
  kReduceScatter = 4,
  kReduce = 5,
  kAllToAll = 6,
  kSendRecv = 7,
  kAllReduceLL = 8,       // one-shot through the LL region (at most kLLBlocks * kLLPayload bytes)
  kReduceDirect = 9,      // every rank's input to the root, reduced there (2 ranks)
  kReduceLL = 10,         // kAllReduceLL with only the root writing its output
  kReduceScatterLL = 11,  // each rank sends each peer that peer's part in LL words
  kAllReduceLL128 = 12,   // the LL forms through the LL128 region (mid sizes)
  kReduceLL128 = 13,
  kReduceScatterLL128 = 14,
};
// The LL forms: each rank sends each peer `count` elements in LL words (an all-reduce or
// reduce its whole input, a reduce-scatter the peer's part), at most kLLBlocks * kLLPayload
// bytes.
LOOM_HOST_DEVICE inline bool isLL(MeshKind k) {
  return k == MeshKind::kAllReduceLL || k == MeshKind::kReduceLL || k == MeshKind::kReduceScatterLL;
}
// The same three through the LL128 region (at most Geometry::ll128Capacity() bytes).
LOOM_HOST_DEVICE inline bool isLL128(MeshKind k) {
  return k == MeshKind::kAllReduceLL128 || k == MeshKind::kReduceLL128 ||
         k == MeshKind::kReduceScatterLL128;
}
const char* meshKindName(MeshKind kind);

struct MeshContext {
  Geometry geo;
  int rank = 0;
  int nranks = 0;
  char* windows[kMaxRanks] = {};  // every rank's window as mapped in this process (own too)
  uint64_t* state = nullptr;      // this rank's private counters (device memory)
  const volatile int* abortFlag = nullptr;  // device view of a host-mapped flag
  int* errorFlag = nullptr;                 // device view of a host-mapped error code
  uint64_t timeoutNs = 0;
  int threads = 512;
  bool pdl = false;  // host side: launch with programmatic stream serialization (mesh_kernels.cu)
};

// Codes a kernel leaves in errorFlag.
inline constexpr int kMeshErrorAborted = 1;
inline constexpr int kMeshErrorTimeout = 2;

struct P2pOp {
  void* buffer = nullptr;  // send: read from; recv: written to
  size_t bytes = 0;
  int peer = 0;
  int isSend = 0;
  int seq = 0;  // index among this group's calls with the same peer and direction
};

// Send/Recv tiles depend only on the message's size, which both ends know (the group's
// other calls may differ between the two ranks).
LOOM_HOST_DEVICE inline size_t p2pTileBytes(size_t bytes, int maxBlocks, size_t slotBytes) {
  size_t t = (bytes + maxBlocks - 1) / maxBlocks;
  t = t < 16 * 1024 ? 16 * 1024 : t;
  t = t > slotBytes ? slotBytes : t;
  return t / 16 * 16;
}

struct MeshCall {
  MeshKind kind = MeshKind::kAllReduceOneShot;
  DataType type = DataType::kFloat32;
  RedKind red = RedKind::kSum;
  double scalar = 1.0;                 // PreMulSum (host value)
  const void* scalarDevice = nullptr;  // PreMulSum with ncclScalarDevice: read by the kernel
  uint64_t divisor = 1;                // SumPostDiv
  const void* in = nullptr;
  void* out = nullptr;
  size_t count = 0;  // the C API's count
  int root = 0;
};

// The Send/Recv calls of one group (kSendRecv), passed to their own kernel so that the
// collectives' launches carry small parameters.
struct P2pList {
  int nops = 0;
  P2pOp ops[kMaxP2pOps];
};

struct LaunchShape {
  int blocks = 0;
  size_t tileElems = 0;
};

// The grid and tile size a call will use (deterministic: the same on every rank).
// (kSendRecv: the whole grid on every rank; each message tiles itself, p2pTileBytes.)
LaunchShape meshShape(const MeshContext& ctx, const MeshCall& call);

// Enqueues the call on `stream` (`p2p` for kSendRecv). Returns a cudaError_t value (0: success).
int launchMesh(const MeshContext& ctx, const MeshCall& call, cudaStream_t stream,
               const P2pList* p2p = nullptr);

// One-shot all-reduce for ranks whose inputs every rank can read (peer access in one
// process, registered memory between processes): each rank reads every rank's input (`inputs`, in
// rank order) and writes the whole result to its own output; no slots, no per-tile handshakes. The
// kernel waits for every peer to arrive first and, before it ends, for every peer to finish
// reading, so inputs may change after it. Outputs must not overlap inputs. No pre-op is applied, so
// not for PreMulSum (ncclAvg on floats included). Returns a cudaError_t value.
// With `writer` >= 0 only that rank reads and writes its output (a reduce to that root);
// the others only arrive and wait until it finished reading their inputs.
struct PullInputs {
  const void* inputs[kMaxRanks] = {};
  int writer = -1;
  void* outputs[kMaxRanks] = {};  // the two-shot form only: every rank's output
};
int launchPullAllReduce(const MeshContext& ctx, const MeshCall& call, const PullInputs& in,
                        cudaStream_t stream);

// Two-shot all-reduce for ranks that can all read each other's input and write each
// other's output (`in.inputs`, `in.outputs`, in rank order): rank r reads part r of every
// rank's input (part r of n), reduces it and stores the result into part r of every rank's
// output, so each element is read and written by one thread only: it works in place
// (outputs equal to inputs) as well as out of place, with no counter between the two
// halves. The same bytes cross each link as with the one-shot form, half of them as
// stores. Arrive and leave as the one-shot form; the leave also publishes the stores into
// the peers' outputs. Each rank's output must not overlap any input but its own, and then
// only as the same buffer. No pre-op (not for PreMulSum). Returns a cudaError_t value.
// A null output is left out: with only the root's given, this is a reduce whose ranks
// each store their part into the root's output.
int launchPullTwoShot(const MeshContext& ctx, const MeshCall& call, const PullInputs& in,
                      cudaStream_t stream);

// Where the chunk counter `kind` (kChunkReady, kChunkFree) that rank `from` writes lives in
// `owner`'s window.
inline constexpr int kChunkReady = 0, kChunkFree = 1;
LOOM_HOST_DEVICE inline uint64_t* chunkFlag(const MeshContext& c, int owner, int kind, int from) {
  return reinterpret_cast<uint64_t*>(c.windows[owner] + c.geo.chunkFlagOffset() +
                                     (size_t(kind) * kMaxRanks + from) * kFlagStride);
}

// The copy-engine all-reduce and reduce (chunk_plan.h): the kernels that follow the copies.
// A counter value of 0 means "none".
struct ChunkFlags {
  uint64_t signal[kMaxRanks] = {};  // ready[us] in peer p's window := signal[p]
  uint64_t wait[kMaxRanks] = {};    // then wait until free[p] in our window >= wait[p]
};
// One warp: after the copies before it on `stream`, tells each peer how many chunks it has
// (release at system scope), then waits until each peer freed the slots named.
int launchChunkFlags(const MeshContext& ctx, const ChunkFlags& flags, cudaStream_t stream);

// One chunk of our segment: waits until every peer's copy of it landed (ready[q] in our
// window >= wait[q]), reduces the sources (in rank order: our input and the peers' copies)
// into `out`, then tells each peer its slot is free (free[us] in q's window := signal[q],
// then the same in freeMirror where given).
// The op is applied as in MeshCall; PreMulSum multiplies every source by the one scalar.
struct ChunkReduce {
  DataType type = DataType::kFloat32;
  RedKind red = RedKind::kSum;
  double scalar = 1.0;
  uint64_t divisor = 1;
  const void* srcs[kMaxRanks] = {};
  void* out = nullptr;
  size_t count = 0;
  uint64_t wait[kMaxRanks] = {};
  uint64_t signal[kMaxRanks] = {};
  int maxBlocks = 0;  // at most this many blocks (0: the mesh's); parts are at least 64 KiB
  // Host-mapped copies of the free counters, [pusher * kMaxRanks + owner] (null: none),
  // written after the counters themselves.
  uint64_t* freeMirror = nullptr;
};
int launchChunkReduce(const MeshContext& ctx, const ChunkReduce& chunk, cudaStream_t stream);

// Whether the kernels loaded for the current device wait for their stream predecessor
// (compiled for compute_90 or later, which also means the device is): only then may they
// be launched with `pdl`.
bool kernelsWaitForPredecessor();

// Loads every mesh kernel for the current device now (cudaFuncGetAttributes), as NCCL
// loads its own at init. Under CUDA's lazy loading (the default since 12.2) a kernel is
// otherwise loaded at its first launch, which may wait for the whole context: for a kernel
// that spins until a peer's kernel of the same process arrives, that peer's first launch
// would then wait for it forever. Returns a cudaError_t value.
int preloadMeshKernels();

// Enqueues a barrier of every rank of the mesh on `stream`: one small kernel that tells
// each peer this rank got here and waits until every peer did (counters in the windows,
// system-scope release and acquire, so work before it on any rank's stream, copies
// included, is visible to work after it on every rank's). Returns a cudaError_t value.
int launchMeshBarrier(const MeshContext& ctx, cudaStream_t stream);

}  // namespace loom::collectives::device
