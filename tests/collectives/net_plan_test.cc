// Network plans (collectives/device/net_plan.h): every schedule the network executor uses
// becomes a plan whose phases never use a connection twice, for 1-64 ranks; and the plans
// run correctly end to end over real sockets and proxies, ranks as threads, with an
// emulation of the kernel on the CPU (CpuKernel below, an emulation of
// collectives/device/net_kernels.cu: the same FIFO protocol and the same combination
// order, host arithmetic). The kernel itself runs in the GPU tests.
#include "collectives/device/net_plan.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/tuner.h"
#include "common/datatype.h"
#include "transports/net/connect.h"
#include "transports/net/net_fifo.h"
#include "transports/net/proxy.h"

namespace loom::collectives::device {
namespace {

using transport::net::Fifo;
using transport::net::fifoHead;
using transport::net::fifoHeadIs;
using transport::net::fifoHeadSize;
using transport::net::fifoWord;
using transport::net::fifoWords;

CollRequest request(CollType type, int rank, int n, size_t count, int root, size_t pieceElems) {
  CollRequest r;
  r.type = type;
  r.count = count;
  r.elemSize = 4;
  r.nranks = n;
  r.rank = rank;
  r.root = root;
  r.pieceElems = pieceElems;
  r.network = true;
  return r;
}

struct Case {
  CollType type;
  Algorithm algo;
};
const Case kCases[] = {
    {CollType::kAllReduce, Algorithm::kRing},
    {CollType::kAllReduce, Algorithm::kTree},
    {CollType::kAllReduce, Algorithm::kDirect},
    {CollType::kAllReduce, Algorithm::kDoubling},
    {CollType::kAllGather, Algorithm::kRing},
    {CollType::kReduceScatter, Algorithm::kRing},
    {CollType::kBroadcast, Algorithm::kChain},
    {CollType::kBroadcast, Algorithm::kTree},
    {CollType::kReduce, Algorithm::kTree},
    {CollType::kReduce, Algorithm::kChain},
    {CollType::kAllToAll, Algorithm::kDirect},
    {CollType::kAllGather, Algorithm::kDoubling},
    {CollType::kReduceScatter, Algorithm::kDoubling},
};
// Forms that only some rank counts take.
const Case kOneShotCase = {CollType::kAllReduce, Algorithm::kOneShot};

TEST(NetPlan, EveryScheduleBecomesAPlanForOneToSixtyFourRanks) {
  for (const Case& c : kCases) {
    for (int n : {1, 2, 3, 4, 5, 7, 8, 16, 33, 64}) {
      for (int r = 0; r < n; ++r) {
        for (int root : {0, n - 1}) {
          Schedule s = netSchedule(request(c.type, r, n, 1000, root, 37), c.algo);
          auto plan = makeNetPlan(s, 37);
          ASSERT_TRUE(plan.isOk()) << collTypeName(c.type) << "/" << algorithmName(c.algo)
                                   << " n=" << n << " r=" << r << ": " << plan.status().message();
          const auto* h = reinterpret_cast<const NetPlanHeader*>(plan->data());
          EXPECT_LE(h->bytes, plan->size() * 8);
          EXPECT_GE(h->blocks, 1u);
          EXPECT_LE(h->blocks, kNetMaxBlocks);
        }
      }
    }
  }
}

TEST(NetPlan, SplitPutsTheKthUseOfAConnectionInSubPhaseK) {
  Schedule s;
  Phase p;
  auto send = [](int peer, size_t count) {
    Step st;
    st.count = count;
    st.src = {Buffer::kAbsolute, 0x1000};
    st.sendTo(peer);
    return st;
  };
  auto recv = [](int peer, size_t count) {
    Step st;
    st.count = count;
    st.dst = {Buffer::kAbsolute, 0x2000};
    st.recvFrom(peer);
    return st;
  };
  p = {send(1, 10), send(1, 20), recv(1, 5), send(2, 7), recv(1, 0), recv(1, 6)};
  s.phases.push_back(p);
  EXPECT_FALSE(makeNetPlan(s, 4).isOk());  // two sends to rank 1 in one phase
  Schedule t = splitByConnection(s);
  ASSERT_EQ(t.phases.size(), 2u);
  ASSERT_EQ(t.phases[0].size(), 3u);  // send(1,10) recv(1,5) send(2,7)
  ASSERT_EQ(t.phases[1].size(), 2u);  // send(1,20) recv(1,6); the empty receive is gone
  EXPECT_EQ(t.phases[1][0].count, 20u);
  EXPECT_EQ(t.phases[1][1].count, 6u);
  auto plan = makeNetPlan(t, 4);
  ASSERT_TRUE(plan.isOk());
  std::vector<NetLink> sends, recvs;
  netPlanLinks(reinterpret_cast<const NetPlanHeader*>(plan->data()), &sends, &recvs);
  EXPECT_EQ(sends, (std::vector<NetLink>{{1, 0}, {2, 0}}));
  EXPECT_EQ(recvs, (std::vector<NetLink>{{1, 0}}));

  // Listed in order: a step never goes into a sub-phase before one listed ahead of it.
  // recv(1,5) and send(2,7) share no connection with send(1,10) but follow send(1,20) into
  // sub-phase 1, and recv(1,6) goes on to sub-phase 2.
  s.listedInOrder = true;
  Schedule u = splitByConnection(s);
  EXPECT_TRUE(u.listedInOrder);
  ASSERT_EQ(u.phases.size(), 3u);
  ASSERT_EQ(u.phases[0].size(), 1u);  // send(1,10)
  ASSERT_EQ(u.phases[1].size(), 3u);  // send(1,20) recv(1,5) send(2,7)
  ASSERT_EQ(u.phases[2].size(), 1u);  // recv(1,6)
  EXPECT_EQ(u.phases[2][0].count, 6u);
}

// The tuner's choice for `type` of `count` elements over the network on n ranks with
// LOOM_ALGO `algo` (kOneShot, after a failed expectation, where it gives an error).
Algorithm netPick(CollType type, int n, size_t count, const char* algo) {
  auto c = chooseNetAlgorithm(request(type, 0, n, count, 0, 1000), *AlgoRequest::parse(algo));
  EXPECT_TRUE(c.isOk());
  return c.isOk() ? c->algo : Algorithm::kOneShot;
}
// The same for an all-reduce of `bytes` (floats).
Algorithm allReducePick(int n, size_t bytes, const char* algo) {
  return netPick(CollType::kAllReduce, n, bytes / 4, algo);
}

// Recursive doubling and halving for all-gather and reduce-scatter: only where LOOM_ALGO
// names doubling and none of ring, direct and hier, on 4 and 8 ranks; never by default.
TEST(NetPlan, GatherAndScatterTakeDoublingOnlyWhereNamed) {
  for (CollType type : {CollType::kAllGather, CollType::kReduceScatter}) {
    for (int n : {2, 3, 4, 8, 16}) {
      for (size_t count : {size_t{64}, size_t{1} << 20}) {
        const bool fits = n == 4 || n == 8;
        EXPECT_EQ(netPick(type, n, count, "doubling") == Algorithm::kDoubling, fits) << n;
        EXPECT_NE(netPick(type, n, count, ""), Algorithm::kDoubling) << n;
        EXPECT_NE(netPick(type, n, count, "doubling,ring"), Algorithm::kDoubling) << n;
        EXPECT_NE(netPick(type, n, count, "doubling,direct"), Algorithm::kDoubling) << n;
        EXPECT_NE(netPick(type, n, count, "^ring,direct"), Algorithm::kDoubling) << n;
      }
    }
  }
}

// A small all-reduce over the network: one-shot on 3 ranks by default and on 3 and 4 when
// forced, recursive doubling on 2 and 4 (one exchange on 2; on 4 two, one peer each), never
// one-shot beyond 4 (a step has at most kMaxStepPeers peers); LOOM_ALGO=doubling still
// gets doubling.
TEST(NetPlan, OneShotOverTheNetworkOnThreeRanks) {
  for (int n : {2, 3, 4, 5, 8}) {
    const Algorithm byDefault = allReducePick(n, 8, "");
    EXPECT_EQ(byDefault == Algorithm::kOneShot, n == 3) << n;
    if (n == 4) {
      EXPECT_EQ(byDefault, Algorithm::kDoubling);
    }
    EXPECT_EQ(allReducePick(n, 8, "oneshot") == Algorithm::kOneShot, n == 3 || n == 4) << n;
    EXPECT_NE(allReducePick(n, 8, "doubling"), Algorithm::kOneShot) << n;
    // Past the small-message bound: not one-shot.
    EXPECT_NE(allReducePick(n, kOneShotMaxBytes + 4, ""), Algorithm::kOneShot) << n;
  }
}

// An all-reduce over the network on 2 ranks: recursive doubling up to
// kTwoRankDoublingMaxBytes, the ring above; LOOM_ALGO keeps the say. Not on more ranks.
TEST(NetPlan, TwoRanksTakeRecursiveDoublingUpTo256KiB) {
  EXPECT_EQ(allReducePick(2, 128 * 1024, ""), Algorithm::kDoubling);
  EXPECT_EQ(allReducePick(2, kTwoRankDoublingMaxBytes, ""), Algorithm::kDoubling);
  EXPECT_EQ(allReducePick(2, kTwoRankDoublingMaxBytes + 4, ""), Algorithm::kRing);
  EXPECT_EQ(allReducePick(2, 128 * 1024, "ring"), Algorithm::kRing);
  EXPECT_EQ(allReducePick(2, 128 * 1024, "^doubling"), Algorithm::kRing);
  EXPECT_EQ(allReducePick(2, kTwoRankDoublingMaxBytes + 4, "doubling"), Algorithm::kDoubling);
  EXPECT_NE(allReducePick(4, 128 * 1024, ""), Algorithm::kDoubling);
  EXPECT_NE(allReducePick(8, 128 * 1024, ""), Algorithm::kDoubling);
}

TEST(NetPlan, FourRanksTakeTheRingAbove2MiB) {
  EXPECT_EQ(allReducePick(4, 1024 * 1024, ""), Algorithm::kDirect);
  EXPECT_EQ(allReducePick(4, kDirectAllReduceMaxBytes4, ""), Algorithm::kDirect);
  EXPECT_EQ(allReducePick(4, kDirectAllReduceMaxBytes4 + 4, ""), Algorithm::kRing);
  EXPECT_EQ(allReducePick(4, 128u << 20, ""), Algorithm::kRing);
  EXPECT_EQ(allReducePick(4, 16u << 20, "direct"), Algorithm::kDirect);
  EXPECT_EQ(allReducePick(4, 16u << 20, "^ring"), Algorithm::kDirect);
  EXPECT_EQ(allReducePick(3, 64u << 20, ""), Algorithm::kDirect);
  EXPECT_EQ(allReducePick(4, 16u << 20, "direct,ring"), Algorithm::kDirect);  // names direct: kept
  EXPECT_NE(allReducePick(4, 16u << 20, "^direct"), Algorithm::kDirect);
  EXPECT_NE(allReducePick(5, 16u << 20, ""), Algorithm::kDirect);
  EXPECT_NE(allReducePick(8, 16u << 20, ""), Algorithm::kDirect);
}

TEST(NetPlan, ThreeRanksTakeDirectFrom256KiB) {
  for (size_t bytes : {size_t{256} << 10, size_t{512} << 10, size_t{1} << 20, size_t{2} << 20,
                       size_t{8} << 20, size_t{64} << 20}) {
    EXPECT_EQ(allReducePick(3, bytes, ""), Algorithm::kDirect) << bytes;
  }
  EXPECT_EQ(allReducePick(3, 2u << 20, "tree"), Algorithm::kTree);      // named: kept
  EXPECT_EQ(allReducePick(3, 2u << 20, "direct"), Algorithm::kDirect);  // named: kept
  EXPECT_EQ(allReducePick(3, 2u << 20, "^tree"), Algorithm::kDirect);
  EXPECT_EQ(allReducePick(3, 2u << 20, "ring"), Algorithm::kRing);
  EXPECT_EQ(allReducePick(4, 2u << 20, ""), Algorithm::kDirect);  // 4 ranks: their own rule
}

// Past 4 ranks a small all-reduce over the network cannot take the one-shot: the next
// form LOOM_ALGO leaves in, never one it leaves out.
TEST(NetPlan, SmallMessagesBeyondFourRanksKeepLoomAlgosExclusions) {
  EXPECT_EQ(allReducePick(8, 8, ""), Algorithm::kDoubling);
  EXPECT_NE(allReducePick(8, 8, "^doubling"), Algorithm::kDoubling);
  EXPECT_EQ(allReducePick(5, 8, "^ring"), Algorithm::kTree);
  EXPECT_EQ(allReducePick(6, 8, "oneshot"), Algorithm::kRing);  // nothing else left: the ring runs
  EXPECT_EQ(allReducePick(4, 8, "^doubling"), Algorithm::kOneShot);
  EXPECT_EQ(allReducePick(4, 8, "oneshot"), Algorithm::kOneShot);
}

// Lanes whose blocks would be more than a kernel takes run as fewer lanes: recursive
// doubling's pipelined rounds take 2 log2(n) blocks a lane, the direct forms 2n - 1.
TEST(NetPlan, LanesFitTheBlockLimit) {
  struct Want {
    Algorithm algo;
    int n;
  };
  for (const Want& w : {Want{Algorithm::kDoubling, 32}, Want{Algorithm::kDoubling, 64},
                        Want{Algorithm::kDoubling, 4}, Want{Algorithm::kDirect, 5}}) {
    for (int lanes : {4, 8}) {
      const size_t piece = 1 << 14;
      const CollRequest req = request(CollType::kAllReduce, 1, w.n, size_t{64} << 20, 0, piece);
      const std::vector<Schedule> s = netLaneSchedules(req, w.algo, lanes);
      ASSERT_FALSE(s.empty());
      EXPECT_LE(s.size(), size_t(lanes));
      auto plan = makeNetPlan(s, piece);
      ASSERT_TRUE(plan.isOk()) << algorithmName(w.algo) << " n=" << w.n << " lanes=" << lanes
                               << ": " << plan.status().message();
      const auto* h = reinterpret_cast<const NetPlanHeader*>(plan->data());
      EXPECT_LE(h->blocks, kNetMaxBlocks);
      // Where every lane fits, every lane stays.
      if (w.n == 4) {
        EXPECT_EQ(s.size(), size_t(lanes));
      }
    }
  }
}

// Every rank adds the inputs in rank order: its own at its rank among the others'.
TEST(NetPlan, OneShotAddsInRankOrderOnEveryRank) {
  for (int n : {2, 3, 4}) {
    for (int r = 0; r < n; ++r) {
      Schedule s =
          netSchedule(request(CollType::kAllReduce, r, n, 100, 0, 1000), Algorithm::kOneShot);
      // The send, then the sum (in place, the sum overwrites what the send reads).
      ASSERT_EQ(s.phases.size(), 2u);
      ASSERT_EQ(s.phases[0].size(), 1u);
      ASSERT_EQ(s.phases[1].size(), 1u);
      const Step& sum = s.phases[1][0];
      ASSERT_EQ(sum.nrecv, n - 1);
      EXPECT_EQ(sum.srcAt, r);
      std::vector<int> order(sum.recvPeers, sum.recvPeers + sum.nrecv);
      order.insert(order.begin() + sum.srcAt, r);
      for (int q = 0; q < n; ++q) EXPECT_EQ(order[q], q) << "n=" << n << " r=" << r;
      EXPECT_EQ(s.phases[0][0].nsend, n - 1);
    }
  }
}

// All-gather and reduce-scatter of GPU buffers over the network: direct (one step) for
// blocks up to kDirectAllGatherMaxBytes on 4 ranks and any on 3 (all-gather), up to
// kDirectReduceScatterMaxBytes on 3 (reduce-scatter); the ring above, on 2 ranks (one step
// either way) and beyond 4; LOOM_ALGO decides where it names one (up to 4 ranks).
TEST(NetPlan, SmallAllGatherAndReduceScatterAreDirectOnFewRanks) {
  for (CollType type : {CollType::kAllGather, CollType::kReduceScatter}) {
    const bool gather = type == CollType::kAllGather;
    const size_t small = (gather ? kDirectAllGatherMaxBytes : kDirectReduceScatterMaxBytes) / 4;
    const size_t large = small + 1;
    auto pick = [type](int n, size_t count, const char* algo) {
      return netPick(type, n, count, algo);
    };
    const int t = static_cast<int>(type);
    for (int n : {3, 4}) {
      const Algorithm smallPick = gather || n == 3 ? Algorithm::kDirect : Algorithm::kRing;
      EXPECT_EQ(pick(n, 1, ""), smallPick) << t << " " << n;
      EXPECT_EQ(pick(n, small, ""), smallPick) << t << " " << n;
      EXPECT_EQ(pick(n, large, ""), gather && n == 3 ? Algorithm::kDirect : Algorithm::kRing)
          << t << " " << n;
      EXPECT_EQ(pick(n, large, "direct"), Algorithm::kDirect) << t << " " << n;
      EXPECT_EQ(pick(n, 1, "ring"), Algorithm::kRing) << t << " " << n;
      EXPECT_EQ(pick(n, 1, "^direct"), Algorithm::kRing) << t << " " << n;
    }
    for (int n : {2, 5, 8}) EXPECT_EQ(pick(n, 1, ""), Algorithm::kRing) << t << " " << n;
    // Host buffers across hosts of one rank: direct from kDirectHostMinBytes a rank on 3
    // and 4 (not within a host, where no fabric is given, nor on hosts of several ranks).
    auto host = [type](int n, size_t count, int perHost = 1, bool across = true) {
      CollRequest r = request(type, 0, n, count, 0, 1000);
      model::Fabric f;
      f.hosts = n / perHost;
      f.ranksPerHost = perHost;
      if (across) r.fabric = &f;
      auto c = chooseFlatAlgorithm(r, AlgoRequest());
      EXPECT_TRUE(c.isOk());
      return c.isOk() ? c->algo : Algorithm::kOneShot;
    };
    const size_t from = kDirectHostMinBytes / 4;
    for (int n : {3, 4}) {
      EXPECT_EQ(host(n, from), Algorithm::kDirect) << t << " " << n;
      EXPECT_EQ(host(n, from - 1), Algorithm::kRing) << t << " " << n;
    }
    EXPECT_EQ(host(5, from), Algorithm::kRing) << t;
    EXPECT_EQ(host(4, from, 2), Algorithm::kRing) << t;
    EXPECT_EQ(host(4, from, 1, false), Algorithm::kRing) << t;
  }
}

// ---- Plans over real sockets and proxies, the kernel emulated on the CPU. ----

constexpr uint32_t kSlots = 4;
constexpr uint64_t kSlotBytes = 4096;

uint64_t loadAcquire(uint64_t* p) {
  return std::atomic_ref<uint64_t>(*p).load(std::memory_order_acquire);
}
void storeRelease(uint64_t* p, uint64_t v) {
  std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release);
}
bool closed(const Fifo& f) {
  return std::atomic_ref<uint32_t>(f.header->closed).load() != transport::net::kNetOpen;
}

// One rank: its backend, proxy and FIFOs, and the emulated kernel's counters.
struct Rank {
  int rank = 0;
  int n = 0;
  std::unique_ptr<transport::net::Backend> backend;
  std::vector<void*> memory;
  std::vector<Fifo> send, recv;  // by link (lane * n + peer)
  std::vector<bool> haveSend, haveRecv;
  std::vector<uint64_t> sent, consumed;
  transport::net::HandleExchange exchange[kNetMaxLanes];  // each lane's handles
  std::unique_ptr<transport::net::Proxy> proxy;           // declared last: goes first

