// The network interface (transports/net/net.h) through each backend: sockets over the
// first usable interface of this machine, and ib over the emulated RDMA devices
// (LOOM_IB_EMULATE, transports/net/ib/emulator.h; no hardware here): set-up through
// handles, messages of every size class (on one and several sockets or queue pairs), the
// request limit, strangers at the listener, and a peer that goes away.
#include <gtest/gtest.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/settings.h"
#include "common/socket.h"
#include "transports/net/connect.h"
#include "transports/net/net.h"
#ifdef LOOM_HAVE_VERBS
#include "transports/net/ib/ib.h"
#endif
#ifdef LOOM_HAVE_UCX
#include "transports/net/ucx/ucx.h"
#endif
#include "transports/net/plugin/plugin.h"

namespace loom::transport::net {
namespace {

using settings::ScopedSetting;

// The backend the tests make: sockets unless a test of the Net suite chose ib or ucx.
bool gIb = false;
bool gUcx = false;
int gPlugin = 0;  // the ABI version of loom's exported plugin under test (0: none)

Result<std::unique_ptr<Backend>> makeTested(const Context& ctx) {
  if (gPlugin) {
    std::string why;
    auto b = plugin::makePluginBackend(ctx, "", &why);
    if (b && !*b) return errorf(Code::kSystemError, "no plugin: %s", why.c_str());
    return b;
  }
#ifdef LOOM_HAVE_VERBS
  if (gIb) return ib::makeIbBackend(ctx);
#endif
#ifdef LOOM_HAVE_UCX
  if (gUcx) return ucx::makeUcxBackend(ctx);
#endif
  return makeSocketBackend(ctx);
}

struct Pair {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
  Handle handle;
};

// A connection from rank 1 to rank 0 of one communicator, both ends in this process.
// `beforeConnect` runs between listen and connect (strangers knock then).
template <typename F>
void connectPair(Pair* p, F beforeConnect, uint64_t senderHash = 0x5eed) {
  Context ctx;
  ctx.commHash = 0x5eed;
  ctx.rank = 0;
  ctx.handshakeMs = 300;
  auto b = makeTested(ctx);
  ASSERT_TRUE(b.isOk()) << b.status().message();
  p->backend = std::move(b).value();
  ASSERT_GE(p->backend->devices(), 1);
  std::unique_ptr<ListenComm> listener;
  ASSERT_TRUE(p->backend->listen(0, &p->handle, &listener).isOk());
  beforeConnect(p->handle);
  Context sctx = ctx;
  sctx.rank = 1;
  sctx.commHash = senderHash;
  auto sb = makeTested(sctx);
  ASSERT_TRUE(sb.isOk());
  Handle h = p->handle;
  // A refused sender never gets an accepted connection: give it 1.5 s.
  auto deadline =
      Clock::now() + std::chrono::milliseconds(senderHash == ctx.commHash ? 10000 : 1500);
  while ((!p->send || !p->recv) && Clock::now() < deadline) {
    if (!p->send) {
      Status st = (*sb)->connect(0, &h, 0, &p->send);
      // ib's sender hears that it was refused (sockets' never gets accepted).
      if (!st && senderHash != ctx.commHash) return;
      ASSERT_TRUE(st.isOk()) << st.message();
    }
    if (!p->recv) {
      Status st = listener->accept(&p->recv);
      ASSERT_TRUE(st.isOk()) << st.message();
    }
  }
  if (senderHash != ctx.commHash) return;
  ASSERT_TRUE(p->send && p->recv) << "no connection within 10 s";
}

// Sends `sizes.size()` messages, at most `depth` in flight, each received into a buffer
// of `capacity`; checks every byte and size. `sendsAhead`: a receive is posted only once
// `depth` sends past it have finished (or all have), so that the bytes of the messages
// behind it are already waiting when it reads.
void exchange(Pair& p, const std::vector<size_t>& sizes, size_t capacity, int depth,
              bool sendsAhead = false) {
  const size_t n = sizes.size();
  std::vector<std::vector<unsigned char>> out(n), in(n);
  for (size_t m = 0; m < n; ++m) {
    out[m].resize(sizes[m]);
    for (size_t i = 0; i < sizes[m]; ++i)
      out[m][i] = static_cast<unsigned char>(m * 31 + i * 7 + 1);
    in[m].assign(capacity, 0xee);
  }
  std::vector<Request*> sreq(n, nullptr), rreq(n, nullptr);
  size_t sent = 0, recvd = 0, sdone = 0, rdone = 0;
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (sdone < n || rdone < n) {
    ASSERT_LT(Clock::now(), deadline) << "stuck at send " << sdone << ", receive " << rdone;
    while (sent < n && sent - sdone < size_t(depth)) {
      ASSERT_TRUE(p.send->isend(out[sent].data(), sizes[sent], 0, nullptr, &sreq[sent]).isOk());
      if (!sreq[sent]) break;
      ++sent;
    }
    while (recvd < n && recvd - rdone < size_t(depth)) {
      if (sendsAhead && sdone < n && sdone < recvd + size_t(depth)) break;
      void* data = in[recvd].data();
      int tag = 0;
      MemHandle mh = nullptr;
      ASSERT_TRUE(p.recv->irecv(1, &data, &capacity, &tag, &mh, &rreq[recvd]).isOk());
      if (!rreq[recvd]) break;
      ++recvd;
    }
    if (sdone < sent) {
      bool done = false;
      size_t size = 0;
      Status st = p.send->test(sreq[sdone], &done, &size);
      ASSERT_TRUE(st.isOk()) << st.message();
      if (done) {
        EXPECT_EQ(size, sizes[sdone]);
        ++sdone;
      }
    }
    if (rdone < recvd) {
      bool done = false;
      size_t size = 0;
      Status st = p.recv->test(rreq[rdone], &done, &size);
      ASSERT_TRUE(st.isOk()) << st.message();
      if (done) {
        ASSERT_EQ(size, sizes[rdone]) << "message " << rdone;
        if (size > 0) {
          ASSERT_EQ(std::memcmp(in[rdone].data(), out[rdone].data(), size), 0)
              << "message " << rdone;
        }
        if (size < capacity) {
          EXPECT_EQ(in[rdone][size], 0xee) << "wrote past the message";
        }
        ++rdone;
      }
    }
  }
}

const std::vector<size_t> kSizes = {
    0, 1, 8, 4095, 65535, 65536, 65537, 200000, 1 << 20, (1 << 20) - 3, 77, 0, 524288};

// The cases every backend must pass: "socket"; "ib" over the emulated devices (a short
// ack timeout, so that a peer that is gone fails in well under a second); "ucx" with
// UCX's own choice of transports (here tcp, and cma for large messages: its shared-memory
// ones lack the peer-failure handling the backend asks for) and "ucx_tcp" with UCX_TLS=tcp;
// "plugin_vN": loom's sockets exported through NCCL's plugin ABI version N
// (libnccl-net-loomvN.so) and loaded back through it. The plugin holds its own copy of
// loom's settings, which this process's ScopedSettings do not reach: it runs at the
// defaults (and a short handshake or several sockets are not tested through it).
class Net : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string backend = GetParam();
    if (backend.rfind("plugin_v", 0) == 0) {
      gPlugin = std::stoi(backend.substr(8));
      plugin_.emplace(settings::kNetPlugin, std::string(LOOM_TEST_PLUGIN_DIR) +
                                                "/libnccl-net-loomv" + backend.substr(8) + ".so");
    }
    gIb = backend == "ib";
    gUcx = backend.rfind("ucx", 0) == 0;
    if (gIb) {
#ifndef LOOM_HAVE_VERBS
      GTEST_SKIP() << "built without rdma-core's headers (libibverbs-dev): no ib backend";
#endif
      emulate_.emplace(settings::kIbEmulate, "roce");
      // Retries give up after about half a second without an ack (67 ms a try, 8 tries):
      // a failure still ends the test quickly, and a NIC thread that a loaded 2-core
      // machine starves for 50 ms no longer fails it ("transport retry counter exceeded"
      // in ManyMessagesFullWindow/ib once, with 12 and 2).
      timeout_.emplace(settings::kIbTimeout, "14");
      retry_.emplace(settings::kIbRetryCnt, "7");
    }
    if (gUcx) {
#ifndef LOOM_HAVE_UCX
      GTEST_SKIP() << "built without UCX's headers (libucx-dev): no ucx backend";
#endif
      // UCX reads its variables when a backend makes its context.
      if (backend == "ucx_tcp") setenv("UCX_TLS", "tcp", 1);
    }
  }
  void TearDown() override {
    if (std::string(GetParam()) == "ucx_tcp") unsetenv("UCX_TLS");
    gIb = false;
    gUcx = false;
    gPlugin = 0;
  }
  std::optional<ScopedSetting> emulate_, timeout_, retry_, plugin_;
};

