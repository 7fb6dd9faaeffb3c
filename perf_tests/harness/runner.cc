#include "perf_tests/harness/runner.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "perf_tests/harness/cuda_api.h"
#include "perf_tests/harness/format.h"
#include "perf_tests/harness/job.h"
#include "perf_tests/harness/values.h"

namespace loom::perf {
namespace {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Mpi* gMpi = nullptr;  // for fatal(): ends every process of an MPI job

std::string hostName() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  std::string s = name;
  const size_t dot = s.find('.');
  return dot == std::string::npos ? s : s.substr(0, dot);
}

// ---- the -T watchdog ----

class Watchdog {
 public:
  Watchdog(Job& job, int timeoutSec) : job_(job), timeoutNs_(int64_t{timeoutSec} * 1000000000) {}
  ~Watchdog() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  void watch(const NcclApi& nccl, const std::vector<ncclComm_t>& comms) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (ncclComm_t c : comms) comms_.emplace_back(&nccl, c);
  }
  void start() {
    heartbeat(job_);
    thread_ = std::thread([this] { loop(); });
  }

 private:
  void loop() {
    uint64_t seen = job_.progress.load(std::memory_order_relaxed);
    int64_t changedNs = nowNs();
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const uint64_t now = job_.progress.load(std::memory_order_relaxed);
      if (now != seen) {
        seen = now;
        changedNs = nowNs();
        continue;
      }
      if (nowNs() - changedNs <= timeoutNs_) continue;
      std::printf("%s: Test timeout (%llds): no progress in %s; aborting the communicators\n",
                  job_.host.c_str(), static_cast<long long>(timeoutNs_ / 1000000000),
                  describeWhere(job_).c_str());
      std::fflush(stdout);
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& [nccl, comm] : comms_) nccl->commAbort(comm);
      fatal(job_, "timeout");
    }
  }

  Job& job_;
  const int64_t timeoutNs_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::vector<std::pair<const NcclApi*, ncclComm_t>> comms_;
  std::thread thread_;
};

// ---- set-up helpers ----

std::vector<DeviceInfo> describeRanks(const Job& job, const std::vector<int>& devices, int pid) {
  const Options& o = job.options;
  std::vector<DeviceInfo> out;
  for (int i = 0; i < o.nThreads * o.nGpus; ++i) {
    DeviceInfo d;
    d.rank = job.proc * o.nThreads * o.nGpus + i;
    d.pid = pid;
    d.host = job.host;
    d.device = devices[i];
    if (job.memory->isDevice()) {
      const CudaApi* api = cudaApi();
      char busId[64] = {};
      api->deviceGetPCIBusId(busId, sizeof busId, d.device);
      d.busId = busId;
      std::vector<char> prop(16384, 0);
      api->getDeviceProperties(prop.data(), d.device);
      d.name = std::string(prop.data(), strnlen(prop.data(), 256));
    } else {
      d.busId = "host";
      d.name = "host memory";
    }
    out.push_back(d);
  }
  return out;
}

// One line per rank, "|"-separated, so MPI can gather them as text.
std::string serialize(const std::vector<DeviceInfo>& ranks) {
  std::ostringstream s;
  for (const DeviceInfo& d : ranks) {
    s << d.rank << '|' << d.group << '|' << d.pid << '|' << d.host << '|' << d.device << '|'
      << d.busId << '|' << d.name << '\n';
  }
  return s.str();
}

std::vector<DeviceInfo> deserialize(const std::string& text) {
  std::vector<DeviceInfo> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    std::string field[7];
    for (std::string& x : field) std::getline(f, x, '|');
    DeviceInfo d;
    d.rank = std::atoi(field[0].c_str());
    d.group = std::atoi(field[1].c_str());
    d.pid = std::atoi(field[2].c_str());
    d.host = field[3];
    d.device = std::atoi(field[4].c_str());
    d.busId = field[5];
    d.name = field[6];
    out.push_back(d);
  }
  return out;
}

int localRankOf(Mpi& mpi, const std::string& host) {
  const std::vector<std::string> hosts = mpi.allgather(host);
  int local = 0;
  for (int p = 0; p < mpi.rank(); ++p) local += hosts[p] == host ? 1 : 0;
  return local;
}

