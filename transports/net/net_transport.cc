// Host buffers over a network backend (net.h): the transport boundary's slots
// (transport.h) carried by a backend's isend/irecv, so that a backend other than sockets
// (ib) serves host-memory collectives between hosts as well as GPU buffers. Each side
// owns a ring of `slots` buffers registered with the backend; the receiver keeps a
// receive posted for every free slot, the sender posts a slot as soon as it is filled.
//
// Nothing here waits: connect and accept only start a connection, and a thread of the
// transport (the connector) finishes it in the background, so that no handshake depends
// on which connection a rank's executor happens to wait on (with a receiver-driven
// backend such as ib, a rank waiting to send to A would otherwise never answer B). A
// sender fills its slots meanwhile; they leave once the connection is up.
#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/settings.h"
#include "transports/net/net.h"
#include "transports/transport.h"

namespace loom::transport {

namespace {

using net::Handle;
using net::MemHandle;

std::string peerName(int rank) {
  return "rank " + std::to_string(rank);
}

// A connection being made: the connector calls step() until it says finished; the
// connection's owner takes the result (or gives up, cancel()).
class Dial {
 public:
  virtual ~Dial() = default;
  // One round of non-blocking work; true once finished (connected, failed or cancelled).
  virtual bool step() = 0;
  void cancel() {
    std::lock_guard<std::mutex> lock(mutex);
    cancelled = true;
  }
  std::mutex mutex;
  bool finished = false;  // under mutex
  bool cancelled = false;
  Status status;
};

class SendDial final : public Dial {
 public:
  SendDial(net::Backend& b, int peer, const Handle& h) : backend_(b), peer_(peer), handle_(h) {}
  ~SendDial() override {
    if (!comm) backend_.cancelConnect(&handle_);
  }
  bool step() override {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (cancelled) return true;
    }
    std::unique_ptr<net::SendComm> c;
    Status st = backend_.connect(0, &handle_, peer_, &c);
    if (st && !c) return false;
    std::lock_guard<std::mutex> lock(mutex);
    status = st.withContext("connecting to " + peerName(peer_));
    if (st) status = Status::ok();
    comm = std::move(c);
    finished = true;
    return true;
  }
  std::unique_ptr<net::SendComm> comm;  // under mutex once finished

 private:
  net::Backend& backend_;
  int peer_;
  Handle handle_;
};

class RecvDial final : public Dial {
 public:
  RecvDial(std::unique_ptr<net::ListenComm> l, int peer)
      : listener_(std::move(l)),
        peer_(peer),
        deadline_(Clock::now() + std::chrono::milliseconds(settings::get(settings::kTimeoutMs))) {}
  bool step() override {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (cancelled) return true;
    }
    std::unique_ptr<net::RecvComm> c;
    Status st = listener_->accept(&c);
    if (st && !c && Clock::now() < deadline_) return false;
    std::lock_guard<std::mutex> lock(mutex);
    if (!st) {
      status = st.withContext("accepting the connection from " + peerName(peer_));
    } else if (!c) {
      status = errorf(Code::kRemoteError, "net: %s never connected within LOOM_TIMEOUT_MS",
                      peerName(peer_).c_str());
    }
    comm = std::move(c);
    listener_.reset();
    finished = true;
    return true;
  }
  std::unique_ptr<net::RecvComm> comm;

 private:
  std::unique_ptr<net::ListenComm> listener_;
  int peer_;
  Clock::time_point deadline_;
};

// The thread that finishes connections; it sleeps while there are none.
class Connector {
 public:
  ~Connector() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void add(std::shared_ptr<Dial> d) {
    std::lock_guard<std::mutex> lock(mutex_);
    incoming_.push_back(std::move(d));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    wake_.notify_all();
  }

 private:
  void run() {
    std::vector<std::shared_ptr<Dial>> mine;
    int idle = 0;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stop_ || !incoming_.empty() || !mine.empty(); });
        if (stop_) return;
        for (auto& d : incoming_) mine.push_back(std::move(d));
        incoming_.clear();
      }
      const size_t before = mine.size();
      mine.erase(std::remove_if(mine.begin(), mine.end(), [](auto& d) { return d->step(); }),
                 mine.end());
      // Spin briefly while handshakes are moving, then back off to 1 ms.
      idle = mine.size() < before ? 0 : std::min(idle + 1, 1000);
      if (!mine.empty() && idle > 50) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait_for(lock, std::chrono::microseconds(std::min(idle, 1000)),
                       [&] { return stop_ || !incoming_.empty(); });
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::shared_ptr<Dial>> incoming_;
  bool stop_ = false;
  std::thread thread_;
};

