#include "transports/net/proxy.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <utility>

#include "common/clock.h"
#include "common/cuda_probe.h"
#include "common/log.h"

namespace loom::transport::net {

namespace {

uint64_t loadAcquire(uint64_t* p) {
  return std::atomic_ref<uint64_t>(*p).load(std::memory_order_acquire);
}
void storeRelease(uint64_t* p, uint64_t v) {
  std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release);
}
void setClosed(FifoHeader* h, uint32_t why) {
  uint32_t expected = kNetOpen;
  std::atomic_ref<uint32_t>(h->closed).compare_exchange_strong(expected, why,
                                                               std::memory_order_release);
}

#ifdef LOOM_NET_TRACE
// A diagnostic build's timeline of the proxy (host CLOCK_REALTIME), written at the end.
constexpr unsigned kTraceMax = 1u << 17;
uint64_t gTrace[kTraceMax][2];
std::atomic<unsigned> gTraceN{0};
void trace(int ev, int peer) {
  timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  const unsigned i = gTraceN.fetch_add(1, std::memory_order_relaxed);
  if (i < kTraceMax) {
    gTrace[i][0] = uint64_t(t.tv_sec) * 1000000000ull + uint64_t(t.tv_nsec);
    gTrace[i][1] = uint64_t(ev) | (uint64_t(uint32_t(peer)) << 32);
  }
}
#else
void trace(int, int) {}
#endif

// Zeroes the first n tagged words of message seq's slot.
void clearSmall(const Fifo& f, uint64_t seq, uint32_t n) {
  uint64_t* words = f.header->ll[seq % f.nslots];
  for (uint32_t i = 0; i < n; ++i)
    std::atomic_ref<uint64_t>(words[i]).store(0, std::memory_order_relaxed);
}

// Before message seq's receive: the words of the slot's last message, if it was small (its
// head says so), go; the kernel has read them (it moved `done` past it).
void clearReceived(const Fifo& f, uint64_t seq) {
  if (seq < f.nslots) return;
  const uint64_t last = seq - f.nslots;
  const uint64_t head =
      std::atomic_ref<uint64_t>(f.header->head[seq % f.nslots]).load(std::memory_order_relaxed);
  if (fifoHeadIs(head, last) && f.isSmall(fifoHeadSize(head)))
    clearSmall(f, last, fifoWords(fifoHeadSize(head)));
}

// A small message the kernel posted as tagged words: copied into its slot once every word
// is there (false: not yet; the next loop looks again, and copies again).
bool takeSmall(const Fifo& f, uint64_t seq, uint64_t size) {
  uint64_t* words = f.header->ll[seq % f.nslots];
  char* slot = f.slot(seq);
  const uint32_t n = fifoWords(size);
  for (uint32_t i = 0; i < n; ++i) {
    const uint64_t w = loadAcquire(&words[i]);
    if (!fifoHeadIs(w, seq)) return false;
    const uint32_t payload = static_cast<uint32_t>(w);
    std::memcpy(slot + 4 * i, &payload, std::min<uint64_t>(4, size - 4 * i));
  }
  clearSmall(f, seq, n);  // the kernel writes them again only once `done` frees the slot
  return true;
}

// A small message received into its slot, also written as tagged words for the kernel
// (before its head, which the caller then stores).
void putSmall(const Fifo& f, uint64_t seq, uint64_t size) {
  uint64_t* words = f.header->ll[seq % f.nslots];
  const char* slot = f.slot(seq);
  const uint32_t n = fifoWords(size);
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t payload = 0;
    std::memcpy(&payload, slot + 4 * i, std::min<uint64_t>(4, size - 4 * i));
    std::atomic_ref<uint64_t>(words[i]).store(fifoWord(seq, payload), std::memory_order_relaxed);
  }
}

// Spin this long with the CPU's pause hint before yielding between polls.
constexpr int64_t kPauseUs = 50;

}  // namespace

// Receive channels that have not moved for this long are tested every kQuietEvery-th loop.
constexpr auto kQuietTime = std::chrono::milliseconds(2);
constexpr int64_t kQuietEvery = 8;

struct Proxy::Channel {
  bool send = false;
  std::unique_ptr<SendComm> sendComm;
  std::unique_ptr<RecvComm> recvComm;
  SendDialer sendDial;  // until connected
  RecvDialer recvDial;
  Clock::time_point dialDeadline{};
  bool connected = false;
  int64_t timeoutMs = 0;
  Fifo fifo;
  SlotMemory mem;
  MemHandle mh = nullptr;
  uint64_t issued = 0;     // slots handed to the backend
  uint64_t completed = 0;  // of those, the ones it finished
  Request* requests[kFifoMaxSlots] = {};
  bool failed = false;
  Clock::time_point lastMoved{};  // a receive channel: when it last moved (run(): quiet ones)

