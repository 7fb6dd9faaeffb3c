// Making network connections with a backend (net.h), the handles travelling through the
// bootstrap, without any rank waiting on a peer that is itself waiting: a receiver
// listens and sends its handle at once (sending never waits for the peer); a sender
// polls for the handle and then connects; a receiver polls its listener. The polls are
// "dialers" that the proxy thread calls until they give a comm (transports/net/proxy.h),
// so the thread that makes a GPU call never waits for a connection; connectPeers() runs
// the same dialers to completion, for callers that want the connections now.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "transports/net/net.h"

namespace loom::transport::net {

// How handles travel between this rank and `peer`.
struct HandleExchange {
  // To the sender `peer`, from this rank (its receiver). May block briefly, never on the peer.
  std::function<Status(int peer, const Handle& handle)> send;
  // From the receiver `peer`: true once it has arrived (never waits).
  std::function<Result<bool>(int peer, Handle* handle)> tryRecv;
  // Optional: an error when `peer`'s process is known to be gone (ok when alive or not
  // known). A dialer still waiting for its peer asks it once a second, so a peer that
  // died before its end of the connection existed costs a second, not LOOM_TIMEOUT_MS.
  // Must return within a fraction of a second (the proxy thread calls it).
  std::function<Status(int peer)> peerAlive;
};

// Called until it leaves a comm in its argument (or fails).
using SendDialer = std::function<Status(std::unique_ptr<SendComm>*)>;
using RecvDialer = std::function<Status(std::unique_ptr<RecvComm>*)>;

// The receiving end of a connection from `peer`: listens and sends the handle now.
// `backend` and `exchange` must outlive the dialer.
Result<RecvDialer> listenFor(Backend& backend, int dev, int peer, const HandleExchange& exchange);
// The sending end of a connection to `peer`: waits for its handle, then connects.
SendDialer dialTo(Backend& backend, int dev, int peer, const HandleExchange& exchange);

// Both directions between this rank (`self`) and `peer` != self, for a backend that says
// duplex(): listens and sends the handle now, marked as an offer to pair (its
// kPairOfferByte). Where the peer's handle carries the offer too, the two make one
// connection: the lower rank dials, and each end takes the other direction from its comm's
// reverse(). Where it does not (the peer needs one direction only now), each direction
// gets a connection of its own, as listenFor and dialTo make them; the handles travel as
// theirs do either way. Each dialer gives its comm as soon as it is connected (a peer that
// dials before it sends its own handle is not kept waiting for it), except that the higher
// rank's send comm of a pair waits until it has taken the lower rank's handle (already on
// its way), which no later connection may take for its own. Call the two dialers from one
// thread (the proxy's): they share their state without a lock. Both ranks decide alike
// where the two make at most one connection each way on `exchange` (the GPU executor's
// lanes, connectPeers' peers named once); with more, a pair may take a handle meant for
// another connection, and the disagreement ends in an error or the timeout.
struct PairDialers {
  SendDialer send;
  RecvDialer recv;
};
Result<PairDialers> pairWith(Backend& backend, int dev, int self, int peer,
                             const HandleExchange& exchange);

struct Connections {
  std::vector<std::unique_ptr<SendComm>> sends;  // in the order of sendPeers
  std::vector<std::unique_ptr<RecvComm>> recvs;  // in the order of recvPeers
};

// Makes the connections now: a collective call, every peer named must make the matching
// one (its recvPeers hold this rank where our sendPeers hold it, and the other way).
// `self` names this rank: a connection to itself exchanges its handle locally. A peer in
// both lists is offered a pair (pairWith) where the backend is duplex().
Status connectPeers(Backend& backend, int dev, int self, const std::vector<int>& sendPeers,
                    const std::vector<int>& recvPeers, const HandleExchange& exchange,
                    const Deadline& deadline, Connections* out);

}  // namespace loom::transport::net
