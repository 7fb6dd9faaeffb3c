// transports/p2p: the post board. A block of host shared memory that the ranks of one
// host share, through which each rank tells the others, call by call, whether they may
// read that call's input where it lies (memory the rank registered with
// ncclCommRegister), and which allocations it exported for that (CUDA IPC handles, kept
// here as opaque bytes: this file needs no CUDA).
//
// Posting costs nothing while no rank has registered memory: each rank writes its post
// for a call into a ring and goes on, and nobody reads. The first rank that wants its
// posts read activates the board: it picks a call number E, the first call that no rank
// has posted yet, and from E on every rank reads every rank's post for each call before
// it decides how to run it, so all ranks decide alike. Before E nobody reads, and every
// call takes the form that needs no registration.
//
// Why E is safe: a rank posts a call, then looks for a pending activation; the activator
// marks the activation pending, then reads every rank's count of posted calls. With
// sequentially consistent atomics one of the two sees the other: either the rank sees the
// activation pending (and waits for E before it decides), or the activator saw the call
// posted (and E lies beyond it). A ring slot is written again only once every rank has
// read the post in it, where that post counts (at or after E).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::transport::p2p {

inline constexpr int kPostRing = 256;  // posts per rank kept in the ring
// Allocations a rank can export at once (PyTorch's allocator hook registers every segment
// of its cache; 22 KiB of the board per rank).
inline constexpr int kExportSlots = 256;
inline constexpr size_t kHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

// What a rank says about one call.
struct Post {
  uint64_t signature = 0;   // what the call is (type, count, ...): every rank's must match
  uint32_t readable = 0;    // nonzero: the peers may read this call's input at entry + offset
                            // (the caller says how, e.g. 2: the input is the output)
  uint32_t entry = 0;       // index in the rank's export table
  uint64_t generation = 0;  // the entry's generation when posted
  uint64_t offset = 0;      // bytes from the exported allocation's base to the input
  uint32_t writable = 0;    // 1: the peers may write this call's output at outEntry + outOffset
  uint32_t outEntry = 0;    // the same three for the output
  uint64_t outGeneration = 0;
  uint64_t outOffset = 0;
};

// One allocation a rank exported: its IPC handle, base address (in the exporter) and size.
struct Export {
  uint64_t generation = 0;
  uint64_t base = 0;
  uint64_t bytes = 0;
  unsigned char handle[kHandleBytes] = {};
};

class PostBoard {
 public:
  // Bytes of shared memory a board for `nranks` ranks takes.
  static size_t bytesFor(int nranks);

  // Collective over `allGather` (every rank of the host's communicator calls it): rank 0
  // creates the shared memory, the others map it, and it is unlinked once all have.
  using AllGatherFn = std::function<Status(void* data, size_t size)>;
  static Result<std::unique_ptr<PostBoard>> createShared(int rank, int nranks,
                                                         const AllGatherFn& allGather);

  // A board over memory the caller provides (zeroed, bytesFor(nranks) bytes, shared by
  // every rank's board), for tests with threads as ranks. Not owned.
  PostBoard(void* memory, int rank, int nranks);
  ~PostBoard();
  PostBoard(const PostBoard&) = delete;
  PostBoard& operator=(const PostBoard&) = delete;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }

  // This rank has memory its peers should read: its next exchange activates the board.
  // (Any thread; exchange() runs on the thread that issues the calls.)
  void want() { want_.store(true, std::memory_order_relaxed); }

  // For call `seq` (0, 1, 2, ...: every rank calls this for the same calls, in order):
  // posts `mine`, then returns false when posts are not read for this call (the board is
  // not active, or became active after it), or true with every rank's post in `all`
  // (all[rank] == mine). Waits for the peers to post this call (and, rarely, to read an
  // old one whose slot this call reuses) at most `timeoutMs` (<= 0: no limit); `stop`
  // (optional) ends a wait early when it returns true (an abort).
  Result<bool> exchange(uint64_t seq, const Post& mine, std::vector<Post>* all, int64_t timeoutMs,
                        const std::function<bool()>& stop = {});

  // The call from which posts are read (0: not active yet).
  uint64_t activeFrom() const;

  // This rank's export table. publish() fills a free entry (a new generation) and returns
  // its index, or -1 when all kExportSlots are in use; retire() frees one.
  int publish(uint64_t base, uint64_t bytes, const unsigned char* handle, uint64_t* generation);
  void retire(int entry);
  // Rank `r`'s entry `entry` as it was at `generation`; false when it changed since.
  bool read(int r, int entry, uint64_t generation, Export* out) const;
  // The process id rank `r` gave when it mapped the board (0 before).
  int pidOf(int r) const;

 private:
  struct Layout;
  Status wait(const std::function<bool()>& done, int64_t timeoutMs,
              const std::function<bool()>& stop, const std::string& what) const;

  Layout* layout_ = nullptr;
  size_t mappedBytes_ = 0;  // non-zero when createShared mapped it (unmapped at the end)
  int rank_ = 0;
  int nranks_ = 0;
  std::atomic<bool> want_{false};
  bool activated_ = false;  // this rank ran the activation (or saw it done)
};

}  // namespace loom::transport::p2p
