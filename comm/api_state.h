// State shared by the C API entry points: the live-communicator registry, the calling
// thread's group and its last error.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "nccl.h"

// The opaque handle behind ncclComm_t.
struct ncclComm {
  uint64_t magic;
  std::unique_ptr<loom::comm::Communicator> impl;
};

namespace loom::comm {

inline constexpr uint64_t kCommMagic = 0x6c6f6f6d636f6d6dull;

// Registry of live handles, so a destroyed or bogus communicator is an error, not a crash.
void registerComm(ncclComm* c);
// False when `c` was not registered (never, or another thread unregistered it first).
bool unregisterComm(ncclComm* c);

// A hold on a live communicator for the length of one API call. It is taken under the
// registry's lock, so once ncclCommAbort or ncclCommDestroy has unregistered a
// communicator no call can take a new hold on it, and they free it only after every
// hold has ended (Communicator::waitIdle). A call that dereferences a communicator
// does so only while it holds one (a check followed by a separate enter() left a window
// in which another thread's abort freed it: a crash under PyTorch's watchdog).
class CommHold {
 public:
  CommHold() = default;
  CommHold(CommHold&& o) noexcept : comm_(o.comm_) { o.comm_ = nullptr; }
  CommHold& operator=(CommHold&& o) noexcept;
  CommHold(const CommHold&) = delete;
  CommHold& operator=(const CommHold&) = delete;
  ~CommHold() { release(); }
  // Takes a hold on `c`; false (and nothing held) when it is not a live communicator.
  bool take(const ncclComm* c);
  void release();
  explicit operator bool() const { return comm_ != nullptr; }

 private:
  Communicator* comm_ = nullptr;
};

// Records `st` as this thread's last error and the process's (and logs it at WARN), fails
// the thread's group if it is in one, and returns its code.
ncclResult_t fail(const Status& st);
// ncclGetLastError: this thread's last error; if it has none, `comm`'s last failure (null
// or not live: skipped), else the process's last error.
const char* lastError(const ncclComm* comm = nullptr);
void clearLastError();

// Groups.
void groupStart();
bool inGroup();
int groupDepth();
ncclResult_t groupEnd();
// Ends the outermost group without running its calls: `estimatedUs` gets the cost
// model's time for them (each communicator's calls in turn, the communicators at once).
ncclResult_t groupSimulateEnd(float* estimatedUs);
// Runs `init` on its own thread now; the outermost ncclGroupEnd waits for it, registers
// `handle` on success and frees it (returning the error) on failure.
void deferInit(ncclComm* handle, std::function<Status()> init);
// Queues (in a group) or runs (outside) one operation.
ncclResult_t enqueue(ncclComm* comm, const Operation& op);

}  // namespace loom::comm
