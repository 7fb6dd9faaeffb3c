#include "perf_tests/harness/runner.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "perf_tests/harness/cuda_api.h"
#include "perf_tests/harness/format.h"
#include "perf_tests/harness/job.h"

// Present from NCCL 2.19 / 2.27 on; resolved at load time so older libraries still run.
#pragma weak ncclCommRegister
#pragma weak ncclCommDeregister
#pragma weak ncclCommWindowRegister
#pragma weak ncclCommWindowDeregister

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
  void watch(std::vector<ncclComm_t> comms) {
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.insert(comms_.end(), comms.begin(), comms.end());
  }
  void start() {
    heartbeat(job_);
    thread_ = std::thread([this] { loop(); });
  }

 private:
  void loop() {
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (nowNs() - job_.lastProgressNs.load() <= timeoutNs_) continue;
      std::printf("%s: Test timeout (%llds): no progress; aborting the communicators\n",
                  job_.host.c_str(), static_cast<long long>(timeoutNs_ / 1000000000));
      std::fflush(stdout);
      std::lock_guard<std::mutex> lock(mutex_);
      for (ncclComm_t c : comms_) ncclCommAbort(c);
      fatal(job_, "timeout");
    }
  }

  Job& job_;
  const int64_t timeoutNs_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::vector<ncclComm_t> comms_;
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
    if (!job.options.streamNull) LOOM_PERF_CHECK(job, job.memory->createStream(&r.stream));
  }
}

void initCommsInThread(Job& job, ThreadState& t, const ncclUniqueId& id) {
  const bool group = t.ranks.size() > 1;
  if (group) LOOM_PERF_NCCL(job, ncclGroupStart());
  for (RankState& r : t.ranks) {
    if (r.device >= 0) LOOM_PERF_CHECK(job, job.memory->setDevice(r.device));
    LOOM_PERF_NCCL(job, ncclCommInitRank(&r.comm, job.nranks, id, r.rank));
  }
  if (group) LOOM_PERF_NCCL(job, ncclGroupEnd());
}

void registerBuffers(Job& job, ThreadState& t) {
  const int mode = job.options.registration;
  if (mode == 0) return;
  const size_t bytes = job.options.maxBytes;
  for (RankState& r : t.ranks) {
    ncclResult_t a = ncclInvalidUsage, b = ncclInvalidUsage;
    const bool available = mode == 2 ? &ncclCommWindowRegister != nullptr
                                     : &ncclCommRegister != nullptr;
    if (!available) {
      if (t.isMain && &r == &t.ranks[0]) {
        std::printf("# Buffer registration (-R %d): this NCCL has no %s; running unregistered\n",
                    mode, mode == 2 ? "ncclCommWindowRegister" : "ncclCommRegister");
      }
      continue;
    }
    if (mode == 2) {
      a = ncclCommWindowRegister(r.comm, r.send, bytes, &r.sendWindow, NCCL_WIN_COLL_SYMMETRIC);
      b = ncclCommWindowRegister(r.comm, r.recv, bytes, &r.recvWindow, NCCL_WIN_COLL_SYMMETRIC);
    } else {
      a = ncclCommRegister(r.comm, r.send, bytes, &r.sendHandle);
      b = ncclCommRegister(r.comm, r.recv, bytes, &r.recvHandle);
    }
    if ((a != ncclSuccess || b != ncclSuccess) && t.isMain && &r == &t.ranks[0]) {
      std::printf("# Buffer registration (-R %d) failed (%s): running unregistered\n", mode,
                  ncclGetErrorString(a != ncclSuccess ? a : b));
    }
  }
}

void deregisterBuffers(ThreadState& t) {
  for (RankState& r : t.ranks) {
    if (r.sendWindow != nullptr) ncclCommWindowDeregister(r.comm, r.sendWindow);
    if (r.recvWindow != nullptr) ncclCommWindowDeregister(r.comm, r.recvWindow);
    if (r.sendHandle != nullptr) ncclCommDeregister(r.comm, r.sendHandle);
    if (r.recvHandle != nullptr) ncclCommDeregister(r.comm, r.recvHandle);
  }
}

