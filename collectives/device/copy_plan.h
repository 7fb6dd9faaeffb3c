// Collectives that are only copies (broadcast, all-gather, all-to-all), done by the GPUs'
// copy engines instead of kernels, when every rank's buffers are known to every rank.
//
// That is the case for ranks driven from one process (ncclCommInitAll, `-g N`) whose
// calls meet in one group: the communicator learns the peers' pointers at ncclGroupEnd
// and each rank pushes its data straight into the peers' output buffers with
// cudaMemcpyAsync, between two barriers (cuda_executor_local.cc). On an H200 pair one copy
// engine carries about 395 GB/s one way and 390 each way with both busy, where SM stores
// top out near 365 (docs/perf/h200x2.md).
//
// This file is the plan only: which copies each rank issues. It is plain host code, so
// the unit tests run it on host memory.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/device/mesh.h"

namespace loom::collectives::device {

// One rank's buffers of one call.
struct RankBuffers {
  const void* in = nullptr;
  void* out = nullptr;
};

struct CopyStep {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
  int peer = 0;  // the rank whose memory dst is (the copying rank itself for a local copy)
};

// True for the collectives a copy plan exists for.
bool copyOnly(MeshKind kind);

// The copies `rank` issues for one call whose every rank's buffers are `all` (nranks of
// them). `blockBytes` is the bytes of one rank's block: count x element size. Copies into
// peers come first (in ring order from rank + 1), local copies last; a copy whose source
// and destination are the same is left out.
std::vector<CopyStep> planCopies(MeshKind kind, int rank, int nranks, int root, size_t blockBytes,
                                 const RankBuffers* all);

// False when a rank's input overlaps its output in a way the pushes could break: any
// overlap for all-to-all (a peer could overwrite a block before it is sent), anything
// but the in-place layouts for broadcast (in == out) and all-gather (in == out + rank x
// blockBytes). The result depends only on `all`, so every rank decides alike.
bool copyPlanSafe(MeshKind kind, int nranks, int root, size_t blockBytes, const RankBuffers* all);

// Between processes, where a rank can read its peers' registered inputs but not write
// their outputs: the copies `rank` issues to pull its own output `out` together from every
// rank's input (`inputs`, in rank order, as mapped in this process, its own among them;
// only the root's is used for broadcast). Copies from peers first (in ring order from
// rank + 1), the local one last; a copy whose source and destination are the same is
// left out.
std::vector<CopyStep> planPulls(MeshKind kind, int rank, int nranks, int root, size_t blockBytes,
                                const void* const* inputs, void* out);

// Whether peers may pull from `rank`'s input `in` while it writes its own output `out`
// (planPulls): apart, or the in-place layouts of broadcast (in == out, the root) and
// all-gather (in == out + rank x blockBytes). A broadcast's non-root is never read from.
bool pullSafe(MeshKind kind, int rank, int nranks, int root, size_t blockBytes, const void* in,
              const void* out);

}  // namespace loom::collectives::device