class NetSend final : public SendConnection {
 public:
  NetSend(std::shared_ptr<SendDial> dial, const FifoConfig& fifo)
      : dial_(std::move(dial)), fifo_(fifo) {
    slots_.resize(fifo.slotBytes * fifo.slots);
    reqs_.resize(fifo.slots, nullptr);
    sizes_.resize(fifo.slots, 0);
  }
  ~NetSend() override {
    if (dial_) dial_->cancel();
    // The registration first, then the connection (its queue pairs), then the slots
    // (members declared before comm_): a NIC may still be writing until the second.
    if (comm_ && mh_) (void)comm_->deregMr(mh_);
    comm_.reset();
  }

  // Slots fill before the connection is up: they leave once it is.
  Result<void*> trySendSlot() override {
    LOOM_TRY(progress());
    if (posted_ - done_ >= static_cast<uint64_t>(fifo_.slots)) return nullptr;
    return slot(posted_);
  }

  Status postSend(size_t bytes) override {
    sizes_[posted_ % fifo_.slots] = bytes;
    ++posted_;
    return progress();
  }

  Status progress() override {
    LOOM_TRY(error_);
    if (!comm_) {
      {
        std::lock_guard<std::mutex> lock(dial_->mutex);
        if (!dial_->finished) return Status::ok();
        if (!dial_->status) return fail(dial_->status);
        comm_ = std::move(dial_->comm);
      }
      dial_.reset();
      auto mh = comm_->regMr(slots_.data(), slots_.size(), net::MemType::kHost);
      if (!mh) return fail(mh.status());
      mh_ = *mh;
    }
    // Post what is filled, in order; then retire what has left.
    while (sent_ < posted_) {
      const size_t i = sent_ % fifo_.slots;
      LOOM_TRY(fail(comm_->isend(slot(sent_), sizes_[i], 0, mh_, &reqs_[i])));
      if (!reqs_[i]) break;
      ++sent_;
    }
    while (done_ < sent_) {
      bool done = false;
      size_t size = 0;
      LOOM_TRY(fail(comm_->test(reqs_[done_ % fifo_.slots], &done, &size)));
      if (!done) break;
      ++done_;
    }
    return Status::ok();
  }

  bool flushed() const override { return done_ == posted_; }
  void abort() override {
    if (dial_) dial_->cancel();  // not connected yet: stop trying
    if (comm_) comm_->shutdown();
  }

 private:
  void* slot(uint64_t seq) { return slots_.data() + (seq % fifo_.slots) * fifo_.slotBytes; }
  Status fail(Status st) {
    if (!st && error_) error_ = st;
    return st;
  }

  std::vector<char> slots_;         // outlives comm_
  std::shared_ptr<SendDial> dial_;  // until connected
  FifoConfig fifo_;
  std::unique_ptr<net::SendComm> comm_;
  MemHandle mh_ = nullptr;
  std::vector<net::Request*> reqs_;
  std::vector<size_t> sizes_;
  uint64_t posted_ = 0, sent_ = 0, done_ = 0;
  Status error_;
};

class NetRecv final : public RecvConnection {
 public:
  NetRecv(std::shared_ptr<RecvDial> dial, const FifoConfig& fifo)
      : dial_(std::move(dial)), fifo_(fifo) {
    slots_.resize(fifo.slotBytes * fifo.slots);
    reqs_.resize(fifo.slots, nullptr);
  }
  ~NetRecv() override {
    if (dial_) dial_->cancel();
    // The registration first, then the connection (its queue pairs), then the slots
    // (members declared before comm_): a NIC may still be writing until the second.
    if (comm_ && mh_) (void)comm_->deregMr(mh_);
    comm_.reset();
  }

  Result<const void*> tryRecv(size_t* bytes) override {
    LOOM_TRY(progress());
    if (held_) {  // asked again before releasing: the same slot
      *bytes = heldBytes_;
      return static_cast<const void*>(slot(done_));
    }
    if (!comm_ || done_ == posted_) return nullptr;
    bool done = false;
    size_t size = 0;
    LOOM_TRY(fail(comm_->test(reqs_[done_ % fifo_.slots], &done, &size)));
    if (!done) return nullptr;
    *bytes = heldBytes_ = size;
    held_ = true;
    return static_cast<const void*>(slot(done_));
  }

  Status releaseRecv() override {
    held_ = false;
    ++done_;
    return progress();
  }

  Status progress() override {
    LOOM_TRY(error_);
    if (!comm_) {
      {
        std::lock_guard<std::mutex> lock(dial_->mutex);
        if (!dial_->finished) return Status::ok();
        if (!dial_->status) return fail(dial_->status);
        comm_ = std::move(dial_->comm);
      }
      dial_.reset();
      auto mh = comm_->regMr(slots_.data(), slots_.size(), net::MemType::kHost);
      if (!mh) return fail(mh.status());
      mh_ = *mh;
    }
    // A receive posted for every free slot.
    while (posted_ < done_ + fifo_.slots) {
      const size_t i = posted_ % fifo_.slots;
      void* data = slot(posted_);
      size_t size = fifo_.slotBytes;
      int tag = 0;
      LOOM_TRY(fail(comm_->irecv(1, &data, &size, &tag, &mh_, &reqs_[i])));
      if (!reqs_[i]) break;
      ++posted_;
    }
    return Status::ok();
  }

