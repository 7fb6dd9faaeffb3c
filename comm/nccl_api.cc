// The NCCL C API: every entry point loom exports through libnccl.so.2. Each one
// validates its arguments, converts to the C++ core and never lets an exception or a
// crash through. pnccl* names (NCCL's profiling aliases) point at the same code.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/api_state.h"
#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "comm/unique_id.h"
#include "common/cuda_probe.h"
#include "common/log.h"
#include "common/settings.h"
#include "nccl.h"

using loom::Code;
using loom::DataType;
using loom::errorf;
using loom::Status;
using loom::collectives::CollType;
using loom::comm::fail;
using loom::comm::Operation;

namespace {

// Runs `body`, turning exceptions into ncclInternalError.
template <typename F>
ncclResult_t guarded(const char* fn, F&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(errorf(Code::kSystemError, "%s: out of host memory", fn));
  } catch (const std::exception& e) {
    return fail(errorf(Code::kInternalError, "%s: unexpected exception: %s", fn, e.what()));
  } catch (...) {
    return fail(errorf(Code::kInternalError, "%s: unexpected exception", fn));
  }
}

// Takes `hold` on a live communicator (kept until the caller's call returns), or says why not.
Status checkComm(const char* fn, const ncclComm* comm, loom::comm::CommHold* hold) {
  if (!comm) return errorf(Code::kInvalidArgument, "%s: comm is NULL", fn);
  if (!hold->take(comm)) {
    return errorf(Code::kInvalidArgument, "%s: comm %p is not a live communicator (destroyed?)", fn,
                  static_cast<const void*>(comm));
  }
  return Status::ok();
}

// Enums are read through their bytes: a caller's out-of-range value is not a valid
// ncclDataType_t, and loading it as one is undefined behaviour.
int rawEnum(const void* e) {
  int v;
  std::memcpy(&v, e, sizeof(v));
  return v;
}

Status checkType(const char* fn, const ncclDataType_t& t) {
  if (!loom::isValidDataType(rawEnum(&t))) {
    return errorf(Code::kInvalidArgument, "%s: invalid datatype %d (valid: 0..%d)", fn, rawEnum(&t),
                  ncclNumTypes - 1);
  }
  return Status::ok();
}

Status checkBuffer(const char* fn, const char* name, const void* p, size_t count, int cudaDev) {
  if (!p && count > 0) {
    return errorf(Code::kInvalidArgument, "%s: %s is NULL with count %zu", fn, name, count);
  }
  if (count > 0 && cudaDev < 0 && loom::cuda::isDevicePointer(p)) {
    return errorf(Code::kInvalidUsage,
                  "%s: %s is GPU memory but the communicator was made for host memory (no GPU "
                  "was current at init, or LOOM_DEVICE=cpu): create it with a CUDA device "
                  "current, or pass host buffers",
                  fn, name);
  }
  return Status::ok();
}

Status checkBytes(const char* fn, size_t count, size_t multiplier, size_t elem) {
  size_t total;
  if (__builtin_mul_overflow(count, multiplier, &total) ||
      __builtin_mul_overflow(total, elem, &total) || total > (size_t{1} << 62)) {
    return errorf(Code::kInvalidArgument, "%s: count %zu overflows the addressable size", fn,
                  count);
  }
  return Status::ok();
}

ncclResult_t submit(const char* fn, const void* sendbuff, void* recvbuff, size_t count,
                    ncclDataType_t datatype, int op, int root, ncclComm_t comm, cudaStream_t stream,
                    CollType type, bool reduces) {
  return guarded(fn, [&]() -> ncclResult_t {
    loom::comm::CommHold hold;
    Status st = checkComm(fn, comm, &hold);
    if (st) st = checkType(fn, datatype);
    if (!st) return fail(st);
    auto& impl = *comm->impl;
    const int n = impl.nranks();
    const size_t esz = loom::dataTypeSize(static_cast<DataType>(datatype));
    if (reduces && !impl.validOp(op)) {
      return fail(errorf(Code::kInvalidArgument, "%s: invalid reduction op %d", fn, op));
    }
    if (reduces) {
      st = impl.checkOpType(op, static_cast<DataType>(datatype));
      if (!st) return fail(st.withContext(fn));
    }
    bool rooted = type == CollType::kBroadcast || type == CollType::kReduce;
    if (rooted && (root < 0 || root >= n)) {
      return fail(errorf(Code::kInvalidArgument, "%s: root %d out of range [0, %d)", fn, root, n));
    }
    size_t inMul = 1, outMul = 1;
    if (type == CollType::kAllGather) outMul = n;
    if (type == CollType::kReduceScatter) inMul = n;
    if (type == CollType::kAllToAll) inMul = outMul = n;
    st = checkBytes(fn, count, std::max(inMul, outMul), esz);
    bool needSend = !(type == CollType::kBroadcast && impl.rank() != root);
    bool needRecv = !(type == CollType::kReduce && impl.rank() != root);
    if (st && needSend) st = checkBuffer(fn, "sendbuff", sendbuff, count, impl.cudaDevice());
    if (st && needRecv) st = checkBuffer(fn, "recvbuff", recvbuff, count, impl.cudaDevice());
    if (!st) return fail(st);
    Operation o;
    o.type = type;
    o.sendbuff = sendbuff;
    o.recvbuff = recvbuff;
    o.count = count;
    o.dtype = static_cast<DataType>(datatype);
    o.ncclOp = op;
    o.root = root;
    o.stream = stream;
    // An empty call on a GPU communicator counts as device work (so it orders with it).
    o.onDevice = impl.cudaDevice() >= 0 &&
                 (count == 0 || loom::cuda::isDevicePointer(needSend ? sendbuff : recvbuff));
    return loom::comm::enqueue(comm, o);
  });
}

