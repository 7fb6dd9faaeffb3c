// Runs every schedule for every rank count 1..64 in a single-threaded simulator with
// bounded FIFOs (as the transports have), so a schedule that deadlocks, reads a piece
// twice, or applies the pre-/post-op a wrong number of times fails here.
//
// Data: rank r's input element i is r * 1000 + i % 997 + 1. The pre-op doubles a
// contribution and the post-op negates the result, so a correct reduction yields
// exactly -2 * (sum of inputs) and any double application shows.
#include "collectives/schedule.h"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/device/net_plan.h"
#include "collectives/hierarchy.h"
#include "collectives/tuner.h"
#include "tests/support/sweep.h"

namespace loom::collectives {
namespace {

constexpr size_t kPiece = 5;  // elements per FIFO slot: small, to exercise pipelining
constexpr size_t kDepth = 2;  // slots per connection

int64_t inputValue(int r, size_t i) {
  return r * 1000 + static_cast<int64_t>(i % 997) + 1;
}

struct RankState {
  Schedule sch;
  std::vector<int64_t> in, out;
  size_t phase = 0;
  std::vector<size_t> done;  // pieces done per step of the current phase
};

class Simulator {
 public:
  // `piece`: the elements of a FIFO slot, as the schedules were built with.
  Simulator(std::vector<Schedule> schedules, std::vector<std::vector<int64_t>> inputs,
            size_t piece = kPiece)
      : n_(static_cast<int>(schedules.size())), piece_(piece) {
    ranks_.resize(n_);
    for (int r = 0; r < n_; ++r) {
      ranks_[r].sch = std::move(schedules[r]);
      ranks_[r].in = std::move(inputs[r]);
      ranks_[r].out.assign(ranks_[r].sch.outputCount, INT64_MIN);
      if (!ranks_[r].sch.phases.empty()) ranks_[r].done.assign(ranks_[r].sch.phases[0].size(), 0);
    }
  }

  // Returns false on deadlock.
  bool run() {
    while (true) {
      bool allDone = true, moved = false;
      for (int r = 0; r < n_; ++r) {
        RankState& s = ranks_[r];
        if (s.phase >= s.sch.phases.size()) continue;
        allDone = false;
        const Phase& ph = s.sch.phases[s.phase];
        bool phaseDone = true;
        std::map<std::pair<int, bool>, bool> busy;  // connection used by an earlier step
        for (size_t k = 0; k < ph.size(); ++k) {
          const Step& st = ph[k];
          size_t pieces = (st.count + piece_ - 1) / piece_;
          bool blocked = false;
          for (int j = 0; j < st.nrecv; ++j) blocked |= busy[{st.recvPeers[j], false}];
          for (int j = 0; j < st.nsend; ++j) blocked |= busy[{st.sendPeers[j], true}];
          // Step::after: this piece waits for the same piece of an earlier step.
          if (st.after >= 0) {
            EXPECT_LT(static_cast<size_t>(st.after), k);
            blocked |= s.done[st.after] <= s.done[k];
          }
          if (s.done[k] < pieces) {
            phaseDone = false;
            if (!blocked && tryPiece(r, st, s.done[k])) {
              ++s.done[k];
              moved = true;
            }
          }
          if (s.done[k] < pieces) {
            for (int j = 0; j < st.nrecv; ++j) busy[{st.recvPeers[j], false}] = true;
            for (int j = 0; j < st.nsend; ++j) busy[{st.sendPeers[j], true}] = true;
          }
        }
        if (phaseDone) {
          ++s.phase;
          if (s.phase < s.sch.phases.size()) s.done.assign(s.sch.phases[s.phase].size(), 0);
          moved = true;
        }
      }
      if (allDone) return fifosEmpty();
      if (!moved) return false;
    }
  }

  const std::vector<int64_t>& output(int r) const { return ranks_[r].out; }

 private:
  bool tryPiece(int r, const Step& st, size_t piece) {
    RankState& s = ranks_[r];
    size_t first = piece * piece_;
    size_t m = std::min(piece_, st.count - first);
    for (int j = 0; j < st.nrecv; ++j) {
      auto& q = fifo_[{st.recvPeers[j], r}];
      if (q.empty()) return false;
      EXPECT_EQ(q.front().size(), m)
          << "piece size mismatch from " << st.recvPeers[j] << " to " << r;
      if (q.front().size() != m) return false;
    }
    for (int j = 0; j < st.nsend; ++j) {
      if (fifo_[{r, st.sendPeers[j]}].size() >= kDepth) return false;
    }
    std::vector<int64_t> acc(m);
    bool have = false;
    if (st.src.buffer != Buffer::kNone) {
      const auto& buf = st.src.buffer == Buffer::kInput ? s.in : s.out;
      for (size_t i = 0; i < m; ++i) {
        size_t idx = st.src.offset + first + i;
        EXPECT_LT(idx, buf.size());
        int64_t v = idx < buf.size() ? buf[idx] : 0;
        acc[i] = s.sch.reduces && !st.srcPartial ? 2 * v : v;
      }
      have = true;
    }
    for (int j = 0; j < st.nrecv; ++j) {
      auto& q = fifo_[{st.recvPeers[j], r}];
      for (size_t i = 0; i < m; ++i) acc[i] = have ? acc[i] + q.front()[i] : q.front()[i];
      EXPECT_TRUE(have || j == 0);
      have = true;
      q.pop_front();
      if (!s.sch.reduces) {
        EXPECT_EQ(st.nrecv, 1);
      }
    }
    if (st.final)
      for (auto& v : acc) v = -v;
    if (st.dst.buffer == Buffer::kOutput) {
      for (size_t i = 0; i < m; ++i) {
        size_t idx = st.dst.offset + first + i;
        EXPECT_LT(idx, s.out.size());
        if (idx < s.out.size()) s.out[idx] = acc[i];
      }
    }
    for (int j = 0; j < st.nsend; ++j) fifo_[{r, st.sendPeers[j]}].push_back(acc);
    return true;
  }

