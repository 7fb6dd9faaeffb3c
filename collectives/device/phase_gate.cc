#include "collectives/device/phase_gate.h"

#include <algorithm>
#include <chrono>

namespace loom::collectives::device {

bool PhaseGate::allReached(uint64_t mark) const {
  return std::all_of(marks_.begin(), marks_.end(), [mark](uint64_t v) { return v >= mark; });
}

void PhaseGate::arrive(int m, uint64_t mark) {
  if (m < 0 || m >= members()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  marks_[static_cast<size_t>(m)] = std::max(marks_[static_cast<size_t>(m)], mark);
  changed_.notify_all();
}

bool PhaseGate::arriveAndWait(int m, uint64_t mark, int64_t timeoutMs,
                              const std::atomic<bool>* abortFlag) {
  if (m < 0 || m >= members()) return false;
  std::unique_lock<std::mutex> lock(mutex_);
  marks_[static_cast<size_t>(m)] = std::max(marks_[static_cast<size_t>(m)], mark);
  changed_.notify_all();
  constexpr int64_t kDayMs = 24LL * 3600 * 1000;
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(std::clamp<int64_t>(timeoutMs, 0, kDayMs));
  // The abort flag is polled: nothing notifies the condition when it is raised.
  while (!allReached(mark)) {
    if (abortFlag && abortFlag->load(std::memory_order_relaxed)) return false;
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) return false;
    changed_.wait_for(lock, std::min<std::chrono::steady_clock::duration>(
                                until - now, std::chrono::milliseconds(10)));
  }
  return true;
}

}  // namespace loom::collectives::device