  ~Channel() {
    if (mh && sendComm) (void)sendComm->deregMr(mh);
    if (mh && recvComm) (void)recvComm->deregMr(mh);
  }
};

SlotMemory& SlotMemory::operator=(SlotMemory&& o) noexcept {
  if (this != &o) {
    closeDmaBuf();
    type = o.type;
    dmaBufFd = std::exchange(o.dmaBufFd, -1);
    dmaBufOffset = o.dmaBufOffset;
    flushContext = o.flushContext;
  }
  return *this;
}

void SlotMemory::closeDmaBuf() {
  if (dmaBufFd >= 0) ::close(dmaBufFd);
  dmaBufFd = -1;
}

Proxy::Proxy(int rank, int64_t spinUs) : rank_(rank), spinUs_(std::max<int64_t>(0, spinUs)) {
  thread_ = std::thread([this] { run(); });
}

Proxy::~Proxy() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  thread_.join();
#ifdef LOOM_NET_TRACE
  if (const char* dir = getenv("LOOM_NET_TRACE_DIR"); dir && gTraceN.load() > 0) {
    if (FILE* f = fopen((std::string(dir) + "/proxy." + std::to_string(getpid()) + ".txt").c_str(),
                        "w")) {
      const unsigned n = std::min(gTraceN.load(), kTraceMax);
      for (unsigned i = 0; i < n; ++i)
        fprintf(f, "%llu %llu %llu\n", (unsigned long long)gTrace[i][0],
                (unsigned long long)(gTrace[i][1] & 0xff),
                (unsigned long long)(gTrace[i][1] >> 32));
      fclose(f);
    }
    gTraceN.store(0);
  }
#endif
}

void Proxy::add(std::unique_ptr<Channel> c) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    incoming_.push_back(std::move(c));
    haveIncoming_.store(true, std::memory_order_release);
  }
  kick();
}

void Proxy::addSend(std::unique_ptr<SendComm> comm, const Fifo& fifo) {
  auto c = std::make_unique<Channel>();
  c->send = true;
  c->sendComm = std::move(comm);
  c->connected = true;
  c->fifo = fifo;
  add(std::move(c));
}

void Proxy::addRecv(std::unique_ptr<RecvComm> comm, const Fifo& fifo) {
  auto c = std::make_unique<Channel>();
  c->recvComm = std::move(comm);
  c->connected = true;
  c->fifo = fifo;
  add(std::move(c));
}

void Proxy::addSend(SendDialer dial, const Fifo& fifo, int64_t timeoutMs, SlotMemory mem) {
  auto c = std::make_unique<Channel>();
  c->send = true;
  c->sendDial = std::move(dial);
  c->timeoutMs = timeoutMs;
  c->fifo = fifo;
  c->mem = std::move(mem);
  add(std::move(c));
}

void Proxy::addRecv(RecvDialer dial, const Fifo& fifo, int64_t timeoutMs, SlotMemory mem) {
  auto c = std::make_unique<Channel>();
  c->recvDial = std::move(dial);
  c->timeoutMs = timeoutMs;
  c->fifo = fifo;
  c->mem = std::move(mem);
  add(std::move(c));
}

void Proxy::kick() {
  kicks_.fetch_add(1, std::memory_order_release);
  if (sleeping_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_all();
  }
}

void Proxy::shutdown() {
  shutdown_.store(true, std::memory_order_release);
  kick();
}

Status Proxy::status(int peer, bool send) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [key, st] : failures_) {
    if (key.first == peer && key.second == send) return st;
  }
  return Status::ok();
}

Status Proxy::firstError() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failures_.empty() ? Status::ok() : failures_.front().second;
}

double Proxy::cpuSeconds() const {
  return cpuNs_.load(std::memory_order_relaxed) * 1e-9;
}

void Proxy::adoptNew() {
  std::vector<std::unique_ptr<Channel>> fresh;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fresh.swap(incoming_);
    haveIncoming_.store(false, std::memory_order_relaxed);
  }
  const auto now = Clock::now();
  for (auto& c : fresh) {
    c->dialDeadline = now + std::chrono::milliseconds(std::max<int64_t>(0, c->timeoutMs));
    channels_.push_back(std::move(c));
    if (channels_.back()->connected) registerFifo(*channels_.back());
  }
}

void Proxy::registerFifo(Channel& c) {
  const size_t bytes = size_t(c.fifo.nslots) * c.fifo.slotBytes;
  const SlotMemory& m = c.mem;
  Result<MemHandle> mh =
      m.dmaBufFd >= 0
          ? (c.send
                 ? c.sendComm->regMrDmaBuf(c.fifo.slots, bytes, m.type, m.dmaBufOffset, m.dmaBufFd)
                 : c.recvComm->regMrDmaBuf(c.fifo.slots, bytes, m.type, m.dmaBufOffset, m.dmaBufFd))
          : (c.send ? c.sendComm->regMr(c.fifo.slots, bytes, m.type)
                    : c.recvComm->regMr(c.fifo.slots, bytes, m.type));
  c.mem.closeDmaBuf();  // the registration holds the pages
  if (!mh) {
    fail(c, mh.status().withContext(m.type == MemType::kCuda
                                        ? "registering the FIFO's GPU memory (GPUDirect RDMA)"
                                        : "registering the FIFO"));
  } else {
    c.mh = *mh;
  }
}

