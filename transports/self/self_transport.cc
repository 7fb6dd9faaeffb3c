// `self`: a rank talking to itself (send/recv to its own rank, alltoall's own block).
// The FIFO lives in ordinary memory shared by the two connection objects.
#include <cstdlib>
#include <memory>

#include "transports/memory_fifo.h"
#include "transports/transport.h"

namespace loom::transport {
namespace {

struct SelfFifo {
  explicit SelfFifo(const FifoConfig& cfg) {
    bytes = fifoBytes(cfg.slotBytes, cfg.slots);
    memory = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    FifoView::init(memory, cfg.slotBytes, cfg.slots, 0);
  }
  ~SelfFifo() { std::free(memory); }
  void* memory = nullptr;
  size_t bytes = 0;
};

class SelfSend : public SendConnection {
 public:
  explicit SelfSend(std::shared_ptr<SelfFifo> fifo)
      : fifo_(std::move(fifo)), view_(fifo_->memory) {}
  Result<void*> trySendSlot() override { return view_.trySendSlot(sent_); }
  Status postSend(size_t bytes) override {
    view_.post(sent_++, bytes);
    return Status::ok();
  }

 private:
  std::shared_ptr<SelfFifo> fifo_;
  FifoView view_;
  uint64_t sent_ = 0;
};

class SelfRecv : public RecvConnection {
 public:
  explicit SelfRecv(std::shared_ptr<SelfFifo> fifo)
      : fifo_(std::move(fifo)), view_(fifo_->memory) {}
  Result<const void*> tryRecv(size_t* bytes) override { return view_.tryRecv(received_, bytes); }
  Status releaseRecv() override {
    view_.release(received_++);
    return Status::ok();
  }

 private:
  std::shared_ptr<SelfFifo> fifo_;
  FifoView view_;
  uint64_t received_ = 0;
};

class SelfSetup : public RecvSetup {
 public:
  explicit SelfSetup(std::shared_ptr<SelfFifo> fifo) : fifo_(std::move(fifo)) {}
  const Blob& blob() const override { return blob_; }
  Result<std::unique_ptr<RecvConnection>> accept(const Deadline&) override {
    return std::unique_ptr<RecvConnection>(new SelfRecv(fifo_));
  }

 private:
  std::shared_ptr<SelfFifo> fifo_;
  Blob blob_;
};

class SelfTransport : public Transport {
 public:
  explicit SelfTransport(const TransportContext& ctx) : ctx_(ctx) {}
  const char* name() const override { return "self"; }
  Capability canConnect(const PeerInfo& self, const PeerInfo& peer) const override {
    Capability c;
    c.reachable = self.rank == peer.rank;
    c.bandwidthGBs = 10;
    c.latencyUs = 0.1;
    if (!c.reachable) c.reason = "not the same rank";
    return c;
  }
  Result<std::unique_ptr<RecvSetup>> listen(const PeerInfo&, const Deadline&) override {
    pending_ = std::make_shared<SelfFifo>(ctx_.fifo);
    return std::unique_ptr<RecvSetup>(new SelfSetup(pending_));
  }
  Result<std::unique_ptr<SendConnection>> connect(const PeerInfo&, const Blob&,
                                                  const Deadline&) override {
    if (!pending_) return errorf(Code::kInternalError, "self transport: connect before listen");
    auto conn = std::unique_ptr<SendConnection>(new SelfSend(std::move(pending_)));
    pending_.reset();
    return conn;
  }

 private:
  TransportContext ctx_;
  std::shared_ptr<SelfFifo> pending_;  // listen() then connect(): one rank does both
};

}  // namespace

std::unique_ptr<Transport> makeSelfTransport(const TransportContext& ctx) {
  return std::make_unique<SelfTransport>(ctx);
}

}  // namespace loom::transport
