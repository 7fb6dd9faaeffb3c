#include "transports/net/ucx/striped.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <utility>

#include "common/clock.h"
#include "common/log.h"
#include "common/settings.h"

namespace loom::transport::net::ucx {

namespace {

int64_t threadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Empties a lane thread's wake-up descriptor (an eventfd: one read() takes the whole count).
void drainWakeFd(int fd) {
  uint64_t count = 0;
  while (::read(fd, &count, sizeof(count)) > 0) {
  }
}

}  // namespace

Striped::Striped(std::vector<std::unique_ptr<Lane>> lanes, bool sending,
                 std::shared_ptr<UcpContext> ucp, std::shared_ptr<Sweeper> sweeper)
    : lanes_(std::move(lanes)),
      ucp_(std::move(ucp)),
      sending_(sending),
      nlanes_(static_cast<int>(lanes_.size())),
      lane0Part_(settings::get(settings::kUcxLane0Part)),
      spinNs_(static_cast<int64_t>(
          std::min<uint64_t>(settings::get(settings::kUcxSpinUs).orAuto(0), 1000000) * 1000)),
      prepost_(!sending_ && nlanes_ == 2 && !lane0Part_ && settings::get(settings::kUcxPrepost)),
      helpers_(new Helper[lanes_.size()]),
      sweeper_(sending ? std::move(sweeper) : nullptr) {
  for (int k = 1; k < nlanes_; ++k) {
    helpers_[k].wakeFd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (helpers_[k].wakeFd < 0) {
      stopped(k, sysError(errno, "net/ucx: eventfd"));
      continue;
    }
    helpers_[k].thread = std::thread([this, k] {
      helperMain(k);
      ucp_->addThreadCpuNs(threadCpuNs());
    });
  }
  if (sweeper_) {
    auto efd = lanes_[0]->eventFd();
    if (efd) {
      lane0Fd_ = *efd;
      if (!sweeper_->join(this)) sweeper_.reset();  // (said at WARN)
    } else {
      LOOM_WARN(kNet, "net/ucx: no sweeper for the connection to %s: %s", lanes_[0]->peer().c_str(),
                efd.status().message().c_str());
      sweeper_.reset();
    }
  }
}

Striped::~Striped() {
  if (sweeper_) sweeper_->leave(this);
  stop_.store(true, std::memory_order_release);
  wakeHelpers();
  for (int k = 1; k < nlanes_; ++k) {
    if (helpers_[k].thread.joinable()) helpers_[k].thread.join();
    if (helpers_[k].wakeFd >= 0) ::close(helpers_[k].wakeFd);
  }
  // Lane 0 last: its heartbeat tells the other lanes' flushes when the peer has gone.
  for (int k = nlanes_ - 1; k >= 0; --k) lanes_[k].reset();
}

void Striped::partRange(size_t total, int k, size_t* begin, size_t* end) const {
  if (nlanes_ == 1 || total < kMinPart) {
    *begin = 0;
    *end = k == 0 ? total : 0;
    return;
  }
  if (k == 0 && !lane0Part_) {
    *begin = *end = 0;
    return;
  }
  const size_t parts = static_cast<size_t>(lane0Part_ ? nlanes_ : nlanes_ - 1);
  const size_t part = static_cast<size_t>(lane0Part_ ? k : k - 1);
  size_t per = (total + parts - 1) / parts;
  per = (per + 63) / 64 * 64;
  *begin = std::min(total, per * part);
  *end = std::min(total, per * (part + 1));
}

uint64_t Striped::oldestInUse() const {
  // Pre-posting: lane 1's thread still reads the entries of messages from holdSeq on.
  if (prepost_) return std::min(freed_, helpers_[1].holdSeq.load(std::memory_order_acquire));
  // A helper holds the slot of the oldest large message it has not finished.
  uint64_t oldest = freed_;
  const uint64_t large = largePosted_.load(std::memory_order_relaxed);
  for (int k = 1; k < nlanes_; ++k) {
    const uint64_t done = helpers_[k].done.load(std::memory_order_acquire);
    if (done < large) oldest = std::min(oldest, large_[done % kMaxRequests]);
  }
  return oldest;
}

void Striped::publishLarge(Message& m) {
  const uint64_t i = largePosted_.load(std::memory_order_relaxed);
  m.large = i;
  large_[i % kMaxRequests] = m.seq;
  largePosted_.store(i + 1, std::memory_order_release);
  wakeHelpers();
}

void Striped::wakeHelpers() {
  const uint64_t one = 1;
  for (int k = 1; k < nlanes_; ++k) {
    if (helpers_[k].wakeFd >= 0 && ::write(helpers_[k].wakeFd, &one, sizeof(one)) < 0) {
      // Full (it never is: the helper drains it before it sleeps): nothing to do.
    }
  }
}

Status Striped::post(void* data, size_t size, Request** request) {
  *request = nullptr;
  std::unique_lock<std::mutex> lane0(lane0Mutex_, std::defer_lock);
  if (sweeper_) {
    lane0.lock();
    callerIdle_.store(false, std::memory_order_relaxed);  // its tests move lane 0 now
  }
  const uint64_t seq = posted_;
  if (seq - oldestInUse() >= static_cast<uint64_t>(kMaxRequests)) {
    if (prepost_) LOOM_TRY(helperError(1));  // lane 1's thread has stopped: say why
    wakeHelpers();                           // a helper still on a large message holds the slot
    return Status::ok();
  }
  Message& m = msgs_[seq % kMaxRequests];
  m = Message{};
  m.data = static_cast<char*>(data);
  m.seq = seq;
  size_t b = 0, e = 0;
  if (sending_) {
    m.size = size;
    m.header = size;
    partRange(size, 0, &b, &e);
  } else {
    m.capacity = size;
    e = size;  // lane 0 takes all of a small message; a large one's header only
  }
  LOOM_TRY(lanes_[0]->post(m.data + b, e - b, &m.header, &m.head));
  if (!m.head) return Status::ok();
  posted_ = seq + 1;
  if (prepost_) {
    Recv& r = recvs_[seq % kMaxRequests];
    r = Recv{m.data, size, lastLarge_ && size >= kMinPart};
    recvPosted_.store(seq + 1, std::memory_order_release);
    if (r.prepost) wakeHelpers();
  }
  // The helpers take a send's parts at once, a receive's once its size is known (test).
  if (sending_ && nlanes_ > 1 && size >= kMinPart) publishLarge(m);
  *request = reinterpret_cast<Request*>(&m);
  return Status::ok();
}

Status Striped::test(Request* request, bool* done, size_t* size) {
  auto* m = reinterpret_cast<Message*>(request);
  *done = false;
  std::unique_lock<std::mutex> lane0(lane0Mutex_, std::defer_lock);
  if (sweeper_) lane0.lock();
  if (m->seq != freed_) {
    return errorf(Code::kInternalError, "net/ucx: requests to %s tested out of order",
                  lanes_[0]->peer().c_str());
  }
  if (!m->headDone) {
    bool headDone = false;
    size_t got = 0;
    LOOM_TRY(lanes_[0]->test(m->head, &headDone, &got));
    if (!headDone) return Status::ok();
    m->headDone = true;
    if (!sending_) {
      m->size = m->header;
      if (m->size > m->capacity) {
        return errorf(Code::kInvalidUsage,
                      "net/ucx: %s sent a %llu-byte message into a %zu-byte receive (the ranks "
                      "disagree on the operation, or on LOOM_BUFFSIZE)",
                      lanes_[0]->peer().c_str(), (unsigned long long)m->size, m->capacity);
      }
      size_t b, e;
      partRange(m->size, 0, &b, &e);
      if (got != e - b) {
        return errorf(Code::kRemoteError,
                      "net/ucx: %s sent %zu bytes on lane 0 of a %zu-byte message",
                      lanes_[0]->peer().c_str(), got, m->size);
      }
      if (prepost_) {
        // Lane 1's thread posts the part's receive now where it did not at once, or
        // cancels the one it did for a small message.
        const bool large = m->size >= kMinPart;
        sizes_[m->seq % kMaxRequests] = m->size;
        headerKnown_.store(m->seq + 1, std::memory_order_release);
        lastLarge_ = large;
        // (And before small ones fill the window behind it: it steps over them.)
        const uint64_t held = helpers_[1].holdSeq.load(std::memory_order_acquire);
        if (large || recvs_[m->seq % kMaxRequests].prepost ||
            m->seq + 1 - held >= static_cast<uint64_t>(kMaxRequests / 2)) {
          wakeHelpers();
        }
      } else if (nlanes_ > 1 && m->size >= kMinPart) {
        publishLarge(*m);
      }
    }
  }
  if (prepost_ && m->size >= kMinPart &&
      helpers_[1].doneSeq.load(std::memory_order_acquire) <= m->seq) {
    LOOM_TRY(helperError(1));
    return lanes_[0]->heartbeat();  // still waiting on lane 1: has the peer gone?
  }
  if (!prepost_ && nlanes_ > 1 && m->size >= kMinPart) {
    for (int k = 1; k < nlanes_; ++k) {
      if (helpers_[k].done.load(std::memory_order_acquire) > m->large) continue;
      LOOM_TRY(helperError(k));
      return lanes_[0]->heartbeat();  // still waiting on lane k: has the peer gone?
    }
  }
  *done = true;
  *size = m->size;
  ++freed_;
  if (sweeper_ && posted_ == freed_) callerIdle_.store(true, std::memory_order_release);
  return Status::ok();
}

Striped::Sweep Striped::sweep() {
  // With messages in flight the caller's tests move lane 0 (and the sweeper would only
  // contend with them, and keep an events-per-completion transport arming).
  if (!callerIdle_.load(std::memory_order_acquire)) return Sweep::kSoon;
  std::unique_lock<std::mutex> lane0(lane0Mutex_, std::try_to_lock);
  if (!lane0.owns_lock()) return Sweep::kSoon;
  lanes_[0]->drain();
  return lanes_[0]->arm() == UCS_ERR_BUSY ? Sweep::kAgain : Sweep::kDone;
}

void Striped::shutdown() {
  for (auto& lane : lanes_) lane->shutdown();
}

Status Striped::helperError(int k) {
  std::lock_guard<std::mutex> lock(errorMutex_);
  return helpers_[k].error;
}

void Striped::stopped(int k, Status st) {
  std::lock_guard<std::mutex> lock(errorMutex_);
  helpers_[k].error = std::move(st);
}

// Lane k's thread: posts its part of every message once it may (a send's at once, a
// receive's once lane 0 has read its size), progresses the lane while parts are in
// flight, and sleeps in poll() when a round moved nothing: on its wake-up descriptor,
// and on the worker's event descriptor while parts are in flight.
void Striped::helperMain(int k) {
  if (prepost_) {
    prepostMain();
    return;
  }
  Lane& lane = *lanes_[k];
  Helper& me = helpers_[k];
  auto efd = lane.eventFd();
  if (!efd) {
    stopped(k, efd.status());
    return;
  }
  // (large index, the message's sequence number, its part's request: null where it has none)
  struct Part {
    uint64_t large, seq;
    LaneRequest* r;
  };
  std::deque<Part> inFlight;
  uint64_t next = 0;  // the next large message to take
  Clock::time_point lastMove = Clock::now();
  bool woken = true;  // the wake-up descriptor may hold a count: drain it
  while (!stop_.load(std::memory_order_acquire)) {
    if (woken) drainWakeFd(me.wakeFd);
    bool moved = false;
    while (next < largePosted_.load(std::memory_order_acquire)) {
      const uint64_t seq = large_[next % kMaxRequests];
      Message& m = msgs_[seq % kMaxRequests];
      size_t b, e;
      partRange(m.size, k, &b, &e);
      LaneRequest* r = nullptr;
      if (b < e) {
        Status st = lane.post(m.data + b, e - b, nullptr, &r, m.seq);
        if (!st) {
          stopped(k, st);
          return;
        }
        if (!r) break;  // the lane is full: test first
      }
      inFlight.push_back({next++, seq, r});
      moved = true;
    }
    while (!inFlight.empty()) {
      const auto [large, seq, r] = inFlight.front();
      if (r) {
        bool done = false;
        size_t got = 0;
        Status st = lane.test(r, &done, &got);
        if (!st) {
          stopped(k, st);
          return;
        }
        if (!done) break;
        size_t b, e;
        partRange(msgs_[seq % kMaxRequests].size, k, &b, &e);
        if (got != e - b) {
          stopped(k, errorf(Code::kRemoteError, "net/ucx: %s sent %zu bytes of a %zu-byte part",
                            lane.peer().c_str(), got, e - b));
          return;
        }
      }
      inFlight.pop_front();
      me.done.store(large + 1, std::memory_order_release);
      moved = true;
    }
    // A send's worker may hold bytes of a part it has finished (sweeper.h says why): it
    // is progressed on each wake-up and slept on armed, even with nothing in flight.
    if (sending_ && inFlight.empty()) lane.progress();
    woken = afterRound(k, *efd, moved, sending_ || !inFlight.empty(), &lastMove);
  }
}

bool Striped::afterRound(int k, int efd, bool moved, bool armed, Clock::time_point* lastMove) {
  if (moved) {
    if (spinNs_ > 0) *lastMove = Clock::now();
    return false;
  }
  if (spinNs_ > 0 && Clock::now() - *lastMove < std::chrono::nanoseconds(spinNs_)) {
    lanes_[k]->progress();
    return false;
  }
  pollfd fds[2] = {{helpers_[k].wakeFd, POLLIN, 0}, {efd, POLLIN, 0}};
  nfds_t n = 1;
  if (armed) {
    if (lanes_[k]->arm() == UCS_ERR_BUSY) return false;  // events wait: progress them first
    n = 2;
  }
  // The timeout is only a safety net: every change that matters wakes the poll. (A count
  // left in the wake-up descriptor by a busy round makes this poll return at once.)
  return ::poll(fds, n, 100) > 0 && fds[0].revents != 0;
}

// Lane 1's thread of a pre-posting receive: takes the messages in order, posting a part's
// receive over the whole buffer at once where the caller guessed large, and otherwise once
// lane 0 has read the size (none for a small message); finishes them in order, cancelling
// a guess that the size proved wrong.
void Striped::prepostMain() {
  Lane& lane = *lanes_[1];
  Helper& me = helpers_[1];
  auto efd = lane.eventFd();
  if (!efd) {
    stopped(1, efd.status());
    return;
  }
  struct Part {
    uint64_t seq;
    LaneRequest* r;
    bool guessed;  // posted before the size was known
    bool finished = false;
    size_t got = 0;
  };
  std::deque<Part> inFlight;
  uint64_t next = 0;  // the next message to take
  Clock::time_point lastMove = Clock::now();
  bool woken = true;  // the wake-up descriptor may hold a count: drain it
  while (!stop_.load(std::memory_order_acquire)) {
    if (woken) drainWakeFd(me.wakeFd);
    bool moved = false;
    const uint64_t posted = recvPosted_.load(std::memory_order_acquire);
    while (next < posted) {
      const Recv e = recvs_[next % kMaxRequests];
      size_t size = e.capacity;
      if (!e.prepost) {
        if (next >= headerKnown_.load(std::memory_order_acquire)) break;  // its size first
        size = sizes_[next % kMaxRequests];
      }
      if (e.prepost || size >= kMinPart) {
        LaneRequest* r = nullptr;
        Status st = lane.post(e.data, size, nullptr, &r, next);
        if (!st) {
          stopped(1, st);
          return;
        }
        if (!r) break;  // the lane is full: test first
        inFlight.push_back({next, r, e.prepost});
      }
      ++next;
      moved = true;
    }
    while (!inFlight.empty()) {
      Part& p = inFlight.front();
      const bool known = p.seq < headerKnown_.load(std::memory_order_acquire);
      const size_t size = known ? sizes_[p.seq % kMaxRequests] : 0;
      if (p.guessed && known && size < kMinPart && !p.finished) {
        lane.cancel(p.r);  // a small one after all
      }
      if (!p.finished) {
        bool done = false;
        Status st = lane.test(p.r, &done, &p.got);
        if (!st) {
          stopped(1, st);
          return;
        }
        if (!done) break;
        p.finished = true;
        moved = true;
      }
      if (!known) {
        lane.progress();  // the later parts move on while this one waits for its size
        break;
      }
      if (size < kMinPart && p.got != 0) {
        stopped(1, errorf(Code::kRemoteError,
                          "net/ucx: %s sent %zu bytes on lane 1 of a %zu-byte message",
                          lane.peer().c_str(), p.got, size));
        return;
      }
      if (size >= kMinPart) {
        if (p.got != size) {
          stopped(1, errorf(Code::kRemoteError,
                            "net/ucx: %s sent %zu bytes on lane 1 of a %zu-byte message",
                            lane.peer().c_str(), p.got, size));
          return;
        }
        me.doneSeq.store(p.seq + 1, std::memory_order_release);
      }
      inFlight.pop_front();
      moved = true;
    }
    me.holdSeq.store(inFlight.empty() ? next : inFlight.front().seq, std::memory_order_release);
    // Armed while a receive waits on UCX (a finished one waiting for its size is woken by
    // the caller when it reads the size).
    // (Only the front can have finished: the parts finish in order.)
    const bool waiting = inFlight.size() > 1 || (!inFlight.empty() && !inFlight.front().finished);
    woken = afterRound(1, *efd, moved, waiting, &lastMove);
  }
}

}  // namespace loom::transport::net::ucx