ncclResult_t initRank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank,
                      const ncclConfig_t* config, bool deferrable = false, int device = -2) {
  if (!out) return fail(errorf(Code::kInvalidArgument, "ncclCommInitRank: comm pointer is NULL"));
  *out = nullptr;
  if (nranks < 1) {
    return fail(errorf(Code::kInvalidArgument, "ncclCommInitRank: nranks %d must be >= 1", nranks));
  }
  if (rank < 0 || rank >= nranks) {
    return fail(errorf(Code::kInvalidArgument, "ncclCommInitRank: rank %d out of range [0, %d)",
                       rank, nranks));
  }
  auto contents = loom::comm::decodeId(id);
  if (!contents) return fail(contents.status());
  loom::comm::CommOptions options;
  if (config && config->commName) options.name = config->commName;
  // The device current in the calling thread (a deferred init runs on another thread).
  options.cudaDev = device == -2 ? loom::comm::currentDevice() : device;
  if (deferrable && loom::comm::inGroup()) {
    // Inside a group (one thread creating several ranks, as nccl-tests' -g N does) every
    // rank must be joining at once: the init runs in the background and completes at
    // the outermost ncclGroupEnd, which reports its result.
    auto* handle = new ncclComm{0, nullptr};
    loom::comm::deferInit(handle, [handle, c = *contents, rank, nranks, options]() -> Status {
      auto made = loom::comm::Communicator::create(c, rank, nranks, options);
      if (!made)
        return made.status().withContext("ncclCommInitRank(rank " + std::to_string(rank) + ")");
      handle->impl = std::move(made).value();
      handle->magic = loom::comm::kCommMagic;
      return Status::ok();
    });
    *out = handle;
    return ncclSuccess;
  }
  auto c = loom::comm::Communicator::create(*contents, rank, nranks, options);
  if (!c)
    return fail(c.status().withContext("ncclCommInitRank(rank " + std::to_string(rank) + ")"));
  auto* handle = new ncclComm{loom::comm::kCommMagic, std::move(c).value()};
  loom::comm::registerComm(handle);
  *out = handle;
  return ncclSuccess;
}

ncclResult_t makeId(ncclUniqueId* id) {
  std::string env = loom::settings::get(loom::settings::kCommId);
  if (!env.empty()) {
    auto addr = loom::SocketAddress::parse(env);
    if (!addr) {
      return fail(addr.status().withContext("LOOM_COMM_ID/NCCL_COMM_ID"));
    }
    const std::string secret = loom::settings::get(loom::settings::kCommSecret);
    if (secret.empty()) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        LOOM_WARN(kBootstrap,
                  "LOOM_COMM_ID=%s without LOOM_COMM_SECRET: anyone who can reach that port can "
                  "join as a rank and read the ranks' addresses; set LOOM_COMM_SECRET to the same "
                  "value on every rank (a job id or a random token from the launcher)",
                  env.c_str());
      });
    }
    loom::comm::encodeId(loom::comm::idFromAddress(*addr, secret), id);
    return ncclSuccess;
  }
  auto ifs = loom::findInterfacesFromSettings();
  if (!ifs) return fail(ifs.status().withContext("ncclGetUniqueId"));
  loom::comm::IdContents c;
  c.root = ifs->front().address;
  c.root.setPort(0);
  Status st = loom::comm::randomSecret(c.secret);
  if (st) st = loom::comm::startRoot(&c, loom::settings::get(loom::settings::kTimeoutMs));
  if (!st) return fail(st.withContext("ncclGetUniqueId"));
  LOOM_INFO(kBootstrap, "ncclGetUniqueId: bootstrap root on %s (%s)", c.root.toString().c_str(),
            ifs->front().name.c_str());
  loom::comm::encodeId(c, id);
  return ncclSuccess;
}

ncclResult_t destroyComm(ncclComm_t comm, bool abort) {
  const char* fn = abort ? "ncclCommAbort" : "ncclCommDestroy";
  if (!comm)
    return abort ? ncclSuccess : fail(errorf(Code::kInvalidArgument, "%s: comm is NULL", fn));
  // Unregistering is the check: of two threads destroying one communicator, one wins; from
  // here on no call can take a hold on it, and the holds already taken are waited for.
  if (!loom::comm::unregisterComm(comm)) {
    return fail(errorf(Code::kInvalidArgument,
                       "%s: comm %p is not a live communicator (destroyed?)", fn,
                       static_cast<const void*>(comm)));
  }
  if (abort) {
    comm->impl->abort();
    // A call still running on another thread sees the abort within ~100 ms.
    if (!comm->impl->waitIdle(10000)) {
      LOOM_WARN(kInit,
                "ncclCommAbort: an operation did not stop within 10 s; leaking the "
                "communicator instead of freeing memory in use");
      return ncclSuccess;
    }
  } else if (!comm->impl->waitIdle(loom::settings::get(loom::settings::kTimeoutMs))) {
    return fail(errorf(Code::kInvalidUsage, "ncclCommDestroy: the communicator is still in use"));
  }
  comm->magic = 0;
  delete comm;
  return ncclSuccess;
}

}  // namespace

