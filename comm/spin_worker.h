// SpinWorker: a thread that runs jobs handed to it one at a time, picking each up without
// a system call. Between jobs it polls for `spinUs` microseconds, then sleeps on a futex
// (std::atomic::wait) until the next post. Used to issue several GPU ranks' launches of
// one group at once (comm/group.cc), where a hand-over costs less than one launch.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>

namespace loom::comm {

class SpinWorker {
 public:
  explicit SpinWorker(int64_t spinUs);
  ~SpinWorker();  // finishes the job in hand, then joins
  SpinWorker(const SpinWorker&) = delete;
  SpinWorker& operator=(const SpinWorker&) = delete;

  // Hands over `job`. The previous job must have been waited for.
  void post(std::function<void()> job);
  // Returns once the posted job has run (polls, then yields).
  void wait();

 private:
  void main();

  const int64_t spinUs_;
  std::function<void()> job_;
  std::atomic<uint32_t> posted_{0};
  std::atomic<uint32_t> done_{0};
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace loom::comm
