// `socket`: the network backend that always works (transports/net/net.h). A connection
// is LOOM_NSOCKS_PERTHREAD x LOOM_SOCKET_NTHREADS TCP sockets (at most kMaxSocks); socket
// 0 carries an 8-byte size before each message and every message under kMinPart bytes;
// a larger one is cut into one part per further socket (sockets 1 to n-1; socket 0's own
// where it is the only one), so several sockets (and, with helper threads, several cores
// doing the kernel's copies) carry it at once. Everything is non-blocking: the caller's
// test() moves socket 0's bytes (a small message never waits for another thread to wake)
// and, without helper threads, the others' too.
//
// A connection may carry messages both ways (duplex()): where the handle it connects with
// asks for it (kPairOfferByte, set by transports/net/connect.cc where both ends pair), the
// sender dials n - 1 further sockets for the way back and says so in its hellos, and the
// comms' reverse() send on socket 0 and those. A failure in either direction shuts the
// sockets of both, and they close with the last comm of the two. Socket 0, the sizes and
// every small message, is shared by the two directions, each with its own requests and
// framing: a small reply then carries the acknowledgement of what it answers
// (on loopback one TCP connection both ways moved an 8-byte ping-pong in 3.5 us one way
// against 6.9 with a connection each way: scripts/bench/tcp_pingpong_probe.cc, one H100
// machine, 2026-12-07). The large parts keep sockets of their own per direction: 4-host
// all-reduces of 128 MiB whose sockets all carried both directions ran at 0.10-0.87 x the
// busbw of a connection each way (presumably because a TCP socket's sends and receives
// copy under one lock; not traced).
//
// Set-up: listen() opens a listening socket of its own and puts its address, a random
// nonce and the socket count in the handle. The sender's sockets each say hello (magic,
// communicator hash, nonce, index, rank, how many it dials) first; the listener gives every
// connection that arrives kHandshakeMs to do so, each on its own clock, and drops (and logs) one
// that says anything else or nothing: a port scanner or a stranger costs nobody a wait.
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "common/handshake.h"
#include "common/log.h"
#include "common/settings.h"
#include "common/socket.h"
#include "transports/net/net.h"