#define LOOM_ALIAS(name) __attribute__((alias(#name), visibility("default")))
#define LOOM_API extern "C" __attribute__((visibility("default")))

LOOM_API ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail(errorf(Code::kInvalidArgument, "ncclGetVersion: version is NULL"));
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
LOOM_API ncclResult_t pncclGetVersion(int* version) LOOM_ALIAS(ncclGetVersion);

LOOM_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return fail(errorf(Code::kInvalidArgument, "ncclGetUniqueId: uniqueId is NULL"));
  return guarded("ncclGetUniqueId", [&] { return makeId(uniqueId); });
}
LOOM_API ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId) LOOM_ALIAS(ncclGetUniqueId);

LOOM_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                             int rank, ncclConfig_t* config) {
  return guarded("ncclCommInitRankConfig",
                 [&] { return initRank(comm, nranks, commId, rank, config, true); });
}
LOOM_API ncclResult_t pncclCommInitRankConfig(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*)
    LOOM_ALIAS(ncclCommInitRankConfig);

LOOM_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                       int rank) {
  return guarded("ncclCommInitRank",
                 [&] { return initRank(comm, nranks, commId, rank, nullptr, true); });
}
LOOM_API ncclResult_t pncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int)
    LOOM_ALIAS(ncclCommInitRank);

LOOM_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                               ncclUniqueId* commIds, ncclConfig_t* config) {
  if (nId < 1 || !commIds) {
    return fail(errorf(Code::kInvalidArgument, "ncclCommInitRankScalable: needs at least one id"));
  }
  return guarded("ncclCommInitRankScalable",
                 [&] { return initRank(newcomm, nranks, commIds[0], myrank, config, true); });
}
LOOM_API ncclResult_t pncclCommInitRankScalable(ncclComm_t*, int, int, int, ncclUniqueId*,
                                                ncclConfig_t*) LOOM_ALIAS(ncclCommInitRankScalable);

LOOM_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  return guarded("ncclCommInitAll", [&]() -> ncclResult_t {
    if (!comms) return fail(errorf(Code::kInvalidArgument, "ncclCommInitAll: comms is NULL"));
    if (ndev < 1) return fail(errorf(Code::kInvalidArgument, "ncclCommInitAll: ndev %d < 1", ndev));
    ncclUniqueId id;
    // Ranks of one process always meet over loopback.
    loom::comm::IdContents c;
    auto lo = loom::SocketAddress::parse("127.0.0.1:0");
    if (!lo) return fail(lo.status());
    c.root = *lo;
    Status st = loom::comm::randomSecret(c.secret);
    if (st) st = loom::comm::startRoot(&c, loom::settings::get(loom::settings::kTimeoutMs));
    if (!st) return fail(st.withContext("ncclCommInitAll"));
    loom::comm::encodeId(c, &id);
    std::vector<ncclResult_t> results(ndev, ncclSuccess);
    std::vector<std::string> errors(ndev);
    std::vector<std::thread> threads;
    // GPUs devlist[i] (or i), as NCCL; host memory when there are none.
    const bool gpus = loom::comm::currentDevice() >= 0;
    for (int i = 0; i < ndev; ++i) {
      threads.emplace_back([&, i] {
        int dev = gpus ? (devlist ? devlist[i] : i) : -1;
        results[i] = initRank(&comms[i], ndev, id, i, nullptr, false, dev);
        if (results[i] != ncclSuccess) errors[i] = loom::comm::lastError();
      });
    }
    for (auto& t : threads) t.join();
    for (int i = 0; i < ndev; ++i) {
      if (results[i] != ncclSuccess) {
        for (int j = 0; j < ndev; ++j) {
          if (comms[j]) destroyComm(comms[j], true);
          comms[j] = nullptr;
        }
        return fail(Status(static_cast<Code>(results[i]), errors[i]));
      }
    }
    return ncclSuccess;
  });
}
LOOM_API ncclResult_t pncclCommInitAll(ncclComm_t*, int, const int*) LOOM_ALIAS(ncclCommInitAll);

LOOM_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  loom::comm::CommHold hold;
  Status st = checkComm("ncclCommFinalize", comm, &hold);
  if (st && comm->impl->revoked()) {
    st = errorf(Code::kInvalidUsage,
                "ncclCommFinalize: the communicator was revoked (ncclCommRevoke): destroy it "
                "instead");
  }
  return st ? ncclSuccess : fail(st);
}
LOOM_API ncclResult_t pncclCommFinalize(ncclComm_t) LOOM_ALIAS(ncclCommFinalize);

