#include <gtest/gtest.h>

#include "tests/topology/fixtures.h"

namespace loom::topology {
namespace {

using testing::fixturePath;
using testing::loadXml;

const char* kFixtures[] = {"dgx_h100.xml",     "pcie_8gpu.xml",     "mesh_4gpu.xml",
                           "flat_h200_vm.xml", "cpu_only_2nic.xml", "nccl_dump_h200.xml"};

TEST(Xml, ReadsDgxH100) {
  System s = loadXml("dgx_h100.xml");
  ASSERT_EQ(s.cpus.size(), 2u);
  EXPECT_EQ(s.cpus[0].numaId, 0);
  EXPECT_EQ(s.cpus[1].vendor, "GenuineIntel");
  EXPECT_EQ(s.cpus[1].modelId, 143);
  EXPECT_EQ(gpuCount(s), 8);
  EXPECT_EQ(netCount(s), 8);
  const PciNode& sw = s.cpus[0].pcis[0];
  EXPECT_EQ(sw.busId, "0000:16:00.0");
  EXPECT_EQ(sw.pciClass, "0x060400");
  ASSERT_EQ(sw.children.size(), 2u);
  ASSERT_TRUE(sw.children[1].gpu.has_value());
  const Gpu& gpu = *sw.children[1].gpu;
  EXPECT_EQ(gpu.sm, 90);
  EXPECT_TRUE(gpu.gdr);
  ASSERT_EQ(gpu.nvlinks.size(), 4u);
  EXPECT_EQ(gpu.nvlinks[0].count, 5);
  EXPECT_EQ(gpu.nvlinks[0].targetClass, kClassNvSwitch);
  ASSERT_TRUE(sw.children[0].nic.has_value());
  const Net& net = sw.children[0].nic->nets[0];
  EXPECT_EQ(net.name, "mlx5_0");
  EXPECT_EQ(net.speedMbps, 400000);
  EXPECT_EQ(net.port, 1);
  EXPECT_EQ(net.guid, 0xa088c20300120000ull);
  EXPECT_EQ(net.maxConn, 131072);
  EXPECT_TRUE(net.gdr);
}

TEST(Xml, RoundTripsEveryFixture) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    System s = loadXml(name);
    std::string text = toXml(s);
    auto again = parseXml(text, "roundtrip");
    ASSERT_TRUE(again.isOk()) << again.status().message();
    EXPECT_EQ(again->system, s);
    EXPECT_EQ(toXml(again->system), text);  // writing is a fixed point
  }
}

TEST(Xml, RoundTripsThroughAFile) {
  System s = loadXml("mesh_4gpu.xml");
  std::string path = ::testing::TempDir() + "/loom_topo_roundtrip.xml";
  ASSERT_TRUE(writeXmlFile(s, path).isOk());
  auto back = readXmlFile(path);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->system, s);
}

TEST(Xml, ReadsAnNcclDump) {
  // In the shape NCCL writes: host_hash first on <cpu>, RoCE NICs (class 0x020000)
  // beside the GPUs, nvlinks to four NVSwitches.
  System s = loadXml("nccl_dump_h200.xml");
  EXPECT_EQ(gpuCount(s), 8);
  EXPECT_EQ(netCount(s), 8);
  ASSERT_FALSE(s.cpus[0].extra.empty());
  EXPECT_EQ(s.cpus[0].extra[0].first, "host_hash");
  EXPECT_NE(toXml(s).find("host_hash=\"0x16fe256e956b115c\""), std::string::npos);
  Graph g = testing::buildGraph(s);
  EXPECT_EQ(testing::pathByName(g, "GPU0", "GPU7").type, PathType::kNvl);
  EXPECT_EQ(testing::pathByName(g, "GPU0", "GPU7").nvlinks, 18);
  EXPECT_EQ(testing::pathByName(g, "GPU0", "NIC0").type, PathType::kPix);
  EXPECT_EQ(g.closestNet(5), 5);
}

