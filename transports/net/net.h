// The network backends' interface: what every way of reaching another host (sockets
// today; ibverbs, UCX and NCCL's external plugins as further folders beside `socket/`)
// offers the proxy. It has the shape of NCCL's net plugin (ncclNet_v8 to v12), so a
// plugin can be wrapped without translation:
//
//   - connections are one-way: a receiver listens and passes a handle of at most
//     kHandleBytes to its sender through the bootstrap; the sender connects with it;
//   - listen, connect and accept never block: connect and accept leave their output
//     null while the connection is not ready, and are called again (connect with the
//     same Handle object, which carries its state between calls);
//   - isend and irecv never block either: they leave *request null when they cannot
//     take the message now; test() moves data along and says when a request is done;
//   - memory is registered before use (regMr), for backends that need it.
//
// Requests of one comm complete in the order they were posted (the proxy relies on it).
// A comm takes at most kMaxRequests requests at once. Receives may be larger than the
// matching sends, never smaller. Every call is made by one thread at a time per comm.
//
// Errors: kRemoteError for the peer or the network (it closed, reset, sent garbage),
// kSystemError for this host (a socket call failed), kInternalError for misuse by loom,
// kInvalidUsage for the user's configuration. Messages name the peer where one is known.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/socket.h"
#include "common/status.h"

