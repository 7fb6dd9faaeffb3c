// An external NCCL network plugin under loom's network interface (plugin.h): the library
// is found by NCCL's naming rules, its newest known table (v11 to v8) is taken, and every
// call goes through one adapter per version. The plugin keeps its own threads and
// sockets; loom only calls it from the proxy, one thread per comm, as NCCL does.
#include <dlfcn.h>
#include <link.h>
#include <strings.h>

#include <atomic>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "common/log.h"
#include "common/settings.h"
#include "transports/net/plugin/nccl_net_abi.h"
#include "transports/net/plugin/plugin.h"

namespace loom::transport::net::plugin {

namespace {

// The last warning a plugin logged on this thread: added to the error of the call that
// failed, which otherwise says only "ncclSystemError".
thread_local std::string tLastWarning;

void pluginLog(int level, unsigned long /*flags*/, const char* /*file*/, int /*line*/,
               const char* fmt, ...) {
  if (level < 2 || !fmt) return;
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(text, sizeof(text), fmt, ap);
  va_end(ap);
  size_t n = std::strlen(text);
  while (n > 0 && text[n - 1] == '\n') text[--n] = '\0';
  if (level == 2 || level == 4) {  // NCCL_LOG_WARN, NCCL_LOG_ABORT
    tLastWarning = text;
    LOOM_WARN(kNet, "net plugin: %s", text);
  } else if (level == 3) {
    LOOM_INFO(kNet, "net plugin: %s", text);
  } else {
    LOOM_TRACE(kNet, "net plugin: %s", text);
  }
}

// Given to plugins that take a profiler callback: loom has no profiler to feed.
ncclNetResult_t noProfiler(void** eHandle, int, void*, int64_t, void*) {
  if (eHandle) *eHandle = nullptr;
  return kNcclNetSuccess;
}

const char* resultName(ncclNetResult_t r) {
  switch (r) {
    case kNcclNetUnhandledCudaError: return "ncclUnhandledCudaError";
    case kNcclNetSystemError: return "ncclSystemError";
    case kNcclNetInternalError: return "ncclInternalError";
    case kNcclNetInvalidArgument: return "ncclInvalidArgument";
    case kNcclNetInvalidUsage: return "ncclInvalidUsage";
    case kNcclNetRemoteError: return "ncclRemoteError";
    case kNcclNetInProgress: return "ncclInProgress";
    default: return "an unknown ncclResult_t";
  }
}

Code codeOf(ncclNetResult_t r) {
  switch (r) {
    case kNcclNetUnhandledCudaError: return Code::kCudaError;
    case kNcclNetInternalError: return Code::kInternalError;
    case kNcclNetInvalidArgument: return Code::kInvalidArgument;
    case kNcclNetInvalidUsage: return Code::kInvalidUsage;
    case kNcclNetRemoteError: return Code::kRemoteError;
    default: return Code::kSystemError;
  }
}

// One loaded library; never unloaded (plugins keep threads and state of their own).
struct Library {
  std::string path;  // where the loader found it
  std::string name;  // the plugin's own (ncclNet_vN::name)
  int version = 0;
  const ncclNet_v8_t* v8 = nullptr;
  const ncclNet_v9_t* v9 = nullptr;
  const ncclNet_v10_t* v10 = nullptr;
  const ncclNet_v11_t* v11 = nullptr;
  // v8 to v10 take one init per process.
  bool initDone = false;
  Status initStatus;

