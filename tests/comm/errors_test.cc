// Ranks as real processes (fork), over shared memory and over TCP, and what happens
// when things go wrong: bad arguments, a peer that dies mid-collective, abort while
// another thread waits, and a stranger connecting to the bootstrap.
#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/unique_id.h"
#include "common/socket.h"
#include "tests/support/free_port.h"

namespace {

// An address for LOOM_COMM_ID with a port free right now. Children make their id from
// it (rank 0 runs the root): the parent must not start the root thread itself, because
// forking a process while another thread holds an allocator lock can leave the child
// deadlocked (seen under AddressSanitizer).
std::string freeCommId() {
  return loom::test::freeLoopbackAddress();
}

ncclUniqueId childId(const std::string& address) {
  setenv("LOOM_COMM_ID", address.c_str(), 1);
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) _exit(90);
  return id;
}

// Runs `body(rank)` in n forked children; returns their exit codes.
template <typename F>
std::vector<int> forkRanks(int n, F body) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = body(r);
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

int allReduceCheck(ncclComm_t comm, int rank, int n, size_t count) {
  std::vector<double> in(count), out(count, -1);
  for (size_t i = 0; i < count; ++i) in[i] = rank + static_cast<double>(i % 101);
  if (ncclAllReduce(in.data(), out.data(), count, ncclFloat64, ncclSum, comm, nullptr) !=
      ncclSuccess) {
    fprintf(stderr, "rank %d: %s\n", rank, ncclGetLastError(comm));
    return 2;
  }
  for (size_t i = 0; i < count; ++i) {
    double want = n * (n - 1) / 2.0 + n * static_cast<double>(i % 101);
    if (out[i] != want) return 3;
  }
  std::vector<int> ag(count * n, -1), mine(count);
  for (size_t i = 0; i < count; ++i) mine[i] = rank * 7 + static_cast<int>(i);
  if (ncclAllGather(mine.data(), ag.data(), count, ncclInt32, comm, nullptr) != ncclSuccess) {
    fprintf(stderr, "rank %d: %s\n", rank, ncclGetLastError(comm));
    return 4;
  }
  for (int q = 0; q < n; ++q)
    for (size_t i = 0; i < count; ++i)
      if (ag[q * count + i] != q * 7 + static_cast<int>(i)) return 5;
  return 0;
}

void runProcesses(int n, const char* transports, bool separateHosts) {
  std::string addr = freeCommId();
  auto codes = forkRanks(n, [&](int r) {
    ncclUniqueId id = childId(addr);
    // Should rank 0 fail to start the root, the others give up well inside ctest's limit
    // and say so, instead of knocking for the default five minutes.
    setenv("LOOM_TIMEOUT_MS", "60000", 1);
    if (transports) setenv("LOOM_TRANSPORTS", transports, 1);
    if (separateHosts) {
      setenv("LOOM_HOST_ID", ("host" + std::to_string(r)).c_str(), 1);
      setenv("LOOM_NSOCKS_PERTHREAD", "3", 1);  // exercise striping over several sockets
    }
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, n, id, r) != ncclSuccess) return 1;
    int code = allReduceCheck(comm, r, n, 1000003);
    if (code == 0) code = allReduceCheck(comm, r, n, 3);
    ncclCommDestroy(comm);
    return code;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(Processes, SharedMemory) {
  runProcesses(4, nullptr, false);
}
TEST(Processes, TcpBetweenHosts) {
  runProcesses(3, nullptr, true);
}
TEST(Processes, TcpForced) {
  runProcesses(4, "self,tcp", false);
}

void peerDies(const char* transports) {
  std::string addr = freeCommId();
  const int n = 3;
  auto start = std::chrono::steady_clock::now();
  auto codes = forkRanks(n, [&](int r) {
    ncclUniqueId id = childId(addr);
    setenv("LOOM_TIMEOUT_MS", "20000", 1);
    if (transports) setenv("LOOM_TRANSPORTS", transports, 1);
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, n, id, r) != ncclSuccess) return 1;
    if (allReduceCheck(comm, r, n, 1000) != 0) return 2;
    if (r == 1) _exit(42);  // dies before the second collective
    std::vector<float> buf(1 << 20, 1.0f);
    ncclResult_t res =
        ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, comm, nullptr);
    if (res == ncclSuccess) return 3;
    std::string msg = ncclGetLastError(comm);
    ncclResult_t async;
    ncclCommGetAsyncError(comm, &async);
    if (async == ncclSuccess) return 4;
    fprintf(stderr, "rank %d saw: %s\n", r, msg.c_str());
    ncclCommAbort(comm);
    return msg.find("rank") != std::string::npos ? 10 : 5;
  });
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(codes[0], 10);
  EXPECT_EQ(codes[1], 42);
  EXPECT_EQ(codes[2], 10);
  EXPECT_LT(secs, 15.0) << "errors should come from the dead peer, not the 20 s timeout";
}

