// Both directions between two ranks on one connection (transports/net/connect.h pairWith,
// the socket backend's reverse()): two ranks as threads of this process, handles through an
// in-memory mailbox. One connection where both offer, two where only one does, where
// LOOM_SOCKET_DUPLEX=0 or where connectPeers names a peer twice; the other direction
// arriving later, or the peer dialing before it sends its own handle; messages of every
// size class both ways at once; no way back without the offer; and a peer that closes
// ending both directions with an error.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/settings.h"
#include "transports/net/connect.h"
#include "transports/net/net.h"

namespace loom::transport::net {
namespace {

// The sockets this process has open (listeners and connections).
int openSockets() {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent* e = readdir(d)) {
    char link[64] = {};
    const std::string path = std::string("/proc/self/fd/") + e->d_name;
    if (readlink(path.c_str(), link, sizeof(link) - 1) > 0 && std::strncmp(link, "socket:", 7) == 0)
      ++n;
  }
  closedir(d);
  return n;
}

// Handles between ranks, in the order they were sent.
class Mailbox {
 public:
  HandleExchange exchangeFor(int r) {
    HandleExchange ex;
    ex.send = [this, r](int peer, const Handle& h) {
      std::lock_guard<std::mutex> lock(mutex_);
      mail_[{r, peer}].push_back(h);
      return Status::ok();
    };
    ex.tryRecv = [this, r](int peer, Handle* h) -> Result<bool> {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& q = mail_[{peer, r}];
      if (q.empty() || held_.count({peer, r})) return false;
      *h = q.front();
      q.pop_front();
      return true;
    };
    return ex;
  }
  // Handles from `from` to `to` wait (as one slow on the bootstrap would) while held.
  void hold(int from, int to, bool on) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (on) {
      held_.insert({from, to});
    } else {
      held_.erase({from, to});
    }
  }
  size_t waiting(int from, int to) {
    std::lock_guard<std::mutex> lock(mutex_);
    return mail_[{from, to}].size();
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<int, int>, std::deque<Handle>> mail_;
  std::set<std::pair<int, int>> held_;
};

struct Rank {
  std::unique_ptr<Backend> backend;
  HandleExchange exchange;
  std::unique_ptr<SendComm> send;  // to the other rank
  std::unique_ptr<RecvComm> recv;  // from it
};

// `duplex`: LOOM_SOCKET_DUPLEX of each rank, as its backend reads it when it is made.
void makeRanks(Mailbox& mail, std::array<Rank, 2>* ranks,
               std::array<bool, 2> duplex = {true, true}) {
  for (int r = 0; r < 2; ++r) {
    settings::ScopedSetting d(settings::kSocketDuplex, duplex[r] ? "1" : "0");
    Context ctx;
    ctx.commHash = 0xd0b1e;
    ctx.rank = r;
    auto b = makeSocketBackend(ctx);
    ASSERT_TRUE(b.isOk()) << b.status().message();
    (*ranks)[r].backend = std::move(b).value();
    ASSERT_EQ((*ranks)[r].backend->duplex(), duplex[r]);
    (*ranks)[r].exchange = mail.exchangeFor(r);
  }
}

// Calls the dialers (all non-blocking, from this one thread) until each gave its comm.
void drive(std::vector<SendDialer> sends, std::vector<std::unique_ptr<SendComm>*> sendOut,
           std::vector<RecvDialer> recvs, std::vector<std::unique_ptr<RecvComm>*> recvOut) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (true) {
    bool all = true;
    for (size_t i = 0; i < sends.size(); ++i) {
      if (*sendOut[i]) continue;
      Status st = sends[i](sendOut[i]);
      ASSERT_TRUE(st.isOk()) << st.message();
      all = all && *sendOut[i];
    }
    for (size_t i = 0; i < recvs.size(); ++i) {
      if (*recvOut[i]) continue;
      Status st = recvs[i](recvOut[i]);
      ASSERT_TRUE(st.isOk()) << st.message();
      all = all && *recvOut[i];
    }
    if (all) return;
    ASSERT_LT(Clock::now(), deadline) << "no connection within 10 s";
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Both ranks offer a pair and get their comms (the dialers end with this call: what they
// held that the comms do not, the listeners, is closed).
void pairBoth(std::array<Rank, 2>& ranks) {
  auto p0 = pairWith(*ranks[0].backend, 0, 0, 1, ranks[0].exchange);
  auto p1 = pairWith(*ranks[1].backend, 0, 1, 0, ranks[1].exchange);
  ASSERT_TRUE(p0.isOk() && p1.isOk());
  ASSERT_NO_FATAL_FAILURE(drive({p0->send, p1->send}, {&ranks[0].send, &ranks[1].send},
                                {p0->recv, p1->recv}, {&ranks[0].recv, &ranks[1].recv}));
}

// connectPeers on both ranks at once, each naming the other `times` times in both lists.
void connectBoth(std::array<Rank, 2>& ranks, int times, std::array<Connections, 2>* c) {
  std::array<Status, 2> st;
  auto connect = [&](int r) {
    const std::vector<int> peers(times, 1 - r);
    st[r] = connectPeers(*ranks[r].backend, 0, r, peers, peers, ranks[r].exchange,
                         Deadline::afterMs(10000), &(*c)[r]);
  };
  std::thread other(connect, 1);
  connect(0);
  other.join();
  ASSERT_TRUE(st[0].isOk() && st[1].isOk()) << st[0].message() << st[1].message();
}

// Messages of every size class from `from` to `to`, at most 4 in flight; every byte and
// size checked. Runs on its own thread beside the other direction's.
void oneWay(SendComm& send, RecvComm& recv, int seed) {
  const std::vector<size_t> sizes = {8, 1, 0, 4095, 65536, 200000, 1 << 20, 77, 8, 524288};
  const size_t n = sizes.size(), capacity = 1 << 20;
  std::vector<std::vector<unsigned char>> out(n), in(n);
  for (size_t m = 0; m < n; ++m) {
    out[m].resize(sizes[m]);
    for (size_t i = 0; i < sizes[m]; ++i)
      out[m][i] = static_cast<unsigned char>(seed * 53 + m * 31 + i * 7 + 1);
    in[m].assign(capacity, 0xee);
  }
  std::vector<Request*> sreq(n, nullptr), rreq(n, nullptr);
  size_t sent = 0, posted = 0, sdone = 0, rdone = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (sdone < n || rdone < n) {
    ASSERT_LT(Clock::now(), deadline) << "stuck at send " << sdone << ", receive " << rdone;
    while (sent < n && sent - sdone < 4) {
      ASSERT_TRUE(send.isend(out[sent].data(), sizes[sent], 0, nullptr, &sreq[sent]).isOk());
      if (!sreq[sent]) break;
      ++sent;
    }
    while (posted < n && posted - rdone < 4) {
      void* data = in[posted].data();
      size_t cap = capacity;
      int tag = 0;
      MemHandle mh = nullptr;
      ASSERT_TRUE(recv.irecv(1, &data, &cap, &tag, &mh, &rreq[posted]).isOk());
      if (!rreq[posted]) break;
      ++posted;
    }
    bool done = false;
    size_t size = 0;
    if (sdone < sent) {
      Status st = send.test(sreq[sdone], &done, &size);
      ASSERT_TRUE(st.isOk()) << st.message();
      if (done) ++sdone;
    }
    if (rdone < posted) {
      done = false;
      Status st = recv.test(rreq[rdone], &done, &size);
      ASSERT_TRUE(st.isOk()) << st.message();
      if (done) {
        ASSERT_EQ(size, sizes[rdone]) << "message " << rdone;
        if (size > 0) {
          ASSERT_EQ(std::memcmp(in[rdone].data(), out[rdone].data(), size), 0);
        }
        if (size < capacity) {
          EXPECT_EQ(in[rdone][size], 0xee) << "wrote past message " << rdone;
        }
        ++rdone;
      }
    }
  }
}

// Both directions at once, each on a thread of its own (as a proxy's sends and receives
// of one connection are moved by different calls, and their helpers by different threads).
void bothWays(std::array<Rank, 2>& ranks) {
  std::thread there([&] { oneWay(*ranks[0].send, *ranks[1].recv, 1); });
  oneWay(*ranks[1].send, *ranks[0].recv, 2);
  there.join();
}

// The socket count per connection LOOM_SOCKET_NTHREADS x LOOM_NSOCKS_PERTHREAD gives.
constexpr int kSocks = 4;
constexpr int kBothWays = 2 * kSocks - 1;  // the sockets of a connection both ways

// Every test at kSocks sockets a direction, whatever the environment says.
class NetPair : public ::testing::Test {
 protected:
  settings::ScopedSetting threads_{settings::kSocketNthreads, std::to_string(kSocks)};
  settings::ScopedSetting perThread_{settings::kNsocksPerthread, "1"};
};

TEST_F(NetPair, BothOfferedMakeOneConnection) {
  Mailbox mail;
  std::array<Rank, 2> ranks;
  ASSERT_NO_FATAL_FAILURE(makeRanks(mail, &ranks));
  const int before = openSockets();
  ASSERT_NO_FATAL_FAILURE(pairBoth(ranks));
  // Each end of the one connection holds its sockets (socket 0 both ways, the others one
  // way each: 2 x kSocks - 1); the listeners are gone.
  EXPECT_EQ(openSockets() - before, 2 * kBothWays);
  bothWays(ranks);
}

TEST_F(NetPair, OfferedByOneSideOnlyMakesTwoConnections) {
  Mailbox mail;
  std::array<Rank, 2> ranks;
  ASSERT_NO_FATAL_FAILURE(makeRanks(mail, &ranks));
  const int before = openSockets();
  // Each rank in turn the one that offers (the lower rank dials where both do).
  for (int offers = 0; offers < 2; ++offers) {
    const int other = 1 - offers;
    Rank& a = ranks[offers];
    Rank& b = ranks[other];
    a.send.reset();
    a.recv.reset();
    b.send.reset();
    b.recv.reset();
    auto p = pairWith(*a.backend, 0, offers, other, a.exchange);
    ASSERT_TRUE(p.isOk());
    auto listen = listenFor(*b.backend, 0, offers, b.exchange);
    ASSERT_TRUE(listen.isOk());
    SendDialer dial = dialTo(*b.backend, 0, offers, b.exchange);
    ASSERT_NO_FATAL_FAILURE(
        drive({p->send, dial}, {&a.send, &b.send}, {p->recv, *listen}, {&a.recv, &b.recv}));
    // Two connections one way each, and the listener that listenFor's dialer holds while
    // it lives.
    EXPECT_EQ(openSockets() - before, 4 * kSocks + 1);
    bothWays(ranks);
  }
}

// connectPeers pairs a peer named in both lists, unless LOOM_SOCKET_DUPLEX=0 asks for a
// connection each way.
TEST_F(NetPair, ConnectPeersPairsUnlessDuplexIsOff) {
  for (const char* duplex : {"1", "0"}) {
    settings::ScopedSetting d(settings::kSocketDuplex, duplex);
    Mailbox mail;
    std::array<Rank, 2> ranks;
    ASSERT_NO_FATAL_FAILURE(makeRanks(mail, &ranks, {duplex[0] == '1', duplex[0] == '1'}));
    const int before = openSockets();
    std::array<Connections, 2> c;
    ASSERT_NO_FATAL_FAILURE(connectBoth(ranks, 1, &c));
    EXPECT_EQ(openSockets() - before, duplex[0] == '1' ? 2 * kBothWays : 4 * kSocks)
        << "LOOM_SOCKET_DUPLEX=" << duplex;
    for (int r = 0; r < 2; ++r) {
      ranks[r].send = std::move(c[r].sends[0]);
      ranks[r].recv = std::move(c[r].recvs[0]);
    }
    bothWays(ranks);
  }
}

// The lower rank's handle reaches the higher one only after the lower rank's connection
// did: the higher rank hands over its send comm only once it has taken that handle, so
// that no later connection between the two finds it waiting and dials a closed listener.
TEST_F(NetPair, TheLowerRanksHandleIsTakenWhenItsConnectionCameFirst) {
  Mailbox mail;
  std::array<Rank, 2> ranks;
  ASSERT_NO_FATAL_FAILURE(makeRanks(mail, &ranks));
  mail.hold(0, 1, true);
  auto p0 = pairWith(*ranks[0].backend, 0, 0, 1, ranks[0].exchange);
  auto p1 = pairWith(*ranks[1].backend, 0, 1, 0, ranks[1].exchange);
  ASSERT_TRUE(p0.isOk() && p1.isOk());
  ASSERT_NO_FATAL_FAILURE(drive({p0->send}, {&ranks[0].send}, {p1->recv}, {&ranks[1].recv}));
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(p1->send(&ranks[1].send).isOk());
    ASSERT_FALSE(ranks[1].send) << "handed over before the peer's handle was taken";
  }
  mail.hold(0, 1, false);
  ASSERT_NO_FATAL_FAILURE(drive({p1->send}, {&ranks[1].send}, {p0->recv}, {&ranks[0].recv}));
  EXPECT_EQ(mail.waiting(0, 1), 0u);
  EXPECT_EQ(mail.waiting(1, 0), 0u);
  bothWays(ranks);
}

// A connection made without the offer has no way back: reverse() says so, with one socket
// a direction (where both ways would also be one socket) and with several.
TEST_F(NetPair, NoWayBackWithoutTheOffer) {
  for (const char* threads : {"1", "4"}) {
    settings::ScopedSetting t(settings::kSocketNthreads, threads);
    Mailbox mail;
    std::array<Rank, 2> ranks;
    ASSERT_NO_FATAL_FAILURE(makeRanks(mail, &ranks));
    auto listen = listenFor(*ranks[0].backend, 0, 1, ranks[0].exchange);
    ASSERT_TRUE(listen.isOk());
    SendDialer dial = dialTo(*ranks[1].backend, 0, 0, ranks[1].exchange);
    ASSERT_NO_FATAL_FAILURE(drive({dial}, {&ranks[1].send}, {*listen}, {&ranks[0].recv}));
    EXPECT_FALSE(ranks[1].send->twoWay() || ranks[0].recv->twoWay()) << threads << " threads";
    EXPECT_EQ(ranks[1].send->reverse().status().code(), Code::kInternalError);
    EXPECT_EQ(ranks[0].recv->reverse().status().code(), Code::kInternalError);
    ASSERT_NO_FATAL_FAILURE(oneWay(*ranks[1].send, *ranks[0].recv, 5));
  }
}

// Rank `pairer` pairs; rank `dialer` sends first (dialTo) and only then, in a later call,
// gets to its receive (listenFor). The pair hands over the receive connection the dialer
// made at once, without the dialer's handle (which comes only with that later call), and
// the dialer's connection stays one way.
void dialsFirstThenListens(std::array<Rank, 2>& ranks, int pairer, int dialer, int seed) {
  Rank& p = ranks[pairer];
  Rank& d = ranks[dialer];
  auto pair = pairWith(*p.backend, 0, pairer, dialer, p.exchange);
  ASSERT_TRUE(pair.isOk());
  SendDialer first = dialTo(*d.backend, 0, pairer, d.exchange);
  ASSERT_NO_FATAL_FAILURE(drive({first}, {&d.send}, {pair->recv}, {&p.recv}));
  EXPECT_FALSE(d.send->twoWay()) << "the dialer did not pair: one way";
  ASSERT_NO_FATAL_FAILURE(oneWay(*d.send, *p.recv, seed));
  auto later = listenFor(*d.backend, 0, pairer, d.exchange);
  ASSERT_TRUE(later.isOk());
  ASSERT_NO_FATAL_FAILURE(drive({pair->send}, {&p.send}, {*later}, {&d.recv}));
  bothWays(ranks);
}

// Both ranks pair, and the peer dials before it listens: whether this rank is the lower or
// the higher one.
TEST_F(NetPair, PeerDialsBeforeItListens) {
  for (int pairer = 0; pairer < 2; ++pairer) {
    Mailbox mail;
    std::array<Rank, 2> ranks;
    ASSERT_NO_FATAL_FAILURE(makeRanks(mail, &ranks));
    ASSERT_NO_FATAL_FAILURE(dialsFirstThenListens(ranks, pairer, 1 - pairer, 6));
  }
}

// One rank with LOOM_SOCKET_DUPLEX=0 beside one that pairs: the first sends in one call and
// receives in a later one, dialing the pairing rank's handle (which carries the offer) one
// way, so the pair does not take its connection for a shared one. Both orders of rank.
TEST_F(NetPair, DuplexOffBesideAPair) {
  for (int off = 0; off < 2; ++off) {
    const int on = 1 - off;
    Mailbox mail;
    std::array<Rank, 2> ranks;
    std::array<bool, 2> duplex;
    duplex[off] = false;
    duplex[on] = true;
    ASSERT_NO_FATAL_FAILURE(makeRanks(mail, &ranks, duplex));
    ASSERT_NO_FATAL_FAILURE(dialsFirstThenListens(ranks, on, off, 11));
  }
}

// A peer named twice in connectPeers' lists is not paired (which dialer takes which handle
// would depend on timing): two connections each way, each carrying its own messages.
TEST_F(NetPair, ConnectPeersLeavesAPeerNamedTwiceUnpaired) {
  Mailbox mail;
  std::array<Rank, 2> ranks;
  ASSERT_NO_FATAL_FAILURE(makeRanks(mail, &ranks));
  const int before = openSockets();
  std::array<Connections, 2> c;
  ASSERT_NO_FATAL_FAILURE(connectBoth(ranks, 2, &c));
  EXPECT_EQ(openSockets() - before, 8 * kSocks);
  for (int i = 0; i < 2; ++i) {
    ASSERT_NO_FATAL_FAILURE(oneWay(*c[0].sends[i], *c[1].recvs[i], 7 + i));
    ASSERT_NO_FATAL_FAILURE(oneWay(*c[1].sends[i], *c[0].recvs[i], 9 + i));
  }
}

// The peer needs one direction now and the other in a later call (a group of sends, then
// one of receives): the pair's receive waits for that later connection, unhurried.
TEST_F(NetPair, TheOtherDirectionLater) {
  Mailbox mail;
  std::array<Rank, 2> ranks;
  ASSERT_NO_FATAL_FAILURE(makeRanks(mail, &ranks));
  auto p = pairWith(*ranks[1].backend, 0, 1, 0, ranks[1].exchange);
  ASSERT_TRUE(p.isOk());
  auto listen = listenFor(*ranks[0].backend, 0, 1, ranks[0].exchange);
  ASSERT_TRUE(listen.isOk());
  ASSERT_NO_FATAL_FAILURE(drive({p->send}, {&ranks[1].send}, {*listen}, {&ranks[0].recv}));
  std::unique_ptr<RecvComm> early;
  ASSERT_TRUE(p->recv(&early).isOk());
  EXPECT_FALSE(early) << "a receive connection nobody has made yet";
  ASSERT_NO_FATAL_FAILURE(oneWay(*ranks[1].send, *ranks[0].recv, 3));
  SendDialer later = dialTo(*ranks[0].backend, 0, 1, ranks[0].exchange);
  ASSERT_NO_FATAL_FAILURE(drive({later}, {&ranks[0].send}, {p->recv}, {&ranks[1].recv}));
  bothWays(ranks);
}

// A rank whose comms of the pair close: the other rank's receive and send both fail with
// an error naming it (never a hang, never a made-up message).
TEST_F(NetPair, PeerThatClosesFailsBothDirections) {
  Mailbox mail;
  std::array<Rank, 2> ranks;
  ASSERT_NO_FATAL_FAILURE(makeRanks(mail, &ranks));
  ASSERT_NO_FATAL_FAILURE(pairBoth(ranks));
  // Closing one direction leaves the other working: the sockets close with the last.
  ranks[1].recv.reset();
  ASSERT_NO_FATAL_FAILURE(oneWay(*ranks[1].send, *ranks[0].recv, 4));
  ranks[1].send.reset();
  std::vector<unsigned char> in(64, 0);
  void* data = in.data();
  size_t cap = in.size();
  int tag = 0;
  MemHandle mh = nullptr;
  Request* r = nullptr;
  ASSERT_TRUE(ranks[0].recv->irecv(1, &data, &cap, &tag, &mh, &r).isOk());
  ASSERT_NE(r, nullptr);
  bool done = false;
  size_t size = 0;
  Status st;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (st.isOk() && !done && Clock::now() < deadline) st = ranks[0].recv->test(r, &done, &size);
  EXPECT_FALSE(done);
  EXPECT_EQ(st.code(), Code::kRemoteError) << st.message();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  // The send side: the failed receive shut the shared sockets, so sends fail too.
  std::vector<unsigned char> out(1 << 20, 0x3c);
  st = Status::ok();
  done = false;
  for (int m = 0; m < 64 && st.isOk() && Clock::now() < deadline; ++m) {
    Request* s = nullptr;
    st = ranks[0].send->isend(out.data(), out.size(), 0, nullptr, &s);
    while (st.isOk() && s && !done && Clock::now() < deadline)
      st = ranks[0].send->test(s, &done, &size);
    done = false;
  }
  EXPECT_EQ(st.code(), Code::kRemoteError) << st.message();
}

}  // namespace
}  // namespace loom::transport::net
