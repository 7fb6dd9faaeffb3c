// The proxy (transports/net/proxy.h) between two ranks of this process over the socket
// backend, with host threads doing what the GPU kernels do with the FIFOs: fill send
// slots and post them, take receive slots and release them (net_fifo.h's protocol).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/settings.h"
#include "transports/net/connect.h"
#include "transports/net/net_fifo.h"
#include "transports/net/proxy.h"

namespace loom::transport::net {
namespace {

constexpr uint32_t kSlots = 4;
constexpr uint64_t kSlotBytes = 256 * 1024;

uint64_t loadAcquire(uint64_t* p) {
  return std::atomic_ref<uint64_t>(*p).load(std::memory_order_acquire);
}
void storeRelease(uint64_t* p, uint64_t v) {
  std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release);
}
uint32_t closedOf(const Fifo& f) {
  return std::atomic_ref<uint32_t>(f.header->closed).load();
}

struct FifoMemory {
  void* p = nullptr;
  Fifo fifo;
  FifoMemory(int peer) {
    const size_t bytes = fifoBytes(kSlots, kSlotBytes);
    p = std::aligned_alloc(4096, bytes);
    std::memset(p, 0, bytes);
    fifo = fifoAt(p, kSlots, kSlotBytes, peer);
  }
  ~FifoMemory() { std::free(p); }
};

// Rank r of two: a backend, a proxy, a send FIFO to the other rank and a receive FIFO
// from it.
struct Side {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<FifoMemory> send, recv;
  std::unique_ptr<Proxy> proxy;  // goes first: its thread uses the FIFOs
};

void makeSides(Side* sides) {
  std::vector<Connections> conns(2);
  std::vector<Status> st(2);
  Handle mail[2];
  std::atomic<bool> posted[2] = {false, false};
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    Context ctx;
    ctx.commHash = 99;
    ctx.rank = r;
    auto b = makeSocketBackend(ctx);
    ASSERT_TRUE(b.isOk());
    sides[r].backend = std::move(b).value();
  }
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      HandleExchange ex;
      ex.send = [&, r](int, const Handle& h) {
        mail[r] = h;
        posted[r] = true;
        return Status::ok();
      };
      ex.tryRecv = [&](int peer, Handle* h) -> Result<bool> {
        if (!posted[peer]) return false;
        *h = mail[peer];
        return true;
      };
      st[r] = connectPeers(*sides[r].backend, 0, r, {1 - r}, {1 - r}, ex, Deadline::afterMs(10000),
                           &conns[r]);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(st[r].isOk()) << st[r].message();
    sides[r].proxy = std::make_unique<Proxy>(r, 1000);
    sides[r].send = std::make_unique<FifoMemory>(1 - r);
    sides[r].recv = std::make_unique<FifoMemory>(1 - r);
    sides[r].proxy->addSend(std::move(conns[r].sends[0]), sides[r].send->fifo);
    sides[r].proxy->addRecv(std::move(conns[r].recvs[0]), sides[r].recv->fifo);
  }
}

unsigned char pattern(int from, uint64_t msg, size_t i) {
  return static_cast<unsigned char>(from * 101 + msg * 7 + i);
}
// Empty, small (tagged words: up to kFifoSmallBytes, the edges included) and slot-sized
// messages.
size_t sizeOf(uint64_t msg) {
  if (msg % 5 == 0) return 0;
  if (msg % 5 == 1) return msg % 3 == 0 ? kFifoSmallBytes : (msg * 37) % kFifoSmallBytes + 1;
  if (msg % 5 == 2) return kFifoSmallBytes + 1 + msg % 5;
  return (msg * 40503) % kSlotBytes + 1;
}