TEST(Failures, PeerDiesOverSharedMemory) {
  peerDies(nullptr);
}
TEST(Failures, PeerDiesOverTcp) {
  peerDies("self,tcp");
}

// A rank that exits right after init, before any connection to it exists: the others'
// first collective fails within seconds, naming it, not at the 60 s timeout.
void peerGoneBeforeConnections(const char* transports) {
  std::string addr = freeCommId();
  const int n = 3;
  auto start = std::chrono::steady_clock::now();
  auto codes = forkRanks(n, [&](int r) {
    ncclUniqueId id = childId(addr);
    setenv("LOOM_TIMEOUT_MS", "60000", 1);
    if (transports) setenv("LOOM_TRANSPORTS", transports, 1);
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, n, id, r) != ncclSuccess) return 1;
    if (r == 2) _exit(42);
    std::vector<float> buf(1000, 1.0f);
    ncclResult_t res =
        ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, comm, nullptr);
    if (res == ncclSuccess) return 3;
    std::string msg = ncclGetLastError(comm);
    fprintf(stderr, "rank %d saw: %s\n", r, msg.c_str());
    ncclCommAbort(comm);
    // Rank 2, or in the cascade a rank that failed on it first and left (named too).
    return msg.find("rank 2") != std::string::npos || msg.find("is gone") != std::string::npos ||
                   msg.find("closed") != std::string::npos
               ? 10
               : 5;
  });
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(codes[0], 10);
  EXPECT_EQ(codes[1], 10);
  EXPECT_EQ(codes[2], 42);
  EXPECT_LT(secs, 10.0) << "a rank gone before its connections cost the others the timeout";
}

TEST(Failures, PeerGoneBeforeConnectionsOverSharedMemory) {
  peerGoneBeforeConnections(nullptr);
}
TEST(Failures, PeerGoneBeforeConnectionsOverTcp) {
  peerGoneBeforeConnections("self,tcp");
}

TEST(Failures, AbortWhileAnotherThreadWaits) {
  std::vector<ncclComm_t> comms(2);
  ASSERT_EQ(ncclCommInitAll(comms.data(), 2, nullptr), ncclSuccess);
  std::vector<float> buf(1000, 1.0f);
  ncclResult_t res = ncclSuccess;
  // Rank 0 enters a collective that rank 1 never joins.
  std::thread waiter([&] {
    res =
        ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, comms[0], nullptr);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  waiter.join();
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(res, ncclSuccess);
  EXPECT_LT(secs, 2.0);
  EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
}

TEST(Failures, TimeoutNamesThePeer) {
  setenv("LOOM_TIMEOUT_MS", "1500", 1);
  std::vector<ncclComm_t> comms(2);
  ASSERT_EQ(ncclCommInitAll(comms.data(), 2, nullptr), ncclSuccess);
  std::vector<float> buf(1000, 1.0f);
  ncclResult_t res =
      ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat32, ncclSum, comms[0], nullptr);
  unsetenv("LOOM_TIMEOUT_MS");
  EXPECT_EQ(res, ncclRemoteError);
  std::string msg = ncclGetLastError(comms[0]);
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  ncclCommAbort(comms[0]);
  ncclCommAbort(comms[1]);
}

TEST(Failures, MissingRankFailsInitWithinTimeout) {
  setenv("LOOM_TIMEOUT_MS", "1500", 1);
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  auto start = std::chrono::steady_clock::now();
  EXPECT_NE(ncclCommInitRank(&comm, 2, id, 0), ncclSuccess);
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  unsetenv("LOOM_TIMEOUT_MS");
  EXPECT_EQ(comm, nullptr);
  EXPECT_LT(secs, 5.0);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("missing ranks: 1"), std::string::npos)
      << ncclGetLastError(nullptr);
}

