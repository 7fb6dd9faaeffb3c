#include "transports/net/ucx/lane.h"

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>

#include "common/log.h"

namespace loom::transport::net::ucx {

namespace {

// After the heartbeat socket closes, how long what the peer sent before may still arrive
// (a sender closes only after UCX has flushed its endpoint).
constexpr auto kCloseGrace = std::chrono::milliseconds(200);
constexpr auto kHeartbeatEvery = std::chrono::milliseconds(1);
// How long a closing lane waits for UCX to finish what it still holds.
constexpr auto kCloseWait = std::chrono::milliseconds(1000);
// Progress rounds per test(): one round moves at most a segment per transport endpoint.
constexpr int kDrainRounds = 64;

// Whether the peer has closed (or broken) the socket `fd`, without reading from it.
bool peerClosed(int fd) {
  if (fd < 0) return false;
  char byte;
  const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace

Result<ucp_worker_h> UcpContext::newWorker() const {
  ucp_worker_params_t p{};
  p.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  p.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // one thread at a time, never two
  ucp_worker_h w = nullptr;
  ucs_status_t s = u_->workerCreate(h_, &p, &w);
  if (s != UCS_OK) {
    return errorf(Code::kSystemError, "net/ucx: ucp_worker_create: %s", error(s).c_str());
  }
  return w;
}

Lane::Lane(std::shared_ptr<UcpContext> ctx, ucp_worker_h worker, Socket heartbeat, int watchFd,
           int peer, bool sending)
    : ctx_(std::move(ctx)),
      u_(ctx_->calls()),
      worker_(worker),
      heartbeat_(std::move(heartbeat)),
      watchFd_(heartbeat_.isOpen() ? heartbeat_.fd() : watchFd),
      what_(peer >= 0 ? "rank " + std::to_string(peer) : "the peer"),
      sending_(sending) {}

Status Lane::connectTo(const std::vector<char>& address) {
  ucp_ep_params_t p{};
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(address.data());
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;  // a peer that fails fails our sends, not hangs
  p.err_handler.cb = [](void* arg, ucp_ep_h, ucs_status_t status) {
    static_cast<Lane*>(arg)->epError_ = status;
  };
  p.err_handler.arg = this;
  ucs_status_t s = u_.epCreate(worker_, &p, &ep_);
  if (s == UCS_ERR_UNREACHABLE) {
    // No transport of UCX_TLS that reaches the peer handles peer failures (shared memory,
    // for one): the endpoint goes without, and the lane's heartbeat socket still tells
    // when the peer is gone (test() fails the lane then, and close() does not wait on it).
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    s = u_.epCreate(worker_, &p, &ep_);
    if (s == UCS_OK) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) {
        LOOM_INFO(kNet,
                  "net/ucx: no transport of UCX_TLS that reaches %s handles a peer's failure "
                  "(UCX has logged that as an error: destination unreachable); the endpoint "
                  "is made without, and loom's heartbeat socket detects a peer that dies",
                  what_.c_str());
      }
    }
  }
  if (s != UCS_OK) {
    ep_ = nullptr;
    return errorf(Code::kRemoteError, "net/ucx: ucp_ep_create to %s: %s", what_.c_str(),
                  ctx_->error(s).c_str());
  }
  return Status::ok();
}

Status Lane::startSetup(uint64_t nonce) {
  setupNonce_ = nonce;
  ucp_request_param_t p{};
  ucs_status_ptr_t sp;
  if (sending_) {
    setupBuf_ = nonce;
    // Synchronous: it completes when the receiver's acknowledgement comes back, so the
    // receiving worker wires its way back to this one now, while both are there. Wired
    // lazily instead, on the first rendezvous reply, a sender that went away in between
    // made UCX 1.13 abort the receiving process on an internal assertion (7 of 60 runs of
    // the backend suite's SenderGoneMidMessage case; 0 of 60 this way).
    sp = u_.tagSendSyncNbx(ep_, &setupBuf_, sizeof(setupBuf_), kSetupTag, &p);
  } else {
    p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // as post(): the size must be known
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

Result<bool> Lane::setupDone() {
  u_.workerProgress(worker_);
  if (setupReq_) {
    setupStatus_ =
        sending_ ? u_.requestCheckStatus(setupReq_) : u_.tagRecvRequestTest(setupReq_, &setupInfo_);
    if (setupStatus_ == UCS_INPROGRESS) return false;
    u_.requestFree(setupReq_);
    setupReq_ = nullptr;
  }
  if (setupStatus_ != UCS_OK) return peerFailed(setupStatus_);
  if (sending_ && !setupFlushed_) {
    // And flushed while the receiver still progresses its worker for the set-up: the
    // endpoint is then wired up in both directions.
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

Result<int> Lane::eventFd() {
  int fd = -1;
  ucs_status_t s = u_.workerGetEfd(worker_, &fd);
  if (s != UCS_OK) {
    return errorf(Code::kSystemError, "net/ucx: ucp_worker_get_efd: %s", ctx_->error(s).c_str());
  }
  return fd;
}

void Lane::drain() {
  for (int i = 0; i < kDrainRounds && u_.workerProgress(worker_) != 0; ++i) {
  }
}

LaneRequest* Lane::slot() {
  if (posted_ - freed_ >= static_cast<uint64_t>(kMaxRequests)) return nullptr;
  LaneRequest& r = requests_[posted_ % kMaxRequests];
  r = LaneRequest{};
  r.seq = posted_;
  return &r;
}

void Lane::finishPost(LaneRequest* r, ucs_status_ptr_t sp) {
  if (UCS_PTR_IS_PTR(sp)) {
    r->ucx = sp;
  } else {
    r->status = UCS_PTR_STATUS(sp);  // done at once, or failed at once
  }
  ++posted_;
}

Status Lane::post(void* data, size_t size, uint64_t* header, LaneRequest** request, ucp_tag_t tag) {
  *request = nullptr;
  LOOM_TRY(usable());
  LaneRequest* r = slot();
  if (!r) return Status::ok();
  r->tag = tag == kLaneTag ? r->seq : tag;
  ucp_request_param_t p{};
  const void* buffer = data;
  size_t count = size;
  if (header) {
    r->header = true;
    r->iov[0] = {header, sizeof(uint64_t)};
    r->iov[1] = {data, size};
    p.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
    p.datatype = ucp_dt_make_iov();
    buffer = r->iov;
    count = size > 0 ? 2 : 1;
  }
  ucs_status_ptr_t sp;
  if (sending_) {
    r->size = size;
    sp = u_.tagSendNbx(ep_, buffer, count, r->tag, &p);
  } else {
    r->capacity = size;
    // Always a request: UCX 1.13 leaves recv_info unset when a receive completes at once
    // from its unexpected queue (its size would be lost).
    p.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    sp = u_.tagRecvNbx(worker_, const_cast<void*>(buffer), count, r->tag, ~ucp_tag_t{0}, &p);
  }
  finishPost(r, sp);
  *request = r;
  return Status::ok();
}

Status Lane::test(LaneRequest* r, bool* done, size_t* size) {
  *done = false;
  if (r->seq != freed_ || freed_ >= posted_) {
    return errorf(Code::kInternalError, "net/ucx: requests to %s tested out of order",
                  what_.c_str());
  }
  if (r->ucx) {
    drain();
    ucs_status_t s =
        sending_ ? u_.requestCheckStatus(r->ucx) : u_.tagRecvRequestTest(r->ucx, &r->info);
    if (s == UCS_INPROGRESS) {
      if (epError_ != UCS_OK) return peerFailed(epError_);
      return heartbeat();
    }
    u_.requestFree(r->ucx);
    r->ucx = nullptr;
    r->status = s;
  }
  if (r->cancelled && r->status == UCS_ERR_CANCELED) {
    *done = true;
    *size = 0;
    ++freed_;
    return Status::ok();
  }
  if (r->status == UCS_ERR_MESSAGE_TRUNCATED) {
    return errorf(Code::kInvalidUsage,
                  "net/ucx: %s sent a message larger than the %zu-byte receive (the ranks "
                  "disagree on the operation, or on LOOM_BUFFSIZE)",
                  what_.c_str(), r->capacity);
  }
  if (r->status != UCS_OK) return peerFailed(r->status);
  if (!sending_ && r->header && r->info.length < sizeof(uint64_t)) {
    return errorf(Code::kRemoteError, "net/ucx: %s sent a message without its header",
                  what_.c_str());
  }
  *done = true;
  *size = sending_ ? r->size : r->info.length - (r->header ? sizeof(uint64_t) : 0);
  ++freed_;
  return Status::ok();
}

void Lane::cancel(LaneRequest* r) {
  if (sending_ || r->cancelled) return;
  r->cancelled = true;
  if (r->ucx) u_.requestCancel(worker_, r->ucx);
}

Status Lane::usable() {
  if (shut_.load(std::memory_order_relaxed)) {
    return errorf(Code::kSystemError, "net/ucx: the connection to %s was shut down", what_.c_str());
  }
  if (epError_ != UCS_OK) return peerFailed(epError_);
  return Status::ok();
}

Status Lane::peerFailed(ucs_status_t s) const {
  return errorf(Code::kRemoteError,
                "net/ucx: %s %s failed: %s (the peer exited or cannot be reached)",
                sending_ ? "sending to" : "receiving from", what_.c_str(), ctx_->error(s).c_str());
}

Status Lane::heartbeat() {
  if (shut_.load(std::memory_order_relaxed)) {
    return errorf(Code::kSystemError, "net/ucx: the connection to %s was shut down", what_.c_str());
  }
  if (!heartbeat_.isOpen()) return Status::ok();  // lane 0 watches
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

void Lane::shutdown() {
  shut_.store(true, std::memory_order_relaxed);
  heartbeat_.shutdown();
}

void Lane::close() {
  const auto until = Clock::now() + kCloseWait;
  const bool shut = shut_.load(std::memory_order_relaxed);
  if (setupReq_) {
    if (!sending_) u_.requestCancel(worker_, setupReq_);
    wait(std::exchange(setupReq_, nullptr), shut ? Clock::now() : until, false);
  }
  // Receives are cancelled; sends run out (the caller's buffers stay valid until then).
  for (uint64_t s = freed_; s < posted_; ++s) {
    LaneRequest& r = requests_[s % kMaxRequests];
    if (r.ucx && !sending_) u_.requestCancel(worker_, r.ucx);
  }
  for (uint64_t s = freed_; s < posted_; ++s) {
    LaneRequest& r = requests_[s % kMaxRequests];
    if (r.ucx) wait(std::exchange(r.ucx, nullptr), shut ? Clock::now() : until, false);
  }
  if (ep_) {
    // Flushed (what was sent has reached the peer), then closed without UCX's disconnect
    // handshake, which would wait for a peer that is closing its own comms. The flush
    // ends early when the peer has closed its heartbeat (it has read all it wanted), and
    // is skipped when the peer failed or this end was shut down.
    ucp_request_param_t p{};
    if (!shut && epError_ == UCS_OK) wait(u_.epFlushNbx(ep_, &p), until, /*untilPeerGone=*/true);
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    wait(u_.epCloseNbx(ep_, &p), until, false);
    ep_ = nullptr;
  }
  u_.workerDestroy(worker_);
  worker_ = nullptr;
  heartbeat_.close();
}

void Lane::wait(ucs_status_ptr_t sp, Clock::time_point until, bool untilPeerGone) {
  if (!UCS_PTR_IS_PTR(sp)) return;
  auto look = Clock::now();
  while (u_.requestCheckStatus(sp) == UCS_INPROGRESS && epError_ == UCS_OK) {
    const auto now = Clock::now();
    if (now >= until) break;
    if (untilPeerGone && now >= look) {
      look = now + kHeartbeatEvery;
      if (peerClosed(watchFd_)) break;
    }
    if (u_.workerProgress(worker_) == 0 && untilPeerGone && watchFd_ >= 0) {
      // Nothing moved: instead of spinning (on the closer's thread, beside the threads
      // whose closes end this wait), sleep until the peer closes, or for 1 ms.
      pollfd p{watchFd_, POLLIN | POLLRDHUP, 0};
      if (::poll(&p, 1, 1) > 0) look = now;
    }
  }
  u_.requestFree(sp);  // released by UCX when it is done with it
}

}  // namespace loom::transport::net::ucx