TEST(Xml, KeepsElementsLoomDoesNotInterpret) {
  // Grace machines: <c2c> under <gpu>, the virtual NVSwitch address with 7 digits,
  // a socket NIC listed under each <cpu>.
  const char* text =
      "<system version=\"1\">\n"
      "  <cpu host_hash=\"0x1\" numaid=\"0\" affinity=\"ff\" arch=\"arm64\" vendor=\"NVIDIA\">\n"
      "    <pci busid=\"0008:01:00.0\" class=\"0x030200\" vendor=\"0x10de\" device=\"0x2941\" "
      "link_speed=\"32.0 GT/s PCIe\" link_width=\"16\">\n"
      "      <gpu dev=\"0\" sm=\"100\" rank=\"0\" gdr=\"1\">\n"
      "        <nvlink target=\"fffffff:ff:ff.0\" count=\"18\" tclass=\"0x068000\"/>\n"
      "        <c2c bw=\"56376\" count=\"7\"/>\n"
      "      </gpu>\n"
      "    </pci>\n"
      "    <nic><net name=\"eth0\" dev=\"0\" speed=\"10000\" port=\"0\" guid=\"0x0\" "
      "maxconn=\"65536\" gdr=\"0\"/></nic>\n"
      "  </cpu>\n"
      "  <cpu numaid=\"1\" affinity=\"ff00\" arch=\"arm64\" vendor=\"NVIDIA\">\n"
      "    <nic><net name=\"eth0\" dev=\"0\" speed=\"10000\" port=\"0\" guid=\"0x0\" "
      "maxconn=\"65536\" gdr=\"0\"/></nic>\n"
      "  </cpu>\n"
      "</system>\n";
  auto r = parseXml(text, "grace.xml");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  std::string out = toXml(r->system);
  EXPECT_NE(out.find("<c2c bw=\"56376\" count=\"7\""), std::string::npos) << out;
  EXPECT_NE(out.find("fffffff:ff:ff.0"), std::string::npos);
  auto again = parseXml(out, "again");
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(again->system, r->system);
  Graph g = testing::buildGraph(r->system);
  EXPECT_EQ(g.netCount(), 1);  // one endpoint, listed twice
  EXPECT_EQ(g.gpuCount(), 1);
}

TEST(Xml, MalformedFileNamesTheLine) {
  auto r = parseXml(
      "<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"0000:01:00.0\"\n  "
      "</cpu>\n</system>\n",
      "bad.xml");
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("bad.xml:"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("malformed XML"), std::string::npos);
}

TEST(Xml, BadAttributeNamesLineAndAttribute) {
  auto r = parseXml(
      "<system version=\"1\">\n"
      "  <cpu numaid=\"0\">\n"
      "    <pci busid=\"0000:01:00.0\" class=\"0x030200\">\n"
      "      <gpu dev=\"0\" sm=\"ninety\" rank=\"0\" gdr=\"1\"/>\n"
      "    </pci>\n"
      "  </cpu>\n"
      "</system>\n",
      "topo.xml");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("topo.xml:4:"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("sm"), std::string::npos);
}

TEST(Xml, BadBusIdNamesLine) {
  auto r = parseXml(
      "<system version=\"1\">\n<cpu numaid=\"0\">\n<pci busid=\"zz:01\"/>\n</cpu>\n</system>\n",
      "t.xml");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("t.xml:3:"), std::string::npos) << r.status().message();
}

TEST(Xml, WrongRootIsAnError) {
  auto r = parseXml("<topology/>", "x.xml");
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find("<system>"), std::string::npos);
}

TEST(Xml, MissingFileIsSystemError) {
  auto r = readXmlFile("/nonexistent/topo.xml");
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), Code::kSystemError);
}

TEST(Xml, NormalizesBusIds) {
  EXPECT_EQ(normalizeBusId("0000:1B:00.0").value(), "0000:1b:00.0");
  EXPECT_EQ(normalizeBusId("00000000:1b:00.0").value(), "0000:1b:00.0");
  EXPECT_EQ(normalizeBusId("1b:00.0").value(), "0000:1b:00.0");
  EXPECT_EQ(normalizeBusId("FFFFFFFF:FF:FF.0").value(), "ffffffff:ff:ff.0");
  EXPECT_EQ(normalizeBusId("fffffff:ff:ff.0").value(), "fffffff:ff:ff.0");
  EXPECT_FALSE(normalizeBusId("garbage").isOk());
  EXPECT_FALSE(normalizeBusId("0000:1b:00.9").isOk());
  EXPECT_FALSE(normalizeBusId("0000:1b:00").isOk());
}

}  // namespace
}  // namespace loom::topology