TEST(Failures, StrangerAtTheBootstrapIsDropped) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  auto contents = loom::comm::decodeId(id);
  ASSERT_TRUE(contents.isOk());
  {
    // Garbage, then a well-formed request with the wrong secret.
    auto s = loom::Socket::connect(contents->root, loom::Deadline::afterMs(2000));
    ASSERT_TRUE(s.isOk());
    char junk[64];
    std::memset(junk, 0x41, sizeof(junk));
    ASSERT_TRUE(s->sendAll(junk, sizeof(junk), loom::Deadline::afterMs(2000)).isOk());
  }
  std::vector<ncclComm_t> comms(2);
  std::vector<ncclResult_t> res(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] { res[r] = ncclCommInitRank(&comms[r], 2, id, r); });
  for (auto& t : ts) t.join();
  ASSERT_EQ(res[0], ncclSuccess);
  ASSERT_EQ(res[1], ncclSuccess);
  for (auto c : comms) ncclCommDestroy(c);
}

TEST(Arguments, BadCallsReturnInvalidArgument) {
  std::vector<ncclComm_t> comms(1);
  ASSERT_EQ(ncclCommInitAll(comms.data(), 1, nullptr), ncclSuccess);
  ncclComm_t c = comms[0];
  float buf[4] = {1, 2, 3, 4};
  EXPECT_EQ(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, nullptr, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(buf, buf, 4, static_cast<ncclDataType_t>(42), ncclSum, c, nullptr),
            ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(c)).find("datatype"), std::string::npos);
  EXPECT_EQ(ncclAllReduce(buf, buf, 4, ncclFloat32, static_cast<ncclRedOp_t>(17), c, nullptr),
            ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(nullptr, buf, 4, ncclFloat32, ncclSum, c, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclFloat32, ncclSum, c, nullptr), ncclSuccess);
  EXPECT_EQ(ncclBroadcast(buf, buf, 4, ncclFloat32, 1, c, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclReduce(buf, buf, 4, ncclFloat32, ncclSum, -1, c, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclSend(buf, 4, ncclFloat32, 3, c, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclAllGather(buf, buf, SIZE_MAX / 2, ncclFloat32, c, nullptr), ncclInvalidArgument);
  int count = 0, rank = -1;
  EXPECT_EQ(ncclCommCount(c, &count), ncclSuccess);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(ncclCommUserRank(c, &rank), ncclSuccess);
  EXPECT_EQ(rank, 0);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  // Registration of host memory: accepted without effect; bad arguments rejected.
  void* handle = nullptr;
  EXPECT_EQ(ncclCommRegister(c, buf, sizeof(buf), &handle), ncclSuccess);
  EXPECT_EQ(ncclCommDeregister(c, handle), ncclSuccess);
  EXPECT_EQ(ncclCommRegister(c, buf, sizeof(buf), nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommRegister(c, nullptr, 16, &handle), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(c)).find("buff is NULL"), std::string::npos);
  EXPECT_EQ(ncclCommRegister(nullptr, buf, sizeof(buf), &handle), ncclInvalidArgument);
  ncclWindow_t win = nullptr;
  EXPECT_EQ(ncclCommWindowRegister(c, buf, sizeof(buf), &win, NCCL_WIN_COLL_SYMMETRIC),
            ncclSuccess);
  EXPECT_EQ(ncclCommWindowDeregister(c, win), ncclSuccess);
  EXPECT_EQ(ncclCommWindowRegister(c, buf, sizeof(buf), nullptr, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommWindowRegister(c, buf, sizeof(buf), &win, 0x40), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(c)).find("winFlags"), std::string::npos);
  EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  // A destroyed communicator is recognised, not dereferenced.
  EXPECT_EQ(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommDestroy(c), ncclInvalidArgument);
  ncclUniqueId junk;
  std::memset(&junk, 7, sizeof(junk));
  ncclComm_t out;
  EXPECT_EQ(ncclCommInitRank(&out, 2, junk, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&out, 2, junk, 5), ncclInvalidArgument);
  int v = 0;
  EXPECT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_VERSION_CODE);
  EXPECT_STRNE(ncclGetErrorString(ncclRemoteError), "");
}

TEST(Split, ByParity) {
  const int n = 4;
  std::vector<ncclComm_t> comms(n), sub(n);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess);
  std::vector<std::thread> ts;
  std::vector<ncclResult_t> res(n);
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] { res[r] = ncclCommSplit(comms[r], r % 2, -r, &sub[r], nullptr); });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(res[r], ncclSuccess) << ncclGetLastError(nullptr);
    int cnt, rk;
    ncclCommCount(sub[r], &cnt);
    ncclCommUserRank(sub[r], &rk);
    EXPECT_EQ(cnt, 2);
    EXPECT_EQ(rk, r < 2 ? 1 : 0);  // key -r: the higher rank comes first
  }
  for (int r = 0; r < n; ++r) {
    ncclCommDestroy(sub[r]);
    ncclCommDestroy(comms[r]);
  }
}

