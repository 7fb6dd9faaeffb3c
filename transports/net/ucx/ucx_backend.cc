// `ucx`: the network backend over UCP's tag API (transports/net/ucx/ucx.h).
//
// One UCP context per backend. A connection direction is LOOM_UCX_LANES lanes (lane.h),
// each a UCP worker of its own used by one thread (UCS_THREAD_MODE_SERIALIZED, no lock
// contended): lane 0 is moved by the proxy's calls, the others by a thread each
// (striped.h), so a large message is carried by several cores, as the socket backend's
// helper threads carry theirs. Message i of lane 0 is tag i, and a part on a further lane
// has its message's number as tag: UCX matches them exactly, eager or rendezvous as it
// chooses by size.
//
// Set-up: listen() opens a TCP listening socket and puts its address and a random nonce in
// the handle. The sender connects and says hello (magic, communicator hash, nonce, rank);
// the listener drops (and logs) anyone who says anything else, creates the lanes' workers
// and answers with their UCP addresses (larger than a handle). The sender creates its
// workers and an endpoint per lane, sends the nonce through UCX on each (tag kSetupTag; a
// synchronous send, so that each lane is wired both ways) and flushes them, while the
// listener progresses its workers until every nonce has arrived and the sender has written
// one byte on the socket to say it is flushed. Only then does either end hand out its
// comm: UCX wires an endpoint up lazily, with both workers progressing, and a comm handed
// out half-wired would wait for a peer that only tests its other comms. The TCP socket
// then stays open, idle, as the connection's heartbeat: when it closes or resets (the peer
// exited, was killed, or its host was cut off: keepalive within LOOM_TIMEOUT_MS), whatever
// is still in flight fails with a message naming the peer, instead of waiting on a receive
// UCX would never complete.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <vector>

#include "common/clock.h"
#include "common/handshake.h"
#include "common/log.h"
#include "common/settings.h"
#include "common/socket.h"
#include "transports/net/ucx/closer.h"
#include "transports/net/ucx/lane.h"
#include "transports/net/ucx/striped.h"
#include "transports/net/ucx/sweeper.h"
#include "transports/net/ucx/ucp_calls.h"
#include "transports/net/ucx/ucx.h"

namespace loom::transport::net::ucx {
namespace {

// LOOM_UCX_LANES auto. GPU buffers through the proxy: 2. The executor already spreads a
// large call over up to 4 connections (its lanes), each with lanes of its own here. One H100
// machine (16 cores), 2 processes as hosts, all_reduce of GPU buffers, 2026-12-06 17:24-17:33
// UTC, with the tcp segments UCX 1.16 takes (docs/perf/ucx.md), mean busbw at 16 and 128 MiB:
// 2 lanes (4 runs) 5.33 and 5.97 GB/s, 3 lanes (2 runs) 5.14 and 6.03, 4 lanes (7 runs) 4.20
// and 4.83. Host buffers: 1 (a lane thread each beside the caller's
// own copies; 2 processes over loopback on the 2-core development machine, all_reduce of
// host buffers with 256 KiB tcp segments, three runs, 2026-12-05: 16 MiB 6.9-7.9 ms with 1
// lane, 16.7-19.0 with 2, 25.6-26.8 with 4).
constexpr int kGpuLanes = 2;

constexpr uint64_t kHandleMagic = 0x3178637568c6f6full;  // "loomucx1" (roughly)
// "ucxhell2": since the parts on lanes past 0 took their message's number as tag, a peer
// of the older tagging is refused at connect instead of hanging on its first large part.
constexpr uint64_t kHelloMagic = 0x326c6c6568786375ull;
constexpr uint32_t kMaxReply = 1 << 22;  // the lanes' UCP addresses: a few hundred bytes each
constexpr char kReadyByte = 'R';
constexpr const char* kTcpSegment = "256k";

struct UcxHandle {
  uint64_t magic;
  SocketAddress address;
  uint64_t nonce;
  int32_t rank;  // the listener's
  int32_t pad;
  uint64_t stage;  // the sender's state between connect() calls (0 as sent)
};
static_assert(sizeof(UcxHandle) <= kHandleBytes);

struct Hello {
  uint64_t magic;
  uint64_t commHash;
  uint64_t nonce;
  int32_t rank;
  int32_t pad;
};

std::string peerName(int rank) {
  return rank >= 0 ? "rank " + std::to_string(rank) : "the peer";
}

Status registration(const UcpContext& ctx, MemType type) {
  if (type == MemType::kCuda && !ctx.cuda()) {
    return errorf(Code::kInternalError,
                  "net/ucx: this UCX reports no CUDA memory support (built without CUDA, or "
                  "its CUDA module did not load): device memory must be staged");
  }
  return Status::ok();
}

class UcxSend final : public SendComm {
 public:
  UcxSend(std::unique_ptr<Striped> comm, std::shared_ptr<UcpContext> ctx,
          std::shared_ptr<Closer> closer)
      : comm_(std::move(comm)), ctx_(std::move(ctx)), closer_(std::move(closer)) {}
  // With nothing in flight, flushed and closed on the closer's thread (closer.h) while
  // this rank closes the rest; else here, before the caller frees what it was sending.
  ~UcxSend() override {
    if (comm_->idle()) {
      closer_->close(std::move(comm_));
    } else {
      comm_.reset();
    }
  }
  Result<MemHandle> regMr(void*, size_t, MemType type) override {
    LOOM_TRY(registration(*ctx_, type));
    return MemHandle(nullptr);  // UCX registers (and caches) what it sends itself
  }
  Status deregMr(MemHandle) override { return Status::ok(); }
  Status isend(const void* data, size_t size, int, MemHandle, Request** request) override {
    return comm_->post(const_cast<void*>(data), size, request);
  }
  Status test(Request* r, bool* done, size_t* size) override { return comm_->test(r, done, size); }
  void shutdown() override { comm_->shutdown(); }

