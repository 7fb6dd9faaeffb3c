// One lane of a ucx connection: a UCP worker of its own (and, sending, an endpoint to the
// peer's lane), its messages in order (message i of the lane is tag i, unless the caller
// names the tag, as Striped does past lane 0), and, on lane 0, the connection's heartbeat
// socket. A lane is used by one thread at a time.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/socket.h"
#include "common/status.h"
#include "transports/net/net.h"
#include "transports/net/ucx/ucp_calls.h"

namespace loom::transport::net::ucx {

inline constexpr ucp_tag_t kSetupTag = ucp_tag_t{1} << 63;  // lane messages use their number

// The UCP context, shared by the backend and every lane it made (a lane may outlive it).
class UcpContext {
 public:
  UcpContext(const UcpCalls* u, ucp_context_h h, bool cuda) : u_(u), h_(h), cuda_(cuda) {}
  ~UcpContext() { u_->cleanup(h_); }
  UcpContext(const UcpContext&) = delete;
  UcpContext& operator=(const UcpContext&) = delete;
  const UcpCalls& calls() const { return *u_; }
  bool cuda() const { return cuda_; }
  std::string error(ucs_status_t s) const { return u_->statusString(s); }
  Result<ucp_worker_h> newWorker() const;
  // CPU nanoseconds of the lane threads that have ended (Striped's helpers), for the
  // proxy's CPU report.
  void addThreadCpuNs(int64_t ns) { threadCpuNs_.fetch_add(ns, std::memory_order_relaxed); }
  int64_t threadCpuNs() const { return threadCpuNs_.load(std::memory_order_relaxed); }

 private:
  const UcpCalls* u_;
  ucp_context_h h_;
  bool cuda_;
  std::atomic<int64_t> threadCpuNs_{0};
};

// A message in flight on a lane.
struct LaneRequest {
  void* ucx = nullptr;           // UCX's request; null once done, or when it completed at once
  ucs_status_t status = UCS_OK;  // how it ended (when ucx is null)
  ucp_tag_recv_info_t info{};    // a receive: what arrived (ucp_tag_recv_request_test)
  ucp_dt_iov_t iov[2]{};         // the 8-byte header and the data, where there is a header
  bool header = false;
  size_t size = 0;      // a send: its data bytes
  size_t capacity = 0;  // a receive: the data buffer's size
  uint64_t seq = 0;
  ucp_tag_t tag = 0;
  bool cancelled = false;  // cancel() asked UCX to drop this receive
};

class Lane {
 public:
  // `heartbeat` is lane 0's (closed on the others); `watchFd` is lane 0's descriptor for
  // the others, whose flush at close ends when the peer has closed it.
  Lane(std::shared_ptr<UcpContext> ctx, ucp_worker_h worker, Socket heartbeat, int watchFd,
       int peer, bool sending);
  ~Lane() { close(); }
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  // The endpoint to the receiver's lane (a sender's).
  Status connectTo(const std::vector<char>& address);
  // The set-up message through UCX: the sender sends the nonce synchronously (done once
  // the receiver has matched it, which wires the receiver's way back to the sender too)
  // and then flushes; the receiver posts its receive. setupDone() says when that is over
  // on this end.
  Status startSetup(uint64_t nonce);
  Result<bool> setupDone();

  // Posts the lane's next message: `size` bytes at `data` (a receive: at most), after the
  // 8 bytes at `header` where that is not null, with tag `tag` (the lane's message number
  // where it is kLaneTag). *request stays null when the lane has kMaxRequests in flight.
  static constexpr ucp_tag_t kLaneTag = ~ucp_tag_t{0};
  Status post(void* data, size_t size, uint64_t* header, LaneRequest** request,
              ucp_tag_t tag = kLaneTag);
  // In the order posted. *size: the data bytes sent or received (the header excluded); a
  // cancelled receive that nothing matched is done with *size 0.
  Status test(LaneRequest* r, bool* done, size_t* size);
  // Asks UCX to drop receive `r` (one posted for a message that will not come); test() then
  // finds it done.
  void cancel(LaneRequest* r);
  // Lane 0, while the caller waits on the other lanes: has the peer gone?
  Status heartbeat();
  void shutdown();

  Socket& socket() { return heartbeat_; }
  int socketFd() const { return heartbeat_.fd(); }
  void progress() { u_.workerProgress(worker_); }
  // Progress rounds until one moves nothing (at most kDrainRounds).
  void drain();
  // The worker's event descriptor, readable when it has work once armed; arm() says
  // UCS_ERR_BUSY when it has work now (progress first).
  Result<int> eventFd();
  ucs_status_t arm() { return u_.workerArm(worker_); }
  const std::string& peer() const { return what_; }

 private:
  LaneRequest* slot();
  void finishPost(LaneRequest* r, ucs_status_ptr_t sp);
  Status usable();
  Status peerFailed(ucs_status_t s) const;
  void close();
  void wait(ucs_status_ptr_t sp, Clock::time_point until, bool untilPeerGone);

  std::shared_ptr<UcpContext> ctx_;
  const UcpCalls& u_;
  ucp_worker_h worker_;
  ucp_ep_h ep_ = nullptr;
  Socket heartbeat_;
  int watchFd_;
  const std::string what_;
  const bool sending_;
  LaneRequest requests_[kMaxRequests];
  uint64_t posted_ = 0;
  uint64_t freed_ = 0;
  ucs_status_t epError_ = UCS_OK;  // set by UCX's error callback, in workerProgress
  std::atomic<bool> shut_{false};
  void* setupReq_ = nullptr;
  bool setupFlushed_ = false;
  ucs_status_t setupStatus_ = UCS_OK;
  uint64_t setupBuf_ = 0;
  uint64_t setupNonce_ = 0;
  ucp_tag_recv_info_t setupInfo_{};
  Clock::time_point lastBeat_{};
  std::optional<Clock::time_point> closedAt_;
  std::string closedWhy_;
};

}  // namespace loom::transport::net::ucx
