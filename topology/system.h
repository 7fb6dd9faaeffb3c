// The machine as detected or loaded: a tree in the shape of NCCL's topology XML.
//
// A System mirrors NCCL's XML one to one (system > cpu > pci > ... > gpu/nic > net), so
// that an NCCL dump loads into loom and a loom dump loads into NCCL without loss.
// Attributes loom does not interpret are kept in `extra` and written back unchanged.
// Two things detection adds stay out of the XML, to keep dumps inside NCCL's limits
// (256 elements a file): an RDMA port's whole GID table (Net::gids) and the P2P answers
// of GPU pairs with access (Gpu::p2p keeps those without, as `no_p2p`).
// The graph that paths and the search work on is derived from a System (graph.h).
//
// All types here are plain values: copyable, comparable, no hidden state, safe to
// share read-only between threads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace loom::topology {

// Attributes kept verbatim, in the order they were read.
using Attrs = std::vector<std::pair<std::string, std::string>>;

// PCI class codes as NCCL writes them in `class` and `tclass` attributes.
inline constexpr const char* kClassPciBridge = "0x060400";
inline constexpr const char* kClassNvSwitch = "0x068000";
inline constexpr const char* kClassCpu = "0x068001";  // NVLink to a CPU (POWER9, Grace)
inline constexpr const char* kClassGpu3d = "0x030200";

// `count` NVLinks from the owning GPU to the PCI function `target`.
struct NvLink {
  std::string target;       // remote PCI bus id, normalized ("0000:1b:00.0")
  int count = 0;            // number of links (NVML: active links to that device)
  std::string targetClass;  // tclass: kClassGpu3d, kClassNvSwitch or kClassCpu
  Attrs extra;
  bool operator==(const NvLink&) const = default;
};

// What CUDA says about the owning GPU reaching `target`'s memory directly.
struct P2pPeer {
  std::string target;    // the peer GPU's PCI bus id, normalized
  bool access = false;   // cuDeviceCanAccessPeer
  int rank = 0;          // CUDA's P2P performance rank: relative, 0 = best
  bool atomics = false;  // native atomics supported over the connection
  bool operator==(const P2pPeer&) const = default;
};

struct Gpu {
  int dev = -1;      // CUDA device index on this host
  int sm = 0;        // compute capability * 10 + minor (90 for H100/H200); 0 when unknown
  int rank = -1;     // communicator rank, -1 when not part of one
  bool gdr = false;  // GPUDirect RDMA possible
  std::vector<NvLink> nvlinks;
  // Peer access to the host's other GPUs; empty when not checked (no CUDA driver, an
  // NCCL file). The XML keeps only the peers without access (`no_p2p` attribute), so
  // a file read back lists those alone, with rank 0.
  std::vector<P2pPeer> p2p;
  Attrs extra;                       // e.g. loom's "mem" (MiB), NCCL attributes loom does not use
  std::vector<std::string> unknown;  // child elements loom does not know (<c2c>), as XML text
  bool operator==(const Gpu&) const = default;
};

// A populated (non-zero) entry of an RDMA port's GID table, as sysfs shows it under
// /sys/class/infiniband/<dev>/ports/<port>/{gids,gid_attrs/types,gid_attrs/ndevs}/<index>.
struct GidEntry {
  int index = 0;
  std::string gid;     // "fe80:0000:0000:0000:0e42:a1ff:fe00:0001" (sysfs form)
  std::string type;    // "IB/RoCE v1" or "RoCE v2"; "" when sysfs gives none
  std::string netdev;  // the interface the entry belongs to (RoCE); "" when none
  bool operator==(const GidEntry&) const = default;
};

// One network endpoint (an IB/RoCE port or a network interface): NCCL's `net`.
struct Net {
  std::string name;   // "mlx5_0", "eth0"
  int dev = -1;       // index among this host's nets
  int speedMbps = 0;  // per direction
  int port = 0;       // IB port number (1-based), 0 for sockets
  uint64_t guid = 0;
  int maxConn = 0;
  bool gdr = false;    // GPUDirect RDMA to/from this NIC
  double latency = 0;  // microseconds, 0 when unknown
  Attrs extra;  // loom writes "link_layer", "virtual", "state", "address", "netdev", "gid", ...
  // RDMA ports: the populated GID table, by index. Detection only: the XML carries the
  // chosen entry ("gid", "gid_index", "roce") but not the table, because NCCL refuses
  // files of more than 256 elements.
  std::vector<GidEntry> gids;
  bool operator==(const Net&) const = default;

