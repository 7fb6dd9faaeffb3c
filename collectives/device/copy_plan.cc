#include "collectives/device/copy_plan.h"

#include <cstdint>
#include <utility>

namespace loom::collectives::device {

namespace {

const char* at(const void* base, size_t off) {
  return static_cast<const char*>(base) + off;
}
char* atw(void* base, size_t off) {
  return static_cast<char*>(base) + off;
}

// The copies of one plan, each of one block; a copy onto itself is left out.
struct Steps {
  size_t blockBytes;
  std::vector<CopyStep> steps;
  void add(void* dst, const void* src, int peer) {
    if (dst != src) steps.push_back(CopyStep{dst, src, blockBytes, peer});
  }
};

}  // namespace

bool copyOnly(MeshKind kind) {
  return kind == MeshKind::kBroadcast || kind == MeshKind::kAllGather ||
         kind == MeshKind::kAllToAll;
}

bool copyPlanSafe(MeshKind kind, int nranks, int root, size_t blockBytes, const RankBuffers* all) {
  if (!copyOnly(kind)) return false;
  for (int r = 0; r < nranks; ++r) {
    if (kind == MeshKind::kBroadcast && r != root) continue;  // only the root's input is read
    auto in = reinterpret_cast<uintptr_t>(all[r].in);
    auto out = reinterpret_cast<uintptr_t>(all[r].out);
    size_t inBytes = kind == MeshKind::kAllToAll ? blockBytes * nranks : blockBytes;
    size_t outBytes = kind == MeshKind::kBroadcast ? blockBytes : blockBytes * nranks;
    bool overlap = in < out + outBytes && out < in + inBytes;
    if (!overlap) continue;
    if (kind == MeshKind::kBroadcast && in == out) continue;
    if (kind == MeshKind::kAllGather && in == out + size_t(r) * blockBytes) continue;
    return false;
  }
  return true;
}

std::vector<CopyStep> planCopies(MeshKind kind, int rank, int nranks, int root, size_t blockBytes,
                                 const RankBuffers* all) {
  if (blockBytes == 0 || !copyOnly(kind)) return {};
  Steps plan{blockBytes, {}};
  const RankBuffers& me = all[rank];
  const size_t mine = size_t(rank) * blockBytes;
  for (int i = 1; i < nranks; ++i) {
    int p = (rank + i) % nranks;
    switch (kind) {
      case MeshKind::kBroadcast:
        if (rank == root) plan.add(all[p].out, me.in, p);
        break;
      case MeshKind::kAllGather: plan.add(atw(all[p].out, mine), me.in, p); break;
      case MeshKind::kAllToAll:
        plan.add(atw(all[p].out, mine), at(me.in, size_t(p) * blockBytes), p);
        break;
      default: break;
    }
  }
  switch (kind) {
    case MeshKind::kBroadcast:
      if (rank == root) plan.add(me.out, me.in, rank);
      break;
    case MeshKind::kAllGather: plan.add(atw(me.out, mine), me.in, rank); break;
    case MeshKind::kAllToAll: plan.add(atw(me.out, mine), at(me.in, mine), rank); break;
    default: break;
  }
  return std::move(plan.steps);
}

std::vector<CopyStep> planPulls(MeshKind kind, int rank, int nranks, int root, size_t blockBytes,
                                const void* const* inputs, void* out) {
  if (blockBytes == 0 || !copyOnly(kind)) return {};
  Steps plan{blockBytes, {}};
  const size_t mine = size_t(rank) * blockBytes;
  for (int i = 1; i < nranks; ++i) {
    int p = (rank + i) % nranks;
    switch (kind) {
      case MeshKind::kBroadcast:
        if (p == root) plan.add(out, inputs[root], p);
        break;
      case MeshKind::kAllGather: plan.add(atw(out, size_t(p) * blockBytes), inputs[p], p); break;
      case MeshKind::kAllToAll:
        plan.add(atw(out, size_t(p) * blockBytes), at(inputs[p], mine), p);
        break;
      default: break;
    }
  }
  switch (kind) {
    case MeshKind::kBroadcast:
      if (rank == root) plan.add(out, inputs[rank], rank);
      break;
    case MeshKind::kAllGather: plan.add(atw(out, mine), inputs[rank], rank); break;
    case MeshKind::kAllToAll: plan.add(atw(out, mine), at(inputs[rank], mine), rank); break;
    default: break;
  }
  return std::move(plan.steps);
}

bool pullSafe(MeshKind kind, int rank, int nranks, int root, size_t blockBytes, const void* in,
              const void* out) {
  if (!copyOnly(kind)) return false;
  if (kind == MeshKind::kBroadcast && rank != root) return true;
  auto i = reinterpret_cast<uintptr_t>(in);
  auto o = reinterpret_cast<uintptr_t>(out);
  size_t inBytes = kind == MeshKind::kAllToAll ? blockBytes * nranks : blockBytes;
  size_t outBytes = kind == MeshKind::kBroadcast ? blockBytes : blockBytes * nranks;
  if (!(i < o + outBytes && o < i + inBytes)) return true;
  if (kind == MeshKind::kBroadcast) return i == o;
  return kind == MeshKind::kAllGather && i == o + size_t(rank) * blockBytes;
}

}  // namespace loom::collectives::device
