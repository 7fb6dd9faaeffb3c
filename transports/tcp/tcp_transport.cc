// `tcp`: the transport that always works. Each connection stripes its slots over
// LOOM_NSOCKS_PERTHREAD sockets; socket 0 carries an 8-byte size header per slot, the
// others carry only their part of large slots. Progress is driven by whoever waits on
// the connection (the communicator's executing thread), with non-blocking sockets and
// poll(), so no thread spins while the kernel moves bytes (see docs/decisions.md).
#include <sys/uio.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "common/handshake.h"
#include "common/log.h"
#include "common/settings.h"
#include "common/socket.h"
#include "transports/transport.h"

namespace loom::transport {
namespace {

constexpr uint64_t kHelloMagic = 0x6c6f6f6d74637031ull;  // "loomtcp1"
constexpr size_t kStripeMin = 128 * 1024;                // below this a slot goes on socket 0 alone
constexpr int kMaxSocks = 16;

struct TcpBlob {
  SocketAddress address;
  uint64_t nonce;
  int32_t nsocks;
};
static_assert(sizeof(TcpBlob) <= kMaxBlob);

struct Hello {
  uint64_t magic;
  uint64_t commHash;
  uint64_t nonce;
  int32_t index;
  int32_t senderRank;
};

// The byte range of slot data that socket k carries for a slot of `total` bytes.
void partRange(size_t total, int k, int nsocks, size_t* begin, size_t* end) {
  if (nsocks == 1 || total < kStripeMin) {
    *begin = 0;
    *end = k == 0 ? total : 0;
    return;
  }
  size_t per = (total + nsocks - 1) / nsocks;
  per = (per + 63) / 64 * 64;
  *begin = std::min(total, per * k);
  *end = std::min(total, per * (k + 1));
}

class SlotRing {
 public:
  SlotRing(size_t slotBytes, int slots) : slotBytes_(slotBytes), slots_(slots) {
    memory_ =
        static_cast<char*>(std::aligned_alloc(4096, (slotBytes * slots + 4095) / 4096 * 4096));
    sizes_.assign(slots, 0);
  }
  ~SlotRing() { std::free(memory_); }
  char* slot(uint64_t i) const { return memory_ + (i % slots_) * slotBytes_; }
  uint64_t& size(uint64_t i) { return sizes_[i % slots_]; }
  int slots() const { return slots_; }
  size_t slotBytes() const { return slotBytes_; }

