// NIC detection: RDMA devices from /sys/class/infiniband (what libibverbs itself reads),
// checked against libibverbs loaded with dlopen on a live machine; network interfaces
// from /sys/class/net, virtual ones marked.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "topology/detect_internal.h"
#include "topology/gid_table.h"

#if __has_include(<infiniband/verbs.h>)
#include <infiniband/verbs.h>
#define LOOM_HAVE_VERBS_HEADER 1
#endif

namespace loom::topology::detail {
namespace {

constexpr int kDefaultIbMaxConn = 131072;
constexpr int kDefaultSocketMaxConn = 65536;

// "400 Gb/sec (4X NDR)" -> 400000 Mb/s.
int rateMbps(const std::string& rate) {
  double gbps = std::atof(rate.c_str());
  return gbps > 0 ? static_cast<int>(gbps * 1000) : 0;
}

uint64_t parseGuid(const std::string& text) {
  std::string hex;
  for (char c : text)
    if (std::isxdigit(static_cast<unsigned char>(c))) hex += c;
  return hex.empty() ? 0 : std::strtoull(hex.c_str(), nullptr, 16);
}

// The PCI function behind a sysfs device link, or "" when it is not a PCI device.
std::string pciOf(const Reader& reader, const std::string& deviceLink) {
  auto real = reader.realPath(deviceLink);
  if (!real || real.value().rfind("/sys/devices/pci", 0) != 0) return "";
  // A virtio NIC's device is ".../0000:00:03.0/virtio2": the PCI function is above it.
  std::string path = real.value();
  while (!path.empty() && !looksLikeBusId(baseName(path))) path = path.substr(0, path.rfind('/'));
  return path.empty() ? "" : baseName(path);
}

// What libibverbs says: which devices it can open and their max_qp. Live machine only.
struct VerbsInfo {
  bool loaded = false;
  std::string error;
  std::map<std::string, int> maxQp;
};

VerbsInfo probeVerbs() {
  VerbsInfo info;
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    info.error = err ? err : "dlopen failed";
    return info;
  }
  info.loaded = true;
#ifdef LOOM_HAVE_VERBS_HEADER
  using GetList = ibv_device** (*)(int*);
  using FreeList = void (*)(ibv_device**);
  using GetName = const char* (*)(ibv_device*);
  using Open = ibv_context* (*)(ibv_device*);
  using Close = int (*)(ibv_context*);
  using Query = int (*)(ibv_context*, ibv_device_attr*);
  auto getList = reinterpret_cast<GetList>(dlsym(lib, "ibv_get_device_list"));
  auto freeList = reinterpret_cast<FreeList>(dlsym(lib, "ibv_free_device_list"));
  auto getName = reinterpret_cast<GetName>(dlsym(lib, "ibv_get_device_name"));
  auto open = reinterpret_cast<Open>(dlsym(lib, "ibv_open_device"));
  auto close = reinterpret_cast<Close>(dlsym(lib, "ibv_close_device"));
  auto query = reinterpret_cast<Query>(dlsym(lib, "ibv_query_device"));
  if (getList && freeList && getName && open && close && query) {
    int n = 0;
    ibv_device** list = getList(&n);
    for (int i = 0; list && i < n; ++i) {
      ibv_context* ctx = open(list[i]);
      if (!ctx) continue;
      ibv_device_attr attr{};
      if (query(ctx, &attr) == 0) info.maxQp[getName(list[i])] = attr.max_qp;
      close(ctx);
    }
    if (list) freeList(list);
  }
#endif
  // libibverbs keeps provider libraries loaded; closing it is safe but pointless.
  dlclose(lib);
  return info;
}

// First IPv4/IPv6 address of each interface (live machine only).
std::map<std::string, std::string> interfaceAddresses() {
  std::map<std::string, std::string> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || out.count(a->ifa_name)) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof(buf));
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, buf,
                sizeof(buf));
    } else {
      continue;
    }
    out[a->ifa_name] = buf;
  }
  freeifaddrs(list);
  return out;
}

