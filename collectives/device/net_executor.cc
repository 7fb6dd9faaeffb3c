#include "collectives/device/net_executor.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>

#include "collectives/device/net_plan.h"
#include "common/cuda_probe.h"
#include "common/log.h"
#include "transports/net/gdr.h"
#include "transports/net/nic_choice.h"

namespace loom::collectives::device {

namespace {

Status cudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  cudaGetLastError();
  return errorf(Code::kCudaError, "%s failed: %s", what, cudaGetErrorString(e));
}

const char* closedText(int code) {
  switch (code) {
    case kNetErrorAborted: return "aborted (ncclCommAbort)";
    case kNetErrorTimeout: return "timed out";
    case kNetErrorClosed: return "its connection closed";
    case kNetErrorMismatch: return "a piece of another size arrived";
  }
  return "failed";
}

}  // namespace

bool NetExecutor::PlanKey::operator<(const PlanKey& o) const {
  return std::tie(type, algo, count, elemSize, pieceElems, root, lanes) <
         std::tie(o.type, o.algo, o.count, o.elemSize, o.pieceElems, o.root, o.lanes);
}

Result<std::unique_ptr<NetExecutor>> NetExecutor::create(const NetOptions& options,
                                                         NetHandleExchange exchange) {
  std::unique_ptr<NetExecutor> e(new NetExecutor(options));
  LOOM_TRY(e->init(std::move(exchange)));
  return e;
}