LOOM_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return guarded("ncclCommDestroy", [&] { return destroyComm(comm, false); });
}
LOOM_API ncclResult_t pncclCommDestroy(ncclComm_t) LOOM_ALIAS(ncclCommDestroy);

LOOM_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return guarded("ncclCommAbort", [&] { return destroyComm(comm, true); });
}
LOOM_API ncclResult_t pncclCommAbort(ncclComm_t) LOOM_ALIAS(ncclCommAbort);

LOOM_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  // Local, as in NCCL: each rank revokes its own communicator (typically after a peer
  // failed), then the survivors shrink it or split it, or destroy it.
  const char* fn = "ncclCommRevoke";
  return guarded(fn, [&]() -> ncclResult_t {
    loom::comm::CommHold hold;
    Status st = checkComm(fn, comm, &hold);
    if (!st) return fail(st);
    if (revokeFlags != NCCL_REVOKE_DEFAULT) {
      return fail(errorf(Code::kInvalidArgument,
                         "%s: revokeFlags %d is not NCCL_REVOKE_DEFAULT (0)", fn, revokeFlags));
    }
    // The calls in flight see the stop within ~100 ms, their kernels when they run.
    constexpr int64_t kWaitMs = 10000;
    if (comm->impl->revoke(kWaitMs)) return ncclSuccess;
    LOOM_WARN(kInit,
              "%s: rank %d: what the revoke stopped has not ended within %lld ms (a kernel "
              "queued behind other work on its stream?); ncclCommGetAsyncError says "
              "ncclInProgress until it has",
              fn, comm->impl->rank(), static_cast<long long>(kWaitMs));
    return ncclInProgress;
  });
}
LOOM_API ncclResult_t pncclCommRevoke(ncclComm_t, int) LOOM_ALIAS(ncclCommRevoke);

namespace {
// The id of a new communicator of `members` (parent ranks, in their new order; this rank
// among them): the first starts its root and sends the id to the others over the parent's
// bootstrap, point to point, under `tag`, so that no other rank of the parent takes part.
Status shareNewId(loom::comm::Bootstrap& bs, const std::vector<int>& members, uint64_t tag,
                  ncclUniqueId* id) {
  if (members[0] != bs.rank()) return bs.recv(members[0], tag, id, sizeof(*id));
  loom::comm::IdContents c;
  c.root = bs.address(bs.rank());
  c.root.setPort(0);
  LOOM_TRY(loom::comm::randomSecret(c.secret));
  LOOM_TRY(loom::comm::startRoot(&c, loom::settings::get(loom::settings::kTimeoutMs)));
  loom::comm::encodeId(c, id);
  for (size_t i = 1; i < members.size(); ++i) LOOM_TRY(bs.send(members[i], tag, id, sizeof(*id)));
  return Status::ok();
}
}  // namespace

LOOM_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                    ncclConfig_t* config) {
  return guarded("ncclCommSplit", [&]() -> ncclResult_t {
    loom::comm::CommHold hold;
    Status st = checkComm("ncclCommSplit", comm, &hold);
    if (!st) return fail(st);
    if (!newcomm) return fail(errorf(Code::kInvalidArgument, "ncclCommSplit: newcomm is NULL"));
    *newcomm = nullptr;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
      return fail(errorf(Code::kInvalidArgument,
                         "ncclCommSplit: color %d must be >= 0 or "
                         "NCCL_SPLIT_NOCOLOR",
                         color));
    }
    auto& impl = *comm->impl;
    st = impl.readyAsParent("ncclCommSplit");
    if (!st) return fail(st);
    auto& bs = impl.bootstrap();
    const int n = impl.nranks(), me = impl.rank();
    struct Entry {
      int color, key, rank;
    };
    std::vector<Entry> all(n);
    all[me] = {color, key, me};
    st = bs.allGather(all.data(), sizeof(Entry));
    if (!st) return fail(st.withContext("ncclCommSplit"));
    uint64_t idTag = bs.nextTag();
    if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
    std::vector<Entry> members;
    for (const auto& e : all)
      if (e.color == color) members.push_back(e);
    std::stable_sort(members.begin(), members.end(), [](const Entry& a, const Entry& b) {
      return a.key != b.key ? a.key < b.key : a.rank < b.rank;
    });
    std::vector<int> ranks;
    int newRank = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      if (members[i].rank == me) newRank = static_cast<int>(i);
      ranks.push_back(members[i].rank);
    }
    ncclUniqueId id;
    st = shareNewId(bs, ranks, idTag, &id);
    if (!st) return fail(st.withContext("ncclCommSplit"));
    return initRank(newcomm, static_cast<int>(members.size()), id, newRank, config);
  });
}
LOOM_API ncclResult_t pncclCommSplit(ncclComm_t, int, int, ncclComm_t*, ncclConfig_t*)
    LOOM_ALIAS(ncclCommSplit);

