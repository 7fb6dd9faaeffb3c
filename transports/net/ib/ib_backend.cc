// The ib backend: RDMA over InfiniBand or RoCE through libibverbs (the verbs table of
// ib/verbs.h), one network device per ACTIVE port that LOOM_IB_HCA keeps.
//
// A connection is one or more RC queue pairs (LOOM_IB_QPS_PER_CONNECTION) from the
// sender to the receiver, set up through a TCP socket whose address travels in the
// handle: the sender says hello with its queue pairs, the receiver answers with its own,
// and the sender confirms once its side can take writes. The socket stays open: it tells
// either side at once when the other closed or aborted (a host that vanishes shows up as
// a failed work completion instead, after LOOM_IB_TIMEOUT and LOOM_IB_RETRY_CNT).
//
// Data moves receiver-driven, as in NCCL's IB transport:
//   - irecv writes a clear-to-send entry (buffer address, key, size) into the sender's
//     FIFO of kMaxRequests entries with RDMA WRITE_WITH_IMM (inline: it is 32 bytes), and
//     posts one receive per queue pair for the data's completions;
//   - isend takes the next entry once its completion has arrived (no entry yet: no
//     request, try again) and writes the message straight into the receiver's buffer, an
//     equal share on each queue pair, each share a WRITE_WITH_IMM whose immediate is its
//     byte count; tiny messages go inline;
//   - a receive is done when every queue pair's share has completed, a send when every
//     share's write is acknowledged.
// No byte is copied by the CPU on either side. Buffers are registered once through a
// cache per device (regMr, or on first use of an unregistered buffer).
#include <arpa/inet.h>
#include <net/if.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <random>

#include "common/handshake.h"
#include "common/log.h"
#include "common/settings.h"
#include "common/socket.h"
#include "transports/net/gdr.h"
#include "transports/net/ib/ib.h"
#include "transports/net/ib/ib_select.h"
#include "transports/net/ib/verbs.h"

namespace loom::transport::net::ib {
namespace {

constexpr uint64_t kHandleMagic = 0x3162696d6f6f6cull;  // "loomib1"
constexpr uint64_t kHelloMagic = 0x6f6c6c6568626931ull;
constexpr int kMaxQps = 8;
constexpr uint32_t kTooBig = 0xffffffffu;  // immediate: the message did not fit the receive
constexpr int kInline = 64;                // inline bytes asked of each queue pair
constexpr int kPollBatch = 16;
// The sender re-posts the receives that clear-to-send entries consume this many at a time
// (one ibv_post_recv of a chain), keeping kMaxRequests and more posted in between.
constexpr int kCtsBatch = 8;
constexpr int64_t kPeerCheckMs = 100;
constexpr char kAbortByte = 'A';
constexpr char kReadyByte = 'R';

std::string peerName(int rank) {
  return rank >= 0 ? "rank " + std::to_string(rank) : "the peer";
}

// What a receiver's irecv tells the sender.
struct CtsEntry {
  uint64_t addr;
  uint64_t size;
  uint64_t seq;
  uint32_t rkey;
  int32_t tag;
};
static_assert(sizeof(CtsEntry) == 32);

// One side's queue pairs, as the other side needs them.
struct QpInfo {
  uint32_t qpn[kMaxQps];
  unsigned char gid[16];
  uint64_t ctsAddr;  // the sender's FIFO of CtsEntry (sender only)
  uint32_t ctsRkey;
  uint16_t lid;
  uint8_t infiniband;
  uint8_t mtu;
  int32_t nqps;
};

struct Hello {
  uint64_t magic;
  uint64_t commHash;
  uint64_t nonce;
  int32_t rank;
  int32_t pad;
  QpInfo info;
};

struct ConnectStage;

struct IbHandle {
  uint64_t magic;
  SocketAddress address;
  uint64_t nonce;
  int32_t rank;  // the listener's
  int32_t nqps;
  ConnectStage* stage;  // the sender's state between connect() calls (null as sent)
};
static_assert(sizeof(IbHandle) <= kHandleBytes);

// An open device, its protection domain and its registrations; shared by the backend and
// every comm made on it, so it closes after the last.
struct Device {
  const Verbs* v = nullptr;
  std::string name;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_device_attr attr{};

  struct Registration {
    uintptr_t begin = 0, end = 0;
    ibv_mr* mr = nullptr;
    int refs = 0;
    bool gpu = false;  // GPU memory (GPUDirect RDMA)
  };
  std::mutex mutex;
  std::vector<std::unique_ptr<Registration>> regs;

  ~Device() {
    for (auto& r : regs) v->deregMr(r->mr);
    if (pd) v->deallocPd(pd);
    if (ctx) v->closeDevice(ctx);
  }

  // A registration covering [data, data + size) (page-aligned in host memory), made or found
  // in the cache. GPU memory: as given (its pages are the driver's), through ibv_reg_mr, which
  // takes it where nvidia_peermem is loaded, or through dma-buf where `dmaBuf` is an exported
  // descriptor (cuda::dmaBufFor) with `data` at `dmaBufOffset` in it.
  Result<Registration*> acquire(const void* data, size_t size, bool gpu = false, int dmaBuf = -1,
                                uint64_t dmaBufOffset = 0) {
    const uintptr_t page = gpu ? 1 : 4096;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(data) & ~(page - 1);
    const uintptr_t end =
        (reinterpret_cast<uintptr_t>(data) + std::max<size_t>(size, 1) + page - 1) & ~(page - 1);
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& r : regs) {
      if (r->gpu == gpu && r->begin <= begin && end <= r->end) {
        ++r->refs;
        return r.get();
      }
    }
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    ibv_mr* mr = nullptr;
    if (dmaBuf >= 0) {
      if (!v->regDmabufMr) {
        return errorf(Code::kSystemError,
                      "net/ib: %s: libibverbs has no ibv_reg_dmabuf_mr (rdma-core older than 34)",
                      name.c_str());
      }
      mr = v->regDmabufMr(pd, dmaBufOffset, end - begin, begin, dmaBuf, access);
      if (!mr) {
        return sysError(errno,
                        "net/ib: %s: registering %zu bytes of GPU memory at %p through dma-buf "
                        "(ibv_reg_dmabuf_mr)",
                        name.c_str(), static_cast<size_t>(end - begin), data);
      }
    } else {
      mr = v->regMr(pd, reinterpret_cast<void*>(begin), end - begin, access);
      if (!mr && gpu) {
        return sysError(errno,
                        "net/ib: %s: registering %zu bytes of GPU memory at %p (ibv_reg_mr on GPU "
                        "memory needs nvidia_peermem loaded)",
                        name.c_str(), static_cast<size_t>(end - begin), data);
      }
      if (!mr) {
        return sysError(errno,
                        "net/ib: %s: registering %zu bytes of host memory at %p (is the "
                        "locked-memory limit, ulimit -l, too low?)",
                        name.c_str(), static_cast<size_t>(end - begin), data);
      }
    }
    auto r = std::make_unique<Registration>();
    r->begin = begin;
    r->end = end;
    r->mr = mr;
    r->refs = 1;
    r->gpu = gpu;
    regs.push_back(std::move(r));
    return regs.back().get();
  }

