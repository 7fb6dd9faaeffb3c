// The cluster view at communicator init (comm/topology_view.h): ranks as threads of
// this process over a real bootstrap, with hand-made PeerInfo so that one machine
// plays several hosts (LOOM_HOST_ID is process-wide; PeerInfo::hostHash is per rank).
#include "comm/topology_view.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "comm/bootstrap.h"
#include "comm/unique_id.h"
#include "common/settings.h"
#include "topology/topology.h"

namespace loom::comm {
namespace {

namespace fs = std::filesystem;
using settings::ScopedSetting;

std::string fixture(const std::string& name) {
  return std::string(LOOM_TOPO_FIXTURES) + "/" + name;
}

struct RankSpec {
  uint64_t hostHash;
  int cudaDev;  // -1: host memory
};

constexpr uint64_t kHostA = 0xa11ce, kHostB = 0xb0b;

struct RankRun {
  std::vector<std::optional<Result<TopologyView>>> views;
  double wallMs = 0;  // from all ranks joined to the last view built

  const TopologyView& view(int r) const { return views[r]->value(); }
};

// Runs buildTopologyView on specs.size() ranks, one thread each.
RankRun runRanks(const std::vector<RankSpec>& specs, const TopologyViewOptions& options = {}) {
  const int n = static_cast<int>(specs.size());
  IdContents id;
  id.root = SocketAddress::parse("127.0.0.1:0").value();
  EXPECT_TRUE(randomSecret(id.secret).isOk());
  Status st = startRoot(&id, 20000);
  EXPECT_TRUE(st.isOk()) << st.message();
  std::vector<transport::PeerInfo> peers(n);
  for (int r = 0; r < n; ++r) {
    peers[r].rank = r;
    peers[r].cudaDev = specs[r].cudaDev;
    peers[r].pid = getpid();
    peers[r].hostHash = specs[r].hostHash;
    std::snprintf(peers[r].hostName, sizeof(peers[r].hostName), "fake%llx",
                  static_cast<unsigned long long>(specs[r].hostHash));
  }
  // Join concurrently: the root answers once everyone is there.
  std::vector<std::unique_ptr<Bootstrap>> boots(n);
  std::vector<std::thread> joiners;
  for (int r = 0; r < n; ++r) {
    joiners.emplace_back([&, r] {
      auto b = Bootstrap::join(id, r, n, 20000, nullptr);
      if (b) boots[r] = std::move(b).value();
    });
  }
  for (auto& t : joiners) t.join();
  RankRun run;
  run.views.resize(n);
  for (int r = 0; r < n; ++r) {
    if (!boots[r]) {
      ADD_FAILURE() << "rank " << r << " did not join";
      return run;
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      run.views[r].emplace(buildTopologyView(*boots[r], peers, r, specs[r].cudaDev, options));
    });
  }
  for (auto& t : threads) t.join();
  run.wallMs =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return run;
}

void expectAllOk(const RankRun& run) {
  for (size_t r = 0; r < run.views.size(); ++r) {
    ASSERT_TRUE(run.views[r].has_value());
    ASSERT_TRUE(run.views[r]->isOk()) << "rank " << r << ": " << run.views[r]->status().message();
  }
}

bool isPermutation(std::vector<int> ring, int n) {
  std::sort(ring.begin(), ring.end());
  for (int i = 0; i < n; ++i)
    if (static_cast<int>(ring.size()) != n || ring[i] != i) return false;
  return true;
}

// Each host's ranks form one contiguous stretch of the (cyclic) ring.
bool hostsAdjacent(const TopologyView& v, const std::vector<int>& ring) {
  const int n = static_cast<int>(ring.size());
  int changes = 0;
  for (int i = 0; i < n; ++i) changes += v.hostOf[ring[i]] != v.hostOf[ring[(i + 1) % n]];
  int hosts = static_cast<int>(v.hostRanks.size());
  return hosts == 1 ? changes == 0 : changes == hosts;
}

// Every rank reaches the root by parents, without cycles.
void expectTree(const topology::TreeChannel& t, int n) {
  ASSERT_EQ(static_cast<int>(t.parent.size()), n);
  ASSERT_GE(t.root, 0);
  EXPECT_EQ(t.parent[t.root], -1);
  for (int r = 0; r < n; ++r) {
    int at = r, steps = 0;
    while (at != t.root && steps <= n) {
      at = t.parent[at];
      ASSERT_GE(at, 0) << "rank " << r << " does not reach the root";
      ++steps;
    }
    EXPECT_LE(steps, n);
  }
}

void expectSameEverywhere(const RankRun& run) {
  const TopologyView& v0 = run.view(0);
  for (size_t r = 1; r < run.views.size(); ++r) {
    const TopologyView& v = run.view(static_cast<int>(r));
    EXPECT_EQ(v.ring, v0.ring) << "rank " << r;
    EXPECT_EQ(v.rings, v0.rings) << "rank " << r;
    EXPECT_EQ(v.hostOf, v0.hostOf);
    EXPECT_EQ(v.hostIds, v0.hostIds);
    EXPECT_EQ(v.searched, v0.searched);
    EXPECT_EQ(v.cluster.hosts, v0.cluster.hosts);
    ASSERT_EQ(v.trees.channels.size(), v0.trees.channels.size());
    for (size_t c = 0; c < v.trees.channels.size(); ++c) {
      EXPECT_EQ(v.trees.channels[c].root, v0.trees.channels[c].root);
      EXPECT_EQ(v.trees.channels[c].parent, v0.trees.channels[c].parent);
    }
    for (int a = 0; a < v.nranks; ++a)
      for (int b = 0; b < v.nranks; ++b) EXPECT_EQ(v.pathType(a, b), v0.pathType(a, b));
  }
}

std::string tempDir(const std::string& name) {
  std::string dir =
      ::testing::TempDir() + "/loom_topo_view_" + name + "_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(TopologyView, HostMemoryTwoHostsGroupsRanksAndWritesDumps) {
  std::string dir = tempDir("dumps");
  ScopedSetting topoDump(settings::kTopoDumpFile, dir + "/topo_%r.xml");
  ScopedSetting graphDump(settings::kGraphDumpFile, dir + "/graph_%r.json");
  topology::DirReader reader(fixture("sysfs/cpu_only_2nic"));
  TopologyViewOptions options;
  options.reader = &reader;
  // Hosts interleaved in rank order, so grouping them is not the identity.
  RankRun run = runRanks({{kHostA, -1}, {kHostB, -1}, {kHostA, -1}, {kHostB, -1}}, options);
  expectAllOk(run);
  expectSameEverywhere(run);
  const TopologyView& v = run.view(0);
  EXPECT_EQ(v.ring, (std::vector<int>{0, 2, 1, 3}));
  EXPECT_TRUE(isPermutation(v.ring, 4));
  EXPECT_TRUE(hostsAdjacent(v, v.ring));
  EXPECT_FALSE(v.searched);
  EXPECT_TRUE(v.warnings.empty()) << v.warnings.front();  // host memory: the plan, not a fallback
  EXPECT_TRUE(v.sameHost(0, 2));
  EXPECT_FALSE(v.sameHost(0, 1));
  EXPECT_EQ(v.pathType(0, 1), "NET");
  EXPECT_EQ(v.pathType(0, 2), "");
  EXPECT_EQ(v.pathType(3, 3), "LOC");
  ASSERT_EQ(v.hostIds.size(), 2u);
  EXPECT_NE(v.hostIds[0], v.hostIds[1]);  // one machine playing two hosts
  ASSERT_EQ(v.trees.channels.size(), 2u);
  for (const auto& t : v.trees.channels) expectTree(t, 4);
  EXPECT_NE(v.summary.find("4 ranks on 2 hosts"), std::string::npos) << v.summary;

  // The hosts' lowest ranks (0 and 1) wrote their host's XML; it reads back, with ranks.
  for (int r : {0, 1}) {
    auto xml = topology::readXmlFile(dir + "/topo_" + std::to_string(r) + ".xml");
    ASSERT_TRUE(xml.isOk()) << xml.status().message();
    EXPECT_EQ(xml->system, v.cluster.hosts[v.hostOf[r]]);
    EXPECT_EQ(topology::netCount(xml->system), 4);  // two E810 ports, docker0, a veth
  }
  EXPECT_FALSE(fs::exists(dir + "/topo_2.xml"));
  EXPECT_FALSE(fs::exists(dir + "/topo_3.xml"));
  // Rank 0 wrote the graph.
  EXPECT_FALSE(fs::exists(dir + "/graph_1.json"));
  std::ifstream in(dir + "/graph_0.json");
  ASSERT_TRUE(in.good());
  auto json = nlohmann::json::parse(in, nullptr, false);
  ASSERT_FALSE(json.is_discarded());
  ASSERT_TRUE(json["rings"].is_array());
  EXPECT_EQ(json["rings"][0].get<std::vector<int>>(), (std::vector<int>{0, 2, 1, 3}));
  ASSERT_TRUE(json["trees"].is_array());
  ASSERT_EQ(json["trees"].size(), 2u);
  EXPECT_EQ(json["trees"][0]["parent"].get<std::vector<int>>(), v.trees.channels[0].parent);
  fs::remove_all(dir);
}

TEST(TopologyView, GpuRanksOnTwoRecordedDgxHostsFollowTheSearch) {
  topology::DirReader reader(fixture("sysfs/dgx_h100"));
  TopologyViewOptions options;
  options.reader = &reader;
  options.busIdOf = [](int) { return std::string(); };  // match GPUs by CUDA index
  RankRun run = runRanks({{kHostA, 0}, {kHostB, 0}, {kHostA, 1}, {kHostB, 1}}, options);
  expectAllOk(run);
  expectSameEverywhere(run);
  const TopologyView& v = run.view(0);
  EXPECT_TRUE(v.searched) << (v.warnings.empty() ? "" : v.warnings.front());
  // Matched by index, which each rank's warning says (the index is wrong under a
  // CUDA_VISIBLE_DEVICES that reorders GPUs; GpuFoundByBusIdNotIndex).
  EXPECT_EQ(v.warnings.size(), 4u);
  for (const auto& w : v.warnings) EXPECT_NE(w.find("by its CUDA index"), std::string::npos) << w;
  EXPECT_TRUE(isPermutation(v.ring, 4));
  EXPECT_TRUE(hostsAdjacent(v, v.ring));
  EXPECT_GE(v.rings.size(), 2u);  // one per NIC the two GPUs use, at least
  for (const auto& ring : v.rings) {
    EXPECT_TRUE(isPermutation(ring, 4));
    EXPECT_TRUE(hostsAdjacent(v, ring));
  }
  EXPECT_EQ(v.pathType(0, 2), "NVL");
  EXPECT_EQ(v.pathType(1, 3), "NVL");
  EXPECT_EQ(v.pathType(0, 1), "NET");
  EXPECT_EQ(v.pathType(2, 2), "LOC");
  ASSERT_FALSE(v.plan.channels.front().netIn.empty());  // across hosts, through NICs
  for (const auto& t : v.trees.channels) expectTree(t, 4);
  // The ranks went into the cluster view's GPUs.
  int ranked = 0;
  for (const auto& host : v.cluster.hosts)
    forEachPci(host, [&](const topology::PciNode& p, const topology::Cpu&) {
      if (p.gpu && p.gpu->rank >= 0) ++ranked;
    });
  EXPECT_EQ(ranked, 4);
}

TEST(TopologyView, SixteenGpuRanksOnTwoDgxHostsUseEveryNic) {
  topology::DirReader reader(fixture("sysfs/dgx_h100"));
  TopologyViewOptions options;
  options.reader = &reader;
  options.log = false;
  options.busIdOf = [](int) { return std::string(); };
  std::vector<RankSpec> specs;
  for (int r = 0; r < 16; ++r) specs.push_back({r < 8 ? kHostA : kHostB, r % 8});
  RankRun run = runRanks(specs, options);
  expectAllOk(run);
  expectSameEverywhere(run);
  const TopologyView& v = run.view(0);
  ASSERT_TRUE(v.searched);
  EXPECT_GE(v.rings.size(), 8u);
  std::set<int> nicsIn;
  for (const auto& ch : v.plan.channels) {
    EXPECT_TRUE(isPermutation(ch.ranks, 16));
    EXPECT_TRUE(hostsAdjacent(v, ch.ranks));
    nicsIn.insert(ch.netIn[0]);
  }
  EXPECT_EQ(nicsIn.size(), 8u);
  EXPECT_EQ(v.pathType(0, 7), "NVL");
  EXPECT_EQ(v.pathType(0, 8), "NET");
}

TEST(TopologyView, GpuFoundByBusIdNotIndex) {
  topology::DirReader reader(fixture("sysfs/dgx_h100"));
  auto detected = topology::detectLocal(reader);
  ASSERT_TRUE(detected.isOk()) << detected.status().message();
  std::map<int, std::string> busOfDev;
  forEachPci(detected->system, [&](const topology::PciNode& p, const topology::Cpu&) {
    if (p.gpu) busOfDev[p.gpu->dev] = p.busId;
  });
  ASSERT_EQ(busOfDev.size(), 8u);
  TopologyViewOptions options;
  options.reader = &reader;
  options.log = false;
  // CUDA_VISIBLE_DEVICES=7,6 in effect: CUDA device 0 is the machine's GPU 7.
  options.busIdOf = [&](int cudaDev) { return busOfDev[7 - cudaDev]; };
  RankRun run = runRanks({{kHostA, 0}, {kHostA, 1}}, options);
  expectAllOk(run);
  const TopologyView& v = run.view(0);
  ASSERT_TRUE(v.searched);
  int rankOf7 = -1, rankOf6 = -1;
  forEachPci(v.cluster.hosts[0], [&](const topology::PciNode& p, const topology::Cpu&) {
    if (p.gpu && p.gpu->dev == 7) rankOf7 = p.gpu->rank;
    if (p.gpu && p.gpu->dev == 6) rankOf6 = p.gpu->rank;
  });
  EXPECT_EQ(rankOf7, 0);
  EXPECT_EQ(rankOf6, 1);
  EXPECT_EQ(v.pathType(0, 1), "NVL");
}

TEST(TopologyView, MalformedTopoFileFailsEveryRankWithItsLine) {
  std::string dir = tempDir("bad");
  std::string path = dir + "/bad.xml";
  {
    std::ofstream f(path);
    f << "<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci "
         "busid=\"0000:01:00.0\"\n</system>\n";
  }
  // Through the NCCL alias, as a user of NCCL would set it.
  setenv("NCCL_TOPO_FILE", path.c_str(), 1);
  topology::DirReader reader(fixture("sysfs/cpu_only_2nic"));
  TopologyViewOptions options;
  options.reader = &reader;
  RankRun run = runRanks({{kHostA, -1}, {kHostB, -1}, {kHostA, -1}}, options);
  unsetenv("NCCL_TOPO_FILE");
  for (size_t r = 0; r < run.views.size(); ++r) {
    ASSERT_TRUE(run.views[r].has_value());
    ASSERT_FALSE(run.views[r]->isOk()) << "rank " << r;
    const Status& st = run.views[r]->status();
    EXPECT_EQ(st.code(), Code::kInvalidUsage);
    EXPECT_NE(st.message().find("NCCL_TOPO_FILE"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(path + ":"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("rank 0:"), std::string::npos) << st.message();
    EXPECT_EQ(st.message(), run.views[0]->status().message());
  }
  fs::remove_all(dir);
}

TEST(TopologyView, MissingTopoFileIsIgnoredWithAWarning) {
  ScopedSetting file(settings::kTopoFile, "/nonexistent/loom-topo.xml");
  topology::DirReader reader(fixture("sysfs/dgx_h100"));
  TopologyViewOptions options;
  options.reader = &reader;
  options.busIdOf = [](int) { return std::string(); };
  RankRun run = runRanks({{kHostA, 0}, {kHostA, 1}}, options);
  expectAllOk(run);
  EXPECT_TRUE(run.view(0).searched);
}

TEST(TopologyView, TopoFileLaidOverDetection) {
  // A CPU-only machine told by the file that it has a DGX's GPUs.
  ScopedSetting file(settings::kTopoFile, fixture("dgx_h100.xml"));
  topology::DirReader reader(fixture("sysfs/cpu_only_2nic"));
  TopologyViewOptions options;
  options.reader = &reader;
  options.busIdOf = [](int) { return std::string(); };
  RankRun run = runRanks({{kHostA, 0}, {kHostA, 1}, {kHostA, 2}, {kHostA, 3}}, options);
  expectAllOk(run);
  expectSameEverywhere(run);
  const TopologyView& v = run.view(0);
  EXPECT_TRUE(v.searched);
  EXPECT_EQ(topology::gpuCount(v.cluster.hosts[0]), 8);
  EXPECT_EQ(v.pathType(0, 3), "NVL");
  EXPECT_GE(v.rings.size(), 2u);
}

TEST(TopologyView, DetectionFailureFallsBackToRanksByHost) {
  std::string empty = tempDir("nosys");  // no /sys under it: detection fails
  topology::DirReader reader(empty);
  TopologyViewOptions options;
  options.reader = &reader;
  options.busIdOf = [](int) { return std::string(); };
  RankRun run = runRanks({{kHostB, 0}, {kHostA, 0}, {kHostB, 1}}, options);
  expectAllOk(run);
  expectSameEverywhere(run);
  const TopologyView& v = run.view(0);
  EXPECT_FALSE(v.searched);
  EXPECT_EQ(v.ring, (std::vector<int>{0, 2, 1}));
  ASSERT_FALSE(v.warnings.empty());
  EXPECT_NE(v.warnings.front().find("could not detect"), std::string::npos) << v.warnings.front();
  EXPECT_EQ(v.pathType(0, 2), "");
  EXPECT_EQ(v.pathType(0, 1), "NET");
  for (const auto& t : v.trees.channels) expectTree(t, 3);
  fs::remove_all(empty);
}

TEST(TopologyView, TwoRanksOnOneGpuFallBack) {
  topology::DirReader reader(fixture("sysfs/dgx_h100"));
  TopologyViewOptions options;
  options.reader = &reader;
  options.log = false;
  options.busIdOf = [](int) { return std::string(); };
  RankRun run = runRanks({{kHostA, 3}, {kHostA, 3}}, options);
  expectAllOk(run);
  const TopologyView& v = run.view(1);
  EXPECT_FALSE(v.searched);
  EXPECT_EQ(v.ring, (std::vector<int>{0, 1}));
  ASSERT_FALSE(v.warnings.empty());
  bool said = false;
  for (const auto& w : v.warnings) said |= w.find("two ranks on one GPU") != std::string::npos;
  EXPECT_TRUE(said) << v.warnings.front();
}

TEST(TopologyView, OneRank) {
  RankRun run = runRanks({{kHostA, -1}});
  expectAllOk(run);
  EXPECT_EQ(run.view(0).ring, std::vector<int>{0});
  EXPECT_EQ(run.view(0).pathType(0, 0), "LOC");
  ASSERT_EQ(run.view(0).trees.channels.size(), 1u);
  EXPECT_EQ(run.view(0).trees.channels[0].root, 0);
}

// The live machine (whatever it has), timed: 4 ranks on one host and on two.
TEST(TopologyView, LiveMachineFourRanksTimed) {
  for (bool twoHosts : {false, true}) {
    std::vector<RankSpec> specs;
    for (int r = 0; r < 4; ++r) specs.push_back({twoHosts && r >= 2 ? kHostB : kHostA, -1});
    TopologyViewOptions options;
    options.log = false;
    RankRun run = runRanks(specs, options);
    expectAllOk(run);
    expectSameEverywhere(run);
    double detect = 0, total = 0;
    for (int r = 0; r < 4; ++r) {
      detect = std::max(detect, run.view(r).detectMs);
      total = std::max(total, run.view(r).totalMs);
    }
    EXPECT_TRUE(isPermutation(run.view(0).ring, 4));
    std::printf(
        "4 ranks on %d host(s), live machine: detection %.2f ms (slowest leader), "
        "buildTopologyView %.2f ms (slowest rank), wall %.2f ms\n%s\n",
        twoHosts ? 2 : 1, detect, total, run.wallMs, run.view(0).summary.c_str());
    RecordProperty(twoHosts ? "wall_ms_two_hosts" : "wall_ms_one_host", std::to_string(run.wallMs));
  }
}

TEST(TopologyView, ExpandDumpPath) {
  EXPECT_EQ(expandDumpPath("/tmp/topo-%h-%r.%p.xml", "node7", 3, 42), "/tmp/topo-node7-3.42.xml");
  EXPECT_EQ(expandDumpPath("a%%b%", "h", 0, 1), "a%b%");
  EXPECT_EQ(expandDumpPath("x%qy", "h", 0, 1), "x%qy");
  EXPECT_EQ(expandDumpPath("plain.xml", "h", 0, 1), "plain.xml");
}

}  // namespace
}  // namespace loom::comm

// ---- ranksHaveOwnCpus: whether the host's ranks may each spin on a core of their own ----

namespace loom::comm {

namespace {

transport::PeerInfo peerOn(int rank, uint64_t host, std::initializer_list<int> cpus) {
  transport::PeerInfo p;
  p.rank = rank;
  p.hostHash = host;
  for (int c : cpus) p.cpuMask[c / 64] |= uint64_t{1} << (c % 64);
  return p;
}

}  // namespace

TEST(OwnCpus, CountsTheUnionOfTheHostsRanksAffinity) {
  // 4 ranks free to run on 2 CPUs (this VM): they share.
  std::vector<transport::PeerInfo> shared;
  for (int r = 0; r < 4; ++r) shared.push_back(peerOn(r, 7, {0, 1}));
  for (int r = 0; r < 4; ++r) EXPECT_FALSE(ranksHaveOwnCpus(shared, r));
  // 4 ranks on a 32-CPU machine, unbound.
  std::vector<transport::PeerInfo> roomy;
  for (int r = 0; r < 4; ++r) roomy.push_back(peerOn(r, 7, {0, 1, 2, 3, 4, 5, 6, 31}));
  EXPECT_TRUE(ranksHaveOwnCpus(roomy, 0));
  // Bound one to a core (mpirun --bind-to core): each sees one CPU, but all differ.
  std::vector<transport::PeerInfo> bound;
  for (int r = 0; r < 4; ++r) bound.push_back(peerOn(r, 7, {r * 2}));
  EXPECT_TRUE(ranksHaveOwnCpus(bound, 3));
  // Bound, but two to one core (taskset on a shared CPU).
  bound[3] = peerOn(3, 7, {0});
  EXPECT_FALSE(ranksHaveOwnCpus(bound, 1));
  // CPUs past 64 count; only the rank's own host counts.
  std::vector<transport::PeerInfo> hosts = {peerOn(0, 1, {70}), peerOn(1, 1, {900}),
                                            peerOn(2, 2, {5}), peerOn(3, 2, {5})};
  EXPECT_TRUE(ranksHaveOwnCpus(hosts, 0));
  EXPECT_TRUE(ranksHaveOwnCpus(hosts, 1));
  EXPECT_FALSE(ranksHaveOwnCpus(hosts, 2));
}

}  // namespace loom::comm
