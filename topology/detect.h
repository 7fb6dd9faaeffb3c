// Detection of the local host: CPUs/NUMA, the PCI tree, GPUs (sysfs + NVML, P2P access
// through the CUDA driver), NICs (sysfs /sys/class/infiniband with each port's GID table,
// /sys/class/net, ibverbs loaded with dlopen).
//
// Every source may be missing or partial. Detection then degrades and says so once per
// source in `Detected::warnings` (no NVML, no ibverbs, numa_node -1, no NUMA, a flat PCI
// tree, unreadable files); it fails only when the reader cannot read sysfs at all.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "topology/gpu_source.h"
#include "topology/reader.h"
#include "topology/system.h"

namespace loom::topology {

struct DetectOptions {
  // Where GPU details (P2P access included) come from. nullptr: NVML and the CUDA
  // driver when `reader` is the live machine; for a recorded tree, the answers in its
  // /loom/nvml.json when present.
  GpuSource* gpuSource = nullptr;
  // Probe libibverbs (dlopen) for the RDMA NICs sysfs lists; live machine only.
  bool probeIbverbs = true;
};

struct Detected {
  System system;
  std::vector<std::string> warnings;  // one line per missing or partial source
};

// Detects the host that `reader` shows. GPU ranks are left at -1; dev is the NVML index
// (the CUDA index unless CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER reorders them).
Result<Detected> detectLocal(const Reader& reader, const DetectOptions& options = {});

// The host id: LOOM_HOST_ID when set, else "<hostname>-<hash of hostname and boot id>"
// read through `reader` (/proc/sys/kernel/hostname, /proc/sys/kernel/random/boot_id).
// Same for every process of one boot of one host, different across hosts.
std::string detectHostId(const Reader& reader);

// SM version for an NVIDIA PCI device id ("0x2330" -> 90); 0 when unknown. Fallback
// for machines without NVML.
int smFromDeviceId(const std::string& deviceId);

// The topology file the settings name: LOOM_TOPO_FILE, else NCCL_TOPO_FILE; "" when none.
std::string topoFileSetting();

// Lays the NCCL XML file `path` over `detected`: the file wins where both describe a
// device, the host id stays detection's, the file's warnings are appended. A file that
// cannot be read is kSystemError; a malformed one kInvalidArgument with
// "<path>:<line>: ..." (`detected` is then unchanged).
Status overlayTopoFile(Detected& detected, const std::string& path);

// Detection with the environment's settings applied (loom-topo and tests; the
// communicator does the same steps itself, see comm/topology_view.h): the topology
// file (topoFileSetting) laid over detection, and LOOM_TOPO_DUMP_FILE (or
// NCCL_TOPO_DUMP_FILE), when set, written with the result as XML. Any error of either
// file is returned.
Result<Detected> detectWithEnvironment(const Reader& reader, const DetectOptions& options = {});

}  // namespace loom::topology
