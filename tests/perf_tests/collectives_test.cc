// The seven collective specs: counts, bandwidth factors, and that each spec's expected
// outputs are what the collective really produces (simulated here on host buffers).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "perf_tests/specs.h"

namespace loom::perf {
namespace {

const CollectiveSpec* const kSpecs[] = {&kAllReduceSpec,     &kAllGatherSpec, &kBroadcastSpec,
                                        &kReduceScatterSpec, &kReduceSpec,    &kSendRecvSpec,
                                        &kAllToAllSpec,      &kGatherSpec,    &kScatterSpec};

TEST(Specs, CountsAsNcclTests) {
  // count = 10 elements over 4 ranks.
  auto eq = [](CollCounts c, CollCounts e) {
    return c.sendCount == e.sendCount && c.recvCount == e.recvCount &&
           c.paramCount == e.paramCount && c.sendInplaceOffset == e.sendInplaceOffset &&
           c.recvInplaceOffset == e.recvInplaceOffset;
  };
  EXPECT_TRUE(eq(kAllReduceSpec.counts(10, 4), {10, 10, 10, 0, 0}));
  EXPECT_TRUE(eq(kAllGatherSpec.counts(10, 4), {2, 8, 2, 2, 0}));
  EXPECT_TRUE(eq(kBroadcastSpec.counts(10, 4), {10, 10, 10, 0, 0}));
  EXPECT_TRUE(eq(kReduceScatterSpec.counts(10, 4), {8, 2, 2, 0, 2}));
  EXPECT_TRUE(eq(kReduceSpec.counts(10, 4), {10, 10, 10, 0, 0}));
  EXPECT_TRUE(eq(kSendRecvSpec.counts(10, 4), {10, 10, 10, 0, 0}));
  EXPECT_TRUE(eq(kAllToAllSpec.counts(10, 4), {8, 8, 2, 0, 0}));
  EXPECT_TRUE(eq(kGatherSpec.counts(10, 4), {2, 8, 2, 2, 0}));
  EXPECT_TRUE(eq(kScatterSpec.counts(10, 4), {8, 2, 2, 0, 2}));
  EXPECT_TRUE(eq(kAllGatherSpec.counts(3, 4), {0, 0, 0, 0, 0}));
}

TEST(Specs, BusBandwidthFormulas) {
  // 2.5e8 floats (1e9 bytes) in one second.
  const size_t n = 250000000;
  auto bw = [&](const CollectiveSpec& s, size_t count, int ranks) {
    return computeBandwidth(s, count, 4, 1.0, ranks);
  };
  EXPECT_DOUBLE_EQ(bw(kAllReduceSpec, n, 4).algBw, 1.0);
  EXPECT_DOUBLE_EQ(bw(kAllReduceSpec, n, 4).busBw, 1.5);  // 2(n-1)/n
  EXPECT_DOUBLE_EQ(bw(kAllReduceSpec, n, 1).busBw, 0.0);
  EXPECT_DOUBLE_EQ(bw(kAllGatherSpec, n / 4, 4).algBw, 1.0);  // param count is per rank
  EXPECT_DOUBLE_EQ(bw(kAllGatherSpec, n / 4, 4).busBw, 0.75);
  EXPECT_DOUBLE_EQ(bw(kReduceScatterSpec, n / 8, 8).busBw, 0.875);
  EXPECT_DOUBLE_EQ(bw(kAllToAllSpec, n / 2, 2).busBw, 0.5);
  EXPECT_DOUBLE_EQ(bw(kGatherSpec, n / 4, 4).algBw, 1.0);  // the gathered bytes
  EXPECT_DOUBLE_EQ(bw(kGatherSpec, n / 4, 4).busBw, 0.75);
  EXPECT_DOUBLE_EQ(bw(kScatterSpec, n / 8, 8).busBw, 0.875);
  EXPECT_DOUBLE_EQ(bw(kBroadcastSpec, n, 8).busBw, 1.0);
  EXPECT_DOUBLE_EQ(bw(kReduceSpec, n, 8).busBw, 1.0);
  EXPECT_DOUBLE_EQ(bw(kSendRecvSpec, n, 8).busBw, 1.0);
  EXPECT_DOUBLE_EQ(bw(kSendRecvSpec, n, 8).algBw, 1.0);
}

TEST(Specs, NamesAndFlags) {
  EXPECT_STREQ(kAllReduceSpec.program, "all_reduce_perf");
  EXPECT_STREQ(kAllToAllSpec.program, "alltoall_perf");
  EXPECT_TRUE(kAllReduceSpec.hasOp && kReduceSpec.hasOp && kReduceScatterSpec.hasOp);
  EXPECT_FALSE(kAllGatherSpec.hasOp || kBroadcastSpec.hasOp || kSendRecvSpec.hasOp ||
               kAllToAllSpec.hasOp);
  EXPECT_TRUE(kBroadcastSpec.hasRoot && kReduceSpec.hasRoot && kGatherSpec.hasRoot &&
              kScatterSpec.hasRoot);
  EXPECT_FALSE(kAllToAllSpec.checkInPlace);
}

// The collective's real effect, written independently of the specs' expect functions.
using Buffers = std::vector<std::vector<char>>;

void storeResult(ncclDataType_t type, const Expected& e, char* dst) {
  if (e.isFloat) {
    storeFloat(type, e.value, dst);
  } else {
    storeInteger(type, e.bits, dst);
  }
}

Buffers simulate(const CollectiveSpec& s, const DataParams& p, const Buffers& in, CollCounts c,
                 int root) {
  const int n = p.nranks;
  const size_t ts = typeInfo(p.type).size;
  Buffers out(n, std::vector<char>(c.recvCount * ts + 1, '\x7f'));
  auto reduceInto = [&](char* dst, size_t index) {
    storeResult(p.type, expectedReduce(p, index), dst);
  };
  for (int r = 0; r < n; ++r) {
    char* o = out[r].data();
    const size_t per = c.paramCount;
    if (&s == &kAllReduceSpec) {
      for (size_t j = 0; j < c.recvCount; ++j) reduceInto(o + j * ts, j);
    } else if (&s == &kAllGatherSpec) {
      for (int q = 0; q < n; ++q) std::memcpy(o + q * per * ts, in[q].data(), per * ts);
    } else if (&s == &kBroadcastSpec) {
      std::memcpy(o, in[root].data(), c.recvCount * ts);
    } else if (&s == &kReduceScatterSpec) {
      for (size_t j = 0; j < per; ++j) reduceInto(o + j * ts, r * per + j);
    } else if (&s == &kReduceSpec) {
      if (r == root) {
        for (size_t j = 0; j < c.recvCount; ++j) reduceInto(o + j * ts, j);
      }
    } else if (&s == &kSendRecvSpec) {
      std::memcpy(o, in[(r + n - 1) % n].data(), c.recvCount * ts);
    } else if (&s == &kAllToAllSpec) {
      for (int q = 0; q < n; ++q)
        std::memcpy(o + q * per * ts, in[q].data() + r * per * ts, per * ts);
    } else if (&s == &kGatherSpec) {
      for (int q = 0; r == root && q < n; ++q)
        std::memcpy(o + q * per * ts, in[q].data(), per * ts);
    } else if (&s == &kScatterSpec) {
      std::memcpy(o, in[root].data() + r * per * ts, per * ts);
    }
  }
  return out;
}

TEST(Specs, ExpectedOutputsMatchTheCollectives) {
  for (const CollectiveSpec* spec : kSpecs) {
    for (int n : {1, 2, 3, 4, 7}) {
      for (const TypeInfo& t : allTypes()) {
        for (const OpInfo& op : allOps()) {
          if (!spec->hasOp && op.kind != OpKind::kSum) continue;
          const DataParams p{t.type, op.kind, n, 17};
          const CollCounts c = spec->counts(61, n);  // 61: prime, not divisible by n
          Buffers in(n);
          for (int r = 0; r < n; ++r) {
            in[r].resize(c.sendCount * t.size + 1);
            fillInput(p, r, in[r].data(), c.sendCount);
          }
          const int root = spec->hasRoot ? n - 1 : -1;
          Buffers out = simulate(*spec, p, in, c, root);
          for (int r = 0; r < n; ++r) {
            RankLayout layout{r, n, root, c.paramCount};
            EXPECT_EQ(countWrong(p, layout, spec->expect, out[r].data(), c.recvCount), 0)
                << spec->program << " n=" << n << " " << t.name << " " << op.name << " rank " << r;
          }
          // A rank whose output was not written is caught.
          if (c.recvCount > 0 &&
              spec->expect({0, n, root, c.paramCount}, 0).kind != Source::Kind::kUnchecked) {
            std::memset(out[0].data(), poisonByte(t.type), t.size);
            RankLayout layout{0, n, root, c.paramCount};
            EXPECT_EQ(countWrong(p, layout, spec->expect, out[0].data(), c.recvCount), 1)
                << spec->program << " n=" << n << " " << t.name << " " << op.name;
          }
        }
      }
    }
  }
}

// The specs call only through RunArgs::nccl (so --compare can run them on a second library).
// A table of recording stubs stands in for a library.
namespace calls {
std::string log;
ncclResult_t groupStart() {
  log += "G";
  return ncclSuccess;
}
ncclResult_t groupEnd() {
  log += "E";
  return ncclSuccess;
}
ncclResult_t allReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                       cudaStream_t) {
  log += "AR";
  return ncclSuccess;
}
ncclResult_t alltoAll(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
  log += "A2A";
  return ncclSuccess;
}
ncclResult_t send(const void*, size_t, ncclDataType_t, int peer, ncclComm_t, cudaStream_t) {
  log += 'S';
  log += std::to_string(peer);
  return ncclSuccess;
}
ncclResult_t recv(void*, size_t, ncclDataType_t, int peer, ncclComm_t, cudaStream_t) {
  log += 'R';
  log += std::to_string(peer);
  return ncclSuccess;
}
}  // namespace calls

TEST(Specs, CallThroughTheLibraryTable) {
  NcclApi api;
  api.groupStart = calls::groupStart;
  api.groupEnd = calls::groupEnd;
  api.allReduce = calls::allReduce;
  api.send = calls::send;
  api.recv = calls::recv;
  std::vector<float> buf(8);
  RunArgs a;
  a.nccl = &api;
  a.sendbuff = buf.data();
  a.recvbuff = buf.data();
  a.count = 1;
  a.rank = 1;
  a.nranks = 3;
  calls::log.clear();
  EXPECT_EQ(kAllReduceSpec.run(a), ncclSuccess);
  EXPECT_EQ(calls::log, "AR");
  calls::log.clear();
  EXPECT_EQ(kSendRecvSpec.run(a), ncclSuccess);
  EXPECT_EQ(calls::log, "GS2R0E");  // to rank+1, from rank-1
  // alltoall: grouped send/recv where the library has no ncclAlltoAll, else ncclAlltoAll.
  calls::log.clear();
  EXPECT_EQ(kAllToAllSpec.run(a), ncclSuccess);
  EXPECT_EQ(calls::log, "GS0R0S1R1S2R2E");
  api.alltoAll = calls::alltoAll;
  calls::log.clear();
  EXPECT_EQ(kAllToAllSpec.run(a), ncclSuccess);
  EXPECT_EQ(calls::log, "A2A");
}

}  // namespace
}  // namespace loom::perf
