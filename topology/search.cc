#include "topology/search.h"

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <set>

namespace loom::topology {
namespace {

constexpr double kEps = 1e-9;
// Per-channel bandwidths tried, GB/s; the search keeps the one moving the most in total.
constexpr double kLadder[] = {40, 30, 25, 24, 20,  16, 15,  12,   10,  8,    6,
                              5,  4,  3,  2,  1.5, 1,  0.5, 0.25, 0.1, 0.05, 0.01};

// One directed link, as (node, index into node.links).
struct Slot {
  int node, link;
};

class RingSearch {
 public:
  RingSearch(const Graph& graph, const std::vector<int>& gpus, const SearchOptions& options)
      : graph_(graph), gpus_(gpus), options_(options) {
    const auto& nodes = graph.nodes();
    offset_.resize(nodes.size() + 1, 0);
    for (size_t i = 0; i < nodes.size(); ++i) offset_[i + 1] = offset_[i] + nodes[i].links.size();
    const int k = static_cast<int>(gpus.size());
    hops_.resize(static_cast<size_t>(k) * k);
    order_.resize(k);
    for (int a = 0; a < k; ++a) {
      for (int b = 0; b < k; ++b) {
        if (a == b) continue;
        const Path& p = graph.gpuToGpu(gpus[a], gpus[b]);
        auto& slots = hops_[a * k + b];
        for (size_t i = 0; i + 1 < p.nodes.size(); ++i) {
          const auto& links = nodes[p.nodes[i]].links;
          for (size_t l = 0; l < links.size(); ++l) {
            if (links[l].to == p.nodes[i + 1]) {
              slots.push_back(Slot{p.nodes[i], static_cast<int>(l)});
              break;
            }
          }
        }
      }
      // Candidates for the hop after `a`: best path type, then widest, then index.
      for (int b = 0; b < k; ++b)
        if (b != a) order_[a].push_back(b);
      std::stable_sort(order_[a].begin(), order_[a].end(), [&](int x, int y) {
        const Path& px = graph.gpuToGpu(gpus[a], gpus[x]);
        const Path& py = graph.gpuToGpu(gpus[a], gpus[y]);
        if (px.type != py.type) return px.type < py.type;
        return px.bw > py.bw;
      });
    }
  }

  HostPlan run() {
    HostPlan best;
    best.gpus = gpus_;
    const int k = static_cast<int>(gpus_.size());
    if (k == 0) return best;
    if (k == 1) {
      best.rings.push_back({0});
      best.channelBw = options_.maxChannelBw;
      return best;
    }
    double bestTotal = 0;
    for (double speed : kLadder) {
      if (speed > options_.maxChannelBw + kEps) continue;
      if (speed * options_.maxChannels <= bestTotal + kEps) break;  // cannot win any more
      resetCapacity();
      std::vector<std::vector<int>> rings;
      while (static_cast<int>(rings.size()) < options_.maxChannels) {
        std::vector<int> ring;
        if (!findRing(speed, ring)) break;
        rings.push_back(std::move(ring));
      }
      double total = speed * rings.size();
      if (total > bestTotal + kEps) {
        bestTotal = total;
        best.rings = std::move(rings);
        best.channelBw = speed;
      }
    }
    // Rings hold positions in gpus_; translate to local GPU indices.
    for (auto& ring : best.rings)
      for (int& g : ring) g = gpus_[g];
    for (const auto& ring : best.rings) {
      for (size_t i = 0; i < ring.size(); ++i) {
        const Path& p = graph_.gpuToGpu(ring[i], ring[(i + 1) % ring.size()]);
        best.worstType = std::max(best.worstType, p.type);
      }
    }
    return best;
  }

