// The TCP connection's receive-into-memory claims (RecvConnection::claimRecv): two TCP
// transports of one process joined over the first usable interface, one send and one
// receive connection, slots pushed by hand.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "common/clock.h"
#include "transports/transport.h"

namespace loom::transport {
namespace {

constexpr size_t kSlotBytes = 256 * 1024;
constexpr int kSlots = 4;

struct Pair {
  std::unique_ptr<Transport> a, b;  // rank 0 receives, rank 1 sends
  std::unique_ptr<SendConnection> send;
  std::unique_ptr<RecvConnection> recv;

  explicit Pair(int nsocks) {
    setenv("LOOM_NSOCKS_PERTHREAD", std::to_string(nsocks).c_str(), 1);
    TransportContext c0, c1;
    c0.self.rank = 0;
    c1.self.rank = 1;
    c0.fifo = c1.fifo = FifoConfig{kSlotBytes, kSlots};
    c0.commHash = c1.commHash = 0x1234;
    auto t0 = makeTcpTransport(c0);
    auto t1 = makeTcpTransport(c1);
    unsetenv("LOOM_NSOCKS_PERTHREAD");
    EXPECT_TRUE(t0.isOk() && t1.isOk());
    if (!t0.isOk() || !t1.isOk()) return;
    a = std::move(t0).value();
    b = std::move(t1).value();
    Deadline d = Deadline::afterMs(10000);
    auto setup = a->listen(c1.self, d);
    EXPECT_TRUE(setup.isOk());
    auto s = b->connect(c0.self, (*setup)->blob(), d);
    EXPECT_TRUE(s.isOk()) << s.status().message();
    auto r = (*setup)->accept(d);
    EXPECT_TRUE(r.isOk()) << r.status().message();
    send = std::move(s).value();
    recv = std::move(r).value();
    EXPECT_TRUE(recv->recvsIntoMemory());
  }

  // Sends `data` as one slot.
  void post(const std::vector<char>& data) {
    Deadline d = Deadline::afterMs(10000);
    void* slot = nullptr;
    while (!slot) {
      auto r = send->trySendSlot();
      ASSERT_TRUE(r.isOk());
      slot = *r;
      ASSERT_FALSE(d.expired());
    }
    std::memcpy(slot, data.data(), data.size());
    ASSERT_TRUE(send->postSend(data.size()).isOk());
  }
  // Drives both ends until the next slot is there; returns it.
  const char* next(size_t* bytes) {
    Deadline d = Deadline::afterMs(10000);
    while (true) {
      EXPECT_TRUE(send->progress().isOk());
      auto r = recv->tryRecv(bytes);
      EXPECT_TRUE(r.isOk()) << r.status().message();
      if (!r.isOk()) return nullptr;
      if (*r) return static_cast<const char*>(*r);
      if (d.expired()) {
        ADD_FAILURE() << "no slot arrived";
        return nullptr;
      }
    }
  }
  // Drives both ends until everything posted has left and (a while longer) arrived.
  void settle() {
    Deadline d = Deadline::afterMs(10000);
    while (!send->flushed() && !d.expired()) ASSERT_TRUE(send->progress().isOk());
    for (int i = 0; i < 200; ++i) ASSERT_TRUE(recv->progress().isOk());
  }
};

std::vector<char> pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 131 + seed * 7) & 0xff);
  return v;
}

TEST(TcpClaims, ClaimedSlotsLandInTheCallersMemory) {
  for (int nsocks : {1, 2}) {
    Pair p(nsocks);
    ASSERT_TRUE(p.send && p.recv);
    // Slots of 200 KiB: striped over both sockets when there are two.
    std::vector<std::vector<char>> dst(3, std::vector<char>(200 * 1024, 0));
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(p.recv->claimRecv(k, dst[k].data(), dst[k].size()));
    for (int k = 0; k < 3; ++k) p.post(pattern(dst[k].size(), k));
    for (int k = 0; k < 3; ++k) {
      size_t bytes = 0;
      const char* got = p.next(&bytes);
      ASSERT_EQ(got, dst[k].data()) << "slot " << k << ", " << nsocks << " socket(s)";
      EXPECT_EQ(bytes, dst[k].size());
      EXPECT_EQ(dst[k], pattern(dst[k].size(), k));
      ASSERT_TRUE(p.recv->releaseRecv().isOk());
    }
  }
}

TEST(TcpClaims, TooLateTooFarOrTooSmallArrivesInTheRing) {
  Pair p(1);
  ASSERT_TRUE(p.send && p.recv);
  std::vector<char> dst(64 * 1024, 0);
  const std::vector<char> zero(dst.size(), 0);
  // Past the ring.
  EXPECT_FALSE(p.recv->claimRecv(kSlots, dst.data(), dst.size()));
  // Already arrived.
  p.post(pattern(1000, 1));
  p.settle();
  EXPECT_FALSE(p.recv->claimRecv(0, dst.data(), dst.size()));
  size_t bytes = 0;
  const char* got = p.next(&bytes);
  ASSERT_NE(got, nullptr);
  EXPECT_NE(got, dst.data());
  EXPECT_EQ(std::vector<char>(got, got + bytes), pattern(1000, 1));
  ASSERT_TRUE(p.recv->releaseRecv().isOk());
  // Smaller than the slot that comes: dropped when its header arrives.
  EXPECT_TRUE(p.recv->claimRecv(0, dst.data(), 100));
  p.post(pattern(5000, 2));
  got = p.next(&bytes);
  ASSERT_NE(got, nullptr);
  EXPECT_NE(got, dst.data());
  EXPECT_EQ(bytes, 5000u);
  EXPECT_EQ(std::vector<char>(got, got + bytes), pattern(5000, 2));
  EXPECT_EQ(dst, zero);  // nothing written past the claim
  ASSERT_TRUE(p.recv->releaseRecv().isOk());
}

TEST(TcpClaims, DroppedClaims) {
  Pair p(1);
  ASSERT_TRUE(p.send && p.recv);
  std::vector<char> dst(4096, 0);
  const std::vector<char> zero(dst.size(), 0);
  // A claim nothing arrived for yet: forgotten, the slot comes through the ring.
  EXPECT_TRUE(p.recv->claimRecv(0, dst.data(), dst.size()));
  p.recv->dropClaims();
  p.post(pattern(4096, 3));
  size_t bytes = 0;
  const char* got = p.next(&bytes);
  ASSERT_NE(got, nullptr);
  EXPECT_NE(got, dst.data());
  EXPECT_EQ(std::vector<char>(got, got + bytes), pattern(4096, 3));
  EXPECT_EQ(dst, zero);
  ASSERT_TRUE(p.recv->releaseRecv().isOk());
  // A claimed slot whose data arrived, then dropped: the data is not in the ring, so the
  // connection says it is unusable instead of handing out the ring's stale bytes.
  EXPECT_TRUE(p.recv->claimRecv(0, dst.data(), dst.size()));
  p.post(pattern(4096, 4));
  p.settle();
  EXPECT_EQ(dst, pattern(4096, 4));
  p.recv->dropClaims();
  size_t ignored = 0;
  auto r = p.recv->tryRecv(&ignored);
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("unusable"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace loom::transport
