#include "common/cuda_probe.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace loom::cuda {

namespace {

// Values from the CUDA driver API (cuda.h); declared here so no CUDA header is needed.
constexpr int kAttrMemoryType = 2;   // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kAttrBufferId = 7;     // CU_POINTER_ATTRIBUTE_BUFFER_ID
constexpr int kAttrIsManaged = 8;    // CU_POINTER_ATTRIBUTE_IS_MANAGED
constexpr int kAttrLegacyIpc = 10;   // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
constexpr int kAttrRangeStart = 11;  // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
constexpr int kAttrRangeSize = 12;   // CU_POINTER_ATTRIBUTE_RANGE_SIZE
constexpr unsigned kMemoryTypeDevice = 2;
constexpr int kP2pPerformanceRank = 0x01;  // CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK
constexpr int kP2pNativeAtomics = 0x03;    // CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED

using CuInit = int (*)(unsigned);
using CuPointerGetAttribute = int (*)(void*, int, uintptr_t);
using CuPointerGetAttributes = int (*)(unsigned, int*, void**, uintptr_t);
using CuDeviceGet = int (*)(int*, int);
using CuDeviceGetPCIBusId = int (*)(char*, int, int);
using CuDeviceGetCount = int (*)(int*);
using CuDeviceCanAccessPeer = int (*)(int*, int, int);
using CuDeviceGetP2PAttribute = int (*)(int*, int, int, int);
using CuStreamWriteValue64 = int (*)(void*, uintptr_t, uint64_t, unsigned);
using CuDeviceGetAttribute = int (*)(int*, int, int);
using CuCtxSetCurrent = int (*)(void*);
using CuCtxGetCurrent = int (*)(void**);
using CuFlushGPUDirectRDMAWrites = int (*)(int, int);
using CuStreamCreate = int (*)(void**, unsigned);
using CuStreamDestroy = int (*)(void*);
using CuStreamSynchronize = int (*)(void*);
using CuMemcpyAsync = int (*)(uintptr_t, uintptr_t, size_t, void*);
constexpr int kAttrContext = 1;             // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr unsigned kStreamNonBlocking = 1;  // CU_STREAM_NON_BLOCKING
using CuMemGetHandleForAddressRange = int (*)(void*, uintptr_t, size_t, int, unsigned long long);
constexpr int kRangeHandleDmaBufFd = 1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD

constexpr int kAttrComputeMajor = 75;      // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kAttrGpuDirectRdma = 116;    // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED
constexpr int kAttrDmaBufSupported = 124;  // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
constexpr int kAttrRdmaFlushOptions =
    117;  // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS
constexpr int kAttrRdmaWritesOrdering = 118;  // CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING
constexpr int kFlushOptionHost = 1;           // CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST
constexpr int kFlushTargetCurrentCtx = 0;     // CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX
constexpr int kFlushToOwner = 100;            // CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER

struct Driver {
  CuPointerGetAttribute getAttribute = nullptr;    // null: no usable driver (see `error`)
  CuPointerGetAttributes getAttributes = nullptr;  // one call for both attributes
  CuDeviceGet deviceGet = nullptr;
  CuDeviceGetPCIBusId busId = nullptr;
  CuDeviceGetCount deviceCount = nullptr;
  CuDeviceCanAccessPeer canAccessPeer = nullptr;
  CuDeviceGetP2PAttribute p2pAttribute = nullptr;
  CuStreamWriteValue64 writeValue64 = nullptr;
  CuDeviceGetAttribute deviceAttribute = nullptr;
  CuMemGetHandleForAddressRange rangeHandle = nullptr;  // CUDA 11.7 and later
  CuCtxSetCurrent ctxSetCurrent = nullptr;
  CuCtxGetCurrent ctxGetCurrent = nullptr;
  CuFlushGPUDirectRDMAWrites flushRdmaWrites = nullptr;  // CUDA 11.3 and later
  CuStreamCreate streamCreate = nullptr;
  CuStreamDestroy streamDestroy = nullptr;
  CuStreamSynchronize streamSynchronize = nullptr;
  CuMemcpyAsync memcpyAsync = nullptr;
  std::string error;  // why there is no usable driver
};

template <typename Fn>
void sym(void* lib, Fn& fn, const char* name) {
  fn = reinterpret_cast<Fn>(dlsym(lib, name));
}

Driver load() {
  Driver d;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    d.error = std::string("cannot load libcuda.so.1 (") + (err ? err : "not found") + ")";
    return d;
  }
  auto init = reinterpret_cast<CuInit>(dlsym(lib, "cuInit"));
  auto get = reinterpret_cast<CuPointerGetAttribute>(dlsym(lib, "cuPointerGetAttribute"));
  if (!init || !get) {
    d.error = "libcuda.so.1 lacks cuInit or cuPointerGetAttribute";
    return d;
  }
  if (int rc = init(0); rc != 0) {
    d.error = "cuInit failed (CUDA error " + std::to_string(rc) + ")";
    return d;
  }
  d.getAttribute = get;
  sym(lib, d.getAttributes, "cuPointerGetAttributes");
  sym(lib, d.deviceGet, "cuDeviceGet");
  sym(lib, d.busId, "cuDeviceGetPCIBusId");
  sym(lib, d.deviceCount, "cuDeviceGetCount");
  sym(lib, d.canAccessPeer, "cuDeviceCanAccessPeer");
  sym(lib, d.p2pAttribute, "cuDeviceGetP2PAttribute");
  sym(lib, d.writeValue64, "cuStreamWriteValue64_v2");
  sym(lib, d.deviceAttribute, "cuDeviceGetAttribute");
  sym(lib, d.rangeHandle, "cuMemGetHandleForAddressRange");
  sym(lib, d.ctxSetCurrent, "cuCtxSetCurrent");
  sym(lib, d.ctxGetCurrent, "cuCtxGetCurrent");
  sym(lib, d.flushRdmaWrites, "cuFlushGPUDirectRDMAWrites");
  sym(lib, d.streamCreate, "cuStreamCreate");
  sym(lib, d.streamDestroy, "cuStreamDestroy_v2");
  sym(lib, d.streamSynchronize, "cuStreamSynchronize");
  sym(lib, d.memcpyAsync, "cuMemcpyAsync");
  return d;
}

