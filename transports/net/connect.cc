#include "transports/net/connect.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace loom::transport::net {

namespace {

// While a dialer waits for `peer`: once a second, whether its process is gone.
Status checkPeer(const HandleExchange& exchange, int peer, Clock::time_point* next) {
  if (!exchange.peerAlive) return Status::ok();
  const auto now = Clock::now();
  if (now < *next) return Status::ok();
  *next = now + std::chrono::seconds(1);
  return exchange.peerAlive(peer);
}

}  // namespace

Result<RecvDialer> listenFor(Backend& backend, int dev, int peer, const HandleExchange& exchange) {
  Handle h;
  std::unique_ptr<ListenComm> listener;
  LOOM_TRY(backend.listen(dev, &h, &listener));
  LOOM_TRY(exchange.send(peer, h).withContext("sending the connection handle to rank " +
                                              std::to_string(peer)));
  std::shared_ptr<ListenComm> l(std::move(listener));
  auto nextCheck = std::make_shared<Clock::time_point>(Clock::now() + std::chrono::seconds(1));
  return RecvDialer([l, peer, nextCheck, &exchange](std::unique_ptr<RecvComm>* comm) {
    Status st = l->accept(comm);
    if (!st) return st.withContext("accepting the connection from rank " + std::to_string(peer));
    if (!*comm) LOOM_TRY(checkPeer(exchange, peer, nextCheck.get()));
    return Status::ok();
  });
}

SendDialer dialTo(Backend& backend, int dev, int peer, const HandleExchange& exchange) {
  struct State {
    Handle handle;
    bool haveHandle = false;
    Backend* backend;
    Clock::time_point nextCheck = Clock::now() + std::chrono::seconds(1);
    ~State() {
      if (haveHandle) backend->cancelConnect(&handle);  // a no-op once connected
    }
  };
  auto state = std::make_shared<State>();
  state->backend = &backend;
  return SendDialer([state, dev, peer, &exchange](std::unique_ptr<SendComm>* comm) -> Status {
    if (!state->haveHandle) {
      auto got = exchange.tryRecv(peer, &state->handle);
      if (!got)
        return got.status().withContext("receiving the connection handle of rank " +
                                        std::to_string(peer));
      state->haveHandle = *got;
      if (!state->haveHandle) return checkPeer(exchange, peer, &state->nextCheck);
      // A pair's offer: this dialer does not pair, so no way back.
      if (state->backend->duplex()) state->handle.data[kPairOfferByte] = 0;
    }
    Status st = state->backend->connect(dev, &state->handle, peer, comm);
    return st ? st : st.withContext("connecting to rank " + std::to_string(peer));
  });
}

namespace {

// The state both dialers of a pair share; whichever the proxy calls moves it on.
struct Pair {
  Backend* backend = nullptr;
  const HandleExchange* exchange = nullptr;
  int dev = 0;
  int peer = -1;
  bool lower = false;                    // this rank dials where the two pair
  std::unique_ptr<ListenComm> listener;  // ours: the peer dials it, unless we pair and dial
  Handle theirs;                         // the peer's listener
  bool haveHandle = false;
  // Both offered: one connection. Known from the peer's handle or, on the higher rank,
  // from the connection the lower one made (twoWay()), whichever comes first.
  bool paired = false;
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
  bool sendGiven = false;
  bool recvGiven = false;
  Status failed;
  Clock::time_point nextCheck = Clock::now() + std::chrono::seconds(1);

  ~Pair() {
    if (haveHandle) backend->cancelConnect(&theirs);  // a no-op once connected
  }

  Status advance() {
    if (!failed.isOk()) return failed;
    Status st = step();
    if (!st) failed = st;
    return st;
  }

  Status step() {
    if (!haveHandle) {
      auto got = exchange->tryRecv(peer, &theirs);
      if (!got) return got.status().withContext("receiving the connection handle of " + who());
      haveHandle = *got;
      if (haveHandle && theirs.data[kPairOfferByte] == 1) paired = true;
    }
    // The peer's connection to our listener, which may come before its handle: on the lower
    // rank only from a peer that does not pair (one way), on the higher one either way.
    if (!recv && !recvGiven && listener && !(paired && lower)) {
      Status st = listener->accept(&recv);
      if (!st) return st.withContext("accepting the connection from " + who());
      if (recv) {
        listener.reset();
        if (!lower && recv->twoWay()) {
          if (send || sendGiven) return disagree();
          paired = true;
          LOOM_ASSIGN_OR_RETURN(send, recv->reverse());
        }
      }
    }
    if (haveHandle && !send && !sendGiven && !(paired && !lower)) {
      Status st = backend->connect(dev, &theirs, peer, &send);
      if (!st) return st.withContext("connecting to " + who());
      if (send && paired) {
        if (recv || recvGiven) return disagree();
        LOOM_ASSIGN_OR_RETURN(recv, send->reverse());
        listener.reset();  // the peer does not dial it
      }
    }
    const bool sendWaits = !sendGiven && !(send && haveHandle);
    if (sendWaits || (!recv && !recvGiven)) LOOM_TRY(checkPeer(*exchange, peer, &nextCheck));
    return Status::ok();
  }

  std::string who() const { return "rank " + std::to_string(peer); }
  // A connection from the peer that says it pairs where this end already has the
  // direction it would give (the two made more than one connection each way on this
  // exchange, which pairWith does not support): an error now rather than a lost comm.
  Status disagree() const {
    return errorf(Code::kInternalError,
                  "%s and this rank disagree on whether they share one connection (more than "
                  "one connection each way between them on one exchange)",
                  who().c_str());
  }
};

}  // namespace

