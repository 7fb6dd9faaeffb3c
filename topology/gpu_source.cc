#include "topology/gpu_source.h"

#include <dlfcn.h>

#include <nlohmann/json.hpp>

#include "common/cuda_probe.h"
#include "topology/system.h"

namespace loom::topology {
namespace {

// The few NVML types used, as the NVML headers define them (stable ABI since R450).
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr unsigned kNvmlMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS
struct NvmlPciInfo {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
struct NvmlMemory {
  unsigned long long total, free, used;
};

class NvmlSource : public GpuSource {
 public:
  ~NvmlSource() override {
    if (initialized_) shutdown_();
    if (lib_) dlclose(lib_);
  }
  std::string name() const override { return "NVML"; }

  Result<std::vector<GpuRecord>> query() override {
    LOOM_TRY(load());
    unsigned count = 0;
    LOOM_TRY(check(getCount_(&count), "nvmlDeviceGetCount"));
    std::vector<GpuRecord> out;
    for (unsigned i = 0; i < count; ++i) {
      NvmlDevice dev = nullptr;
      LOOM_TRY(check(getHandle_(i, &dev), "nvmlDeviceGetHandleByIndex"));
      GpuRecord r;
      r.index = static_cast<int>(i);
      NvmlPciInfo pci{};
      LOOM_TRY(check(getPci_(dev, &pci), "nvmlDeviceGetPciInfo"));
      auto bus = normalizeBusId(pci.busId);
      if (!bus) return bus.status().withContext("NVML GPU " + std::to_string(i));
      r.busId = bus.value();
      char name[96] = {};
      if (getName_ && getName_(dev, name, sizeof(name)) == kNvmlSuccess) r.name = name;
      int major = 0, minor = 0;
      if (getCc_ && getCc_(dev, &major, &minor) == kNvmlSuccess) r.sm = major * 10 + minor;
      NvmlMemory mem{};
      if (getMem_ && getMem_(dev, &mem) == kNvmlSuccess) r.memoryBytes = mem.total;
      for (unsigned l = 0; getLinkState_ && l < kNvmlMaxLinks; ++l) {
        int active = 0;
        if (getLinkState_(dev, l, &active) != kNvmlSuccess || !active) continue;
        NvlinkPeerInfo(dev, l, r);
      }
      out.push_back(std::move(r));
    }
    if (out.size() >= 2) {
      // Without a CUDA driver the records go out without P2P answers; detection says so.
      Status st = addCudaP2p(out);
      p2pError_ = st.isOk() ? "" : st.message();
    }
    return out;
  }

  std::string p2pUnavailable() const override {
    return p2pError_.empty() ? GpuSource::p2pUnavailable() : p2pError_;
  }

 private:
  void NvlinkPeerInfo(NvmlDevice dev, unsigned l, GpuRecord& r) {
    NvmlPciInfo remote{};
    if (!getRemotePci_ || getRemotePci_(dev, l, &remote) != kNvmlSuccess) return;
    auto bus = normalizeBusId(remote.busId);
    if (!bus) return;
    NvLinkRecord link;
    link.link = static_cast<int>(l);
    link.remoteBusId = bus.value();
    int type = -1;
    if (getRemoteType_ && getRemoteType_(dev, l, &type) == kNvmlSuccess) {
      link.peer = type == 0   ? NvLinkPeer::kGpu
                  : type == 1 ? NvLinkPeer::kCpu
                  : type == 2 ? NvLinkPeer::kSwitch
                              : NvLinkPeer::kUnknown;
    }
    r.nvlinks.push_back(link);
  }

  Status check(NvmlReturn rc, const char* what) const {
    if (rc == kNvmlSuccess) return Status::ok();
    const char* msg = errorString_ ? errorString_(rc) : "unknown error";
    return errorf(Code::kSystemError, "%s failed: %s (NVML error %d)", what, msg, rc);
  }

  template <typename T>
  void sym(T& fn, const char* name) {
    fn = reinterpret_cast<T>(dlsym(lib_, name));
  }

