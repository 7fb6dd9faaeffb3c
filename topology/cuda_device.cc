#include "topology/cuda_device.h"

#include "common/cuda_probe.h"
#include "topology/system.h"

namespace loom::topology {

std::string cudaDeviceBusId(int ordinal) {
  std::string text = cuda::deviceBusId(ordinal);
  if (text.empty()) return "";
  auto normalized = normalizeBusId(text);
  return normalized ? normalized.value() : "";
}

}  // namespace loom::topology
