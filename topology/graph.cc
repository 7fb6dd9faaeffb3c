#include "topology/graph.h"

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <set>

namespace loom::topology {

const char* pathTypeName(PathType type) {
  switch (type) {
    case PathType::kLoc: return "LOC";
    case PathType::kNvl: return "NVL";
    case PathType::kNvb: return "NVB";
    case PathType::kPix: return "PIX";
    case PathType::kPxb: return "PXB";
    case PathType::kPhb: return "PHB";
    case PathType::kSys: return "SYS";
    case PathType::kNet: return "NET";
    case PathType::kDis: return "DIS";
  }
  return "?";
}

const char* nodeKindName(NodeKind kind) {
  switch (kind) {
    case NodeKind::kGpu: return "GPU";
    case NodeKind::kNvSwitch: return "NVS";
    case NodeKind::kPciSwitch: return "PCI";
    case NodeKind::kCpu: return "CPU";
    case NodeKind::kNic: return "NICDEV";
    case NodeKind::kNet: return "NIC";
  }
  return "?";
}

double nvlinkBandwidth(int sm) {
  // Per link, per direction, from the published aggregate figures of each generation.
  if (sm >= 100) return 50.0;                            // NVLink 5: 1.8 TB/s over 18 links
  if (sm >= 90) return 25.0;                             // NVLink 4: 900 GB/s over 18 links
  if (sm == 86 || sm == 87 || sm == 89) return 14.0625;  // GA10x bridges: 112.5 GB/s over 4
  if (sm >= 70) return 25.0;                             // NVLink 2 and 3
  if (sm >= 60) return 20.0;                             // NVLink 1
  return 25.0;                                           // unknown generation
}

double pciBandwidth(const std::string& linkSpeed, int linkWidth) {
  if (linkWidth <= 0 || linkSpeed.empty()) return 0;
  char* end = nullptr;
  double gts = std::strtod(linkSpeed.c_str(), &end);
  if (end == linkSpeed.c_str() || gts <= 0) return 0;
  double efficiency = gts < 8 ? 0.8 : (gts < 64 ? 128.0 / 130.0 : 0.945);  // line coding
  return gts * linkWidth * efficiency / 8.0;
}

double smpBandwidth(const Cpu& cpu) {
  // Effective CPU-to-CPU figures for device traffic, as NCCL measures them.
  if (cpu.arch == "ppc64" || cpu.arch == "ppc64le") return 32.0;
  if (cpu.vendor == "AuthenticAMD" || cpu.vendor == "HygonGenuine") return 16.0;
  if (cpu.vendor == "GenuineIntel") return cpu.modelId >= 0x55 ? 10.0 : 6.0;
  return 6.0;
}

namespace {

constexpr double kLocBandwidth = 5000.0;       // a device to itself
constexpr double kDefaultPciBandwidth = 31.5;  // PCIe Gen4 x16, when sysfs says nothing
constexpr double kDefaultNetBandwidth = 1.25;  // 10 Gb/s, when a net has no speed

bool isSwitchClass(const std::string& cls) {
  return cls.rfind("0x0604", 0) == 0;
}

class Builder {
 public:
  explicit Builder(std::vector<Node>& nodes) : nodes_(nodes) {}

  int add(NodeKind kind, int index) {
    Node n;
    n.kind = kind;
    n.index = index;
    nodes_.push_back(std::move(n));
    return static_cast<int>(nodes_.size()) - 1;
  }
  void connect(int a, int b, LinkKind kind, double bw, int nvlinks = 0) {
    addDirected(a, b, kind, bw, nvlinks);
    addDirected(b, a, kind, bw, nvlinks);
  }
  void addDirected(int a, int b, LinkKind kind, double bw, int nvlinks) {
    for (Link& l : nodes_[a].links) {
      if (l.to == b && l.kind == kind) {  // parallel links add up
        l.bw += bw;
        l.nvlinks += nvlinks;
        return;
      }
    }
    nodes_[a].links.push_back(Link{b, kind, bw, nvlinks});
  }

