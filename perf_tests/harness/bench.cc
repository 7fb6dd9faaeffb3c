// The benchmark loop of one thread: for every type, op and root, every size: time the
// out-of-place and in-place collective, check the results, print the row.
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <vector>

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
  void warmUp(const TestCase& test, size_t lib);
  ResultRow timeSize(const TestCase& test, size_t size);
  Measurement benchTime(const TestCase& test, size_t lib, bool inPlace);
  void setup(size_t bytes, ncclDataType_t type);
  void startColl(const TestCase& test, size_t lib, bool inPlace, int iter);
  void completeColl(size_t lib, bool force = false);
  void createOps(const TestCase& test, size_t lib);
  void destroyOps(size_t lib);
  const NcclApi& nccl(size_t lib) const { return *job_.libraries[lib]; }
  bool comparing() const { return job_.libraries.size() > 1; }
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
  std::array<std::vector<ncclRedOp_t>, kMaxLibraries> ops_;  // per library, per rank
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

void Bench::createOps(const TestCase& test, size_t lib) {
  std::vector<ncclRedOp_t>& ops = ops_[lib];
  ops.assign(state_.ranks.size(), builtinRedOp(test.op));
  if (!job_.spec->hasOp || test.op != OpKind::kMulSum) return;
  const NcclApi& api = nccl(lib);
  for (size_t i = 0; i < state_.ranks.size(); ++i) {
    RankState& r = state_.ranks[i];
    uint64_t scalar = 0;  // the scalar in the element type, in host memory
    storeValue(test.type, mulSumScalar(r.rank), &scalar);
    LOOM_PERF_NCCL(job_, api,
                   api.redOpCreatePreMulSum(&ops[i], &scalar, test.type, ncclScalarHostImmediate,
                                            r.lib[lib].comm));
  }
}

void Bench::destroyOps(size_t lib) {
  const std::vector<ncclRedOp_t>& ops = ops_[lib];
  if (ops.empty() || ops[0] < ncclNumOps) return;
  const NcclApi& api = nccl(lib);
  for (size_t i = 0; i < state_.ranks.size(); ++i) {
    LOOM_PERF_NCCL(job_, api, api.redOpDestroy(ops[i], state_.ranks[i].lib[lib].comm));
  }
}

void Bench::startColl(const TestCase& test, size_t lib, bool inPlace, int iter) {
  // Move through the buffers from one iteration to the next, as nccl-tests does, so that
  // caches do not flatter small sizes.
  const size_t steps = totalBytes_ ? std::max<size_t>(o_.maxBytes / totalBytes_, 1) : 1;
  const size_t shift = totalBytes_ * (static_cast<size_t>(iter) % steps);
  const NcclApi& api = nccl(lib);
  const bool group = state_.ranks.size() > 1;
  if (group) LOOM_PERF_NCCL(job_, api, api.groupStart());
  for (size_t i = 0; i < state_.ranks.size(); ++i) {
    RankState& r = state_.ranks[i];
    char* recv = static_cast<char*>(r.recv) + shift;
    char* send = static_cast<char*>(r.send) + shift;
    const size_t rank = static_cast<size_t>(r.rank);
    RunArgs a;
    a.nccl = &api;
    a.sendbuff = inPlace ? recv + counts_.sendInplaceOffset * rank * typeSize_ : send;
    a.recvbuff = inPlace ? recv + counts_.recvInplaceOffset * rank * typeSize_ : recv;
    a.count = counts_.paramCount;
    a.type = test.type;
    a.op = ops_[lib][i];
    a.root = test.root;
    a.rank = r.rank;
    a.nranks = job_.nranks;
    a.comm = r.lib[lib].comm;
    a.stream = r.stream;
    const ncclResult_t result = job_.spec->run(a);
    if (result != ncclSuccess) ncclFatal(job_, api, result, job_.spec->name, __FILE__, __LINE__);
  }
  if (group) LOOM_PERF_NCCL(job_, api, api.groupEnd());
  heartbeat(job_);
  if (o_.blocking) {
    completeColl(lib, /*force=*/true);
    job_.team->barrier(state_.thread);
  }
}