 private:
  std::unique_ptr<Striped> comm_;
  std::shared_ptr<UcpContext> ctx_;
  std::shared_ptr<Closer> closer_;
};

class UcxRecv final : public RecvComm {
 public:
  UcxRecv(std::unique_ptr<Striped> comm, std::shared_ptr<UcpContext> ctx)
      : comm_(std::move(comm)), ctx_(std::move(ctx)) {}
  ~UcxRecv() override { comm_.reset(); }
  Result<MemHandle> regMr(void*, size_t, MemType type) override {
    LOOM_TRY(registration(*ctx_, type));
    return MemHandle(nullptr);
  }
  Status deregMr(MemHandle) override { return Status::ok(); }
  Status irecv(int n, void** data, const size_t* sizes, const int*, const MemHandle*,
               Request** request) override {
    if (n != 1) return errorf(Code::kInternalError, "net/ucx: one buffer per receive");
    return comm_->post(data[0], sizes[0], request);
  }
  Status test(Request* r, bool* done, size_t* sizes) override {
    return comm_->test(r, done, sizes);
  }
  void shutdown() override { comm_->shutdown(); }

 private:
  std::unique_ptr<Striped> comm_;
  std::shared_ptr<UcpContext> ctx_;
};

void append(std::vector<char>* out, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  out->insert(out->end(), c, c + n);
}

// The receiver's lanes as the set-up socket carries them: the byte count of what follows,
// the lane count, then each lane's UCP address (its length, then its bytes).
Result<std::vector<char>> laneAddresses(const UcpContext& ctx,
                                        const std::vector<ucp_worker_h>& workers) {
  std::vector<char> out(sizeof(uint32_t));
  const uint32_t count = static_cast<uint32_t>(workers.size());
  append(&out, &count, sizeof(count));
  for (ucp_worker_h w : workers) {
    ucp_address_t* a = nullptr;
    size_t len = 0;
    ucs_status_t s = ctx.calls().workerGetAddress(w, &a, &len);
    if (s != UCS_OK) {
      return errorf(Code::kSystemError, "net/ucx: ucp_worker_get_address: %s",
                    ctx.error(s).c_str());
    }
    const uint32_t n = static_cast<uint32_t>(len);
    append(&out, &n, sizeof(n));
    append(&out, a, len);
    ctx.calls().workerReleaseAddress(w, a);
  }
  const uint32_t total = static_cast<uint32_t>(out.size() - sizeof(uint32_t));
  std::memcpy(out.data(), &total, sizeof(total));
  return out;
}

Result<std::vector<std::vector<char>>> parseAddresses(const std::vector<char>& in,
                                                      const std::string& what) {
  auto bad = [&] {
    return errorf(Code::kRemoteError, "net/ucx: %s sent malformed lane addresses", what.c_str());
  };
  size_t at = 0;
  auto take = [&](void* p, size_t n) {
    if (in.size() - at < n) return false;
    std::memcpy(p, in.data() + at, n);
    at += n;
    return true;
  };
  uint32_t count = 0;
  if (!take(&count, sizeof(count)) || count < 1 || count > static_cast<uint32_t>(kMaxLanes)) {
    return bad();
  }
  std::vector<std::vector<char>> out(count);
  for (auto& a : out) {
    uint32_t n = 0;
    if (!take(&n, sizeof(n)) || n == 0 || in.size() - at < n) return bad();
    a.assign(in.data() + at, in.data() + at + n);
    at += n;
  }
  if (at != in.size()) return bad();
  return out;
}

// Lanes on `workers` (taken): lane 0 holds the heartbeat socket, the others watch it.
std::vector<std::unique_ptr<Lane>> makeLanes(const std::shared_ptr<UcpContext>& ucp,
                                             std::vector<ucp_worker_h>* workers, Socket sock,
                                             int peer, bool sending) {
  std::vector<std::unique_ptr<Lane>> lanes;
  for (size_t k = 0; k < workers->size(); ++k) {
    if (k == 0) {
      lanes.push_back(
          std::make_unique<Lane>(ucp, (*workers)[k], std::move(sock), -1, peer, sending));
    } else {
      lanes.push_back(std::make_unique<Lane>(ucp, (*workers)[k], Socket(), lanes[0]->socketFd(),
                                             peer, sending));
    }
  }
  workers->clear();
  return lanes;
}

Result<std::vector<ucp_worker_h>> newWorkers(const UcpContext& ucp, size_t n) {
  std::vector<ucp_worker_h> out;
  for (size_t k = 0; k < n; ++k) {
    auto w = ucp.newWorker();
    if (!w) {
      for (ucp_worker_h x : out) ucp.calls().workerDestroy(x);
      return w.status();
    }
    out.push_back(*w);
  }
  return out;
}

// Every lane's set-up message has gone (sender: and been flushed) or arrived.
Result<bool> setupDone(std::vector<std::unique_ptr<Lane>>& lanes) {
  bool all = true;
  for (auto& lane : lanes) {
    LOOM_ASSIGN_OR_RETURN(bool done, lane->setupDone());
    all = all && done;
  }
  return all;
}

class UcxListen final : public ListenComm {
 public:
  UcxListen(const Context& ctx, std::shared_ptr<UcpContext> ucp, Socket listener, uint64_t nonce,
            int lanes)
      : ctx_(ctx),
        ucp_(std::move(ucp)),
        listener_(std::move(listener)),
        nonce_(nonce),
        nlanes_(lanes),
        arrivals_(&listener_, sizeof(Hello), ctx.handshakeMs, "net/ucx") {}
  ~UcxListen() override {
    lanes_.clear();
    for (ucp_worker_h w : workers_) ucp_->calls().workerDestroy(w);
  }

