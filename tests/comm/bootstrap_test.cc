// The bootstrap's listeners under strangers: silent connections and garbage at the root
// and at a rank's listener cost the others nothing (each connection has its own short
// deadline, common/handshake.h); and tryRecv, the call a polling thread uses.
#include "comm/bootstrap.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/unique_id.h"
#include "common/socket.h"
#include "transports/sub_channel.h"

namespace loom::comm {
namespace {

std::vector<Socket> silentStrangers(const SocketAddress& at, int n) {
  std::vector<Socket> out;
  for (int i = 0; i < n; ++i) {
    auto s = Socket::connect(at, Deadline::afterMs(2000));
    EXPECT_TRUE(s.isOk());
    if (i % 3 == 0) {  // some say something, none of it the protocol
      const char junk[16] = "hello?";
      (void)s->sendAll(junk, 6, Deadline::afterMs(1000));
    }
    if (s) out.push_back(std::move(s).value());
  }
  return out;
}

// n ranks join as threads; returns their bootstraps.
std::vector<std::unique_ptr<Bootstrap>> joinAll(const IdContents& id, int n) {
  std::vector<std::unique_ptr<Bootstrap>> out(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      auto b = Bootstrap::join(id, r, n, 20000, nullptr);
      EXPECT_TRUE(b.isOk()) << b.status().message();
      if (b) out[r] = std::move(b).value();
    });
  }
  for (auto& t : ts) t.join();
  return out;
}

IdContents localId() {
  IdContents id;
  id.root = *SocketAddress::parse("127.0.0.1:0");
  EXPECT_TRUE(randomSecret(id.secret).isOk());
  return id;
}

TEST(Bootstrap, SilentStrangersAtTheRootDoNotStallJoining) {
  IdContents id = localId();
  ASSERT_TRUE(startRoot(&id, 20000).isOk());
  auto strangers = silentStrangers(id.root, 20);  // before any rank: first in the queue
  const auto start = std::chrono::steady_clock::now();
  auto b = joinAll(id, 3);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto& x : b) ASSERT_TRUE(x);
  EXPECT_LT(s, 3.0) << "20 silent connections held the root up (each used to cost 5 s)";
}

TEST(Bootstrap, SilentStrangersAtARankDoNotStallItsMessages) {
  IdContents id = localId();
  ASSERT_TRUE(startRoot(&id, 20000).isOk());
  auto b = joinAll(id, 2);
  ASSERT_TRUE(b[0] && b[1]);
  auto strangers = silentStrangers(b[1]->address(1), 20);
  const auto start = std::chrono::steady_clock::now();
  int v = 42, got = 0;
  std::thread sender([&] { EXPECT_TRUE(b[0]->send(1, 7, &v, sizeof(v)).isOk()); });
  ASSERT_TRUE(b[1]->recv(0, 7, &got, sizeof(got)).isOk());
  sender.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(got, 42);
  EXPECT_LT(s, 2.0) << "silent connections held the rank's listener up";
  // And collectives over it still work.
  std::vector<int> all = {10, 11};
  std::thread other([&] {
    std::vector<int> mine = {10, 11};
    EXPECT_TRUE(b[0]->allGather(mine.data(), sizeof(int)).isOk());
  });
  EXPECT_TRUE(b[1]->allGather(all.data(), sizeof(int)).isOk());
  other.join();
}

TEST(Bootstrap, TryRecvNeverWaits) {
  IdContents id = localId();
  ASSERT_TRUE(startRoot(&id, 20000).isOk());
  auto b = joinAll(id, 2);
  ASSERT_TRUE(b[0] && b[1]);
  int got = 0;
  const auto start = std::chrono::steady_clock::now();
  auto r = b[1]->tryRecv(0, 9, &got, sizeof(got));
  ASSERT_TRUE(r.isOk());
  EXPECT_FALSE(*r);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.1);
  int v = 5;
  ASSERT_TRUE(b[0]->send(1, 9, &v, sizeof(v)).isOk());
  bool have = false;
  for (int i = 0; i < 2000 && !have; ++i) {
    auto t = b[1]->tryRecv(0, 9, &got, sizeof(got));
    ASSERT_TRUE(t.isOk());
    have = *t;
    if (!have) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(have);
  EXPECT_EQ(got, 5);
}

