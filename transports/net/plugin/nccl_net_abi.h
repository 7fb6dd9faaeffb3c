// NCCL's network plugin ABI, versions 8 to 11: the tables a `libnccl-net*.so` exports as
// `ncclNetPlugin_vN`, with the property structs they fill. Declared here from the
// layouts NCCL 2.28.9 loads (its src/include/plugin/net/net_v8.h .. net_v11.h): the field
// order and types are the ABI, so they must stay exactly as they are. Only the
// point-to-point tables; loom neither loads nor exports collNet or GIN.
//
// What changed between versions, for the adapters on both sides:
//   v8   init(logger); isend takes an int size, irecv int sizes
//   v9   sizes become size_t in isend/irecv (test still reports int); properties gain
//        forceFlush, vProps, maxP2pBytes, maxCollBytes; makeVDevice
//   v10  init(logger, profiler); connect takes a config (traffic class); isend/irecv
//        take profiler handles
//   v11  init(&ctx, commId, config, logger, profiler): a context per communicator, passed
//        to listen and connect; finalize(ctx), setNetAttr; properties gain
//        maxMultiRequestSize
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// ncclResult_t's values, as the plugin returns them (the same as nccl.h's).
typedef int ncclNetResult_t;
enum : int {
  kNcclNetSuccess = 0,
  kNcclNetUnhandledCudaError = 1,
  kNcclNetSystemError = 2,
  kNcclNetInternalError = 3,
  kNcclNetInvalidArgument = 4,
  kNcclNetInvalidUsage = 5,
  kNcclNetRemoteError = 6,
  kNcclNetInProgress = 7,
};

constexpr int kNcclNetHandleMaxSize = 128;  // NCCL_NET_HANDLE_MAXSIZE
constexpr int kNcclPtrHost = 0x1;           // NCCL_PTR_HOST
constexpr int kNcclPtrCuda = 0x2;           // NCCL_PTR_CUDA
constexpr int kNcclPtrDmaBuf = 0x4;         // NCCL_PTR_DMABUF
constexpr int kNcclNetMaxDevsPerNic = 4;    // NCCL_NET_MAX_DEVS_PER_NIC
constexpr int kNcclNetDeviceHost = 0;       // ncclNetDeviceType NCCL_NET_DEVICE_HOST
constexpr int kNcclNetTrafficClassUndef = -1;
constexpr size_t kNcclMaxNetSizeBytes = 1ull << 40;   // NCCL_MAX_NET_SIZE_BYTES
constexpr size_t kNcclMaxCollNetSize = 512ull << 20;  // MAX_COLLNET_SIZE

// ncclDebugLogger_t: level (0 none, 1 version, 2 warn, 3 info, 4 abort, 5 trace), the
// subsystem flags (NCCL_NET is 0x10), file, line, printf format.
typedef void (*ncclNetLogger_t)(int level, unsigned long flags, const char* file, int line,
                                const char* fmt, ...);
// ncclProfilerCallback_t (loom passes none and ignores the one it is given).
typedef ncclNetResult_t (*ncclNetProfilerCallback_t)(void** eHandle, int type, void* pHandle,
                                                     int64_t pluginId, void* extData);

// ncclNetDeviceHandle_v7_t .. _v11_t (one layout): device offload, which loom does not do.
struct ncclNetDeviceHandle_loom_t {
  int netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
};

struct ncclNetProperties_v8_t {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int speed;  // Mb/s
  int port;
  float latency;  // us
  int maxComms;
  int maxRecvs;
  int netDeviceType;  // an enum in NCCL's header: int-sized
  int netDeviceVersion;
};

struct ncclNetVDeviceProps_v9_t {
  int ndevs;
  int devs[kNcclNetMaxDevsPerNic];
};

// v9 and v10 share this layout.
struct ncclNetProperties_v9_t {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v9_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
};
typedef ncclNetProperties_v9_t ncclNetProperties_v10_t;

struct ncclNetProperties_v11_t {
  char* name;
  char* pciPath;
  uint64_t guid;
  int ptrSupport;
  int regIsGlobal;
  int forceFlush;
  int speed;
  int port;
  float latency;
  int maxComms;
  int maxRecvs;
  int netDeviceType;
  int netDeviceVersion;
  ncclNetVDeviceProps_v9_t vProps;
  size_t maxP2pBytes;
  size_t maxCollBytes;
  int maxMultiRequestSize;
};

struct ncclNetCommConfig_v10_t {
  int trafficClass;
};
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v11_t;

struct ncclNetCommAttr_v11_t {
  int32_t maxConcurrentPeers;
  int32_t minConcurrentPeers;
  int32_t maxFlowsPerPeer;
  int32_t minFlowsPerPeer;
};
struct ncclNetAttr_v11_t {
  ncclNetCommAttr_v11_t sendCommAttr;
  ncclNetCommAttr_v11_t recvCommAttr;
  uint32_t op;
  uint32_t algo;
  uint32_t proto;
};

typedef ncclNetDeviceHandle_loom_t DevHandle;

struct ncclNet_v8_t {
  const char* name;
  ncclNetResult_t (*init)(ncclNetLogger_t logFunction);
  ncclNetResult_t (*devices)(int* ndev);
  ncclNetResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  ncclNetResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclNetResult_t (*connect)(int dev, void* handle, void** sendComm, DevHandle** sendDevComm);
  ncclNetResult_t (*accept)(void* listenComm, void** recvComm, DevHandle** recvDevComm);
  ncclNetResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclNetResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                 int fd, void** mhandle);
  ncclNetResult_t (*deregMr)(void* comm, void* mhandle);
  ncclNetResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle,
                           void** request);
  ncclNetResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags,
                           void** mhandles, void** request);
  ncclNetResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                            void** request);
  ncclNetResult_t (*test)(void* request, int* done, int* sizes);
  ncclNetResult_t (*closeSend)(void* sendComm);
  ncclNetResult_t (*closeRecv)(void* recvComm);
  ncclNetResult_t (*closeListen)(void* listenComm);
  ncclNetResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclNetResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
};