LOOM_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                     ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  // The ranks left out do not call: the others agree on the new communicator over the
  // parent's bootstrap, point to point (the lowest of them starts its root and sends the
  // id), so a left-out rank that is gone is never waited for.
  const char* fn = "ncclCommShrink";
  return guarded(fn, [&]() -> ncclResult_t {
    loom::comm::CommHold hold;
    Status st = checkComm(fn, comm, &hold);
    if (!st) return fail(st);
    if (!newcomm) return fail(errorf(Code::kInvalidArgument, "%s: newcomm is NULL", fn));
    *newcomm = nullptr;
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT) {
      return fail(errorf(Code::kInvalidArgument,
                         "%s: shrinkFlags %d is neither NCCL_SHRINK_DEFAULT nor NCCL_SHRINK_ABORT",
                         fn, shrinkFlags));
    }
    auto& impl = *comm->impl;
    const int n = impl.nranks(), me = impl.rank();
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList)) {
      return fail(errorf(Code::kInvalidArgument, "%s: excludeRanksList is %s with count %d", fn,
                         excludeRanksList ? "given" : "NULL", excludeRanksCount));
    }
    std::vector<bool> out(n, false);
    for (int i = 0; i < excludeRanksCount; ++i) {
      const int r = excludeRanksList[i];
      if (r < 0 || r >= n || out[r]) {
        return fail(errorf(Code::kInvalidArgument, "%s: excludeRanksList[%d] = %d is %s", fn, i, r,
                           r < 0 || r >= n ? "out of range" : "listed twice"));
      }
      if (r == me) {
        return fail(errorf(Code::kInvalidArgument,
                           "%s: rank %d is in excludeRanksList (the excluded ranks do not call it)",
                           fn, me));
      }
      out[r] = true;
    }
    std::vector<int> members;  // parent ranks, in order: their place is the new rank
    for (int r = 0; r < n; ++r)
      if (!out[r]) members.push_back(r);
    const int newRank =
        static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
    st = impl.readyAsParent(fn);
    if (!st) return fail(st);
    auto& bs = impl.bootstrap();
    ncclUniqueId id;
    st = shareNewId(bs, members, bs.nextTag(), &id);
    if (!st) return fail(st.withContext(fn));
    // NCCL_SHRINK_ABORT: the parent's operations still waiting (on a rank that is gone)
    // end now, with an error; the parent is then only good for ncclCommDestroy.
    if (shrinkFlags == NCCL_SHRINK_ABORT) impl.abort();
    return initRank(newcomm, static_cast<int>(members.size()), id, newRank, config);
  });
}
LOOM_API ncclResult_t pncclCommShrink(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int)
    LOOM_ALIAS(ncclCommShrink);

LOOM_API const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with LOOM_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with LOOM_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the loom developers";
    case ncclInvalidArgument: return "invalid argument (run with LOOM_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with LOOM_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
LOOM_API const char* pncclGetErrorString(ncclResult_t) LOOM_ALIAS(ncclGetErrorString);

LOOM_API const char* ncclGetLastError(ncclComm_t comm) {
  return loom::comm::lastError(comm);
}
LOOM_API const char* pncclGetLastError(ncclComm_t) LOOM_ALIAS(ncclGetLastError);

LOOM_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  loom::comm::CommHold hold;
  Status st = checkComm("ncclCommGetAsyncError", comm, &hold);
  if (!st) return fail(st);
  if (!asyncError)
    return fail(errorf(Code::kInvalidArgument, "ncclCommGetAsyncError: asyncError is NULL"));
  *asyncError = comm->impl->asyncError();
  return ncclSuccess;
}
LOOM_API ncclResult_t pncclCommGetAsyncError(ncclComm_t, ncclResult_t*)
    LOOM_ALIAS(ncclCommGetAsyncError);

LOOM_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  loom::comm::CommHold hold;
  Status st = checkComm("ncclCommCount", comm, &hold);
  if (!st) return fail(st);
  if (!count) return fail(errorf(Code::kInvalidArgument, "ncclCommCount: count is NULL"));
  *count = comm->impl->nranks();
  return ncclSuccess;
}
LOOM_API ncclResult_t pncclCommCount(const ncclComm_t, int*) LOOM_ALIAS(ncclCommCount);

LOOM_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  loom::comm::CommHold hold;
  Status st = checkComm("ncclCommCuDevice", comm, &hold);
  if (!st) return fail(st);
  if (!device) return fail(errorf(Code::kInvalidArgument, "ncclCommCuDevice: device is NULL"));
  *device = comm->impl->cudaDevice();
  return ncclSuccess;
}
LOOM_API ncclResult_t pncclCommCuDevice(const ncclComm_t, int*) LOOM_ALIAS(ncclCommCuDevice);

LOOM_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  loom::comm::CommHold hold;
  Status st = checkComm("ncclCommUserRank", comm, &hold);
  if (!st) return fail(st);
  if (!rank) return fail(errorf(Code::kInvalidArgument, "ncclCommUserRank: rank is NULL"));
  *rank = comm->impl->rank();
  return ncclSuccess;
}
LOOM_API ncclResult_t pncclCommUserRank(const ncclComm_t, int*) LOOM_ALIAS(ncclCommUserRank);

