// The NCCL entry points the perf binaries call, as a table of function pointers: one table for
// the libnccl the binary is linked against (loom's), and one for a second NCCL loaded with
// dlopen for `--compare nccl[=PATH]` (NVIDIA's). The harness and the collective specs call
// only through a table, so the same code measures either library.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nccl.h"

namespace loom::perf {

struct NcclApi {
  std::string label;  // "loom" (the linked library) or "NCCL" (--compare): headings, messages
  std::string path;   // the file dlopen'd; empty for the linked library

  // Present in every NCCL the harness supports (2.12 on); loading fails without them.
  ncclResult_t (*getVersion)(int* version) = nullptr;
  ncclResult_t (*getUniqueId)(ncclUniqueId* id) = nullptr;
  ncclResult_t (*commInitRank)(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) = nullptr;
  ncclResult_t (*commInitAll)(ncclComm_t* comms, int ndev, const int* devlist) = nullptr;
  ncclResult_t (*commDestroy)(ncclComm_t comm) = nullptr;
  ncclResult_t (*commAbort)(ncclComm_t comm) = nullptr;
  ncclResult_t (*commGetAsyncError)(ncclComm_t comm, ncclResult_t* error) = nullptr;
  const char* (*getErrorString)(ncclResult_t result) = nullptr;
  ncclResult_t (*groupStart)() = nullptr;
  ncclResult_t (*groupEnd)() = nullptr;
  ncclResult_t (*allReduce)(const void* send, void* recv, size_t count, ncclDataType_t type,
                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*allGather)(const void* send, void* recv, size_t count, ncclDataType_t type,
                            ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*broadcast)(const void* send, void* recv, size_t count, ncclDataType_t type,
                            int root, ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*reduce)(const void* send, void* recv, size_t count, ncclDataType_t type,
                         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*reduceScatter)(const void* send, void* recv, size_t count, ncclDataType_t type,
                                ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*send)(const void* buf, size_t count, ncclDataType_t type, int peer,
                       ncclComm_t comm, cudaStream_t stream) = nullptr;
  ncclResult_t (*recv)(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                       cudaStream_t stream) = nullptr;
  ncclResult_t (*redOpCreatePreMulSum)(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                       ncclScalarResidence_t residence, ncclComm_t comm) = nullptr;
  ncclResult_t (*redOpDestroy)(ncclRedOp_t op, ncclComm_t comm) = nullptr;

  // Added to NCCL later; nullptr where the library lacks them (the harness then does without:
  // no finalize before destroy, no last-error text, grouped send/recv for alltoall, gather and
  // scatter, no -R).
  ncclResult_t (*commFinalize)(ncclComm_t comm) = nullptr;  // 2.14
  const char* (*getLastError)(ncclComm_t comm) = nullptr;   // 2.13
  ncclResult_t (*alltoAll)(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) = nullptr;  // 2.28
  ncclResult_t (*gather)(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                         ncclComm_t comm, cudaStream_t stream) = nullptr;  // 2.28
  ncclResult_t (*scatter)(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                          ncclComm_t comm, cudaStream_t stream) = nullptr;  // 2.28
  ncclResult_t (*commRegister)(const ncclComm_t comm, void* buff, size_t size,
                               void** handle) = nullptr;  // 2.19
  ncclResult_t (*commDeregister)(const ncclComm_t comm, void* handle) = nullptr;
  ncclResult_t (*commWindowRegister)(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                     int flags) = nullptr;  // 2.27
  ncclResult_t (*commWindowDeregister)(ncclComm_t comm, ncclWindow_t win) = nullptr;

  // getLastError's text, or "" where the library has none.
  std::string lastError() const;
};

// The table of the libnccl the binary is linked against. Built once; thread-safe.
const NcclApi& linkedNccl();

// What the default search of `--compare nccl` reads from the process, so that a test can give
// made-up values (tcmalloc style: the reader is a parameter).
struct NcclSearchEnv {
  std::string ncclHome;     // $NCCL_HOME
  std::string pythonPath;   // $PYTHONPATH (':'-separated)
  std::string home;         // $HOME
  std::string virtualEnv;   // $VIRTUAL_ENV
  std::string condaPrefix;  // $CONDA_PREFIX
  // The existing paths matching a glob(3) pattern, sorted; none when nothing matches.
  std::function<std::vector<std::string>(const std::string& pattern)> glob;
};

// The process's environment and glob(3).
NcclSearchEnv processSearchEnv();

// Where `--compare nccl` (no path) looks for libnccl.so.2, in order, as glob patterns:
// $NCCL_HOME/lib, python packages' nvidia/nccl/lib (the nvidia-nccl-cu* wheels) under
// $PYTHONPATH, $VIRTUAL_ENV, $CONDA_PREFIX, ~/.local and the usual system and /opt prefixes,
// then /usr/lib/x86_64-linux-gnu and /usr/local/cuda/lib64. Pure.
std::vector<std::string> ncclSearchPatterns(const NcclSearchEnv& env);

// The files those patterns match, in order, without repeats.
std::vector<std::string> ncclCandidates(const NcclSearchEnv& env);

struct NcclLoad {
  std::unique_ptr<NcclApi> api;    // null on failure
  std::string error;               // on failure: what was tried and why each failed
  std::vector<std::string> notes;  // on success: things worth a "# " line (skipped candidates)
};

// Loads a second NCCL for `--compare nccl[=PATH]`: `path` when not empty, otherwise the first
// of ncclCandidates(env) that loads, with dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND) so
// that its calls to its own nccl* functions do not resolve to the linked library's exports.
// A candidate that turns out to be the linked library (same ncclGetVersion address: dlopen
// returned the copy already loaded) is skipped; an explicit `path` to it is accepted with a
// note (the tests compare loom with itself on a second set of communicators). The library is
// never unloaded (its threads may outlive the run).
NcclLoad loadCompareNccl(const std::string& path, const NcclSearchEnv& env, const NcclApi& linked);

}  // namespace loom::perf