bool Proxy::dial(Channel& c, Clock::time_point now) {
  Status st = c.send ? c.sendDial(&c.sendComm) : c.recvDial(&c.recvComm);
  if (st && (c.send ? c.sendComm != nullptr : c.recvComm != nullptr)) {
    c.connected = true;
    c.sendDial = nullptr;
    c.recvDial = nullptr;
    registerFifo(c);
    return true;
  }
  if (st && now > c.dialDeadline) {
    st = errorf(Code::kRemoteError,
                "not made within LOOM_TIMEOUT_MS=%lld ms (the peer never made "
                "its end: it died, or called another operation)",
                (long long)c.timeoutMs);
  }
  if (!st) fail(c, st);
  return false;
}

void Proxy::fail(Channel& c, const Status& st) {
  if (c.failed) return;
  c.failed = true;
  const char* dir = c.send ? "to" : "from";
  Status full = st.withContext(std::string("net: the connection ") + dir + " rank " +
                               std::to_string(c.fifo.peer));
  const bool closedByPeer = st.code() == Code::kRemoteError;
  // A peer that closes is also how a communicator ends on the other side: whoever waits
  // on this connection reports it; the log says it only at INFO.
  if (closedByPeer) {
    LOOM_INFO(kNet, "rank %d: %s", rank_, full.message().c_str());
  } else {
    LOOM_WARN(kNet, "rank %d: %s", rank_, full.message().c_str());
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failures_.push_back({{c.fifo.peer, c.send}, full});
  }
  if (c.sendComm) c.sendComm->shutdown();
  if (c.recvComm) c.recvComm->shutdown();
  c.sendDial = nullptr;
  c.recvDial = nullptr;
  setClosed(c.fifo.header, closedByPeer ? kNetPeerClosed : kNetFailed);
}

// Posts requests while `post(seq, &request)` gives them and `room` allows, then retires
// those the backend finished, in order, calling `retired(size)` for each (a failing status
// fails the channel). False (and the channel failed) on an error; `moved` says whether
// anything changed.
template <typename Post, typename Test, typename Retired>
bool Proxy::pump(Channel& c, uint64_t room, Post post, Test test, Retired retired, bool* moved) {
  while (c.issued < room) {
    Request* r = nullptr;
    Status st = post(c.issued, &r);
    if (!st) {
      fail(c, st);
      return false;
    }
    if (!r) break;
    c.requests[c.issued % c.fifo.nslots] = r;
    ++c.issued;
    *moved = true;
  }
  while (c.completed < c.issued) {
    bool done = false;
    size_t size = 0;
    Status st = test(c.requests[c.completed % c.fifo.nslots], &done, &size);
    if (!st) {
      fail(c, st);
      return false;
    }
    if (!done) break;
    if (Status rs = retired(size); !rs) {
      fail(c, rs);
      return false;
    }
    *moved = true;
  }
  return true;
}

bool Proxy::progressSend(Channel& c) {
  bool moved = false;
  FifoHeader* h = c.fifo.header;
  // Every message the kernel posted goes out (a small one once all its words are there);
  // a finished one's slot is free again.
  const bool ok = pump(
      c, c.issued + c.fifo.nslots,
      [&](uint64_t seq, Request** r) {
        const uint64_t head = loadAcquire(&h->head[seq % c.fifo.nslots]);
        if (!fifoHeadIs(head, seq)) return Status::ok();  // not posted yet
        const uint64_t size = fifoHeadSize(head);
        if (c.fifo.isSmall(size) && !takeSmall(c.fifo, seq, size)) return Status::ok();
        trace(11, c.fifo.peer);
        return c.sendComm->isend(c.fifo.slot(seq), size, 0, c.mh, r);
      },
      [&](Request* r, bool* done, size_t* size) { return c.sendComm->test(r, done, size); },
      [&](size_t) {
        trace(12, c.fifo.peer);
        storeRelease(&h->done, ++c.completed);
        return Status::ok();
      },
      &moved);
  return moved || !ok;
}