  void release(Registration* r) {
    std::lock_guard<std::mutex> lock(mutex);
    if (--r->refs > 0) return;
    v->deregMr(r->mr);
    regs.erase(std::find_if(regs.begin(), regs.end(), [&](auto& p) { return p.get() == r; }));
  }
};

// A usable port: what connections on it need.
struct Port {
  std::shared_ptr<Device> device;
  int port = 1;
  bool infiniband = false;
  int speedMbps = 0;
  uint16_t lid = 0;
  int gidIndex = 0;
  ibv_gid gid{};
  ibv_mtu mtu = IBV_MTU_1024;
  std::string pciPath;
  std::string gidWhy;
  bool gidUsual = true;  // the GID the rule asks for, not a fallback
  bool dmaBuf = false;   // the provider registers dma-buf (probeDmaBuf)
  std::string dmaBufWhy;
};

struct Tuning {
  int nqps = 1;
  int timeout = 20;
  int retryCnt = 7;
  int tc = 0;
  int sl = 0;
};

// The queue pairs and completion queue of one direction of one connection.
struct Qps {
  const Verbs* v = nullptr;
  ibv_cq* cq = nullptr;
  std::vector<ibv_qp*> qps;
  int maxInline = 0;

  ~Qps() {
    for (ibv_qp* qp : qps) v->destroyQp(qp);
    if (cq) v->destroyCq(cq);
  }