LOOM_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size,
                                       void** handle) {
  loom::comm::CommHold hold;
  Status st = checkComm("ncclCommRegister", comm, &hold);
  if (!st) return fail(st);
  if (!handle) return fail(errorf(Code::kInvalidArgument, "ncclCommRegister: handle is NULL"));
  if (!buff && size > 0) {
    return fail(
        errorf(Code::kInvalidArgument, "ncclCommRegister: buff is NULL with size %zu", size));
  }
  auto h = comm->impl->registerBuffer(buff, size);
  if (!h) return fail(h.status().withContext("ncclCommRegister"));
  *handle = h.value();
  return ncclSuccess;
}
LOOM_API ncclResult_t pncclCommRegister(const ncclComm_t, void*, size_t, void**)
    LOOM_ALIAS(ncclCommRegister);

LOOM_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  loom::comm::CommHold hold;
  Status st = checkComm("ncclCommDeregister", comm, &hold);
  if (!st) return fail(st);
  st = comm->impl->deregisterBuffer(handle);
  return st ? ncclSuccess : fail(st.withContext("ncclCommDeregister"));
}
LOOM_API ncclResult_t pncclCommDeregister(const ncclComm_t, void*) LOOM_ALIAS(ncclCommDeregister);

// NCCL's windows are collective and symmetric; loom's registration is local and serves
// windows as well: the window is a registration handle.
LOOM_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                             ncclWindow_t* win, int winFlags) {
  loom::comm::CommHold hold;
  Status st = checkComm("ncclCommWindowRegister", comm, &hold);
  if (!st) return fail(st);
  if (!win) return fail(errorf(Code::kInvalidArgument, "ncclCommWindowRegister: win is NULL"));
  *win = nullptr;
  if (!buff && size > 0) {
    return fail(
        errorf(Code::kInvalidArgument, "ncclCommWindowRegister: buff is NULL with size %zu", size));
  }
  if (winFlags & ~NCCL_WIN_COLL_SYMMETRIC) {
    return fail(
        errorf(Code::kInvalidArgument, "ncclCommWindowRegister: unknown winFlags 0x%x", winFlags));
  }
  auto h = comm->impl->registerBuffer(buff, size);
  if (!h) return fail(h.status().withContext("ncclCommWindowRegister"));
  *win = static_cast<ncclWindow_t>(h.value());
  return ncclSuccess;
}
LOOM_API ncclResult_t pncclCommWindowRegister(ncclComm_t, void*, size_t, ncclWindow_t*, int)
    LOOM_ALIAS(ncclCommWindowRegister);

LOOM_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  loom::comm::CommHold hold;
  Status st = checkComm("ncclCommWindowDeregister", comm, &hold);
  if (!st) return fail(st);
  st = comm->impl->deregisterBuffer(win);
  return st ? ncclSuccess : fail(st.withContext("ncclCommWindowDeregister"));
}
LOOM_API ncclResult_t pncclCommWindowDeregister(ncclComm_t, ncclWindow_t)
    LOOM_ALIAS(ncclCommWindowDeregister);

LOOM_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (!ptr) return fail(errorf(Code::kInvalidArgument, "ncclMemAlloc: ptr is NULL"));
  // With a GPU current this is device memory, as NCCL's; host memory otherwise (the
  // host-memory communicators' buffers).
  if (loom::comm::currentDevice() >= 0) {
    *ptr = loom::comm::deviceAlloc(size);
    if (!*ptr)
      return fail(errorf(Code::kCudaError, "ncclMemAlloc: cudaMalloc of %zu bytes failed", size));
    return ncclSuccess;
  }
  size_t rounded = (size + 4095) / 4096 * 4096;
  *ptr = std::aligned_alloc(4096, rounded == 0 ? 4096 : rounded);
  if (!*ptr)
    return fail(errorf(Code::kSystemError, "ncclMemAlloc: cannot allocate %zu bytes", size));
  return ncclSuccess;
}
LOOM_API ncclResult_t pncclMemAlloc(void**, size_t) LOOM_ALIAS(ncclMemAlloc);

LOOM_API ncclResult_t ncclMemFree(void* ptr) {
  if (loom::cuda::isDevicePointer(ptr)) {
    loom::comm::deviceFree(ptr);
    return ncclSuccess;
  }
  std::free(ptr);
  return ncclSuccess;
}
LOOM_API ncclResult_t pncclMemFree(void*) LOOM_ALIAS(ncclMemFree);

LOOM_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                               ncclDataType_t datatype,
                                               ncclScalarResidence_t residence, ncclComm_t comm) {
  return guarded("ncclRedOpCreatePreMulSum", [&]() -> ncclResult_t {
    loom::comm::CommHold hold;
    Status st = checkComm("ncclRedOpCreatePreMulSum", comm, &hold);
    if (st) st = checkType("ncclRedOpCreatePreMulSum", datatype);
    if (!st) return fail(st);
    if (!op || !scalar) {
      return fail(errorf(Code::kInvalidArgument, "ncclRedOpCreatePreMulSum: op or scalar is NULL"));
    }
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate) {
      return fail(errorf(Code::kInvalidArgument, "ncclRedOpCreatePreMulSum: bad residence %d",
                         static_cast<int>(residence)));
    }
    auto r = comm->impl->createPreMulSum(scalar, static_cast<DataType>(datatype), residence);
    if (!r) return fail(r.status());
    *op = static_cast<ncclRedOp_t>(*r);
    return ncclSuccess;
  });
}
LOOM_API ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t*, void*, ncclDataType_t,
                                                ncclScalarResidence_t, ncclComm_t)
    LOOM_ALIAS(ncclRedOpCreatePreMulSum);

