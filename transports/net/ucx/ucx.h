// The ucx network backend (LOOM_NET=ucx): UCX's UCP tag API under the network interface
// (transports/net/net.h), so loom reaches every network UCX reaches (InfiniBand and RoCE
// through HPC-X, TCP, shared memory) with UCX's own variables (UCX_TLS, UCX_NET_DEVICES)
// choosing how.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "transports/net/net.h"

namespace loom::transport::net::ucx {

// A backend whose devices are the interfaces LOOM_SOCKET_IFNAME keeps (each connection
// is set up through a TCP socket there, which then stays open to notice a peer that is
// gone); an error that says what is missing otherwise.
Result<std::unique_ptr<Backend>> makeUcxBackend(const Context& ctx);

}  // namespace loom::transport::net::ucx