  bool fifosEmpty() const {
    for (const auto& [k, q] : fifo_) {
      if (!q.empty()) return false;
    }
    return true;
  }

  int n_;
  size_t piece_;
  std::vector<RankState> ranks_;
  std::map<std::pair<int, int>, std::deque<std::vector<int64_t>>> fifo_;
};

// 1..64; a sample of them with LOOM_TEST_SWEEP=short (tests/support/sweep.h).
std::vector<int> rankCounts() {
  if (loom::test::shortSweep()) return {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 31, 64};
  std::vector<int> v;
  for (int n = 1; n <= 64; ++n) v.push_back(n);
  return v;
}

std::vector<size_t> countsFor(int n) {
  return {0, 1, 2, static_cast<size_t>(n) + 3, 97};
}

using Builder = std::function<Schedule(int r, int n, size_t count, int root)>;

struct Case {
  const char* name;
  CollType type;
  Builder build;
};

// A ring order other than rank order: odd ranks first, then even ones, as a topology that
// groups ranks by host would give for ranks launched alternately on two hosts.
const std::vector<int>* interleavedRing(int n) {
  static thread_local std::vector<int> ring;
  ring.clear();
  for (int r = 1; r < n; r += 2) ring.push_back(r);
  for (int r = 0; r < n; r += 2) ring.push_back(r);
  return &ring;
}

std::vector<Case> cases() {
  return {
      {"RingAllReduceTopoOrder", CollType::kAllReduce,
       [](int r, int n, size_t c, int) {
         return ringAllReduce(r, n, c, kPiece, interleavedRing(n));
       }},
      {"RingAllGatherTopoOrder", CollType::kAllGather,
       [](int r, int n, size_t c, int) {
         return ringAllGather(r, n, c, kPiece, interleavedRing(n));
       }},
      {"RingReduceScatterTopoOrder", CollType::kReduceScatter,
       [](int r, int n, size_t c, int) {
         return ringReduceScatter(r, n, c, kPiece, interleavedRing(n));
       }},
      {"ChainBroadcastTopoOrder", CollType::kBroadcast,
       [](int r, int n, size_t c, int root) {
         return chainBroadcast(r, n, c, root, interleavedRing(n));
       }},
      {"ChainReduceTopoOrder", CollType::kReduce,
       [](int r, int n, size_t c, int root) {
         return chainReduce(r, n, c, root, interleavedRing(n));
       }},
      {"RingAllReduce", CollType::kAllReduce,
       [](int r, int n, size_t c, int) { return ringAllReduce(r, n, c, kPiece); }},
      {"TreeAllReduceLagged", CollType::kAllReduce,
       [](int r, int n, size_t c, int) { return treeAllReduce(r, n, c, kPiece, true); }},
      {"DirectAllReduce", CollType::kAllReduce,
       [](int r, int n, size_t c, int) { return directAllReduce(r, n, c, kPiece); }},
      {"DoublingAllReduce", CollType::kAllReduce,
       [](int r, int n, size_t c, int) { return doublingAllReduce(r, n, c, kPiece); }},
      {"TreeAllReduce", CollType::kAllReduce,
       [](int r, int n, size_t c, int) { return treeAllReduce(r, n, c, kPiece); }},
      {"RingAllGather", CollType::kAllGather,
       [](int r, int n, size_t c, int) { return ringAllGather(r, n, c, kPiece); }},
      {"RingReduceScatter", CollType::kReduceScatter,
       [](int r, int n, size_t c, int) { return ringReduceScatter(r, n, c, kPiece); }},
      {"ChainBroadcast", CollType::kBroadcast,
       [](int r, int n, size_t c, int root) { return chainBroadcast(r, n, c, root); }},
      {"TreeBroadcast", CollType::kBroadcast,
       [](int r, int n, size_t c, int root) { return treeBroadcast(r, n, c, root); }},
      {"ChainReduce", CollType::kReduce,
       [](int r, int n, size_t c, int root) { return chainReduce(r, n, c, root); }},
      {"TreeReduce", CollType::kReduce,
       [](int r, int n, size_t c, int root) { return treeReduce(r, n, c, root); }},
      {"DirectAllToAll", CollType::kAllToAll,
       [](int r, int n, size_t c, int) { return directAllToAll(r, n, c); }},
      {"RoundsAllToAll", CollType::kAllToAll,
       [](int r, int n, size_t c, int) { return roundsAllToAll(r, n, c, 3); }},
      {"DirectAllGather", CollType::kAllGather,
       [](int r, int n, size_t c, int) { return directAllGather(r, n, c); }},
      {"DirectReduceScatter", CollType::kReduceScatter,
       [](int r, int n, size_t c, int) { return directReduceScatter(r, n, c, kPiece); }},
      {"HalvingReduceScatter", CollType::kReduceScatter,
       [](int r, int n, size_t c, int) { return halvingReduceScatter(r, n, c, kPiece); }},
      {"DoublingAllGather", CollType::kAllGather,
       [](int r, int n, size_t c, int) { return doublingAllGather(r, n, c, kPiece); }},
  };
}

TEST(Schedules, EmptyCallPassesOneEmptyMessageAroundTheRing) {
  EXPECT_TRUE(emptyCall(0, 1).phases.empty());
  const std::vector<int> ring = {0, 2, 1};
  for (int r = 0; r < 3; ++r) {
    const Schedule s = emptyCall(r, 3, &ring);
    ASSERT_EQ(s.phases.size(), 1u);
    ASSERT_EQ(s.phases[0].size(), 2u);
    const Step& send = s.phases[0][0];
    const Step& recv = s.phases[0][1];
    EXPECT_TRUE(send.empty && recv.empty);
    EXPECT_EQ(send.count + recv.count, 0u);
    ASSERT_EQ(send.nsend, 1);
    ASSERT_EQ(recv.nrecv, 1);
    EXPECT_EQ(send.nrecv + recv.nsend, 0);
    int pos = 0;
    while (ring[pos] != r) ++pos;
    EXPECT_EQ(send.sendPeers[0], ring[(pos + 1) % 3]);
    EXPECT_EQ(recv.recvPeers[0], ring[(pos + 2) % 3]);
  }
}

TEST(RingOrder, RejectsWhatIsNotAPermutation) {
  EXPECT_TRUE(isRingOrder({2, 0, 1}, 3));
  EXPECT_FALSE(isRingOrder({0, 0, 1}, 3));
  EXPECT_FALSE(isRingOrder({0, 1}, 3));
  EXPECT_FALSE(isRingOrder({0, 1, 3}, 3));
  // Not a permutation: the schedule falls back to rank order, which still works.
  std::vector<int> bad{0, 0, 0};
  Schedule a = ringAllReduce(1, 3, 10, kPiece, &bad), b = ringAllReduce(1, 3, 10, kPiece);
  EXPECT_EQ(a.phases.size(), b.phases.size());
}

void checkCase(const Case& cs, int n, size_t count, int root, bool split = false,
               size_t piece = kPiece) {
  std::vector<Schedule> schedules;
  std::vector<std::vector<int64_t>> inputs;
  for (int r = 0; r < n; ++r) {
    schedules.push_back(split ? device::splitByConnection(cs.build(r, n, count, root))
                              : cs.build(r, n, count, root));
    std::vector<int64_t> in(schedules.back().inputCount);
    for (size_t i = 0; i < in.size(); ++i) in[i] = inputValue(r, i);
    inputs.push_back(std::move(in));
  }
  Simulator sim(schedules, inputs, piece);
  ASSERT_TRUE(sim.run()) << cs.name << " deadlocks or leaves data behind: n=" << n
                         << " count=" << count << " piece=" << piece;
  for (int r = 0; r < n; ++r) {
    const auto& out = sim.output(r);
    auto sumAt = [&](size_t i) {
      int64_t s = 0;
      for (int q = 0; q < n; ++q) s += inputValue(q, i);
      return -2 * s;
    };
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t expect = 0;
      switch (cs.type) {
        case CollType::kAllReduce: expect = sumAt(i); break;
        case CollType::kReduce: expect = sumAt(i); break;
        case CollType::kReduceScatter: expect = sumAt(r * count + i); break;
        case CollType::kAllGather:
          expect = inputValue(static_cast<int>(i / count), i % count);
          break;
        case CollType::kBroadcast: expect = inputValue(root, i); break;
        case CollType::kAllToAll:
          expect = inputValue(static_cast<int>(i / count), r * count + i % count);
          break;
        default: break;
      }
      ASSERT_EQ(out[i], expect) << cs.name << " n=" << n << " count=" << count << " rank " << r
                                << " element " << i;
    }
  }
}

// Every case, rank count 1..64, count and root; `split` as checkCase takes it.
void checkEveryCase(bool split) {
  for (const auto& cs : cases()) {
    for (int n : rankCounts()) {
      for (size_t count : countsFor(n)) {
        std::vector<int> roots = {0};
        if (cs.type == CollType::kBroadcast || cs.type == CollType::kReduce)
          roots = {0, n / 2, n - 1};
        for (int root : roots) {
          checkCase(cs, n, count, root, split);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(Schedules, EveryCollectiveEveryRankCount) {
  checkEveryCase(false);
}

// The form the GPU network executor runs (collectives/device/net_plan.h): steps that share
// a connection in sub-phases of their own, every phase strictly after the one before.
TEST(Schedules, EveryCollectiveSplitByConnection) {
  checkEveryCase(true);
}

// The forms that cut blocks of n pieces into chunks (chunkRange with chunkUnit), with pieces
// that are and are not whole units of kChunkAlign, and counts from a partial block of more
// than n units to several blocks; split by connection too. A chunk larger than a piece
// deadlocked the direct form with two slots a connection (4 ranks, pieces of 24 elements).
TEST(Schedules, ChunkedFormsWithAnyPiece) {
  for (size_t piece : {size_t{16}, size_t{24}, size_t{40}, size_t{48}}) {
    const std::vector<Case> chunked = {
        {"RingAllReduce", CollType::kAllReduce,
         [piece](int r, int n, size_t c, int) { return ringAllReduce(r, n, c, piece); }},
        {"DirectAllReduce", CollType::kAllReduce,
         [piece](int r, int n, size_t c, int) { return directAllReduce(r, n, c, piece); }},
        {"TreeAllReduceLagged", CollType::kAllReduce,
         [piece](int r, int n, size_t c, int) { return treeAllReduce(r, n, c, piece, true); }},
        {"TreeAllReduce", CollType::kAllReduce,
         [piece](int r, int n, size_t c, int) { return treeAllReduce(r, n, c, piece); }},
    };
    for (const Case& cs : chunked) {
      for (int n : {2, 3, 4, 5, 8}) {
        const size_t block = piece * n;
        for (size_t count : {size_t{16} * n + 7, block - 1, block, block + 17, 3 * block + 5}) {
          for (bool split : {false, true}) {
            checkCase(cs, n, count, 0, split, piece);
            if (::testing::Test::HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// The hierarchical all-reduce, all-gather and reduce-scatter (host buffers): hosts of L
// ranks, the hosts' ranks either in blocks (0 1 | 2 3) or interleaved (0 2 | 1 3), counts
// from 0 to many blocks; the results on every rank, the pre-op and the post-op applied once
// each; split by connection too. (The simulator keeps input and output apart: in place is
// checked by tests/comm/rank_check.cc.)
TEST(Schedules, HierarchicalFormsEveryShape) {
  const std::pair<int, int> shapes[] = {{2, 2}, {2, 3}, {3, 2}, {4, 4}, {2, 8}, {8, 2}, {3, 5}};
  for (auto [hosts, local] : shapes) {
    for (bool interleaved : {false, true}) {
      const int n = hosts * local;
      std::vector<uint64_t> hostOf(n);
      for (int r = 0; r < n; ++r) hostOf[r] = interleaved ? r % hosts : r / local;
      // Rank r's view of the hierarchy (every case builds its schedule from it).
      auto hierOf = [hostOf](int r) {
        Hierarchy h;
        std::string why;
        EXPECT_TRUE(findHierarchy(hostOf, r, &h, &why)) << why;
        return h;
      };
      Case cs{"HierAllReduce", CollType::kAllReduce,
              [hierOf](int r, int, size_t c, int) { return hierAllReduce(hierOf(r), c, kPiece); }};
      Case gather{"HierAllGather", CollType::kAllGather, [hierOf](int r, int, size_t c, int) {
                    return hierAllGather(hierOf(r), c, kPiece);
                  }};
      Case scatter{
          "HierReduceScatter", CollType::kReduceScatter,
          [hierOf](int r, int, size_t c, int) { return hierReduceScatter(hierOf(r), c, kPiece); }};
      Case tree{"HostTreeAllReduce", CollType::kAllReduce, [hierOf](int r, int, size_t c, int) {
                  return hostTreeAllReduce(hierOf(r), c, kPiece);
                }};
      Case lagged{"HostTreeAllReduceLagged", CollType::kAllReduce,
                  [hierOf](int r, int, size_t c, int) {
                    return hostTreeAllReduce(hierOf(r), c, kPiece, /*lagResults=*/true);
                  }};
      for (size_t count : {size_t{0}, size_t{1}, size_t{3}, kPiece * local - 1, kPiece * local,
                           kPiece * local * 3 + 7, size_t{1000}}) {
        SCOPED_TRACE(std::to_string(hosts) + " hosts x " + std::to_string(local) +
                     (interleaved ? " interleaved" : "") + ", count " + std::to_string(count));
        for (const Case* c : {&cs, &gather, &scatter, &tree}) {
          checkCase(*c, n, count, 0);
          checkCase(*c, n, count, 0, /*split=*/true);
        }
        checkCase(lagged, n, count, 0);  // the host executor's form: not split
      }
    }
  }
}

// The host executor's tree all-reduce, results trailing reductions by two blocks on
// shared connections: many blocks (up to 200 of two pieces), 3 to 33 ranks, FIFOs of two
// slots.
TEST(Schedules, LaggedTreeAllReduceManyBlocks) {
  const Case lagged{"TreeAllReduceLagged", CollType::kAllReduce, [](int r, int n, size_t c, int) {
                      return treeAllReduce(r, n, c, kPiece, true);
                    }};
  for (int n : {3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 24, 31, 33}) {
    for (size_t count : {size_t{41}, size_t{333}, size_t{2003}}) {
      SCOPED_TRACE("n " + std::to_string(n) + ", count " + std::to_string(count));
      checkCase(lagged, n, count, 0);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(Schedules, BinaryTreeIsATree) {
  for (int n = 1; n <= 200; ++n) {
    int roots = 0;
    for (int p = 0; p < n; ++p) {
      TreeLinks t = binaryTree(p, n);
      if (t.parent < 0) {
        ++roots;
        continue;
      }
      // My parent lists me as a child.
      TreeLinks par = binaryTree(t.parent, n);
      bool listed = false;
      for (int c = 0; c < par.nchildren; ++c) listed |= par.children[c] == p;
      ASSERT_TRUE(listed) << "n=" << n << " p=" << p;
      // Walking up reaches the root within log2(n) + 2 steps.
      int steps = 0, cur = p;
      while (binaryTree(cur, n).parent >= 0 && steps < 64) {
        cur = binaryTree(cur, n).parent;
        ++steps;
      }
      ASSERT_LT(steps, 64);
    }
    ASSERT_EQ(roots, 1) << "n=" << n;
  }
}

// binaryTree in O(log n) against the definition it replaced: every label's parent by
// walking up the levels, children as the labels whose parent it is.
TEST(Schedules, BinaryTreeMatchesParentWalk) {
  for (int n = 1; n <= 300; ++n) {
    int root = 1;
    while (root * 2 <= n) root *= 2;
    auto parentOf = [&](int i) {
      if (i == root) return -1;
      int cur = i, k = __builtin_ctz(static_cast<unsigned>(i));
      while (true) {
        const int par = (cur & (2 << k)) ? cur - (1 << k) : cur + (1 << k);
        if (par <= n) return par;
        cur = par;
        k = __builtin_ctz(static_cast<unsigned>(cur));
      }
    };
    for (int p = 0; p < n; ++p) {
      const TreeLinks t = binaryTree(p, n);
      const int par = parentOf(p + 1);
      ASSERT_EQ(t.parent, par < 0 ? -1 : par - 1) << "n=" << n << " p=" << p;
      std::vector<int> kids;
      for (int j = 1; j <= n; ++j)
        if (j != p + 1 && parentOf(j) == p + 1) kids.push_back(j - 1);
      ASSERT_EQ(t.nchildren, static_cast<int>(kids.size())) << "n=" << n << " p=" << p;
      for (int c = 0; c < t.nchildren; ++c) ASSERT_EQ(t.children[c], kids[c]);
    }
    for (int r = 0; r < n; ++r) {
      for (int tree = 0; tree < 2; ++tree)
        ASSERT_EQ(doubleTreeRank(tree, doubleTreePosition(tree, r, n), n), r);
      for (int rootRank : {0, n / 2, n - 1}) {
        ASSERT_EQ(rootedTreeRank(rootedTreePosition(r, n, rootRank), n, rootRank), r);
      }
    }
    for (int rootRank : {0, n - 1})
      ASSERT_LT(binaryTree(rootedTreePosition(rootRank, n, rootRank), n).parent, 0);
  }
}

TEST(Schedules, ChunksCoverTheCount) {
  for (int n = 1; n <= 64; ++n) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{63}, size_t{262144}, size_t{1000003}}) {
      for (size_t unit : {size_t{1}, size_t{2}, size_t{8}, kChunkAlign}) {
        const bool aligned = unit > 1 && count >= static_cast<size_t>(n) * unit;
        size_t next = 0, least = count, most = 0;
        for (int i = 0; i < n; ++i) {
          size_t off, sz;
          chunkRange(count, n, i, &off, &sz, unit);
          ASSERT_EQ(off, next);
          if (aligned) {
            ASSERT_EQ(off % unit, 0u) << count << " in " << n << " by " << unit;
            ASSERT_GT(sz, 0u);
          }
          least = std::min(least, sz);
          most = std::max(most, sz);
          next += sz;
        }
        ASSERT_EQ(next, count);
        ASSERT_LE(most - least, aligned ? unit : 1) << count << " in " << n << " by " << unit;
      }
    }
  }
}

// The ring's and the direct form's FIFOs rely on no chunk of a block (at most n pieces)
// being larger than a piece; chunkUnit's unit keeps that for any piece.
TEST(Schedules, AlignedChunksNeverOutgrowAPiece) {
  EXPECT_EQ(chunkUnit(16384), kChunkAlign);
  EXPECT_EQ(chunkUnit(2056), 8u);  // 16448 bytes of doubles: a multiple of 64 bytes
  EXPECT_EQ(chunkUnit(24), 8u);
  EXPECT_EQ(chunkUnit(5), 1u);
  for (int n = 1; n <= 9; ++n) {
    for (size_t piece : {size_t{5}, size_t{24}, size_t{40}, size_t{48}, size_t{2056}}) {
      const size_t block = piece * n;
      for (size_t count : {size_t{1}, block / 2, block - 1, block, size_t{16} * n + 7}) {
        if (count > block) continue;
        for (int i = 0; i < n; ++i) {
          size_t off, sz;
          chunkRange(count, n, i, &off, &sz, chunkUnit(piece));
          ASSERT_LE(sz, piece) << "chunk " << i << " of " << count << " in " << n;
        }
      }
    }
  }
}

TEST(Tuner, ForcedAlgorithmAndUnknownNames) {
  CollRequest req;
  req.type = CollType::kAllReduce;
  req.count = 1 << 20;
  req.nranks = 8;
  auto ring = chooseAlgorithm(req, "ring");
  ASSERT_TRUE(ring.isOk());
  EXPECT_EQ(ring->algo, Algorithm::kRing);
  auto tree = chooseAlgorithm(req, "Tree");
  ASSERT_TRUE(tree.isOk());
  EXPECT_EQ(tree->algo, Algorithm::kTree);
  auto notTree = chooseAlgorithm(req, "^tree");
  ASSERT_TRUE(notTree.isOk());
  EXPECT_EQ(notTree->algo, Algorithm::kRing);
  auto bad = chooseAlgorithm(req, "warp");
  EXPECT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("warp"), std::string::npos);
}

TEST(Tuner, MessageSizePicksOneShotTreeOrRing) {
  CollRequest req;
  req.type = CollType::kAllReduce;
  req.count = 2;
  req.elemSize = 4;
  req.nranks = 64;
  auto c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kOneShot) << c->reason;
  c = chooseAlgorithm(req, "ring,tree");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kTree) << c->reason;
  req.count = 64 << 20;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kRing) << c->reason;
}

TEST(Tuner, SmallAllReduceOverSocketsTakesRecursiveDoubling) {
  CollRequest req;
  req.type = CollType::kAllReduce;
  req.count = 2;
  req.elemSize = 4;
  req.nranks = 4;
  req.network = true;
  auto c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kDoubling) << c->reason;
  // Not a power of two, or not over sockets: one-shot.
  req.nranks = 6;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kOneShot) << c->reason;
  req.nranks = 4;
  req.network = false;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kOneShot) << c->reason;
  // Forced, at any size; excluded, never.
  req.count = 64 << 20;
  c = chooseAlgorithm(req, "doubling");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kDoubling) << c->reason;
  req.count = 2;
  req.network = true;
  c = chooseAlgorithm(req, "^doubling");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kOneShot) << c->reason;
}

// Thousands of ranks: 8 bytes pass the small-message bound (it counts one-shot's n-1
// copies), yet recursive doubling's log2(n) steps stay under the tree's; large messages
// leave it (log2(n) times the data); shared memory and LOOM_ALGO without it never take it.
TEST(Tuner, ManyRanksOverSocketsKeepRecursiveDoublingWhereTheModelPricesItLower) {
  CollRequest req;
  req.type = CollType::kAllReduce;
  req.count = 2;
  req.elemSize = 4;
  req.nranks = 16384;
  req.network = true;
  ASSERT_GT(req.count * req.elemSize * (req.nranks - 1), kOneShotMaxBytes);
  auto c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kDoubling) << c->reason;
  c = chooseNetAlgorithm(req, AlgoRequest{});
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kDoubling) << c->reason;
  c = chooseAlgorithm(req, "^doubling");
  ASSERT_TRUE(c.isOk());
  EXPECT_NE(c->algo, Algorithm::kDoubling) << c->reason;
  req.nranks = 12288;  // not a power of two
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_NE(c->algo, Algorithm::kDoubling) << c->reason;
  req.nranks = 16384;
  req.count = 64 << 20;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_NE(c->algo, Algorithm::kDoubling) << c->reason;
  req.count = 2;
  req.network = false;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_NE(c->algo, Algorithm::kDoubling) << c->reason;
}

TEST(Tuner, LargerAllReduceOverSocketsWithFewRanksGoesDirect) {
  CollRequest req;
  req.type = CollType::kAllReduce;
  req.count = 1 << 20;
  req.elemSize = 4;
  req.nranks = 4;
  req.network = true;
  auto c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kDirect) << c->reason;
  req.nranks = 3;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kDirect) << c->reason;
  // Too many ranks for one step, shared memory, or excluded: ring (or tree).
  req.nranks = 5;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_NE(c->algo, Algorithm::kDirect) << c->reason;
  req.nranks = 4;
  c = chooseAlgorithm(req, "ring");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kRing) << c->reason;
  req.network = false;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_NE(c->algo, Algorithm::kDirect) << c->reason;
  c = chooseAlgorithm(req, "direct");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kDirect) << c->reason;
}

