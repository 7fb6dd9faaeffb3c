// The transport between two ranks, chosen from the transports' reports.
#include "transports/select.h"

#include <gtest/gtest.h>

namespace loom::transport {
namespace {

Offer offer(const char* name, double gbs, double us, bool reachable = true) {
  Offer o;
  o.name = name;
  o.cap.reachable = reachable;
  o.cap.bandwidthGBs = gbs;
  o.cap.latencyUs = us;
  if (!reachable) o.cap.reason = std::string(name) + " cannot";
  return o;
}

TEST(SelectTransport, FastestReachableWins) {
  // Another host: the network backend's 400 Gb/s port over tcp on the same host's 25 Gb/s.
  auto s = chooseTransport(
      {offer("shm", 10, 1, false), offer("net/ib", 50, 2), offer("tcp", 3.1, 20)}, 0, 1);
  ASSERT_TRUE(s.isOk());
  EXPECT_EQ(s->index, 1);
  EXPECT_NE(s->reason.find("50 GB/s"), std::string::npos) << s->reason;
  EXPECT_NE(s->reason.find("tcp: 3.1 GB/s"), std::string::npos) << s->reason;
  // Order does not decide: listed last, the fastest still wins.
  auto t = chooseTransport({offer("tcp", 1.25, 20), offer("shm", 10, 1)}, 0, 1);
  ASSERT_TRUE(t.isOk());
  EXPECT_EQ(t->index, 1);
}

TEST(SelectTransport, LatencyThenOrderBreakTies) {
  auto s = chooseTransport({offer("a", 1.25, 20), offer("b", 1.25, 5), offer("c", 1.25, 5)}, 0, 1);
  ASSERT_TRUE(s.isOk());
  EXPECT_EQ(s->index, 1);  // the lower latency, and of two equal ones the first
}

TEST(SelectTransport, NoneReachableNamesEveryReason) {
  auto s = chooseTransport({offer("shm", 10, 1, false), offer("net/ib", 50, 2, false)}, 3, 7);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.status().code(), Code::kInvalidUsage);
  const std::string m = s.status().message();
  EXPECT_NE(m.find("rank 7 from rank 3"), std::string::npos) << m;
  EXPECT_NE(m.find("shm: shm cannot"), std::string::npos) << m;
  EXPECT_NE(m.find("net/ib: net/ib cannot"), std::string::npos) << m;
  EXPECT_NE(m.find("LOOM_TRANSPORTS"), std::string::npos) << m;
}

// The defaults loom's transports report keep the choices the list order made before:
// shared memory on one host, the network backend (its port's speed) or tcp (its
// interface's) across hosts, self for a rank itself.
TEST(SelectTransport, LoomsOwnReportsKeepTheUsualChoices) {
  const Offer self = offer("self", 10, 0.1), shm = offer("shm", 10, 1);
  const Offer tcp = offer("tcp", 10000 / 8000.0, 20);
  auto sameHost = chooseTransport({offer("self", 0, 0, false), shm, tcp}, 0, 1);
  ASSERT_TRUE(sameHost.isOk());
  EXPECT_EQ(sameHost->index, 1);
  auto itself = chooseTransport({self, shm, tcp}, 0, 0);
  ASSERT_TRUE(itself.isOk());
  EXPECT_EQ(itself->index, 0);
  // Across hosts a socket backend on the same interface ties with tcp on bandwidth; its
  // latency (0: unknown) or, failing that, its place before tcp in the list, keeps it.
  auto across = chooseTransport({offer("shm", 10, 1, false), offer("net/ucx", 1.25, 0), tcp}, 0, 1);
  ASSERT_TRUE(across.isOk());
  EXPECT_EQ(across->index, 1);
}

}  // namespace
}  // namespace loom::transport
