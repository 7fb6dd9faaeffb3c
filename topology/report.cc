#include "topology/report.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <sstream>

namespace loom::topology {
namespace {

using nlohmann::ordered_json;

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%" PRIx64, v);
  return buf;
}

double round3(double v) {
  return static_cast<double>(static_cast<long long>(v * 1000 + 0.5)) / 1000;
}

ordered_json ringsJson(const Rings& rings) {
  ordered_json out = ordered_json::array();
  for (const RingChannel& ch : rings.channels) out.push_back(ch.ranks);
  return out;
}

ordered_json ringChannelsJson(const Rings& rings) {
  ordered_json out = ordered_json::array();
  for (size_t c = 0; c < rings.channels.size(); ++c) {
    const RingChannel& ch = rings.channels[c];
    ordered_json j;
    j["channel"] = c;
    j["ranks"] = ch.ranks;
    if (!ch.netIn.empty()) {
      j["net_in"] = ch.netIn;
      j["net_out"] = ch.netOut;
    }
    out.push_back(j);
  }
  return out;
}

ordered_json treesJson(const Trees& trees) {
  ordered_json out = ordered_json::array();
  for (const TreeChannel& t : trees.channels) {
    ordered_json j;
    j["root"] = t.root;
    j["cross_host_tree"] = t.crossHostTree;
    j["parent"] = t.parent;
    out.push_back(j);
  }
  return out;
}

std::string dump(const ordered_json& j, int indent) {
  return j.dump(indent) + "\n";
}

// The GPU's P2P answers, peers named by their GPU id (by bus id when not in the graph).
ordered_json p2pJson(const Graph& graph, const Gpu& gpu) {
  ordered_json out = ordered_json::array();
  for (const P2pPeer& p : gpu.p2p) {
    std::string peer = p.target;
    for (int n : graph.gpus())
      if (graph.nodes()[n].busId == p.target) peer = graph.nodeName(n);
    out.push_back({{"peer", peer}, {"access", p.access}, {"rank", p.rank}, {"atomics", p.atomics}});
  }
  return out;
}

// One line on P2P under the matrix: the GPU pairs without peer access, or that every
// pair has it; nothing when CUDA was not asked (detection said so once already).
std::string p2pLine(const Graph& graph) {
  const int n = graph.gpuCount();
  std::string denied;
  bool allChecked = true;
  for (int a = 0; a < n; ++a) {
    const Gpu& gpu = *graph.nodes()[graph.gpus()[a]].gpu;
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      const std::string& peer = graph.nodes()[graph.gpus()[b]].busId;
      allChecked &= std::any_of(gpu.p2p.begin(), gpu.p2p.end(),
                                [&](const P2pPeer& p) { return p.target == peer; });
      if (a < b && !graph.p2pAllowed(a, b)) {
        denied += (denied.empty() ? "" : ", ") + graph.nodeName(graph.gpus()[a]) + "-" +
                  graph.nodeName(graph.gpus()[b]);
      }
    }
  }
  if (!denied.empty()) {
    return "P2P: CUDA gives no peer access for " + denied +
           "; these pairs go through host memory (PHB or SYS above).\n";
  }
  if (n >= 2 && allChecked) return "P2P: every GPU pair has peer access (CUDA).\n";
  return "";
}

}  // namespace

std::string cpuListFromMask(const std::string& mask) {
  std::string digits;
  for (char c : mask) {
    if (c == ',' || c == '\n' || c == ' ') continue;
    if (!std::isxdigit(static_cast<unsigned char>(c))) return "";
    digits += c;
  }
  std::vector<int> cpus;
  int bit = 0;
  for (auto it = digits.rbegin(); it != digits.rend(); ++it, bit += 4) {
    int v =
        std::isdigit(static_cast<unsigned char>(*it)) ? *it - '0' : (std::tolower(*it) - 'a' + 10);
    for (int b = 0; b < 4; ++b)
      if (v & (1 << b)) cpus.push_back(bit + b);
  }
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) out.append("-").append(std::to_string(cpus[j]));
    i = j + 1;
  }
  return out;
}

