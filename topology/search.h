// Rings and trees from a cluster view.
//
// Within a host, rings follow the best links: the search looks for as many rings as
// the links carry at one per-channel bandwidth (each ring consumes that bandwidth on
// every link its hops cross), over a ladder of bandwidths, and keeps the ladder step
// that moves the most data in total. Across hosts, channel c of every host is a chain
// that enters at a GPU whose closest NIC is the c-th of the host's NICs and leaves at
// the GPU before it in the ring, so every GPU's network traffic uses its closest NIC;
// the global ring is the hosts' chains in host order.
//
// Trees: a chain within each host (the same chains as the rings); across hosts a
// double binary tree (two binary trees in which no host is an inner node of both;
// even channels use the first, odd channels the second).
//
// Everything is deterministic: the same cluster view gives the same answer on every
// rank, whatever order the ranks computed it in. Pure functions, thread-safe.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "topology/graph.h"
#include "topology/system.h"

namespace loom::topology {

// Every host of a communicator, in host order (the order the bootstrap gathered them).
// A GPU takes part when its `rank` is >= 0; when no GPU anywhere has a rank, ranks are
// assigned host-major in GPU order (host 0's GPU0 is rank 0).
struct ClusterView {
  std::vector<System> hosts;
};

// Groups per-rank views by System::hostId (hosts ordered by first appearance) and
// merges the views of one host into one (mergeInto). Errors when a view has no host id.
Result<ClusterView> buildClusterView(const std::vector<System>& rankViews);

// `count` copies of `host`, ranks host-major, host ids "<id>#<i>" (loom-topo --nodes).
ClusterView replicateHost(const System& host, int count);

struct SearchOptions {
  int maxChannels = 16;
  double maxChannelBw = 40.0;  // GB/s one channel can drive; more bandwidth -> more channels
  int dfsBudget = 20000;       // ring-search steps per ring attempt (bounds odd topologies)
};

// The plan for one host, in local GPU indices (Graph::gpus() order).
struct HostPlan {
  std::vector<int> gpus;                // participating GPUs (local indices)
  std::vector<std::vector<int>> rings;  // cyclic orders of local GPU indices
  double channelBw = 0;                 // GB/s per ring inside the host
  PathType worstType = PathType::kLoc;  // worst hop path type over the rings
};

// What a host's Graph depends on (CPUs, PCI tree, GPUs with their NVLinks, NIC speeds)
// and nothing host-specific (ranks, host id, names, GUIDs, addresses): two hosts with
// equal keys have equal graphs, so one Graph serves both. Used to plan identical hosts
// once.
std::string hostShapeKey(const System& system);

// Intra-host ring search over `gpus` (local indices; all of the graph's GPUs if empty).
HostPlan planHost(const Graph& graph, std::vector<int> gpus, const SearchOptions& options);

struct RingChannel {
  std::vector<int> ranks;   // ring order; ranks[i] sends to ranks[i+1] (and the last to the first)
  std::vector<int> netIn;   // per host: net index (NIC<n>) receiving from the previous host
  std::vector<int> netOut;  // per host: net index sending to the next host; empty for one host
};

struct Rings {
  std::vector<RingChannel> channels;
  double channelBw = 0;  // GB/s per channel (intra-host links and NICs both counted)
};

struct TreeChannel {
  int root = -1;            // rank
  std::vector<int> parent;  // parent[rank]; -1 for the root and ranks not taking part
  int crossHostTree = 0;    // which of the two binary trees across hosts (0 or 1)
};

struct Trees {
  std::vector<TreeChannel> channels;
};

Result<Rings> searchRings(const ClusterView& cluster, const SearchOptions& options = {});
Result<Trees> searchTrees(const ClusterView& cluster, const SearchOptions& options = {});

// Children of `rank` in `tree`, ascending.
std::vector<int> treeChildren(const TreeChannel& tree, int rank);

// Parent of every position 0..n-1 in the cross-host binary tree `which` (0 or 1) of
// the double binary tree over n hosts; -1 at the root.
std::vector<int> doubleBinaryTree(int n, int which);

}  // namespace loom::topology