 private:
  void resetCapacity() {
    const auto& nodes = graph_.nodes();
    capacity_.assign(offset_.back(), 0);
    for (size_t n = 0; n < nodes.size(); ++n)
      for (size_t l = 0; l < nodes[n].links.size(); ++l)
        capacity_[offset_[n] + l] = nodes[n].links[l].bw;
  }
  bool fits(int a, int b, double speed) const {
    // A hop that crosses a link twice needs twice the speed there; hops are short paths
    // that never repeat a link, so one check per slot suffices.
    for (const Slot& s : hops_[a * gpus_.size() + b])
      if (capacity_[offset_[s.node] + s.link] + kEps < speed) return false;
    return !hops_[a * gpus_.size() + b].empty();
  }
  double remaining(int a, int b) const {
    double r = 1e300;
    for (const Slot& s : hops_[a * gpus_.size() + b])
      r = std::min(r, capacity_[offset_[s.node] + s.link]);
    return r;
  }
  void take(int a, int b, double amount) {
    for (const Slot& s : hops_[a * gpus_.size() + b]) capacity_[offset_[s.node] + s.link] -= amount;
  }

  bool findRing(double speed, std::vector<int>& ring) {
    const int k = static_cast<int>(gpus_.size());
    std::vector<char> used(k, 0);
    ring.assign(1, 0);
    used[0] = 1;
    steps_ = 0;
    return extend(speed, ring, used, k);
  }

  bool extend(double speed, std::vector<int>& ring, std::vector<char>& used, int k) {
    if (++steps_ > options_.dfsBudget) return false;
    int last = ring.back();
    if (static_cast<int>(ring.size()) == k) {
      if (!fits(last, ring.front(), speed)) return false;
      take(last, ring.front(), speed);
      return true;
    }
    // Best path type first (order_ is sorted that way), then the hop with the most
    // capacity left, so successive rings spread over parallel links instead of
    // exhausting one cycle; ties keep GPU order, so the result stays deterministic.
    std::vector<std::pair<int, double>> candidates;
    for (int next : order_[last]) {
      if (used[next] || !fits(last, next, speed)) continue;
      candidates.emplace_back(next, remaining(last, next));
    }
    std::stable_sort(candidates.begin(), candidates.end(), [&](const auto& x, const auto& y) {
      PathType tx = graph_.gpuToGpu(gpus_[last], gpus_[x.first]).type;
      PathType ty = graph_.gpuToGpu(gpus_[last], gpus_[y.first]).type;
      if (tx != ty) return tx < ty;
      return x.second > y.second + kEps;
    });
    for (auto [next, _] : candidates) {
      take(last, next, speed);
      used[next] = 1;
      ring.push_back(next);
      if (extend(speed, ring, used, k)) return true;
      ring.pop_back();
      used[next] = 0;
      take(last, next, -speed);
    }
    return false;
  }

