// The emulated RDMA provider (emulator.h): rdma-core's structs, a registry of memory
// registrations, and one thread per opened context standing in for the NIC.
//
// Objects. Each object the table hands out is one of ours whose first member is the
// rdma-core struct (EmuContext starts with ibv_context, EmuQp with ibv_qp, ...); the
// structs are standard-layout (asserted), so the pointers convert both ways, and the public
// fields the backend reads are filled.
//
// Wire. A queue pair owns an AF_UNIX SOCK_DGRAM socket bound at <dir>/<address>.<qpn>,
// <address> being the port's first GID in hex (RoCE; a symlink for each further GID of the
// port, so whichever GID the peer was given reaches it) or "lid<lid>" (InfiniBand). It
// connects to its peer's path, computed from the RTR address, at its first transmission.
// Data travels as datagrams of at most 64 KiB of payload behind a Packet header; the
// responder answers with cumulative ACKs and with NAKs. Datagrams between two Unix sockets
// are neither lost nor reordered, so the only losses are sends to a socket that is gone (a
// dead peer), and retransmission (after a timeout or an RNR NAK) is go-back-N from the
// oldest work request not acknowledged. Sequence numbers count work requests, not packets
// (packets within one are told apart by offset), starting at sq_psn / rq_psn.
//
// Threads. The app's calls and the NIC thread share each QP under its mutex (state, ring
// indexes, attributes) and each CQ under its own; the order is QP mutex, then CQ mutex.
// A send entry is written under the QP mutex before sendTail moves past it, and the NIC
// reads it after reading sendTail under that mutex; the app reuses the slot only after the
// NIC moved sendHead past it, under the mutex again. So an entry, and the app's buffers it
// names, are read by the NIC only between post and completion, and the completion hands
// them back under the CQ mutex. NicQp belongs to the NIC thread alone. The MR registry has
// a shared_mutex: the NIC holds it shared while it touches registered memory, regMr and
// deregMr take it exclusive, so once deregMr returns no emulated access touches the memory.
#include "transports/net/ib/emulator.h"

#include <arpa/inet.h>
#include <endian.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string_view>
#include <system_error>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/cuda_probe.h"
#include "common/settings.h"

