// Collectives as pure schedules: for rank r of n, the phases of steps it runs. An
// executor (host_executor.h) runs them over connections; tests run them in a
// simulator. Nothing here touches memory, sockets or time.
//
// A Step streams `count` elements in pieces. For each piece, in this order:
//   acc  = src                        (pre-op applied when the collective reduces)
//   acc  = acc (+) recv(p)  for each recv peer p, in order   (copy if there is no src)
//   acc  = post(acc)                  when `final`
//   dst  = acc;  send(acc) to each send peer
// so one Step covers send, recv, recv-reduce-send, recv-reduce-copy(-send),
// recv-copy-send and local copies. Steps of one Phase progress together (p2p, trees);
// Phases run one after the other.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::collectives {

// kAbsolute: `offset` is itself a byte address (the p2p calls of a group, each with
// its own buffer, run byte-wise).
enum class Buffer : uint8_t { kNone = 0, kInput = 1, kOutput = 2, kAbsolute = 3 };

struct Region {
  Buffer buffer = Buffer::kNone;
  size_t offset = 0;  // in elements (bytes of address for kAbsolute)
};

// Up to 3 peers a step: enough for a binary tree (2 children) and for direct all-reduce
// over 4 ranks (a chunk reduced from, and sent to, 3 peers at once).
inline constexpr int kMaxStepPeers = 3;
// One-shot all-reduce (every rank sends its whole buffer to every other) is used, and
// honoured when LOOM_ALGO forces it, only while bytes * (ranks - 1) stays under this.
inline constexpr size_t kOneShotMaxBytes = 96 * 1024;
// All-reduce of GPU buffers over the network on 2 ranks: recursive doubling (one exchange
// of the whole buffer) up to this many bytes, the ring (two hops of half of it) above.
// Processes as hosts on an H100 under MPS, one forced against the other (2026-12-06 and
// 2026-12-07, docs/decisions.md): doubling 98-136 us against the ring's 110-158 from 128
// to 192 KiB and ahead in three model checks at 256 KiB (143-160 against 153-163); the
// ring 178-221 us against 203-270 at 320 and 384 KiB.
inline constexpr size_t kTwoRankDoublingMaxBytes = 256 * 1024;
// All-reduce of GPU buffers over the network on 4 ranks: the direct form (reduce-scatter
// and all-gather, each one step with every peer) up to this many bytes, the ring above.
// Processes as hosts on an H100 under MPS, each forced against the other (2026-12-07 07:42,
// two rounds, docs/perf/crosshost.md): level at 2 MiB (1091-1125 us against 1085-1256),
// the ring ahead at 4 MiB (1556-1835 against 1804-1904), 8 MiB (2588-2796 against
// 3254-3458) and 16 MiB (5045-5554 against 6107-6373), as in four checks before at 16 MiB.
// Measured on 4 hosts of one rank; the rule holds for any 4 ranks of a network executor.
// On 3 ranks the direct form at every size: in the same call ahead of the ring at 1 and 4
// MiB, within 4 % of it at 16 and 64 MiB; with its chunks on 16-byte boundaries (2edbd8c)
// ahead of the tree at 256 KiB-16 MiB (2026-12-08 01:16-01:21, docs/decisions.md).
inline constexpr size_t kDirectAllReduceMaxBytes4 = 2 * 1024 * 1024;
// All-gather of GPU buffers over the network: the direct form (every block to every peer
// in one step) on 3 ranks at every size, on 4 up to this many bytes a rank, the ring above
// and on more ranks. Processes as hosts on an H100 under MPS (2026-12-06 08:17, two rounds,
// docs/perf/crosshost.md): on 3, direct 36-42 us against the ring's 52-60 below 4 KiB and
// 0.63-0.72 x its time from 256 KiB to 16 MiB; on 4, 51-62 us against 69-80 below 32 KiB,
// level at 256 KiB-2 MiB (64-512 KiB a rank), 1.26-1.30 x the ring's time at 16 MiB.
inline constexpr size_t kDirectAllGatherMaxBytes = 512 * 1024;
// Reduce-scatter likewise (directReduceScatter), on 3 ranks up to this many bytes a rank.
// The same machine (08:26, round 1; round 2 ran disturbed): up to 32 KiB of input 0-8 us
// under the ring's time on 3 ranks, 12-18 on 4, mixed or slower from 2 MiB on 4. On 4
// ranks 2 of 5 default runs took 162-190 us at 64 B-32 KiB (08:26, 08:46) where the
// others and the forced form took 66-86, with or without NCCL beside them: on 4 ranks the
// ring stays until that is understood.
inline constexpr size_t kDirectReduceScatterMaxBytes = 64 * 1024;
// Host buffers: the direct all-gather and reduce-scatter on 3 and 4 hosts of one rank each,
// from this many bytes a rank, the ring below. Processes as hosts over loopback TCP on the
// 2-core machine, three interleaved rounds (2026-12-06, docs/perf/host_across_hosts.md): at
// 64 MiB the ring took 1.06-1.27 x direct's time on 3 hosts and 1.22-1.95 x on 4; at 16 MiB
// on 4, 1.19-2.0 x; on 3 at 16 MiB, and below 16 MiB, either could win.
inline constexpr size_t kDirectHostMinBytes = 4 * 1024 * 1024;

