#include "collectives/hierarchy.h"

#include <map>

namespace loom::collectives {

bool findHierarchy(const std::vector<uint64_t>& hostKeys, int rank, Hierarchy* h,
                   std::string* why) {
  *h = Hierarchy{};
  const int n = static_cast<int>(hostKeys.size());
  if (rank < 0 || rank >= n) {
    *why = "rank out of range";
    return false;
  }
  std::map<uint64_t, int> hostIds;  // key -> host index, in the order of first ranks
  std::vector<std::vector<int>> members;
  h->hostOf.assign(n, -1);
  h->localOf.assign(n, -1);
  for (int r = 0; r < n; ++r) {
    auto [it, fresh] = hostIds.emplace(hostKeys[r], static_cast<int>(members.size()));
    if (fresh) members.emplace_back();
    h->hostOf[r] = it->second;
    h->localOf[r] = static_cast<int>(members[it->second].size());
    members[it->second].push_back(r);
  }
  h->hosts = static_cast<int>(members.size());
  h->local = static_cast<int>(members[0].size());
  if (h->hosts < 2) {
    *why = "every rank is on one host";
    return false;
  }
  for (int k = 0; k < h->hosts; ++k) {
    if (static_cast<int>(members[k].size()) != h->local) {
      *why = "hosts hold different numbers of ranks (" + std::to_string(members[0].size()) +
             " on the first, " + std::to_string(members[k].size()) + " on host " +
             std::to_string(k) + ")";
      return false;
    }
  }
  if (h->local < 2) {
    *why = "one rank per host";
    return false;
  }
  h->hostIndex = h->hostOf[rank];
  h->localIndex = h->localOf[rank];
  h->localRanks = members[h->hostIndex];
  h->hostRanks = members;
  for (int k = 0; k < h->hosts; ++k) h->railRanks.push_back(members[k][h->localIndex]);
  return true;
}

const char* hierDecline(CollType type, size_t count, const Hierarchy& h, const AlgoRequest& algo) {
  if (!algo.allows(AlgoName::kHier)) return "LOOM_ALGO leaves out hier";
  switch (type) {
    case CollType::kAllReduce:
      if (count % static_cast<size_t>(h.local) != 0) {
        return "the count is not a multiple of the ranks per host (the in-host reduce-scatter "
               "needs equal parts)";
      }
      return nullptr;
    case CollType::kBroadcast:
    case CollType::kReduce: return nullptr;
    case CollType::kAllGather:
    case CollType::kReduceScatter:
      // Their blocks are in rank order, which the copies between rank and local order
      // (hierBlockOrderCopies) take to be host by host.
      if (!ranksHostByHost(h))
        return "the ranks are not numbered host by host (each host's ranks one after "
               "another), which the all-gather's and reduce-scatter's block order needs";
      return nullptr;
    case CollType::kAllToAll:
    case CollType::kSendRecv: return "point-to-point exchanges go directly";
  }
  return "unknown collective";
}

bool ranksHostByHost(const Hierarchy& h) {
  for (int host = 0; host < h.hosts; ++host) {
    for (int l = 0; l < h.local; ++l) {
      if (h.hostRanks[host][l] != host * h.local + l) return false;
    }
  }
  return true;
}

// The reasons below and in cuda_executor_hier.cc name the bound.
static_assert(kHierP2pMeshBytes == 512 * 1024, "update the messages that say 512 KiB");

bool hierP2pOverMesh(size_t bytes, const AlgoRequest& algo) {
  return algo.names(AlgoName::kHier) || bytes >= kHierP2pMeshBytes;
}

bool hierP2pMessageOverMesh(int peer, size_t bytes, int rank, const Hierarchy& h,
                            const AlgoRequest& algo) {
  return peer != rank && h.hostOf[peer] == h.hostIndex && bytes > 0 && hierP2pOverMesh(bytes, algo);
}

bool hierP2pMeshWork(const std::vector<Operation>& ops, size_t begin, size_t end, int rank,
                     const Hierarchy& h, const AlgoRequest& algo) {
  for (size_t i = begin; i < end; ++i) {
    if (hierP2pMessageOverMesh(ops[i].root, ops[i].count * dataTypeSize(ops[i].dtype), rank, h,
                               algo)) {
      return true;
    }
  }
  return false;
}

const char* hierP2pDecline(CollType type, const Hierarchy& h, const AlgoRequest& algo,
                           size_t blockBytes) {
  if (type != CollType::kSendRecv && type != CollType::kAllToAll)
    return "not a point-to-point exchange";
  if (!algo.allows(AlgoName::kHier)) return "LOOM_ALGO leaves out hier";
  if (type == CollType::kAllToAll && !hierP2pOverMesh(blockBytes, algo))
    return "blocks under 512 KiB: every peer over the network (one pass; LOOM_ALGO=hier splits "
           "them)";
  // The all-to-all gives the host's ranks their blocks in one mesh all-to-all over the
  // host's part of the buffers, which is one range where the ranks go host by host.
  if (type == CollType::kAllToAll && !ranksHostByHost(h))
    return "the ranks are not numbered host by host, which the all-to-all's split needs";
  return nullptr;
}

std::vector<BlockCopy2D> hierBlockOrderCopies(int hosts, int local, size_t blockBytes,
                                              bool toRankOrder) {
  const size_t G = static_cast<size_t>(local), H = static_cast<size_t>(hosts);
  std::vector<BlockCopy2D> copies;
  for (size_t l = 0; l < G; ++l) {
    BlockCopy2D c;
    const size_t rankOrder = l * blockBytes;       // block (0, l); then every G blocks
    const size_t localOrder = l * H * blockBytes;  // block (0, l); then the next
    c.srcOffset = toRankOrder ? localOrder : rankOrder;
    c.srcPitch = toRankOrder ? blockBytes : G * blockBytes;
    c.dstOffset = toRankOrder ? rankOrder : localOrder;
    c.dstPitch = toRankOrder ? G * blockBytes : blockBytes;
    c.width = blockBytes;
    c.height = H;
    copies.push_back(c);
  }
  return copies;
}

SplitReduction splitReduction(RedKind kind) {
  switch (kind) {
    case RedKind::kPreMulSum: return {RedKind::kPreMulSum, RedKind::kSum};
    case RedKind::kSumPostDiv: return {RedKind::kSum, RedKind::kSumPostDiv};
    default: return {kind, kind};
  }
}

std::string hierRanksText(const std::vector<int>& ranks) {
  std::string a = "communicator rank ", b;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) {
      a += ", ";
      b += ", ";
    }
    a += std::to_string(ranks[i]);
    b += std::to_string(i);
  }
  return a + " for i = " + b;
}

AlgoRequest railRequest(const AlgoRequest& algo) {
  const bool ring = algo.allows(AlgoName::kRing);
  const bool tree = algo.allows(AlgoName::kTree);
  if (algo.set() && ring != tree) return algo;
  return AlgoRequest();
}

}  // namespace loom::collectives