  const Graph& graph_;
  const std::vector<int>& gpus_;
  const SearchOptions& options_;
  std::vector<size_t> offset_;
  std::vector<std::vector<Slot>> hops_;
  std::vector<std::vector<int>> order_;
  std::vector<double> capacity_;
  int steps_ = 0;
};

// What identifies a host's shape for caching: everything the graph depends on, nothing
// per host (ranks, host id, guids, names).
void signPci(const PciNode& pci, std::string& out) {
  out += pci.busId;
  out += pci.pciClass;
  out += pci.linkSpeed;
  out += std::to_string(pci.linkWidth);
  if (pci.gpu) {
    out += "g" + std::to_string(pci.gpu->sm) + "/" + std::to_string(pci.gpu->dev);
    for (const NvLink& l : pci.gpu->nvlinks)
      out += l.target + l.targetClass + std::to_string(l.count);
    for (const P2pPeer& p : pci.gpu->p2p)
      if (!p.access) out += "x" + p.target;  // pairs without peer access change the paths
  }
  if (pci.nic) {
    for (const Net& n : pci.nic->nets)
      out.append("n").append(std::to_string(n.speedMbps)).append("/").append(std::to_string(n.dev));
  }
  out += "(";
  for (const PciNode& c : pci.children) signPci(c, out);
  out += ")";
}

std::string signature(const System& s) {
  std::string out;
  for (const Cpu& cpu : s.cpus) {
    out.append("c")
        .append(std::to_string(cpu.numaId))
        .append(cpu.vendor)
        .append(cpu.arch)
        .append(std::to_string(cpu.modelId));
    for (const PciNode& p : cpu.pcis) signPci(p, out);
    for (const Nic& nic : cpu.nics)
      for (const Net& n : nic.nets) out.append("v").append(std::to_string(n.speedMbps));
  }
  return out;
}

struct HostState {
  const Graph* graph = nullptr;
  const HostPlan* plan = nullptr;
  std::vector<int> rankOf;  // by local GPU index; -1 when not taking part
  std::vector<int> nets;    // distinct closest nets of the participating GPUs, ascending
};

// Everything both searches need: graphs and plans (cached per host shape), ranks.
class Prepared {
 public:
  Status prepare(const ClusterView& cluster, const SearchOptions& options) {
    // Ranks: explicit when any GPU has one, else host-major.
    bool explicitRanks = false;
    for (const System& s : cluster.hosts)
      forEachPci(s,
                 [&](const PciNode& p, const Cpu&) { explicitRanks |= p.gpu && p.gpu->rank >= 0; });
    int next = 0;
    for (const System& s : cluster.hosts) {
      std::string sig = signature(s);
      auto it = graphs_.find(sig);
      if (it == graphs_.end()) {
        LOOM_ASSIGN_OR_RETURN(Graph g, Graph::build(s));
        it = graphs_.emplace(sig, std::make_unique<Graph>(std::move(g))).first;
      }
      HostState h;
      h.graph = it->second.get();
      const Graph& g = *h.graph;
      h.rankOf.assign(g.gpuCount(), -1);
      std::vector<int> local;
      for (int i = 0; i < g.gpuCount(); ++i) {
        // The graph's GPU i may come from a different (same-shaped) System: take the
        // rank from this host's GPU with the same bus id.
        const std::string& bus = g.nodes()[g.gpus()[i]].busId;
        int rank = -1;
        forEachPci(s, [&](const PciNode& p, const Cpu&) {
          if (p.gpu && p.busId == bus) rank = p.gpu->rank;
        });
        if (!explicitRanks) rank = next++;
        h.rankOf[i] = rank;
        if (rank >= 0) local.push_back(i);
      }
      std::string planKey = sig + "|";
      for (int i : local) planKey += std::to_string(i) + ",";
      auto pit = plans_.find(planKey);
      if (pit == plans_.end()) {
        pit =
            plans_.emplace(planKey, std::make_unique<HostPlan>(planHost(g, local, options))).first;
      }
      h.plan = pit->second.get();
      std::set<int> nets;
      for (int i : local)
        if (g.closestNet(i) >= 0) nets.insert(g.closestNet(i));
      h.nets.assign(nets.begin(), nets.end());
      if (!local.empty()) hosts_.push_back(std::move(h));
    }
    // Ranks must be 0..n-1, each once.
    std::vector<int> seen;
    for (const HostState& h : hosts_)
      for (int r : h.rankOf)
        if (r >= 0) seen.push_back(r);
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size(); ++i) {
      if (seen[i] != static_cast<int>(i)) {
        return errorf(Code::kInvalidArgument,
                      "GPU ranks in the cluster view are not 0..%zu each once (rank %d %s)",
                      seen.size() - 1, seen[i],
                      i > 0 && seen[i] == seen[i - 1] ? "repeats" : "is out of place");
      }
    }
    nranks_ = static_cast<int>(seen.size());
    // Channels: one host uses its rings; several hosts need the same count everywhere,
    // enough to give every NIC a channel.
    channels_ = 0;
    if (!hosts_.empty()) {
      channels_ = options.maxChannels;
      for (const HostState& h : hosts_) {
        int want = static_cast<int>(h.plan->rings.size());
        if (hosts_.size() > 1) want = std::max(want, static_cast<int>(h.nets.size()));
        channels_ = std::min(channels_, std::max(want, 1));
      }
    }
    return Status::ok();
  }

