// What the C API needs to know of device memory, with or without CUDA in the build.
#pragma once

#include <cstddef>

namespace loom::comm {

// True when `p` is device memory (the CUDA driver says so).
bool isDeviceBuffer(const void* p);
// The device the calling thread uses, or -1 without GPUs (or with LOOM_DEVICE=cpu).
int currentDevice();
// Copies `bytes` from device memory to the host (synchronously); false on failure.
bool copyDeviceToHost(void* dst, const void* src, size_t bytes);
// Device memory on the current GPU (ncclMemAlloc); null on failure or without CUDA.
void* deviceAlloc(size_t bytes);
void deviceFree(void* p);

}  // namespace loom::comm