INSTANTIATE_TEST_SUITE_P(Backends, Net,
                         ::testing::Values("socket", "ib", "ucx", "ucx_tcp", "plugin_v8",
                                           "plugin_v9", "plugin_v10", "plugin_v11"),
                         [](const auto& info) { return std::string(info.param); });

TEST_P(Net, Sizes) {
  Pair p;
  connectPair(&p, [](const Handle&) {});
  exchange(p, kSizes, 1 << 20, 8);
}

TEST_P(Net, ManyMessagesFullWindow) {
  Pair p;
  connectPair(&p, [](const Handle&) {});
  std::vector<size_t> many;
  for (int i = 0; i < 300; ++i) many.push_back(kSizes[i % kSizes.size()]);
  exchange(p, many, 1 << 20, kMaxRequests);
}

TEST_P(Net, SeveralQueuePairsOrSockets) {
  ScopedSetting q(settings::kIbQpsPerConnection, "3");
  ScopedSetting t(settings::kSocketNthreads, "1");
  ScopedSetting s(settings::kNsocksPerthread, "3");
  Pair p;
  connectPair(&p, [](const Handle&) {});
  exchange(p, kSizes, 1 << 20, 8);
}

TEST(NetSocket, OneSocket) {
  ScopedSetting t(settings::kSocketNthreads, "1");  // unset, GPU buffers get 4
  Pair p;
  connectPair(&p, [](const Handle&) {});
  exchange(p, kSizes, 1 << 20, 8);
}

