// GPUDirect RDMA: whether a NIC could read and write a GPU's memory directly, and how
// (dma-buf, or nvidia_peermem), by NCCL's rules; the facts come from the CUDA driver, the
// verbs provider, the kernel's modules and the PCI tree. Reported by loom-topo and the
// network executor's INFO log; the network executor puts its FIFOs' slots in GPU memory
// where the assessment allows it (docs/ib.md).
#pragma once

#include <string>

#include "transports/net/net.h"

namespace loom::transport::net {

// How far a NIC is from a GPU on the PCI tree, in NCCL's terms: PIX (behind one PCIe
// switch), PXB (several switches, no host bridge), PHB (through the host bridge of one
// root complex), SYS (across root complexes or sockets); unknown where either device is
// not on PCI (an emulated NIC, a virtual function without a path).
enum class PciPath { kPix, kPxb, kPhb, kSys, kUnknown };
const char* pciPathName(PciPath p);

// The path between two sysfs PCI device paths
// ("/sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0"), from the bridges they share.
PciPath pciPathBetween(const std::string& gpuSysfs, const std::string& nicSysfs);

// Whether nvidia_peermem (or the older nv_peer_mem) is loaded: what lets ibv_reg_mr take
// a GPU's virtual address. `sysRoot` is "/" except in tests.
bool peerMemLoaded(const std::string& sysRoot = "/");

struct GdrFacts {
  bool gpuDmaBuf = false;    // the CUDA driver exports the GPU's memory as dma-buf
  bool gpuRdma = false;      // the CUDA driver says the GPU supports GPUDirect RDMA
  int computeMajor = 0;      // the GPU's compute capability (0: not known)
  int writesOrdering = -1;   // cuda::GpuRdmaSupport::writesOrdering (-1: not known)
  bool flushHost = false;    // the driver flushes a NIC's writes (cuFlushGPUDirectRDMAWrites)
  bool forceFlush = false;   // LOOM_NET_FORCE_FLUSH
  bool nicDmaBuf = false;    // the verbs provider registers dma-buf (ibv_reg_dmabuf_mr)
  std::string nicDmaBufWhy;  // why not, where not
  bool peerMem = false;      // peerMemLoaded()
  PciPath path = PciPath::kUnknown;
  // The distance rule (LOOM_NET_GDR_LEVEL / NCCL_NET_GDR_LEVEL; NCCL's default is PXB),
  // or off (LOC).
  PciPath maxPath = PciPath::kPxb;
  bool levelOff = false;
};

// LOOM_NET_GDR_LEVEL's word (LOC, PIX, PXB, PHB or SYS, any case) as the facts take it:
// false for LOC (GPUDirect RDMA off) or a word it does not know, with *maxPath left alone.
bool gdrLevelFrom(const std::string& word, PciPath* maxPath);

enum class GdrMode { kDmaBuf, kPeerMem, kNone };
const char* gdrModeName(GdrMode m);

struct GdrAssessment {
  GdrMode mode = GdrMode::kNone;
  // A receive into GPU memory needs a flush before a kernel reads it: the driver says the GPU
  // does not order a NIC's writes for its own consumers (where it does not say, before compute
  // 9.0, as NCCL), or LOOM_NET_FORCE_FLUSH.
  bool flush = false;
  bool canFlush = false;  // the driver offers the flush (cuFlushGPUDirectRDMAWrites)
  std::string why;
};

// dma-buf where the GPU and the NIC both take it, else peer memory where it is loaded;
// neither beyond `maxPath` or where the path is unknown, nor where the GPU does not do
// GPUDirect RDMA.
GdrAssessment assessGdr(const GdrFacts& f);

// The same for CUDA device `gpuOrdinal` and a NIC at `nicPciPath` (sysfs) whose provider
// does or does not register dma-buf: the facts read from the CUDA driver, sysfs and the
// kernel's modules. Without a CUDA driver, the assessment says so.
// `nearEveryGpu`: an emulated NIC (Properties::nearEveryGpu), taken as PIX from the GPU, as
// if peer memory were loaded and the GPU reported GPUDirect RDMA (the emulation copies with
// CUDA); dma-buf export and the compute capability stay the driver's.
GdrAssessment assessGdrFor(int gpuOrdinal, const std::string& nicPciPath, bool nicDmaBuf,
                           const std::string& nicDmaBufWhy, bool nearEveryGpu = false);

// Where the network executor puts a GPU's FIFO slots: in GPU memory, registered through
// dma-buf (`dmaBuf`) or as plain GPU memory (peer memory, or a backend that moves GPU memory
// itself), or in page-locked host memory (`gpu` false); `why` says which and why, for the
// INFO log. `a` is assessGdrFor for the GPU and `nic` (it is read only where the NIC stands
// on the PCI tree or is loom's RDMA backend).
struct SlotPlacement {
  bool gpu = false;
  bool dmaBuf = false;
  bool flush = false;  // flush the NIC's writes after each receive (cuda::flushRdmaWrites)
  std::string why;
};
SlotPlacement placeSlots(const Properties& nic, const GdrAssessment& a);
// Whether placeSlots reads its assessment for `nic` (else the CUDA driver need not be asked).
bool placementNeedsAssessment(const Properties& nic);

}  // namespace loom::transport::net
