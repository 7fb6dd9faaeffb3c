#include "transports/p2p/post_board.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

namespace loom::transport::p2p {

namespace {

constexpr uint64_t kMagic = 0x6c6f6f6d706f7374ull;  // "loompost"

// Sequentially consistent throughout where the activation's argument needs it (posted,
// pending, epoch); the posts themselves are published with release and read with acquire.
struct Slot {
  std::atomic<uint64_t> seq;  // call number + 1 (0: never written)
  Post post;
};

struct Entry {
  std::atomic<uint64_t> generation;  // 0 while free or being written
  uint64_t base;
  uint64_t bytes;
  unsigned char handle[kHandleBytes];
};

struct alignas(64) RankArea {
  alignas(64) std::atomic<uint64_t> posted;    // calls posted (last call + 1)
  alignas(64) std::atomic<uint64_t> consumed;  // calls whose posts this rank has read
  alignas(64) std::atomic<int32_t> pid;
  Slot slots[kPostRing];
  Entry entries[kExportSlots];
};

static_assert(std::atomic<uint64_t>::is_always_lock_free, "the board needs lock-free atomics");

}  // namespace

struct PostBoard::Layout {
  uint64_t magic;
  uint32_t nranks;
  alignas(64) std::atomic<uint64_t> pending;  // 1 once some rank started the activation
  alignas(64) std::atomic<uint64_t> epoch;    // E (0: not yet)
  RankArea* area(int r) {
    auto* first = reinterpret_cast<char*>(this) + ((sizeof(Layout) + 63) / 64 * 64);
    return reinterpret_cast<RankArea*>(first) + r;
  }
};

size_t PostBoard::bytesFor(int nranks) {
  return (sizeof(Layout) + 63) / 64 * 64 + sizeof(RankArea) * static_cast<size_t>(nranks);
}

PostBoard::PostBoard(void* memory, int rank, int nranks)
    : layout_(static_cast<Layout*>(memory)), rank_(rank), nranks_(nranks) {
  if (rank == 0) {
    layout_->magic = kMagic;
    layout_->nranks = static_cast<uint32_t>(nranks);
  }
  layout_->area(rank)->pid.store(static_cast<int32_t>(getpid()));
}

PostBoard::~PostBoard() {
  if (mappedBytes_) munmap(layout_, mappedBytes_);
}

Result<std::unique_ptr<PostBoard>> PostBoard::createShared(int rank, int nranks,
                                                           const AllGatherFn& allGather) {
  const size_t bytes = bytesFor(nranks);
  struct Name {
    char text[64];
  };
  std::vector<Name> names(nranks);
  std::memset(names.data(), 0, sizeof(Name) * names.size());
  Status made = Status::ok();
  void* mem = MAP_FAILED;
  if (rank == 0) {
    std::snprintf(names[0].text, sizeof(names[0].text), "/loom-posts-%d-%08x", int(getpid()),
                  static_cast<unsigned>(std::random_device{}()));
    int fd = shm_open(names[0].text, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      made = sysError(errno, "shm_open(%s) for the registration post board", names[0].text);
    } else {
      int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
      if (rc != 0) {
        made = sysError(rc, "cannot allocate %zu bytes in /dev/shm for the registration post board",
                        bytes);
      } else {
        mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (mem == MAP_FAILED) {
          made = sysError(errno, "mmap of the registration post board");
        } else {
          static_cast<Layout*>(mem)->magic = kMagic;  // before any peer looks
          static_cast<Layout*>(mem)->nranks = static_cast<uint32_t>(nranks);
        }
      }
      close(fd);
      if (!made) shm_unlink(names[0].text);
    }
    if (!made) names[0].text[0] = '\0';
  }
  Status st = allGather(names.data(), sizeof(Name));
  if (!st) {
    if (mem != MAP_FAILED) munmap(mem, bytes);
    if (rank == 0 && made) shm_unlink(names[0].text);
    return st;
  }
  if (rank != 0) {
    if (names[0].text[0] == '\0') {
      made = errorf(Code::kSystemError, "rank 0 could not create the registration post board");
    } else {
      int fd = shm_open(names[0].text, O_RDWR | O_CLOEXEC, 0600);
      if (fd < 0) {
        made = sysError(errno, "shm_open(%s) (rank 0's registration post board)", names[0].text);
      } else {
        mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (mem == MAP_FAILED) made = sysError(errno, "mmap of rank 0's registration post board");
        close(fd);
      }
    }
  }
  // Every rank mapped it (or says why not): nothing named is left in /dev/shm after this.
  std::vector<int32_t> ok(nranks, 0);
  ok[rank] = made ? 1 : 0;
  st = allGather(ok.data(), sizeof(int32_t));
  if (rank == 0 && names[0].text[0] != '\0') shm_unlink(names[0].text);
  auto unmap = [&] {
    if (mem != MAP_FAILED) munmap(mem, bytes);
  };
  if (!st) {
    unmap();
    return st;
  }
  if (!made) {
    unmap();
    return made;
  }
  for (int r = 0; r < nranks; ++r) {
    if (!ok[r]) {
      unmap();
      return errorf(Code::kSystemError, "rank %d could not map the registration post board", r);
    }
  }
  auto* layout = static_cast<Layout*>(mem);
  if (rank != 0 && (layout->magic != kMagic || layout->nranks != static_cast<uint32_t>(nranks))) {
    unmap();
    return errorf(Code::kInternalError, "the registration post board has an unexpected layout");
  }
  auto board = std::make_unique<PostBoard>(mem, rank, nranks);
  board->mappedBytes_ = bytes;
  return board;
}

uint64_t PostBoard::activeFrom() const {
  return layout_->epoch.load();
}

Status PostBoard::wait(const std::function<bool()>& done, int64_t timeoutMs,
                       const std::function<bool()>& stop, const std::string& what) const {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (uint64_t spin = 0;; ++spin) {
    if (done()) return Status::ok();
    if (spin < 64) continue;
    if ((spin & 63) == 0) {
      if (stop && stop()) {
        return errorf(Code::kInvalidUsage, "rank %d: stopped while waiting for %s (aborted)", rank_,
                      what.c_str());
      }
      if (timeoutMs > 0 && Clock::now() - start > std::chrono::milliseconds(timeoutMs)) {
        return errorf(Code::kRemoteError,
                      "rank %d: waited more than LOOM_TIMEOUT_MS=%lld ms for %s (a peer died, "
                      "or ranks issued different collectives)",
                      rank_, (long long)timeoutMs, what.c_str());
      }
    }
    std::this_thread::yield();
  }
}

Result<bool> PostBoard::exchange(uint64_t seq, const Post& mine, std::vector<Post>* all,
                                 int64_t timeoutMs, const std::function<bool()>& stop) {
  Layout& l = *layout_;
  RankArea& self = *l.area(rank_);
  // Reusing a slot: its old post (call seq - kPostRing) must have been read by every rank,
  // if anyone reads it at all (calls from E on).
  const uint64_t e0 = l.epoch.load();
  if (e0 != 0 && seq >= uint64_t(kPostRing) && seq - kPostRing >= e0) {
    const uint64_t need = seq - kPostRing + 1;
    for (int r = 0; r < nranks_; ++r) {
      RankArea& a = *l.area(r);
      LOOM_TRY(wait([&] { return a.consumed.load(std::memory_order_acquire) >= need; }, timeoutMs,
                    stop,
                    "rank " + std::to_string(r) + " to read call " +
                        std::to_string(seq - kPostRing) + "'s registration posts"));
    }
  }
  Slot& s = self.slots[seq % kPostRing];
  s.post = mine;
  s.seq.store(seq + 1, std::memory_order_release);
  self.posted.store(seq + 1);
  if (!activated_ && want_.load(std::memory_order_relaxed)) {
    activated_ = true;
    if (l.pending.exchange(1) == 0) {
      uint64_t first = 0;
      for (int r = 0; r < nranks_; ++r) first = std::max(first, l.area(r)->posted.load());
      l.epoch.store(first);  // >= seq + 1 > 0: this call still runs unregistered
    }
  }
  if (l.pending.load() == 0) return false;
  uint64_t epoch = 0;
  LOOM_TRY(wait([&] { return (epoch = l.epoch.load()) != 0; }, timeoutMs, stop,
                "the registration post board's activation"));
  activated_ = true;
  if (seq < epoch) return false;
  all->resize(nranks_);
  for (int r = 0; r < nranks_; ++r) {
    if (r == rank_) {
      (*all)[r] = mine;
      continue;
    }
    Slot& p = l.area(r)->slots[seq % kPostRing];
    LOOM_TRY(wait([&] { return p.seq.load(std::memory_order_acquire) == seq + 1; }, timeoutMs, stop,
                  "rank " + std::to_string(r) + " to post call " + std::to_string(seq)));
    (*all)[r] = p.post;
  }
  self.consumed.store(seq + 1, std::memory_order_release);
  return true;
}

int PostBoard::publish(uint64_t base, uint64_t bytes, const unsigned char* handle,
                       uint64_t* generation) {
  RankArea& self = *layout_->area(rank_);
  for (int i = 0; i < kExportSlots; ++i) {
    Entry& e = self.entries[i];
    if (e.generation.load(std::memory_order_relaxed) != 0) continue;
    // Never 0, never the same twice in this process: a peer's post names the one it read.
    static std::atomic<uint64_t> counter{1};
    const uint64_t g = counter.fetch_add(1);
    std::atomic_thread_fence(std::memory_order_release);  // after a retire's store of 0
    e.base = base;
    e.bytes = bytes;
    std::memcpy(e.handle, handle, kHandleBytes);
    e.generation.store(g, std::memory_order_release);
    *generation = g;
    return i;
  }
  return -1;
}

void PostBoard::retire(int entry) {
  if (entry < 0 || entry >= kExportSlots) return;
  layout_->area(rank_)->entries[entry].generation.store(0, std::memory_order_release);
}

bool PostBoard::read(int r, int entry, uint64_t generation, Export* out) const {
  if (r < 0 || r >= nranks_ || entry < 0 || entry >= kExportSlots || generation == 0) return false;
  Entry& e = layout_->area(r)->entries[entry];
  if (e.generation.load(std::memory_order_acquire) != generation) return false;
  out->generation = generation;
  out->base = e.base;
  out->bytes = e.bytes;
  std::memcpy(out->handle, e.handle, kHandleBytes);
  std::atomic_thread_fence(std::memory_order_acquire);
  return e.generation.load(std::memory_order_relaxed) == generation;
}

int PostBoard::pidOf(int r) const {
  if (r < 0 || r >= nranks_) return 0;
  return layout_->area(r)->pid.load();
}

}  // namespace loom::transport::p2p
