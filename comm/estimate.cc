// The cost model (collectives/cost_model.h) on this communicator's fabric: for
// ncclGroupSimulateEnd (estimateUs), and for the host tuner's choice across hosts.
#include <algorithm>

#include "collectives/fabric.h"
#include "collectives/tuner.h"
#include "comm/communicator.h"

namespace loom::comm {

namespace model = collectives::model;

const model::Fabric& Communicator::fabric(bool hostMemory) {
  std::optional<model::Fabric>& slot =
      hostMemory && cudaDev_ >= 0 ? hostFabric_ : fabric_;  // without a GPU they are one
  if (slot) return *slot;
  model::FabricOptions o;
  o.hosts = static_cast<int>(topo_.hostRanks.size());
  for (const auto& ranks : topo_.hostRanks)
    o.ranksPerHost = std::max<int>(o.ranksPerHost, ranks.size());
  o.hostMemory = hostMemory || cudaDev_ < 0;
  // Every rank must price alike (the tuner's choice is each rank's own, and ranks that
  // chose differently would wait for each other until the timeout): from every host's
  // topology, which the cluster view holds the same on every rank, the slowest host's
  // terms, across hosts first.
  const model::Fabric fallback =
      o.hostMemory
          ? model::hostMemoryFabric(o.hosts, o.ranksPerHost, 0)
          : model::gpuFabric(o.hosts, o.ranksPerHost, 24.0, 10.0 / 8, model::NetPath::kSockets);
  std::optional<model::Fabric> slowest;
  for (const topology::System& system : topo_.cluster.hosts) {
    model::Fabric f = fallback;  // no topology of this host (detection failed): as planned
    if (auto graph = topology::Graph::build(system);
        graph.isOk() && (o.hostMemory || graph->gpuCount() > 0)) {
      f = model::fabricOf(*graph, o);
    }
    if (!slowest || f.inter.gbps < slowest->inter.gbps ||
        (f.inter.gbps == slowest->inter.gbps && f.intra.gbps < slowest->intra.gbps)) {
      slowest = f;
    }
  }
  slot = slowest ? *slowest : fallback;
  // The host tree needs hosts of as many ranks each (the hierarchy); otherwise the tree is
  // the one over all ranks.
  slot->hostTree = slot->hostTree && hier_.has_value();
  return *slot;
}

double Communicator::estimateUs(const Operation& op) {
  const model::Fabric& f = fabric(cudaDev_ < 0);
  const size_t esize = dataTypeSize(op.dtype);
  const size_t n = static_cast<size_t>(nranks_);
  size_t bytes = op.count * esize;
  switch (op.type) {
    case collectives::CollType::kAllGather:
    case collectives::CollType::kReduceScatter:
    case collectives::CollType::kAllToAll: bytes *= n; break;
    case collectives::CollType::kSendRecv: {
      // One message to or from one peer.
      const bool known = op.root >= 0 && op.root < static_cast<int>(topo_.hostOf.size()) &&
                         rank_ < static_cast<int>(topo_.hostOf.size());
      const bool remote = !known || topo_.hostOf[op.root] != topo_.hostOf[rank_];
      const model::LinkCost& link = remote && f.hosts > 1 ? f.inter : f.intra;
      return f.baseUs + link.latencyUs + (link.gbps > 0 ? bytes / link.bytesPerUs() : 0);
    }
    default: break;
  }
  // What loom would run (the tuner's pick, priced where it runs: tunerEstimate); the
  // model's fastest built form where the tuner does not decide (GPUs of one host, whose
  // mesh planner decides by size limits).
  model::Estimate e;
  if (collectives::tunerEstimate(op.type, bytes, f, &e)) return e.us;
  return model::fastest(model::estimates(op.type, bytes, f)).us;
}

}  // namespace loom::comm