const char* virtualKind(const std::string& name, bool bridge) {
  if (bridge) return "bridge";
  for (const char* prefix :
       {"veth", "docker", "virbr", "br-", "cni", "flannel", "cali", "tun", "tap", "vxlan", "lxc"})
    if (name.rfind(prefix, 0) == 0) return prefix;
  return "virtual";
}

struct Found {
  std::string busId;  // "" for non-PCI
  Net net;
};

}  // namespace

namespace {

// Records the port's GID table and the entry the ib transport uses ("gid", "gid_index",
// and for RoCE "roce" and "netdev"; common/roce_gid.h, with LOOM_IB_GID_INDEX and the
// address settings); warns when a RoCE port has none that the rule asks for.
void describeGids(const Reader& reader, const std::string& dev, const std::string& port,
                  const std::string& portDir, const std::string& layer, Net& net,
                  Warnings& warnings) {
  const bool roce = layer == "Ethernet";
  const std::string where = dev + " port " + port;
  net.gids = readGidTable(reader, portDir);
  if (net.gids.empty()) {
    if (roce) {
      warnings.add("gid-" + dev + "/" + port,
                   where +
                       " has no populated GID (no IP address on its interface?): "
                       "RoCE peers cannot address it");
    }
    return;
  }
  const roce::GidRule rule = roce::GidRule::fromSettings();
  const roce::GidChoice c = roce::chooseGid(roceTable(net.gids, !roce), !roce, rule, where);
  if (c.index < 0) {
    warnings.add("gid-" + dev + "/" + port, c.why);
    return;
  }
  const GidEntry& e = *std::find_if(net.gids.begin(), net.gids.end(),
                                    [&](const GidEntry& g) { return g.index == c.index; });
  if (roce) {
    if (!e.type.empty()) net.setAttr("roce", e.type.find("v2") != std::string::npos ? "v2" : "v1");
    if (!e.netdev.empty()) net.setAttr("netdev", e.netdev);
    if (!c.usual) warnings.add("gid-" + dev + "/" + port, where + ": " + c.why);
  }
  net.setAttr("gid", e.gid);
  net.setAttr("gid_index", std::to_string(c.index));
}

}  // namespace