struct Step {
  Region src;
  Region dst;
  size_t count = 0;
  int recvPeers[kMaxStepPeers] = {-1, -1, -1};
  int sendPeers[kMaxStepPeers] = {-1, -1, -1};
  int nrecv = 0;
  int nsend = 0;
  bool final = false;  // apply the post-op (the result is complete after this step)
  // src already holds a partial result (this rank's earlier work), so the pre-op is not
  // applied to it again.
  bool srcPartial = false;
  // One message of 0 bytes each way (count is 0): see emptyCall(). No piece of data is
  // ever 0 bytes long, so a peer that expects data and gets this one (or the reverse)
  // reports the mismatch at once.
  bool empty = false;
  // A step of the same phase (its index there) that this one reads the results of: piece p
  // of this step waits until piece p of that one is done (a rank's own data dependency,
  // which connections alone do not order). -1: none.
  int after = -1;
  // Where the source goes among what the step combines: before receive srcAt (the
  // received ones in their order around it; nrecv: after them all). -1: first. A rank
  // that adds every rank's input itself puts its own at its rank, so that every rank adds
  // the same values in the same order and gets the same bits.
  int srcAt = -1;

  Step& recvFrom(int p) {
    recvPeers[nrecv++] = p;
    return *this;
  }
  Step& sendTo(int p) {
    sendPeers[nsend++] = p;
    return *this;
  }
};

using Phase = std::vector<Step>;

enum class CollType : uint8_t {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kAllToAll,
  kSendRecv,  // the p2p calls of a group
};

enum class Algorithm : uint8_t { kRing, kTree, kChain, kOneShot, kDirect, kDoubling, kHier };

const char* collTypeName(CollType type);
const char* algorithmName(Algorithm algo);

struct Schedule {
  bool reduces = false;  // src goes through the pre-op and recv data is reduced
  // The steps of each phase are listed in the order a rank may run them one at a time
  // (the lagged trees' slots): where a phase must be split into sub-phases that run one
  // after another (device/net_plan.h), no step goes before one listed ahead of it.
  bool listedInOrder = false;
  std::vector<Phase> phases;
  // Elements the Input and Output buffers must hold on this rank.
  size_t inputCount = 0;
  size_t outputCount = 0;
};

// Element range of chunk i when `count` is split into n near-equal chunks. With a `unit`
// (chunkUnit) and at least one for each chunk, chunks start at multiples of `unit` and the
// last one takes the tail: the GPU kernels copy and reduce in 16-byte vectors only where
// every address is aligned. A count of at most n pieces, of a piece that is whole units,
// never gives a chunk larger than the piece (the ring and direct forms' FIFOs rely on it).
void chunkRange(size_t count, int n, int i, size_t* offset, size_t* size, size_t unit = 1);

// The unit of chunkRange for chunks of at most `piece` elements: the largest power of two
// up to kChunkAlign that divides the piece. The network executor's pieces are multiples of
// 64 bytes, so for an element of any size the unit is a multiple of 16 bytes.
inline constexpr size_t kChunkAlign = 16;
size_t chunkUnit(size_t piece);

// The schedules. `count` follows the C API: per-rank count for AllGather (sendcount)
// and ReduceScatter (recvcount), per-peer block for AllToAll, total otherwise.
// `piece` is the elements one FIFO slot holds: ring schedules work in blocks whose
// chunks fit one slot each, which keeps a ring of bounded FIFOs from deadlocking.
// Rings follow `ring` (the ranks in ring order, a permutation of 0..n-1, e.g. the
// topology's) or rank order when it is null or not a permutation of n ranks.
Schedule ringAllReduce(int rank, int n, size_t count, size_t piece,
                       const std::vector<int>* ring = nullptr);
