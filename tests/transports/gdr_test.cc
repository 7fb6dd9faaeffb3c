// The GPUDirect RDMA assessment (transports/net/gdr.h): PCI distances from sysfs paths,
// NCCL's rule, the peer-memory module, and the ib backend's dma-buf probe against the
// emulated devices.
#include "transports/net/gdr.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "common/settings.h"
#ifdef LOOM_HAVE_VERBS
#include "transports/net/ib/ib.h"
#endif

namespace loom::transport::net {
namespace {

// A root complex, its root port, a PCIe switch (upstream port 01:00.0, downstream ports
// 02:08.0 and 02:10.0), and a second switch below the first.
const std::string kRoot = "/sys/devices/pci0000:00/0000:00:01.0";
const std::string kGpu = kRoot + "/0000:01:00.0/0000:02:08.0/0000:03:00.0";
const std::string kNicSameSwitch = kRoot + "/0000:01:00.0/0000:02:10.0/0000:04:00.0";
const std::string kNicBelowSameParent = kRoot + "/0000:01:00.0/0000:02:08.0/0000:03:00.1";
const std::string kNicTwoSwitches =
    kRoot + "/0000:01:00.0/0000:02:10.0/0000:05:00.0/0000:06:01.0/0000:07:00.0";
const std::string kNicOtherRootPort = "/sys/devices/pci0000:00/0000:00:02.0/0000:08:00.0";
const std::string kNicOtherRoot = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0";

TEST(Gdr, PciPathsFromSysfs) {
  EXPECT_EQ(pciPathBetween(kGpu, kNicSameSwitch), PciPath::kPix);
  EXPECT_EQ(pciPathBetween(kGpu, kNicBelowSameParent), PciPath::kPix);
  EXPECT_EQ(pciPathBetween(kGpu, kNicTwoSwitches), PciPath::kPxb);
  EXPECT_EQ(pciPathBetween(kGpu, kNicOtherRootPort), PciPath::kPhb);
  EXPECT_EQ(pciPathBetween(kGpu, kNicOtherRoot), PciPath::kSys);
  EXPECT_EQ(pciPathBetween(kGpu, ""), PciPath::kUnknown);  // an emulated or virtual NIC
  EXPECT_EQ(pciPathBetween("", kNicSameSwitch), PciPath::kUnknown);
}

GdrFacts capable(PciPath path) {
  GdrFacts f;
  f.gpuRdma = f.gpuDmaBuf = f.nicDmaBuf = true;
  f.computeMajor = 9;
  f.path = path;
  return f;
}

// Where the network executor puts a GPU's FIFO slots (placeSlots): GPU memory where the
// assessment allows it and the NIC takes that memory, never before compute 9.0 (no flush),
// page-locked host memory otherwise; a backend with no NIC on the PCI tree that moves GPU
// memory itself (UCX built with CUDA) without the assessment; sockets never.
TEST(Gdr, SlotPlacementFollowsTheAssessmentAndTheBackend) {
  Properties ib;
  ib.rdma = true;
  ib.pciPath = kNicSameSwitch;
  ib.ptrSupport = kPtrHost | kPtrCuda | kPtrDmaBuf;
  EXPECT_TRUE(placementNeedsAssessment(ib));
  SlotPlacement p = placeSlots(ib, assessGdr(capable(PciPath::kPix)));
  EXPECT_TRUE(p.gpu) << p.why;
  EXPECT_TRUE(p.dmaBuf) << p.why;
  EXPECT_NE(p.why.find("dma-buf"), std::string::npos) << p.why;
  GdrFacts f = capable(PciPath::kPix);
  f.nicDmaBuf = false;
  f.peerMem = true;
  p = placeSlots(ib, assessGdr(f));
  EXPECT_TRUE(p.gpu) << p.why;
  EXPECT_FALSE(p.dmaBuf) << p.why;
  EXPECT_FALSE(p.flush);
  f.computeMajor = 8;  // Ampere: a receive needs a flush, which this driver does not offer
  p = placeSlots(ib, assessGdr(f));
  EXPECT_FALSE(p.gpu) << p.why;
  EXPECT_NE(p.why.find("flush"), std::string::npos) << p.why;
  f.flushHost = true;  // it does: GPU memory, every receive flushed
  p = placeSlots(ib, assessGdr(f));
  EXPECT_TRUE(p.gpu) << p.why;
  EXPECT_TRUE(p.flush) << p.why;
  f.writesOrdering = 100;  // the driver says the GPU orders the NIC's writes itself
  EXPECT_FALSE(placeSlots(ib, assessGdr(f)).flush);
  f.forceFlush = true;  // LOOM_NET_FORCE_FLUSH
  EXPECT_TRUE(placeSlots(ib, assessGdr(f)).flush);
  f.writesOrdering = 0;  // Hopper by its capability, yet the driver says it needs one
  f.forceFlush = false;
  f.computeMajor = 9;
  EXPECT_TRUE(placeSlots(ib, assessGdr(f)).flush);
  f = capable(PciPath::kPix);
  f.nicDmaBuf = false;
  f.peerMem = true;
  p = placeSlots(ib, assessGdr(capable(PciPath::kSys)));  // beyond LOOM_NET_GDR_LEVEL
  EXPECT_FALSE(p.gpu) << p.why;
  EXPECT_NE(p.why.find("page-locked host memory"), std::string::npos) << p.why;
  ib.ptrSupport = kPtrHost | kPtrCuda;  // dma-buf possible, but the backend takes only peer memory
  p = placeSlots(ib, assessGdr(capable(PciPath::kPix)));
  EXPECT_FALSE(p.gpu) << p.why;
  ib.ptrSupport = kPtrHost;
  EXPECT_FALSE(placementNeedsAssessment(ib));
  EXPECT_FALSE(placeSlots(ib, assessGdr(capable(PciPath::kPix))).gpu);

  Properties ucx;  // no PCI path (loopback), built with CUDA
  ucx.ptrSupport = kPtrHost | kPtrCuda;
  EXPECT_FALSE(placementNeedsAssessment(ucx));
  p = placeSlots(ucx, GdrAssessment{});
  EXPECT_TRUE(p.gpu) << p.why;
  EXPECT_FALSE(p.dmaBuf);
  ucx.ptrSupport = kPtrHost;
  EXPECT_FALSE(placeSlots(ucx, GdrAssessment{}).gpu);

  Properties socket;
  socket.pciPath = kNicSameSwitch;
  EXPECT_FALSE(placementNeedsAssessment(socket));
  p = placeSlots(socket, assessGdr(capable(PciPath::kPix)));
  EXPECT_FALSE(p.gpu) << p.why;
  EXPECT_NE(p.why.find("host memory only"), std::string::npos) << p.why;
}

TEST(Gdr, DmaBufThenPeerMemoryWithinTheDistance) {
  GdrAssessment a = assessGdr(capable(PciPath::kPix));
  EXPECT_EQ(a.mode, GdrMode::kDmaBuf) << a.why;
  EXPECT_FALSE(a.flush);  // Hopper and later need no flush
  GdrFacts f = capable(PciPath::kPxb);
  f.nicDmaBuf = false;
  f.nicDmaBufWhy = "the verbs provider does not register dma-buf";
  EXPECT_EQ(assessGdr(f).mode, GdrMode::kNone);
  f.peerMem = true;
  a = assessGdr(f);
  EXPECT_EQ(a.mode, GdrMode::kPeerMem);
  EXPECT_NE(a.why.find("does not register dma-buf"), std::string::npos) << a.why;
  f.computeMajor = 8;  // Ampere: receives into GPU memory need a flush
  EXPECT_TRUE(assessGdr(f).flush);
}

TEST(Gdr, NothingBeyondPxbOrWhereTheGpuCannot) {
  for (PciPath p : {PciPath::kPhb, PciPath::kSys}) {
    const GdrAssessment a = assessGdr(capable(p));
    EXPECT_EQ(a.mode, GdrMode::kNone) << pciPathName(p);
    EXPECT_NE(a.why.find(pciPathName(p)), std::string::npos) << a.why;
  }
  const GdrAssessment unknown = assessGdr(capable(PciPath::kUnknown));
  EXPECT_EQ(unknown.mode, GdrMode::kNone);
  EXPECT_NE(unknown.why.find("not known"), std::string::npos);
  GdrFacts f = capable(PciPath::kPix);
  f.gpuRdma = false;
  EXPECT_EQ(assessGdr(f).mode, GdrMode::kNone);
}

// LOOM_NET_GDR_LEVEL (NCCL_NET_GDR_LEVEL): the distance rule moves, LOC turns it off.
TEST(Gdr, LevelSetsTheDistanceRule) {
  PciPath max = PciPath::kPxb;
  EXPECT_TRUE(gdrLevelFrom("phb", &max));
  EXPECT_EQ(max, PciPath::kPhb);
  EXPECT_TRUE(gdrLevelFrom("SYS", &max));
  EXPECT_EQ(max, PciPath::kSys);
  EXPECT_FALSE(gdrLevelFrom("LOC", &max));
  EXPECT_EQ(max, PciPath::kSys);  // left alone
  GdrFacts f = capable(PciPath::kPhb);
  EXPECT_EQ(assessGdr(f).mode, GdrMode::kNone);  // beyond PXB, the default
  EXPECT_NE(assessGdr(f).why.find("NCCL_NET_GDR_LEVEL"), std::string::npos);
  f.maxPath = PciPath::kPhb;
  EXPECT_EQ(assessGdr(f).mode, GdrMode::kDmaBuf);
  f = capable(PciPath::kPix);
  f.levelOff = true;
  const GdrAssessment off = assessGdr(f);
  EXPECT_EQ(off.mode, GdrMode::kNone);
  EXPECT_NE(off.why.find("LOC"), std::string::npos) << off.why;
}

TEST(Gdr, PeerMemoryModuleFromSysfs) {
  char tmpl[] = "/tmp/loom_gdr_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  EXPECT_FALSE(peerMemLoaded(root));
  ASSERT_EQ(system(("mkdir -p " + root + "/sys/module/nvidia_peermem").c_str()), 0);
  std::ofstream(root + "/sys/module/nvidia_peermem/version") << "1.0\n";
  EXPECT_TRUE(peerMemLoaded(root));
  ASSERT_EQ(system(("rm -rf " + root).c_str()), 0);
}

// Without a CUDA driver (CI) the assessment says so instead of guessing.
TEST(Gdr, WithoutACudaDriverItSaysSo) {
  const GdrAssessment a = assessGdrFor(0, kNicSameSwitch, true, "");
  if (a.why.find("CUDA driver cannot say") == std::string::npos)
    GTEST_SKIP() << "a CUDA driver is present: " << a.why;
  EXPECT_EQ(a.mode, GdrMode::kNone);
}

#ifdef LOOM_HAVE_VERBS
// The emulated provider has no dma-buf registration: the probe says so for every port.
TEST(Gdr, EmulatedProviderRegistersNoDmaBuf) {
  settings::ScopedSetting emu(settings::kIbEmulate, "roce");
  auto ports = ib::describePorts();
  ASSERT_TRUE(ports.isOk()) << ports.status().message();
  ASSERT_FALSE(ports->empty());
  for (const auto& p : *ports) {
    if (!p.usable) continue;
    EXPECT_FALSE(p.dmaBuf) << p.device;
    EXPECT_NE(p.dmaBufWhy.find("does not register dma-buf"), std::string::npos) << p.dmaBufWhy;
  }
}
#endif

}  // namespace
}  // namespace loom::transport::net