  // Host h's chain for channel c, in local GPU indices, starting at the GPU where the
  // channel enters (closest to the c-th NIC).
  std::vector<int> chain(size_t h, int c) const {
    const HostState& host = hosts_[h];
    const auto& rings = host.plan->rings;
    std::vector<int> ring = rings.empty() ? host.plan->gpus : rings[c % rings.size()];
    size_t start = 0;
    if (!host.nets.empty()) {
      int target = host.nets[c % host.nets.size()];
      for (size_t i = 0; i < ring.size(); ++i) {
        if (host.graph->closestNet(ring[i]) == target) {
          start = i;
          break;
        }
      }
    }
    std::rotate(ring.begin(), ring.begin() + start, ring.end());
    return ring;
  }

  const std::vector<HostState>& hosts() const { return hosts_; }
  int channels() const { return channels_; }
  int nranks() const { return nranks_; }

 private:
  std::map<std::string, std::unique_ptr<Graph>> graphs_;
  std::map<std::string, std::unique_ptr<HostPlan>> plans_;
  std::vector<HostState> hosts_;
  int channels_ = 0;
  int nranks_ = 0;
};

}  // namespace

std::string hostShapeKey(const System& system) {
  return signature(system);
}

HostPlan planHost(const Graph& graph, std::vector<int> gpus, const SearchOptions& options) {
  if (gpus.empty()) {
    gpus.resize(graph.gpuCount());
    std::iota(gpus.begin(), gpus.end(), 0);
  }
  return RingSearch(graph, gpus, options).run();
}

Result<ClusterView> buildClusterView(const std::vector<System>& rankViews) {
  ClusterView view;
  std::vector<std::string> ids;
  for (size_t i = 0; i < rankViews.size(); ++i) {
    const System& s = rankViews[i];
    std::string id = s.hostId();
    if (id.empty()) return errorf(Code::kInvalidArgument, "view %zu has no host id", i);
    auto it = std::find(ids.begin(), ids.end(), id);
    if (it == ids.end()) {
      ids.push_back(id);
      view.hosts.push_back(s);
    } else {
      mergeInto(view.hosts[it - ids.begin()], s);
    }
  }
  return view;
}

ClusterView replicateHost(const System& host, int count) {
  ClusterView view;
  const int perHost = gpuCount(host);
  // Local GPU order is the graph's (by CUDA device index); ranks are host-major in it.
  std::map<std::string, int> localIndex;
  if (auto built = Graph::build(host)) {
    for (int i = 0; i < built->gpuCount(); ++i)
      localIndex[built->nodes()[built->gpus()[i]].busId] = i;
  }
  for (int h = 0; h < count; ++h) {
    System s = host;
    s.setHostId(host.hostId() + "#" + std::to_string(h));
    forEachPci(s, [&](PciNode& p, Cpu&) {
      if (p.gpu) p.gpu->rank = h * perHost + localIndex[p.busId];
    });
    view.hosts.push_back(std::move(s));
  }
  return view;
}

std::vector<int> doubleBinaryTree(int n, int which) {
  // Tree 0: in-order binary tree over positions; the root of a range is the position p
  // whose p+1 has the most trailing zeros, so every inner node has an odd position.
  // Tree 1 relabels positions (mirror for even n, shift by one for odd n) so its inner
  // nodes are even: no host is an inner node of both trees.
  std::vector<int> parent(std::max(n, 0), -1);
  if (n <= 0) return parent;
  std::vector<std::pair<std::pair<int, int>, int>> stack{{{0, n - 1}, -1}};
  while (!stack.empty()) {
    auto [range, up] = stack.back();
    stack.pop_back();
    auto [lo, hi] = range;
    if (lo > hi) continue;
    int root = lo;
    for (int p = lo; p <= hi; ++p)
      if (__builtin_ctz(p + 1) > __builtin_ctz(root + 1)) root = p;
    parent[root] = up;
    stack.push_back({{lo, root - 1}, root});
    stack.push_back({{root + 1, hi}, root});
  }
  if (which == 0 || n == 1) return parent;
  auto relabel = [&](int p) { return n % 2 == 0 ? n - 1 - p : (p + 1) % n; };
  std::vector<int> out(n, -1);
  for (int p = 0; p < n; ++p) out[relabel(p)] = parent[p] < 0 ? -1 : relabel(parent[p]);
  return out;
}

