// loom-topo: shows what loom sees of a machine, and the rings and trees it would use.
//
//   loom-topo                      detect this machine, print the matrix
//   loom-topo --topo-file F.xml    load an NCCL/loom topology XML instead
//   loom-topo --sysfs-root DIR     detect against a recorded sysfs tree
//   loom-topo --format matrix|xml|json
//   loom-topo --nodes N            rings and trees for N hosts like this one
//   loom-topo --record DIR         record this machine's sysfs (and NVML answers) into DIR
//   loom-topo --bench              time detection and search (8-GPU host, 1024 hosts)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tools/topo_record.h"
#include "topology/topology.h"
#ifdef LOOM_HAVE_VERBS
#include "common/cuda_probe.h"
#include "transports/net/gdr.h"
#include "transports/net/ib/ib.h"
#endif

namespace topo = loom::topology;

namespace {

struct Args {
  std::string topoFile, sysfsRoot, format = "matrix", record;
  int nodes = 1;
  bool bench = false;
};

void usage(FILE* out) {
  std::fprintf(
      out,
      "usage: loom-topo [--topo-file FILE | --sysfs-root DIR] [--format matrix|xml|json]\n"
      "                 [--nodes N] [--record DIR] [--bench]\n"
      "  --topo-file FILE   load a topology XML (NCCL's NCCL_TOPO_DUMP_FILE format) instead of "
      "detecting\n"
      "  --sysfs-root DIR   detect against a recorded tree (DIR/sys, DIR/proc, "
      "DIR/loom/nvml.json)\n"
      "  --format F         matrix (default, like nvidia-smi topo -m), xml, or json\n"
      "  --nodes N          show the cross-host rings and trees for N hosts like this one\n"
      "  --record DIR       copy what detection reads from this machine into DIR (for bug "
      "reports)\n"
      "  --bench            time detection, path computation and the search\n");
}

bool parseArgs(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](std::string& out) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "loom-topo: %s needs a value\n", arg.c_str());
        return false;
      }
      out = argv[++i];
      return true;
    };
    std::string v;
    if (arg == "--topo-file") {
      if (!value(a.topoFile)) return false;
    } else if (arg == "--sysfs-root") {
      if (!value(a.sysfsRoot)) return false;
    } else if (arg == "--format") {
      if (!value(a.format)) return false;
      if (a.format != "matrix" && a.format != "xml" && a.format != "json") {
        std::fprintf(stderr, "loom-topo: --format wants matrix, xml or json, not '%s'\n",
                     a.format.c_str());
        return false;
      }
    } else if (arg == "--nodes") {
      if (!value(v)) return false;
      char* end = nullptr;
      long n = std::strtol(v.c_str(), &end, 10);
      if (*end != '\0' || n < 1 || n > 100000) {
        std::fprintf(stderr, "loom-topo: --nodes wants a number from 1 to 100000, not '%s'\n",
                     v.c_str());
        return false;
      }
      a.nodes = static_cast<int>(n);
    } else if (arg == "--record") {
      if (!value(a.record)) return false;
    } else if (arg == "--bench") {
      a.bench = true;
    } else if (arg == "-h" || arg == "--help") {
      usage(stdout);
      std::exit(0);
    } else {
      std::fprintf(stderr, "loom-topo: unknown argument '%s'\n", arg.c_str());
      usage(stderr);
      return false;
    }
  }
  if (!a.topoFile.empty() && !a.sysfsRoot.empty()) {
    std::fprintf(stderr, "loom-topo: give --topo-file or --sysfs-root, not both\n");
    return false;
  }
  return true;
}

