// The cost model's fabric (collectives/cost_model.h) from a host's topology: how many
// ranks per host, the bandwidth between its GPUs, its NICs' total, and the constants
// measured for the transports loom would use.
#pragma once

#include <string>

#include "collectives/cost_model.h"
#include "topology/graph.h"

namespace loom::collectives::model {

struct FabricOptions {
  int hosts = 1;
  int ranksPerHost = 0;     // 0: one per GPU of the topology, or 1 where it has none
  bool hostMemory = false;  // host buffers even where the topology has GPUs
  double netGbps = 0;       // > 0: the network bandwidth per host (GB/s), instead of the NICs'
  // GPU buffers over sockets: these staging rates (Staging::gbps; all 0: none) instead of
  // the ones measured on our machines.
  bool stageGiven = false;
  double stageGbps[4] = {};
};

// `why` (optional) receives one line on where each term came from.
Fabric fabricOf(const topology::Graph& graph, const FabricOptions& o, std::string* why = nullptr);

}  // namespace loom::collectives::model
