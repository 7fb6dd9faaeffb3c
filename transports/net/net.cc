// Which network backend a communicator gets: LOOM_NET (or NCCL_NET), an external NCCL
// plugin (LOOM_NET_PLUGIN), or the best one this machine can use.
#include "transports/net/net.h"

#include <strings.h>

#include <climits>
#include <cstdlib>
#include <mutex>

#include "common/log.h"
#include "common/settings.h"
#include "transports/net/plugin/plugin.h"
#ifdef LOOM_HAVE_VERBS
#include "transports/net/ib/ib.h"
#endif
#ifdef LOOM_HAVE_UCX
#include "transports/net/ucx/ucx.h"
#endif

namespace loom::transport::net {

Result<std::unique_ptr<RecvComm>> SendComm::reverse() {
  return Status(Code::kInternalError, "this network backend's connections go one way only");
}
Result<std::unique_ptr<SendComm>> RecvComm::reverse() {
  return Status(Code::kInternalError, "this network backend's connections go one way only");
}

namespace {

// The built backends, for the messages that list them.
#ifdef LOOM_HAVE_VERBS
constexpr const char* kIbName = ", IB";
#else
constexpr const char* kIbName = "";
#endif
#ifdef LOOM_HAVE_UCX
constexpr const char* kUcxName = ", UCX";
#else
constexpr const char* kUcxName = "";
#endif

bool automatic(const std::string& name) {
  return strcasecmp(name.c_str(), "auto") == 0;
}

// ib as LOOM_NET asks: an error where it was asked for and cannot be had, null where auto
// found none (said once at INFO).
Result<std::unique_ptr<Backend>> tryIb(const Context& ctx, const std::string& name) {
#ifdef LOOM_HAVE_VERBS
  auto ib = ib::makeIbBackend(ctx);
  if (ib) return ib;
  if (!automatic(name)) return ib.status().withContext("LOOM_NET/NCCL_NET=" + name);
  static std::once_flag once;
  std::call_once(once, [&] {
    LOOM_INFO(kNet, "net/ib: not used (%s); sockets instead", ib.status().message().c_str());
  });
  return std::unique_ptr<Backend>();
#else
  if (automatic(name)) return std::unique_ptr<Backend>();
  return errorf(Code::kInvalidUsage,
                "LOOM_NET/NCCL_NET=%s: this build has no ib backend (it was built without "
                "rdma-core's headers, libibverbs-dev); there is: Socket",
                name.c_str());
#endif
}

// ucx, which is used only where asked for.
Result<std::unique_ptr<Backend>> tryUcx(const Context& ctx, const std::string& name) {
#ifdef LOOM_HAVE_UCX
  auto ucx = ucx::makeUcxBackend(ctx);
  if (!ucx) return ucx.status().withContext("LOOM_NET/NCCL_NET=" + name);
  return ucx;
#else
  return errorf(Code::kInvalidUsage,
                "LOOM_NET/NCCL_NET=%s: this build has no ucx backend (it was built without "
                "UCX's headers, libucx-dev); there is: Socket%s",
                name.c_str(), kIbName);
#endif
}

}  // namespace

Properties interfaceProperties(const NetInterface& i) {
  Properties p;
  p.name = i.name;
  p.ptrSupport = kPtrHost;
  const int mbps = interfaceSpeedMbps(i.name);
  p.speedMbps = mbps > 0 ? mbps : kUnknownLinkMbps;
  char real[PATH_MAX];
  if (::realpath(("/sys/class/net/" + i.name + "/device").c_str(), real)) p.pciPath = real;
  p.maxRecvs = 1;
  return p;
}

namespace {

bool builtinName(const std::string& name) {
  return automatic(name) || strcasecmp(name.c_str(), "ib") == 0 ||
         strcasecmp(name.c_str(), "ucx") == 0 || strcasecmp(name.c_str(), "socket") == 0;
}

// loom's own backends other than sockets, as `name` (auto, ib, ucx, socket) asks.
Result<std::unique_ptr<Backend>> builtinNonSocket(const Context& ctx, const std::string& name) {
  if (automatic(name) || strcasecmp(name.c_str(), "ib") == 0) return tryIb(ctx, name);
  if (strcasecmp(name.c_str(), "ucx") == 0) return tryUcx(ctx, name);
  return std::unique_ptr<Backend>();
}

}  // namespace

Result<std::unique_ptr<Backend>> makeNonSocketBackend(const Context& ctx) {
  const std::string name = settings::get(settings::kNet);
  if (!builtinName(name) || automatic(name)) {
    // An external plugin first, as NCCL does (LOOM_NET then names either it or nothing).
    std::string why;
    LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Backend> p,
                          plugin::makePluginBackend(ctx, automatic(name) ? "" : name, &why));
    if (p) return p;
    if (!automatic(name))
      return errorf(Code::kInvalidUsage,
                    "LOOM_NET/NCCL_NET=%s: no such network backend (there is: Socket%s%s%s%s)",
                    name.c_str(), kIbName, kUcxName, why.empty() ? "" : "; plugins: ", why.c_str());
  }
  return builtinNonSocket(ctx, name);
}

Result<std::unique_ptr<Backend>> makeBackend(const Context& ctx) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Backend> b, makeNonSocketBackend(ctx));
  if (b) return b;
  return makeSocketBackend(ctx);
}

Result<std::unique_ptr<Backend>> makeBuiltinBackend(const Context& ctx, const std::string& name) {
  if (!builtinName(name))
    return errorf(Code::kInvalidUsage,
                  "%s: no such network backend of loom's (there is: Socket%s%s)", name.c_str(),
                  kIbName, kUcxName);
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Backend> b, builtinNonSocket(ctx, name));
  if (b) return b;
  return makeSocketBackend(ctx);
}

}  // namespace loom::transport::net