  void abort() override {
    if (dial_) dial_->cancel();  // not connected yet: stop trying
    if (comm_) comm_->shutdown();
  }

 private:
  char* slot(uint64_t seq) { return slots_.data() + (seq % fifo_.slots) * fifo_.slotBytes; }
  Status fail(Status st) {
    if (!st && error_) error_ = st;
    return st;
  }

  std::vector<char> slots_;         // outlives comm_
  std::shared_ptr<RecvDial> dial_;  // until connected
  FifoConfig fifo_;
  std::unique_ptr<net::RecvComm> comm_;
  MemHandle mh_ = nullptr;
  std::vector<net::Request*> reqs_;
  uint64_t posted_ = 0, done_ = 0;
  bool held_ = false;
  size_t heldBytes_ = 0;
  Status error_;
};

class NetSetup final : public RecvSetup {
 public:
  NetSetup(std::unique_ptr<net::ListenComm> listener, const Handle& handle, int peer,
           const FifoConfig& fifo, Connector& connector)
      : listener_(std::move(listener)), peer_(peer), fifo_(fifo), connector_(connector) {
    blob_.size = sizeof(handle.data);
    std::memcpy(blob_.data, handle.data, sizeof(handle.data));
  }
  const Blob& blob() const override { return blob_; }
  Result<std::unique_ptr<RecvConnection>> accept(const Deadline&) override {
    auto dial = std::make_shared<RecvDial>(std::move(listener_), peer_);
    connector_.add(dial);
    return std::unique_ptr<RecvConnection>(new NetRecv(std::move(dial), fifo_));
  }

 private:
  std::unique_ptr<net::ListenComm> listener_;
  int peer_;
  FifoConfig fifo_;
  Connector& connector_;
  Blob blob_;
};

class NetTransport final : public Transport {
 public:
  NetTransport(const TransportContext& ctx, std::unique_ptr<net::Backend> backend)
      : ctx_(ctx), backend_(std::move(backend)), name_(std::string("net/") + backend_->name()) {
    net::Properties p;
    if (backend_->properties(0, &p)) props_ = p;
  }

  const char* name() const override { return name_.c_str(); }

  Capability canConnect(const PeerInfo& self, const PeerInfo& peer) const override {
    Capability c;
    if (self.hostHash == peer.hostHash) {
      c.reason = "same host (shared memory is for that)";
      return c;
    }
    c.reachable = true;
    c.hostMemory = true;
    c.needsProxy = true;  // a connector thread, and the proxy for device buffers
    c.network = true;
    c.bandwidthGBs = props_.speedMbps / 8000.0;
    c.latencyUs = props_.latencyUs;
    return c;
  }

  Result<std::unique_ptr<RecvSetup>> listen(const PeerInfo& peer, const Deadline&) override {
    Handle h;
    std::unique_ptr<net::ListenComm> l;
    LOOM_TRY(backend_->listen(0, &h, &l));
    return std::unique_ptr<RecvSetup>(
        new NetSetup(std::move(l), h, peer.rank, ctx_.fifo, *connector_));
  }

  Result<std::unique_ptr<SendConnection>> connect(const PeerInfo& peer, const Blob& blob,
                                                  const Deadline&) override {
    if (blob.size != sizeof(Handle::data)) {
      return errorf(Code::kRemoteError, "net: rank %d sent a connection blob of %u bytes",
                    peer.rank, blob.size);
    }
    Handle h;
    std::memcpy(h.data, blob.data, sizeof(h.data));
    auto dial = std::make_shared<SendDial>(*backend_, peer.rank, h);
    connector_->add(dial);
    return std::unique_ptr<SendConnection>(new NetSend(std::move(dial), ctx_.fifo));
  }

 private:
  TransportContext ctx_;
  std::unique_ptr<net::Backend> backend_;
  // Declared after the backend: its thread stops (and drops its dials) before the
  // backend goes.
  std::unique_ptr<Connector> connector_ = std::make_unique<Connector>();
  std::string name_;
  net::Properties props_;
};

}  // namespace

Result<std::unique_ptr<Transport>> makeNetTransport(const TransportContext& ctx) {
  net::Context nctx;
  nctx.commHash = ctx.commHash;
  nctx.rank = ctx.self.rank;
  nctx.abortFlag = ctx.abortFlag;
  nctx.hostBuffers = true;
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<net::Backend> backend, net::makeNonSocketBackend(nctx));
  if (!backend) return std::unique_ptr<Transport>();
  LOOM_INFO(kNet, "host buffers between hosts go over net/%s", backend->name());
  return std::unique_ptr<Transport>(new NetTransport(ctx, std::move(backend)));
}

}  // namespace loom::transport