namespace loom::transport::net::ib {

namespace {

using Clock = std::chrono::steady_clock;

// Limits, as queryDevice reports them and the calls enforce them.
constexpr uint8_t kPortNum = 1;
constexpr int kMaxQp = 16384;
constexpr uint32_t kMaxQpWr = 8192;
constexpr int kMaxSge = 4;
constexpr int kMaxCq = 16384;
constexpr int kMaxCqe = 65536;
constexpr int kMaxMr = 65536;
constexpr int kMaxPd = 16384;
constexpr uint64_t kMaxMrSize = uint64_t{1} << 40;
constexpr uint32_t kMaxInline = 256;
constexpr uint64_t kMaxMessage = uint64_t{1} << 31;
constexpr int kMaxRdAtomic = 16;
constexpr uint32_t kPsnLimit = 1u << 24;
constexpr uint8_t kRnrInfinite = 7;  // rnr_retry 7: retry for ever

// The NIC thread's pace.
constexpr size_t kSegmentBytes = 64 * 1024;  // payload of one datagram
constexpr int kSocketBuffer = 4 << 20;       // asked of SO_SNDBUF/SO_RCVBUF (the kernel caps it)
constexpr int kBurst = 64;                   // datagrams per QP per turn, each way
constexpr auto kSpin = std::chrono::microseconds(50);  // polling on after activity, then sleep
// The RNR delays of min_rnr_timer's codes above 1 ms are shortened to 1 ms, so an emulated
// run does not stall on a receiver that is merely late.
constexpr auto kMaxRnrDelay = std::chrono::microseconds(1000);
constexpr int kSlots = 64;  // distinct configs (tables) per process

// ---------------------------------------------------------------------------------------
// Small helpers.

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

uint32_t randomU32() {
  uint32_t v = 0;
  if (getrandom(&v, sizeof v, 0) == static_cast<ssize_t>(sizeof v)) return v;
  static std::atomic<uint64_t> fallback{static_cast<uint64_t>(getpid()) << 32};
  const uint64_t t = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  return static_cast<uint32_t>(mix(fallback.fetch_add(0x9e3779b97f4a7c15ULL) ^ t));
}

// Who this host is: LOOM_HOST_ID (NCCL_HOSTID) when set, else the host name; processes of
// one host get the same GIDs and LID, as ports of one machine's NIC would.
std::string hostIdentity() {
  if (std::string id = settings::get(settings::kHostId); !id.empty()) return id;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

std::string hexOf(const uint8_t* raw, size_t n) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out += kDigits[raw[i] >> 4];
    out += kDigits[raw[i] & 15];
  }
  return out;
}

bool fillAddress(const std::string& path, sockaddr_un* addr, socklen_t* len) {
  if (path.size() >= sizeof addr->sun_path) return false;
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  std::memcpy(addr->sun_path, path.c_str(), path.size() + 1);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return true;
}

// 4.096 us * 2^code: the transport timeout of ibv_qp_attr::timeout (0: none).
std::chrono::nanoseconds transportTimeout(uint8_t code) {
  return std::chrono::nanoseconds(int64_t{4096} << code);
}

// The RNR NAK delay of a min_rnr_timer code (IB spec table 45), capped at kMaxRnrDelay.
std::chrono::microseconds rnrDelay(uint32_t code) {
  static const uint32_t kMicros[32] = {
      655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,   320,
      480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240, 15360,
      20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return std::min(std::chrono::microseconds(kMicros[code & 31]), kMaxRnrDelay);
}

// ---------------------------------------------------------------------------------------
// Objects.

struct Emulator;

struct EmuDevice {
  ibv_device base;  // first: the ibv_device* handed out points here
  Emulator* emu;
  int index;
};

struct Emulator {
  EmulatorConfig config;
  std::string dir;       // config.dir, or the default
  std::string provider;  // Verbs::provider
  std::vector<std::unique_ptr<EmuDevice>> devices;
  Verbs verbs;
};

struct EmuQp;

// A request to the NIC thread: it owns the list of QPs it serves, so adding, removing and
// resetting one goes through it.
struct NicRequest {
  enum Kind { kAdd, kRemove, kReset, kStop } kind;
  EmuQp* qp;
};

struct EmuContext {
  ibv_context base;
  EmuDevice* dev;
  Emulator* emu;
  bool infiniband;
  uint64_t guid;  // host order
  uint16_t lid;   // InfiniBand only
  std::vector<ibv_gid_entry> gids;
  std::vector<std::string> addresses;  // socket-name prefixes of this port; QPs bind the first
  std::atomic<int> pds;
  std::atomic<int> cqs;
  std::atomic<int> qps;

  int wakeFd;                   // eventfd: wakes the NIC thread from ppoll
  std::atomic<bool> sleeping;   // the NIC is about to sleep or sleeps
  std::atomic<bool> work;       // something was posted since the NIC last looked
  std::atomic<bool> requested;  // `pending` is not empty
  std::mutex mutex;
  std::condition_variable served;
  std::vector<NicRequest> pending;  // guarded by mutex
  uint64_t ticket;                  // guarded by mutex: requests made
  uint64_t done;                    // guarded by mutex: requests served

  std::thread nic;
  // The NIC thread's own.
  std::vector<EmuQp*> live;
  std::vector<char> rx;
  std::vector<pollfd> fds;
};

struct EmuPd {
  ibv_pd base;
  EmuContext* ctx;
  std::atomic<int> users;  // MRs and QPs
};

struct EmuMr {
  ibv_mr base;
  EmuPd* pd;
  int access;
  bool device;  // GPU memory (EmulatorConfig::gdr): reached through CUDA copies
};

// Bytes into or out of a registration: memcpy for host memory, a CUDA copy for GPU memory
// (what a NIC's DMA through GPUDirect RDMA does). False when the copy fails.
bool moveBytes(const EmuMr* mr, void* dst, const void* src, size_t n) {
  if (!mr->device) {
    std::memcpy(dst, src, n);
    return true;
  }
  return cuda::copyMemory(dst, src, n).isOk();
}

struct EmuCq {
  ibv_cq base;
  EmuContext* ctx;
  std::atomic<int> users;  // QPs
  std::mutex mutex;
  std::vector<ibv_wc> ring;  // guarded by mutex, as the three below
  size_t head;
  size_t count;
  bool overflowed;  // a completion found the queue full: the CQ is in error
};

struct SendEntry {
  uint64_t wrId;
  uint64_t remoteAddr;
  uint64_t length;  // bytes of the gather list
  uint32_t rkey;
  uint32_t imm;
  ibv_wr_opcode opcode;
  bool signaled;  // IBV_SEND_SIGNALED, or the QP's sq_sig_all
  bool isInline;
  int numSge;
  ibv_sge sge[kMaxSge];
  uint8_t* inlineData;  // this slot's kMaxInline bytes of EmuQp::inlineData
};

struct RecvEntry {
  uint64_t wrId;
  int numSge;
  ibv_sge sge[kMaxSge];
};

// What modifyQp sets; guarded by EmuQp::mutex.
struct QpAttrs {
  int access;
  uint8_t timeout, retryCnt, rnrRetry, minRnrTimer;
  uint32_t destQpn, rqPsn, sqPsn;
  sockaddr_un dest;  // the peer QP's socket
  socklen_t destLen;
  uint64_t generation;  // counts RTR transitions: the NIC restarts its state when it moves
};

enum class Nak : uint8_t { kNone, kRnr, kAccess, kInvalid, kOperation };

// The NIC thread's state of a QP.
struct NicQp {
  uint64_t generation;
  bool connected;    // the socket is connected to the peer's path
  bool unreachable;  // the last transmission found no peer: wait for the timer
  bool wantOut;      // blocked on a full peer: poll for POLLOUT
  // Requester. Sequence numbers here are ring positions; the wire adds sq_psn.
  uint64_t txSeq, txOffset;  // the next segment to transmit
  uint64_t sentUpTo;         // one past the last WR any of whose packets went out
  bool timerArmed;
  Clock::time_point deadline;
  int retries, rnrRetries;
  bool paused;  // after an RNR NAK, until resumeAt
  Clock::time_point resumeAt;
  bool localError;  // WR localErrorSeq has a bad local gather list
  uint64_t localErrorSeq;
  // Responder. Sequence numbers are the wire's.
  uint64_t expectSeq, expectOffset;
  bool ackPending;
  uint64_t ackSeq;
  Nak nak;  // kNone: no NAK pending
  uint64_t nakSeq;
  uint8_t nakTimer;
  RecvEntry current;  // the receive the message in progress lands in
};

struct EmuQp {
  ibv_qp base;
  EmuContext* ctx;
  EmuPd* pd;
  EmuCq* sendCq;
  EmuCq* recvCq;
  int fd;
  std::vector<std::string> paths;  // bound path, then its aliases
  uint32_t maxSendWr, maxRecvWr, maxSendSge, maxRecvSge;
  bool sigAll;
  std::vector<SendEntry> sendRing;
  std::vector<uint8_t> inlineData;
  std::vector<RecvEntry> recvRing;

  std::mutex mutex;
  ibv_qp_state state;  // guarded, as all below; the NIC moves it to ERR
  uint64_t sendHead, sendTail, recvHead, recvTail;  // heads move on the NIC thread only
  QpAttrs attrs;

  NicQp nic;
};

static_assert(std::is_standard_layout_v<EmuDevice> && std::is_standard_layout_v<EmuContext> &&
                  std::is_standard_layout_v<EmuPd> && std::is_standard_layout_v<EmuMr> &&
                  std::is_standard_layout_v<EmuCq> && std::is_standard_layout_v<EmuQp>,
              "the rdma-core struct must sit at the start of each object");

EmuContext* asContext(ibv_context* c) {
  return reinterpret_cast<EmuContext*>(c);
}
EmuPd* asPd(ibv_pd* p) {
  return reinterpret_cast<EmuPd*>(p);
}
EmuMr* asMr(ibv_mr* m) {
  return reinterpret_cast<EmuMr*>(m);
}
EmuCq* asCq(ibv_cq* c) {
  return reinterpret_cast<EmuCq*>(c);
}
EmuQp* asQp(ibv_qp* q) {
  return reinterpret_cast<EmuQp*>(q);
}

SendEntry& sendSlot(EmuQp* qp, uint64_t seq) {
  return qp->sendRing[seq % qp->sendRing.size()];
}
RecvEntry& recvSlot(EmuQp* qp, uint64_t seq) {
  return qp->recvRing[seq % qp->recvRing.size()];
}

// ---------------------------------------------------------------------------------------
// The registry of this process's memory registrations, by lkey and by rkey.

class Registry {
 public:
  static Registry& instance() {
    static Registry* r = new Registry;  // lives for the process: NIC threads may outlive main
    return *r;
  }

  std::shared_mutex mutex;

  // With mutex held (shared or exclusive).
  const EmuMr* findLocal(uint32_t lkey) const {
    auto it = keys_.find(lkey);
    return it != keys_.end() && it->second->base.lkey == lkey ? it->second : nullptr;
  }
  const EmuMr* findRemote(uint32_t rkey) const {
    auto it = keys_.find(rkey);
    return it != keys_.end() && it->second->base.rkey == rkey ? it->second : nullptr;
  }

  // With mutex held exclusive. False when there are kMaxMr registrations already.
  bool add(EmuMr* mr) {
    if (count_ >= kMaxMr) return false;
    mr->base.lkey = freshKey();
    keys_[mr->base.lkey] = mr;
    mr->base.rkey = freshKey();
    keys_[mr->base.rkey] = mr;
    ++count_;
    return true;
  }
  void remove(EmuMr* mr) {
    keys_.erase(mr->base.lkey);
    keys_.erase(mr->base.rkey);
    --count_;
  }

 private:
  uint32_t freshKey() const {
    for (;;) {
      const uint32_t k = randomU32();
      if (k != 0 && !keys_.count(k)) return k;
    }
  }

  std::unordered_map<uint32_t, EmuMr*> keys_;
  int count_ = 0;
};

// Whether [addr, addr + len) lies inside the registration.
bool inside(const ibv_mr& mr, uint64_t addr, uint64_t len) {
  const uint64_t begin = reinterpret_cast<uintptr_t>(mr.addr);
  return addr >= begin && len <= mr.length && addr - begin <= mr.length - len;
}

// ---------------------------------------------------------------------------------------
// The wire.

constexpr uint32_t kMagic = 0x4c454d31;  // "LEM1"
enum Kind : uint8_t { kData = 1, kAck = 2, kNakKind = 3 };
enum : uint8_t { kFirst = 1, kLast = 2 };

struct Packet {
  uint32_t magic;
  uint8_t kind;
  uint8_t opcode;  // data: the ibv_wr_opcode
  uint8_t flags;   // data: kFirst | kLast
  uint8_t nak;     // NAK: the Nak
  uint32_t destQpn;
  uint32_t srcQpn;
  uint32_t rkey;      // data, writes
  uint32_t imm;       // data with immediate: as posted (network order)
  uint32_t rnrTimer;  // RNR NAK: the responder's min_rnr_timer code
  uint32_t reserved;
  uint64_t seq;          // data: the WR's sequence number; ACK/NAK: the one answered
  uint64_t remoteAddr;   // data, writes: where the WR's first byte goes
  uint64_t totalLength;  // data: the WR's bytes
  uint64_t offset;       // data: this segment's first byte within the WR
};
static_assert(sizeof(Packet) == 64);

enum class Outcome { kSent, kBlocked, kLost, kBadLocal };

// ---------------------------------------------------------------------------------------
// Completions.

void pushWc(EmuCq* cq, const ibv_wc& wc) {
  std::lock_guard<std::mutex> lock(cq->mutex);
  if (cq->overflowed) return;
  if (cq->count == cq->ring.size()) {
    cq->overflowed = true;
    return;
  }
  cq->ring[(cq->head + cq->count) % cq->ring.size()] = wc;
  ++cq->count;
}

void pushSendWc(EmuQp* qp, const SendEntry& e, ibv_wc_status status) {
  ibv_wc wc{};
  wc.wr_id = e.wrId;
  wc.status = status;
  const bool send = e.opcode == IBV_WR_SEND || e.opcode == IBV_WR_SEND_WITH_IMM;
  wc.opcode = send ? IBV_WC_SEND : IBV_WC_RDMA_WRITE;
  wc.qp_num = qp->base.qp_num;
  pushWc(qp->sendCq, wc);
}

void pushRecvWc(EmuQp* qp, uint64_t wrId, ibv_wc_status status) {
  ibv_wc wc{};
  wc.wr_id = wrId;
  wc.status = status;
  wc.opcode = IBV_WC_RECV;
  wc.qp_num = qp->base.qp_num;
  pushWc(qp->recvCq, wc);
}

// Completes every outstanding WR of both queues, the oldest of each with the given status
// when there is one and the others with WR_FLUSH_ERR (errors complete unsignaled WRs too).
// NIC thread, with qp->mutex held.
void flushLocked(EmuQp* qp, std::optional<ibv_wc_status> sendStatus,
                 std::optional<ibv_wc_status> recvStatus) {
  for (uint64_t seq = qp->sendHead; seq < qp->sendTail; ++seq) {
    const bool first = seq == qp->sendHead && sendStatus;
    pushSendWc(qp, sendSlot(qp, seq), first ? *sendStatus : IBV_WC_WR_FLUSH_ERR);
  }
  for (uint64_t seq = qp->recvHead; seq < qp->recvTail; ++seq) {
    const bool first = seq == qp->recvHead && recvStatus;
    pushRecvWc(qp, recvSlot(qp, seq).wrId, first ? *recvStatus : IBV_WC_WR_FLUSH_ERR);
  }
  qp->sendHead = qp->sendTail;
  qp->recvHead = qp->recvTail;
  NicQp& n = qp->nic;
  n.txSeq = n.sentUpTo = qp->sendTail;
  n.txOffset = 0;
  n.timerArmed = n.paused = n.localError = false;
}

// ---------------------------------------------------------------------------------------
// The NIC thread.

// What the NIC reads of a QP under its mutex once per turn.
struct Snapshot {
  ibv_qp_state state;
  uint64_t sendTail;
  int access;
  uint8_t timeout, retryCnt, rnrRetry, minRnrTimer;
  uint32_t destQpn;
  uint64_t sqPsn, rqPsn;
  uint64_t generation;
};

Snapshot snapshot(EmuQp* qp) {
  std::lock_guard<std::mutex> lock(qp->mutex);
  const QpAttrs& a = qp->attrs;
  return {qp->state,     qp->sendTail, a.access, a.timeout, a.retryCnt,  a.rnrRetry,
          a.minRnrTimer, a.destQpn,    a.sqPsn,  a.rqPsn,   a.generation};
}

// Moves the QP to ERR and flushes it (the NIC's own errors).
void failQp(EmuQp* qp, Snapshot& s, std::optional<ibv_wc_status> sendStatus,
            std::optional<ibv_wc_status> recvStatus) {
  std::lock_guard<std::mutex> lock(qp->mutex);
  qp->state = IBV_QPS_ERR;
  s.state = IBV_QPS_ERR;
  flushLocked(qp, sendStatus, recvStatus);
}

// After RTR: a new peer, the responder expecting rq_psn.
void restartConnection(EmuQp* qp, const Snapshot& s) {
  NicQp& n = qp->nic;
  const uint64_t head = qp->sendHead;  // the NIC is its only writer
  n = NicQp{};
  n.generation = s.generation;
  n.txSeq = n.sentUpTo = head;
  n.expectSeq = s.rqPsn;
}

bool ensureConnected(EmuQp* qp) {
  NicQp& n = qp->nic;
  if (n.connected) return true;
  sockaddr_un addr;
  socklen_t len;
  {
    std::lock_guard<std::mutex> lock(qp->mutex);
    addr = qp->attrs.dest;
    len = qp->attrs.destLen;
  }
  // ENOENT or ECONNREFUSED: no peer (yet, or any more); EPERM: its socket talks to another.
  if (len == 0 || ::connect(qp->fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) return false;
  n.connected = true;
  return true;
}

Outcome sendPacket(EmuQp* qp, iovec* iov, int count) {
  if (!ensureConnected(qp)) return Outcome::kLost;
  msghdr m{};
  m.msg_iov = iov;
  m.msg_iovlen = static_cast<size_t>(count);
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (::sendmsg(qp->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) return Outcome::kSent;
    if (errno == EINTR || errno == ECONNRESET) continue;  // ECONNRESET: a stale socket error
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
      qp->nic.wantOut = true;
      return Outcome::kBlocked;
    }
    break;
  }
  qp->nic.connected = false;  // ECONNREFUSED: the peer is gone (the kernel disconnected us)
  return Outcome::kLost;
}

void armTimer(NicQp& n, const Snapshot& s, Clock::time_point now) {
  if (n.timerArmed || s.timeout == 0) return;
  n.timerArmed = true;
  n.deadline = now + transportTimeout(s.timeout);
}

// Completes the send WRs before ring position `limit`, acknowledged by the responder.
void completeSends(EmuQp* qp, const Snapshot& s, uint64_t limit, Clock::time_point now) {
  NicQp& n = qp->nic;
  limit = std::min(limit, n.sentUpTo);
  if (limit <= qp->sendHead) return;
  {
    std::lock_guard<std::mutex> lock(qp->mutex);
    for (uint64_t seq = qp->sendHead; seq < limit; ++seq) {
      const SendEntry& e = sendSlot(qp, seq);
      if (e.signaled) pushSendWc(qp, e, IBV_WC_SUCCESS);
    }
    qp->sendHead = limit;
  }
  n.retries = n.rnrRetries = 0;
  if (n.txSeq < limit) {
    n.txSeq = limit;
    n.txOffset = 0;
  }
  n.timerArmed = false;  // restarted: progress was made
  if (limit < n.sentUpTo) armTimer(n, s, now);
}

void onAck(EmuQp* qp, const Snapshot& s, uint64_t wireSeq, Clock::time_point now) {
  if (wireSeq < s.sqPsn) return;
  completeSends(qp, s, wireSeq - s.sqPsn + 1, now);
}

void onNak(EmuQp* qp, Snapshot& s, const Packet& h, Clock::time_point now) {
  NicQp& n = qp->nic;
  if (h.seq < s.sqPsn) return;
  const uint64_t seq = h.seq - s.sqPsn;
  if (seq < qp->sendHead || seq >= n.sentUpTo) return;  // stale
  completeSends(qp, s, seq, now);                       // a NAK acknowledges what came before
  switch (static_cast<Nak>(h.nak)) {
    case Nak::kRnr:
      if (s.rnrRetry != kRnrInfinite && n.rnrRetries >= s.rnrRetry) {
        failQp(qp, s, IBV_WC_RNR_RETRY_EXC_ERR, std::nullopt);
        return;
      }
      ++n.rnrRetries;
      n.txSeq = seq;
      n.txOffset = 0;
      n.paused = true;
      n.resumeAt = now + rnrDelay(h.rnrTimer);
      n.timerArmed = n.unreachable = n.localError = false;
      return;
    case Nak::kAccess: failQp(qp, s, IBV_WC_REM_ACCESS_ERR, std::nullopt); return;
    case Nak::kInvalid: failQp(qp, s, IBV_WC_REM_INV_REQ_ERR, std::nullopt); return;
    case Nak::kOperation: failQp(qp, s, IBV_WC_REM_OP_ERR, std::nullopt); return;
    case Nak::kNone: return;
  }
}

// Responder: what to answer.
void ack(NicQp& n, uint64_t seq) {
  if (n.nak != Nak::kNone) return;  // the NAK acknowledges it
  n.ackPending = true;
  n.ackSeq = seq;
}
void nak(NicQp& n, uint64_t seq, Nak why, uint8_t timer) {
  n.nak = why;
  n.nakSeq = seq;
  n.nakTimer = timer;
  n.ackPending = false;
}

// The oldest posted receive, left posted (the last segment consumes it); false if none.
bool peekRecv(EmuQp* qp, RecvEntry* out) {
  std::lock_guard<std::mutex> lock(qp->mutex);
  if (qp->recvHead == qp->recvTail) return false;
  *out = recvSlot(qp, qp->recvHead);
  return true;
}

void completeRecv(EmuQp* qp, const Packet& h) {
  ibv_wc wc{};
  wc.status = IBV_WC_SUCCESS;
  const auto op = static_cast<ibv_wr_opcode>(h.opcode);
  wc.opcode = op == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
  // Hardware reports the write's length for RECV_RDMA_WITH_IMM too; so does the emulation.
  wc.byte_len = static_cast<uint32_t>(h.totalLength);
  if (op != IBV_WR_SEND) {
    wc.wc_flags = IBV_WC_WITH_IMM;
    wc.imm_data = h.imm;
  }
  wc.qp_num = qp->base.qp_num;
  std::lock_guard<std::mutex> lock(qp->mutex);
  wc.wr_id = recvSlot(qp, qp->recvHead).wrId;
  ++qp->recvHead;
  pushWc(qp->recvCq, wc);
}

uint64_t gatherLength(const RecvEntry& r) {
  uint64_t total = 0;
  for (int i = 0; i < r.numSge; ++i) total += r.sge[i].length;
  return total;
}

// A SEND's bytes [offset, offset + len) into the receive's scatter list, every element
// checked (lkey, local write, protection domain, range); false on a bad one.
bool scatter(const EmuQp* qp, const RecvEntry& r, uint64_t offset, const char* data, uint64_t len) {
  Registry& reg = Registry::instance();
  std::shared_lock<std::shared_mutex> lock(reg.mutex);
  uint64_t pos = 0;
  for (int i = 0; i < r.numSge; ++i) {
    const ibv_sge& g = r.sge[i];
    if (g.length == 0) continue;
    const EmuMr* mr = reg.findLocal(g.lkey);
    if (!mr || !(mr->access & IBV_ACCESS_LOCAL_WRITE) || mr->pd != qp->pd ||
        !inside(mr->base, g.addr, g.length)) {
      return false;
    }
    const uint64_t b = std::max(pos, offset), e = std::min(pos + g.length, offset + len);
    if (b < e &&
        !moveBytes(mr, reinterpret_cast<void*>(g.addr + (b - pos)), data + (b - offset), e - b)) {
      return false;
    }
    pos += g.length;
  }
  return true;
}

// A write segment into place after the responder's checks: the rkey names a registration
// of this QP's protection domain that allows remote writes (as must the QP) and holds the
// WR's whole range.
bool placeWrite(const EmuQp* qp, const Snapshot& s, const Packet& h, const char* data,
                uint64_t len) {
  if (!(s.access & IBV_ACCESS_REMOTE_WRITE)) return false;
  Registry& reg = Registry::instance();
  std::shared_lock<std::shared_mutex> lock(reg.mutex);
  const EmuMr* mr = reg.findRemote(h.rkey);
  if (!mr || !(mr->access & IBV_ACCESS_REMOTE_WRITE) || mr->pd != qp->pd ||
      !inside(mr->base, h.remoteAddr, h.totalLength)) {
    return false;
  }
  return len == 0 || moveBytes(mr, reinterpret_cast<void*>(h.remoteAddr + h.offset), data, len);
}

void onData(EmuQp* qp, Snapshot& s, const Packet& h, const char* data, uint64_t len) {
  NicQp& n = qp->nic;
  if (h.offset > h.totalLength || len > h.totalLength - h.offset) return;  // malformed
  const bool first = h.offset == 0, last = h.offset + len == h.totalLength;
  if (h.seq < n.expectSeq) {  // a retransmission of what was done: acknowledge it again
    if (last) ack(n, n.expectSeq - 1);
    return;
  }
  // Past a NAK, or a retransmission's segments before where the original stopped: dropped.
  if (h.seq != n.expectSeq || h.offset != n.expectOffset) return;
  const auto op = static_cast<ibv_wr_opcode>(h.opcode);
  const bool isSend = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM;
  const bool isWrite = op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (!isSend && !isWrite) {
    nak(n, h.seq, Nak::kInvalid, 0);
    failQp(qp, s, std::nullopt, std::nullopt);
    return;
  }
  const bool needsRecv = isSend || op == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (first && needsRecv && !peekRecv(qp, &n.current)) {
    nak(n, h.seq, Nak::kRnr, s.minRnrTimer);  // receiver not ready: expect this WR again
    return;
  }
  if (isSend) {
    if (first && gatherLength(n.current) < h.totalLength) {
      nak(n, h.seq, Nak::kInvalid, 0);
      failQp(qp, s, std::nullopt, IBV_WC_LOC_LEN_ERR);
      return;
    }
    if (!scatter(qp, n.current, h.offset, data, len)) {
      nak(n, h.seq, Nak::kOperation, 0);
      failQp(qp, s, std::nullopt, IBV_WC_LOC_PROT_ERR);
      return;
    }
  } else if (h.totalLength > 0 && !placeWrite(qp, s, h, data, len)) {
    // A zero-length write checks no rkey (IB spec 9.4.4.1).
    nak(n, h.seq, Nak::kAccess, 0);
    failQp(qp, s, std::nullopt, std::nullopt);
    return;
  }
  n.expectOffset += len;
  if (!last) return;
  ++n.expectSeq;
  n.expectOffset = 0;
  if (needsRecv) completeRecv(qp, h);
  ack(n, h.seq);
}

// Drains the QP's socket (at most kBurst datagrams) and acts on what came.
bool receive(EmuContext* c, EmuQp* qp, Snapshot& s, Clock::time_point now) {
  bool any = false;
  for (int i = 0; i < kBurst; ++i) {
    const ssize_t got = ::recv(qp->fd, c->rx.data(), c->rx.size(), MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR || errno == ECONNRESET) continue;  // ECONNRESET: consumed
      break;
    }
    any = true;
    if (static_cast<size_t>(got) < sizeof(Packet)) continue;
    Packet h;
    std::memcpy(&h, c->rx.data(), sizeof h);
    if (h.magic != kMagic || h.destQpn != qp->base.qp_num || h.srcQpn != s.destQpn) continue;
    // A QP in RESET, INIT or ERR drops what arrives, as hardware does; the sender's
    // timer retransmits it.
    if (s.state != IBV_QPS_RTR && s.state != IBV_QPS_RTS) continue;
    const char* data = c->rx.data() + sizeof h;
    const uint64_t len = static_cast<uint64_t>(got) - sizeof h;
    if (h.kind == kData) {
      onData(qp, s, h, data, len);
    } else if (h.kind == kAck && s.state == IBV_QPS_RTS) {
      onAck(qp, s, h.seq, now);
    } else if (h.kind == kNakKind && s.state == IBV_QPS_RTS) {
      onNak(qp, s, h, now);
    }
  }
  return any;
}

// The pending ACK or NAK, if the peer takes it; one datagram per turn, coalescing the
// ACKs of a burst into one (they are cumulative).
bool sendControl(EmuQp* qp, const Snapshot& s) {
  NicQp& n = qp->nic;
  if (n.nak == Nak::kNone && !n.ackPending) return false;
  Packet h{};
  h.magic = kMagic;
  h.kind = n.nak != Nak::kNone ? kNakKind : kAck;
  h.nak = static_cast<uint8_t>(n.nak);
  h.rnrTimer = n.nakTimer;
  h.seq = n.nak != Nak::kNone ? n.nakSeq : n.ackSeq;
  h.destQpn = s.destQpn;
  h.srcQpn = qp->base.qp_num;
  iovec iov{&h, sizeof h};
  if (sendPacket(qp, &iov, 1) == Outcome::kBlocked) return false;
  n.nak = Nak::kNone;  // sent, or lost with a peer that is gone
  n.ackPending = false;
  return true;
}

// The iovecs of bytes [offset, offset + len) of the WR's gather list, every element checked
// (lkey, protection domain, range); false on a bad one. With the registry held shared. GPU
// memory is copied into `bounce` (len <= kSegmentBytes bytes) first.
bool gather(const EmuQp* qp, const SendEntry& e, uint64_t offset, uint64_t len, iovec* iov,
            int* count, char* bounce) {
  const Registry& reg = Registry::instance();
  uint64_t pos = 0;
  for (int i = 0; i < e.numSge; ++i) {
    const ibv_sge& g = e.sge[i];
    if (g.length == 0) continue;
    const EmuMr* mr = reg.findLocal(g.lkey);
    if (!mr || mr->pd != qp->pd || !inside(mr->base, g.addr, g.length)) return false;
    const uint64_t b = std::max(pos, offset), end = std::min(pos + g.length, offset + len);
    if (b < end) {
      void* at = reinterpret_cast<void*>(g.addr + (b - pos));
      if (mr->device) {
        char* to = bounce + (b - offset);
        if (!moveBytes(mr, to, at, end - b)) return false;
        at = to;
      }
      iov[(*count)++] = {at, end - b};
    }
    pos += g.length;
  }
  return true;
}

// The next segment of WR txSeq.
Outcome sendSegment(EmuQp* qp, const Snapshot& s, const SendEntry& e) {
  const NicQp& n = qp->nic;
  const uint64_t len = std::min<uint64_t>(kSegmentBytes, e.length - n.txOffset);
  Packet h{};
  h.magic = kMagic;
  h.kind = kData;
  h.opcode = static_cast<uint8_t>(e.opcode);
  h.flags = static_cast<uint8_t>((n.txOffset == 0 ? kFirst : 0) |
                                 (n.txOffset + len == e.length ? kLast : 0));
  h.destQpn = s.destQpn;
  h.srcQpn = qp->base.qp_num;
  h.rkey = e.rkey;
  h.imm = e.imm;
  h.seq = s.sqPsn + n.txSeq;
  h.remoteAddr = e.remoteAddr;
  h.totalLength = e.length;
  h.offset = n.txOffset;
  iovec iov[1 + kMaxSge];
  iov[0] = {&h, sizeof h};
  int count = 1;
  if (e.isInline) {
    if (len > 0) iov[count++] = {e.inlineData + n.txOffset, len};
    return sendPacket(qp, iov, count);
  }
  std::shared_lock<std::shared_mutex> lock(Registry::instance().mutex);
  thread_local std::unique_ptr<char[]> bounce;  // the NIC thread's, for GPU memory
  if (!bounce) bounce = std::make_unique<char[]>(kSegmentBytes);
  if (!gather(qp, e, n.txOffset, len, iov, &count, bounce.get())) return Outcome::kBadLocal;
  return sendPacket(qp, iov, count);
}

bool transmit(EmuQp* qp, const Snapshot& s, Clock::time_point now, Clock::time_point* next) {
  NicQp& n = qp->nic;
  if (n.paused) {
    if (now < n.resumeAt) {
      *next = std::min(*next, n.resumeAt);
      return false;
    }
    n.paused = false;
  }
  if (n.unreachable || n.localError) return false;
  bool any = false;
  for (int i = 0; i < kBurst && n.txSeq < s.sendTail; ++i) {
    const SendEntry& e = sendSlot(qp, n.txSeq);
    const Outcome o = sendSegment(qp, s, e);
    if (o == Outcome::kBlocked) break;
    if (o == Outcome::kBadLocal) {  // completes when the WRs before it have
      n.localError = true;
      n.localErrorSeq = n.txSeq;
      break;
    }
    any = true;
    n.sentUpTo = std::max(n.sentUpTo, n.txSeq + 1);
    armTimer(n, s, now);
    if (o == Outcome::kLost) {  // no peer: the timer retransmits
      n.unreachable = true;
      break;
    }
    n.txOffset += std::min<uint64_t>(kSegmentBytes, e.length - n.txOffset);
    if (n.txOffset >= e.length) {
      ++n.txSeq;
      n.txOffset = 0;
    }
  }
  return any;
}

// The transport timer: retransmit from the oldest WR not acknowledged, retry_cnt times,
// then fail it with "transport retry counter exceeded".
bool checkTimer(EmuQp* qp, Snapshot& s, Clock::time_point now, Clock::time_point* next) {
  NicQp& n = qp->nic;
  if (!n.timerArmed) return false;
  if (now < n.deadline) {
    *next = std::min(*next, n.deadline);
    return false;
  }
  if (n.retries >= s.retryCnt) {
    failQp(qp, s, IBV_WC_RETRY_EXC_ERR, std::nullopt);
    return true;
  }
  ++n.retries;
  n.txSeq = qp->sendHead;
  n.txOffset = 0;
  n.unreachable = n.localError = false;
  n.deadline = now + transportTimeout(s.timeout);
  *next = std::min(*next, n.deadline);
  return true;
}

bool flushIfAny(EmuQp* qp) {
  std::lock_guard<std::mutex> lock(qp->mutex);
  if (qp->sendHead == qp->sendTail && qp->recvHead == qp->recvTail) return false;
  flushLocked(qp, std::nullopt, std::nullopt);
  return true;
}

// One turn of one QP; whether anything happened. `next` gets the QP's earliest timer.
bool serviceQp(EmuContext* c, EmuQp* qp, Clock::time_point now, Clock::time_point* next) {
  NicQp& n = qp->nic;
  n.wantOut = false;
  Snapshot s = snapshot(qp);
  if (s.generation != n.generation) restartConnection(qp, s);
  bool active = receive(c, qp, s, now);
  active |= sendControl(qp, s);
  if (s.state == IBV_QPS_ERR) return flushIfAny(qp) || active;
  if (s.state != IBV_QPS_RTS) return active;
  active |= checkTimer(qp, s, now, next);
  if (s.state == IBV_QPS_RTS) active |= transmit(qp, s, now, next);
  if (s.state == IBV_QPS_RTS && n.localError && qp->sendHead == n.localErrorSeq) {
    failQp(qp, s, IBV_WC_LOC_PROT_ERR, std::nullopt);
    active = true;
  }
  return active;
}

void drainSocket(EmuContext* c, int fd) {
  for (int i = 0; i < 1 << 16; ++i) {
    const ssize_t got = ::recv(fd, c->rx.data(), c->rx.size(), MSG_DONTWAIT);
    if (got < 0 && errno != EINTR && errno != ECONNRESET) return;
  }
}

// modifyQp(RESET), on the NIC thread: nothing of the QP's past may survive.
void resetOnNic(EmuContext* c, EmuQp* qp) {
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(qp->mutex);
    qp->state = IBV_QPS_RESET;
    qp->sendHead = qp->sendTail = qp->recvHead = qp->recvTail = 0;
    generation = qp->attrs.generation;
    qp->attrs = QpAttrs{};
    qp->attrs.generation = generation;
  }
  qp->nic = NicQp{};
  qp->nic.generation = generation;
  sockaddr none{};
  none.sa_family = AF_UNSPEC;
  (void)::connect(qp->fd, &none, sizeof none);  // dissolves the association with the peer
  drainSocket(c, qp->fd);
}

