#include "transports/net/ucx/ucp_calls.h"

#include <dlfcn.h>

#include <string>

namespace loom::transport::net::ucx {

namespace {

struct Loaded {
  UcpCalls calls;
  Status status;
};

Loaded load() {
  Loaded out;
  void* lib = dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* err = dlerror();
    out.status = errorf(Code::kSystemError,
                        "libucp.so.0 cannot be loaded (%s): install UCX (Debian and Ubuntu: "
                        "libucx0)",
                        err ? err : "dlopen failed");
    return out;
  }
  std::string missing;
  auto sym = [&](const char* name) -> void* {
    void* p = dlsym(lib, name);  // also finds libucs's, which libucp depends on
    if (!p) missing += std::string(missing.empty() ? "" : ", ") + name;
    return p;
  };
  UcpCalls& c = out.calls;
  c.getVersion = reinterpret_cast<decltype(c.getVersion)>(sym("ucp_get_version"));
  c.configRead = reinterpret_cast<decltype(c.configRead)>(sym("ucp_config_read"));
  c.configRelease = reinterpret_cast<decltype(c.configRelease)>(sym("ucp_config_release"));
  c.configModify = reinterpret_cast<decltype(c.configModify)>(sym("ucp_config_modify"));
  c.initVersion = reinterpret_cast<decltype(c.initVersion)>(sym("ucp_init_version"));
  c.cleanup = reinterpret_cast<decltype(c.cleanup)>(sym("ucp_cleanup"));
  c.contextQuery = reinterpret_cast<decltype(c.contextQuery)>(sym("ucp_context_query"));
  c.workerCreate = reinterpret_cast<decltype(c.workerCreate)>(sym("ucp_worker_create"));
  c.workerDestroy = reinterpret_cast<decltype(c.workerDestroy)>(sym("ucp_worker_destroy"));
  c.workerGetAddress =
      reinterpret_cast<decltype(c.workerGetAddress)>(sym("ucp_worker_get_address"));
  c.workerReleaseAddress =
      reinterpret_cast<decltype(c.workerReleaseAddress)>(sym("ucp_worker_release_address"));
  c.workerProgress = reinterpret_cast<decltype(c.workerProgress)>(sym("ucp_worker_progress"));
  c.workerGetEfd = reinterpret_cast<decltype(c.workerGetEfd)>(sym("ucp_worker_get_efd"));
  c.workerArm = reinterpret_cast<decltype(c.workerArm)>(sym("ucp_worker_arm"));
  c.epCreate = reinterpret_cast<decltype(c.epCreate)>(sym("ucp_ep_create"));
  c.epCloseNbx = reinterpret_cast<decltype(c.epCloseNbx)>(sym("ucp_ep_close_nbx"));
  c.epFlushNbx = reinterpret_cast<decltype(c.epFlushNbx)>(sym("ucp_ep_flush_nbx"));
  c.tagSendNbx = reinterpret_cast<decltype(c.tagSendNbx)>(sym("ucp_tag_send_nbx"));
  c.tagSendSyncNbx = reinterpret_cast<decltype(c.tagSendSyncNbx)>(sym("ucp_tag_send_sync_nbx"));
  c.tagRecvNbx = reinterpret_cast<decltype(c.tagRecvNbx)>(sym("ucp_tag_recv_nbx"));
  c.requestCheckStatus =
      reinterpret_cast<decltype(c.requestCheckStatus)>(sym("ucp_request_check_status"));
  c.tagRecvRequestTest =
      reinterpret_cast<decltype(c.tagRecvRequestTest)>(sym("ucp_tag_recv_request_test"));
  c.requestCancel = reinterpret_cast<decltype(c.requestCancel)>(sym("ucp_request_cancel"));
  c.requestFree = reinterpret_cast<decltype(c.requestFree)>(sym("ucp_request_free"));
  c.statusString = reinterpret_cast<decltype(c.statusString)>(sym("ucs_status_string"));
  if (!missing.empty()) {
    out.status = errorf(Code::kSystemError, "libucp.so.0 lacks %s: UCX 1.10 or newer is needed",
                        missing.c_str());
    dlclose(lib);
  }
  // Kept open for the process: UCX's transports stay loaded behind it.
  return out;
}

}  // namespace

Result<const UcpCalls*> loadUcp() {
  static const Loaded loaded = load();
  if (!loaded.status) return loaded.status;
  return &loaded.calls;
}

}  // namespace loom::transport::net::ucx