namespace loom::transport::net {
namespace {

constexpr uint64_t kHandleMagic = 0x316574656e6d6f6full;  // "loomnet1"
constexpr uint64_t kHelloMagic = 0x6f6c6c65686d6f6full;   // "loomhello"
constexpr int kMaxSocks = 16;
constexpr size_t kMinPart = 64 * 1024;  // a message below this goes on socket 0 alone
// LOOM_SOCKET_NTHREADS where it is not set: 4 sockets, socket 0 moved by the proxy thread
// and each of the other 3 by a helper thread of its own. 2 processes as hosts on one H200 machine
// (16 cores, loopback, all_reduce 128 MiB, 4 lanes, 2026-12-02): 1 thread 2.45 GB/s busbw, 2: 6.9,
// 3: 8.4, 4: 8.9.
constexpr int64_t kDefaultThreads = 4;

struct ConnectStage;

struct SocketHandle {
  uint64_t magic;
  SocketAddress address;
  uint64_t nonce;
  int32_t nsocks;
  int32_t rank;         // the listener's
  ConnectStage* stage;  // the sender's state between connect() calls (null as sent)
};
static_assert(sizeof(SocketHandle) <= kPairOfferByte, "the last byte is connect.cc's");

// A connection's sockets, shared by the comms of its two directions; closed with the last.
// n sockets one way; 2n - 1 both ways: 0 to n - 1 the dialer's direction, then 0 and n
// to 2n - 2 the way back.
using SharedSockets = std::shared_ptr<std::vector<Socket>>;

// The sockets of one direction of a connection of n per direction.
std::vector<Socket*> directionOf(std::vector<Socket>& all, size_t n, bool back) {
  std::vector<Socket*> v;
  for (size_t k = 0; k < n; ++k) v.push_back(&all[k == 0 || !back ? k : n - 1 + k]);
  return v;
}

struct Hello {
  uint64_t magic;
  uint64_t commHash;
  uint64_t nonce;
  int32_t index;
  int32_t rank;
  int32_t back;  // 1: the sender dials the way back's sockets too (2n - 1 in all)
  int32_t pad;
};

// The bytes of a `total`-byte message that socket k of n carries.
void partRange(size_t total, int k, int n, size_t* begin, size_t* end) {
  if (n == 1 || total < kMinPart) {
    *begin = 0;
    *end = k == 0 ? total : 0;
    return;
  }
  if (k == 0) {
    *begin = *end = 0;
    return;
  }
  const size_t parts = static_cast<size_t>(n - 1);
  size_t per = std::max(kMinPart / 2, (total + parts - 1) / parts);
  per = (per + 63) / 64 * 64;
  *begin = std::min(total, per * (k - 1));
  *end = std::min(total, per * k);
}

std::string peerName(int rank) {
  return rank >= 0 ? "rank " + std::to_string(rank) : "the peer";
}

// The helper threads each connection direction gets, and where they add the CPU they
// used when they end (shared by the backend and every connection it made).
struct Helpers {
  int count = 0;
  std::shared_ptr<std::atomic<int64_t>> cpuNs = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace

// A posted message. Fields are written by the poster before `posted` is published and
// only read after; `size` of a receive is written by socket 0's mover before it bumps
// `headers` (release), and read by the others after they see it (acquire).
struct Request {
  char* data = nullptr;
  size_t capacity = 0;  // receive: the buffer's size
  size_t size = 0;      // send: the message; receive: what arrived (from its header)
  uint64_t header = 0;  // receive: socket 0 reads the size here
  uint64_t seq = 0;
};

namespace {

// One direction of one connection: its sockets, the requests posted on it, and who moves
// the bytes. The caller's test() always moves socket 0's (the sizes, and all of a message
// under kMinPart: a small message never waits for a thread to wake); the others' move in
// test() too, or, with helper threads, helper t moves those of sockets k >= 1 with
// (k - 1) % threads == t.
class SocketComm {
 public:
  // `socks`: this direction's sockets, in `owned`.
  SocketComm(SharedSockets owned, std::vector<Socket*> socks, bool sending, int peer,
             const Helpers& helpers)
      : sending_(sending),
        what_(peerName(peer)),
        nsocks_(socks.size()),
        owned_(std::move(owned)),
        socks_(new Sock[nsocks_]),
        cpuNs_(helpers.cpuNs) {
    for (size_t k = 0; k < nsocks_; ++k) socks_[k].sock = socks[k];
    const int threads = std::clamp(helpers.count, 0, static_cast<int>(nsocks_) - 1);
    // Before any helper starts: they read both.
    for (int t = 0; t < threads; ++t) {
      const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      if (fd < 0) {  // no helpers then: the caller moves every socket (slower, still right)
        LOOM_WARN(kNet, "socket backend: eventfd: %s; %s runs without helper threads",
                  std::strerror(errno), what_.c_str());
        for (int w : wakeFds_) ::close(w);
        wakeFds_.clear();
        break;
      }
      wakeFds_.push_back(fd);
    }
    threaded_ = !wakeFds_.empty();
    if (!threaded_) return;
    for (int t = 0; t < threads; ++t)
      helpers_.emplace_back([this, t, threads] { helperMain(t, threads); });
  }
  ~SocketComm() {
    stopHelpers();
    for (int fd : wakeFds_)
      if (fd >= 0) close(fd);
  }

  // Takes a request slot for a new message; null when kMaxRequests are in flight (or a
  // helper has not yet passed the request that last used the slot).
  Request* post(const void* data, size_t bytes) {
    const uint64_t posted = posted_.load(std::memory_order_relaxed);
    if (posted - oldestInUse() >= static_cast<uint64_t>(kMaxRequests)) {
      stepOverSmall();
      if (posted - oldestInUse() >= static_cast<uint64_t>(kMaxRequests)) return nullptr;
    }
    Request& r = requests_[posted % kMaxRequests];
    r.data = static_cast<char*>(const_cast<void*>(data));
    r.capacity = bytes;
    // Atomic: a helper may read the size of a request it is about to be stepped past,
    // meanwhile reused (progress() validates what it read before it acts on it).
    std::atomic_ref<size_t>(r.size).store(sending_ ? bytes : 0, std::memory_order_relaxed);
    r.header = 0;
    r.seq = posted;
    posted_.store(posted + 1, std::memory_order_release);
    // A receive's helpers wait for its size, which wakes them.
    if (sending_) wakeHelpersFor(bytes);
    return &r;
  }

  Status test(Request* r, bool* done, size_t* size) {
    *done = false;
    if (!failed_.isOk()) return failed_;
    if (r->seq != freed_) {
      return errorf(Code::kInternalError, "socket backend: requests to %s tested out of order",
                    what_.c_str());
    }
    // First up to this request only; where it is not done yet, on past it too (a
    // receive's later sizes let the helpers start on their parts meanwhile). Done at
    // once, it costs no system call that would find nothing.
    for (const uint64_t last : {r->seq, UINT64_MAX}) {
      for (size_t k = 0; k < (threaded_ ? 1 : nsocks_); ++k) {
        if (!socketError(k).isOk()) continue;
        Status st = progress(k, last);
        if (!st) {
          std::lock_guard<std::mutex> lock(errorMutex_);
          socks_[k].error = st;
        }
      }
      stepOverSmall();
      if (firstUnfinished(*r) == nsocks_) break;
    }
    // A socket that failed (the peer closed it, say) fails only the requests it had not
    // finished: what arrived before stays good.
    bool unfinished = false;
    for (size_t k = 0; k < nsocks_; ++k) {
      if (!unfinishedOn(*r, k)) continue;
      unfinished = true;
      if (Status st = socketError(k); !st.isOk()) return fail(st);
    }
    if (unfinished) return Status::ok();
    *done = true;
    *size = r->size;
    ++freed_;
    return Status::ok();
  }

