// `ucx`: the network backend over UCP's tag API (transports/net/ucx/ucx.h).
//
// One UCP context per backend; one UCP worker per connection direction (a comm is used by
// one thread at a time, so each worker runs in UCS_THREAD_MODE_SERIALIZED and no two
// comms contend for a lock). Message i of a connection is sent and received with tag i:
// UCX matches them exactly, eager or rendezvous as it chooses by size, and a receive
// larger than its send is fine.
//
// Set-up: listen() opens a TCP listening socket and puts its address and a random nonce
// in the handle. The sender connects and says hello (magic, communicator hash, nonce,
// rank); the listener drops (and logs) anyone who says anything else, creates the
// receiving worker and answers with its UCP address (length, then bytes: UCP addresses
// are larger than a handle). The sender creates its worker and an endpoint to that
// address, sends the nonce through UCX (tag kSetupTag) and flushes the endpoint, while
// the listener progresses its worker until the nonce has arrived and the sender has
// written one byte on the socket to say it is flushed. Only then does either end hand out
// its comm: UCX wires an endpoint up lazily, with both workers progressing, and a comm
// handed out half-wired would wait for a peer that only tests its other comms. The TCP
// socket then stays open, idle, as the connection's heartbeat: when it
// closes or resets (the peer exited, was killed, or its host was cut off: keepalive within
// LOOM_TIMEOUT_MS), whatever is still in flight fails with a message naming the peer,
// instead of waiting on a receive UCX would never complete.
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <fstream>
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
#include "transports/net/ucx/ucp_calls.h"
#include "transports/net/ucx/ucx.h"

namespace loom::transport::net::ucx {
namespace {

constexpr uint64_t kHandleMagic = 0x3178637568c6f6full;  // "loomucx1" (roughly)
constexpr uint64_t kHelloMagic = 0x6f6c6c6568786375ull;  // "ucxhello"
constexpr uint32_t kMaxAddress = 1 << 20;            // a UCP worker address is a few hundred bytes
constexpr ucp_tag_t kSetupTag = ucp_tag_t{1} << 63;  // messages use their sequence number
constexpr char kReadyByte = 'R';
// After the heartbeat socket closes, how long what the peer sent before may still arrive
// (a sender closes only after UCX has flushed its endpoint).
constexpr auto kCloseGrace = std::chrono::milliseconds(200);
constexpr auto kHeartbeatEvery = std::chrono::milliseconds(1);
// How long a closing comm waits for UCX to finish what it still holds.
constexpr auto kCloseWait = std::chrono::milliseconds(1000);

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

// A message in flight; the comms hand out its address as the opaque net::Request.
struct UcxRequest {
  void* ucx = nullptr;           // UCX's request; null once done, or when it completed at once
  ucs_status_t status = UCS_OK;  // how it ended (when ucx is null)
  ucp_tag_recv_info_t info{};    // a receive: what arrived (from ucp_tag_recv_request_test)
  size_t size = 0;               // a send: its bytes
  size_t capacity = 0;           // a receive: the buffer's size
  uint64_t seq = 0;
  bool recv = false;
};

std::string peerName(int rank) {
  return rank >= 0 ? "rank " + std::to_string(rank) : "the peer";
}

// The UCP context, shared by the backend and every comm it made (a comm may outlive it).
class UcpContext {
 public:
  UcpContext(const UcpCalls* u, ucp_context_h h, bool cuda) : u_(u), h_(h), cuda_(cuda) {}
  ~UcpContext() { u_->cleanup(h_); }
  const UcpCalls& calls() const { return *u_; }
  ucp_context_h get() const { return h_; }
  bool cuda() const { return cuda_; }
  std::string error(ucs_status_t s) const { return u_->statusString(s); }

