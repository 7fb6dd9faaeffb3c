// libnccl-net-loom.so: loom's own network backends (sockets unless LOOM_NET says ib or
// ucx) exported through NCCL's plugin ABI
// (nccl_net_abi.h) as ncclNetPlugin_v11, v10, v9 and v8, so NVIDIA's NCCL
// (NCCL_NET_PLUGIN=loom) and loom itself (LOOM_NET_PLUGIN=loom) can run over them. The
// tests build variants with one version each (LOOM_EXPORT_ONLY=N) and one whose init
// fails (LOOM_EXPORT_FAIL_INIT), to check both sides of every version.
//
// Only the ncclNetPlugin_v* symbols leave the library (export.map): loom's code inside it
// is its own copy, bound to itself, beside any other loom in the process.
#include <strings.h>

#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/settings.h"
#include "transports/net/net.h"
#include "transports/net/plugin/nccl_net_abi.h"

#ifndef LOOM_EXPORT_ONLY
#define LOOM_EXPORT_ONLY 0  // every version
#else
#pragma GCC diagnostic ignored "-Wunused-function"  // the other versions' adapters
#endif

namespace loom::transport::net {
namespace {

// v8 to v10 carry no communicator id: their connections all use this hash.
constexpr uint64_t kNoCommHash = 0x67756c706d6f6f6cull;  // "loomplug"
constexpr int kMaxRecvs = 8;

// NCCL's logger (the last one an init gave); read by any thread that reports an error.
std::atomic<ncclNetLogger_t> gLog{nullptr};

ncclNetResult_t report(const Status& st) {
  if (st) return kNcclNetSuccess;
  if (ncclNetLogger_t log = gLog.load())
    log(2, 0x10, __FILE__, __LINE__, "NET/Loom: %s", st.message().c_str());
  const int c = static_cast<int>(st.code());  // loom's codes are ncclResult_t's
  return c >= kNcclNetUnhandledCudaError && c <= kNcclNetRemoteError ? c : kNcclNetSystemError;
}

ncclNetResult_t misuse(const char* what) {
  if (ncclNetLogger_t log = gLog.load()) log(2, 0x10, __FILE__, __LINE__, "NET/Loom: %s", what);
  return kNcclNetInternalError;
}

// One communicator's backend (v11), or the process's (v8 to v10).
struct ExportContext {
  std::mutex mu;  // listen and connect of one backend, from whichever thread
  std::unique_ptr<Backend> backend;
};
using ContextPtr = std::shared_ptr<ExportContext>;

// The backend exported: loom's sockets, unless LOOM_NET (or NCCL_NET, which names this
// plugin to NCCL) asks for ib or ucx. NCCL has IB of its own; what it lacks is sockets
// that carry several streams per peer.
std::string backendName() {
  const std::string n = settings::get(settings::kNet);
  for (const char* own : {"ib", "ucx"})
    if (strcasecmp(n.c_str(), own) == 0) return n;
  return "socket";
}

struct Global {
  std::mutex mu;
  ContextPtr process;  // the backend that answers devices and getProperties
  std::vector<Properties> props;
};
Global& global() {
  static Global* g = new Global;  // never destroyed: NCCL may call in during exit
  return *g;
}

Result<ContextPtr> makeContext(uint64_t commHash) {
  Context ctx;
  ctx.commHash = commHash;
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Backend> b, makeBuiltinBackend(ctx, backendName()));
  auto c = std::make_shared<ExportContext>();
  c->backend = std::move(b);
  return c;
}

ncclNetResult_t initProcess(ncclNetLogger_t log) {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  if (log) gLog.store(log);
#ifdef LOOM_EXPORT_FAIL_INIT
  return report(errorf(Code::kSystemError, "this test plugin's init always fails"));
#endif
  if (g.process) return kNcclNetSuccess;
  auto c = makeContext(kNoCommHash);
  if (!c) return report(c.status());
  std::vector<Properties> props((*c)->backend->devices());
  for (int d = 0; d < static_cast<int>(props.size()); ++d) {
    Status st = (*c)->backend->properties(d, &props[d]);
    if (!st) return report(st);
  }
  g.props = std::move(props);
  g.process = std::move(c).value();
  if (ncclNetLogger_t l = gLog.load())
    l(3, 0x10, __FILE__, __LINE__, "NET/Loom: loom's %s backend, %zu devices",
      g.process->backend->name(), g.props.size());
  return kNcclNetSuccess;
}

// A request in flight: its comm's, in posting order.
struct ExportComm;
struct ExportRequest {
  ExportComm* comm = nullptr;
  Request* req = nullptr;
  int n = 1;
  bool used = false;
  bool done = false;
  size_t sizes[kMaxRecvs] = {};
};

struct ExportComm {
  ContextPtr ctx;
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
  std::array<ExportRequest, 2 * kMaxRequests> slots;  // receives and their flushes
  std::deque<ExportRequest*> pending;

