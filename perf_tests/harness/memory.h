// Where the benchmark's buffers live: host memory (plain malloc) or device memory (through
// the dlopen'd CUDA runtime). The runner moves test data through these calls only.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "nccl.h"

namespace loom::perf {

class Memory {
 public:
  virtual ~Memory() = default;
  virtual bool isDevice() const = 0;
  virtual const char* name() const = 0;  // "host" or "device"
  // Each returns "" on success, otherwise what failed.
  virtual std::string setDevice(int device) = 0;
  virtual std::string allocate(size_t bytes, void** ptr) = 0;
  virtual void release(void* ptr) = 0;
  virtual std::string fill(void* dst, int byte, size_t bytes) = 0;
  virtual std::string upload(void* dst, const void* hostSrc, size_t bytes) = 0;
  // Waits until fills and uploads on the current device have landed. They run on CUDA's
  // legacy stream, which the benchmark's non-blocking streams do not wait for (and a
  // pageable upload may return before its copy ends).
  virtual std::string synchronize() = 0;
  virtual std::string download(void* hostDst, const void* src, size_t bytes) = 0;
  virtual std::string createStream(cudaStream_t* stream) = 0;
  virtual void destroyStream(cudaStream_t stream) = 0;
  // Sets *done when all work on the stream has finished.
  virtual std::string query(cudaStream_t stream, bool* done) = 0;
  // CUDA graphs (-G), device memory only: capture what the calling thread enqueues on
  // `stream` until endCapture (*graph: the captured graph); make an executable graph of it
  // (*exec; the captured graph is released), once no stream of this thread is capturing;
  // launch it on a stream; destroy it.
  virtual std::string beginCapture(cudaStream_t stream) = 0;
  virtual std::string endCapture(cudaStream_t stream, void** graph) = 0;
  virtual std::string instantiate(void* graph, void** exec) = 0;
  virtual std::string launchGraph(void* exec, cudaStream_t stream) = 0;
  virtual void destroyGraph(void* exec) = 0;
};

std::unique_ptr<Memory> makeHostMemory();
// nullptr when the CUDA runtime cannot be loaded.
std::unique_ptr<Memory> makeDeviceMemory();

}  // namespace loom::perf