  // Every call's result goes through here: a warning of a call that succeeded is dropped,
  // so that only the failing call's own reaches its error.
  Status check(ncclNetResult_t r, const char* what) const {
    if (r == kNcclNetSuccess) {
      if (!tLastWarning.empty()) tLastWarning.clear();
      return Status::ok();
    }
    std::string last;
    last.swap(tLastWarning);
    return errorf(codeOf(r), "net plugin %s (%s, v%d): %s failed with %s%s%s", name.c_str(),
                  path.c_str(), version, what, resultName(r), last.empty() ? "" : ": ",
                  last.c_str());
  }
};

// What init gave one backend (v11: a context of its own, finalized after its last comm).
struct PluginContext {
  std::shared_ptr<Library> lib;
  void* ctx = nullptr;
  ~PluginContext() {
    if (lib->v11 && ctx) (void)lib->v11->finalize(ctx);
  }
};
using ContextPtr = std::shared_ptr<PluginContext>;

// Calls `f` with the library's table, for the calls whose signature no version changed.
template <typename F>
ncclNetResult_t onTable(const Library& l, F f) {
  switch (l.version) {
    case 8: return f(*l.v8);
    case 9: return f(*l.v9);
    case 10: return f(*l.v10);
    default: return f(*l.v11);
  }
}

ncclNetResult_t callTest(const Library& l, void* request, int* done, int* sizes) {
  return onTable(l, [&](const auto& t) { return t.test(request, done, sizes); });
}

ncclNetResult_t callRegMr(const Library& l, void* comm, void* data, size_t size, MemType type,
                          void** mh) {
  const int kind = type == MemType::kCuda ? kNcclPtrCuda : kNcclPtrHost;
  return onTable(l, [&](const auto& t) { return t.regMr(comm, data, size, kind, mh); });
}

ncclNetResult_t callRegMrDmaBuf(const Library& l, void* comm, void* data, size_t size, MemType type,
                                uint64_t offset, int fd, void** mh) {
  const int kind = type == MemType::kCuda ? kNcclPtrCuda : kNcclPtrHost;
  return onTable(l, [&](const auto& t) {
    return t.regMrDmaBuf ? t.regMrDmaBuf(comm, data, size, kind, offset, fd, mh)
                         : kNcclNetInvalidUsage;  // the plugin has no regMrDmaBuf
  });
}

ncclNetResult_t callDeregMr(const Library& l, void* comm, void* mh) {
  return onTable(l, [&](const auto& t) { return t.deregMr(comm, mh); });
}

constexpr int kMaxRecvs = 8;  // the most buffers loom hands one irecv (NCCL's own limit)

// The error every call of a comm gets once shutdown() has closed it.
Status shutDown(const Library& l) {
  return errorf(Code::kRemoteError, "net plugin %s: the connection was shut down (abort)",
                l.name.c_str());
}

class PluginSend : public SendComm {
 public:
  PluginSend(ContextPtr ctx, void* comm, int peer)
      : ctx_(std::move(ctx)), comm_(comm), peer_(peer) {}
  ~PluginSend() override { close(); }

  Result<MemHandle> regMr(void* data, size_t size, MemType type) override {
    if (shut_.load(std::memory_order_acquire)) return shutDown(lib());
    void* mh = nullptr;
    LOOM_TRY(named(lib().check(callRegMr(lib(), comm_, data, size, type, &mh), "regMr")));
    return mh;
  }
  Result<MemHandle> regMrDmaBuf(void* data, size_t size, MemType type, uint64_t offset,
                                int fd) override {
    if (shut_.load(std::memory_order_acquire)) return shutDown(lib());
    void* mh = nullptr;
    LOOM_TRY(named(lib().check(callRegMrDmaBuf(lib(), comm_, data, size, type, offset, fd, &mh),
                               "regMrDmaBuf")));
    return mh;
  }
  Status deregMr(MemHandle mh) override {
    return named(lib().check(callDeregMr(lib(), comm_, mh), "deregMr"));
  }
  Status isend(const void* data, size_t size, int tag, MemHandle mh, Request** request) override {
    *request = nullptr;
    if (shut_.load(std::memory_order_acquire)) return shutDown(lib());
    const Library& l = lib();
    void* req = nullptr;
    void* d = const_cast<void*>(data);
    ncclNetResult_t r;
    switch (l.version) {
      case 8:
        if (size > INT_MAX)
          return errorf(Code::kInternalError,
                        "net plugin %s (v8): a message of %zu bytes is "
                        "over v8's 2 GiB limit",
                        l.name.c_str(), size);
        r = l.v8->isend(comm_, d, static_cast<int>(size), tag, mh, &req);
        break;
      case 9: r = l.v9->isend(comm_, d, size, tag, mh, &req); break;
      case 10: r = l.v10->isend(comm_, d, size, tag, mh, nullptr, &req); break;
      default: r = l.v11->isend(comm_, d, size, tag, mh, nullptr, &req); break;
    }
    LOOM_TRY(named(l.check(r, "isend")));
    *request = reinterpret_cast<Request*>(req);
    return Status::ok();
  }
  Status test(Request* request, bool* done, size_t* size) override {
    *done = false;
    if (shut_.load(std::memory_order_acquire)) return shutDown(lib());
    int d = 0, s = 0;
    LOOM_TRY(named(lib().check(callTest(lib(), request, &d, &s), "test of a send")));
    *done = d != 0;
    if (*done) *size = static_cast<size_t>(s);
    return Status::ok();
  }
  // From any thread (an abort): later calls fail; the plugin's comm is closed by the
  // destructor, on the thread that owns it (the ABI has nothing safe to call meanwhile).
  void shutdown() override { shut_.store(true, std::memory_order_release); }