// What a kernel does: posts `n` messages and checks `n` from the peer.
void kernelLike(int r, Side& s, uint64_t n, std::string* error) {
  const Fifo& out = s.send->fifo;
  const Fifo& in = s.recv->fifo;
  uint64_t sent = 0, got = 0;
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while ((sent < n || got < n) && error->empty()) {
    if (Clock::now() > deadline) {
      *error = "rank " + std::to_string(r) + " timed out at " + std::to_string(sent) + "/" +
               std::to_string(got);
      return;
    }
    if (sent < n && sent - loadAcquire(&out.header->done) < kSlots) {
      const size_t bytes = sizeOf(sent);
      uint64_t* head = &out.header->head[sent % kSlots];
      if (out.isSmall(bytes)) {
        // As the kernel's threads may: the head first, then the words in any order (here
        // last to first); never into the slot.
        std::atomic_ref<uint64_t>(*head).store(fifoHead(sent, bytes), std::memory_order_relaxed);
        for (uint32_t w = fifoWords(bytes); w-- > 0;) {
          uint32_t payload = 0;
          for (size_t i = 4 * w; i < std::min<size_t>(bytes, 4 * w + 4); ++i)
            payload |= uint32_t{pattern(r, sent, i)} << (8 * (i - 4 * w));
          std::atomic_ref<uint64_t>(out.header->ll[sent % kSlots][w])
              .store(fifoWord(sent, payload), std::memory_order_relaxed);
        }
      } else {
        char* slot = out.slot(sent);
        for (size_t i = 0; i < bytes; ++i) slot[i] = static_cast<char>(pattern(r, sent, i));
        storeRelease(head, fifoHead(sent, bytes));
      }
      ++sent;
      s.proxy->kick();
    }
    if (uint64_t head;
        got < n && fifoHeadIs(head = loadAcquire(&in.header->head[got % kSlots]), got)) {
      const size_t bytes = fifoHeadSize(head);
      if (bytes != sizeOf(got)) {
        *error = "message " + std::to_string(got) + " has " + std::to_string(bytes) + " bytes";
        return;
      }
      const unsigned char* slot = reinterpret_cast<const unsigned char*>(in.slot(got));
      for (size_t i = 0; i < bytes; ++i) {
        if (slot[i] != pattern(1 - r, got, i)) {
          *error = "message " + std::to_string(got) + " byte " + std::to_string(i) + " is wrong";
          return;
        }
      }
      // A small one also as tagged words, the same bytes.
      for (uint32_t w = 0; in.isSmall(bytes) && w < fifoWords(bytes); ++w) {
        const uint64_t word = loadAcquire(&in.header->ll[got % kSlots][w]);
        uint32_t expect = 0;
        std::memcpy(&expect, slot + 4 * w, std::min<size_t>(4, bytes - 4 * w));
        if (!fifoHeadIs(word, got) || static_cast<uint32_t>(word) != expect) {
          *error = "message " + std::to_string(got) + " word " + std::to_string(w) + " is wrong";
          return;
        }
      }
      storeRelease(&in.header->done, ++got);
    }
  }
}

void runBothWays(uint64_t n) {
  Side sides[2];
  makeSides(sides);
  std::string errors[2];
  std::thread a([&] { kernelLike(0, sides[0], n, &errors[0]); });
  std::thread b([&] { kernelLike(1, sides[1], n, &errors[1]); });
  a.join();
  b.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  for (auto& s : sides)
    EXPECT_TRUE(s.proxy->firstError().isOk()) << s.proxy->firstError().message();
}

TEST(NetProxy, MessagesBothWays) {
  runBothWays(300);
}

TEST(NetProxy, StripedOverHelperThreads) {
  settings::ScopedSetting t(settings::kSocketNthreads, "2");
  settings::ScopedSetting k(settings::kNsocksPerthread, "2");
  runBothWays(300);
}

