// The benchmark loop of one thread: for every type, op and root, every size: time the
// out-of-place and in-place collective, check the results, print the row.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>

#include "perf_tests/harness/format.h"
#include "perf_tests/harness/job.h"
#include "perf_tests/harness/values.h"

namespace loom::perf {
namespace {

constexpr uint64_t kWarmSeed = 99;

struct TestCase {
  ncclDataType_t type;
  OpKind op;
  const char* opName;
  int root;
};

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string timestampText() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

class Bench {
 public:
  Bench(Job& job, ThreadState& state) : job_(job), state_(state), o_(job.options) {}

  void runAll();

 private:
  void timeTest(const TestCase& test);
  Measurement benchTime(const TestCase& test, bool inPlace);
  void setup(size_t bytes, ncclDataType_t type);
  void startColl(const TestCase& test, bool inPlace, int iter);
  void completeColl(bool force = false);
  void createOps(const TestCase& test);
  void destroyOps();
  void prepareData(const TestCase& test, bool inPlace, uint64_t seed, bool poison);
  int64_t checkData(const TestCase& test, bool inPlace, uint64_t seed);
  DataParams dataParams(const TestCase& test, uint64_t seed) const;
  void print(const std::string& text) const {
    if (state_.isMain) std::fputs(text.c_str(), stdout);
  }

