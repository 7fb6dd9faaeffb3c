// Which PCI function a CUDA device index names, asked of the CUDA driver (libcuda
// loaded with dlopen, so binaries run without it).
//
// CUDA's device order can differ from the PCI/NVML order (CUDA_VISIBLE_DEVICES,
// CUDA_DEVICE_ORDER), so the communicator finds a rank's GPU in the detected topology
// by this bus id rather than by index.
#pragma once

#include <string>

namespace loom::topology {

// The normalized PCI bus id ("0000:1b:00.0") of CUDA device `ordinal`; "" when the
// driver is missing, fails to initialise, or has no such device. Thread-safe. Calls
// cuInit on first use, so call it only for ranks that use a GPU.
std::string cudaDeviceBusId(int ordinal);

}  // namespace loom::topology
