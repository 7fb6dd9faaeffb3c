#include <gtest/gtest.h>

#include "tests/topology/fixtures.h"

namespace loom::topology {
namespace {

using testing::buildGraph;
using testing::loadXml;
using testing::pathByName;

TEST(Graph, DgxH100Paths) {
  System s = loadXml("dgx_h100.xml");
  Graph g = buildGraph(s);
  ASSERT_EQ(g.gpuCount(), 8);
  ASSERT_EQ(g.netCount(), 8);
  for (int a = 0; a < 8; ++a) {
    for (int b = 0; b < 8; ++b) {
      if (a == b) continue;
      const Path& p = g.gpuToGpu(a, b);
      EXPECT_EQ(p.type, PathType::kNvl) << a << "->" << b;
      EXPECT_EQ(p.nvlinks, 18);
      EXPECT_DOUBLE_EQ(p.bw, 18 * 25.0);
      EXPECT_EQ(p.nodes.size(), 3u);  // GPU, NVSwitch, GPU
    }
    EXPECT_EQ(g.closestNet(a), a);
    EXPECT_EQ(g.gpuToNet(a, a).type, PathType::kPix);
    EXPECT_DOUBLE_EQ(g.gpuToNet(a, a).bw, 50.0);  // 400 Gb/s NIC, Gen5 x16 PCIe is wider
  }
  EXPECT_EQ(pathByName(g, "GPU0", "NIC1").type, PathType::kPhb);
  EXPECT_EQ(pathByName(g, "GPU0", "NIC4").type, PathType::kSys);
  EXPECT_DOUBLE_EQ(pathByName(g, "GPU0", "NIC4").bw, 10.0);  // Sapphire Rapids UPI
  EXPECT_EQ(pathByName(g, "NIC4", "GPU0").type, PathType::kSys);
  EXPECT_EQ(pathByName(g, "GPU5", "CPU1").type, PathType::kPhb);
  EXPECT_EQ(pathByName(g, "GPU5", "CPU0").type, PathType::kSys);
  EXPECT_EQ(pathByName(g, "CPU0", "CPU1").type, PathType::kSys);
  EXPECT_EQ(pathByName(g, "NIC2", "NIC3").type, PathType::kPhb);
  EXPECT_EQ(pathByName(g, "GPU3", "GPU3").type, PathType::kLoc);
}

TEST(Graph, PcieServerPaths) {
  System s = loadXml("pcie_8gpu.xml");
  Graph g = buildGraph(s);
  const double gen4x16 = 16.0 * 16 * 128 / 130 / 8;
  EXPECT_EQ(g.gpuToGpu(0, 1).type, PathType::kPix);
  EXPECT_NEAR(g.gpuToGpu(0, 1).bw, gen4x16, 1e-9);
  EXPECT_EQ(g.gpuToGpu(0, 1).nvlinks, 0);
  EXPECT_EQ(g.gpuToGpu(4, 7).type, PathType::kPix);
  EXPECT_EQ(g.gpuToGpu(0, 4).type, PathType::kSys);
  EXPECT_DOUBLE_EQ(g.gpuToGpu(0, 4).bw, 10.0);
  EXPECT_EQ(g.gpuToNet(0, 0).type, PathType::kPix);
  EXPECT_DOUBLE_EQ(g.gpuToNet(0, 0).bw, 25.0);  // 200 Gb/s
  EXPECT_EQ(g.gpuToNet(0, 1).type, PathType::kSys);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(g.closestNet(i), 0);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(g.closestNet(i), 1);
}

TEST(Graph, FourGpuMeshPaths) {
  System s = loadXml("mesh_4gpu.xml");
  Graph g = buildGraph(s);
  for (int a = 0; a < 4; ++a) {
    for (int b = 0; b < 4; ++b) {
      if (a == b) continue;
      EXPECT_EQ(g.gpuToGpu(a, b).type, PathType::kNvl);
      EXPECT_EQ(g.gpuToGpu(a, b).nvlinks, 4);
      EXPECT_DOUBLE_EQ(g.gpuToGpu(a, b).bw, 100.0);
      EXPECT_EQ(g.gpuToGpu(a, b).nodes.size(), 2u);  // direct
    }
  }
  EXPECT_EQ(g.closestNet(0), 0);
  EXPECT_EQ(g.closestNet(1), 0);
  EXPECT_EQ(g.closestNet(2), 1);
  EXPECT_EQ(g.closestNet(3), 1);
  EXPECT_EQ(g.gpuToNet(2, 0).type, PathType::kPhb);
}

TEST(Graph, NvlinkThroughAGpuIsNvb) {
  System s = loadXml("mesh_4gpu.xml");
  // Cut GPU0 <-> GPU2: the best way is now NVLink through GPU1 or GPU3.
  forEachPci(s, [](PciNode& p, Cpu&) {
    if (!p.gpu) return;
    auto& links = p.gpu->nvlinks;
    std::string other = p.busId == "0000:07:00.0"   ? "0000:87:00.0"
                        : p.busId == "0000:87:00.0" ? "0000:07:00.0"
                                                    : "";
    links.erase(std::remove_if(links.begin(), links.end(),
                               [&](const NvLink& l) { return l.target == other; }),
                links.end());
  });
  Graph g = buildGraph(s);
  const Path& p = g.gpuToGpu(0, 2);
  EXPECT_EQ(p.type, PathType::kNvb);
  EXPECT_EQ(p.nvlinks, 4);
  EXPECT_EQ(p.nodes.size(), 3u);
  EXPECT_EQ(g.gpuToGpu(0, 1).type, PathType::kNvl);
}

TEST(Graph, FlatVmPaths) {
  System s = loadXml("flat_h200_vm.xml");
  Graph g = buildGraph(s);
  ASSERT_EQ(g.gpuCount(), 2);
  EXPECT_EQ(g.gpuToGpu(0, 1).type, PathType::kNvl);
  EXPECT_EQ(g.gpuToGpu(0, 1).nvlinks, 18);
  EXPECT_DOUBLE_EQ(g.gpuToGpu(0, 1).bw, 450.0);
  EXPECT_EQ(g.gpuToNet(0, 0).type, PathType::kPhb);  // virtio NIC on the CPU
  EXPECT_EQ(g.nodes()[g.cpus()[0]].cpuInfo->numaId, -1);
}

TEST(Graph, CpuOnlyPaths) {
  System s = loadXml("cpu_only_2nic.xml");
  Graph g = buildGraph(s);
  EXPECT_EQ(g.gpuCount(), 0);
  ASSERT_EQ(g.netCount(), 2);
  EXPECT_EQ(pathByName(g, "NIC0", "NIC1").type, PathType::kSys);
  EXPECT_DOUBLE_EQ(pathByName(g, "NIC0", "NIC1").bw, 12.5);  // min(100 Gb/s, AMD SMP 16)
  EXPECT_EQ(pathByName(g, "NIC0", "CPU0").type, PathType::kPhb);
  EXPECT_EQ(g.closestNet(0), -1);
}

TEST(Graph, DuplicateBusIdIsAnError) {
  System s = loadXml("mesh_4gpu.xml");
  s.cpus[0].pcis.push_back(s.cpus[0].pcis[0]);
  auto g = Graph::build(s);
  ASSERT_FALSE(g.isOk());
  EXPECT_NE(g.status().message().find("appears twice"), std::string::npos);
}

TEST(Graph, Bandwidths) {
  EXPECT_NEAR(pciBandwidth("32.0 GT/s PCIe", 16), 63.015, 1e-3);
  EXPECT_NEAR(pciBandwidth("8 GT/s", 16), 15.754, 1e-3);
  EXPECT_DOUBLE_EQ(pciBandwidth("2.5 GT/s PCIe", 1), 0.25);
  EXPECT_EQ(pciBandwidth("Unknown", 16), 0);
  EXPECT_EQ(pciBandwidth("16.0 GT/s PCIe", 0), 0);
  EXPECT_EQ(nvlinkBandwidth(90), 25.0);
  EXPECT_EQ(nvlinkBandwidth(100), 50.0);
  EXPECT_EQ(nvlinkBandwidth(80), 25.0);
  EXPECT_STREQ(pathTypeName(PathType::kPxb), "PXB");
}

TEST(Graph, TwoLevelSwitchIsPxb) {
  // CPU > switch A > switch B > GPU0, and switch A > GPU1: one switch apart is PIX,
  // two is PXB.
  const char* text =
      "<system version=\"1\"><cpu numaid=\"0\" affinity=\"ff\" arch=\"x86_64\" "
      "vendor=\"AuthenticAMD\">"
      "<pci busid=\"0000:10:00.0\" class=\"0x060400\" link_speed=\"16.0 GT/s PCIe\" "
      "link_width=\"16\">"
      "  <pci busid=\"0000:12:00.0\" class=\"0x060400\" link_speed=\"16.0 GT/s PCIe\" "
      "link_width=\"16\">"
      "    <pci busid=\"0000:14:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" "
      "link_width=\"16\"><gpu dev=\"0\" sm=\"80\"/></pci>"
      "    <pci busid=\"0000:15:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" "
      "link_width=\"16\"><gpu dev=\"1\" sm=\"80\"/></pci>"
      "  </pci>"
      "  <pci busid=\"0000:13:00.0\" class=\"0x030200\" link_speed=\"16.0 GT/s PCIe\" "
      "link_width=\"8\"><gpu dev=\"2\" sm=\"80\"/></pci>"
      "</pci></cpu></system>";
  auto r = parseXml(text);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  Graph g = buildGraph(r->system);
  EXPECT_EQ(g.gpuToGpu(0, 1).type, PathType::kPix);
  EXPECT_EQ(g.gpuToGpu(0, 2).type, PathType::kPxb);
  EXPECT_NEAR(g.gpuToGpu(0, 2).bw, 16.0 * 8 * 128 / 130 / 8, 1e-9);  // the x8 GPU's link
}

}  // namespace
}  // namespace loom::topology
