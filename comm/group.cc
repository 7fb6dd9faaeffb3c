// Groups: calls between ncclGroupStart and ncclGroupEnd are queued per thread and run
// at the outermost ncclGroupEnd. One communicator runs inline in the calling thread.
// Several whose calls only enqueue GPU work run at once, each in its launch thread (the
// first in the calling thread), or one after another with LOOM_LAUNCH_THREADS=0;
// otherwise several (ncclCommInitAll, -g N on host memory) each run on their own worker
// thread at once, since their ranks wait on each other.
#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "comm/api_state.h"
#include "common/log.h"
#include "common/settings.h"

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

Status runGroup(std::vector<std::pair<ncclComm*, Operation>>& ops) {
  // Order of first appearance, keeping each communicator's calls in order.
  std::vector<ncclComm*> comms;
  std::map<ncclComm*, std::vector<Operation>> perComm;
  for (auto& [c, op] : ops) {
    if (!perComm.count(c)) comms.push_back(c);
    perComm[c].push_back(op);
  }
  for (ncclComm* c : comms) c->impl->enter();
  static std::atomic<uint64_t> groups{0};
  const uint64_t group = ++groups;
  for (ncclComm* c : comms) c->impl->postGroup(group, perComm[c]);
  Status result;
  // GPU mesh operations only enqueue work on streams: they never wait on a peer in the
  // calling thread, so several communicators' calls run inline, one after another.
  bool inline_ = comms.size() == 1;
  if (!inline_) {
    inline_ = true;
    for (ncclComm* c : comms) inline_ = inline_ && c->impl->enqueuesOnly(perComm[c]);
  }
  if (inline_ && comms.size() > 1 && settings::getBool("LOOM_LAUNCH_THREADS")) {
    // Each rank's launches cost the host a few microseconds: issue them at once, the
    // first in this thread and the others in their communicators' launch threads.
    std::vector<Status> results(comms.size());
    for (size_t i = 1; i < comms.size(); ++i) {
      ncclComm* c = comms[i];
      c->impl->launcher().post(
          [c, &ops = perComm[c], &st = results[i]] { st = c->impl->execute(ops); });
    }
    results[0] = comms[0]->impl->execute(perComm[comms[0]]);
    for (size_t i = 1; i < comms.size(); ++i) comms[i]->impl->launcher().wait();
    for (const Status& st : results) {
      if (!st && result) result = st;
    }
  } else if (inline_) {
    for (ncclComm* c : comms) {
      Status st = c->impl->execute(perComm[c]);
      if (!st && result) result = st;
    }
  } else {
    std::vector<std::promise<Status>> promises(comms.size());
    std::vector<std::future<Status>> futures;
    for (auto& p : promises) futures.push_back(p.get_future());
    for (size_t i = 0; i < comms.size(); ++i) {
      comms[i]->impl->executeAsync(perComm[comms[i]],
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

void unregisterComm(ncclComm* c) {
  std::lock_guard<std::mutex> lock(registryMutex);
  registry().erase(c);
}

bool isLiveComm(const ncclComm* c) {
  if (!c) return false;
  std::lock_guard<std::mutex> lock(registryMutex);
  return registry().count(c) != 0 && c->magic == kCommMagic;
}

ncclResult_t fail(const Status& st) {
  tlsLastError = st.message();
  LOOM_WARN(kColl, "%s", st.message().c_str());
  return toNccl(st.code());
}

const char* lastError() { return tlsLastError.c_str(); }
void clearLastError() { tlsLastError.clear(); }

void groupStart() { ++tlsGroup.depth; }

void deferInit(ncclComm* handle, std::function<Status()> init) {
  auto p = std::make_unique<PendingInit>();
  p->handle = handle;
  PendingInit* raw = p.get();
  p->thread = std::thread([raw, init = std::move(init)] { raw->result = init(); });
  tlsGroup.inits.push_back(std::move(p));
}
bool inGroup() { return tlsGroup.depth > 0; }
int groupDepth() { return tlsGroup.depth; }

ncclResult_t groupEnd() {
  if (tlsGroup.depth <= 0) {
    return fail(errorf(Code::kInvalidUsage, "ncclGroupEnd without a matching ncclGroupStart"));
  }
  if (--tlsGroup.depth > 0) return ncclSuccess;
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
  auto ops = std::move(tlsGroup.ops);
  tlsGroup.ops.clear();
  Status pending = tlsGroup.error;
  tlsGroup.error = Status();
  if (!initError) return fail(initError);
  if (!pending) return fail(pending);
  if (ops.empty()) return ncclSuccess;
  for (auto& [c, op] : ops) {
    if (!isLiveComm(c)) {
      return fail(errorf(Code::kInvalidArgument, "a communicator used in this group was destroyed"));
    }
  }
  Status st = runGroup(ops);
  return st ? ncclSuccess : fail(st);
}

ncclResult_t enqueue(ncclComm* comm, const Operation& op) {
  if (tlsGroup.depth > 0) {
    tlsGroup.ops.emplace_back(comm, op);
    return ncclSuccess;
  }
  std::vector<std::pair<ncclComm*, Operation>> ops{{comm, op}};
  Status st = runGroup(ops);
  return st ? ncclSuccess : fail(st);
}

}  // namespace loom::comm
