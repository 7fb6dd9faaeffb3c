// P2P capability between GPUs (CUDA's answers, recorded with the NVML ones): detection,
// path classification (a pair without peer access goes through host memory), the
// XML, JSON and matrix views, and the CUDA probe itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/cuda_probe.h"
#include "tests/topology/fixtures.h"

namespace loom::topology {
namespace {

using testing::buildGraph;
using testing::loadXml;
using testing::sysfsRoot;

int countLines(const std::vector<std::string>& lines, const std::string& text) {
  int n = 0;
  for (const auto& l : lines) n += l.find(text) != std::string::npos;
  return n;
}

void forEachGpu(System& s, const std::function<void(const std::string&, Gpu&)>& fn) {
  forEachPci(s, [&](PciNode& p, Cpu&) {
    if (p.gpu) fn(p.busId, *p.gpu);
  });
}

Detected detectRoceBox() {
  DirReader reader(sysfsRoot("pcie_4gpu_roce"));
  auto d = detectLocal(reader);
  if (!d) {
    ADD_FAILURE() << d.status().message();
    std::abort();
  }
  return std::move(d.value());
}

// The recorded 4-GPU PCIe box: CUDA gives no peer access between GPU2 and GPU3, which
// sit behind one PCIe switch.
TEST(P2p, FourGpuBoxWithOnePairWithoutAccess) {
  Detected d = detectRoceBox();
  EXPECT_EQ(countLines(d.warnings, "not checked"), 0) << ::testing::PrintToString(d.warnings);
  EXPECT_EQ(countLines(d.warnings,
                       "CUDA reports no peer access for GPU pairs "
                       "0000:9a:00.0-0000:9b:00.0: their traffic is planned through "
                       "host memory"),
            1)
      << ::testing::PrintToString(d.warnings);
  Graph g = buildGraph(d.system);
  ASSERT_EQ(g.gpuCount(), 4);
  const Gpu& gpu2 = *g.nodes()[g.gpus()[2]].gpu;
  ASSERT_EQ(gpu2.p2p.size(), 3u);
  EXPECT_EQ(gpu2.p2p[0], (P2pPeer{"0000:1a:00.0", true, 1, false}));
  EXPECT_EQ(gpu2.p2p[2], (P2pPeer{"0000:9b:00.0", false, 0, false}));
  EXPECT_FALSE(g.p2pAllowed(2, 3));
  EXPECT_FALSE(g.p2pAllowed(3, 2));
  EXPECT_TRUE(g.p2pAllowed(0, 1));
  EXPECT_TRUE(g.p2pAllowed(1, 2));

  // GPU0-GPU1 behind the other switch keep their direct path; GPU2-GPU3 would be PIX
  // but go through CPU1's host bridge, both ways.
  EXPECT_EQ(g.gpuToGpu(0, 1).type, PathType::kPix);
  EXPECT_EQ(g.gpuToGpu(0, 2).type, PathType::kSys);
  for (auto [a, b] : {std::pair{2, 3}, std::pair{3, 2}}) {
    const Path& p = g.gpuToGpu(a, b);
    EXPECT_EQ(p.type, PathType::kPhb);
    EXPECT_NEAR(p.bw, pciBandwidth("16.0 GT/s PCIe", 16), 1e-9);
    ASSERT_EQ(p.nodes.size(), 5u);  // GPU, switch, CPU1, switch, GPU
    EXPECT_EQ(g.nodeName(p.nodes[2]), "CPU1");
    EXPECT_EQ(p.nodes.front(), g.gpus()[a]);
    EXPECT_EQ(p.nodes.back(), g.gpus()[b]);
  }

  // Without CUDA's answers the same box has GPU2-GPU3 on PIX.
  System unchecked = d.system;
  forEachGpu(unchecked, [](const std::string&, Gpu& gpu) { gpu.p2p.clear(); });
  EXPECT_EQ(buildGraph(unchecked).gpuToGpu(2, 3).type, PathType::kPix);
  EXPECT_NE(hostShapeKey(unchecked), hostShapeKey(d.system));

  // The ring still visits every GPU; the pair without access costs the plan PHB.
  HostPlan plan = planHost(g, {}, {});
  ASSERT_FALSE(plan.rings.empty());
  EXPECT_EQ(plan.rings[0].size(), 4u);
}

TEST(P2p, JsonMatrixAndXml) {
  Detected d = detectRoceBox();
  Graph g = buildGraph(d.system);
  auto j = nlohmann::json::parse(toJson(d.system, g, nullptr, nullptr));
  const auto& p2p = j["gpus"][2]["p2p"];
  ASSERT_EQ(p2p.size(), 3u);
  EXPECT_EQ(p2p[0],
            (nlohmann::json{{"peer", "GPU0"}, {"access", true}, {"rank", 1}, {"atomics", false}}));
  EXPECT_EQ(p2p[2],
            (nlohmann::json{{"peer", "GPU3"}, {"access", false}, {"rank", 0}, {"atomics", false}}));
  EXPECT_EQ(j["gpus"][0]["p2p"][0]["rank"], 0);  // GPU0 -> GPU1, one switch

  std::string m = formatMatrix(d.system, g);
  EXPECT_NE(m.find("GPU2    SYS     SYS     X       PHB"), std::string::npos) << m;
  EXPECT_NE(m.find("P2P: CUDA gives no peer access for GPU2-GPU3; these pairs go through host "
                   "memory (PHB or SYS above).\n"),
            std::string::npos)
      << m;

  // The XML keeps the pairs without access (no_p2p), so a dump or the cluster view
  // exchanged at init classifies the same way.
  std::string xml = toXml(d.system);
  EXPECT_NE(xml.find("no_p2p=\"0000:9b:00.0\""), std::string::npos) << xml;
  auto back = parseXml(xml);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  Graph gb = buildGraph(back->system);
  EXPECT_EQ(gb.gpuToGpu(2, 3).type, PathType::kPhb);
  EXPECT_EQ(gb.gpuToGpu(0, 1).type, PathType::kPix);
  const Gpu& gpu3 = *gb.nodes()[gb.gpus()[3]].gpu;
  EXPECT_EQ(gpu3.p2p, (std::vector<P2pPeer>{{"0000:9a:00.0", false, 0, false}}));
  EXPECT_EQ(toXml(back->system), xml);
  EXPECT_FALSE(parseXml("<system version=\"1\"><cpu numaid=\"0\"><pci busid=\"0000:01:00.0\">"
                        "<gpu dev=\"0\" no_p2p=\"zz\"/></pci></cpu></system>")
                   .isOk());
}

// NVLinked GPUs that CUDA says cannot reach each other: not NVL, and no NVB path uses
// their link either.
TEST(P2p, NvlinkPairWithoutAccessGoesThroughHostMemory) {
  System s = loadXml("mesh_4gpu.xml");
  forEachGpu(s, [](const std::string& bus, Gpu& gpu) {
    if (bus == "0000:07:00.0") gpu.p2p.push_back({"0000:0b:00.0", false, 0, false});
  });
  Graph g = buildGraph(s);
  for (auto [a, b] : {std::pair{0, 1}, std::pair{1, 0}}) {
    const Path& p = g.gpuToGpu(a, b);
    EXPECT_EQ(p.type, PathType::kPhb) << a << "->" << b;
    EXPECT_EQ(p.nvlinks, 0);
    EXPECT_NEAR(p.bw, pciBandwidth("16.0 GT/s PCIe", 16), 1e-9);
    EXPECT_EQ(g.nodeName(p.nodes[2]), "CPU0");
  }
  EXPECT_EQ(g.gpuToGpu(0, 2).type, PathType::kNvl);
  EXPECT_EQ(g.gpuToGpu(2, 3).type, PathType::kNvl);

  // Cut the GPU0-GPU2 NVLinks too: GPU0 reaches GPU2 through GPU3 (NVB), never
  // through GPU1.
  forEachPci(s, [](PciNode& p, Cpu&) {
    if (!p.gpu) return;
    std::string other = p.busId == "0000:07:00.0"   ? "0000:87:00.0"
                        : p.busId == "0000:87:00.0" ? "0000:07:00.0"
                                                    : "";
    auto& links = p.gpu->nvlinks;
    links.erase(std::remove_if(links.begin(), links.end(),
                               [&](const NvLink& l) { return l.target == other; }),
                links.end());
  });
  Graph cut = buildGraph(s);
  const Path& nvb = cut.gpuToGpu(0, 2);
  EXPECT_EQ(nvb.type, PathType::kNvb);
  ASSERT_EQ(nvb.nodes.size(), 3u);
  EXPECT_EQ(nvb.nodes[1], cut.gpus()[3]);
  const Path& back = cut.gpuToGpu(2, 0);
  ASSERT_EQ(back.nodes.size(), 3u);
  EXPECT_EQ(back.nodes[1], cut.gpus()[3]);
}

TEST(P2p, EveryPairAccessible) {
  DirReader reader(sysfsRoot("dgx_h100"));
  auto d = detectLocal(reader);
  ASSERT_TRUE(d.isOk()) << d.status().message();
  EXPECT_TRUE(d->warnings.empty()) << d->warnings.front();
  Graph g = buildGraph(d->system);
  EXPECT_EQ(g.nodes()[g.gpus()[0]].gpu->p2p.size(), 7u);
  EXPECT_EQ(g.gpuToGpu(0, 7).type, PathType::kNvl);
  std::string m = formatMatrix(d->system, g);
  EXPECT_NE(m.find("P2P: every GPU pair has peer access (CUDA).\n"), std::string::npos) << m;
  auto j = nlohmann::json::parse(toJson(d->system, g, nullptr, nullptr));
  EXPECT_EQ(j["gpus"][0]["p2p"][6],
            (nlohmann::json{{"peer", "GPU7"}, {"access", true}, {"rank", 0}, {"atomics", true}}));
}

class FailingSource : public GpuSource {
 public:
  Result<std::vector<GpuRecord>> query() override {
    return errorf(Code::kSystemError, "cannot load libnvidia-ml.so.1 (not found)");
  }
  std::string name() const override { return "NVML"; }
};

// Answers as the live source gives them without a CUDA driver: NVML's, no P2P.
class NvmlOnlySource : public GpuSource {
 public:
  explicit NvmlOnlySource(std::vector<GpuRecord> records) : records_(std::move(records)) {}
  Result<std::vector<GpuRecord>> query() override { return records_; }
  std::string name() const override { return "NVML"; }
  std::string p2pUnavailable() const override { return "cannot load libcuda.so.1 (not found)"; }

