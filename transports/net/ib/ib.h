// The ib network backend (RDMA over InfiniBand and RoCE): how to make one, and what it
// finds on this machine (loom-topo prints it).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transports/net/net.h"

namespace loom::transport::net::ib {

// One port of one RDMA device, usable or not, and why.
struct PortReport {
  std::string device;  // "mlx5_0"
  int port = 0;        // 0: the device itself failed (cannot be opened)
  bool usable = false;
  bool infiniband = false;  // link layer; false: Ethernet (RoCE)
  int speedMbps = 0;
  int gidIndex = -1;          // the GID its connections use (usable ports)
  std::string gid;            // "::ffff:10.0.0.1"
  std::string why;            // usable: which GID and why; else why not
  std::string pciPath;        // the device's PCI path in sysfs ("" when it has none)
  bool dmaBuf = false;        // the provider registers dma-buf (ibv_reg_dmabuf_mr)
  std::string dmaBufWhy;      // why not
  bool nearEveryGpu = false;  // an emulated device with gdr (Properties::nearEveryGpu)
};

// The RDMA ports this process sees through the verbs (activeVerbs(): libibverbs, or
// the emulation LOOM_IB_EMULATE asks for), after LOOM_IB_HCA; an error when libibverbs
// cannot be loaded.
Result<std::vector<PortReport>> describePorts();

// A backend on every usable port; an error that lists what was found otherwise.
Result<std::unique_ptr<Backend>> makeIbBackend(const Context& ctx);

}  // namespace loom::transport::net::ib