 private:
  char* memory_;
  size_t slotBytes_;
  int slots_;
  std::vector<uint64_t> sizes_;
};

struct SockState {
  Socket sock;
  uint64_t seq = 0;     // slot this socket is working on
  size_t done = 0;      // bytes of (header + part) done for that slot
  uint64_t header = 0;  // socket 0 on the receive side: header being read
  bool eof = false;     // the peer closed this socket (its data so far stays valid)
};

std::vector<SockState> wrapSockets(std::vector<Socket> socks) {
  std::vector<SockState> out(socks.size());
  for (size_t i = 0; i < socks.size(); ++i) out[i].sock = std::move(socks[i]);
  return out;
}

// After moving bytes of a socket's part: true when the part is done (the socket moves on
// to the next slot), false when it has to wait for the socket.
bool finishPart(SockState& s, size_t want) {
  if (s.done != want) return false;
  ++s.seq;
  s.done = 0;
  return true;
}

class TcpSend : public SendConnection {
 public:
  TcpSend(std::vector<Socket> socks, const FifoConfig& fifo, int peer)
      : ring_(fifo.slotBytes, fifo.slots),
        socks_(wrapSockets(std::move(socks))),
        data_(fifo.slots, nullptr),
        what_("rank " + std::to_string(peer)) {}
  Result<void*> trySendSlot() override {
    LOOM_TRY(progress());
    if (posted_ - completed() >= static_cast<uint64_t>(ring_.slots())) return nullptr;
    return static_cast<void*>(ring_.slot(posted_));
  }
  Status postSend(size_t bytes) override {
    ring_.size(posted_) = bytes;
    data(posted_) = ring_.slot(posted_);
    ++posted_;
    return progress();
  }
  bool sendsFromMemory() const override { return true; }
  Status postSendFrom(const void* from, size_t bytes) override {
    const uint64_t seq = posted_;
    ring_.size(seq) = bytes;
    data(seq) = static_cast<const char*>(from);
    ++posted_;
    LOOM_TRY(progress());
    // Whatever has not left yet moves into the slot, so the caller may reuse its memory.
    if (completed() <= seq) {
      std::memcpy(ring_.slot(seq), from, bytes);
      data(seq) = ring_.slot(seq);
    }
    return Status::ok();
  }
  Status progress() override {
    for (size_t k = 0; k < socks_.size(); ++k) {
      SockState& s = socks_[k];
      while (s.seq < posted_) {
        size_t total = ring_.size(s.seq);
        size_t b, e;
        partRange(total, static_cast<int>(k), static_cast<int>(socks_.size()), &b, &e);
        size_t hdr = k == 0 ? sizeof(uint64_t) : 0;
        size_t want = hdr + (e - b);
        if (s.done < want) {
          size_t n = 0;
          if (s.done < hdr) {
            uint64_t h = total;
            iovec iov[2] = {{reinterpret_cast<char*>(&h) + s.done, hdr - s.done},
                            {const_cast<char*>(data(s.seq)) + b, e - b}};
            msghdr msg{};
            msg.msg_iov = iov;
            msg.msg_iovlen = 2;
            ssize_t r = sendmsg(s.sock.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (r < 0) {
              if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) break;
              return Status(Code::kRemoteError,
                            sysError(errno, "sending to %s", what_.c_str()).message());
            }
            n = static_cast<size_t>(r);
          } else {
            LOOM_ASSIGN_OR_RETURN(
                n, s.sock.sendSome(data(s.seq) + b + (s.done - hdr), want - s.done, what_.c_str()));
          }
          if (n == 0) break;
          s.done += n;
        }
        if (!finishPart(s, want)) break;
      }
    }
    return Status::ok();
  }
  bool flushed() const override { return completed() == posted_; }
  void addPollFds(std::vector<pollfd>* fds) const override {
    for (const auto& s : socks_) {
      if (s.seq < posted_) fds->push_back({s.sock.fd(), POLLOUT, 0});
    }
  }
  bool pollable() const override { return true; }
  void abort() override {
    for (auto& s : socks_) s.sock.shutdown();
  }

