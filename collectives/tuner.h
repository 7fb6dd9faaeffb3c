// Picks the algorithm for a collective from its type, size and rank count, with the cost
// model (collectives/cost_model.h) where it weighs ring against tree; LOOM_ALGO /
// NCCL_ALGO override it. Also builds the schedule.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "collectives/algo_request.h"
#include "collectives/schedule.h"
#include "common/status.h"

namespace loom::collectives {

namespace model {
struct Fabric;
struct Estimate;
enum class Algo;
}  // namespace model
struct Hierarchy;
struct Operation;

struct CollRequest {
  CollType type = CollType::kAllReduce;
  size_t count = 0;  // as the C API counts
  size_t elemSize = 4;
  int nranks = 1;
  int rank = 0;
  int root = 0;
  size_t pieceElems = 131072;              // elements per FIFO slot
  const std::vector<int>* ring = nullptr;  // ring order (the topology's), or rank order
  // Some peer is reached through sockets, where every message costs its sender a trip
  // through the network stack (on one host: both ends of loopback TCP).
  bool network = false;
  // GPU buffers over the network (chooseNetAlgorithm sets it): broadcast keeps the rule
  // measured there against NCCL, where host buffers ask the model (reduce asks it for both).
  bool device = false;
  // The fabric the cost model prices (collectives/cost_model.h); nullptr: one class of
  // link between every pair of ranks.
  const model::Fabric* fabric = nullptr;
  // The hosts and rails seen from this rank (collectives/hierarchy.h), where the ranks
  // have one (several hosts of as many ranks, more than one each) and the caller can run
  // the hierarchical all-reduce: the host executor. Null: the flat forms only.
  const Hierarchy* hier = nullptr;
};

// The request for `op` among `nranks` ranks, seen from `rank` (type, count, element size,
// root); the rest as the caller's executor sets it.
CollRequest requestFor(const Operation& op, int nranks, int rank);

struct TunerChoice {
  Algorithm algo = Algorithm::kRing;
  const char* reason = "";  // why (static text: choosing allocates nothing)
  // The cost model's estimates, where it decided (negative otherwise): the ring's (the
  // chain's for reduce, as flatName says) and the tree's.
  const char* flatName = "ring";
  double ringUs = -1;
  double treeUs = -1;
  // Where it weighed the hierarchical form against the flat one the rules chose.
  double flatUs = -1;
  double hierUs = -1;
  // The reason with the estimates, for the log.
  std::string text() const;
};

// `forced` is LOOM_ALGO, parsed (collectives/algo_request.h; nothing set: choose). An
// algorithm that does not exist for the collective falls back with the reason noted.
Result<TunerChoice> chooseAlgorithm(const CollRequest& req, const AlgoRequest& forced);
// The choice among the flat forms alone (what chooseAlgorithm weighs the hierarchical
// all-reduce against, where CollRequest::hier is set).
Result<TunerChoice> chooseFlatAlgorithm(const CollRequest& req, const AlgoRequest& forced);
// The same from the text (tests and tools): unknown names are an error.
Result<TunerChoice> chooseAlgorithm(const CollRequest& req, const std::string& forced);

// The algorithm of a collective on device buffers over the network (the GPU network
// executor, collectives/device/net_executor.h): as chooseAlgorithm over sockets, with the
// rules measured for GPU buffers: the one-shot all-reduce only on 3 ranks (4 where
// LOOM_ALGO names it; beyond, recursive doubling where the rank count is a power of two,
// else direct for up to kMaxStepPeers + 1 ranks, else the ring), recursive doubling on 2
// ranks up to kTwoRankDoublingMaxBytes, and on 4 ranks the ring instead of the direct form
// above kDirectAllReduceMaxBytes4 (collectives/schedule.h).
Result<TunerChoice> chooseNetAlgorithm(CollRequest req, const AlgoRequest& forced);

// GPU buffers across hosts of several GPUs each (collectives/device/cuda_executor_hier.cc):
// the hierarchical form (algo kHier) or the flat form of the network executor (its pick
// under `flatForced`), whichever the cost model prices lower on `f`, the communicator's GPU
// fabric: the hierarchical passes one after the other (model::estimate, kHierarchical), the
// flat form on model::netExecutorFabric. LOOM_ALGO naming hier forces it; one that leaves
// it out, or no fabric, keeps the flat form. `bytes` as the model counts them (an
// all-gather's output, a reduce-scatter's input). `partsEven`: the count divides by the
// ranks per host, without which broadcast and reduce keep the buffer whole on the root's
// rail and are priced so. Allocates nothing.
TunerChoice chooseDeviceHier(CollType type, size_t bytes, const model::Fabric* f,
                             const AlgoRequest& forced, const AlgoRequest& flatForced,
                             bool partsEven = true);

// The piece size (bytes) of a collective on device buffers over the network: as
// hostPieceBytes, but up to the whole slot (the network executor's slots are larger, and
// its kernels, not a CPU thread, combine the pieces), and broadcast and reduce in pieces
// of at least 256 KiB (or the slot). `bytes` is one lane's share.
size_t netPieceBytes(CollType type, size_t bytes, int nranks, size_t slotBytes);

// The lanes (independent parts, each with its own connections and CUDA block) of a
// collective on device buffers over the network, at most `maxLanes` (LOOM_NET_LANES): one
// for all-to-all; else one for each 256 KiB of a ring step (all-reduce, broadcast, reduce:
// a rank's share of the buffer; all-gather, reduce-scatter: a rank's block). `bytes` as
// the model counts them.
int netLanes(CollType type, size_t bytes, int nranks, int maxLanes);

Schedule buildSchedule(const CollRequest& req, Algorithm algo);

// The algorithm (as the cost model names it) that the tuner would take, with nothing
// forced, for a call of `bytes` as the model counts them (an all-gather's output, a
// reduce-scatter's input) on fabric `f`, each host's ranks together: host buffers as the
// communicator asks (chooseAlgorithm; the hierarchical forms where the hosts have several
// ranks), GPU buffers across hosts as the GPU executor asks (chooseDeviceHier, then the
// network executor's chooseNetAlgorithm).
// False for GPUs of one host, whose mesh planner decides by size limits
// (collectives/device/mesh_plan.h). What loom-model prints beside the model's estimates.
bool tunerPick(CollType type, size_t bytes, const model::Fabric& f, model::Algo* algo,
               std::string* reason = nullptr);
// The tuner's pick priced where it runs: on `f` for host buffers and the hierarchical GPU
// forms; for the flat GPU form across hosts on the network executor's own fabric
// (model::netExecutorFabric: every pair of ranks through the network, each GPU on its
// share of the host's NICs). False where tunerPick is.
bool tunerEstimate(CollType type, size_t bytes, const model::Fabric& f, model::Estimate* e);

// The piece size (bytes) of a host collective: what one FIFO slot carries per step.
// `bytes` is the call's size as the C API counts it (per rank for all-gather and
// reduce-scatter). Rings cut the data into blocks of nranks pieces and run their steps
// one block at a time, each step one hop, so a message takes as many blocks as it needs
// and no more: one block while nranks pieces fit a slot each. Broadcast and reduce
// stream through their hops, so they get several pieces per rank.
size_t hostPieceBytes(CollType type, size_t bytes, int nranks, size_t slotBytes,
                      bool network = false);

}  // namespace loom::collectives