  Result<ucp_worker_h> newWorker() const {
    ucp_worker_params_t p{};
    p.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    p.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucp_worker_h w = nullptr;
    ucs_status_t s = u_->workerCreate(h_, &p, &w);
    if (s != UCS_OK) {
      return errorf(Code::kSystemError, "net/ucx: ucp_worker_create: %s", error(s).c_str());
    }
    return w;
  }

 private:
  const UcpCalls* u_;
  ucp_context_h h_;
  bool cuda_;
};

Status registration(const UcpContext& ctx, MemType type) {
  if (type == MemType::kCuda && !ctx.cuda()) {
    return errorf(Code::kInternalError,
                  "net/ucx: this UCX was built without CUDA: device memory must be staged");
  }
  return Status::ok();
}

// One direction of one connection: its worker (and, sending, its endpoint), the requests
// posted on it, and the heartbeat socket.
class Endpoint {
 public:
  Endpoint(std::shared_ptr<UcpContext> ctx, ucp_worker_h worker, Socket heartbeat, int peer,
           bool sending)
      : ctx_(std::move(ctx)),
        u_(ctx_->calls()),
        worker_(worker),
        heartbeat_(std::move(heartbeat)),
        what_(peerName(peer)),
        sending_(sending) {}
  ~Endpoint() { close(); }

  // The endpoint to the receiver's worker (a sender's).
  Status connectTo(const std::vector<char>& address) {
    ucp_ep_params_t p{};
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.address = reinterpret_cast<const ucp_address_t*>(address.data());
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;  // a peer that fails fails our sends, not hangs
    p.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t status) {
      static_cast<Endpoint*>(arg)->epError_ = status;
    };
    p.err_handler.arg = this;
    ucs_status_t s = u_.epCreate(worker_, &p, &ep_);
    if (s != UCS_OK) {
      ep_ = nullptr;
      return errorf(Code::kRemoteError, "net/ucx: ucp_ep_create to %s: %s", what_.c_str(),
                    ctx_->error(s).c_str());
    }
    return Status::ok();
  }

  // The set-up message through UCX: the sender sends the nonce, the receiver posts its
  // receive; setupDone() says when it has gone (sender) or arrived with the right nonce.
  Status startSetup(uint64_t nonce) {
    setupNonce_ = nonce;
    ucp_request_param_t p{};
    ucs_status_ptr_t sp;
    if (sending_) {
      setupBuf_ = nonce;
      sp = u_.tagSendNbx(ep_, &setupBuf_, sizeof(setupBuf_), kSetupTag, &p);
    } else {
      p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // as irecv: the size must be known
      sp = u_.tagRecvNbx(worker_, &setupBuf_, sizeof(setupBuf_), kSetupTag, ~ucp_tag_t{0}, &p);
    }
    if (UCS_PTR_IS_PTR(sp)) {
      setupReq_ = sp;
      setupStatus_ = UCS_INPROGRESS;
    } else {
      setupStatus_ = UCS_PTR_STATUS(sp);
    }
    return Status::ok();
  }
  Result<bool> setupDone() {
    u_.workerProgress(worker_);
    if (setupReq_) {
      setupStatus_ = sending_ ? u_.requestCheckStatus(setupReq_)
                              : u_.tagRecvRequestTest(setupReq_, &setupInfo_);
      if (setupStatus_ == UCS_INPROGRESS) return false;
      u_.requestFree(setupReq_);
      setupReq_ = nullptr;
    }
    if (setupStatus_ != UCS_OK) return peerFailed(setupStatus_);
    if (sending_ && !setupFlushed_) {
      // And flushed while the receiver still progresses its worker for the set-up: the
      // endpoint is then wired up in both directions, and the flush when it closes needs
      // nothing more of the peer.
      setupFlushed_ = true;
      ucp_request_param_t p{};
      ucs_status_ptr_t sp = u_.epFlushNbx(ep_, &p);
      if (UCS_PTR_IS_PTR(sp)) {
        setupReq_ = sp;
        return false;
      }
      setupStatus_ = UCS_PTR_STATUS(sp);
      if (setupStatus_ != UCS_OK) return peerFailed(setupStatus_);
    }
    if (!sending_ && (setupInfo_.length != sizeof(setupBuf_) || setupBuf_ != setupNonce_)) {
      return errorf(Code::kRemoteError, "net/ucx: %s sent a wrong set-up message", what_.c_str());
    }
    return true;
  }
  Socket& socket() { return heartbeat_; }
  void progress() { u_.workerProgress(worker_); }