// Asked on every collective (isDevicePointer): a function-local static costs one load once
// initialised, where std::call_once costs a thread-local write and a pthread_once call.
const Driver& driver() {
  static const Driver d = load();
  return d;
}

}  // namespace

bool isDevicePointer(const void* ptr) {
  if (!ptr) return false;
  const Driver& d = driver();
  if (!d.getAttribute) return false;
  if (d.getAttributes) {
    // Called on every collective: one driver call instead of two.
    int attrs[2] = {kAttrMemoryType, kAttrIsManaged};
    unsigned type = 0, managed = 0;
    void* data[2] = {&type, &managed};
    if (d.getAttributes(2, attrs, data, reinterpret_cast<uintptr_t>(ptr)) != 0) return false;
    return type == kMemoryTypeDevice && !managed;
  }
  unsigned type = 0;
  if (d.getAttribute(&type, kAttrMemoryType, reinterpret_cast<uintptr_t>(ptr)) != 0) return false;
  if (type != kMemoryTypeDevice) return false;
  unsigned managed = 0;
  if (d.getAttribute(&managed, kAttrIsManaged, reinterpret_cast<uintptr_t>(ptr)) == 0 && managed) {
    return false;
  }
  return true;
}

bool isPeerMappableDevicePointer(const void* ptr) {
  if (!isDevicePointer(ptr)) return false;
  const Driver& d = driver();
  int legacy = 0;
  if (d.getAttribute(&legacy, kAttrLegacyIpc, reinterpret_cast<uintptr_t>(ptr)) != 0) return false;
  return legacy != 0;
}

bool allocationOf(const void* ptr, Allocation* out) {
  if (!isDevicePointer(ptr)) return false;
  const Driver& d = driver();
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  unsigned long long id = 0;
  uintptr_t base = 0;
  size_t bytes = 0;
  int legacy = 0;
  if (d.getAttribute(&base, kAttrRangeStart, p) != 0 ||
      d.getAttribute(&bytes, kAttrRangeSize, p) != 0 ||
      d.getAttribute(&id, kAttrBufferId, p) != 0) {
    return false;
  }
  if (d.getAttribute(&legacy, kAttrLegacyIpc, p) != 0) legacy = 0;
  out->base = base;
  out->bytes = bytes;
  out->bufferId = id;
  out->legacyIpc = legacy != 0;
  return true;
}

uint64_t bufferIdOf(const void* ptr) {
  const Driver& d = driver();
  unsigned long long id = 0;
  if (!ptr || !d.getAttribute ||
      d.getAttribute(&id, kAttrBufferId, reinterpret_cast<uintptr_t>(ptr)) != 0) {
    return 0;
  }
  return id;
}

int streamWriteValue64(void* stream, void* addr, uint64_t value) {
  const Driver& d = driver();
  if (!d.writeValue64) return -1;
  return d.writeValue64(stream, reinterpret_cast<uintptr_t>(addr), value, 0);
}