// Ranks 0, 2 and 3 of `comms` (4 ranks) shrink away rank 1, which does not call, each with
// `flags(r)`, into `sub`, and run an all-reduce of 1000 ints on the result, which must be
// right everywhere.
void shrinkAwayRank1AndCheck(const std::vector<ncclComm_t>& comms, std::vector<ncclComm_t>* sub,
                             int (*flags)(int rank)) {
  int excluded[] = {1};
  std::vector<std::thread> ts;
  std::vector<ncclResult_t> res(comms.size(), ncclSuccess);
  std::vector<std::vector<int>> data(comms.size(), std::vector<int>(1000));
  for (int r : {0, 2, 3}) {
    ts.emplace_back([&, r] {
      res[r] = ncclCommShrink(comms[r], excluded, 1, &(*sub)[r], nullptr, flags(r));
      if (res[r] != ncclSuccess) return;
      for (int i = 0; i < 1000; ++i) data[r][i] = r * 1000 + i;
      res[r] = ncclAllReduce(data[r].data(), data[r].data(), 1000, ncclInt32, ncclSum, (*sub)[r],
                             nullptr);
    });
  }
  for (auto& t : ts) t.join();
  for (int r : {0, 2, 3}) {
    ASSERT_EQ(res[r], ncclSuccess) << "rank " << r << ": " << ncclGetLastError((*sub)[r]);
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(data[r][i], 5000 + 3 * i) << "rank " << r;
  }
}