  ExportRequest* take(Request* req, int n) {
    for (auto& s : slots) {
      if (s.used) continue;
      s = ExportRequest{};
      s.comm = this, s.req = req, s.n = n, s.used = true;
      pending.push_back(&s);
      return &s;
    }
    return nullptr;
  }
  Result<MemHandle> regMr(void* data, size_t size, MemType type) {
    return send ? send->regMr(data, size, type) : recv->regMr(data, size, type);
  }
  Status deregMr(MemHandle mh) { return send ? send->deregMr(mh) : recv->deregMr(mh); }
};

struct ExportListen {
  ContextPtr ctx;
  std::unique_ptr<ListenComm> listen;
};

ContextPtr contextOf(void* ctx) {
  if (ctx) return *static_cast<ContextPtr*>(ctx);
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  return g.process;
}

// --- the calls, one body for every version ------------------------------------------

ncclNetResult_t devices(int* ndev) {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  if (!g.process) return misuse("devices() before init()");
  *ndev = static_cast<int>(g.props.size());
  return kNcclNetSuccess;
}

const Properties* propsOf(int dev) {
  Global& g = global();
  std::lock_guard<std::mutex> lock(g.mu);
  if (!g.process || dev < 0 || dev >= static_cast<int>(g.props.size())) return nullptr;
  return &g.props[dev];
}

template <typename P>
void fillCommon(const Properties& p, int dev, P* out) {
  std::memset(out, 0, sizeof(*out));
  out->name = const_cast<char*>(p.name.c_str());
  out->pciPath = p.pciPath.empty() ? nullptr : const_cast<char*>(p.pciPath.c_str());
  out->guid = p.guid ? p.guid : static_cast<uint64_t>(dev);
  // Host memory only: a backend that takes GPU memory (ib with nvidia_peermem) has no iflush,
  // which NCCL calls after receives into GPU memory before compute 9.0, and loom's regMrDmaBuf
  // is not exported; NCCL stages through host memory instead.
  out->ptrSupport = p.ptrSupport & kNcclPtrHost;
  out->regIsGlobal = 0;
  out->speed = p.speedMbps;
  out->port = p.port;
  out->latency = static_cast<float>(p.latencyUs);
  out->maxComms = p.maxComms;
  out->maxRecvs = 1;  // the proxy posts one buffer per receive, and so do loom's backends
  out->netDeviceType = kNcclNetDeviceHost;
  out->netDeviceVersion = 0;
}

template <typename P>
void fillNewer(int dev, P* out) {
  out->forceFlush = 0;
  out->vProps.ndevs = 1;
  out->vProps.devs[0] = dev;
  out->maxP2pBytes = kNcclMaxNetSizeBytes;
  out->maxCollBytes = kNcclMaxCollNetSize;
}

ncclNetResult_t listen(void* ctx, int dev, void* handle, void** listenComm) {
  ContextPtr c = contextOf(ctx);
  if (!c) return misuse("listen() before init()");
  Handle h;
  std::unique_ptr<ListenComm> l;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    if (ncclNetResult_t r = report(c->backend->listen(dev, &h, &l))) return r;
  }
  std::memcpy(handle, h.data, kHandleBytes);
  *listenComm = new ExportListen{c, std::move(l)};
  return kNcclNetSuccess;
}

