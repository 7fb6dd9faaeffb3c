#include "comm/bootstrap.h"

#include <unistd.h>

#include <cstring>
#include <thread>

#include "common/handshake.h"
#include "common/log.h"

namespace loom::comm {

namespace {

constexpr uint64_t kMsgMagic = 0x4c4f4f4d42535031ull;  // "LOOMBSP1"
// The tag of Bootstrap::probe's messages (no collective exchange uses it: nextTag() counts
// in steps of 256 from 256, the connection tags set bits 60-62 only).
constexpr uint64_t kAliveTag = ~0ull;

struct JoinRequest {
  uint64_t magic;
  uint64_t secret[2];
  int32_t rank;
  int32_t nranks;
  SocketAddress listen;
};

struct JoinReplyHeader {
  uint64_t magic;
  int32_t code;  // 0: ok, else a Code with a message following
  uint32_t messageBytes;
};

struct MsgHeader {
  uint64_t magic;
  uint64_t secret[2];
  int32_t from;
  int32_t pad;
  uint64_t tag;
  uint64_t size;
};

bool secretMatches(const uint64_t a[2], const uint64_t b[2]) {
  return a[0] == b[0] && a[1] == b[1];
}

void rootMain(Socket listener, IdContents id, int64_t timeoutMs) {
  log::RankScope scope(-1);
  Deadline deadline = Deadline::afterMs(timeoutMs);
  std::vector<Socket> conns;
  std::vector<SocketAddress> table;
  std::vector<bool> seen;
  int nranks = -1;
  int joined = 0;
  auto replyError = [&](Socket& s, Code code, const std::string& msg) {
    JoinReplyHeader h{kMsgMagic, static_cast<int32_t>(code), static_cast<uint32_t>(msg.size())};
    Deadline d = Deadline::afterMs(2000);
    (void)s.sendAll(&h, sizeof(h), d, "joining rank");
    (void)s.sendAll(msg.data(), msg.size(), d, "joining rank");
  };
  // Every connection gets 5 s of its own to present the request; silent or wrong ones
  // are dropped without holding up the others.
  Arrivals arrivals(&listener, sizeof(JoinRequest), 5000, "bootstrap root");
  while (nranks < 0 || joined < nranks) {
    auto accepted = arrivals.next(deadline);
    if (!accepted) {
      std::string missing;
      for (int r = 0; r < nranks; ++r) {
        if (!seen[r]) missing.append(missing.empty() ? "" : ",").append(std::to_string(r));
      }
      std::string msg = "bootstrap root at " + id.root.toString() + ": only " +
                        std::to_string(joined) + " of " + std::to_string(nranks) +
                        " ranks joined within " + std::to_string(timeoutMs) +
                        " ms; missing ranks: " + (missing.empty() ? "?" : missing);
      LOOM_WARN(kBootstrap, "%s", msg.c_str());
      for (auto& c : conns) {
        if (c.isOpen()) replyError(c, Code::kRemoteError, msg);
      }
      return;
    }
    Arrival a = std::move(accepted).value();
    JoinRequest req{};
    std::memcpy(&req, a.hello.data(), sizeof(req));
    if (req.magic != kMsgMagic || !secretMatches(req.secret, id.secret)) {
      arrivals.drop(a, "it did not present this communicator's secret");
      continue;
    }
    Socket s = std::move(a.sock);
    if (nranks < 0) {
      nranks = req.nranks;
      table.assign(nranks > 0 ? nranks : 0, SocketAddress{});
      seen.assign(table.size(), false);
      conns.resize(table.size());
    }
    if (req.nranks != nranks || req.rank < 0 || req.rank >= nranks || seen[req.rank]) {
      std::string msg = "bootstrap: rank " + std::to_string(req.rank) +
                        " joined with nranks=" + std::to_string(req.nranks) +
                        " but the communicator has nranks=" + std::to_string(nranks) +
                        (req.rank >= 0 && req.rank < nranks && seen[req.rank]
                             ? " and that rank already joined (duplicate rank)"
                             : "");
      LOOM_WARN(kBootstrap, "%s", msg.c_str());
      replyError(s, Code::kInvalidUsage, msg);
      continue;
    }
    seen[req.rank] = true;
    table[req.rank] = req.listen;
    conns[req.rank] = std::move(s);
    ++joined;
  }
  JoinReplyHeader ok{kMsgMagic, 0, 0};
  for (int r = 0; r < nranks; ++r) {
    Deadline d = Deadline::afterMs(timeoutMs);
    Status st = conns[r].sendAll(&ok, sizeof(ok), d, "joining rank");
    if (st)
      st = conns[r].sendAll(table.data(), table.size() * sizeof(SocketAddress), d, "joining rank");
    if (!st)
      LOOM_WARN(kBootstrap, "bootstrap root: could not answer rank %d: %s", r,
                st.message().c_str());
  }
  LOOM_INFO(kBootstrap, "bootstrap root %s served %d ranks", id.root.toString().c_str(), nranks);
}

}  // namespace

Status startRoot(IdContents* id, int64_t timeoutMs) {
  LOOM_ASSIGN_OR_RETURN(Socket listener, Socket::listen(id->root));
  LOOM_ASSIGN_OR_RETURN(SocketAddress bound, listener.localAddress());
  id->root = bound;
  std::thread(rootMain, std::move(listener), *id, timeoutMs).detach();
  return Status::ok();
}

Result<std::unique_ptr<Bootstrap>> Bootstrap::join(const IdContents& id, int rank, int nranks,
                                                   int64_t timeoutMs,
                                                   const std::atomic<bool>* abortFlag) {
  std::unique_ptr<Bootstrap> b(new Bootstrap());
  b->rank_ = rank;
  b->nranks_ = nranks;
  b->secret_[0] = id.secret[0];
  b->secret_[1] = id.secret[1];
  b->timeoutMs_ = timeoutMs;
  b->abortFlag_ = abortFlag;
  // Listen where the root can reach us back: the interface that reaches the root.
  LOOM_ASSIGN_OR_RETURN(NetInterface nif, findInterfaceMatching(id.root));
  SocketAddress mine = nif.address;
  mine.setPort(0);
  LOOM_ASSIGN_OR_RETURN(b->listener_, Socket::listen(mine));
  b->arrivals_ = std::make_unique<Arrivals>(&b->listener_, sizeof(MsgHeader), 5000,
                                            "bootstrap rank " + std::to_string(rank));
  LOOM_ASSIGN_OR_RETURN(SocketAddress bound, b->listener_.localAddress());
  LOOM_INFO(kBootstrap, "bootstrap: rank %d of %d listening on %s (%s), root %s", rank, nranks,
            bound.toString().c_str(), nif.name.c_str(), id.root.toString().c_str());

  Deadline deadline = b->deadline();
  auto conn = Socket::connect(id.root, deadline);
  if (!conn)
    return conn.status().withContext("rank " + std::to_string(rank) +
                                     " joining the bootstrap root");
  JoinRequest req{kMsgMagic, {id.secret[0], id.secret[1]}, rank, nranks, bound};
  LOOM_TRY(conn->sendAll(&req, sizeof(req), deadline, "bootstrap root"));
  JoinReplyHeader h{};
  // The root gives up at the same timeout and then says which ranks are missing: wait
  // a little longer than it does so that message arrives.
  Deadline replyDeadline = Deadline::afterMs(timeoutMs + 3000, abortFlag);
  Status st = conn->recvAll(&h, sizeof(h), replyDeadline, "bootstrap root");
  if (!st)
    return st.withContext("rank " + std::to_string(rank) + " waiting for the other ranks to join");
  if (h.magic != kMsgMagic) return errorf(Code::kRemoteError, "bootstrap root sent garbage");
  if (h.code != 0) {
    std::string msg(std::min<uint32_t>(h.messageBytes, 4096), '\0');
    (void)conn->recvAll(msg.data(), msg.size(), replyDeadline, "bootstrap root");
    return Status(static_cast<Code>(h.code), msg);
  }
  b->addresses_.resize(nranks);
  LOOM_TRY(conn->recvAll(b->addresses_.data(), nranks * sizeof(SocketAddress), deadline,
                         "bootstrap root"));
  return b;
}

Bootstrap::~Bootstrap() = default;

Status Bootstrap::send(int peer, uint64_t tag, const void* data, size_t size) {
  std::string what = "rank " + std::to_string(peer);
  Deadline d = deadline();
  // The peer's listener exists from its join to its end: a refusal means it is gone.
  auto s = Socket::connect(addresses_[peer], d, /*retryRefused=*/false);
  if (!s) {
    if (s.status().code() == Code::kRemoteError) {
      return errorf(Code::kRemoteError,
                    "bootstrap: rank %d is gone (its listener at %s refuses connections)", peer,
                    addresses_[peer].toString().c_str());
    }
    return s.status().withContext("bootstrap message to " + what);
  }
  MsgHeader h{kMsgMagic, {secret_[0], secret_[1]}, rank_, 0, tag, size};
  LOOM_TRY(s->sendAll(&h, sizeof(h), d, what.c_str()));
  LOOM_TRY(s->sendAll(data, size, d, what.c_str()));
  // A normal close delivers what is queued; the receiver reads it all before closing.
  return Status::ok();
}

Result<bool> Bootstrap::takeUnexpected(int peer, uint64_t tag, void* data, size_t size) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = unexpected_.find(std::make_pair(peer, tag));
  if (it == unexpected_.end()) return false;
  if (it->second.size() != size) {
    return errorf(Code::kInvalidUsage,
                  "bootstrap: rank %d sent %zu bytes for tag %llx, expected %zu (ranks "
                  "disagree on the operation)",
                  peer, it->second.size(), (unsigned long long)tag, size);
  }
  std::memcpy(data, it->second.data(), size);
  unexpected_.erase(it);
  return true;
}

