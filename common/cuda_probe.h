// What loom needs to know about CUDA before it has GPU code paths: whether a pointer is
// device memory. libcuda is loaded with dlopen, so binaries run with or without it.
#pragma once

namespace loom::cuda {

// True when the CUDA driver is present, initialises, and reports `ptr` as device
// (non-managed) memory. False on machines without CUDA and for host pointers.
bool isDevicePointer(const void* ptr);

}  // namespace loom::cuda
