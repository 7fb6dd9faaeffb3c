// Human and machine readable views of a topology: the JSON dump (docs/topology.md
// documents its fields) and an `nvidia-smi topo -m` style matrix.
#pragma once

#include <string>

#include "topology/graph.h"
#include "topology/search.h"
#include "topology/system.h"

namespace loom::topology {

// JSON with `host_id`, `cpus`, `gpus` (with `p2p`), `nics` (with `gids`), `paths`, and
// (when given) `rings` and `trees`. `graph` must have been built from `system`.
// Pretty-printed with `indent` spaces; -1 writes one line.
std::string toJson(const System& system, const Graph& graph, const Rings* rings, const Trees* trees,
                   int indent = 2);

// JSON for the rings and trees alone (LOOM_GRAPH_DUMP_FILE).
std::string graphToJson(const Rings& rings, const Trees& trees, int indent = 2);

// The matrix of GPUs and NICs: X, NV<n> (NVLink, n = bottleneck link count, direct or
// through NVSwitch), NVB<n> (NVLink through one GPU), PIX, PXB, PHB (same PCIe root
// bus), NODE (different root buses of one NUMA node) or SYS; then CPU and NUMA
// affinity of each GPU, a line on P2P (the GPU pairs CUDA gives no peer access, or
// that all have it; none when CUDA was not asked), a legend, and one line per NIC
// (name, speed, link layer, bus id, and for RDMA ports the GID index NCCL would use,
// the number of populated GID entries and the RoCE version).
std::string formatMatrix(const System& system, const Graph& graph);

// "0-3,8-11" from a sysfs cpumap ("00000f0f" or "ffffffff,00000000"); "" when empty
// or malformed.
std::string cpuListFromMask(const std::string& mask);

}  // namespace loom::topology
