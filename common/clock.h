// Deadlines for every blocking step. A Deadline also watches an optional abort flag so
// that ncclCommAbort ends any wait promptly.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>

namespace loom {

using Clock = std::chrono::steady_clock;

// The CPU's hint for a busy-wait loop's body (x86 pause, Arm yield).
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class Deadline {
 public:
  // Expires `ms` milliseconds from now (ms < 0: never).
  static Deadline afterMs(int64_t ms, const std::atomic<bool>* abortFlag = nullptr) {
    Deadline d;
    d.never_ = ms < 0;
    d.when_ = Clock::now() + std::chrono::milliseconds(ms < 0 ? 0 : ms);
    d.abort_ = abortFlag;
    d.totalMs_ = ms;
    return d;
  }
  static Deadline never(const std::atomic<bool>* abortFlag = nullptr) {
    return afterMs(-1, abortFlag);
  }

  bool expired() const { return !never_ && Clock::now() >= when_; }
  bool aborted() const { return abort_ && abort_->load(std::memory_order_relaxed); }
  // Milliseconds left, clamped to [0, cap] (cap when the deadline is never).
  int remainingMs(int cap = 1000) const {
    if (never_) return cap;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(when_ - Clock::now());
    int64_t v = left.count();
    if (v < 0) return 0;
    return v > cap ? cap : static_cast<int>(v);
  }
  int64_t totalMs() const { return totalMs_; }
  const std::atomic<bool>* abortFlag() const { return abort_; }

 private:
  Clock::time_point when_{};
  bool never_ = true;
  const std::atomic<bool>* abort_ = nullptr;
  int64_t totalMs_ = -1;
};

inline uint64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// CPU time the calling thread has used, in nanoseconds (for the proxy's CPU report).
inline int64_t threadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace loom