void allocateBuffers(Job& job, ThreadState& t) {
  for (RankState& r : t.ranks) {
    if (r.device >= 0) LOOM_PERF_CHECK(job, job.memory->setDevice(r.device));
    LOOM_PERF_CHECK(job, job.memory->allocate(job.options.maxBytes, &r.send));
    LOOM_PERF_CHECK(job, job.memory->allocate(job.options.maxBytes, &r.recv));
    // Without -c the buffers are never filled: give them a finite, non-zero pattern
    // (0x3C bytes: 1.5 in fp8 e4m3, 1.06 in fp16, 0.0115 in fp32) so that nothing is
    // ever timed on zeros.
    LOOM_PERF_CHECK(job, job.memory->fill(r.send, 0x3C, job.options.maxBytes));
    LOOM_PERF_CHECK(job, job.memory->fill(r.recv, 0x3C, job.options.maxBytes));
    LOOM_PERF_CHECK(job, job.memory->synchronize());
    if (!job.options.streamNull) LOOM_PERF_CHECK(job, job.memory->createStream(&r.stream));
  }
}

void initCommsInThread(Job& job, ThreadState& t, size_t lib, const ncclUniqueId& id) {
  const NcclApi& nccl = *job.libraries[lib];
  const bool group = t.ranks.size() > 1;
  if (group) LOOM_PERF_NCCL(job, nccl, nccl.groupStart());
  for (RankState& r : t.ranks) {
    if (r.device >= 0) LOOM_PERF_CHECK(job, job.memory->setDevice(r.device));
    LOOM_PERF_NCCL(job, nccl, nccl.commInitRank(&r.lib[lib].comm, job.nranks, id, r.rank));
  }
  if (group) LOOM_PERF_NCCL(job, nccl, nccl.groupEnd());
}

void registerBuffers(Job& job, ThreadState& t, size_t lib) {
  const int mode = job.options.registration;
  if (mode == 0) return;
  const NcclApi& nccl = *job.libraries[lib];
  const size_t bytes = job.options.maxBytes;
  for (RankState& r : t.ranks) {
    LibraryRank& l = r.lib[lib];
    const bool report = t.isMain && &r == &t.ranks[0];
    ncclResult_t a = ncclInvalidUsage, b = ncclInvalidUsage;
    const bool available =
        mode == 2 ? nccl.commWindowRegister != nullptr : nccl.commRegister != nullptr;
    if (!available) {
      if (report) {
        std::printf("# Buffer registration (-R %d): %s has no %s; running unregistered\n", mode,
                    nccl.label.c_str(), mode == 2 ? "ncclCommWindowRegister" : "ncclCommRegister");
      }
      continue;
    }
    if (mode == 2) {
      a = nccl.commWindowRegister(l.comm, r.send, bytes, &l.sendWindow, NCCL_WIN_COLL_SYMMETRIC);
      b = nccl.commWindowRegister(l.comm, r.recv, bytes, &l.recvWindow, NCCL_WIN_COLL_SYMMETRIC);
    } else {
      a = nccl.commRegister(l.comm, r.send, bytes, &l.sendHandle);
      b = nccl.commRegister(l.comm, r.recv, bytes, &l.recvHandle);
    }
    if ((a != ncclSuccess || b != ncclSuccess) && report) {
      std::printf("# Buffer registration (-R %d) on %s failed (%s): running unregistered\n", mode,
                  nccl.label.c_str(), nccl.getErrorString(a != ncclSuccess ? a : b));
    }
  }
}

void deregisterBuffers(Job& job, ThreadState& t, size_t lib) {
  const NcclApi& nccl = *job.libraries[lib];
  for (RankState& r : t.ranks) {
    LibraryRank& l = r.lib[lib];
    if (l.sendWindow != nullptr) nccl.commWindowDeregister(l.comm, l.sendWindow);
    if (l.recvWindow != nullptr) nccl.commWindowDeregister(l.comm, l.recvWindow);
    if (l.sendHandle != nullptr) nccl.commDeregister(l.comm, l.sendHandle);
    if (l.recvHandle != nullptr) nccl.commDeregister(l.comm, l.recvHandle);
  }
}

