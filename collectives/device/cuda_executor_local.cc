// The forms for ranks that all live in one process (ncclCommInitAll, `-g N`) and whose calls
// meet in one group: every rank sees the others' buffers through the Clique, so a rank can
// read its peers' inputs (the pulled all-reduce), let the copy engines write straight into
// their outputs (broadcast, all-gather, all-to-all), or push its input in chunks to the
// rank that reduces them (the chunked reduce and all-reduce, collectives/device/chunk_plan.h).
#include <algorithm>
#include <cstring>

#include "collectives/device/cuda_executor.h"
#include "common/cuda_probe.h"
#include "common/log.h"

namespace loom::collectives::device {

// One Clique per communicator (its token agreed at init), shared by its ranks here.
std::shared_ptr<Clique> cliqueFor(uint64_t token, int nranks) {
  static std::mutex mutex;
  static auto* all = new std::map<uint64_t, std::weak_ptr<Clique>>();
  std::lock_guard<std::mutex> lock(mutex);
  for (auto it = all->begin(); it != all->end();)
    it = it->second.expired() ? all->erase(it) : std::next(it);
  auto& slot = (*all)[token];
  auto c = slot.lock();
  if (!c) {
    c = std::make_shared<Clique>(nranks);
    slot = c;
  }
  return c;
}

bool CudaExecutor::peerBuffers(const Operation& op, size_t index,
                               std::vector<dev::RankBuffers>* all, bool* inputsMapped,
                               bool* outputsMapped, bool* anyCaptured) {
  if (!clique_ || group_ == 0) return false;
  all->assign(nranks_, {});
  if (inputsMapped) *inputsMapped = true;
  if (outputsMapped) *outputsMapped = true;
  if (anyCaptured) *anyCaptured = false;
  std::lock_guard<std::mutex> lock(clique_->mutex);
  for (int r = 0; r < nranks_; ++r) {
    if (clique_->group[r] != group_ || index >= clique_->calls[r].size()) return false;
    const Clique::Call& c = clique_->calls[r][index];
    if (c.type != op.type || c.count != op.count || c.dtype != op.dtype || c.root != op.root ||
        c.ncclOp != op.ncclOp) {
      return false;
    }
    (*all)[r] = {c.in, c.out};
    if (inputsMapped) *inputsMapped = *inputsMapped && c.inMapped;
    if (outputsMapped) *outputsMapped = *outputsMapped && c.outMapped;
    if (anyCaptured) *anyCaptured = *anyCaptured || c.captured;
  }
  return true;
}

Status CudaExecutor::failCliqueOn(Status st) {
  if (!st && clique_) {
    std::lock_guard<std::mutex> lock(clique_->mutex);
    for (volatile int* f : clique_->abortFlags) {
      if (f) *f = 1;
    }
  }
  return st;
}

bool CudaExecutor::outputsApart(const std::vector<dev::RankBuffers>& all, size_t bytes) {
  for (const auto& o : all) {
    auto out = reinterpret_cast<uintptr_t>(o.out);
    for (const auto& i : all) {
      auto in = reinterpret_cast<uintptr_t>(i.in);
      if (in < out + bytes && out < in + bytes) return false;
    }
  }
  return true;
}

bool CudaExecutor::rootOutputApart(const std::vector<dev::RankBuffers>& all, int root,
                                   size_t bytes) {
  auto out = reinterpret_cast<uintptr_t>(all[root].out);
  for (size_t r = 0; r < all.size(); ++r) {
    auto in = reinterpret_cast<uintptr_t>(all[r].in);
    if (static_cast<int>(r) == root && in == out) continue;
    if (in < out + bytes && out < in + bytes) return false;
  }
  return true;
}

bool CudaExecutor::allInPlace(const std::vector<dev::RankBuffers>& all) {
  for (const auto& b : all) {
    if (b.in != b.out) return false;
  }
  return true;
}

Status CudaExecutor::launchPull(const dev::MeshCall& call, const dev::PullInputs& in,
                                cudaStream_t stream, const char* form, bool twoShot) {
  DeviceGuard guard(device_);
  LOOM_ASSIGN_OR_RETURN(const bool cap, capturing(stream));
  LOOM_TRY(order(stream, cap));
  if (log::enabled(log::kInfo, log::kColl)) {
    const int at = in.writer >= 0 ? in.writer : rank_;
    const bool inPlace = twoShot && in.outputs[at] == in.inputs[at];
    LOOM_INFO(kColl, "GPU pulled %s %s%s: %zu x %s (%s)", twoShot ? "two-shot" : "one-shot",
              in.writer < 0 ? "all-reduce" : "reduce", inPlace ? " in place" : "", call.count,
              dataTypeName(call.type), form);
  }
  const int e = twoShot ? dev::launchPullTwoShot(ctx_, call, in, stream)
                        : dev::launchPullAllReduce(ctx_, call, in, stream);
  LOOM_TRY(launchStatus(e, in.writer < 0 ? "the pulled all-reduce" : "the pulled reduce"));
  return recordDone(stream, cap);
}

Status CudaExecutor::launchCopies(const dev::MeshCall& call,
                                  const std::vector<dev::CopyStep>& steps, cudaStream_t stream,
                                  const char* form) {
  DeviceGuard guard(device_);
  LOOM_ASSIGN_OR_RETURN(const bool cap, capturing(stream));
  LOOM_TRY(order(stream, cap));
  if (log::enabled(log::kInfo, log::kColl)) {
    LOOM_INFO(kColl, "GPU copy-engine %s: %zu x %s, %zu copies (%s)", dev::meshKindName(call.kind),
              call.count, dataTypeName(call.type), steps.size(), form);
  }
  auto barrier = [&]() {
    return launchStatus(dev::launchMeshBarrier(ctx_, stream), "the mesh barrier");
  };
  LOOM_TRY(barrier());
  bool local = false;
  for (const auto& s : steps) local = local || s.peer == rank_;
  // A side stream that joined a capture stays in it until the capture ends: while it
  // does, local copies go on the caller's stream instead.
  LOOM_ASSIGN_OR_RETURN(const bool sideCapturing, capturing(side_));
  local = local && !sideCapturing;
  if (local) {
    LOOM_TRY(cudaStatus(cudaEventRecord(forkEvent_, stream), "cudaEventRecord"));
    LOOM_TRY(cudaStatus(cudaStreamWaitEvent(side_, forkEvent_, 0), "cudaStreamWaitEvent"));
  }
  for (const auto& s : steps) {
    LOOM_TRY(cudaStatus(cudaMemcpyAsync(s.dst, s.src, s.bytes, cudaMemcpyDefault,
                                        local && s.peer == rank_ ? side_ : stream),
                        "cudaMemcpyAsync (copy-engine collective)"));
  }
  if (local) {
    LOOM_TRY(cudaStatus(cudaEventRecord(sideEvent_, side_), "cudaEventRecord"));
    LOOM_TRY(cudaStatus(cudaStreamWaitEvent(stream, sideEvent_, 0), "cudaStreamWaitEvent"));
  }
  LOOM_TRY(barrier());
  return recordDone(stream, cap);
}

std::vector<void*> CudaExecutor::chunkScratch() {
  std::lock_guard<std::mutex> lock(clique_->mutex);
  if (clique_->scratchFailed) return {};
  if (!clique_->scratch[0]) {
    const size_t bytes = dev::kChunkSlots * size_t(nranks_ - 1) * limits_.chunkMax;
    for (int r = 0; r < nranks_; ++r) {
      DeviceGuard guard(clique_->devices[r]);
      if (cudaMalloc(&clique_->scratch[r], bytes) != cudaSuccess) {
        cudaGetLastError();
        clique_->scratch[r] = nullptr;
        LOOM_WARN(kColl,
                  "GPU %d: no %zu bytes of device memory for the chunked all-reduce and reduce "
                  "(LOOM_P2P_CE_SCRATCH_BYTES): the kernels do them instead",
                  clique_->devices[r], bytes);
        for (void*& p : clique_->scratch) {
          if (p) {
            DeviceGuard g(clique_->devices[&p - clique_->scratch.data()]);
            cudaFree(p);
            p = nullptr;
          }
        }
        clique_->scratchFailed = true;
        return {};
      }
    }
    void* mirror = nullptr;
    void* mirrorDevice = nullptr;
    const size_t mirrorBytes = sizeof(uint64_t) * dev::kMaxRanks * dev::kMaxRanks;
    if (cudaHostAlloc(&mirror, mirrorBytes, cudaHostAllocPortable | cudaHostAllocMapped) ==
            cudaSuccess &&
        cudaHostGetDevicePointer(&mirrorDevice, mirror, 0) == cudaSuccess) {
      std::memset(mirror, 0, mirrorBytes);
      clique_->freeMirror = static_cast<uint64_t*>(mirror);
      clique_->freeMirrorDevice = static_cast<uint64_t*>(mirrorDevice);
    } else {
      if (mirror) cudaFreeHost(mirror);
      cudaGetLastError();  // the waits then always run on the GPU
    }
    LOOM_INFO(kColl, "chunked all-reduce and reduce: %zu bytes of scratch on each GPU", bytes);
  }
  return clique_->scratch;
}

Status CudaExecutor::launchChunked(const Operation& op, const dev::MeshCall& call,
                                   const std::vector<dev::RankBuffers>& all,
                                   const std::vector<void*>& scratch) {
  DeviceGuard guard(device_);
  cudaStream_t stream = op.stream;
  LOOM_TRY(order(stream, false));
  const bool gather = op.type == collectives::CollType::kAllReduce;
  const size_t es = dataTypeSize(op.dtype);
  const int n = nranks_, me = rank_;
  // Chunks as large as a slot for reduce (on the H200 pair, at 2-64 MiB 1, 2 and 4 MiB
  // chunks were all slower than one chunk: each chunk's copy, counter and kernel cost more
  // than the overlap gains); at most 64 MiB for all-reduce (at 8 GiB: 373 GB/s with
  // 64 MiB chunks, 365 with 128, 353 with 32). LOOM_P2P_CE_CHUNK_BYTES sets them, to measure.
  // All-reduce cuts each peer's scratch into 4 slots where they hold 64 MiB, so a push
  // waits for the reduction of the chunk four before it, not two, and a waiting kernel
  // comes every second chunk (8 GiB: 375.9-376.4 GB/s against 369.5-373.4,
  // docs/perf/h200x2.md, session 7).
  const int slots = gather ? limits_.allReduceSlots : static_cast<int>(dev::kChunkSlots);
  const size_t region =
      dev::kChunkSlots * limits_.chunkMax;  // each peer's part of an owner's scratch
  const size_t slotBytes = region / static_cast<size_t>(slots) / (64 * 1024) * (64 * 1024);
  size_t chunkBytes = gather ? std::min(slotBytes, dev::kChunkAllReduceBytes) : slotBytes;
  if (limits_.chunkSize > 0) chunkBytes = std::min(limits_.chunkSize, slotBytes);
  const dev::ChunkPlan plan(op.count, es, n, gather ? -1 : op.root, chunkBytes);
  if (log::enabled(log::kInfo, log::kColl)) {
    LOOM_INFO(kColl,
              "GPU chunked %s: %zu x %s, %zu chunks of our segment (copy engines, ranks of one "
              "process, size >= %s)",
              gather ? "all-reduce" : "reduce", op.count, dataTypeName(op.dtype), plan.chunks(me),
              gather ? "LOOM_P2P_CE_ALLREDUCE_BYTES" : "LOOM_P2P_CE_REDUCE_BYTES");
  }
  const auto* in = static_cast<const char*>(op.sendbuff);
  auto* out = static_cast<char*>(op.recvbuff);
  auto cuda = [](cudaError_t e, const char* what) { return cudaStatus(e, what); };
  auto slot = [&](int owner, int from, uint64_t m) {
    return static_cast<char*>(scratch[owner]) + dev::chunkOffset(owner, from, m, n, slots, region);
  };
  // Counters the driver would not write by a stream memory operation, written by one
  // kernel after the copies (the owner only reads the counter, so each rank may choose).
  dev::ChunkFlags pending;
  bool anyPending = false;
  auto flush = [&]() -> Status {
    if (!anyPending) return Status::ok();
    anyPending = false;
    LOOM_TRY(launchStatus(dev::launchChunkFlags(ctx_, pending, pushStream_), "the chunk counters"));
    pending = dev::ChunkFlags();
    return Status::ok();
  };
  using K = dev::ChunkStep::Kind;
  // The counters advance only once the whole call is enqueued.
  dev::ChunkCounters next = chunkCounters_;
  for (const dev::ChunkStep& s : dev::chunkProgram(plan, me, gather, slots, &next)) {
    if (s.kind != K::kSignalReady) LOOM_TRY(flush());
    switch (s.kind) {
      case K::kFork:  // the pushes read our input: after our stream's earlier work
        LOOM_TRY(cuda(cudaEventRecord(forkEvent_, stream), "cudaEventRecord"));
        LOOM_TRY(cuda(cudaStreamWaitEvent(pushStream_, forkEvent_, 0), "cudaStreamWaitEvent"));
        break;
      case K::kWaitFree: {
        // Slots whose owners already wrote them free (the mirror) need no wait on the GPU:
        // in steady state none do, and each waiting kernel between two copies costs the
        // push stream a few microseconds (the counters only grow, so this cannot be wrong).
        const uint64_t* mirror = clique_->freeMirror;
        bool needed = false;
        for (int p = 0; p < n; ++p) {
          if (s.wait[p] == 0) continue;
          needed = needed || !mirror ||
                   __atomic_load_n(mirror + me * dev::kMaxRanks + p, __ATOMIC_ACQUIRE) < s.wait[p];
        }
        if (!needed) break;
        dev::ChunkFlags wait;
        for (int p = 0; p < n; ++p) wait.wait[p] = s.wait[p];
        LOOM_TRY(
            launchStatus(dev::launchChunkFlags(ctx_, wait, pushStream_), "the chunk counters"));
        break;
      }
      case K::kPush:
        LOOM_TRY(cuda(cudaMemcpyAsync(slot(s.peer, me, s.m), in + s.begin * es, s.count * es,
                                      cudaMemcpyDefault, pushStream_),
                      "cudaMemcpyAsync (chunk to its owner)"));
        break;
      case K::kSignalReady: {
        int e = memopOk_
                    ? cuda::streamWriteValue64(
                          pushStream_, dev::chunkFlag(ctx_, s.peer, dev::kChunkReady, me), s.m + 1)
                    : -1;
        if (e != 0) {
          if (e > 0) {
            LOOM_WARN(kColl,
                      "GPU %d: cuStreamWriteValue64 failed (CUDA driver error %d): the chunk "
                      "counters are written by a kernel from now on",
                      device_, e);
          }
          memopOk_ = false;
          pending.signal[s.peer] = s.m + 1;
          anyPending = true;
        }
        break;
      }
      case K::kWaitReduced:
        LOOM_TRY(cuda(cudaStreamWaitEvent(pushStream_, chunkEvent_, 0), "cudaStreamWaitEvent"));
        break;
      case K::kGather:
        LOOM_TRY(
            cuda(cudaMemcpyAsync(static_cast<char*>(all[s.peer].out) + s.begin * es,
                                 out + s.begin * es, s.count * es, cudaMemcpyDefault, pushStream_),
                 "cudaMemcpyAsync (reduced chunk to a peer)"));
        break;
      case K::kReduce: {
        dev::ChunkReduce r;
        r.type = call.type;
        r.red = call.red;
        r.scalar = call.scalar;
        r.divisor = call.divisor;
        r.out = out + s.begin * es;
        r.count = s.count;
        // All-reduce: each GPU also pushes its chunks out while it reduces; a reduction at
        // full speed (every block) slowed those copies on the H200 pair (busbw at 8 GiB: 357
        // with 64 blocks, 373 with 48, 369 with 32, 139 with 8: too slow to keep up). The
        // root of a reduce only receives: every block (379 GB/s; 272 with 32).
        if (gather) r.maxBlocks = kChunkAllReduceBlocks;
        r.freeMirror = clique_->freeMirrorDevice;
        for (int q = 0; q < n; ++q) {
          if (q == me) {
            r.srcs[q] = in + s.begin * es;
            continue;
          }
          r.srcs[q] = slot(me, q, s.mOf[q]);
          r.wait[q] = r.signal[q] = s.mOf[q] + 1;
        }
        LOOM_TRY(launchStatus(dev::launchChunkReduce(ctx_, r, stream), "the chunk reduction"));
        break;
      }
      case K::kRecordReduced:
        LOOM_TRY(cuda(cudaEventRecord(chunkEvent_, stream), "cudaEventRecord"));
        break;
      case K::kJoin:
        LOOM_TRY(cuda(cudaEventRecord(pushEvent_, pushStream_), "cudaEventRecord"));
        LOOM_TRY(cuda(cudaStreamWaitEvent(stream, pushEvent_, 0), "cudaStreamWaitEvent"));
        break;
      case K::kBarrier:  // every peer's copies into our output have landed after this
        LOOM_TRY(launchStatus(dev::launchMeshBarrier(ctx_, stream), "the mesh barrier"));
        break;
    }
  }
  LOOM_TRY(flush());
  chunkCounters_ = next;
  return recordDone(stream, false);
}

}  // namespace loom::collectives::device
