// The GID table of RDMA ports: reading it from sysfs, the index the transport uses, and how
// it shows in the XML, the JSON and loom-topo's NIC lines.
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>

#include "common/settings.h"
#include "tests/topology/fixtures.h"
#include "topology/gid_table.h"

namespace loom::topology {
namespace {

using testing::buildGraph;
using testing::sysfsRoot;

constexpr const char* kLinkLocal = "fe80:0000:0000:0000:0e42:a1ff:fe5a:0b10";
constexpr const char* kIpv6 = "fd00:0010:0000:0001:0000:0000:0000:0011";
constexpr const char* kIpv4 = "0000:0000:0000:0000:0000:ffff:0a0a:0a11";  // ::ffff:10.10.10.17

bool hasLine(const std::vector<std::string>& lines, const std::string& text) {
  for (const auto& l : lines)
    if (l.find(text) != std::string::npos) return true;
  return false;
}

const Net& netNamed(const Graph& g, const std::string& name) {
  for (int n : g.nets())
    if (g.nodes()[n].net->name == name) return *g.nodes()[n].net;
  ADD_FAILURE() << "no net " << name;
  std::abort();
}

// The recorded PCIe box: mlx5_0 is a RoCE port whose table holds link-local, IPv6 and
// IPv4-mapped entries, each as RoCE v1 and v2, with zero slots between and after.
TEST(Gid, RocePortTableAndChosenIndex) {
  DirReader reader(sysfsRoot("pcie_4gpu_roce"));
  auto d = detectLocal(reader);
  ASSERT_TRUE(d.isOk()) << d.status().message();
  Graph g = buildGraph(d->system);
  const Net& roce = netNamed(g, "mlx5_0");
  EXPECT_EQ(roce.attr("link_layer"), "Ethernet");
  ASSERT_EQ(roce.gids.size(), 6u);  // slots 4, 5 and 8-15 are zero
  std::vector<int> indexes;
  for (const GidEntry& e : roce.gids) indexes.push_back(e.index);
  EXPECT_EQ(indexes, (std::vector<int>{0, 1, 2, 3, 6, 7}));
  EXPECT_EQ(roce.gids[0], (GidEntry{0, kLinkLocal, "IB/RoCE v1", "ens1f0np0"}));
  EXPECT_EQ(roce.gids[3], (GidEntry{3, kIpv6, "RoCE v2", "ens1f0np0"}));
  EXPECT_EQ(roce.gids[5], (GidEntry{7, kIpv4, "RoCE v2", "ens1f0np0"}));
  // RoCE v2 with the IPv4-mapped address, though v2 entries come before it.
  EXPECT_EQ(roce.attr("gid_index"), "7");
  EXPECT_EQ(roce.attr("gid"), kIpv4);
  EXPECT_EQ(roce.attr("roce"), "v2");
  EXPECT_EQ(roce.attr("netdev"), "ens1f0np0");
  EXPECT_FALSE(hasLine(d->warnings, "GID")) << ::testing::PrintToString(d->warnings);
  // The Ethernet interface of the RoCE function is folded into the RDMA port.
  EXPECT_EQ(g.netCount(), 2);
}

TEST(Gid, InfinibandPortUsesIndexZero) {
  DirReader reader(sysfsRoot("pcie_4gpu_roce"));
  auto d = detectLocal(reader);
  ASSERT_TRUE(d.isOk()) << d.status().message();
  Graph g = buildGraph(d->system);
  const Net& ib = netNamed(g, "mlx5_1");
  EXPECT_EQ(ib.attr("link_layer"), "InfiniBand");
  ASSERT_EQ(ib.gids.size(), 2u);  // slots 0 and 2; 1 and 3-7 zero
  EXPECT_EQ(ib.gids[1].index, 2);
  EXPECT_EQ(ib.attr("gid_index"), "0");
  EXPECT_EQ(ib.attr("gid"), "fe80:0000:0000:0000:1070:fd03:00c0:0001");
  EXPECT_EQ(ib.attr("roce"), "");  // not RoCE

  // The DGX fixture's ports have GID 0 alone.
  DirReader dgx(sysfsRoot("dgx_h100"));
  auto dd = detectLocal(dgx);
  ASSERT_TRUE(dd.isOk()) << dd.status().message();
  Graph gd = buildGraph(dd->system);
  const Net& n0 = netNamed(gd, "mlx5_0");
  ASSERT_EQ(n0.gids.size(), 1u);
  EXPECT_EQ(n0.attr("gid_index"), "0");
  EXPECT_EQ(n0.attr("gid"), "fe80:0000:0000:0000:a088:c203:0012:0000");
}

// The sysfs table as the shared GID choice reads it (common/roce_gid.h), and the choice.
TEST(Gid, ChoiceOverTheSysfsTable) {
  auto e = [](int i, const char* gid, const char* type) { return GidEntry{i, gid, type, "eth0"}; };
  auto pick = [](const std::vector<GidEntry>& t, bool ib) {
    return roce::chooseGid(roceTable(t, ib), ib, roce::GidRule{}, "d").index;
  };
  // v2 + IPv4 first, wherever it sits.
  EXPECT_EQ(pick({e(0, kLinkLocal, "IB/RoCE v1"), e(1, kLinkLocal, "RoCE v2"),
                  e(2, kIpv4, "IB/RoCE v1"), e(3, kIpv4, "RoCE v2")},
                 false),
            3);
  // No IPv4: other v2, global before link-local.
  EXPECT_EQ(pick({e(0, kLinkLocal, "IB/RoCE v1"), e(1, kLinkLocal, "RoCE v2"),
                  e(2, kIpv6, "IB/RoCE v1"), e(3, kIpv6, "RoCE v2")},
                 false),
            3);
  EXPECT_EQ(pick({e(0, kLinkLocal, "IB/RoCE v1"), e(1, kLinkLocal, "RoCE v2")}, false), 1);
  // v1 only: IPv4 first, then the lowest index.
  EXPECT_EQ(pick({e(0, kLinkLocal, "IB/RoCE v1"), e(4, kIpv4, "IB/RoCE v1")}, false), 4);
  EXPECT_EQ(pick({e(2, kLinkLocal, "IB/RoCE v1"), e(5, kLinkLocal, "IB/RoCE v1")}, false), 2);
  // InfiniBand: index 0 whatever else the table has.
  EXPECT_EQ(pick({e(0, kLinkLocal, "IB/RoCE v1"), e(1, kIpv4, "RoCE v2")}, true), 0);
  EXPECT_EQ(pick({}, false), -1);
  // Types and texts: "IB/RoCE v1" is v1 on a RoCE port; an entry that is not a GID is left out.
  const auto t = roceTable(
      {e(0, kIpv4, "IB/RoCE v1"), e(1, "not a gid", "RoCE v2"), e(2, kIpv6, "RoCE v2")}, false);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_TRUE(t[0].ipv4Mapped());
  EXPECT_EQ(t[0].type, roce::Gid::Type::kRoceV1);
  EXPECT_EQ(t[1].type, roce::Gid::Type::kRoceV2);
  EXPECT_EQ(t[1].text(), "fd00:10:0:1::11");
}

// loom-topo shows the GID the transport uses: LOOM_IB_GID_INDEX and the address settings
// move it.
TEST(Gid, DetectionFollowsTheSettings) {
  {
    settings::ScopedSetting index(settings::kIbGidIndex, "3");
    DirReader reader(sysfsRoot("pcie_4gpu_roce"));
    auto d = detectLocal(reader);
    ASSERT_TRUE(d.isOk()) << d.status().message();
    EXPECT_EQ(netNamed(buildGraph(d->system), "mlx5_0").attr("gid_index"), "3");
  }
  {
    settings::ScopedSetting family(settings::kIbAddrFamily, "AF_INET6");
    DirReader reader(sysfsRoot("pcie_4gpu_roce"));
    auto d = detectLocal(reader);
    ASSERT_TRUE(d.isOk()) << d.status().message();
    const Net& n = netNamed(buildGraph(d->system), "mlx5_0");
    EXPECT_EQ(n.attr("gid_index"), "3");
    EXPECT_EQ(n.attr("gid"), kIpv6);
  }
  {
    settings::ScopedSetting index(settings::kIbGidIndex, "9");
    DirReader reader(sysfsRoot("pcie_4gpu_roce"));
    auto d = detectLocal(reader);
    ASSERT_TRUE(d.isOk()) << d.status().message();
    EXPECT_TRUE(hasLine(d->warnings, "LOOM_IB_GID_INDEX=9 is not a populated GID"))
        << ::testing::PrintToString(d->warnings);
    EXPECT_EQ(netNamed(buildGraph(d->system), "mlx5_0").attr("gid"), "");
  }
}

// Counts the reads, to hold the cost of a mostly empty 256-slot table down.
class CountingReader : public MapReader {
 public:
  Result<std::string> readFile(const std::string& path) const override {
    ++reads;
    return MapReader::readFile(path);
  }
  mutable std::atomic<int> reads{0};
};

TEST(Gid, TableStopsAtTheFirstMissingSlotAndReadsLittle) {
  CountingReader r;
  const std::string port = "/sys/class/infiniband/mlx5_0/ports/1";
  const std::string zero = "0000:0000:0000:0000:0000:0000:0000:0000\n";
  for (int i = 0; i < 256; ++i) r.addFile(port + "/gids/" + std::to_string(i), zero);
  r.addFile(port + "/gids/0", std::string(kLinkLocal) + "\n");
  r.addFile(port + "/gid_attrs/types/0", "IB/RoCE v1\n");
  r.addFile(port + "/gid_attrs/ndevs/0", "eth0\n");
  r.addFile(port + "/gids/200", std::string(kIpv4) + "\n");
  r.addFile(port + "/gid_attrs/types/200", "RoCE v2\n");
  r.addFile(port + "/gid_attrs/ndevs/200", "eth0\n");
  std::vector<GidEntry> table = readGidTable(r, port);
  ASSERT_EQ(table.size(), 2u);
  EXPECT_EQ(table[1], (GidEntry{200, kIpv4, "RoCE v2", "eth0"}));
  EXPECT_EQ(r.reads.load(), 256 + 2 * 2);  // one read per slot, two more per populated one

  // A gap in the files ends the table: slots after it are not read.
  CountingReader gap;
  gap.addFile(port + "/gids/0", std::string(kLinkLocal) + "\n");
  gap.addFile(port + "/gids/2", std::string(kIpv4) + "\n");
  EXPECT_EQ(readGidTable(gap, port).size(), 1u);
  EXPECT_TRUE(readGidTable(gap, "/sys/class/infiniband/none/ports/1").empty());
}

TEST(Gid, RocePortWithoutIpv4V2Warns) {
  MapReader r;
  r.addDir("/sys");
  const std::string dev = "/sys/class/infiniband/mlx5_0";
  r.addFile(dev + "/ports/1/state", "4: ACTIVE\n");
  r.addFile(dev + "/ports/1/rate", "100 Gb/sec (4X EDR)\n");
  r.addFile(dev + "/ports/1/link_layer", "Ethernet\n");
  r.addFile(dev + "/ports/1/gids/0", std::string(kLinkLocal) + "\n");
  r.addFile(dev + "/ports/1/gid_attrs/types/0", "IB/RoCE v1\n");
  r.addFile(dev + "/ports/1/gid_attrs/ndevs/0", "eth0\n");
  r.addFile(dev + "/ports/1/gids/1", std::string(kLinkLocal) + "\n");
  r.addFile(dev + "/ports/1/gid_attrs/types/1", "RoCE v2\n");
  r.addFile(dev + "/ports/1/gid_attrs/ndevs/1", "eth0\n");
  r.addFile("/sys/class/infiniband/mlx5_1/ports/1/state", "4: ACTIVE\n");
  r.addFile("/sys/class/infiniband/mlx5_1/ports/1/link_layer", "Ethernet\n");
  r.addFile("/sys/class/infiniband/mlx5_1/ports/1/gids/0",
            "0000:0000:0000:0000:0000:0000:0000:0000\n");
  auto d = detectLocal(r);
  ASSERT_TRUE(d.isOk()) << d.status().message();
  EXPECT_TRUE(hasLine(d->warnings,
                      "mlx5_0 port 1: GID 1 (fe80::e42:a1ff:fe5a:b10, RoCE v2): no GID fits "
                      "AF_INET, RoCE v2"))
      << ::testing::PrintToString(d->warnings);
  EXPECT_TRUE(hasLine(d->warnings, "mlx5_1 port 1 has no populated GID"));
  Graph g = buildGraph(d->system);
  EXPECT_EQ(netNamed(g, "mlx5_0").attr("roce"), "v2");
  EXPECT_EQ(netNamed(g, "mlx5_1").attr("gid"), "");
}

TEST(Gid, JsonMatrixAndXml) {
  DirReader reader(sysfsRoot("pcie_4gpu_roce"));
  auto d = detectLocal(reader);
  ASSERT_TRUE(d.isOk()) << d.status().message();
  Graph g = buildGraph(d->system);
  auto j = nlohmann::json::parse(toJson(d->system, g, nullptr, nullptr));
  const auto& nic = j["nics"][0];
  EXPECT_EQ(nic["name"], "mlx5_0");
  EXPECT_EQ(nic["gid_index"], 7);
  EXPECT_EQ(nic["roce"], "v2");
  ASSERT_EQ(nic["gids"].size(), 6u);
  EXPECT_EQ(
      nic["gids"][5],
      (nlohmann::json{{"index", 7}, {"gid", kIpv4}, {"type", "RoCE v2"}, {"netdev", "ens1f0np0"}}));
  EXPECT_EQ(j["nics"][1]["gid_index"], 0);
  EXPECT_EQ(j["nics"][1]["gids"].size(), 2u);

  std::string m = formatMatrix(d->system, g);
  EXPECT_NE(
      m.find("NIC0: mlx5_0 port 1, 100 Gb/s, Ethernet, GDR, 0000:19:00.0, GID index 7 (RoCE v2) "
             "of 6 in its table\n"),
      std::string::npos)
      << m;
  EXPECT_NE(
      m.find("NIC1: mlx5_1 port 1, 200 Gb/s, InfiniBand, GDR, 0000:99:00.0, GID index 0 of 2 in "
             "its table\n"),
      std::string::npos)
      << m;

  // The XML carries the chosen entry, not the table (NCCL caps files at 256 elements).
  auto back = parseXml(toXml(d->system));
  ASSERT_TRUE(back.isOk()) << back.status().message();
  Graph gb = buildGraph(back->system);
  const Net& roce = netNamed(gb, "mlx5_0");
  EXPECT_TRUE(roce.gids.empty());
  EXPECT_EQ(roce.attr("gid_index"), "7");
  EXPECT_EQ(roce.attr("gid"), kIpv4);
  std::string mb = formatMatrix(back->system, gb);
  EXPECT_NE(mb.find("GID index 7 (RoCE v2)\n"), std::string::npos) << mb;
}

}  // namespace
}  // namespace loom::topology