 private:
  const Library& lib() const { return *ctx_->lib; }
  Status named(Status st) const {
    return st ? st : st.withContext("sending to rank " + std::to_string(peer_));
  }
  void close() {
    if (!comm_) return;
    const Library& l = lib();
    (void)onTable(l, [&](const auto& t) { return t.closeSend(comm_); });
    comm_ = nullptr;
  }
  ContextPtr ctx_;
  void* comm_;
  int peer_;
  std::atomic<bool> shut_{false};
};

class PluginRecv : public RecvComm {
 public:
  PluginRecv(ContextPtr ctx, void* comm) : ctx_(std::move(ctx)), comm_(comm) {}
  ~PluginRecv() override { close(); }

  Result<MemHandle> regMr(void* data, size_t size, MemType type) override {
    if (shut_.load(std::memory_order_acquire)) return shutDown(lib());
    void* mh = nullptr;
    LOOM_TRY(lib().check(callRegMr(lib(), comm_, data, size, type, &mh), "regMr"));
    return mh;
  }
  Result<MemHandle> regMrDmaBuf(void* data, size_t size, MemType type, uint64_t offset,
                                int fd) override {
    if (shut_.load(std::memory_order_acquire)) return shutDown(lib());
    void* mh = nullptr;
    LOOM_TRY(lib().check(callRegMrDmaBuf(lib(), comm_, data, size, type, offset, fd, &mh),
                         "regMrDmaBuf"));
    return mh;
  }
  Status deregMr(MemHandle mh) override {
    return lib().check(callDeregMr(lib(), comm_, mh), "deregMr");
  }
  Status irecv(int n, void** data, const size_t* sizes, const int* tags, const MemHandle* mh,
               Request** request) override {
    *request = nullptr;
    if (shut_.load(std::memory_order_acquire)) return shutDown(lib());
    if (n < 1 || n > kMaxRecvs)
      return errorf(Code::kInternalError, "net plugin: %d buffers for one receive (1 to %d)", n,
                    kMaxRecvs);
    const Library& l = lib();
    int isizes[kMaxRecvs], itags[kMaxRecvs];
    size_t zsizes[kMaxRecvs];
    void* mhs[kMaxRecvs];
    for (int i = 0; i < n; ++i) {
      if (l.version == 8 && sizes[i] > INT_MAX)
        return errorf(Code::kInternalError,
                      "net plugin %s (v8): a receive of %zu bytes is over "
                      "v8's 2 GiB limit",
                      l.name.c_str(), sizes[i]);
      isizes[i] = static_cast<int>(sizes[i]);
      zsizes[i] = sizes[i];
      itags[i] = tags[i];
      mhs[i] = mh[i];
    }
    void* req = nullptr;
    ncclNetResult_t r;
    switch (l.version) {
      case 8: r = l.v8->irecv(comm_, n, data, isizes, itags, mhs, &req); break;
      case 9: r = l.v9->irecv(comm_, n, data, zsizes, itags, mhs, &req); break;
      case 10: r = l.v10->irecv(comm_, n, data, zsizes, itags, mhs, nullptr, &req); break;
      default: r = l.v11->irecv(comm_, n, data, zsizes, itags, mhs, nullptr, &req); break;
    }
    LOOM_TRY(l.check(r, "irecv"));
    if (req) remember(req, n);
    *request = reinterpret_cast<Request*>(req);
    return Status::ok();
  }
  Status test(Request* request, bool* done, size_t* sizes) override {
    *done = false;
    if (shut_.load(std::memory_order_acquire)) return shutDown(lib());
    int d = 0, s[kMaxRecvs] = {};
    LOOM_TRY(lib().check(callTest(lib(), request, &d, s), "test of a receive"));
    if (!d) return Status::ok();
    const int n = forget(request);
    for (int i = 0; i < n; ++i) sizes[i] = static_cast<size_t>(s[i]);
    *done = true;
    return Status::ok();
  }
  Status iflush(int n, void** data, const size_t* sizes, const MemHandle* mh,
                Request** request) override {
    *request = nullptr;
    if (shut_.load(std::memory_order_acquire)) return shutDown(lib());
    if (n < 1 || n > kMaxRecvs)
      return errorf(Code::kInternalError, "net plugin: %d buffers to flush", n);
    const Library& l = lib();
    int isizes[kMaxRecvs];
    void* mhs[kMaxRecvs];
    for (int i = 0; i < n; ++i) {
      isizes[i] = static_cast<int>(sizes[i] > INT_MAX ? INT_MAX : sizes[i]);
      mhs[i] = mh[i];
    }
    void* req = nullptr;
    ncclNetResult_t r;
    switch (l.version) {
      case 8: r = l.v8->iflush(comm_, n, data, isizes, mhs, &req); break;
      case 9: r = l.v9->iflush(comm_, n, data, isizes, mhs, &req); break;
      case 10: r = l.v10->iflush(comm_, n, data, isizes, mhs, &req); break;
      default: r = l.v11->iflush(comm_, n, data, isizes, mhs, &req); break;
    }
    LOOM_TRY(l.check(r, "iflush"));
    if (req) remember(req, n);
    *request = reinterpret_cast<Request*>(req);
    return Status::ok();
  }
  // From any thread (an abort): later calls fail; the plugin's comm is closed by the
  // destructor, on the thread that owns it (the ABI has nothing safe to call meanwhile).
  void shutdown() override { shut_.store(true, std::memory_order_release); }