Status NetExecutor::init(NetHandleExchange exchange) {
  exchange_ = std::move(exchange);
  for (int l = 0; l < int(kNetMaxLanes); ++l) {
    laneExchanges_[l].send = [this, l](int peer, const transport::net::Handle& h) {
      return exchange_.send(peer, l, h);
    };
    laneExchanges_[l].tryRecv = [this, l](int peer, transport::net::Handle* h) {
      return exchange_.tryRecv(peer, l, h);
    };
    laneExchanges_[l].peerAlive = exchange_.peerAlive;
  }
  options_.slots = std::clamp<uint32_t>(options_.slots, 2, transport::net::kFifoMaxSlots);
  // (Under 4 GiB: a FIFO head holds the size in 32 bits.)
  options_.slotBytes =
      std::clamp<uint64_t>(options_.slotBytes / 4096 * 4096, 4096, uint64_t{1} << 30);
  transport::net::Context ctx;
  ctx.commHash = options_.commHash;
  ctx.rank = options_.rank;
  ctx.abortFlag = options_.abortFlag;
  LOOM_ASSIGN_OR_RETURN(backend_, transport::net::makeBackend(ctx));
  options_.lanes = std::clamp<int>(options_.lanes, 1, kNetMaxLanes);
  const size_t n = size_t(options_.nranks) * kNetMaxLanes;  // links
  LOOM_TRY(cudaStatus(cudaMalloc(&sendTable_, n * sizeof(transport::net::Fifo)), "cudaMalloc"));
  LOOM_TRY(cudaStatus(cudaMalloc(&recvTable_, n * sizeof(transport::net::Fifo)), "cudaMalloc"));
  LOOM_TRY(cudaStatus(cudaMalloc(&counters_, n * sizeof(NetPeerCounters)), "cudaMalloc"));
  LOOM_TRY(cudaStatus(cudaMalloc(&barrier_, 2 * kNetMaxLanes * sizeof(unsigned)), "cudaMalloc"));
  LOOM_TRY(cudaStatus(cudaMemset(sendTable_, 0, n * sizeof(transport::net::Fifo)), "cudaMemset"));
  LOOM_TRY(cudaStatus(cudaMemset(recvTable_, 0, n * sizeof(transport::net::Fifo)), "cudaMemset"));
  LOOM_TRY(cudaStatus(cudaMemset(counters_, 0, n * sizeof(NetPeerCounters)), "cudaMemset"));
  LOOM_TRY(cudaStatus(cudaMemset(barrier_, 0, 2 * kNetMaxLanes * sizeof(unsigned)), "cudaMemset"));
  LOOM_TRY(cudaStatus(cudaHostAlloc(reinterpret_cast<void**>(&hostFlags_), 4 * sizeof(int),
                                    cudaHostAllocMapped | cudaHostAllocPortable),
                      "cudaHostAlloc of the network flags"));
  std::memset(hostFlags_, 0, 4 * sizeof(int));
  LOOM_TRY(cudaStatus(cudaHostGetDevicePointer(reinterpret_cast<void**>(&devFlags_), hostFlags_, 0),
                      "cudaHostGetDevicePointer"));
  LOOM_TRY(cudaStatus(cudaStreamCreateWithFlags(&uploadStream_, cudaStreamNonBlocking),
                      "cudaStreamCreate"));
  // Loaded now, not at a first launch that could wait behind a kernel waiting for a peer.
  if (const int e = preloadNetKernels(); e != 0) {
    cudaGetLastError();
    LOOM_WARN(kInit,
              "GPU %d: loading the network kernels ahead failed (%s): each loads at its "
              "first launch",
              options_.device, cudaGetErrorString(static_cast<cudaError_t>(e)));
  }
  LOOM_TRY(cudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the network set-up"));
  sendConnected_.assign(n, false);
  recvConnected_.assign(n, false);
  proxy_ = std::make_unique<transport::net::Proxy>(options_.rank, options_.proxySpinUs);
  started_ = Clock::now();
  // The NIC nearest this GPU (rails where several are as near).
  std::vector<std::string> paths, names;
  for (int d = 0; d < backend_->devices(); ++d) {
    transport::net::Properties p;
    LOOM_TRY(backend_->properties(d, &p));
    paths.push_back(p.pciPath);
    std::string name = p.name;
    if (p.port > 0) name.append(":").append(std::to_string(p.port));
    names.push_back(std::move(name));
  }
  char busId[32] = {};
  std::string gpuPath;
  if (cudaDeviceGetPCIBusId(busId, sizeof(busId), options_.device) == cudaSuccess)
    gpuPath = transport::net::pciSysfsPath(busId);
  const transport::net::NicChoice nic =
      transport::net::chooseNic(gpuPath, paths, names, options_.device);
  dev_ = nic.dev;
  transport::net::Properties props;
  LOOM_TRY(backend_->properties(dev_, &props));
  transport::net::GdrAssessment assessment;
  if (transport::net::placementNeedsAssessment(props)) {
    assessment =
        transport::net::assessGdrFor(options_.device, props.pciPath, props.dmaBufRegistration,
                                     props.dmaBufWhy, props.nearEveryGpu);
  }
  const transport::net::SlotPlacement placement = transport::net::placeSlots(props, assessment);
  slotsOnGpu_ = placement.gpu;
  slotsDmaBuf_ = placement.dmaBuf;
  flushContext_ = placement.flush ? cuda::currentContext() : nullptr;
  if (placement.flush && !flushContext_) {
    return errorf(Code::kCudaError,
                  "GPU %d: GPUDirect RDMA needs a flush after each receive, and this thread has "
                  "no current CUDA context to flush",
                  options_.device);
  }
  LOOM_INFO(kNet, "GPU %d (%s) uses %s device %s: %s; %s", options_.device, busId, backend_->name(),
            names[dev_].c_str(), nic.why.c_str(), placement.why.c_str());
  LOOM_INFO(kInit,
            "GPU %d: device buffers reach the other ranks over the network (%s, %s, %d Mb/s): "
            "kernels on the caller's stream, a proxy thread, up to %d lanes, %u slots x %llu "
            "bytes per connection in %s",
            options_.device, backend_->name(), props.name.c_str(), props.speedMbps, options_.lanes,
            options_.slots, (unsigned long long)options_.slotBytes,
            slotsOnGpu_ ? "GPU memory" : "page-locked memory");
  return Status::ok();
}

NetExecutor::~NetExecutor() {
  // Kernels still running use the FIFOs and the tables: they end (done, timed out, or
  // aborted) before anything goes.
  if (launched_) cudaDeviceSynchronize();
#ifdef LOOM_NET_TRACE
  if (const char* dir = getenv("LOOM_NET_TRACE_DIR"); dir && launched_) {
    dumpNetTrace((std::string(dir) + "/gpu." + std::to_string(getpid()) + ".txt").c_str());
  }
#endif
  const double wall = std::chrono::duration<double>(Clock::now() - started_).count();
  const double proxyCpu = proxy_ ? proxy_->cpuSeconds() : 0.0;
  const bool hadProxy = proxy_ != nullptr;
  proxy_.reset();  // drains what kernels posted, then closes the connections
  if (hadProxy) {
    // The backend's threads (socket helpers) have ended with the connections; ucx's
    // send connections may still be closing (their flush), and it waits for them.
    const double helpers = backend_ ? backend_->threadCpuSeconds() : 0.0;
    LOOM_INFO(kNet,
              "rank %d: the network proxy thread used %.3f s of CPU and the backend's threads "
              "%.3f s in %.3f s (%.2f cores in all)",
              options_.rank, proxyCpu, helpers, wall, wall > 0 ? (proxyCpu + helpers) / wall : 0.0);
  }
  for (auto& [key, p] : plans_) {
    if (p.device) cudaFree(p.device);
  }
  for (auto& p : p2pPlans_) {
    if (p.device) cudaFree(p.device);
    if (p.used) cudaEventDestroy(p.used);
  }
  for (void* m : fifoMemory_) cudaFreeHost(m);
  for (void* m : fifoSlotsOnGpu_) cudaFree(m);
  for (void* m : {static_cast<void*>(sendTable_), static_cast<void*>(recvTable_),
                  static_cast<void*>(counters_), static_cast<void*>(barrier_)}) {
    if (m) cudaFree(m);
  }
  if (hostFlags_) cudaFreeHost(hostFlags_);
  if (uploadStream_) cudaStreamDestroy(uploadStream_);
  cudaGetLastError();
}

void NetExecutor::abort() {
  if (hostFlags_) reinterpret_cast<volatile int*>(hostFlags_)[0] = 1;
  if (proxy_) proxy_->shutdown();
}

Status NetExecutor::error() const {
  const int code = reinterpret_cast<volatile int*>(hostFlags_)[1];
  if (code == 0) return Status::ok();
  const int peer = reinterpret_cast<volatile int*>(hostFlags_)[2];
  if (code == kNetErrorAborted) {
    return errorf(Code::kInvalidUsage,
                  "a GPU network kernel stopped: the communicator was aborted");
  }
  std::string what = peer >= 0 ? "rank " + std::to_string(peer) : std::string("a peer");
  if (code == kNetErrorClosed && peer >= 0) {
    // The proxy knows why (and which direction failed first).
    Status st = proxy_->status(peer, false);
    if (st) st = proxy_->status(peer, true);
    if (!st)
      return Status(Code::kRemoteError,
                    "rank " + std::to_string(options_.rank) + ": " + st.message());
  }
  if (code == kNetErrorTimeout) {
    return errorf(Code::kRemoteError,
                  "rank %d: a GPU network kernel waited more than LOOM_TIMEOUT_MS=%lld ms for %s "
                  "(it died, is stuck, or called a different collective)",
                  options_.rank, (long long)options_.timeoutMs, what.c_str());
  }
  if (code == kNetErrorMismatch) {
    return errorf(Code::kInvalidUsage,
                  "rank %d: %s sent a piece of another size than this rank expected: the ranks "
                  "called different operations or counts",
                  options_.rank, what.c_str());
  }
  return errorf(Code::kRemoteError, "rank %d: a GPU network kernel failed on %s: %s", options_.rank,
                what.c_str(), closedText(code));
}

Status NetExecutor::connect(const std::vector<NetLink>& sends, const std::vector<NetLink>& recvs) {
  const int n = options_.nranks;
  std::vector<NetLink> needSend, needRecv;
  for (const NetLink& l : sends) {
    if (!sendConnected_[l.lane * n + l.peer]) needSend.push_back(l);
  }
  for (const NetLink& l : recvs) {
    if (!recvConnected_[l.lane * n + l.peer]) needRecv.push_back(l);
  }
  if (needSend.empty() && needRecv.empty()) return Status::ok();
  // The FIFOs now (this rank's own memory); the connections are the proxy's to make,
  // while kernels may already post to the FIFOs: nothing here waits for a peer, so a rank
  // may capture or issue calls on its own, in any order with its peers.
  RelaxedCapture relaxed;
  const size_t bytes = transport::net::fifoBytes(options_.slots, options_.slotBytes);
  auto fifoFor = [&](const NetLink& l, transport::net::Fifo* table,
                     transport::net::SlotMemory* where) -> Result<transport::net::Fifo> {
    // GPU memory for the slots where placeSlots chose it (page-aligned: dma-buf exports
    // whole pages), and its dma-buf export; the counters the proxy polls stay in page-locked
    // memory. An export the driver refuses sends this and every later FIFO to host memory.
    const size_t slotBytes = bytes - transport::net::kFifoHeaderBytes;
    char* gpuSlots = nullptr;
    if (slotsOnGpu_) {
      void* raw = nullptr;
      LOOM_TRY(cudaStatus(cudaMalloc(&raw, slotBytes + 4096),
                          "cudaMalloc of a network FIFO's slots (GPU memory)"));
      fifoSlotsOnGpu_.push_back(raw);
      gpuSlots =
          reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + 4095) & ~uintptr_t(4095));
      if (slotsDmaBuf_) {
        Result<cuda::DmaBuf> d = cuda::dmaBufFor(gpuSlots, slotBytes);
        if (!d) {
          LOOM_WARN(kNet,
                    "GPU %d: the CUDA driver would not export the network FIFOs' GPU memory as "
                    "dma-buf (%s): GPU buffers go through page-locked host memory instead",
                    options_.device, d.status().message().c_str());
          slotsOnGpu_ = slotsDmaBuf_ = false;
          gpuSlots = nullptr;
        } else {
          where->dmaBufFd = d->fd;
          where->dmaBufOffset = d->offset;
        }
      }
    }
    const size_t hostBytes = gpuSlots ? transport::net::kFifoHeaderBytes : bytes;
    void* mem = nullptr;
    LOOM_TRY(cudaStatus(cudaHostAlloc(&mem, hostBytes, cudaHostAllocMapped | cudaHostAllocPortable),
                        "cudaHostAlloc of a network FIFO"));
    std::memset(mem, 0, hostBytes);
    fifoMemory_.push_back(mem);
    transport::net::Fifo f =
        transport::net::fifoAt(mem, options_.slots, options_.slotBytes, l.peer);
    if (gpuSlots) {
      f.slots = gpuSlots;
      f.small = false;  // the proxy cannot read or write them as tagged words
      where->type = transport::net::MemType::kCuda;
      where->flushContext = flushContext_;
    }
    LOOM_TRY(cudaStatus(cudaMemcpyAsync(table + l.lane * n + l.peer, &f, sizeof(f),
                                        cudaMemcpyHostToDevice, uploadStream_),
                        "cudaMemcpyAsync of the FIFO table"));
    LOOM_TRY(cudaStatus(cudaStreamSynchronize(uploadStream_), "cudaStreamSynchronize"));
    return f;
  };
  // Each lane's connection between two ranks is its own, and so are its handles. Where a
  // lane needs both directions with a peer now, they are offered one connection (pairWith:
  // a small message's reply then carries the acknowledgement of what it answers).
  std::map<std::pair<int, int>, transport::net::PairDialers> pairs;  // by (lane, peer)
  if (backend_->duplex()) {
    for (const NetLink& l : needRecv) {
      const bool both = std::any_of(needSend.begin(), needSend.end(), [&](const NetLink& s) {
        return s.lane == l.lane && s.peer == l.peer;
      });
      if (!both || l.peer == options_.rank) continue;
      LOOM_ASSIGN_OR_RETURN(
          transport::net::PairDialers d,
          transport::net::pairWith(*backend_, dev_, options_.rank, l.peer, laneExchange(l.lane)));
      pairs.emplace(std::make_pair(l.lane, l.peer), std::move(d));
    }
  }
  for (const NetLink& l : needRecv) {
    transport::net::SlotMemory where;
    LOOM_ASSIGN_OR_RETURN(transport::net::Fifo f, fifoFor(l, recvTable_, &where));
    transport::net::RecvDialer dial;
    if (auto it = pairs.find({l.lane, l.peer}); it != pairs.end()) {
      dial = it->second.recv;
    } else {
      LOOM_ASSIGN_OR_RETURN(
          dial, transport::net::listenFor(*backend_, dev_, l.peer, laneExchange(l.lane)));
    }
    proxy_->addRecv(std::move(dial), f, options_.timeoutMs, std::move(where));
    recvConnected_[l.lane * n + l.peer] = true;
  }
  for (const NetLink& l : needSend) {
    transport::net::SlotMemory where;
    LOOM_ASSIGN_OR_RETURN(transport::net::Fifo f, fifoFor(l, sendTable_, &where));
    auto it = pairs.find({l.lane, l.peer});
    proxy_->addSend(it != pairs.end()
                        ? it->second.send
                        : transport::net::dialTo(*backend_, dev_, l.peer, laneExchange(l.lane)),
                    f, options_.timeoutMs, std::move(where));
    sendConnected_[l.lane * n + l.peer] = true;
  }
  LOOM_INFO(kInit, "rank %d: network connections under way: %zu send, %zu receive", options_.rank,
            needSend.size(), needRecv.size());
  return Status::ok();
}