// Serves the pending requests; true when one was to stop.
bool serveRequests(EmuContext* c) {
  std::vector<NicRequest> todo;
  uint64_t upTo = 0;
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    todo.swap(c->pending);
    upTo = c->ticket;
    c->requested.store(false);
  }
  bool stop = false;
  for (const NicRequest& r : todo) {
    switch (r.kind) {
      case NicRequest::kAdd: c->live.push_back(r.qp); break;
      case NicRequest::kRemove: std::erase(c->live, r.qp); break;
      case NicRequest::kReset: resetOnNic(c, r.qp); break;
      case NicRequest::kStop: stop = true; break;
    }
  }
  {
    std::lock_guard<std::mutex> lock(c->mutex);
    c->done = upTo;
  }
  c->served.notify_all();
  return stop;
}

void kick(EmuContext* c) {
  const uint64_t one = 1;
  while (::write(c->wakeFd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

// After a post: wakes the NIC if it sleeps. Pairs with nicLoop's sleeping/work handshake:
// both sides store, then load, the other's flag (seq_cst), so one of them sees the other.
void wake(EmuContext* c) {
  c->work.store(true);
  if (c->sleeping.load()) kick(c);
}

// A request to the NIC thread; with `wait`, returns once it is served.
void request(EmuContext* c, NicRequest r, bool wait) {
  std::unique_lock<std::mutex> lock(c->mutex);
  c->pending.push_back(r);
  const uint64_t t = ++c->ticket;
  c->requested.store(true);
  kick(c);
  if (wait) c->served.wait(lock, [&] { return c->done >= t; });
}

// Sleeps until a socket is readable (or writable where one was blocked), the eventfd
// fires, or `next`.
void sleepUntil(EmuContext* c, Clock::time_point now, Clock::time_point next) {
  c->fds.clear();
  c->fds.push_back({c->wakeFd, POLLIN, 0});
  for (EmuQp* qp : c->live) {
    const short events = static_cast<short>(POLLIN | (qp->nic.wantOut ? POLLOUT : 0));
    c->fds.push_back({qp->fd, events, 0});
  }
  timespec ts{};
  timespec* timeout = nullptr;
  if (next != Clock::time_point::max()) {
    const auto ns = std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::nanoseconds>(next - now).count());
    ts.tv_sec = static_cast<time_t>(ns / 1000000000);
    ts.tv_nsec = static_cast<long>(ns % 1000000000);
    timeout = &ts;
  }
  (void)::ppoll(c->fds.data(), c->fds.size(), timeout, nullptr);
  if (c->fds[0].revents & POLLIN) {
    uint64_t value = 0;
    (void)!::read(c->wakeFd, &value, sizeof value);
  }
}

void nicLoop(EmuContext* c) {
  Clock::time_point lastActive = Clock::now();
  for (;;) {
    if (c->requested.load() && serveRequests(c)) return;
    const Clock::time_point now = Clock::now();
    Clock::time_point next = Clock::time_point::max();
    bool active = false;
    for (EmuQp* qp : c->live) active |= serviceQp(c, qp, now, &next);
    if (active) {
      lastActive = now;
      continue;
    }
    if (now - lastActive < kSpin) continue;
    c->sleeping.store(true);
    if (!c->work.exchange(false) && !c->requested.load()) sleepUntil(c, now, next);
    c->sleeping.store(false);
  }
}

// ---------------------------------------------------------------------------------------
// Devices and ports.

// The IPv4 addresses (network order) and interface indexes of the interfaces that are up
// and not loopback; 127.0.0.1 on lo when there are none.
std::vector<std::pair<uint32_t, uint32_t>> ipv4Interfaces() {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
      sockaddr_in sin;
      std::memcpy(&sin, i->ifa_addr, sizeof sin);
      const uint32_t a = sin.sin_addr.s_addr;
      if (std::any_of(out.begin(), out.end(), [&](const auto& e) { return e.first == a; })) {
        continue;
      }
      out.emplace_back(a, if_nametoindex(i->ifa_name));
    }
    freeifaddrs(list);
  }
  if (out.empty()) out.emplace_back(htonl(INADDR_LOOPBACK), if_nametoindex("lo"));
  return out;
}