  Job& job_;
  ThreadState& state_;
  const Options& o_;
  CollCounts counts_;
  size_t typeSize_ = 4;
  size_t totalBytes_ = 0;
  std::vector<ncclRedOp_t> ops_;  // per rank
  int rep_ = 0;
};

void Bench::runAll() {
  const CollectiveSpec& spec = *job_.spec;
  std::vector<ncclDataType_t> types;
  if (o_.type) {
    types.push_back(*o_.type);
  } else {
    for (const TypeInfo& t : allTypes()) types.push_back(t.type);
  }
  std::vector<OpKind> ops;
  if (!spec.hasOp) {
    ops.push_back(OpKind::kSum);
  } else if (o_.op) {
    ops.push_back(*o_.op);
  } else {
    for (const OpInfo& op : allOps()) ops.push_back(op.kind);
  }
  std::vector<int> roots;
  if (!spec.hasRoot) {
    roots.push_back(-1);
  } else if (o_.root == -1) {
    for (int r = 0; r < job_.nranks; ++r) roots.push_back(r);
  } else {
    roots.push_back(o_.root);
  }
  for (ncclDataType_t type : types) {
    for (OpKind op : ops) {
      for (int root : roots) {
        timeTest({type, op, spec.hasOp ? opName(op) : "none", root});
      }
    }
  }
}

void Bench::setup(size_t bytes, ncclDataType_t type) {
  typeSize_ = typeInfo(type).size;
  counts_ = job_.spec->counts(bytes / typeSize_, job_.nranks);
  totalBytes_ = std::max(counts_.sendCount, counts_.recvCount) * typeSize_;
}

void Bench::createOps(const TestCase& test) {
  ops_.assign(state_.ranks.size(), builtinRedOp(test.op));
  if (!job_.spec->hasOp || test.op != OpKind::kMulSum) return;
  for (size_t i = 0; i < state_.ranks.size(); ++i) {
    RankState& r = state_.ranks[i];
    uint64_t scalar = 0;  // the scalar in the element type, in host memory
    storeValue(test.type, mulSumScalar(r.rank), &scalar);
    LOOM_PERF_NCCL(job_, ncclRedOpCreatePreMulSum(&ops_[i], &scalar, test.type,
                                                  ncclScalarHostImmediate, r.comm));
  }
}

void Bench::destroyOps() {
  if (ops_.empty() || ops_[0] < ncclNumOps) return;
  for (size_t i = 0; i < state_.ranks.size(); ++i) {
    LOOM_PERF_NCCL(job_, ncclRedOpDestroy(ops_[i], state_.ranks[i].comm));
  }
}

void Bench::startColl(const TestCase& test, bool inPlace, int iter) {
  // Move through the buffers from one iteration to the next, as nccl-tests does, so that
  // caches do not flatter small sizes.
  const size_t steps = totalBytes_ ? std::max<size_t>(o_.maxBytes / totalBytes_, 1) : 1;
  const size_t shift = totalBytes_ * (static_cast<size_t>(iter) % steps);
  const bool group = state_.ranks.size() > 1;
  if (group) LOOM_PERF_NCCL(job_, ncclGroupStart());
  for (size_t i = 0; i < state_.ranks.size(); ++i) {
    RankState& r = state_.ranks[i];
    char* recv = static_cast<char*>(r.recv) + shift;
    char* send = static_cast<char*>(r.send) + shift;
    const size_t rank = static_cast<size_t>(r.rank);
    RunArgs a;
    a.sendbuff = inPlace ? recv + counts_.sendInplaceOffset * rank * typeSize_ : send;
    a.recvbuff = inPlace ? recv + counts_.recvInplaceOffset * rank * typeSize_ : recv;
    a.count = counts_.paramCount;
    a.type = test.type;
    a.op = ops_[i];
    a.root = test.root;
    a.rank = r.rank;
    a.nranks = job_.nranks;
    a.comm = r.comm;
    a.stream = r.stream;
    const ncclResult_t result = job_.spec->run(a);
    if (result != ncclSuccess) ncclFatal(job_, result, job_.spec->name, __FILE__, __LINE__);
  }
  if (group) LOOM_PERF_NCCL(job_, ncclGroupEnd());
  heartbeat(job_);
  if (o_.blocking) {
    completeColl(/*force=*/true);
    job_.team->barrier(state_.thread);
  }
}

void Bench::completeColl(bool force) {
  if (o_.blocking && !force) return;
  if (!job_.memory->isDevice()) return;  // host collectives are complete on return
  std::vector<bool> done(state_.ranks.size(), false);
  size_t remaining = done.size();
  while (remaining > 0) {
    bool idle = true;
    for (size_t i = 0; i < done.size(); ++i) {
      if (done[i]) continue;
      bool finished = false;
      LOOM_PERF_CHECK(job_, job_.memory->query(state_.ranks[i].stream, &finished));
      if (finished) {
        done[i] = true;
        --remaining;
        idle = false;
        continue;
      }
      ncclResult_t asyncError = ncclSuccess;
      LOOM_PERF_NCCL(job_, ncclCommGetAsyncError(state_.ranks[i].comm, &asyncError));
      if (asyncError != ncclSuccess) {
        ncclFatal(job_, asyncError, "asynchronous error", __FILE__, __LINE__);
      }
    }
    if (idle) sched_yield();
  }
  heartbeat(job_);
}

DataParams Bench::dataParams(const TestCase& test, uint64_t seed) const {
  DataParams p;
  p.type = test.type;
  p.op = job_.spec->hasOp ? test.op : OpKind::kSum;
  p.nranks = job_.nranks;
  p.seed = seed;
  return p;
}

void Bench::prepareData(const TestCase& test, bool inPlace, uint64_t seed, bool poison) {
  const DataParams params = dataParams(test, seed);
  Memory& mem = *job_.memory;
  for (RankState& r : state_.ranks) {
    const size_t rank = static_cast<size_t>(r.rank);
    const size_t sendOffset = inPlace ? counts_.sendInplaceOffset * rank * typeSize_ : 0;
    const size_t recvOffset = inPlace ? counts_.recvInplaceOffset * rank * typeSize_ : 0;
    const size_t sendBytes = counts_.sendCount * typeSize_;
    if (poison) {
      const size_t span = std::max({recvOffset + counts_.recvCount * typeSize_,
                                    inPlace ? sendOffset + sendBytes : 0, totalBytes_});
      LOOM_PERF_CHECK(job_, mem.fill(r.recv, poisonByte(test.type), std::min(span, o_.maxBytes)));
    }
    char* dst = static_cast<char*>(inPlace ? r.recv : r.send) + sendOffset;
    if (mem.isDevice()) {
      r.scratch.resize(std::max(r.scratch.size(), sendBytes));
      fillInput(params, r.rank, r.scratch.data(), counts_.sendCount);
      LOOM_PERF_CHECK(job_, mem.upload(dst, r.scratch.data(), sendBytes));
    } else {
      fillInput(params, r.rank, dst, counts_.sendCount);
    }
  }
  heartbeat(job_);
}

int64_t Bench::checkData(const TestCase& test, bool inPlace, uint64_t seed) {
  const DataParams params = dataParams(test, seed);
  int64_t wrong = 0;
  for (RankState& r : state_.ranks) {
    const size_t rank = static_cast<size_t>(r.rank);
    const size_t recvOffset = inPlace ? counts_.recvInplaceOffset * rank * typeSize_ : 0;
    const size_t bytes = counts_.recvCount * typeSize_;
    const char* data = static_cast<const char*>(r.recv) + recvOffset;
    if (job_.memory->isDevice()) {
      r.scratch.resize(std::max(r.scratch.size(), bytes));
      LOOM_PERF_CHECK(job_, job_.memory->download(r.scratch.data(), data, bytes));
      data = r.scratch.data();
    }
    RankLayout layout;
    layout.rank = r.rank;
    layout.nranks = job_.nranks;
    layout.root = test.root;
    layout.paramCount = counts_.paramCount;
    wrong += countWrong(params, layout, job_.spec->expect, data, counts_.recvCount);
  }
  heartbeat(job_);
  return wrong;
}

Measurement Bench::benchTime(const TestCase& test, bool inPlace) {
  Team& team = *job_.team;
  const int thread = state_.thread;
  if (o_.check > 0) prepareData(test, inPlace, kWarmSeed, /*poison=*/false);

  startColl(test, inPlace, 0);  // sync
  completeColl();
  team.barrier(thread);

  const auto start = std::chrono::steady_clock::now();
  for (int iter = 0; iter < o_.iters; ++iter) {
    if (o_.aggIters > 1) LOOM_PERF_NCCL(job_, ncclGroupStart());
    for (int a = 0; a < o_.aggIters; ++a) startColl(test, inPlace, iter * o_.aggIters + a);
    if (o_.aggIters > 1) LOOM_PERF_NCCL(job_, ncclGroupEnd());
  }
  const double calls = static_cast<double>(o_.iters) * o_.aggIters;
  const double cpuSec = secondsSince(start) / calls;
  completeColl();
  double sec = secondsSince(start) / calls;
  sec = team.combine(thread, sec, combineForAverage(o_.average));
  const double reportedSec = o_.reportCputime ? team.combine(thread, cpuSec, combineForAverage(o_.average)) : sec;

  const Bandwidth bw = computeBandwidth(*job_.spec, counts_.paramCount, typeSize_, sec, job_.nranks);
  team.barrier(thread);

  Measurement m;
  m.timeUsec = reportedSec * 1.0e6;
  m.algBw = bw.algBw;
  m.busBw = bw.busBw;
  m.checked = o_.check > 0 && (!inPlace || job_.spec->checkInPlace);
  ++rep_;
  if (m.checked) {
    for (int c = 0; c < o_.check; ++c) {
      const uint64_t seed = static_cast<uint64_t>(rep_) * 1000 + static_cast<uint64_t>(c);
      prepareData(test, inPlace, seed, /*poison=*/true);
      startColl(test, inPlace, 0);
      completeColl();
      const int64_t local = checkData(test, inPlace, seed);
      m.wrong = static_cast<int64_t>(team.combine(thread, static_cast<double>(local), Combine::kSum));
      if (m.wrong != 0) break;
    }
  }

  print(formatRowResult(m.timeUsec, m.algBw, m.busBw, m.checked, m.wrong));
  if (inPlace && o_.reportTimestamps && state_.isMain) std::printf("%21s", timestampText().c_str());
  if (state_.isMain) {
    if (m.checked && m.wrong != 0) ++state_.errors;
    state_.busBwSum += m.busBw;
    ++state_.busBwCount;
  }
  return m;
}

void Bench::timeTest(const TestCase& test) {
  job_.team->barrier(state_.thread);
  createOps(test);

  for (size_t size : warmupSizes(o_.minBytes, o_.maxBytes)) {
    setup(size, test.type);
    for (int w = 0; w < o_.warmupIters; ++w) startColl(test, /*inPlace=*/false, w);
    completeColl();
  }

  const std::vector<size_t> sizes =
      sizeSequence(o_.minBytes, o_.maxBytes, o_.stepBytes, o_.stepFactor);
  for (long cycle = 0; o_.runCycles == 0 || cycle < o_.runCycles; ++cycle) {
    for (size_t size : sizes) {
      setup(size, test.type);
      ResultRow row;
      row.bytes = totalBytes_;
      row.count = counts_.paramCount;
      row.type = typeInfo(test.type).name;
      row.op = test.opName;
      row.root = test.root;
      row.iterations = o_.iters;
      print(formatRowStart(row.bytes, row.count, row.type, row.op, row.root));
      row.outOfPlace = benchTime(test, /*inPlace=*/false);
      row.inPlace = benchTime(test, /*inPlace=*/true);
      print("\n");
      if (state_.isMain && job_.json != nullptr) job_.json->row(row, o_.reportCputime);
    }
  }
  destroyOps();
}

}  // namespace

void runThreadTests(Job& job, ThreadState& thread) {
  Bench bench(job, thread);
  bench.runAll();
}

}  // namespace loom::perf