// Host buffers across hosts of several ranks each: the hierarchical all-reduce where the
// cost model prices it under the flat form the rules chose (large messages behind slow
// NICs), never for small ones, always where LOOM_ALGO names it alone, never where LOOM_ALGO
// leaves it out or no hierarchy was given.
TEST(Tuner, HierarchicalAllReduceWhereTheModelPricesItLower) {
  const model::Fabric f = model::hostMemoryFabric(2, 2, 0.125);  // 2 hosts x 2 ranks, 1 Gb/s
  Hierarchy h;
  std::string why;
  ASSERT_TRUE(findHierarchy({0, 0, 1, 1}, 1, &h, &why)) << why;
  CollRequest req;
  req.type = CollType::kAllReduce;
  req.elemSize = 4;
  req.nranks = 4;
  req.rank = 1;
  req.network = true;
  req.fabric = &f;
  req.hier = &h;
  req.count = 4 << 20;
  auto c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kHier) << c->text();
  EXPECT_NE(c->text().find("hierarchical"), std::string::npos) << c->text();
  EXPECT_FALSE(buildSchedule(req, c->algo).phases.empty());
  for (const char* forced : {"^hier", "ring", "direct"}) {
    c = chooseAlgorithm(req, forced);
    ASSERT_TRUE(c.isOk());
    EXPECT_NE(c->algo, Algorithm::kHier) << forced;
  }
  req.count = 2;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_NE(c->algo, Algorithm::kHier) << c->text();
  c = chooseAlgorithm(req, "hier");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kHier) << c->text();
  req.hier = nullptr;
  req.count = 4 << 20;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_NE(c->algo, Algorithm::kHier) << c->text();
  // All-gather likewise (priced by its output).
  req.hier = &h;
  req.type = CollType::kAllGather;
  req.count = 1 << 20;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kHier) << c->text();
  EXPECT_EQ(buildSchedule(req, c->algo).outputCount, req.count * 4);
  c = chooseAlgorithm(req, "^hier");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kRing) << c->text();
  // Reduce-scatter, its mirror (priced by its input), not below 16 KiB a rank.
  req.type = CollType::kReduceScatter;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kHier) << c->text();
  EXPECT_EQ(buildSchedule(req, c->algo).inputCount, req.count * 4);
  EXPECT_EQ(buildSchedule(req, c->algo).outputCount, req.count);
  req.count = 1024;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kRing) << c->text();
  c = chooseAlgorithm(req, "hier");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kHier) << c->text();
}

