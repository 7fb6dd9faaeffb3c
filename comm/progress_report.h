// "Who is stuck": when a wait times out, the rank that timed out asks every other rank
// where it is, and the error says it.
//
// Each rank keeps a ProgressRecord (the last call it entered: sequence number, type,
// count, root; whether that call returned; the rank's own failure, if any) and serves
// it from a ProgressServer: a thread of the communicator with a listening socket of its
// own (on the bootstrap's interface), idle in poll() until asked. A question carries the
// communicator's secret; a connection without it is dropped and logged, and every
// connection gets its own short deadline (common/handshake.h), so a stranger stalls
// nobody. askWhereRanksAre() asks every rank at once, each under one deadline, and
// sums the answers up in one line: the ranks in the same state together.
//
// A rank that is stopped (SIGSTOP, a debugger, a hung host) or cut off does not answer
// within the deadline; one whose process is gone refuses the connection. Both are said
// as such. Sequence numbers count every collective (and every group of send/receive
// calls) this rank entered, so ranks that called the same things agree on them; for GPU
// buffers "returned" means queued on the stream.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/socket.h"
#include "common/status.h"

namespace loom::comm {

// The answer a rank gives (fixed layout: it travels between processes of one build).
struct ProgressReply {
  uint64_t magic = 0;
  int32_t rank = -1;
  int32_t type = -1;      // collectives::CollType of the last call entered; -1: none yet
  uint64_t entered = 0;   // sequence number of that call (1 = the first)
  uint64_t returned = 0;  // the last call that returned (== entered: not in a call)
  uint64_t count = 0;
  int32_t root = -1;
  int32_t onDevice = 0;     // 1: GPU buffers (returned = queued on the stream)
  int64_t sinceMs = 0;      // since it entered (in a call) or returned (not in one)
  char failure[200] = {0};  // the rank's own first failure, cut short
};

class ProgressRecord {
 public:
  void enter(int type, uint64_t count, int root, bool onDevice);
  void leave();
  void setFailure(const std::string& message);
  ProgressReply snapshot(int rank) const;

 private:
  mutable std::mutex mutex_;
  ProgressReply state_;
  Clock::time_point since_ = Clock::now();
};

class ProgressServer {
 public:
  // Listens on `ip` (its port is ignored) and answers with `record`'s snapshot, to
  // questions that carry `secret`.
  static Result<std::unique_ptr<ProgressServer>> start(const SocketAddress& ip, int rank,
                                                       const uint64_t secret[2],
                                                       const ProgressRecord* record);
  ~ProgressServer();  // returns at once (the thread is woken)
  const SocketAddress& address() const { return address_; }

 private:
  ProgressServer() = default;
  void run();

  Socket listener_;
  SocketAddress address_;
  int rank_ = -1;
  uint64_t secret_[2] = {0, 0};
  const ProgressRecord* record_ = nullptr;
  int stopFd_ = -1;
  std::thread thread_;
};

// How long a rank that timed out waits for the others' answers. A live rank's progress
// thread answers within a millisecond or two (it is idle in poll()), so this is mostly
// the time a stopped rank costs, on top of LOOM_TIMEOUT_MS; the reliability goal is the
// timeout within 100 ms for a stopped peer.
constexpr int64_t kAnswerMs = 80;

// Asks every rank but `self` with `whom[r]` set (at `addresses`) where it is, each within
// `deadlineMs`, 128 at a time, and returns one line such as
//   "where the ranks are: rank 0 (this one): in AllReduce #12 (count 1024) for 30.0 s;
//    ranks 1, 3: in AllReduce #12 (count 1024); rank 2: not in a call; its last,
//    AllReduce #11 (count 1024), returned: it has not called #12; rank 4: no answer
//    within 80 ms (stopped, hung or cut off)"
std::string askWhereRanksAre(const std::vector<SocketAddress>& addresses,
                             const std::vector<char>& whom, int self, const uint64_t secret[2],
                             const ProgressReply& mine, int64_t deadlineMs);

// Whether `st` is a wait that ran out of time (LOOM_TIMEOUT_MS).
bool isTimeout(const Status& st);

}  // namespace loom::comm
