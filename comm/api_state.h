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
void unregisterComm(ncclComm* c);
bool isLiveComm(const ncclComm* c);

// Records `st` as this thread's last error (and logs it at WARN) and returns its code.
ncclResult_t fail(const Status& st);
const char* lastError();
void clearLastError();

// Groups.
void groupStart();
bool inGroup();
int groupDepth();
ncclResult_t groupEnd();
// Runs `init` on its own thread now; the outermost ncclGroupEnd waits for it, registers
// `handle` on success and frees it (returning the error) on failure.
void deferInit(ncclComm* handle, std::function<Status()> init);
// Queues (in a group) or runs (outside) one operation.
ncclResult_t enqueue(ncclComm* comm, const Operation& op);

}  // namespace loom::comm