// Finalize (grouped across this thread's ranks) then destroy; failures here only warn.
void destroyComms(Job& job, ThreadState& t, size_t lib) {
  const NcclApi& nccl = *job.libraries[lib];
  auto warn = [&](const char* call, const RankState& r, ncclResult_t e) {
    std::fprintf(stderr, "%s: warning: %s (%s, rank %d): %s\n", job.host.c_str(), call,
                 nccl.label.c_str(), r.rank, nccl.getErrorString(e));
  };
  const bool group = t.ranks.size() > 1;
  if (nccl.commFinalize != nullptr) {
    if (group) nccl.groupStart();
    for (RankState& r : t.ranks) {
      const ncclResult_t e = nccl.commFinalize(r.lib[lib].comm);
      if (e != ncclSuccess) warn("ncclCommFinalize", r, e);
    }
    if (group) nccl.groupEnd();
  }
  for (RankState& r : t.ranks) {
    const ncclResult_t e = nccl.commDestroy(r.lib[lib].comm);
    if (e != ncclSuccess) warn("ncclCommDestroy", r, e);
    r.lib[lib].comm = nullptr;
  }
}

void freeBuffers(Job& job, ThreadState& t) {
  for (RankState& r : t.ranks) {
    if (r.device >= 0) job.memory->setDevice(r.device);
    job.memory->destroyStream(r.stream);
    job.memory->release(r.send);
    job.memory->release(r.recv);
  }
}

// What each thread does once its communicators exist (or, for -t > 1 and MPI, from the
// start: ncclCommInitRank blocks until every rank has joined, so ranks init concurrently;
// every thread makes loom's communicators first, then the compared library's). `ids` holds
// one id per library, or is null when ncclCommInitAll made the communicators already.
void threadMain(Job& job, ThreadState& t, const ncclUniqueId* ids, Watchdog* watchdog) {
  const size_t nlibs = job.libraries.size();
  for (size_t lib = 0; lib < nlibs; ++lib) {
    setWhere(job, Phase::kInit, static_cast<int>(lib));
    if (ids != nullptr) initCommsInThread(job, t, lib, ids[lib]);
    if (watchdog != nullptr) {
      std::vector<ncclComm_t> comms;
      for (const RankState& r : t.ranks) comms.push_back(r.lib[lib].comm);
      watchdog->watch(*job.libraries[lib], comms);
    }
    registerBuffers(job, t, lib);
  }
  setWhere(job, Phase::kBarrier);
  job.team->barrier(t.thread);
  if (t.isMain) {
    std::fputs(formatTableHeader(job.options.reportCputime, job.options.reportTimestamps, nlibs > 1)
                   .c_str(),
               stdout);
    std::fflush(stdout);
  }
  job.team->barrier(t.thread);
  runThreadTests(job, t);
  setWhere(job, Phase::kBarrier);
  job.team->barrier(t.thread);
  for (size_t lib = 0; lib < nlibs; ++lib) {
    setWhere(job, Phase::kFinish, static_cast<int>(lib));
    deregisterBuffers(job, t, lib);
    destroyComms(job, t, lib);
  }
}

std::unique_ptr<Memory> chooseMemory(const Options& o, std::string* error) {
  const bool gpu = o.memory != MemoryKind::kHost && cudaDeviceCount() > 0;
  if (o.memory == MemoryKind::kDevice && !gpu) {
    *error =
        "--memory device: no CUDA device found (libcudart could not be loaded, or it sees "
        "no GPU); use --memory host";
    return nullptr;
  }
  if (gpu) return makeDeviceMemory();
  // loom runs host-memory communicators when asked; other NCCLs ignore the variable.
  setenv("LOOM_DEVICE", "cpu", /*overwrite=*/0);
  return makeHostMemory();
}

}  // namespace

// ---- job-wide helpers declared in job.h ----

void heartbeat(Job& job) {
  job.progress.fetch_add(1, std::memory_order_relaxed);
}

void setWhere(Job& job, Phase phase, int lib, size_t bytes, int inPlace) {
  Where& w = job.where;
  if (lib >= 0) {
    w.lib.store(lib, std::memory_order_relaxed);
    w.bytes.store(bytes, std::memory_order_relaxed);
  }
  if (inPlace >= 0) w.inPlace.store(inPlace, std::memory_order_relaxed);
  w.phase.store(static_cast<int>(phase), std::memory_order_relaxed);
}