 private:
  const Library& lib() const { return *ctx_->lib; }
  // How many buffers each request in flight has (test reports one size per buffer).
  void remember(void* req, int n) { inFlight_.emplace_back(req, n); }
  int forget(Request* request) {
    for (size_t i = 0; i < inFlight_.size(); ++i) {
      if (inFlight_[i].first == static_cast<void*>(request)) {
        const int n = inFlight_[i].second;
        inFlight_.erase(inFlight_.begin() + static_cast<long>(i));
        return n;
      }
    }
    return 1;
  }
  void close() {
    if (!comm_) return;
    const Library& l = lib();
    (void)onTable(l, [&](const auto& t) { return t.closeRecv(comm_); });
    comm_ = nullptr;
    inFlight_.clear();
  }
  ContextPtr ctx_;
  void* comm_;
  std::vector<std::pair<void*, int>> inFlight_;
  std::atomic<bool> shut_{false};
};

class PluginListen : public ListenComm {
 public:
  PluginListen(ContextPtr ctx, void* comm) : ctx_(std::move(ctx)), comm_(comm) {}
  ~PluginListen() override {
    const Library& l = *ctx_->lib;
    (void)onTable(l, [&](const auto& t) { return t.closeListen(comm_); });
  }
  Status accept(std::unique_ptr<RecvComm>* comm) override {
    const Library& l = *ctx_->lib;
    void* rc = nullptr;
    DevHandle* dev = nullptr;
    ncclNetResult_t r;
    switch (l.version) {
      case 8: r = l.v8->accept(comm_, &rc, &dev); break;
      case 9: r = l.v9->accept(comm_, &rc, &dev); break;
      case 10: r = l.v10->accept(comm_, &rc, &dev); break;
      default: r = l.v11->accept(comm_, &rc, &dev); break;
    }
    LOOM_TRY(l.check(r, "accept"));
    if (rc) *comm = std::make_unique<PluginRecv>(ctx_, rc);
    return Status::ok();
  }

