#include "comm/bootstrap.h"

#include <unistd.h>

#include <cstring>
#include <thread>

#include "common/log.h"

namespace loom::comm {

namespace {

constexpr uint64_t kMsgMagic = 0x4c4f4f4d42535031ull;  // "LOOMBSP1"

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
  while (nranks < 0 || joined < nranks) {
    auto accepted = listener.accept(deadline);
    if (!accepted) {
      std::string missing;
      for (int r = 0; r < nranks; ++r) {
        if (!seen[r]) missing += (missing.empty() ? "" : ",") + std::to_string(r);
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
    Socket s = std::move(accepted).value();
    JoinRequest req{};
    Status st = s.recvAll(&req, sizeof(req), Deadline::afterMs(5000), "joining rank");
    if (!st || req.magic != kMsgMagic || !secretMatches(req.secret, id.secret)) {
      auto pa = s.peerAddress();
      LOOM_WARN(kBootstrap, "bootstrap root: dropped a connection from %s (%s)",
                pa ? pa->toString().c_str() : "?",
                st ? "it did not present this communicator's secret" : st.message().c_str());
      continue;
    }
    if (nranks < 0) {
      nranks = req.nranks;
      table.assign(nranks > 0 ? nranks : 0, SocketAddress{});
      seen.assign(table.size(), false);
      conns.resize(table.size());
    }
    if (req.nranks != nranks || req.rank < 0 || req.rank >= nranks || seen[req.rank]) {
      std::string msg = "bootstrap: rank " + std::to_string(req.rank) + " joined with nranks=" +
                        std::to_string(req.nranks) + " but the communicator has nranks=" +
                        std::to_string(nranks) +
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
    if (st) st = conns[r].sendAll(table.data(), table.size() * sizeof(SocketAddress), d, "joining rank");
    if (!st) LOOM_WARN(kBootstrap, "bootstrap root: could not answer rank %d: %s", r, st.message().c_str());
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
  LOOM_ASSIGN_OR_RETURN(SocketAddress bound, b->listener_.localAddress());
  LOOM_INFO(kBootstrap, "bootstrap: rank %d of %d listening on %s (%s), root %s", rank, nranks,
            bound.toString().c_str(), nif.name.c_str(), id.root.toString().c_str());

  Deadline deadline = b->deadline();
  auto conn = Socket::connect(id.root, deadline);
  if (!conn) return conn.status().withContext("rank " + std::to_string(rank) + " joining the bootstrap root");
  JoinRequest req{kMsgMagic, {id.secret[0], id.secret[1]}, rank, nranks, bound};
  LOOM_TRY(conn->sendAll(&req, sizeof(req), deadline, "bootstrap root"));
  JoinReplyHeader h{};
  // The root gives up at the same timeout and then says which ranks are missing: wait
  // a little longer than it does so that message arrives.
  Deadline replyDeadline = Deadline::afterMs(timeoutMs + 3000, abortFlag);
  Status st = conn->recvAll(&h, sizeof(h), replyDeadline, "bootstrap root");
  if (!st) return st.withContext("rank " + std::to_string(rank) + " waiting for the other ranks to join");
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
  auto s = Socket::connect(addresses_[peer], d);
  if (!s) return s.status().withContext("bootstrap message to " + what);
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

Status Bootstrap::readMessage(Socket s) {
  MsgHeader h{};
  Deadline hd = Deadline::afterMs(std::min<int64_t>(timeoutMs_, 10000), abortFlag_);
  Status st = s.recvAll(&h, sizeof(h), hd, "bootstrap peer");
  if (!st || h.magic != kMsgMagic || !secretMatches(h.secret, secret_) || h.from < 0 ||
      h.from >= nranks_ || h.size > (1ull << 30)) {
    auto pa = s.peerAddress();
    LOOM_WARN(kBootstrap, "bootstrap: rank %d dropped a connection from %s (%s)", rank_,
              pa ? pa->toString().c_str() : "?",
              st ? "no valid header with this communicator's secret" : st.message().c_str());
    return Status::ok();
  }
  std::vector<char> payload(h.size);
  st = s.recvAll(payload.data(), payload.size(), hd, "bootstrap peer");
  if (!st) return st.withContext("bootstrap: message from rank " + std::to_string(h.from));
  std::lock_guard<std::mutex> lock(mutex_);
  unexpected_[{h.from, h.tag}] = std::move(payload);
  return Status::ok();
}

// Waiting threads hold no lock while they wait: the network proxy polls (tryRecv) for
// its connection handles while another thread of this rank may be in a long recv.
Status Bootstrap::recv(int peer, uint64_t tag, void* data, size_t size) {
  Deadline d = deadline();
  while (true) {
    LOOM_ASSIGN_OR_RETURN(bool got, takeUnexpected(peer, tag, data, size));
    if (got) return Status::ok();
    if (d.aborted() || d.expired()) {
      if (d.aborted()) {
        return errorf(Code::kSystemError, "bootstrap: rank %d waiting for a message from rank %d: aborted",
                      rank_, peer);
      }
      return errorf(Code::kRemoteError,
                    "bootstrap: rank %d waiting for a message from rank %d: no connection arrived "
                    "within %lld ms",
                    rank_, peer, (long long)d.totalMs());
    }
    // A short wait, then look again: another thread may have taken our message in.
    auto s = listener_.accept(Deadline::afterMs(std::min(d.remainingMs(20), 20), abortFlag_));
    if (!s) continue;
    LOOM_TRY(readMessage(std::move(s).value()));
  }
}

Result<bool> Bootstrap::tryRecv(int peer, uint64_t tag, void* data, size_t size) {
  while (true) {
    LOOM_ASSIGN_OR_RETURN(bool got, takeUnexpected(peer, tag, data, size));
    if (got) return true;
    int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return false;
      return sysError(errno, "bootstrap: accept");
    }
    Socket s(fd);
    s.setNoDelay();
    LOOM_TRY(readMessage(std::move(s)));
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
