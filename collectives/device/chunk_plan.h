// All-reduce and reduce by the copy engines, for ranks of one process (how the calls are
// issued: CudaExecutor::launchChunked in cuda_executor_local.cc).
//
// Each rank owns a segment of the elements (all-reduce: 1/n each; reduce: the root all).
// Every other rank pushes its input's part of that segment, chunk by chunk, into the
// owner's scratch with cudaMemcpyAsync; the owner reduces each chunk in a kernel as soon
// as every peer's copy of it landed (counters in the windows, written after each copy);
// for all-reduce, the owner then pushes the reduced chunk into every peer's output. The SMs only
// touch local memory; all the NVLink traffic is the copy engines', which carry about 390 GB/s each
// way on an H200 pair where SM stores top out near 365 (docs/perf/h200x2.md). On 2 ranks, reduce
// uses it by default from 2 MiB and all-reduce from 256 MiB.
//
// This file is plain host code: the plan (which elements each chunk covers) and each
// rank's program (what it enqueues, in order, on its two streams). The unit tests run
// every rank's program on host memory under random timing (tests/gpu/chunk_plan_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/device/mesh.h"

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

// One step of a rank's program. "push" steps go on the rank's own push stream, the others
// on the caller's stream. Counters: ready[from] and free[from] in each rank's window
// (mesh.h, chunkFlag); both only grow, across calls.
struct ChunkStep {
  enum class Kind {
    kFork,           // caller: the push stream starts after the caller's earlier work
    kWaitFree,       // push: until free[p] in our window >= wait[p], for every p with wait[p] > 0
    kPush,           // push: our input [begin, begin + count) into `peer`'s slot for chunk `m`
    kSignalReady,    // push: ready[us] in `peer`'s window := m + 1 (after the copy before it)
    kWaitReduced,    // push: after the caller stream's last kRecordReduced issued so far
    kGather,         // push: our output [begin, begin + count) into `peer`'s output
    kReduce,         // caller: until ready[q] >= m[q] + 1 for each peer q, then our output
                     // [begin, begin + count) := our input there reduced with the peers'
                     // slots for chunks m[q]; then free[us] in q's window := m[q] + 1
    kRecordReduced,  // caller: marks the reduction just issued (for kWaitReduced)
    kJoin,           // caller: after everything issued on the push stream so far
    kBarrier,        // caller: until every rank got here (the peers' gathers have landed)
  };
  Kind kind = Kind::kFork;
  int peer = -1;
  size_t begin = 0, count = 0;    // elements
  uint64_t m = 0;                 // kPush, kSignalReady: the chunk's number between us and peer
  uint64_t wait[kMaxRanks] = {};  // kWaitFree
  uint64_t mOf[kMaxRanks] = {};   // kReduce: per peer, the number of its chunk reduced here
};

// Chunks pushed to each peer and reduced from each so far (they carry over between calls),
// and how many slots per peer the last call that pushed to each peer cut its scratch into.
struct ChunkCounters {
  uint64_t sent[kMaxRanks] = {};
  uint64_t reduced[kMaxRanks] = {};
  int slots[kMaxRanks] = {};  // 0: none yet
};

// Rank `me`'s program for one call (`gather`: all-reduce) with `slots` slots per peer,
// counting on and updating `counters`. Where our last push to a peer cut its scratch into
// another number of slots, the first push to it waits until it has reduced every chunk
// sent to it before (the two layouts' slots overlap).
std::vector<ChunkStep> chunkProgram(const ChunkPlan& plan, int me, bool gather, int slots,
                                    ChunkCounters* counters);

// Where in `owner`'s scratch the m-th chunk from rank `from` goes, in bytes, when each peer
// has `region` bytes of it (in the order of the peers after the owner), cut into `slots`
// equal slots.
inline size_t chunkOffset(int owner, int from, uint64_t m, int nranks, int slots, size_t region) {
  const size_t peerIndex = static_cast<size_t>((from - owner - 1 + nranks) % nranks);
  const size_t slot = static_cast<size_t>(m % static_cast<uint64_t>(slots));
  return peerIndex * region + slot * (region / static_cast<size_t>(slots));
}

}  // namespace loom::collectives::device
