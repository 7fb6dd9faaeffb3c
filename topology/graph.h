// The graph derived from a System: nodes, links with bandwidth, and the best path
// between every pair of GPU, NIC (network endpoint) and CPU nodes.
//
// Path types follow NCCL's definitions, ordered from best to worst:
//   LOC  same device
//   NVL  NVLink, directly or through NVSwitch
//   NVB  NVLink through one intermediate GPU
//   PIX  at most one PCIe switch
//   PXB  several PCIe switches, not through a CPU
//   PHB  through a CPU's PCIe host bridge (same NUMA node)
//   SYS  across the SMP interconnect between NUMA nodes
//   NET  across the network (between hosts; see search.h)
//   DIS  disconnected
//
// A GPU pair that CUDA reports as not peer-capable (Gpu::p2p, either direction) is
// never a direct GPU-GPU path: as in NCCL, its traffic goes through host memory, so
// its path runs from the source GPU to the CPU of the destination GPU and on to the
// destination, typed PHB or worse (SYS across sockets), and no NVB path uses an NVLink
// between such a pair.
//
// Bandwidths are GB/s per direction (1 GB = 1e9 bytes). A Graph is immutable after
// build() and safe to read from several threads.
#pragma once

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "topology/system.h"

namespace loom::topology {

enum class PathType : int { kLoc = 0, kNvl, kNvb, kPix, kPxb, kPhb, kSys, kNet, kDis };
const char* pathTypeName(PathType type);  // "LOC", "NVL", ...

enum class NodeKind : int { kGpu, kNvSwitch, kPciSwitch, kCpu, kNic, kNet };
const char* nodeKindName(NodeKind kind);

enum class LinkKind : int { kNvLink, kPci, kSmp, kNet };

struct Link {
  int to = -1;  // node index
  LinkKind kind = LinkKind::kPci;
  double bw = 0;    // GB/s
  int nvlinks = 0;  // number of NVLinks aggregated (kNvLink only)
};

struct Node {
  NodeKind kind = NodeKind::kCpu;
  int index = 0;             // index among nodes of its kind: GPU<index>, NIC<index>, CPU<index>
  std::string busId;         // PCI nodes
  int cpu = -1;              // the CPU (index) whose PCI tree holds this node
  int topLevel = -1;         // node index of this node's top-level PCI ancestor (itself if top)
  const Gpu* gpu = nullptr;  // kGpu: points into the System the graph was built from
  const Net* net = nullptr;  // kNet
  const Cpu* cpuInfo = nullptr;  // kCpu
  std::vector<Link> links;
};

struct Path {
  PathType type = PathType::kDis;
  double bw = 0;           // bottleneck bandwidth, GB/s
  int nvlinks = 0;         // bottleneck NVLink count on NVL/NVB paths, else 0
  std::vector<int> nodes;  // node indices from source to destination, inclusive
};

// Per-link NVLink bandwidth for a GPU generation (GB/s per direction).
double nvlinkBandwidth(int sm);
// PCIe bandwidth for sysfs-style link speed ("16.0 GT/s PCIe") and width (GB/s).
// Returns 0 when either is unknown.
double pciBandwidth(const std::string& linkSpeed, int linkWidth);
// Bandwidth between two CPU sockets for this CPU (GB/s).
double smpBandwidth(const Cpu& cpu);

class Graph {
 public:
  // Builds the graph from `system`, which must outlive the Graph (nodes point into it).
  // All NVSwitches of a host become one NVSwitch node (what matters for bandwidth is
  // the sum of a GPU's links into the switch fabric). Errors on duplicate bus ids.
  static Result<Graph> build(const System& system);

  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int>& gpus() const { return gpus_; }  // node index of GPU<i>
  const std::vector<int>& nets() const { return nets_; }  // node index of NIC<i>
  const std::vector<int>& cpus() const { return cpus_; }  // node index of CPU<i>
  int gpuCount() const { return static_cast<int>(gpus_.size()); }
  int netCount() const { return static_cast<int>(nets_.size()); }

  // Best path between any two nodes: lowest type, then widest, then fewest hops.
  const Path& path(int from, int to) const { return paths_[from * nodes_.size() + to]; }
  const Path& gpuToGpu(int a, int b) const { return path(gpus_[a], gpus_[b]); }
  const Path& gpuToNet(int g, int n) const { return path(gpus_[g], nets_[n]); }

  // Node id as written in dumps: "GPU3", "NIC0", "CPU1", "NVS0", "PCI0000:1a:00.0".
  std::string nodeName(int node) const;

  // The net closest to GPU g (best path type, then bandwidth, then lowest index);
  // -1 when the host has no nets. Ties are spread: among equally good nets, GPUs
  // take them in turn so two GPUs behind one switch with two NICs use both.
  int closestNet(int gpu) const { return closestNet_.empty() ? -1 : closestNet_[gpu]; }

  // False when CUDA reports no peer access between GPU<a> and GPU<b> (either way);
  // true when it allows it or was not asked.
  bool p2pAllowed(int a, int b) const { return !p2pBlocked(gpus_[a], gpus_[b]); }

 private:
  void sortByDevice();
  void findBlockedPairs();
  void computePaths();
  void divertBlockedPairs();
  void computeClosestNets();
  bool p2pBlocked(int nodeA, int nodeB) const {
    return blocked_.count({std::min(nodeA, nodeB), std::max(nodeA, nodeB)}) > 0;
  }

  std::vector<Node> nodes_;
  std::vector<int> gpus_, nets_, cpus_;
  std::vector<Path> paths_;
  std::vector<int> closestNet_;
  std::set<std::pair<int, int>> blocked_;  // GPU node pairs (lower first) without P2P
};

}  // namespace loom::topology