std::string describeWhere(const Job& job) {
  const Where& w = job.where;
  const auto phase = static_cast<Phase>(w.phase.load(std::memory_order_relaxed));
  const int lib = w.lib.load(std::memory_order_relaxed);
  std::string out;
  if (lib >= 0 && static_cast<size_t>(lib) < job.libraries.size()) {
    out = job.libraries[lib]->label + " ";
  }
  out += job.spec != nullptr ? job.spec->name : "the job";
  const bool sized = phase != Phase::kStart && phase != Phase::kInit && phase != Phase::kFinish;
  const size_t bytes = w.bytes.load(std::memory_order_relaxed);
  if (sized && bytes > 0) {
    out += ", " + std::to_string(bytes) + " B";
    if (phase != Phase::kWarmUp) {
      out += w.inPlace.load(std::memory_order_relaxed) ? " in place" : " out of place";
    }
  }
  switch (phase) {
    case Phase::kStart: return out + ": setting up";
    case Phase::kInit: return out + ": making communicators";
    case Phase::kWarmUp: return out + ": warm-up calls";
    case Phase::kPrepare: return out + ": filling the input";
    case Phase::kLaunch: return out + ": enqueuing the timed calls";
    case Phase::kWait: return out + ": waiting for the stream to finish the calls";
    case Phase::kCheck: return out + ": the checked call";
    case Phase::kBarrier: return out + ": waiting for the other ranks";
    case Phase::kFinish: return out + ": destroying communicators";
  }
  return out;
}