  Status isend(const void* data, size_t size, Request** request) {
    *request = nullptr;
    LOOM_TRY(usable());
    UcxRequest* r = slot();
    if (!r) return Status::ok();
    ucp_request_param_t p{};
    ucs_status_ptr_t sp = u_.tagSendNbx(ep_, data, size, r->seq, &p);
    r->size = size;
    finishPost(r, sp);
    *request = reinterpret_cast<Request*>(r);
    return Status::ok();
  }

  Status irecv(void* data, size_t capacity, Request** request) {
    *request = nullptr;
    LOOM_TRY(usable());
    UcxRequest* r = slot();
    if (!r) return Status::ok();
    r->recv = true;
    r->capacity = capacity;
    // Always a request: UCX 1.13 leaves recv_info unset when a receive completes at once
    // from its unexpected queue (its size would be lost).
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    ucs_status_ptr_t sp = u_.tagRecvNbx(worker_, data, capacity, r->seq, ~ucp_tag_t{0}, &p);
    finishPost(r, sp);
    *request = reinterpret_cast<Request*>(r);
    return Status::ok();
  }

  Status test(Request* request, bool* done, size_t* size) {
    auto* r = reinterpret_cast<UcxRequest*>(request);
    *done = false;
    if (r->seq != freed_ || freed_ >= posted_) {
      return errorf(Code::kInternalError, "net/ucx: requests to %s tested out of order",
                    what_.c_str());
    }
    if (r->ucx) {
      u_.workerProgress(worker_);
      ucs_status_t s =
          r->recv ? u_.tagRecvRequestTest(r->ucx, &r->info) : u_.requestCheckStatus(r->ucx);
      if (s == UCS_INPROGRESS) {
        if (epError_ != UCS_OK) return peerFailed(epError_);
        return heartbeat();
      }
      u_.requestFree(r->ucx);
      r->ucx = nullptr;
      r->status = s;
    }
    if (r->status == UCS_ERR_MESSAGE_TRUNCATED) {
      return errorf(Code::kInvalidUsage,
                    "net/ucx: %s sent a message larger than the %zu-byte receive (the ranks "
                    "disagree on the operation, or on LOOM_BUFFSIZE)",
                    what_.c_str(), r->capacity);
    }
    if (r->status != UCS_OK) return peerFailed(r->status);
    *done = true;
    *size = r->recv ? r->info.length : r->size;
    ++freed_;
    return Status::ok();
  }

  void shutdown() {
    shut_ = true;
    heartbeat_.shutdown();
  }

