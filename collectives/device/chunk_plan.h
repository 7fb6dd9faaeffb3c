// All-reduce and reduce by the copy engines, for ranks of one process (how the calls are
// issued: CudaDeviceComm::launchChunked in comm/device_one_process.cc).
//
// Each rank owns a segment of the elements (all-reduce: 1/n each; reduce: the root all).
// Every other rank pushes its input's part of that segment, chunk by chunk, into the
// owner's scratch with cudaMemcpyAsync; the owner reduces each chunk in a kernel as soon
// as every peer's copy of it landed (counters in the windows, written by a small kernel
// after each copy); for all-reduce, the owner then pushes the reduced chunk into every
// peer's output. The SMs only touch local memory; all the NVLink traffic is the copy
// engines', which carry about 390 GB/s each way on an H200 pair where SM stores top out
// near 365 (docs/perf/h200x2.md). On 2 ranks, reduce uses it by default from 16 MiB and
// all-reduce from 256 MiB.
//
// This file is the plan only: which elements each chunk covers. Plain host code.
#pragma once

#include <cstddef>
#include <vector>

namespace loom::collectives::device {

class ChunkPlan {
 public:
  // `count` elements of `elemSize` bytes over `nranks`; `root` < 0: all-reduce (every
  // rank owns an equal segment, starting on a 16-byte boundary), else reduce (the root
  // owns everything). Chunks hold at most `maxChunkBytes` (rounded down to 64 KiB, at
  // least 64 KiB); a segment is cut into equal chunks.
  ChunkPlan(size_t count, size_t elemSize, int nranks, int root, size_t maxChunkBytes);

  int nranks() const { return static_cast<int>(segBegin_.size()); }
  size_t segmentBegin(int owner) const { return segBegin_[owner]; }
  size_t segmentCount(int owner) const { return segCount_[owner]; }
  // Chunks of `owner`'s segment, and chunk c's first element and element count.
  size_t chunks(int owner) const;
  size_t chunkBegin(int owner, size_t c) const { return segBegin_[owner] + c * chunkElems_[owner]; }
  size_t chunkCount(int owner, size_t c) const;
  // The largest chunk of any segment, in bytes (what one scratch slot must hold).
  size_t maxChunkBytes() const;

 private:
  size_t elemSize_;
  std::vector<size_t> segBegin_, segCount_, chunkElems_;
};

}  // namespace loom::collectives::device
