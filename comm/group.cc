// Groups: calls between ncclGroupStart and ncclGroupEnd are queued per thread and run
// at the outermost ncclGroupEnd. One communicator runs inline in the calling thread.
// Several whose calls only enqueue GPU work run at once, each in its launch thread (the
// first in the calling thread), or one after another with LOOM_LAUNCH_THREADS=0;
// otherwise several (ncclCommInitAll, -g N on host memory) each run on their own worker
// thread at once, since their ranks wait on each other.
#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "comm/api_state.h"
#include "common/log.h"

namespace loom::comm {

namespace {

struct PendingInit {
  ncclComm* handle = nullptr;
  std::thread thread;
  Status result;
};

struct GroupState {
  int depth = 0;
  std::vector<std::unique_ptr<PendingInit>> inits;
  std::vector<std::pair<ncclComm*, Operation>> ops;
  Status error;  // the first error seen by a call inside the group
};

thread_local GroupState tlsGroup;
thread_local std::string tlsLastError;

std::mutex registryMutex;
std::set<const ncclComm*>& registry() {
  static auto* r = new std::set<const ncclComm*>();
  return *r;
}

// The calling thread's working lists, kept from call to call so that a call on one
// communicator, or a group of them issued in one thread, allocates nothing once the thread
// has made one like it (groups that span threads or communicators that block still make
// their jobs and promises). runGroup is never re-entered in a thread: nothing it runs
// calls enqueue or groupEnd. The lists keep the largest group's capacity.
struct GroupScratch {
  std::vector<ncclComm*> comms;
  std::vector<std::vector<Operation>> calls;             // calls[k]: comms[k]'s; more may be kept
  std::vector<std::pair<ncclComm*, Operation>> single;   // enqueue() outside a group
  std::vector<std::pair<ncclComm*, Operation>> grouped;  // groupEnd()'s, swapped with tlsGroup.ops
};
GroupScratch& groupScratch() {
  thread_local GroupScratch scratch;
  return scratch;
}

Status runGroup(std::vector<std::pair<ncclComm*, Operation>>& ops) {
  // Order of first appearance, keeping each communicator's calls in order (a group
  // holds a few communicators: a linear search is the cheapest map).
  GroupScratch& scratch = groupScratch();
  std::vector<ncclComm*>& comms = scratch.comms;
  std::vector<std::vector<Operation>>& calls = scratch.calls;
  comms.clear();
  for (auto& [c, op] : ops) {
    size_t k = std::find(comms.begin(), comms.end(), c) - comms.begin();
    if (k == comms.size()) {
      comms.push_back(c);
      if (calls.size() < comms.size()) calls.emplace_back();
      calls[k].clear();
    }
    calls[k].push_back(op);
  }
  for (ncclComm* c : comms) c->impl->enter();
  static std::atomic<uint64_t> groups{0};
  const uint64_t group = ++groups;
  for (size_t k = 0; k < comms.size(); ++k) comms[k]->impl->postGroup(group, calls[k]);
  Status result;
  // What the calls need made (network plans, connections, scratch memory), for every
  // communicator before any of them launches: made between two kernels of the group that
  // wait for each other, it could stall the GPU for good (Communicator::prepare). A failure
  // runs none of the group: nothing is enqueued that would wait for the failed rank.
  size_t failed = comms.size();
  for (size_t k = 0; k < comms.size() && result; ++k) {
    result = comms[k]->impl->prepare(calls[k]);
    if (!result) failed = k;
  }
  if (!result) {
    // The group's other communicators fail too: their peers would otherwise wait for calls
    // that never come, and their next calls would meet the peers' earlier ones.
    for (size_t k = 0; k < comms.size(); ++k) {
      comms[k]->impl->dropGroup();
      if (k != failed) {
        (void)comms[k]->impl->failWith(
            Status(result.code(), "rank " + std::to_string(comms[k]->impl->rank()) +
                                      ": the group was not run: rank " +
                                      std::to_string(comms[failed]->impl->rank()) +
                                      " of a communicator in the same group could not prepare its "
                                      "calls: " +
                                      result.message()));
      }
      comms[k]->impl->leave();
    }
    return result;
  }
  // GPU mesh operations only enqueue work on streams: they never wait on a peer in the
  // calling thread, so several communicators' calls need no worker each (below: launch
  // threads, or one after another in this thread).
  bool inline_ = comms.size() == 1;
  if (!inline_) {
    inline_ = true;
    for (size_t k = 0; k < comms.size(); ++k) {
      inline_ = inline_ && comms[k]->impl->enqueuesOnly(calls[k]);
    }
  }
  if (inline_ && comms.size() > 1 && comms[0]->impl->launchThreads()) {
    // Each rank's launches cost the host a few microseconds: issue them at once, the
    // first in this thread and the others in their communicators' launch threads.
    struct Job {
      ncclComm* comm;
      const std::vector<Operation>* ops;
      Status result;
    };
    std::vector<Job> jobs(comms.size());
    for (size_t i = 0; i < comms.size(); ++i) jobs[i] = {comms[i], &calls[i], Status()};
    for (size_t i = 1; i < comms.size(); ++i) {
      // One pointer: the closure fits in std::function without an allocation.
      comms[i]->impl->launcher().post(
          [j = &jobs[i]] { j->result = j->comm->impl->execute(*j->ops); });
    }
    jobs[0].result = comms[0]->impl->execute(calls[0]);
    for (size_t i = 1; i < comms.size(); ++i) comms[i]->impl->launcher().wait();
    for (const Job& j : jobs) {
      if (!j.result && result) result = j.result;
    }
  } else if (inline_) {
    for (size_t k = 0; k < comms.size(); ++k) {
      Status st = comms[k]->impl->execute(calls[k]);
      if (!st && result) result = st;
    }
  } else {
    std::vector<std::promise<Status>> promises(comms.size());
    std::vector<std::future<Status>> futures;
    for (auto& p : promises) futures.push_back(p.get_future());
    for (size_t i = 0; i < comms.size(); ++i) {
      comms[i]->impl->executeAsync(calls[i],
                                   [&promises, i](Status st) { promises[i].set_value(st); });
    }
    for (auto& f : futures) {
      Status st = f.get();
      if (!st && result) result = st;
    }
  }
  for (ncclComm* c : comms) c->impl->leave();
  return result;
}

}  // namespace

void registerComm(ncclComm* c) {
  std::lock_guard<std::mutex> lock(registryMutex);
  registry().insert(c);
}

bool unregisterComm(ncclComm* c) {
  std::lock_guard<std::mutex> lock(registryMutex);
  return registry().erase(c) != 0;
}

bool CommHold::take(const ncclComm* c) {
  release();
  if (!c) return false;
  std::lock_guard<std::mutex> lock(registryMutex);
  if (registry().count(c) == 0 || c->magic != kCommMagic) return false;
  comm_ = c->impl.get();
  comm_->enter();
  return true;
}

void CommHold::release() {
  if (comm_) comm_->leave();
  comm_ = nullptr;
}

CommHold& CommHold::operator=(CommHold&& o) noexcept {
  if (this != &o) {
    release();
    comm_ = o.comm_;
    o.comm_ = nullptr;
  }
  return *this;
}

// The process's last error, for threads that made no failing call themselves (PyTorch's
// watchdog asks ncclGetLastError after ncclCommGetAsyncError said the communicator failed).
std::mutex lastErrorMutex;
std::string& processLastError() {
  static auto* s = new std::string();
  return *s;
}

ncclResult_t fail(const Status& st) {
  tlsLastError = st.message();
  {
    std::lock_guard<std::mutex> lock(lastErrorMutex);
    processLastError() = st.message();
  }
  // A call that fails inside a group fails the group too (as NCCL's ncclGroupEnd does).
  if (tlsGroup.depth > 0 && tlsGroup.error) tlsGroup.error = st;
  LOOM_WARN(kColl, "%s", st.message().c_str());
  return toNccl(st.code());
}

const char* lastError(const ncclComm* comm) {
  if (!tlsLastError.empty()) return tlsLastError.c_str();
  // The communicator's own failure (a collective that failed, seen by another thread), else
  // the process's last error: copied, since other threads may change them meanwhile.
  thread_local std::string copy;
  CommHold hold;
  if (comm && hold.take(comm)) {
    copy = comm->impl->lastFailure();
    if (!copy.empty()) return copy.c_str();
  }
  std::lock_guard<std::mutex> lock(lastErrorMutex);
  copy = processLastError();
  return copy.c_str();
}
void clearLastError() {
  tlsLastError.clear();
}

void groupStart() {
  ++tlsGroup.depth;
}

void deferInit(ncclComm* handle, std::function<Status()> init) {
  auto p = std::make_unique<PendingInit>();
  p->handle = handle;
  PendingInit* raw = p.get();
  p->thread = std::thread([raw, init = std::move(init)] { raw->result = init(); });
  tlsGroup.inits.push_back(std::move(p));
}
bool inGroup() {
  return tlsGroup.depth > 0;
}
int groupDepth() {
  return tlsGroup.depth;
}

namespace {

// The group's deferred inits, waited for: each registered, or freed with its error (the
// first is returned).
Status joinInits() {
  Status initError;
  auto inits = std::move(tlsGroup.inits);
  tlsGroup.inits.clear();
  for (auto& p : inits) {
    p->thread.join();
    if (p->result) {
      registerComm(p->handle);
    } else {
      if (initError) initError = p->result;
      delete p->handle;
    }
  }
  return initError;
}

}  // namespace

ncclResult_t groupSimulateEnd(float* estimatedUs) {
  if (tlsGroup.depth <= 0) {
    return fail(
        errorf(Code::kInvalidUsage, "ncclGroupSimulateEnd without a matching ncclGroupStart"));
  }
  if (tlsGroup.depth > 1) {
    return fail(
        errorf(Code::kInvalidUsage,
               "ncclGroupSimulateEnd ends the outermost group only (this one is %d deep); the "
               "group is still open",
               tlsGroup.depth));
  }
  --tlsGroup.depth;
  Status initError = joinInits();
  std::vector<std::pair<ncclComm*, Operation>> ops;
  ops.swap(tlsGroup.ops);  // estimated, never run
  Status pending = tlsGroup.error;
  tlsGroup.error = Status();
  if (!initError) return fail(initError);
  if (!pending) return fail(pending);
  // Each communicator's calls run one after another, the communicators side by side.
  std::vector<std::pair<const ncclComm*, double>> perComm;
  for (auto& entry : ops) {
    // (Not a structured binding: clang before 16 cannot capture one in the lambda below.)
    ncclComm* c = entry.first;
    const Operation& op = entry.second;
    CommHold h;
    if (!h.take(c)) {
      return fail(
          errorf(Code::kInvalidArgument, "a communicator used in this group was destroyed"));
    }
    const double us = c->impl->estimateUs(op);
    auto it =
        std::find_if(perComm.begin(), perComm.end(), [&](const auto& e) { return e.first == c; });
    if (it == perComm.end()) {
      perComm.emplace_back(c, us);
    } else {
      it->second += us;
    }
  }
  double longest = 0;
  for (const auto& e : perComm) longest = std::max(longest, e.second);
  *estimatedUs = static_cast<float>(longest);
  return ncclSuccess;
}

ncclResult_t groupEnd() {
  if (tlsGroup.depth <= 0) {
    return fail(errorf(Code::kInvalidUsage, "ncclGroupEnd without a matching ncclGroupStart"));
  }
  if (--tlsGroup.depth > 0) return ncclSuccess;
  Status initError = joinInits();
  // Swapped, not moved: the next group's list gets this one's capacity back.
  std::vector<std::pair<ncclComm*, Operation>>& ops = groupScratch().grouped;
  ops.clear();
  ops.swap(tlsGroup.ops);
  Status pending = tlsGroup.error;
  tlsGroup.error = Status();
  if (!initError) return fail(initError);
  if (!pending) return fail(pending);
  if (ops.empty()) return ncclSuccess;
  // Every communicator of the group stays held until it has run: a concurrent abort
  // unregisters it first, and then waits for these holds to end.
  std::vector<CommHold> holds;
  std::vector<const ncclComm*> held;
  for (auto& [c, op] : ops) {
    if (std::find(held.begin(), held.end(), c) != held.end()) continue;
    CommHold h;
    if (!h.take(c)) {
      return fail(
          errorf(Code::kInvalidArgument, "a communicator used in this group was destroyed"));
    }
    held.push_back(c);
    holds.push_back(std::move(h));
  }
  Status st = runGroup(ops);
  return st ? ncclSuccess : fail(st);
}

ncclResult_t enqueue(ncclComm* comm, const Operation& op) {
  if (tlsGroup.depth > 0) {
    tlsGroup.ops.emplace_back(comm, op);
    return ncclSuccess;
  }
  std::vector<std::pair<ncclComm*, Operation>>& ops = groupScratch().single;
  ops.clear();
  ops.emplace_back(comm, op);
  Status st = runGroup(ops);
  return st ? ncclSuccess : fail(st);
}

}  // namespace loom::comm
