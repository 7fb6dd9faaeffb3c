// The GPU mesh's choice of form (collectives/device/mesh_plan.h): pure functions of the
// agreed limits and the call's facts, checked here without a GPU.
#include "collectives/device/mesh_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace loom::collectives::device {
namespace {

constexpr uint64_t kNever = UINT64_MAX;
constexpr size_t KiB = 1024, MiB = 1024 * 1024;

// The sizes init resolves from the defaults of docs/environment.md for `nranks` ranks.
MeshSizes defaults(int nranks) {
  MeshSizes s;
  const bool two = nranks == 2;
  s.llBytes = nranks <= 2 ? kLLBlocks * kLLPayload : 256 * KiB;
  s.ll128Bytes = 0;
  s.oneShotBytes = nranks <= 2 ? 4 * MiB : 256 * KiB;
  s.ceBytes = 16 * MiB;
  s.reduceDirectBytes = 2 * MiB;
  s.pullBytes = 64 * MiB;
  s.pullReduceBytes = kNever;
  s.twoShotReduceBytes = 0;
  s.cePullBytes = kNever;
  s.chunkReduceBytes = two ? 2 * MiB : kNever;
  s.chunkAllReduceBytes = two ? 256 * MiB : kNever;
  s.chunkSize = 0;
  s.scratchBytes = 256 * MiB;
  return s;
}

MeshLimits limits(int nranks, const char* algo = "", Proto proto = Proto::kAuto,
                  MeshSizes s = MeshSizes{}, bool useDefaults = true, int sharedBlocks = 0) {
  auto a = AlgoRequest::parse(algo);
  EXPECT_TRUE(a.isOk());
  return resolveMeshLimits(useDefaults ? defaults(nranks) : s, a.value(), proto, nranks,
                           /*ll128Capacity=*/8 * MiB, sharedBlocks);
}

MeshCallFacts call(CollType type, size_t bytes) {
  MeshCallFacts f;
  f.type = type;
  f.bytes = bytes;
  f.builtinOp = f.plainOp = true;
  return f;
}

// Every rank of this process posted the same call, memory mapped, buffers apart.
MeshCallFacts inProcess(CollType type, size_t bytes) {
  MeshCallFacts f = call(type, bytes);
  f.peersKnown = f.inMapped = f.outMapped = f.outputsApart = f.rootOutputApart = true;
  f.copyPlanSafe = true;
  return f;
}

std::vector<MeshRoute> routes(const MeshPlan& p) {
  std::vector<MeshRoute> r;
  for (int i = 0; i < p.nsteps; ++i) r.push_back(p.steps[i].route);
  return r;
}

using R = MeshRoute;

TEST(MeshPlan, AllReduceFormsBySizeOnTwoRanks) {
  const MeshLimits m = limits(2);
  auto kind = [&](size_t bytes) { return planMeshCall(m, call(CollType::kAllReduce, bytes)).kind; };
  EXPECT_EQ(kind(8), MeshKind::kAllReduceLL);
  EXPECT_EQ(kind(1 * MiB), MeshKind::kAllReduceLL);
  EXPECT_EQ(kind(1 * MiB + 4), MeshKind::kAllReduceOneShot);
  EXPECT_EQ(kind(4 * MiB), MeshKind::kAllReduceOneShot);
  EXPECT_EQ(kind(4 * MiB + 4), MeshKind::kAllReduceTwoShot);
  const MeshPlan p = planMeshCall(m, call(CollType::kAllReduce, 8));
  EXPECT_EQ(routes(p), std::vector<MeshRoute>{R::kKernel});
  EXPECT_NE(std::string(p.why).find("LOOM_P2P_LL_BYTES"), std::string::npos) << p.why;
}

TEST(MeshPlan, MoreRanksSwitchEarlier) {
  const MeshLimits m = limits(4);
  EXPECT_EQ(planMeshCall(m, call(CollType::kAllReduce, 256 * KiB)).kind, MeshKind::kAllReduceLL);
  EXPECT_EQ(planMeshCall(m, call(CollType::kAllReduce, 512 * KiB)).kind,
            MeshKind::kAllReduceTwoShot);
  // Nothing chunked without the 2-rank measurements behind it.
  EXPECT_FALSE(m.chunkedSize(CollType::kAllReduce, 1024 * MiB));
}

TEST(MeshPlan, ProtocolsMoveTheFlagForms) {
  EXPECT_EQ(planMeshCall(limits(2, "", Proto::kSimple), call(CollType::kAllReduce, 8)).kind,
            MeshKind::kAllReduceOneShot);
  const MeshLimits ll128 = limits(2, "", Proto::kLL128);
  EXPECT_EQ(ll128.llLimit, 0u);
  EXPECT_EQ(planMeshCall(ll128, call(CollType::kAllReduce, 8)).kind, MeshKind::kAllReduceLL128);
  EXPECT_EQ(planMeshCall(ll128, call(CollType::kReduceScatter, 2 * MiB)).kind,
            MeshKind::kReduceScatterLL128);
  const MeshPlan ll = planMeshCall(limits(2, "", Proto::kLL), call(CollType::kReduce, 64));
  EXPECT_EQ(ll.kind, MeshKind::kReduceLL);
  EXPECT_STREQ(ll.why, "LOOM_PROTO=ll");
}

TEST(MeshPlan, AlgoForcesTheShots) {
  // twoshot (and ring, tree) skip LL; oneshot keeps it for small sizes.
  for (const char* two : {"twoshot", "ring", "Tree", "^oneshot"}) {
    const MeshPlan p = planMeshCall(limits(2, two), call(CollType::kAllReduce, 8));
    EXPECT_EQ(p.kind, MeshKind::kAllReduceTwoShot) << two;
    EXPECT_NE(std::string(p.why).find("LOOM_ALGO"), std::string::npos) << p.why;
  }
  EXPECT_EQ(planMeshCall(limits(2, "oneshot"), call(CollType::kAllReduce, 8)).kind,
            MeshKind::kAllReduceLL);
  EXPECT_EQ(planMeshCall(limits(2, "oneshot"), call(CollType::kAllReduce, 64 * MiB)).kind,
            MeshKind::kAllReduceOneShot);
  // Both allowed: the sizes decide between them again.
  EXPECT_EQ(planMeshCall(limits(2, "oneshot,twoshot"), call(CollType::kAllReduce, 64 * MiB)).kind,
            MeshKind::kAllReduceTwoShot);
  // Any LOOM_ALGO turns the one-process forms off.
  const MeshPlan p = planMeshCall(limits(2, "doubling"), inProcess(CollType::kAllReduce, 8 * MiB));
  EXPECT_EQ(routes(p), std::vector<MeshRoute>{R::kKernel});
}

// LOOM_ALGO restricts the mesh only where it leaves out one of the mesh's names, and what
// it leaves out is not chosen by size either.
TEST(MeshPlan, AlgoListsAndExclusions) {
  // "^nvls" (NCCL's switch for NVLink SHARP) leaves every mesh form as it was.
  const MeshLimits nvls = limits(2, "^NVLS");
  EXPECT_FALSE(nvls.algoRestricts);
  EXPECT_EQ(routes(planMeshCall(nvls, inProcess(CollType::kAllReduce, 8 * MiB))),
            std::vector<MeshRoute>{R::kPulledAllReduce});
  // "Ring,Tree": the two-shot, as ring alone.
  EXPECT_EQ(planMeshCall(limits(2, "Ring,Tree"), call(CollType::kAllReduce, 8)).kind,
            MeshKind::kAllReduceTwoShot);
  // "^direct": a 2-rank reduce of up to LOOM_P2P_REDUCE_DIRECT_BYTES takes two stages.
  EXPECT_EQ(planMeshCall(limits(2, "^direct"), call(CollType::kReduce, 2 * MiB)).kind,
            MeshKind::kReduce);
  // A name without a mesh form ("doubling") restricts the mesh but forces nothing: the
  // size rules choose among the shots as before.
  const MeshLimits doubling = limits(2, "doubling");
  EXPECT_TRUE(doubling.algoRestricts);
  EXPECT_EQ(planMeshCall(doubling, call(CollType::kAllReduce, 2 * MiB)).kind,
            MeshKind::kAllReduceOneShot);
  EXPECT_EQ(planMeshCall(doubling, call(CollType::kReduce, 2 * MiB)).kind, MeshKind::kReduceDirect);
  // "hier" asks for the hierarchical form across hosts, whose in-host part is the mesh: the
  // mesh's forms stay as they were.
  const MeshLimits hier = limits(2, "hier");
  EXPECT_FALSE(hier.algoRestricts);
  EXPECT_EQ(routes(planMeshCall(hier, inProcess(CollType::kAllReduce, 8 * MiB))),
            std::vector<MeshRoute>{R::kPulledAllReduce});
}

TEST(MeshPlan, ReduceForms) {
  const MeshLimits two = limits(2), three = limits(3);
  EXPECT_EQ(planMeshCall(two, call(CollType::kReduce, 1 * MiB)).kind, MeshKind::kReduceLL);
  EXPECT_EQ(planMeshCall(two, call(CollType::kReduce, 2 * MiB)).kind, MeshKind::kReduceDirect);
  EXPECT_EQ(planMeshCall(two, call(CollType::kReduce, 4 * MiB)).kind, MeshKind::kReduce);
  const MeshPlan p = planMeshCall(three, call(CollType::kReduce, 4 * MiB));
  EXPECT_EQ(p.kind, MeshKind::kReduce);
  EXPECT_STREQ(p.why, "more than 2 ranks");
  EXPECT_EQ(planMeshCall(limits(3, "direct"), call(CollType::kReduce, 4 * MiB)).kind,
            MeshKind::kReduceDirect);
  EXPECT_EQ(planMeshCall(limits(3, "oneshot"), call(CollType::kReduce, 4 * MiB)).kind,
            MeshKind::kReduceDirect);
  EXPECT_EQ(planMeshCall(limits(2, "ring"), call(CollType::kReduce, 1 * MiB)).kind,
            MeshKind::kReduce);
}

TEST(MeshPlan, OneProcessRoutesForAllReduce) {
  const MeshLimits m = limits(2);
  // Up to LOOM_P2P_PULL_BYTES: the pulled two-shot; in place says so.
  MeshCallFacts f = inProcess(CollType::kAllReduce, 8 * MiB);
  EXPECT_EQ(routes(planMeshCall(m, f)), std::vector<MeshRoute>{R::kPulledAllReduce});
  f.outputsApart = false;
  f.allInPlace = true;
  const MeshPlan inPlace = planMeshCall(m, f);
  EXPECT_EQ(routes(inPlace), std::vector<MeshRoute>{R::kPulledAllReduce});
  EXPECT_NE(std::string(inPlace.steps[0].why).find("in place"), std::string::npos);
  // Outputs a peer cannot write: the one-shot into our own output, out of place only.
  f = inProcess(CollType::kAllReduce, 8 * MiB);
  f.outMapped = false;
  EXPECT_EQ(routes(planMeshCall(m, f)), std::vector<MeshRoute>{R::kPulledOneShot});
  // Overlapping buffers, neither apart nor in place: the kernels.
  f = inProcess(CollType::kAllReduce, 8 * MiB);
  f.outputsApart = false;
  EXPECT_EQ(routes(planMeshCall(m, f)), std::vector<MeshRoute>{R::kKernel});
  // PreMulSum: no pre-op in the pulled kernel.
  f = inProcess(CollType::kAllReduce, 8 * MiB);
  f.builtinOp = false;
  EXPECT_EQ(routes(planMeshCall(m, f)), std::vector<MeshRoute>{R::kKernel});
  // From LOOM_P2P_CE_ALLREDUCE_BYTES: the chunks, which may decline (no scratch).
  f = inProcess(CollType::kAllReduce, 512 * MiB);
  f.builtinOp = false;  // avg on floats: the chunked form applies 1/n itself
  EXPECT_EQ(routes(planMeshCall(m, f)), (std::vector<MeshRoute>{R::kChunked, R::kKernel}));
  f.captured = true;  // nothing chunked inside a graph capture
  EXPECT_EQ(routes(planMeshCall(m, f)), std::vector<MeshRoute>{R::kKernel});
  f.captured = false;
  f.plainOp = false;  // a user's PreMulSum, whose scalar may differ between ranks
  EXPECT_EQ(routes(planMeshCall(m, f)), std::vector<MeshRoute>{R::kKernel});
}

TEST(MeshPlan, OneProcessRoutesForReduce) {
  MeshSizes s = defaults(2);
  s.twoShotReduceBytes = 64 * MiB;
  const MeshLimits m = limits(2, "", Proto::kAuto, s, false);
  MeshCallFacts f = inProcess(CollType::kReduce, 4 * MiB);
  EXPECT_EQ(routes(planMeshCall(m, f)), std::vector<MeshRoute>{R::kPulledReduce});
  f.rootOutputApart = false;  // the root's output over a peer's input: chunks instead
  EXPECT_EQ(routes(planMeshCall(m, f)), (std::vector<MeshRoute>{R::kChunked, R::kKernel}));
  // A reduce's non-root outputs are never written: chunks without mapped outputs.
  f.outMapped = false;
  EXPECT_EQ(routes(planMeshCall(m, f)), (std::vector<MeshRoute>{R::kChunked, R::kKernel}));
}

TEST(MeshPlan, RegisteredRoutesBetweenProcesses) {
  MeshCallFacts f = call(CollType::kAllReduce, 8 * MiB);
  f.board = true;
  EXPECT_EQ(routes(planMeshCall(limits(2), f)),
            (std::vector<MeshRoute>{R::kRegisteredPull, R::kKernel}));
  f.type = CollType::kReduce;  // up to LOOM_P2P_PULL_REDUCE_BYTES (any by default)
  EXPECT_EQ(routes(planMeshCall(limits(3), f)),
            (std::vector<MeshRoute>{R::kRegisteredPull, R::kKernel}));
  // Copy collectives pull only where LOOM_P2P_CE_PULL_BYTES says, on 2 ranks.
  MeshSizes s = defaults(2);
  s.cePullBytes = 16 * MiB;
  MeshCallFacts g = call(CollType::kAllGather, 32 * MiB);
  g.board = true;
  EXPECT_EQ(routes(planMeshCall(limits(2, "", Proto::kAuto, s, false), g)),
            (std::vector<MeshRoute>{R::kRegisteredCopies, R::kKernel}));
  EXPECT_EQ(routes(planMeshCall(limits(3, "", Proto::kAuto, s, false), g)),
            std::vector<MeshRoute>{R::kKernel});
  g.bytes = 512 * MiB;  // all-gather pulls measured faster only up to 256 MiB a block
  EXPECT_EQ(routes(planMeshCall(limits(2, "", Proto::kAuto, s, false), g)),
            std::vector<MeshRoute>{R::kKernel});
}

TEST(MeshPlan, CopyEnginesInOneProcess) {
  const MeshLimits m = limits(3);
  for (CollType t : {CollType::kAllGather, CollType::kBroadcast, CollType::kAllToAll}) {
    MeshCallFacts f = inProcess(t, 16 * MiB);
    EXPECT_EQ(routes(planMeshCall(m, f)), std::vector<MeshRoute>{R::kCopyEngines});
    f.copyPlanSafe = false;
    EXPECT_EQ(routes(planMeshCall(m, f)), std::vector<MeshRoute>{R::kKernel});
    f = inProcess(t, 16 * MiB - 4);  // below LOOM_P2P_CE_BYTES
    EXPECT_EQ(routes(planMeshCall(m, f)), std::vector<MeshRoute>{R::kKernel});
  }
}

TEST(MeshPlan, LimitsFromTheSizes) {
  // Ranks sharing a GPU: the flag forms only as far as the blocks that fit.
  const MeshLimits shared = limits(2, "", Proto::kAuto, {}, true, 16);
  EXPECT_EQ(shared.llLimit, 16 * kLLPayload);
  // ... and no chunked forms (a shared GPU waited in them, mesh_plan.cc says where).
  EXPECT_FALSE(shared.chunkedSize(CollType::kReduce, 16 * MiB));
  EXPECT_FALSE(shared.chunkedSize(CollType::kAllReduce, 1024 * MiB));
  // Two slots per peer of the scratch, in multiples of 64 KiB; four for the all-reduce where
  // each holds 64 MiB.
  const MeshLimits m = limits(2);
  EXPECT_EQ(m.chunkMax, 128 * MiB);
  EXPECT_EQ(m.allReduceSlots, 4);
  EXPECT_EQ(limits(3).chunkMax, 64 * MiB);
  MeshSizes none = defaults(2);
  none.scratchBytes = 0;
  const MeshLimits noScratch = limits(2, "", Proto::kAuto, none, false);
  EXPECT_EQ(noScratch.chunkReduceMin, SIZE_MAX);
  EXPECT_EQ(noScratch.chunkAllReduceMin, SIZE_MAX);
  EXPECT_TRUE(meshNeedsLL128(defaults(2), Proto::kLL128));
  EXPECT_FALSE(meshNeedsLL128(defaults(2), Proto::kAuto));
  none.ll128Bytes = 1 * MiB;
  EXPECT_TRUE(meshNeedsLL128(none, Proto::kAuto));
  EXPECT_FALSE(meshNeedsLL128(none, Proto::kSimple));
}

// Over every combination of facts, types, sizes and settings: a plan ends with a step that
// cannot decline and has nothing after one, and a plan that reads every rank's buffers is
// one whose call the executor gathers them for (meshNeedsPeerFacts).
TEST(MeshPlan, EveryPlanEndsAndAsksOnlyForFactsItIsGiven) {
  const CollType types[] = {CollType::kAllReduce,     CollType::kAllGather, CollType::kBroadcast,
                            CollType::kReduceScatter, CollType::kReduce,    CollType::kAllToAll};
  const size_t sizes[] = {4, 64 * KiB, 1 * MiB + 4, 3 * MiB, 16 * MiB, 80 * MiB, 300 * MiB};
  MeshSizes wide = defaults(2);
  wide.twoShotReduceBytes = 64 * MiB;
  wide.cePullBytes = 1 * MiB;
  wide.ll128Bytes = 2 * MiB;
  const MeshLimits settings[] = {limits(2),
                                 limits(3),
                                 limits(8),
                                 limits(2, "ring"),
                                 limits(2, "", Proto::kAuto, wide, false),
                                 limits(2, "", Proto::kSimple)};
  int plans = 0;
  for (const MeshLimits& m : settings) {
    for (CollType t : types) {
      for (size_t bytes : sizes) {
        for (unsigned bits = 0; bits < (1u << 10); ++bits) {
          MeshCallFacts f = call(t, bytes);
          bool* flags[] = {&f.builtinOp,  &f.plainOp,     &f.board,    &f.peersKnown,
                           &f.inMapped,   &f.outMapped,   &f.captured, &f.outputsApart,
                           &f.allInPlace, &f.copyPlanSafe};
          for (int b = 0; b < 10; ++b) *flags[b] = (bits >> b) & 1u;
          f.rootOutputApart = f.outputsApart;
          const MeshPlan p = planMeshCall(m, f);
          ++plans;
          ASSERT_GE(p.nsteps, 1);
          ASSERT_LE(p.nsteps, 5);
          for (int i = 0; i + 1 < p.nsteps; ++i)
            ASSERT_TRUE(routeMayDecline(p.steps[i].route)) << meshRouteName(p.steps[i].route);
          ASSERT_FALSE(routeMayDecline(p.steps[p.nsteps - 1].route));
          bool readsPeers = false;
          for (int i = 0; i < p.nsteps; ++i) {
            const MeshRoute r = p.steps[i].route;
            readsPeers = readsPeers || r == R::kPulledReduce || r == R::kChunked ||
                         r == R::kPulledAllReduce || r == R::kPulledOneShot || r == R::kCopyEngines;
          }
          if (readsPeers) {
            ASSERT_TRUE(meshNeedsPeerFacts(m, t, bytes)) << collTypeName(t) << bytes;
          }
        }
      }
    }
  }
  EXPECT_GT(plans, 200000);
}

// The mesh's grouped Send/Recv reads a send before an overlapping receive writes it only in
// the order its kernel keeps (meshP2pUnordered): one buffer of one size, the send's step
// not later than the receive's; never a receive from itself over a send.
TEST(MeshPlan, SendReceiveInPlaceOnlyInTheKernelsOrder) {
  char buf[4096];
  auto op = [&](int at, size_t bytes, int peer, bool send, int seq) {
    P2pOp o;
    o.buffer = buf + at;
    o.bytes = bytes;
    o.peer = peer;
    o.isSend = send ? 1 : 0;
    o.seq = seq;
    return o;
  };
  auto check = [&](std::initializer_list<P2pOp> msgs, std::vector<MeshRange> self = {}) {
    P2pList l;
    for (const P2pOp& o : msgs) l.ops[l.nops++] = o;
    return meshP2pUnordered(l, self);
  };
  // nccl-tests' sendrecv in place; separate buffers; a send to two peers before the receive.
  EXPECT_EQ(check({op(0, 1024, 1, true, 0), op(0, 1024, 3, false, 0)}), nullptr);
  EXPECT_EQ(check({op(0, 1024, 1, true, 0), op(1024, 1024, 3, false, 0)}), nullptr);
  EXPECT_EQ(check({op(0, 512, 1, true, 0), op(0, 512, 2, true, 0), op(0, 512, 3, false, 0)}),
            nullptr);
  // The receive's step before the send's: the second message to peer 1 leaves too late.
  EXPECT_NE(check({op(0, 64, 1, true, 0), op(0, 64, 1, true, 1), op(0, 64, 3, false, 0)}), nullptr);
  // Sizes or starts that differ tile differently.
  EXPECT_NE(check({op(0, 1024, 1, true, 0), op(0, 2048, 3, false, 0)}), nullptr);
  EXPECT_NE(check({op(0, 1024, 1, true, 0), op(512, 1024, 3, false, 0)}), nullptr);
  // A receive from itself is copied before the kernel sends.
  EXPECT_NE(check({op(0, 1024, 1, true, 0)}, {{reinterpret_cast<uintptr_t>(buf + 1000), 8}}),
            nullptr);
  EXPECT_EQ(check({op(0, 1024, 1, true, 0)}, {{reinterpret_cast<uintptr_t>(buf + 1024), 8}}),
            nullptr);
  // Empty messages overlap nothing.
  EXPECT_EQ(check({op(0, 0, 1, true, 0), op(0, 64, 3, false, 0)}), nullptr);
}

}  // namespace
}  // namespace loom::collectives::device
