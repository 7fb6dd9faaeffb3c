// Buffer registration (ncclCommRegister) on GPU communicators whose ranks live in several
// processes of one host. A registered buffer's allocation is exported once (its CUDA IPC
// handle on the post board, transports/p2p/post_board.h); each call that can read the
// peers' inputs where they lie posts where its own input lies, and a peer maps the
// allocation the first time a post names it. Registration stays local, as NCCL's: a rank
// registers what it likes, and a call takes a registered form only when every rank whose
// input is read posted one for it, which the post board lets every rank see alike.
//
// Ranks of one process already read each other's buffers through peer access (the
// one-process forms), so there a registration is accepted and kept, without effect.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstring>

#include "collectives/device/cuda_executor.h"
#include "common/cuda_probe.h"
#include "common/log.h"

namespace loom::collectives::device {

Result<void*> CudaExecutor::registerBuffer(void* buff, size_t bytes) {
  auto reg = std::make_unique<Registration>();
  reg->begin = reinterpret_cast<uintptr_t>(buff);
  reg->end = reg->begin + bytes;
  std::lock_guard<std::mutex> lock(regMutex_);
  cuda::Allocation a;
  const bool device = bytes > 0 && cuda::allocationOf(buff, &a);
  if (board_ && device && a.legacyIpc && reg->end <= a.base + a.bytes) {
    // One export per allocation, shared by the registrations inside it.
    for (size_t i = 0; i < exports_.size(); ++i) {
      ExportRef& x = exports_[i];
      if (x.refs > 0 && x.base == a.base && x.bufferId == a.bufferId) {
        ++x.refs;
        reg->exportIndex = static_cast<int>(i);
        break;
      }
    }
    if (reg->exportIndex < 0) {
      DeviceGuard guard(device_);
      cudaIpcMemHandle_t handle;
      cudaError_t e = cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(a.base));
      uint64_t generation = 0;
      int entry = -1;
      if (e != cudaSuccess) {
        cudaGetLastError();
        LOOM_INFO(kInit,
                  "rank %d: ncclCommRegister(%p, %zu): cudaIpcGetMemHandle failed (%s); "
                  "registered without effect",
                  rank_, buff, bytes, cudaErrorText(e).c_str());
      } else {
        static_assert(sizeof(handle) == transport::p2p::kHandleBytes, "IPC handle size");
        entry = board_->publish(a.base, a.bytes, reinterpret_cast<const unsigned char*>(&handle),
                                &generation);
        if (entry < 0 && !warnedExportsFull_) {
          warnedExportsFull_ = true;  // once: an allocator hook may register many more
          LOOM_WARN(kInit,
                    "rank %d: ncclCommRegister(%p, %zu): %d allocations are registered "
                    "already (the most loom shares with its peers at once); this one and any "
                    "further ones are kept without effect until some are deregistered",
                    rank_, buff, bytes, transport::p2p::kExportSlots);
        }
      }
      if (entry >= 0) {
        size_t slot = exports_.size();
        for (size_t i = 0; i < exports_.size(); ++i) {
          if (exports_[i].refs == 0) slot = i;
        }
        if (slot == exports_.size()) exports_.emplace_back();
        exports_[slot] = ExportRef{a.base, a.bytes, a.bufferId, entry, generation, 1};
        reg->exportIndex = static_cast<int>(slot);
        board_->want();
      }
    }
  } else {
    LOOM_INFO(kInit, "rank %d: ncclCommRegister(%p, %zu): kept without effect (%s)", rank_, buff,
              bytes,
              !board_        ? "the ranks are not in several processes of one GPU mesh"
              : !device      ? "not device memory"
              : !a.legacyIpc ? "not cudaMalloc memory, which CUDA IPC exports"
                             : "the range runs past its allocation");
  }
  void* handle = reg.get();
  registrations_.push_back(std::move(reg));
  return handle;
}

Status CudaExecutor::deregisterBuffer(void* handle) {
  std::lock_guard<std::mutex> lock(regMutex_);
  for (size_t i = 0; i < registrations_.size(); ++i) {
    if (registrations_[i].get() != handle) continue;
    const int x = registrations_[i]->exportIndex;
    if (x >= 0 && --exports_[x].refs == 0) board_->retire(exports_[x].entry);
    registrations_.erase(registrations_.begin() + static_cast<long>(i));
    return Status::ok();
  }
  return errorf(Code::kInvalidArgument,
                "handle %p was not returned by ncclCommRegister on this communicator (or was "
                "deregistered already)",
                handle);
}