// Finalize (grouped across this thread's ranks) then destroy; failures here only warn.
void destroyComms(Job& job, ThreadState& t) {
  const bool group = t.ranks.size() > 1;
  if (group) ncclGroupStart();
  for (RankState& r : t.ranks) {
    const ncclResult_t e = ncclCommFinalize(r.comm);
    if (e != ncclSuccess) {
      std::fprintf(stderr, "%s: warning: ncclCommFinalize (rank %d): %s\n", job.host.c_str(),
                   r.rank, ncclGetErrorString(e));
    }
  }
  if (group) ncclGroupEnd();
  for (RankState& r : t.ranks) {
    const ncclResult_t e = ncclCommDestroy(r.comm);
    if (e != ncclSuccess) {
      std::fprintf(stderr, "%s: warning: ncclCommDestroy (rank %d): %s\n", job.host.c_str(),
                   r.rank, ncclGetErrorString(e));
    }
    r.comm = nullptr;
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
// start: ncclCommInitRank blocks until every rank has joined, so ranks init concurrently).
void threadMain(Job& job, ThreadState& t, const ncclUniqueId* id, Watchdog* watchdog) {
  if (id != nullptr) initCommsInThread(job, t, *id);
  if (watchdog != nullptr) {
    std::vector<ncclComm_t> comms;
    for (const RankState& r : t.ranks) comms.push_back(r.comm);
    watchdog->watch(comms);
  }
  registerBuffers(job, t);
  job.team->barrier(t.thread);
  if (t.isMain) {
    std::fputs(formatTableHeader(job.options.reportCputime, job.options.reportTimestamps).c_str(),
               stdout);
    std::fflush(stdout);
  }
  job.team->barrier(t.thread);
  runThreadTests(job, t);
  job.team->barrier(t.thread);
  deregisterBuffers(t);
  destroyComms(job, t);
}

std::unique_ptr<Memory> chooseMemory(const Options& o, std::string* error) {
  const bool gpu = o.memory != MemoryKind::kHost && cudaDeviceCount() > 0;
  if (o.memory == MemoryKind::kDevice && !gpu) {
    *error = "--memory device: no CUDA device found (libcudart could not be loaded, or it sees "
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

void heartbeat(Job& job) { job.lastProgressNs.store(nowNs(), std::memory_order_relaxed); }

void fatal(const Job& job, const std::string& message) {
  std::printf("%s: Test failure: %s\n", job.host.c_str(), message.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  if (gMpi != nullptr) gMpi->abort(1);
  std::_Exit(1);
}

void ncclFatal(const Job& job, ncclResult_t result, const char* call, const char* file, int line) {
  const char* last = ncclGetLastError(nullptr);
  std::string message = std::string("NCCL failure ") + file + ":" + std::to_string(line) + " '" +
                        call + "': " + ncclGetErrorString(result);
  if (last != nullptr && last[0] != '\0') message += " (" + std::string(last) + ")";
  fatal(job, message);
}

// ---- main ----

int perfMain(int argc, char** argv, const CollectiveSpec& spec) {
  setlinebuf(stdout);
  const ParseResult parsed = parseArgs(argc, argv);
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
  job.options.graphLaunches = 0;  // accepted, not run (see the note printed in the header)
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
  if (spec.hasRoot && o.root >= job.nranks) {
    fatal(job, "root " + std::to_string(o.root) + " is out of range for " +
                   std::to_string(job.nranks) + " ranks");
  }

  int libraryVersion = 0;
  ncclGetVersion(&libraryVersion);

  // Devices: consecutive per process on a host, or from NCCL_TESTS_DEVICE.
  const int perProc = o.nThreads * o.nGpus;
  const int localRank = localRankOf(mpi, job.host);
  std::vector<int> devices(perProc, -1);
  if (memory->isDevice()) {
    const char* env = std::getenv("NCCL_TESTS_DEVICE");
    const int first = env != nullptr ? std::atoi(env) : localRank * perProc;
    const int available = cudaDeviceCount();
    for (int i = 0; i < perProc; ++i) devices[i] = first + i;
    if (first + perProc > available) {
      fatal(job, "Invalid number of GPUs: " + std::to_string(first + perProc) +
                     " requested but only " + std::to_string(available) + " were found");
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
    if (!o.jsonPath.empty()) {
      if (json.open(o.jsonPath, &error)) {
        std::printf("# Writing JSON output to %s\n", o.jsonPath.c_str());
      } else {
        std::printf("# skipping json output; %s\n", error.c_str());
      }
    }
    std::printf("#\n# Using devices\n");
    for (const DeviceInfo& d : all) {
      std::fputs(formatDeviceLine(d.rank, d.group, d.pid, d.host, d.device, d.busId, d.name).c_str(),
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
  // with ncclCommInitRank on the id made by process 0.
  ncclUniqueId id{};
  const bool initAll = job.nprocs == 1 && o.nThreads == 1;
  if (initAll) {
    std::vector<ncclComm_t> comms(o.nGpus);
    std::vector<int> devlist(o.nGpus);
    for (int i = 0; i < o.nGpus; ++i) devlist[i] = devices[i] >= 0 ? devices[i] : i;
    LOOM_PERF_NCCL(job, ncclCommInitAll(comms.data(), o.nGpus, devlist.data()));
    for (int i = 0; i < o.nGpus; ++i) threads[0].ranks[i].comm = comms[i];
  } else {
    if (mainProc) LOOM_PERF_NCCL(job, ncclGetUniqueId(&id));
    mpi.broadcast(&id, sizeof id, 0);
  }
  const ncclUniqueId* idForThreads = initAll ? nullptr : &id;

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
  double errors = static_cast<double>(main.errors);
  mpi.broadcast(&errors, sizeof errors, 0);
  const double avgBusBw = main.busBwCount > 0 ? main.busBwSum / main.busBwCount : 0;
  const char* minBwEnv = std::getenv("NCCL_TESTS_MIN_BW");
  const double minBw = minBwEnv != nullptr ? std::atof(minBwEnv) : -1;
  const char* lastError = ncclGetLastError(nullptr);
  const std::string lastErrorText = lastError != nullptr ? lastError : "";
  if (mainProc) {
    std::fputs(formatFooter(static_cast<int64_t>(errors), avgBusBw, minBw, spec.program).c_str(),
               stdout);
    if (!lastErrorText.empty()) {
      std::printf("# error: %s\n", lastErrorText.c_str());
    } else {
      std::printf("\n");
    }
    std::fflush(stdout);
    json.finish(static_cast<int64_t>(errors), avgBusBw, minBw, lastErrorText);
  }
  mpi.finalize();
  gMpi = nullptr;
  const bool bwFailed = minBw >= 0 && avgBusBw < minBw * 0.9;
  return errors > 0 || (mainProc && bwFailed) ? 1 : 0;
}

}  // namespace loom::perf