// Ranks 0, 2 and 3 of 4 shrink away rank 1, which does not call; the new communicator
// numbers them 0, 1, 2 and runs an all-reduce. Then the argument checks.
TEST(Shrink, LeavesOutARankThatDoesNotCall) {
  const int n = 4;
  std::vector<ncclComm_t> comms(n), sub(n, nullptr);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess);
  shrinkAwayRank1AndCheck(comms, &sub,
                          [](int r) { return r == 3 ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT; });
  if (HasFatalFailure()) return;
  for (int r : {0, 2, 3}) {
    int cnt = 0, rk = -1;
    ncclCommCount(sub[r], &cnt);
    ncclCommUserRank(sub[r], &rk);
    EXPECT_EQ(cnt, 3);
    EXPECT_EQ(rk, r == 0 ? 0 : r - 1);
  }
  int excluded[] = {1}, self[] = {0}, twice[] = {1, 1}, far[] = {4};
  ncclComm_t out = nullptr;
  EXPECT_EQ(ncclCommShrink(comms[0], self, 1, &out, nullptr, 0), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comms[0])).find("rank 0 is in excludeRanksList"),
            std::string::npos);
  EXPECT_EQ(ncclCommShrink(comms[0], twice, 2, &out, nullptr, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommShrink(comms[0], far, 1, &out, nullptr, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommShrink(comms[0], nullptr, 1, &out, nullptr, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommShrink(comms[0], excluded, 1, &out, nullptr, 7), ncclInvalidArgument);
  EXPECT_EQ(ncclCommShrink(comms[0], excluded, 1, nullptr, nullptr, 0), ncclInvalidArgument);
  for (int r = 0; r < n; ++r) {
    if (sub[r]) {
      EXPECT_EQ(ncclCommDestroy(sub[r]), ncclSuccess);
    }
    EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess) << "rank " << r;
  }
}

// Rank 1 of 4 never comes to an all-reduce, so the other three wait in it. Each of them
// revokes its communicator: the waiting calls end with an error, the communicators are
// quiescent (ncclCommGetAsyncError: ncclSuccess), later calls are refused, and the three
// shrink the revoked parent (NCCL_SHRINK_DEFAULT) and run an all-reduce on the result.
// `connected`: the four ran an all-reduce before (the three then wait for data, not for
// the connections' set-up over the bootstrap).
void revokeAndShrink(bool connected) {
  const int n = 4;
  std::vector<ncclComm_t> comms(n), sub(n, nullptr);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, nullptr), ncclSuccess);
  std::vector<std::vector<int>> data(n, std::vector<int>(1000, 1));
  std::vector<ncclResult_t> res(n, ncclSuccess);
  std::vector<std::thread> ts;
  if (connected) {
    for (int r = 0; r < n; ++r) {
      ts.emplace_back([&, r] {
        res[r] = ncclAllReduce(data[r].data(), data[r].data(), 1000, ncclInt32, ncclSum, comms[r],
                               nullptr);
      });
    }
    for (auto& t : ts) t.join();
    ts.clear();
    for (int r = 0; r < n; ++r) ASSERT_EQ(res[r], ncclSuccess) << ncclGetLastError(comms[r]);
  }
  for (int r : {0, 2, 3}) {
    ts.emplace_back([&, r] {
      res[r] = ncclAllReduce(data[r].data(), data[r].data(), 1000, ncclInt32, ncclSum, comms[r],
                             nullptr);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the three are waiting
  const auto t0 = std::chrono::steady_clock::now();
  for (int r : {0, 2, 3}) EXPECT_EQ(ncclCommRevoke(comms[r], NCCL_REVOKE_DEFAULT), ncclSuccess);
  for (auto& t : ts) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 10.0);
  for (int r : {0, 2, 3}) {
    EXPECT_NE(res[r], ncclSuccess) << "rank " << r << ": the call in flight was not stopped";
    ncclResult_t state = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(comms[r], &state), ncclSuccess);
    EXPECT_EQ(state, ncclSuccess) << "rank " << r;
  }
  // Refused from now on: calls, ncclCommFinalize; flags other than 0.
  EXPECT_EQ(
      ncclAllReduce(data[0].data(), data[0].data(), 1000, ncclInt32, ncclSum, comms[0], nullptr),
      ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(comms[0])).find("revoked"), std::string::npos)
      << ncclGetLastError(comms[0]);
  EXPECT_EQ(ncclCommFinalize(comms[0]), ncclInvalidUsage);
  EXPECT_EQ(ncclCommRevoke(comms[0], 1), ncclInvalidArgument);
  EXPECT_EQ(ncclCommRevoke(nullptr, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommRevoke(comms[0], NCCL_REVOKE_DEFAULT), ncclSuccess);  // again: no effect
  shrinkAwayRank1AndCheck(comms, &sub, [](int) { return NCCL_SHRINK_DEFAULT; });
  if (::testing::Test::HasFatalFailure()) return;
  for (int r = 0; r < n; ++r) {
    if (sub[r]) {
      EXPECT_EQ(ncclCommDestroy(sub[r]), ncclSuccess);
    }
    EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess) << "rank " << r;
  }
}

TEST(Revoke, WhileTheCallsSetUpTheirConnections) {
  revokeAndShrink(false);
}
TEST(Revoke, WhileTheCallsWaitForData) {
  revokeAndShrink(true);
}

}  // namespace

#include <loom/launch.h>

namespace {

// A rank variable that is set but is not a number is an error naming it, not "unset" (the
// next launcher's variables would then give this process another rank).
TEST(Launch, RankVariablesThatDoNotParseAreErrors) {
  setenv("LOOM_RANK", "3x", 1);
  setenv("LOOM_NRANKS", "4", 1);
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "4", 1);
  int rank = -1, nranks = -1;
  EXPECT_EQ(loomRankFromEnv(&rank, &nranks), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("LOOM_RANK='3x' is not an integer"),
            std::string::npos)
      << ncclGetLastError(nullptr);
  setenv("LOOM_RANK", "2", 1);
  EXPECT_EQ(loomRankFromEnv(&rank, &nranks), ncclSuccess);
  EXPECT_EQ(rank, 2);
  EXPECT_EQ(nranks, 4);
  for (const char* v : {"LOOM_RANK", "LOOM_NRANKS", "RANK", "WORLD_SIZE"}) unsetenv(v);
}

}  // namespace