  ~Rank() {
    proxy.reset();
    for (void* m : memory) std::free(m);
  }
};

// n ranks of one communicator, each with its backend (null if it failed) and proxy.
std::vector<std::unique_ptr<Rank>> makeRanks(int n, uint64_t commHash) {
  std::vector<std::unique_ptr<Rank>> ranks(n);
  for (int r = 0; r < n; ++r) {
    ranks[r] = std::make_unique<Rank>();
    Rank& k = *ranks[r];
    k.rank = r;
    k.n = n;
    transport::net::Context ctx;
    ctx.commHash = commHash;
    ctx.rank = r;
    auto b = transport::net::makeSocketBackend(ctx);
    EXPECT_TRUE(b.isOk()) << b.status().message();
    if (b) k.backend = std::move(b).value();
    const size_t links = size_t(n) * kNetMaxLanes;
    k.send.resize(links);
    k.recv.resize(links);
    k.haveSend.assign(links, false);
    k.haveRecv.assign(links, false);
    k.sent.assign(links, 0);
    k.consumed.assign(links, 0);
    k.proxy = std::make_unique<transport::net::Proxy>(r, 1000);
  }
  return ranks;
}

struct Mailbox {
  std::mutex mutex;
  std::map<std::tuple<int, int, int>, transport::net::Handle> handles;  // (from, to, lane)
};

// Connections as the network executor makes them: the FIFOs now, the connections by the
// proxy thread (transports/net/connect.h's dialers), so nothing here waits for a peer.
void connectRank(Rank& r, Mailbox& mail, const std::vector<NetLink>& sends,
                 const std::vector<NetLink>& recvs) {
  for (int lane = 0; lane < int(kNetMaxLanes) && !r.exchange[0].send; ++lane) {
    for (int l = 0; l < int(kNetMaxLanes); ++l) {
      r.exchange[l].send = [&mail, me = r.rank, l](int peer, const transport::net::Handle& h) {
        std::lock_guard<std::mutex> lock(mail.mutex);
        mail.handles[{me, peer, l}] = h;
        return Status::ok();
      };
      r.exchange[l].tryRecv = [&mail, me = r.rank, l](int peer,
                                                      transport::net::Handle* h) -> Result<bool> {
        std::lock_guard<std::mutex> lock(mail.mutex);
        auto it = mail.handles.find({peer, me, l});
        if (it == mail.handles.end()) return false;
        *h = it->second;
        mail.handles.erase(it);
        return true;
      };
    }
  }
  auto fifo = [&](int peer) {
    const size_t bytes = transport::net::fifoBytes(kSlots, kSlotBytes);
    void* m = std::aligned_alloc(4096, bytes);
    std::memset(m, 0, bytes);
    r.memory.push_back(m);
    return transport::net::fifoAt(m, kSlots, kSlotBytes, peer);
  };
  for (const NetLink& l : recvs) {
    const int k = l.lane * r.n + l.peer;
    if (r.haveRecv[k]) continue;
    r.recv[k] = fifo(l.peer);
    auto dial = transport::net::listenFor(*r.backend, 0, l.peer, r.exchange[l.lane]);
    ASSERT_TRUE(dial.isOk()) << dial.status().message();
    r.proxy->addRecv(std::move(dial).value(), r.recv[k], 20000);
    r.haveRecv[k] = true;
  }
  for (const NetLink& l : sends) {
    const int k = l.lane * r.n + l.peer;
    if (r.haveSend[k]) continue;
    r.send[k] = fifo(l.peer);
    r.proxy->addSend(transport::net::dialTo(*r.backend, 0, l.peer, r.exchange[l.lane]), r.send[k],
                     20000);
    r.haveSend[k] = true;
  }
}

// The kernel, emulated: a thread per step of a phase (the kernel's blocks), the phases
// one after another, every piece through the FIFOs as net_kernels.cu moves it.
class CpuKernel {
 public:
  CpuKernel(Rank& r, const NetPlanHeader* plan, DataType type, RedOp op, const void* in, void* out)
      : r_(r), plan_(plan), type_(type), op_(op), in_(in), out_(out), es_(dataTypeSize(type)) {}

