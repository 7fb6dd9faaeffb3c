// Topology benchmarks: detection and search for one 8-GPU, 8-NIC host (target: under
// 50 ms together) and rings and trees for a 1024-host cluster view (target: under 1 s).
#include <benchmark/benchmark.h>

#include <string>

#include "topology/topology.h"

namespace topo = loom::topology;

namespace {

std::string fixtures() {
  return LOOM_TOPO_FIXTURES;
}

topo::System dgx() {
  auto r = topo::readXmlFile(fixtures() + "/dgx_h100.xml");
  return r ? std::move(r.value().system) : topo::System{};
}

// Detection from the recorded DGX H100 tree, then graph, paths, rings and trees.
void BM_DetectAndSearchDgxH100(benchmark::State& state) {
  topo::DirReader reader(fixtures() + "/sysfs/dgx_h100");
  for (auto _ : state) {
    auto d = topo::detectLocal(reader);
    auto g = topo::Graph::build(d->system);
    topo::ClusterView one{{d->system}};
    auto rings = topo::searchRings(one);
    auto trees = topo::searchTrees(one);
    benchmark::DoNotOptimize(rings->channels.size() + trees->channels.size());
  }
}
BENCHMARK(BM_DetectAndSearchDgxH100)->Unit(benchmark::kMillisecond);

void BM_GraphAndPathsDgxH100(benchmark::State& state) {
  topo::System s = dgx();
  for (auto _ : state) {
    auto g = topo::Graph::build(s);
    benchmark::DoNotOptimize(g->gpuCount());
  }
}
BENCHMARK(BM_GraphAndPathsDgxH100)->Unit(benchmark::kMicrosecond);

void BM_ClusterRingsAndTrees(benchmark::State& state) {
  topo::ClusterView view = topo::replicateHost(dgx(), static_cast<int>(state.range(0)));
  for (auto _ : state) {
    auto rings = topo::searchRings(view);
    auto trees = topo::searchTrees(view);
    benchmark::DoNotOptimize(rings->channels.size() + trees->channels.size());
  }
}
BENCHMARK(BM_ClusterRingsAndTrees)->Arg(2)->Arg(64)->Arg(1024)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
