// Shared helpers for the topology tests: fixture paths and loaders.
#pragma once

#include <string>

#include "topology/topology.h"

namespace loom::topology::testing {

std::string fixturePath(const std::string& name);   // "dgx_h100.xml" -> absolute path
std::string sysfsRoot(const std::string& machine);  // "dgx_h100" -> recorded tree
System loadXml(const std::string& name);            // asserts success
Graph buildGraph(const System& system);             // asserts success
// The graph node of "GPU3" / "NIC0" / "CPU1".
int nodeByName(const Graph& graph, const std::string& name);
const Path& pathByName(const Graph& graph, const std::string& from, const std::string& to);

}  // namespace loom::topology::testing