  // The lanes side by side, each its phases in order.
  Status run() {
    std::vector<Status> results(plan_->nlanes);
    std::vector<std::thread> lanes;
    for (uint32_t l = 0; l < plan_->nlanes; ++l)
      lanes.emplace_back([&, l] { results[l] = lane(netLanes(plan_)[l]); });
    for (auto& t : lanes) t.join();
    for (auto& s : results) LOOM_TRY(s);
    return Status::ok();
  }

 private:
  char* at(uint8_t buffer, uint64_t offset) const {
    switch (static_cast<Buffer>(buffer)) {
      case Buffer::kInput: return const_cast<char*>(static_cast<const char*>(in_)) + offset * es_;
      case Buffer::kOutput: return static_cast<char*>(out_) + offset * es_;
      case Buffer::kAbsolute: return reinterpret_cast<char*>(offset);
      default: return nullptr;
    }
  }

  template <typename Ready>
  Status await(Ready ready, const char* what, int peer) {
    auto deadline = Clock::now() + std::chrono::seconds(30);
    while (!ready()) {
      if (Clock::now() > deadline)
        return errorf(Code::kRemoteError, "rank %d: %s rank %d timed out", r_.rank, what, peer);
      std::this_thread::yield();
    }
    return Status::ok();
  }

  Status lane(const NetLane& L) {
    const NetPhase* phases = netPhases(plan_) + L.firstPhase;
    const NetStep* steps = netSteps(plan_);
    for (uint32_t p = 0; p < L.nphases; ++p) {
      std::vector<Status> st(phases[p].nsteps);
      std::vector<std::thread> blocks;
      for (uint32_t b = 0; b < phases[p].nsteps; ++b) {
        blocks.emplace_back([&, b] { st[b] = step(steps[phases[p].firstStep + b]); });
      }
      for (auto& t : blocks) t.join();
      for (auto& s : st) LOOM_TRY(s);
    }
    return Status::ok();
  }