 private:
  std::vector<GpuRecord> records_;
};

std::vector<GpuRecord> recordedAnswers(const std::string& machine) {
  DirReader reader(sysfsRoot(machine));
  auto r = makeRecordedGpuSource(reader, "/loom/nvml.json")->query();
  if (!r) {
    ADD_FAILURE() << r.status().message();
    std::abort();
  }
  return std::move(r.value());
}

TEST(P2p, NotCheckedIsSaidOnceAndChangesNothing) {
  // No CUDA driver: today's paths, one line saying why P2P was not checked.
  std::vector<GpuRecord> records = recordedAnswers("dgx_h100");
  for (GpuRecord& r : records) r.p2p.reset();
  NvmlOnlySource source(records);
  DetectOptions options;
  options.gpuSource = &source;
  DirReader reader(sysfsRoot("dgx_h100"));
  auto d = detectLocal(reader, options);
  ASSERT_TRUE(d.isOk()) << d.status().message();
  ASSERT_EQ(d->warnings.size(), 1u) << ::testing::PrintToString(d->warnings);
  EXPECT_EQ(d->warnings[0],
            "P2P capability between GPUs not checked (cannot load libcuda.so.1 (not found)): GPU "
            "pairs are assumed peer-capable");
  Graph g = buildGraph(d->system);
  EXPECT_EQ(g.gpuToGpu(0, 1).type, PathType::kNvl);
  EXPECT_TRUE(g.p2pAllowed(0, 1));
  EXPECT_EQ(formatMatrix(d->system, g).find("P2P:"), std::string::npos);
  auto j = nlohmann::json::parse(toJson(d->system, g, nullptr, nullptr));
  EXPECT_TRUE(j["gpus"][0]["p2p"].empty());
  EXPECT_EQ(toXml(d->system).find("no_p2p"), std::string::npos);

  // Answers recorded before P2P was: the same, naming the file.
  DirReader recorded(sysfsRoot("h200_x2_vm_recorded"));
  auto old = detectLocal(recorded);
  ASSERT_TRUE(old.isOk()) << old.status().message();
  EXPECT_EQ(countLines(old->warnings, "P2P"), 1) << ::testing::PrintToString(old->warnings);
  EXPECT_EQ(countLines(old->warnings,
                       "P2P capability between GPUs not checked (no P2P answers "
                       "from recorded NVML answers (/loom/nvml.json))"),
            1);
  EXPECT_EQ(buildGraph(old->system).gpuToGpu(0, 1).type, PathType::kNvl);

  // No NVML either: the NVML line says it, no second line.
  FailingSource failing;
  options.gpuSource = &failing;
  auto none = detectLocal(reader, options);
  ASSERT_TRUE(none.isOk());
  EXPECT_EQ(countLines(none->warnings, "P2P"), 1) << ::testing::PrintToString(none->warnings);
  EXPECT_EQ(countLines(none->warnings, "no NVLink information, P2P capability not checked"), 1);
}

TEST(P2p, GpuHiddenFromCudaIsNamed) {
  std::vector<GpuRecord> records = recordedAnswers("flat_h200_vm");
  ASSERT_EQ(records.size(), 2u);
  records[1].p2p.reset();
  records[0].p2p = std::vector<P2pPeer>{};  // CUDA saw GPU 0 alone
  NvmlOnlySource source(records);
  DetectOptions options;
  options.gpuSource = &source;
  DirReader reader(sysfsRoot("flat_h200_vm"));
  auto d = detectLocal(reader, options);
  ASSERT_TRUE(d.isOk()) << d.status().message();
  EXPECT_EQ(countLines(d->warnings,
                       "P2P capability not checked for GPU 0000:00:06.0 (not visible "
                       "to CUDA): assumed peer-capable"),
            1)
      << ::testing::PrintToString(d->warnings);
  EXPECT_EQ(buildGraph(d->system).gpuToGpu(0, 1).type, PathType::kNvl);
}

TEST(P2p, RecordedAnswersRoundTrip) {
  std::vector<GpuRecord> in(2);
  in[0].busId = "0000:1b:00.0";
  in[1].busId = "0000:43:00.0";
  in[0].p2p = std::vector<P2pPeer>{{"0000:43:00.0", true, 2, true}};
  auto out = gpuRecordsFromJson(gpuRecordsToJson(in));
  ASSERT_TRUE(out.isOk()) << out.status().message();
  ASSERT_TRUE((*out)[0].p2p.has_value());
  EXPECT_EQ(*(*out)[0].p2p, *in[0].p2p);
  EXPECT_FALSE((*out)[1].p2p.has_value());  // not checked stays not checked
  EXPECT_FALSE(
      gpuRecordsFromJson(R"({"gpus": [{"busid": "0000:01:00.0", "p2p": [{"rank": 0}]}]})").isOk());
  EXPECT_FALSE(
      gpuRecordsFromJson(R"({"gpus": [{"busid": "0000:01:00.0", "p2p": [{"peer": "x"}]}]})")
          .isOk());
}

TEST(P2p, TopologyFileKeepsDetectedAnswers) {
  // A file without P2P laid over detection keeps what CUDA said.
  Detected d = detectRoceBox();
  System file = d.system;
  forEachGpu(file, [](const std::string&, Gpu& gpu) { gpu.p2p.clear(); });
  mergeInto(file, d.system);
  EXPECT_EQ(buildGraph(file).gpuToGpu(2, 3).type, PathType::kPhb);
}

// The CUDA probe answers, or says why not (no driver on CPU-only machines).
TEST(CudaProbe, PeerAccessOrWhyNot) {
  auto count = cuda::deviceCount();
  if (!count) {
    EXPECT_EQ(count.status().code(), Code::kSystemError);
    EXPECT_FALSE(count.status().message().empty());
    auto peer = cuda::peerAccess(0, 1);
    ASSERT_FALSE(peer.isOk());
    EXPECT_EQ(peer.status().message(), count.status().message());
    int x = 0;
    EXPECT_FALSE(cuda::isDevicePointer(&x));  // the older functions still answer
    EXPECT_FALSE(cuda::isPeerMappableDevicePointer(&x));
    EXPECT_FALSE(cuda::isPeerMappableDevicePointer(nullptr));
    EXPECT_EQ(cuda::deviceBusId(0), "");
    std::vector<GpuRecord> gpus(2);
    gpus[0].busId = "0000:01:00.0";
    gpus[1].busId = "0000:02:00.0";
    EXPECT_FALSE(addCudaP2p(gpus).isOk());
    EXPECT_FALSE(gpus[0].p2p.has_value());
    GTEST_SKIP() << "no CUDA driver: " << count.status().message();
  }
  EXPECT_FALSE(cuda::peerAccess(0, *count).isOk());  // no such device
  if (*count < 2) GTEST_SKIP() << "one CUDA device: no pair to ask about";
  auto peer = cuda::peerAccess(0, 1);
  ASSERT_TRUE(peer.isOk()) << peer.status().message();
  EXPECT_GE(peer->rank, 0);
  std::vector<GpuRecord> gpus(2);
  gpus[0].busId = normalizeBusId(cuda::deviceBusId(0)).value();
  gpus[1].busId = normalizeBusId(cuda::deviceBusId(1)).value();
  ASSERT_TRUE(addCudaP2p(gpus).isOk());
  ASSERT_TRUE(gpus[0].p2p.has_value());
  ASSERT_EQ(gpus[0].p2p->size(), 1u);
  EXPECT_EQ((*gpus[0].p2p)[0].access, peer->access);
}

}  // namespace
}  // namespace loom::topology