 private:
  uint64_t completed() const {
    uint64_t m = posted_;
    for (const auto& s : socks_) m = std::min(m, s.seq);
    return m;
  }
  // Where slot i's bytes are: its ring slot, or the caller's memory during postSendFrom.
  const char*& data(uint64_t i) { return data_[i % data_.size()]; }
  SlotRing ring_;
  std::vector<SockState> socks_;
  std::vector<const char*> data_;
  uint64_t posted_ = 0;
  std::string what_;
};

class TcpRecv : public RecvConnection {
 public:
  TcpRecv(std::vector<Socket> socks, const FifoConfig& fifo, int peer)
      : ring_(fifo.slotBytes, fifo.slots),
        socks_(wrapSockets(std::move(socks))),
        claims_(fifo.slots),
        what_("rank " + std::to_string(peer)) {}
  bool recvsIntoMemory() const override { return true; }
  bool claimRecv(size_t ahead, void* dst, size_t bytes) override {
    if (ahead >= static_cast<size_t>(ring_.slots()) || !broken_.isOk()) return false;
    const uint64_t seq = released_ + ahead;
    if (started(seq)) return false;
    // Socket 0 may have read the slot's header already: then its size is known.
    if (socks_[0].seq == seq && socks_[0].done == sizeof(uint64_t) && ring_.size(seq) > bytes) {
      return false;
    }
    claims_[seq % claims_.size()] = {seq, static_cast<char*>(dst), bytes, true};
    return true;
  }
  void dropClaims() override {
    for (auto& c : claims_) {
      if (c.active && started(c.seq) && c.seq >= released_ && broken_.isOk()) {
        broken_ = errorf(Code::kInternalError,
                         "the connection from %s is unusable: an operation failed after data "
                         "had arrived into the caller's buffers for it",
                         what_.c_str());
      }
      c.active = false;
    }
  }
  Result<const void*> tryRecv(size_t* bytes) override {
    LOOM_TRY(broken_);
    // Only read more when the next slot is not complete: a peer that has sent all and
    // closed must not turn data already here into an error.
    if (complete() <= released_) LOOM_TRY(progress());
    if (complete() <= released_) {
      // Report a close only once a socket that the next slot still needs has ended.
      for (const auto& st : socks_) {
        if (st.eof && st.seq <= released_) return closed_;
      }
      return nullptr;
    }
    *bytes = ring_.size(released_);
    return static_cast<const void*>(dest(released_));
  }
  Status releaseRecv() override {
    Claim& c = claims_[released_ % claims_.size()];
    if (c.seq == released_) c.active = false;
    ++released_;
    return Status::ok();
  }
  Status progress() override {
    const uint64_t limit = released_ + ring_.slots();
    for (size_t k = 0; k < socks_.size(); ++k) {
      SockState& s = socks_[k];
      while (s.seq < limit) {
        size_t hdr = k == 0 ? sizeof(uint64_t) : 0;
        if (k == 0 && s.done < hdr) {
          LOOM_ASSIGN_OR_RETURN(
              size_t n, readSome(s, reinterpret_cast<char*>(&s.header) + s.done, hdr - s.done));
          if (n == 0) break;
          s.done += n;
          if (s.done < hdr) break;
          if (s.header > ring_.slotBytes()) {
            return errorf(Code::kRemoteError,
                          "%s announced a %llu-byte slot, larger than the %zu-byte FIFO slot "
                          "(mismatched LOOM_BUFFSIZE or corrupt stream)",
                          what_.c_str(), (unsigned long long)s.header, ring_.slotBytes());
          }
          ring_.size(s.seq) = s.header;
          // A claim too small for the slot (the ranks disagree on the call) is dropped
          // before any of its data arrives: the executor reports the mismatch.
          Claim& c = claims_[s.seq % claims_.size()];
          if (c.active && c.seq == s.seq && s.header > c.bytes) c.active = false;
          ++headers_;
        }
        if (k != 0 && headers_ <= s.seq) break;  // size of this slot not known yet
        size_t total = ring_.size(s.seq);
        size_t b, e;
        partRange(total, static_cast<int>(k), static_cast<int>(socks_.size()), &b, &e);
        size_t want = hdr + (e - b);
        if (s.done < want) {
          LOOM_ASSIGN_OR_RETURN(size_t n,
                                readSome(s, dest(s.seq) + b + (s.done - hdr), want - s.done));
          if (n == 0) break;
          s.done += n;
        }
        if (!finishPart(s, want)) break;
      }
    }
    return Status::ok();
  }
  void addPollFds(std::vector<pollfd>* fds) const override {
    const uint64_t limit = released_ + ring_.slots();
    for (const auto& s : socks_) {
      if (s.seq < limit) fds->push_back({s.sock.fd(), POLLIN, 0});
    }
  }
  bool pollable() const override { return true; }
  void abort() override {
    for (auto& s : socks_) s.sock.shutdown();
  }

 private:
  // Reads what is there; a closed connection is remembered rather than reported, since
  // the slots already received stay valid (tryRecv reports it once they run out).
  Result<size_t> readSome(SockState& s, void* p, size_t bytes) {
    if (s.eof) return size_t{0};
    auto r = s.sock.recvSome(p, bytes, what_.c_str());
    if (!r.isOk()) {
      if (r.status().code() != Code::kRemoteError) return r.status();
      s.eof = true;
      closed_ = r.status();
      return size_t{0};
    }
    return r;
  }