std::string toJson(const System& system, const Graph& graph, const Rings* rings, const Trees* trees,
                   int indent) {
  const auto& nodes = graph.nodes();
  ordered_json root;
  root["version"] = 1;
  root["host_id"] = system.hostId();

  ordered_json cpus = ordered_json::array();
  for (int n : graph.cpus()) {
    const Cpu& c = *nodes[n].cpuInfo;
    ordered_json j;
    j["id"] = graph.nodeName(n);
    j["numa"] = c.numaId;
    j["affinity"] = cpuListFromMask(c.affinity);
    j["arch"] = c.arch;
    j["vendor"] = c.vendor;
    j["family"] = c.familyId;
    j["model"] = c.modelId;
    cpus.push_back(j);
  }
  root["cpus"] = cpus;

  ordered_json gpus = ordered_json::array();
  for (int i = 0; i < graph.gpuCount(); ++i) {
    int n = graph.gpus()[i];
    const Gpu& gpu = *nodes[n].gpu;
    ordered_json j;
    j["id"] = graph.nodeName(n);
    j["busid"] = nodes[n].busId;
    j["dev"] = gpu.dev;
    j["rank"] = gpu.rank;
    j["sm"] = gpu.sm;
    j["numa"] = nodes[graph.cpus()[nodes[n].cpu]].cpuInfo->numaId;
    j["cpu"] = graph.nodeName(graph.cpus()[nodes[n].cpu]);
    j["gdr"] = gpu.gdr;
    ordered_json links = ordered_json::array();
    for (const Link& l : nodes[n].links) {
      if (l.kind != LinkKind::kNvLink) continue;
      links.push_back(
          {{"target", graph.nodeName(l.to)}, {"count", l.nvlinks}, {"bw_gbps", round3(l.bw)}});
    }
    j["nvlinks"] = links;
    int net = graph.closestNet(i);
    j["nic"] = net >= 0 ? ordered_json("NIC" + std::to_string(net)) : ordered_json(nullptr);
    j["p2p"] = p2pJson(graph, gpu);
    gpus.push_back(j);
  }
  root["gpus"] = gpus;

  ordered_json nics = ordered_json::array();
  for (int n : graph.nets()) {
    const Net& net = *nodes[n].net;
    ordered_json j;
    j["id"] = graph.nodeName(n);
    j["name"] = net.name;
    j["busid"] = nodes[n].busId.empty() ? ordered_json(nullptr) : ordered_json(nodes[n].busId);
    j["dev"] = net.dev;
    j["speed_mbps"] = net.speedMbps;
    j["port"] = net.port;
    j["gdr"] = net.gdr;
    j["guid"] = hex(net.guid);
    j["numa"] = nodes[graph.cpus()[nodes[n].cpu]].cpuInfo->numaId;
    j["link_layer"] = net.attr("link_layer");
    j["virtual"] = net.attr("virtual") == "1";
    if (!net.attr("gid_index").empty()) {
      j["gid_index"] = std::atoi(net.attr("gid_index").c_str());
      if (!net.attr("roce").empty()) j["roce"] = net.attr("roce");
    }
    ordered_json gids = ordered_json::array();
    for (const GidEntry& e : net.gids) {
      gids.push_back({{"index", e.index}, {"gid", e.gid}, {"type", e.type}, {"netdev", e.netdev}});
    }
    j["gids"] = gids;
    nics.push_back(j);
  }
  root["nics"] = nics;

  std::vector<int> ends;
  for (int n : graph.gpus()) ends.push_back(n);
  for (int n : graph.nets()) ends.push_back(n);
  for (int n : graph.cpus()) ends.push_back(n);
  ordered_json paths = ordered_json::array();
  for (int a : ends) {
    for (int b : ends) {
      if (a == b) continue;
      const Path& p = graph.path(a, b);
      ordered_json j;
      j["from"] = graph.nodeName(a);
      j["to"] = graph.nodeName(b);
      j["type"] = pathTypeName(p.type);
      j["bw_gbps"] = round3(p.bw);
      if (p.nvlinks > 0) j["nvlinks"] = p.nvlinks;
      j["hops"] = p.nodes.empty() ? 0 : static_cast<int>(p.nodes.size()) - 1;
      paths.push_back(j);
    }
  }
  root["paths"] = paths;

  if (rings) {
    root["rings"] = ringsJson(*rings);
    root["ring_channels"] = ringChannelsJson(*rings);
    root["ring_channel_bw_gbps"] = round3(rings->channelBw);
  }
  if (trees) root["trees"] = treesJson(*trees);
  return dump(root, indent);
}

std::string graphToJson(const Rings& rings, const Trees& trees, int indent) {
  ordered_json root;
  root["version"] = 1;
  root["rings"] = ringsJson(rings);
  root["ring_channels"] = ringChannelsJson(rings);
  root["ring_channel_bw_gbps"] = round3(rings.channelBw);
  root["trees"] = treesJson(trees);
  return dump(root, indent);
}

