// The FIFO between a GPU kernel and the proxy thread: slots, and the words that hand
// them back and forth. The words are page-locked host memory that the GPU maps; the slots
// too, or GPU memory where the NIC reaches it (GPUDirect RDMA, gdr.h placeSlots). One FIFO
// per network connection and direction. Message `seq` (counting from 0) uses slot
// `seq % nslots`, and its tag is seq modulo 2^32 - 1, plus 1 (fifoTag: never 0).
//
//   head[slot]: tag << 32 | size, written once the message is in the slot. One word, so
//               its reader learns that the message is there and its size in one load (for
//               a GPU, one trip over PCIe).
//   done:       how many messages the consumer is finished with (their slots free again).
//
//   send FIFO: the kernel fills the slot and writes its head; the proxy isends it and,
//              once the backend is done with it, bumps `done`.
//   recv FIFO: the proxy irecvs into free slots (fewer than `slots` ahead of `done`); when
//              one completes it writes the head; the kernel reads the slot and bumps `done`.
//
// Small messages (at most kFifoSmallBytes, where the slots are in host memory: `small`)
// also travel as tagged words, ll[slot][i] = tag << 32 | payload bytes 4i..4i+3, each
// written with one 8-byte store. A reader that sees a word's tag has that word's bytes,
// whatever order the words arrived in, so neither side needs a fence between data and
// flag: the kernel writes a small send's words from shared memory and the proxy reads
// them out into the slot before it isends; the proxy writes a received small message's
// words and the kernel reads them, every thread a few, in one trip over PCIe. The proxy
// clears a slot's words once they are read (a send's before `done` frees the slot, a
// receive's before the slot's next receive), so that a word never outlives its message
// and an old one cannot pass for a new one when the tags come round again.
//
// Memory ordering for the rest: the producer writes a slot's bytes, then stores its head
// with release (the GPU: a system fence after its threads' stores, ordered by a block
// barrier; the CPU: a release store); the consumer loads the head with acquire before it
// reads the slot. `done` goes the other way with the same pairing. `done` only grows
// (64-bit) and lives as long as the connection, so kernels replayed from a CUDA graph go
// on where the last one stopped. `closed` is set by the proxy (once, to a NetClosed code)
// when the connection failed: whoever waits on the FIFO stops waiting.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/host_device.h"

namespace loom::transport::net {

inline constexpr int kFifoMaxSlots = 16;
// The largest message that also travels as tagged words, and the words a slot has for it.
inline constexpr uint32_t kFifoSmallBytes = 1024;
inline constexpr uint32_t kFifoSmallWords = kFifoSmallBytes / 4;

enum NetClosed : uint32_t {
  kNetOpen = 0,
  kNetPeerClosed = 1,  // the peer closed or reset the connection
  kNetFailed = 2,      // another network error (the proxy's log and status say which)
  kNetShutdown = 3,    // this side gave up (abort, destroy)
};

struct alignas(128) FifoHeader {
  uint64_t done;
  uint8_t pad0[120];
  uint32_t closed;
  uint32_t pad1[31];
  uint64_t head[kFifoMaxSlots];
  uint64_t ll[kFifoMaxSlots][kFifoSmallWords];
};
static_assert(sizeof(FifoHeader) % 128 == 0);
// The bytes a FIFO's header takes (its slots start there, each 4 KiB aligned).
inline constexpr size_t kFifoHeaderBytes = (sizeof(FifoHeader) + 4095) / 4096 * 4096;

// 1 to 2^32 - 1, never 0 (the value of memory nobody wrote).
LOOM_HOST_DEVICE inline uint32_t fifoTag(uint64_t seq) {
  return static_cast<uint32_t>(seq % 0xffffffffull) + 1;
}
LOOM_HOST_DEVICE inline uint64_t fifoHead(uint64_t seq, uint64_t size) {
  return uint64_t{fifoTag(seq)} << 32 | (size & 0xffffffffu);
}
// Whether `head` is message seq's head (else the slot's earlier message's, or nothing).
LOOM_HOST_DEVICE inline bool fifoHeadIs(uint64_t head, uint64_t seq) {
  return static_cast<uint32_t>(head >> 32) == fifoTag(seq);
}
LOOM_HOST_DEVICE inline uint64_t fifoHeadSize(uint64_t head) {
  return head & 0xffffffffu;
}
LOOM_HOST_DEVICE inline uint64_t fifoWord(uint64_t seq, uint32_t payload) {
  return uint64_t{fifoTag(seq)} << 32 | payload;
}
LOOM_HOST_DEVICE inline uint32_t fifoWords(uint64_t bytes) {
  return static_cast<uint32_t>((bytes + 3) / 4);
}

// One FIFO as both sides address it (unified addressing: the GPU maps the host pointers,
// and `slots` may be a GPU pointer, which the proxy only hands to the backend).
struct Fifo {
  FifoHeader* header = nullptr;
  char* slots = nullptr;  // `nslots` slots of `slotBytes`, back to back
  uint32_t nslots = 0;
  uint64_t slotBytes = 0;
  int peer = -1;
  bool small = false;  // messages up to kFifoSmallBytes also travel as tagged words

  char* slot(uint64_t seq) const { return slots + (seq % nslots) * slotBytes; }
  // Whether a message of `bytes` travels as tagged words.
  LOOM_HOST_DEVICE bool isSmall(uint64_t bytes) const { return small && bytes <= kFifoSmallBytes; }
};

// Bytes one FIFO takes (header, then slots, each slot 4 KiB aligned). Slots hold less
// than 4 GiB (a head's size has 32 bits).
inline size_t fifoBytes(uint32_t nslots, uint64_t slotBytes) {
  return kFifoHeaderBytes + size_t(nslots) * size_t((slotBytes + 4095) / 4096 * 4096);
}
// Lays out a FIFO in `memory` (fifoBytes of it, zeroed by the caller), its slots there too
// (and so small messages as tagged words: `small`).
inline Fifo fifoAt(void* memory, uint32_t nslots, uint64_t slotBytes, int peer) {
  Fifo f;
  f.header = static_cast<FifoHeader*>(memory);
  f.slots = static_cast<char*>(memory) + kFifoHeaderBytes;
  f.small = true;
  f.nslots = nslots;
  f.slotBytes = (slotBytes + 4095) / 4096 * 4096;
  f.peer = peer;
  return f;
}

}  // namespace loom::transport::net
