// "Who is stuck" (comm/progress_report.h): ranks as forked processes over shared memory,
// LOOM_TIMEOUT_MS=2000, and one rank that misbehaves before the second all-reduce: it
// skips it, it is stopped (SIGSTOP), or it dies. The error of a rank that waited must say
// where every rank is. Plus the pieces on their own: the record, and a server that
// drops strangers.
#include "comm/progress_report.h"

#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/socket.h"
#include "tests/support/free_port.h"

namespace {

using loom::SocketAddress;

enum class Misbehave { kSkip, kStop, kDie, kCountZero };

// Child `rank` of `n`: two all-reduces, except the misbehaving rank n-1, which does only
// the first. A waiting rank exits 0 when its error holds every piece of `want` (printed
// to stderr otherwise: exit 10), 11 when the second call succeeded, other codes for
// set-up failures.
int child(int rank, int n, const std::string& address, Misbehave how,
          const std::vector<std::string>& want) {
  setenv("LOOM_COMM_ID", address.c_str(), 1);
  setenv("LOOM_TIMEOUT_MS", "2000", 1);
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 90;
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, n, id, rank) != ncclSuccess) return 91;
  std::vector<float> in(4096, static_cast<float>(rank + 1)), out(4096);
  if (ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat32, ncclSum, comm, nullptr) !=
      ncclSuccess) {
    return 92;
  }
  if (rank == n - 1) {
    switch (how) {
      case Misbehave::kSkip:
        std::this_thread::sleep_for(std::chrono::seconds(6));
        ncclCommAbort(comm);
        return 0;
      case Misbehave::kStop: raise(SIGSTOP); return 0;  // the parent kills it
      case Misbehave::kDie: _exit(0);
      case Misbehave::kCountZero:  // a call that moves no data
        ncclAllReduce(in.data(), out.data(), 0, ncclFloat32, ncclSum, comm, nullptr);
        std::this_thread::sleep_for(std::chrono::seconds(6));
        ncclCommAbort(comm);
        return 0;
    }
  }
  const ncclResult_t rc =
      ncclAllReduce(in.data(), out.data(), in.size(), ncclFloat32, ncclSum, comm, nullptr);
  const std::string msg = ncclGetLastError(comm);
  ncclCommAbort(comm);
  if (rc == ncclSuccess) return 11;
  for (const std::string& w : want) {
    // "a|b": either will do.
    bool found = false;
    for (size_t at = 0; at <= w.size();) {
      const size_t bar = std::min(w.find('|', at), w.size());
      found = found || msg.find(w.substr(at, bar - at)) != std::string::npos;
      at = bar + 1;
    }
    if (!found) {
      std::fprintf(stderr, "rank %d: no \"%s\" in: %s\n", rank, w.c_str(), msg.c_str());
      return 10;
    }
  }
  std::fprintf(stderr, "rank %d: %s\n", rank, msg.c_str());
  return 0;
}

// Runs n ranks; the misbehaving one is killed once the others have ended. The exit
// codes of ranks 0..n-2.
std::vector<int> runRanks(int n, Misbehave how, const std::vector<std::string>& want) {
  const std::string address = loom::test::freeLoopbackAddress();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(child(r, n, address, how, want));
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (int r = 0; r < n - 1; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  kill(pids[n - 1], SIGKILL);
  waitpid(pids[n - 1], nullptr, 0);
  return codes;
}

TEST(ProgressReport, ARankThatSkipsACallIsNamed) {
  // Ranks 0 and 1 time out in all-reduce #2 (or one of them fails first and the other
  // sees it give up); either way the message says rank 2 never called #2.
  const auto codes =
      runRanks(3, Misbehave::kSkip,
               {"where the ranks are", "rank 2: not in a call; its last, AllReduce #1 (count 4096)",
                "it has not called #2"});
  for (int c : codes) EXPECT_EQ(c, 0);
}

// NCCL's count 0 is a call that does nothing, so the others wait for their timeout. loom's
// still passes an empty message around the ring, so the ranks with data hear at once
// that the counts disagree (here well inside the 2 s timeout).
TEST(ProgressReport, ACountOfZeroAgainstOthersFailsAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  // A rank whose peer has already given up may hear that first (a race no rank can avoid).
  const auto codes =
      runRanks(3, Misbehave::kCountZero,
               {"were expected: the ranks called different operations or counts|gave up on the"});
  for (int c : codes) EXPECT_EQ(c, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500));
}

TEST(ProgressReport, AStoppedRankIsNamed) {
  const auto codes =
      runRanks(3, Misbehave::kStop, {"where the ranks are", "rank 2: no answer within 80 ms"});
  for (int c : codes) EXPECT_EQ(c, 0);
}

TEST(ProgressReport, ADeadRankIsNamed) {
  // Death is noticed at once (not at the timeout); the cascade's other messages still
  // say which rank is gone (grouped with any other rank that has ended since). A query
  // that reaches rank 3's port as it dies (accepted, then closed) says so instead.
  const auto start = std::chrono::steady_clock::now();
  const auto codes =
      runRanks(4, Misbehave::kDie,
               {"where the ranks are", "3: gone|rank 3: closed the connection without an answer"});
  for (int c : codes) EXPECT_EQ(c, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(ProgressReport, RecordSaysWhereARankIs) {
  loom::comm::ProgressRecord rec;
  auto s = rec.snapshot(3);
  EXPECT_EQ(s.rank, 3);
  EXPECT_EQ(s.entered, 0u);
  rec.enter(0, 1024, 0, false);
  s = rec.snapshot(3);
  EXPECT_EQ(s.entered, 1u);
  EXPECT_EQ(s.returned, 0u);
  rec.leave();
  rec.setFailure("first");
  rec.setFailure("second");
  s = rec.snapshot(3);
  EXPECT_EQ(s.returned, 1u);
  EXPECT_STREQ(s.failure, "first");
}

// A stranger that connects and says nothing, or the wrong thing, is dropped; a question
// with the secret is answered meanwhile; the server ends at once when destroyed.
TEST(ProgressReport, ServerAnswersOnlyItsCommunicator) {
  loom::comm::ProgressRecord rec;
  rec.enter(0, 77, 0, false);
  const uint64_t secret[2] = {11, 22};
  auto lo = SocketAddress::parse("127.0.0.1:0");
  auto server = loom::comm::ProgressServer::start(*lo, 1, secret, &rec);
  ASSERT_TRUE(server.isOk()) << server.status().message();
  std::vector<SocketAddress> addrs = {SocketAddress{}, (*server)->address()};
  std::vector<char> whom = {0, 1};
  auto idle = loom::Socket::connect((*server)->address(), loom::Deadline::afterMs(1000));
  ASSERT_TRUE(idle.isOk());
  loom::comm::ProgressReply mine;
  std::string line = loom::comm::askWhereRanksAre(addrs, whom, 0, secret, mine, 1000);
  EXPECT_NE(line.find("rank 1: in AllReduce #1 (count 77)"), std::string::npos) << line;
  const uint64_t wrong[2] = {11, 23};
  line = loom::comm::askWhereRanksAre(addrs, whom, 0, wrong, mine, 1000);
  EXPECT_NE(line.find("rank 1: closed the connection without an answer"), std::string::npos)
      << line;
  const auto start = std::chrono::steady_clock::now();
  server->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
  line = loom::comm::askWhereRanksAre(addrs, whom, 0, secret, mine, 1000);
  EXPECT_NE(line.find("rank 1: gone"), std::string::npos) << line;
}

}  // namespace