  Status accept(std::unique_ptr<RecvComm>* comm) override {
    *comm = nullptr;
    while (!sock_.isOpen() && lanes_.empty()) {
      LOOM_ASSIGN_OR_RETURN(std::optional<Arrival> a, arrivals_.poll());
      if (!a) return Status::ok();
      Hello h;
      std::memcpy(&h, a->hello.data(), sizeof(h));
      const char* why = h.magic != kHelloMagic        ? "it spoke another protocol"
                        : h.commHash != ctx_.commHash ? "it belongs to another communicator"
                        : h.nonce != nonce_           ? "it is meant for another connection"
                                                      : nullptr;
      if (why) {
        arrivals_.drop(*a, why);
        continue;
      }
      peerRank_ = h.rank;
      sock_ = std::move(a->sock);
      LOOM_ASSIGN_OR_RETURN(workers_, newWorkers(*ucp_, nlanes_));
      LOOM_ASSIGN_OR_RETURN(reply_, laneAddresses(*ucp_, workers_));
    }
    const std::string what = peerName(peerRank_);
    while (sent_ < reply_.size()) {
      LOOM_ASSIGN_OR_RETURN(
          size_t n, sock_.sendSome(reply_.data() + sent_, reply_.size() - sent_, what.c_str()));
      if (n == 0) return Status::ok();
      sent_ += n;
      if (sent_ < reply_.size()) continue;
      sock_.setKeepAlive(settings::get(settings::kTimeoutMs));
      lanes_ = makeLanes(ucp_, &workers_, std::move(sock_), peerRank_, /*sending=*/false);
      for (auto& lane : lanes_) LOOM_TRY(lane->startSetup(nonce_));
    }
    Socket& sock = lanes_[0]->socket();
    if (!ready_) {
      LOOM_ASSIGN_OR_RETURN(bool arrived, setupDone(lanes_));
      if (!arrived) {
        // The sender writes nothing on the socket before it: a read that ends it has gone.
        char byte;
        LOOM_ASSIGN_OR_RETURN(size_t n, sock.recvSome(&byte, 1, what.c_str()));
        if (n > 0) {
          return errorf(Code::kRemoteError, "net/ucx: %s broke the set-up protocol", what.c_str());
        }
        return Status::ok();
      }
      ready_ = true;
    }
    // The sender's flushes need these workers' progress until it says they are done.
    for (auto& lane : lanes_) lane->progress();
    char byte = 0;
    LOOM_ASSIGN_OR_RETURN(size_t n, sock.recvSome(&byte, 1, what.c_str()));
    if (n == 0) return Status::ok();
    if (byte != kReadyByte) {
      return errorf(Code::kRemoteError, "net/ucx: %s broke the set-up protocol", what.c_str());
    }
    *comm = std::make_unique<UcxRecv>(
        std::make_unique<Striped>(std::move(lanes_), /*sending=*/false, ucp_), ucp_);
    return Status::ok();
  }