LOOM_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  loom::comm::CommHold hold;
  Status st = checkComm("ncclRedOpDestroy", comm, &hold);
  if (st) st = comm->impl->destroyRedOp(static_cast<int>(op));
  return st ? ncclSuccess : fail(st);
}
LOOM_API ncclResult_t pncclRedOpDestroy(ncclRedOp_t, ncclComm_t) LOOM_ALIAS(ncclRedOpDestroy);

LOOM_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                                 cudaStream_t stream) {
  return submit("ncclReduce", sendbuff, recvbuff, count, datatype, op, root, comm, stream,
                CollType::kReduce, true);
}
LOOM_API ncclResult_t pncclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int,
                                  ncclComm_t, cudaStream_t) LOOM_ALIAS(ncclReduce);

LOOM_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, int root, ncclComm_t comm,
                                    cudaStream_t stream) {
  return submit("ncclBroadcast", sendbuff, recvbuff, count, datatype, 0, root, comm, stream,
                CollType::kBroadcast, false);
}
LOOM_API ncclResult_t pncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                                     cudaStream_t) LOOM_ALIAS(ncclBroadcast);

LOOM_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                ncclComm_t comm, cudaStream_t stream) {
  return submit("ncclBcast", buff, buff, count, datatype, 0, root, comm, stream,
                CollType::kBroadcast, false);
}
LOOM_API ncclResult_t pncclBcast(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    LOOM_ALIAS(ncclBcast);

LOOM_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                    cudaStream_t stream) {
  return submit("ncclAllReduce", sendbuff, recvbuff, count, datatype, op, 0, comm, stream,
                CollType::kAllReduce, true);
}
LOOM_API ncclResult_t pncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                     ncclComm_t, cudaStream_t) LOOM_ALIAS(ncclAllReduce);

LOOM_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                        ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t stream) {
  return submit("ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream,
                CollType::kReduceScatter, true);
}
LOOM_API ncclResult_t pncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t,
                                         ncclComm_t, cudaStream_t) LOOM_ALIAS(ncclReduceScatter);

LOOM_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                    ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return submit("ncclAllGather", sendbuff, recvbuff, sendcount, datatype, 0, 0, comm, stream,
                CollType::kAllGather, false);
}
LOOM_API ncclResult_t pncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                                     cudaStream_t) LOOM_ALIAS(ncclAllGather);

LOOM_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                   ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return submit("ncclAlltoAll", sendbuff, recvbuff, count, datatype, 0, 0, comm, stream,
                CollType::kAllToAll, false);
}
LOOM_API ncclResult_t pncclAlltoAll(const void*, void*, size_t, ncclDataType_t, ncclComm_t,
                                    cudaStream_t) LOOM_ALIAS(ncclAlltoAll);

namespace {
ncclResult_t p2p(const char* fn, const void* buf, size_t count, ncclDataType_t datatype, int peer,
                 ncclComm_t comm, cudaStream_t stream, bool isSend) {
  return guarded(fn, [&]() -> ncclResult_t {
    loom::comm::CommHold hold;
    Status st = checkComm(fn, comm, &hold);
    if (st) st = checkType(fn, datatype);
    if (st)
      st = checkBuffer(fn, isSend ? "sendbuff" : "recvbuff", buf, count, comm->impl->cudaDevice());
    if (st) st = checkBytes(fn, count, 1, loom::dataTypeSize(static_cast<DataType>(datatype)));
    if (!st) return fail(st);
    if (peer < 0 || peer >= comm->impl->nranks()) {
      return fail(errorf(Code::kInvalidArgument, "%s: peer %d out of range [0, %d)", fn, peer,
                         comm->impl->nranks()));
    }
    Operation o;
    o.type = CollType::kSendRecv;
    o.sendbuff = isSend ? buf : nullptr;
    o.recvbuff = isSend ? nullptr : const_cast<void*>(buf);
    o.count = count;
    o.dtype = static_cast<DataType>(datatype);
    o.root = peer;
    o.isSend = isSend;
    o.stream = stream;
    o.onDevice = comm->impl->cudaDevice() >= 0 && (count == 0 || loom::cuda::isDevicePointer(buf));
    return loom::comm::enqueue(comm, o);
  });
}
}  // namespace