Status NetExecutor::planCapacity(Plan* plan, size_t size) {
  if (plan->device && plan->capacity >= size) return Status::ok();
  RelaxedCapture relaxed;
  if (plan->device) cudaFree(plan->device);
  plan->device = nullptr;
  plan->capacity = 0;
  LOOM_TRY(cudaStatus(cudaMalloc(&plan->device, size), "cudaMalloc of a network plan"));
  plan->capacity = size;
  return Status::ok();
}

Result<void*> NetExecutor::uploadPlan(const std::vector<uint64_t>& bytes, bool captured,
                                      cudaStream_t stream, Plan* plan) {
  const size_t size = bytes.size() * sizeof(uint64_t);
  LOOM_TRY(planCapacity(plan, size));
  if (captured || !stream) {
    // Read at every replay: uploaded now, and never reused.
    RelaxedCapture relaxed;
    LOOM_TRY(cudaStatus(
        cudaMemcpyAsync(plan->device, bytes.data(), size, cudaMemcpyHostToDevice, uploadStream_),
        "cudaMemcpyAsync of a network plan"));
    LOOM_TRY(cudaStatus(cudaStreamSynchronize(uploadStream_), "cudaStreamSynchronize"));
  } else {
    // Ahead of its kernel on the caller's stream (pageable memory: staged at the call).
    LOOM_TRY(cudaStatus(
        cudaMemcpyAsync(plan->device, bytes.data(), size, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync of a network plan"));
  }
  return plan->device;
}

Result<NetExecutor::Plan*> NetExecutor::collectivePlan(const CollRequest& req, Algorithm algo,
                                                       int lanes) {
  PlanKey key{req.type, algo, req.count, req.elemSize, req.pieceElems, req.root, lanes};
  auto it = plans_.find(key);
  if (it != plans_.end()) return &it->second;
  LOOM_ASSIGN_OR_RETURN(std::vector<uint64_t> bytes,
                        makeNetPlan(netLaneSchedules(req, algo, lanes), req.pieceElems));
  Plan plan;
  const auto* h = reinterpret_cast<const NetPlanHeader*>(bytes.data());
  plan.blocks = h->blocks;
  netPlanLinks(h, &plan.sends, &plan.recvs);
  LOOM_TRY(uploadPlan(bytes, true, nullptr, &plan).status());
  plan.pinned = true;
  if (bytes.size() <= kNetInlinePlanWords) plan.small = bytes;
  return &plans_.emplace(key, std::move(plan)).first->second;
}

bool NetExecutor::inlinePlan(const std::vector<uint64_t>& bytes, NetCall* call) {
  if (bytes.empty() || bytes.size() > kNetInlinePlanWords) return false;
  std::copy(bytes.begin(), bytes.end(), call->inlinePlan);
  call->inlineWords = static_cast<uint32_t>(bytes.size());
  return true;
}

Status NetExecutor::launch(const Plan& plan, const NetCall& call, cudaStream_t stream) {
  NetContext ctx;
  ctx.sendFifos = sendTable_;
  ctx.recvFifos = recvTable_;
  ctx.counters = counters_;
  ctx.barrier = barrier_;
  ctx.nranks = options_.nranks;
  int* devFlags = devFlags_;
  ctx.abortFlag = devFlags;
  ctx.errorFlag = devFlags + 1;
  ctx.errorPeer = devFlags + 2;
  ctx.timeoutNs = options_.timeoutMs > 0 ? uint64_t(options_.timeoutMs) * 1000000ull : 0;
  ctx.rank = options_.rank;
  ctx.threads = options_.threads;
  if (int e = launchNet(ctx, call, stream, options_.pdl); e != 0) {
    return errorf(Code::kCudaError, "launching the network kernel failed: %s",
                  cudaGetErrorString(static_cast<cudaError_t>(e)));
  }
  launched_ = true;
  proxy_->kick();
  return Status::ok();
}

Result<NetExecutor::Ready> NetExecutor::readyCollective(CollRequest& req, const AlgoRequest& algo) {
  const size_t bytes = req.count * req.elemSize;
  // (All-gather and reduce-scatter: `count` is a rank's block; the rule counts the whole.)
  const bool blocked = req.type == CollType::kAllGather || req.type == CollType::kReduceScatter;
  Ready r;
  r.lanes = netLanes(req.type, blocked ? bytes * static_cast<size_t>(req.nranks) : bytes,
                     req.nranks, options_.lanes);
  const size_t piece = options_.pieceBytes > 0 ? options_.pieceBytes
                                               : netPieceBytes(req.type, bytes / r.lanes,
                                                               req.nranks, options_.slotBytes);
  req.pieceElems = std::max<size_t>(1, std::min<size_t>(piece, options_.slotBytes) / req.elemSize);
  req.network = true;
  if (options_.fabric) req.fabric = &*options_.fabric;
  LOOM_ASSIGN_OR_RETURN(r.choice, chooseNetAlgorithm(req, algo));
  LOOM_ASSIGN_OR_RETURN(r.plan, collectivePlan(req, r.choice.algo, r.lanes));
  LOOM_TRY(connect(r.plan->sends, r.plan->recvs));
  return r;
}

Status NetExecutor::prepareCollective(CollRequest req, const AlgoRequest& algo) {
  LOOM_TRY(error());
  return readyCollective(req, algo).status();
}

Status NetExecutor::runCollective(CollRequest req, const void* in, void* out, DataType type,
                                  const NetReduction& red, const AlgoRequest& algo,
                                  cudaStream_t stream, std::string* why) {
  LOOM_TRY(error());
  LOOM_ASSIGN_OR_RETURN(const Ready r, readyCollective(req, algo));
  if (why) {
    *why = std::string(algorithmName(r.choice.algo)) + ", " + r.choice.text() + "; " +
           std::to_string(r.lanes) + " lane(s), pieces of " +
           std::to_string(req.pieceElems * req.elemSize) + " bytes";
  }
  NetCall call;
  call.type = type;
  call.red = red.red;
  call.scalar = red.scalar;
  call.scalarDevice = red.scalarDevice;
  call.divisor = red.divisor;
  call.in = in;
  call.out = out;
  call.plan = static_cast<const NetPlanHeader*>(r.plan->device);
  call.blocks = r.plan->blocks;
  inlinePlan(r.plan->small, &call);
  return launch(*r.plan, call, stream);
}

Result<std::vector<uint64_t>> NetExecutor::p2pPlanBytes(const std::vector<P2p>& ops) const {
  Schedule sch;
  Phase phase;
  for (const P2p& o : ops) {
    if (o.bytes == 0) continue;
    Step st;
    st.count = o.bytes;
    if (o.isSend) {
      st.src = {Buffer::kAbsolute, reinterpret_cast<uintptr_t>(o.buffer)};
      st.sendTo(o.peer);
    } else {
      st.dst = {Buffer::kAbsolute, reinterpret_cast<uintptr_t>(o.buffer)};
      st.recvFrom(o.peer);
    }
    phase.push_back(st);
  }
  if (phase.empty()) return std::vector<uint64_t>{};
  sch.phases.push_back(std::move(phase));
  return makeNetPlan(splitByConnection(sch), options_.slotBytes);
}

Result<size_t> NetExecutor::p2pPlanFor(const std::vector<uint64_t>& bytes, bool captured) {
  // A plan whose last kernel is done is reused (eager calls); a captured one is kept.
  const size_t size = bytes.size() * sizeof(uint64_t);
  size_t index = p2pPlans_.size();
  if (!captured) {
    for (size_t i = 0; i < p2pPlans_.size(); ++i) {
      const Plan& p = p2pPlans_[i];
      if (p.pinned || p.reserved || p.capacity < size) continue;
      if (cudaEventQuery(p.used) == cudaSuccess) {
        index = i;
        break;
      }
      cudaGetLastError();
    }
  }
  if (index == p2pPlans_.size()) {
    p2pPlans_.emplace_back();
    RelaxedCapture relaxed;
    LOOM_TRY(cudaStatus(cudaEventCreateWithFlags(&p2pPlans_.back().used, cudaEventDisableTiming),
                        "cudaEventCreate"));
  }
  Plan& plan = p2pPlans_[index];
  const auto* h = reinterpret_cast<const NetPlanHeader*>(bytes.data());
  plan.blocks = h->blocks;
  plan.sends.clear();
  plan.recvs.clear();
  netPlanLinks(h, &plan.sends, &plan.recvs);
  LOOM_TRY(connect(plan.sends, plan.recvs));
  // Device memory for an eager plan's bytes now (they are uploaded on the caller's stream
  // at the call); a captured plan's are uploaded now, once.
  if (captured) {
    LOOM_TRY(uploadPlan(bytes, true, nullptr, &plan).status());
  } else {
    LOOM_TRY(planCapacity(&plan, size));
  }
  plan.pinned = captured;
  return index;
}

Status NetExecutor::prepareP2p(const std::vector<P2p>& ops, cudaStream_t stream) {
  LOOM_TRY(error());
  LOOM_ASSIGN_OR_RETURN(std::vector<uint64_t> bytes, p2pPlanBytes(ops));
  if (bytes.empty()) return Status::ok();
  LOOM_ASSIGN_OR_RETURN(const bool cap, streamCapturing(stream));
  LOOM_ASSIGN_OR_RETURN(const size_t index, p2pPlanFor(bytes, cap));
  // A call on the legacy default stream: its eager plan's bytes now (the plan is idle), since
  // at the call they would go through the upload stream and wait for it. On any other
  // stream they go ahead of the kernel at the call, without waiting.
  const bool uploadNow = !cap && !stream;
  if (uploadNow) LOOM_TRY(uploadPlan(bytes, true, nullptr, &p2pPlans_[index]).status());
  p2pPlans_[index].reserved = true;
  preparedP2p_.push_back({std::move(bytes), index, cap, cap || uploadNow});
  return Status::ok();
}

void NetExecutor::endGroup() {
  // What was prepared and not run: free again (a captured plan no graph took is no longer
  // kept for one).
  for (const PreparedP2p& p : preparedP2p_) {
    p2pPlans_[p.plan].reserved = false;
    if (p.captured) p2pPlans_[p.plan].pinned = false;
  }
  preparedP2p_.clear();
}

Status NetExecutor::runP2p(const std::vector<P2p>& ops, cudaStream_t stream) {
  LOOM_TRY(error());
  LOOM_ASSIGN_OR_RETURN(std::vector<uint64_t> bytes, p2pPlanBytes(ops));
  if (bytes.empty()) return Status::ok();
  LOOM_ASSIGN_OR_RETURN(const bool cap, streamCapturing(stream));
  // The plan prepared for this call (the first prepared one with the same bytes), else one
  // found or made now.
  size_t index = p2pPlans_.size();
  bool prepared = false, uploaded = false;
  for (auto it = preparedP2p_.begin(); it != preparedP2p_.end(); ++it) {
    if (it->bytes != bytes || it->captured != cap) continue;
    index = it->plan;
    prepared = true;
    uploaded = it->uploaded;
    p2pPlans_[index].reserved = false;
    preparedP2p_.erase(it);
    break;
  }
  if (!prepared) {
    LOOM_ASSIGN_OR_RETURN(index, p2pPlanFor(bytes, cap));
    uploaded = cap;
  }
  Plan& plan = p2pPlans_[index];
  NetCall call;
  call.type = DataType::kUint8;
  call.plan = static_cast<const NetPlanHeader*>(plan.device);
  call.blocks = plan.blocks;
  // Eager: the bytes on the caller's stream, ahead of the kernel (pageable memory: staged
  // at the call, without waiting), unless prepare() uploaded them or they travel in the
  // kernel's parameters. Captured: uploaded when the plan was made.
  if (!inlinePlan(bytes, &call) && !uploaded)
    LOOM_TRY(uploadPlan(bytes, false, stream, &plan).status());
  LOOM_TRY(launch(plan, call, stream));
  if (!cap) LOOM_TRY(cudaStatus(cudaEventRecord(plan.used, stream), "cudaEventRecord"));
  return Status::ok();
}

Result<bool> streamCapturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (const cudaError_t e = cudaStreamIsCapturing(s, &st); e != cudaSuccess) {
    cudaGetLastError();
    // Not "not capturing": a stream that cannot be asked (destroyed, of another context,
    // or a device in error) would fail later with a message further from the cause.
    return errorf(Code::kInvalidArgument,
                  "cudaStreamIsCapturing on the caller's stream failed: %s "
                  "(is the stream valid, and of this communicator's device?)",
                  cudaGetErrorString(e));
  }
  return st != cudaStreamCaptureStatusNone;
}

}  // namespace loom::collectives::device
