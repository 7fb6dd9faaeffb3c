// The few CUDA runtime calls the perf binaries make, loaded with dlopen so that one binary
// runs with or without CUDA. Error codes are cudaError_t values (0 is success).
#pragma once

#include <cstddef>
#include <string>

#include "nccl.h"  // cudaStream_t (opaque when CUDA's headers are absent)

namespace loom::perf {

struct CudaApi {
  int (*getDeviceCount)(int* count);
  int (*setDevice)(int device);
  int (*malloc)(void** ptr, size_t bytes);
  int (*free)(void* ptr);
  int (*memcpy)(void* dst, const void* src, size_t bytes, int kind);
  int (*memset)(void* ptr, int value, size_t bytes);
  int (*streamCreateWithFlags)(cudaStream_t* stream, unsigned int flags);
  int (*streamDestroy)(cudaStream_t stream);
  int (*streamSynchronize)(cudaStream_t stream);
  int (*streamQuery)(cudaStream_t stream);
  int (*deviceSynchronize)();
  const char* (*getErrorString)(int error);
  int (*deviceGetPCIBusId)(char* busId, int len, int device);
  int (*getDeviceProperties)(void* prop, int device);  // only the leading name[256] is read
  // CUDA graphs (-G); graphs and executable graphs are opaque pointers.
  int (*streamBeginCapture)(cudaStream_t stream, int mode);
  int (*streamEndCapture)(cudaStream_t stream, void** graph);
  int (*graphInstantiateWithFlags)(void** exec, void* graph, unsigned long long flags);
  int (*graphLaunch)(void* exec, cudaStream_t stream);
  int (*graphDestroy)(void* graph);
  int (*graphExecDestroy)(void* exec);

  static constexpr int kMemcpyDefault = 4;
  static constexpr int kErrorNotReady = 600;
  static constexpr unsigned int kStreamNonBlocking = 1;
  static constexpr int kCaptureModeThreadLocal = 1;
};

// The CUDA runtime, or nullptr when libcudart cannot be loaded. Loaded once; thread-safe.
const CudaApi* cudaApi();
// Number of CUDA devices (0 when there is no runtime, no driver or no device).
int cudaDeviceCount();
// "cudaErrorX: text" for messages.
std::string cudaErrorText(int error);

}  // namespace loom::perf
