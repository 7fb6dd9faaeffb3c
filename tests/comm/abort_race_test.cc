// ncclCommAbort from one thread while other threads keep issuing calls on the same
// communicators: PyTorch's watchdog does exactly this. Every call must either run, fail
// with an error, or find the communicator gone; none may touch freed memory (this test
// crashed with SIGSEGV before calls held the communicator; under AddressSanitizer a
// use-after-free is reported at once).
#include <gtest/gtest.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <random>
#include <thread>
#include <vector>

namespace {

struct Loop {
  std::atomic<long> calls{0};
  std::atomic<int> lastResult{ncclSuccess};
};

// Issues `kind` calls on comm, going on after errors (a training thread does not notice
// at once that its communicator was aborted), until `stop` is set and it has made one
// call that began after `aborted` was: that call's result is the last one kept.
void hammer(ncclComm_t comm, int kind, Loop* loop, const std::atomic<bool>* stop,
            const std::atomic<bool>* aborted) {
  std::vector<float> buf(4096, 1.0f);
  int rank = -1;
  ncclResult_t asyncErr = ncclSuccess;
  bool madeOneAfter = false;
  while (!(madeOneAfter && stop->load())) {
    const bool after = aborted->load();
    ncclResult_t r = ncclSuccess;
    switch (kind) {
      case 0:
        r = ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, comm, nullptr);
        break;
      case 1: r = ncclCommUserRank(comm, &rank); break;
      case 2: r = ncclCommGetAsyncError(comm, &asyncErr); break;
      default: {
        // A group: its communicator is checked again when the group runs.
        ncclGroupStart();
        ncclResult_t q =
            ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, comm, nullptr);
        r = ncclGroupEnd();
        if (q != ncclSuccess) r = q;
      }
    }
    loop->calls.fetch_add(1);
    loop->lastResult = r;
    madeOneAfter = madeOneAfter || after;
  }
}

TEST(AbortRace, AbortWhileOtherThreadsCall) {
  std::mt19937 rng(12345);
  for (int round = 0; round < 40; ++round) {
    const int n = 2;
    std::vector<ncclComm_t> comms(n, nullptr);
    ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess);
    // Collectives on every rank (each its own thread, since they wait on each other),
    // and a thread of cheap calls per communicator beside them.
    std::vector<Loop> loops(2 * n);
    std::vector<std::thread> threads;
    std::atomic<bool> stop{false}, aborted{false};
    const int groupOrPlain = round % 2 == 0 ? 0 : 3;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] { hammer(comms[r], groupOrPlain, &loops[r], &stop, &aborted); });
      threads.emplace_back(
          [&, r] { hammer(comms[r], 1 + (round + r) % 2, &loops[n + r], &stop, &aborted); });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 10000));
    for (int r = 0; r < n; ++r) EXPECT_EQ(ncclCommAbort(comms[r]), ncclSuccess);
    aborted = true;
    // The callers go on for a while after the abort, as a training loop would.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    stop = true;
    for (auto& t : threads) t.join();
    for (auto& l : loops) {
      // Every thread's last call, after the abort, found the communicator gone.
      EXPECT_EQ(l.lastResult.load(), ncclInvalidArgument);
    }
    // The handles are gone: using them again is an error, not a crash.
    int rank = -1;
    EXPECT_EQ(ncclCommUserRank(comms[0], &rank), ncclInvalidArgument);
    EXPECT_EQ(ncclCommAbort(comms[0]), ncclInvalidArgument);
  }
}

// Two threads destroy the same communicator at once: one wins, the other is told.
TEST(AbortRace, DoubleAbort) {
  for (int round = 0; round < 20; ++round) {
    ncclComm_t comm = nullptr;
    ASSERT_EQ(ncclCommInitAll(&comm, 1, nullptr), ncclSuccess);
    std::atomic<int> ok{0}, refused{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&] {
        ncclResult_t r = ncclCommAbort(comm);
        (r == ncclSuccess ? ok : refused).fetch_add(1);
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(ok.load(), 1);
    EXPECT_EQ(refused.load(), 1);
  }
}

}  // namespace