// `handle` carries the backend's state between calls, in its own bytes: copied in and out.
ncclNetResult_t connect(void* ctx, int dev, void* handle, void** sendComm) {
  *sendComm = nullptr;
  ContextPtr c = contextOf(ctx);
  if (!c) return misuse("connect() before init()");
  Handle h;
  std::memcpy(h.data, handle, kHandleBytes);
  std::unique_ptr<SendComm> s;
  Status st;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    st = c->backend->connect(dev, &h, -1, &s);
  }
  std::memcpy(handle, h.data, kHandleBytes);
  if (ncclNetResult_t r = report(st)) return r;
  if (s) {
    auto* e = new ExportComm;
    e->ctx = c;
    e->send = std::move(s);
    *sendComm = e;
  }
  return kNcclNetSuccess;
}

ncclNetResult_t accept(void* listenComm, void** recvComm, DevHandle** /*recvDevComm*/) {
  *recvComm = nullptr;
  auto* l = static_cast<ExportListen*>(listenComm);
  std::unique_ptr<RecvComm> r;
  if (ncclNetResult_t res = report(l->listen->accept(&r))) return res;
  if (r) {
    auto* e = new ExportComm;
    e->ctx = l->ctx;
    e->recv = std::move(r);
    *recvComm = e;
  }
  return kNcclNetSuccess;
}

ncclNetResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  auto* e = static_cast<ExportComm*>(comm);
  if (type != kNcclPtrHost && type != kNcclPtrCuda)
    return misuse("regMr of an unknown memory type");
  auto mh = e->regMr(data, size, type == kNcclPtrCuda ? MemType::kCuda : MemType::kHost);
  if (!mh) return report(mh.status());
  *mhandle = *mh;
  return kNcclNetSuccess;
}

ncclNetResult_t regMrDmaBuf(void*, void*, size_t, int, uint64_t, int, void**) {
  return misuse("regMrDmaBuf: loom's plugin does not take dma-buf memory (ptrSupport says so)");
}

ncclNetResult_t deregMr(void* comm, void* mhandle) {
  return report(static_cast<ExportComm*>(comm)->deregMr(mhandle));
}

ncclNetResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                      void** request) {
  *request = nullptr;
  auto* e = static_cast<ExportComm*>(sendComm);
  Request* r = nullptr;
  if (ncclNetResult_t res = report(e->send->isend(data, size, tag, mhandle, &r))) return res;
  if (!r) return kNcclNetSuccess;  // not now: NCCL calls again
  ExportRequest* x = e->take(r, 1);
  if (!x) return misuse("isend: more requests in flight than NCCL_NET_MAX_REQUESTS");
  *request = x;
  return kNcclNetSuccess;
}

ncclNetResult_t irecv(void* recvComm, int n, void** data, const size_t* sizes, int* tags,
                      void** mhandles, void** request) {
  *request = nullptr;
  auto* e = static_cast<ExportComm*>(recvComm);
  if (n < 1 || n > kMaxRecvs) return misuse("irecv: more buffers than maxRecvs");
  Request* r = nullptr;
  if (ncclNetResult_t res = report(e->recv->irecv(n, data, sizes, tags, mhandles, &r))) return res;
  if (!r) return kNcclNetSuccess;
  ExportRequest* x = e->take(r, n);
  if (!x) return misuse("irecv: more requests in flight than NCCL_NET_MAX_REQUESTS");
  *request = x;
  return kNcclNetSuccess;
}

ncclNetResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                       void** request) {
  *request = nullptr;
  auto* e = static_cast<ExportComm*>(recvComm);
  if (n < 1 || n > kMaxRecvs) return misuse("iflush: more buffers than maxRecvs");
  size_t z[kMaxRecvs];
  for (int i = 0; i < n; ++i) z[i] = sizes[i] < 0 ? 0 : static_cast<size_t>(sizes[i]);
  Request* r = nullptr;
  if (ncclNetResult_t res = report(e->recv->iflush(n, data, z, mhandles, &r))) return res;
  if (!r) return kNcclNetSuccess;  // nothing to flush (the CPU wrote the data)
  ExportRequest* x = e->take(r, n);
  if (!x) return misuse("iflush: more requests in flight than NCCL_NET_MAX_REQUESTS");
  *request = x;
  return kNcclNetSuccess;
}

// loom's requests complete in posting order and are tested so: a test of a later request
// moves the earlier ones along first.
ncclNetResult_t test(void* request, int* done, int* sizes) {
  *done = 0;
  auto* x = static_cast<ExportRequest*>(request);
  if (!x || !x->used) return misuse("test of a request that is not in flight");
  ExportComm* e = x->comm;
  while (!x->done && !e->pending.empty()) {
    ExportRequest* h = e->pending.front();
    bool d = false;
    Status st = e->send ? e->send->test(h->req, &d, h->sizes) : e->recv->test(h->req, &d, h->sizes);
    if (ncclNetResult_t r = report(st)) return r;
    if (!d) break;
    h->done = true;
    e->pending.pop_front();
  }
  if (!x->done) return kNcclNetSuccess;
  *done = 1;
  if (sizes)
    for (int i = 0; i < x->n; ++i) sizes[i] = static_cast<int>(x->sizes[i]);
  x->used = false;
  return kNcclNetSuccess;
}

ncclNetResult_t closeComm(void* comm) {
  delete static_cast<ExportComm*>(comm);
  return kNcclNetSuccess;
}

ncclNetResult_t closeListen(void* listenComm) {
  delete static_cast<ExportListen*>(listenComm);
  return kNcclNetSuccess;
}

// --- the versions ---------------------------------------------------------------------

ncclNetResult_t initV8(ncclNetLogger_t log) {
  return initProcess(log);
}
ncclNetResult_t initV10(ncclNetLogger_t log, ncclNetProfilerCallback_t) {
  return initProcess(log);
}
ncclNetResult_t initV11(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t*, ncclNetLogger_t log,
                        ncclNetProfilerCallback_t) {
  *ctx = nullptr;
  if (ncclNetResult_t r = initProcess(log)) return r;
  auto c = makeContext(commId);
  if (!c) return report(c.status());
  *ctx = new ContextPtr(std::move(c).value());
  return kNcclNetSuccess;
}
ncclNetResult_t finalizeV11(void* ctx) {
  delete static_cast<ContextPtr*>(ctx);  // comms still open keep the backend alive
  return kNcclNetSuccess;
}

ncclNetResult_t propsV8(int dev, ncclNetProperties_v8_t* p) {
  const Properties* q = propsOf(dev);
  if (!q) return misuse("getProperties of a device that does not exist");
  fillCommon(*q, dev, p);
  return kNcclNetSuccess;
}
ncclNetResult_t propsV9(int dev, ncclNetProperties_v9_t* p) {
  const Properties* q = propsOf(dev);
  if (!q) return misuse("getProperties of a device that does not exist");
  fillCommon(*q, dev, p);
  fillNewer(dev, p);
  return kNcclNetSuccess;
}
ncclNetResult_t propsV11(int dev, ncclNetProperties_v11_t* p) {
  const Properties* q = propsOf(dev);
  if (!q) return misuse("getProperties of a device that does not exist");
  fillCommon(*q, dev, p);
  fillNewer(dev, p);
  p->maxMultiRequestSize = 1;
  return kNcclNetSuccess;
}

ncclNetResult_t listenNoCtx(int dev, void* handle, void** listenComm) {
  return listen(nullptr, dev, handle, listenComm);
}
ncclNetResult_t connectV8(int dev, void* handle, void** sendComm, DevHandle**) {
  return connect(nullptr, dev, handle, sendComm);
}
ncclNetResult_t connectV10(int dev, ncclNetCommConfig_v10_t*, void* handle, void** sendComm,
                           DevHandle**) {
  return connect(nullptr, dev, handle, sendComm);
}
ncclNetResult_t connectV11(void* ctx, int dev, void* handle, void** sendComm, DevHandle**) {
  return connect(ctx, dev, handle, sendComm);
}