Result<Rings> searchRings(const ClusterView& cluster, const SearchOptions& options) {
  Prepared prep;
  LOOM_TRY(prep.prepare(cluster, options));
  Rings out;
  const auto& hosts = prep.hosts();
  if (hosts.empty()) return out;
  const bool multi = hosts.size() > 1;
  double bw = options.maxChannelBw;
  std::vector<std::map<int, int>> inUses(hosts.size()), outUses(hosts.size());
  for (int c = 0; c < prep.channels(); ++c) {
    RingChannel ch;
    ch.ranks.reserve(prep.nranks());
    for (size_t h = 0; h < hosts.size(); ++h) {
      std::vector<int> chain = prep.chain(h, c);
      for (int g : chain) ch.ranks.push_back(hosts[h].rankOf[g]);
      if (multi) {
        int in = hosts[h].graph->closestNet(chain.front());
        int outNet = hosts[h].graph->closestNet(chain.back());
        ch.netIn.push_back(in);
        ch.netOut.push_back(outNet);
        ++inUses[h][in];
        ++outUses[h][outNet];
      }
    }
    out.channels.push_back(std::move(ch));
  }
  for (size_t h = 0; h < hosts.size(); ++h) {
    bw = std::min(bw, hosts[h].plan->channelBw);
    for (const auto* uses : {&inUses[h], &outUses[h]}) {
      for (auto [net, n] : *uses) {
        if (net < 0) continue;
        double netBw = hosts[h].graph->nodes()[hosts[h].graph->nets()[net]].links.front().bw;
        bw = std::min(bw, netBw / n);
      }
    }
  }
  out.channelBw = bw;
  return out;
}

Result<Trees> searchTrees(const ClusterView& cluster, const SearchOptions& options) {
  Prepared prep;
  LOOM_TRY(prep.prepare(cluster, options));
  Trees out;
  const auto& hosts = prep.hosts();
  if (hosts.empty()) return out;
  const int n = static_cast<int>(hosts.size());
  std::vector<int> trees[2] = {doubleBinaryTree(n, 0), doubleBinaryTree(n, 1)};
  for (int c = 0; c < prep.channels(); ++c) {
    TreeChannel t;
    t.crossHostTree = n > 1 ? c % 2 : 0;
    t.parent.assign(prep.nranks(), -1);
    std::vector<int> heads(n);
    for (int h = 0; h < n; ++h) {
      std::vector<int> chain = prep.chain(h, c);
      heads[h] = hosts[h].rankOf[chain.front()];
      for (size_t i = 1; i < chain.size(); ++i)
        t.parent[hosts[h].rankOf[chain[i]]] = hosts[h].rankOf[chain[i - 1]];
    }
    const std::vector<int>& up = trees[t.crossHostTree];
    for (int h = 0; h < n; ++h) {
      if (up[h] < 0) {
        t.root = heads[h];
      } else {
        t.parent[heads[h]] = heads[up[h]];
      }
    }
    out.channels.push_back(std::move(t));
  }
  return out;
}

std::vector<int> treeChildren(const TreeChannel& tree, int rank) {
  std::vector<int> out;
  for (size_t r = 0; r < tree.parent.size(); ++r)
    if (tree.parent[r] == rank) out.push_back(static_cast<int>(r));
  return out;
}

}  // namespace loom::topology