 private:
  UcxRequest* slot() {
    if (posted_ - freed_ >= static_cast<uint64_t>(kMaxRequests)) return nullptr;
    UcxRequest& r = requests_[posted_ % kMaxRequests];
    r = UcxRequest{};
    r.seq = posted_;
    return &r;
  }
  void finishPost(UcxRequest* r, ucs_status_ptr_t sp) {
    if (UCS_PTR_IS_PTR(sp)) {
      r->ucx = sp;
    } else {
      r->status = UCS_PTR_STATUS(sp);  // done at once, or failed at once
    }
    ++posted_;
  }
  Status usable() const {
    if (shut_)
      return errorf(Code::kSystemError, "net/ucx: the connection to %s was shut down",
                    what_.c_str());
    if (epError_ != UCS_OK) return const_cast<Endpoint*>(this)->peerFailed(epError_);
    return Status::ok();
  }
  Status peerFailed(ucs_status_t s) {
    return errorf(Code::kRemoteError,
                  "net/ucx: %s %s failed: %s (the peer exited or cannot "
                  "be reached)",
                  sending_ ? "sending to" : "receiving from", what_.c_str(),
                  ctx_->error(s).c_str());
  }
  // Once a millisecond while a request waits: has the peer gone?
  Status heartbeat() {
    if (shut_)
      return errorf(Code::kSystemError, "net/ucx: the connection to %s was shut down",
                    what_.c_str());
    const auto now = Clock::now();
    if (now - lastBeat_ < kHeartbeatEvery) return Status::ok();
    lastBeat_ = now;
    if (closedAt_) {
      if (now - *closedAt_ < kCloseGrace) return Status::ok();
      return errorf(Code::kRemoteError, "net/ucx: %s with a message still in flight",
                    closedWhy_.c_str());
    }
    char byte;
    ssize_t n = ::recv(heartbeat_.fd(), &byte, 1, MSG_DONTWAIT);
    if (n > 0) {
      closedAt_ = now;  // the peer never writes here after the set-up
      closedWhy_ = what_ + " broke the protocol (bytes on the heartbeat socket)";
    } else if (n == 0) {
      closedAt_ = now;
      closedWhy_ = what_ + " closed the connection";
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      closedAt_ = now;
      closedWhy_ = sysError(errno, "the connection to %s broke", what_.c_str()).message();
    }
    return Status::ok();
  }
  void close() {
    const auto until = Clock::now() + kCloseWait;
    if (setupReq_) {
      if (!sending_) u_.requestCancel(worker_, setupReq_);
      while (u_.requestCheckStatus(setupReq_) == UCS_INPROGRESS && Clock::now() < until &&
             epError_ == UCS_OK && !shut_) {
        u_.workerProgress(worker_);
      }
      u_.requestFree(setupReq_);
      setupReq_ = nullptr;
    }
    // Receives are cancelled; sends run out (the caller's buffers stay valid until then).
    for (uint64_t s = freed_; s < posted_; ++s) {
      UcxRequest& r = requests_[s % kMaxRequests];
      if (r.ucx && r.recv) u_.requestCancel(worker_, r.ucx);
    }
    for (uint64_t s = freed_; s < posted_; ++s) {
      UcxRequest& r = requests_[s % kMaxRequests];
      while (r.ucx && u_.requestCheckStatus(r.ucx) == UCS_INPROGRESS && Clock::now() < until &&
             epError_ == UCS_OK && !shut_) {
        u_.workerProgress(worker_);
      }
      if (r.ucx) u_.requestFree(r.ucx);  // freed when UCX is done with it
      r.ucx = nullptr;
    }
    if (ep_) {
      // Flushed (what was sent has reached the peer), then closed without UCX's disconnect
      // handshake, which would wait for a peer that is closing its own comms. The flush
      // ends early when the peer has closed its end (it has read all it wanted), and is
      // skipped when the peer failed or this end was shut down.
      ucp_request_param_t p{};
      if (!shut_ && epError_ == UCS_OK) wait(u_.epFlushNbx(ep_, &p), until, /*untilPeerGone=*/true);
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      wait(u_.epCloseNbx(ep_, &p), until);
      ep_ = nullptr;
    }
    u_.workerDestroy(worker_);
    worker_ = nullptr;
    heartbeat_.close();
  }

  // Progresses until the operation `sp` is done or `until` (or the peer has closed the
  // heartbeat socket), then frees it.
  void wait(ucs_status_ptr_t sp, Clock::time_point until, bool untilPeerGone = false) {
    if (!UCS_PTR_IS_PTR(sp)) return;
    auto look = Clock::now();
    while (u_.requestCheckStatus(sp) == UCS_INPROGRESS) {
      const auto now = Clock::now();
      if (now >= until) break;
      if (untilPeerGone && now >= look) {
        look = now + kHeartbeatEvery;
        char byte;
        const ssize_t n = ::recv(heartbeat_.fd(), &byte, 1, MSG_DONTWAIT | MSG_PEEK);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
      }
      u_.workerProgress(worker_);
    }
    u_.requestFree(sp);
  }

