// The transport between two ranks, chosen from the transports' reports.
#include "transports/select.h"

#include <gtest/gtest.h>

namespace loom::transport {
namespace {

enum Kind { kMemory, kBackend, kFallback };

Offer offer(const char* name, Kind kind, double gbs, double us, bool reachable = true) {
  Offer o;
  o.name = name;
  o.cap.reachable = reachable;
  o.cap.network = kind != kMemory;
  o.cap.needsProxy = kind == kBackend;
  o.cap.fallback = kind == kFallback;
  o.cap.bandwidthGBs = gbs;
  o.cap.latencyUs = us;
  if (!reachable) o.cap.reason = std::string(name) + " cannot";
  return o;
}

int chosen(const std::vector<Offer>& offers) {
  auto s = chooseTransport(offers, 0, 1);
  EXPECT_TRUE(s.isOk()) << s.status().message();
  return s.isOk() ? s->index : -1;
}

// Two ranks of one host: shared memory, however fast the NIC tcp would use (a 400 GbE
// port is still loopback TCP between them).
TEST(SelectTransport, MemoryBeforeTheNetwork) {
  EXPECT_EQ(chosen({offer("tcp", kFallback, 50, 20), offer("shm", kMemory, 10, 1)}), 1);
  EXPECT_EQ(chosen({offer("self", kMemory, 10, 0.1), offer("shm", kMemory, 10, 1),
                    offer("tcp", kFallback, 50, 20)}),
            0);  // a rank's messages to itself: the lower latency of two memories
}

// Across hosts: the network backend (configured or found) over the tcp fallback, even
// where tcp's interface is faster or the backend does not know its speed.
TEST(SelectTransport, BackendBeforeTheFallback) {
  const Offer shm = offer("shm", kMemory, 10, 1, false);
  EXPECT_EQ(chosen({shm, offer("net/ib", kBackend, 25, 0), offer("tcp", kFallback, 100, 20)}), 1);
  EXPECT_EQ(chosen({shm, offer("tcp", kFallback, 1.25, 20), offer("net/Plugin", kBackend, 0, 0)}),
            2);
  // Only the fallback reaches: it is used.
  EXPECT_EQ(
      chosen({shm, offer("net/ucx", kBackend, 1.25, 0, false), offer("tcp", kFallback, 1.25, 20)}),
      2);
}

TEST(SelectTransport, WithinATierBandwidthThenLatencyThenOrder) {
  EXPECT_EQ(chosen({offer("a", kMemory, 5, 1), offer("b", kMemory, 10, 2)}), 1);
  EXPECT_EQ(chosen({offer("a", kMemory, 10, 2), offer("b", kMemory, 10, 1)}), 1);
  EXPECT_EQ(chosen({offer("a", kMemory, 10, 1), offer("b", kMemory, 10, 1)}), 0);
  // Not known (0) decides nothing: the next criterion, then the order.
  EXPECT_EQ(chosen({offer("a", kMemory, 0, 5), offer("b", kMemory, 10, 1)}), 1);
  EXPECT_EQ(chosen({offer("a", kMemory, 0, 0), offer("b", kMemory, 10, 1)}), 0);
}

TEST(SelectTransport, TheReasonGivesTheFiguresOfEveryOffer) {
  auto s =
      chooseTransport({offer("net/ib", kBackend, 50, 2), offer("tcp", kFallback, 3.1, 20)}, 0, 1);
  ASSERT_TRUE(s.isOk());
  EXPECT_NE(s->reason.find("50 GB/s, 2 us, over the network, a proxy thread"), std::string::npos)
      << s->reason;
  EXPECT_NE(s->reason.find("tcp: 3.1 GB/s"), std::string::npos) << s->reason;
}

TEST(SelectTransport, NoneReachableNamesEveryReason) {
  auto s = chooseTransport(
      {offer("shm", kMemory, 10, 1, false), offer("net/ib", kBackend, 50, 2, false)}, 3, 7);
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.status().code(), Code::kInvalidUsage);
  const std::string m = s.status().message();
  EXPECT_NE(m.find("rank 7 from rank 3"), std::string::npos) << m;
  EXPECT_NE(m.find("shm: shm cannot"), std::string::npos) << m;
  EXPECT_NE(m.find("net/ib: net/ib cannot"), std::string::npos) << m;
  EXPECT_NE(m.find("LOOM_TRANSPORTS"), std::string::npos) << m;
}

}  // namespace
}  // namespace loom::transport