 private:
  ContextPtr ctx_;
  void* comm_;
};

template <typename P>
void commonProperties(const P& p, Properties* out) {
  out->name = p.name ? p.name : "";
  out->pciPath = p.pciPath ? p.pciPath : "";
  out->guid = p.guid;
  out->ptrSupport = p.ptrSupport;
  out->speedMbps = p.speed;
  out->port = p.port;
  out->latencyUs = p.latency;
  out->maxComms = p.maxComms;
  out->maxRecvs = p.maxRecvs;
}

class PluginBackend : public Backend {
 public:
  PluginBackend(ContextPtr ctx, int ndev) : ctx_(std::move(ctx)), ndev_(ndev) {}
  const char* name() const override { return ctx_->lib->name.c_str(); }
  int devices() const override { return ndev_; }

  Status properties(int dev, Properties* props) const override {
    const Library& l = *ctx_->lib;
    if (dev < 0 || dev >= ndev_)
      return errorf(Code::kInternalError, "net plugin %s: no device %d (%d devices)",
                    l.name.c_str(), dev, ndev_);
    *props = Properties();
    int type = kNcclNetDeviceHost;
    if (l.version == 8) {
      ncclNetProperties_v8_t p{};
      LOOM_TRY(l.check(l.v8->getProperties(dev, &p), "getProperties"));
      commonProperties(p, props);
      type = p.netDeviceType;
    } else if (l.version == 11) {
      ncclNetProperties_v11_t p{};
      LOOM_TRY(l.check(l.v11->getProperties(dev, &p), "getProperties"));
      commonProperties(p, props);
      type = p.netDeviceType;
    } else {
      ncclNetProperties_v9_t p{};
      LOOM_TRY(
          l.check(l.version == 9 ? l.v9->getProperties(dev, &p) : l.v10->getProperties(dev, &p),
                  "getProperties"));
      commonProperties(p, props);
      type = p.netDeviceType;
    }
    if (type != kNcclNetDeviceHost)
      return errorf(Code::kInvalidUsage,
                    "net plugin %s: device %d (%s) moves data from the GPU itself (netDeviceType "
                    "%d), which loom does not support",
                    l.name.c_str(), dev, props->name.c_str(), type);
    if (props->maxRecvs < 1) props->maxRecvs = 1;
    if (props->maxRecvs > kMaxRecvs) props->maxRecvs = kMaxRecvs;
    return Status::ok();
  }

  Status listen(int dev, Handle* handle, std::unique_ptr<ListenComm>* listenComm) override {
    const Library& l = *ctx_->lib;
    void* lc = nullptr;
    ncclNetResult_t r;
    switch (l.version) {
      case 8: r = l.v8->listen(dev, handle->data, &lc); break;
      case 9: r = l.v9->listen(dev, handle->data, &lc); break;
      case 10: r = l.v10->listen(dev, handle->data, &lc); break;
      default: r = l.v11->listen(ctx_->ctx, dev, handle->data, &lc); break;
    }
    LOOM_TRY(l.check(r, "listen"));
    if (!lc)
      return errorf(Code::kInternalError, "net plugin %s: listen gave no listener", l.name.c_str());
    *listenComm = std::make_unique<PluginListen>(ctx_, lc);
    return Status::ok();
  }