  // Convenience accessors for loom's own extra attributes ("" when absent).
  std::string attr(const std::string& key) const;
  void setAttr(const std::string& key, std::string value);
};

struct Nic {
  std::vector<Net> nets;
  Attrs extra;
  bool operator==(const Nic&) const = default;
};

// A PCI function; class 0x0604xx nodes are switches (NCCL keeps the upstream port).
struct PciNode {
  std::string busId;  // normalized "dddd:bb:dd.f"
  std::string pciClass, vendor, device, subsystemVendor, subsystemDevice;  // "0x10de"
  std::string linkSpeed;  // as sysfs writes it: "32.0 GT/s PCIe"; "" when unknown
  int linkWidth = 0;      // lanes; 0 when unknown
  std::optional<Gpu> gpu;
  std::optional<Nic> nic;
  std::vector<PciNode> children;
  Attrs extra;
  std::vector<std::string> unknown;  // child elements loom does not know, as XML text
  bool operator==(const PciNode&) const = default;
};

// A CPU socket / NUMA node.
struct Cpu {
  int numaId = -1;       // -1 when the machine exposes no NUMA information
  std::string affinity;  // sysfs cpumap: "ffffffff,00000000" (comma-separated 32-bit words)
  std::string arch;      // "x86_64", "arm64", "ppc64"
  std::string vendor;    // "GenuineIntel", "AuthenticAMD"
  int familyId = -1, modelId = -1;
  std::vector<PciNode> pcis;
  std::vector<Nic> nics;  // NICs not on a PCI bus (virtual interfaces, virtio-mmio)
  Attrs extra;
  std::vector<std::string> unknown;  // child elements loom does not know, as XML text
  bool operator==(const Cpu&) const = default;
};

struct System {
  int version = 1;  // NCCL's <system version>
  std::vector<Cpu> cpus;
  Attrs extra;  // loom writes "host_id"
  bool operator==(const System&) const = default;

  std::string hostId() const;
  void setHostId(std::string id);
};

// "0000:1B:00.0", "00000000:1b:00.0" and "1b:00.0" all become "0000:1b:00.0".
// Errors when the text is not a PCI address.
Result<std::string> normalizeBusId(const std::string& busId);

// Visits every PCI node of `system`, depth first in document order, with its CPU.
template <typename Fn>
void forEachPci(const System& system, Fn&& fn);
template <typename Fn>
void forEachPci(System& system, Fn&& fn);

// True when `gpu` reports no peer access to the GPU at `peerBusId` (an unchecked
// peer is assumed reachable).
bool p2pDenied(const Gpu& gpu, const std::string& peerBusId);

// Counts.
int gpuCount(const System& system);
int netCount(const System& system);

// Merges `more` into `base`: CPUs matched by NUMA id, PCI nodes by bus id, nets by
// name and port; what `base` already has wins. Used to merge the views of several
// ranks of one host, and to lay a topology file over detection.
void mergeInto(System& base, const System& more);

// --- implementation of the templates ---
namespace detail {
template <typename PciT, typename CpuT, typename Fn>
void visitPci(PciT& node, CpuT& cpu, Fn& fn) {
  fn(node, cpu);
  for (auto& child : node.children) visitPci(child, cpu, fn);
}
}  // namespace detail

template <typename Fn>
void forEachPci(const System& system, Fn&& fn) {
  for (const Cpu& cpu : system.cpus)
    for (const PciNode& pci : cpu.pcis) detail::visitPci(pci, cpu, fn);
}
template <typename Fn>
void forEachPci(System& system, Fn&& fn) {
  for (Cpu& cpu : system.cpus)
    for (PciNode& pci : cpu.pcis) detail::visitPci(pci, cpu, fn);
}

}  // namespace loom::topology
