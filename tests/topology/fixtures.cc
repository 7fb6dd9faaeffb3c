#include "tests/topology/fixtures.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace loom::topology::testing {

std::string fixturePath(const std::string& name) {
  return std::string(LOOM_TOPO_FIXTURES) + "/" + name;
}
std::string sysfsRoot(const std::string& machine) {
  return fixturePath("sysfs/" + machine);
}

System loadXml(const std::string& name) {
  auto r = readXmlFile(fixturePath(name));
  if (!r) {
    ADD_FAILURE() << r.status().message();
    std::abort();
  }
  return std::move(r.value().system);
}

Graph buildGraph(const System& system) {
  auto g = Graph::build(system);
  if (!g) {
    ADD_FAILURE() << g.status().message();
    std::abort();
  }
  return std::move(g.value());
}

int nodeByName(const Graph& graph, const std::string& name) {
  for (size_t i = 0; i < graph.nodes().size(); ++i)
    if (graph.nodeName(static_cast<int>(i)) == name) return static_cast<int>(i);
  ADD_FAILURE() << "no node " << name;
  std::abort();
}

const Path& pathByName(const Graph& graph, const std::string& from, const std::string& to) {
  return graph.path(nodeByName(graph, from), nodeByName(graph, to));
}

}  // namespace loom::topology::testing