TEST(NetSocket, ThreeSocketsStriped) {
  ScopedSetting t(settings::kSocketNthreads, "1");  // the caller moves all three
  ScopedSetting s(settings::kNsocksPerthread, "3");
  Pair p;
  connectPair(&p, [](const Handle&) {});
  exchange(p, kSizes, 1 << 20, 8);
}

// LOOM_UCX_PREPOST on 2 lanes: lane 1's receive is posted with the message while the last
// one was large, and cancelled where the size says small. Runs of large messages, runs of
// small ones longer than the window between them, and single ones either way, so that
// guesses go right and wrong; windows of 8 and of kMaxRequests. (Not with the sends a
// window ahead of the receives: a large ucx send ends only once its receive is posted.)
TEST_P(Net, UcxPrepostedPartsOverTwoLanes) {
  if (!gUcx) GTEST_SKIP() << "a ucx setting";
  ScopedSetting lanes(settings::kUcxLanes, "2");
  ScopedSetting prepost(settings::kUcxPrepost, "1");
  std::vector<size_t> sizes;
  for (int run = 0; run < 3; ++run) {
    for (int i = 0; i < 12; ++i) sizes.push_back((1 << 20) - 64 * i - run);
    for (int i = 0; i < 2 * kMaxRequests + 3; ++i) sizes.push_back(1 + (i * 37) % 4000);
    sizes.push_back(65536);
    sizes.push_back(8);
    sizes.push_back(200000);
    sizes.push_back(0);
  }
  for (int depth : {8, kMaxRequests}) {
    Pair p;
    connectPair(&p, [](const Handle&) {});
    exchange(p, sizes, 1 << 20, depth);
  }
}

// An environment variable set for a scope, as it was before after it (UCX reads its
// variables when a backend makes its context).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// A send that test() has called done reaches the peer while the sender calls nothing more:
// the sender's last test may come while the backend still holds bytes of it (UCX's tcp
// transport finishes a send it has copied into its own buffer, and writes what the socket
// did not take only as its worker progresses). For ucx small socket buffers, so that the
// socket takes only part of each send, and copied sends at every size
// (UCX_ZCOPY_THRESH=inf; by default UCX sends from the caller's buffer from some kilobytes,
// and finishes such a send only once the socket has taken all of it); one message on lane
// 0 (1 lane), and one cut into parts over 3 lane threads (4 lanes).
TEST_P(Net, SendCalledDoneArrivesWithoutMoreCalls) {
  struct Case {
    const char* lanes;
    size_t size;
  };
  std::optional<ScopedEnv> sndbuf, rcvbuf, zcopy;
  if (gUcx) {
    sndbuf.emplace("UCX_TCP_SNDBUF", "16k");
    rcvbuf.emplace("UCX_TCP_RCVBUF", "16k");
    zcopy.emplace("UCX_ZCOPY_THRESH", "inf");
  }
  for (const Case c : {Case{"1", 200000}, Case{"4", 262144}}) {
    ScopedSetting lanes(settings::kUcxLanes, c.lanes);
    std::vector<unsigned char> out(c.size), in(c.size, 0xee);  // outlive the comms
    Pair p;
    ASSERT_NO_FATAL_FAILURE(connectPair(&p, [](const Handle&) {}));
    for (size_t i = 0; i < c.size; ++i) out[i] = static_cast<unsigned char>(i * 13 + 5);
    Request *sreq = nullptr, *rreq = nullptr;
    void* data = in.data();
    size_t capacity = c.size;
    int tag = 0;
    MemHandle mh = nullptr;
    ASSERT_TRUE(p.recv->irecv(1, &data, &capacity, &tag, &mh, &rreq).isOk());
    ASSERT_NE(rreq, nullptr);
    bool sent = false, recvd = false, waitedAfterSent = false;
    size_t size = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!recvd) {
      ASSERT_LT(Clock::now(), deadline)
          << (sent ? "the send was done, its message never came" : "the send never finished");
      if (!sreq) {  // (ib takes a send once the receiver's clear-to-send has come)
        ASSERT_TRUE(p.send->isend(out.data(), c.size, 0, nullptr, &sreq).isOk());
      } else if (!sent) {
        Status st = p.send->test(sreq, &sent, &size);  // the sender's last call once done
        ASSERT_TRUE(st.isOk()) << st.message();
      }
      Status st = p.recv->test(rreq, &recvd, &size);
      ASSERT_TRUE(st.isOk()) << st.message();
      waitedAfterSent = waitedAfterSent || (sent && !recvd);
    }
    ASSERT_EQ(size, c.size);
    EXPECT_EQ(std::memcmp(in.data(), out.data(), c.size), 0);
    while (!sent) {  // (a send may still read `out` after its message has come)
      ASSERT_LT(Clock::now(), deadline) << "the message came, its send never finished";
      size_t sentSize = 0;
      Status st = p.send->test(sreq, &sent, &sentSize);
      ASSERT_TRUE(st.isOk()) << st.message();
    }
    // Over UCX's tcp the send is done before its message has all come: what is tested.
    if (std::string(GetParam()) == "ucx_tcp") {
      EXPECT_TRUE(waitedAfterSent) << "the message came before the send was done";
    }
  }
}

