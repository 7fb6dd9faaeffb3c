// SubChannel: set-up exchanges among some of a parent channel's ranks (the host groups and
// rails of the hierarchical GPU forms), over a parent that is an in-memory mailbox here.
#include "transports/sub_channel.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

namespace loom::transport {
namespace {

// Messages between ranks of one process, by (sender, receiver, tag), as the bootstrap
// keeps them; ranks in `dead` answer no probe.
struct Mailbox {
  std::mutex mutex;
  std::map<std::tuple<int, int, uint64_t>, std::vector<std::vector<char>>> queued;
  std::set<int> dead;
  std::set<uint64_t> tagsSeen;
};

class Parent final : public SetupChannel {
 public:
  Parent(Mailbox& box, int rank, int nranks) : box_(box), rank_(rank), nranks_(nranks) {}
  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  Status allGather(void*, size_t) override {
    return errorf(Code::kInternalError, "not used by SubChannel");
  }
  Status barrier() override { return errorf(Code::kInternalError, "not used by SubChannel"); }
  Status send(int peer, uint64_t tag, const void* data, size_t size) override {
    std::lock_guard<std::mutex> lock(box_.mutex);
    const char* p = static_cast<const char*>(data);
    box_.queued[{rank_, peer, tag}].emplace_back(p, p + size);
    box_.tagsSeen.insert(tag);
    return Status::ok();
  }
  Result<bool> tryRecv(int peer, uint64_t tag, void* data, size_t size) override {
    std::lock_guard<std::mutex> lock(box_.mutex);
    auto it = box_.queued.find({peer, rank_, tag});
    if (it == box_.queued.end() || it->second.empty()) return false;
    if (it->second.front().size() != size) return errorf(Code::kInternalError, "size differs");
    std::memcpy(data, it->second.front().data(), size);
    it->second.erase(it->second.begin());
    return true;
  }
  Status probe(int peer, int64_t) override {
    std::lock_guard<std::mutex> lock(box_.mutex);
    if (box_.dead.count(peer)) return errorf(Code::kRemoteError, "rank %d is gone", peer);
    return Status::ok();
  }