  Status create(const Port& p, int n) {
    v = p.device->v;
    const int depth = kMaxRequests + kCtsBatch + 1;
    cq = v->createCq(p.device->ctx, 2 * depth * (n + 1) + 16, nullptr, nullptr, 0);
    if (!cq) return sysError(errno, "net/ib: %s: ibv_create_cq", p.device->name.c_str());
    for (int i = 0; i < n; ++i) {
      ibv_qp_init_attr a{};
      a.send_cq = cq;
      a.recv_cq = cq;
      a.qp_type = IBV_QPT_RC;
      a.cap.max_send_wr = depth;
      a.cap.max_recv_wr = depth;
      a.cap.max_send_sge = 1;
      a.cap.max_recv_sge = 1;
      a.cap.max_inline_data = kInline;
      ibv_qp* qp = v->createQp(p.device->pd, &a);
      if (!qp) {  // some NICs take no inline data
        a.cap.max_inline_data = 0;
        qp = v->createQp(p.device->pd, &a);
      }
      if (!qp) return sysError(errno, "net/ib: %s: ibv_create_qp", p.device->name.c_str());
      maxInline = i == 0 ? static_cast<int>(a.cap.max_inline_data)
                         : std::min(maxInline, static_cast<int>(a.cap.max_inline_data));
      qps.push_back(qp);
      ibv_qp_attr m{};
      m.qp_state = IBV_QPS_INIT;
      m.pkey_index = 0;
      m.port_num = static_cast<uint8_t>(p.port);
      m.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE;
      if (int e = v->modifyQp(
              qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
        return sysError(e, "net/ib: %s: queue pair to INIT", p.device->name.c_str());
      }
    }
    return Status::ok();
  }

  void describe(const Port& p, QpInfo* info) const {
    std::memset(info, 0, sizeof(*info));
    for (size_t i = 0; i < qps.size(); ++i) info->qpn[i] = qps[i]->qp_num;
    info->nqps = static_cast<int32_t>(qps.size());
    std::memcpy(info->gid, p.gid.raw, 16);
    info->lid = p.lid;
    info->infiniband = p.infiniband;
    info->mtu = static_cast<uint8_t>(p.mtu);
  }

  // INIT -> RTR -> RTS towards the peer's queue pairs.
  Status connectTo(const Port& p, const QpInfo& remote, const Tuning& t, const std::string& who) {
    if (remote.nqps != static_cast<int>(qps.size())) {
      return errorf(Code::kInvalidUsage,
                    "net/ib: %s uses %d queue pairs per connection, this rank %zu "
                    "(LOOM_IB_QPS_PER_CONNECTION must be the same everywhere)",
                    who.c_str(), remote.nqps, qps.size());
    }
    if (static_cast<bool>(remote.infiniband) != p.infiniband) {
      return errorf(Code::kInvalidUsage,
                    "net/ib: %s is on %s, this rank's %s port %d on %s: they cannot connect",
                    who.c_str(), remote.infiniband ? "InfiniBand" : "RoCE", p.device->name.c_str(),
                    p.port, p.infiniband ? "InfiniBand" : "RoCE");
    }
    for (size_t i = 0; i < qps.size(); ++i) {
      ibv_qp_attr m{};
      m.qp_state = IBV_QPS_RTR;
      m.path_mtu = static_cast<ibv_mtu>(std::min<int>(p.mtu, remote.mtu));
      m.dest_qp_num = remote.qpn[i];
      m.rq_psn = 0;
      m.max_dest_rd_atomic = 1;
      m.min_rnr_timer = 12;
      m.ah_attr.port_num = static_cast<uint8_t>(p.port);
      m.ah_attr.sl = static_cast<uint8_t>(t.sl);
      if (p.infiniband) {
        m.ah_attr.dlid = remote.lid;
      } else {
        m.ah_attr.is_global = 1;
        std::memcpy(m.ah_attr.grh.dgid.raw, remote.gid, 16);
        m.ah_attr.grh.sgid_index = static_cast<uint8_t>(p.gidIndex);
        m.ah_attr.grh.hop_limit = 255;
        m.ah_attr.grh.traffic_class = static_cast<uint8_t>(t.tc);
      }
      if (int e =
              v->modifyQp(qps[i], &m,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
        return sysError(e, "net/ib: %s: queue pair %u to RTR towards %s (queue pair %u)",
                        p.device->name.c_str(), qps[i]->qp_num, who.c_str(), remote.qpn[i]);
      }
      ibv_qp_attr s{};
      s.qp_state = IBV_QPS_RTS;
      s.timeout = static_cast<uint8_t>(t.timeout);
      s.retry_cnt = static_cast<uint8_t>(t.retryCnt);
      s.rnr_retry = 7;
      s.sq_psn = 0;
      s.max_rd_atomic = 1;
      if (int e = v->modifyQp(qps[i], &s,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) {
        return sysError(e, "net/ib: %s: queue pair %u to RTS", p.device->name.c_str(),
                        qps[i]->qp_num);
      }
    }
    return Status::ok();
  }

  Status postRecv(int qp, uint64_t wrId, const std::string& device) {
    return postRecvs(qp, wrId, 1, device);
  }
  // `count` receives without buffers (for writes with an immediate), in one call, the
  // first with `wrId`.
  Status postRecvs(int qp, uint64_t wrId, int count, const std::string& device) {
    constexpr int kMost = kMaxRequests + kCtsBatch;
    if (count < 1 || count > kMost) {
      return errorf(Code::kInternalError, "net/ib: %d receives in one call (1 to %d)", count,
                    kMost);
    }
    ibv_recv_wr wrs[kMost];  // only the first `count` are set (this runs per message)
    for (int i = 0; i < count; ++i) {
      wrs[i] = ibv_recv_wr{};
      wrs[i].wr_id = wrId;
      wrs[i].next = i + 1 < count ? &wrs[i + 1] : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    if (int e = v->postRecv(qps[qp], wrs, &bad)) {
      return sysError(e, "net/ib: %s: ibv_post_recv", device.c_str());
    }
    return Status::ok();
  }
};

// wr_id layout: the sequence number in the high bits, the queue pair in the low byte.
uint64_t wrId(uint64_t seq, int qp) {
  return seq << 8 | static_cast<uint64_t>(qp);
}
uint64_t wrSeq(uint64_t id) {
  return id >> 8;
}

// The byte range of a `total`-byte message that queue pair k of n carries: equal shares
// in 128-byte multiples, all of it on the first when it is under 64 KiB.
void shareOf(size_t total, int k, int n, size_t* begin, size_t* end) {
  if (n == 1 || total < 65536) {
    *begin = 0;
    *end = k == 0 ? total : 0;
    return;
  }
  size_t per = (total + n - 1) / n;
  per = (per + 127) / 128 * 128;
  *begin = std::min(total, per * k);
  *end = std::min(total, per * (k + 1));
}

// What both directions of a connection share: the device, the queue pairs, the socket
// that watches the peer, and the first error.
class Link {
 public:
  Link(const Port& port, int peerRank) : port_(port), peer_(peerName(peerRank)) {}
  const Port& port() const { return port_; }
  Qps& qps() { return qps_; }
  const std::string& peer() const { return peer_; }
  // The handshake's socket, kept open to watch the peer: closed or aborted at once, a
  // host that stopped answering within about LOOM_TIMEOUT_MS (keepalive), so that a side
  // with only receives posted (no work request of its own to fail) notices too.
  void setSocket(Socket s) {
    sock_ = std::move(s);
    sock_.setKeepAlive(settings::get(settings::kTimeoutMs));
  }

  Status error() const { return error_; }
  Status fail(Status st) {
    if (error_) error_ = std::move(st);
    return error_;
  }

  // Every kPeerCheckMs while waiting: whether the peer closed its end or aborted.
  Status checkPeer() {
    if (!error_) return error_;
    const auto now = Clock::now();
    if (now < nextCheck_ || !sock_.isOpen()) return Status::ok();
    nextCheck_ = now + std::chrono::milliseconds(kPeerCheckMs);
    char byte = 0;
    ssize_t n = ::recv(sock_.fd(), &byte, 1, MSG_DONTWAIT);
    if (n == 1 && byte == kAbortByte) {
      return fail(errorf(Code::kRemoteError, "net/ib: %s aborted the connection", peer_.c_str()));
    }
    if (n < 0 && (errno == ETIMEDOUT || errno == EHOSTUNREACH)) {
      return fail(errorf(Code::kRemoteError,
                         "net/ib: %s stopped answering (%s: its host is down or cut off from "
                         "this one)",
                         peer_.c_str(), strerror(errno)));
    }
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      return fail(errorf(Code::kRemoteError, "net/ib: %s closed the connection (%s)", peer_.c_str(),
                         n == 0 ? "its process ended it" : strerror(errno)));
    }
    return Status::ok();
  }

  void shutdown() {
    if (sock_.isOpen()) {
      const char byte = kAbortByte;
      (void)::send(sock_.fd(), &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    (void)fail(
        errorf(Code::kRemoteError, "net/ib: the connection to %s was shut down", peer_.c_str()));
  }

  // Polls the completion queue; `onCompletion` sees each successful one.
  template <typename F>
  Status poll(F onCompletion) {
    LOOM_TRY(error_);
    ibv_wc wc[kPollBatch];
    const int n = port_.device->v->pollCq(qps_.cq, kPollBatch, wc);
    if (n < 0) {
      return fail(errorf(Code::kSystemError,
                         "net/ib: %s: ibv_poll_cq failed (the completion "
                         "queue overflowed?)",
                         port_.device->name.c_str()));
    }
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        const char* text = port_.device->v->wcStatusStr(wc[i].status);
        const Code code =
            wc[i].status == IBV_WC_LOC_PROT_ERR || wc[i].status == IBV_WC_LOC_ACCESS_ERR
                ? Code::kInternalError
                : Code::kRemoteError;
        return fail(Status(
            code, explainCompletion(wc[i].status, text, peer_, wc[i].qp_num, port_.device->name)));
      }
      LOOM_TRY(fail(onCompletion(wc[i])));
      LOOM_TRY(error_);
    }
    return Status::ok();
  }

  int qpIndex(uint32_t qpn) const {
    for (size_t i = 0; i < qps_.qps.size(); ++i)
      if (qps_.qps[i]->qp_num == qpn) return static_cast<int>(i);
    return -1;
  }

 private:
  Port port_;
  std::string peer_;
  Qps qps_;
  Socket sock_;
  Status error_;
  Clock::time_point nextCheck_{};
};

// A request in flight; the comms hand out its address as the opaque net::Request.
struct IbRequest {
  uint64_t seq = 0;
  size_t size = 0;  // send: the message; receive: what arrived so far
  int pending = 0;  // completions still to come
  bool tooBig = false;
  Device::Registration* ownReg = nullptr;  // registered for this request alone (mh was null)
};

// The sending side.
class IbSend final : public SendComm {
 public:
  IbSend(std::unique_ptr<Link> link, std::unique_ptr<CtsEntry[]> fifo, Device::Registration* reg)
      : link_(std::move(link)), fifo_(std::move(fifo)), fifoReg_(reg) {}
  ~IbSend() override {
    std::shared_ptr<Device> keep = link_->port().device;  // the link may hold the last
    Device& d = *keep;
    link_.reset();  // queue pairs go before the memory they write
    for (auto& r : reqs_)
      if (r.ownReg) d.release(r.ownReg);
    d.release(fifoReg_);
  }

  Result<MemHandle> regMr(void* data, size_t size, MemType type) override {
    return registerMemory(*link_->port().device, data, size, type);
  }
  Result<MemHandle> regMrDmaBuf(void* data, size_t size, MemType type, uint64_t offset,
                                int fd) override {
    return registerDmaBuf(*link_->port().device, data, size, type, offset, fd);
  }
  Status deregMr(MemHandle mh) override {
    if (mh) link_->port().device->release(static_cast<Device::Registration*>(mh));
    return Status::ok();
  }

  Status isend(const void* data, size_t size, int tag, MemHandle mh, Request** request) override {
    *request = nullptr;
    // The completion queue only where it may hold what this call waits for (the proxy's
    // tests poll it for every message anyway): a verbs call less per message.
    const bool ready =
        posted_ - done_ < static_cast<uint64_t>(kMaxRequests) && ctsArrived_ > posted_;
    LOOM_TRY(ready ? link_->error() : progress());
    if (posted_ - done_ >= static_cast<uint64_t>(kMaxRequests) || ctsArrived_ <= posted_) {
      return link_->checkPeer();
    }
    const CtsEntry cts = fifo_[posted_ % kMaxRequests];
    if (cts.seq != posted_) {
      return link_->fail(
          errorf(Code::kRemoteError, "net/ib: %s sent clear-to-send %llu where %llu was due",
                 link_->peer().c_str(), (unsigned long long)cts.seq, (unsigned long long)posted_));
    }
    IbRequest& r = reqs_[posted_ % kMaxRequests];
    r = IbRequest{};
    r.seq = posted_;
    r.size = size;
    const bool fits = size <= cts.size;
    Device::Registration* reg = static_cast<Device::Registration*>(mh);
    if (!reg && fits && size > 0 && size > static_cast<size_t>(link_->qps().maxInline)) {
      LOOM_ASSIGN_OR_RETURN(reg, link_->port().device->acquire(data, size));
      r.ownReg = reg;
    }
    Qps& q = link_->qps();
    const int n = static_cast<int>(q.qps.size());
    if (fits) {
      size_t b = 0, e = 0;
      shareOf(size, 0, n, &b, &e);  // the first share is the largest
      if (e - b >= kTooBig) {
        if (r.ownReg) link_->port().device->release(std::exchange(r.ownReg, nullptr));
        return errorf(Code::kInvalidUsage,
                      "net/ib: a %zu-byte message to %s: a queue pair's share of it is over "
                      "the 4 GiB a work request carries (send it in pieces, or raise "
                      "LOOM_IB_QPS_PER_CONNECTION)",
                      size, link_->peer().c_str());
      }
    }
    for (int k = 0; k < n; ++k) {
      size_t b = 0, e = 0;
      if (fits) shareOf(size, k, n, &b, &e);
      ibv_sge sge{};
      ibv_send_wr wr{};
      wr.wr_id = wrId(r.seq, k);
      wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.imm_data = htonl(fits ? static_cast<uint32_t>(e - b) : kTooBig);
      wr.wr.rdma.remote_addr = cts.addr + b;
      wr.wr.rdma.rkey = cts.rkey;
      if (e > b) {
        sge.addr = reinterpret_cast<uintptr_t>(data) + b;
        sge.length = static_cast<uint32_t>(e - b);
        if (size <= static_cast<size_t>(q.maxInline) && !reg) {
          wr.send_flags |= IBV_SEND_INLINE;
        } else {
          sge.lkey = reg->mr->lkey;
        }
        wr.sg_list = &sge;
        wr.num_sge = 1;
      }
      ibv_send_wr* bad = nullptr;
      if (int err = link_->port().device->v->postSend(q.qps[k], &wr, &bad)) {
        return link_->fail(sysError(err, "net/ib: %s: ibv_post_send to %s",
                                    link_->port().device->name.c_str(), link_->peer().c_str()));
      }
      ++r.pending;
    }
    ++posted_;
    if (!fits) {
      return link_->fail(errorf(Code::kInvalidUsage,
                                "net/ib: a %zu-byte message to %s, whose receive takes %llu "
                                "bytes (every rank must make the same calls)",
                                size, link_->peer().c_str(), (unsigned long long)cts.size));
    }
    *request = reinterpret_cast<Request*>(&r);
    return Status::ok();
  }

  Status test(Request* request, bool* done, size_t* size) override {
    *done = false;
    LOOM_TRY(progress());
    auto* r = reinterpret_cast<IbRequest*>(request);
    if (r->pending > 0) return link_->checkPeer();
    if (r->seq != done_) {
      return errorf(Code::kInternalError, "net/ib: send requests tested out of order");
    }
    *done = true;
    *size = r->size;
    if (r->ownReg) {
      link_->port().device->release(r->ownReg);
      r->ownReg = nullptr;
    }
    ++done_;
    return Status::ok();
  }

  void shutdown() override { link_->shutdown(); }

  static Result<MemHandle> registerMemory(Device& d, void* data, size_t size, MemType type) {
    LOOM_ASSIGN_OR_RETURN(Device::Registration * r, d.acquire(data, size, type == MemType::kCuda));
    return static_cast<MemHandle>(r);
  }
  static Result<MemHandle> registerDmaBuf(Device& d, void* data, size_t size, MemType type,
                                          uint64_t offset, int fd) {
    if (type != MemType::kCuda || fd < 0) {
      return errorf(Code::kInvalidUsage, "net/ib: %s: dma-buf registration of %s (fd %d)",
                    d.name.c_str(), type == MemType::kCuda ? "GPU memory" : "host memory", fd);
    }
    LOOM_ASSIGN_OR_RETURN(Device::Registration * r, d.acquire(data, size, true, fd, offset));
    return static_cast<MemHandle>(r);
  }

 private:
  Status progress() {
    return link_->poll([&](const ibv_wc& wc) -> Status {
      if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {  // a clear-to-send entry arrived
        ++ctsArrived_;
        if (ctsArrived_ - ctsReposted_ < static_cast<uint64_t>(kCtsBatch)) return Status::ok();
        ctsReposted_ += kCtsBatch;
        return link_->qps().postRecvs(0, wrId(ctsReposted_, 0), kCtsBatch,
                                      link_->port().device->name);
      }
      IbRequest& r = reqs_[wrSeq(wc.wr_id) % kMaxRequests];
      if (r.pending > 0) --r.pending;
      return Status::ok();
    });
  }

  std::unique_ptr<Link> link_;
  std::unique_ptr<CtsEntry[]> fifo_;  // written by the receiver's NIC
  Device::Registration* fifoReg_;
  IbRequest reqs_[kMaxRequests];
  uint64_t posted_ = 0, done_ = 0, ctsArrived_ = 0;
  uint64_t ctsReposted_ = 0;  // clear-to-send receives posted again (kCtsBatch at a time)
};

// The receiving side.
class IbRecv final : public RecvComm {
 public:
  IbRecv(std::unique_ptr<Link> link, uint64_t ctsAddr, uint32_t ctsRkey)
      : link_(std::move(link)), ctsAddr_(ctsAddr), ctsRkey_(ctsRkey) {}
  ~IbRecv() override {
    std::shared_ptr<Device> keep = link_->port().device;  // the link may hold the last
    Device& d = *keep;
    link_.reset();
    for (auto& r : reqs_)
      if (r.ownReg) d.release(r.ownReg);
    if (stageReg_) d.release(stageReg_);
  }

  Result<MemHandle> regMr(void* data, size_t size, MemType type) override {
    return IbSend::registerMemory(*link_->port().device, data, size, type);
  }
  Result<MemHandle> regMrDmaBuf(void* data, size_t size, MemType type, uint64_t offset,
                                int fd) override {
    return IbSend::registerDmaBuf(*link_->port().device, data, size, type, offset, fd);
  }
  Status deregMr(MemHandle mh) override {
    if (mh) link_->port().device->release(static_cast<Device::Registration*>(mh));
    return Status::ok();
  }

  Status irecv(int n, void** data, const size_t* sizes, const int* tags, const MemHandle* mh,
               Request** request) override {
    *request = nullptr;
    if (n != 1) {
      return errorf(Code::kInternalError, "net/ib: irecv of %d buffers (it takes 1)", n);
    }
    // A slot of the FIFO per request, and room in the send queue for its clear-to-send
    // write (whose acknowledgement may come after the data it asked for). The completion
    // queue only where neither is free (the tests poll it for every message anyway).
    auto full = [&] {
      return posted_ - done_ >= static_cast<uint64_t>(kMaxRequests) || ctsInFlight_ >= kMaxRequests;
    };
    LOOM_TRY(full() ? progress() : link_->error());
    if (full()) return link_->checkPeer();
    IbRequest& r = reqs_[posted_ % kMaxRequests];
    r = IbRequest{};
    r.seq = posted_;
    Qps& q = link_->qps();
    const bool inlineCts = q.maxInline >= static_cast<int>(sizeof(CtsEntry));
    if (!inlineCts && !stageReg_) {
      LOOM_ASSIGN_OR_RETURN(stageReg_, link_->port().device->acquire(stage_, sizeof(stage_)));
    }
    auto* reg = static_cast<Device::Registration*>(mh[0]);
    if (!reg) {
      LOOM_ASSIGN_OR_RETURN(reg, link_->port().device->acquire(data[0], sizes[0]));
      r.ownReg = reg;
    }
    // From here on a failure leaves receives posted: it ends the connection.
    const int nq = static_cast<int>(q.qps.size());
    for (int k = 0; k < nq; ++k) {
      LOOM_TRY(link_->fail(q.postRecv(k, wrId(r.seq, k), link_->port().device->name)));
    }
    r.pending = nq;
    // The clear-to-send entry, into the sender's FIFO slot for this sequence number.
    CtsEntry& e = stage_[posted_ % kMaxRequests];
    e.addr = reinterpret_cast<uintptr_t>(data[0]);
    e.size = sizes[0];
    e.seq = posted_;
    e.rkey = reg->mr->rkey;
    e.tag = tags ? tags[0] : 0;
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(&e);
    sge.length = sizeof(e);
    ibv_send_wr wr{};
    wr.wr_id = wrId(r.seq, 0);
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (inlineCts) {
      wr.send_flags |= IBV_SEND_INLINE;
    } else {
      sge.lkey = stageReg_->mr->lkey;
    }
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.imm_data = htonl(static_cast<uint32_t>(r.seq));
    wr.wr.rdma.remote_addr = ctsAddr_ + (posted_ % kMaxRequests) * sizeof(CtsEntry);
    wr.wr.rdma.rkey = ctsRkey_;
    ibv_send_wr* bad = nullptr;
    if (int err = link_->port().device->v->postSend(q.qps[0], &wr, &bad)) {
      return link_->fail(sysError(err, "net/ib: %s: ibv_post_send to %s",
                                  link_->port().device->name.c_str(), link_->peer().c_str()));
    }
    ++ctsInFlight_;
    ++posted_;
    *request = reinterpret_cast<Request*>(&r);
    return Status::ok();
  }

  Status test(Request* request, bool* done, size_t* sizes) override {
    *done = false;
    LOOM_TRY(progress());
    auto* r = reinterpret_cast<IbRequest*>(request);
    if (r->pending > 0) return link_->checkPeer();
    if (r->tooBig) {
      return link_->fail(errorf(Code::kInvalidUsage,
                                "net/ib: %s sent a message larger than this rank's receive "
                                "(every rank must make the same calls)",
                                link_->peer().c_str()));
    }
    if (r->seq != done_) {
      return errorf(Code::kInternalError, "net/ib: receive requests tested out of order");
    }
    *done = true;
    sizes[0] = r->size;
    if (r->ownReg) {
      link_->port().device->release(r->ownReg);
      r->ownReg = nullptr;
    }
    ++done_;
    return Status::ok();
  }

  void shutdown() override { link_->shutdown(); }

 private:
  Status progress() {
    return link_->poll([&](const ibv_wc& wc) -> Status {
      if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM) {  // a clear-to-send write went out
        if (ctsInFlight_ > 0) --ctsInFlight_;
        return Status::ok();
      }
      IbRequest& r = reqs_[wrSeq(wc.wr_id) % kMaxRequests];
      const uint32_t imm = ntohl(wc.imm_data);
      if (imm == kTooBig) {
        r.tooBig = true;
      } else {
        r.size += imm;
      }
      if (r.pending > 0) --r.pending;
      return Status::ok();
    });
  }

  std::unique_ptr<Link> link_;
  uint64_t ctsAddr_;
  uint32_t ctsRkey_;
  CtsEntry stage_[kMaxRequests] = {};
  Device::Registration* stageReg_ = nullptr;
  IbRequest reqs_[kMaxRequests];
  uint64_t posted_ = 0, done_ = 0;
  int ctsInFlight_ = 0;  // clear-to-send writes not yet acknowledged
};

Tuning tuningFromSettings() {
  Tuning t;
  t.nqps = static_cast<int>(
      std::clamp<int64_t>(settings::get(settings::kIbQpsPerConnection), 1, kMaxQps));
  t.timeout = static_cast<int>(std::clamp<int64_t>(settings::get(settings::kIbTimeout), 0, 31));
  t.retryCnt = static_cast<int>(std::clamp<int64_t>(settings::get(settings::kIbRetryCnt), 0, 7));
  t.tc = static_cast<int>(std::clamp<int64_t>(settings::get(settings::kIbTc), 0, 255));
  t.sl = static_cast<int>(std::clamp<int64_t>(settings::get(settings::kIbSl), 0, 15));
  return t;
}

// The sender between connect() calls.
struct ConnectStage {
  std::unique_ptr<Link> link;
  std::unique_ptr<CtsEntry[]> fifo;
  Device::Registration* fifoReg = nullptr;
  Socket sock;
  bool connected = false;
  size_t sent = 0;  // bytes of the hello
  QpInfo reply{};
  size_t got = 0;  // bytes of the reply
  Clock::time_point retryAt{};
  Clock::time_point deadline;

  ~ConnectStage() {
    if (fifoReg) {
      std::shared_ptr<Device> keep = link->port().device;
      Device& d = *keep;
      link.reset();
      d.release(fifoReg);
    }
  }
};

class IbListen final : public ListenComm {
 public:
  IbListen(const Context& ctx, const Port& port, const Tuning& t, Socket listener, uint64_t nonce)
      : ctx_(ctx),
        port_(port),
        tuning_(t),
        listener_(std::move(listener)),
        nonce_(nonce),
        arrivals_(&listener_, sizeof(Hello), ctx.handshakeMs, "net/ib") {}

  Status accept(std::unique_ptr<RecvComm>* comm) override {
    *comm = nullptr;
    if (!link_) {
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
        return Status::ok();
      }
      auto link = std::make_unique<Link>(port_, h.rank);
      LOOM_TRY(link->qps().create(port_, tuning_.nqps));
      LOOM_TRY(link->qps().connectTo(port_, h.info, tuning_, link->peer()));
      QpInfo mine;
      link->qps().describe(port_, &mine);
      // A few dozen bytes into an empty socket buffer: they go at once or it is broken.
      LOOM_TRY(a->sock.sendAll(&mine, sizeof(mine), Deadline::afterMs(ctx_.handshakeMs),
                               link->peer().c_str()));
      ctsAddr_ = h.info.ctsAddr;
      ctsRkey_ = h.info.ctsRkey;
      sock_ = std::move(a->sock);
      link_ = std::move(link);
      readyBy_ = Clock::now() + std::chrono::milliseconds(ctx_.handshakeMs);
    }
    // Writes may go to the sender once it says its queue pairs take them.
    char byte = 0;
    ssize_t n = ::recv(sock_.fd(), &byte, 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (Clock::now() > readyBy_) {
        return errorf(Code::kRemoteError, "net/ib: %s did not finish connecting within %lld ms",
                      link_->peer().c_str(), (long long)ctx_.handshakeMs);
      }
      return Status::ok();
    }
    if (n != 1 || byte != kReadyByte) {
      return errorf(Code::kRemoteError, "net/ib: %s closed the connection while making it",
                    link_->peer().c_str());
    }
    link_->setSocket(std::move(sock_));
    *comm = std::make_unique<IbRecv>(std::move(link_), ctsAddr_, ctsRkey_);
    return Status::ok();
  }

 private:
  Context ctx_;
  Port port_;
  Tuning tuning_;
  Socket listener_;
  uint64_t nonce_;
  Arrivals arrivals_;
  std::unique_ptr<Link> link_;  // accepted, waiting for the sender's ready
  Socket sock_;
  uint64_t ctsAddr_ = 0;
  uint32_t ctsRkey_ = 0;
  Clock::time_point readyBy_{};
};

ibv_mtu mtuOf(int code) {
  return code >= IBV_MTU_256 && code <= IBV_MTU_4096 ? static_cast<ibv_mtu>(code) : IBV_MTU_1024;
}

class IbBackend final : public Backend {
 public:
  IbBackend(const Context& ctx, std::vector<Port> ports, SocketAddress oob)
      : ctx_(ctx),
        ports_(std::move(ports)),
        oob_(oob),
        tuning_(tuningFromSettings()),
        rng_(seed()) {}
  ~IbBackend() override {
    for (ConnectStage* s : stages_) delete s;
  }