TEST(NetSocket, HelperThreads) {
  ScopedSetting t(settings::kSocketNthreads, "2");
  ScopedSetting s(settings::kNsocksPerthread, "2");
  Pair p;
  connectPair(&p, [](const Handle&) {});
  std::vector<size_t> many;
  for (int i = 0; i < 200; ++i) many.push_back(kSizes[i % kSizes.size()]);
  exchange(p, many, 1 << 20, 32);
}

// Small messages go on socket 0 alone and leave the helpers asleep; runs of them longer
// than the request window, between large ones, must neither reuse a slot a helper has not
// stepped over nor wait for one to wake.
TEST(NetSocket, HelperThreadsRunsOfSmallMessages) {
  ScopedSetting t(settings::kSocketNthreads, "4");
  Pair p;
  connectPair(&p, [](const Handle&) {});
  std::vector<size_t> sizes;
  for (int run = 0; run < 4; ++run) {
    for (int i = 0; i < 3 * kMaxRequests; ++i) sizes.push_back(1 + (i * 37) % 4000);
    sizes.push_back((1 << 20) - run);
  }
  exchange(p, sizes, 1 << 20, kMaxRequests);
}

// Socket 0 of a receive reads ahead 4 KiB at a time: one read then holds several small
// messages, or a message's size and the start of a large one. Sizes about that boundary
// (with the 8-byte size in front), a window of sends finished before each receive is
// posted, so that a read finds the next messages behind the one it was for.
TEST(NetSocket, ReadAheadAcrossMessageBoundaries) {
  std::vector<size_t> sizes = {4087, 4088, 4089, 4095, 4096,  4097, 8184,
                               8192, 3,    0,    1,    70000, 5,    4080};
  for (int i = 0; i < 40; ++i) sizes.push_back(1 + (i * 53) % 300);
  for (const char* threads : {"1", "4"}) {
    ScopedSetting t(settings::kSocketNthreads, threads);
    Pair p;
    connectPair(&p, [](const Handle&) {});
    exchange(p, sizes, 1 << 17, kMaxRequests, /*sendsAhead=*/true);
  }
}

TEST_P(Net, AtMostMaxRequestsInFlight) {
  // ib takes a send only once its receive is posted: post them all first. The buffers
  // outlive the connection (the NIC may still write into them when the test ends).
  std::vector<char> in(kMaxRequests + 1);
  char byte = 1;
  Pair p;
  connectPair(&p, [](const Handle&) {});
  for (int i = 0; gIb && i < kMaxRequests; ++i) {
    void* data = &in[i];
    size_t cap = 1;
    int tag = 0;
    MemHandle mh = nullptr;
    Request* r = nullptr;
    ASSERT_TRUE(p.recv->irecv(1, &data, &cap, &tag, &mh, &r).isOk());
    ASSERT_NE(r, nullptr);
  }
  std::vector<Request*> reqs;
  for (int i = 0; i < kMaxRequests + 1; ++i) {
    Request* r = nullptr;
    auto deadline = Clock::now() + std::chrono::seconds(5);
    do {  // ib: until the receiver's clear-to-send has arrived
      ASSERT_TRUE(p.send->isend(&byte, 1, 0, nullptr, &r).isOk());
    } while (gIb && !r && i < kMaxRequests && Clock::now() < deadline);
    if (i < kMaxRequests) {
      EXPECT_NE(r, nullptr) << i;
    } else {
      EXPECT_EQ(r, nullptr);
    }
  }
}

