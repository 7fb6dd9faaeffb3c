// What loom needs to know about CUDA outside its GPU code paths: whether a pointer is
// device memory, a device's PCI bus id, and peer access between two devices. libcuda
// is loaded with dlopen, so binaries run with or without it. All functions are
// thread-safe; the first call loads the driver and calls cuInit.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace loom::cuda {

// True when the CUDA driver is present, initialises, and reports `ptr` as device
// (non-managed) memory. False on machines without CUDA and for host pointers.
bool isDevicePointer(const void* ptr);

// True when `ptr` lies in memory from cudaMalloc (the driver calls it legacy-IPC
// capable): the kind that cudaDeviceEnablePeerAccess maps into peer devices. False for
// stream-ordered pools (cudaMallocAsync), cuMem/VMM allocations, host memory, and
// without a driver.
bool isPeerMappableDevicePointer(const void* ptr);

// The allocation a device pointer lies in: where it starts, its size, and the driver's
// process-wide id for it (a new allocation at the same address gets a new id).
struct Allocation {
  uintptr_t base = 0;
  size_t bytes = 0;
  uint64_t bufferId = 0;
  bool legacyIpc = false;  // cudaMalloc memory, which cudaIpcGetMemHandle exports
};
// False for host memory, managed memory and without a driver.
bool allocationOf(const void* ptr, Allocation* out);
// Allocation::bufferId alone (one driver call, for every call that checks it): 0 for
// host memory and without a driver.
uint64_t bufferIdOf(const void* ptr);

// Enqueues on `stream` (a cudaStream_t) a write of `value` to the 8 bytes at `addr` (device
// memory this process maps), after the stream's earlier work and with a memory fence
// before it (cuStreamWriteValue64). Returns the driver's error code, -1 without a driver.
int streamWriteValue64(void* stream, void* addr, uint64_t value);

// The PCI bus id the CUDA driver reports for device `ordinal` ("0000:19:00.0"), or ""
// without a driver or such a device.
std::string deviceBusId(int ordinal);

// Number of CUDA devices this process sees (after CUDA_VISIBLE_DEVICES). kSystemError
// when libcuda.so.1 is missing or cuInit fails; the message says which.
Result<int> deviceCount();

// What the CUDA driver says of device `ordinal` and GPUDirect RDMA.
struct GpuRdmaSupport {
  bool rdma = false;     // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
  bool dmaBuf = false;   // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
  int computeMajor = 0;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
  // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING: 0 the device does not order a NIC's
  // writes for its own consumers (they need a flush), 100 it does (owner), 200 for every
  // device; -1 not known.
  int writesOrdering = -1;
  // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS has HOST: flushRdmaWrites works.
  bool flushHost = false;
};
// kSystemError without a driver, or when the driver rejects the device or lacks
// cuDeviceGetAttribute.
Result<GpuRdmaSupport> gpuRdmaSupport(int ordinal);

// A dma-buf file descriptor exporting the whole pages around the device memory
// [ptr, ptr + size) (cuMemGetHandleForAddressRange), and where `ptr` lies in it: what
// ibv_reg_dmabuf_mr takes for GPUDirect RDMA. Needs the CUDA context of the memory's device
// current. The caller closes the descriptor. kSystemError where the driver has no such call
// or refuses (no dma-buf export: the proprietary kernel modules), with which in the message.
struct DmaBuf {
  int fd = -1;
  uint64_t offset = 0;
};
Result<DmaBuf> dmaBufFor(const void* ptr, size_t size);

// The calling thread's current CUDA context (cuCtxGetCurrent), null without one or without a
// driver.
void* currentContext();

// Blocks until GPUDirect RDMA writes into `ctx`'s device are visible to that context
// (cuFlushGPUDirectRDMAWrites to the owner, with `ctx` made current on the calling thread):
// what a receive into GPU memory needs before a kernel reads it, on devices that do not order
// such writes themselves. Any thread.
Status flushRdmaWrites(void* ctx);

// Copies `n` bytes between memory of this process, at least one side device memory, on a
// non-blocking stream of the calling thread's own (no wait on the legacy default stream,
// so kernels that run meanwhile do not hold it up), and waits for it. What an emulated NIC
// does in place of DMA (transports/net/ib/emulator.h); not for data paths.
Status copyMemory(void* dst, const void* src, size_t n);

// What the CUDA driver says about device `from` reaching device `to`'s memory.
struct PeerAccess {
  bool access = false;   // cuDeviceCanAccessPeer
  int rank = 0;          // CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK: relative, 0 = best
  bool atomics = false;  // CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED
};

// Peer access from CUDA device ordinal `from` to ordinal `to` (from != to). Needs no
// context. kSystemError without a driver, or when the driver rejects the devices;
// `rank` and `atomics` stay 0/false when the driver lacks cuDeviceGetP2PAttribute.
Result<PeerAccess> peerAccess(int from, int to);

}  // namespace loom::cuda