 private:
  Context ctx_;
  std::shared_ptr<UcpContext> ucp_;
  Socket listener_;
  uint64_t nonce_;
  size_t nlanes_;
  Arrivals arrivals_;
  Socket sock_;  // the sender's, once it said hello
  int peerRank_ = -1;
  std::vector<ucp_worker_h> workers_;  // until they are lanes
  std::vector<char> reply_;            // their addresses
  size_t sent_ = 0;
  std::vector<std::unique_ptr<Lane>> lanes_;  // once the addresses have gone
  bool ready_ = false;                        // every set-up message has arrived
};

// The sender between connect() calls.
struct ConnectStage {
  Socket sock;
  bool connected = false;
  size_t sent = 0;  // bytes of the hello
  uint32_t length = 0;
  size_t got = 0;  // bytes of the length and then of the lanes' addresses
  std::vector<char> reply;
  std::vector<std::unique_ptr<Lane>> lanes;  // once the addresses have arrived
  Clock::time_point deadline;
};

class UcxBackend final : public Backend {
 public:
  UcxBackend(const Context& ctx, std::shared_ptr<UcpContext> ucp, std::vector<NetInterface> ifs)
      : ctx_(ctx), ucp_(std::move(ucp)), ifs_(std::move(ifs)), rng_(seed()) {}

  const char* name() const override { return "ucx"; }
  // The lane threads of the connections closed so far, and the sweeper's. Waits for the
  // send connections the closer still holds (closer.h: up to 1 s a lane), whose threads
  // count once they end.
  double threadCpuSeconds() const override {
    closer_->drain();
    return (ucp_->threadCpuNs() + sweeper_->cpuNs()) * 1e-9;
  }
  int devices() const override { return static_cast<int>(ifs_.size()); }

  Status properties(int dev, Properties* p) const override {
    LOOM_TRY(checkDev(dev));
    *p = interfaceProperties(ifs_[dev]);
    if (ucp_->cuda()) p->ptrSupport |= kPtrCuda;
    return Status::ok();
  }

  Status listen(int dev, Handle* handle, std::unique_ptr<ListenComm>* listenComm) override {
    LOOM_TRY(checkDev(dev));
    SocketAddress addr = ifs_[dev].address;
    addr.setPort(0);
    LOOM_ASSIGN_OR_RETURN(Socket listener, Socket::listen(addr));
    UcxHandle h{};
    h.magic = kHandleMagic;
    LOOM_ASSIGN_OR_RETURN(h.address, listener.localAddress());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      h.nonce = rng_();
    }
    h.rank = ctx_.rank;
    *handle = Handle{};
    std::memcpy(handle->data, &h, sizeof(h));
    const int lanes = static_cast<int>(std::clamp<uint64_t>(
        settings::get(settings::kUcxLanes).orAuto(ctx_.hostBuffers ? 1 : kGpuLanes), 1, kMaxLanes));
    *listenComm = std::make_unique<UcxListen>(ctx_, ucp_, std::move(listener), h.nonce, lanes);
    return Status::ok();
  }