  void shutdown() {
    for (size_t k = 0; k < nsocks_; ++k) socks_[k].sock->shutdown();
  }

 private:
  // A helper's socket: the request it works on, with kClaimed set once it has started on
  // its part. Until then the caller's thread may step it over messages it has no part of
  // (stepOverSmall), so that small messages never wait for, or wake, a helper.
  static constexpr uint64_t kClaimed = uint64_t{1} << 63;
  static uint64_t seqOf(uint64_t v) { return v & ~kClaimed; }
  struct Sock {
    Socket* sock = nullptr;        // in owned_
    std::atomic<uint64_t> seq{0};  // the request this socket works on (kClaimed: started)
    size_t done = 0;               // bytes of that request's (header and) part moved
    Status error;  // why it stopped (written by its mover; helpers: under errorMutex_)
  };

  // Moves what socket k can move now without blocking, up to request `last` (the one the
  // caller tests: a receive posted after it would cost a system call that finds nothing).
  Status progress(size_t k, uint64_t last = UINT64_MAX) {
    Sock& s = socks_[k];
    const int n = static_cast<int>(nsocks_);
    // A helper's socket, which the caller's thread may step over small messages meanwhile.
    const bool shared = threaded_ && k != 0;
    while (true) {
      const uint64_t v = s.seq.load(std::memory_order_acquire);
      const uint64_t seq = seqOf(v);
      if (seq >= posted_.load(std::memory_order_acquire) || seq > last) return Status::ok();
      Request& r = requests_[seq % kMaxRequests];
      if (shared && !(v & kClaimed)) {
        // Not started: a message this socket has no part of is stepped over, one it has a
        // part of claimed first. Either fails where stepOverSmall moved the socket on since
        // the load (the request read may then be a later one in the same slot): load again.
        if (!sending_ && headers_.load(std::memory_order_acquire) <= seq) return Status::ok();
        size_t b, e;
        partRange(std::atomic_ref<size_t>(r.size).load(std::memory_order_relaxed),
                  static_cast<int>(k), n, &b, &e);
        uint64_t expected = seq;
        if (b == e) {
          s.seq.compare_exchange_strong(expected, seq + 1, std::memory_order_acq_rel);
          continue;
        }
        if (!s.seq.compare_exchange_strong(expected, seq | kClaimed, std::memory_order_acq_rel))
          continue;
      }
      const size_t hdr = k == 0 ? sizeof(uint64_t) : 0;
      if (!sending_) {
        if (k == 0 && s.done < hdr) {
          // (A size may straddle the end of the read-ahead: then read on.)
          while (s.done < hdr) {
            LOOM_ASSIGN_OR_RETURN(
                size_t got, recvSome(k, reinterpret_cast<char*>(&r.header) + s.done, hdr - s.done));
            if (got == 0) return Status::ok();
            s.done += got;
          }
          if (r.header > r.capacity) {
            return errorf(Code::kInvalidUsage,
                          "%s sent a %llu-byte message into a %zu-byte receive (the ranks "
                          "disagree on the operation, or on LOOM_BUFFSIZE)",
                          what_.c_str(), (unsigned long long)r.header, r.capacity);
          }
          std::atomic_ref<size_t>(r.size).store(r.header, std::memory_order_relaxed);
          headers_.store(seq + 1, std::memory_order_release);
          wakeHelpersFor(r.size);  // their sockets may have waited for the size
        } else if (k != 0 && headers_.load(std::memory_order_acquire) <= seq) {
          return Status::ok();  // the size is not known yet
        }
      }
      size_t b, e;
      partRange(r.size, static_cast<int>(k), n, &b, &e);
      const size_t want = hdr + (e - b);
      while (s.done < want) {
        size_t moved = 0;
        if (sending_) {
          LOOM_ASSIGN_OR_RETURN(moved, sendPart(s, r, hdr, b, e));
        } else {
          LOOM_ASSIGN_OR_RETURN(moved, recvSome(k, r.data + b + (s.done - hdr), want - s.done));
        }
        if (moved == 0) return Status::ok();
        s.done += moved;
      }
      s.done = 0;
      s.seq.store(seq + 1, std::memory_order_release);
    }
  }