// What loom-model prints as the tuner's pick is the tuner's own choice, rules included:
// host buffers across hosts of two ranks take the hierarchical form for large messages
// and recursive doubling for small ones (a rule, whatever the model says); GPU buffers
// across hosts the one-shot on 3 ranks only; GPUs of one host are the mesh planner's to decide.
TEST(Tuner, PickForAFabricIsTheTunersChoice) {
  const model::Fabric host = model::hostMemoryFabric(4, 2, 0.125);
  model::Algo a{};
  std::string why;
  ASSERT_TRUE(tunerPick(CollType::kAllReduce, 4 << 20, host, &a, &why));
  EXPECT_EQ(a, model::Algo::kHierarchical) << why;
  ASSERT_TRUE(tunerPick(CollType::kAllReduce, 4096, host, &a, &why));
  EXPECT_EQ(a, model::Algo::kDoubling) << why;
  ASSERT_TRUE(tunerPick(CollType::kReduceScatter, 4 << 20, host, &a, &why));
  EXPECT_EQ(a, model::Algo::kHierarchical) << why;
  ASSERT_TRUE(tunerPick(CollType::kBroadcast, 4 << 20, host, &a, &why));
  EXPECT_EQ(a, model::Algo::kChain) << why;
  ASSERT_TRUE(tunerPick(CollType::kReduce, 4 << 20, host, &a, &why));
  EXPECT_EQ(a, model::Algo::kChain) << why;
  ASSERT_TRUE(tunerPick(CollType::kAllToAll, 4 << 20, host, &a, &why));
  EXPECT_EQ(a, model::Algo::kDirect) << why;
  const model::Fabric gpus = model::gpuFabric(3, 1, 450, 50, model::NetPath::kSockets);
  ASSERT_TRUE(tunerPick(CollType::kAllReduce, 8, gpus, &a, &why));
  EXPECT_EQ(a, model::Algo::kOneShot) << why;  // 3 ranks: one step with both peers
  ASSERT_TRUE(tunerPick(CollType::kAllReduce, 1 << 20, gpus, &a, &why));
  EXPECT_EQ(a, model::Algo::kDirect) << why;  // 3 ranks: direct at every size from 256 KiB
  ASSERT_TRUE(tunerPick(CollType::kAllReduce, 64 << 20, gpus, &a, &why));
  EXPECT_EQ(a, model::Algo::kDirect) << why;
  ASSERT_TRUE(tunerPick(CollType::kReduce, 4 << 20, gpus, &a, &why));
  EXPECT_EQ(a, model::Algo::kChain) << why;  // the model: the chain from 3 hosts at 4 MiB
  // GPU buffers across hosts of 8 GPUs: what the GPU executor asks (the hierarchical form
  // where the model prices it lower), else the network executor, on its fabric (every pair
  // of ranks through the network), at every size and host count.
  int hierPicks = 0;
  for (int hosts : {2, 4, 16, 256}) {
    const model::Fabric g = model::gpuFabric(hosts, 8, 450, 400, model::NetPath::kRdma);
    const model::Fabric executor = model::netExecutorFabric(g, /*rail=*/false);
    for (size_t bytes = 8; bytes <= (size_t(1) << 30); bytes *= 16) {
      CollRequest net;
      net.type = CollType::kAllReduce;
      net.elemSize = 4;
      net.nranks = hosts * 8;
      net.count = bytes / 4;
      net.fabric = &executor;
      auto flat = chooseNetAlgorithm(net, AlgoRequest{});
      ASSERT_TRUE(flat.isOk());
      const TunerChoice h =
          chooseDeviceHier(CollType::kAllReduce, bytes, &g, AlgoRequest{}, AlgoRequest{});
      const char* want = h.algo == Algorithm::kHier ? "hierarchical" : algorithmName(flat->algo);
      hierPicks += h.algo == Algorithm::kHier;
      ASSERT_TRUE(tunerPick(CollType::kAllReduce, bytes, g, &a, &why));
      EXPECT_STREQ(model::algoName(a), want) << hosts << " hosts, " << bytes << " B: " << why;
    }
  }
  EXPECT_GT(hierPicks, 0);
  const model::Fabric mesh = model::gpuFabric(1, 8, 450, 50, model::NetPath::kRdma);
  EXPECT_FALSE(tunerPick(CollType::kAllReduce, 8, mesh, &a, &why));
  EXPECT_NE(why.find("mesh"), std::string::npos) << why;
}