  uint64_t complete() const {
    uint64_t m = UINT64_MAX;
    for (const auto& s : socks_) m = std::min(m, s.seq);
    return m;
  }
  // Whether any socket has read data (beyond socket 0's header) of slot `seq`.
  bool started(uint64_t seq) const {
    for (size_t k = 0; k < socks_.size(); ++k) {
      const SockState& s = socks_[k];
      const size_t hdr = k == 0 ? sizeof(uint64_t) : 0;
      if (s.seq > seq || (s.seq == seq && s.done > hdr)) return true;
    }
    return false;
  }
  // Where slot `seq`'s data goes: its claim, or its ring slot.
  char* dest(uint64_t seq) {
    const Claim& c = claims_[seq % claims_.size()];
    return c.active && c.seq == seq ? c.dst : ring_.slot(seq);
  }
  struct Claim {
    uint64_t seq = 0;
    char* dst = nullptr;
    size_t bytes = 0;
    bool active = false;
  };
  SlotRing ring_;
  std::vector<SockState> socks_;
  std::vector<Claim> claims_;  // by slot index; active for the claimed seq only
  Status broken_;
  uint64_t released_ = 0;
  uint64_t headers_ = 0;
  Status closed_;
  std::string what_;
};

class TcpTransport;

class TcpSetup : public RecvSetup {
 public:
  TcpSetup(TcpTransport* t, const TcpBlob& b, int peer)
      : transport_(t), nonce_(b.nonce), nsocks_(b.nsocks), peer_(peer) {
    blob_.size = sizeof(TcpBlob);
    std::memcpy(blob_.data, &b, sizeof(b));
  }
  const Blob& blob() const override { return blob_; }
  Result<std::unique_ptr<RecvConnection>> accept(const Deadline& deadline) override;

 private:
  TcpTransport* transport_;
  Blob blob_;
  uint64_t nonce_;
  int nsocks_;
  int peer_;
};

class TcpTransport : public Transport {
 public:
  TcpTransport(const TransportContext& ctx, Socket listener, SocketAddress address, int speedMbps)
      : ctx_(ctx),
        listener_(std::move(listener)),
        speedMbps_(speedMbps),
        address_(address),
        arrivals_(&listener_, sizeof(Hello), 5000, "tcp rank " + std::to_string(ctx.self.rank)),
        rng_(std::random_device{}()) {
    const int64_t threads = static_cast<int64_t>(
        std::min<uint64_t>(settings::get(settings::kSocketNthreads).orAuto(1), kMaxSocks));
    nsocks_ = static_cast<int>(
        std::clamp<int64_t>(settings::get(settings::kNsocksPerthread) * threads, 1, kMaxSocks));
  }
  const char* name() const override { return "tcp"; }
  Capability canConnect(const PeerInfo& self, const PeerInfo& peer) const override {
    Capability c;
    c.reachable = true;
    c.bandwidthGBs = speedMbps_ / 8000.0;  // the interface's, as the net backends report it
    c.latencyUs = 20;
    c.network = true;
    c.fallback = true;
    return c;
  }
  Result<std::unique_ptr<RecvSetup>> listen(const PeerInfo& peer, const Deadline&) override {
    TcpBlob b{};
    b.address = address_;
    b.nonce = rng_();
    b.nsocks = nsocks_;
    return std::unique_ptr<RecvSetup>(new TcpSetup(this, b, peer.rank));
  }
  Result<std::unique_ptr<SendConnection>> connect(const PeerInfo& peer, const Blob& blob,
                                                  const Deadline& deadline) override {
    if (blob.size != sizeof(TcpBlob)) {
      return errorf(Code::kRemoteError, "rank %d sent a malformed tcp connection blob", peer.rank);
    }
    TcpBlob b;
    std::memcpy(&b, blob.data, sizeof(b));
    if (b.nsocks < 1 || b.nsocks > kMaxSocks) {
      return errorf(Code::kRemoteError, "rank %d asked for %d sockets", peer.rank, b.nsocks);
    }
    std::vector<Socket> socks;
    for (int i = 0; i < b.nsocks; ++i) {
      // The peer's listener exists since it sent the blob: a refusal means it is gone.
      auto s = Socket::connect(b.address, deadline, /*retryRefused=*/false);
      if (!s && s.status().code() == Code::kRemoteError) {
        return errorf(Code::kRemoteError,
                      "tcp: rank %d is gone (its listener at %s refuses connections)", peer.rank,
                      b.address.toString().c_str());
      }
      if (!s) {
        return s.status().withContext("tcp connection to rank " + std::to_string(peer.rank) +
                                      " at " + b.address.toString());
      }
      Hello h{kHelloMagic, ctx_.commHash, b.nonce, i, ctx_.self.rank};
      LOOM_TRY(s->sendAll(&h, sizeof(h), deadline, "tcp peer"));
      socks.push_back(std::move(s).value());
    }
    FifoConfig f = ctx_.fifo;
    return std::unique_ptr<SendConnection>(new TcpSend(std::move(socks), f, peer.rank));
  }