ncclNetResult_t isendV8(void* c, void* data, int size, int tag, void* mh, void** req) {
  if (size < 0) return misuse("isend of a negative size");
  return isend(c, data, static_cast<size_t>(size), tag, mh, req);
}
ncclNetResult_t isendV9(void* c, void* data, size_t size, int tag, void* mh, void** req) {
  return isend(c, data, size, tag, mh, req);
}
ncclNetResult_t isendV10(void* c, void* data, size_t size, int tag, void* mh, void*, void** req) {
  return isend(c, data, size, tag, mh, req);
}
ncclNetResult_t irecvV8(void* c, int n, void** data, int* sizes, int* tags, void** mh, void** req) {
  if (n < 1 || n > kMaxRecvs) return misuse("irecv: more buffers than maxRecvs");
  size_t z[kMaxRecvs];
  for (int i = 0; i < n; ++i) z[i] = sizes[i] < 0 ? 0 : static_cast<size_t>(sizes[i]);
  return irecv(c, n, data, z, tags, mh, req);
}
ncclNetResult_t irecvV9(void* c, int n, void** data, size_t* sizes, int* tags, void** mh,
                        void** req) {
  return irecv(c, n, data, sizes, tags, mh, req);
}
ncclNetResult_t irecvV10(void* c, int n, void** data, size_t* sizes, int* tags, void** mh, void**,
                         void** req) {
  return irecv(c, n, data, sizes, tags, mh, req);
}

}  // namespace
}  // namespace loom::transport::net

using namespace loom::transport::net;  // NOLINT: the tables below name every call

extern "C" {

#if LOOM_EXPORT_ONLY == 0 || LOOM_EXPORT_ONLY == 8
__attribute__((visibility("default"))) ncclNet_v8_t ncclNetPlugin_v8 = {
    "Loom",    initV8,      devices,     propsV8, listenNoCtx, connectV8, accept,
    regMr,     regMrDmaBuf, deregMr,     isendV8, irecvV8,     iflush,    test,
    closeComm, closeComm,   closeListen, nullptr, nullptr};
#endif
#if LOOM_EXPORT_ONLY == 0 || LOOM_EXPORT_ONLY == 9
__attribute__((visibility("default"))) ncclNet_v9_t ncclNetPlugin_v9 = {
    "Loom",    initV8,      devices,     propsV9, listenNoCtx, connectV8, accept,
    regMr,     regMrDmaBuf, deregMr,     isendV9, irecvV9,     iflush,    test,
    closeComm, closeComm,   closeListen, nullptr, nullptr,     nullptr};
#endif
#if LOOM_EXPORT_ONLY == 0 || LOOM_EXPORT_ONLY == 10
__attribute__((visibility("default"))) ncclNet_v10_t ncclNetPlugin_v10 = {
    "Loom",    initV10,     devices,     propsV9,  listenNoCtx, connectV10, accept,
    regMr,     regMrDmaBuf, deregMr,     isendV10, irecvV10,    iflush,     test,
    closeComm, closeComm,   closeListen, nullptr,  nullptr,     nullptr};
#endif
#if LOOM_EXPORT_ONLY == 0 || LOOM_EXPORT_ONLY == 11
__attribute__((visibility("default"))) ncclNet_v11_t ncclNetPlugin_v11 = {
    "Loom",      initV11, devices,  propsV11, listen,      connectV11, accept,    regMr,
    regMrDmaBuf, deregMr, isendV10, irecvV10, iflush,      test,       closeComm, closeComm,
    closeListen, nullptr, nullptr,  nullptr,  finalizeV11, nullptr};  // no setNetAttr: NCCL skips
                                                                      // the per-op hints
#endif

}  // extern "C"
