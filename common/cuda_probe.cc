#include "common/cuda_probe.h"

#include <dlfcn.h>

#include <cstdint>
#include <mutex>

namespace loom::cuda {

namespace {

// Values from the CUDA driver API (cuda.h); declared here so no CUDA header is needed.
constexpr int kAttrMemoryType = 2;  // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kAttrIsManaged = 8;   // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr unsigned kMemoryTypeDevice = 2;

using CuInit = int (*)(unsigned);
using CuPointerGetAttribute = int (*)(void*, int, uintptr_t);
using CuPointerGetAttributes = int (*)(unsigned, int*, void**, uintptr_t);
using CuDeviceGet = int (*)(int*, int);
using CuDeviceGetPCIBusId = int (*)(char*, int, int);

struct Driver {
  CuPointerGetAttribute getAttribute = nullptr;
  CuPointerGetAttributes getAttributes = nullptr;  // one call for both attributes
  CuDeviceGet deviceGet = nullptr;
  CuDeviceGetPCIBusId busId = nullptr;
};

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    auto init = reinterpret_cast<CuInit>(dlsym(lib, "cuInit"));
    auto get = reinterpret_cast<CuPointerGetAttribute>(dlsym(lib, "cuPointerGetAttribute"));
    if (!init || !get || init(0) != 0) return;
    d.getAttribute = get;
    d.getAttributes = reinterpret_cast<CuPointerGetAttributes>(dlsym(lib, "cuPointerGetAttributes"));
    d.deviceGet = reinterpret_cast<CuDeviceGet>(dlsym(lib, "cuDeviceGet"));
    d.busId = reinterpret_cast<CuDeviceGetPCIBusId>(dlsym(lib, "cuDeviceGetPCIBusId"));
  });
  return d;
}

}  // namespace

bool isDevicePointer(const void* ptr) {
  if (!ptr) return false;
  const Driver& d = driver();
  if (!d.getAttribute) return false;
  if (d.getAttributes) {
    // Called on every collective: one driver call instead of two.
    int attrs[2] = {kAttrMemoryType, kAttrIsManaged};
    unsigned type = 0, managed = 0;
    void* data[2] = {&type, &managed};
    if (d.getAttributes(2, attrs, data, reinterpret_cast<uintptr_t>(ptr)) != 0) return false;
    return type == kMemoryTypeDevice && !managed;
  }
  unsigned type = 0;
  if (d.getAttribute(&type, kAttrMemoryType, reinterpret_cast<uintptr_t>(ptr)) != 0) return false;
  if (type != kMemoryTypeDevice) return false;
  unsigned managed = 0;
  if (d.getAttribute(&managed, kAttrIsManaged, reinterpret_cast<uintptr_t>(ptr)) == 0 && managed) {
    return false;
  }
  return true;
}

std::string deviceBusId(int ordinal) {
  const Driver& d = driver();
  if (ordinal < 0 || !d.deviceGet || !d.busId) return "";
  int dev = 0;
  if (d.deviceGet(&dev, ordinal) != 0) return "";
  char text[64] = {0};
  if (d.busId(text, sizeof(text) - 1, dev) != 0) return "";
  return text;
}

}  // namespace loom::cuda