void fatal(const Job& job, const std::string& message) {
  std::printf("%s: Test failure: %s\n", job.host.c_str(), message.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  // One thread ends the job. The watchdog's abort makes the timed thread fail too, and two
  // threads in MPI_Abort at once crashed Open MPI 4.1 (its help-message parser).
  // (Should that abort hang, the second thread still ends the process after a while.)
  static std::atomic<bool> ending{false};
  if (ending.exchange(true)) {
    std::this_thread::sleep_for(std::chrono::seconds(30));
    std::_Exit(1);
  }
  if (gMpi != nullptr) gMpi->abort(1);
  std::_Exit(1);
}

void ncclFatal(const Job& job, const NcclApi& nccl, ncclResult_t result, const char* call,
               const char* file, int line) {
  const std::string last = nccl.lastError();
  // The linked library keeps nccl-tests' wording; the compared one is named.
  const std::string which = nccl.path.empty() ? "" : " (compared library " + nccl.path + ")";
  std::string message = "NCCL failure" + which + " " + file + ":" + std::to_string(line) + " '" +
                        call + "': " + nccl.getErrorString(result);
  if (!last.empty()) message += " (" + last + ")";
  fatal(job, message);
}

// ---- main ----

int perfMain(int argc, char** argv, const CollectiveSpec& spec) {
  setlinebuf(stdout);
  ParseResult parsed = parseArgs(argc, argv);
  if (parsed.help) {
    std::fputs(usage(spec.program).c_str(), stdout);
    return 0;
  }
  if (!parsed.error.empty()) {
    std::fprintf(stderr, "%s: %s\n%s", spec.program, parsed.error.c_str(),
                 usage(spec.program).c_str());
    return 2;
  }

  Mpi mpi;
  mpi.init(&argc, &argv);
  gMpi = &mpi;
  Job job;
  job.spec = &spec;
  job.options = parsed.options;
  const Options& o = job.options;
  job.mpi = &mpi;
  job.nprocs = mpi.size();
  job.proc = mpi.rank();
  job.host = hostName();
  job.nranks = job.nprocs * o.nThreads * o.nGpus;
  const bool mainProc = job.proc == 0;

  std::string error;
  std::unique_ptr<Memory> memory = chooseMemory(o, &error);
  if (!memory) fatal(job, error);
  job.memory = memory.get();
  if (o.graphLaunches > 0 && !memory->isDevice()) {
    // Host collectives complete before they return: there is nothing to capture.
    parsed.notes.push_back("-G (cudagraph) is ignored on host memory");
    job.options.graphLaunches = 0;
  }
  if (spec.hasRoot && o.root >= job.nranks) {
    fatal(job, "root " + std::to_string(o.root) + " is out of range for " +
                   std::to_string(job.nranks) + " ranks");
  }

  // The libraries to measure: the linked one, and --compare's.
  const NcclApi& linked = linkedNccl();
  job.libraries.push_back(&linked);
  NcclLoad compare;
  int compareVersion = 0;
  if (o.compareNccl) {
    compare = loadCompareNccl(o.compareNcclPath, processSearchEnv(), linked);
    if (!compare.api) fatal(job, compare.error);
    LOOM_PERF_NCCL(job, *compare.api, compare.api->getVersion(&compareVersion));
    job.libraries.push_back(compare.api.get());
  }
  int libraryVersion = 0;
  linked.getVersion(&libraryVersion);

  // Devices: consecutive per process on a host, or from NCCL_TESTS_DEVICE.
  const int perProc = o.nThreads * o.nGpus;
  const int localRank = localRankOf(mpi, job.host);
  std::vector<int> devices(perProc, -1);
  if (memory->isDevice()) {
    const char* env = std::getenv("NCCL_TESTS_DEVICE");
    const int first = env != nullptr ? std::atoi(env) : localRank * perProc;
    const int available = cudaDeviceCount();
    // LOOM_P2P_SHARE_GPU on (1, true, TRUE or yes, as loom reads it) lets ranks of one
    // process share GPUs (loom's test setting): then the ranks go round the GPUs there are.
    const char* shareEnv = std::getenv("LOOM_P2P_SHARE_GPU");
    const std::string share = shareEnv ? shareEnv : "";
    const bool shareAsked = share == "1" || share == "true" || share == "TRUE" || share == "yes";
    const bool wrap = shareAsked && available > 0 && !o.compareNccl;
    for (int i = 0; i < perProc; ++i) devices[i] = wrap ? (first + i) % available : first + i;
    if (wrap && first + perProc > available) {
      parsed.notes.push_back("LOOM_P2P_SHARE_GPU=1: " + std::to_string(perProc) + " ranks share " +
                             std::to_string(available) +
                             " GPU(s); the times say nothing of a machine with a GPU per rank");
    } else if (first + perProc > available) {
      fatal(job, "Invalid number of GPUs: " + std::to_string(first + perProc) +
                     " requested but only " + std::to_string(available) + " were found" +
                     (o.compareNccl && shareAsked
                          ? " (LOOM_P2P_SHARE_GPU does not apply with --compare: NCCL refuses "
                            "two ranks on one GPU)"
                          : ""));
    }
  }

  // Header and the devices of every process.
  const std::vector<DeviceInfo> mine = describeRanks(job, devices, static_cast<int>(getpid()));
  std::vector<DeviceInfo> all;
  for (const std::string& part : mpi.allgather(serialize(mine))) {
    for (const DeviceInfo& d : deserialize(part)) all.push_back(d);
  }
  JsonReport json;
  if (mainProc) {
    std::fputs(formatRunHeader(o, spec.program, libraryVersion).c_str(), stdout);
    for (const std::string& note : parsed.notes) std::printf("# %s\n", note.c_str());
    // Filling and checking large buffers runs a thread per CPU this process may use: under
    // mpirun, bound to one core by default, a GiB-sized check takes minutes.
    const unsigned online = std::max(1u, std::thread::hardware_concurrency());
    if (o.check > 0 && o.maxBytes >= (size_t{256} << 20) && usableCpus() == 1 && online > 1) {
      std::printf(
          "# Note: this process may run on 1 of %u CPUs, so -c fills and checks large "
          "buffers on one thread; mpirun binds each process to a core by default: "
          "--bind-to none is faster\n",
          online);
    }
    if (compare.api) {
      std::printf("# Comparing with NCCL %d from %s\n", compareVersion, compare.api->path.c_str());
      for (const std::string& note : compare.notes) std::printf("# %s\n", note.c_str());
    }
    if (!o.jsonPath.empty()) {
      if (json.open(o.jsonPath, &error)) {
        std::printf("# Writing JSON output to %s\n", o.jsonPath.c_str());
      } else {
        std::printf("# skipping json output; %s\n", error.c_str());
      }
    }
    std::printf("#\n# Using devices\n");
    for (const DeviceInfo& d : all) {
      std::fputs(
          formatDeviceLine(d.rank, d.group, d.pid, d.host, d.device, d.busId, d.name).c_str(),
          stdout);
    }
    std::fflush(stdout);
    if (json.isOpen()) {
      RunInfo run;
      run.program = spec.program;
      run.collective = spec.name;
      for (int i = 0; i < argc; ++i) run.args.push_back(argv[i]);
      run.libraryVersion = libraryVersion;
      run.memory = memory->name();
      run.nranks = job.nranks;
      run.nprocs = job.nprocs;
      if (compare.api) {
        run.comparePath = compare.api->path;
        run.compareVersion = compareVersion;
      }
      json.config(run, o, all);
      job.json = &json;
    }
  }

  Team team(o.nThreads, &mpi);
  job.team = &team;
  std::vector<ThreadState> threads(o.nThreads);
  for (int t = 0; t < o.nThreads; ++t) {
    threads[t].thread = t;
    threads[t].isMain = mainProc && t == 0;
    for (int i = 0; i < o.nGpus; ++i) {
      RankState r;
      r.rank = (job.proc * o.nThreads + t) * o.nGpus + i;
      r.device = devices[t * o.nGpus + i];
      threads[t].ranks.push_back(std::move(r));
    }
    allocateBuffers(job, threads[t]);
  }

  std::unique_ptr<Watchdog> watchdog;
  if (o.timeoutSec > 0) {
    watchdog = std::make_unique<Watchdog>(job, o.timeoutSec);
    watchdog->start();
  }

  // One process, one thread: ncclCommInitAll makes every rank. Otherwise every thread joins
  // with ncclCommInitRank on the id made by process 0 (one id per library).
  std::array<ncclUniqueId, kMaxLibraries> ids{};
  const bool initAll = job.nprocs == 1 && o.nThreads == 1;
  for (size_t lib = 0; lib < job.libraries.size(); ++lib) {
    const NcclApi& nccl = *job.libraries[lib];
    setWhere(job, Phase::kInit, static_cast<int>(lib));
    if (initAll) {
      std::vector<ncclComm_t> comms(o.nGpus);
      std::vector<int> devlist(o.nGpus);
      for (int i = 0; i < o.nGpus; ++i) devlist[i] = devices[i] >= 0 ? devices[i] : i;
      LOOM_PERF_NCCL(job, nccl, nccl.commInitAll(comms.data(), o.nGpus, devlist.data()));
      for (int i = 0; i < o.nGpus; ++i) threads[0].ranks[i].lib[lib].comm = comms[i];
    } else {
      if (mainProc) LOOM_PERF_NCCL(job, nccl, nccl.getUniqueId(&ids[lib]));
      mpi.broadcast(&ids[lib], sizeof ids[lib], 0);
    }
  }
  const ncclUniqueId* idForThreads = initAll ? nullptr : ids.data();

  std::vector<std::thread> workers;
  for (int t = 1; t < o.nThreads; ++t) {
    workers.emplace_back(threadMain, std::ref(job), std::ref(threads[t]), idForThreads,
                         watchdog.get());
  }
  threadMain(job, threads[0], idForThreads, watchdog.get());
  for (std::thread& w : workers) w.join();
  watchdog.reset();

  for (ThreadState& t : threads) freeBuffers(job, t);

  const ThreadState& main = threads[0];
  auto average = [](const LibraryTotals& t) {
    return t.busBwCount > 0 ? t.busBwSum / t.busBwCount : 0.0;
  };
  // Wrong results in either library fail the run; the footer counts them apart.
  double errors[kMaxLibraries] = {static_cast<double>(main.totals[0].errors),
                                  static_cast<double>(main.totals[1].errors)};
  mpi.broadcast(errors, sizeof errors, 0);
  const double avgBusBw = average(main.totals[0]);
  std::optional<CompareSummary> summary;
  if (compare.api) {
    const LibraryTotals& t = main.totals[1];
    summary.emplace();
    summary->errors = static_cast<int64_t>(errors[1]);
    summary->avgBusBw = average(t);
    summary->avgRatio = bandwidthRatio(avgBusBw, summary->avgBusBw);
    summary->geomeanRatio =
        t.ratioCount > 0 ? std::exp(t.logRatioSum / t.ratioCount) : std::nan("");
  }
  const char* minBwEnv = std::getenv("NCCL_TESTS_MIN_BW");
  const double minBw = minBwEnv != nullptr ? std::atof(minBwEnv) : -1;
  const std::string lastErrorText = linked.lastError();
  const CompareSummary* summaryPtr = summary ? &*summary : nullptr;
  if (mainProc) {
    std::fputs(
        formatFooter(static_cast<int64_t>(errors[0]), avgBusBw, minBw, spec.program, summaryPtr)
            .c_str(),
        stdout);
    if (!lastErrorText.empty()) {
      std::printf("# error: %s\n", lastErrorText.c_str());
    } else {
      std::printf("\n");
    }
    std::fflush(stdout);
    json.finish(static_cast<int64_t>(errors[0]), avgBusBw, minBw, lastErrorText, summaryPtr);
  }
  mpi.finalize();
  gMpi = nullptr;
  const bool bwFailed = minBw >= 0 && avgBusBw < minBw * 0.9;
  return errors[0] > 0 || errors[1] > 0 || (mainProc && bwFailed) ? 1 : 0;
}

}  // namespace loom::perf