bool Proxy::progressRecv(Channel& c) {
  bool moved = false;
  FifoHeader* h = c.fifo.header;
  // A receive for every slot the kernel has released; a finished one is the kernel's.
  const bool ok = pump(
      c, loadAcquire(&h->done) + c.fifo.nslots,
      [&](uint64_t seq, Request** r) {
        clearReceived(c.fifo, seq);
        void* data = c.fifo.slot(seq);
        const size_t capacity = c.fifo.slotBytes;
        const int tag = 0;
        return c.recvComm->irecv(1, &data, &capacity, &tag, &c.mh, r);
      },
      [&](Request* r, bool* done, size_t* size) { return c.recvComm->test(r, done, size); },
      [&](size_t size) {
        // GPUDirect RDMA on a GPU that does not order the NIC's writes: make them visible
        // before the kernel may read the slot.
        if (c.mem.flushContext && size > 0) {
          LOOM_TRY(cuda::flushRdmaWrites(c.mem.flushContext)
                       .withContext("flushing a receive into GPU memory (GPUDirect RDMA)"));
        }
        const uint64_t seq = c.completed++;
        if (c.fifo.isSmall(size)) putSmall(c.fifo, seq, size);
        storeRelease(&h->head[seq % c.fifo.nslots], fifoHead(seq, size));
        trace(13, c.fifo.peer);
        return Status::ok();
      },
      &moved);
  return moved || !ok;
}

void Proxy::run() {
  Clock::time_point lastWork = Clock::now();
  Clock::time_point drainUntil{};
  uint64_t seenKicks = kicks_.load();
  bool shut = false;
  int64_t loops = 0;
  while (true) {
    if (haveIncoming_.load(std::memory_order_acquire)) adoptNew();
    if (!shut && shutdown_.load(std::memory_order_acquire)) shut = true;
    if (shut) {
      for (auto& c : channels_) {
        if (c->failed) continue;
        c->failed = true;
        if (c->sendComm) c->sendComm->shutdown();
        if (c->recvComm) c->recvComm->shutdown();
        setClosed(c->fifo.header, kNetShutdown);
      }
    }
    const bool stopping = stop_.load(std::memory_order_acquire);
    bool moved = false;
    bool sendsPending = false;
    const auto loopStart = Clock::now();
    int64_t quietIndex = 0;
    for (auto& c : channels_) {
      if (c->failed) continue;
      if (!c->connected) {
        // Until then its sends wait in the FIFO; at the end, there is nobody to wait for.
        if (!stopping && dial(*c, loopStart)) moved = true;
        continue;
      }
      if (c->send) {
        moved = progressSend(*c) || moved;
        sendsPending =
            sendsPending || c->completed < c->issued ||
            fifoHeadIs(loadAcquire(&c->fifo.header->head[c->issued % c->fifo.nslots]), c->issued);
      } else if (!stopping) {
        // A receive channel quiet for kQuietTime is tested only every kQuietEvery-th loop:
        // a test of the socket backend is a system call, 0.2 us where it finds nothing (the
        // 2-core development machine), and the lanes and peers a call does not use would
        // add that to every step of the ones it does. A first message after the quiet then
        // waits at most kQuietEvery loops.
        // (Each on a loop of its own, so that their tests do not all land on one step.)
        if (loopStart - c->lastMoved > kQuietTime && (loops + quietIndex++) % kQuietEvery != 0)
          continue;
        if (progressRecv(*c)) {
          moved = true;
          c->lastMoved = loopStart;
        }
      }
    }
    if ((++loops & 1023) == 0) cpuNs_.store(threadCpuNs(), std::memory_order_relaxed);
    const auto now = Clock::now();
    if (stopping) {
      // Sends a kernel posted before the end still leave, for a while.
      if (drainUntil == Clock::time_point{}) drainUntil = now + std::chrono::milliseconds(drainMs);
      if (!sendsPending) break;
      if (now > drainUntil) {
        LOOM_WARN(kNet,
                  "rank %d: net: slots posted to the network did not leave within %lld ms of "
                  "the end; dropping them",
                  rank_, (long long)drainMs);
        break;
      }
    }
    const uint64_t kicks = kicks_.load(std::memory_order_acquire);
    if (moved || kicks != seenKicks) {
      seenKicks = kicks;
      lastWork = now;
      continue;
    }
    const int64_t idleUs =
        std::chrono::duration_cast<std::chrono::microseconds>(now - lastWork).count();
    if (idleUs < kPauseUs) {
      cpuRelax();
    } else if (idleUs < spinUs_ || stopping) {
      sched_yield();
    } else {
      std::unique_lock<std::mutex> lock(mutex_);
      sleeping_.store(true, std::memory_order_release);
      if (kicks_.load(std::memory_order_acquire) == seenKicks && !stop_.load() &&
          !haveIncoming_.load()) {
        wake_.wait_for(lock, std::chrono::milliseconds(1));
      }
      sleeping_.store(false, std::memory_order_relaxed);
    }
  }
  cpuNs_.store(threadCpuNs(), std::memory_order_relaxed);
  channels_.clear();
}

}  // namespace loom::transport::net