Result<char*> CudaExecutor::importedBase(int r, uint32_t entry, uint64_t generation) {
  Import& im = imports_[{r, entry}];
  if (im.base && im.generation == generation) return im.base;
  transport::p2p::Export x;
  if (!board_->read(r, static_cast<int>(entry), generation, &x)) {
    return errorf(Code::kInvalidUsage,
                  "rank %d deregistered the buffer it posted for this call before the call ran "
                  "here (deregister only after the calls that use a buffer completed)",
                  r);
  }
  if (im.base) {
    // The entry now holds another allocation: the old mapping goes first.
    LOOM_TRY(closeImport(im));
  }
  // Every rank is a process of its own (the board exists only then): CUDA IPC.
  cudaIpcMemHandle_t handle;
  std::memcpy(&handle, x.handle, sizeof(handle));
  void* p = nullptr;
  cudaError_t e = cudaIpcOpenMemHandle(&p, handle, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return errorf(Code::kCudaError,
                  "mapping rank %d's registered buffer of %llu bytes "
                  "(cudaIpcOpenMemHandle) failed: %s",
                  r, (unsigned long long)x.bytes, cudaErrorText(e).c_str());
  }
  im.base = static_cast<char*>(p);
  im.opened = true;
  im.bytes = x.bytes;
  im.generation = generation;
  LOOM_INFO(kColl, "rank %d: mapped rank %d's registered allocation of %llu bytes", rank_, r,
            (unsigned long long)x.bytes);
  return im.base;
}

Result<char*> CudaExecutor::postedAt(int r, uint32_t entry, uint64_t generation, uint64_t offset,
                                     size_t bytes, const char* what) {
  LOOM_ASSIGN_OR_RETURN(char* base, importedBase(r, entry, generation));
  const uint64_t size = imports_[{r, entry}].bytes;
  if (offset + bytes > size) {
    return errorf(Code::kInvalidUsage,
                  "rank %d posted an %s of %zu bytes at offset %llu of a registered "
                  "allocation of %llu bytes",
                  r, what, bytes, (unsigned long long)offset, (unsigned long long)size);
  }
  return base + offset;
}

Status CudaExecutor::closeImport(Import& im) {
  if (im.opened) {
    if (importsInGraph_) {
      // A CUDA graph captured a call that read peers' allocations and may be replayed
      // (the last call may have been outside it): kept until the end.
      staleImports_.push_back(im.base);
    } else if (const cudaEvent_t last = lastEagerEvent()) {
      // Our calls so far, which may read it, are done first.
      LOOM_TRY(cudaStatus(cudaEventSynchronize(last), "cudaEventSynchronize"));
      cudaIpcCloseMemHandle(im.base);
    } else {
      cudaIpcCloseMemHandle(im.base);
    }
  }
  im = Import{};
  return Status::ok();
}

Status CudaExecutor::pruneImports() {
  for (auto it = imports_.begin(); it != imports_.end();) {
    transport::p2p::Export x;
    if (board_->read(it->first.first, static_cast<int>(it->first.second), it->second.generation,
                     &x)) {
      ++it;
      continue;
    }
    LOOM_TRY(closeImport(it->second));
    it = imports_.erase(it);
  }
  return Status::ok();
}

void CudaExecutor::closeImports() {
  for (auto& [key, im] : imports_) {
    if (im.opened && im.base) cudaIpcCloseMemHandle(im.base);
  }
  imports_.clear();
  for (char* p : staleImports_) cudaIpcCloseMemHandle(p);
  staleImports_.clear();
  if (board_) {
    for (const ExportRef& x : exports_) {
      if (x.refs > 0) board_->retire(x.entry);
    }
  }
  cudaGetLastError();
}