  // Sends what is left of socket s's part [begin, end) of r; socket 0 sends what is left
  // of the size first, in the same call.
  Result<size_t> sendPart(Sock& s, const Request& r, size_t hdr, size_t begin, size_t end) {
    if (s.done >= hdr) {
      const size_t at = begin + (s.done - hdr);
      return s.sock->sendSome(r.data + at, end - at, what_.c_str());
    }
    uint64_t h = r.size;
    iovec iov[2] = {{reinterpret_cast<char*>(&h) + s.done, hdr - s.done},
                    {r.data + begin, end - begin}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    while (true) {
      ssize_t n = ::sendmsg(s.sock->fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) return static_cast<size_t>(n);
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
      return Status(errno == EPIPE || errno == ECONNRESET ? Code::kRemoteError : Code::kSystemError,
                    sysError(errno, "send to %s", what_.c_str()).message());
    }
  }
  // Receives into p what socket k has, up to `bytes`. Socket 0 (only the caller's thread
  // moves it) reads ahead: a read of less than kReadAhead fills the look-ahead buffer
  // instead, so that a small message's size and bytes take one system call, not two, and
  // reads are served from that buffer while it holds anything.
  Result<size_t> recvSome(size_t k, void* p, size_t bytes) {
    Sock& s = socks_[k];
    if (k != 0) return s.sock->recvSome(p, bytes, what_.c_str());
    if (aheadAt_ == aheadEnd_) {
      if (bytes >= kReadAhead) return s.sock->recvSome(p, bytes, what_.c_str());
      if (!ahead_) ahead_ = std::make_unique<char[]>(kReadAhead);
      LOOM_ASSIGN_OR_RETURN(size_t got, s.sock->recvSome(ahead_.get(), kReadAhead, what_.c_str()));
      aheadAt_ = 0;
      aheadEnd_ = got;
    }
    const size_t n = std::min(bytes, aheadEnd_ - aheadAt_);
    std::memcpy(p, ahead_.get() + aheadAt_, n);
    aheadAt_ += n;
    return n;
  }

  // A helper: moves its sockets' bytes, blocking in poll() on the sockets that cannot
  // move and on its wake-up descriptor, which post(), the size of a receive arriving on
  // socket 0, and the end signal. A receive's socket that waits for that size is not
  // polled (bytes may sit there that it cannot place yet).
  void helperMain(int t, int threads) {
    std::vector<pollfd> fds;
    while (!stop_.load(std::memory_order_acquire)) {
      uint64_t drained = 0;
      while (::read(wakeFds_[t], &drained, sizeof(drained)) > 0) {
      }
      fds.clear();
      fds.push_back({wakeFds_[t], POLLIN, 0});
      for (size_t k = 1 + t; k < nsocks_; k += threads) {
        if (!socketError(k).isOk()) continue;
        Status st = progress(k);
        if (!st) {
          std::lock_guard<std::mutex> lock(errorMutex_);
          socks_[k].error = st;
          continue;
        }
        const uint64_t seq = seqOf(socks_[k].seq.load(std::memory_order_relaxed));
        if (seq >= posted_.load(std::memory_order_acquire)) continue;
        if (!sending_ && k != 0 && headers_.load(std::memory_order_acquire) <= seq) continue;
        fds.push_back({socks_[k].sock->fd(), static_cast<short>(sending_ ? POLLOUT : POLLIN), 0});
      }
      // The timeout is only a safety net: every change that matters wakes the poll.
      ::poll(fds.data(), fds.size(), 100);
    }
    cpuNs_->fetch_add(threadCpuNs(), std::memory_order_relaxed);
  }
  // The first socket that still has work on r (nsocks_: none).
  size_t firstUnfinished(const Request& r) const {
    for (size_t k = 0; k < nsocks_; ++k)
      if (unfinishedOn(r, k)) return k;
    return nsocks_;
  }
  // Whether socket k still has work on r. A helper's socket with no part of r is done with
  // it already (stepped over it, or will be): a small message never waits for a helper.
  bool unfinishedOn(const Request& r, size_t k) const {
    if (seqOf(socks_[k].seq.load(std::memory_order_acquire)) > r.seq) return false;
    return !(threaded_ && k != 0 && noPart(r, k));
  }
  // A request failed: the connection is lost (its messages' order with it). Every socket
  // is shut and the helpers stopped before the error reaches the caller, who may then
  // free the buffers of this request and the ones after it: no helper is still moving
  // bytes into or out of them (under ASan a helper's recv() wrote into a freed buffer).
  // Every later test() returns the same error.
  Status fail(Status st) {
    shutdown();
    stopHelpers();
    failed_ = st;
    return st;
  }
  // Whether socket k carries none of r (a receive's size must be known).
  bool noPart(const Request& r, size_t k) const {
    if (!sending_ && headers_.load(std::memory_order_acquire) <= r.seq) return false;
    size_t b, e;
    partRange(r.size, static_cast<int>(k), static_cast<int>(nsocks_), &b, &e);
    return b == e;
  }
  // The oldest request some socket still works on (slots from it on are in use).
  uint64_t oldestInUse() const {
    uint64_t oldest = freed_;
    if (threaded_) {
      for (size_t k = 1; k < nsocks_; ++k)
        oldest = std::min(oldest, seqOf(socks_[k].seq.load(std::memory_order_acquire)));
    }
    return oldest;
  }
  // The caller's thread steps each helper's socket over the messages it has no part of,
  // up to the first it has one of (or whose size a receive does not know yet), unless its
  // helper has started on one (kClaimed). Without this a small message left the helpers
  // behind until they were woken to catch up: eventfd writes and wake-ups every few
  // messages, and steps of 8 B that took 6.7-9.0 us on average where one thread took 4
  // (a proxy over loopback on the 2-core development machine, 2026-12-05).
  void stepOverSmall() {
    if (!threaded_) return;
    const uint64_t posted = posted_.load(std::memory_order_acquire);
    const uint64_t known = sending_ ? posted : headers_.load(std::memory_order_acquire);
    for (size_t k = 1; k < nsocks_; ++k) {
      std::atomic<uint64_t>& seq = socks_[k].seq;
      uint64_t v = seq.load(std::memory_order_acquire);
      while (!(v & kClaimed) && v < known) {
        if (!noPart(requests_[v % kMaxRequests], k)) break;
        // Fails where the helper moved on meanwhile; v then holds where it is now.
        if (seq.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) ++v;
      }
    }
  }
  // Wakes the helpers for a message of `bytes`: when they have a part of it, or when they
  // have fallen half the request window behind (stepping over small messages).
  void wakeHelpersFor(size_t bytes) {
    if (!threaded_) return;
    if (bytes >= kMinPart ||
        posted_.load(std::memory_order_relaxed) - oldestInUse() >= kMaxRequests / 2) {
      wakeHelpers();
    }
  }
  void wakeHelpers() {
    if (!threaded_) return;
    const uint64_t one = 1;
    for (int fd : wakeFds_) {
      if (::write(fd, &one, sizeof(one)) < 0) {
        // Full (it never is: the helper drains it before it polls) or closed: nothing to do.
      }
    }
  }
  Status socketError(size_t k) {
    if (!threaded_) return socks_[k].error;
    std::lock_guard<std::mutex> lock(errorMutex_);
    return socks_[k].error;
  }
  void stopHelpers() {
    stop_.store(true, std::memory_order_release);
    wakeHelpers();
    for (auto& h : helpers_) h.join();
    helpers_.clear();
  }

  const bool sending_;
  const std::string what_;
  const size_t nsocks_;
  const SharedSockets owned_;      // with the other direction's comm, where it has one
  std::unique_ptr<Sock[]> socks_;  // fixed once helpers run
  // Receive, socket 0: bytes read ahead of the request that wanted them (recvSome).
  static constexpr size_t kReadAhead = 4096;
  std::unique_ptr<char[]> ahead_;
  size_t aheadAt_ = 0, aheadEnd_ = 0;
  Request requests_[kMaxRequests];
  std::atomic<uint64_t> posted_{0};
  std::atomic<uint64_t> headers_{0};  // receive: messages whose size socket 0 has read
  uint64_t freed_ = 0;                // requests test() has handed back (the caller's)
  bool threaded_ = false;             // helper threads move the bytes (fixed before they start)
  std::vector<std::thread> helpers_;  // only the constructor and stopHelpers touch it
  std::atomic<bool> stop_{false};
  std::vector<int> wakeFds_;  // one eventfd per helper (fixed before they start)
  std::shared_ptr<std::atomic<int64_t>> cpuNs_;
  std::mutex errorMutex_;
  Status failed_;  // set by fail(): the caller's thread only
};

// The part of a connection of n sockets a direction that a comm moves: the one way of a
// connection of n sockets, the dialer's way of one of 2n - 1 (which has a way back), or
// its way back (a reverse()).
enum class Way { kOnly, kThere, kBack };

// What a comm keeps to give the other direction of its connection (reverse()).
struct WayBack {
  SharedSockets socks;  // null where the connection has none, or once taken
  size_t n = 0;
  int peer = -1;
  Helpers helpers;