// GPU buffers across hosts of several GPUs: LOOM_ALGO naming hier forces the hierarchical
// form and leaving it out keeps the flat one; otherwise the cost model decides (on 2 hosts
// of 8 H100s, hierarchical for a 16 MiB all-reduce and all-gather, whose flat forms send
// everything through every GPU's share of the NICs); no fabric, no hierarchical form unless
// asked.
TEST(Tuner, GpuHierarchicalFormWhereForcedOrPricedLower) {
  const model::Fabric g = model::gpuFabric(2, 8, 450, 400, model::NetPath::kRdma);
  const AlgoRequest none;
  auto parse = [](const char* text) {
    auto r = AlgoRequest::parse(text);
    EXPECT_TRUE(r.isOk()) << text;
    return r.isOk() ? r.value() : AlgoRequest{};
  };
  const AlgoRequest hier = parse("hier"), notHier = parse("^hier");
  TunerChoice c = chooseDeviceHier(CollType::kAllReduce, 16 << 20, &g, none, none);
  EXPECT_EQ(c.algo, Algorithm::kHier) << c.text();
  EXPECT_GT(c.flatUs, c.hierUs);
  EXPECT_NE(c.text().find("hierarchical"), std::string::npos) << c.text();
  c = chooseDeviceHier(CollType::kAllReduce, 16 << 20, &g, notHier, notHier);
  EXPECT_NE(c.algo, Algorithm::kHier);
  c = chooseDeviceHier(CollType::kAllGather, 16 << 20, &g, none, none);
  EXPECT_EQ(c.algo, Algorithm::kHier) << c.text();
  EXPECT_GT(c.flatUs, c.hierUs);
  c = chooseDeviceHier(CollType::kAllGather, 16 << 20, &g, notHier, notHier);
  EXPECT_NE(c.algo, Algorithm::kHier);
  for (CollType t : {CollType::kAllGather, CollType::kBroadcast, CollType::kReduce}) {
    EXPECT_EQ(chooseDeviceHier(t, 8, &g, hier, none).algo, Algorithm::kHier);
    EXPECT_EQ(chooseDeviceHier(t, 8, nullptr, hier, none).algo, Algorithm::kHier);
  }
  EXPECT_NE(chooseDeviceHier(CollType::kAllReduce, 16 << 20, nullptr, none, none).algo,
            Algorithm::kHier);
  // A count that does not divide by the ranks per host keeps the buffer whole on the root's
  // rail, and is priced so: on 2 hosts of 8 GPUs a 256 MiB broadcast is then no faster
  // than the flat form (the pipelined chain), where split over the rails it is 3 x faster.
  for (CollType t : {CollType::kBroadcast, CollType::kReduce}) {
    model::Estimate whole, split;
    ASSERT_TRUE(model::hierRootedEstimate(t, 256 << 20, g, false, &whole));
    ASSERT_TRUE(model::hierRootedEstimate(t, 256 << 20, g, true, &split));
    const TunerChoice even = chooseDeviceHier(t, 256 << 20, &g, none, none, true);
    const TunerChoice odd = chooseDeviceHier(t, 256 << 20, &g, none, none, false);
    EXPECT_DOUBLE_EQ(even.hierUs, split.us) << collTypeName(t);
    EXPECT_DOUBLE_EQ(odd.hierUs, whole.us) << collTypeName(t);
    EXPECT_EQ(even.algo, Algorithm::kHier) << even.text();
    if (t == CollType::kBroadcast) {
      EXPECT_NE(odd.algo, Algorithm::kHier) << odd.text();
    }
  }
  // Where the flat form wins, the choice is the network executor's own.
  const model::Fabric oneRail = model::gpuFabric(2, 2, 450, 400, model::NetPath::kRdma);
  for (size_t bytes = 8; bytes <= (size_t(1) << 30); bytes *= 8) {
    c = chooseDeviceHier(CollType::kBroadcast, bytes, &oneRail, none, none);
    if (c.algo == Algorithm::kHier) continue;
    EXPECT_TRUE(c.algo == Algorithm::kChain || c.algo == Algorithm::kTree) << c.text();
    EXPECT_LE(c.flatUs, c.hierUs) << bytes;
  }
}