Result<int> CudaExecutor::registeredInputs(const Operation& op, const PullRequest& req,
                                           dev::PullInputs* in) {
  DeviceGuard guard(device_);  // the mappings go to our GPU, whatever the thread's current one
  size_t bytes = 0, outBytes = 0;
  callBytes(op, nranks_, &bytes, &outBytes);
  const int reader = req.reader;
  const auto begin = reinterpret_cast<uintptr_t>(op.sendbuff);
  transport::p2p::Post mine;
  // What the call is: a rank that numbered its calls otherwise fails here, not in a kernel.
  mine.signature = (uint64_t(op.type) << 56) ^ (uint64_t(op.dtype) << 48) ^
                   (uint64_t(uint32_t(op.root)) << 40) ^ (uint64_t(uint32_t(op.ncclOp)) << 32) ^
                   op.count;
  // The registered allocation that holds [ptr, ptr + n): its export entry, generation and
  // the offset of ptr in it. False when none does.
  auto find = [&](const void* ptr, size_t n, uint32_t* entry, uint64_t* generation,
                  uint64_t* offset) {
    const auto at = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(regMutex_);
    for (const auto& reg : registrations_) {
      if (reg->exportIndex < 0 || at < reg->begin || at + n > reg->end) continue;
      const ExportRef& x = exports_[reg->exportIndex];
      // Freed and allocated again at the same address since it was registered: not ours to share.
      if (cuda::bufferIdOf(ptr) != x.bufferId) continue;
      *entry = static_cast<uint32_t>(x.entry);
      *generation = x.generation;
      *offset = at - x.base;
      return true;
    }
    return false;
  };
  mine.readable = find(op.sendbuff, bytes, &mine.entry, &mine.generation, &mine.offset) ? 1 : 0;
  const auto out = reinterpret_cast<uintptr_t>(op.recvbuff);
  const bool allReduce = reader < 0 && req.source < 0 && req.layout < 0;
  if (req.layout >= 0) {
    // The caller checked that peers may read our input while we write our output.
    if (req.layout == 0) mine.readable = 0;
  } else if (allReduce && mine.readable && out < begin + bytes && begin < out + bytes) {
    // An all-reduce's peers read our input while we write our output: apart (readable 1),
    // or the very same buffer (the two-shot form in place, which writes each element only
    // after reading it: readable 2); a partial overlap takes neither.
    mine.readable = out == begin ? 2 : 0;
  }
  // An all-reduce whose output lies apart in registered memory too: the peers may write
  // their parts of it (the two-shot form out of place).
  if (allReduce && mine.readable == 1 &&
      find(op.recvbuff, outBytes, &mine.outEntry, &mine.outGeneration, &mine.outOffset)) {
    mine.writable = 1;
  }
  auto stop = [this] { return reinterpret_cast<volatile int*>(hostFlags_)[0] != 0; };
  LOOM_ASSIGN_OR_RETURN(bool active,
                        board_->exchange(boardSeq_++, mine, &posts_, timeoutMs_, stop));
  if (!active) return 0;
  for (int r = 0; r < nranks_; ++r) {
    if (posts_[r].signature != mine.signature) {
      return errorf(Code::kInvalidUsage,
                    "rank %d: rank %d's call %llu on this communicator is another collective "
                    "(type, count, type of data, root or op differ): every rank must issue the "
                    "same collectives in the same order",
                    rank_, r, (unsigned long long)(boardSeq_ - 1));
    }
  }
  // The form: a reduce's root reads every other rank's input, a broadcast every rank its
  // root's, the copies every rank every input (1); an all-reduce takes the two-shot form
  // when every rank's output is its input (2) or when every rank's output is apart and
  // registered (3), the one-shot form when every rank's output is apart (1), the kernels
  // otherwise.
  int form = 0;
  bool writable = allReduce;
  for (int r = 0; r < nranks_; ++r) {
    if (r == reader || (req.source >= 0 && r != req.source)) continue;
    const int k = allReduce ? static_cast<int>(posts_[r].readable) : (posts_[r].readable ? 1 : 0);
    if (k == 0 || (form != 0 && k != form)) return 0;
    form = k;
    writable = writable && posts_[r].writable;
  }
  if (form == 0) return 0;
  if (form == 1 && writable) form = 3;
  in->inputs[rank_] = op.sendbuff;
  in->outputs[rank_] = op.recvbuff;
  if (reader >= 0 && reader != rank_) return form;  // only the reader maps the inputs
  if (req.source == rank_) return form;             // nobody's input is read but ours
  // Every rank decided on the registered form, so the peers' kernels will wait for ours.
  Status st = pruneImports();
  for (int r = 0; r < nranks_ && st; ++r) {
    if (r == rank_ || (req.source >= 0 && r != req.source)) continue;
    const transport::p2p::Post& post = posts_[r];
    auto input = postedAt(r, post.entry, post.generation, post.offset, bytes, "input");
    if (!input) {
      st = input.status();
      continue;
    }
    in->inputs[r] = input.value();
    if (form != 3) continue;
    auto output =
        postedAt(r, post.outEntry, post.outGeneration, post.outOffset, outBytes, "output");
    if (!output) {
      st = output.status();
      continue;
    }
    in->outputs[r] = output.value();
  }
  if (!st) {
    dev::PullInputs none;
    none.writer = dev::kMaxRanks;  // nobody reads or writes
    dev::MeshCall call;
    call.type = op.dtype;
    call.count = op.count;
    // One-shot forms: a kernel that takes part in the handshakes lets the peers finish
    // right (they read our input, which is valid). The two-shot forms' peers would wait
    // for a part that we cannot reduce: nothing is launched, and they fail after
    // LOOM_TIMEOUT_MS instead of returning wrong values.
    if (form == 1) launchPull(call, none, op.stream, "taking part only: this rank failed").ignore();
    return st;
  }
  return form;
}

}  // namespace loom::collectives::device