  std::shared_ptr<UcpContext> ctx_;
  const UcpCalls& u_;
  ucp_worker_h worker_;
  ucp_ep_h ep_ = nullptr;
  Socket heartbeat_;
  const std::string what_;
  const bool sending_;
  UcxRequest requests_[kMaxRequests];
  uint64_t posted_ = 0;
  uint64_t freed_ = 0;
  ucs_status_t epError_ = UCS_OK;  // set by UCX's error callback, in workerProgress
  void* setupReq_ = nullptr;
  bool setupFlushed_ = false;
  ucs_status_t setupStatus_ = UCS_OK;
  uint64_t setupBuf_ = 0;
  uint64_t setupNonce_ = 0;
  ucp_tag_recv_info_t setupInfo_{};
  bool shut_ = false;
  Clock::time_point lastBeat_{};
  std::optional<Clock::time_point> closedAt_;
  std::string closedWhy_;
};

class UcxSend final : public SendComm {
 public:
  explicit UcxSend(std::unique_ptr<Endpoint> ep, std::shared_ptr<UcpContext> ctx)
      : ep_(std::move(ep)), ctx_(std::move(ctx)) {}
  ~UcxSend() override { ep_.reset(); }
  Result<MemHandle> regMr(void*, size_t, MemType type) override {
    LOOM_TRY(registration(*ctx_, type));
    return MemHandle(nullptr);  // UCX registers (and caches) what it sends itself
  }
  Status deregMr(MemHandle) override { return Status::ok(); }
  Status isend(const void* data, size_t size, int, MemHandle, Request** request) override {
    return ep_->isend(data, size, request);
  }
  Status test(Request* r, bool* done, size_t* size) override { return ep_->test(r, done, size); }
  void shutdown() override { ep_->shutdown(); }

 private:
  std::unique_ptr<Endpoint> ep_;
  std::shared_ptr<UcpContext> ctx_;
};

class UcxRecv final : public RecvComm {
 public:
  explicit UcxRecv(std::unique_ptr<Endpoint> ep, std::shared_ptr<UcpContext> ctx)
      : ep_(std::move(ep)), ctx_(std::move(ctx)) {}
  ~UcxRecv() override { ep_.reset(); }
  Result<MemHandle> regMr(void*, size_t, MemType type) override {
    LOOM_TRY(registration(*ctx_, type));
    return MemHandle(nullptr);
  }
  Status deregMr(MemHandle) override { return Status::ok(); }
  Status irecv(int n, void** data, const size_t* sizes, const int*, const MemHandle*,
               Request** request) override {
    if (n != 1) return errorf(Code::kInternalError, "net/ucx: one buffer per receive");
    return ep_->irecv(data[0], sizes[0], request);
  }
  Status test(Request* r, bool* done, size_t* sizes) override { return ep_->test(r, done, sizes); }
  void shutdown() override { ep_->shutdown(); }

 private:
  std::unique_ptr<Endpoint> ep_;
  std::shared_ptr<UcpContext> ctx_;
};

// The receiver's worker address, as the set-up socket carries it: length, then bytes.
Result<std::vector<char>> workerAddress(const UcpContext& ctx, ucp_worker_h w) {
  ucp_address_t* a = nullptr;
  size_t len = 0;
  ucs_status_t s = ctx.calls().workerGetAddress(w, &a, &len);
  if (s != UCS_OK) {
    return errorf(Code::kSystemError, "net/ucx: ucp_worker_get_address: %s", ctx.error(s).c_str());
  }
  std::vector<char> out(sizeof(uint32_t) + len);
  const uint32_t n = static_cast<uint32_t>(len);
  std::memcpy(out.data(), &n, sizeof(n));
  std::memcpy(out.data() + sizeof(n), a, len);
  ctx.calls().workerReleaseAddress(w, a);
  return out;
}

class UcxListen final : public ListenComm {
 public:
  UcxListen(const Context& ctx, std::shared_ptr<UcpContext> ucp, Socket listener, uint64_t nonce)
      : ctx_(ctx),
        ucp_(std::move(ucp)),
        listener_(std::move(listener)),
        nonce_(nonce),
        arrivals_(&listener_, sizeof(Hello), ctx.handshakeMs, "net/ucx") {}
  ~UcxListen() override {
    if (worker_) ucp_->calls().workerDestroy(worker_);
  }