// Reduce: the pipelined chain or the tree, as the cost model prices them; LOOM_ALGO picks
// either. GPU buffers over the network likewise, on the network executor's fabric.
TEST(Tuner, ReduceTakesTheChainForLargeMessages) {
  CollRequest req;
  req.type = CollType::kReduce;
  req.elemSize = 4;
  req.nranks = 8;
  req.count = 1 << 20;
  auto c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kChain) << c->reason;
  EXPECT_EQ(buildSchedule(req, c->algo).phases.size(), 1u);
  req.count = 1024;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kTree) << c->reason;
  c = chooseAlgorithm(req, "chain");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kChain) << c->reason;
  req.count = 1 << 20;
  c = chooseAlgorithm(req, "tree");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kTree) << c->reason;
  c = chooseNetAlgorithm(req, AlgoRequest{});
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kChain) << c->reason;
  // LOOM_ALGO naming neither (an all-reduce form) leaves reduce to the model; ^chain
  // leaves the chain out.
  c = chooseAlgorithm(req, "direct");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kChain) << c->reason;
  c = chooseAlgorithm(req, "^chain");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kTree) << c->reason;
  auto onlyRing = AlgoRequest::parse("ring");
  ASSERT_TRUE(onlyRing.isOk());
  c = chooseNetAlgorithm(req, *onlyRing);
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kChain) << c->reason;  // ring: the chain's alias
  auto onlyChain = AlgoRequest::parse("chain");
  ASSERT_TRUE(onlyChain.isOk());
  c = chooseNetAlgorithm(req, *onlyChain);
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kChain) << c->reason;
  // GPU buffers across 3 and 4 hosts of one GPU over sockets: whichever the model prices
  // lower on the executor's fabric; the chain at 16 MiB, the tree for 8 B on 4 hosts
  // (log2(n) hops against n - 1).
  for (int hosts : {3, 4}) {
    const model::Fabric g = model::gpuFabric(hosts, 1, 450, 50, model::NetPath::kSockets);
    const model::Fabric executor = model::netExecutorFabric(g, /*rail=*/false);
    req.nranks = hosts;
    req.fabric = &executor;
    for (size_t bytes : {size_t(8), size_t(32) << 10, size_t(2) << 20, size_t(16) << 20}) {
      req.count = bytes / req.elemSize;
      model::Estimate ce, te;
      ASSERT_TRUE(model::estimate(CollType::kReduce, model::Algo::kChain, bytes, executor, &ce));
      ASSERT_TRUE(model::estimate(CollType::kReduce, model::Algo::kTree, bytes, executor, &te));
      EXPECT_TRUE(ce.built && te.built);
      c = chooseNetAlgorithm(req, AlgoRequest{});
      ASSERT_TRUE(c.isOk());
      EXPECT_EQ(c->algo, te.us < ce.us ? Algorithm::kTree : Algorithm::kChain)
          << hosts << " hosts, " << bytes << " B: " << c->text();
      if (bytes == (size_t(16) << 20)) EXPECT_EQ(c->algo, Algorithm::kChain) << c->text();
      if (bytes == 8 && hosts == 4) EXPECT_EQ(c->algo, Algorithm::kTree) << c->text();
    }
  }
}

