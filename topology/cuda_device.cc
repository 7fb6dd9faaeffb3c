#include "topology/cuda_device.h"

#include <dlfcn.h>

#include <mutex>

#include "topology/system.h"

namespace loom::topology {
namespace {

// CUDA driver API entry points (cuda.h), declared here so no CUDA header is needed.
using CuInit = int (*)(unsigned);
using CuDeviceGet = int (*)(int*, int);
using CuDeviceGetPCIBusId = int (*)(char*, int, int);

struct Driver {
  CuDeviceGet deviceGet = nullptr;
  CuDeviceGetPCIBusId busId = nullptr;
};

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    // Never closed: the CUDA driver does not support being unloaded.
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto init = reinterpret_cast<CuInit>(dlsym(lib, "cuInit"));
    auto get = reinterpret_cast<CuDeviceGet>(dlsym(lib, "cuDeviceGet"));
    auto bus = reinterpret_cast<CuDeviceGetPCIBusId>(dlsym(lib, "cuDeviceGetPCIBusId"));
    if (!init || !get || !bus || init(0) != 0) return;
    d.deviceGet = get;
    d.busId = bus;
  });
  return d;
}

}  // namespace

std::string cudaDeviceBusId(int ordinal) {
  if (ordinal < 0) return "";
  const Driver& d = driver();
  if (!d.deviceGet) return "";
  int dev = 0;
  if (d.deviceGet(&dev, ordinal) != 0) return "";
  char text[64] = {0};
  if (d.busId(text, sizeof(text) - 1, dev) != 0) return "";
  auto normalized = normalizeBusId(text);
  return normalized ? normalized.value() : "";
}

}  // namespace loom::topology