  WayBack(const SharedSockets& all, size_t n, Way way, int peer, const Helpers& helpers)
      : socks(way == Way::kThere ? all : nullptr), n(n), peer(peer), helpers(helpers) {}
  Result<WayBack> take() {
    if (!socks) {
      return errorf(Code::kInternalError,
                    "net/socket: reverse() of a connection with no way back, or a second one");
    }
    return std::move(*this);
  }
};

class SocketSend final : public SendComm {
 public:
  SocketSend(SharedSockets socks, size_t n, Way way, int peer, const Helpers& helpers)
      : back_(socks, n, way, peer, helpers),
        comm_(socks, directionOf(*socks, n, way == Way::kBack), true, peer, helpers) {}
  Result<MemHandle> regMr(void*, size_t, MemType type) override { return registration(type); }
  Status deregMr(MemHandle) override { return Status::ok(); }
  Status isend(const void* data, size_t size, int, MemHandle, Request** request) override {
    *request = comm_.post(data, size);
    return Status::ok();
  }
  Status test(Request* r, bool* done, size_t* size) override { return comm_.test(r, done, size); }
  void shutdown() override { comm_.shutdown(); }
  bool twoWay() const override { return back_.socks != nullptr; }
  Result<std::unique_ptr<RecvComm>> reverse() override;