ibv_gid linkLocalGid(uint64_t guid) {
  ibv_gid g{};
  g.raw[0] = 0xfe;
  g.raw[1] = 0x80;
  const uint64_t be = htobe64(guid);
  std::memcpy(&g.raw[8], &be, 8);
  return g;
}

void addGid(std::vector<ibv_gid_entry>* table, const ibv_gid& gid, uint32_t type,
            uint32_t ifindex) {
  ibv_gid_entry e{};
  e.gid = gid;
  e.gid_index = static_cast<uint32_t>(table->size());
  e.port_num = kPortNum;
  e.gid_type = type;
  e.ndev_ifindex = ifindex;
  table->push_back(e);
}

// RoCE: the link-local GID (v1, v2), then each IPv4 address as ::ffff:a.b.c.d (v1, v2).
std::vector<ibv_gid_entry> roceGids(uint64_t guid) {
  const auto v4 = ipv4Interfaces();
  std::vector<ibv_gid_entry> table;
  const uint32_t netdev = v4.front().second;
  addGid(&table, linkLocalGid(guid), IBV_GID_TYPE_ROCE_V1, netdev);
  addGid(&table, linkLocalGid(guid), IBV_GID_TYPE_ROCE_V2, netdev);
  for (const auto& [addr, ifindex] : v4) {
    ibv_gid g{};
    g.raw[10] = g.raw[11] = 0xff;
    std::memcpy(&g.raw[12], &addr, 4);
    addGid(&table, g, IBV_GID_TYPE_ROCE_V1, ifindex);
    addGid(&table, g, IBV_GID_TYPE_ROCE_V2, ifindex);
  }
  return table;
}

