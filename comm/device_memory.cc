#include "comm/device_memory.h"

#include "common/cuda_probe.h"
#include "common/log.h"
#include "common/settings.h"

#if LOOM_HAVE_CUDA
#include <cuda_runtime.h>

#include <mutex>
#endif

namespace loom::comm {

bool isDeviceBuffer(const void* p) {
  return cuda::isDevicePointer(p);
}

#if !LOOM_HAVE_CUDA

int currentDevice() {
  return -1;
}
bool copyDeviceToHost(void*, const void*, size_t) {
  return false;
}
void* deviceAlloc(size_t) {
  return nullptr;
}
void deviceFree(void*) {}

#else

int currentDevice() {
  if (settings::get(settings::kDevice) == "cpu") return -1;
  int n = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess || n <= 0) {
    cudaGetLastError();
    // No GPU, or no driver: host memory, as asked of a machine without GPUs. Any other
    // error (a driver older than this runtime, say) is said once, since the communicators
    // then work on host memory where the caller may expect its GPUs.
    static std::once_flag said;
    if (e != cudaSuccess && e != cudaErrorNoDevice && e != cudaErrorInsufficientDriver) {
      std::call_once(said, [e] {
        LOOM_WARN(kInit, "CUDA cannot count the GPUs (%s: %s): communicators use host memory",
                  cudaGetErrorName(e), cudaGetErrorString(e));
      });
    }
    return -1;
  }
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return d;
}

bool copyDeviceToHost(void* dst, const void* src, size_t bytes) {
  if (cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

void* deviceAlloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes == 0 ? 1 : bytes) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void deviceFree(void* p) {
  if (p) cudaFree(p);
  cudaGetLastError();
}

#endif  // LOOM_HAVE_CUDA

}  // namespace loom::comm