  static Result<MemHandle> registration(MemType type) {
    if (type != MemType::kHost) {
      return errorf(Code::kInternalError, "the socket backend moves host memory only");
    }
    return MemHandle(nullptr);
  }

 private:
  WayBack back_;
  SocketComm comm_;
};

class SocketRecv final : public RecvComm {
 public:
  SocketRecv(SharedSockets socks, size_t n, Way way, int peer, const Helpers& helpers)
      : back_(socks, n, way, peer, helpers),
        comm_(socks, directionOf(*socks, n, way == Way::kBack), false, peer, helpers) {}
  Result<MemHandle> regMr(void*, size_t, MemType type) override {
    return SocketSend::registration(type);
  }
  Status deregMr(MemHandle) override { return Status::ok(); }
  Status irecv(int n, void** data, const size_t* sizes, const int*, const MemHandle*,
               Request** request) override {
    if (n != 1)
      return errorf(Code::kInternalError, "the socket backend takes one buffer per receive");
    *request = comm_.post(data[0], sizes[0]);
    return Status::ok();
  }
  Status test(Request* r, bool* done, size_t* sizes) override { return comm_.test(r, done, sizes); }
  void shutdown() override { comm_.shutdown(); }
  bool twoWay() const override { return back_.socks != nullptr; }
  Result<std::unique_ptr<SendComm>> reverse() override {
    LOOM_ASSIGN_OR_RETURN(WayBack w, back_.take());
    return std::unique_ptr<SendComm>(new SocketSend(w.socks, w.n, Way::kBack, w.peer, w.helpers));
  }

 private:
  WayBack back_;
  SocketComm comm_;
};

Result<std::unique_ptr<RecvComm>> SocketSend::reverse() {
  LOOM_ASSIGN_OR_RETURN(WayBack w, back_.take());
  return std::unique_ptr<RecvComm>(new SocketRecv(w.socks, w.n, Way::kBack, w.peer, w.helpers));
}

class SocketListen final : public ListenComm {
 public:
  SocketListen(const Context& ctx, Socket listener, uint64_t nonce, int nsocks,
               const Helpers& helpers)
      : ctx_(ctx),
        listener_(std::move(listener)),
        nonce_(nonce),
        helpers_(helpers),
        nsocks_(nsocks),
        arrivals_(&listener_, sizeof(Hello), ctx.handshakeMs, "net/socket") {}

  Status accept(std::unique_ptr<RecvComm>* comm) override {
    *comm = nullptr;
    while (true) {
      LOOM_ASSIGN_OR_RETURN(std::optional<Arrival> a, arrivals_.poll());
      if (!a) break;
      if (const char* why = place(*a)) arrivals_.drop(*a, why);
    }
    if (slots_.empty()) return Status::ok();
    for (const auto& s : slots_) {
      if (!s.isOpen()) return Status::ok();
    }
    auto socks = std::make_shared<std::vector<Socket>>();
    for (auto& s : slots_) socks->push_back(std::move(s));
    *comm = std::make_unique<SocketRecv>(std::move(socks), nsocks_,
                                         back_ ? Way::kThere : Way::kOnly, peerRank_, helpers_);
    return Status::ok();
  }

 private:
  // Where a hello says its socket belongs; the reason to drop it otherwise.
  const char* place(Arrival& a) {
    Hello h;
    std::memcpy(&h, a.hello.data(), sizeof(h));
    if (h.magic != kHelloMagic) return "it spoke another protocol";
    if (h.commHash != ctx_.commHash) return "it belongs to another communicator";
    if (h.nonce != nonce_) return "it is meant for another connection";
    // n sockets, or 2n - 1 with the way back; the first hello says which.
    if (h.back != 0 && h.back != 1) return "it gave a bad socket count";
    if (slots_.empty()) {
      back_ = h.back == 1;
      slots_.resize(back_ ? 2 * nsocks_ - 1 : nsocks_);
    }
    if (back_ != (h.back == 1)) return "it gave another socket count";
    if (h.index < 0 || h.index >= static_cast<int>(slots_.size()) || slots_[h.index].isOpen()) {
      return "it gave a bad socket index";
    }
    peerRank_ = h.rank;
    slots_[h.index] = std::move(a.sock);
    return nullptr;
  }