void describePort(EmuContext* c) {
  c->infiniband = c->emu->config.infiniband;
  uint64_t h = mix(fnv1a(hostIdentity()) ^ mix(static_cast<uint64_t>(c->dev->index) + 1));
  if (h == 0) h = 1;
  c->guid = h;
  c->lid = static_cast<uint16_t>(1 + (h >> 16) % 0xbffe);  // a unicast LID
  if (c->infiniband) {
    addGid(&c->gids, linkLocalGid(h), IBV_GID_TYPE_IB, 0);
    c->addresses.push_back("lid" + std::to_string(c->lid));
    return;
  }
  c->gids = roceGids(h);
  for (const ibv_gid_entry& e : c->gids) {
    std::string a = hexOf(e.gid.raw, 16);
    if (std::find(c->addresses.begin(), c->addresses.end(), a) == c->addresses.end()) {
      c->addresses.push_back(std::move(a));
    }
  }
}

ibv_device** deviceList(Emulator* emu, int* num) {
  if (!emu) {
    errno = ENODEV;
    return nullptr;
  }
  const size_t n = emu->devices.size();
  auto** list = new (std::nothrow) ibv_device*[n + 1];
  if (!list) {
    errno = ENOMEM;
    return nullptr;
  }
  for (size_t i = 0; i < n; ++i) list[i] = &emu->devices[i]->base;
  list[n] = nullptr;
  if (num) *num = static_cast<int>(n);
  return list;
}

void freeDeviceList(ibv_device** list) {
  delete[] list;
}

const char* getDeviceName(ibv_device* device) {
  return device ? device->name : nullptr;
}

int postSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int postRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int pollCq(ibv_cq* cq, int n, ibv_wc* wc);

ibv_context* openDevice(ibv_device* device) {
  if (!device) {
    errno = EINVAL;
    return nullptr;
  }
  auto* dev = reinterpret_cast<EmuDevice*>(device);
  auto* c = new EmuContext{};
  c->base.device = device;
  c->base.ops.poll_cq = pollCq;  // so rdma-core's inline ibv_post_send & co. work too
  c->base.ops.post_send = postSend;
  c->base.ops.post_recv = postRecv;
  c->base.cmd_fd = -1;
  c->base.async_fd = -1;
  c->base.num_comp_vectors = 1;
  c->dev = dev;
  c->emu = dev->emu;
  describePort(c);
  c->rx.resize(sizeof(Packet) + kSegmentBytes);
  c->wakeFd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (c->wakeFd < 0) {
    const int err = errno;
    delete c;
    errno = err;
    return nullptr;
  }
  try {
    c->nic = std::thread(nicLoop, c);
  } catch (const std::system_error&) {
    ::close(c->wakeFd);
    delete c;
    errno = EAGAIN;
    return nullptr;
  }
  return &c->base;
}

int closeDevice(ibv_context* context) {
  EmuContext* c = asContext(context);
  if (c->pds.load() > 0 || c->cqs.load() > 0) {
    errno = EBUSY;
    return EBUSY;
  }
  request(c, {NicRequest::kStop, nullptr}, true);
  c->nic.join();
  ::close(c->wakeFd);
  delete c;
  return 0;
}

int queryDevice(ibv_context* context, ibv_device_attr* a) {
  const EmuContext* c = asContext(context);
  *a = ibv_device_attr{};
  std::snprintf(a->fw_ver, sizeof a->fw_ver, "loom-emulator");
  a->node_guid = htobe64(c->guid);
  a->sys_image_guid = htobe64(c->guid);
  a->max_mr_size = kMaxMrSize;
  a->page_size_cap = 4096;
  a->max_qp = kMaxQp;
  a->max_qp_wr = static_cast<int>(kMaxQpWr);
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN;
  a->max_sge = kMaxSge;
  a->max_sge_rd = kMaxSge;
  a->max_cq = kMaxCq;
  a->max_cqe = kMaxCqe;
  a->max_mr = kMaxMr;
  a->max_pd = kMaxPd;
  a->max_qp_rd_atom = kMaxRdAtomic;
  a->max_qp_init_rd_atom = kMaxRdAtomic;
  a->max_res_rd_atom = kMaxRdAtomic;
  a->atomic_cap = IBV_ATOMIC_NONE;
  a->max_pkeys = 1;
  a->local_ca_ack_delay = 16;
  a->phys_port_cnt = 1;
  return 0;
}

