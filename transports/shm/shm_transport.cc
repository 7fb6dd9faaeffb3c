// `shm`: ranks of one host exchange data through POSIX shared memory. Each connection
// is one segment holding a FIFO (memory_fifo.h), created by the receiver. The sender
// unlinks the name as soon as it has mapped it, and the receiver unlinks it as soon
// as the sender is attached (or it gives up), so nothing stays in /dev/shm after a
// crash beyond the moment of set-up.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "common/log.h"
#include "common/settings.h"
#include "transports/memory_fifo.h"
#include "transports/transport.h"

namespace loom::transport {
namespace {

struct ShmBlob {
  char name[96];
  uint64_t bytes;
};
static_assert(sizeof(ShmBlob) <= kMaxBlob);

class Mapping {
 public:
  Mapping() = default;
  Mapping(void* p, size_t n) : ptr_(p), bytes_(n) {}
  ~Mapping() {
    if (ptr_) munmap(ptr_, bytes_);
  }
  Mapping(Mapping&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

std::string freeSpaceText() {
  struct statvfs st{};
  if (statvfs("/dev/shm", &st) != 0) return "unknown";
  return std::to_string(static_cast<unsigned long long>(st.f_bavail) * st.f_frsize / (1 << 20)) +
         " MiB";
}

// Dead, or a zombie its parent has not collected yet (kill() still succeeds then).
Status peerAlive(pid_t pid, int rank) {
  if (pid <= 0 || pid == getpid()) return Status::ok();
  bool dead = kill(pid, 0) != 0 && errno == ESRCH;
  if (!dead) {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (FILE* f = std::fopen(path, "r")) {
      int p = 0;
      char comm[256], state = 0;
      if (std::fscanf(f, "%d %255s %c", &p, comm, &state) == 3) dead = state == 'Z' || state == 'X';
      std::fclose(f);
    }
  }
  if (dead) return errorf(Code::kRemoteError, "rank %d (pid %d) has exited", rank, (int)pid);
  return Status::ok();
}

class ShmSend : public SendConnection {
 public:
  ShmSend(Mapping m, const PeerInfo& peer) : map_(std::move(m)), view_(map_.get()), peer_(peer) {}
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
  Status checkPeer() override { return peerAlive(peer_.pid, peer_.rank); }
  void abort() override { view_.setAborted(); }

 private:
  Mapping map_;
  FifoView view_;
  PeerInfo peer_;
  uint64_t sent_ = 0;
};

class ShmRecv : public RecvConnection {
 public:
  ShmRecv(Mapping m, const PeerInfo& peer) : map_(std::move(m)), view_(map_.get()), peer_(peer) {}
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
  Status checkPeer() override { return peerAlive(peer_.pid, peer_.rank); }
  void abort() override { view_.setAborted(); }

 private:
  Mapping map_;
  FifoView view_;
  PeerInfo peer_;
  uint64_t received_ = 0;
};

class ShmSetup : public RecvSetup {
 public:
  ShmSetup(Mapping m, const ShmBlob& b, const PeerInfo& peer) : map_(std::move(m)), peer_(peer) {
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
      if (++spins % 1000 == 0) LOOM_TRY(peerAlive(peer_.pid, peer_.rank));
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    shm_unlink(name_);
    name_[0] = '\0';
    return std::unique_ptr<RecvConnection>(new ShmRecv(std::move(map_), peer_));
  }

 private:
  Mapping map_;
  Blob blob_;
  PeerInfo peer_;
  char name_[96] = {0};
};

class ShmTransport : public Transport {
 public:
  explicit ShmTransport(const TransportContext& ctx) : ctx_(ctx), rng_(std::random_device{}()) {}
  const char* name() const override { return "shm"; }

  Capability canConnect(const PeerInfo& self, const PeerInfo& peer) const override {
    Capability c;
    if (settings::getBool("LOOM_SHM_DISABLE")) {
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
                    sysError(rc, "cannot allocate %llu bytes of shared memory in /dev/shm for the "
                                 "connection from rank %d (%s free); in a container raise its "
                                 "/dev/shm size (docker --shm-size), lower LOOM_BUFFSIZE, or set "
                                 "LOOM_SHM_DISABLE=1",
                             (unsigned long long)b.bytes, peer.rank, freeSpaceText().c_str())
                        .message());
    }
    void* p = mmap(nullptr, b.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
      shm_unlink(b.name);
      return sysError(errno, "mmap of %llu bytes of shared memory", (unsigned long long)b.bytes);
    }
    FifoView::init(p, ctx_.fifo.slotBytes, ctx_.fifo.slots, getpid());
    return std::unique_ptr<RecvSetup>(new ShmSetup(Mapping(p, b.bytes), b, peer));
  }

  Result<std::unique_ptr<SendConnection>> connect(const PeerInfo& peer, const Blob& blob,
                                                  const Deadline&) override {
    if (blob.size != sizeof(ShmBlob)) {
      return errorf(Code::kRemoteError, "rank %d sent a malformed shm connection blob",
                    peer.rank);
    }
    ShmBlob b;
    std::memcpy(&b, blob.data, sizeof(b));
    b.name[sizeof(b.name) - 1] = '\0';
    int fd = shm_open(b.name, O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 && errno == ENOENT) {
      // The receiver made it before it sent us its name, and removes it when it ends.
      return errorf(Code::kRemoteError, "shm: rank %d is gone (its shared-memory segment %s was removed)",
                    peer.rank, b.name);
    }
    if (fd < 0) return sysError(errno, "shm_open(%s) for rank %d", b.name, peer.rank);
    void* p = mmap(nullptr, b.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    shm_unlink(b.name);
    if (p == MAP_FAILED) return sysError(errno, "mmap of shm segment %s", b.name);
    FifoView view(p);
    if (view.header()->magic != kFifoMagic || view.header()->slotBytes != ctx_.fifo.slotBytes) {
      munmap(p, b.bytes);
      return errorf(Code::kInvalidUsage,
                    "rank %d's shm FIFO has a different layout (mismatched LOOM_BUFFSIZE?)",
                    peer.rank);
    }
    view.header()->senderPid = getpid();
    view.header()->senderAttached.store(1, std::memory_order_release);
    return std::unique_ptr<SendConnection>(new ShmSend(Mapping(p, b.bytes), peer));
  }

 private:
  TransportContext ctx_;
  std::mt19937_64 rng_;
};

}  // namespace

std::unique_ptr<Transport> makeShmTransport(const TransportContext& ctx) {
  return std::make_unique<ShmTransport>(ctx);
}

}  // namespace loom::transport
