// The transport boundary. A transport moves data between two ranks through a FIFO of
// slots owned by the receiving side (as NCCL's "simple" protocol does):
//
//   sender:   slot = trySendSlot(); fill it; postSend(bytes)
//   receiver: data = tryRecv(&bytes); use it; releaseRecv()
//
// Both calls are non-blocking: they return nullptr when nothing is ready, and the
// executor decides how to wait (spin, yield, or poll() on addPollFds()). Every transport
// moves the same slot size (the communicator's chunk), so a piece of a collective
// maps to one slot on every connection it crosses.
//
// Connections are set up in three steps through the bootstrap, so no rank ever waits
// on a peer that is itself waiting:
//   1. receiver: listen(peer) -> RecvSetup with a small blob, sent to the sender;
//   2. sender:   connect(peer, blob) -> SendConnection;
//   3. receiver: setup->accept() -> RecvConnection.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/socket.h"
#include "common/status.h"

namespace loom::transport {

// What every rank publishes about itself at init (fixed layout: it travels through the
// bootstrap between processes of the same build).
struct PeerInfo {
  int rank = -1;
  int cudaDev = -1;         // -1: host memory
  pid_t pid = 0;            // in its own PID namespace: for messages only
  uint64_t process = 0;     // processToken(): equal exactly for ranks of one process
  uint64_t pidNs = 0;       // the inode of its PID namespace: pids compare only where equal
  SocketAddress progress;   // its progress port (comm/progress_report.h); invalid: none
  uint64_t hostHash = 0;    // equal for ranks that share memory (same host id)
  uint64_t shmDevHash = 0;  // identifies /dev/shm's filesystem (containers differ)
  char hostName[64] = {0};
  // The CPUs this rank may run on (sched_getaffinity at init), CPU i in bit i % 64 of
  // word i / 64: with the other ranks' of its host, whether each has a core of its own.
  uint64_t cpuMask[16] = {};
};

// Answer to "can these two ranks connect through you, and how well". The communicator
// chooses among the transports that answer reachable from these reports
// (transports/select.h), not from their order. Bandwidth and latency are what the
// transport knows of its link (0: not known).
struct Capability {
  bool reachable = false;
  bool hostMemory = true;     // moves host buffers directly
  bool deviceMemory = false;  // moves device buffers directly (others stage)
  bool needsProxy = false;    // a thread of the rank's moves its messages (network backends)
  double bandwidthGBs = 0;    // expected one-way bandwidth, GB/s
  double latencyUs = 0;       // expected one-way latency of a small message
  bool network = false;       // every message goes through a network stack (sockets)
  bool fallback = false;      // the transport that always works, for when nothing else does
  std::string reason;         // why not reachable (logged at INFO)
};

// Sizes shared by all connections of a communicator.
struct FifoConfig {
  size_t slotBytes = 512 * 1024;
  int slots = 8;
};

inline constexpr size_t kMaxBlob = 256;
struct Blob {
  uint32_t size = 0;
  unsigned char data[kMaxBlob] = {0};
};

class SendConnection {
 public:
  virtual ~SendConnection() = default;
  // A free slot of slotBytes, or nullptr when the receiver has not freed one yet.
  virtual Result<void*> trySendSlot() = 0;
  // Publishes the slot returned by the last trySendSlot with `bytes` of data.
  virtual Status postSend(size_t bytes) = 0;
  // True when postSendFrom works: the transport copies into the kernel anyway (sockets),
  // so a result that already lies in the caller's memory need not go through a slot.
  virtual bool sendsFromMemory() const { return false; }
  // Like postSend, but the data is `bytes` at `data` instead of the slot returned by the
  // last trySendSlot (which must have returned one). `data` is not referenced after the
  // call returns: what cannot leave at once is copied into that slot.
  virtual Status postSendFrom(const void* data, size_t bytes) {
    return Status(Code::kInternalError, "postSendFrom on a transport without sendsFromMemory");
  }
  // Moves posted data along (TCP writes to its sockets); shm has nothing to do.
  virtual Status progress() { return Status::ok(); }
  // True once every posted slot has left this process (TCP) or been written (shm).
  virtual bool flushed() const { return true; }
  // Appends the descriptors (and events) worth poll()ing while waiting on this
  // connection; none for memory transports, which are spun on.
  virtual void addPollFds(std::vector<pollfd>* fds) const {}
  // True when waiting on this connection can block in poll() (sockets).
  virtual bool pollable() const { return false; }
  // Checks that the peer is still there (cheap enough for every ~100 ms).
  virtual Status checkPeer() { return Status::ok(); }
  // Tells the peer we are giving up, so that it fails instead of waiting.
  virtual void abort() {}
};

class RecvConnection {
 public:
  virtual ~RecvConnection() = default;
  // The next filled slot and its byte count, or nullptr when none has arrived.
  virtual Result<const void*> tryRecv(size_t* bytes) = 0;
  // Hands the slot returned by the last tryRecv back to the sender.
  virtual Status releaseRecv() = 0;
  // True when claimRecv works: the transport copies out of the kernel anyway (sockets), so
  // a slot whose data goes unchanged into the caller's memory can land there directly.
  virtual bool recvsIntoMemory() const { return false; }
  // Asks that the slot `ahead` places after the next one tryRecv returns (0: that one)
  // land at `dst` (at most `bytes`), not in the ring; tryRecv then returns `dst` for it.
  // False when it is too late (its data started arriving) or too far ahead (past the
  // ring): the slot then arrives in the ring as usual. `dst` must stay valid until the
  // slot is released, or until dropClaims.
  virtual bool claimRecv(size_t ahead, void* dst, size_t bytes) { return false; }
  // Forgets every claim not yet released (an operation that failed part-way). A claimed
  // slot whose data had started arriving leaves the connection unusable.
  virtual void dropClaims() {}
  virtual Status progress() { return Status::ok(); }
  virtual void addPollFds(std::vector<pollfd>* fds) const {}
  virtual bool pollable() const { return false; }
  virtual Status checkPeer() { return Status::ok(); }
  virtual void abort() {}
};

class RecvSetup {
 public:
  virtual ~RecvSetup() = default;
  virtual const Blob& blob() const = 0;
  virtual Result<std::unique_ptr<RecvConnection>> accept(const Deadline& deadline) = 0;
};

// One instance per communicator and transport kind.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual Capability canConnect(const PeerInfo& self, const PeerInfo& peer) const = 0;
  virtual Result<std::unique_ptr<RecvSetup>> listen(const PeerInfo& peer,
                                                    const Deadline& deadline) = 0;
  virtual Result<std::unique_ptr<SendConnection>> connect(const PeerInfo& peer, const Blob& blob,
                                                          const Deadline& deadline) = 0;
};

// What the transports get from the communicator.
struct TransportContext {
  PeerInfo self;
  FifoConfig fifo;
  const std::atomic<bool>* abortFlag = nullptr;
  uint64_t commHash = 0;  // distinguishes communicators in names and handshakes
};

std::unique_ptr<Transport> makeSelfTransport(const TransportContext& ctx);
std::unique_ptr<Transport> makeShmTransport(const TransportContext& ctx);
// Fails when no usable interface exists (the message names LOOM_SOCKET_IFNAME).
Result<std::unique_ptr<Transport>> makeTcpTransport(const TransportContext& ctx);
// Host buffers between hosts over the network backend LOOM_NET chooses, where that is not
// sockets (ib); null where it is (the tcp transport serves them then).
Result<std::unique_ptr<Transport>> makeNetTransport(const TransportContext& ctx);

}  // namespace loom::transport
