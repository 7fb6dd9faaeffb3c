// Which of a backend's devices a GPU uses: the one nearest to it on the PCI tree, and
// among equally near ones a different one for each GPU of the host (rails: GPU i on NIC
// i mod n), as NCCL pairs GPUs with NICs.
#pragma once

#include <string>
#include <vector>

namespace loom::transport::net {

struct NicChoice {
  int dev = 0;
  std::string why;  // for the INFO log
};

// `gpuPath` and `nicPaths` are sysfs paths of PCI devices
// ("/sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0"); "" where one is not on PCI
// (loopback, veth, an emulated device): such a NIC is as far as any. `nicNames` name
// them in `why`. `gpuIndex` is the GPU's index among this host's GPUs.
NicChoice chooseNic(const std::string& gpuPath, const std::vector<std::string>& nicPaths,
                    const std::vector<std::string>& nicNames, int gpuIndex);

// The PCI components of a sysfs device path, root first: "pci0000:00", then every bridge
// and the device ("0000:00:01.0").
std::vector<std::string> pciHops(const std::string& path);

// The sysfs path of the PCI device with this bus id ("0000:03:00.0"), "" when unknown.
std::string pciSysfsPath(const std::string& busId);

}  // namespace loom::transport::net