  void cancelConnect(Handle* handle) override {
    UcxHandle h;
    std::memcpy(&h, handle->data, sizeof(h));
    if (h.magic != kHandleMagic) return;
    dropStage(h.stage);
    h.stage = 0;
    std::memcpy(handle->data, &h, sizeof(h));
  }

  Status connect(int dev, Handle* handle, int peerRank, std::unique_ptr<SendComm>* comm) override {
    *comm = nullptr;
    LOOM_TRY(checkDev(dev));
    UcxHandle h;
    std::memcpy(&h, handle->data, sizeof(h));
    if (h.magic != kHandleMagic || !h.address.valid()) {
      return errorf(Code::kRemoteError, "net/ucx: %s sent a malformed connection handle",
                    peerName(peerRank).c_str());
    }
    ConnectStage* stage = findStage(h.stage);
    if (!stage) {  // as the peer sent it (whatever the field holds)
      auto s = std::make_unique<ConnectStage>();
      s->deadline = Clock::now() + std::chrono::milliseconds(settings::get(settings::kTimeoutMs));
      stage = s.get();
      std::lock_guard<std::mutex> lock(mutex_);
      h.stage = ++lastStage_;
      stages_.emplace_back(h.stage, std::move(s));
      std::memcpy(handle->data, &h, sizeof(h));
    }
    Status st = advance(h, *stage, peerRank, comm);
    if (!st || *comm) {
      dropStage(h.stage);
      h.stage = 0;
      std::memcpy(handle->data, &h, sizeof(h));
    }
    return st;
  }

