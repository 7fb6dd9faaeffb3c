// The GPU mesh's choice of form for each call (collectives/device/mesh.h), as pure
// functions of the call's facts and the limits every rank agreed at init. The executor
// (cuda_executor.h) gathers the facts, asks, and runs what comes back; the choices
// are tested on the CPU (tests/collectives/mesh_plan_test.cc). Every rank asks with the
// same limits and, where a fact decides, with facts every rank sees alike (the calls every
// rank of the process posted), so every rank chooses the same form.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/algo_request.h"
#include "collectives/device/mesh.h"
#include "collectives/schedule.h"

namespace loom::collectives::device {

// The sizes that pick the forms, as the ranks agreed them at init (LOOM_P2P_*, resolved for
// the rank count): "up to" limits are 0 when off and UINT64_MAX for any size, "from"
// thresholds UINT64_MAX when off (docs/environment.md gives each default).
struct MeshSizes {
  uint64_t llBytes = 0;                       // LOOM_P2P_LL_BYTES
  uint64_t ll128Bytes = 0;                    // LOOM_P2P_LL128_BYTES
  uint64_t oneShotBytes = 0;                  // LOOM_P2P_ONESHOT_BYTES
  uint64_t ceBytes = UINT64_MAX;              // LOOM_P2P_CE_BYTES
  uint64_t reduceDirectBytes = 0;             // LOOM_P2P_REDUCE_DIRECT_BYTES
  uint64_t pullBytes = 0;                     // LOOM_P2P_PULL_BYTES
  uint64_t pullReduceBytes = 0;               // LOOM_P2P_PULL_REDUCE_BYTES
  uint64_t twoShotReduceBytes = 0;            // LOOM_P2P_TWOSHOT_REDUCE_BYTES
  uint64_t cePullBytes = UINT64_MAX;          // LOOM_P2P_CE_PULL_BYTES
  uint64_t chunkReduceBytes = UINT64_MAX;     // LOOM_P2P_CE_REDUCE_BYTES
  uint64_t chunkAllReduceBytes = UINT64_MAX;  // LOOM_P2P_CE_ALLREDUCE_BYTES
  uint64_t chunkSize = 0;                     // LOOM_P2P_CE_CHUNK_BYTES (0: by form)
  uint64_t scratchBytes = 0;                  // LOOM_P2P_CE_SCRATCH_BYTES
  bool operator==(const MeshSizes&) const = default;
};

// The chunked forms' scratch: slots per peer (a reduce's; the scratch is sized for these),
// and chunks of at most this many bytes for the all-reduce, which takes 4 slots where each
// holds that much.
inline constexpr size_t kChunkSlots = 2;
inline constexpr size_t kChunkAllReduceBytes = size_t(64) << 20;

// The LL forms and the LL128 forms, or neither, for a call that sends each peer `bytes`.
enum class FlagForm { kNone, kLL, kLL128 };

// What the planner reads, resolved once at init (resolveMeshLimits).
struct MeshLimits {
  int nranks = 0;
  AlgoRequest algo;  // LOOM_ALGO as every rank agreed it
  Proto proto = Proto::kAuto;
  // Whether LOOM_ALGO leaves out any of the mesh's names (oneshot, twoshot, ring, tree,
  // direct): only then do the size rules and the one-process forms stand aside
  // ("^nvls", NCCL's way to turn NVLink SHARP off, leaves the mesh as it is).
  bool algoRestricts = false;
  bool anyTwoShot = true;  // LOOM_ALGO allows twoshot, ring or tree (or says nothing)
  // What LOOM_ALGO forces among the mesh's forms (all false when it forces nothing here).
  bool forceOneShot = false;         // all-reduce: oneshot and none of twoshot, ring, tree
  bool forceTwoShot = false;         // all-reduce: twoshot, ring or tree, and not oneshot
  bool forceReduceDirect = false;    // reduce: direct or oneshot, none of twoshot, ring, tree
  bool forceReduceTwoStage = false;  // reduce: twoshot, ring or tree, neither direct nor oneshot
  size_t llLimit = 0;                // the LL forms up to this size (bytes sent to each peer)
  size_t ll128Limit = 0;             // the LL128 forms above llLimit up to this size
  size_t oneShotMax = 0;
  size_t ceMin = SIZE_MAX;
  size_t reduceDirectMax = 0;
  size_t pullMax = 0;
  size_t pullReduceMax = 0;
  size_t twoShotReduceMax = 0;
  size_t cePullMin = SIZE_MAX;
  size_t chunkReduceMin = SIZE_MAX;     // SIZE_MAX: never
  size_t chunkAllReduceMin = SIZE_MAX;  // SIZE_MAX: never
  size_t chunkSize = 0;                 // 0: by form
  size_t chunkMax = 0;                  // a chunk's most bytes (a multiple of 64 KiB)
  int allReduceSlots = 2;               // the chunked all-reduce's slots per peer

