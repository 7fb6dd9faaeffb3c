#include "comm/topology_view.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>

#include "common/log.h"
#include "common/settings.h"
#include "topology/cuda_device.h"
#include "topology/detect.h"
#include "topology/report.h"
#include "topology/xml.h"

namespace loom::comm {
namespace {

using topology::PathType;
using topology::System;

double msSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// What a host's lowest rank found, as every rank learns it.
enum class HostState : int32_t {
  kNotLeader = 0,  // this rank did not detect
  kDetected = 1,   // payload: the host's NCCL XML
  kFailed = 2,     // payload: why detection failed (the view falls back)
  kFileError = 3,  // payload: the topology file's error (every rank fails init)
};

// The fixed-size record every rank contributes (one allGather).
struct RankRecord {
  uint64_t payloadBytes = 0;  // this rank's block in the exchange (leaders only)
  int32_t state = 0;          // HostState
  int32_t cudaDev = -1;
  char busId[32] = {0};  // normalized PCI bus id of this rank's GPU; "" when unknown
};

struct LocalTopology {
  HostState state = HostState::kFailed;
  std::string payload;
};

// Detection of this host by its lowest rank, with the topology file laid over it.
LocalTopology detectHost(const TopologyViewOptions& options) {
  topology::DirReader live("/");
  const topology::Reader& reader = options.reader ? *options.reader : live;
  topology::DetectOptions detectOptions;
  detectOptions.gpuSource = options.gpuSource;
  const std::string file = topology::topoFileSetting();
  const std::string fileVar = settings::sourceOf(settings::kTopoFile);
  LocalTopology out;

  auto detected = topology::detectLocal(reader, detectOptions);
  if (!detected) {
    // No sysfs: a topology file, when given, can stand alone.
    if (file.empty()) {
      out.payload = detected.status().message();
      return out;
    }
    auto loaded = topology::readXmlFile(file);
    if (!loaded) {
      if (loaded.status().code() == Code::kInvalidArgument) {
        out.state = HostState::kFileError;
        out.payload = fileVar + ": " + loaded.status().message();
      } else {
        out.payload =
            detected.status().message() + "; and " + fileVar + ": " + loaded.status().message();
      }
      return out;
    }
    topology::Detected fromFile;
    fromFile.system = std::move(loaded->system);
    fromFile.system.setHostId(topology::detectHostId(reader));
    detected = std::move(fromFile);
  } else if (!file.empty()) {
    Status st = topology::overlayTopoFile(*detected, file);
    if (!st && st.code() == Code::kInvalidArgument) {
      out.state = HostState::kFileError;
      out.payload = fileVar + ": " + st.message();
      return out;
    }
    // Unreadable: NCCL warns and goes on with detection; so do we.
    if (!st) LOOM_WARN(kInit, "topology: %s ignored: %s", fileVar.c_str(), st.message().c_str());
  }
  for (const std::string& w : detected->warnings) LOOM_INFO(kGraph, "topology: %s", w.c_str());
  out.state = HostState::kDetected;
  out.payload = topology::toXml(detected->system);
  return out;
}

// All-gather of one variable-sized block per host: a ring over the hosts' lowest ranks,
// then each of them hands the whole set to the other ranks of its host. `blocks[h]` is
// host h's (sizes known to every rank from the records; this rank's own already filled
// when it is a leader). Every rank calls nextTag() hosts.size() times.
Status exchangeHostBlocks(Bootstrap& bootstrap, const std::vector<std::vector<int>>& hosts,
                          int myHost, int rank, std::vector<std::string>& blocks) {
  const int nh = static_cast<int>(hosts.size());
  std::vector<uint64_t> tags(nh);
  for (uint64_t& t : tags) t = bootstrap.nextTag();
  const bool leader = hosts[myHost].front() == rank;
  if (leader && nh > 1) {
    const int next = hosts[(myHost + 1) % nh].front();
    const int prev = hosts[(myHost - 1 + nh) % nh].front();
    for (int s = 0; s < nh - 1; ++s) {
      const int sendHost = (myHost - s + nh) % nh;
      const int recvHost = (myHost - s - 1 + nh) % nh;
      auto doSend = [&]() -> Status {
        if (blocks[sendHost].empty()) return Status::ok();
        return bootstrap.send(next, tags[s], blocks[sendHost].data(), blocks[sendHost].size());
      };
      auto doRecv = [&]() -> Status {
        if (blocks[recvHost].empty()) return Status::ok();
        return bootstrap.recv(prev, tags[s], blocks[recvHost].data(), blocks[recvHost].size());
      };
      // Even hosts send first, odd hosts receive first: a block larger than the socket
      // buffers blocks its sender until the receiver reads, and a ring of blocked
      // senders would never move.
      if (myHost % 2 == 0) {
        LOOM_TRY(doSend());
        LOOM_TRY(doRecv());
      } else {
        LOOM_TRY(doRecv());
        LOOM_TRY(doSend());
      }
    }
  }
  size_t total = 0;
  for (const std::string& b : blocks) total += b.size();
  if (total == 0 || hosts[myHost].size() == 1) return Status::ok();
  std::string all;
  if (leader) {
    all.reserve(total);
    for (const std::string& b : blocks) all += b;
    for (size_t i = 1; i < hosts[myHost].size(); ++i) {
      LOOM_TRY(bootstrap.send(hosts[myHost][i], tags[nh - 1], all.data(), all.size()));
    }
  } else {
    all.resize(total);
    LOOM_TRY(bootstrap.recv(hosts[myHost].front(), tags[nh - 1], all.data(), all.size()));
    size_t at = 0;
    for (std::string& b : blocks) {
      std::memcpy(b.data(), all.data() + at, b.size());
      at += b.size();
    }
  }
  return Status::ok();
}

// Host order and membership from the peers' host hashes: hosts in order of their
// lowest rank, ranks ascending inside a host.
void groupHosts(const std::vector<transport::PeerInfo>& peers, TopologyView& view) {
  auto& hosts = view.hostRanks;
  const int n = static_cast<int>(peers.size());
  std::map<uint64_t, int> index;
  view.hostOf.assign(n, -1);
  view.localIndex.assign(n, -1);
  for (int r = 0; r < n; ++r) {
    auto [it, fresh] = index.emplace(peers[r].hostHash, static_cast<int>(hosts.size()));
    if (fresh) hosts.emplace_back();
    view.hostOf[r] = it->second;
    view.localIndex[r] = static_cast<int>(hosts[it->second].size());
    hosts[it->second].push_back(r);
  }
}

// Host h's topology from its leader's block; an empty System (and a warning) when the
// host could not be detected. Host ids are made unique (two "hosts" of one machine,
// as tests make them with different host hashes, detect the same id).
System hostSystem(int h, int leader, const RankRecord& record, const std::string& block,
                  const transport::PeerInfo& peer, const std::vector<std::string>& earlierIds,
                  std::vector<std::string>& warnings) {
  System system;
  char hash[24];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(peer.hostHash));
  if (static_cast<HostState>(record.state) == HostState::kDetected) {
    auto parsed = topology::parseXml(block, "rank " + std::to_string(leader) + "'s topology");
    if (parsed) {
      system = std::move(parsed->system);
    } else {
      warnings.push_back("host " + std::to_string(h) + " (rank " + std::to_string(leader) +
                         "): its topology did not parse: " + parsed.status().message());
    }
  } else {
    warnings.push_back("host " + std::to_string(h) + " (" + peer.hostName + ", rank " +
                       std::to_string(leader) + ") could not detect its topology: " + block);
  }
  std::string id = system.hostId();
  if (id.empty()) id = std::string(peer.hostName) + "-" + hash;
  if (std::find(earlierIds.begin(), earlierIds.end(), id) != earlierIds.end()) {
    id += "#" + std::string(hash);
  }
  system.setHostId(id);
  return system;
}

// Gives each rank's GPU its rank in its host's System. False (with a warning) when a
// rank's GPU is not there or two ranks share one; host-memory ranks are skipped.
bool assignGpuRanks(const std::vector<std::vector<int>>& hosts,
                    const std::vector<RankRecord>& records, TopologyView& view) {
  bool ok = true;
  for (size_t h = 0; h < hosts.size(); ++h) {
    System& system = view.cluster.hosts[h];
    if (system.cpus.empty()) {  // not detected: already warned about, no GPU to find
      for (int r : hosts[h]) ok &= records[r].cudaDev < 0;
      continue;
    }
    forEachPci(system, [](topology::PciNode& p, topology::Cpu&) {
      if (p.gpu) p.gpu->rank = -1;
    });
    for (int r : hosts[h]) {
      const RankRecord& rec = records[r];
      if (rec.cudaDev < 0) continue;
      const std::string bus = rec.busId;
      topology::PciNode* found = nullptr;
      forEachPci(system, [&](topology::PciNode& p, topology::Cpu&) {
        if (!p.gpu || found) return;
        if (bus.empty() ? p.gpu->dev == rec.cudaDev : p.busId == bus) found = &p;
      });
      std::string which = "rank " + std::to_string(r) + "'s GPU (CUDA device " +
                          std::to_string(rec.cudaDev) + (bus.empty() ? "" : ", " + bus) + ")";
      if (!found) {
        view.warnings.push_back(which + " is not in host " + std::to_string(h) + "'s topology");
        ok = false;
      } else if (found->gpu->rank >= 0) {
        view.warnings.push_back(which + " is also rank " + std::to_string(found->gpu->rank) +
                                "'s: two ranks on one GPU");
        ok = false;
      } else {
        found->gpu->rank = r;
        if (bus.empty()) {
          // The index names the same GPU only where CUDA and the topology count devices
          // alike (not under a CUDA_VISIBLE_DEVICES that reorders them): say so.
          view.warnings.push_back(
              which + " reports no PCI bus id: matched to the topology's GPU " +
              std::to_string(rec.cudaDev) +
              " by its CUDA index, which is wrong if CUDA_VISIBLE_DEVICES reorders "
              "the GPUs");
        }
      }
    }
  }
  return ok;
}

// Path types between the ranks of each host. Identical hosts share one Graph.
void computeLocalPaths(const std::vector<std::vector<int>>& hosts, TopologyView& view) {
  std::map<std::string, std::unique_ptr<topology::Graph>> graphs;
  view.localPaths.assign(hosts.size(), {});
  for (size_t h = 0; h < hosts.size(); ++h) {
    const int k = static_cast<int>(hosts[h].size());
    auto& paths = view.localPaths[h];
    paths.assign(static_cast<size_t>(k) * k, PathType::kDis);
    for (int i = 0; i < k; ++i) paths[i * k + i] = PathType::kLoc;
    // Local GPU index of each rank of the host, by bus id.
    const System& system = view.cluster.hosts[h];
    std::map<int, std::string> busOf;  // rank -> bus id
    forEachPci(system, [&](const topology::PciNode& p, const topology::Cpu&) {
      if (p.gpu && p.gpu->rank >= 0) busOf[p.gpu->rank] = p.busId;
    });
    if (busOf.size() < 2) continue;
    std::string key = topology::hostShapeKey(system);
    auto it = graphs.find(key);
    if (it == graphs.end()) {
      auto built = topology::Graph::build(system);
      it = graphs
               .emplace(key, built ? std::make_unique<topology::Graph>(std::move(built).value())
                                   : nullptr)
               .first;
      if (!built) {
        view.warnings.push_back("host " + std::to_string(h) + ": " + built.status().message());
      }
    }
    const topology::Graph* graph = it->second.get();
    if (!graph) continue;
    std::map<std::string, int> gpuIndex;
    for (int g = 0; g < graph->gpuCount(); ++g)
      gpuIndex[graph->nodes()[graph->gpus()[g]].busId] = g;
    for (int a = 0; a < k; ++a) {
      for (int b = 0; b < k; ++b) {
        if (a == b) continue;
        auto ba = busOf.find(hosts[h][a]), bb = busOf.find(hosts[h][b]);
        if (ba == busOf.end() || bb == busOf.end()) continue;
        auto ga = gpuIndex.find(ba->second), gb = gpuIndex.find(bb->second);
        if (ga == gpuIndex.end() || gb == gpuIndex.end()) continue;
        paths[a * k + b] = graph->gpuToGpu(ga->second, gb->second).type;
      }
    }
  }
}

bool isPermutation(const std::vector<int>& ring, int n) {
  if (static_cast<int>(ring.size()) != n) return false;
  std::vector<char> seen(n, 0);
  for (int r : ring) {
    if (r < 0 || r >= n || seen[r]) return false;
    seen[r] = 1;
  }
  return true;
}

// The plan without the search: ranks grouped by host; a chain inside each host and a
// double binary tree over the hosts' first ranks (two tree channels when there are
// several hosts, one per binary tree).
void fallbackPlan(const std::vector<std::vector<int>>& hosts, int n, TopologyView& view) {
  topology::RingChannel ring;
  for (const auto& members : hosts)
    ring.ranks.insert(ring.ranks.end(), members.begin(), members.end());
  view.plan = topology::Rings{};
  view.plan.channels.push_back(std::move(ring));
  view.trees = topology::Trees{};
  const int nh = static_cast<int>(hosts.size());
  for (int which = 0; which < (nh > 1 ? 2 : 1); ++which) {
    topology::TreeChannel t;
    t.crossHostTree = which;
    t.parent.assign(n, -1);
    for (const auto& members : hosts)
      for (size_t i = 1; i < members.size(); ++i) t.parent[members[i]] = members[i - 1];
    std::vector<int> up = topology::doubleBinaryTree(nh, which);
    for (int h = 0; h < nh; ++h) {
      if (up[h] < 0) {
        t.root = hosts[h].front();
      } else {
        t.parent[hosts[h].front()] = hosts[up[h]].front();
      }
    }
    view.trees.channels.push_back(std::move(t));
  }
}

std::string ranksText(const std::vector<int>& ranks, size_t limit = 64) {
  std::string out;
  for (size_t i = 0; i < ranks.size() && i < limit; ++i)
    out.append(i ? " " : "").append(std::to_string(ranks[i]));
  if (ranks.size() > limit) out += " ... (" + std::to_string(ranks.size()) + " ranks)";
  return out;
}

std::string makeSummary(const std::vector<std::vector<int>>& hosts, int gpuRanks,
                        const TopologyView& view) {
  const int n = view.nranks;
  std::string sizes;
  for (size_t h = 0; h < hosts.size() && h < 8; ++h)
    sizes.append(h ? "+" : "").append(std::to_string(hosts[h].size()));
  if (hosts.size() > 8) sizes += "+...";
  char line[512];
  std::snprintf(line, sizeof(line),
                "topology: %d ranks on %zu host%s (%s), %s; view built in %.1f ms", n, hosts.size(),
                hosts.size() == 1 ? "" : "s", sizes.c_str(),
                gpuRanks == n   ? "GPUs"
                : gpuRanks == 0 ? "host memory"
                                : "GPUs and host memory",
                view.totalMs);
  std::string out = line;
  if (view.searched) {
    std::snprintf(line, sizeof(line),
                  "\ntopology: %zu ring channel%s at %.1f GB/s, %zu tree channel%s; ring 0: ",
                  view.rings.size(), view.rings.size() == 1 ? "" : "s", view.plan.channelBw,
                  view.trees.channels.size(), view.trees.channels.size() == 1 ? "" : "s");
    out += line + ranksText(view.ring);
  } else {
    out += "\ntopology: ring " + ranksText(view.ring) + " (ranks grouped by host" +
           (view.warnings.empty() ? "" : "; topology search not used") + ")";
  }
  return out;
}

void writeDumps(const TopologyView& view, const std::vector<std::vector<int>>& hosts,
                const std::vector<RankRecord>& records, int rank, const transport::PeerInfo& me) {
  const int h = view.hostOf[rank];
  std::string topoDump = settings::get(settings::kTopoDumpFile);
  if (!topoDump.empty() && hosts[h].front() == rank) {
    if (static_cast<HostState>(records[rank].state) != HostState::kDetected) {
      LOOM_WARN(kInit, "topology: %s not written: this host's topology was not detected",
                settings::sourceOf(settings::kTopoDumpFile).c_str());
    } else {
      std::string path = expandDumpPath(topoDump, me.hostName, rank, static_cast<int>(getpid()));
      Status st = topology::writeXmlFile(view.cluster.hosts[h], path);
      if (!st) {
        LOOM_WARN(kInit, "topology: %s: %s", settings::sourceOf(settings::kTopoDumpFile).c_str(),
                  st.message().c_str());
      } else {
        LOOM_INFO(kInit, "topology: host %d's topology written to %s", h, path.c_str());
      }
    }
  }
  std::string graphDump = settings::get(settings::kGraphDumpFile);
  if (!graphDump.empty() && rank == 0) {
    std::string path = expandDumpPath(graphDump, me.hostName, rank, static_cast<int>(getpid()));
    std::ofstream f(path);
    f << topology::graphToJson(view.plan, view.trees) << "\n";
    f.close();
    if (!f) {
      LOOM_WARN(kInit, "topology: %s: cannot write %s",
                settings::sourceOf(settings::kGraphDumpFile).c_str(), path.c_str());
    } else {
      LOOM_INFO(kInit, "topology: rings and trees written to %s", path.c_str());
    }
  }
}

// Steps 1 and 2: this rank's GPU and, on a host's lowest rank, the host's topology;
// then every rank's record and every host's block. A malformed topology file on any
// host is returned here, on every rank alike.
Status gatherHosts(Bootstrap& bootstrap, int rank, int cudaDev, const TopologyViewOptions& options,
                   TopologyView& view, std::vector<RankRecord>& records,
                   std::vector<std::string>& blocks) {
  const std::vector<std::vector<int>>& hosts = view.hostRanks;
  const int myHost = view.hostOf[rank];
  RankRecord mine;
  mine.cudaDev = cudaDev;
  if (cudaDev >= 0) {
    std::string bus =
        options.busIdOf ? options.busIdOf(cudaDev) : topology::cudaDeviceBusId(cudaDev);
    if (auto normalized = topology::normalizeBusId(bus); !bus.empty() && normalized) {
      std::snprintf(mine.busId, sizeof(mine.busId), "%s", normalized->c_str());
    }
  }
  blocks.assign(hosts.size(), {});
  if (hosts[myHost].front() == rank) {
    const auto td = std::chrono::steady_clock::now();
    LocalTopology local = detectHost(options);
    view.detectMs = msSince(td);
    mine.state = static_cast<int32_t>(local.state);
    mine.payloadBytes = local.payload.size();
    blocks[myHost] = std::move(local.payload);
  }
  records.assign(view.nranks, RankRecord{});
  records[rank] = mine;
  LOOM_TRY(bootstrap.allGather(records.data(), sizeof(RankRecord)));
  for (size_t h = 0; h < hosts.size(); ++h) {
    const int lead = hosts[h].front();
    const RankRecord& rec = records[lead];
    if (static_cast<HostState>(rec.state) == HostState::kNotLeader) {
      return errorf(Code::kInternalError,
                    "topology: rank %d sent no host topology (ranks disagree on the hosts)", lead);
    }
    if (rec.payloadBytes > (1ull << 30)) {
      return errorf(Code::kRemoteError, "topology: rank %d announced %llu bytes of topology", lead,
                    static_cast<unsigned long long>(rec.payloadBytes));
    }
    if (lead != rank) blocks[h].resize(rec.payloadBytes);
  }
  LOOM_TRY(exchangeHostBlocks(bootstrap, hosts, myHost, rank, blocks));
  // A malformed topology file fails init on every rank, with the first such host's error.
  for (size_t h = 0; h < hosts.size(); ++h) {
    if (static_cast<HostState>(records[hosts[h].front()].state) == HostState::kFileError) {
      return Status(Code::kInvalidUsage,
                    "rank " + std::to_string(hosts[h].front()) + ": " + blocks[h]);
    }
  }
  return Status::ok();
}

// Step 3: the cluster view and the plan, the same on every rank. Returns how many
// ranks use a GPU.
int planView(const std::vector<transport::PeerInfo>& peers, const std::vector<RankRecord>& records,
             const std::vector<std::string>& blocks, TopologyView& view) {
  const std::vector<std::vector<int>>& hosts = view.hostRanks;
  const int n = view.nranks;
  bool allDetected = true;
  for (size_t h = 0; h < hosts.size(); ++h) {
    const int lead = hosts[h].front();
    allDetected &= static_cast<HostState>(records[lead].state) == HostState::kDetected;
    view.cluster.hosts.push_back(hostSystem(static_cast<int>(h), lead, records[lead], blocks[h],
                                            peers[lead], view.hostIds, view.warnings));
    view.hostIds.push_back(view.cluster.hosts.back().hostId());
  }
  allDetected &= view.warnings.empty();
  int gpuRanks = 0;
  for (const RankRecord& rec : records) gpuRanks += rec.cudaDev >= 0 ? 1 : 0;
  const bool gpusFound = assignGpuRanks(hosts, records, view);
  if (gpuRanks > 0 && gpuRanks < n) {
    view.warnings.push_back(std::to_string(n - gpuRanks) + " of " + std::to_string(n) +
                            " ranks use host memory and the others GPUs");
  }
  computeLocalPaths(hosts, view);
  if (allDetected && gpusFound && gpuRanks == n) {
    auto rings = topology::searchRings(view.cluster);
    auto trees =
        rings ? topology::searchTrees(view.cluster) : Result<topology::Trees>(rings.status());
    if (!rings || !trees) {
      view.warnings.push_back("topology search failed: " +
                              (rings ? trees.status() : rings.status()).message());
    } else if (rings->channels.empty() || !isPermutation(rings->channels.front().ranks, n)) {
      view.warnings.push_back("topology search gave no ring over all " + std::to_string(n) +
                              " ranks");
    } else {
      view.plan = std::move(rings).value();
      view.trees = std::move(trees).value();
      view.searched = true;
    }
  }
  if (!view.searched) fallbackPlan(hosts, n, view);
  for (const auto& ch : view.plan.channels) view.rings.push_back(ch.ranks);
  view.ring = view.rings.front();
  return gpuRanks;
}

// Rank 0's log: the warnings as one line (at most four shown), the summary at INFO.
void logView(const TopologyView& view) {
  if (!view.warnings.empty()) {
    std::string all;
    const size_t shown = std::min<size_t>(view.warnings.size(), 4);
    for (size_t i = 0; i < shown; ++i) all += (i ? "; " : "") + view.warnings[i];
    if (shown < view.warnings.size()) {
      all += "; and " + std::to_string(view.warnings.size() - shown) + " more";
    }
    LOOM_WARN(kInit, "topology: %s%s", all.c_str(),
              view.searched ? "" : ". Collectives follow the ranks grouped by host.");
  }
  size_t begin = 0;
  while (begin <= view.summary.size()) {  // one log line per line, each with its prefix
    size_t end = view.summary.find('\n', begin);
    if (end == std::string::npos) end = view.summary.size();
    LOOM_INFO(kInit, "%s", view.summary.substr(begin, end - begin).c_str());
    begin = end + 1;
  }
}

}  // namespace