 private:
  // Nonces tell this backend's listeners apart from strangers': 256 bits of seed.
  static std::mt19937_64 seed() {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }
  ConnectStage* findStage(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [i, s] : stages_)
      if (i == id && id != 0) return s.get();
    return nullptr;
  }
  void dropStage(uint64_t id) {
    std::unique_ptr<ConnectStage> gone;
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = stages_.begin(); it != stages_.end(); ++it) {
      if (it->first == id) {
        gone = std::move(it->second);
        stages_.erase(it);
        return;
      }
    }
  }
  Status checkDev(int dev) const {
    if (dev < 0 || dev >= devices()) {
      return errorf(Code::kInternalError, "net/ucx: no device %d (%d devices)", dev, devices());
    }
    return Status::ok();
  }

  Status advance(const UcxHandle& h, ConnectStage& s, int peerRank,
                 std::unique_ptr<SendComm>* comm) {
    const std::string what = peerName(peerRank) + " at " + h.address.toString();
    const auto now = Clock::now();
    if (ctx_.abortFlag && ctx_.abortFlag->load()) {
      return errorf(Code::kSystemError, "net/ucx: connecting to %s: aborted", what.c_str());
    }
    if (now > s.deadline) {
      return errorf(Code::kRemoteError, "net/ucx: connecting to %s timed out (LOOM_TIMEOUT_MS)",
                    what.c_str());
    }
    if (s.lanes.empty() && !s.sock.isOpen()) {
      int fd = ::socket(h.address.u.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) return sysError(errno, "net/ucx: socket()");
      s.sock = Socket(fd);
      s.sock.setNoDelay();
      if (::connect(fd, &h.address.u.sa, h.address.length()) != 0 && errno != EINPROGRESS) {
        return refused(errno, what);
      }
    }
    if (!s.connected) {
      pollfd pfd{s.sock.fd(), POLLOUT, 0};
      if (::poll(&pfd, 1, 0) <= 0) return Status::ok();
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(s.sock.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return refused(err, what);
      s.connected = true;
    }
    if (s.sent < sizeof(Hello)) {
      Hello hello{kHelloMagic, ctx_.commHash, h.nonce, ctx_.rank, 0};
      LOOM_ASSIGN_OR_RETURN(size_t n,
                            s.sock.sendSome(reinterpret_cast<const char*>(&hello) + s.sent,
                                            sizeof(Hello) - s.sent, what.c_str()));
      s.sent += n;
      if (s.sent < sizeof(Hello)) return Status::ok();
    }
    while (s.got < sizeof(uint32_t)) {
      LOOM_ASSIGN_OR_RETURN(size_t n, s.sock.recvSome(reinterpret_cast<char*>(&s.length) + s.got,
                                                      sizeof(uint32_t) - s.got, what.c_str()));
      if (n == 0) return Status::ok();
      s.got += n;
      if (s.got == sizeof(uint32_t)) {
        if (s.length == 0 || s.length > kMaxReply) {
          return errorf(Code::kRemoteError, "net/ucx: %s sent %u bytes of lane addresses",
                        what.c_str(), s.length);
        }
        s.reply.resize(s.length);
      }
    }
    while (s.got < sizeof(uint32_t) + s.length) {
      const size_t at = s.got - sizeof(uint32_t);
      LOOM_ASSIGN_OR_RETURN(size_t n,
                            s.sock.recvSome(s.reply.data() + at, s.length - at, what.c_str()));
      if (n == 0) return Status::ok();
      s.got += n;
    }
    if (s.lanes.empty()) {
      LOOM_ASSIGN_OR_RETURN(auto addresses, parseAddresses(s.reply, what));
      LOOM_ASSIGN_OR_RETURN(auto workers, newWorkers(*ucp_, addresses.size()));
      s.sock.setKeepAlive(settings::get(settings::kTimeoutMs));
      s.lanes = makeLanes(ucp_, &workers, std::move(s.sock), peerRank, /*sending=*/true);
      for (size_t k = 0; k < s.lanes.size(); ++k) {
        LOOM_TRY(s.lanes[k]->connectTo(addresses[k]));
        LOOM_TRY(s.lanes[k]->startSetup(h.nonce));
      }
    }
    LOOM_ASSIGN_OR_RETURN(bool flushed, setupDone(s.lanes));
    if (!flushed) return Status::ok();
    LOOM_ASSIGN_OR_RETURN(size_t n, s.lanes[0]->socket().sendSome(&kReadyByte, 1, what.c_str()));
    if (n == 0) return Status::ok();
    *comm = std::make_unique<UcxSend>(
        std::make_unique<Striped>(std::move(s.lanes), /*sending=*/true, ucp_, sweeper_), ucp_,
        closer_);
    return Status::ok();
  }

  // The listener was open before its handle was sent: a refusal means it is gone.
  static Status refused(int err, const std::string& what) {
    if (err == ECONNREFUSED) {
      return errorf(Code::kRemoteError,
                    "net/ucx: connecting to %s: refused (nothing listens there any more: did "
                    "that rank exit or abort?)",
                    what.c_str());
    }
    return Status(Code::kRemoteError,
                  sysError(err, "net/ucx: connecting to %s", what.c_str()).message());
  }

  Context ctx_;
  std::shared_ptr<UcpContext> ucp_;
  // Shared with the send comms, which may outlive the backend.
  std::shared_ptr<Closer> closer_ = std::make_shared<Closer>();
  std::shared_ptr<Sweeper> sweeper_ = std::make_shared<Sweeper>();
  std::vector<NetInterface> ifs_;
  std::mutex mutex_;  // rng_, stages_, lastStage_
  std::mt19937_64 rng_;
  std::vector<std::pair<uint64_t, std::unique_ptr<ConnectStage>>> stages_;
  uint64_t lastStage_ = 0;
};

struct Opened {
  std::shared_ptr<UcpContext> context;
  std::string description;
};