struct ncclNet_v9_t {
  const char* name;
  ncclNetResult_t (*init)(ncclNetLogger_t logFunction);
  ncclNetResult_t (*devices)(int* ndev);
  ncclNetResult_t (*getProperties)(int dev, ncclNetProperties_v9_t* props);
  ncclNetResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclNetResult_t (*connect)(int dev, void* handle, void** sendComm, DevHandle** sendDevComm);
  ncclNetResult_t (*accept)(void* listenComm, void** recvComm, DevHandle** recvDevComm);
  ncclNetResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclNetResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                 int fd, void** mhandle);
  ncclNetResult_t (*deregMr)(void* comm, void* mhandle);
  ncclNetResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                           void** request);
  ncclNetResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                           void** mhandles, void** request);
  ncclNetResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                            void** request);
  ncclNetResult_t (*test)(void* request, int* done, int* sizes);
  ncclNetResult_t (*closeSend)(void* sendComm);
  ncclNetResult_t (*closeRecv)(void* recvComm);
  ncclNetResult_t (*closeListen)(void* listenComm);
  ncclNetResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclNetResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclNetResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
};

struct ncclNet_v10_t {
  const char* name;
  ncclNetResult_t (*init)(ncclNetLogger_t logFunction, ncclNetProfilerCallback_t profFunction);
  ncclNetResult_t (*devices)(int* ndev);
  ncclNetResult_t (*getProperties)(int dev, ncclNetProperties_v10_t* props);
  ncclNetResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclNetResult_t (*connect)(int dev, ncclNetCommConfig_v10_t* config, void* handle,
                             void** sendComm, DevHandle** sendDevComm);
  ncclNetResult_t (*accept)(void* listenComm, void** recvComm, DevHandle** recvDevComm);
  ncclNetResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclNetResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                 int fd, void** mhandle);
  ncclNetResult_t (*deregMr)(void* comm, void* mhandle);
  ncclNetResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                           void* phandle, void** request);
  ncclNetResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                           void** mhandles, void** phandles, void** request);
  ncclNetResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                            void** request);
  ncclNetResult_t (*test)(void* request, int* done, int* sizes);
  ncclNetResult_t (*closeSend)(void* sendComm);
  ncclNetResult_t (*closeRecv)(void* recvComm);
  ncclNetResult_t (*closeListen)(void* listenComm);
  ncclNetResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclNetResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclNetResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
};

struct ncclNet_v11_t {
  const char* name;
  ncclNetResult_t (*init)(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config,
                          ncclNetLogger_t logFunction, ncclNetProfilerCallback_t profFunction);
  ncclNetResult_t (*devices)(int* ndev);
  ncclNetResult_t (*getProperties)(int dev, ncclNetProperties_v11_t* props);
  ncclNetResult_t (*listen)(void* ctx, int dev, void* handle, void** listenComm);
  ncclNetResult_t (*connect)(void* ctx, int dev, void* handle, void** sendComm,
                             DevHandle** sendDevComm);
  ncclNetResult_t (*accept)(void* listenComm, void** recvComm, DevHandle** recvDevComm);
  ncclNetResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclNetResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                                 int fd, void** mhandle);
  ncclNetResult_t (*deregMr)(void* comm, void* mhandle);
  ncclNetResult_t (*isend)(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                           void* phandle, void** request);
  ncclNetResult_t (*irecv)(void* recvComm, int n, void** data, size_t* sizes, int* tags,
                           void** mhandles, void** phandles, void** request);
  ncclNetResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                            void** request);
  ncclNetResult_t (*test)(void* request, int* done, int* sizes);
  ncclNetResult_t (*closeSend)(void* sendComm);
  ncclNetResult_t (*closeRecv)(void* recvComm);
  ncclNetResult_t (*closeListen)(void* listenComm);
  ncclNetResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclNetResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
  ncclNetResult_t (*makeVDevice)(int* d, ncclNetVDeviceProps_v9_t* props);
  ncclNetResult_t (*finalize)(void* ctx);
  ncclNetResult_t (*setNetAttr)(void* ctx, ncclNetAttr_v11_t* netAttr);
};

}  // extern "C"

// The sizes NCCL 2.28.9's structs have on LP64 machines (x86-64, aarch64).
static_assert(sizeof(ncclNetProperties_v8_t) == 64);
static_assert(sizeof(ncclNetProperties_v9_t) == 104);
static_assert(offsetof(ncclNetProperties_v9_t, maxP2pBytes) == 88);
static_assert(sizeof(ncclNetProperties_v11_t) == 112);
static_assert(sizeof(ncclNetDeviceHandle_loom_t) == 32);
static_assert(sizeof(ncclNet_v8_t) == 19 * sizeof(void*));
static_assert(sizeof(ncclNet_v9_t) == 20 * sizeof(void*));
static_assert(sizeof(ncclNet_v10_t) == 20 * sizeof(void*));
static_assert(sizeof(ncclNet_v11_t) == 22 * sizeof(void*));