 private:
  std::vector<Node>& nodes_;
};

}  // namespace

Result<Graph> Graph::build(const System& system) {
  Graph g;
  Builder b(g.nodes_);
  std::map<std::string, int> byBus;

  for (size_t c = 0; c < system.cpus.size(); ++c) {
    int node = b.add(NodeKind::kCpu, static_cast<int>(c));
    g.nodes_[node].cpuInfo = &system.cpus[c];
    g.nodes_[node].cpu = static_cast<int>(c);
    g.cpus_.push_back(node);
  }
  for (size_t i = 0; i < g.cpus_.size(); ++i) {
    for (size_t j = i + 1; j < g.cpus_.size(); ++j) {
      double bw = std::min(smpBandwidth(system.cpus[i]), smpBandwidth(system.cpus[j]));
      b.connect(g.cpus_[i], g.cpus_[j], LinkKind::kSmp, bw);
    }
  }

  std::set<std::pair<std::string, int>> seenNets;
  auto addNets = [&](int nicNode, const Nic& nic, int cpu) {
    for (const Net& net : nic.nets) {
      // NCCL dumps list a socket NIC under every <cpu>; one endpoint is one node.
      if (!seenNets.insert({net.name, net.port}).second) continue;
      int node = b.add(NodeKind::kNet, static_cast<int>(g.nets_.size()));
      g.nodes_[node].net = &net;
      g.nodes_[node].cpu = cpu;
      g.nodes_[node].topLevel = g.nodes_[nicNode].topLevel;
      g.nodes_[node].busId = g.nodes_[nicNode].busId;
      g.nets_.push_back(node);
      double bw = net.speedMbps > 0 ? net.speedMbps / 8000.0 : kDefaultNetBandwidth;
      b.connect(nicNode, node, LinkKind::kNet, bw);
    }
  };

  // Depth-first over the PCI tree; returns the node made for `pci` or -1 (a leaf of no
  // interest, such as an NVMe drive, makes none).
  std::function<Result<int>(const PciNode&, int, int, double, int)> visit;
  visit = [&](const PciNode& pci, int parent, int cpu, double parentBw,
              int topLevel) -> Result<int> {
    NodeKind kind;
    if (pci.gpu) {
      kind = NodeKind::kGpu;
    } else if (pci.nic) {
      kind = NodeKind::kNic;
    } else if (!pci.children.empty() || isSwitchClass(pci.pciClass)) {
      kind = NodeKind::kPciSwitch;
    } else {
      return -1;
    }
    if (byBus.count(pci.busId)) {
      return errorf(Code::kInvalidArgument, "PCI bus id %s appears twice in the topology",
                    pci.busId.c_str());
    }
    int index = kind == NodeKind::kGpu ? static_cast<int>(g.gpus_.size()) : 0;
    int node = b.add(kind, index);
    byBus[pci.busId] = node;
    Node& n = g.nodes_[node];
    n.busId = pci.busId;
    n.cpu = cpu;
    n.topLevel = topLevel < 0 ? node : topLevel;
    if (kind == NodeKind::kGpu) {
      n.gpu = &*pci.gpu;
      g.gpus_.push_back(node);
    }
    double bw = pciBandwidth(pci.linkSpeed, pci.linkWidth);
    if (bw <= 0) bw = parentBw > 0 ? parentBw : kDefaultPciBandwidth;
    if (parentBw > 0) bw = std::min(bw, parentBw);
    b.connect(parent, node, LinkKind::kPci, bw);
    int top = g.nodes_[node].topLevel;
    if (kind == NodeKind::kNic) addNets(node, *pci.nic, cpu);
    for (const PciNode& child : pci.children) {
      // A bridge's own link bounds what its children can reach upstream only through it;
      // children keep their own width (a x16 switch may feed two x16 devices).
      auto r = visit(child, node, cpu, 0, top);
      if (!r) return r.status();
    }
    return node;
  };

  for (size_t c = 0; c < system.cpus.size(); ++c) {
    const Cpu& cpu = system.cpus[c];
    for (const PciNode& pci : cpu.pcis) {
      auto r = visit(pci, g.cpus_[c], static_cast<int>(c), 0, -1);
      if (!r) return r.status();
    }
    for (const Nic& nic : cpu.nics) {
      // A NIC without a PCI address (virtual or platform device) hangs off the CPU.
      int node = b.add(NodeKind::kNic, 0);
      g.nodes_[node].cpu = static_cast<int>(c);
      g.nodes_[node].topLevel = node;
      double bw = 0;
      for (const Net& net : nic.nets) bw += net.speedMbps > 0 ? net.speedMbps / 8000.0 : 0;
      b.connect(g.cpus_[c], node, LinkKind::kPci, bw > 0 ? bw : kDefaultNetBandwidth);
      addNets(node, nic, static_cast<int>(c));
    }
  }

  // NVLinks. All NVSwitches become one node; GPU-GPU links are directed per GPU's own
  // list and mirrored when the peer does not list them.
  int nvs = -1;
  for (int gi : g.gpus_) {
    const Node& gpuNode = g.nodes_[gi];
    const Gpu& gpu = *gpuNode.gpu;
    double perLink = nvlinkBandwidth(gpu.sm);
    for (const NvLink& link : gpu.nvlinks) {
      if (link.count <= 0) continue;
      auto it = byBus.find(link.target);
      bool targetIsGpu = it != byBus.end() && g.nodes_[it->second].kind == NodeKind::kGpu;
      if (link.targetClass == kClassNvSwitch || (!targetIsGpu && link.targetClass.empty())) {
        if (nvs < 0) nvs = b.add(NodeKind::kNvSwitch, 0);
        b.connect(gi, nvs, LinkKind::kNvLink, perLink * link.count, link.count);
      } else if (targetIsGpu) {
        b.addDirected(gi, it->second, LinkKind::kNvLink, perLink * link.count, link.count);
      } else if (link.targetClass == kClassCpu) {
        b.connect(gi, g.cpus_[gpuNode.cpu], LinkKind::kNvLink, perLink * link.count, link.count);
      }
      // Otherwise the peer is not part of this view (hidden by CUDA_VISIBLE_DEVICES).
    }
  }
  for (int gi : g.gpus_) {
    for (const Link& l : std::vector<Link>(g.nodes_[gi].links)) {
      if (l.kind != LinkKind::kNvLink || g.nodes_[l.to].kind != NodeKind::kGpu) continue;
      const auto& back = g.nodes_[l.to].links;
      bool mirrored = std::any_of(back.begin(), back.end(), [&](const Link& r) {
        return r.to == gi && r.kind == LinkKind::kNvLink;
      });
      if (!mirrored) b.addDirected(l.to, gi, LinkKind::kNvLink, l.bw, l.nvlinks);
    }
  }

  g.sortByDevice();
  g.findBlockedPairs();
  g.computePaths();
  g.divertBlockedPairs();
  g.computeClosestNets();
  return g;
}

namespace {

struct Label {
  int node;
  PathType type;
  double bw;
  int hops;
  int nvlinks;
  int prev;  // label index, -1 at the source
  bool dead = false;
};

PathType hopType(const Node& from, const Node& to, const Link& link) {
  switch (link.kind) {
    case LinkKind::kNvLink: return PathType::kNvl;
    case LinkKind::kSmp: return PathType::kSys;
    case LinkKind::kNet: return PathType::kLoc;
    case LinkKind::kPci:
      if (from.kind == NodeKind::kCpu || to.kind == NodeKind::kCpu) return PathType::kPhb;
      if (from.kind == NodeKind::kPciSwitch && to.kind == NodeKind::kPciSwitch) {
        return PathType::kPxb;
      }
      return PathType::kPix;
  }
  return PathType::kDis;
}

bool better(const Label& a, const Label& b) {
  if (a.type != b.type) return a.type < b.type;
  if (a.bw != b.bw) return a.bw > b.bw;
  return a.hops < b.hops;
}

bool dominates(const Label& a, const Label& b) {
  return a.type <= b.type && a.bw >= b.bw && a.hops <= b.hops;
}

}  // namespace

void Graph::computePaths() {
  const int n = static_cast<int>(nodes_.size());
  paths_.assign(static_cast<size_t>(n) * n, Path{});
  std::vector<Label> labels;
  std::vector<std::vector<int>> front(n);
  std::deque<int> queue;
  for (int src = 0; src < n; ++src) {
    labels.clear();
    for (auto& f : front) f.clear();
    labels.push_back(Label{src, PathType::kLoc, kLocBandwidth, 0, INT_MAX, -1});
    front[src].push_back(0);
    queue.assign(1, 0);
    const bool srcIsGpu = nodes_[src].kind == NodeKind::kGpu;
    while (!queue.empty()) {
      int li = queue.front();
      queue.pop_front();
      if (labels[li].dead) continue;
      const Label cur = labels[li];
      const Node& u = nodes_[cur.node];
      if (cur.node != src) {
        // Never route through a NIC's port; through a NIC only to its own ports.
        if (u.kind == NodeKind::kNet) continue;
        // Through a GPU only as NVLink GPU -> GPU -> GPU, one hop in (NVB).
        if (u.kind == NodeKind::kGpu &&
            !(srcIsGpu && cur.hops == 1 && cur.type == PathType::kNvl)) {
          continue;
        }
      }
      for (const Link& link : u.links) {
        const Node& v = nodes_[link.to];
        // Through a NIC only between it and its own ports: NET -> NIC -> rest, or
        // rest -> NIC -> NET; never rest -> NIC -> rest.
        if (cur.node != src && u.kind == NodeKind::kNic && link.kind != LinkKind::kNet &&
            nodes_[labels[cur.prev].node].kind != NodeKind::kNet) {
          continue;
        }
        if (cur.node != src && u.kind == NodeKind::kGpu &&
            (link.kind != LinkKind::kNvLink || v.kind != NodeKind::kGpu)) {
          continue;
        }
        // An NVLink between GPUs that cannot reach each other's memory carries nothing.
        if (link.kind == LinkKind::kNvLink && u.kind == NodeKind::kGpu &&
            v.kind == NodeKind::kGpu && p2pBlocked(cur.node, link.to)) {
          continue;
        }
        // No cycles.
        bool seen = false;
        for (int p = li; p >= 0; p = labels[p].prev) {
          if (labels[p].node == link.to) {
            seen = true;
            break;
          }
        }
        if (seen) continue;
        Label next{link.to,
                   std::max(cur.type, hopType(u, v, link)),
                   std::min(cur.bw, link.bw),
                   cur.hops + 1,
                   cur.nvlinks,
                   li};
        if (cur.node != src && u.kind == NodeKind::kGpu)
          next.type = std::max(next.type, PathType::kNvb);
        if (link.kind == LinkKind::kNvLink) next.nvlinks = std::min(next.nvlinks, link.nvlinks);
        auto& f = front[link.to];
        bool dominated = std::any_of(f.begin(), f.end(), [&](int o) {
          return !labels[o].dead && dominates(labels[o], next);
        });
        if (dominated) continue;
        for (int o : f)
          if (dominates(next, labels[o])) labels[o].dead = true;
        labels.push_back(next);
        int ni = static_cast<int>(labels.size()) - 1;
        f.push_back(ni);
        queue.push_back(ni);
      }
    }
    for (int dst = 0; dst < n; ++dst) {
      int best = -1;
      for (int o : front[dst])
        if (!labels[o].dead && (best < 0 || better(labels[o], labels[best]))) best = o;
      if (best < 0) continue;
      Path& path = paths_[static_cast<size_t>(src) * n + dst];
      const Label& l = labels[best];
      path.type = l.type;
      path.bw = l.bw;
      path.nvlinks = (l.type == PathType::kNvl || l.type == PathType::kNvb) ? l.nvlinks : 0;
      for (int p = best; p >= 0; p = labels[p].prev) path.nodes.push_back(labels[p].node);
      std::reverse(path.nodes.begin(), path.nodes.end());
    }
  }
}

void Graph::findBlockedPairs() {
  for (int a : gpus_) {
    for (int b : gpus_) {
      if (a != b && p2pDenied(*nodes_[a].gpu, nodes_[b].busId)) {
        blocked_.insert({std::min(a, b), std::max(a, b)});
      }
    }
  }
}

void Graph::divertBlockedPairs() {
  // NCCL's answer when two GPUs cannot use P2P (paths.cc, addInterStep): the traffic
  // is staged in host memory near the destination, so the path is source -> the
  // destination's CPU -> destination. At least PHB: even when both GPUs hang off one
  // PCIe switch, the data crosses the host bridge.
  const size_t n = nodes_.size();
  for (auto [x, y] : blocked_) {
    for (auto [a, b] : {std::pair{x, y}, std::pair{y, x}}) {
      const int cpu = cpus_[nodes_[b].cpu];
      const Path& first = path(a, cpu);
      const Path& second = path(cpu, b);
      Path via;
      if (first.type != PathType::kDis && second.type != PathType::kDis) {
        via.type = std::max({PathType::kPhb, first.type, second.type});
        via.bw = std::min(first.bw, second.bw);
        via.nodes = first.nodes;
        via.nodes.insert(via.nodes.end(), second.nodes.begin() + 1, second.nodes.end());
      }
      paths_[static_cast<size_t>(a) * n + b] = std::move(via);
    }
  }
}

void Graph::sortByDevice() {
  // GPU<i> and NIC<i> follow the CUDA device and net indices when those are valid and
  // unique (what nvidia-smi and NCCL show), else document order.
  auto sortBy = [&](std::vector<int>& list, auto key) {
    std::vector<int> keys;
    for (int n : list) keys.push_back(key(nodes_[n]));
    std::vector<int> sorted = keys;
    std::sort(sorted.begin(), sorted.end());
    bool usable = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end() &&
                  (sorted.empty() || sorted.front() >= 0);
    if (!usable) return;
    std::stable_sort(list.begin(), list.end(),
                     [&](int a, int b) { return key(nodes_[a]) < key(nodes_[b]); });
    for (size_t i = 0; i < list.size(); ++i) nodes_[list[i]].index = static_cast<int>(i);
  };
  sortBy(gpus_, [](const Node& n) { return n.gpu->dev; });
  sortBy(nets_, [](const Node& n) { return n.net->dev; });
}

void Graph::computeClosestNets() {
  closestNet_.assign(gpus_.size(), -1);
  if (nets_.empty()) return;
  std::vector<int> uses(nets_.size(), 0);
  for (size_t g = 0; g < gpus_.size(); ++g) {
    int best = -1;
    for (size_t n = 0; n < nets_.size(); ++n) {
      const Path& p = path(gpus_[g], nets_[n]);
      if (p.type == PathType::kDis) continue;
      if (best < 0) {
        best = static_cast<int>(n);
        continue;
      }
      const Path& q = path(gpus_[g], nets_[best]);
      bool closer = p.type != q.type ? p.type < q.type : p.bw > q.bw;
      bool same = p.type == q.type && p.bw == q.bw;
      if (closer || (same && uses[n] < uses[best])) best = static_cast<int>(n);
    }
    closestNet_[g] = best;
    if (best >= 0) ++uses[best];
  }
}

std::string Graph::nodeName(int node) const {
  const Node& n = nodes_[node];
  switch (n.kind) {
    case NodeKind::kGpu: return "GPU" + std::to_string(n.index);
    case NodeKind::kNet: return "NIC" + std::to_string(n.index);
    case NodeKind::kCpu: return "CPU" + std::to_string(n.index);
    case NodeKind::kNvSwitch: return "NVS0";
    case NodeKind::kPciSwitch: return "PCI" + n.busId;
    case NodeKind::kNic: return "NICDEV" + n.busId;
  }
  return "?";
}

}  // namespace loom::topology