namespace loom::transport::net {

inline constexpr size_t kHandleBytes = 128;  // NCCL_NET_HANDLE_MAXSIZE
inline constexpr int kMaxRequests = 32;      // NCCL_NET_MAX_REQUESTS
// The byte of a duplex backend's handle that connect.cc uses (Backend::duplex()).
inline constexpr size_t kPairOfferByte = kHandleBytes - 1;

// What a receiver passes to its sender. Opaque to everyone but the backend.
struct Handle {
  alignas(8) unsigned char data[kHandleBytes] = {};
};

// Which memory a backend moves directly (NCCL_PTR_HOST, NCCL_PTR_CUDA, NCCL_PTR_DMABUF).
enum PtrSupport : int { kPtrHost = 1, kPtrCuda = 2, kPtrDmaBuf = 4 };
enum class MemType { kHost, kCuda };

struct Properties {
  std::string name;     // the device: "eth0", "mlx5_0"
  std::string pciPath;  // its PCI path in sysfs, empty when it has none (loopback, veth)
  uint64_t guid = 0;    // equal for devices that share a port
  int ptrSupport = kPtrHost;
  int speedMbps = 0;     // line rate, Mb/s
  double latencyUs = 0;  // one-way, as far as the backend knows
  int port = 0;
  int maxComms = 65536;
  int maxRecvs = 1;  // buffers one irecv may take
  // RDMA devices (ib): whether the provider registers dma-buf, whatever ptrSupport says the
  // backend takes today, for the GPUDirect RDMA assessment (transports/net/gdr.h).
  bool rdma = false;
  bool dmaBufRegistration = false;
  std::string dmaBufWhy;  // why not, where not
  // An emulated NIC that reaches GPU memory (LOOM_IB_EMULATE=...,gdr): no place on the PCI
  // tree, taken as near every GPU by the GPUDirect RDMA rule.
  bool nearEveryGpu = false;
};

// A registration (backend-specific; null for backends that need none).
using MemHandle = void*;

// An operation in flight, owned by the comm that made it.
struct Request;

// What regMrDmaBuf says on backends that take no dma-buf.
inline Status noDmaBuf() {
  return Status(Code::kInvalidUsage, "this network backend does not register dma-buf");
}

class RecvComm;

class SendComm {
 public:
  virtual ~SendComm() = default;
  virtual Result<MemHandle> regMr(void* data, size_t size, MemType type) = 0;
  // Device memory exported as dma-buf (`fd`, `data` at `offset` in it), for backends whose
  // properties name kPtrDmaBuf; the caller keeps the descriptor and may close it after.
  virtual Result<MemHandle> regMrDmaBuf(void* data, size_t size, MemType type, uint64_t offset,
                                        int fd) {
    return noDmaBuf();
  }
  virtual Status deregMr(MemHandle mh) = 0;
  // Posts `size` bytes at `data` (registered as `mh`); *request stays null when the
  // comm cannot take it now. `data` must stay valid until the request is done.
  virtual Status isend(const void* data, size_t size, int tag, MemHandle mh, Request** request) = 0;
  // Moves data along. *done once the bytes have left this host's buffers (the request
  // is then gone); *size its byte count.
  virtual Status test(Request* request, bool* done, size_t* size) = 0;
  // Makes every request fail and tells the peer (abort; a later test() reports it).
  virtual void shutdown() = 0;
  // Backends whose connections carry both directions (Backend::duplex()): whether this
  // one does (its listener offered it), and its receiving end, for what the listener's
  // side sends back (at most once).
  virtual bool twoWay() const { return false; }
  virtual Result<std::unique_ptr<RecvComm>> reverse();
};

class RecvComm {
 public:
  virtual ~RecvComm() = default;
  virtual Result<MemHandle> regMr(void* data, size_t size, MemType type) = 0;
  virtual Result<MemHandle> regMrDmaBuf(void* data, size_t size, MemType type, uint64_t offset,
                                        int fd) {  // as SendComm's
    return noDmaBuf();
  }
  virtual Status deregMr(MemHandle mh) = 0;
  // Posts `n` (<= Properties::maxRecvs) buffers for the next message; *request stays
  // null when the comm cannot take it now.
  virtual Status irecv(int n, void** data, const size_t* sizes, const int* tags,
                       const MemHandle* mh, Request** request) = 0;
  // *done once the data is in the buffers; sizes[i] the bytes that arrived in buffer i.
  virtual Status test(Request* request, bool* done, size_t* sizes) = 0;
  // After a receive into device memory, makes the data visible to the GPU. Backends that
  // need no flush (sockets: the CPU wrote the data) leave *request null.
  virtual Status iflush(int n, void** data, const size_t* sizes, const MemHandle* mh,
                        Request** request) {
    *request = nullptr;
    return Status::ok();
  }
  virtual void shutdown() = 0;
  // As SendComm's: the sending end of this connection, towards the dialer (at most once).
  virtual bool twoWay() const { return false; }
  virtual Result<std::unique_ptr<SendComm>> reverse();
};

class ListenComm {
 public:
  virtual ~ListenComm() = default;
  // The connection from the sender that holds this listener's handle; *comm stays null
  // while it is not complete.
  virtual Status accept(std::unique_ptr<RecvComm>* comm) = 0;
};

// What every backend of a communicator shares.
struct Context {
  uint64_t commHash = 0;  // connections of other communicators (or strangers) are refused
  int rank = -1;          // named in the peer's messages
  const std::atomic<bool>* abortFlag = nullptr;
  int64_t handshakeMs = 5000;  // the longest a connecting socket may take to say hello
  // The connections carry host buffers (transports/net/net_transport.cc), not GPU buffers
  // through the proxy: a backend that gives a connection helper threads by default gives
  // them fewer (each message is already a copy the caller's thread made).
  bool hostBuffers = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual int devices() const = 0;
  virtual Status properties(int dev, Properties* props) const = 0;
  // A listener on device `dev`; `handle` is what the sender needs (send it as it is).
  virtual Status listen(int dev, Handle* handle, std::unique_ptr<ListenComm>* listenComm) = 0;
  // Connects to the listener of `handle` (received from the peer, `peerRank` for the
  // messages); *comm stays null until connected: call again with the same `handle`.
  virtual Status connect(int dev, Handle* handle, int peerRank,
                         std::unique_ptr<SendComm>* comm) = 0;
  // Gives up a connect() that has not completed (frees what it kept in `handle`).
  virtual void cancelConnect(Handle* handle) {}
  // Whether a connection carries messages both ways (the comms' reverse()): two ranks
  // that need both directions then make one connection, not two (transports/net/
  // connect.h). Such a backend leaves the last byte of its handles (kPairOfferByte) zero.
  virtual bool duplex() const { return false; }
  // CPU seconds used so far by threads the backend runs itself (the socket backend's
  // helpers; those that ended count too), for the proxy's CPU report. ucx's waits for the
  // send connections it is still closing (their threads count once they end).
  virtual double threadCpuSeconds() const { return 0; }
};

// The properties of a device that is a network interface (the socket and ucx backends):
// its name, line rate from sysfs (10 Gb/s, NCCL's assumption, where it does not say), PCI
// path, host memory and one buffer per receive.
Properties interfaceProperties(const NetInterface& i);

// The socket backend (LOOM_NET=socket; NCCL's name "Socket" works too).
Result<std::unique_ptr<Backend>> makeSocketBackend(const Context& ctx);

// The backend that LOOM_NET (or NCCL_NET) names, or the default (auto: an external NCCL
// plugin where LOOM_NET_PLUGIN finds one, else ib where an RDMA port is usable, else
// sockets); an unknown or unusable name is an error that lists the ones there are.
Result<std::unique_ptr<Backend>> makeBackend(const Context& ctx);
// One of loom's own backends by name (auto, socket, ib, ucx; any case), never a plugin:
// what loom's exported plugin (libnccl-net-loom.so) runs on.
Result<std::unique_ptr<Backend>> makeBuiltinBackend(const Context& ctx, const std::string& name);
// The same as makeBackend, but null where that would be the socket backend (host buffers have the
// tcp transport for sockets).
Result<std::unique_ptr<Backend>> makeNonSocketBackend(const Context& ctx);

}  // namespace loom::transport::net