namespace {

std::string rootBus(const std::string& busId) {
  return busId.substr(0, 7);
}  // "dddd:bb"

std::string cell(const Graph& graph, int a, int b) {
  if (a == b) return "X";
  const Path& p = graph.path(a, b);
  switch (p.type) {
    case PathType::kLoc: return "X";
    case PathType::kNvl: return "NV" + std::to_string(p.nvlinks);
    case PathType::kNvb: return "NVB" + std::to_string(p.nvlinks);
    case PathType::kPhb: {
      const auto& nodes = graph.nodes();
      int ta = nodes[a].topLevel, tb = nodes[b].topLevel;
      if (ta < 0 || tb < 0 || nodes[ta].busId.empty() || nodes[tb].busId.empty()) return "PHB";
      return rootBus(nodes[ta].busId) == rootBus(nodes[tb].busId) ? "PHB" : "NODE";
    }
    default: return pathTypeName(p.type);
  }
}

}  // namespace

std::string formatMatrix(const System& system, const Graph& graph) {
  const auto& nodes = graph.nodes();
  std::vector<int> ends;
  for (int n : graph.gpus()) ends.push_back(n);
  for (int n : graph.nets()) ends.push_back(n);
  std::ostringstream out;
  if (graph.gpuCount() == 0) out << "No GPU found on this host.\n\n";
  if (!ends.empty()) {
    auto pad = [](const std::string& s, size_t w) {
      return s + std::string(w > s.size() ? w - s.size() : 1, ' ');
    };
    out << pad("", 8);
    for (int n : ends) out << pad(graph.nodeName(n), 8);
    if (graph.gpuCount() > 0) out << pad("CPU Affinity", 16) << "NUMA Affinity";
    out << "\n";
    for (int a : ends) {
      out << pad(graph.nodeName(a), 8);
      for (int b : ends) out << pad(cell(graph, a, b), 8);
      if (nodes[a].kind == NodeKind::kGpu) {
        const Cpu& cpu = *nodes[graph.cpus()[nodes[a].cpu]].cpuInfo;
        std::string list = cpuListFromMask(cpu.affinity);
        out << pad(list.empty() ? "N/A" : list, 16)
            << (cpu.numaId >= 0 ? std::to_string(cpu.numaId) : "N/A");
      }
      out << "\n";
    }
    if (std::string line = p2pLine(graph); !line.empty()) out << "\n" << line;
    out << "\nLegend:\n\n"
           "  X    = Self\n"
           "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA "
           "nodes\n"
           "  NODE = Connection traversing PCIe as well as the interconnect between PCIe root "
           "buses within a NUMA node\n"
           "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
           "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host "
           "Bridge)\n"
           "  PIX  = Connection traversing at most a single PCIe bridge\n"
           "  NV#  = Connection traversing a bonded set of # NVLinks (directly or through "
           "NVSwitch)\n"
           "  NVB# = Connection traversing # NVLinks through an intermediate GPU\n";
  }
  // Only the sections that have something to show (no empty "CPUs:" on a machine whose
  // NUMA nodes could not be read, no "NIC Legend:" without NICs).
  if (!graph.cpus().empty()) out << "\nCPUs:\n";
  for (int n : graph.cpus()) {
    const Cpu& c = *nodes[n].cpuInfo;
    std::string list = cpuListFromMask(c.affinity);
    out << "  " << graph.nodeName(n) << ": NUMA "
        << (c.numaId >= 0 ? std::to_string(c.numaId) : "N/A") << ", CPUs "
        << (list.empty() ? "N/A" : list) << ", " << (c.vendor.empty() ? "unknown vendor" : c.vendor)
        << " " << c.arch << "\n";
  }
  if (graph.nets().empty()) {
    out << "\nNo NIC found on this host.\n";
  } else {
    out << "\nNIC Legend:\n\n";
  }
  for (int n : graph.nets()) {
    const Net& net = *nodes[n].net;
    out << "  " << graph.nodeName(n) << ": " << net.name;
    if (net.port > 0) out << " port " << net.port;
    if (net.speedMbps > 0) {
      out << ", " << net.speedMbps / 1000.0 << " Gb/s";
    } else {
      out << ", speed unknown (planned as 10 Gb/s)";
    }
    std::string layer = net.attr("link_layer");
    if (!layer.empty()) out << ", " << layer;
    if (net.gdr) out << ", GDR";
    if (net.attr("virtual") == "1") out << ", virtual";
    if (!nodes[n].busId.empty()) out << ", " << nodes[n].busId;
    if (!net.attr("gid_index").empty()) {
      // The index NCCL would use, and how many entries the port's table holds.
      out << ", GID index " << net.attr("gid_index");
      if (!net.attr("roce").empty()) out << " (RoCE " << net.attr("roce") << ")";
      if (!net.gids.empty()) out << " of " << net.gids.size() << " in its table";
    }
    out << "\n";
  }
  (void)system;
  return out.str();
}

}  // namespace loom::topology