TEST_P(Net, ReceiveSmallerThanSendIsAnError) {
  Pair p;
  connectPair(&p, [](const Handle&) {});
  std::vector<char> big(1000, 3), small(10);
  Request *s = nullptr, *r = nullptr;
  Status sst = p.send->isend(big.data(), big.size(), 0, nullptr, &s);  // ib: no CTS yet
  void* data = small.data();
  size_t cap = small.size();
  int tag = 0;
  MemHandle mh = nullptr;
  ASSERT_TRUE(p.recv->irecv(1, &data, &cap, &tag, &mh, &r).isOk());
  Status st;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (st && Clock::now() < deadline) {
    bool done = false;
    size_t size = 0;
    st = p.recv->test(r, &done, &size);
    ASSERT_FALSE(done);
    bool sdone = false;
    if (!s && sst) sst = p.send->isend(big.data(), big.size(), 0, nullptr, &s);
    if (s && sst) sst = p.send->test(s, &sdone, &size);
    if (sdone) s = nullptr;
  }
  EXPECT_EQ(st.code(), Code::kInvalidUsage) << st.message();
  if (gIb) {  // the sender knows the size, and says it; the receiver that it did not fit
    EXPECT_EQ(sst.code(), Code::kInvalidUsage);
    EXPECT_NE(sst.message().find("1000-byte message"), std::string::npos) << sst.message();
    EXPECT_NE(st.message().find("larger than this rank's receive"), std::string::npos)
        << st.message();
  } else if (gUcx) {  // UCX says only that it did not fit
    EXPECT_NE(st.message().find("larger than the 10-byte receive"), std::string::npos)
        << st.message();
  } else {
    EXPECT_NE(st.message().find("1000-byte message"), std::string::npos) << st.message();
  }
}

// What a stranger sees of the handle: the listener's address (the backend's layout).
SocketAddress listenerAddress(const Handle& h) {
  SocketAddress a;
  std::memcpy(&a, h.data + sizeof(uint64_t), sizeof(a));
  return a;
}

TEST_P(Net, StrangersAreDroppedWithoutStallingTheListener) {
  Pair p;
  std::vector<Socket> strangers;
  connectPair(&p, [&](const Handle& h) {
    SocketAddress a = listenerAddress(h);
    for (int i = 0; i < 20; ++i) {
      auto s = Socket::connect(a, Deadline::afterMs(2000));
      ASSERT_TRUE(s.isOk());
      if (i % 2 == 0) {  // half say something wrong, half nothing at all
        const char junk[64] = "GET / HTTP/1.0\r\n\r\n";
        ASSERT_TRUE(s->sendAll(junk, sizeof(junk), Deadline::afterMs(2000)).isOk());
      }
      strangers.push_back(std::move(s).value());
    }
  });
  // The real connection was made while the silent strangers still held theirs.
  exchange(p, {1, 100000}, 1 << 20, 2);
}

TEST_P(Net, AnotherCommunicatorIsRefused) {
  if (gPlugin && gPlugin < 11) GTEST_SKIP() << "ABI v" << gPlugin << " carries no communicator id";
  Pair p;
  connectPair(
      &p, [](const Handle&) {}, /*senderHash=*/0xbad);
  EXPECT_FALSE(p.recv) << "a sender of another communicator got in";
}

TEST_P(Net, PeerThatClosesIsARemoteError) {
  Pair p;
  connectPair(&p, [](const Handle&) {});
  std::vector<char> buf(100);
  void* data = buf.data();
  size_t cap = buf.size();
  int tag = 0;
  MemHandle mh = nullptr;
  Request* r = nullptr;
  ASSERT_TRUE(p.recv->irecv(1, &data, &cap, &tag, &mh, &r).isOk());
  p.send.reset();
  Status st;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (st && Clock::now() < deadline) {
    bool done = false;
    size_t size = 0;
    st = p.recv->test(r, &done, &size);
    ASSERT_FALSE(done);
  }
  EXPECT_EQ(st.code(), Code::kRemoteError);
  // Through a plugin the backend does not know the ranks: the transport above names them.
  if (!gPlugin) {
    EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  }
}