  Status accept(std::unique_ptr<RecvComm>* comm) override {
    *comm = nullptr;
    while (!sock_.isOpen() && !ep_) {
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
      LOOM_ASSIGN_OR_RETURN(worker_, ucp_->newWorker());
      LOOM_ASSIGN_OR_RETURN(reply_, workerAddress(*ucp_, worker_));
    }
    const std::string what = peerName(peerRank_);
    while (sent_ < reply_.size()) {
      LOOM_ASSIGN_OR_RETURN(
          size_t n, sock_.sendSome(reply_.data() + sent_, reply_.size() - sent_, what.c_str()));
      if (n == 0) return Status::ok();
      sent_ += n;
      if (sent_ < reply_.size()) continue;
      sock_.setKeepAlive(settings::get(settings::kTimeoutMs));
      ep_ = std::make_unique<Endpoint>(ucp_, std::exchange(worker_, nullptr), std::move(sock_),
                                       peerRank_, /*sending=*/false);
      LOOM_TRY(ep_->startSetup(nonce_));
    }
    if (!ready_) {
      LOOM_ASSIGN_OR_RETURN(bool arrived, ep_->setupDone());
      if (!arrived) {
        // The sender writes nothing on the socket before it: a read that ends it has gone.
        char byte;
        LOOM_ASSIGN_OR_RETURN(size_t n, ep_->socket().recvSome(&byte, 1, what.c_str()));
        if (n > 0) {
          return errorf(Code::kRemoteError, "net/ucx: %s broke the set-up protocol", what.c_str());
        }
        return Status::ok();
      }
      ready_ = true;
    }
    // The sender's flush needs this worker's progress until it says it is done.
    ep_->progress();
    char byte = 0;
    LOOM_ASSIGN_OR_RETURN(size_t n, ep_->socket().recvSome(&byte, 1, what.c_str()));
    if (n == 0) return Status::ok();
    if (byte != kReadyByte) {
      return errorf(Code::kRemoteError, "net/ucx: %s broke the set-up protocol", what.c_str());
    }
    *comm = std::make_unique<UcxRecv>(std::move(ep_), ucp_);
    return Status::ok();
  }

 private:
  Context ctx_;
  std::shared_ptr<UcpContext> ucp_;
  Socket listener_;
  uint64_t nonce_;
  Arrivals arrivals_;
  Socket sock_;  // the sender's, once it said hello
  int peerRank_ = -1;
  ucp_worker_h worker_ = nullptr;
  std::vector<char> reply_;  // its address
  size_t sent_ = 0;
  std::unique_ptr<Endpoint> ep_;  // once the address has gone
  bool ready_ = false;            // the set-up message has arrived
};

// The sender between connect() calls.
struct ConnectStage {
  Socket sock;
  bool connected = false;
  size_t sent = 0;  // bytes of the hello
  uint32_t length = 0;
  size_t got = 0;  // bytes of the length and then of the address
  std::vector<char> address;
  std::unique_ptr<Endpoint> ep;  // once the address has arrived
  Clock::time_point deadline;
};

class UcxBackend final : public Backend {
 public:
  UcxBackend(const Context& ctx, std::shared_ptr<UcpContext> ucp, std::vector<NetInterface> ifs)
      : ctx_(ctx), ucp_(std::move(ucp)), ifs_(std::move(ifs)), rng_(seed()) {}

