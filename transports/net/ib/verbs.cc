#include "transports/net/ib/verbs.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "common/settings.h"
#include "transports/net/ib/emulator.h"

namespace loom::transport::net::ib {

namespace {

// The fast-path calls are inline in rdma-core: they go through the provider's ops.
int realPostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  return qp->context->ops.post_send(qp, wr, bad);
}
int realPostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  return qp->context->ops.post_recv(qp, wr, bad);
}
int realPollCq(ibv_cq* cq, int n, ibv_wc* wc) {
  return cq->context->ops.poll_cq(cq, n, wc);
}

using QueryGidEx = int (*)(ibv_context*, uint32_t, uint32_t, ibv_gid_entry*, uint32_t, size_t);
QueryGidEx gQueryGidEx = nullptr;
int realQueryGidEx(ibv_context* context, uint32_t port, uint32_t index, ibv_gid_entry* entry) {
  return gQueryGidEx(context, port, index, entry, 0, sizeof(*entry));
}

struct Loaded {
  Verbs verbs;
  Status status;
};

Loaded load() {
  Loaded out;
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    out.status = errorf(Code::kSystemError,
                        "libibverbs.so.1 cannot be loaded (%s): install rdma-core's libibverbs1",
                        err ? err : "dlopen failed");
    return out;
  }
  std::string missing;
  // The versions rdma-core gives these symbols (the unversioned lookup could find the
  // 1.0 compat ones, whose structs differ).
  auto sym = [&](const char* name, const char* version) -> void* {
    void* p = dlvsym(lib, name, version);
    if (!p) p = dlsym(lib, name);
    if (!p) missing += std::string(missing.empty() ? "" : ", ") + name;
    return p;
  };
  Verbs& v = out.verbs;
  v.provider = "libibverbs.so.1";
  v.getDeviceList =
      reinterpret_cast<decltype(v.getDeviceList)>(sym("ibv_get_device_list", "IBVERBS_1.1"));
  v.freeDeviceList =
      reinterpret_cast<decltype(v.freeDeviceList)>(sym("ibv_free_device_list", "IBVERBS_1.1"));
  v.getDeviceName =
      reinterpret_cast<decltype(v.getDeviceName)>(sym("ibv_get_device_name", "IBVERBS_1.1"));
  v.openDevice = reinterpret_cast<decltype(v.openDevice)>(sym("ibv_open_device", "IBVERBS_1.1"));
  v.closeDevice = reinterpret_cast<decltype(v.closeDevice)>(sym("ibv_close_device", "IBVERBS_1.1"));
  v.queryDevice = reinterpret_cast<decltype(v.queryDevice)>(sym("ibv_query_device", "IBVERBS_1.1"));
  v.queryPort = reinterpret_cast<decltype(v.queryPort)>(sym("ibv_query_port", "IBVERBS_1.1"));
  gQueryGidEx = reinterpret_cast<QueryGidEx>(sym("_ibv_query_gid_ex", "IBVERBS_1.11"));
  v.queryGidEx = realQueryGidEx;
  v.allocPd = reinterpret_cast<decltype(v.allocPd)>(sym("ibv_alloc_pd", "IBVERBS_1.1"));
  v.deallocPd = reinterpret_cast<decltype(v.deallocPd)>(sym("ibv_dealloc_pd", "IBVERBS_1.1"));
  v.regMr = reinterpret_cast<decltype(v.regMr)>(sym("ibv_reg_mr", "IBVERBS_1.1"));
  v.deregMr = reinterpret_cast<decltype(v.deregMr)>(sym("ibv_dereg_mr", "IBVERBS_1.1"));
  v.createCq = reinterpret_cast<decltype(v.createCq)>(sym("ibv_create_cq", "IBVERBS_1.1"));
  v.destroyCq = reinterpret_cast<decltype(v.destroyCq)>(sym("ibv_destroy_cq", "IBVERBS_1.1"));
  v.createQp = reinterpret_cast<decltype(v.createQp)>(sym("ibv_create_qp", "IBVERBS_1.1"));
  v.modifyQp = reinterpret_cast<decltype(v.modifyQp)>(sym("ibv_modify_qp", "IBVERBS_1.1"));
  v.destroyQp = reinterpret_cast<decltype(v.destroyQp)>(sym("ibv_destroy_qp", "IBVERBS_1.1"));
  v.wcStatusStr =
      reinterpret_cast<decltype(v.wcStatusStr)>(sym("ibv_wc_status_str", "IBVERBS_1.1"));
  // Optional: rdma-core 34 and newer.
  v.regDmabufMr =
      reinterpret_cast<decltype(v.regDmabufMr)>(dlvsym(lib, "ibv_reg_dmabuf_mr", "IBVERBS_1.12"));
  v.postSend = realPostSend;
  v.postRecv = realPostRecv;
  v.pollCq = realPollCq;
  if (!missing.empty()) {
    out.status =
        errorf(Code::kSystemError,
               "libibverbs.so.1 lacks %s: rdma-core 32 or newer is needed (_ibv_query_gid_ex)",
               missing.c_str());
    dlclose(lib);
  }
  // Kept open for the process: providers stay loaded behind it.
  return out;
}

std::atomic<const Verbs*> gTesting{nullptr};

}  // namespace

Result<const Verbs*> loadVerbs() {
  static const Loaded loaded = load();
  if (!loaded.status) return loaded.status;
  return &loaded.verbs;
}

Result<const Verbs*> activeVerbs() {
  if (const Verbs* v = gTesting.load()) return v;
  const std::string spec = settings::get(settings::kIbEmulate);
  if (!spec.empty()) {
    LOOM_ASSIGN_OR_RETURN(EmulatorConfig config, parseEmulatorSpec(spec));
    return emulatedVerbs(config);
  }
  return loadVerbs();
}

void setVerbsForTesting(const Verbs* verbs) {
  gTesting.store(verbs);
}

}  // namespace loom::transport::net::ib
