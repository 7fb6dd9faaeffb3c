#include "perf_tests/harness/memory.h"

#include <cstdlib>
#include <cstring>

#include "perf_tests/harness/cuda_api.h"

namespace loom::perf {
namespace {

class HostMemory final : public Memory {
 public:
  bool isDevice() const override { return false; }
  const char* name() const override { return "host"; }
  std::string setDevice(int) override { return ""; }
  std::string allocate(size_t bytes, void** ptr) override {
    *ptr = std::malloc(bytes == 0 ? 1 : bytes);
    return *ptr != nullptr ? "" : "malloc of " + std::to_string(bytes) + " bytes failed";
  }
  void release(void* ptr) override { std::free(ptr); }
  std::string fill(void* dst, int byte, size_t bytes) override {
    std::memset(dst, byte, bytes);
    return "";
  }
  std::string synchronize() override { return ""; }
  std::string upload(void* dst, const void* src, size_t bytes) override {
    if (dst != src) std::memcpy(dst, src, bytes);
    return "";
  }
  std::string download(void* dst, const void* src, size_t bytes) override {
    if (dst != src) std::memcpy(dst, src, bytes);
    return "";
  }
  std::string createStream(cudaStream_t* stream) override {
    *stream = nullptr;  // collectives on host memory complete before they return
    return "";
  }
  void destroyStream(cudaStream_t) override {}
  std::string query(cudaStream_t, bool* done) override {
    *done = true;
    return "";
  }
  std::string beginCapture(cudaStream_t) override { return "CUDA graphs need device memory"; }
  std::string endCapture(cudaStream_t, void**) override { return "CUDA graphs need device memory"; }
  std::string instantiate(void*, void**) override { return "CUDA graphs need device memory"; }
  std::string launchGraph(void*, cudaStream_t) override { return "CUDA graphs need device memory"; }
  void destroyGraph(void*) override {}
};

class DeviceMemory final : public Memory {
 public:
  explicit DeviceMemory(const CudaApi* api) : api_(api) {}
  bool isDevice() const override { return true; }
  const char* name() const override { return "device"; }
  std::string setDevice(int device) override {
    return check(api_->setDevice(device), "cudaSetDevice");
  }
  std::string allocate(size_t bytes, void** ptr) override {
    return check(api_->malloc(ptr, bytes == 0 ? 1 : bytes), "cudaMalloc");
  }
  void release(void* ptr) override { api_->free(ptr); }
  std::string fill(void* dst, int byte, size_t bytes) override {
    return check(api_->memset(dst, byte, bytes), "cudaMemset");
  }
  std::string upload(void* dst, const void* src, size_t bytes) override {
    return check(api_->memcpy(dst, src, bytes, CudaApi::kMemcpyDefault), "cudaMemcpy");
  }
  std::string synchronize() override {
    return check(api_->deviceSynchronize(), "cudaDeviceSynchronize");
  }
  std::string download(void* dst, const void* src, size_t bytes) override {
    return check(api_->memcpy(dst, src, bytes, CudaApi::kMemcpyDefault), "cudaMemcpy");
  }
  std::string createStream(cudaStream_t* stream) override {
    return check(api_->streamCreateWithFlags(stream, CudaApi::kStreamNonBlocking),
                 "cudaStreamCreateWithFlags");
  }
  void destroyStream(cudaStream_t stream) override {
    if (stream != nullptr) api_->streamDestroy(stream);
  }
  std::string query(cudaStream_t stream, bool* done) override {
    const int e = api_->streamQuery(stream);
    *done = e == 0;
    return e == 0 || e == CudaApi::kErrorNotReady ? "" : check(e, "cudaStreamQuery");
  }
  std::string beginCapture(cudaStream_t stream) override {
    // Thread-local: other threads (of -t, or the library's own) may make calls that a
    // global capture would forbid.
    return check(api_->streamBeginCapture(stream, CudaApi::kCaptureModeThreadLocal),
                 "cudaStreamBeginCapture");
  }
  std::string endCapture(cudaStream_t stream, void** graph) override {
    *graph = nullptr;
    return check(api_->streamEndCapture(stream, graph), "cudaStreamEndCapture");
  }
  std::string instantiate(void* graph, void** exec) override {
    *exec = nullptr;
    const std::string error =
        check(api_->graphInstantiateWithFlags(exec, graph, 0), "cudaGraphInstantiateWithFlags");
    api_->graphDestroy(graph);
    return error;
  }
  std::string launchGraph(void* exec, cudaStream_t stream) override {
    return check(api_->graphLaunch(exec, stream), "cudaGraphLaunch");
  }
  void destroyGraph(void* exec) override {
    if (exec != nullptr) api_->graphExecDestroy(exec);
  }

 private:
  static std::string check(int error, const char* what) {
    return error == 0 ? "" : std::string(what) + " failed: " + cudaErrorText(error);
  }
  const CudaApi* api_;
};

}  // namespace

std::unique_ptr<Memory> makeHostMemory() {
  return std::make_unique<HostMemory>();
}

std::unique_ptr<Memory> makeDeviceMemory() {
  const CudaApi* api = cudaApi();
  if (api == nullptr) return nullptr;
  return std::make_unique<DeviceMemory>(api);
}

}  // namespace loom::perf