  Status load() {
    if (initialized_) return Status::ok();
    if (!lib_) {
      lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
      if (!lib_) {
        const char* err = dlerror();
        return errorf(Code::kSystemError, "cannot load libnvidia-ml.so.1 (%s)", err ? err : "?");
      }
    }
    sym(init_, "nvmlInit_v2");
    sym(shutdown_, "nvmlShutdown");
    sym(errorString_, "nvmlErrorString");
    sym(getCount_, "nvmlDeviceGetCount_v2");
    sym(getHandle_, "nvmlDeviceGetHandleByIndex_v2");
    sym(getPci_, "nvmlDeviceGetPciInfo_v3");
    sym(getName_, "nvmlDeviceGetName");
    sym(getCc_, "nvmlDeviceGetCudaComputeCapability");
    sym(getMem_, "nvmlDeviceGetMemoryInfo");
    sym(getLinkState_, "nvmlDeviceGetNvLinkState");
    sym(getRemotePci_, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    sym(getRemoteType_, "nvmlDeviceGetNvLinkRemoteDeviceType");
    if (!init_ || !shutdown_ || !getCount_ || !getHandle_ || !getPci_) {
      return errorf(Code::kSystemError,
                    "libnvidia-ml.so.1 lacks nvmlInit_v2 or device queries (driver too old)");
    }
    LOOM_TRY(check(init_(), "nvmlInit"));
    initialized_ = true;
    return Status::ok();
  }

  void* lib_ = nullptr;
  bool initialized_ = false;
  std::string p2pError_;  // why the last query has no P2P answers
  NvmlReturn (*init_)() = nullptr;
  NvmlReturn (*shutdown_)() = nullptr;
  const char* (*errorString_)(NvmlReturn) = nullptr;
  NvmlReturn (*getCount_)(unsigned*) = nullptr;
  NvmlReturn (*getHandle_)(unsigned, NvmlDevice*) = nullptr;
  NvmlReturn (*getPci_)(NvmlDevice, NvmlPciInfo*) = nullptr;
  NvmlReturn (*getName_)(NvmlDevice, char*, unsigned) = nullptr;
  NvmlReturn (*getCc_)(NvmlDevice, int*, int*) = nullptr;
  NvmlReturn (*getMem_)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*getLinkState_)(NvmlDevice, unsigned, int*) = nullptr;
  NvmlReturn (*getRemotePci_)(NvmlDevice, unsigned, NvmlPciInfo*) = nullptr;
  NvmlReturn (*getRemoteType_)(NvmlDevice, unsigned, int*) = nullptr;
};

class RecordedSource : public GpuSource {
 public:
  RecordedSource(const Reader& reader, std::string path)
      : reader_(reader), path_(std::move(path)) {}
  std::string name() const override { return "recorded NVML answers (" + path_ + ")"; }
  Result<std::vector<GpuRecord>> query() override {
    LOOM_ASSIGN_OR_RETURN(std::string text, reader_.readFile(path_));
    auto r = gpuRecordsFromJson(text);
    if (!r) return r.status().withContext(path_);
    return r;
  }