Status detectNics(const Reader& reader, const DetectOptions& options, PciTreeBuilder& tree,
                  System& system, Warnings& warnings) {
  std::vector<Found> found;
  std::map<std::string, bool> rdmaFunctions;  // PCI functions that carry an RDMA device
  const bool gdr = reader.exists("/sys/kernel/mm/memory_peers/nv_mem/version") ||
                   reader.exists("/sys/module/nvidia_peermem") ||
                   reader.exists("/sys/module/nv_peer_mem");

  auto ibDevices = reader.listDir("/sys/class/infiniband");
  if (!ibDevices || ibDevices.value().empty()) {
    warnings.add("ib", "no RDMA devices (/sys/class/infiniband is " +
                           std::string(ibDevices ? "empty" : "missing") +
                           "): network over sockets only");
  }
  VerbsInfo verbs;
  bool haveIb = ibDevices && !ibDevices.value().empty();
  if (haveIb && reader.isLive() && options.probeIbverbs) {
    verbs = probeVerbs();
    if (!verbs.loaded) {
      warnings.add("ibverbs",
                   "RDMA devices present but libibverbs.so.1 cannot be loaded (" + verbs.error +
                       "): install rdma-core/libibverbs1; the IB transport is unavailable");
    }
  }
  if (haveIb) {
    for (const std::string& dev : ibDevices.value()) {
      const std::string dir = "/sys/class/infiniband/" + dev;
      std::string bus = pciOf(reader, dir + "/device");
      if (!bus.empty()) rdmaFunctions[bus] = true;
      uint64_t guid = parseGuid(reader.readTrimmed(dir + "/node_guid"));
      auto ports = reader.listDir(dir + "/ports");
      if (!ports) continue;
      for (const std::string& p : ports.value()) {
        const std::string pdir = dir + "/ports/" + p;
        std::string state = reader.readTrimmed(pdir + "/state");
        if (state.find("ACTIVE") == std::string::npos) {
          warnings.add("ib-down-" + dev + "/" + p,
                       dev + " port " + p + " is " +
                           (state.empty() ? "in an unknown state" : state) + ": not used");
          continue;
        }
        Net net;
        net.name = dev;
        net.port = std::atoi(p.c_str());
        net.speedMbps = rateMbps(reader.readTrimmed(pdir + "/rate"));
        net.guid = guid;
        net.gdr = gdr;
        auto qp = verbs.maxQp.find(dev);
        net.maxConn = qp != verbs.maxQp.end() ? qp->second : kDefaultIbMaxConn;
        std::string layer = reader.readTrimmed(pdir + "/link_layer", "InfiniBand");
        net.setAttr("link_layer", layer);
        describeGids(reader, dev, p, pdir, layer, net, warnings);
        net.setAttr("state", "up");
        if (reader.isLive() && options.probeIbverbs && verbs.loaded && qp == verbs.maxQp.end()) {
          warnings.add("ibverbs-open-" + dev,
                       "libibverbs cannot open " + dev + ": the IB transport will skip it");
          net.setAttr("verbs", "0");
        }
        found.push_back(Found{bus, std::move(net)});
      }
    }
  }

  std::map<std::string, std::string> addresses;
  if (reader.isLive()) addresses = interfaceAddresses();
  auto ifaces = reader.listDir("/sys/class/net");
  if (!ifaces) {
    warnings.add("netdev", "cannot list /sys/class/net (" + ifaces.status().message() +
                               "): no network interfaces");
  } else {
    std::vector<Found> physical, virt;
    for (const std::string& name : ifaces.value()) {
      const std::string dir = "/sys/class/net/" + name;
      if (reader.readTrimmed(dir + "/type") == "772" || name == "lo") continue;  // loopback
      auto real = reader.realPath(dir);
      bool isVirtual = real && real.value().rfind("/sys/devices/virtual/", 0) == 0;
      std::string bus = isVirtual ? "" : pciOf(reader, dir + "/device");
      if (!bus.empty() && rdmaFunctions.count(bus)) continue;  // the RDMA device already covers it
      Net net;
      net.name = name;
      int speed = std::atoi(reader.readTrimmed(dir + "/speed", "0").c_str());
      net.speedMbps = speed > 0 ? speed : 0;
      net.maxConn = kDefaultSocketMaxConn;
      std::string mac = reader.readTrimmed(dir + "/address");
      net.guid = parseGuid(mac);
      net.setAttr("link_layer", reader.readTrimmed(dir + "/type") == "32" ? "IPoIB" : "Ethernet");
      std::string state = reader.readTrimmed(dir + "/operstate", "unknown");
      net.setAttr("state", state);
      if (!mac.empty()) net.setAttr("address", mac);
      if (addresses.count(name)) net.setAttr("ip", addresses[name]);
      if (isVirtual) {
        net.setAttr("virtual", "1");
        net.setAttr("kind", virtualKind(name, reader.exists(dir + "/bridge")));
        virt.push_back(Found{"", std::move(net)});
      } else {
        physical.push_back(Found{bus, std::move(net)});
      }
    }
    for (auto& f : physical) found.push_back(std::move(f));
    for (auto& f : virt) found.push_back(std::move(f));
  }

  for (size_t i = 0; i < found.size(); ++i) {
    Found& f = found[i];
    f.net.dev = static_cast<int>(i);
    if (f.net.speedMbps == 0 && f.net.attr("virtual") != "1") {
      warnings.add("speed-" + f.net.name,
                   f.net.name + " reports no link speed; assuming 10 Gb/s for planning");
    }
    if (!f.busId.empty()) {
      LOOM_ASSIGN_OR_RETURN(PciNode * node, tree.insert(f.busId));
      if (!node->nic) node->nic = Nic{};
      node->nic->nets.push_back(std::move(f.net));
    } else {
      system.cpus.front().nics.push_back(Nic{{std::move(f.net)}, {}});
    }
  }
  return Status::ok();
}

}  // namespace loom::topology::detail