  const char* name() const override { return "ib"; }
  int devices() const override { return static_cast<int>(ports_.size()); }

  Status properties(int dev, Properties* p) const override {
    LOOM_TRY(checkDev(dev));
    const Port& port = ports_[dev];
    *p = Properties{};
    p->name = port.device->name;
    p->pciPath = port.pciPath;
    p->guid = port.device->attr.node_guid;
    // GPU memory as NCCL's IB transport says it: CUDA where nvidia_peermem lets ibv_reg_mr
    // take a GPU address (or the emulation stands in for it), DMABUF where the provider
    // registers dma-buf.
    const bool emulatedGdr = port.device->v->emulatedGdr;
    p->ptrSupport =
        kPtrHost | (emulatedGdr || peerMemLoaded() ? kPtrCuda : 0) | (port.dmaBuf ? kPtrDmaBuf : 0);
    p->nearEveryGpu = emulatedGdr;
    p->speedMbps = port.speedMbps;
    p->latencyUs = 0;
    p->rdma = true;
    p->dmaBufRegistration = port.dmaBuf;
    p->dmaBufWhy = port.dmaBufWhy;
    p->port = port.port;
    p->maxComms = std::max(1, port.device->attr.max_qp / std::max(1, tuning_.nqps));
    p->maxRecvs = 1;
    return Status::ok();
  }