// Broadcast: across hosts (a fabric given), host buffers take chain or tree by the model;
// inside one host, and GPU buffers, the rule (tree below 256 KiB over more than 4 ranks).
TEST(Tuner, BroadcastByTheModelAcrossHostsByTheRuleElsewhere) {
  const model::Fabric f = model::hostMemoryFabric(8, 1, 0.125);  // 8 hosts, 1 Gb/s
  CollRequest req;
  req.type = CollType::kBroadcast;
  req.elemSize = 4;
  req.nranks = 8;
  req.count = 16384;  // 64 KiB
  auto c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kTree) << c->reason;  // one host: the rule
  req.network = true;
  req.fabric = &f;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kChain) << c->text();  // measured 0.50 of the tree's time
  c = chooseNetAlgorithm(req, AlgoRequest{});
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kTree) << c->reason;  // GPU buffers: the rule
  req.count = 2;
  c = chooseAlgorithm(req, "");
  ASSERT_TRUE(c.isOk());
  EXPECT_EQ(c->algo, Algorithm::kTree) << c->text();
}

TEST(Tuner, HostPiecesFillOneRingBlockWhenTheSlotsAllow) {
  const size_t slot = 256 * 1024;
  // 512 KiB over 4 ranks: one block of four 128 KiB pieces.
  EXPECT_EQ(hostPieceBytes(CollType::kAllReduce, 512 * 1024, 4, slot), 128u * 1024);
  // Larger messages take whole slots; small ones never go below 16 KiB.
  EXPECT_EQ(hostPieceBytes(CollType::kAllReduce, 64 << 20, 4, slot), slot);
  EXPECT_EQ(hostPieceBytes(CollType::kAllReduce, 1000, 4, slot), 16u * 1024);
  // All-gather and reduce-scatter count per rank.
  EXPECT_EQ(hostPieceBytes(CollType::kAllGather, 128 * 1024, 4, slot), 128u * 1024);
  // Broadcast streams through a chain: several pieces per rank.
  EXPECT_EQ(hostPieceBytes(CollType::kBroadcast, 1 << 20, 4, slot), 64u * 1024);
  // Never more than a slot, always a multiple of 64 bytes.
  EXPECT_EQ(hostPieceBytes(CollType::kAllReduce, 3 << 20, 3, 4096), 4096u);
  // Over sockets the ring collectives take pieces of at most 128 KiB; broadcast keeps its own.
  EXPECT_EQ(hostPieceBytes(CollType::kAllReduce, 64 << 20, 4, slot, true),
            std::min<size_t>(slot, 128u * 1024));
  EXPECT_EQ(hostPieceBytes(CollType::kAllGather, 8 << 20, 4, slot, true),
            std::min<size_t>(slot, 128u * 1024));
  EXPECT_EQ(hostPieceBytes(CollType::kBroadcast, 64 << 20, 4, slot, true), slot);
  EXPECT_EQ(hostPieceBytes(CollType::kAllReduce, 1000, 4, slot, true), 16u * 1024);
  EXPECT_EQ(hostPieceBytes(CollType::kAllReduce, 100001 * 3, 3, slot) % 64, 0u);
}

TEST(Tuner, NetworkBroadcastAndReduceTakeLargePieces) {
  const size_t slot = 1 << 20;
  // GPU buffers over the network: broadcast and reduce in pieces of at least 256 KiB (one
  // piece when the message is smaller), at most a slot; the ring collectives as on hosts.
  EXPECT_EQ(netPieceBytes(CollType::kBroadcast, 1 << 20, 4, slot), 256u * 1024);
  EXPECT_EQ(netPieceBytes(CollType::kReduce, 64 * 1024, 2, slot), 256u * 1024);
  EXPECT_EQ(netPieceBytes(CollType::kBroadcast, 64 << 20, 2, slot), slot);
  EXPECT_EQ(netPieceBytes(CollType::kReduce, 1 << 20, 2, 128 * 1024), 128u * 1024);
  EXPECT_EQ(netPieceBytes(CollType::kAllReduce, 1 << 20, 4, slot),
            hostPieceBytes(CollType::kAllReduce, 1 << 20, 4, slot));
}

}  // namespace
}  // namespace loom::collectives