  Status connect(int dev, Handle* handle, int peerRank, std::unique_ptr<SendComm>* comm) override {
    const Library& l = *ctx_->lib;
    void* sc = nullptr;
    DevHandle* devHandle = nullptr;
    ncclNetResult_t r;
    switch (l.version) {
      case 8: r = l.v8->connect(dev, handle->data, &sc, &devHandle); break;
      case 9: r = l.v9->connect(dev, handle->data, &sc, &devHandle); break;
      case 10: {
        ncclNetCommConfig_v10_t config{kNcclNetTrafficClassUndef};
        r = l.v10->connect(dev, &config, handle->data, &sc, &devHandle);
        break;
      }
      default: r = l.v11->connect(ctx_->ctx, dev, handle->data, &sc, &devHandle); break;
    }
    Status st = l.check(r, "connect");
    if (!st) return st.withContext("connecting to rank " + std::to_string(peerRank));
    if (sc) *comm = std::make_unique<PluginSend>(ctx_, sc, peerRank);
    return Status::ok();
  }

 private:
  ContextPtr ctx_;
  int ndev_;
};

// Opens one candidate: the library, or null with `*why` saying what went wrong.
std::shared_ptr<Library> open(const std::string& candidate, std::string* why) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<Library>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = loaded.find(candidate); it != loaded.end()) return it->second;
  void* h = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    *why = e ? e : candidate + ": cannot be loaded";  // dlerror names the file
    return nullptr;
  }
  // The same library reached by another name (a path, or NCCL's short name) is the same
  // plugin: one Library, one init.
  static std::map<void*, std::shared_ptr<Library>> byHandle;
  if (auto it = byHandle.find(h); it != byHandle.end()) {
    dlclose(h);  // the reference this dlopen added
    loaded[candidate] = it->second;
    return it->second;
  }
  auto lib = std::make_shared<Library>();
  lib->path = candidate;
  if (link_map* lm = nullptr;
      dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && *lm->l_name)
    lib->path = lm->l_name;
  if (auto* t = static_cast<const ncclNet_v11_t*>(dlsym(h, "ncclNetPlugin_v11"))) {
    lib->version = 11, lib->v11 = t, lib->name = t->name ? t->name : "";
  } else if (auto* t10 = static_cast<const ncclNet_v10_t*>(dlsym(h, "ncclNetPlugin_v10"))) {
    lib->version = 10, lib->v10 = t10, lib->name = t10->name ? t10->name : "";
  } else if (auto* t9 = static_cast<const ncclNet_v9_t*>(dlsym(h, "ncclNetPlugin_v9"))) {
    lib->version = 9, lib->v9 = t9, lib->name = t9->name ? t9->name : "";
  } else if (auto* t8 = static_cast<const ncclNet_v8_t*>(dlsym(h, "ncclNetPlugin_v8"))) {
    lib->version = 8, lib->v8 = t8, lib->name = t8->name ? t8->name : "";
  } else {
    std::string older;
    for (int v = 7; v >= 2 && older.empty(); --v) {
      const std::string sym = "ncclNetPlugin_v" + std::to_string(v);
      if (dlsym(h, sym.c_str())) older = sym;
    }
    *why = lib->path + (older.empty() ? ": exports no ncclNetPlugin_vN table"
                                      : ": exports " + older + " only; loom loads v8 to v11");
    dlclose(h);
    return nullptr;
  }
  if (lib->name.empty()) lib->name = "plugin";
  loaded[candidate] = lib;
  byHandle[h] = lib;
  return lib;
}

