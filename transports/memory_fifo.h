// A single-producer single-consumer FIFO of slots laid out in one block of memory that
// both sides can see (a POSIX shared-memory segment, or plain memory for `self`).
//
// Memory ordering: the sender writes a slot's bytes and its size, then stores `tail`
// with release; the receiver loads `tail` with acquire before reading the slot. The
// receiver stores `head` with release after it is done reading; the sender loads it
// with acquire before overwriting. Counters only grow (64-bit, never wrap in practice).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace loom::transport {

inline constexpr int kMaxSlots = 64;
inline constexpr uint32_t kFifoMagic = 0x4c4f4f4d;  // "LOOM"

struct alignas(64) FifoHeader {
  uint32_t magic;
  uint32_t slots;
  uint64_t slotBytes;
  alignas(64) std::atomic<uint64_t> tail;  // slots posted by the sender
  alignas(64) std::atomic<uint64_t> head;  // slots released by the receiver
  alignas(64) std::atomic<uint32_t> senderAttached;
  std::atomic<uint32_t> aborted;  // set by either side when it gives up
  int32_t senderPid;
  int32_t receiverPid;
  uint64_t sizes[kMaxSlots];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

inline size_t fifoBytes(size_t slotBytes, int slots) {
  return sizeof(FifoHeader) + slotBytes * static_cast<size_t>(slots);
}

// Views over a FIFO block; neither owns the memory.
class FifoView {
 public:
  FifoView() = default;
  explicit FifoView(void* base) : header_(static_cast<FifoHeader*>(base)) {}

  static void init(void* base, size_t slotBytes, int slots, int32_t receiverPid) {
    auto* h = new (base) FifoHeader();
    h->magic = kFifoMagic;
    h->slots = static_cast<uint32_t>(slots);
    h->slotBytes = slotBytes;
    h->tail.store(0, std::memory_order_relaxed);
    h->head.store(0, std::memory_order_relaxed);
    h->senderAttached.store(0, std::memory_order_relaxed);
    h->aborted.store(0, std::memory_order_relaxed);
    h->receiverPid = receiverPid;
    h->senderPid = 0;
    std::atomic_thread_fence(std::memory_order_release);
  }

  FifoHeader* header() const { return header_; }
  char* slot(uint64_t index) const {
    return reinterpret_cast<char*>(header_ + 1) + (index % header_->slots) * header_->slotBytes;
  }

  // Sender side.
  void* trySendSlot(uint64_t sent) const {
    uint64_t head = header_->head.load(std::memory_order_acquire);
    if (sent - head >= header_->slots) return nullptr;
    return slot(sent);
  }
  void post(uint64_t sent, size_t bytes) const {
    header_->sizes[sent % header_->slots] = bytes;
    header_->tail.store(sent + 1, std::memory_order_release);
  }

  // Receiver side.
  const void* tryRecv(uint64_t received, size_t* bytes) const {
    uint64_t tail = header_->tail.load(std::memory_order_acquire);
    if (tail <= received) return nullptr;
    *bytes = header_->sizes[received % header_->slots];
    return slot(received);
  }
  void release(uint64_t received) const {
    header_->head.store(received + 1, std::memory_order_release);
  }

  bool aborted() const { return header_->aborted.load(std::memory_order_acquire) != 0; }
  void setAborted() const { header_->aborted.store(1, std::memory_order_release); }

 private:
  FifoHeader* header_ = nullptr;
};

}  // namespace loom::transport