Status Bootstrap::readMessage(Arrival a) {
  MsgHeader h{};
  std::memcpy(&h, a.hello.data(), sizeof(h));
  if (h.magic != kMsgMagic || !secretMatches(h.secret, secret_) || h.from < 0 ||
      h.from >= nranks_ || h.size > (1ull << 30)) {
    arrivals_->drop(a, "no valid header with this communicator's secret");
    return Status::ok();
  }
  if (h.tag == kAliveTag) return Status::ok();  // a peer asking whether we are still here
  // It knows the secret: a rank of ours, whose payload follows its header at once.
  Deadline hd = Deadline::afterMs(std::min<int64_t>(timeoutMs_, 10000), abortFlag_);
  std::vector<char> payload(h.size);
  Status st = a.sock.recvAll(payload.data(), payload.size(), hd, "bootstrap peer");
  if (!st) return st.withContext("bootstrap: message from rank " + std::to_string(h.from));
  std::lock_guard<std::mutex> lock(mutex_);
  unexpected_[{h.from, h.tag}] = std::move(payload);
  return Status::ok();
}

// Waiting threads hold no lock while they wait: the network proxy polls (tryRecv) for
// its connection handles while another thread of this rank may be in a long recv.
Status Bootstrap::probe(int peer, int64_t ms) {
  if (peer == rank_) return Status::ok();
  auto s =
      Socket::connect(addresses_[peer], Deadline::afterMs(ms, abortFlag_), /*retryRefused=*/false);
  if (!s) {
    if (s.status().code() == Code::kRemoteError) {
      return errorf(Code::kRemoteError,
                    "rank %d is gone (its bootstrap listener at %s refuses connections)", peer,
                    addresses_[peer].toString().c_str());
    }
    return Status::ok();  // slow or unreachable for now: not known to be gone
  }
  MsgHeader h{kMsgMagic, {secret_[0], secret_[1]}, rank_, 0, kAliveTag, 0};
  (void)s->sendAll(&h, sizeof(h), Deadline::afterMs(ms, abortFlag_), "bootstrap peer");
  return Status::ok();
}

