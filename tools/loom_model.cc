// loom-model: what the cost model (collectives/cost_model.h) predicts for every
// collective, size and algorithm on a topology and a host count, and which algorithm the
// tuner would take. docs/cost-model.md explains the terms. The algorithms are priced on the
// communicator's fabric (for GPUs: NVLink inside a host, the NICs across); the `loom`
// column (a `loom` row in the CSV) prices the tuner's pick where loom runs it, which for
// GPU buffers across hosts is the network executor's fabric: every pair of ranks through
// the network, those of one host too, each GPU on its share of the NICs.
//
//   loom-model                           this machine, 2 hosts like it
//   loom-model --topo-file F.xml -N 64   an NCCL topology XML, 64 hosts like it
//   loom-model --scale FILE.csv          busbw of 1 GiB and time of 8 B all-reduce against
//                                        the host count, 2 to 4096 (scripts/plot_model.py
//                                        draws it)
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/fabric.h"
#include "collectives/tuner.h"
#include "common/settings.h"
#include "topology/topology.h"

namespace topo = loom::topology;
namespace model = loom::collectives::model;
using loom::collectives::CollType;

namespace {

struct Args {
  std::string topoFile, sysfsRoot, scale, coll = "all";
  model::FabricOptions fabric;
  size_t minBytes = 8, maxBytes = size_t(1) << 30;
  int factor = 8;
  bool csv = false;
};

void usage(FILE* out) {
  std::fprintf(
      out,
      "usage: loom-model [--topo-file FILE | --sysfs-root DIR] [-N HOSTS] [-g RANKS_PER_HOST]\n"
      "                  [--host-memory] [--net-gbps X] [--stage-gbps A,B,C,D] [-c COLL] [-b MIN] "
      "[-e MAX] [-f FACTOR]\n"
      "                  [--csv] [--scale FILE.csv]\n"
      "  --topo-file FILE   a topology XML (NCCL's format) instead of detecting this machine\n"
      "  --sysfs-root DIR   detect against a recorded tree\n"
      "  -N, --hosts N      hosts like this one (default 2)\n"
      "  -g N               ranks per host (default: one per GPU, 1 without GPUs)\n"
      "  --host-memory      host buffers even where there are GPUs\n"
      "  --net-gbps X       network bandwidth per host in GB/s, instead of its NICs' total\n"
      "  --stage-gbps A,B,C,D\n"
      "                     GPU buffers over sockets: the rate (GB/s each way) at which 1, 2, 4\n"
      "                     and 8 blocks of a rank's kernel copy through host memory while\n"
      "                     every rank does (bench/gpu_staging_probe), instead of the measured\n"
      "                     defaults; 0: no staging\n"
      "  -c COLL            all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall\n"
      "                     or all (default)\n"
      "  -b, -e, -f         sizes in bytes from MIN to MAX by FACTOR (8 B to 1 GiB by 8)\n"
      "  --csv              one line per collective, size and algorithm (and `loom`: the\n"
      "                     tuner's pick priced where loom runs it)\n"
      "  --scale FILE       write all_reduce at 1 GiB and 8 B for 2..4096 hosts to FILE (CSV)\n");
}

// Bytes with an optional K, M, G or T, as the settings take them.
bool parseSize(const char* text, size_t* out) {
  const auto v = loom::settings::parseAmount(text, "", true);
  if (v) *out = v->value;
  return v.has_value();
}

// "A,B,C,D" (GB/s of 1, 2, 4 and 8 blocks, each at least the one before), or "0": none.
bool parseStage(const char* text, model::FabricOptions* o) {
  o->stageGiven = true;
  if (std::string(text) == "0") {
    for (double& g : o->stageGbps) g = 0;
    return true;
  }
  const char* at = text;
  for (int i = 0; i < 4; ++i) {
    char* end = nullptr;
    errno = 0;
    const double g = std::strtod(at, &end);
    if (end == at || errno || !(g > 0) || !std::isfinite(g) || (i > 0 && g < o->stageGbps[i - 1]))
      return false;
    o->stageGbps[i] = g;
    if (*end != (i < 3 ? ',' : '\0')) return false;
    at = end + 1;
  }
  return true;
}

bool parseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (k == "--host-memory") {
      a->fabric.hostMemory = true;
    } else if (k == "--csv") {
      a->csv = true;
    } else if (k == "-h" || k == "--help") {
      usage(stdout);
      std::exit(0);
    } else if (!(v = next())) {
      std::fprintf(stderr, "loom-model: %s needs a value\n", k.c_str());
      return false;
    } else if (k == "--topo-file") {
      a->topoFile = v;
    } else if (k == "--sysfs-root") {
      a->sysfsRoot = v;
    } else if (k == "--scale") {
      a->scale = v;
    } else if (k == "-c") {
      a->coll = v;
    } else if (k == "-N" || k == "--hosts" || k == "-g") {
      char* end = nullptr;
      long n = std::strtol(v, &end, 10);
      if (*end || n < 1 || n > 1 << 20) {
        std::fprintf(stderr, "loom-model: %s %s: not a count from 1\n", k.c_str(), v);
        return false;
      }
      (k == "-g" ? a->fabric.ranksPerHost : a->fabric.hosts) = static_cast<int>(n);
    } else if (k == "--net-gbps") {
      char* end = nullptr;
      a->fabric.netGbps = std::strtod(v, &end);
      if (*end || !(a->fabric.netGbps > 0)) {
        std::fprintf(stderr, "loom-model: --net-gbps %s: not a bandwidth above 0\n", v);
        return false;
      }
    } else if (k == "--stage-gbps") {
      if (!parseStage(v, &a->fabric)) {
        std::fprintf(stderr,
                     "loom-model: --stage-gbps %s: four rates from 0 (GB/s for 1, 2, 4 and 8 "
                     "blocks, rising), or 0\n",
                     v);
        return false;
      }
    } else if (k == "-b" || k == "-e") {
      if (!parseSize(v, k == "-b" ? &a->minBytes : &a->maxBytes)) {
        std::fprintf(stderr, "loom-model: %s %s: not a size (bytes, or with K, M, G)\n", k.c_str(),
                     v);
        return false;
      }
    } else if (k == "-f") {
      a->factor = std::atoi(v);
      if (a->factor < 2) {
        std::fprintf(stderr, "loom-model: -f %s: a factor from 2\n", v);
        return false;
      }
    } else {
      std::fprintf(stderr, "loom-model: unknown option %s\n", k.c_str());
      return false;
    }
  }
  if (a->minBytes == 0 || a->minBytes > a->maxBytes) {
    std::fprintf(stderr, "loom-model: -b must be from 1 and at most -e\n");
    return false;
  }
  return true;
}