Result<PairDialers> pairWith(Backend& backend, int dev, int self, int peer,
                             const HandleExchange& exchange) {
  if (!backend.duplex() || peer == self) {
    return errorf(Code::kInternalError, "pairWith: rank %d with rank %d on the %s backend", self,
                  peer, backend.name());
  }
  auto pair = std::make_shared<Pair>();
  pair->backend = &backend;
  pair->exchange = &exchange;
  pair->dev = dev;
  pair->peer = peer;
  pair->lower = self < peer;
  Handle h;
  LOOM_TRY(backend.listen(dev, &h, &pair->listener));
  h.data[kPairOfferByte] = 1;
  LOOM_TRY(exchange.send(peer, h).withContext("sending the connection handle to rank " +
                                              std::to_string(peer)));
  PairDialers d;
  d.send = [pair](std::unique_ptr<SendComm>* comm) -> Status {
    *comm = nullptr;
    LOOM_TRY(pair->advance());
    // Not before the peer's handle is taken (it is on its way: the peer sent it before it
    // dialed), so that no later connection between the two takes it for its own.
    if (pair->send && pair->haveHandle) {
      *comm = std::move(pair->send);
      pair->sendGiven = true;
    }
    return Status::ok();
  };
  d.recv = [pair](std::unique_ptr<RecvComm>* comm) -> Status {
    *comm = nullptr;
    LOOM_TRY(pair->advance());
    if (pair->recv) {
      *comm = std::move(pair->recv);
      pair->recvGiven = true;
    }
    return Status::ok();
  };
  return d;
}

Status connectPeers(Backend& backend, int dev, int self, const std::vector<int>& sendPeers,
                    const std::vector<int>& recvPeers, const HandleExchange& exchange,
                    const Deadline& deadline, Connections* out) {
  out->sends.clear();
  out->recvs.clear();
  out->sends.resize(sendPeers.size());
  out->recvs.resize(recvPeers.size());
  // A connection to this rank itself: its handle goes through a local mailbox.
  struct Local {
    std::mutex mutex;
    std::map<int, Handle> handles;
  };
  auto local = std::make_shared<Local>();
  HandleExchange ex;
  ex.send = [&, local, self](int peer, const Handle& h) {
    if (peer != self) return exchange.send(peer, h);
    std::lock_guard<std::mutex> lock(local->mutex);
    local->handles[peer] = h;
    return Status::ok();
  };
  ex.tryRecv = [&, local, self](int peer, Handle* h) -> Result<bool> {
    if (peer != self) return exchange.tryRecv(peer, h);
    std::lock_guard<std::mutex> lock(local->mutex);
    auto it = local->handles.find(peer);
    if (it == local->handles.end()) return false;
    *h = it->second;
    return true;
  };
  ex.peerAlive = exchange.peerAlive;
  // A peer named once in each list: a pair, where the backend can. (One named more often
  // is not paired: which of its dialers took which handle would then depend on timing.)
  std::map<int, PairDialers> pairs;
  if (backend.duplex()) {
    for (int p : recvPeers) {
      if (p != self && std::count(recvPeers.begin(), recvPeers.end(), p) == 1 &&
          std::count(sendPeers.begin(), sendPeers.end(), p) == 1) {
        LOOM_ASSIGN_OR_RETURN(pairs[p], pairWith(backend, dev, self, p, ex));
      }
    }
  }
  std::vector<RecvDialer> accepts;
  for (int p : recvPeers) {
    if (auto it = pairs.find(p); it != pairs.end()) {
      accepts.push_back(it->second.recv);
      continue;
    }
    LOOM_ASSIGN_OR_RETURN(RecvDialer d, listenFor(backend, dev, p, ex));
    accepts.push_back(std::move(d));
  }
  std::vector<SendDialer> dials;
  for (int p : sendPeers) {
    auto it = pairs.find(p);
    dials.push_back(it != pairs.end() ? it->second.send : dialTo(backend, dev, p, ex));
  }
  size_t left = sendPeers.size() + recvPeers.size();
  while (left > 0) {
    const size_t before = left;
    for (size_t i = 0; i < dials.size(); ++i) {
      if (out->sends[i]) continue;
      LOOM_TRY(dials[i](&out->sends[i]));
      if (out->sends[i]) --left;
    }
    for (size_t i = 0; i < accepts.size(); ++i) {
      if (out->recvs[i]) continue;
      LOOM_TRY(accepts[i](&out->recvs[i]));
      if (out->recvs[i]) --left;
    }
    if (left == 0) break;
    if (deadline.aborted())
      return errorf(Code::kSystemError, "making network connections: aborted");
    if (deadline.expired()) {
      std::string missing;
      for (size_t i = 0; i < sendPeers.size(); ++i) {
        if (!out->sends[i]) missing += " to rank " + std::to_string(sendPeers[i]);
      }
      for (size_t i = 0; i < recvPeers.size(); ++i) {
        if (!out->recvs[i]) missing += " from rank " + std::to_string(recvPeers[i]);
      }
      return errorf(Code::kRemoteError,
                    "making network connections: timed out (LOOM_TIMEOUT_MS=%lld) with these "
                    "still missing:%s",
                    (long long)deadline.totalMs(), missing.c_str());
    }
    if (left == before) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return Status::ok();
}

}  // namespace loom::transport::net