TEST(NetSocket, UnknownBackendIsAnErrorThatSaysWhatThereIs) {
  ScopedSetting s(settings::kNet, "Bogus");
  auto b = makeBackend(Context{});
  ASSERT_FALSE(b.isOk());
  EXPECT_NE(b.status().message().find("Socket"), std::string::npos) << b.status().message();
  ScopedSetting t(settings::kNet, "Socket");  // NCCL's spelling
  EXPECT_TRUE(makeBackend(Context{}).isOk());
}

// dma-buf (GPU memory exported for a NIC) is the RDMA backends' to take: sockets refuse it.
TEST(NetSocket, DmaBufRegistrationIsRefused) {
  Pair p;
  connectPair(&p, [](const Handle&) {});
  ASSERT_TRUE(p.send && p.recv);
  char buf[64];
  auto s = p.send->regMrDmaBuf(buf, sizeof buf, MemType::kCuda, 0, 0);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.status().code(), Code::kInvalidUsage);
  EXPECT_NE(s.status().message().find("dma-buf"), std::string::npos) << s.status().message();
  EXPECT_FALSE(p.recv->regMrDmaBuf(buf, sizeof buf, MemType::kCuda, 0, 0).isOk());
  Properties props;
  ASSERT_TRUE(p.backend->properties(0, &props).isOk());
  EXPECT_EQ(props.ptrSupport, kPtrHost);
}

#ifdef LOOM_HAVE_VERBS
// Without an RDMA device (this machine, CI): LOOM_NET=IB is an error that says why, auto
// falls back to sockets.
TEST(NetIb, WithoutDevicesIbIsAnErrorAndAutoIsSockets) {
  ScopedSetting n(settings::kNet, "IB");
  auto b = makeBackend(Context{});
  if (b) GTEST_SKIP() << "this machine has a usable RDMA port";
  EXPECT_NE(b.status().message().find("net/ib"), std::string::npos) << b.status().message();
  EXPECT_NE(b.status().message().find("LOOM_NET"), std::string::npos) << b.status().message();
  ScopedSetting a(settings::kNet, "auto");
  auto s = makeBackend(Context{});
  ASSERT_TRUE(s.isOk()) << s.status().message();
  EXPECT_STREQ((*s)->name(), "socket");
}

// ib over the emulated devices, cases of its own.
class NetIbEmulated : public ::testing::Test {
 protected:
  void SetUp() override { gIb = true; }
  void TearDown() override { gIb = false; }
  ScopedSetting emulate_{settings::kIbEmulate, "roce"};
};

// The emulation's NIC with gdr says what GPUDirect RDMA needs: GPU memory (peer memory and
// dma-buf) in ptrSupport, and a NIC near every GPU; without gdr, host memory alone, and a
// dma-buf registration is refused with what the provider said.
class NetIbEmulatedGdr : public ::testing::Test {
 protected:
  void SetUp() override { gIb = true; }
  void TearDown() override { gIb = false; }
};

TEST_F(NetIbEmulatedGdr, PropertiesSayWhatMemoryTheNicTakes) {
  {
    ScopedSetting e(settings::kIbEmulate, "roce,gdr");
    auto b = makeTested(Context{});
    ASSERT_TRUE(b.isOk()) << b.status().message();
    Properties p;
    ASSERT_TRUE((*b)->properties(0, &p).isOk());
    EXPECT_EQ(p.ptrSupport, kPtrHost | kPtrCuda | kPtrDmaBuf);
    EXPECT_TRUE(p.dmaBufRegistration) << p.dmaBufWhy;
    EXPECT_TRUE(p.nearEveryGpu);
  }
  {
    ScopedSetting e(settings::kIbEmulate, "roce");
    auto b = makeTested(Context{});
    ASSERT_TRUE(b.isOk()) << b.status().message();
    Properties p;
    ASSERT_TRUE((*b)->properties(0, &p).isOk());
    EXPECT_EQ(p.ptrSupport & kPtrDmaBuf, 0);
    EXPECT_FALSE(p.dmaBufRegistration);
    EXPECT_NE(p.dmaBufWhy.find("dma-buf"), std::string::npos) << p.dmaBufWhy;
    EXPECT_FALSE(p.nearEveryGpu);
  }
}

