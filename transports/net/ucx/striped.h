// One direction of a ucx connection over its lanes (lane.h): lane 0 carries every
// message's 8-byte size, and with it all of a message under kMinPart; a larger one is cut
// into a part per further lane (and one on lane 0 with LOOM_UCX_LANE0_PART). The caller's
// test() moves lane 0 (a small message never waits for another thread); each further
// lane has a thread of its own that posts and progresses its parts, so several cores move
// one message (UCX progresses a worker on one thread at a time), and sleeps in poll() on
// its worker's event descriptor and a wake-up descriptor of its own when nothing moves
// (spinning threads would outnumber the cores with a few hosts per machine), after
// LOOM_UCX_SPIN_US of progressing in vain where that is set. A lane past 0 tags a message's
// part with the message's number. With LOOM_UCX_PREPOST, a receiving connection of 2 lanes
// posts lane 1's receive (the whole buffer) as soon as the message is posted while the last
// message was large, so that the part's rendezvous needs no wait for lane 0's size; the
// helper cancels it when the size says the message was small.
//
// A send comm's lanes keep moving after the caller's last message: a lane thread keeps its
// worker armed and progresses it on its events while nothing is in flight, and the
// backend's sweeper (sweeper.h) does so for lane 0, which only the caller's calls move
// otherwise.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"
#include "transports/net/net.h"
#include "transports/net/ucx/lane.h"
#include "transports/net/ucx/sweeper.h"

namespace loom::transport::net::ucx {

inline constexpr size_t kMinPart = 64 * 1024;  // below this a message goes on lane 0 alone
inline constexpr int kMaxLanes = 16;

class Striped {
 public:
  // `ucp` collects the CPU time of the lane threads when they end; `sweeper` (a send's)
  // moves lane 0 when the caller has nothing left to test.
  Striped(std::vector<std::unique_ptr<Lane>> lanes, bool sending, std::shared_ptr<UcpContext> ucp,
          std::shared_ptr<Sweeper> sweeper = nullptr);
  ~Striped();
  Striped(const Striped&) = delete;
  Striped& operator=(const Striped&) = delete;

  // A send of `size` bytes, or a receive of at most `size`; *request stays null when
  // kMaxRequests messages are in flight.
  Status post(void* data, size_t size, Request** request);
  Status test(Request* request, bool* done, size_t* size);
  void shutdown();
  // Nothing in flight: every message posted has been tested done (with its parts on the
  // other lanes), so no lane reads or writes a caller's buffer any more. (A pre-posting
  // receive may still hold a cancelled guess, which writes nothing; only sends ask.)
  bool idle() const { return posted_ == freed_; }

  // Lane 0's worker's event descriptor where the sweeper watches it (a send's), else -1.
  int lane0Fd() const { return lane0Fd_; }
  // The sweeper's thread, when that descriptor is readable: progresses lane 0 and arms its
  // worker again (kDone), unless its caller has messages in flight or is in a call
  // (kSoon: its tests move lane 0), or events still wait (kAgain: at once again).
  enum class Sweep { kDone, kSoon, kAgain };
  Sweep sweep();

 private:
  struct Message {
    char* data = nullptr;
    size_t capacity = 0;  // a receive: the buffer's size
    size_t size = 0;      // a send: its bytes; a receive: what lane 0's header said
    uint64_t header = 0;
    uint64_t seq = 0;
    LaneRequest* head = nullptr;  // on lane 0
    bool headDone = false;
    uint64_t large = 0;  // a message with parts on the other lanes: its index in large_
  };
  struct Helper {
    std::atomic<uint64_t> done{0};  // large messages this lane has finished its part of
    // Pre-posting (lane 1 of a receive): every message before doneSeq whose part it took
    // is finished; it still reads the entries of messages from holdSeq on.
    std::atomic<uint64_t> doneSeq{0};
    std::atomic<uint64_t> holdSeq{0};
    Status error;     // why it stopped (under errorMutex_)
    int wakeFd = -1;  // an eventfd: work for it, or the end
    std::thread thread;
  };

  void helperMain(int k);
  void prepostMain();  // helperMain of lane 1 of a pre-posting receive
  // After a round of lane k's thread: on at once where it moved something, progressing
  // within LOOM_UCX_SPIN_US of its last move, and otherwise asleep until there may be work
  // (on the worker's events too where `armed`). True where it slept and woke: the next
  // round drains the wake-up descriptor (busy rounds leave it: a read() each saved).
  bool afterRound(int k, int efd, bool moved, bool armed, Clock::time_point* lastMove);
  void partRange(size_t total, int k, size_t* begin, size_t* end) const;
  uint64_t oldestInUse() const;
  void wakeHelpers();
  // The caller's thread: message `m` has parts on the other lanes; the helpers may take it.
  void publishLarge(Message& m);
  Status helperError(int k);
  void stopped(int k, Status st);

  std::vector<std::unique_ptr<Lane>> lanes_;
  std::shared_ptr<UcpContext> ucp_;
  const bool sending_;
  const int nlanes_;
  const bool lane0Part_;  // LOOM_UCX_LANE0_PART
  const int64_t spinNs_;  // LOOM_UCX_SPIN_US
  const bool prepost_;    // LOOM_UCX_PREPOST on a receive of 2 lanes
  // Pre-posting: what the caller posted (message i at recvs_[i % kMaxRequests], recvPosted_
  // of them), and the sizes lane 0 has read (headerKnown_ of them, in order).
  struct Recv {
    char* data = nullptr;
    size_t capacity = 0;
    bool prepost = false;  // lane 1's receive at once (the last message was large)
  };
  Recv recvs_[kMaxRequests];
  std::atomic<uint64_t> recvPosted_{0};
  size_t sizes_[kMaxRequests] = {};
  std::atomic<uint64_t> headerKnown_{0};
  bool lastLarge_ = false;  // the caller's: the last size lane 0 read was of a large message
  Message msgs_[kMaxRequests];
  uint64_t posted_ = 0;  // messages posted (the caller's)
  // The messages with parts on the lanes past 0 (a send's once posted, a receive's once
  // lane 0 has read its size), in order: the helpers take only these, so that small
  // messages never wait for, or wake, a helper. large_[i % kMaxRequests] is the i-th's
  // sequence number; largePosted_ counts them.
  uint64_t large_[kMaxRequests] = {};
  std::atomic<uint64_t> largePosted_{0};
  uint64_t freed_ = 0;                 // messages test() has handed back (the caller's)
  std::unique_ptr<Helper[]> helpers_;  // index k for lane k (0 unused)
  std::atomic<bool> stop_{false};
  std::mutex errorMutex_;
  // A send's lane 0 between the caller's calls and the sweeper's: the caller holds it in
  // post() and test(), the sweeper in sweep().
  std::shared_ptr<Sweeper> sweeper_;
  std::mutex lane0Mutex_;
  std::atomic<bool> callerIdle_{true};  // nothing in flight: every message posted is done
  int lane0Fd_ = -1;
};

}  // namespace loom::transport::net::ucx
