#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tests/topology/fixtures.h"

namespace loom::topology {
namespace {

using testing::buildGraph;
using testing::loadXml;

TEST(Report, JsonHasTheDocumentedFields) {
  System s = loadXml("dgx_h100.xml");
  Graph g = buildGraph(s);
  ClusterView view{{s}};
  auto rings = searchRings(view);
  auto trees = searchTrees(view);
  ASSERT_TRUE(rings.isOk() && trees.isOk());
  auto j = nlohmann::json::parse(toJson(s, g, &*rings, &*trees));
  ASSERT_EQ(j["gpus"].size(), 8u);
  const auto& gpu = j["gpus"][0];
  EXPECT_EQ(gpu["id"], "GPU0");
  EXPECT_EQ(gpu["busid"], "0000:1b:00.0");
  EXPECT_EQ(gpu["sm"], 90);
  EXPECT_EQ(gpu["numa"], 0);
  EXPECT_EQ(gpu["nic"], "NIC0");
  ASSERT_EQ(gpu["nvlinks"].size(), 1u);
  EXPECT_EQ(gpu["nvlinks"][0]["target"], "NVS0");
  EXPECT_EQ(gpu["nvlinks"][0]["count"], 18);
  ASSERT_EQ(j["nics"].size(), 8u);
  const auto& nic = j["nics"][4];
  EXPECT_EQ(nic["id"], "NIC4");
  EXPECT_EQ(nic["name"], "mlx5_4");
  EXPECT_EQ(nic["busid"], "0000:9a:00.0");
  EXPECT_EQ(nic["speed_mbps"], 400000);
  EXPECT_EQ(nic["port"], 1);
  EXPECT_EQ(nic["gdr"], true);
  bool found = false;
  for (const auto& p : j["paths"]) {
    if (p["from"] == "GPU0" && p["to"] == "NIC0") {
      EXPECT_EQ(p["type"], "PIX");
      EXPECT_DOUBLE_EQ(p["bw_gbps"].get<double>(), 50.0);
      found = true;
    }
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(j["paths"].size(), 18u * 17u);  // every ordered pair of 8 GPUs, 8 NICs, 2 CPUs
  ASSERT_EQ(j["rings"].size(), rings->channels.size());
  EXPECT_EQ(j["rings"][0].size(), 8u);
  ASSERT_EQ(j["trees"].size(), trees->channels.size());
  EXPECT_EQ(j["trees"][0]["parent"].size(), 8u);
  auto graphOnly = nlohmann::json::parse(graphToJson(*rings, *trees));
  EXPECT_EQ(graphOnly["rings"], j["rings"]);
}

TEST(Report, MatrixLooksLikeNvidiaSmi) {
  System s = loadXml("dgx_h100.xml");
  std::string m = formatMatrix(s, buildGraph(s));
  EXPECT_NE(m.find("GPU0    X       NV18"), std::string::npos) << m;
  EXPECT_NE(m.find("PIX"), std::string::npos);
  EXPECT_NE(m.find("NODE"), std::string::npos);
  EXPECT_NE(m.find("SYS"), std::string::npos);
  EXPECT_NE(m.find("0-55,112-167"), std::string::npos);
  EXPECT_NE(m.find("NIC0: mlx5_0"), std::string::npos);

  System mesh = loadXml("mesh_4gpu.xml");
  EXPECT_NE(formatMatrix(mesh, buildGraph(mesh)).find("NV4"), std::string::npos);

  System vm = loadXml("flat_h200_vm.xml");
  std::string vmMatrix = formatMatrix(vm, buildGraph(vm));
  EXPECT_NE(vmMatrix.find("NV18"), std::string::npos);
  EXPECT_NE(vmMatrix.find("N/A"), std::string::npos);  // no NUMA information

  System cpu = loadXml("cpu_only_2nic.xml");
  std::string cpuMatrix = formatMatrix(cpu, buildGraph(cpu));
  EXPECT_NE(cpuMatrix.find("No GPU found"), std::string::npos);
  EXPECT_NE(cpuMatrix.find("NIC1: ens2f0"), std::string::npos);
  EXPECT_NE(cpuMatrix.find("CPU1: NUMA 1"), std::string::npos);
}

// A machine with nothing to show (no GPU, no NIC, no NUMA information) gets no empty
// "Legend:", "CPUs:" or "NIC Legend:" heading.
TEST(Report, OnlySectionsWithContent) {
  System empty;
  std::string m = formatMatrix(empty, buildGraph(empty));
  EXPECT_NE(m.find("No GPU found"), std::string::npos) << m;
  EXPECT_NE(m.find("No NIC found"), std::string::npos) << m;
  EXPECT_EQ(m.find("Legend:"), std::string::npos) << m;
  EXPECT_EQ(m.find("CPUs:"), std::string::npos) << m;

  System cpu = loadXml("cpu_only_2nic.xml");
  std::string withNics = formatMatrix(cpu, buildGraph(cpu));
  EXPECT_NE(withNics.find("NIC Legend:"), std::string::npos);
  EXPECT_NE(withNics.find("CPUs:"), std::string::npos);
}

TEST(Report, CpuListFromMask) {
  EXPECT_EQ(cpuListFromMask("0000ffff"), "0-15");
  EXPECT_EQ(cpuListFromMask("ff000000,00000000"), "56-63");
  EXPECT_EQ(cpuListFromMask("00000f0f"), "0-3,8-11");
  EXPECT_EQ(cpuListFromMask(""), "");
  EXPECT_EQ(cpuListFromMask("xyz"), "");
}

}  // namespace
}  // namespace loom::topology
