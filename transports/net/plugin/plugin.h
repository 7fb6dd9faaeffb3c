// NCCL's external network plugins (libnccl-net*.so, transports/net/plugin/nccl_net_abi.h)
// as a loom network backend, and NCCL's rules for finding them:
//
//   LOOM_NET_PLUGIN (or NCCL_NET_PLUGIN) unset: libnccl-net.so, where the dynamic loader
//     finds one; a comma-separated list: each name is tried as it is and, unless it is a
//     path or already `lib...so`, as libnccl-net-NAME.so; "none": no plugin.
//   The first one that loads, has a known version (v11, v10, v9, v8, newest first) and
//   whose init succeeds with at least one device is used. One that is missing, older, or
//   fails gets a message, and loom goes on with its own backends, as NCCL does.
//
// A plugin's properties feed loom like a built-in backend's: its PCI paths the choice of
// NIC per GPU, its speed the cost model.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transports/net/net.h"

namespace loom::transport::net::plugin {

// The libraries to try for one LOOM_NET_PLUGIN value, grouped per listed name, in order.
std::vector<std::vector<std::string>> candidateLibraries(const std::string& setting);

// The plugin backend, or null where no plugin is configured or usable (`*why` then says
// what was tried and why each was not used; empty where nothing was asked for). `wanted`
// (LOOM_NET's value where it names no built-in backend) keeps only a plugin of that name.
Result<std::unique_ptr<Backend>> makePluginBackend(const Context& ctx, const std::string& wanted,
                                                   std::string* why);

}  // namespace loom::transport::net::plugin