  const char* name() const override { return "ucx"; }
  int devices() const override { return static_cast<int>(ifs_.size()); }

  Status properties(int dev, Properties* p) const override {
    LOOM_TRY(checkDev(dev));
    const NetInterface& i = ifs_[dev];
    *p = Properties{};
    p->name = i.name;
    p->ptrSupport = kPtrHost | (ucp_->cuda() ? kPtrCuda : 0);
    p->speedMbps = 10000;  // as the socket backend: where the interface does not say
    std::ifstream speed("/sys/class/net/" + i.name + "/speed");
    int mbps = 0;
    if (speed >> mbps && mbps > 0) p->speedMbps = mbps;
    char real[PATH_MAX];
    if (::realpath(("/sys/class/net/" + i.name + "/device").c_str(), real)) p->pciPath = real;
    p->maxRecvs = 1;
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
    *listenComm = std::make_unique<UcxListen>(ctx_, ucp_, std::move(listener), h.nonce);
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
    if (!s.ep && !s.sock.isOpen()) {
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
        if (s.length == 0 || s.length > kMaxAddress) {
          return errorf(Code::kRemoteError, "net/ucx: %s sent a %u-byte UCP address", what.c_str(),
                        s.length);
        }
        s.address.resize(s.length);
      }
    }
    while (s.got < sizeof(uint32_t) + s.length) {
      const size_t at = s.got - sizeof(uint32_t);
      LOOM_ASSIGN_OR_RETURN(size_t n,
                            s.sock.recvSome(s.address.data() + at, s.length - at, what.c_str()));
      if (n == 0) return Status::ok();
      s.got += n;
    }
    if (!s.ep) {
      LOOM_ASSIGN_OR_RETURN(ucp_worker_h w, ucp_->newWorker());
      s.sock.setKeepAlive(settings::get(settings::kTimeoutMs));
      s.ep = std::make_unique<Endpoint>(ucp_, w, std::move(s.sock), peerRank, /*sending=*/true);
      LOOM_TRY(s.ep->connectTo(s.address));
      LOOM_TRY(s.ep->startSetup(h.nonce));
    }
    LOOM_ASSIGN_OR_RETURN(bool flushed, s.ep->setupDone());
    if (!flushed) return Status::ok();
    LOOM_ASSIGN_OR_RETURN(size_t n, s.ep->socket().sendSome(&kReadyByte, 1, what.c_str()));
    if (n == 0) return Status::ok();
    *comm = std::make_unique<UcxSend>(std::move(s.ep), ucp_);
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
  ucp_params_t p{};
  p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  p.features = UCP_FEATURE_TAG;
  p.mt_workers_shared = 1;  // the comms' workers run on several threads
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
  char text[160];
  std::snprintf(text, sizeof(text), "UCX %u.%u.%u, %s", major, minor, release,
                cuda ? "host and CUDA memory (built with CUDA)"
                     : "host memory only (built without CUDA: device buffers are staged)");
  out.description = text;
  return out;
}

}  // namespace

Result<std::string> describeUcx() {
  LOOM_ASSIGN_OR_RETURN(Opened o, open());
  return o.description;
}

Result<std::unique_ptr<Backend>> makeUcxBackend(const Context& ctx) {
  LOOM_ASSIGN_OR_RETURN(Opened o, open());
  LOOM_ASSIGN_OR_RETURN(auto ifs, findInterfacesFromSettings());
  LOOM_INFO(kNet, "net/ucx: %s; %zu device(s), first %s (%s) for the set-up and heartbeat",
            o.description.c_str(), ifs.size(), ifs.front().name.c_str(),
            ifs.front().address.toString().c_str());
  return std::unique_ptr<Backend>(new UcxBackend(ctx, std::move(o.context), std::move(ifs)));
}

}  // namespace loom::transport::net::ucx