struct Named {
  const char* name;
  CollType type;
};
const Named kColls[] = {{"all_reduce", CollType::kAllReduce},
                        {"all_gather", CollType::kAllGather},
                        {"reduce_scatter", CollType::kReduceScatter},
                        {"broadcast", CollType::kBroadcast},
                        {"reduce", CollType::kReduce},
                        {"alltoall", CollType::kAllToAll}};

std::string sizeText(size_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (u < 3 && b >= 1024 && b % 1024 == 0) {
    b /= 1024;
    ++u;
  }
  return std::to_string(b) + " " + units[u];
}

// The tuner's pick for a size (collectives/tuner.h: tunerPick); false where the tuner cannot
// be asked here (GPUs of one host: the mesh planner's size limits decide).
bool tunerOf(CollType type, size_t b, const model::Fabric& f, model::Algo* algo) {
  return loom::collectives::tunerPick(type, b, f, algo);
}

// One size of the table: each algorithm's time and busbw (* on the tuner's pick), the
// model's fastest built one and the tuner's pick; the header before the first.
void printRow(const Named& c, size_t b, int n, const std::vector<model::Estimate>& list,
              const model::Estimate& fastest, const model::Algo* tuner, const model::Estimate* loom,
              bool* header) {
  if (!*header) {
    std::printf("%10s", "size");
    for (const auto& e : list) std::printf("  %22s", model::algoName(e.algo));
    std::printf("  %-13s %-13s %s\n", "fastest", "tuner", "loom");
    *header = true;
  }
  std::printf("%10s", sizeText(b).c_str());
  for (const auto& e : list) {
    char cell[64];
    std::snprintf(cell, sizeof(cell), "%s%.4g / %.3g%s%s", e.built ? "" : "(", e.us,
                  model::busGBs(c.type, b, n, e.us), e.built ? "" : ")",
                  tuner && e.algo == *tuner ? "*" : "");
    std::printf("  %22s", cell);
  }
  char where[48] = "";
  if (loom) {
    std::snprintf(where, sizeof(where), "%.4g / %.3g", loom->us,
                  model::busGBs(c.type, b, n, loom->us));
  }
  std::printf("  %-13s %-13s %s\n", model::algoName(fastest.algo),
              tuner ? model::algoName(*tuner) : "mesh planner", where);
}

