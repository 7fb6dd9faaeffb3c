// The table of the libnccl the binary is linked against: the one file of the harness that
// names the nccl* symbols, so everything else can run on either library.
#include "nccl.h"
#include "perf_tests/harness/nccl_api.h"

// Added to NCCL after 2.12; resolved at load time so that the binaries also link against (and
// run on) an older NCCL, which then lacks them (null).
#pragma weak ncclCommFinalize
#pragma weak ncclGetLastError
#pragma weak ncclAlltoAll
#pragma weak ncclCommRegister
#pragma weak ncclCommDeregister
#pragma weak ncclCommWindowRegister
#pragma weak ncclCommWindowDeregister

namespace loom::perf {
namespace {

NcclApi makeLinked() {
  NcclApi api;
  api.label = "loom";
  api.getVersion = &ncclGetVersion;
  api.getUniqueId = &ncclGetUniqueId;
  api.commInitRank = &ncclCommInitRank;
  api.commInitAll = &ncclCommInitAll;
  api.commDestroy = &ncclCommDestroy;
  api.commAbort = &ncclCommAbort;
  api.commGetAsyncError = &ncclCommGetAsyncError;
  api.getErrorString = &ncclGetErrorString;
  api.groupStart = &ncclGroupStart;
  api.groupEnd = &ncclGroupEnd;
  api.allReduce = &ncclAllReduce;
  api.allGather = &ncclAllGather;
  api.broadcast = &ncclBroadcast;
  api.reduce = &ncclReduce;
  api.reduceScatter = &ncclReduceScatter;
  api.send = &ncclSend;
  api.recv = &ncclRecv;
  api.redOpCreatePreMulSum = &ncclRedOpCreatePreMulSum;
  api.redOpDestroy = &ncclRedOpDestroy;
  api.commFinalize = &ncclCommFinalize;
  api.getLastError = &ncclGetLastError;
  api.alltoAll = &ncclAlltoAll;
  api.gather = &ncclGather;
  api.scatter = &ncclScatter;
  api.commRegister = &ncclCommRegister;
  api.commDeregister = &ncclCommDeregister;
  api.commWindowRegister = &ncclCommWindowRegister;
  api.commWindowDeregister = &ncclCommWindowDeregister;
  return api;
}

}  // namespace

const NcclApi& linkedNccl() {
  static const NcclApi api = makeLinked();  // thread-safe initialisation (C++11 statics)
  return api;
}

}  // namespace loom::perf