  FlagForm flagForm(size_t bytes) const;
  // No LOOM_ALGO and above both flag forms' limits: where the pulled and chunked forms start.
  bool pastFlagForms(size_t bytes) const;
  // An all-reduce of `bytes` may take the pulled form (up to LOOM_P2P_PULL_BYTES).
  bool pullSize(size_t bytes) const { return pastFlagForms(bytes) && bytes <= pullMax; }
  // A reduce of `bytes` may take the two-shot pulled form (ranks of one process).
  bool twoShotReduceSize(size_t bytes) const {
    return pastFlagForms(bytes) && bytes <= twoShotReduceMax;
  }
  // A call may take the chunked form: a reduce from LOOM_P2P_CE_REDUCE_BYTES, an
  // all-reduce from LOOM_P2P_CE_ALLREDUCE_BYTES.
  bool chunkedSize(CollType type, size_t bytes) const;
  // A copy collective between processes (registered inputs) pulls its blocks with the copy
  // engines (see mesh_plan.cc for where this was measured faster).
  bool pullCopyWins(MeshKind kind, size_t block) const;
};

// The limits from the agreed sizes, LOOM_ALGO and LOOM_PROTO for `nranks` ranks.
// `ll128Capacity`: the most an LL128 call carries to each peer (Geometry::ll128Capacity(),
// 0 without the region). `sharedBlocks`: where ranks share a GPU, the blocks each kernel
// may use (the LL forms launch a block per 8 KiB, LL128 per 16 KiB, sent to each peer, so
// their limits shrink to fit, and the chunked forms are off); 0 when the GPU is not shared.
MeshLimits resolveMeshLimits(const MeshSizes& sizes, const AlgoRequest& algo, Proto proto,
                             int nranks, size_t ll128Capacity, int sharedBlocks);

// Whether the LL128 region is needed (the window is sized for it): LOOM_PROTO=ll128, or an
// LL128 limit above 0 that LOOM_PROTO does not turn off.
bool meshNeedsLL128(const MeshSizes& sizes, Proto proto);

// What the executor knows of one call when it chooses. Nothing here costs communication.
struct MeshCallFacts {
  CollType type = CollType::kAllReduce;
  size_t bytes = 0;        // one rank's block: count x element size
  bool builtinOp = false;  // sum, prod, max or min with no pre-op (no PreMulSum, ncclAvg
                           // on floats included, and no scalar in device memory)
  bool plainOp = false;    // one of NCCL's built-in ops (avg included) and no device scalar
  bool board = false;      // registration between processes is possible (the post board)
  // Every rank's buffers for this call are known: the ranks are in this process and every
  // one posted the same call in this group. The rest only count when this is true.
  bool peersKnown = false;
  bool inMapped = false;         // every input is memory peer access maps
  bool outMapped = false;        // every output too (a reduce's non-roots: always)
  bool captured = false;         // some rank's stream is capturing a CUDA graph
  bool outputsApart = false;     // no output overlaps any input
  bool allInPlace = false;       // every output is its input
  bool rootOutputApart = false;  // reduce: the root's output overlaps no input but its own
  bool copyPlanSafe = false;     // copy collectives: the pushes cannot break a layout
};

// How a call runs, beside the kernels of its form.
enum class MeshRoute : uint8_t {
  kKernel,            // the slot (or LL, LL128) kernels of the plan's kind
  kPulledReduce,      // one process: the two-shot reduce, every input read where it lies
  kChunked,           // one process: copy engines move chunks, kernels reduce them locally
  kRegisteredPull,    // between processes: the pulled all-reduce or reduce on registered buffers
  kPulledAllReduce,   // one process: the pulled two-shot all-reduce into every output
  kPulledOneShot,     // one process: the pulled one-shot all-reduce, own output only
  kRegisteredCopies,  // between processes: copy engines pull registered inputs together
  kCopyEngines,       // one process: copy engines push every block
};
const char* meshRouteName(MeshRoute r);

// The executor may decline these and go on to the next step: kChunked (no scratch),
// kRegisteredPull and kRegisteredCopies (not every rank posted a registered buffer; every
// rank sees the same posts, so all decline alike).
bool routeMayDecline(MeshRoute r);

struct MeshStep {
  MeshRoute route = MeshRoute::kKernel;
  const char* why = "";
};

struct MeshPlan {
  MeshKind kind = MeshKind::kAllReduceLL;  // the kernels' form
  const char* why = "";                    // why that form
  // Tried in order; the last is always the kernels (kKernel), unless a step before it
  // cannot be declined.
  MeshStep steps[5];
  int nsteps = 0;
};

// The kernels' form for a collective of `type` whose ranks each send `bytes` (a
// reduce-scatter: the part per rank), and why.
MeshKind meshKind(const MeshLimits& limits, CollType type, size_t bytes, const char** why);

// The plan for one collective (not Send/Recv).
MeshPlan planMeshCall(const MeshLimits& limits, const MeshCallFacts& facts);

// Whether the plan for a call of `type` and `bytes` may read the peer facts of
// MeshCallFacts (the executor gathers them only then).
bool meshNeedsPeerFacts(const MeshLimits& limits, CollType type, size_t bytes);

// A grouped Send/Recv over the mesh whose send reads bytes that a receive of the same group
// writes (in place): whether the kernel still reads them first. It moves tile t of every
// message of step j (P2pOp::seq) before it receives tile t of step j, tiles sized by each
// message's bytes, and the messages with this rank itself are copied before it starts. So
// it is ordered where the two are the same buffer and size and the send's step is not later
// than the receive's (nccl-tests' sendrecv in place), and never where a receive from this
// rank itself overwrites a send to a peer. `ops`: the messages with peers; `selfRecvs`:
// the ranges [start, start + bytes) the messages from this rank itself write. Returns why
// the first pair that is not ordered is not, or null where all are.
struct MeshRange {
  uintptr_t start = 0;
  size_t bytes = 0;
};
const char* meshP2pUnordered(const P2pList& ops, const std::vector<MeshRange>& selfRecvs);

}  // namespace loom::collectives::device