  Context ctx_;
  Socket listener_;
  uint64_t nonce_;
  Helpers helpers_;
  int nsocks_;                 // a direction's
  bool back_ = false;          // the sender dials the way back too (the first hello says)
  std::vector<Socket> slots_;  // sized by the first hello
  Arrivals arrivals_;
  int peerRank_ = -1;
};

// The sender's sockets while they connect and say hello.
struct ConnectStage {
  struct Pending {
    Socket sock;
    bool connected = false;
    size_t sent = 0;  // bytes of the hello
    Clock::time_point retryAt{};
  };
  std::vector<Pending> socks;
  bool back = false;  // the way back's sockets too
  Clock::time_point deadline;
};

class SocketBackend final : public Backend {
 public:
  SocketBackend(const Context& ctx, std::vector<NetInterface> ifs, int nsocks, int threads)
      : ctx_(ctx),
        ifs_(std::move(ifs)),
        nsocks_(nsocks),
        duplex_(settings::get(settings::kSocketDuplex)),
        rng_(std::random_device{}()) {
    helpers_.count = threads;
  }
  double threadCpuSeconds() const override {
    return helpers_.cpuNs->load(std::memory_order_relaxed) * 1e-9;
  }

  const char* name() const override { return "socket"; }
  bool duplex() const override { return duplex_; }
  int devices() const override { return static_cast<int>(ifs_.size()); }

  Status properties(int dev, Properties* p) const override {
    LOOM_TRY(checkDev(dev));
    *p = interfaceProperties(ifs_[dev]);
    return Status::ok();
  }

  Status listen(int dev, Handle* handle, std::unique_ptr<ListenComm>* listenComm) override {
    LOOM_TRY(checkDev(dev));
    SocketAddress addr = ifs_[dev].address;
    addr.setPort(0);
    LOOM_ASSIGN_OR_RETURN(Socket listener, Socket::listen(addr));
    SocketHandle h{};
    h.magic = kHandleMagic;
    LOOM_ASSIGN_OR_RETURN(h.address, listener.localAddress());
    {
      std::lock_guard<std::mutex> lock(rngMutex_);
      h.nonce = rng_();
    }
    h.nsocks = nsocks_;
    h.rank = ctx_.rank;
    h.stage = nullptr;
    *handle = Handle{};
    std::memcpy(handle->data, &h, sizeof(h));
    *listenComm =
        std::make_unique<SocketListen>(ctx_, std::move(listener), h.nonce, nsocks_, helpers_);
    return Status::ok();
  }

  void cancelConnect(Handle* handle) override {
    SocketHandle h;
    std::memcpy(&h, handle->data, sizeof(h));
    if (h.magic != kHandleMagic) return;
    delete h.stage;
    h.stage = nullptr;
    std::memcpy(handle->data, &h, sizeof(h));
  }

  Status connect(int dev, Handle* handle, int peerRank, std::unique_ptr<SendComm>* comm) override {
    *comm = nullptr;
    SocketHandle h;
    std::memcpy(&h, handle->data, sizeof(h));
    if (h.magic != kHandleMagic || h.nsocks < 1 || h.nsocks > kMaxSocks || !h.address.valid()) {
      return errorf(Code::kRemoteError, "net/socket: %s sent a malformed connection handle",
                    peerName(peerRank).c_str());
    }
    if (!h.stage) {
      h.stage = new ConnectStage();
      // The way back (transports/net/connect.cc sets the byte where both ends pair; never
      // with LOOM_SOCKET_DUPLEX=0 here, whatever the peer's setting): its sockets too.
      h.stage->back = duplex_ && handle->data[kPairOfferByte] == 1;
      h.stage->socks.resize(h.stage->back ? 2 * h.nsocks - 1 : h.nsocks);
      h.stage->deadline =
          Clock::now() + std::chrono::milliseconds(settings::get(settings::kTimeoutMs));
      std::memcpy(handle->data, &h, sizeof(h));
    }
    Status st = advance(h, peerRank, comm);
    if (!st || *comm) {
      delete h.stage;
      h.stage = nullptr;
      std::memcpy(handle->data, &h, sizeof(h));
    }
    return st;
  }

 private:
  Status checkDev(int dev) const {
    if (dev < 0 || dev >= devices()) {
      return errorf(Code::kInternalError, "net/socket: no device %d (%d devices)", dev, devices());
    }
    return Status::ok();
  }

