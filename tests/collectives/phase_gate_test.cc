// The gate that keeps ranks sharing a GPU from enqueuing past a peer's mesh pass
// (collectives/device/phase_gate.h), with threads standing in for the ranks.
#include "collectives/device/phase_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace loom::collectives::device {
namespace {

using Ms = std::chrono::milliseconds;

// Every member returns from round r only after every member has said it reached round r:
// what each thread "enqueues" after the gate comes after everything the others enqueued
// before it.
TEST(PhaseGate, NoMemberPassesARoundBeforeEveryoneReachedIt) {
  constexpr int kMembers = 3, kRounds = 200;
  PhaseGate gate(kMembers);
  std::mutex m;
  std::vector<std::pair<int, int>> log;  // (round, 0 = reached, 1 = passed)
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kMembers; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 1; r <= kRounds; ++r) {
        {
          std::lock_guard<std::mutex> lock(m);
          log.push_back({r, 0});
        }
        if (!gate.arriveAndWait(t, static_cast<uint64_t>(r), 10000)) ++failures;
        std::lock_guard<std::mutex> lock(m);
        log.push_back({r, 1});
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  // Before the first "passed" of round r, all kMembers "reached" of round r are logged.
  for (int r = 1; r <= kRounds; ++r) {
    int reached = 0;
    for (const auto& [round, what] : log) {
      if (round != r) continue;
      if (what == 0) ++reached;
      if (what == 1) {
        EXPECT_EQ(reached, kMembers) << "round " << r;
        break;
      }
    }
  }
}

TEST(PhaseGate, AMemberThatNeverComesEndsTheWaitAtTheTimeout) {
  PhaseGate gate(2);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(gate.arriveAndWait(0, 1, 100));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, Ms(100));
  EXPECT_LT(took, Ms(2000));
  // The late member finds the first already there and passes at once.
  EXPECT_TRUE(gate.arriveAndWait(1, 1, 0));
}

TEST(PhaseGate, AbortEndsTheWait) {
  PhaseGate gate(2);
  std::atomic<bool> abort{false};
  std::thread raiser([&] {
    std::this_thread::sleep_for(Ms(50));
    abort = true;
  });
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(gate.arriveAndWait(0, 1, 60000, &abort));
  EXPECT_LT(std::chrono::steady_clock::now() - start, Ms(5000));
  raiser.join();
}

// A member that arrives without waiting (a failed or captured call) lets the others pass.
TEST(PhaseGate, ArrivingWithoutWaitingReleasesTheOthers) {
  PhaseGate gate(2);
  std::thread waiter([&] { EXPECT_TRUE(gate.arriveAndWait(0, 15, 10000)); });
  std::this_thread::sleep_for(Ms(20));
  gate.arrive(1, 15);
  waiter.join();
  // Its mark stays: a later, lower mark passes at once.
  EXPECT_TRUE(gate.arriveAndWait(0, 9, 0));
  EXPECT_FALSE(gate.arriveAndWait(0, 16, 0));
}

TEST(PhaseGate, OneMemberAndBadIndices) {
  PhaseGate one(1);
  EXPECT_TRUE(one.arriveAndWait(0, 7, 0));
  PhaseGate two(2);
  EXPECT_FALSE(two.arriveAndWait(-1, 1, 0));
  EXPECT_FALSE(two.arriveAndWait(2, 1, 0));
}

}  // namespace
}  // namespace loom::collectives::device
