// SpinWorker: jobs run in order on the worker, each seen whole by the poster after wait(),
// whether the worker was polling or asleep when the job came.
#include "comm/spin_worker.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace loom::comm {
namespace {

TEST(SpinWorker, RunsEveryJobInOrderOnItsOwnThread) {
  SpinWorker worker(200);
  std::thread::id workerId;
  worker.post([&] { workerId = std::this_thread::get_id(); });
  worker.wait();
  EXPECT_NE(workerId, std::this_thread::get_id());
  uint64_t sum = 0;  // written by the worker only, read here after each wait()
  for (uint64_t i = 1; i <= 100000; ++i) {
    worker.post([&sum, i] { sum = sum * 31 + i; });
    worker.wait();
  }
  uint64_t want = 0;
  for (uint64_t i = 1; i <= 100000; ++i) want = want * 31 + i;
  EXPECT_EQ(sum, want);
}

TEST(SpinWorker, WakesFromSleepAndStopsWhileAsleep) {
  SpinWorker worker(0);  // sleeps as soon as it finds nothing
  int runs = 0;
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    worker.post([&] { ++runs; });
    worker.wait();
  }
  EXPECT_EQ(runs, 50);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // The destructor wakes the sleeping worker and joins it.
}

}  // namespace
}  // namespace loom::comm