namespace {
// Gather and scatter: messages between the root and every rank in one group (the root's
// own block a copy, none where it is already in place), so they run wherever send and
// receive do: host and GPU buffers, inside a caller's group, in a CUDA graph.
ncclResult_t rootedP2p(const char* fn, const void* sendbuff, void* recvbuff, size_t count,
                       ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
                       bool gather) {
  return guarded(fn, [&]() -> ncclResult_t {
    int rank = 0, n = 0;
    size_t esz = 0;
    {
      // Checked here first, so that no message of the group fails on its own.
      loom::comm::CommHold hold;
      Status st = checkComm(fn, comm, &hold);
      if (st) st = checkType(fn, datatype);
      if (!st) return fail(st);
      rank = comm->impl->rank();
      n = comm->impl->nranks();
      esz = loom::dataTypeSize(static_cast<DataType>(datatype));
      if (root < 0 || root >= n) {
        return fail(
            errorf(Code::kInvalidArgument, "%s: root %d out of range [0, %d)", fn, root, n));
      }
      const bool many = rank == root;  // the root's side holds every rank's block
      st = checkBytes(fn, count, static_cast<size_t>(n), esz);
      const int dev = comm->impl->cudaDevice();
      if (st) st = checkBuffer(fn, "sendbuff", sendbuff, gather || many ? count : 0, dev);
      if (st) st = checkBuffer(fn, "recvbuff", recvbuff, !gather || many ? count : 0, dev);
      if (!st) return fail(st);
    }
    const size_t block = count * esz;
    // In place (NCCL's rule): the root's own block is already where it belongs.
    // (A rank other than the root may pass null for the buffer it does not use.)
    const char* base = static_cast<const char*>(gather ? recvbuff : sendbuff);
    const char* rootBlock = base ? base + static_cast<size_t>(root) * block : nullptr;
    const bool inPlace = rank == root && (gather ? sendbuff : recvbuff) == rootBlock;
    loom::comm::groupStart();
    ncclResult_t rc = ncclSuccess;
    const auto keep = [&rc](ncclResult_t r) {
      if (rc == ncclSuccess) rc = r;
    };
    if (rank == root) {
      for (int q = 0; q < n; ++q) {
        if (q == root && inPlace) continue;
        char* at = static_cast<char*>(gather ? recvbuff : const_cast<void*>(sendbuff)) +
                   static_cast<size_t>(q) * block;
        keep(p2p(fn, at, count, datatype, q, comm, stream, /*isSend=*/!gather));
      }
    }
    if (!inPlace) {
      keep(p2p(fn, gather ? sendbuff : recvbuff, count, datatype, root, comm, stream,
               /*isSend=*/gather));
    }
    const ncclResult_t end = loom::comm::groupEnd();
    return rc != ncclSuccess ? rc : end;
  });
}
}  // namespace

LOOM_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream) {
  return rootedP2p("ncclGather", sendbuff, recvbuff, count, datatype, root, comm, stream, true);
}
LOOM_API ncclResult_t pncclGather(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                                  cudaStream_t) LOOM_ALIAS(ncclGather);
LOOM_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream) {
  return rootedP2p("ncclScatter", sendbuff, recvbuff, count, datatype, root, comm, stream, false);
}
LOOM_API ncclResult_t pncclScatter(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                                   cudaStream_t) LOOM_ALIAS(ncclScatter);

LOOM_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                               int peer, ncclComm_t comm, cudaStream_t stream) {
  return p2p("ncclSend", sendbuff, count, datatype, peer, comm, stream, true);
}
LOOM_API ncclResult_t pncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    LOOM_ALIAS(ncclSend);
LOOM_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                               ncclComm_t comm, cudaStream_t stream) {
  return p2p("ncclRecv", recvbuff, count, datatype, peer, comm, stream, false);
}
LOOM_API ncclResult_t pncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)
    LOOM_ALIAS(ncclRecv);

LOOM_API ncclResult_t ncclGroupStart(void) {
  loom::comm::groupStart();
  return ncclSuccess;
}
LOOM_API ncclResult_t pncclGroupStart(void) LOOM_ALIAS(ncclGroupStart);
LOOM_API ncclResult_t ncclGroupEnd(void) {
  return guarded("ncclGroupEnd", [] { return loom::comm::groupEnd(); });
}
LOOM_API ncclResult_t pncclGroupEnd(void) LOOM_ALIAS(ncclGroupEnd);
LOOM_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  // NCCL's check: an ncclSimInfo_t made with NCCL_SIM_INFO_INITIALIZER.
  if (!simInfo || simInfo->magic != 0x74685283 || simInfo->size < sizeof(ncclSimInfo_t)) {
    return fail(
        errorf(Code::kInvalidArgument,
               "ncclGroupSimulateEnd: simInfo is %s (initialize it with NCCL_SIM_INFO_INITIALIZER)",
               simInfo ? "not an ncclSimInfo_t" : "NULL"));
  }
  return guarded("ncclGroupSimulateEnd",
                 [&] { return loom::comm::groupSimulateEnd(&simInfo->estimatedTime); });
}
LOOM_API ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t*) LOOM_ALIAS(ncclGroupSimulateEnd);

// Device API entry points PyTorch links against; loom has no device communicator yet.
LOOM_API ncclResult_t ncclDevCommCreate(ncclComm_t, const void*, void*) {
  return fail(errorf(Code::kInvalidUsage, "ncclDevCommCreate is not implemented in loom yet"));
}
LOOM_API ncclResult_t ncclDevCommDestroy(ncclComm_t, const void*) {
  return fail(errorf(Code::kInvalidUsage, "ncclDevCommDestroy is not implemented in loom yet"));
}
