// A stand-in libnccl.so.2 for the --compare tests: every call succeeds and no collective
// writes its output, so the harness's checker must report the compared library's results
// as wrong (while loom's, measured in the same run, stay right). Host memory only.
#include <cstring>

#include "nccl.h"

namespace {

struct FakeComm {
  int rank;
  int nranks;
};

ncclComm_t makeComm(int rank, int nranks) {
  return reinterpret_cast<ncclComm_t>(new FakeComm{rank, nranks});
}

}  // namespace

// Default visibility (the project builds without -fvisibility=hidden), C names.
extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  *version = 99999;
  return ncclSuccess;
}
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof *id);
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId, int rank) {
  *comm = makeComm(rank, nranks);
  return ncclSuccess;
}
ncclResult_t ncclCommInitAll(ncclComm_t* comms, int n, const int*) {
  for (int i = 0; i < n; ++i) comms[i] = makeComm(i, n);
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete reinterpret_cast<FakeComm*>(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return ncclCommDestroy(comm);
}
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* error) {
  *error = ncclSuccess;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t) {
  return "wrong_nccl error";
}
ncclResult_t ncclGroupStart() {
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  return ncclSuccess;
}
ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                           cudaStream_t) {
  return ncclSuccess;
}
ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) {
  return ncclSuccess;
}
ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                           cudaStream_t) {
  return ncclSuccess;
}
ncclResult_t ncclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t,
                        cudaStream_t) {
  return ncclSuccess;
}
ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                               cudaStream_t) {
  return ncclSuccess;
}
ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return ncclSuccess;
}
ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) {
  return ncclSuccess;
}
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void*, ncclDataType_t, ncclScalarResidence_t,
                                      ncclComm_t) {
  *op = static_cast<ncclRedOp_t>(ncclNumOps);
  return ncclSuccess;
}
ncclResult_t ncclRedOpDestroy(ncclRedOp_t, ncclComm_t) {
  return ncclSuccess;
}

}  // extern "C"
