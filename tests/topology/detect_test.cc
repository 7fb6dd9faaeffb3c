#include <gtest/gtest.h>

#include <cstdlib>

#include "tests/topology/fixtures.h"
#include "topology/reader.h"

namespace loom::topology {
namespace {

using testing::buildGraph;
using testing::loadXml;
using testing::sysfsRoot;

}  // namespace

bool hasWarning(const Detected& d, const std::string& text) {
  for (const auto& w : d.warnings)
    if (w.find(text) != std::string::npos) return true;
  return false;
}

namespace {

class FailingSource : public GpuSource {
 public:
  Result<std::vector<GpuRecord>> query() override {
    return errorf(Code::kSystemError, "cannot load libnvidia-ml.so.1 (not found)");
  }
  std::string name() const override { return "NVML"; }
};

// Detecting a recorded tree gives the same paths as the XML written for that machine.
void expectSamePaths(const Graph& a, const Graph& b) {
  ASSERT_EQ(a.gpuCount(), b.gpuCount());
  ASSERT_EQ(a.netCount(), b.netCount());
  std::vector<int> endsA, endsB;
  for (int i = 0; i < a.gpuCount(); ++i) endsA.push_back(a.gpus()[i]), endsB.push_back(b.gpus()[i]);
  for (int i = 0; i < a.netCount(); ++i) endsA.push_back(a.nets()[i]), endsB.push_back(b.nets()[i]);
  for (size_t i = 0; i < endsA.size(); ++i) {
    for (size_t j = 0; j < endsA.size(); ++j) {
      const Path& pa = a.path(endsA[i], endsA[j]);
      const Path& pb = b.path(endsB[i], endsB[j]);
      EXPECT_EQ(pa.type, pb.type) << a.nodeName(endsA[i]) << "->" << a.nodeName(endsA[j]);
      EXPECT_NEAR(pa.bw, pb.bw, 1e-9) << a.nodeName(endsA[i]) << "->" << a.nodeName(endsA[j]);
      EXPECT_EQ(pa.nvlinks, pb.nvlinks);
    }
  }
}

// A read that fails after the open (here /proc/self/mem at address 0: EIO) is an error,
// not an empty file (a stream used to report it as "").
TEST(Reader, AFailingReadIsAnError) {
  DirReader reader("/");
  auto text = reader.readFile("/proc/self/mem");
  EXPECT_FALSE(text.isOk());
  if (!text.isOk()) {
    EXPECT_NE(text.status().message().find("reading"), std::string::npos)
        << text.status().message();
  }
  EXPECT_TRUE(reader.readFile("/proc/self/stat").isOk());
}

TEST(Detect, DgxH100FromRecordedTree) {
  DirReader reader(sysfsRoot("dgx_h100"));
  auto d = detectLocal(reader);
  ASSERT_TRUE(d.isOk()) << d.status().message();
  const System& s = d->system;
  EXPECT_TRUE(d->warnings.empty()) << d->warnings.front();
  ASSERT_EQ(s.cpus.size(), 2u);
  EXPECT_EQ(s.cpus[0].vendor, "GenuineIntel");
  EXPECT_EQ(s.cpus[0].modelId, 143);
  EXPECT_EQ(gpuCount(s), 8);
  EXPECT_EQ(netCount(s), 8);  // IPoIB ib0..ib7 share the RDMA functions; lo is skipped
  ASSERT_EQ(s.cpus[0].pcis.size(), 4u);
  const PciNode& sw = s.cpus[0].pcis[0];
  EXPECT_EQ(sw.busId,
            "0000:16:00.0");  // the switch's upstream port, root and downstream ports dropped
  ASSERT_EQ(sw.children.size(), 2u);
  const PciNode& gpuPci = sw.children[0].gpu ? sw.children[0] : sw.children[1];
  const PciNode& nicPci = sw.children[0].gpu ? sw.children[1] : sw.children[0];
  ASSERT_TRUE(gpuPci.gpu.has_value());
  ASSERT_TRUE(nicPci.nic.has_value());
  EXPECT_EQ(gpuPci.busId, "0000:1b:00.0");
  EXPECT_EQ(gpuPci.linkSpeed, "32.0 GT/s PCIe");
  const Gpu& gpu = *gpuPci.gpu;
  EXPECT_EQ(gpu.sm, 90);
  EXPECT_EQ(gpu.dev, 0);
  EXPECT_TRUE(gpu.gdr);
  ASSERT_EQ(gpu.nvlinks.size(), 4u);
  int links = 0;
  for (const NvLink& l : gpu.nvlinks) {
    links += l.count;
    EXPECT_EQ(l.targetClass, kClassNvSwitch);
  }
  EXPECT_EQ(links, 18);
  const Net& net = nicPci.nic->nets[0];
  EXPECT_EQ(net.name, "mlx5_0");
  EXPECT_EQ(net.speedMbps, 400000);
  EXPECT_EQ(net.port, 1);
  EXPECT_EQ(net.guid, 0xa088c20300120000ull);
  EXPECT_EQ(net.attr("link_layer"), "InfiniBand");
  EXPECT_TRUE(net.gdr);
  EXPECT_EQ(s.hostId().rfind("dgx-h100-01-", 0), 0u) << s.hostId();

  System fromXml = loadXml("dgx_h100.xml");
  Graph a = buildGraph(s), b = buildGraph(fromXml);
  expectSamePaths(a, b);
}

TEST(Detect, FlatVmFromRecordedTree) {
  DirReader reader(sysfsRoot("flat_h200_vm"));
  auto d = detectLocal(reader);
  ASSERT_TRUE(d.isOk()) << d.status().message();
  EXPECT_EQ(gpuCount(d->system), 2);
  EXPECT_TRUE(hasWarning(*d, "numa_node -1")) << ::testing::PrintToString(d->warnings);
  EXPECT_TRUE(hasWarning(*d, "no RDMA devices"));
  EXPECT_TRUE(hasWarning(*d, "GPUDirect RDMA unavailable"));
  EXPECT_TRUE(hasWarning(*d, "eth0 reports no link speed"));
  Graph g = buildGraph(d->system);
  EXPECT_EQ(g.gpuToGpu(0, 1).type, PathType::kNvl);
  EXPECT_EQ(g.gpuToGpu(0, 1).nvlinks, 18);
  ASSERT_EQ(g.netCount(), 1);
  EXPECT_EQ(g.nodes()[g.nets()[0]].net->name, "eth0");
  EXPECT_TRUE(g.nodes()[g.nets()[0]].busId.empty());  // virtio-mmio, not PCI
}

TEST(Detect, CpuOnlyHostFromRecordedTree) {
  DirReader reader(sysfsRoot("cpu_only_2nic"));
  auto d = detectLocal(reader);
  ASSERT_TRUE(d.isOk()) << d.status().message();
  EXPECT_EQ(gpuCount(d->system), 0);
  EXPECT_FALSE(hasWarning(*d, "NVML"));  // no GPUs: nothing to say about NVML
  Graph g = buildGraph(d->system);
  ASSERT_EQ(g.netCount(), 4);
  const Net& n0 = *g.nodes()[g.nets()[0]].net;
  const Net& n1 = *g.nodes()[g.nets()[1]].net;
  EXPECT_EQ(n0.name, "ens1f0");
  EXPECT_EQ(n0.speedMbps, 100000);
  EXPECT_EQ(n1.name, "ens2f0");
  EXPECT_EQ(g.nodes()[g.cpus()[g.nodes()[g.nets()[1]].cpu]].cpuInfo->numaId, 1);
  const Net& bridge = *g.nodes()[g.nets()[2]].net;
  EXPECT_EQ(bridge.name, "docker0");
  EXPECT_EQ(bridge.attr("virtual"), "1");
  EXPECT_EQ(bridge.attr("kind"), "bridge");
  EXPECT_EQ(g.nodes()[g.nets()[3]].net->attr("kind"), "veth");
  EXPECT_EQ(testing::pathByName(g, "NIC0", "NIC1").type, PathType::kSys);
}

TEST(Detect, WithoutNvmlFallsBackWithOneWarning) {
  DirReader reader(sysfsRoot("dgx_h100"));
  FailingSource nvml;
  DetectOptions options;
  options.gpuSource = &nvml;
  auto d = detectLocal(reader, options);
  ASSERT_TRUE(d.isOk()) << d.status().message();
  int nvmlWarnings = 0;
  for (const auto& w : d->warnings) nvmlWarnings += w.find("NVML") != std::string::npos;
  EXPECT_EQ(nvmlWarnings, 1);
  Graph g = buildGraph(d->system);
  EXPECT_EQ(g.nodes()[g.gpus()[0]].gpu->sm, 90);     // from the device id 0x2330
  EXPECT_EQ(g.gpuToGpu(0, 1).type, PathType::kPhb);  // no NVLink known
}

TEST(Detect, RecordedTreeWithoutNvmlAnswers) {
  MapReader reader;
  reader.addFile("/sys/devices/system/node/node0/cpumap", "ff\n");
  reader.addFile("/sys/devices/pci0000:00/0000:00:04.0/class", "0x030200\n");
  reader.addFile("/sys/devices/pci0000:00/0000:00:04.0/vendor", "0x10de\n");
  reader.addFile("/sys/devices/pci0000:00/0000:00:04.0/device", "0x20b2\n");
  reader.addFile("/sys/devices/pci0000:00/0000:00:04.0/numa_node", "0\n");
  reader.addLink("/sys/bus/pci/devices/0000:00:04.0", "/sys/devices/pci0000:00/0000:00:04.0");
  auto d = detectLocal(reader);
  ASSERT_TRUE(d.isOk()) << d.status().message();
  EXPECT_TRUE(hasWarning(*d, "no NVML answers")) << ::testing::PrintToString(d->warnings);
  EXPECT_TRUE(hasWarning(*d, "cannot read /proc/cpuinfo"));
  ASSERT_EQ(gpuCount(d->system), 1);
  Graph g = buildGraph(d->system);
  EXPECT_EQ(g.nodes()[g.gpus()[0]].gpu->sm, 80);
  EXPECT_GT(g.path(g.gpus()[0], g.cpus()[0]).bw, 0);  // link speed unknown: a default, not 0
}

TEST(Detect, AlmostEmptyTreeDegradesWithoutCrashing) {
  MapReader reader;
  reader.addDir("/sys");
  auto d = detectLocal(reader);
  ASSERT_TRUE(d.isOk()) << d.status().message();
  ASSERT_EQ(d->system.cpus.size(), 1u);
  EXPECT_EQ(d->system.cpus[0].numaId, -1);
  EXPECT_TRUE(hasWarning(*d, "no NUMA information"));
  EXPECT_TRUE(hasWarning(*d, "cannot list /sys/bus/pci/devices"));
  EXPECT_TRUE(hasWarning(*d, "cannot list /sys/class/net"));
  EXPECT_TRUE(Graph::build(d->system).isOk());
}

TEST(Detect, NoSysfsIsAnError) {
  MapReader reader;
  auto d = detectLocal(reader);
  ASSERT_FALSE(d.isOk());
  EXPECT_EQ(d.status().code(), Code::kSystemError);
}

TEST(Detect, HostIdOverride) {
  DirReader reader(sysfsRoot("cpu_only_2nic"));
  std::string natural = detectHostId(reader);
  EXPECT_EQ(natural.rfind("cpu-epyc-01-", 0), 0u);
  EXPECT_EQ(detectHostId(reader), natural);  // stable
  DirReader other(sysfsRoot("dgx_h100"));
  EXPECT_NE(detectHostId(other), natural);
  setenv("LOOM_HOST_ID", "fake-host-7", 1);
  EXPECT_EQ(detectHostId(reader), "fake-host-7");
  auto d = detectLocal(reader);
  ASSERT_TRUE(d.isOk());
  EXPECT_EQ(d->system.hostId(), "fake-host-7");
  unsetenv("LOOM_HOST_ID");
}

TEST(Detect, TopoFileLaidOverDetection) {
  std::string path = ::testing::TempDir() + "/loom_topo_env.xml";
  std::string dump = ::testing::TempDir() + "/loom_topo_env_dump.xml";
  ASSERT_TRUE(writeXmlFile(loadXml("dgx_h100.xml"), path).isOk());
  setenv("LOOM_TOPO_FILE", path.c_str(), 1);
  setenv("LOOM_TOPO_DUMP_FILE", dump.c_str(), 1);
  DirReader reader(sysfsRoot("cpu_only_2nic"));
  auto d = detectWithEnvironment(reader);
  unsetenv("LOOM_TOPO_FILE");
  unsetenv("LOOM_TOPO_DUMP_FILE");
  ASSERT_TRUE(d.isOk()) << d.status().message();
  EXPECT_EQ(gpuCount(d->system), 8);  // from the file
  EXPECT_EQ(d->system.hostId().rfind("cpu-epyc-01-", 0), 0u);
  auto written = readXmlFile(dump);
  ASSERT_TRUE(written.isOk()) << written.status().message();
  EXPECT_EQ(written->system, d->system);
}

TEST(Detect, TopoFileSettingHonoursNcclAlias) {
  unsetenv("LOOM_TOPO_FILE");
  setenv("NCCL_TOPO_FILE", "/nccl.xml", 1);
  EXPECT_EQ(topoFileSetting(), "/nccl.xml");
  setenv("LOOM_TOPO_FILE", "/loom.xml", 1);
  EXPECT_EQ(topoFileSetting(), "/loom.xml");  // loom's name wins
  unsetenv("LOOM_TOPO_FILE");
  unsetenv("NCCL_TOPO_FILE");
  EXPECT_EQ(topoFileSetting(), "");
}

TEST(Detect, MalformedTopoFileIsAnErrorWithItsLine) {
  std::string path = ::testing::TempDir() + "/loom_topo_malformed.xml";
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"x\"\n</system>\n",
               f);
    std::fclose(f);
  }
  DirReader reader(sysfsRoot("cpu_only_2nic"));
  auto d = detectLocal(reader);
  ASSERT_TRUE(d.isOk());
  Detected before = *d;
  Status st = overlayTopoFile(*d, path);
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message().rfind(path + ":", 0), 0u) << st.message();
  EXPECT_EQ(d->system, before.system);  // unchanged
  Status missing = overlayTopoFile(*d, path + ".missing");
  EXPECT_EQ(missing.code(), Code::kSystemError);
  std::remove(path.c_str());
}

