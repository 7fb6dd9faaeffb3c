// The verbs table: every libibverbs call the ib backend makes goes through one of these
// function pointers, so one binary runs with and without rdma-core, and tests put an
// emulated provider (ib/emulator.h) in place of the real one.
//
// The types are rdma-core's own (<infiniband/verbs.h>, Debian's libibverbs-dev); the
// real table calls libibverbs.so.1 opened with dlopen, and the fast-path calls
// (post_send, post_recv, poll_cq), which rdma-core makes inline through the context's
// ops, go through those ops exactly as the inline functions would.
#pragma once

#include <infiniband/verbs.h>

#include <string>

#include "common/status.h"

namespace loom::transport::net::ib {

struct Verbs {
  const char* provider = "";  // "libibverbs.so.1" or the emulator's name, for messages
  // The emulator with gdr (emulator.h): its NIC reaches GPU memory as peer memory or dma-buf
  // would let it, and has no place on the PCI tree, so it counts as near every GPU.
  bool emulatedGdr = false;

  ibv_device** (*getDeviceList)(int* num) = nullptr;
  void (*freeDeviceList)(ibv_device** list) = nullptr;
  const char* (*getDeviceName)(ibv_device* device) = nullptr;
  ibv_context* (*openDevice)(ibv_device* device) = nullptr;
  int (*closeDevice)(ibv_context* context) = nullptr;
  int (*queryDevice)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  int (*queryPort)(ibv_context* context, uint8_t port, ibv_port_attr* attr) = nullptr;
  // The entry (GID, type, interface) at `index`; an error number (ENODATA: unpopulated).
  int (*queryGidEx)(ibv_context* context, uint32_t port, uint32_t index,
                    ibv_gid_entry* entry) = nullptr;

  ibv_pd* (*allocPd)(ibv_context* context) = nullptr;
  int (*deallocPd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*regMr)(ibv_pd* pd, void* addr, size_t length, int access) = nullptr;
  // Null where the library predates dma-buf (rdma-core < 34) or the provider lacks it.
  ibv_mr* (*regDmabufMr)(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                         int access) = nullptr;
  int (*deregMr)(ibv_mr* mr) = nullptr;

  ibv_cq* (*createCq)(ibv_context* context, int cqe, void* cqContext, ibv_comp_channel* channel,
                      int compVector) = nullptr;
  int (*destroyCq)(ibv_cq* cq) = nullptr;
  ibv_qp* (*createQp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modifyQp)(ibv_qp* qp, ibv_qp_attr* attr, int mask) = nullptr;
  int (*destroyQp)(ibv_qp* qp) = nullptr;

  // As ibv_post_send / ibv_post_recv / ibv_poll_cq: 0 or an error number; poll returns
  // the completions written (>= 0) or a negative number on error.
  int (*postSend)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) = nullptr;
  int (*postRecv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) = nullptr;
  int (*pollCq)(ibv_cq* cq, int n, ibv_wc* wc) = nullptr;

  const char* (*wcStatusStr)(ibv_wc_status status) = nullptr;
};

// libibverbs.so.1 through dlopen; the error says what could not be loaded (the library,
// or a symbol: an rdma-core older than the one loom needs).
Result<const Verbs*> loadVerbs();

// The table the backend uses: the one set for tests (setVerbsForTesting) if any, else
// the emulator when LOOM_IB_EMULATE asks for it, else loadVerbs().
Result<const Verbs*> activeVerbs();

// Replaces the table for this process (tests); nullptr goes back to the default.
void setVerbsForTesting(const Verbs* verbs);

}  // namespace loom::transport::net::ib