// init for one backend: v11 a context of its own; older versions once per process.
Result<std::unique_ptr<Backend>> start(const std::shared_ptr<Library>& lib, const Context& ctx) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto pc = std::make_shared<PluginContext>();
  pc->lib = lib;
  const Library& l = *lib;
  if (l.version == 11) {
    ncclNetCommConfig_v11_t config{kNcclNetTrafficClassUndef};
    LOOM_TRY(l.check(l.v11->init(&pc->ctx, ctx.commHash, &config, pluginLog, noProfiler), "init"));
  } else {
    if (!lib->initDone) {
      ncclNetResult_t r = l.version == 10  ? l.v10->init(pluginLog, noProfiler)
                          : l.version == 9 ? l.v9->init(pluginLog)
                                           : l.v8->init(pluginLog);
      lib->initStatus = l.check(r, "init");
      lib->initDone = true;
    }
    LOOM_TRY(lib->initStatus);
  }
  int ndev = 0;
  ncclNetResult_t r = l.version == 11   ? l.v11->devices(&ndev)
                      : l.version == 10 ? l.v10->devices(&ndev)
                      : l.version == 9  ? l.v9->devices(&ndev)
                                        : l.v8->devices(&ndev);
  LOOM_TRY(l.check(r, "devices"));
  if (ndev <= 0)
    return errorf(Code::kSystemError, "net plugin %s (%s): no devices", l.name.c_str(),
                  l.path.c_str());
  auto b = std::make_unique<PluginBackend>(std::move(pc), ndev);
  // A device loom cannot drive (GPU offload) rules the plugin out here, before it is chosen.
  for (int d = 0; d < ndev; ++d) {
    Properties p;
    LOOM_TRY(b->properties(d, &p));
  }
  return std::unique_ptr<Backend>(std::move(b));
}

bool endsWith(const std::string& s, const char* tail) {
  const size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

}  // namespace

std::vector<std::vector<std::string>> candidateLibraries(const std::string& setting) {
  std::vector<std::vector<std::string>> out;
  if (setting.empty()) return {{"libnccl-net.so"}};
  if (strcasecmp(setting.c_str(), "none") == 0) return out;
  size_t start = 0;
  while (start <= setting.size()) {
    size_t comma = setting.find(',', start);
    if (comma == std::string::npos) comma = setting.size();
    const std::string name = setting.substr(start, comma - start);
    start = comma + 1;
    if (name.empty()) continue;
    std::vector<std::string> group{name};
    const bool isLibName = name.rfind("lib", 0) == 0 && endsWith(name, ".so");
    if (name.find('/') == std::string::npos && !isLibName)
      group.push_back("libnccl-net-" + name + ".so");
    out.push_back(std::move(group));
  }
  return out;
}

Result<std::unique_ptr<Backend>> makePluginBackend(const Context& ctx, const std::string& wanted,
                                                   std::string* why) {
  why->clear();
  const std::string setting = settings::get(settings::kNetPlugin);
  std::string reasons;
  auto add = [&](const std::string& r) { reasons += (reasons.empty() ? "" : "; ") + r; };
  for (const auto& group : candidateLibraries(setting)) {
    std::shared_ptr<Library> lib;
    for (const auto& name : group) {
      std::string w;
      lib = open(name, &w);
      if (lib) break;
      add(w);
    }
    if (!lib) continue;
    if (!wanted.empty() && strcasecmp(lib->name.c_str(), wanted.c_str()) != 0) {
      add(lib->path + " is the plugin " + lib->name + ", not LOOM_NET's " + wanted);
      continue;
    }
    auto b = start(lib, ctx);
    if (!b) {
      add(b.status().message());
      continue;
    }
    static std::mutex mu;
    static std::set<std::string> said;
    std::lock_guard<std::mutex> lock(mu);
    if (said.insert(lib->path).second)
      LOOM_INFO(kNet, "net/plugin: NCCL network plugin %s (ncclNetPlugin_v%d from %s), %d devices",
                lib->name.c_str(), lib->version, lib->path.c_str(), (*b)->devices());
    return b;
  }
  *why = reasons;
  if (!reasons.empty()) {
    static std::mutex mu;
    static std::set<std::string> said;
    std::lock_guard<std::mutex> lock(mu);
    if (said.insert(setting + "|" + reasons).second) {
      if (setting.empty())
        LOOM_INFO(kNet, "net/plugin: no external plugin (%s); loom's own network backends",
                  reasons.c_str());
      else
        LOOM_WARN(kNet,
                  "LOOM_NET_PLUGIN/NCCL_NET_PLUGIN=%s: no plugin used (%s); loom's own network "
                  "backends instead",
                  setting.c_str(), reasons.c_str());
    }
  }
  return std::unique_ptr<Backend>();
}

}  // namespace loom::transport::net::plugin
