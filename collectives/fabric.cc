#include "collectives/fabric.h"

#include <algorithm>
#include <cstdio>

namespace loom::collectives::model {

namespace {

// A NIC that reports no speed is planned as 10 Gb/s, as loom-topo says.
constexpr double kUnknownNicGbps = 10.0 / 8;

}  // namespace

Fabric fabricOf(const topology::Graph& graph, const FabricOptions& o, std::string* why) {
  double nicGbps = 0;
  int nics = 0, rdma = 0;
  for (int n : graph.nets()) {
    const topology::Net& net = *graph.nodes()[n].net;
    if (net.attr("virtual") == "1") continue;  // bridges, ifb, veth: no wire of their own
    nicGbps += net.speedMbps > 0 ? net.speedMbps / 8000.0 : kUnknownNicGbps;
    ++nics;
    if (net.port > 0) ++rdma;  // an RDMA port (sockets have none)
  }
  const NetPath path = nics > 0 && rdma == nics ? NetPath::kRdma : NetPath::kSockets;
  // No NIC at all: planned as one of unknown speed.
  const double net = o.netGbps > 0 ? o.netGbps : nics > 0 ? nicGbps : kUnknownNicGbps;
  const int gpus = graph.gpuCount();
  const bool hostMemory = o.hostMemory || gpus == 0;
  const int perHost = o.ranksPerHost > 0 ? o.ranksPerHost : hostMemory ? 1 : gpus;
  Fabric f;
  char line[256];
  if (hostMemory) {
    f = hostMemoryFabric(o.hosts, perHost, net);
    std::snprintf(
        line, sizeof(line),
        "host memory: shared memory inside a host, TCP between hosts at %.3g GB/s per host (%s)",
        f.inter.gbps,
        o.netGbps > 0 ? "as given"
        : nics        ? "its NICs, at most loopback TCP's 2 GB/s"
                      : "no NIC: planned as 10 Gb/s");
  } else {
    // The GPUs' bandwidth to each other: the path between the first two (NVLink through
    // NVSwitch or direct, else PCIe), as the topology's links give it.
    const double intra = gpus > 1 ? graph.gpuToGpu(0, 1).bw : 0;
    f = gpuFabric(o.hosts, perHost, intra, net, path);
    if (o.stageGiven && path == NetPath::kSockets) {
      for (int i = 0; i < 4; ++i) f.stage.gbps[i] = o.stageGbps[i];
    }
    std::snprintf(line, sizeof(line),
                  "GPU buffers: %d GPU(s) a host, %.4g GB/s between GPUs (%s); %.4g GB/s of "
                  "network per host (%s), over %s",
                  perHost, intra,
                  gpus > 1 ? topology::pathTypeName(graph.gpuToGpu(0, 1).type) : "one GPU", net,
                  o.netGbps > 0 ? "as given" : (std::to_string(nics) + " NIC(s)").c_str(),
                  path == NetPath::kRdma ? "RDMA" : "sockets");
  }
  if (why) {
    *why = line;
    if (f.stage.on()) {
      char staging[160];
      std::snprintf(staging, sizeof(staging),
                    "; staged through host memory at %.3g, %.3g, %.3g, %.3g GB/s each way (1, "
                    "2, 4, 8 blocks%s)",
                    f.stage.gbps[0], f.stage.gbps[1], f.stage.gbps[2], f.stage.gbps[3],
                    o.stageGiven ? ", as given" : "");
      *why += staging;
    } else if (o.stageGiven && o.stageGbps[0] > 0) {
      *why += "; --stage-gbps ignored: only GPU buffers over sockets are staged";
    }
  }
  return f;
}

}  // namespace loom::collectives::model