  // One more round of non-blocking work on the sender's sockets.
  Status advance(const SocketHandle& h, int peerRank, std::unique_ptr<SendComm>* comm) {
    ConnectStage& stage = *h.stage;
    const std::string what = peerName(peerRank) + " at " + h.address.toString();
    const auto now = Clock::now();
    if (ctx_.abortFlag && ctx_.abortFlag->load()) {
      return errorf(Code::kSystemError, "net/socket: connecting to %s: aborted", what.c_str());
    }
    bool all = true;
    for (size_t i = 0; i < stage.socks.size(); ++i) {
      auto& p = stage.socks[i];
      if (!p.sock.isOpen()) {
        if (now < p.retryAt) {
          all = false;
          continue;
        }
        int fd = ::socket(h.address.u.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) return sysError(errno, "net/socket: socket()");
        p.sock = Socket(fd);
        p.sock.setNoDelay();
        if (::connect(fd, &h.address.u.sa, h.address.length()) != 0 && errno != EINPROGRESS) {
          LOOM_TRY(retryOrFail(p, errno, what, stage, now));
          all = false;
          continue;
        }
      }
      if (!p.connected) {
        pollfd pfd{p.sock.fd(), POLLOUT, 0};
        if (::poll(&pfd, 1, 0) <= 0) {
          all = false;
          if (now > stage.deadline) {
            return errorf(Code::kRemoteError,
                          "net/socket: connecting to %s timed out (LOOM_TIMEOUT_MS)", what.c_str());
          }
          continue;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(p.sock.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          LOOM_TRY(retryOrFail(p, err, what, stage, now));
          all = false;
          continue;
        }
        p.connected = true;
      }
      if (p.sent < sizeof(Hello)) {
        Hello hello{kHelloMagic, ctx_.commHash,      h.nonce, static_cast<int32_t>(i),
                    ctx_.rank,   stage.back ? 1 : 0, 0};
        LOOM_ASSIGN_OR_RETURN(size_t n,
                              p.sock.sendSome(reinterpret_cast<const char*>(&hello) + p.sent,
                                              sizeof(Hello) - p.sent, what.c_str()));
        p.sent += n;
        if (p.sent < sizeof(Hello)) {
          all = false;
          continue;
        }
      }
    }
    if (!all) return Status::ok();
    auto socks = std::make_shared<std::vector<Socket>>();
    for (auto& p : stage.socks) socks->push_back(std::move(p.sock));
    *comm = std::make_unique<SocketSend>(std::move(socks), h.nsocks,
                                         stage.back ? Way::kThere : Way::kOnly, peerRank, helpers_);
    return Status::ok();
  }

  // A refused or unreachable connection is tried again (the listener's backlog may be
  // full for a moment) until the deadline; anything else is an error.
  static Status retryOrFail(ConnectStage::Pending& p, int err, const std::string& what,
                            const ConnectStage& stage, Clock::time_point now) {
    p.sock.close();
    p.connected = false;
    const bool transient = err == ECONNREFUSED || err == ETIMEDOUT || err == EHOSTUNREACH ||
                           err == ENETUNREACH || err == EAGAIN;
    if (!transient || now > stage.deadline) {
      return Status(Code::kRemoteError,
                    sysError(err, "net/socket: connecting to %s", what.c_str()).message());
    }
    p.retryAt = now + std::chrono::milliseconds(10);
    return Status::ok();
  }

  Context ctx_;
  std::vector<NetInterface> ifs_;
  int nsocks_;
  bool duplex_;  // LOOM_SOCKET_DUPLEX
  Helpers helpers_;
  std::mutex rngMutex_;
  std::mt19937_64 rng_;
};

}  // namespace

Result<std::unique_ptr<Backend>> makeSocketBackend(const Context& ctx) {
  LOOM_ASSIGN_OR_RETURN(auto ifs, findInterfacesFromSettings());
  // auto: GPU buffers get kDefaultThreads (the host buffers' tcp transport keeps 1).
  const int64_t threads = static_cast<int64_t>(std::clamp<uint64_t>(
      settings::get(settings::kSocketNthreads).orAuto(kDefaultThreads), 1, kMaxSocks));
  const int64_t perThread = std::max<int64_t>(1, settings::get(settings::kNsocksPerthread));
  const int nsocks = static_cast<int>(std::min<int64_t>(kMaxSocks, threads * perThread));
  // One thread: the proxy's test() moves the bytes; more: the proxy moves socket 0's and
  // a helper per further thread its share of the others.
  const int helpers = threads > 1 ? static_cast<int>(std::min<int64_t>(threads, nsocks) - 1) : 0;
  LOOM_INFO(kNet,
            "net/socket: %zu device(s), first %s (%s); %d socket(s) per connection, %d helper "
            "thread(s) (LOOM_SOCKET_NTHREADS x LOOM_NSOCKS_PERTHREAD)",
            ifs.size(), ifs.front().name.c_str(), ifs.front().address.toString().c_str(), nsocks,
            helpers);
  return std::unique_ptr<Backend>(new SocketBackend(ctx, std::move(ifs), nsocks, helpers));
}

}  // namespace loom::transport::net