TEST(Detect, GpuRecordsJsonRoundTrip) {
  std::vector<GpuRecord> in(1);
  in[0].index = 3;
  in[0].busId = "0000:1b:00.0";
  in[0].sm = 90;
  in[0].memoryBytes = uint64_t{81559} << 20;
  in[0].nvlinks.push_back(NvLinkRecord{0, "0000:05:00.0", NvLinkPeer::kSwitch});
  auto out = gpuRecordsFromJson(gpuRecordsToJson(in));
  ASSERT_TRUE(out.isOk()) << out.status().message();
  ASSERT_EQ(out->size(), 1u);
  EXPECT_EQ((*out)[0].index, 3);
  EXPECT_EQ((*out)[0].nvlinks[0].peer, NvLinkPeer::kSwitch);
  EXPECT_EQ((*out)[0].memoryBytes, in[0].memoryBytes);
  EXPECT_FALSE(gpuRecordsFromJson("{\"gpus\": 7}").isOk());
  EXPECT_FALSE(gpuRecordsFromJson("not json").isOk());
  EXPECT_FALSE(
      gpuRecordsFromJson("{\"gpus\": [{\"busid\": \"0000:01:00.0\", \"sm\": \"x\"}]}").isOk());
}

TEST(Detect, MapReaderResolvesLinks) {
  MapReader r;
  r.addFile("/sys/devices/pci0000:00/0000:00:01.0/class", "0x060400");
  r.addLink("/sys/bus/pci/devices/0000:00:01.0", "../../../devices/pci0000:00/0000:00:01.0");
  EXPECT_EQ(r.realPath("/sys/bus/pci/devices/0000:00:01.0").value(),
            "/sys/devices/pci0000:00/0000:00:01.0");
  EXPECT_EQ(r.readTrimmed("/sys/bus/pci/devices/0000:00:01.0/class"), "0x060400");
  EXPECT_EQ(r.listDir("/sys/bus/pci/devices").value(), std::vector<std::string>{"0000:00:01.0"});
  EXPECT_FALSE(r.readFile("/sys/nothing").isOk());
  EXPECT_EQ(normalizePath("/a/b/../c/./d/"), "/a/c/d");
}

