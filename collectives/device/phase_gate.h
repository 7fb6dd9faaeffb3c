// Where ranks of one process share one GPU (LOOM_P2P_SHARE_GPU, a testing mode), their
// streams may share CUDA's in-order hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, fewer
// under MPS, whose clients share one pool). A hierarchical call enqueues passes one after
// another on each rank's stream: a mesh kernel that spins until its host's peers' mesh
// kernels run, a rail kernel that waits for the other hosts. Where one rank's next pass
// (which waits for its current one) is queued before a peer's current pass, the shared
// queue holds the peer's pass back behind it, and the ranks wait for each other until
// LOOM_TIMEOUT_MS, across hosts too. The gate keeps the host order safe: each rank says it
// has enqueued a pass, and enqueues the next only once every rank of the gate has said the
// same, so that every rank's pass k is queued before any rank's pass k + 1 (and a call's
// first and last passes are gated too, against the calls and kernels around it).
//
// What it assumes: that within one pass nothing a rank enqueues waits for its own earlier
// work in a way that holds a shared queue (an event recorded after a kernel is taken not
// to). What it does not cover: replays of CUDA graphs (their launch order is the
// caller's), and ranks of separate processes sharing a GPU (no gate spans processes).
//
// Plain host code (collectives/device is its home; it needs no CUDA), tested on the CPU.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace loom::collectives::device {

class PhaseGate {
 public:
  explicit PhaseGate(int members) : marks_(static_cast<size_t>(members), 0) {}

  // Member `m` has enqueued everything up to `mark` (marks only grow, alike on every member:
  // a call's index and the pass within it). Waits until every member has reached `mark`;
  // false when `timeoutMs` passed first or `abortFlag` was raised (the caller goes on
  // without the gate's protection).
  // `timeoutMs` is clamped to a day.
  bool arriveAndWait(int m, uint64_t mark, int64_t timeoutMs,
                     const std::atomic<bool>* abortFlag = nullptr);
  // Member `m` has reached `mark` and does not wait (a call that failed half-way, or one
  // captured in a CUDA graph, whose enqueue order is not the replays').
  void arrive(int m, uint64_t mark);

  int members() const { return static_cast<int>(marks_.size()); }

 private:
  bool allReached(uint64_t mark) const;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<uint64_t> marks_;  // under mutex_
};

}  // namespace loom::collectives::device