 private:
  const Reader& reader_;
  std::string path_;
};

const char* peerName(NvLinkPeer p) {
  switch (p) {
    case NvLinkPeer::kGpu: return "gpu";
    case NvLinkPeer::kSwitch: return "nvswitch";
    case NvLinkPeer::kCpu: return "cpu";
    case NvLinkPeer::kUnknown: return "unknown";
  }
  return "unknown";
}

}  // namespace

std::unique_ptr<GpuSource> makeNvmlSource() {
  return std::make_unique<NvmlSource>();
}

std::unique_ptr<GpuSource> makeRecordedGpuSource(const Reader& reader, std::string path) {
  return std::make_unique<RecordedSource>(reader, std::move(path));
}

Status addCudaP2p(std::vector<GpuRecord>& gpus) {
  LOOM_ASSIGN_OR_RETURN(int count, cuda::deviceCount());
  // CUDA's order is not NVML's (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER): match by bus id.
  std::vector<int> ordinal(gpus.size(), -1);
  for (int c = 0; c < count; ++c) {
    auto bus = normalizeBusId(cuda::deviceBusId(c));
    if (!bus) continue;
    for (size_t i = 0; i < gpus.size(); ++i)
      if (gpus[i].busId == bus.value()) ordinal[i] = c;
  }
  std::vector<std::vector<P2pPeer>> found(gpus.size());
  for (size_t i = 0; i < gpus.size(); ++i) {
    for (size_t j = 0; j < gpus.size() && ordinal[i] >= 0; ++j) {
      if (i == j || ordinal[j] < 0) continue;
      LOOM_ASSIGN_OR_RETURN(cuda::PeerAccess a, cuda::peerAccess(ordinal[i], ordinal[j]));
      found[i].push_back(P2pPeer{gpus[j].busId, a.access, a.rank, a.atomics});
    }
  }
  for (size_t i = 0; i < gpus.size(); ++i)
    if (ordinal[i] >= 0) gpus[i].p2p = std::move(found[i]);
  return Status::ok();
}

std::string gpuRecordsToJson(const std::vector<GpuRecord>& records) {
  nlohmann::ordered_json gpus = nlohmann::ordered_json::array();
  for (const GpuRecord& r : records) {
    nlohmann::ordered_json j;
    j["index"] = r.index;
    j["busid"] = r.busId;
    j["name"] = r.name;
    j["sm"] = r.sm;
    j["memory_mib"] = r.memoryBytes >> 20;
    nlohmann::ordered_json links = nlohmann::ordered_json::array();
    for (const NvLinkRecord& l : r.nvlinks)
      links.push_back({{"link", l.link}, {"remote", l.remoteBusId}, {"peer", peerName(l.peer)}});
    j["nvlinks"] = links;
    if (r.p2p) {
      nlohmann::ordered_json peers = nlohmann::ordered_json::array();
      for (const P2pPeer& p : *r.p2p) {
        peers.push_back(
            {{"peer", p.target}, {"access", p.access}, {"rank", p.rank}, {"atomics", p.atomics}});
      }
      j["p2p"] = peers;
    }
    gpus.push_back(j);
  }
  nlohmann::ordered_json root;
  root["gpus"] = gpus;
  return root.dump(2) + "\n";
}

namespace {
Result<std::vector<GpuRecord>> parseGpuRecords(const std::string& text) {
  nlohmann::json root = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object() || !root.contains("gpus") ||
      !root["gpus"].is_array()) {
    return errorf(Code::kInvalidArgument, "not a recorded NVML answer (want {\"gpus\": [...]})");
  }
  std::vector<GpuRecord> out;
  for (const auto& g : root["gpus"]) {
    if (!g.is_object() || !g.contains("busid") || !g["busid"].is_string()) {
      return errorf(Code::kInvalidArgument, "GPU entry %zu has no busid", out.size());
    }
    GpuRecord r;
    r.index = g.value("index", static_cast<int>(out.size()));
    LOOM_ASSIGN_OR_RETURN(r.busId, normalizeBusId(g["busid"].get<std::string>()));
    r.name = g.value("name", "");
    r.sm = g.value("sm", 0);
    r.memoryBytes = g.value("memory_mib", uint64_t{0}) << 20;
    if (g.contains("nvlinks") && g["nvlinks"].is_array()) {
      for (const auto& l : g["nvlinks"]) {
        if (!l.is_object() || !l.contains("remote") || !l["remote"].is_string()) continue;
        NvLinkRecord link;
        link.link = l.value("link", 0);
        LOOM_ASSIGN_OR_RETURN(link.remoteBusId, normalizeBusId(l["remote"].get<std::string>()));
        std::string peer = l.value("peer", "unknown");
        link.peer = peer == "gpu"        ? NvLinkPeer::kGpu
                    : peer == "nvswitch" ? NvLinkPeer::kSwitch
                    : peer == "cpu"      ? NvLinkPeer::kCpu
                                         : NvLinkPeer::kUnknown;
        r.nvlinks.push_back(link);
      }
    }
    if (g.contains("p2p") && g["p2p"].is_array()) {
      std::vector<P2pPeer> peers;
      for (const auto& p : g["p2p"]) {
        if (!p.is_object() || !p.contains("peer") || !p["peer"].is_string()) {
          return errorf(Code::kInvalidArgument, "GPU %s: a p2p entry has no peer", r.busId.c_str());
        }
        P2pPeer peer;
        LOOM_ASSIGN_OR_RETURN(peer.target, normalizeBusId(p["peer"].get<std::string>()));
        peer.access = p.value("access", false);
        peer.rank = p.value("rank", 0);
        peer.atomics = p.value("atomics", false);
        peers.push_back(std::move(peer));
      }
      r.p2p = std::move(peers);
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

Result<std::vector<GpuRecord>> gpuRecordsFromJson(const std::string& text) {
  try {
    return parseGpuRecords(text);
  } catch (const std::exception& e) {  // a field of the wrong type
    return errorf(Code::kInvalidArgument, "bad recorded NVML answer: %s", e.what());
  }
}

}  // namespace loom::topology
