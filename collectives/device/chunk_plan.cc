#include "collectives/device/chunk_plan.h"

#include <algorithm>

namespace loom::collectives::device {

namespace {
constexpr size_t kGrain = 64 * 1024;  // chunk sizes are multiples of this many bytes
}

ChunkPlan::ChunkPlan(size_t count, size_t elemSize, int nranks, int root, size_t maxChunkBytes)
    : elemSize_(elemSize), segBegin_(nranks, 0), segCount_(nranks, 0), chunkElems_(nranks, 1) {
  if (root >= 0) {
    segCount_[root] = count;
  } else {
    // Equal segments on 16-byte boundaries (the kernels' vector width); the last is shorter.
    const size_t vec = std::max<size_t>(1, 16 / elemSize);
    const size_t per = ((count + nranks - 1) / nranks + vec - 1) / vec * vec;
    for (int r = 0; r < nranks; ++r) {
      segBegin_[r] = std::min(count, r * per);
      segCount_[r] = std::min(count, segBegin_[r] + per) - segBegin_[r];
    }
  }
  const size_t maxBytes = std::max(kGrain, maxChunkBytes / kGrain * kGrain);
  for (int r = 0; r < nranks; ++r) {
    const size_t bytes = segCount_[r] * elemSize;
    const size_t n = std::max<size_t>(1, (bytes + maxBytes - 1) / maxBytes);
    // Equal chunks, each a multiple of kGrain bytes (so of 16 bytes and of the element).
    size_t chunk = (bytes + n - 1) / n;
    chunk = std::min(maxBytes, (chunk + kGrain - 1) / kGrain * kGrain);
    chunkElems_[r] = std::max<size_t>(1, chunk / elemSize);
  }
}

size_t ChunkPlan::chunks(int owner) const {
  return (segCount_[owner] + chunkElems_[owner] - 1) / chunkElems_[owner];
}

size_t ChunkPlan::chunkCount(int owner, size_t c) const {
  const size_t begin = c * chunkElems_[owner];
  return begin >= segCount_[owner] ? 0 : std::min(chunkElems_[owner], segCount_[owner] - begin);
}

size_t ChunkPlan::maxChunkBytes() const {
  size_t m = 0;
  for (size_t r = 0; r < segCount_.size(); ++r) {
    if (segCount_[r]) m = std::max(m, std::min(segCount_[r], chunkElems_[r]) * elemSize_);
  }
  return m;
}

std::vector<ChunkStep> chunkProgram(const ChunkPlan& plan, int me, bool gather, int slots,
                                    ChunkCounters* counters) {
  using K = ChunkStep::Kind;
  const int n = plan.nranks();
  const uint64_t D = static_cast<uint64_t>(slots), B = std::max<uint64_t>(1, D / 2);
  std::vector<ChunkStep> out;
  auto add = [&](K kind, int peer = -1) -> ChunkStep& {
    out.push_back({});
    out.back().kind = kind;
    out.back().peer = peer;
    return out.back();
  };
  // Before our m-th push to p, p must have freed chunk m - D. One wait covers the pushes up
  // to the next multiple of B (fewer kernels between copies).
  auto needFree = [&](int p, uint64_t m) -> uint64_t {
    const uint64_t last = std::min<uint64_t>((m / B + 1) * B, counters->sent[p] + plan.chunks(p));
    return last >= D ? last - D : 0;
  };
  auto gatherChunk = [&](size_t c) {
    add(K::kWaitReduced);
    for (int i = 1; i < n; ++i) {
      ChunkStep& g = add(K::kGather, (me + i) % n);
      g.begin = plan.chunkBegin(me, c);
      g.count = plan.chunkCount(me, c);
    }
  };
  size_t rounds = plan.chunks(me);
  for (int p = 0; p < n; ++p) {
    if (p != me) rounds = std::max(rounds, plan.chunks(p));
  }
  add(K::kFork);
  for (size_t c = 0; c < rounds; ++c) {
    ChunkStep wait;
    bool waits = false;
    for (int i = 1; i < n; ++i) {
      const int p = (me + i) % n;
      const uint64_t m = counters->sent[p] + c;
      if (c < plan.chunks(p) && (c == 0 || m % B == 0) && needFree(p, m) > 0) {
        wait.wait[p] = needFree(p, m);
        waits = true;
      }
      // Another layout before: everything sent so far must be reduced (needFree never
      // asks for more than that).
      const bool relaid = counters->slots[p] != 0 && counters->slots[p] != slots;
      if (relaid && c == 0 && c < plan.chunks(p) && counters->sent[p] > 0) {
        wait.wait[p] = counters->sent[p];
        waits = true;
      }
    }
    if (waits) {
      wait.kind = K::kWaitFree;
      out.push_back(wait);
    }
    for (int i = 1; i < n; ++i) {
      const int p = (me + i) % n;
      if (c >= plan.chunks(p)) continue;
      ChunkStep& push = add(K::kPush, p);
      push.begin = plan.chunkBegin(p, c);
      push.count = plan.chunkCount(p, c);
      push.m = counters->sent[p] + c;
      add(K::kSignalReady, p).m = counters->sent[p] + c;
    }
    // The previous chunk's copies to the peers go after this chunk's pushes, so the push
    // stream never waits for a reduction that waits for this chunk.
    if (gather && c >= 1 && c - 1 < plan.chunks(me)) gatherChunk(c - 1);
    if (c >= plan.chunks(me)) continue;
    ChunkStep& r = add(K::kReduce);
    r.begin = plan.chunkBegin(me, c);
    r.count = plan.chunkCount(me, c);
    for (int q = 0; q < n; ++q) {
      if (q != me) r.mOf[q] = counters->reduced[q] + c;
    }
    if (gather) add(K::kRecordReduced);
  }
  if (gather && plan.chunks(me) > 0 && plan.chunks(me) >= rounds) gatherChunk(plan.chunks(me) - 1);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    counters->sent[p] += plan.chunks(p);
    counters->reduced[p] += plan.chunks(me);
    if (plan.chunks(p) > 0) counters->slots[p] = slots;
  }
  add(K::kJoin);
  if (gather) add(K::kBarrier);
  return out;
}

}  // namespace loom::collectives::device