 private:
  Mailbox& box_;
  int rank_, nranks_;
};

// Two hosts of two ranks each gather within their host, and two rails within theirs, at
// the same time, several rounds: every block lands where it belongs.
TEST(SubChannel, HostsAndRailsGatherApart) {
  Mailbox box;
  constexpr int kRanks = 4, kRounds = 20;
  std::vector<std::thread> threads;
  std::vector<int> failures(kRanks, 0);
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      Parent parent(box, r, kRanks);
      const int host = r / 2, local = r % 2;
      SubChannel hostChannel(parent, {2 * host, 2 * host + 1}, 1, 10000);
      SubChannel railChannel(parent, {local, local + 2}, 2, 10000);
      EXPECT_EQ(hostChannel.rank(), local);
      EXPECT_EQ(railChannel.rank(), host);
      EXPECT_EQ(railChannel.parentRank(1), local + 2);
      for (int round = 0; round < kRounds; ++round) {
        int64_t hostBlocks[2] = {}, railBlocks[2] = {};
        hostBlocks[local] = 1000 * round + r;
        railBlocks[host] = -(1000 * round + r);
        if (!hostChannel.allGather(hostBlocks, sizeof(int64_t)).isOk()) ++failures[r];
        if (!railChannel.allGather(railBlocks, sizeof(int64_t)).isOk()) ++failures[r];
        for (int m = 0; m < 2; ++m) {
          if (hostBlocks[m] != 1000 * round + 2 * host + m) ++failures[r];
          if (railBlocks[m] != -(1000 * round + local + 2 * m)) ++failures[r];
        }
        if (!hostChannel.barrier().isOk()) ++failures[r];
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(failures[r], 0) << "rank " << r;
}

// A point-to-point message of a sub-channel is not the parent's message of the same tag,
// nor another sub-channel's.
TEST(SubChannel, TagsStayApart) {
  Mailbox box;
  Parent p0(box, 0, 2), p1(box, 1, 2);
  SubChannel a0(p0, {0, 1}, 1, 1000), a1(p1, {0, 1}, 1, 1000);
  SubChannel b1(p1, {0, 1}, 2, 1000);
  const int value = 42;
  ASSERT_TRUE(a0.send(1, 7, &value, sizeof(value)).isOk());
  int got = 0;
  EXPECT_FALSE(p1.tryRecv(0, 7, &got, sizeof(got)).value());
  EXPECT_FALSE(b1.tryRecv(0, 7, &got, sizeof(got)).value());
  EXPECT_TRUE(a1.tryRecv(0, 7, &got, sizeof(got)).value());
  EXPECT_EQ(got, 42);
  // Tags past the range (the channel's own start there) are refused, not folded onto others.
  for (uint64_t tag : {SubChannel::kMaxTag, SubChannel::kMaxTag * 2}) {
    EXPECT_EQ(a0.send(1, tag, &value, sizeof(value)).code(), Code::kInternalError) << tag;
    EXPECT_EQ(a1.tryRecv(0, tag, &got, sizeof(got)).status().code(), Code::kInternalError) << tag;
  }
  EXPECT_EQ(a0.send(5, 1, &value, sizeof(value)).code(), Code::kInternalError);
}

// A member that never comes: the others' allGather ends at the deadline naming it.
TEST(SubChannel, MissingMemberTimesOutNamingIt) {
  Mailbox box;
  Parent p0(box, 0, 3);
  SubChannel s(p0, {0, 2}, 1, 300);
  int blocks[2] = {1, 0};
  const auto start = std::chrono::steady_clock::now();
  const Status st = s.allGather(blocks, sizeof(int));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(st.code(), Code::kRemoteError);
  EXPECT_NE(st.message().find("rank 2"), std::string::npos) << st.message();
  EXPECT_GE(ms, 290);
  EXPECT_LT(ms, 5000);
}

// A member whose process is gone: found by the probe after about a second, well before
// the deadline.
TEST(SubChannel, DeadMemberIsReportedByTheProbe) {
  Mailbox box;
  box.dead.insert(1);
  Parent p0(box, 0, 2);
  SubChannel s(p0, {0, 1}, 1, 60000);
  int blocks[2] = {1, 0};
  const auto start = std::chrono::steady_clock::now();
  const Status st = s.allGather(blocks, sizeof(int));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(st.code(), Code::kRemoteError);
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  EXPECT_LT(ms, 10000);
}

// A member whose part of a set-up failed gives up: the others' exchanges, the one under
// way and every later one, fail at once naming it instead of waiting for the deadline.
TEST(SubChannel, AMemberThatGivesUpEndsTheWaitAtOnce) {
  Mailbox box;
  Parent p0(box, 0, 3), p2(box, 2, 3);
  SubChannel s0(p0, {0, 2}, 1, 60000), s2(p2, {0, 2}, 1, 60000);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    s2.abandon();
  });
  int blocks[2] = {1, 0};
  const auto start = std::chrono::steady_clock::now();
  const Status st = s0.allGather(blocks, sizeof(int));
  t.join();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(st.code(), Code::kRemoteError);
  EXPECT_NE(st.message().find("rank 2 gave up"), std::string::npos) << st.message();
  EXPECT_LT(ms, 5000);
  EXPECT_EQ(s0.barrier().code(), Code::kRemoteError);
}

// An abort ends the wait at once.
TEST(SubChannel, AbortEndsTheWait) {
  Mailbox box;
  Parent p0(box, 0, 2);
  std::atomic<bool> abort{false};
  SubChannel s(p0, {0, 1}, 1, 60000, &abort);
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    abort = true;
  });
  int blocks[2] = {1, 0};
  const Status st = s.allGather(blocks, sizeof(int));
  t.join();
  EXPECT_FALSE(st.isOk());
  EXPECT_NE(st.message().find("aborted"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace loom::transport