// LOOM_COMM_ID mode: the id's secret comes from LOOM_COMM_SECRET, so a stranger that
// knows the address but not the secret is refused by the root.
TEST(Bootstrap, SharedSecretKeepsStrangersOut) {
  auto addr = *SocketAddress::parse("127.0.0.1:0");
  IdContents a = idFromAddress(addr, "job-1234"), b = idFromAddress(addr, "job-1234");
  IdContents other = idFromAddress(addr, "job-9999"), none = idFromAddress(addr);
  EXPECT_EQ(a.secret[0], b.secret[0]);
  EXPECT_EQ(a.secret[1], b.secret[1]);
  EXPECT_NE(a.secret[0], other.secret[0]);
  EXPECT_NE(a.secret[0], none.secret[0]);
  ASSERT_TRUE(startRoot(&a, 20000).isOk());
  other.root = a.root;
  // The stranger's join is dropped; it gets no address table and gives up at its timeout.
  auto stranger = Bootstrap::join(other, 0, 2, 1000, nullptr);
  EXPECT_FALSE(stranger.isOk());
  auto ranks = joinAll(a, 2);
  EXPECT_TRUE(ranks[0] && ranks[1]);
}

// Sub-channels of the hierarchical GPU forms (transports/sub_channel.h) over a real
// bootstrap: 2 hosts x 3 ranks, each rank in its host's channel and its rail's, gathering
// in both while the whole bootstrap gathers too: nothing lands in the wrong exchange.
TEST(Bootstrap, SubChannelsOfHostsAndRails) {
  IdContents id = localId();
  ASSERT_TRUE(startRoot(&id, 20000).isOk());
  constexpr int kHosts = 2, kLocal = 3, kRanks = kHosts * kLocal;
  auto b = joinAll(id, kRanks);
  for (auto& x : b) ASSERT_TRUE(x);
  std::vector<std::thread> ts;
  std::vector<int> wrong(kRanks, 0);
  for (int r = 0; r < kRanks; ++r) {
    ts.emplace_back([&, r] {
      const int host = r / kLocal, local = r % kLocal;
      std::vector<int> hostRanks, railRanks;
      for (int l = 0; l < kLocal; ++l) hostRanks.push_back(host * kLocal + l);
      for (int h = 0; h < kHosts; ++h) railRanks.push_back(h * kLocal + local);
      transport::SubChannel hostCh(*b[r], hostRanks, 1, 20000);
      transport::SubChannel railCh(*b[r], railRanks, 2, 20000);
      for (int round = 0; round < 5; ++round) {
        std::vector<int> hv(kLocal, -1), rv(kHosts, -1), all(kRanks, -1);
        hv[local] = 100 * round + r;
        rv[host] = 100 * round + r + 50;
        all[r] = r * 7 + round;
        if (!hostCh.allGather(hv.data(), sizeof(int)).isOk()) ++wrong[r];
        if (!b[r]->allGather(all.data(), sizeof(int)).isOk()) ++wrong[r];
        if (!railCh.allGather(rv.data(), sizeof(int)).isOk()) ++wrong[r];
        for (int l = 0; l < kLocal; ++l) wrong[r] += hv[l] != 100 * round + host * kLocal + l;
        for (int h = 0; h < kHosts; ++h) wrong[r] += rv[h] != 100 * round + h * kLocal + local + 50;
        for (int k = 0; k < kRanks; ++k) wrong[r] += all[k] != k * 7 + round;
      }
      if (!railCh.barrier().isOk()) ++wrong[r];
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(wrong[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace loom::comm