void Bench::completeColl(size_t lib, bool force) {
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
      const NcclApi& api = nccl(lib);
      ncclResult_t asyncError = ncclSuccess;
      LOOM_PERF_NCCL(job_, api, api.commGetAsyncError(state_.ranks[i].lib[lib].comm, &asyncError));
      if (asyncError != ncclSuccess) {
        ncclFatal(job_, api, asyncError, "asynchronous error", __FILE__, __LINE__);
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
    // cudaMemset needs the buffer's device current (or peer access, which a run with
    // NCCL_P2P_DISABLE=1 does not have).
    if (mem.isDevice() && r.device >= 0) LOOM_PERF_CHECK(job_, mem.setDevice(r.device));
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
  if (mem.isDevice()) {
    for (RankState& r : state_.ranks) {
      LOOM_PERF_CHECK(job_, mem.setDevice(r.device));
      LOOM_PERF_CHECK(job_, mem.synchronize());
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

Measurement Bench::benchTime(const TestCase& test, size_t lib, bool inPlace) {
  const NcclApi& api = nccl(lib);
  Team& team = *job_.team;
  const int thread = state_.thread;
  const int libIndex = static_cast<int>(lib);
  setWhere(job_, Phase::kPrepare, libIndex, totalBytes_, inPlace ? 1 : 0);
  // Every wait for the other ranks says so to the -T watchdog first.
  auto barrier = [&] {
    setWhere(job_, Phase::kBarrier);
    team.barrier(thread);
  };
  if (o_.check > 0) prepareData(test, inPlace, kWarmSeed, /*poison=*/false);
  // prepareData waits for the whole device (cudaDeviceSynchronize): with -t, a thread still
  // there while another's rank has launched a call would wait for that call's kernel, which
  // waits for this thread's rank, which never launches (every hierarchical form, and the
  // flat one where one process holds ranks that exchange data, hung so on one H100).
  barrier();

  setWhere(job_, Phase::kLaunch);
  startColl(test, lib, inPlace, 0);  // sync
  setWhere(job_, Phase::kWait);
  completeColl(lib);
  barrier();
  setWhere(job_, Phase::kLaunch);

  // -G: the timed calls are captured into one graph per rank and the clock starts when
  // the graphs are launched, -G times each.
  const bool graphs = o_.graphLaunches > 0;
  Memory& mem = *job_.memory;
  if (graphs) {
    for (RankState& r : state_.ranks) {
      LOOM_PERF_CHECK(job_, mem.setDevice(r.device));
      LOOM_PERF_CHECK(job_, mem.beginCapture(r.stream));
    }
  }
  auto start = std::chrono::steady_clock::now();
  for (int iter = 0; iter < o_.iters; ++iter) {
    if (o_.aggIters > 1) LOOM_PERF_NCCL(job_, api, api.groupStart());
    for (int a = 0; a < o_.aggIters; ++a) startColl(test, lib, inPlace, iter * o_.aggIters + a);
    if (o_.aggIters > 1) LOOM_PERF_NCCL(job_, api, api.groupEnd());
  }
  std::vector<void*> execs;
  if (graphs) {
    // Every capture of this thread ends before the first graph is instantiated (CUDA
    // refuses that while one of the thread's streams is capturing: -g 2).
    std::vector<void*> captured(state_.ranks.size(), nullptr);
    for (size_t i = 0; i < state_.ranks.size(); ++i) {
      LOOM_PERF_CHECK(job_, mem.setDevice(state_.ranks[i].device));
      LOOM_PERF_CHECK(job_, mem.endCapture(state_.ranks[i].stream, &captured[i]));
    }
    for (size_t i = 0; i < state_.ranks.size(); ++i) {
      LOOM_PERF_CHECK(job_, mem.setDevice(state_.ranks[i].device));
      execs.push_back(nullptr);
      LOOM_PERF_CHECK(job_, mem.instantiate(captured[i], &execs.back()));
    }
    barrier();
    setWhere(job_, Phase::kLaunch);
    start = std::chrono::steady_clock::now();
    for (int l = 0; l < o_.graphLaunches; ++l) {
      for (size_t i = 0; i < state_.ranks.size(); ++i) {
        LOOM_PERF_CHECK(job_, mem.launchGraph(execs[i], state_.ranks[i].stream));
      }
    }
  }
  const double calls =
      static_cast<double>(o_.iters) * o_.aggIters * (graphs ? o_.graphLaunches : 1);
  const double cpuSec = secondsSince(start) / calls;
  setWhere(job_, Phase::kWait);
  completeColl(lib);
  double sec = secondsSince(start) / calls;
  for (void* exec : execs) mem.destroyGraph(exec);
  setWhere(job_, Phase::kBarrier);
  sec = team.combine(thread, sec, combineForAverage(o_.average));
  const double reportedSec =
      o_.reportCputime ? team.combine(thread, cpuSec, combineForAverage(o_.average)) : sec;

  const Bandwidth bw =
      computeBandwidth(*job_.spec, counts_.paramCount, typeSize_, sec, job_.nranks);
  barrier();

  Measurement m;
  m.timeUsec = reportedSec * 1.0e6;
  m.algBw = bw.algBw;
  m.busBw = bw.busBw;
  m.checked = o_.check > 0 && (!inPlace || job_.spec->checkInPlace);
  ++rep_;
  if (m.checked) {
    for (int c = 0; c < o_.check; ++c) {
      const uint64_t seed = static_cast<uint64_t>(rep_) * 1000 + static_cast<uint64_t>(c);
      setWhere(job_, Phase::kPrepare);
      prepareData(test, inPlace, seed, /*poison=*/true);
      barrier();  // as above
      setWhere(job_, Phase::kCheck);
      startColl(test, lib, inPlace, 0);
      completeColl(lib);
      const int64_t local = checkData(test, inPlace, seed);
      setWhere(job_, Phase::kBarrier);
      m.wrong =
          static_cast<int64_t>(team.combine(thread, static_cast<double>(local), Combine::kSum));
      if (m.wrong != 0) break;
    }
  }

  if (state_.isMain) {
    LibraryTotals& totals = state_.totals[lib];
    if (m.checked && m.wrong != 0) ++totals.errors;
    totals.busBwSum += m.busBw;
    ++totals.busBwCount;
  }
  return m;
}

void Bench::warmUp(const TestCase& test, size_t lib) {
  for (size_t size : warmupSizes(o_.minBytes, o_.maxBytes)) {
    setup(size, test.type);
    setWhere(job_, Phase::kWarmUp, static_cast<int>(lib), totalBytes_, 0);
    for (int w = 0; w < o_.warmupIters; ++w) startColl(test, lib, /*inPlace=*/false, w);
    completeColl(lib);
  }
}

// One row: loom out-of-place and in-place, then (--compare) the same on the compared library,
// each printed as soon as it is measured.
ResultRow Bench::timeSize(const TestCase& test, size_t size) {
  setup(size, test.type);
  ResultRow row;
  row.bytes = totalBytes_;
  row.count = counts_.paramCount;
  row.type = typeInfo(test.type).name;
  row.op = test.opName;
  row.root = test.root;
  row.iterations = o_.iters;
  print(formatRowStart(row.bytes, row.count, row.type, row.op, row.root));
  row.outOfPlace = benchTime(test, 0, /*inPlace=*/false);
  print(formatRowResult(row.outOfPlace));
  row.inPlace = benchTime(test, 0, /*inPlace=*/true);
  print(formatRowResult(row.inPlace));
  if (comparing()) {
    row.comparedOutOfPlace = benchTime(test, 1, /*inPlace=*/false);
    print(formatCompareResult(row.outOfPlace, *row.comparedOutOfPlace));
    row.comparedInPlace = benchTime(test, 1, /*inPlace=*/true);
    print(formatCompareResult(row.inPlace, *row.comparedInPlace));
    if (state_.isMain) {
      LibraryTotals& totals = state_.totals[1];
      for (const auto& [mine, theirs] : {std::pair{row.outOfPlace, *row.comparedOutOfPlace},
                                         std::pair{row.inPlace, *row.comparedInPlace}}) {
        const double ratio = bandwidthRatio(mine.algBw, theirs.algBw);
        if (!(ratio > 0) || std::isinf(ratio)) continue;
        totals.logRatioSum += std::log(ratio);
        ++totals.ratioCount;
      }
    }
  }
  if (o_.reportTimestamps && state_.isMain) std::printf("%21s", timestampText().c_str());
  print("\n");
  return row;
}

void Bench::timeTest(const TestCase& test) {
  job_.team->barrier(state_.thread);
  const size_t nlibs = job_.libraries.size();
  for (size_t lib = 0; lib < nlibs; ++lib) createOps(test, lib);
  for (size_t lib = 0; lib < nlibs; ++lib) warmUp(test, lib);

  const std::vector<size_t> sizes =
      sizeSequence(o_.minBytes, o_.maxBytes, o_.stepBytes, o_.stepFactor);
  for (long cycle = 0; o_.runCycles == 0 || cycle < o_.runCycles; ++cycle) {
    for (size_t size : sizes) {
      const ResultRow row = timeSize(test, size);
      if (state_.isMain && job_.json != nullptr) job_.json->row(row, o_.reportCputime);
    }
  }
  for (size_t lib = 0; lib < nlibs; ++lib) destroyOps(lib);
}

}  // namespace

void runThreadTests(Job& job, ThreadState& thread) {
  Bench bench(job, thread);
  bench.runAll();
}

}  // namespace loom::perf