Status Bootstrap::recv(int peer, uint64_t tag, void* data, size_t size) {
  Deadline d = deadline();
  Clock::time_point nextProbe = Clock::now() + std::chrono::seconds(1);
  while (true) {
    LOOM_ASSIGN_OR_RETURN(bool got, takeUnexpected(peer, tag, data, size));
    if (got) return Status::ok();
    if (d.aborted() || d.expired()) {
      if (d.aborted()) {
        return errorf(Code::kSystemError,
                      "bootstrap: rank %d waiting for a message from rank %d: aborted", rank_,
                      peer);
      }
      return errorf(Code::kRemoteError,
                    "bootstrap: rank %d waiting for a message from rank %d: no connection arrived "
                    "within %lld ms (LOOM_TIMEOUT_MS)",
                    rank_, peer, (long long)d.totalMs());
    }
    // Every second, whether the peer is still there: a rank that has exited (after init,
    // before the message) refuses connections, and waiting for the whole timeout would
    // only hide that.
    if (Clock::now() >= nextProbe) {
      nextProbe = Clock::now() + std::chrono::seconds(1);
      LOOM_TRY(probe(peer).withContext("bootstrap: rank " + std::to_string(rank_) +
                                       " waiting for a message from rank " + std::to_string(peer)));
    }
    // A short wait, then look again: another thread may have taken our message in.
    Result<Arrival> a = Status(Code::kSystemError, "");
    const Deadline shortWait = Deadline::afterMs(std::min(d.remainingMs(20), 20), abortFlag_);
    {
      std::lock_guard<std::mutex> lock(arrivalsMutex_);
      a = arrivals_->next(shortWait);
    }
    if (!a) {
      // Nothing arrived in the short wait: look again. Anything else (accept() failing
      // for want of file descriptors, say) is this host's problem, not a late peer's.
      if (shortWait.expired() || shortWait.aborted()) continue;
      return a.status().withContext("bootstrap: rank " + std::to_string(rank_) +
                                    " waiting for a message from rank " + std::to_string(peer));
    }
    LOOM_TRY(readMessage(std::move(a).value()));
  }
}

