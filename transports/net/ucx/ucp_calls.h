// The UCP table: every libucp call the ucx backend makes goes through one of these
// function pointers, filled from libucp.so.0 opened with dlopen, so one binary runs with
// and without UCX installed. The types are UCX's own (<ucp/api/ucp.h>, Debian's
// libucx-dev); UCX's inline wrappers (ucp_init) are written here against the exported
// functions behind them.
#pragma once

#include <ucp/api/ucp.h>

#include "common/status.h"

namespace loom::transport::net::ucx {

struct UcpCalls {
  void (*getVersion)(unsigned* major, unsigned* minor, unsigned* release) = nullptr;
  ucs_status_t (*configRead)(const char* envPrefix, const char* filename,
                             ucp_config_t** config) = nullptr;
  void (*configRelease)(ucp_config_t* config) = nullptr;
  ucs_status_t (*configModify)(ucp_config_t* config, const char* name, const char* value) = nullptr;
  ucs_status_t (*initVersion)(unsigned apiMajor, unsigned apiMinor, const ucp_params_t* params,
                              const ucp_config_t* config, ucp_context_h* context) = nullptr;
  void (*cleanup)(ucp_context_h context) = nullptr;
  ucs_status_t (*contextQuery)(ucp_context_h context, ucp_context_attr_t* attr) = nullptr;

  ucs_status_t (*workerCreate)(ucp_context_h context, const ucp_worker_params_t* params,
                               ucp_worker_h* worker) = nullptr;
  void (*workerDestroy)(ucp_worker_h worker) = nullptr;
  ucs_status_t (*workerGetAddress)(ucp_worker_h worker, ucp_address_t** address,
                                   size_t* length) = nullptr;
  void (*workerReleaseAddress)(ucp_worker_h worker, ucp_address_t* address) = nullptr;
  unsigned (*workerProgress)(ucp_worker_h worker) = nullptr;
  ucs_status_t (*workerGetEfd)(ucp_worker_h worker, int* fd) = nullptr;
  ucs_status_t (*workerArm)(ucp_worker_h worker) = nullptr;

  ucs_status_t (*epCreate)(ucp_worker_h worker, const ucp_ep_params_t* params,
                           ucp_ep_h* ep) = nullptr;
  ucs_status_ptr_t (*epCloseNbx)(ucp_ep_h ep, const ucp_request_param_t* param) = nullptr;
  ucs_status_ptr_t (*epFlushNbx)(ucp_ep_h ep, const ucp_request_param_t* param) = nullptr;

  ucs_status_ptr_t (*tagSendNbx)(ucp_ep_h ep, const void* buffer, size_t count, ucp_tag_t tag,
                                 const ucp_request_param_t* param) = nullptr;
  ucs_status_ptr_t (*tagSendSyncNbx)(ucp_ep_h ep, const void* buffer, size_t count, ucp_tag_t tag,
                                     const ucp_request_param_t* param) = nullptr;
  ucs_status_ptr_t (*tagRecvNbx)(ucp_worker_h worker, void* buffer, size_t count, ucp_tag_t tag,
                                 ucp_tag_t mask, const ucp_request_param_t* param) = nullptr;
  ucs_status_t (*requestCheckStatus)(void* request) = nullptr;
  ucs_status_t (*tagRecvRequestTest)(void* request, ucp_tag_recv_info_t* info) = nullptr;
  void (*requestCancel)(ucp_worker_h worker, void* request) = nullptr;
  void (*requestFree)(void* request) = nullptr;

  const char* (*statusString)(ucs_status_t status) = nullptr;  // libucs, through libucp
};

// libucp.so.0 through dlopen, once per process; the error says what could not be loaded
// (the library, or a symbol: a UCX older than the one loom needs, 1.10).
Result<const UcpCalls*> loadUcp();

}  // namespace loom::transport::net::ucx
