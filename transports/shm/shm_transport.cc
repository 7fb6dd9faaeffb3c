// `shm`: ranks of one host exchange data through POSIX shared memory. Each connection
// is one segment holding a FIFO (memory_fifo.h), created by the receiver. The sender
// unlinks the name as soon as it has mapped it, and the receiver unlinks it as soon
// as the sender is attached (or it gives up), so nothing stays in /dev/shm after a
// crash beyond the moment of set-up.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <random>
#include <thread>

#include "common/log.h"
#include "common/settings.h"
#include "transports/memory_fifo.h"
#include "transports/shm/orphans.h"
#include "transports/transport.h"

namespace loom::transport {
namespace {

struct ShmBlob {
  char name[96];
  uint64_t bytes;
};
static_assert(sizeof(ShmBlob) <= kMaxBlob);

// A segment's mapping, and the descriptor this side keeps open while it lives: each side
// holds a POSIX record lock on one byte of the segment's file (kReceiverByte or
// kSenderByte), and the kernel drops it when the process ends, however it ends. Another
// process asks the lock whether its peer is still there: that works between PID
// namespaces (containers of one pod share /dev/shm but cannot see each other's pids),
// and a child forked later does not inherit the lock.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* p, size_t n, int fd) : ptr_(p), bytes_(n), fd_(fd) {}
  ~Mapping() {
    if (ptr_) munmap(ptr_, bytes_);
    if (fd_ >= 0) close(fd_);
  }
  Mapping(Mapping&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_), fd_(o.fd_) {
    o.ptr_ = nullptr;
    o.fd_ = -1;
  }
  void* get() const { return ptr_; }
  int fd() const { return fd_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
};

constexpr off_t kReceiverByte = 0;
constexpr off_t kSenderByte = 1;

// Takes this process's lock on `byte` of the segment; false where locks do not work
// there (liveness then falls back to the pid, where the pid can be seen).
bool holdPresence(int fd, off_t byte) {
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  l.l_start = byte;
  l.l_len = 1;
  return fcntl(fd, F_SETLK, &l) == 0;
}

enum class Presence { kThere, kGone, kUnknown };

Presence presenceOf(int fd, off_t byte) {
  if (fd < 0) return Presence::kUnknown;
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  l.l_start = byte;
  l.l_len = 1;
  if (fcntl(fd, F_GETLK, &l) != 0) return Presence::kUnknown;
  return l.l_type == F_UNLCK ? Presence::kGone : Presence::kThere;
}

std::string freeSpaceText() {
  struct statvfs st {};
  if (statvfs("/dev/shm", &st) != 0) return "unknown";
  return std::to_string(static_cast<unsigned long long>(st.f_bavail) * st.f_frsize / (1 << 20)) +
         " MiB";
}

// Whether the process of `peer` still runs. Ranks of this same process are alive by
// definition (and a record lock never conflicts with its own process). Otherwise the
// peer's lock on `byte` of the segment says it (`fd` -1: no segment yet); the pid is
// asked only where the lock could not answer and the peer is in this PID namespace.
// Dead includes a zombie its parent has not collected yet (its files, and so its lock,
// are gone; kill() still succeeds).
Status peerAlive(const PeerInfo& self, const PeerInfo& peer, int fd, off_t byte) {
  if (peer.process == self.process) return Status::ok();
  const Presence p = presenceOf(fd, byte);
  if (p == Presence::kThere) return Status::ok();
  bool dead = p == Presence::kGone;
  if (!dead && peer.pidNs != 0 && peer.pidNs == self.pidNs && peer.pid > 0) {
    dead = kill(peer.pid, 0) != 0 && errno == ESRCH;
    if (!dead) {
      char path[64];
      std::snprintf(path, sizeof(path), "/proc/%d/stat", (int)peer.pid);
      if (FILE* f = std::fopen(path, "r")) {
        int pid = 0;
        char comm[256], state = 0;
        if (std::fscanf(f, "%d %255s %c", &pid, comm, &state) == 3)
          dead = state == 'Z' || state == 'X';
        std::fclose(f);
      }
    }
  }
  if (dead)
    return errorf(Code::kRemoteError, "rank %d (pid %d) has exited", peer.rank, (int)peer.pid);
  return Status::ok();
}

class ShmSend : public SendConnection {
 public:
  ShmSend(Mapping m, const PeerInfo& self, const PeerInfo& peer)
      : map_(std::move(m)), view_(map_.get()), self_(self), peer_(peer) {}
  ~ShmSend() override = default;
  Result<void*> trySendSlot() override {
    if (view_.aborted()) {
      return errorf(Code::kRemoteError, "rank %d gave up on the shared-memory connection",
                    peer_.rank);
    }
    return view_.trySendSlot(sent_);
  }
  Status postSend(size_t bytes) override {
    view_.post(sent_++, bytes);
    return Status::ok();
  }
  Status checkPeer() override { return peerAlive(self_, peer_, map_.fd(), kReceiverByte); }
  void abort() override { view_.setAborted(); }