loom::Result<topo::System> load(const Args& a, bool quiet) {
  if (!a.topoFile.empty()) {
    LOOM_ASSIGN_OR_RETURN(topo::XmlReadResult r, topo::readXmlFile(a.topoFile));
    if (!quiet)
      for (const auto& w : r.warnings) std::fprintf(stderr, "loom-topo: warning: %s\n", w.c_str());
    return std::move(r.system);
  }
  topo::DirReader reader(a.sysfsRoot.empty() ? "/" : a.sysfsRoot);
  LOOM_ASSIGN_OR_RETURN(topo::Detected d, topo::detectLocal(reader));
  if (!quiet)
    for (const auto& w : d.warnings) std::fprintf(stderr, "loom-topo: warning: %s\n", w.c_str());
  return std::move(d.system);
}

std::string ranksText(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i)
    out.append(i ? " " : "").append(std::to_string(ranks[i]));
  return out;
}

// The RDMA ports as the ib backend sees them through libibverbs (or the emulation that
// LOOM_IB_EMULATE asks for): which it would use, with which GID, and why not the others.
void printIbPorts() {
#ifdef LOOM_HAVE_VERBS
  auto ports = loom::transport::net::ib::describePorts();
  if (!ports) {
    std::printf("\nib backend: %s\n", ports.status().message().c_str());
    return;
  }
  if (ports->empty()) {
    std::printf("\nib backend: libibverbs finds no RDMA device (network over sockets)\n");
    return;
  }
  std::printf("\nib backend (LOOM_NET=IB), ports through libibverbs%s:\n",
              std::getenv("LOOM_IB_EMULATE") ? " (EMULATED devices: LOOM_IB_EMULATE)" : "");
  for (const auto& p : *ports) {
    std::printf("  %s port %d: %s", p.device.c_str(), p.port, p.usable ? "used" : "not used");
    if (p.port > 0) {
      std::printf(", %s, %d Gb/s", p.infiniband ? "InfiniBand" : "RoCE", p.speedMbps / 1000);
    }
    std::printf("; %s\n", p.why.c_str());
    if (!p.usable) continue;
    std::printf("    dma-buf registration: %s\n", p.dmaBuf ? "yes" : p.dmaBufWhy.c_str());
    auto gpus = loom::cuda::deviceCount();
    const int ngpus = gpus.isOk() ? gpus.value() : 0;
    for (int g = 0; g < ngpus; ++g) {
      const auto a =
          loom::transport::net::assessGdrFor(g, p.pciPath, p.dmaBuf, p.dmaBufWhy, p.nearEveryGpu);
      std::printf("    GPUDirect RDMA with GPU %d: %s (%s)\n", g,
                  a.mode == loom::transport::net::GdrMode::kNone
                      ? "not possible"
                      : loom::transport::net::gdrModeName(a.mode),
                  a.why.c_str());
    }
  }
  std::printf(
      "  GPU buffers: straight between GPU memory and the port where GPUDirect RDMA is possible "
      "above (flushing each receive where the GPU needs it and the driver can), else through "
      "page-locked host memory\n");
#endif
}

void printGraphs(const topo::Rings& rings, const topo::Trees& trees, int nodes) {
  std::printf("\nRings (%zu channels, %.1f GB/s each%s):\n", rings.channels.size(), rings.channelBw,
              nodes > 1 ? ", ranks host-major" : "");
  for (size_t c = 0; c < rings.channels.size(); ++c) {
    const auto& ch = rings.channels[c];
    std::printf("  %2zu: %s", c, ranksText(ch.ranks).c_str());
    if (!ch.netIn.empty()) std::printf("   (host 0 in NIC%d out NIC%d)", ch.netIn[0], ch.netOut[0]);
    std::printf("\n");
  }
  std::printf("\nTrees (%zu channels; parent of each rank, -1 = root):\n", trees.channels.size());
  for (size_t c = 0; c < trees.channels.size(); ++c) {
    const auto& t = trees.channels[c];
    std::printf(
        "  %2zu: root %d%s, parents %s\n", c, t.root,
        nodes > 1 ? (t.crossHostTree ? " (cross-host tree 1)" : " (cross-host tree 0)") : "",
        t.parent.size() <= 64 ? ranksText(t.parent).c_str() : "(long; use --format json)");
  }
}

double msSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int bench(const Args& a) {
  using clock = std::chrono::steady_clock;
  const int reps = 20;
  double detectMs = 0, graphMs = 0, searchMs = 0;
  topo::System system;
  for (int i = 0; i < reps; ++i) {
    auto t0 = clock::now();
    auto s = load(a, /*quiet=*/true);
    if (!s) {
      std::fprintf(stderr, "loom-topo: %s\n", s.status().message().c_str());
      return 1;
    }
    detectMs += msSince(t0);
    t0 = clock::now();
    auto g = topo::Graph::build(*s);
    graphMs += msSince(t0);
    t0 = clock::now();
    topo::ClusterView one;
    one.hosts.push_back(*s);
    auto r = topo::searchRings(one);
    auto t = topo::searchTrees(one);
    searchMs += msSince(t0);
    system = std::move(*s);
  }
  std::printf(
      "host (%d GPUs, %d NICs): load/detect %.2f ms, graph+paths %.2f ms, rings+trees %.2f ms "
      "(mean of %d)\n",
      topo::gpuCount(system), topo::netCount(system), detectMs / reps, graphMs / reps,
      searchMs / reps, reps);
  const int hosts = a.nodes > 1 ? a.nodes : 1024;
  topo::ClusterView cluster = topo::replicateHost(system, hosts);
  auto t0 = clock::now();
  auto rings = topo::searchRings(cluster);
  auto trees = topo::searchTrees(cluster);
  double clusterMs = msSince(t0);
  if (!rings || !trees) {
    std::fprintf(stderr, "loom-topo: search failed: %s\n",
                 (!rings ? rings.status() : trees.status()).message().c_str());
    return 1;
  }
  std::printf("cluster of %d hosts: rings+trees %.1f ms (%zu ring channels, %zu tree channels)\n",
              hosts, clusterMs, rings->channels.size(), trees->channels.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!parseArgs(argc, argv, a)) return 2;
  if (!a.record.empty()) {
    loom::Status s = loom::tools::recordMachine(a.record);
    if (!s) {
      std::fprintf(stderr, "loom-topo: %s\n", s.message().c_str());
      return 1;
    }
    std::printf("recorded this machine into %s (detect from it with --sysfs-root %s)\n",
                a.record.c_str(), a.record.c_str());
    return 0;
  }
  if (a.bench) return bench(a);

  auto system = load(a, /*quiet=*/false);
  if (!system) {
    std::fprintf(stderr, "loom-topo: %s\n", system.status().message().c_str());
    return 1;
  }
  auto graph = topo::Graph::build(*system);
  if (!graph) {
    std::fprintf(stderr, "loom-topo: %s\n", graph.status().message().c_str());
    return 1;
  }
  topo::ClusterView cluster =
      a.nodes > 1 ? topo::replicateHost(*system, a.nodes) : topo::ClusterView{{*system}};
  auto rings = topo::searchRings(cluster);
  auto trees = topo::searchTrees(cluster);
  if (!rings || !trees) {
    std::fprintf(stderr, "loom-topo: search failed: %s\n",
                 (!rings ? rings.status() : trees.status()).message().c_str());
    return 1;
  }
  if (a.format == "xml") {
    std::fputs(topo::toXml(*system).c_str(), stdout);
  } else if (a.format == "json") {
    std::fputs(topo::toJson(*system, *graph, &*rings, &*trees).c_str(), stdout);
  } else {
    std::printf("Host %s\n\n", system->hostId().empty() ? "(no id)" : system->hostId().c_str());
    std::fputs(topo::formatMatrix(*system, *graph).c_str(), stdout);
    if (a.topoFile.empty() && a.sysfsRoot.empty()) printIbPorts();
    if (graph->gpuCount() == 0) {
      std::printf("\nNo GPUs: no rings or trees to show.\n");
    } else {
      printGraphs(*rings, *trees, a.nodes);
    }
  }
  return 0;
}
