#include "transports/net/gdr.h"

#include <strings.h>
#include <sys/stat.h>

#include <vector>

#include "common/cuda_probe.h"
#include "common/settings.h"
#include "transports/net/nic_choice.h"

namespace loom::transport::net {

namespace {

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

const char* pciPathName(PciPath p) {
  switch (p) {
    case PciPath::kPix: return "PIX";
    case PciPath::kPxb: return "PXB";
    case PciPath::kPhb: return "PHB";
    case PciPath::kSys: return "SYS";
    case PciPath::kUnknown: return "unknown";
  }
  return "?";
}

PciPath pciPathBetween(const std::string& gpuSysfs, const std::string& nicSysfs) {
  const std::vector<std::string> g = pciHops(gpuSysfs), n = pciHops(nicSysfs);
  // A root and a device at least on each side.
  if (g.size() < 2 || n.size() < 2) return PciPath::kUnknown;
  size_t shared = 0;
  while (shared < g.size() && shared < n.size() && g[shared] == n[shared]) ++shared;
  if (shared == 0) return PciPath::kSys;  // different root complexes
  if (shared == 1) return PciPath::kPhb;  // the host bridge only
  // Below a common bridge: PIX where one PCIe switch joins them (the common bridge is
  // their parent, or the switch's upstream port above two of its downstream ports), else
  // PXB.
  const size_t toGpu = g.size() - shared, toNic = n.size() - shared;
  return toGpu <= 2 && toNic <= 2 ? PciPath::kPix : PciPath::kPxb;
}

bool peerMemLoaded(const std::string& sysRoot) {
  const std::string root = sysRoot.empty() || sysRoot.back() != '/' ? sysRoot + "/" : sysRoot;
  for (const char* p :
       {"sys/module/nvidia_peermem/version", "sys/kernel/mm/memory_peers/nv_mem/version",
        "sys/kernel/mm/memory_peers/nv_mem_nc/version"}) {
    if (exists(root + p)) return true;
  }
  return false;
}

const char* gdrModeName(GdrMode m) {
  switch (m) {
    case GdrMode::kDmaBuf: return "dma-buf";
    case GdrMode::kPeerMem: return "nvidia_peermem";
    case GdrMode::kNone: return "none";
  }
  return "?";
}

bool gdrLevelFrom(const std::string& word, PciPath* maxPath) {
  for (PciPath p : {PciPath::kPix, PciPath::kPxb, PciPath::kPhb, PciPath::kSys}) {
    if (strcasecmp(word.c_str(), pciPathName(p)) == 0) {
      *maxPath = p;
      return true;
    }
  }
  return false;
}

GdrAssessment assessGdr(const GdrFacts& f) {
  GdrAssessment a;
  a.flush = f.forceFlush || (f.writesOrdering >= 0 ? f.writesOrdering < 100 : f.computeMajor < 9);
  a.canFlush = f.flushHost;
  if (f.levelOff) {
    a.why = "LOOM_NET_GDR_LEVEL (or NCCL_NET_GDR_LEVEL) is LOC: GPUDirect RDMA is off";
    return a;
  }
  if (!f.gpuRdma) {
    a.why = "the CUDA driver does not report GPUDirect RDMA for this GPU";
    return a;
  }
  if (f.path == PciPath::kUnknown) {
    a.why = "the NIC's place on the PCI tree relative to the GPU is not known";
    return a;
  }
  if (static_cast<int>(f.path) > static_cast<int>(f.maxPath)) {
    a.why = std::string("the NIC is ") + pciPathName(f.path) + " from the GPU, beyond " +
            pciPathName(f.maxPath) +
            " (LOOM_NET_GDR_LEVEL or NCCL_NET_GDR_LEVEL, PXB unless set, as in NCCL)";
    return a;
  }
  const std::string at = std::string(" (") + pciPathName(f.path) + ")";
  if (f.gpuDmaBuf && f.nicDmaBuf) {
    a.mode = GdrMode::kDmaBuf;
    a.why = "dma-buf: the GPU exports it and the NIC's provider registers it" + at;
  } else if (f.peerMem) {
    a.mode = GdrMode::kPeerMem;
    a.why = std::string("nvidia_peermem is loaded") +
            (f.gpuDmaBuf ? "; no dma-buf: " + f.nicDmaBufWhy
                         : "; no dma-buf: the GPU does not export it") +
            at;
  } else {
    a.why = std::string("no dma-buf (") +
            (f.gpuDmaBuf ? f.nicDmaBufWhy : "the GPU does not export it") +
            ") and no nvidia_peermem";
  }
  return a;
}

GdrAssessment assessGdrFor(int gpuOrdinal, const std::string& nicPciPath, bool nicDmaBuf,
                           const std::string& nicDmaBufWhy, bool nearEveryGpu) {
  auto gpu = cuda::gpuRdmaSupport(gpuOrdinal);
  if (!gpu) {
    GdrAssessment a;
    a.why = "the CUDA driver cannot say: " + gpu.status().message();
    return a;
  }
  GdrFacts f;
  f.gpuRdma = gpu->rdma;
  f.gpuDmaBuf = gpu->dmaBuf;
  f.computeMajor = gpu->computeMajor;
  f.writesOrdering = gpu->writesOrdering;
  f.flushHost = gpu->flushHost;
  f.forceFlush = settings::get(settings::kNetForceFlush);
  f.nicDmaBuf = nicDmaBuf;
  f.nicDmaBufWhy = nicDmaBufWhy;
  f.peerMem = peerMemLoaded();
  f.path = pciPathBetween(pciSysfsPath(cuda::deviceBusId(gpuOrdinal)), nicPciPath);
  f.levelOff = !gdrLevelFrom(settings::get(settings::kNetGdrLevel), &f.maxPath);
  if (nearEveryGpu) {        // the emulated NIC with gdr: no PCI path, peer memory of its own,
    f.path = PciPath::kPix;  // and it copies with CUDA, whatever a NIC could reach
    f.peerMem = true;
    f.gpuRdma = true;
  }
  GdrAssessment a = assessGdr(f);
  if (nearEveryGpu)
    a.why += " [emulated NIC: taken as PIX, GPUDirect RDMA and peer memory emulated]";
  return a;
}

bool placementNeedsAssessment(const Properties& nic) {
  const bool gpuMemory = (nic.ptrSupport & (kPtrCuda | kPtrDmaBuf)) != 0;
  return gpuMemory && (nic.rdma || nic.nearEveryGpu || !nic.pciPath.empty());
}

SlotPlacement placeSlots(const Properties& nic, const GdrAssessment& a) {
  SlotPlacement p;
  const std::string staged = ": GPU buffers go through page-locked host memory";
  if ((nic.ptrSupport & (kPtrCuda | kPtrDmaBuf)) == 0) {
    p.why =
        std::string(nic.rdma ? "the NIC takes no GPU memory here (no nvidia_peermem, no dma-buf)"
                             : "the backend moves host memory only") +
        staged;
    return p;
  }
  if (!placementNeedsAssessment(nic)) {
    // No NIC on the PCI tree between them (UCX over TCP, say): the backend moves GPU
    // memory itself, as its memory-type support says.
    p.gpu = true;
    p.why =
        "the backend moves GPU memory itself (its pointer support says so: UCX built with "
        "CUDA, or a network plugin): the FIFOs' slots in GPU memory";
    return p;
  }
  const std::string through = std::string("GPUDirect RDMA through ") + gdrModeName(a.mode);
  if (a.mode == GdrMode::kNone) {
    p.why = "GPUDirect RDMA is not possible (" + a.why + ")" + staged;
  } else if (a.flush && !a.canFlush) {
    // A receive into GPU memory must be flushed before a kernel may read it (NCCL flushes
    // with an RDMA READ, loom with the driver's cuFlushGPUDirectRDMAWrites), and this driver
    // offers no such call.
    p.why = through +
            " would be possible, but this GPU needs a flush after each receive and the CUDA "
            "driver offers none (cuFlushGPUDirectRDMAWrites)" +
            staged;
  } else if (a.mode == GdrMode::kDmaBuf ? !(nic.ptrSupport & kPtrDmaBuf)
                                        : !(nic.ptrSupport & kPtrCuda)) {
    p.why = through + " would be possible, but the backend does not take such memory" + staged;
  } else {
    p.gpu = true;
    p.dmaBuf = a.mode == GdrMode::kDmaBuf;
    p.flush = a.flush;
    p.why = through + " (" + a.why + "): the NIC reads and writes the FIFOs' slots in GPU memory" +
            (a.flush ? ", each receive flushed (cuFlushGPUDirectRDMAWrites)" : "");
  }
  return p;
}

}  // namespace loom::transport::net