// Double binary tree. `lagResults`: the steps that take a block's result down are
// ordered two blocks after its reduction (the roots reduce in one step and send the result
// in another, ordered by Step::after), so that where one tree's reductions and the other's
// results share a connection, a reduction does not wait there for a result. Both executors
// take it: the host executor runs a phase's steps as they become ready, each shared
// connection in phase order; the GPU network plan splits the phase into sub-phases in the
// listed order (Schedule::listedInOrder). Without the lag, each block's result follows its
// reduction, and on a rank inner in one tree and a leaf in the other the second tree's
// reduction waits for the first tree's result (the schedule tests keep that form).
Schedule treeAllReduce(int rank, int n, size_t count, size_t piece, bool lagResults = false);
// The double binary tree of host buffers on hosts of several ranks, as NCCL places its
// trees: a double binary tree across the hosts between their local ranks 0, and inside each
// host a chain through its ranks below local rank 0, in both trees. A host's NICs then
// carry half the buffer for each edge of the two trees across hosts (S on 2 hosts, 1.5S on
// 3, 2S from 4), where the tree over all ranks sends 3S through the busiest host at 4
// hosts of 2 ranks. `lagResults` as for treeAllReduce; lagged, local rank 0 also reduces
// its chain's part and its child hosts' in two steps, so that the next block's chain part
// does not wait behind a step that waits for another host.
struct Hierarchy;
Schedule hostTreeAllReduce(const Hierarchy& h, size_t count, size_t piece, bool lagResults = false);
// Recursive doubling: in round j every rank swaps its partial result with rank ^ 2^j and
// adds the two; log2(n) rounds of one message each, for n a power of two (otherwise the
// ring). Both partners add the same two operands, so results match bitwise on every rank.
Schedule doublingAllReduce(int rank, int n, size_t count, size_t piece);
// Direct reduce-scatter then all-gather, for n - 1 <= kMaxStepPeers (otherwise the
// ring): each rank sends chunk q of its input to rank q, reduces the contributions to
// its own chunk and sends the result to every rank. Two hops a block against the ring's
// 2(n-1), the same bytes, and every rank talks to every other, whatever the pairing.
Schedule directAllReduce(int rank, int n, size_t count, size_t piece);
// Hierarchical, for the rank that `h` is seen from (collectives/hierarchy.h: findHierarchy).
// The buffer is cut in L parts (L ranks per host): a ring reduce-scatter inside the host
// leaves part l, summed over the host, with local rank l; a ring all-reduce across the
// hosts between the ranks of local index l (the rail) completes it, in messages as large as
// the flat ring's; a ring all-gather inside the host hands every part to every local rank.
// The in-host rings move a slice of at most `piece` of every part per step. The post-op
// runs once, in the rail's all-reduce.
struct Hierarchy;
Schedule hierAllReduce(const Hierarchy& h, size_t count, size_t piece);
// Hierarchical all-gather (`count` per rank): a ring all-gather across the hosts on the
// rank's rail puts the blocks of its local index in place, then a ring all-gather inside the
// host (one pass per host) hands each local rank's H blocks to the others. Each host sends
// (H-1)/H of the output through its link where the flat ring sends (n-1)/n.
Schedule hierAllGather(const Hierarchy& h, size_t count, size_t piece);
// Hierarchical reduce-scatter (`count` per rank), the all-gather's mirror: for each host
// d in the rail ring's reduce-scatter order, a ring reduce-scatter inside the host sums
// host d's blocks over this host, and its last step goes straight on as the rail's step
// (adding the previous host's partial sum and passing it on, or writing the result when
// d is this host). Nothing is held between the two rings: the host's partial sums travel
// in the pieces.
Schedule hierReduceScatter(const Hierarchy& h, size_t count, size_t piece);
Schedule ringAllGather(int rank, int n, size_t count, size_t piece,
                       const std::vector<int>* ring = nullptr);
Schedule ringReduceScatter(int rank, int n, size_t count, size_t piece,
                           const std::vector<int>* ring = nullptr);
