// An emulation of RDMA devices behind the verbs table (verbs.h), so the ib backend and its
// tests run on machines without an RDMA NIC. It is an emulation, named so in every message:
// it moves host memory through Unix datagram sockets, one per queue pair, and with `gdr`
// GPU memory too, through CUDA copies in place of a NIC's DMA.
//
// What it emulates, with the semantics of reliable-connected (RC) queue pairs:
//   - devices "loomemu0", "loomemu1", ... with one port (port 1), RoCE or InfiniBand; the
//     port's GIDs (RoCE) or LID (InfiniBand) derive from the host: LOOM_HOST_ID if set, else
//     the host name, plus the host's IPv4 addresses for RoCE's IPv4-mapped GIDs;
//   - protection domains, memory registrations (lkey/rkey checked on every access), CQs;
//   - RC queue pairs with the real state machine (RESET, INIT, RTR, RTS, ERR) and
//     attribute masks, RDMA WRITE, WRITE_WITH_IMM, SEND (and SEND_WITH_IMM), inline data,
//     signaled and unsignaled completions in posting order, receiver-not-ready NAKs with
//     rnr_retry, transport timeouts with retry_cnt (a dead peer ends in "transport retry
//     counter exceeded"), remote access errors, and flushing on error.
//   - with `gdr` (LOOM_IB_EMULATE=roce,gdr): GPUDirect RDMA, a NIC that reads and writes GPU
//     memory, registered through dma-buf (regDmabufMr: the descriptor must be open, the
//     iova a GPU address of this process) or as nvidia_peermem would take it (regMr on a GPU
//     address); the NIC thread copies with CUDA on a stream of its own. Without `gdr`,
//     regDmabufMr fails with EOPNOTSUPP and regMr of GPU memory with EFAULT, as on a host
//     without peer memory.
// What it does not emulate: RDMA READ and atomics (post_send returns EINVAL), shared
// receive queues, UD/UC/XRC queue pairs, completion channels and async events, memory
// windows; nor a PCIe fabric: with `gdr` the ib backend takes the NIC as near every GPU.
//
// Each opened context runs one thread, the emulated NIC: it transmits posted work requests,
// answers as responder, and writes completions. Processes share nothing but a directory of
// sockets, so the emulation works between threads of one process, between processes, and
// between network namespaces standing in for hosts.
#pragma once

#include <string>

#include "common/status.h"
#include "transports/net/ib/verbs.h"

namespace loom::transport::net::ib {

// The most devices one emulation has.
inline constexpr int kMaxEmulatedDevices = 16;

struct EmulatorConfig {
  bool infiniband = false;  // link layer: false RoCE (Ethernet), true InfiniBand
  int devices = 1;          // emulated devices "loomemu0", "loomemu1", ... one port each (port 1)
  std::string dir;   // where the QPs' Unix sockets live; "" = ${TMPDIR:-/tmp}/loom-ibemu-<uid>
  bool gdr = false;  // the NIC reaches GPU memory (GPUDirect RDMA through CUDA copies)

  bool operator==(const EmulatorConfig&) const = default;
};

// Parses LOOM_IB_EMULATE's syntax: "roce", "roce:N", "ib", "ib:N" (N devices, 1 to
// kMaxEmulatedDevices), each optionally followed by ",gdr"; an error (Code::kInvalidUsage)
// naming the value otherwise.
Result<EmulatorConfig> parseEmulatorSpec(const std::string& spec);

// The emulator's verbs table for `config`. The table lives for the process; calling again
// with an equal config returns the same table. Null when config.devices is outside 1 to
// kMaxEmulatedDevices, or when the process already made 64 tables of distinct configs.
// Thread-safe. The table's functions follow libibverbs: pointers or null with errno set,
// or an error number; every function may be called from any thread, and the queue-pair
// and completion-queue calls are safe to make concurrently (each object has its mutex).
// A process that forks should do so before opening a device (as with libibverbs).
const Verbs* emulatedVerbs(const EmulatorConfig& config);

}  // namespace loom::transport::net::ib