Result<Opened> open() {
  LOOM_ASSIGN_OR_RETURN(const UcpCalls* u, loadUcp());
  unsigned major = 0, minor = 0, release = 0;
  u->getVersion(&major, &minor, &release);
  ucp_config_t* config = nullptr;
  ucs_status_t s = u->configRead(nullptr, nullptr, &config);
  if (s != UCS_OK) {
    return errorf(Code::kInvalidUsage, "net/ucx: reading UCX's settings (UCX_*): %s",
                  u->statusString(s));
  }
  // UCX's tcp transport moves 8 KiB (send) and 64 KiB (receive) per system call by
  // default. One H100 machine (16 cores), 1 MiB steps through a proxy over 4 lanes
  // (bench/net_step_probe), UCX 1.16.0, 2026-12-06: 3.4-4.2 GB/s with UCX's sizes, 8.0-8.6
  // with 256 KiB, the socket backend 7.8-9.7 (docs/perf/ucx.md). The user's UCX_TCP_*
  // variables win (one in UCX's configuration file does not). ucp_config_modify keeps a name
  // it does not know as a UCP setting and hands it to each transport's table; up to UCX 1.16
  // those tables match the name without the transport's prefix ("TX_SEG_SIZE"), from 1.17
  // with it ("TCP_TX_SEG_SIZE"). A name no table takes is dropped with a warning ("invalid
  // configurations") on every worker. Only the tcp transport has these two names.
  const bool prefixed = major > 1 || (major == 1 && minor >= 17);
  for (const char* name : {"TX_SEG_SIZE", "RX_SEG_SIZE"}) {
    const std::string full = std::string("TCP_") + name;
    if (std::getenv(("UCX_" + full).c_str())) continue;
    ucs_status_t m = u->configModify(config, prefixed ? full.c_str() : name, kTcpSegment);
    if (m != UCS_OK) {
      LOOM_INFO(kNet, "net/ucx: UCX_%s=%s not applied: %s", full.c_str(), kTcpSegment,
                u->statusString(m));
    }
  }
  // A UCX built with CUDA, with cuda_copy in UCX_TLS, probes on each context's first
  // ucp_ep_create which memory its rendezvous fragments may live in (UCX_RNDV_FRAG_MEM_TYPES,
  // host and cuda by default): it allocates and frees 1 byte of GPU memory, and cuMemFree
  // waits for the GPU to go idle. loom's proxy connects while its network kernels already
  // run and wait for that very connection, so the connect stalled until LOOM_TIMEOUT_MS
  // (processes as hosts on an H100, UCX 1.19.1, 2026-12-06; the fragments in host memory
  // need no probe). The user's UCX_RNDV_FRAG_MEM_TYPES wins (from the environment; one in
  // UCX's configuration file is overridden). The setting came with UCX 1.18; before, its
  // one fragment type (UCX_RNDV_FRAG_MEM_TYPE) defaults to host.
  const bool fragTypes = major > 1 || (major == 1 && minor >= 18);
  if (fragTypes && !std::getenv("UCX_RNDV_FRAG_MEM_TYPES")) {
    if (ucs_status_t m = u->configModify(config, "RNDV_FRAG_MEM_TYPES", "host"); m != UCS_OK) {
      LOOM_INFO(kNet,
                "net/ucx: UCX_RNDV_FRAG_MEM_TYPES=host not applied: %s (with cuda_copy in "
                "UCX_TLS, connections may stall while GPU kernels run)",
                u->statusString(m));
    }
  }
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  p.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;  // lanes' threads sleep on the worker
  p.mt_workers_shared = 1;                            // the comms' workers run on several threads
  ucp_context_h h = nullptr;
  s = u->initVersion(UCP_API_MAJOR, UCP_API_MINOR, &p, config, &h);
  u->configRelease(config);
  if (s != UCS_OK) {
    return errorf(Code::kSystemError,
                  "net/ucx: ucp_init (UCX %u.%u.%u): %s (UCX_TLS, "
                  "UCX_NET_DEVICES?)",
                  major, minor, release, u->statusString(s));
  }
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  const bool queried = u->contextQuery(h, &attr) == UCS_OK;
  const bool cuda = queried && (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  Opened out;
  out.context = std::make_shared<UcpContext>(u, h, cuda);
  char text[256];
  std::snprintf(text, sizeof(text), "UCX %u.%u.%u, %s", major, minor, release,
                cuda ? "host and CUDA memory (built with CUDA)"
                     : "host memory only (no CUDA memory support: UCX built without CUDA, or "
                       "its CUDA module did not load; device buffers are staged)");
  out.description = text;
  return out;
}

}  // namespace

Result<std::unique_ptr<Backend>> makeUcxBackend(const Context& ctx) {
  LOOM_ASSIGN_OR_RETURN(Opened o, open());
  LOOM_ASSIGN_OR_RETURN(auto ifs, findInterfacesFromSettings());
  LOOM_INFO(kNet, "net/ucx: %s; %zu device(s), first %s (%s) for the set-up and heartbeat",
            o.description.c_str(), ifs.size(), ifs.front().name.c_str(),
            ifs.front().address.toString().c_str());
  return std::unique_ptr<Backend>(new UcxBackend(ctx, std::move(o.context), std::move(ifs)));
}

}  // namespace loom::transport::net::ucx