// Direct reduce-scatter (`count` per rank), for n - 1 <= kMaxStepPeers (otherwise the
// ring): in blocks of at most `piece`, each rank sends block q of its input to rank q and
// reduces the n - 1 contributions to its own block with its input in one step. One hop
// against the ring's n - 1, the same bytes.
Schedule directReduceScatter(int rank, int n, size_t count, size_t piece);
// Recursive halving reduce-scatter (`count` per rank), for n a power of two with log2(n)
// <= kMaxStepPeers (otherwise the ring): in round j a rank passes its partners
// rank ^ (n >> (j + 1)) the half of what it still holds that their side owns. Each block
// travels up a binomial tree to its owner: a rank adds its input to the partial sums it
// received for that block in earlier rounds and sends the sum on (one step a block), and
// the owner adds every round's partial to its input. log2(n) hops against the ring's n - 1,
// the same bytes through each rank; in pieces of at most `piece` a block. (Split by
// connection for the GPU network executor, a piece's steps take n / 2 sub-phases one after
// the other, which puts back hops: 4 against the ring's 3 on 4 ranks.)
Schedule halvingReduceScatter(int rank, int n, size_t count, size_t piece);
// True where halvingReduceScatter and doublingAllGather run their binomial trees: n a
// power of two from 2 with log2(n) <= kMaxStepPeers (elsewhere they are the ring).
bool binomialTreesFit(int n);
// True when `ring` lists each of 0..n-1 exactly once.
bool isRingOrder(const std::vector<int>& ring, int n);
// A pipelined chain from the root along `ring` (as the ring schedules take it: rank order
// where it is null or not a permutation), so that with the topology's ring each host's
// ranks are together in it whatever the placement.
Schedule chainBroadcast(int rank, int n, size_t count, int root,
                        const std::vector<int>* ring = nullptr);
Schedule treeBroadcast(int rank, int n, size_t count, int root);
Schedule treeReduce(int rank, int n, size_t count, int root);
// The chain broadcast reversed: rank root + k adds its input to what root + k + 1 sends
// and passes the sum to root + k - 1, piece by piece; each link carries the buffer once,
// where the tree's inner ranks take in two.
Schedule chainReduce(int rank, int n, size_t count, int root,
                     const std::vector<int>* ring = nullptr);
Schedule directAllToAll(int rank, int n, size_t count);
// The same exchange in phases of at most `peersPerPhase` peers, phase j with the peers at
// distance j * peersPerPhase + 1.. on every rank (send to rank + k, receive from rank - k),
// so every phase pairs up across ranks: fewer steps at once, for executors that give each
// step of a phase resources of its own.
Schedule roundsAllToAll(int rank, int n, size_t count, int peersPerPhase);
// Every rank sends its `count` elements to every other rank at once; block q of the
// output holds rank q's input. The first half of a one-shot all-reduce.
Schedule directAllGather(int rank, int n, size_t count);
// Recursive doubling all-gather (`count` per rank), the mirror of halvingReduceScatter:
// each block goes down a binomial tree from its owner, which sends it to rank ^ 2^j for
// every round j; a rank that receives it in round j writes it to the output and passes it
// to its partners of the later rounds. log2(n) hops against the ring's n - 1 (split by
// connection, as halvingReduceScatter says, more); for n a power of two with log2(n) <=
// kMaxStepPeers (otherwise the ring), in pieces of at most `piece`.
Schedule doublingAllGather(int rank, int n, size_t count, size_t piece);
// A one-shot all-reduce for executors that combine what arrives as it arrives (GPU
// buffers over the network): a step sends the input to every other rank (the pre-op
// applied), then a step receives every other rank's and adds them all in rank order
// (Step::srcAt), so every rank's result has the same bits. At most kMaxStepPeers + 1
// ranks.
Schedule oneShotAllReduce(int rank, int n, size_t count);
// A collective called with a count of 0 moves no data, yet still sends one empty message
// to its ring successor and takes one from its predecessor: a rank whose peers called the
// same collective with another count is then told at once ("rank 2 sent 0 bytes where
// 16384 were expected") instead of waiting for its timeout. It costs one hop.
Schedule emptyCall(int rank, int n, const std::vector<int>* ring = nullptr);

// The binary tree over positions 0..n-1 used by the tree schedules: parent (-1 for the
// root) and children (0-2) of position p. Leaves are the even positions. O(log n).
struct TreeLinks {
  int parent = -1;
  int children[2] = {-1, -1};
  int nchildren = 0;
};
TreeLinks binaryTree(int position, int n);
// Where ranks sit in the trees. The double binary tree of the all-reduce: tree 0 puts rank
// r at position r, tree 1 is tree 0 mirrored (n even) or shifted by one (n odd), so a rank
// that is a leaf in one is inside the other. The tree of broadcast and reduce: positions
// rotated so that `root` sits at the tree's root.
int doubleTreePosition(int tree, int rank, int n);
int doubleTreeRank(int tree, int position, int n);
int rootedTreePosition(int rank, int n, int root);
int rootedTreeRank(int position, int n, int root);

}  // namespace loom::collectives