// A listener that is gone (its rank exited) is reported at once, not retried until
// LOOM_TIMEOUT_MS: it was listening before its handle was sent.
TEST_F(NetIbEmulated, ListenerThatIsGoneIsRefusedAtOnce) {
  Context ctx;
  ctx.commHash = 0x5eed;
  auto b = makeTested(ctx);
  ASSERT_TRUE(b.isOk()) << b.status().message();
  Handle h;
  {
    std::unique_ptr<ListenComm> listener;
    ASSERT_TRUE((*b)->listen(0, &h, &listener).isOk());
  }
  ctx.rank = 1;
  auto sb = makeTested(ctx);
  ASSERT_TRUE(sb.isOk());
  std::unique_ptr<SendComm> send;
  Status st;
  const auto start = Clock::now();
  while (st && !send && Clock::now() - start < std::chrono::seconds(5)) {
    st = (*sb)->connect(0, &h, 0, &send);
  }
  ASSERT_FALSE(st.isOk());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
  EXPECT_EQ(st.code(), Code::kRemoteError);
  EXPECT_NE(st.message().find("refused"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st.message();
}

// The handle's field for the sender's state between connect() calls holds whatever the
// peer sent: a value this backend did not make is ignored, never followed. (The offset
// is ib_backend.cc's layout: magic, listener address, nonce, rank, queue pairs, state.)
TEST_F(NetIbEmulated, StatePointerFromTheWireIsNotFollowed) {
  Pair p;
  connectPair(&p, [](const Handle& h) {
    struct Layout {
      uint64_t magic;
      SocketAddress address;
      uint64_t nonce;
      int32_t rank, nqps;
      void* stage;
    };
    const size_t at = offsetof(Layout, stage);
    const uintptr_t junk = 0xdeadbeefcafe0;
    std::memcpy(const_cast<unsigned char*>(h.data) + at, &junk, sizeof(junk));
  });
  exchange(p, {1, 100000}, 1 << 20, 2);
}
#endif

// Handles between ranks that are threads of this process: rank r's exchange posts to and
// takes from one map, (from, to) -> handle.
class Mailbox {
 public:
  HandleExchange exchangeFor(int r) {
    HandleExchange ex;
    ex.send = [this, r](int peer, const Handle& h) {
      std::lock_guard<std::mutex> lock(mutex_);
      mail_[{r, peer}] = h;
      return Status::ok();
    };
    ex.tryRecv = [this, r](int peer, Handle* h) -> Result<bool> {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = mail_.find({peer, r});
      if (it == mail_.end()) return false;
      *h = it->second;
      return true;
    };
    return ex;
  }

 private:
  std::mutex mutex_;
  std::map<std::pair<int, int>, Handle> mail_;
};

// Rank r of a communicator (`hash`) whose ranks are threads: its backend, connected to
// `peers` in both directions.
Status connectThreadRank(int r, uint64_t hash, Mailbox& mail, const std::vector<int>& peers,
                         std::unique_ptr<Backend>* backend, Connections* conns) {
  Context ctx;
  ctx.commHash = hash;
  ctx.rank = r;
  auto b = makeTested(ctx);
  if (!b) return b.status();
  *backend = std::move(b).value();
  return connectPeers(**backend, 0, r, peers, peers, mail.exchangeFor(r), Deadline::afterMs(10000),
                      conns);
}

// connectPeers between 3 ranks as threads, every rank sending to and receiving from
// every rank (itself included), handles passed through in-memory mailboxes.
TEST_P(Net, EveryPairOfThreeRanks) {
  const int n = 3;
  Mailbox mail;
  std::vector<Connections> conns(n);
  std::vector<Status> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Backend> backend;
      results[r] = connectThreadRank(r, 77, mail, {0, 1, 2}, &backend, &conns[r]);
      // Every send connection carries one message naming its two ends. Receives first:
      // ib takes a send only once the receiver has posted its buffer.
      std::vector<int> in(n, -1);
      std::vector<Request*> rreq(n, nullptr);
      for (int q = 0; q < n && results[r]; ++q) {
        void* data = &in[q];
        size_t cap = sizeof(int);
        int tag = 0;
        MemHandle mh = nullptr;
        results[r] = conns[r].recvs[q]->irecv(1, &data, &cap, &tag, &mh, &rreq[q]);
      }
      std::vector<int> out(n);
      for (int q = 0; q < n && results[r]; ++q) {
        out[q] = r * 10 + q;
        Request* req = nullptr;
        while (results[r] && !req)
          results[r] = conns[r].sends[q]->isend(&out[q], sizeof(int), 0, nullptr, &req);
        bool done = false;
        size_t size;
        while (results[r] && !done) results[r] = conns[r].sends[q]->test(req, &done, &size);
      }
      for (int q = 0; q < n && results[r]; ++q) {
        bool done = false;
        size_t size;
        while (results[r] && !done) results[r] = conns[r].recvs[q]->test(rreq[q], &done, &size);
        if (results[r] && in[q] != q * 10 + r)
          results[r] = errorf(Code::kInternalError, "wrong message %d", in[q]);
      }
      // Keep the connections until every rank has read (a closed peer is an error), then
      // close them as a process would, every rank at once.
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      conns[r] = Connections{};
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(results[r].isOk()) << "rank " << r << ": " << results[r].message();
}

// Two ranks that close their send connection before their receive connection, as a
// communicator's destroy may: neither may wait for the other's receive side to move while
// it is itself closing (ucx's flush did, 1 s a lane). Large messages first, so that every
// lane (ucx) or socket has carried data.
TEST_P(Net, ClosingSendsFirstOnBothRanksDoesNotWait) {
  ScopedSetting lanes(settings::kUcxLanes, "4");
  const int n = 2;
  Mailbox mail;
  std::vector<Status> results(n);
  std::vector<double> closeSeconds(n, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const int peer = 1 - r;
      std::unique_ptr<Backend> backend;
      Connections c;
      results[r] = connectThreadRank(r, 78, mail, {peer}, &backend, &c);
      const size_t bytes = 1 << 20;
      std::vector<unsigned char> out(bytes), in(bytes, 0);
      for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<unsigned char>(r * 101 + i * 13 + 1);
      Request* rreq = nullptr;
      Request* sreq = nullptr;
      while (results[r] && !rreq) {
        void* data = in.data();
        size_t cap = bytes;
        int tag = 0;
        MemHandle mh = nullptr;
        results[r] = c.recvs[0]->irecv(1, &data, &cap, &tag, &mh, &rreq);
      }
      while (results[r] && !sreq)
        results[r] = c.sends[0]->isend(out.data(), bytes, 0, nullptr, &sreq);
      bool sent = false, got = false;
      size_t size = 0;
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      while (results[r] && !(sent && got)) {
        if (Clock::now() > deadline) results[r] = errorf(Code::kInternalError, "stuck");
        if (results[r] && !sent) results[r] = c.sends[0]->test(sreq, &sent, &size);
        if (results[r] && !got) results[r] = c.recvs[0]->test(rreq, &got, &size);
      }
      if (results[r]) {
        for (size_t i = 0; i < bytes; ++i) {
          if (in[i] != static_cast<unsigned char>(peer * 101 + i * 13 + 1)) {
            results[r] = errorf(Code::kInternalError, "byte %zu arrived wrong", i);
            break;
          }
        }
      }
      const auto start = Clock::now();
      c.sends.clear();
      c.recvs.clear();
      backend.reset();
      closeSeconds[r] = std::chrono::duration<double>(Clock::now() - start).count();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(results[r].isOk()) << "rank " << r << ": " << results[r].message();
    // ucx took 4 s here when each lane's flush waited for its 1 s limit; 0.05-0.3 s now,
    // under TSan too. The bound leaves room for a loaded machine.
    EXPECT_LT(closeSeconds[r], 1.5) << "rank " << r << " took that long to close";
  }
}

// A sender that goes away with a message in flight, before the receiver has posted for it:
// the receiver then posts and waits, and must end with the message, an error naming the
// peer, or still waiting, never a crash. With UCX 1.13 (Debian 12) the receiving worker
// used to wire its way back to the sender only then, for its first rendezvous reply, and
// UCX aborted the process on an internal assertion in about 1 run in 9 when that failed
// (7 of 60); the set-up now wires both ways while both ends are there (lane.cc).
TEST_P(Net, SenderGoneMidMessageIsAnErrorNotACrash) {
  if (gIb) GTEST_SKIP() << "ib sends only into a posted receive: nothing is in flight before";
  ScopedSetting lanes(settings::kUcxLanes, "2");
  const size_t bytes = 1 << 20;
  for (int round = 0; round < 3; ++round) {
    Pair p;
    connectPair(&p, [](const Handle&) {});
    std::vector<unsigned char> out(bytes, 0x5a);
    Request* sreq = nullptr;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!sreq && Clock::now() < deadline) {
      ASSERT_TRUE(p.send->isend(out.data(), bytes, 0, nullptr, &sreq).isOk());
    }
    ASSERT_NE(sreq, nullptr);
    bool done = false;
    size_t size = 0;
    (void)p.send->test(sreq, &done, &size);  // under way; the receiver has posted nothing
    p.send.reset();
    std::vector<unsigned char> in(bytes, 0);
    void* data = in.data();
    size_t cap = bytes;
    int tag = 0;
    MemHandle mh = nullptr;
    Request* rreq = nullptr;
    Status st = p.recv->irecv(1, &data, &cap, &tag, &mh, &rreq);
    const auto until = Clock::now() + std::chrono::milliseconds(300);
    bool got = false;
    while (st && rreq && !got && Clock::now() < until) st = p.recv->test(rreq, &got, &size);
    if (got) {
      EXPECT_EQ(size, bytes);
    } else if (!st) {
      EXPECT_EQ(st.code(), Code::kRemoteError) << st.message();
    }
  }
}

}  // namespace
}  // namespace loom::transport::net