  // Accepts until all sockets carrying `nonce` have arrived; others are kept for the
  // set-up they belong to. A connection with a bad hello is dropped and logged.
  Result<std::vector<Socket>> acceptFor(uint64_t nonce, int nsocks, int peer,
                                        const Deadline& deadline) {
    while (true) {
      auto& got = pending_[nonce];
      if (static_cast<int>(got.size()) == nsocks) {
        std::vector<Socket> out;
        for (auto& [idx, s] : got) out.push_back(std::move(s));
        pending_.erase(nonce);
        return out;
      }
      // Each connection has 5 s of its own to say hello; a silent one holds up nobody.
      auto a = arrivals_.next(deadline);
      if (!a) {
        return a.status().withContext("waiting for rank " + std::to_string(peer) +
                                      "'s tcp connections");
      }
      Hello h{};
      std::memcpy(&h, a->hello.data(), sizeof(h));
      if (h.magic != kHelloMagic || h.commHash != ctx_.commHash || h.index < 0 ||
          h.index >= kMaxSocks) {
        arrivals_.drop(*a, "a bad hello (wrong magic or communicator)");
        continue;
      }
      pending_[h.nonce][h.index] = std::move(a->sock);
    }
  }

  const FifoConfig& fifo() const { return ctx_.fifo; }

 private:
  TransportContext ctx_;
  Socket listener_;
  int speedMbps_;  // the listening interface's link speed (kUnknownLinkMbps when not known)
  SocketAddress address_;
  Arrivals arrivals_;  // connections to listener_ until their hello is in
  std::mt19937_64 rng_;
  int nsocks_ = 2;
  std::map<uint64_t, std::map<int, Socket>> pending_;
};

Result<std::unique_ptr<RecvConnection>> TcpSetup::accept(const Deadline& deadline) {
  LOOM_ASSIGN_OR_RETURN(auto socks, transport_->acceptFor(nonce_, nsocks_, peer_, deadline));
  for (auto& s : socks) {
    LOOM_TRY(s.setNonBlocking(true));
    s.setNoDelay();
  }
  return std::unique_ptr<RecvConnection>(new TcpRecv(std::move(socks), transport_->fifo(), peer_));
}

}  // namespace

Result<std::unique_ptr<Transport>> makeTcpTransport(const TransportContext& ctx) {
  LOOM_ASSIGN_OR_RETURN(auto ifs, findInterfacesFromSettings());
  SocketAddress addr = ifs.front().address;
  addr.setPort(0);
  LOOM_ASSIGN_OR_RETURN(Socket listener, Socket::listen(addr));
  LOOM_ASSIGN_OR_RETURN(SocketAddress bound, listener.localAddress());
  LOOM_INFO(kNet, "tcp: listening on %s (%s)", bound.toString().c_str(), ifs.front().name.c_str());
  const int mbps = interfaceSpeedMbps(ifs.front().name);
  return std::unique_ptr<Transport>(
      new TcpTransport(ctx, std::move(listener), bound, mbps > 0 ? mbps : kUnknownLinkMbps));
}

}  // namespace loom::transport
