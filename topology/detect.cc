#include "topology/detect.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>

#include "common/settings.h"
#include "topology/detect_internal.h"
#include "topology/xml.h"

namespace loom::topology {
namespace detail {

bool looksLikeBusId(const std::string& s) {
  // dddd:bb:dd.f
  if (s.size() != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9, 11})
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

std::string baseName(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

PciTreeBuilder::PciTreeBuilder(const Reader& reader, System& system, Warnings& warnings)
    : reader_(reader), system_(system), warnings_(warnings) {}

PciNode PciTreeBuilder::describe(const std::string& busId) const {
  const std::string dir = "/sys/bus/pci/devices/" + busId + "/";
  PciNode n;
  n.busId = busId;
  n.pciClass = reader_.readTrimmed(dir + "class");
  // sysfs writes the class with its programming-interface byte; NCCL keeps it too.
  n.vendor = reader_.readTrimmed(dir + "vendor");
  n.device = reader_.readTrimmed(dir + "device");
  n.subsystemVendor = reader_.readTrimmed(dir + "subsystem_vendor");
  n.subsystemDevice = reader_.readTrimmed(dir + "subsystem_device");
  // The maximum, not the current, link: idle GPUs train their links down.
  n.linkSpeed = reader_.readTrimmed(dir + "max_link_speed");
  std::string width = reader_.readTrimmed(dir + "max_link_width");
  n.linkWidth = std::atoi(width.c_str());
  if (n.linkSpeed == "Unknown") n.linkSpeed.clear();
  return n;
}

Result<PciNode*> PciTreeBuilder::insert(const std::string& busId) {
  // /sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:05:00.0
  auto real = reader_.realPath("/sys/bus/pci/devices/" + busId);
  std::vector<std::string> chain;
  if (real) {
    std::stringstream ss(real.value());
    std::string part;
    while (std::getline(ss, part, '/'))
      if (looksLikeBusId(part)) chain.push_back(part);
  }
  if (chain.empty() || chain.back() != busId) chain = {busId};
  // NCCL's shape: drop the root port, then keep every switch's upstream port and drop
  // its downstream port; the device itself last.
  std::vector<std::string> kept;
  for (size_t i = 1; i + 1 < chain.size(); i += 2) kept.push_back(chain[i]);
  kept.push_back(busId);

  int numa =
      std::atoi(reader_.readTrimmed("/sys/bus/pci/devices/" + busId + "/numa_node", "-1").c_str());
  Cpu* cpu = nullptr;
  for (Cpu& c : system_.cpus)
    if (c.numaId == numa) cpu = &c;
  if (!cpu) {
    warnings_.add("numa-device", "PCI devices report no usable NUMA node (numa_node " +
                                     std::to_string(numa) + " for " + busId +
                                     "); attaching them to NUMA node " +
                                     std::to_string(system_.cpus.front().numaId));
    cpu = &system_.cpus.front();
  }
  std::vector<PciNode>* level = &cpu->pcis;
  PciNode* node = nullptr;
  for (const std::string& bus : kept) {
    auto it = std::find_if(level->begin(), level->end(),
                           [&](const PciNode& p) { return p.busId == bus; });
    if (it == level->end()) {
      level->push_back(describe(bus));
      it = level->end() - 1;
    }
    node = &*it;
    level = &node->children;
  }
  return node;
}

std::string Warnings::add(const std::string& source, const std::string& message) {
  if (seen_.insert(source).second) lines_.push_back(message);
  return message;
}

}  // namespace detail

namespace {

using detail::Warnings;

std::string cpuInfoField(const std::string& cpuinfo, const std::string& key) {
  std::stringstream ss(cpuinfo);
  std::string line;
  while (std::getline(ss, line)) {
    if (line.empty()) break;  // first processor only
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string k = line.substr(0, colon);
    k.erase(k.find_last_not_of(" \t") + 1);
    if (k != key) continue;
    std::string v = line.substr(colon + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    return v;
  }
  return "";
}

// "0-3,8-11" -> sysfs cpumap "00000f0f".
std::string maskFromList(const std::string& list) {
  std::vector<bool> bits;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    int lo = std::atoi(item.c_str()), hi = lo;
    size_t dash = item.find('-');
    if (dash != std::string::npos) hi = std::atoi(item.c_str() + dash + 1);
    if (lo < 0 || hi < lo || hi > 65535) return "";
    if (bits.size() <= static_cast<size_t>(hi)) bits.resize(hi + 1);
    for (int i = lo; i <= hi; ++i) bits[i] = true;
  }
  if (bits.empty()) return "";
  size_t words = (bits.size() + 31) / 32;
  std::string out;
  for (size_t w = words; w-- > 0;) {
    uint32_t v = 0;
    for (int b = 0; b < 32; ++b)
      if (w * 32 + b < bits.size() && bits[w * 32 + b]) v |= 1u << b;
    char buf[16];
    std::snprintf(buf, sizeof(buf), "%08x", v);
    if (!out.empty()) out += ",";
    out += buf;
  }
  return out;
}

const char* compiledArch() {
#if defined(__x86_64__)
  return "x86_64";
#elif defined(__aarch64__)
  return "arm64";
#elif defined(__powerpc64__)
  return "ppc64";
#else
  return "unknown";
#endif
}

void detectCpus(const Reader& reader, System& system, Warnings& warnings) {
  std::string cpuinfo =
      reader.readFile("/proc/cpuinfo").isOk() ? reader.readFile("/proc/cpuinfo").value() : "";
  if (cpuinfo.empty())
    warnings.add("cpuinfo", "cannot read /proc/cpuinfo: CPU vendor and model unknown");
  Cpu proto;
  proto.arch = reader.readTrimmed("/proc/sys/kernel/arch", "");
  if (proto.arch.empty()) proto.arch = reader.isLive() ? compiledArch() : "x86_64";
  if (proto.arch == "aarch64") proto.arch = "arm64";
  proto.vendor = cpuInfoField(cpuinfo, "vendor_id");
  std::string family = cpuInfoField(cpuinfo, "cpu family"), model = cpuInfoField(cpuinfo, "model");
  if (!family.empty()) proto.familyId = std::atoi(family.c_str());
  if (!model.empty()) proto.modelId = std::atoi(model.c_str());

  auto nodes = reader.listDir("/sys/devices/system/node");
  std::vector<int> ids;
  if (nodes) {
    for (const std::string& name : nodes.value()) {
      if (name.size() > 4 && name.compare(0, 4, "node") == 0 &&
          std::all_of(name.begin() + 4, name.end(), ::isdigit)) {
        ids.push_back(std::atoi(name.c_str() + 4));
      }
    }
  }
  std::sort(ids.begin(), ids.end());
  for (int id : ids) {
    Cpu cpu = proto;
    cpu.numaId = id;
    cpu.affinity =
        reader.readTrimmed("/sys/devices/system/node/node" + std::to_string(id) + "/cpumap");
    system.cpus.push_back(std::move(cpu));
  }
  if (system.cpus.empty()) {
    warnings.add("numa",
                 "no NUMA information (/sys/devices/system/node missing): one CPU node with "
                 "unknown NUMA id");
    Cpu cpu = proto;
    cpu.affinity = maskFromList(reader.readTrimmed("/sys/devices/system/cpu/online"));
    system.cpus.push_back(std::move(cpu));
  }
}

std::unique_ptr<GpuSource> defaultGpuSource(const Reader& reader) {
  if (reader.isLive()) return makeNvmlSource();
  if (reader.exists("/loom/nvml.json")) return makeRecordedGpuSource(reader, "/loom/nvml.json");
  return nullptr;
}

bool gpuDirectRdma(const Reader& reader) {
  return reader.exists("/sys/kernel/mm/memory_peers/nv_mem/version") ||
         reader.exists("/sys/module/nvidia_peermem") || reader.exists("/sys/module/nv_peer_mem");
}

// One line when P2P capability was not checked (for all GPUs or some), one naming the
// pairs CUDA gives no peer access (their paths then go through host memory).
void reportP2p(const std::vector<std::string>& busIds, const std::vector<GpuRecord>& records,
               const GpuSource& source, Warnings& warnings) {
  if (busIds.size() < 2) return;
  std::vector<std::string> unchecked, denied;
  for (const std::string& bus : busIds) {
    auto rec = std::find_if(records.begin(), records.end(),
                            [&](const GpuRecord& r) { return r.busId == bus; });
    if (rec == records.end() || !rec->p2p) {
      unchecked.push_back(bus);
      continue;
    }
    for (const P2pPeer& p : *rec->p2p) {
      bool known = std::find(busIds.begin(), busIds.end(), p.target) != busIds.end();
      std::string pair = std::min(bus, p.target) + "-" + std::max(bus, p.target);
      if (!p.access && known && std::find(denied.begin(), denied.end(), pair) == denied.end()) {
        denied.push_back(pair);
      }
    }
  }
  auto join = [](const std::vector<std::string>& items) {
    std::string out;
    for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
    return out;
  };
  if (unchecked.size() == busIds.size()) {
    warnings.add("p2p", "P2P capability between GPUs not checked (" + source.p2pUnavailable() +
                            "): GPU pairs are assumed peer-capable");
  } else if (!unchecked.empty()) {
    warnings.add("p2p", "P2P capability not checked for GPU " + join(unchecked) +
                            " (not visible to CUDA): assumed peer-capable");
  }
  if (!denied.empty()) {
    warnings.add("p2p-denied", "CUDA reports no peer access for GPU pairs " + join(denied) +
                                   ": their traffic is planned through host memory");
  }
}

Status detectGpus(const Reader& reader, const DetectOptions& options, detail::PciTreeBuilder& tree,
                  System& system, Warnings& warnings) {
  std::vector<std::string> busIds;
  if (auto devices = reader.listDir("/sys/bus/pci/devices")) {
    for (const std::string& bus : devices.value()) {
      std::string cls = reader.readTrimmed("/sys/bus/pci/devices/" + bus + "/class");
      std::string vendor = reader.readTrimmed("/sys/bus/pci/devices/" + bus + "/vendor");
      if (vendor == "0x10de" && cls.rfind("0x03", 0) == 0) busIds.push_back(bus);
    }
  } else {
    warnings.add("pci", "cannot list /sys/bus/pci/devices (" + devices.status().message() +
                            "): no PCI tree; GPUs only from NVML");
  }

  std::unique_ptr<GpuSource> owned;
  GpuSource* source = options.gpuSource;
  if (!source) {
    owned = defaultGpuSource(reader);
    source = owned.get();
  }
  std::vector<GpuRecord> records;
  bool answered = false;
  if (!source) {
    if (!busIds.empty()) {
      warnings.add("nvml", "no NVML answers recorded in " + reader.describe() +
                               " (loom/nvml.json): SM versions from a device-id table, no NVLinks,"
                               " P2P capability not checked");
    }
  } else if (auto r = source->query()) {
    records = std::move(r.value());
    answered = true;
  } else if (!busIds.empty() || reader.isLive()) {
    // A machine without NVIDIA GPUs has no driver either; say so only where it matters.
    if (!busIds.empty()) {
      warnings.add("nvml", source->name() + " unavailable (" + r.status().message() +
                               "): SM versions from a device-id table, no NVLink information,"
                               " P2P capability not checked");
    }
  }
  for (const GpuRecord& r : records) {
    if (std::find(busIds.begin(), busIds.end(), r.busId) == busIds.end()) {
      warnings.add("nvml-only", "GPU " + r.busId +
                                    " is known to NVML but not in sysfs; placing it under CPU " +
                                    std::to_string(system.cpus.front().numaId));
      busIds.push_back(r.busId);
    }
  }
  std::sort(busIds.begin(), busIds.end());
  const bool gdr = gpuDirectRdma(reader);
  for (size_t i = 0; i < busIds.size(); ++i) {
    LOOM_ASSIGN_OR_RETURN(PciNode * node, tree.insert(busIds[i]));
    Gpu gpu;
    auto rec = std::find_if(records.begin(), records.end(),
                            [&](const GpuRecord& r) { return r.busId == busIds[i]; });
    if (rec != records.end()) {
      gpu.dev = rec->index;
      gpu.sm = rec->sm;
      if (rec->memoryBytes) gpu.extra.emplace_back("mem", std::to_string(rec->memoryBytes >> 20));
      std::map<std::string, NvLink> links;
      for (const NvLinkRecord& l : rec->nvlinks) {
        NvLink& link = links[l.remoteBusId];
        link.target = l.remoteBusId;
        ++link.count;
        switch (l.peer) {
          case NvLinkPeer::kSwitch: link.targetClass = kClassNvSwitch; break;
          case NvLinkPeer::kCpu: link.targetClass = kClassCpu; break;
          case NvLinkPeer::kGpu:
          case NvLinkPeer::kUnknown: {
            std::string cls =
                reader.readTrimmed("/sys/bus/pci/devices/" + l.remoteBusId + "/class");
            link.targetClass = !cls.empty() ? cls : (l.peer == NvLinkPeer::kGpu ? kClassGpu3d : "");
            break;
          }
        }
      }
      for (auto& [_, link] : links) gpu.nvlinks.push_back(std::move(link));
      if (rec->p2p) gpu.p2p = *rec->p2p;
    } else {
      gpu.dev = static_cast<int>(i);
      gpu.sm = smFromDeviceId(node->device);
    }
    if (node->pciClass.empty()) node->pciClass = kClassGpu3d;
    if (node->vendor.empty()) node->vendor = "0x10de";
    gpu.gdr = gdr && gpu.sm >= 60;
    node->gpu = std::move(gpu);
  }
  if (answered) reportP2p(busIds, records, *source, warnings);
  if (!busIds.empty() && !gdr) {
    warnings.add("gdr",
                 "GPUDirect RDMA unavailable (no nvidia_peermem module): GPU-NIC traffic goes "
                 "through host memory");
  }
  return Status::ok();
}

}  // namespace

int smFromDeviceId(const std::string& deviceId) {
  static const std::map<std::string, int> kTable = {
      {"0x15f8", 60}, {"0x15f9", 60},  {"0x1db1", 70},  {"0x1db4", 70}, {"0x1db5", 70},
      {"0x1db6", 70}, {"0x20b0", 80},  {"0x20b2", 80},  {"0x20b3", 80}, {"0x20b5", 80},
      {"0x20f1", 80}, {"0x20f3", 80},  {"0x2230", 86},  {"0x2235", 86}, {"0x26b5", 89},
      {"0x26b9", 89}, {"0x27b8", 89},  {"0x2321", 90},  {"0x2324", 90}, {"0x2330", 90},
      {"0x2331", 90}, {"0x2335", 90},  {"0x2339", 90},  {"0x233a", 90}, {"0x233b", 90},
      {"0x2342", 90}, {"0x2901", 100}, {"0x2941", 100},
  };
  auto it = kTable.find(deviceId);
  return it == kTable.end() ? 0 : it->second;
}

std::string detectHostId(const Reader& reader) {
  if (std::string env = settings::get(settings::kHostId); !env.empty()) return env;
  std::string host = reader.readTrimmed("/proc/sys/kernel/hostname", "unknown-host");
  std::string boot = reader.readTrimmed("/proc/sys/kernel/random/boot_id", "");
  // FNV-1a over hostname and boot id: short, stable, and differs when either does.
  uint64_t h = 1469598103934665603ull;
  for (char c : host + "\n" + boot) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return host + "-" + buf;
}

Result<Detected> detectLocal(const Reader& reader, const DetectOptions& options) {
  Detected out;
  Warnings warnings;
  System& system = out.system;
  if (!reader.exists("/sys")) {
    return errorf(Code::kSystemError, "cannot read %s/sys: no sysfs to detect the topology from",
                  reader.describe() == "/" ? "" : reader.describe().c_str());
  }
  detectCpus(reader, system, warnings);
  detail::PciTreeBuilder tree(reader, system, warnings);
  LOOM_TRY(detectGpus(reader, options, tree, system, warnings));
  LOOM_TRY(detail::detectNics(reader, options, tree, system, warnings));
  system.setHostId(detectHostId(reader));
  out.warnings = warnings.lines();
  return out;
}

std::string topoFileSetting() {
  return settings::get(settings::kTopoFile);
}

Status overlayTopoFile(Detected& detected, const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(XmlReadResult loaded, readXmlFile(path));
  System merged = std::move(loaded.system);
  mergeInto(merged, detected.system);
  // The host id is the running host's, whatever the file says (it may come from
  // another machine of the same shape).
  merged.setHostId(detected.system.hostId());
  detected.system = std::move(merged);
  for (std::string& w : loaded.warnings) detected.warnings.push_back(path + ": " + std::move(w));
  return Status::ok();
}

Result<Detected> detectWithEnvironment(const Reader& reader, const DetectOptions& options) {
  LOOM_ASSIGN_OR_RETURN(Detected detected, detectLocal(reader, options));
  if (std::string file = topoFileSetting(); !file.empty()) {
    LOOM_TRY(overlayTopoFile(detected, file));
  }
  if (std::string dump = settings::get(settings::kTopoDumpFile); !dump.empty()) {
    LOOM_TRY(writeXmlFile(detected.system, dump));
  }
  return detected;
}

}  // namespace loom::topology
