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

}  // namespace loom::collectives::device
