// The cost model: how long each algorithm takes for a collective of a given size on a
// given fabric. The tuner chooses with it (collectives/tuner.h), ncclGroupSimulateEnd
// reports it, and loom-model prints it for any topology and host count. docs/cost-model.md
// gives every term and where each constant comes from.
//
// Every estimate has the form
//   time = base + sum over the algorithm's steps of that step's link latency
//               + the bytes that cross the busiest link / that link's bandwidth
// with the steps and bytes of the algorithm's schedule, and the links of the fabric: one
// class between ranks of one host, one across hosts. GPU buffers staged through host memory
// on their way to the network (Staging) pay the slower of the wire and those copies, and
// each step's first piece.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/schedule.h"

namespace loom::collectives::model {

// One class of link: a message of b bytes takes latencyUs + b / bytesPerUs() on it.
struct LinkCost {
  double latencyUs = 0;  // per step: the wire, the software of both ends, a wake-up
  double gbps = 0;       // GB/s (10^9 bytes per second), one direction
  double bytesPerUs() const { return gbps * 1e3; }
};

// GPU buffers staged through host memory on their way to and from the network (the socket
// and ucx backends without GPUDirect RDMA): each rank's kernel writes every byte it sends
// into page-locked host memory and reads every byte it receives from there, one CUDA block
// per lane of the call (collectives/tuner.h netLanes), a piece (netPieceBytes) at a time.
struct Staging {
  // GB/s each way of 1, 2, 4 and 8 blocks writing and reading at once, while every rank of
  // the machine does the same (bench/gpu_staging_probe); all 0: nothing is staged.
  double gbps[4] = {};
  int maxLanes = 4;                    // LOOM_NET_LANES
  size_t slotBytes = size_t(1) << 20;  // a piece fills one slot at most
  bool on() const { return gbps[0] > 0; }
  // GB/s each way of `lanes` blocks (1 to 8; linear between the measured counts).
  double rate(int lanes) const;
};

// The cluster as the model sees it: `hosts` alike, each with `ranksPerHost` ranks.
struct Fabric {
  int hosts = 1;
  int ranksPerHost = 1;
  // Between two ranks of one host: the bandwidth one rank can send at (for GPUs, its
  // NVLink or PCIe bandwidth), and the latency of one step.
  LinkCost intra;
  // Across hosts: the bandwidth of all of a host's NICs together (a ring per NIC keeps
  // every NIC busy), and the latency of one step between hosts.
  LinkCost inter;
  // Fixed cost of one call (launch, bookkeeping), whatever the algorithm.
  double baseUs = 0;
  // What each further message of one step costs its sender (a step that sends to k peers
  // at once pays k - 1 of these on top of the step's latency).
  double messageUs = 0;
  bool gpu = false;  // device buffers (the in-host mesh forms exist)
  // GPU buffers among the ranks of a network executor (netExecutorFabric): its direct
  // all-gather and reduce-scatter are built on 3 and 4 ranks.
  bool gpuNetwork = false;
  // The tree all-reduce joins the hosts with one rank each and chains each host's ranks
  // (hostTreeAllReduce: host buffers); otherwise it is one tree over all ranks in order.
  bool hostTree = false;
  // GPU buffers over sockets: the staging through host memory (not set: none).
  Staging stage;
  std::string intraName = "shm";
  std::string interName = "tcp";