std::string deviceBusId(int ordinal) {
  const Driver& d = driver();
  if (ordinal < 0 || !d.deviceGet || !d.busId) return "";
  int dev = 0;
  if (d.deviceGet(&dev, ordinal) != 0) return "";
  char text[64] = {0};
  if (d.busId(text, sizeof(text) - 1, dev) != 0) return "";
  return text;
}

Result<int> deviceCount() {
  const Driver& d = driver();
  if (!d.getAttribute) return errorf(Code::kSystemError, "%s", d.error.c_str());
  if (!d.deviceCount) return errorf(Code::kSystemError, "libcuda.so.1 lacks cuDeviceGetCount");
  int count = 0;
  if (int rc = d.deviceCount(&count); rc != 0) {
    return errorf(Code::kSystemError, "cuDeviceGetCount failed (CUDA error %d)", rc);
  }
  return count;
}

Result<GpuRdmaSupport> gpuRdmaSupport(int ordinal) {
  const Driver& d = driver();
  if (!d.getAttribute) return errorf(Code::kSystemError, "%s", d.error.c_str());
  if (!d.deviceGet || !d.deviceAttribute) {
    return errorf(Code::kSystemError, "libcuda.so.1 lacks cuDeviceGet or cuDeviceGetAttribute");
  }
  int dev = 0;
  if (int rc = d.deviceGet(&dev, ordinal); rc != 0) {
    return errorf(Code::kSystemError, "cuDeviceGet(%d) failed (CUDA error %d)", ordinal, rc);
  }
  GpuRdmaSupport s;
  int v = 0;
  if (d.deviceAttribute(&v, kAttrGpuDirectRdma, dev) == 0) s.rdma = v != 0;
  if (d.deviceAttribute(&v, kAttrDmaBufSupported, dev) == 0) s.dmaBuf = v != 0;
  if (d.deviceAttribute(&v, kAttrComputeMajor, dev) == 0) s.computeMajor = v;
  if (d.deviceAttribute(&v, kAttrRdmaWritesOrdering, dev) == 0) s.writesOrdering = v;
  if (d.deviceAttribute(&v, kAttrRdmaFlushOptions, dev) == 0) {
    s.flushHost = (v & kFlushOptionHost) != 0 && d.flushRdmaWrites;
  }
  return s;
}

Result<DmaBuf> dmaBufFor(const void* ptr, size_t size) {
  const Driver& d = driver();
  if (!d.getAttribute) return errorf(Code::kSystemError, "%s", d.error.c_str());
  if (!d.rangeHandle) {
    return errorf(Code::kSystemError,
                  "libcuda.so.1 lacks cuMemGetHandleForAddressRange (a driver older than CUDA "
                  "11.7)");
  }
  Allocation a;
  if (!allocationOf(ptr, &a)) {
    return errorf(Code::kInvalidArgument, "%p is not device memory from this process", ptr);
  }
  constexpr uintptr_t kPage = 4096;
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  const uintptr_t begin = p & ~(kPage - 1);
  const uintptr_t end = (p + std::max<size_t>(size, 1) + kPage - 1) & ~(kPage - 1);
  if (begin < a.base || end > a.base + a.bytes) {
    return errorf(Code::kInvalidArgument,
                  "device memory %p (+%zu) does not fill whole pages of its allocation (%p, %zu "
                  "bytes): dma-buf exports pages",
                  ptr, size, reinterpret_cast<void*>(a.base), a.bytes);
  }
  int fd = -1;
  if (int rc = d.rangeHandle(&fd, begin, end - begin, kRangeHandleDmaBufFd, 0); rc != 0) {
    return errorf(Code::kSystemError,
                  "cuMemGetHandleForAddressRange(dma-buf) failed (CUDA error %d): the driver "
                  "does not export this memory as dma-buf (it needs the open kernel modules)",
                  rc);
  }
  DmaBuf out;
  out.fd = fd;
  out.offset = p - begin;
  return out;
}

void* currentContext() {
  const Driver& d = driver();
  void* ctx = nullptr;
  if (!d.ctxGetCurrent || d.ctxGetCurrent(&ctx) != 0) return nullptr;
  return ctx;
}