 private:
  Mapping map_;
  FifoView view_;
  PeerInfo self_, peer_;
  uint64_t sent_ = 0;
};

class ShmRecv : public RecvConnection {
 public:
  ShmRecv(Mapping m, const PeerInfo& self, const PeerInfo& peer)
      : map_(std::move(m)), view_(map_.get()), self_(self), peer_(peer) {}
  Result<const void*> tryRecv(size_t* bytes) override {
    const void* p = view_.tryRecv(received_, bytes);
    if (!p && view_.aborted()) {
      return errorf(Code::kRemoteError, "rank %d gave up on the shared-memory connection",
                    peer_.rank);
    }
    return p;
  }
  Status releaseRecv() override {
    view_.release(received_++);
    return Status::ok();
  }
  Status checkPeer() override { return peerAlive(self_, peer_, map_.fd(), kSenderByte); }
  void abort() override { view_.setAborted(); }

 private:
  Mapping map_;
  FifoView view_;
  PeerInfo self_, peer_;
  uint64_t received_ = 0;
};

class ShmSetup : public RecvSetup {
 public:
  ShmSetup(Mapping m, const ShmBlob& b, const PeerInfo& self, const PeerInfo& peer)
      : map_(std::move(m)), self_(self), peer_(peer) {
    blob_.size = sizeof(ShmBlob);
    std::memcpy(blob_.data, &b, sizeof(b));
    std::memcpy(name_, b.name, sizeof(name_));
  }
  ~ShmSetup() override {
    if (name_[0]) shm_unlink(name_);
  }
  const Blob& blob() const override { return blob_; }
  Result<std::unique_ptr<RecvConnection>> accept(const Deadline& deadline) override {
    FifoView view(map_.get());
    int spins = 0;
    while (view.header()->senderAttached.load(std::memory_order_acquire) == 0) {
      if (deadline.aborted()) return errorf(Code::kSystemError, "shm set-up aborted");
      if (deadline.expired()) {
        return errorf(Code::kRemoteError,
                      "rank %d did not attach to shared memory segment %s within %lld ms",
                      peer_.rank, name_, (long long)deadline.totalMs());
      }
      // Before it attaches the sender holds no lock: only its pid can say (-1).
      if (++spins % 1000 == 0) LOOM_TRY(peerAlive(self_, peer_, -1, kSenderByte));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    shm_unlink(name_);
    name_[0] = '\0';
    return std::unique_ptr<RecvConnection>(new ShmRecv(std::move(map_), self_, peer_));
  }

 private:
  Mapping map_;
  Blob blob_;
  PeerInfo self_, peer_;
  char name_[96] = {0};
};

// A connection segment's name: "loom-" and 16 hex digits (the communicator), then '-'.
bool isSegmentName(const char* name) {
  if (std::strncmp(name, "loom-", 5) != 0) return false;
  for (int i = 5; i < 21; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  return name[21] == '-';
}

class ShmTransport : public Transport {
 public:
  explicit ShmTransport(const TransportContext& ctx) : ctx_(ctx), rng_(std::random_device{}()) {
    // Set-up takes well under a minute; an unlocked segment older than that is an orphan.
    static std::once_flag swept;
    std::call_once(swept, [] {
      const size_t n = removeOrphanSegments("/dev/shm", 60);
      if (n > 0)
        LOOM_INFO(kInit,
                  "shm: removed %zu shared-memory segment(s) left in /dev/shm by ranks that died",
                  n);
    });
  }
  const char* name() const override { return "shm"; }

  Capability canConnect(const PeerInfo& self, const PeerInfo& peer) const override {
    Capability c;
    if (settings::get(settings::kShmDisable)) {
      c.reason = "disabled by LOOM_SHM_DISABLE/NCCL_SHM_DISABLE";
    } else if (self.hostHash != peer.hostHash) {
      c.reason = "different hosts";
    } else if (self.shmDevHash != peer.shmDevHash) {
      c.reason = "/dev/shm differs (separate containers)";
    } else {
      c.reachable = true;
      c.bandwidthGBs = 10;
      c.latencyUs = 1;
    }
    return c;
  }

  Result<std::unique_ptr<RecvSetup>> listen(const PeerInfo& peer, const Deadline&) override {
    ShmBlob b{};
    b.bytes = fifoBytes(ctx_.fifo.slotBytes, ctx_.fifo.slots);
    std::snprintf(b.name, sizeof(b.name), "/loom-%016llx-%d-%d-%08x",
                  (unsigned long long)ctx_.commHash, peer.rank, ctx_.self.rank,
                  static_cast<unsigned>(rng_()));
    int fd = shm_open(b.name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) return sysError(errno, "shm_open(%s)", b.name);
    int rc = posix_fallocate(fd, 0, static_cast<off_t>(b.bytes));
    if (rc != 0) {
      close(fd);
      shm_unlink(b.name);
      return Status(Code::kSystemError,
                    sysError(rc,
                             "cannot allocate %llu bytes of shared memory in /dev/shm for the "
                             "connection from rank %d (%s free); in a container raise its "
                             "/dev/shm size (docker --shm-size), lower LOOM_BUFFSIZE, or set "
                             "LOOM_SHM_DISABLE=1",
                             (unsigned long long)b.bytes, peer.rank, freeSpaceText().c_str())
                        .message());
    }
    void* p = mmap(nullptr, b.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      close(fd);
      shm_unlink(b.name);
      return sysError(e, "mmap of %llu bytes of shared memory", (unsigned long long)b.bytes);
    }
    if (!holdPresence(fd, kReceiverByte)) {
      LOOM_INFO(kInit,
                "shm: no record lock on %s (%s): rank %d learns that this rank died only "
                "from its pid",
                b.name, std::strerror(errno), peer.rank);
    }
    FifoView::init(p, ctx_.fifo.slotBytes, ctx_.fifo.slots, getpid());
    return std::unique_ptr<RecvSetup>(new ShmSetup(Mapping(p, b.bytes, fd), b, ctx_.self, peer));
  }

  Result<std::unique_ptr<SendConnection>> connect(const PeerInfo& peer, const Blob& blob,
                                                  const Deadline&) override {
    if (blob.size != sizeof(ShmBlob)) {
      return errorf(Code::kRemoteError, "rank %d sent a malformed shm connection blob", peer.rank);
    }
    ShmBlob b;
    std::memcpy(&b, blob.data, sizeof(b));
    b.name[sizeof(b.name) - 1] = '\0';
    int fd = shm_open(b.name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno == ENOENT) {
      // The receiver made it before it sent us its name, and removes it when it ends.
      return errorf(Code::kRemoteError,
                    "shm: rank %d is gone (its shared-memory segment %s was removed)", peer.rank,
                    b.name);
    }
    if (fd < 0) return sysError(errno, "shm_open(%s) for rank %d", b.name, peer.rank);
    void* p = mmap(nullptr, b.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int e = errno;
    shm_unlink(b.name);
    if (p == MAP_FAILED) {
      close(fd);
      return sysError(e, "mmap of shm segment %s", b.name);
    }
    Mapping m(p, b.bytes, fd);
    FifoView view(p);
    if (view.header()->magic != kFifoMagic || view.header()->slotBytes != ctx_.fifo.slotBytes) {
      return errorf(Code::kInvalidUsage,
                    "rank %d's shm FIFO has a different layout (mismatched LOOM_BUFFSIZE?)",
                    peer.rank);
    }
    // The lock first: once attached, the receiver may ask it at any moment.
    if (!holdPresence(fd, kSenderByte)) {
      LOOM_INFO(kInit,
                "shm: no record lock on %s (%s): rank %d learns that this rank died only "
                "from its pid",
                b.name, std::strerror(errno), peer.rank);
    }
    view.header()->senderPid = getpid();
    view.header()->senderAttached.store(1, std::memory_order_release);
    return std::unique_ptr<SendConnection>(new ShmSend(std::move(m), ctx_.self, peer));
  }

 private:
  TransportContext ctx_;
  std::mt19937_64 rng_;
};

}  // namespace

size_t removeOrphanSegments(const std::string& dir, int minAgeSeconds) {
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  size_t removed = 0;
  const time_t now = std::time(nullptr);
  while (dirent* e = readdir(d)) {
    if (!isSegmentName(e->d_name)) continue;
    const std::string path = dir + "/" + e->d_name;
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;  // another user's, or gone meanwhile
    struct stat st {};
    // Its creator's lock, or a creator too young to have taken it yet, keeps it.
    if (fstat(fd, &st) == 0 && now - st.st_mtime >= minAgeSeconds &&
        presenceOf(fd, kReceiverByte) == Presence::kGone) {
      if (unlink(path.c_str()) == 0) ++removed;
    }
    close(fd);
  }
  closedir(d);
  return removed;
}

std::unique_ptr<Transport> makeShmTransport(const TransportContext& ctx) {
  return std::make_unique<ShmTransport>(ctx);
}

}  // namespace loom::transport
