// The hierarchical forms across hosts: a step inside each host, and a step across hosts
// between the ranks of the same local index (rails). Pure: which ranks form the host groups
// and the rails, which calls take the form, and how a reduction splits between the two
// levels; tests/collectives/hierarchy_test.cc. Two executors use it:
//   GPU buffers   the in-host steps on the GPU mesh (collectives/device/mesh.h), the rail's
//                 over the network (collectives/device/net_executor.h);
//                 collectives/device/cuda_executor_hier.cc
//   host buffers  one schedule per collective (hierAllReduce, hierAllGather,
//                 hierReduceScatter: collectives/schedule.h) whose in-host steps go over
//                 the host's transport (shm) and the rail's over the network
//
//   all-reduce  reduce-scatter in the host (each local rank keeps 1/L of the buffer),
//               all-reduce of that part across hosts on the rank's rail, all-gather in
//               the host. Each rail carries 1/L of the data: the network moves
//               2 (H-1)/H x bytes / L per rank instead of the flat ring's 2 (N-1)/N x bytes.
//   broadcast   across hosts on the root's rail, then in each host from that rail's rank
//               (GPU buffers).
//   reduce      in each host to the rank on the root's rail, then across hosts on that rail
//               (GPU buffers).
//   all-gather  GPU buffers: across hosts on each rail (the blocks of its local index), then
//               in the host over the mesh, then the blocks put in rank order (2D copies).
//               Host buffers: across hosts on each rail, then in the host per host's blocks.
//   reduce-scatter  the mirror of the all-gather.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/algo_request.h"
#include "collectives/operation.h"
#include "collectives/schedule.h"
#include "common/datatype.h"

namespace loom::collectives {

struct Hierarchy {
  int hosts = 0;       // H
  int local = 0;       // L: ranks per host (every host has as many)
  int hostIndex = -1;  // this rank's host, in the order of each host's first rank
  int localIndex = -1;
  std::vector<int> localRanks;  // the ranks of this rank's host, ascending
  std::vector<int> railRanks;   // the ranks with this rank's local index, by host
  // Where rank r sits (both sized nranks), and every host's ranks ([host][local]).
  std::vector<int> hostOf, localOf;
  std::vector<std::vector<int>> hostRanks;
};

// The hierarchy of ranks whose hosts are `hostKeys` (one per rank, equal for ranks of one
// host), seen from `rank`; false with the reason when there is none: one host, one rank
// per host, or hosts with different rank counts.
bool findHierarchy(const std::vector<uint64_t>& hostKeys, int rank, Hierarchy* h, std::string* why);

// Why the call does not take the hierarchical form (null: it does). `count` as the C API
// gives it. LOOM_ALGO leaves it out unless it allows "hier".
const char* hierDecline(CollType type, size_t count, const Hierarchy& h, const AlgoRequest& algo);
// (The GPU forms: all-reduce, broadcast, reduce, all-gather, reduce-scatter. Host buffers
// have all-reduce, all-gather and reduce-scatter, collectives/schedule.h.)

// Whether every host's ranks are numbered one after another (host h's local rank l is
// rank h x local + l), as the block orders of the all-gather, reduce-scatter and
// all-to-all across hosts take them to be.
bool ranksHostByHost(const Hierarchy& h);

// GPU buffers, point to point (send/receive, all-to-all): the exchanges split by where the
// peer is, the ranks of this rank's host over the GPU mesh and the others over the network,
// for messages (an all-to-all's blocks) of at least kHierP2pMeshBytes; smaller ones go to
// every peer over the network, as without a hierarchy: one network pass is quicker there
// than a mesh pass and then a network pass (measured in docs/perf/crosshost.md). LOOM_ALGO
// naming hier splits every size; one that leaves hier out, none.
inline constexpr size_t kHierP2pMeshBytes = size_t{512} << 10;
// Why the exchanges do not split (null: they do). `blockBytes`: the all-to-all's block (what
// each rank sends each peer); send/receive messages are taken one by one (hierP2pOverMesh).
const char* hierP2pDecline(CollType type, const Hierarchy& h, const AlgoRequest& algo,
                           size_t blockBytes);
// Whether a send/receive message of `bytes` between two ranks of one host goes over the
// mesh in a split exchange: both ends give the same answer, as both see the same size.
bool hierP2pOverMesh(size_t bytes, const AlgoRequest& algo);
// Whether a message of `bytes` between `rank` (h seen from it) and `peer` goes over the mesh
// in a split exchange: to another rank of its host, not empty, hierP2pOverMesh.
bool hierP2pMessageOverMesh(int peer, size_t bytes, int rank, const Hierarchy& h,
                            const AlgoRequest& algo);
// Whether the Send/Recv calls [begin, end) of one group of `rank` hold a message that goes
// over the mesh (hierP2pMessageOverMesh). On a host of two ranks both give the same answer
// (their mesh messages are each other's), which the gate between the passes relies on
// (cuda_executor_net.cc runNetP2p).
bool hierP2pMeshWork(const std::vector<Operation>& ops, size_t begin, size_t end, int rank,
                     const Hierarchy& h, const AlgoRequest& algo);

// The GPU all-gather and reduce-scatter reorder every rank's block between rank order
// (host by host: block (h, l) at h * local + l) and local order (local index by local
// index, each with its hosts' blocks: (h, l) at l * hosts + h), in one 2D copy per local
// index: `height` rows of `width` bytes, from src + srcOffset every srcPitch bytes to
// dst + dstOffset every dstPitch bytes (cudaMemcpy2DAsync's terms).
struct BlockCopy2D {
  size_t srcOffset = 0, srcPitch = 0;
  size_t dstOffset = 0, dstPitch = 0;
  size_t width = 0, height = 0;
};
std::vector<BlockCopy2D> hierBlockOrderCopies(int hosts, int local, size_t blockBytes,
                                              bool toRankOrder);

// A reduction split between the levels: the first reduces each rank's input (the host
// level), the second combines the hosts' partial results. PreMulSum scales the inputs,
// so only the first applies it; SumPostDiv divides the final sum, so only the second.
struct SplitReduction {
  RedKind first = RedKind::kSum;
  RedKind second = RedKind::kSum;
};
SplitReduction splitReduction(RedKind kind);

// "communicator rank a, b, c for i = 0, 1, 2" (messages of the levels' executors, which
// number their ranks within the host or the rail).
std::string hierRanksText(const std::vector<int>& ranks);

// What LOOM_ALGO asks of the across-host part: the request itself where it chooses
// between ring and tree, else nothing (the tuner chooses).
AlgoRequest railRequest(const AlgoRequest& algo);

}  // namespace loom::collectives
