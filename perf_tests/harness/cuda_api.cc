#include "perf_tests/harness/cuda_api.h"

#include <dlfcn.h>

namespace loom::perf {
namespace {

template <typename F>
bool bind(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

CudaApi* load() {
  const char* names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                         "/usr/local/cuda/lib64/libcudart.so"};
  void* lib = nullptr;
  for (const char* name : names) {
    lib = dlopen(name, RTLD_NOW | RTLD_GLOBAL);
    if (lib != nullptr) break;
  }
  if (lib == nullptr) return nullptr;
  static CudaApi api;
  bool ok = bind(lib, "cudaGetDeviceCount", &api.getDeviceCount) &&
            bind(lib, "cudaSetDevice", &api.setDevice) && bind(lib, "cudaMalloc", &api.malloc) &&
            bind(lib, "cudaFree", &api.free) && bind(lib, "cudaMemcpy", &api.memcpy) &&
            bind(lib, "cudaMemset", &api.memset) &&
            bind(lib, "cudaStreamCreateWithFlags", &api.streamCreateWithFlags) &&
            bind(lib, "cudaStreamDestroy", &api.streamDestroy) &&
            bind(lib, "cudaStreamSynchronize", &api.streamSynchronize) &&
            bind(lib, "cudaStreamQuery", &api.streamQuery) &&
            bind(lib, "cudaDeviceSynchronize", &api.deviceSynchronize) &&
            bind(lib, "cudaGetErrorString", &api.getErrorString) &&
            bind(lib, "cudaDeviceGetPCIBusId", &api.deviceGetPCIBusId) &&
            bind(lib, "cudaStreamBeginCapture", &api.streamBeginCapture) &&
            bind(lib, "cudaStreamEndCapture", &api.streamEndCapture) &&
            bind(lib, "cudaGraphInstantiateWithFlags", &api.graphInstantiateWithFlags) &&
            bind(lib, "cudaGraphLaunch", &api.graphLaunch) &&
            bind(lib, "cudaGraphDestroy", &api.graphDestroy) &&
            bind(lib, "cudaGraphExecDestroy", &api.graphExecDestroy);
  // CUDA 12+ exports the current layout as _v2.
  if (ok && !bind(lib, "cudaGetDeviceProperties_v2", &api.getDeviceProperties)) {
    ok = bind(lib, "cudaGetDeviceProperties", &api.getDeviceProperties);
  }
  return ok ? &api : nullptr;
}

}  // namespace

const CudaApi* cudaApi() {
  static const CudaApi* api = load();
  return api;
}

int cudaDeviceCount() {
  const CudaApi* api = cudaApi();
  if (api == nullptr) return 0;
  int count = 0;
  if (api->getDeviceCount(&count) != 0) return 0;
  return count;
}

std::string cudaErrorText(int error) {
  const CudaApi* api = cudaApi();
  std::string text = "CUDA error " + std::to_string(error);
  if (api != nullptr) text += ": " + std::string(api->getErrorString(error));
  return text;
}

}  // namespace loom::perf