int queryPort(ibv_context* context, uint8_t port, ibv_port_attr* a) {
  const EmuContext* c = asContext(context);
  if (port != kPortNum) return EINVAL;
  *a = ibv_port_attr{};
  a->state = IBV_PORT_ACTIVE;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = IBV_MTU_4096;
  a->gid_tbl_len = static_cast<int>(c->gids.size());
  a->max_msg_sz = static_cast<uint32_t>(kMaxMessage);
  a->pkey_tbl_len = 1;
  a->lid = c->infiniband ? c->lid : 0;
  a->sm_lid = c->infiniband ? 1 : 0;
  a->max_vl_num = 1;
  a->subnet_timeout = 18;
  a->active_width = 2;    // 4x
  a->active_speed = 128;  // NDR: 100 Gb/s a lane, 400 Gb/s the port (RoCE reports it too)
  a->phys_state = 5;      // LinkUp
  a->link_layer = c->infiniband ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
  return 0;
}

int queryGidEx(ibv_context* context, uint32_t port, uint32_t index, ibv_gid_entry* entry) {
  const EmuContext* c = asContext(context);
  if (port != kPortNum) return EINVAL;
  if (index >= c->gids.size()) return ENODATA;
  *entry = c->gids[index];
  return 0;
}

// ---------------------------------------------------------------------------------------
// Protection domains and memory registrations.

ibv_pd* allocPd(ibv_context* context) {
  EmuContext* c = asContext(context);
  if (c->pds.fetch_add(1) >= kMaxPd) {
    c->pds.fetch_sub(1);
    errno = ENOMEM;
    return nullptr;
  }
  static std::atomic<uint32_t> handles{1};
  auto* pd = new EmuPd{};
  pd->base.context = context;
  pd->base.handle = handles.fetch_add(1);
  pd->ctx = c;
  return &pd->base;
}

int deallocPd(ibv_pd* ibpd) {
  EmuPd* pd = asPd(ibpd);
  if (pd->users.load() > 0) {
    errno = EBUSY;
    return EBUSY;
  }
  pd->ctx->pds.fetch_sub(1);
  delete pd;
  return 0;
}

ibv_mr* addMr(EmuPd* pd, void* addr, size_t length, int access, bool device);

ibv_mr* regMr(ibv_pd* ibpd, void* addr, size_t length, int access) {
  // Optional flags (relaxed ordering) are hints a device may ignore; hugetlb too. Memory
  // windows, zero-based and on-demand-paging registrations are not emulated.
  const int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                    IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_HUGETLB | IBV_ACCESS_OPTIONAL_RANGE;
  const bool needsLocalWrite = access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  if (!ibpd || (access & ~known) || (needsLocalWrite && !(access & IBV_ACCESS_LOCAL_WRITE)) ||
      length == 0 || length > kMaxMrSize || !addr) {
    errno = EINVAL;
    return nullptr;
  }
  EmuPd* pd = asPd(ibpd);
  // GPU memory: a real ibv_reg_mr takes it only through nvidia_peermem, which the emulated
  // NIC stands in for where its config says gdr; without, the pages cannot be pinned.
  const bool device = cuda::isDevicePointer(addr);
  if (device && !pd->ctx->emu->config.gdr) {
    errno = EFAULT;
    return nullptr;
  }
  return addMr(pd, addr, length, access, device);
}

ibv_mr* addMr(EmuPd* pd, void* addr, size_t length, int access, bool device) {
  auto* mr = new EmuMr{};
  mr->base.context = pd->base.context;
  mr->base.pd = &pd->base;
  mr->base.addr = addr;
  mr->base.length = length;
  mr->pd = pd;
  mr->access = access;
  mr->device = device;
  {
    Registry& reg = Registry::instance();
    std::unique_lock<std::shared_mutex> lock(reg.mutex);
    if (!reg.add(mr)) {
      delete mr;
      errno = ENOMEM;
      return nullptr;
    }
  }
  mr->base.handle = mr->base.lkey;
  pd->users.fetch_add(1);
  return &mr->base;
}

ibv_mr* regDmabufMr(ibv_pd* ibpd, uint64_t offset, size_t length, uint64_t iova, int fd,
                    int access) {
  if (!ibpd || !asPd(ibpd)->ctx->emu->config.gdr) {
    errno = EOPNOTSUPP;  // without gdr the emulation moves host memory only
    return nullptr;
  }
  // The emulated NIC reaches the memory at `iova` (the GPU address whose pages `fd` exports,
  // as callers pass it) through CUDA copies; the descriptor itself must be open.
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    errno = EBADF;
    return nullptr;
  }
  void* addr = reinterpret_cast<void*>(iova);
  const int known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                    IBV_ACCESS_OPTIONAL_RANGE;
  if ((access & ~known) || length == 0 || length > kMaxMrSize || !cuda::isDevicePointer(addr) ||
      !cuda::isDevicePointer(static_cast<char*>(addr) + length - 1)) {
    errno = EINVAL;
    return nullptr;
  }
  (void)offset;
  return addMr(asPd(ibpd), addr, length, access, true);
}

int deregMr(ibv_mr* ibmr) {
  EmuMr* mr = asMr(ibmr);
  {
    Registry& reg = Registry::instance();
    std::unique_lock<std::shared_mutex> lock(reg.mutex);
    reg.remove(mr);
  }
  mr->pd->users.fetch_sub(1);
  delete mr;
  return 0;
}

// ---------------------------------------------------------------------------------------
// Completion queues.

ibv_cq* createCq(ibv_context* context, int cqe, void* cqContext, ibv_comp_channel* channel,
                 int compVector) {
  EmuContext* c = asContext(context);
  // Completion channels (and so compVector) are not emulated: poll the queue.
  if (cqe < 1 || cqe > kMaxCqe || channel || compVector != 0) {
    errno = EINVAL;
    return nullptr;
  }
  if (c->cqs.fetch_add(1) >= kMaxCq) {
    c->cqs.fetch_sub(1);
    errno = ENOMEM;
    return nullptr;
  }
  auto* cq = new EmuCq{};
  cq->base.context = context;
  cq->base.cq_context = cqContext;
  cq->base.cqe = cqe;
  cq->ctx = c;
  cq->ring.resize(static_cast<size_t>(cqe));
  return &cq->base;
}

int destroyCq(ibv_cq* ibcq) {
  EmuCq* cq = asCq(ibcq);
  if (cq->users.load() > 0) {
    errno = EBUSY;
    return EBUSY;
  }
  cq->ctx->cqs.fetch_sub(1);
  delete cq;
  return 0;
}

int pollCq(ibv_cq* ibcq, int n, ibv_wc* wc) {
  EmuCq* cq = asCq(ibcq);
  if (n < 0) return -1;
  std::lock_guard<std::mutex> lock(cq->mutex);
  if (cq->overflowed) return -1;
  int got = 0;
  while (got < n && cq->count > 0) {
    wc[got++] = cq->ring[cq->head];
    cq->head = (cq->head + 1) % cq->ring.size();
    --cq->count;
  }
  return got;
}

// ---------------------------------------------------------------------------------------
// Queue pairs.

std::string qpPath(const std::string& dir, const std::string& address, uint32_t qpn) {
  return dir + "/" + address + "." + std::to_string(qpn);
}

// Whether a socket still answers at `path` (a file left by a dead process does not).
bool socketLive(const std::string& path) {
  sockaddr_un addr;
  socklen_t len;
  if (!fillAddress(path, &addr, &len)) return true;
  const int s = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return true;  // cannot tell: treat as taken
  const int rc = ::connect(s, reinterpret_cast<sockaddr*>(&addr), len);
  const int err = errno;
  ::close(s);
  return rc == 0 || (err != ECONNREFUSED && err != ENOENT);
}

void removePaths(const std::vector<std::string>& paths) {
  for (const std::string& p : paths) ::unlink(p.c_str());
}

// A socket bound at <dir>/<addresses[0]>.<qpn>, with symlinks <dir>/<address>.<qpn> for the
// other addresses, for a random qpn that is free; the fd, or -1 with errno set.
int bindQpSocket(const std::string& dir, const std::vector<std::string>& addresses, uint32_t* qpn,
                 std::vector<std::string>* paths) {
  for (int attempt = 0; attempt < 64; ++attempt) {
    const uint32_t n = 2 + randomU32() % (kPsnLimit - 2);  // QPs 0 and 1 are special
    std::vector<std::string> p;
    for (const std::string& a : addresses) p.push_back(qpPath(dir, a, n));
    sockaddr_un addr;
    socklen_t len;
    if (!fillAddress(p[0], &addr, &len)) {
      errno = ENAMETOOLONG;
      return -1;
    }
    const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len);
    if (rc != 0 && errno == EADDRINUSE && !socketLive(p[0])) {
      ::unlink(p[0].c_str());  // left by a process that died
      rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len);
    }
    if (rc != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EADDRINUSE) continue;
      errno = err;
      return -1;
    }
    const std::string target = p[0].substr(dir.size() + 1);
    size_t made = 1;
    int err = 0;
    for (; made < p.size(); ++made) {
      if (::symlink(target.c_str(), p[made].c_str()) == 0) continue;
      err = errno;
      if (err == EEXIST && !socketLive(p[made]) && ::unlink(p[made].c_str()) == 0 &&
          ::symlink(target.c_str(), p[made].c_str()) == 0) {
        continue;
      }
      break;
    }
    if (made == p.size()) {
      *qpn = n;
      *paths = std::move(p);
      return fd;
    }
    p.resize(made);
    removePaths(p);
    ::close(fd);
    if (err != EEXIST) {
      errno = err;
      return -1;
    }
  }
  errno = EADDRINUSE;
  return -1;
}