  Status step(const NetStep& st) {
    const int base = st.lane * r_.n;
    const uint64_t pieces = (st.count + plan_->pieceElems - 1) / plan_->pieceElems;
    std::vector<char> acc;
    for (uint64_t p = 0; p < pieces; ++p) {
      const uint64_t first = p * plan_->pieceElems;
      const uint64_t elems = std::min<uint64_t>(plan_->pieceElems, st.count - first);
      const size_t bytes = elems * es_;
      const char* recv[kMaxStepPeers] = {};
      char* send[kMaxStepPeers] = {};
      std::vector<uint32_t> small[kMaxStepPeers];
      for (int j = 0; j < st.nrecv; ++j) {
        const int q = st.recvPeers[j];
        Fifo& f = r_.recv[base + q];
        const uint64_t seq = r_.consumed[base + q];
        uint64_t* head = &f.header->head[seq % f.nslots];
        LOOM_TRY(await([&] { return fifoHeadIs(loadAcquire(head), seq) || closed(f); },
                       "receiving from", q));
        if (!fifoHeadIs(loadAcquire(head), seq))
          return errorf(Code::kRemoteError, "rank %d: FIFO from %d closed", r_.rank, q);
        if (fifoHeadSize(*head) != bytes) {
          return errorf(Code::kInvalidUsage,
                        "rank %d: a piece of %llu bytes from rank %d, %zu expected", r_.rank,
                        (unsigned long long)fifoHeadSize(*head), q, bytes);
        }
        recv[j] = f.slot(seq);
        if (f.isSmall(bytes)) {
          // As the kernel reads it: from the tagged words (the proxy wrote them before the
          // head), which must agree with the slot.
          small[j].resize(fifoWords(bytes));
          for (uint32_t i = 0; i < small[j].size(); ++i) {
            const uint64_t w = loadAcquire(&f.header->ll[seq % f.nslots][i]);
            if (!fifoHeadIs(w, seq))
              return errorf(Code::kInternalError, "rank %d: small word %u from %d untagged",
                            r_.rank, i, q);
            small[j][i] = static_cast<uint32_t>(w);
          }
          if (std::memcmp(small[j].data(), recv[j], bytes) != 0)
            return errorf(Code::kInternalError, "rank %d: small words from %d differ from the slot",
                          r_.rank, q);
          recv[j] = reinterpret_cast<const char*>(small[j].data());
        }
      }
      for (int j = 0; j < st.nsend; ++j) {
        const int q = st.sendPeers[j];
        Fifo& f = r_.send[base + q];
        const uint64_t seq = r_.sent[base + q];
        LOOM_TRY(await([&] { return seq - loadAcquire(&f.header->done) < f.nslots || closed(f); },
                       "sending to", q));
        if (closed(f)) return errorf(Code::kRemoteError, "rank %d: FIFO to %d closed", r_.rank, q);
        send[j] = f.slot(seq);
      }
      // The kernel's combination: the source (pre-op unless partial), then what arrived,
      // in order; the post-op on a final step; into the destination and every send slot.
      const bool reduces = plan_->reduces != 0;
      const char* src = st.srcBuffer ? at(st.srcBuffer, st.srcOffset) + first * es_ : nullptr;
      char* dst = st.dstBuffer ? at(st.dstBuffer, st.dstOffset) + first * es_ : nullptr;
      acc.resize(bytes);
      if (src && reduces && st.srcAt <= st.nrecv) {
        // What arrived with the source at srcAt, combined in that order.
        std::vector<char> own(bytes);
        if (st.srcPartial) {
          std::memcpy(own.data(), src, bytes);
        } else {
          applyPreOp(type_, op_, own.data(), src, elems);
        }
        std::vector<const char*> order(recv, recv + st.nrecv);
        order.insert(order.begin() + st.srcAt, own.data());
        std::memcpy(acc.data(), order[0], bytes);
        for (size_t j = 1; j < order.size(); ++j)
          reduce(type_, op_, acc.data(), acc.data(), order[j], elems);
      } else if (src) {
        if (reduces && !st.srcPartial) {
          applyPreOp(type_, op_, acc.data(), src, elems);
        } else {
          std::memcpy(acc.data(), src, bytes);
        }
        if (reduces) {
          for (int j = 0; j < st.nrecv; ++j)
            reduce(type_, op_, acc.data(), acc.data(), recv[j], elems);
        }
      } else if (st.nrecv > 0) {
        std::memcpy(acc.data(), recv[0], bytes);
        if (reduces) {
          for (int j = 1; j < st.nrecv; ++j)
            reduce(type_, op_, acc.data(), acc.data(), recv[j], elems);
        }
      }
      if (reduces && st.final) applyPostOp(type_, op_, acc.data(), acc.data(), elems);
      if (dst) std::memcpy(dst, acc.data(), bytes);
      for (int j = 0; j < st.nsend; ++j) {
        const int k = base + st.sendPeers[j];
        Fifo& f = r_.send[k];
        const uint64_t seq = r_.sent[k]++;
        if (f.isSmall(bytes)) {
          // Tagged words only (the proxy copies them into the slot). The head first and
          // the words last to first: the proxy may see a message's head and some of its
          // words before the others, as with the kernel's threads.
          std::atomic_ref<uint64_t>(f.header->head[seq % f.nslots])
              .store(fifoHead(seq, bytes), std::memory_order_relaxed);
          acc.resize(fifoWords(bytes) * 4, 0);
          for (uint32_t i = fifoWords(bytes); i-- > 0;) {
            uint32_t payload;
            std::memcpy(&payload, acc.data() + 4 * i, 4);
            std::atomic_ref<uint64_t>(f.header->ll[seq % f.nslots][i])
                .store(fifoWord(seq, payload), std::memory_order_relaxed);
          }
        } else {
          std::memcpy(send[j], acc.data(), bytes);
          storeRelease(&f.header->head[seq % f.nslots], fifoHead(seq, bytes));
        }
      }
      for (int j = 0; j < st.nrecv; ++j) {
        const int k = base + st.recvPeers[j];
        storeRelease(&r_.recv[k].header->done, ++r_.consumed[k]);
      }
      r_.proxy->kick();
    }
    return Status::ok();
  }

