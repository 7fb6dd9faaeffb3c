// The FIFO between a GPU kernel and the proxy thread: slots, and the counters that hand
// them back and forth. The counters are page-locked host memory that the GPU maps; the
// slots too, or GPU memory where the NIC reaches it (GPUDirect RDMA, gdr.h placeSlots). One
// FIFO per network connection and direction.
//
//   send FIFO: the kernel fills slot `posted % slots`, writes its size, then bumps
//              `posted`; the proxy isends it and, once the backend is done with it,
//              bumps `done` (the slot is free again).
//   recv FIFO: the proxy irecvs into free slots (fewer than `slots` ahead of `done`);
//              when one completes it writes the size, then bumps `posted`; the kernel
//              reads the slot and bumps `done`.
//
// Memory ordering: the producer writes a slot's bytes and its size, then stores `posted`
// with release (the GPU: st.release.sys after its threads' stores, ordered by a block
// barrier; the CPU: a release store); the consumer loads `posted` with acquire before it
// reads the slot. `done` goes the other way with the same pairing. Counters only grow
// (64-bit) and live as long as the connection, so kernels replayed from a CUDA graph go
// on where the last one stopped. `closed` is set by the proxy (once, to a NetClosed
// code) when the connection failed: whoever waits on the FIFO stops waiting.
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom::transport::net {

inline constexpr int kFifoMaxSlots = 16;

enum NetClosed : uint32_t {
  kNetOpen = 0,
  kNetPeerClosed = 1,  // the peer closed or reset the connection
  kNetFailed = 2,      // another network error (the proxy's log and status say which)
  kNetShutdown = 3,    // this side gave up (abort, destroy)
};

struct alignas(128) FifoHeader {
  uint64_t posted;
  uint8_t pad0[120];
  uint64_t done;
  uint8_t pad1[120];
  uint32_t closed;
  uint32_t pad2[31];
  uint64_t sizes[kFifoMaxSlots];
};
static_assert(sizeof(FifoHeader) % 128 == 0);

// One FIFO as both sides address it (unified addressing: the GPU maps the host pointers,
// and `slots` may be a GPU pointer, which the proxy only hands to the backend).
struct Fifo {
  FifoHeader* header = nullptr;
  char* slots = nullptr;  // `nslots` slots of `slotBytes`, back to back
  uint32_t nslots = 0;
  uint64_t slotBytes = 0;
  int peer = -1;

  char* slot(uint64_t seq) const { return slots + (seq % nslots) * slotBytes; }
};

// Bytes one FIFO takes (header, then slots, each slot 4 KiB aligned).
inline size_t fifoBytes(uint32_t nslots, uint64_t slotBytes) {
  return 4096 + size_t(nslots) * size_t((slotBytes + 4095) / 4096 * 4096);
}
// Lays out a FIFO in `memory` (fifoBytes of it, zeroed by the caller).
inline Fifo fifoAt(void* memory, uint32_t nslots, uint64_t slotBytes, int peer) {
  Fifo f;
  f.header = static_cast<FifoHeader*>(memory);
  f.slots = static_cast<char*>(memory) + 4096;
  f.nslots = nslots;
  f.slotBytes = (slotBytes + 4095) / 4096 * 4096;
  f.peer = peer;
  return f;
}

}  // namespace loom::transport::net
