#include "topology/system.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace loom::topology {
namespace {

std::string getAttr(const Attrs& attrs, const std::string& key) {
  for (const auto& [k, v] : attrs)
    if (k == key) return v;
  return "";
}

void putAttr(Attrs& attrs, const std::string& key, std::string value) {
  for (auto& [k, v] : attrs) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  attrs.emplace_back(key, std::move(value));
}

bool allHex(const std::string& s) {
  return !s.empty() &&
         std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isxdigit(c) != 0; });
}

}  // namespace

std::string Net::attr(const std::string& key) const {
  return getAttr(extra, key);
}
void Net::setAttr(const std::string& key, std::string value) {
  putAttr(extra, key, std::move(value));
}
std::string System::hostId() const {
  return getAttr(extra, "host_id");
}
void System::setHostId(std::string id) {
  putAttr(extra, "host_id", std::move(id));
}

Result<std::string> normalizeBusId(const std::string& busId) {
  // [domain:]bus:device.function, hex; domain up to 8 digits (NVML writes 8).
  std::string s = busId;
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::string domain = "0000";
  size_t first = s.find(':');
  size_t last = s.rfind(':');
  if (first == std::string::npos) {
    return errorf(Code::kInvalidArgument, "'%s' is not a PCI bus id (want dddd:bb:dd.f)",
                  busId.c_str());
  }
  if (first != last) {
    domain = s.substr(0, first);
    if (!allHex(domain) || domain.size() > 8) {
      return errorf(Code::kInvalidArgument, "'%s' is not a PCI bus id (bad domain)", busId.c_str());
    }
    // Keep four digits as sysfs and NCCL do; NVML's leading zeros go.
    while (domain.size() > 4 && domain[0] == '0') domain.erase(0, 1);
    if (domain.size() < 4) domain = std::string(4 - domain.size(), '0').append(domain);
  }
  std::string rest = s.substr(last + 1);
  std::string bus = s.substr(first == last ? 0 : first + 1, last - (first == last ? 0 : first + 1));
  size_t dot = rest.find('.');
  if (dot == std::string::npos) {
    return errorf(Code::kInvalidArgument, "'%s' is not a PCI bus id (no function)", busId.c_str());
  }
  std::string dev = rest.substr(0, dot), fn = rest.substr(dot + 1);
  if (!allHex(bus) || bus.size() > 2 || !allHex(dev) || dev.size() > 2 || fn.size() != 1 ||
      fn[0] < '0' || fn[0] > '7') {
    return errorf(Code::kInvalidArgument, "'%s' is not a PCI bus id", busId.c_str());
  }
  if (bus.size() == 1) bus.insert(0, "0");
  if (dev.size() == 1) dev.insert(0, "0");
  return domain + ":" + bus + ":" + dev + "." + fn;
}

bool p2pDenied(const Gpu& gpu, const std::string& peerBusId) {
  return std::any_of(gpu.p2p.begin(), gpu.p2p.end(),
                     [&](const P2pPeer& p) { return p.target == peerBusId && !p.access; });
}

int gpuCount(const System& system) {
  int n = 0;
  forEachPci(system, [&](const PciNode& pci, const Cpu&) { n += pci.gpu ? 1 : 0; });
  return n;
}

int netCount(const System& system) {
  int n = 0;
  forEachPci(system, [&](const PciNode& pci, const Cpu&) {
    if (pci.nic) n += static_cast<int>(pci.nic->nets.size());
  });
  for (const Cpu& cpu : system.cpus)
    for (const Nic& nic : cpu.nics) n += static_cast<int>(nic.nets.size());
  return n;
}

namespace {

void mergeNic(Nic& base, const Nic& more) {
  for (const Net& net : more.nets) {
    bool found = std::any_of(base.nets.begin(), base.nets.end(), [&](const Net& n) {
      return n.name == net.name && n.port == net.port;
    });
    if (!found) base.nets.push_back(net);
  }
}

PciNode* findChild(std::vector<PciNode>& nodes, const std::string& busId) {
  for (PciNode& n : nodes)
    if (n.busId == busId) return &n;
  return nullptr;
}

void mergePci(std::vector<PciNode>& base, const PciNode& more) {
  PciNode* existing = findChild(base, more.busId);
  if (!existing) {
    base.push_back(more);
    return;
  }
  if (!existing->gpu && more.gpu) existing->gpu = more.gpu;
  if (existing->gpu && more.gpu && existing->gpu->rank < 0) existing->gpu->rank = more.gpu->rank;
  // A topology file rarely says what CUDA reports; keep detection's answers.
  if (existing->gpu && more.gpu && existing->gpu->p2p.empty()) existing->gpu->p2p = more.gpu->p2p;
  if (more.nic) {
    if (!existing->nic) existing->nic = Nic{};
    mergeNic(*existing->nic, *more.nic);
  }
  for (const PciNode& child : more.children) mergePci(existing->children, child);
}

}  // namespace

void mergeInto(System& base, const System& more) {
  for (const Cpu& cpu : more.cpus) {
    auto it = std::find_if(base.cpus.begin(), base.cpus.end(),
                           [&](const Cpu& c) { return c.numaId == cpu.numaId; });
    if (it == base.cpus.end()) {
      base.cpus.push_back(cpu);
      continue;
    }
    for (const PciNode& pci : cpu.pcis) mergePci(it->pcis, pci);
    for (const Nic& nic : cpu.nics) {
      if (it->nics.empty()) it->nics.push_back(Nic{});
      mergeNic(it->nics.front(), nic);
    }
  }
  if (base.hostId().empty() && !more.hostId().empty()) base.setHostId(more.hostId());
}

}  // namespace loom::topology