  int nranks() const { return hosts * ranksPerHost; }
};

// The algorithms the model knows. Some are not built yet (Estimate::built): the model
// prices them so that the gain of building them can be read off, and the tuner never
// picks them.
enum class Algo {
  kRing,          // ring (all-reduce: reduce-scatter then all-gather around one ring)
  kTree,          // chain inside each host, double binary tree across hosts
  kChain,         // broadcast: a pipelined chain through every rank
  kDirect,        // every rank to every rank at once (all-reduce: direct RS then AG)
  kDoubling,      // recursive doubling (all-reduce, power-of-two rank counts)
  kOneShot,       // every rank sends its whole input to every other, once
  kHierarchical,  // in-host reduce-scatter, a ring across hosts per rail, in-host all-gather
  kMeshOneShot,   // GPUs of one host: one-shot through peer memory
  kMeshTwoShot,   // GPUs of one host: reduce-scatter and all-gather through peer memory
};
inline constexpr Algo kAllAlgos[] = {Algo::kRing,         Algo::kTree,        Algo::kChain,
                                     Algo::kDirect,       Algo::kDoubling,    Algo::kOneShot,
                                     Algo::kHierarchical, Algo::kMeshOneShot, Algo::kMeshTwoShot};
const char* algoName(Algo a);

struct Estimate {
  Algo algo = Algo::kRing;
  double us = 0;           // predicted time of one call
  double latencyUs = 0;    // of which: base and step latencies
  double bandwidthUs = 0;  // of which: bytes over bandwidth
  int steps = 0;
  bool built = true;  // loom has this algorithm for this collective and memory kind
  // The bytes one rank sends through the network backend (and about as many it receives):
  // what a staged path (Fabric::stage) copies through host memory.
  double netBytes = 0;
  // Of bandwidthUs: what the staging added (Fabric::stage), where the kernels' copies are
  // slower than the wire, and each step's first piece, which the wire cannot overlap.
  double stageUs = 0;
};

// One algorithm's estimate; false where it does not apply to this collective or fabric
// (a tree of 2 ranks, recursive doubling on 3, the mesh forms across hosts). Allocates
// nothing: the tuner asks it on every call.
bool estimate(CollType type, Algo a, size_t bytes, const Fabric& f, Estimate* out);

// Every algorithm that applies, in kAllAlgos order. bytes as nccl-tests counts them: the buffer of
// all-reduce, broadcast and reduce; the gathered output of all-gather; the input of reduce-scatter;
// each rank's buffer of all-to-all.
std::vector<Estimate> estimates(CollType type, size_t bytes, const Fabric& f);

// The fastest built estimate (the first on a tie; an empty list never happens: every
// collective has a built form on every fabric).
Estimate fastest(const std::vector<Estimate>& list);

// Broadcast where the tuner follows its rule instead of the model (GPU buffers, and host
// buffers inside one host): the binary tree for messages under 256 KiB over more than 4
// ranks, else the pipelined chain. The tuner and the pricing of a hierarchical form's rail
// both read it here.
bool broadcastRuleTakesTree(size_t bytes, int nranks);

// GPU buffers: whether the hierarchical broadcast or reduce of `bytes` splits the buffer
// over every rail (the mesh passes the parts inside the hosts) rather than sending it whole
// over the root's rail: where the model prices that lower on `f` (the communicator's GPU
// fabric). False for other collectives and fabrics. Allocates nothing.
bool hierSplitsRails(CollType type, size_t bytes, const Fabric& f);
// GPU buffers: the hierarchical broadcast or reduce in one of its two forms (`split` over
// every rail, or whole on the root's rail); estimate(kHierarchical) gives the cheaper,
// which only a count that divides by the ranks per host can take. False where
// estimate(kHierarchical) is.
bool hierRootedEstimate(CollType type, size_t bytes, const Fabric& f, bool split, Estimate* out);

// nccl-tests' bus bandwidth (GB/s) of a call of `bytes` taking `us`.
double busGBs(CollType type, size_t bytes, int nranks, double us);

// The fabrics our machines are, with the constants measured on them (docs/cost-model.md).
// The 2-core development VM: ranks in processes of one host, over shared memory, or each
// a host of its own over TCP whose link is shaped to `netGbps` (tc tbf).
Fabric hostMemoryFabric(int hosts, int ranksPerHost, double netGbps);
// How GPU buffers cross hosts: RDMA NICs (ibverbs ports) or sockets (the socket backend,
// TCP through the proxy and its helper threads).
enum class NetPath { kSockets, kRdma };
// GPUs with NVLink inside a host (intraGbps per GPU) and `nicGbps` of NICs per host
// (GPU buffers over the network transport, by `path`).
Fabric gpuFabric(int hosts, int gpusPerHost, double intraGbps, double nicGbps, NetPath path);
// The fabric the GPU network executor (collectives/device/net_executor.h) prices ring
// against tree on, from its communicator's gpuFabric `comm`: every pair of its ranks goes
// through the network backend, those of one host too (no mesh among them), each rank on
// its share of its host's NICs. `rail`: the executor of one rail of the hierarchical
// form, one rank per host.
Fabric netExecutorFabric(const Fabric& comm, bool rail);

}  // namespace loom::collectives::model
