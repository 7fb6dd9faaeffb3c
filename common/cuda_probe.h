// What loom needs to know about CUDA before it has GPU code paths: whether a pointer is
// device memory. libcuda is loaded with dlopen, so binaries run with or without it.
#pragma once

#include <string>

namespace loom::cuda {

// True when the CUDA driver is present, initialises, and reports `ptr` as device
// (non-managed) memory. False on machines without CUDA and for host pointers.
bool isDevicePointer(const void* ptr);

// The PCI bus id the CUDA driver reports for device `ordinal` ("0000:19:00.0"), or ""
// without a driver or such a device.
std::string deviceBusId(int ordinal);

}  // namespace loom::cuda