bool capsValid(const ibv_qp_cap& cap) {
  return cap.max_send_wr <= kMaxQpWr && cap.max_recv_wr <= kMaxQpWr &&
         cap.max_send_sge <= static_cast<uint32_t>(kMaxSge) &&
         cap.max_recv_sge <= static_cast<uint32_t>(kMaxSge) && cap.max_inline_data <= kMaxInline;
}

ibv_qp* createQp(ibv_pd* ibpd, ibv_qp_init_attr* attr) {
  // RC only: UD, UC, XRC and raw packet QPs, and shared receive queues, are not emulated.
  if (!ibpd || !attr || attr->qp_type != IBV_QPT_RC || attr->srq || !attr->send_cq ||
      !attr->recv_cq || attr->send_cq->context != ibpd->context ||
      attr->recv_cq->context != ibpd->context || !capsValid(attr->cap)) {
    errno = EINVAL;
    return nullptr;
  }
  EmuPd* pd = asPd(ibpd);
  EmuContext* c = pd->ctx;
  if (c->qps.fetch_add(1) >= kMaxQp) {
    c->qps.fetch_sub(1);
    errno = ENOMEM;
    return nullptr;
  }
  const std::string& dir = c->emu->dir;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    c->qps.fetch_sub(1);
    return nullptr;
  }
  uint32_t qpn = 0;
  std::vector<std::string> paths;
  const int fd = bindQpSocket(dir, c->addresses, &qpn, &paths);
  if (fd < 0) {
    c->qps.fetch_sub(1);
    return nullptr;
  }
  const int buffer = kSocketBuffer;
  (void)::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  (void)::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);

  auto* qp = new EmuQp{};
  qp->base.context = ibpd->context;
  qp->base.qp_context = attr->qp_context;
  qp->base.pd = ibpd;
  qp->base.send_cq = attr->send_cq;
  qp->base.recv_cq = attr->recv_cq;
  qp->base.handle = qpn;
  qp->base.qp_num = qpn;
  qp->base.state = IBV_QPS_RESET;
  qp->base.qp_type = IBV_QPT_RC;
  qp->ctx = c;
  qp->pd = pd;
  qp->sendCq = asCq(attr->send_cq);
  qp->recvCq = asCq(attr->recv_cq);
  qp->fd = fd;
  qp->paths = std::move(paths);
  qp->maxSendWr = attr->cap.max_send_wr;
  qp->maxRecvWr = attr->cap.max_recv_wr;
  qp->maxSendSge = attr->cap.max_send_sge;
  qp->maxRecvSge = attr->cap.max_recv_sge;
  qp->sigAll = attr->sq_sig_all != 0;
  const size_t sendSlots = std::max<uint32_t>(1, qp->maxSendWr);
  qp->sendRing.resize(sendSlots);
  qp->inlineData.resize(sendSlots * kMaxInline);
  for (size_t i = 0; i < sendSlots; ++i)
    qp->sendRing[i].inlineData = &qp->inlineData[i * kMaxInline];
  qp->recvRing.resize(std::max<uint32_t>(1, qp->maxRecvWr));
  qp->state = IBV_QPS_RESET;
  attr->cap.max_inline_data = kMaxInline;

  pd->users.fetch_add(1);
  qp->sendCq->users.fetch_add(1);
  qp->recvCq->users.fetch_add(1);
  request(c, {NicRequest::kAdd, qp}, false);
  return &qp->base;
}

int destroyQp(ibv_qp* ibqp) {
  EmuQp* qp = asQp(ibqp);
  EmuContext* c = qp->ctx;
  request(c, {NicRequest::kRemove, qp}, true);  // outstanding WRs are dropped
  ::close(qp->fd);
  removePaths(qp->paths);
  qp->sendCq->users.fetch_sub(1);
  qp->recvCq->users.fetch_sub(1);
  qp->pd->users.fetch_sub(1);
  c->qps.fetch_sub(1);
  delete qp;
  return 0;
}

// The attributes a transition requires and those it may also take (the kernel's table for
// RC, less alternate paths and path migration, which are not emulated).
struct Transition {
  bool valid;
  int required;
  int optional;
};

Transition transitionOf(ibv_qp_state from, ibv_qp_state to) {
  constexpr int S = IBV_QP_STATE;
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) return {true, S, 0};
  if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) {
    return {true, S | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0};
  }
  if (from == IBV_QPS_INIT && to == IBV_QPS_INIT) {
    return {true, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS};
  }
  if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
    return {true,
            S | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
            IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX};
  }
  if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) {
    return {true,
            S | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                IBV_QP_MAX_QP_RD_ATOMIC,
            IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER};
  }
  if (from == IBV_QPS_RTS && to == IBV_QPS_RTS) {
    return {true, 0, IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER};
  }
  return {false, 0, 0};
}

// Whether the values of the attributes in `mask` are in range.
bool valuesValid(const EmuQp* qp, const ibv_qp_attr& a, int mask) {
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                     IBV_ACCESS_REMOTE_ATOMIC;
  const EmuContext* c = qp->ctx;
  if ((mask & IBV_QP_CUR_STATE) && a.cur_qp_state != qp->state) return false;
  if ((mask & IBV_QP_PKEY_INDEX) && a.pkey_index != 0) return false;
  if ((mask & IBV_QP_PORT) && a.port_num != kPortNum) return false;
  if ((mask & IBV_QP_ACCESS_FLAGS) && (a.qp_access_flags & ~access)) return false;
  if ((mask & IBV_QP_PATH_MTU) && (a.path_mtu < IBV_MTU_256 || a.path_mtu > IBV_MTU_4096)) {
    return false;
  }
  if ((mask & IBV_QP_DEST_QPN) && a.dest_qp_num >= kPsnLimit) return false;
  if ((mask & IBV_QP_RQ_PSN) && a.rq_psn >= kPsnLimit) return false;
  if ((mask & IBV_QP_SQ_PSN) && a.sq_psn >= kPsnLimit) return false;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > kMaxRdAtomic) return false;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a.max_rd_atomic > kMaxRdAtomic) return false;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31) return false;
  if ((mask & IBV_QP_TIMEOUT) && a.timeout > 31) return false;
  if ((mask & IBV_QP_RETRY_CNT) && a.retry_cnt > 7) return false;
  if ((mask & IBV_QP_RNR_RETRY) && a.rnr_retry > 7) return false;
  if (mask & IBV_QP_AV) {
    const ibv_ah_attr& ah = a.ah_attr;
    if (ah.port_num != kPortNum) return false;
    if (c->infiniband && ah.dlid == 0) return false;
    // RoCE routes by GID: the address needs its global route header.
    if (!c->infiniband && (!ah.is_global || ah.grh.sgid_index >= c->gids.size())) return false;
  }
  return true;
}

// The peer QP's socket address from an RTR's address vector.
bool destinationOf(const EmuQp* qp, const ibv_qp_attr& a, sockaddr_un* addr, socklen_t* len) {
  const EmuContext* c = qp->ctx;
  const std::string address =
      c->infiniband ? "lid" + std::to_string(a.ah_attr.dlid) : hexOf(a.ah_attr.grh.dgid.raw, 16);
  return fillAddress(qpPath(c->emu->dir, address, a.dest_qp_num), addr, len);
}

void applyAttrs(EmuQp* qp, const ibv_qp_attr& a, int mask) {
  QpAttrs& q = qp->attrs;
  if (mask & IBV_QP_ACCESS_FLAGS) q.access = static_cast<int>(a.qp_access_flags);
  if (mask & IBV_QP_TIMEOUT) q.timeout = a.timeout;
  if (mask & IBV_QP_RETRY_CNT) q.retryCnt = a.retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) q.rnrRetry = a.rnr_retry;
  if (mask & IBV_QP_MIN_RNR_TIMER) q.minRnrTimer = a.min_rnr_timer;
  if (mask & IBV_QP_DEST_QPN) q.destQpn = a.dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) q.rqPsn = a.rq_psn;
  if (mask & IBV_QP_SQ_PSN) q.sqPsn = a.sq_psn;
}

int modifyQp(ibv_qp* ibqp, ibv_qp_attr* attr, int mask) {
  EmuQp* qp = asQp(ibqp);
  if (!attr) return EINVAL;
  ibv_qp_state to = IBV_QPS_RESET;
  {
    std::lock_guard<std::mutex> lock(qp->mutex);
    const ibv_qp_state from = qp->state;
    to = (mask & IBV_QP_STATE) ? attr->qp_state : from;
    const Transition t = transitionOf(from, to);
    if (!t.valid || (mask & t.required) != t.required ||
        (mask & ~(t.required | t.optional | IBV_QP_STATE)) != 0 || !valuesValid(qp, *attr, mask)) {
      return EINVAL;
    }
    if (to == IBV_QPS_RTR) {
      if (!destinationOf(qp, *attr, &qp->attrs.dest, &qp->attrs.destLen)) return EINVAL;
      ++qp->attrs.generation;
    }
    if (to != IBV_QPS_RESET) {
      applyAttrs(qp, *attr, mask);
      qp->state = to;
    }
    qp->base.state = to;
  }
  if (to == IBV_QPS_RESET) {
    request(qp->ctx, {NicRequest::kReset, qp}, true);
  } else {
    wake(qp->ctx);  // ERR flushes; RTR and RTS start the NIC's work
  }
  return 0;
}

