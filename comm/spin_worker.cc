#include "comm/spin_worker.h"

#include <chrono>

#include "common/clock.h"

namespace loom::comm {

SpinWorker::SpinWorker(int64_t spinUs) : spinUs_(spinUs), thread_([this] { main(); }) {}

SpinWorker::~SpinWorker() {
  stop_.store(true);
  posted_.fetch_add(1);
  posted_.notify_one();
  thread_.join();
}

void SpinWorker::post(std::function<void()> job) {
  job_ = std::move(job);
  // Sequentially consistent on both sides: either the worker sees the new count before
  // it sleeps, or this thread sees it sleeping and wakes it.
  posted_.fetch_add(1);
  if (sleeping_.load()) posted_.notify_one();
}

void SpinWorker::wait() {
  const uint32_t want = posted_.load(std::memory_order_relaxed);
  for (int i = 0; done_.load(std::memory_order_acquire) != want; ++i) {
    if (i < 4096) {
      cpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
}

void SpinWorker::main() {
  uint32_t seen = 0;
  while (true) {
    // Poll for the next post, for a while.
    auto until = Clock::now() + std::chrono::microseconds(spinUs_);
    uint32_t now = posted_.load(std::memory_order_acquire);
    for (int i = 0; now == seen; ++i) {
      if ((i & 63) == 63 && Clock::now() > until) {
        sleeping_.store(true);
        now = posted_.load();
        if (now == seen) posted_.wait(seen);
        sleeping_.store(false);
      } else {
        cpuRelax();
      }
      now = posted_.load(std::memory_order_acquire);
    }
    seen = now;
    if (stop_.load()) return;
    job_();
    done_.store(seen, std::memory_order_release);
  }
}

}  // namespace loom::comm