std::string TopologyView::pathType(int a, int b) const {
  if (a == b) return "LOC";
  if (hostOf[a] != hostOf[b]) return "NET";
  const int h = hostOf[a];
  const size_t k = hostRanks[h].size();
  PathType t = localPaths[h][localIndex[a] * k + localIndex[b]];
  return t == PathType::kDis ? "" : topology::pathTypeName(t);
}

std::string expandDumpPath(const std::string& pattern, const std::string& hostName, int rank,
                           int pid) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    char c = pattern[++i];
    if (c == 'h') {
      out += hostName;
    } else if (c == 'r') {
      out += std::to_string(rank);
    } else if (c == 'p') {
      out += std::to_string(pid);
    } else if (c == '%') {
      out += '%';
    } else {
      out += '%';
      out += c;
    }
  }
  return out;
}

Result<TopologyView> buildTopologyView(Bootstrap& bootstrap,
                                       const std::vector<transport::PeerInfo>& peers, int rank,
                                       int cudaDev, const TopologyViewOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const int n = static_cast<int>(peers.size());
  if (n != bootstrap.nranks() || rank < 0 || rank >= n) {
    return errorf(Code::kInternalError, "buildTopologyView: %d peers for rank %d of %d", n, rank,
                  bootstrap.nranks());
  }
  TopologyView view;
  view.nranks = n;
  groupHosts(peers, view);
  std::vector<RankRecord> records;
  std::vector<std::string> blocks;
  LOOM_TRY(gatherHosts(bootstrap, rank, cudaDev, options, view, records, blocks));
  const int gpuRanks = planView(peers, records, blocks, view);
  writeDumps(view, view.hostRanks, records, rank, peers[rank]);
  view.totalMs = msSince(t0);
  view.summary = makeSummary(view.hostRanks, gpuRanks, view);
  if (options.log && rank == 0) logView(view);
  return view;
}

bool ranksHaveOwnCpus(const std::vector<transport::PeerInfo>& peers, int rank) {
  constexpr int kWords = sizeof(transport::PeerInfo::cpuMask) / sizeof(uint64_t);
  uint64_t all[kWords] = {};
  int local = 0;
  for (const transport::PeerInfo& p : peers) {
    if (p.hostHash != peers[rank].hostHash) continue;
    ++local;
    for (int w = 0; w < kWords; ++w) all[w] |= p.cpuMask[w];
  }
  int cpus = 0;
  for (uint64_t w : all) cpus += __builtin_popcountll(w);
  return local <= cpus;
}

}  // namespace loom::comm