Result<bool> Bootstrap::tryRecv(int peer, uint64_t tag, void* data, size_t size) {
  while (true) {
    LOOM_ASSIGN_OR_RETURN(bool got, takeUnexpected(peer, tag, data, size));
    if (got) return true;
    std::optional<Arrival> a;
    {
      std::unique_lock<std::mutex> lock(arrivalsMutex_, std::try_to_lock);
      if (!lock.owns_lock()) return false;  // another thread is taking arrivals in
      LOOM_ASSIGN_OR_RETURN(a, arrivals_->poll());
    }
    if (!a) return false;
    LOOM_TRY(readMessage(std::move(*a)));
  }
}

Status Bootstrap::allGather(void* data, size_t size) {
  uint64_t tag = nextTag();
  char* base = static_cast<char*>(data);
  const int n = nranks_, r = rank_;
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  for (int s = 0; s < n - 1; ++s) {
    int sendBlock = (r - s + n) % n;
    int recvBlock = (r - s - 1 + n) % n;
    LOOM_TRY(send(next, tag + s, base + sendBlock * size, size));
    LOOM_TRY(recv(prev, tag + s, base + recvBlock * size, size));
  }
  return Status::ok();
}

Status Bootstrap::barrier() {
  std::vector<char> dummy(nranks_, 1);
  return allGather(dummy.data(), 1);
}

}  // namespace loom::comm