// One send WR into the ring; an error number for a WR the QP cannot take. With qp->mutex.
int enqueueSend(EmuQp* qp, const ibv_send_wr& wr) {
  // A QP in ERR takes WRs and flushes them, as hardware does.
  if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) return EINVAL;
  switch (wr.opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM: break;
    default: return EINVAL;  // RDMA READ, atomics and the rest are not emulated
  }
  const unsigned flags = IBV_SEND_FENCE | IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE;
  if ((wr.send_flags & ~flags) || wr.num_sge < 0 ||
      static_cast<uint32_t>(wr.num_sge) > qp->maxSendSge || (wr.num_sge > 0 && !wr.sg_list)) {
    return EINVAL;
  }
  uint64_t length = 0;
  for (int i = 0; i < wr.num_sge; ++i) length += wr.sg_list[i].length;
  const bool isInline = wr.send_flags & IBV_SEND_INLINE;
  if (length > kMaxMessage || (isInline && length > kMaxInline)) return EINVAL;
  if (qp->sendTail - qp->sendHead >= qp->maxSendWr) return ENOMEM;
  SendEntry& e = sendSlot(qp, qp->sendTail);
  e.wrId = wr.wr_id;
  e.remoteAddr = wr.wr.rdma.remote_addr;
  e.rkey = wr.wr.rdma.rkey;
  e.length = length;
  e.imm = wr.imm_data;
  e.opcode = wr.opcode;
  e.signaled = qp->sigAll || (wr.send_flags & IBV_SEND_SIGNALED);
  e.isInline = isInline;
  e.numSge = wr.num_sge;
  for (int i = 0; i < wr.num_sge; ++i) e.sge[i] = wr.sg_list[i];
  if (isInline) {  // copied now: the buffer is the app's again when post returns
    uint64_t pos = 0;
    for (int i = 0; i < wr.num_sge; ++i) {
      const ibv_sge& g = wr.sg_list[i];
      if (g.length > 0)
        std::memcpy(e.inlineData + pos, reinterpret_cast<const void*>(g.addr), g.length);
      pos += g.length;
    }
  }
  ++qp->sendTail;
  return 0;
}

int postSend(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  EmuQp* qp = asQp(ibqp);
  int err = 0;
  bool posted = false;
  {
    std::lock_guard<std::mutex> lock(qp->mutex);
    for (; wr; wr = wr->next) {
      if ((err = enqueueSend(qp, *wr)) != 0) break;
      posted = true;
    }
  }
  if (posted) wake(qp->ctx);
  if (err && bad) *bad = wr;
  return err;
}

int enqueueRecv(EmuQp* qp, const ibv_recv_wr& wr) {
  if (qp->state == IBV_QPS_RESET) return EINVAL;
  if (wr.num_sge < 0 || static_cast<uint32_t>(wr.num_sge) > qp->maxRecvSge ||
      (wr.num_sge > 0 && !wr.sg_list)) {
    return EINVAL;
  }
  if (qp->recvTail - qp->recvHead >= qp->maxRecvWr) return ENOMEM;
  RecvEntry& r = recvSlot(qp, qp->recvTail);
  r.wrId = wr.wr_id;
  r.numSge = wr.num_sge;
  for (int i = 0; i < wr.num_sge; ++i) r.sge[i] = wr.sg_list[i];
  ++qp->recvTail;
  return 0;
}

int postRecv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  EmuQp* qp = asQp(ibqp);
  int err = 0;
  bool posted = false;
  {
    std::lock_guard<std::mutex> lock(qp->mutex);
    for (; wr; wr = wr->next) {
      if ((err = enqueueRecv(qp, *wr)) != 0) break;
      posted = true;
    }
  }
  if (posted) wake(qp->ctx);
  if (err && bad) *bad = wr;
  return err;
}

// ibv_wc_status_str's words.
const char* wcStatusStr(ibv_wc_status status) {
  switch (status) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_LEN_ERR: return "local length error";
    case IBV_WC_LOC_QP_OP_ERR: return "local QP operation error";
    case IBV_WC_LOC_EEC_OP_ERR: return "local EE context operation error";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_MW_BIND_ERR: return "memory management operation error";
    case IBV_WC_BAD_RESP_ERR: return "bad response error";
    case IBV_WC_LOC_ACCESS_ERR: return "local access error";
    case IBV_WC_REM_INV_REQ_ERR: return "remote invalid request error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_REM_OP_ERR: return "remote operation error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    case IBV_WC_LOC_RDD_VIOL_ERR: return "local RDD violation error";
    case IBV_WC_REM_INV_RD_REQ_ERR: return "remote invalid RD request";
    case IBV_WC_REM_ABORT_ERR: return "aborted error";
    case IBV_WC_INV_EECN_ERR: return "invalid EE context number";
    case IBV_WC_INV_EEC_STATE_ERR: return "invalid EE context state";
    case IBV_WC_FATAL_ERR: return "fatal error";
    case IBV_WC_RESP_TIMEOUT_ERR: return "response timeout error";
    case IBV_WC_GENERAL_ERR: return "general error";
    case IBV_WC_TM_ERR: return "TM error";
    case IBV_WC_TM_RNDV_INCOMPLETE: return "TM software rendezvous";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------
// Tables: one per distinct config. getDeviceList takes no argument to say which emulation
// it lists, so each slot has a function of its own.

struct Slots {
  std::mutex mutex;
  std::atomic<Emulator*> slot[kSlots] = {};
};

Slots& slots() {
  static Slots* s = new Slots;  // lives for the process, as the tables do
  return *s;
}

template <int I>
ibv_device** getDeviceListAt(int* num) {
  return deviceList(slots().slot[I].load(std::memory_order_acquire), num);
}

template <int... I>
constexpr std::array<ibv_device** (*)(int*), sizeof...(I)> listFunctions(
    std::integer_sequence<int, I...>) {
  return {&getDeviceListAt<I>...};
}

constexpr auto kListFunctions = listFunctions(std::make_integer_sequence<int, kSlots>{});

std::string defaultDir() {
  const char* tmp = std::getenv("TMPDIR");
  const std::string base = tmp && *tmp ? tmp : "/tmp";
  return base + "/loom-ibemu-" + std::to_string(getuid());
}

Emulator* makeEmulator(const EmulatorConfig& config, int slot) {
  auto* e = new Emulator;
  e->config = config;
  e->dir = config.dir.empty() ? defaultDir() : config.dir;
  e->provider = std::string("loom RDMA emulator (") + (config.infiniband ? "ib:" : "roce:") +
                std::to_string(config.devices) + (config.gdr ? ",gdr" : "") + ")";
  e->verbs.emulatedGdr = config.gdr;
  for (int i = 0; i < config.devices; ++i) {
    auto d = std::make_unique<EmuDevice>();
    d->base = ibv_device{};
    d->base.node_type = IBV_NODE_CA;
    d->base.transport_type = IBV_TRANSPORT_IB;
    std::snprintf(d->base.name, sizeof d->base.name, "loomemu%d", i);
    std::snprintf(d->base.dev_name, sizeof d->base.dev_name, "loomemu%d", i);
    d->emu = e;
    d->index = i;
    e->devices.push_back(std::move(d));
  }
  Verbs& v = e->verbs;
  v.provider = e->provider.c_str();
  v.getDeviceList = kListFunctions[slot];
  v.freeDeviceList = freeDeviceList;
  v.getDeviceName = getDeviceName;
  v.openDevice = openDevice;
  v.closeDevice = closeDevice;
  v.queryDevice = queryDevice;
  v.queryPort = queryPort;
  v.queryGidEx = queryGidEx;
  v.allocPd = allocPd;
  v.deallocPd = deallocPd;
  v.regMr = regMr;
  v.regDmabufMr = regDmabufMr;
  v.deregMr = deregMr;
  v.createCq = createCq;
  v.destroyCq = destroyCq;
  v.createQp = createQp;
  v.modifyQp = modifyQp;
  v.destroyQp = destroyQp;
  v.postSend = postSend;
  v.postRecv = postRecv;
  v.pollCq = pollCq;
  v.wcStatusStr = wcStatusStr;
  return e;
}

}  // namespace

Result<EmulatorConfig> parseEmulatorSpec(const std::string& full) {
  EmulatorConfig config;
  std::string spec = full;
  constexpr std::string_view kGdr = ",gdr";
  if (spec.size() > kGdr.size() &&
      spec.compare(spec.size() - kGdr.size(), kGdr.size(), kGdr) == 0) {
    config.gdr = true;
    spec.resize(spec.size() - kGdr.size());
  }
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  bool ok = kind == "roce" || kind == "ib";
  config.infiniband = kind == "ib";
  if (ok && colon != std::string::npos) {
    const std::string count = spec.substr(colon + 1);
    ok = !count.empty() && count.size() <= 3 &&
         std::all_of(count.begin(), count.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (ok) config.devices = std::stoi(count);
    ok = ok && config.devices >= 1 && config.devices <= kMaxEmulatedDevices;
  }
  if (!ok) {
    return errorf(Code::kInvalidUsage,
                  "LOOM_IB_EMULATE=%s: expected roce, roce:N, ib or ib:N (N emulated devices, "
                  "1 to %d), optionally followed by ,gdr",
                  full.c_str(), kMaxEmulatedDevices);
  }
  return config;
}

const Verbs* emulatedVerbs(const EmulatorConfig& config) {
  if (config.devices < 1 || config.devices > kMaxEmulatedDevices) return nullptr;
  Slots& s = slots();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (int i = 0; i < kSlots; ++i) {
    Emulator* e = s.slot[i].load(std::memory_order_relaxed);
    if (!e) {
      e = makeEmulator(config, i);
      s.slot[i].store(e, std::memory_order_release);
      return &e->verbs;
    }
    if (e->config == config) return &e->verbs;
  }
  return nullptr;
}

}  // namespace loom::transport::net::ib
