// The cluster view at communicator init: every host's topology gathered over the
// bootstrap, the rings and trees the collectives should follow, and the path type
// between any two ranks.
//
// What happens (docs/topology.md, "At communicator init", says more):
//   1. The lowest rank of each host (ranks with equal PeerInfo::hostHash) detects the
//      host (topology::detectLocal) and lays LOOM_TOPO_FILE / NCCL_TOPO_FILE over it.
//      The other ranks only look up their own GPU's PCI bus id.
//   2. One allGather of a fixed record per rank (payload length, state, GPU bus id),
//      then each host's XML goes round the ring (an all-gather of variable-sized blocks
//      over Bootstrap::send/recv). Every rank parses the same bytes.
//   3. Every rank builds the same ClusterView (hosts in order of their lowest rank,
//      each rank's GPU found by bus id, else by CUDA index) and runs the ring and tree
//      search, so every rank computes the same answer.
//   4. The lowest rank of each host writes LOOM_TOPO_DUMP_FILE; rank 0 writes
//      LOOM_GRAPH_DUMP_FILE.
//
// Ranks without a GPU (host memory), a host whose detection failed, a GPU not found
// in its host's topology, two ranks on one GPU, or a failed search: the ring is then
// the ranks grouped by host (hosts in order of their lowest rank, ranks ascending
// inside a host), with one warning (none for an all-host-memory communicator, where
// that is simply the plan). Only a malformed topology file, or a bootstrap failure,
// is an error.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "common/status.h"
#include "topology/gpu_source.h"
#include "topology/graph.h"
#include "topology/reader.h"
#include "topology/search.h"
#include "transports/transport.h"

namespace loom::comm {

// The result of buildTopologyView: identical on every rank of the communicator (except
// `detectMs` and `totalMs`). A plain value, safe to read from several threads.
struct TopologyView {
  int nranks = 0;

  // Rank order of the ring the collectives should follow (channel 0): a permutation of
  // 0..n-1; ring[i] sends to ring[i+1], the last to the first. Ranks of one host are
  // adjacent.
  std::vector<int> ring;
  // Every channel's ring (rings[0] == ring). One channel unless the search found more.
  std::vector<std::vector<int>> rings;
  // The same rings with the NICs each host enters and leaves through, and the trees
  // (a chain inside each host, a double binary tree across hosts), as the search gave
  // them (or as the fallback built them). `graphToJson(plan, trees)` is the graph dump.
  topology::Rings plan;
  topology::Trees trees;

  // Hosts in order of their lowest rank; hostOf[rank] indexes them, hostRanks[h] lists
  // host h's ranks, ascending.
  std::vector<int> hostOf;
  std::vector<std::vector<int>> hostRanks;
  std::vector<std::string> hostIds;  // System::hostId of each host ("<hostname>-<hash>")
  // Each host's topology as gathered (empty System when its detection failed), with
  // the GPUs of this communicator's ranks carrying their rank. cluster.hosts[h] is
  // host h.
  topology::ClusterView cluster;

  // True when the rings and trees come from the topology search; false when they are
  // the fallback (ranks grouped by host).
  bool searched = false;
  // Why the fallback was used, or problems met (one line each); empty when all went
  // well. Logged once, by rank 0, as one warning.
  std::vector<std::string> warnings;
  // One or a few lines for LOOM_DEBUG=INFO (already logged by buildTopologyView).
  std::string summary;
  double detectMs = 0;  // this rank's detection (0 when it did not detect)
  double totalMs = 0;   // buildTopologyView on this rank, exchange included

  bool sameHost(int a, int b) const { return hostOf[a] == hostOf[b]; }
  // The path between two ranks' GPUs as the topology classifies it: "LOC" for a rank
  // to itself, "NET" between hosts, else the GPUs' path type ("NVL", "NVB", "PIX",
  // "PXB", "PHB", "SYS"); "" when either rank uses host memory or its GPU is unknown.
  std::string pathType(int a, int b) const;

  // Per host: path types between the host's ranks, indexed by local position
  // (localIndex) — kept per host rather than nranks x nranks, so the memory stays
  // small for large communicators. kDis marks "unknown".
  std::vector<int> localIndex;  // rank -> position among its host's ranks (ascending)
  std::vector<std::vector<topology::PathType>> localPaths;
};

// What buildTopologyView reads, replaceable by tests. Defaults: the live machine.
struct TopologyViewOptions {
  // Detection reads through this (nullptr: the live machine, "/").
  const topology::Reader* reader = nullptr;
  // GPU details (nullptr: NVML on the live machine, recorded answers for a recorded tree).
  topology::GpuSource* gpuSource = nullptr;
  // The PCI bus id of CUDA device `cudaDev` ("" when unknown; the GPU is then matched by
  // its index). Default: the CUDA driver (topology::cudaDeviceBusId).
  std::function<std::string(int cudaDev)> busIdOf;
  // Log the summary at INFO and the warnings (rank 0). Tests turn it off.
  bool log = true;
};

// Builds the view. Called by every rank of a communicator at init, after the bootstrap
// exists and the peers' PeerInfo were exchanged (`peers[r]` is rank r's; hostHash
// groups ranks into hosts). `cudaDev` is this rank's CUDA device, -1 for host memory.
// Collective over `bootstrap`: every rank must call it, in the same order relative to
// its other bootstrap exchanges.
//
// Errors: a bootstrap failure (as the bootstrap reports it), or a malformed topology
// file on any host, which every rank returns as kInvalidUsage naming the rank, the file
// and the line ("rank 0: LOOM_TOPO_FILE: /x.xml:12: ..."). Everything else
// degrades (see the file comment) and never fails.
Result<TopologyView> buildTopologyView(Bootstrap& bootstrap,
                                       const std::vector<transport::PeerInfo>& peers, int rank,
                                       int cudaDev, const TopologyViewOptions& options = {});

// Whether every rank on `rank`'s host can have a CPU of its own: those ranks are no more
// than the CPUs any of them may run on (the union of their PeerInfo::cpuMask). Ranks bound
// one to a core by mpirun pass; 4 ranks sharing 2 cores, bound or not, do not.
bool ranksHaveOwnCpus(const std::vector<transport::PeerInfo>& peers, int rank);

// A dump file name with %h (host name), %r (rank) and %p (process id) substituted; "%%"
// is "%". Other characters are kept.
std::string expandDumpPath(const std::string& pattern, const std::string& hostName, int rank,
                           int pid);

}  // namespace loom::comm