TEST(NetProxy, SendsPostedBeforeTheEndStillLeave) {
  Side sides[2];
  makeSides(sides);
  // Rank 1 posts 3 slots and its proxy is destroyed at once; rank 0 still gets them.
  const Fifo& out = sides[1].send->fifo;
  for (uint64_t m = 0; m < 3; ++m) {
    const size_t bytes = 100000 + m;
    std::memset(out.slot(m), static_cast<int>(m + 1), bytes);
    storeRelease(&out.header->head[m], fifoHead(m, bytes));
  }
  sides[1].proxy.reset();
  const Fifo& in = sides[0].recv->fifo;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!fifoHeadIs(loadAcquire(&in.header->head[2]), 2) && Clock::now() < deadline)
    std::this_thread::yield();
  for (uint64_t m = 0; m < 3; ++m) {
    ASSERT_TRUE(fifoHeadIs(loadAcquire(&in.header->head[m]), m)) << m;
    EXPECT_EQ(fifoHeadSize(in.header->head[m]), 100000 + m);
    EXPECT_EQ(in.slot(m)[99999], static_cast<char>(m + 1));
  }
}

TEST(NetProxy, PeerGoneClosesTheFifoAndSaysWho) {
  Side sides[2];
  makeSides(sides);
  sides[1].proxy.reset();  // its connections close
  const Fifo& in = sides[0].recv->fifo;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (closedOf(in) == kNetOpen && Clock::now() < deadline) std::this_thread::yield();
  EXPECT_EQ(closedOf(in), kNetPeerClosed);
  Status st = sides[0].proxy->status(1, /*send=*/false);
  EXPECT_EQ(st.code(), Code::kRemoteError);
  EXPECT_NE(st.message().find("from rank 1"), std::string::npos) << st.message();
}

// A peer that is gone before its end of the connections exists: the dialers, waiting for
// its handle or its connection, ask whether it lives once a second, and fail then
// instead of at their 30 s deadline.
TEST(NetProxy, DialersGiveUpOnAPeerThatIsGone) {
  Context ctx;
  ctx.commHash = 98;
  ctx.rank = 0;
  auto backend = makeSocketBackend(ctx);
  ASSERT_TRUE(backend.isOk());
  HandleExchange ex;
  ex.send = [](int, const Handle&) { return Status::ok(); };
  ex.tryRecv = [](int, Handle*) -> Result<bool> { return false; };  // its handle never comes
  std::atomic<int> asked{0};
  ex.peerAlive = [&](int peer) {
    ++asked;
    return errorf(Code::kRemoteError, "rank %d is gone (a test's answer)", peer);
  };
  FifoMemory out(1), in(1);
  auto accept = listenFor(**backend, 0, 1, ex);
  ASSERT_TRUE(accept.isOk());
  Proxy proxy(0, 1000);
  const auto start = Clock::now();
  proxy.addSend(dialTo(**backend, 0, 1, ex), out.fifo, 30000);
  proxy.addRecv(std::move(accept).value(), in.fifo, 30000);
  auto deadline = start + std::chrono::seconds(10);
  while ((closedOf(out.fifo) == kNetOpen || closedOf(in.fifo) == kNetOpen) &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  EXPECT_EQ(closedOf(out.fifo), kNetPeerClosed);  // a remote error
  EXPECT_EQ(closedOf(in.fifo), kNetPeerClosed);
  EXPECT_NE(proxy.status(1, true).message().find("rank 1 is gone"), std::string::npos)
      << proxy.status(1, true).message();
  EXPECT_NE(proxy.status(1, false).message().find("rank 1 is gone"), std::string::npos);
  EXPECT_GE(asked.load(), 2);
}

TEST(NetProxy, ShutdownClosesEveryFifo) {
  Side sides[2];
  makeSides(sides);
  sides[0].proxy->shutdown();
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while ((closedOf(sides[0].send->fifo) == kNetOpen || closedOf(sides[0].recv->fifo) == kNetOpen) &&
         Clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_EQ(closedOf(sides[0].send->fifo), kNetShutdown);
  EXPECT_EQ(closedOf(sides[0].recv->fifo), kNetShutdown);
}

}  // namespace
}  // namespace loom::transport::net