Status flushRdmaWrites(void* ctx) {
  const Driver& d = driver();
  if (!d.getAttribute) return errorf(Code::kSystemError, "%s", d.error.c_str());
  if (!d.flushRdmaWrites || !d.ctxSetCurrent || !ctx) {
    return errorf(Code::kSystemError,
                  "no cuFlushGPUDirectRDMAWrites (a driver older than CUDA 11.3) or no context");
  }
  thread_local void* current = nullptr;
  if (current != ctx) {
    if (int rc = d.ctxSetCurrent(ctx); rc != 0) {
      return errorf(Code::kSystemError, "cuCtxSetCurrent failed (CUDA error %d)", rc);
    }
    current = ctx;
  }
  if (int rc = d.flushRdmaWrites(kFlushTargetCurrentCtx, kFlushToOwner); rc != 0) {
    return errorf(Code::kCudaError, "cuFlushGPUDirectRDMAWrites failed (CUDA error %d)", rc);
  }
  return Status::ok();
}

namespace {

// This thread's non-blocking stream in one context (copyMemory), destroyed with the thread.
struct CopyStream {
  void* ctx = nullptr;
  void* stream = nullptr;
  ~CopyStream() {
    if (stream) driver().streamDestroy(stream);
  }
};

}  // namespace

Status copyMemory(void* dst, const void* src, size_t n) {
  if (n == 0) return Status::ok();
  const Driver& d = driver();
  if (!d.getAttribute) return errorf(Code::kSystemError, "%s", d.error.c_str());
  if (!d.ctxSetCurrent || !d.streamCreate || !d.streamDestroy || !d.streamSynchronize ||
      !d.memcpyAsync) {
    return errorf(Code::kSystemError, "libcuda.so.1 lacks the stream or copy calls");
  }
  // The context of whichever side is device memory (page-locked host memory has one too).
  const void* gpuSide = isDevicePointer(dst) ? dst : src;
  void* ctx = nullptr;
  if (!isDevicePointer(gpuSide) ||
      d.getAttribute(&ctx, kAttrContext, reinterpret_cast<uintptr_t>(gpuSide)) != 0 || !ctx) {
    return errorf(Code::kInvalidArgument,
                  "copy of %zu bytes: neither %p nor %p is device memory with a context", n, dst,
                  src);
  }
  thread_local CopyStream cs;
  if (int rc = d.ctxSetCurrent(ctx); rc != 0) {
    return errorf(Code::kSystemError, "cuCtxSetCurrent failed (CUDA error %d)", rc);
  }
  if (cs.ctx != ctx) {
    if (cs.stream) d.streamDestroy(cs.stream);  // a stream of another context (rare)
    cs.stream = nullptr;
    cs.ctx = nullptr;
    if (int rc = d.streamCreate(&cs.stream, kStreamNonBlocking); rc != 0) {
      return errorf(Code::kSystemError, "cuStreamCreate failed (CUDA error %d)", rc);
    }
    cs.ctx = ctx;
  }
  int rc = d.memcpyAsync(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), n,
                         cs.stream);
  if (rc == 0) rc = d.streamSynchronize(cs.stream);
  if (rc != 0) {
    return errorf(Code::kCudaError, "copy of %zu bytes from %p to %p failed (CUDA error %d)", n,
                  src, dst, rc);
  }
  return Status::ok();
}

Result<PeerAccess> peerAccess(int from, int to) {
  const Driver& d = driver();
  if (!d.getAttribute) return errorf(Code::kSystemError, "%s", d.error.c_str());
  if (!d.deviceGet || !d.canAccessPeer) {
    return errorf(Code::kSystemError, "libcuda.so.1 lacks cuDeviceGet or cuDeviceCanAccessPeer");
  }
  int a = 0, b = 0;
  if (int rc = d.deviceGet(&a, from); rc != 0) {
    return errorf(Code::kSystemError, "cuDeviceGet(%d) failed (CUDA error %d)", from, rc);
  }
  if (int rc = d.deviceGet(&b, to); rc != 0) {
    return errorf(Code::kSystemError, "cuDeviceGet(%d) failed (CUDA error %d)", to, rc);
  }
  int can = 0;
  if (int rc = d.canAccessPeer(&can, a, b); rc != 0) {
    return errorf(Code::kSystemError, "cuDeviceCanAccessPeer(%d, %d) failed (CUDA error %d)", from,
                  to, rc);
  }
  PeerAccess out;
  out.access = can != 0;
  // Both attributes are defined only between devices that can reach each other.
  if (out.access && d.p2pAttribute) {
    int value = 0;
    if (d.p2pAttribute(&value, kP2pPerformanceRank, a, b) == 0) out.rank = value;
    if (d.p2pAttribute(&value, kP2pNativeAtomics, a, b) == 0) out.atomics = value != 0;
  }
  return out;
}

}  // namespace loom::cuda
