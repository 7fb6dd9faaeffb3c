#include "transports/net/nic_choice.h"

#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cctype>

namespace loom::transport::net {

std::vector<std::string> pciHops(const std::string& path) {
  std::vector<std::string> hops;
  size_t start = 0;
  while (start < path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    if (part.rfind("pci", 0) == 0 || (part.size() >= 8 && part[4] == ':' && part[7] == ':'))
      hops.push_back(part);
    start = end + 1;
  }
  return hops;
}

NicChoice chooseNic(const std::string& gpuPath, const std::vector<std::string>& nicPaths,
                    const std::vector<std::string>& nicNames, int gpuIndex) {
  NicChoice c;
  if (nicPaths.empty()) return c;
  const std::vector<std::string> gpu = pciHops(gpuPath);
  std::vector<size_t> shared(nicPaths.size(), 0);
  for (size_t i = 0; i < nicPaths.size(); ++i) {
    const std::vector<std::string> nic = pciHops(nicPaths[i]);
    while (shared[i] < gpu.size() && shared[i] < nic.size() && gpu[shared[i]] == nic[shared[i]])
      ++shared[i];
  }
  const size_t best = *std::max_element(shared.begin(), shared.end());
  std::vector<int> nearest;
  for (size_t i = 0; i < shared.size(); ++i)
    if (shared[i] == best) nearest.push_back(static_cast<int>(i));
  c.dev = nearest[static_cast<size_t>(std::max(gpuIndex, 0)) % nearest.size()];
  auto name = [&](int i) { return i < int(nicNames.size()) ? nicNames[i] : std::to_string(i); };
  if (best == 0) {
    c.why = gpu.empty() ? "the GPU's PCI place is unknown"
                        : "no NIC shares a PCI switch or root with it";
  } else {
    c.why = "nearest on the PCI tree (" + std::to_string(best) + " shared hops)";
  }
  if (nearest.size() > 1) {
    c.why += ", " + std::to_string(nearest.size()) + " as near, GPU " + std::to_string(gpuIndex) +
             " takes " + name(c.dev) + " (one rail per GPU)";
  }
  return c;
}

std::string pciSysfsPath(const std::string& busId) {
  std::string id = busId;
  std::transform(id.begin(), id.end(), id.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  // cudaDeviceGetPCIBusId gives "00000000:03:00.0": sysfs has a 4-digit domain.
  if (id.size() > 12 && id.find(':') == 8) id = id.substr(4);
  char real[PATH_MAX];
  const std::string link = "/sys/bus/pci/devices/" + id;
  return realpath(link.c_str(), real) ? std::string(real) : std::string();
}

}  // namespace loom::transport::net
