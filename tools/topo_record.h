// Records what topology detection reads from this machine into a folder, so the
// machine can be reproduced anywhere with `loom-topo --sysfs-root DIR` or used as a
// test fixture: the relevant sysfs files and links (PCI devices with their bridges,
// NUMA nodes, RDMA devices with their GID tables, network interfaces), the first block
// of /proc/cpuinfo, and NVML's answers (with CUDA's P2P answers when a driver is
// present) as loom/nvml.json. Host name and boot id are not recorded.
#pragma once

#include <string>

#include "common/status.h"

namespace loom::tools {

Status recordMachine(const std::string& dir);

}  // namespace loom::tools