TEST(Detect, SmTable) {
  EXPECT_EQ(smFromDeviceId("0x2330"), 90);
  EXPECT_EQ(smFromDeviceId("0x20b2"), 80);
  EXPECT_EQ(smFromDeviceId("0x9999"), 0);
}

}  // namespace
}  // namespace loom::topology

namespace loom::topology {
namespace {

// Recorded with `loom-topo --record` on our 2 x H200 VM (host name replaced).
TEST(Detect, RecordedH200PairVm) {
  DirReader reader(testing::sysfsRoot("h200_x2_vm_recorded"));
  auto d = detectLocal(reader);
  ASSERT_TRUE(d.isOk()) << d.status().message();
  Graph g = testing::buildGraph(d->system);
  ASSERT_EQ(g.gpuCount(), 2);
  EXPECT_EQ(g.nodes()[g.gpus()[0]].busId, "0000:00:06.0");
  EXPECT_EQ(g.nodes()[g.gpus()[0]].gpu->sm, 90);
  EXPECT_EQ(g.gpuToGpu(0, 1).type, PathType::kNvl);
  EXPECT_EQ(g.gpuToGpu(0, 1).nvlinks, 18);  // nvidia-smi topo -m: NV18
  EXPECT_EQ(d->system.cpus[0].modelId, 207);
  // eth0 is virtio: its device is .../0000:00:03.0/virtio2, the PCI function above it.
  ASSERT_GE(g.netCount(), 1);
  EXPECT_EQ(g.nodes()[g.nets()[0]].net->name, "eth0");
  EXPECT_EQ(g.nodes()[g.nets()[0]].busId, "0000:00:03.0");
  EXPECT_TRUE(hasWarning(*d, "numa_node -1"));
  HostPlan plan = planHost(g, {}, {});
  EXPECT_NEAR(plan.channelBw * plan.rings.size(), 450.0, 1e-9);
}

}  // namespace
}  // namespace loom::topology