void table(const Named& c, const Args& a, const model::Fabric& f) {
  const int n = f.nranks();
  if (!a.csv) {
    std::printf("\n%s (time in us, busbw in GB/s; * the tuner's pick, () not built yet%s)\n",
                c.name,
                f.gpu && f.hosts == 1 ? "; GPUs of one host: the mesh planner picks by its size "
                                        "limits (LOOM_P2P_*), not asked here"
                                      : "");
  }
  bool header = false;
  for (size_t b = a.minBytes; b <= a.maxBytes; b *= a.factor) {
    const auto list = model::estimates(c.type, b, f);
    const model::Estimate pick = model::fastest(list);
    model::Algo tuner{};
    const bool asked = tunerOf(c.type, b, f, &tuner);
    model::Estimate runs;
    const bool priced = asked && loom::collectives::tunerEstimate(c.type, b, f, &runs);
    if (a.csv) {
      for (const auto& e : list) {
        std::printf("%s,%d,%d,%zu,%s,%.3f,%.3f,%d,%d,%d\n", c.name, f.hosts, f.ranksPerHost, b,
                    model::algoName(e.algo), e.us, model::busGBs(c.type, b, n, e.us),
                    e.built ? 1 : 0, e.algo == pick.algo ? 1 : 0, asked && e.algo == tuner ? 1 : 0);
      }
      if (priced) {
        std::printf("%s,%d,%d,%zu,loom,%.3f,%.3f,1,0,0\n", c.name, f.hosts, f.ranksPerHost, b,
                    runs.us, model::busGBs(c.type, b, n, runs.us));
      }
    } else {
      printRow(c, b, n, list, pick, asked ? &tuner : nullptr, priced ? &runs : nullptr, &header);
    }
    if (b > a.maxBytes / a.factor) break;  // the next size would pass MAX (or wrap)
  }
}
int scale(const Args& a, const topo::Graph& g) {
  FILE* out = std::fopen(a.scale.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "loom-model: cannot write %s: %s\n", a.scale.c_str(),
                 std::strerror(errno));
    return 1;
  }
  std::fprintf(out, "hosts,ranks_per_host,bytes,algo,us,busbw_gbps,built,picked,tuner\n");
  for (int hosts = 2; hosts <= 4096; hosts *= 2) {
    model::FabricOptions o = a.fabric;
    o.hosts = hosts;
    const model::Fabric f = model::fabricOf(g, o);
    for (size_t b : {size_t(8), size_t(1) << 30}) {
      const auto list = model::estimates(CollType::kAllReduce, b, f);
      const model::Estimate pick = model::fastest(list);
      model::Algo tuner{};
      const bool asked = tunerOf(CollType::kAllReduce, b, f, &tuner);
      for (const auto& e : list) {
        std::fprintf(out, "%d,%d,%zu,%s,%.3f,%.4f,%d,%d,%d\n", hosts, f.ranksPerHost, b,
                     model::algoName(e.algo), e.us,
                     model::busGBs(CollType::kAllReduce, b, f.nranks(), e.us), e.built ? 1 : 0,
                     e.algo == pick.algo ? 1 : 0, asked && e.algo == tuner ? 1 : 0);
      }
      model::Estimate runs;
      if (asked && loom::collectives::tunerEstimate(CollType::kAllReduce, b, f, &runs)) {
        std::fprintf(out, "%d,%d,%zu,loom,%.3f,%.4f,1,0,0\n", hosts, f.ranksPerHost, b, runs.us,
                     model::busGBs(CollType::kAllReduce, b, f.nranks(), runs.us));
      }
    }
  }
  std::fclose(out);
  std::fprintf(stderr, "loom-model: wrote %s\n", a.scale.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  a.fabric.hosts = 2;
  if (!parseArgs(argc, argv, &a)) {
    usage(stderr);
    return 2;
  }
  topo::System system;
  if (!a.topoFile.empty()) {
    auto r = topo::readXmlFile(a.topoFile);
    if (!r) {
      std::fprintf(stderr, "loom-model: %s\n", r.status().message().c_str());
      return 1;
    }
    system = std::move(r->system);
  } else {
    topo::DirReader reader(a.sysfsRoot.empty() ? "/" : a.sysfsRoot);
    auto d = topo::detectLocal(reader);
    if (!d) {
      std::fprintf(stderr, "loom-model: detecting this machine: %s\n",
                   d.status().message().c_str());
      return 1;
    }
    system = std::move(d->system);
  }
  auto graph = topo::Graph::build(system);
  if (!graph) {
    std::fprintf(stderr, "loom-model: %s\n", graph.status().message().c_str());
    return 1;
  }
  if (!a.scale.empty()) return scale(a, *graph);
  std::string why;
  const model::Fabric f = model::fabricOf(*graph, a.fabric, &why);
  if (a.csv) {
    std::printf("coll,hosts,ranks_per_host,bytes,algo,us,busbw_gbps,built,picked,tuner\n");
  } else {
    std::printf("loom-model: %d host(s) x %d rank(s); %s\n", f.hosts, f.ranksPerHost, why.c_str());
    std::printf("  per step: %.3g us inside a host, %.3g us between hosts; %.3g us a call\n",
                f.intra.latencyUs, f.inter.latencyUs, f.baseUs);
  }
  bool any = false;
  for (const Named& c : kColls) {
    if (a.coll != "all" && a.coll != c.name) continue;
    any = true;
    table(c, a, f);
  }
  if (!any) {
    std::fprintf(stderr, "loom-model: -c %s: no such collective\n", a.coll.c_str());
    return 2;
  }
  return 0;
}
