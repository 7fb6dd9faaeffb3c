#include "tools/topo_record.h"

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "topology/gpu_source.h"

namespace loom::tools {
namespace fs = std::filesystem;
namespace {

class Recorder {
 public:
  explicit Recorder(std::string dir) : dir_(std::move(dir)) {}

  // Copies a live file into the tree (at its real path, with a link at `path` when
  // the live path goes through symlinks). Missing files are skipped.
  void copyFile(const std::string& path) {
    std::error_code ec;
    if (!fs::exists(path, ec)) return;
    std::string real = mirror(path);
    std::ifstream in(real, std::ios::binary);
    if (!in) return;
    std::stringstream ss;
    ss << in.rdbuf();
    std::ofstream out(dir_ + real, std::ios::binary | std::ios::trunc);
    out << ss.str();
  }

  // Makes the directory for `path` (resolved) and a link at `path` pointing to it.
  std::string mirror(const std::string& path) {
    std::error_code ec;
    std::string real = fs::canonical(path, ec).string();
    if (ec) real = path;
    fs::create_directories(fs::path(dir_ + real).parent_path(), ec);
    if (real != path) link(path, real);
    return real;
  }

  // A symlink in the tree from `path` to `target` (absolute, read relative to the root).
  void link(const std::string& path, const std::string& target) {
    std::error_code ec;
    // Resolve the link's parent first so links inside linked folders land right.
    std::string parent = fs::path(path).parent_path().string();
    std::string realParent = fs::canonical(parent, ec).string();
    if (ec) realParent = parent;
    std::string at = dir_ + realParent + "/" + fs::path(path).filename().string();
    fs::create_directories(dir_ + realParent, ec);
    if (fs::is_symlink(at, ec) || fs::exists(at, ec)) return;
    fs::create_symlink(target, at, ec);
  }

  void dir(const std::string& path) {
    std::error_code ec;
    if (!fs::exists(path, ec)) return;
    std::string real = mirror(path);
    fs::create_directories(dir_ + real, ec);
  }

  // A PCI device and every PCI ancestor with the attributes detection reads.
  void pciDevice(const std::string& bdf) {
    std::string path = "/sys/bus/pci/devices/" + bdf;
    std::error_code ec;
    std::string real = fs::canonical(path, ec).string();
    if (ec) return;
    link(path, real);
    for (fs::path p = real; p.string().rfind("/sys/devices/pci", 0) == 0 && p.has_filename();
         p = p.parent_path()) {
      for (const char* f : {"class", "vendor", "device", "subsystem_vendor", "subsystem_device",
                            "max_link_speed", "max_link_width", "numa_node"}) {
        copyFile(p.string() + "/" + f);
      }
    }
  }

  void writeText(const std::string& path, const std::string& text) {
    std::error_code ec;
    fs::create_directories(fs::path(dir_ + path).parent_path(), ec);
    std::ofstream(dir_ + path, std::ios::binary | std::ios::trunc) << text;
  }

 private:
  std::string dir_;
};

std::string readLive(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

Status recordMachine(const std::string& dirArg) {
  std::error_code ec;
  fs::create_directories(dirArg, ec);
  if (ec)
    return errorf(Code::kSystemError, "cannot create %s: %s", dirArg.c_str(), ec.message().c_str());
  std::string root = fs::canonical(dirArg, ec).string();
  Recorder r(root);

  std::string cpuinfo = readLive("/proc/cpuinfo");
  r.writeText("/proc/cpuinfo", cpuinfo.substr(0, cpuinfo.find("\n\n") + 1));
  r.copyFile("/proc/sys/kernel/arch");
  r.writeText("/proc/sys/kernel/hostname", "recorded-host\n");
  r.copyFile("/sys/devices/system/cpu/online");
  for (const auto& e : fs::directory_iterator("/sys/devices/system/node", ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind("node", 0) == 0 && name.size() > 4 &&
        std::isdigit(static_cast<unsigned char>(name[4]))) {
      r.copyFile(e.path().string() + "/cpumap");
    }
  }
  r.copyFile("/sys/kernel/mm/memory_peers/nv_mem/version");
  r.dir("/sys/module/nvidia_peermem");
  r.dir("/sys/module/nv_peer_mem");

  // NVIDIA display/3D devices and NVSwitches, with their bridges.
  for (const auto& e : fs::directory_iterator("/sys/bus/pci/devices", ec)) {
    std::string bdf = e.path().filename().string();
    std::string cls = trim(readLive(e.path().string() + "/class"));
    std::string vendor = trim(readLive(e.path().string() + "/vendor"));
    if (vendor == "0x10de" && (cls.rfind("0x03", 0) == 0 || cls.rfind("0x0680", 0) == 0))
      r.pciDevice(bdf);
  }
  r.dir("/sys/class/infiniband");
  for (const auto& e : fs::directory_iterator("/sys/class/infiniband", ec)) {
    std::string d = e.path().string();
    r.dir(d);
    r.copyFile(d + "/node_guid");
    std::string dev = fs::canonical(d + "/device", ec).string();
    if (!ec) {
      r.link(d + "/device", dev);
      r.pciDevice(fs::path(dev).filename().string());
    }
    for (const auto& p : fs::directory_iterator(d + "/ports", ec)) {
      std::string pd = p.path().string();
      for (const char* f : {"state", "rate", "link_layer"}) r.copyFile(pd + "/" + f);
      // The GID table as detection reads it: every slot up to the first missing one,
      // type and netdev for the populated ones only (an empty slot's fail to read).
      for (int i = 0; i < 256 && fs::exists(pd + "/gids/" + std::to_string(i), ec); ++i) {
        const std::string index = std::to_string(i);
        r.copyFile(pd + "/gids/" + index);
        std::string gid = readLive(pd + "/gids/" + index);
        if (gid.find_first_not_of("0:\n") == std::string::npos) continue;
        r.copyFile(pd + "/gid_attrs/types/" + index);
        r.copyFile(pd + "/gid_attrs/ndevs/" + index);
      }
    }
  }
  r.dir("/sys/class/net");
  for (const auto& e : fs::directory_iterator("/sys/class/net", ec)) {
    std::string d = e.path().string();
    r.dir(d);
    for (const char* f : {"type", "speed", "operstate", "address"}) r.copyFile(d + "/" + f);
    if (fs::exists(d + "/bridge", ec)) r.dir(d + "/bridge");
    std::string dev = fs::canonical(d + "/device", ec).string();
    if (!ec) {
      r.link(d + "/device", dev);
      // The PCI function may sit above the device (virtio: .../0000:00:03.0/virtio2).
      for (fs::path p = dev; dev.rfind("/sys/devices/pci", 0) == 0 && p.has_filename();
           p = p.parent_path()) {
        std::string name = p.filename().string();
        if (name.size() == 12 && name[4] == ':' && name[7] == ':' && name[10] == '.') {
          r.pciDevice(name);
          break;
        }
      }
    }
  }

  auto nvml = topology::makeNvmlSource();
  if (auto gpus = nvml->query()) r.writeText("/loom/nvml.json", topology::gpuRecordsToJson(*gpus));
  return Status::ok();
}

}  // namespace loom::tools