  Status listen(int dev, Handle* handle, std::unique_ptr<ListenComm>* listenComm) override {
    LOOM_TRY(checkDev(dev));
    SocketAddress addr = oob_;
    addr.setPort(0);
    LOOM_ASSIGN_OR_RETURN(Socket listener, Socket::listen(addr));
    IbHandle h{};
    h.magic = kHandleMagic;
    LOOM_ASSIGN_OR_RETURN(h.address, listener.localAddress());
    {
      std::lock_guard<std::mutex> lock(rngMutex_);
      h.nonce = rng_();
    }
    h.rank = ctx_.rank;
    h.nqps = tuning_.nqps;
    *handle = Handle{};
    std::memcpy(handle->data, &h, sizeof(h));
    *listenComm =
        std::make_unique<IbListen>(ctx_, ports_[dev], tuning_, std::move(listener), h.nonce);
    return Status::ok();
  }

  void cancelConnect(Handle* handle) override {
    IbHandle h;
    std::memcpy(&h, handle->data, sizeof(h));
    if (h.magic != kHandleMagic) return;
    dropStage(h.stage);
    h.stage = nullptr;
    std::memcpy(handle->data, &h, sizeof(h));
  }

  Status connect(int dev, Handle* handle, int peerRank, std::unique_ptr<SendComm>* comm) override {
    *comm = nullptr;
    LOOM_TRY(checkDev(dev));
    IbHandle h;
    std::memcpy(&h, handle->data, sizeof(h));
    if (h.magic != kHandleMagic || !h.address.valid()) {
      return errorf(Code::kRemoteError, "net/ib: %s sent a malformed connection handle",
                    peerName(peerRank).c_str());
    }
    if (!ownStage(h.stage)) {  // as the peer sent it (whatever the field holds)
      h.stage = nullptr;
      auto stage = std::make_unique<ConnectStage>();
      stage->deadline =
          Clock::now() + std::chrono::milliseconds(settings::get(settings::kTimeoutMs));
      LOOM_TRY(prepare(ports_[dev], peerRank, stage.get()));
      h.stage = stage.release();
      {
        std::lock_guard<std::mutex> lock(stagesMutex_);
        stages_.push_back(h.stage);
      }
      std::memcpy(handle->data, &h, sizeof(h));
    }
    Status st = advance(h, peerRank, comm);
    if (!st || *comm) {
      dropStage(h.stage);
      h.stage = nullptr;
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

  bool ownStage(ConnectStage* s) {
    std::lock_guard<std::mutex> lock(stagesMutex_);
    return s && std::find(stages_.begin(), stages_.end(), s) != stages_.end();
  }
  void dropStage(ConnectStage* s) {
    {
      std::lock_guard<std::mutex> lock(stagesMutex_);
      auto it = std::find(stages_.begin(), stages_.end(), s);
      if (it == stages_.end()) return;
      stages_.erase(it);
    }
    delete s;
  }

  Status checkDev(int dev) const {
    if (dev < 0 || dev >= devices()) {
      return errorf(Code::kInternalError, "net/ib: no device %d (%d devices)", dev, devices());
    }
    return Status::ok();
  }

  // The sender's queue pairs (INIT, receives posted for clear-to-send) and its FIFO.
  Status prepare(const Port& port, int peerRank, ConnectStage* s) {
    s->link = std::make_unique<Link>(port, peerRank);
    LOOM_TRY(s->link->qps().create(port, tuning_.nqps));
    s->fifo = std::make_unique<CtsEntry[]>(kMaxRequests);
    std::memset(s->fifo.get(), 0xff, sizeof(CtsEntry) * kMaxRequests);
    LOOM_ASSIGN_OR_RETURN(s->fifoReg,
                          port.device->acquire(s->fifo.get(), sizeof(CtsEntry) * kMaxRequests));
    // Every entry the receiver may have in flight, and a batch more: the sender posts
    // consumed ones again only a batch at a time.
    LOOM_TRY(s->link->qps().postRecvs(0, wrId(0, 0), kMaxRequests + kCtsBatch, port.device->name));
    return Status::ok();
  }

  Status advance(const IbHandle& h, int peerRank, std::unique_ptr<SendComm>* comm) {
    ConnectStage& s = *h.stage;
    const std::string what = peerName(peerRank) + " at " + h.address.toString();
    const auto now = Clock::now();
    if (ctx_.abortFlag && ctx_.abortFlag->load()) {
      return errorf(Code::kSystemError, "net/ib: connecting to %s: aborted", what.c_str());
    }
    if (now > s.deadline) {
      return errorf(Code::kRemoteError, "net/ib: connecting to %s timed out (LOOM_TIMEOUT_MS)",
                    what.c_str());
    }
    if (!s.sock.isOpen()) {
      if (now < s.retryAt) return Status::ok();
      int fd = ::socket(h.address.u.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) return sysError(errno, "net/ib: socket()");
      s.sock = Socket(fd);
      s.sock.setNoDelay();
      if (::connect(fd, &h.address.u.sa, h.address.length()) != 0 && errno != EINPROGRESS) {
        return retryOrFail(s, errno, what, now);
      }
    }
    if (!s.connected) {
      pollfd pfd{s.sock.fd(), POLLOUT, 0};
      if (::poll(&pfd, 1, 0) <= 0) return Status::ok();
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(s.sock.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return retryOrFail(s, err, what, now);
      s.connected = true;
    }
    if (s.sent < sizeof(Hello)) {
      Hello hello{};
      hello.magic = kHelloMagic;
      hello.commHash = ctx_.commHash;
      hello.nonce = h.nonce;
      hello.rank = ctx_.rank;
      s.link->qps().describe(s.link->port(), &hello.info);
      hello.info.ctsAddr = reinterpret_cast<uintptr_t>(s.fifo.get());
      hello.info.ctsRkey = s.fifoReg->mr->rkey;
      LOOM_ASSIGN_OR_RETURN(size_t n,
                            s.sock.sendSome(reinterpret_cast<const char*>(&hello) + s.sent,
                                            sizeof(Hello) - s.sent, what.c_str()));
      s.sent += n;
      if (s.sent < sizeof(Hello)) return Status::ok();
    }
    if (s.got < sizeof(QpInfo)) {
      LOOM_ASSIGN_OR_RETURN(size_t n, s.sock.recvSome(reinterpret_cast<char*>(&s.reply) + s.got,
                                                      sizeof(QpInfo) - s.got, what.c_str()));
      s.got += n;
      if (s.got < sizeof(QpInfo)) return Status::ok();
      LOOM_TRY(s.link->qps().connectTo(s.link->port(), s.reply, tuning_, s.link->peer()));
      const char ready = kReadyByte;
      LOOM_TRY(s.sock.sendAll(&ready, 1, Deadline::afterMs(ctx_.handshakeMs), what.c_str()));
    }
    s.link->setSocket(std::move(s.sock));
    *comm = std::make_unique<IbSend>(std::move(s.link), std::move(s.fifo),
                                     std::exchange(s.fifoReg, nullptr));
    return Status::ok();
  }

  static Status retryOrFail(ConnectStage& s, int err, const std::string& what,
                            Clock::time_point now) {
    s.sock.close();
    s.connected = false;
    if (err == ECONNREFUSED) {  // its listener was open before the handle was sent: gone
      return errorf(Code::kRemoteError,
                    "net/ib: connecting to %s: refused (nothing listens there any more: did "
                    "that rank exit or abort?)",
                    what.c_str());
    }
    if (err != ETIMEDOUT && err != EAGAIN && err != EHOSTUNREACH && err != ENETUNREACH) {
      return Status(Code::kRemoteError,
                    sysError(err, "net/ib: connecting to %s", what.c_str()).message());
    }
    s.retryAt = now + std::chrono::milliseconds(10);
    return Status::ok();
  }

  Context ctx_;
  std::vector<Port> ports_;
  SocketAddress oob_;  // where listeners listen (the first interface LOOM_SOCKET_IFNAME keeps)
  Tuning tuning_;
  std::mutex rngMutex_;
  std::mt19937_64 rng_;
  std::mutex stagesMutex_;
  std::vector<ConnectStage*> stages_;  // made by connect() and not yet finished
};

// The device's place in sysfs (/sys/devices/pci.../0000:17:00.0), "" off PCI.
std::string sysfsPci(const std::string& device) {
  char real[PATH_MAX];
  const std::string path = "/sys/class/infiniband/" + device + "/device";
  return ::realpath(path.c_str(), real) ? std::string(real) : std::string();
}

// The GID table of a port through the verbs.
std::vector<Gid> gidTable(const Verbs& v, ibv_context* ctx, int port, int length) {
  std::vector<Gid> table;
  for (int i = 0; i < length && i < 256; ++i) {
    ibv_gid_entry e{};
    if (v.queryGidEx(ctx, port, i, &e) != 0) continue;
    Gid g;
    g.index = i;
    std::memcpy(g.raw, e.gid.raw, 16);
    bool zero = true;
    for (unsigned char b : g.raw) zero = zero && b == 0;
    if (zero) continue;
    g.type = e.gid_type == IBV_GID_TYPE_ROCE_V2   ? Gid::Type::kRoceV2
             : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? Gid::Type::kRoceV1
                                                  : Gid::Type::kIb;
    char name[IF_NAMESIZE] = {};
    if (e.ndev_ifindex && if_indextoname(e.ndev_ifindex, name)) g.netdev = name;
    table.push_back(g);
  }
  return table;
}

// Whether the provider registers dma-buf, as NCCL asks: a registration of fd -1, which a
// provider that knows dma-buf refuses for the descriptor and one that does not with
// EOPNOTSUPP or EPROTONOSUPPORT. `why` says why not.
bool probeDmaBuf(const Verbs& v, ibv_pd* pd, std::string* why) {
  if (!v.regDmabufMr) {
    *why = "libibverbs has no ibv_reg_dmabuf_mr (rdma-core older than 34)";
    return false;
  }
  errno = 0;
  if (ibv_mr* mr = v.regDmabufMr(pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE)) {
    v.deregMr(mr);
    return true;
  }
  const int err = errno;
  if (err == EOPNOTSUPP || err == EPROTONOSUPPORT) {
    *why = std::string("the verbs provider does not register dma-buf (") + strerror(err) + ")";
    return false;
  }
  return true;
}

// Every port of every device, and the usable ones as `usable`.
Result<std::vector<PortReport>> scanPorts(const Verbs& v, std::vector<Port>* usable) {
  std::vector<PortReport> reports;
  const std::string hcaText = settings::get(settings::kIbHca);
  const HcaFilter filter = HcaFilter::parse(hcaText);
  const GidRule gidRule = GidRule::fromSettings();
  int n = 0;
  ibv_device** list = v.getDeviceList(&n);
  if (!list) {
    const int err = errno;
    if (err == ENOSYS || err == ENODEV || err == ENOENT) {
      return errorf(Code::kSystemError,
                    "net/ib: no RDMA devices: this kernel has no RDMA support loaded "
                    "(ibv_get_device_list: %s)",
                    strerror(err));
    }
    return sysError(err, "net/ib: ibv_get_device_list (%s)", v.provider);
  }
  for (int i = 0; i < n; ++i) {
    const std::string name = v.getDeviceName(list[i]);
    auto dev = std::make_shared<Device>();
    dev->v = &v;
    dev->name = name;
    dev->ctx = v.openDevice(list[i]);
    if (!dev->ctx) {
      PortReport r;
      r.device = name;
      r.usable = false;
      r.why = std::string("cannot be opened: ") + strerror(errno);
      reports.push_back(r);
      continue;
    }
    if (v.queryDevice(dev->ctx, &dev->attr) != 0) {
      PortReport r;
      r.device = name;
      r.why = "ibv_query_device failed";
      reports.push_back(r);
      continue;
    }
    for (int p = 1; p <= dev->attr.phys_port_cnt; ++p) {
      PortReport r;
      r.device = name;
      r.port = p;
      ibv_port_attr pa{};
      if (v.queryPort(dev->ctx, static_cast<uint8_t>(p), &pa) != 0) {
        r.why = "ibv_query_port failed";
        reports.push_back(r);
        continue;
      }
      r.infiniband = pa.link_layer != IBV_LINK_LAYER_ETHERNET;
      r.speedMbps = portSpeedMbps(pa.active_width, pa.active_speed);
      if (!filter.matches(name, p)) {
        r.why = "left out by LOOM_IB_HCA=" + hcaText;
      } else if (pa.state != IBV_PORT_ACTIVE) {
        r.why = std::string("port not ACTIVE (") +
                (pa.state == IBV_PORT_DOWN   ? "DOWN: no link"
                 : pa.state == IBV_PORT_INIT ? "INIT: no subnet manager?"
                                             : "state " + std::to_string(pa.state)) +
                ")";
      } else if (r.infiniband && pa.lid == 0) {
        r.why = "InfiniBand port without a LID (is the subnet manager running?)";
      } else {
        const std::string where = name + " port " + std::to_string(p);
        const std::vector<Gid> table = gidTable(v, dev->ctx, p, pa.gid_tbl_len);
        GidChoice g = chooseGid(table, r.infiniband, gidRule, where);
        if (g.index < 0) {
          r.why = g.why;
        } else {
          Port port;
          port.device = dev;
          port.port = p;
          port.infiniband = r.infiniband;
          port.speedMbps = r.speedMbps;
          port.lid = pa.lid;
          port.gidIndex = g.index;
          ibv_gid_entry e{};
          v.queryGidEx(dev->ctx, p, g.index, &e);
          port.gid = e.gid;
          port.mtu = mtuOf(pa.active_mtu);
          port.pciPath = sysfsPci(name);
          port.gidWhy = g.why;
          port.gidUsual = g.usual;
          r.usable = true;
          r.gidIndex = g.index;
          Gid shown;
          std::memcpy(shown.raw, e.gid.raw, 16);
          r.gid = shown.text();
          r.why = g.why;
          if (usable) usable->push_back(port);
        }
      }
      reports.push_back(r);
    }
    if (!dev->pd) dev->pd = v.allocPd(dev->ctx);
    if (dev->pd) {
      std::string why;
      const bool dmaBuf = probeDmaBuf(v, dev->pd, &why);
      const std::string pci = sysfsPci(name);
      for (auto& r : reports) {
        if (r.device != name) continue;
        r.pciPath = pci;
        r.dmaBuf = dmaBuf;
        r.dmaBufWhy = why;
        r.nearEveryGpu = v.emulatedGdr;
      }
      if (usable) {
        for (Port& q : *usable) {
          if (q.device != dev) continue;
          q.dmaBuf = dmaBuf;
          q.dmaBufWhy = why;
        }
      }
    }
    if (!dev->pd) {
      for (auto& r : reports)
        if (r.device == name && r.usable) {
          r.usable = false;
          r.why = "ibv_alloc_pd failed";
        }
      if (usable) {
        usable->erase(std::remove_if(usable->begin(), usable->end(),
                                     [&](const Port& q) { return q.device == dev; }),
                      usable->end());
      }
    }
  }
  v.freeDeviceList(list);
  return reports;
}

}  // namespace

Result<std::vector<PortReport>> describePorts() {
  LOOM_ASSIGN_OR_RETURN(const Verbs* v, activeVerbs());
  return scanPorts(*v, nullptr);
}

Result<std::unique_ptr<Backend>> makeIbBackend(const Context& ctx) {
  LOOM_ASSIGN_OR_RETURN(const Verbs* v, activeVerbs());
  std::vector<Port> ports;
  LOOM_ASSIGN_OR_RETURN(std::vector<PortReport> reports, scanPorts(*v, &ports));
  if (ports.empty()) {
    std::string seen;
    for (const PortReport& r : reports) {
      seen += (seen.empty() ? "" : "; ") + r.device +
              (r.port ? " port " + std::to_string(r.port) : "") + ": " + r.why;
    }
    return errorf(Code::kSystemError, "net/ib: no usable RDMA port (%s)",
                  seen.empty() ? "libibverbs finds no RDMA device" : seen.c_str());
  }
  // The handshake's TCP listeners go where sockets would (LOOM_SOCKET_IFNAME).
  LOOM_ASSIGN_OR_RETURN(auto ifs, findInterfacesFromSettings());
  for (const Port& p : ports) {
    const char* emulated =
        v->provider == std::string("libibverbs.so.1") ? "" : " [emulated device]";
    // A GID the rule did not ask for is the first thing to look at when RoCE peers cannot
    // reach each other.
    if (!p.gidUsual) {
      LOOM_WARN(kNet, "net/ib: %s port %d (RoCE, %d Gb/s), %s%s", p.device->name.c_str(), p.port,
                p.speedMbps / 1000, p.gidWhy.c_str(), emulated);
    } else {
      LOOM_INFO(kNet, "net/ib: %s port %d (%s, %d Gb/s), %s%s", p.device->name.c_str(), p.port,
                p.infiniband ? "InfiniBand" : "RoCE", p.speedMbps / 1000, p.gidWhy.c_str(),
                emulated);
    }
  }
  LOOM_INFO(kNet, "net/ib: %zu port(s), %d queue pair(s) per connection, handshakes over %s (%s)",
            ports.size(), tuningFromSettings().nqps, ifs.front().name.c_str(),
            ifs.front().address.toString().c_str());
  return std::unique_ptr<Backend>(new IbBackend(ctx, std::move(ports), ifs.front().address));
}

}  // namespace loom::transport::net::ib
