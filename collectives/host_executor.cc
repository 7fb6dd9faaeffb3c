#include "collectives/host_executor.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/log.h"

namespace loom::collectives {

void schedulePeers(const Schedule& schedule, std::vector<int>* sendPeers,
                   std::vector<int>* recvPeers) {
  sendPeers->clear();
  recvPeers->clear();
  for (const auto& phase : schedule.phases) {
    for (const auto& st : phase) {
      if (st.count == 0 && !st.empty) continue;
      for (int i = 0; i < st.nsend; ++i) sendPeers->push_back(st.sendPeers[i]);
      for (int i = 0; i < st.nrecv; ++i) recvPeers->push_back(st.recvPeers[i]);
    }
  }
  for (auto* v : {sendPeers, recvPeers}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
}

std::string describe(const ExecArgs& args) {
  if (!args.what.empty()) return args.what;
  char text[160];
  std::snprintf(text, sizeof(text), "%s(%s, %zu x %s)", collTypeName(args.coll),
                algorithmName(args.algo), args.count, dataTypeName(args.type));
  return text;
}

namespace {

// How a thread waits for peers: spin `spinUs`, then sched_yield() until kYieldUs, then
// block (poll() on the sockets, or short sleeps for memory transports). Yielding before
// blocking matters most when ranks outnumber cores (4 ranks on 2 cores): a yielding rank
// hands the core to a peer that has work, yet stays runnable, so the data it waits for is
// picked up at the next turn instead of after a wake-up from poll(). Measured on the
// 2-core VM, 4 ranks over TCP: 8-byte all-reduce 150-200 us blocking in poll() at once,
// 70-80 us yielding first (docs/decisions.md). After kYieldUs a rank that still waits
// is waiting on something slow, and blocks so that it costs nothing.
constexpr int64_t kYieldUs = 2000;
// After this long without progress, a rank waiting on memory transports sleeps 500 us
// between looks: a wait that long is a peer that is slow or stuck, and half a millisecond
// more on it costs nothing.
constexpr int64_t kDozeUs = 50000;
// How many pieces ahead a receiving step offers its destination to the connection.
constexpr size_t kClaimDepth = 4;

void waitForPeers(int64_t idleUs, int64_t spinUs, std::vector<pollfd>* fds) {
  if (idleUs < spinUs) {
    cpuRelax();
  } else if (idleUs < kYieldUs) {
    sched_yield();
  } else if (!fds->empty()) {
    ::poll(fds->data(), fds->size(), 1);
  } else {
    // Memory offers nothing to poll: short sleeps, and longer ones once the wait is long
    // enough to be a stuck or slow peer (20 us sleeps cost ~0.15 cores doing nothing).
    std::this_thread::sleep_for(std::chrono::microseconds(idleUs < kDozeUs ? 20 : 500));
  }
}

struct StepState {
  const Step* step = nullptr;
  size_t pieces = 0;
  size_t done = 0;
  size_t claimed = 0;       // pieces up to this one were offered to claimRecv (intoMemory steps)
  bool intoMemory = false;  // received pieces land straight in dst (see claimAhead)
  transport::SendConnection* send[kMaxStepPeers] = {};
  transport::RecvConnection* recv[kMaxStepPeers] = {};
  // The turn queues (Scratch::queues) of the connections this step uses.
  int queues[2 * kMaxStepPeers];
  int nqueues = 0;
  bool finished() const { return done == pieces; }
};

// Steps of a phase that share a connection take it in phase order: `steps` lists them,
// `turn` indexes the one whose turn it is.
struct TurnQueue {
  int key = 0;  // (peer << 1) | isSend
  std::vector<size_t> steps;
  size_t turn = 0;
};

// What a run needs besides the schedule, kept per thread so that a small collective
// allocates nothing once its thread has run one like it (the vectors keep their
// capacity; runSchedule is never re-entered on one thread).
struct Scratch {
  std::vector<StepState> states;
  std::vector<TurnQueue> queues;  // the first `nqueues` are in use
  size_t nqueues = 0;
  std::vector<transport::SendConnection*> activeSends;
  // Send connections of this call's earlier phases whose data has not all left this
  // process yet (a socket that took part of a piece): driven until flushed, while the
  // later phases run.
  std::vector<transport::SendConnection*> lingering;
  std::vector<transport::RecvConnection*> activeRecvs;
  // The connections checkHealth asks about (those with something still to move).
  std::vector<transport::SendConnection*> checkSends;
  std::vector<transport::RecvConnection*> checkRecvs;
  std::vector<pollfd> fds;
  std::vector<int> sendPeers, recvPeers;
};

Scratch& threadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

class PhaseRunner {
 public:
  PhaseRunner(const ExecArgs& a, ConnectionProvider& c, Scratch& scratch)
      : args_(a),
        conns_(c),
        states_(scratch.states),
        queues_(scratch.queues),
        nqueues_(scratch.nqueues),
        activeSends_(scratch.activeSends),
        lingering_(scratch.lingering),
        activeRecvs_(scratch.activeRecvs),
        checkSends_(scratch.checkSends),
        checkRecvs_(scratch.checkRecvs),
        fds_(scratch.fds) {
    esize_ = dataTypeSize(a.type);
    pieceElems_ = std::max<size_t>(1, a.pieceBytes / esize_);
    // The scratch outlives calls: nothing of an earlier call's (its connections may be
    // gone) carries into this one; the call's end flushes every send connection.
    activeSends_.clear();
    activeRecvs_.clear();
    lingering_.clear();
  }

  Status run(const Phase& phase) {
    LOOM_TRY(setUp(phase));
    // The clock is read only once nothing moves: `lastProgress` is when the loop first
    // found nothing to do since it last moved data (a small call never reads it; a read
    // costs about 25 ns in this VM, a tenth of an 8-byte call on one rank).
    bool idle = false;
    Clock::time_point lastProgress{}, lastCheck{};
    while (true) {
      bool progressed = false;
      bool allDone = true;
      for (size_t i = 0; i < states_.size(); ++i) {
        StepState& s = states_[i];
        if (s.finished()) continue;
        allDone = false;
        if (!eligible(i)) continue;
        // A few pieces at a time, so that the other steps of the phase move too.
        for (int burst = 0; burst < 4 && !s.finished(); ++burst) {
          // A step that reads what an earlier one of this rank writes waits for its piece.
          if (s.step->after >= 0 && states_[s.step->after].done <= s.done) break;
          LOOM_ASSIGN_OR_RETURN(bool moved, advance(s));
          if (!moved) break;
          progressed = true;
        }
        if (s.finished()) retire(i);
      }
      if (allDone) return Status::ok();
      if (progressed) {
        idle = false;
        continue;
      }
      // Nothing moved: let the transports work (a socket whose step is not its turn yet
      // still gets read into free slots, so poll() does not keep reporting it), then wait
      // politely.
      for (auto* sc : activeSends_) LOOM_TRY(sc->progress());
      for (auto* rc : activeRecvs_) LOOM_TRY(rc->progress());
      LOOM_TRY(driveLingering());
      Clock::time_point now = Clock::now();
      if (!idle) {
        idle = true;
        lastProgress = now;
        if (lastCheck == Clock::time_point{}) lastCheck = now;
      }
      auto idleUs =
          std::chrono::duration_cast<std::chrono::microseconds>(now - lastProgress).count();
      fds_.clear();
      if (idleUs >= kYieldUs && allPollable_) {
        for (auto* sc : activeSends_) sc->addPollFds(&fds_);
        for (auto* rc : activeRecvs_) rc->addPollFds(&fds_);
        for (auto* sc : lingering_) sc->addPollFds(&fds_);
      }
      waitForPeers(idleUs, args_.spinUs, &fds_);
      if (now - lastCheck > std::chrono::milliseconds(100)) {
        lastCheck = now;
        LOOM_TRY(checkHealth(now, lastProgress));
      }
    }
  }

 private:
  // A phase's sends are done when handed to their connections, which may still hold
  // part of the data (a socket that took part of a piece). The peer waiting for it may
  // be the one this rank waits on in the next phase (recursive doubling over shaped
  // links deadlocked so, each rank waiting on the next with the data it needed stuck in
  // the last one's connection): keep pushing them until they are flushed.
  Status driveLingering() {
    for (size_t k = 0; k < lingering_.size();) {
      LOOM_TRY(lingering_[k]->progress());
      if (lingering_[k]->flushed()) {
        lingering_[k] = lingering_.back();
        lingering_.pop_back();
      } else {
        ++k;
      }
    }
    return Status::ok();
  }

  Status setUp(const Phase& phase) {
    // The last phase's connections that still hold data carry over.
    for (auto* sc : activeSends_) {
      if (!sc->flushed()) addUnique(&lingering_, sc);
    }
    states_.clear();
    states_.resize(phase.size());
    nqueues_ = 0;
    activeSends_.clear();
    activeRecvs_.clear();
    for (size_t i = 0; i < phase.size(); ++i) {
      StepState& s = states_[i];
      s.step = &phase[i];
      s.pieces = s.step->empty ? 1 : (s.step->count + pieceElems_ - 1) / pieceElems_;
      if (s.pieces == 0) continue;
      for (int j = 0; j < s.step->nsend; ++j) {
        int p = s.step->sendPeers[j];
        s.send[j] = conns_.sendConnection(p);
        if (!s.send[j]) return errorf(Code::kInternalError, "no send connection to rank %d", p);
        s.queues[s.nqueues++] = queueFor((p << 1) | 1, i);
        addUnique(&activeSends_, s.send[j]);
      }
      for (int j = 0; j < s.step->nrecv; ++j) {
        int p = s.step->recvPeers[j];
        s.recv[j] = conns_.recvConnection(p);
        if (!s.recv[j]) return errorf(Code::kInternalError, "no recv connection from rank %d", p);
        s.queues[s.nqueues++] = queueFor(p << 1, i);
        addUnique(&activeRecvs_, s.recv[j]);
      }
      s.intoMemory = receivesIntoMemory(s);
    }
    // Blocking in poll() is only a safe way to wait when every connection is a socket;
    // memory transports offer nothing to poll, so then we yield instead.
    allPollable_ = true;
    for (auto* sc : activeSends_) allPollable_ = allPollable_ && sc->pollable();
    for (auto* sc : lingering_) allPollable_ = allPollable_ && sc->pollable();
    for (auto* rc : activeRecvs_) allPollable_ = allPollable_ && rc->pollable();
    return Status::ok();
  }

  // The queue of connection `key` (taking a free one for a new key), with step i appended.
  int queueFor(int key, size_t i) {
    size_t q = 0;
    while (q < nqueues_ && queues_[q].key != key) ++q;
    if (q == nqueues_) {
      if (q == queues_.size()) queues_.emplace_back();
      queues_[q].key = key;
      queues_[q].steps.clear();
      queues_[q].turn = 0;
      ++nqueues_;
    }
    queues_[q].steps.push_back(i);
    return static_cast<int>(q);
  }

  template <typename T>
  static void addUnique(std::vector<T*>* v, T* p) {
    if (std::find(v->begin(), v->end(), p) == v->end()) v->push_back(p);
  }

  // Steps sharing a connection use it in phase order.
  bool eligible(size_t i) const {
    const StepState& s = states_[i];
    for (int k = 0; k < s.nqueues; ++k) {
      const TurnQueue& q = queues_[s.queues[k]];
      if (q.steps[q.turn] != i) return false;
    }
    return true;
  }

  void retire(size_t i) {
    StepState& s = states_[i];
    for (int k = 0; k < s.nqueues; ++k) {
      TurnQueue& q = queues_[s.queues[k]];
      if (q.turn < q.steps.size() && q.steps[q.turn] == i) ++q.turn;
    }
    s.nqueues = 0;
  }

  char* bufferAt(const Region& r) const {
    switch (r.buffer) {
      case Buffer::kInput:
        return const_cast<char*>(static_cast<const char*>(args_.input)) + r.offset * esize_;
      case Buffer::kOutput: return static_cast<char*>(args_.output) + r.offset * esize_;
      case Buffer::kAbsolute: return reinterpret_cast<char*>(r.offset);
      default: return nullptr;
    }
  }

  // Moves one piece of step `s` if every slot it needs is ready.
  Result<bool> advance(StepState& s) {
    const Step& st = *s.step;
    void* sendSlot[kMaxStepPeers] = {};
    const void* recvData[kMaxStepPeers] = {};
    size_t first = s.done * pieceElems_;
    size_t elems = std::min(pieceElems_, st.count - first);
    size_t bytes = elems * esize_;
    if (s.intoMemory) claimAhead(s);
    for (int j = 0; j < st.nrecv; ++j) {
      size_t got = 0;
      LOOM_ASSIGN_OR_RETURN(const void* p, s.recv[j]->tryRecv(&got));
      if (!p) {
        waitingOn_ = st.recvPeers[j];
        waitingSend_ = false;
        return false;
      }
      if (got != bytes) {
        return errorf(Code::kInvalidUsage,
                      "rank %d sent %zu bytes where %zu were expected: the ranks called "
                      "different operations or counts",
                      st.recvPeers[j], got, bytes);
      }
      recvData[j] = p;
    }
    for (int j = 0; j < st.nsend; ++j) {
      LOOM_ASSIGN_OR_RETURN(void* p, s.send[j]->trySendSlot());
      if (!p) {
        waitingOn_ = st.sendPeers[j];
        waitingSend_ = true;
        return false;
      }
      sendSlot[j] = p;
    }
    const char* src = st.src.buffer == Buffer::kNone ? nullptr : bufferAt(st.src) + first * esize_;
    char* dst = st.dst.buffer == Buffer::kNone ? nullptr : bufferAt(st.dst) + first * esize_;
    if (const char* ready = sendFromMemory(s, src, dst, recvData, elems)) {
      for (int j = 0; j < st.nsend; ++j) LOOM_TRY(s.send[j]->postSendFrom(ready, bytes));
    } else {
      char* target = st.nsend > 0 ? static_cast<char*>(sendSlot[0]) : dst;
      if (target && elems > 0) {
        compute(st, target, src, recvData, elems);
        if (dst && dst != target) std::memcpy(dst, target, bytes);
        for (int j = 1; j < st.nsend; ++j) std::memcpy(sendSlot[j], target, bytes);
      }
      for (int j = 0; j < st.nsend; ++j) LOOM_TRY(s.send[j]->postSend(bytes));
    }
    for (int j = 0; j < st.nrecv; ++j) LOOM_TRY(s.recv[j]->releaseRecv());
    ++s.done;
    return true;
  }

  // A step that copies what it receives, unchanged, into its destination (an all-gather
  // or broadcast hop, an all-reduce's gather half) and sends only from memory: sockets
  // copy out of the kernel anyway, so its pieces may land in the destination directly
  // (compute then finds the data in place and copies nothing). Only the step whose turn
  // it is on the connection claims, and only its own pieces, up to kClaimDepth ahead of
  // the one it is on. This relies on no other step of the phase reading this step's
  // destination (true of every schedule in schedules.cc; a schedule that breaks it must
  // not use such steps).
  bool receivesIntoMemory(const StepState& s) const {
    const Step& st = *s.step;
    if (st.nrecv != 1 || st.src.buffer != Buffer::kNone || st.dst.buffer == Buffer::kNone)
      return false;
    if (!s.recv[0]->recvsIntoMemory()) return false;
    if (args_.schedule->reduces && st.final && hasPostOp(args_.op)) return false;
    for (int j = 0; j < st.nsend; ++j) {
      if (!s.send[j]->sendsFromMemory()) return false;
    }
    return true;
  }
  void claimAhead(StepState& s) {
    if (s.claimed < s.done) s.claimed = s.done;
    const Step& st = *s.step;
    while (s.claimed < s.pieces && s.claimed - s.done < kClaimDepth) {
      const size_t first = s.claimed * pieceElems_;
      const size_t bytes = std::min(pieceElems_, st.count - first) * esize_;
      // Refused: it is already arriving in the ring (or the ring is shorter), and is
      // copied from there as usual.
      s.recv[0]->claimRecv(s.claimed - s.done, bufferAt(st.dst) + first * esize_, bytes);
      ++s.claimed;
    }
  }

  // Sockets copy into the kernel anyway, so when the piece's result lies in user memory
  // (the step has a destination, or sends its source unchanged) they send it from there
  // rather than through a slot: one memcpy less per piece. Computes the piece into dst
  // where it needs computing. Returns where the result is, or null to use the slots.
  const char* sendFromMemory(const StepState& s, const char* src, char* dst,
                             const void* const* recvData, size_t elems) {
    const Step& st = *s.step;
    if (st.nsend == 0 || elems == 0) return nullptr;
    for (int j = 0; j < st.nsend; ++j) {
      if (!s.send[j]->sendsFromMemory()) return nullptr;
    }
    if (dst) {
      compute(st, dst, src, recvData, elems);
      return dst;
    }
    const bool reduces = args_.schedule->reduces;
    const bool unchanged =
        !reduces || ((st.srcPartial || !hasPreOp(args_.op)) && !(st.final && hasPostOp(args_.op)));
    return src && st.nrecv == 0 && unchanged ? src : nullptr;
  }

  void compute(const Step& st, char* target, const char* src, const void* const* recv,
               size_t elems) {
    const size_t bytes = elems * esize_;
    const Schedule& sch = *args_.schedule;
    if (sch.reduces) {
      int r0 = 0;
      if (src && st.nrecv > 0) {
        if (st.srcPartial) {
          reduce(args_.type, args_.op, target, src, recv[0], elems);
        } else {
          reduceWithLocal(args_.type, args_.op, target, src, recv[0], elems);
        }
        r0 = 1;
      } else if (src) {
        if (!st.srcPartial) {
          applyPreOp(args_.type, args_.op, target, src, elems);
        } else if (target != src) {
          std::memcpy(target, src, bytes);
        }
      } else if (st.nrecv > 0) {
        if (target != recv[0]) std::memcpy(target, recv[0], bytes);
        r0 = 1;
      }
      for (int j = r0; j < st.nrecv; ++j)
        reduce(args_.type, args_.op, target, target, recv[j], elems);
      if (st.final && hasPostOp(args_.op)) applyPostOp(args_.type, args_.op, target, target, elems);
    } else {
      const void* from = src ? static_cast<const void*>(src) : recv[0];
      if (from && from != target) std::memcpy(target, from, bytes);
    }
  }

  Status checkHealth(Clock::time_point now, Clock::time_point lastProgress) {
    if (args_.abortFlag && args_.abortFlag->load(std::memory_order_relaxed)) {
      return errorf(Code::kSystemError, "%s on rank %d: aborted by ncclCommAbort",
                    describe(args_).c_str(), args_.rank);
    }
    // A peer matters while this rank still has something to move with it: a step not
    // finished, or data still in a send connection. One that did its part and exited (its
    // last data delivered) fails nothing here; a rank still waiting on a peer that waited
    // on it would have heard from that one first.
    checkSends_.clear();
    checkRecvs_.clear();
    for (const StepState& s : states_) {
      if (s.finished()) continue;
      for (int j = 0; j < s.step->nsend; ++j) addUnique(&checkSends_, s.send[j]);
      for (int j = 0; j < s.step->nrecv; ++j) addUnique(&checkRecvs_, s.recv[j]);
    }
    for (auto* sc : activeSends_) {
      if (!sc->flushed()) addUnique(&checkSends_, sc);
    }
    for (auto* sc : lingering_) addUnique(&checkSends_, sc);
    for (auto* sc : checkSends_) {
      Status st = sc->checkPeer();
      if (!st) return st.withContext(describe(args_) + " on rank " + std::to_string(args_.rank));
    }
    for (auto* rc : checkRecvs_) {
      Status st = rc->checkPeer();
      if (!st) return st.withContext(describe(args_) + " on rank " + std::to_string(args_.rank));
    }
    auto idleMs = std::chrono::duration_cast<std::chrono::milliseconds>(now - lastProgress).count();
    if (args_.timeoutMs >= 0 && idleMs > args_.timeoutMs) {
      return errorf(
          Code::kRemoteError,
          "%s on rank %d: no progress for %lld ms while %s rank %d (LOOM_TIMEOUT_MS=%lld); "
          "that rank may be stuck, dead, or calling a different operation",
          describe(args_).c_str(), args_.rank, (long long)idleMs,
          waitingSend_ ? "sending to" : "receiving from", waitingOn_, (long long)args_.timeoutMs);
    }
    return Status::ok();
  }

  const ExecArgs& args_;
  ConnectionProvider& conns_;
  size_t esize_ = 1;
  size_t pieceElems_ = 1;
  std::vector<StepState>& states_;
  std::vector<TurnQueue>& queues_;
  size_t& nqueues_;
  std::vector<transport::SendConnection*>& activeSends_;
  std::vector<transport::SendConnection*>& lingering_;
  std::vector<transport::RecvConnection*>& activeRecvs_;
  std::vector<transport::SendConnection*>& checkSends_;
  std::vector<transport::RecvConnection*>& checkRecvs_;
  std::vector<pollfd>& fds_;
  bool allPollable_ = false;
  int waitingOn_ = -1;
  bool waitingSend_ = false;
};

}  // namespace

Status runSchedule(const ExecArgs& args, ConnectionProvider& conns) {
  const Schedule& sch = *args.schedule;
  Scratch& scratch = threadScratch();
  std::vector<int>& sendPeers = scratch.sendPeers;
  std::vector<int>& recvPeers = scratch.recvPeers;
  schedulePeers(sch, &sendPeers, &recvPeers);
  LOOM_TRY(conns.ensureConnected(sendPeers, recvPeers));
  PhaseRunner runner(args, conns, scratch);
  for (const auto& phase : sch.phases) {
    Status st = runner.run(phase);
    if (!st) {
      // Claimed slots point into the caller's buffers, which may go away now.
      for (int p : recvPeers) {
        if (transport::RecvConnection* rc = conns.recvConnection(p)) rc->dropClaims();
      }
      return st;
    }
  }
  // Everything posted must have left this process before the call returns: nobody
  // drives these connections between operations.
  // (The clocks are read only for a connection that is not flushed at once.)
  std::vector<pollfd>& fds = scratch.fds;
  std::optional<Deadline> deadline;
  for (int p : sendPeers) {
    transport::SendConnection* sc = conns.sendConnection(p);
    if (sc->flushed()) continue;
    if (!deadline) deadline = Deadline::afterMs(args.timeoutMs, args.abortFlag);
    const Clock::time_point start = Clock::now();
    while (!sc->flushed()) {
      LOOM_TRY(sc->progress());
      if (sc->flushed()) break;
      auto idleUs =
          std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
      fds.clear();
      if (idleUs >= kYieldUs) sc->addPollFds(&fds);
      waitForPeers(idleUs, args.spinUs, &fds);
      if (deadline->aborted() || deadline->expired()) {
        return errorf(Code::kRemoteError, "%s on rank %d: rank %d is not draining its connection",
                      describe(args).c_str(), args.rank, p);
      }
    }
  }
  return Status::ok();
}

}  // namespace loom::collectives