  Rank& r_;
  const NetPlanHeader* plan_;
  DataType type_;
  RedOp op_;
  const void* in_;
  void* out_;
  size_t es_;
};

// One rank's part of a test: the plan's connections, then the emulated kernel on it.
Status runPlan(Rank& rank, Mailbox& mail, const Result<std::vector<uint64_t>>& plan, DataType type,
               const void* in, void* out) {
  if (!plan) return plan.status();
  const auto* h = reinterpret_cast<const NetPlanHeader*>(plan->data());
  std::vector<NetLink> sp, rp;
  netPlanLinks(h, &sp, &rp);
  connectRank(rank, mail, sp, rp);
  return CpuKernel(rank, h, type, RedOp{}, in, out).run();
}

int32_t value(int rank, size_t i) {
  return static_cast<int32_t>(rank * 1000 + i % 997 + 1);
}

// Runs one collective on n ranks as threads; checks every rank's output exactly.
// In place (all-reduce, broadcast, reduce): the input is the output buffer.
void runCollective(int n, CollType type, Algorithm algo, size_t count, int root, int lanes = 1,
                   bool inPlace = false) {
  SCOPED_TRACE(std::string(collTypeName(type)) + "/" + algorithmName(algo) +
               " n=" + std::to_string(n) + " count=" + std::to_string(count) +
               " root=" + std::to_string(root) + " lanes=" + std::to_string(lanes) +
               (inPlace ? " in place" : ""));
  Mailbox mail;
  std::vector<std::unique_ptr<Rank>> ranks = makeRanks(n, 4242);
  for (auto& k : ranks) ASSERT_TRUE(k->backend);
  const size_t inCount =
      type == CollType::kReduceScatter || type == CollType::kAllToAll ? count * n : count;
  const size_t outCount =
      type == CollType::kAllGather || type == CollType::kAllToAll ? count * n : count;
  std::vector<std::vector<int32_t>> in(n), out(n);
  std::vector<Status> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    in[r].resize(inCount);
    for (size_t i = 0; i < inCount; ++i) in[r][i] = value(r, i);
    out[r].assign(outCount, -7);
    if (inPlace) out[r] = in[r];
    threads.emplace_back([&, r] {
      const size_t piece = kSlotBytes / 4 / 2;  // two pieces per slot's worth: exercises blocks
      auto plan = makeNetPlan(
          netLaneSchedules(request(type, r, n, count, root, piece), algo, lanes), piece);
      results[r] = runPlan(*ranks[r], mail, plan, DataType::kInt32,
                           inPlace ? out[r].data() : in[r].data(), out[r].data());
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    ASSERT_TRUE(results[r].isOk()) << "rank " << r << ": " << results[r].message();
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < outCount; ++i) {
      int64_t want = 0;
      switch (type) {
        case CollType::kAllReduce:
        case CollType::kReduce:
          if (type == CollType::kReduce && r != root) {
            want = -7;
            break;
          }
          for (int q = 0; q < n; ++q) want += value(q, i);
          break;
        case CollType::kReduceScatter:
          for (int q = 0; q < n; ++q) want += value(q, r * count + i);
          break;
        case CollType::kAllGather: want = value(static_cast<int>(i / count), i % count); break;
        case CollType::kBroadcast: want = value(root, i); break;
        case CollType::kAllToAll:
          want = value(static_cast<int>(i / count), r * count + i % count);
          break;
        default: break;
      }
      ASSERT_EQ(out[r][i], static_cast<int32_t>(want)) << "rank " << r << " element " << i;
    }
  }
}

TEST(NetPlanOverSockets, LanesSplitEveryCollectiveButAllToAll) {
  for (int n : {2, 3}) {
    for (const Case& c :
         {Case{CollType::kAllReduce, Algorithm::kRing},
          Case{CollType::kAllReduce, Algorithm::kDoubling},
          Case{CollType::kBroadcast, Algorithm::kChain}, Case{CollType::kReduce, Algorithm::kTree},
          Case{CollType::kReduce, Algorithm::kChain}, Case{CollType::kAllGather, Algorithm::kRing},
          Case{CollType::kReduceScatter, Algorithm::kRing}}) {
      for (int lanes : {2, 3}) {
        runCollective(n, c.type, c.algo, 20011, n - 1, lanes);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// All-gather's lanes each take a share of every rank's block of the output.
TEST(NetPlan, AllGatherLanesShareEveryBlock) {
  const size_t count = 1000;
  const int n = 3;
  CollRequest r = request(CollType::kAllGather, 1, n, count, 0, 64);
  std::vector<Schedule> s = netLaneSchedules(r, Algorithm::kRing, 2);
  ASSERT_EQ(s.size(), 2u);
  std::vector<int> covered(n * count, 0);
  for (const Schedule& l : s) {
    EXPECT_EQ(l.outputCount, n * count);
    for (const Phase& ph : l.phases) {
      for (const Step& st : ph) {
        if (st.dst.buffer != Buffer::kOutput) continue;
        ASSERT_LE(st.dst.offset + st.count, n * count);
        // Never across a block boundary.
        if (st.count > 0) {
          EXPECT_EQ(st.dst.offset / count, (st.dst.offset + st.count - 1) / count);
        }
        for (size_t i = 0; i < st.count; ++i) ++covered[st.dst.offset + i];
      }
    }
  }
  for (size_t i = 0; i < covered.size(); ++i) EXPECT_EQ(covered[i], 1) << i;
}

TEST(NetPlan, LanesCoverTheCountOnSixteenByteBoundaries) {
  for (size_t count : {size_t(0), size_t(3), size_t(4), size_t(7), size_t(1000), size_t(1001)}) {
    for (int lanes : {1, 2, 3, 8}) {
      CollRequest r = request(CollType::kAllReduce, 0, 2, count, 0, 64);
      std::vector<Schedule> s = netLaneSchedules(r, Algorithm::kRing, lanes);
      const size_t expectLanes = count / 4 >= size_t(lanes) ? lanes : 1;
      ASSERT_EQ(s.size(), expectLanes) << count << " " << lanes;
      // The steps writing the output, in every lane, cover [0, count) exactly once, and
      // every lane starts on a 16-byte boundary.
      std::vector<int> covered(count, 0);
      for (const Schedule& l : s) {
        size_t start = count;
        for (const Phase& ph : l.phases) {
          for (const Step& st : ph) {
            if (st.dst.buffer != Buffer::kOutput) continue;
            start = std::min<size_t>(start, st.dst.offset);
            for (size_t i = 0; i < st.count; ++i) ++covered[st.dst.offset + i];
          }
        }
        if (start < count) {
          EXPECT_EQ(start % 4, 0u) << count << " " << lanes;
        }
      }
      for (size_t i = 0; i < count; ++i)
        EXPECT_EQ(covered[i], 1) << count << " " << lanes << " " << i;
    }
  }
}

TEST(NetPlanOverSockets, EveryCollectiveOnTwoToFourRanks) {
  for (int n : {2, 3, 4}) {
    for (size_t count : {size_t(1), size_t(5003)}) {
      for (bool inPlace : {false, true}) {
        runCollective(n, kOneShotCase.type, kOneShotCase.algo, count, 0, 1, inPlace);
        if (HasFatalFailure()) return;
      }
    }
    for (const Case& c : kCases) {
      for (size_t count : {size_t(1), size_t(5003)}) {
        const bool rooted = c.type == CollType::kBroadcast || c.type == CollType::kReduce;
        for (int root : rooted ? std::vector<int>{0, n - 1} : std::vector<int>{0}) {
          runCollective(n, c.type, c.algo, count, root);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// The tree all-reduce lists its steps in lagged order (results two blocks behind the
// reductions): split for the kernel, a rank never runs a step before one listed ahead of
// it, and that order completes when each rank runs its steps one at a time. Many blocks,
// up to 8 ranks.
TEST(NetPlanOverSockets, TreeAllReduceStreamsManyBlocks) {
  for (int n : {3, 4, 5, 6, 8}) {
    for (size_t count : {size_t(20011), size_t(3 * 4096 + 5)}) {
      for (int lanes : {1, 2}) {
        runCollective(n, CollType::kAllReduce, Algorithm::kTree, count, 0, lanes);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Recursive doubling (all-gather) and halving (reduce-scatter): a step a block, each
// block's steps one hop apart on a binomial tree; on 4 and 8 ranks, in lanes and not (in
// place: tests/comm/collectives_api_test.cc, tests/gpu/gpu_network_test.cc).
TEST(NetPlanOverSockets, DoublingGatherAndHalvingScatter) {
  for (int n : {4, 8}) {
    for (CollType type : {CollType::kAllGather, CollType::kReduceScatter}) {
      for (int lanes : {1, 3}) {
        runCollective(n, type, Algorithm::kDoubling, 20011, 0, lanes);
        if (HasFatalFailure()) return;
      }
      runCollective(n, type, Algorithm::kDoubling, 1, 0);
      if (HasFatalFailure()) return;
    }
  }
}

// A group of Send/Recv calls as the executor builds it: every rank sends two messages
// to every other rank and receives two from each, all in one phase, split by connection.
TEST(NetPlanOverSockets, SendRecvGroupsWithSeveralMessagesPerPeer) {
  const int n = 3;
  Mailbox mail;
  std::vector<std::unique_ptr<Rank>> ranks = makeRanks(n, 4243);
  for (auto& k : ranks) ASSERT_TRUE(k->backend);
  auto size = [](int from, int to, int k) {
    return size_t(1000 * (from + 1) + 300 * to + 7000 * k + 1);
  };
  // bufs[r][q][k]: rank r's k-th send to q, and recvs[r][q][k] its k-th receive from q.
  std::vector<std::vector<std::vector<std::vector<unsigned char>>>> sends(n), recvs(n);
  std::vector<Status> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    sends[r].resize(n);
    recvs[r].resize(n);
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      for (int k = 0; k < 2; ++k) {
        std::vector<unsigned char> b(size(r, q, k));
        for (size_t i = 0; i < b.size(); ++i)
          b[i] = static_cast<unsigned char>(r * 31 + q * 7 + k + i);
        sends[r][q].push_back(b);
        recvs[r][q].push_back(std::vector<unsigned char>(size(q, r, k), 0));
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Schedule s;
      Phase ph;
      for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        for (int k = 0; k < 2; ++k) {
          Step snd;
          snd.count = sends[r][q][k].size();
          snd.src = {Buffer::kAbsolute, reinterpret_cast<uintptr_t>(sends[r][q][k].data())};
          snd.sendTo(q);
          Step rcv;
          rcv.count = recvs[r][q][k].size();
          rcv.dst = {Buffer::kAbsolute, reinterpret_cast<uintptr_t>(recvs[r][q][k].data())};
          rcv.recvFrom(q);
          ph.push_back(k == 0 ? snd : rcv);
          ph.push_back(k == 0 ? rcv : snd);
        }
      }
      s.phases.push_back(ph);
      results[r] = runPlan(*ranks[r], mail, makeNetPlan(splitByConnection(s), kSlotBytes),
                           DataType::kUint8, nullptr, nullptr);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    ASSERT_TRUE(results[r].isOk()) << "rank " << r << ": " << results[r].message();
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      if (q == r) continue;
      for (int k = 0; k < 2; ++k)
        EXPECT_EQ(recvs[r][q][k], sends[q][r][k]) << r << " from " << q << " #" << k;
    }
  }
}

}  // namespace
}  // namespace loom::collectives::device
