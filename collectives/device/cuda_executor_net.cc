// The GPU side of a communicator whose ranks the mesh cannot join (other hosts, or P2P
// off): every device-buffer call goes to the network executor
// (collectives/device/net_executor.h), ordered with the communicator's other calls.
#include "collectives/device/cuda_executor.h"
#include "common/log.h"
#include "common/settings.h"

namespace loom::collectives::device {

dev::NetHandleExchange bootstrapExchange(transport::SetupChannel* bootstrap, int me,
                                         std::vector<int> ranks, uint64_t kind) {
  auto rankOf = [ranks](int peer) { return ranks.empty() ? peer : ranks[peer]; };
  // The tag of the handle that listener `receiver` sends to `sender` for a lane.
  auto tag = [kind](int sender, int receiver, int lane) {
    return (kind << 60) | (static_cast<uint64_t>(lane) << 56) |
           (static_cast<uint64_t>(sender) << 28) | static_cast<uint64_t>(receiver);
  };
  dev::NetHandleExchange ex;
  ex.send = [bootstrap, me, rankOf, tag](int peer, int lane, const transport::net::Handle& h) {
    const int to = rankOf(peer);
    return bootstrap->send(to, tag(to, me, lane), &h, sizeof(h));
  };
  ex.tryRecv = [bootstrap, me, rankOf, tag](int peer, int lane, transport::net::Handle* h) {
    const int from = rankOf(peer);
    return bootstrap->tryRecv(from, tag(me, from, lane), h, sizeof(*h));
  };
  // The proxy thread asks: a short deadline, so a host cut off stalls it only briefly.
  ex.peerAlive = [bootstrap, rankOf](int peer) { return bootstrap->probe(rankOf(peer), 200); };
  return ex;
}

Status CudaExecutor::initNetwork(transport::SetupChannel& bootstrap,
                                 const std::vector<transport::PeerInfo>& peers) {
  LOOM_TRY(
      cudaStatus(cudaEventCreateWithFlags(&lastEvent_, cudaEventDisableTiming), "cudaEventCreate"));
  LOOM_TRY(cudaStatus(cudaEventCreateWithFlags(&eagerEvent_, cudaEventDisableTiming),
                      "cudaEventCreate"));
  LOOM_TRY(
      cudaStatus(cudaEventCreateWithFlags(&joinEvent_, cudaEventDisableTiming), "cudaEventCreate"));
  dev::NetOptions o;
  o.rank = rank_;
  o.nranks = nranks_;
  o.device = device_;
  o.timeoutMs = timeoutMs_;
  // The communicator's FIFO geometry (LOOM_BUFFSIZE, LOOM_STEPS), the same on every rank.
  const int64_t steps =
      std::clamp<int64_t>(settings::get(settings::kSteps), 2, transport::net::kFifoMaxSlots);
  const int64_t buff = std::max<int64_t>(
      static_cast<int64_t>(settings::get(settings::kNetBuffsize).orAuto(0)), steps * 4096);
  o.slots = static_cast<uint32_t>(steps);
  o.slotBytes = static_cast<uint64_t>(buff / steps);
  o.lanes = static_cast<int>(settings::get(settings::kNetLanes));
  o.proxySpinUs = settings::get(settings::kProxySpinUs);
  o.pdl = settings::get(settings::kNetPdl);
  if (context_.fabric) {
    o.fabric = model::netExecutorFabric(*context_.fabric, /*rail=*/false);
    // The staging term cuts calls as this executor will.
    o.fabric->stage.maxLanes = std::clamp<int>(o.lanes, 1, int(kNetMaxLanes));
    o.fabric->stage.slotBytes = o.slotBytes;
  }
  // LOOM_CHUNK_BYTES: pieces of that size (at least 4 KiB, a multiple of 64 bytes; 0: the
  // tuner's rule).
  if (const settings::Amount chunk = settings::get(settings::kChunkBytes); !chunk.isAuto()) {
    o.pieceBytes = std::max<uint64_t>(chunk.value, 4096) / 64 * 64;
  }
  // Every rank must cut pieces and lanes alike: a difference would show as a piece of
  // the wrong size, or a wait on a connection the peer never makes.
  struct Geometry {
    uint64_t slotBytes;
    uint64_t pieceBytes;
    uint32_t slots;
    int32_t lanes;
  };
  std::vector<Geometry> all(nranks_);
  all[rank_] = {o.slotBytes, o.pieceBytes, o.slots, o.lanes};
  LOOM_TRY(bootstrap.allGather(all.data(), sizeof(Geometry)));
  for (int r = 0; r < nranks_; ++r) {
    if (all[r].slotBytes != o.slotBytes || all[r].slots != o.slots || all[r].lanes != o.lanes ||
        all[r].pieceBytes != o.pieceBytes) {
      return errorf(
          Code::kInvalidUsage,
          "rank %d has LOOM_NET_BUFFSIZE/LOOM_STEPS/LOOM_NET_LANES/LOOM_CHUNK_BYTES giving %u "
          "slots of %llu bytes, %d lanes and pieces of %llu (0: automatic), rank %d %u of %llu, "
          "%d and %llu: set them alike on every rank",
          r, all[r].slots, (unsigned long long)all[r].slotBytes, all[r].lanes,
          (unsigned long long)all[r].pieceBytes, rank_, o.slots, (unsigned long long)o.slotBytes,
          o.lanes, (unsigned long long)o.pieceBytes);
    }
  }
  o.abortFlag = context_.abortFlag;
  o.commHash = context_.commHash;
  netOptions_ = o;
  auto net = dev::NetExecutor::create(o, bootstrapExchange(&bootstrap, rank_, {}, kFlatHandles));
  if (!net) return net.status().withContext("setting up GPU buffers over the network");
  net_ = std::move(net).value();
  (void)peers;
  return Status::ok();
}

Result<void*> CudaExecutor::netScratch(size_t bytes, bool captured) {
  netScratchInGraph_ = netScratchInGraph_ || captured;
  if (netScratchBytes_ >= bytes && !netScratch_.empty()) return netScratch_.back();
  void* p = nullptr;
  dev::RelaxedCapture relaxed;  // prepare() may run in a thread that captures
  // The outgrown buffer goes, unless a captured graph may read it. cudaFree waits for the
  // whole device, so for the calls that used it (prepare() grows the buffer before the
  // group's first kernel), but also for every kernel of this process: with another rank of
  // the communicator here, one of its kernels may wait for a call of this thread that comes
  // after this one. Then the buffer stays until the end.
  if (!netScratchInGraph_ && aloneInProcess_ && !netScratch_.empty()) {
    cudaFree(netScratch_.back());
    netScratch_.pop_back();
    netScratchBytes_ = 0;
  }
  LOOM_TRY(cudaStatus(cudaMalloc(&p, bytes),
                      "cudaMalloc of a network scratch buffer (an in-place all-to-all's copy, or "
                      "a hierarchical reduce's partial result)"));
  netScratch_.push_back(p);
  netScratchBytes_ = bytes;
  return p;
}

Status CudaExecutor::prepare(const Operation& op) {
  if (mesh_ || !net_ || op.count == 0 || op.type == collectives::CollType::kSendRecv)
    return Status::ok();
  DeviceGuard guard(device_);
  const char* why = nullptr;
  if (takesHier(op, &why)) return prepareHier(op);
  const collectives::CollRequest req = collectives::requestFor(op, nranks_, rank_);
  if (op.type == collectives::CollType::kAllToAll &&
      splitsP2p(op.type, op.count * req.elemSize, &why)) {
    // The network's connections to the other hosts' ranks and its plan. In place, the
    // blocks leave from the scratch copy (runSplitAllToAll): the same addresses here, since
    // the network executor matches prepared plans by them.
    const size_t block = op.count * req.elemSize;
    const char* in = static_cast<const char*>(op.sendbuff);
    if (op.sendbuff == op.recvbuff) {
      LOOM_ASSIGN_OR_RETURN(void* copy, netScratch(block * nranks_));
      in = static_cast<const char*>(copy);
    }
    return net_->prepareP2p(remoteBlocks(in, static_cast<char*>(op.recvbuff), block), op.stream);
  }
  if (op.type == collectives::CollType::kAllToAll && op.sendbuff == op.recvbuff)
    LOOM_TRY(netScratch(op.count * req.elemSize * nranks_).status());
  return net_->prepareCollective(req, flatAlgo_);
}

Result<bool> CudaExecutor::inPlaceSendsCopied(const std::vector<Operation>& ops, size_t begin,
                                              size_t end, bool captured,
                                              std::vector<Operation>* calls,
                                              std::vector<SendCopy>* copies) {
  const std::vector<size_t> which = collectives::sendsOverwrittenByReceives(ops, begin, end);
  if (which.empty()) return false;
  auto bytesOf = [&](size_t i) { return ops[i].count * dataTypeSize(ops[i].dtype); };
  auto rounded = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  size_t total = 0;
  for (size_t i : which) total += rounded(bytesOf(i));
  LOOM_ASSIGN_OR_RETURN(void* scratch, netScratch(total, captured));
  calls->assign(ops.begin() + static_cast<std::ptrdiff_t>(begin),
                ops.begin() + static_cast<std::ptrdiff_t>(end));
  copies->clear();
  char* to = static_cast<char*>(scratch);
  for (size_t i : which) {
    copies->push_back({ops[i].sendbuff, to, bytesOf(i)});
    (*calls)[i - begin].sendbuff = to;
    to += rounded(bytesOf(i));
  }
  return true;
}

Status CudaExecutor::netP2pWork(const std::vector<Operation>& ops, size_t begin, size_t end,
                                bool captured, bool split, std::vector<Operation>* mesh,
                                cudaStream_t stream, NetP2pWork* w) {
  LOOM_ASSIGN_OR_RETURN(const bool copied,
                        inPlaceSendsCopied(ops, begin, end, captured, &w->calls, &w->copies));
  LOOM_TRY(copied ? netP2pList(w->calls, 0, w->calls.size(), &w->net, &w->selfSends, &w->selfRecvs)
                  : netP2pList(ops, begin, end, &w->net, &w->selfSends, &w->selfRecvs));
  if (split) takeHostMessages(&w->net, mesh, stream);
  return Status::ok();
}

Status CudaExecutor::prepareP2p(const std::vector<Operation>& ops, size_t begin, size_t end) {
  if (mesh_ || !net_) return Status::ok();
  DeviceGuard guard(device_);
  const char* why = nullptr;
  const bool split = splitsP2p(collectives::CollType::kSendRecv, 0, &why);
  // The mesh needs nothing made beforehand.
  NetP2pWork w;
  LOOM_TRY(netP2pWork(ops, begin, end, false, split, nullptr, nullptr, &w));
  if (w.net.empty()) return Status::ok();
  return net_->prepareP2p(w.net, ops[begin].stream);
}

void CudaExecutor::endGroup() {
  group_ = 0;
  if (net_) net_->endGroup();
  if (rail_) rail_->endGroup();
}

bool CudaExecutor::takesHier(const Operation& op, const char** reason, std::string* text) const {
  if (!local_ || !rail_) {
    *reason = limits_.algo.allows(AlgoName::kHier)
                  ? "no hierarchy (one rank per host, or a host without a GPU mesh)"
                  : "LOOM_ALGO leaves out hier";
    return false;
  }
  if (const char* decline = hierDecline(op.type, op.count, hier_, limits_.algo)) {
    *reason = decline;
    return false;
  }
  // The model counts an all-gather's output and a reduce-scatter's input.
  const bool perRank = op.type == CollType::kAllGather || op.type == CollType::kReduceScatter;
  const size_t bytes = op.count * dataTypeSize(op.dtype) * (perRank ? size_t(nranks_) : 1);
  const collectives::TunerChoice c = collectives::chooseDeviceHier(
      op.type, bytes, context_.fabric ? &*context_.fabric : nullptr, limits_.algo, flatAlgo_,
      op.count % static_cast<size_t>(hier_.local) == 0);
  *reason = c.reason;
  if (text) *text = c.text();
  return c.algo == collectives::Algorithm::kHier;
}

Status CudaExecutor::runNet(const Operation& op, const ExecutorRedOp& red) {
  const bool logging = log::enabled(log::kInfo, log::kColl);
  const char* flat = nullptr;
  std::string flatText;
  if (takesHier(op, &flat, logging ? &flatText : nullptr)) return runHier(op, red);
  if (const char* why = nullptr; op.type == collectives::CollType::kAllToAll &&
                                 splitsP2p(op.type, op.count * dataTypeSize(op.dtype), &why)) {
    return runSplitAllToAll(op);
  }
  if (logging && flatText.empty()) flatText = flat;
  ++cursor_;
  if (op.count == 0) return Status::ok();
  DeviceGuard guard(device_);
  LOOM_ASSIGN_OR_RETURN(const bool cap, capturing(op.stream));
  LOOM_TRY(order(op.stream, cap));
  const collectives::CollRequest req = collectives::requestFor(op, nranks_, rank_);
  const void* in = op.sendbuff;
  if (op.type == collectives::CollType::kAllToAll && op.sendbuff == op.recvbuff) {
    // The direct exchange reads blocks it also overwrites: from a copy.
    const size_t bytes = op.count * req.elemSize * nranks_;
    LOOM_ASSIGN_OR_RETURN(void* copy, netScratch(bytes, cap));
    LOOM_TRY(
        cudaStatus(cudaMemcpyAsync(copy, op.sendbuff, bytes, cudaMemcpyDeviceToDevice, op.stream),
                   "cudaMemcpyAsync (in-place all-to-all)"));
    in = copy;
  }
  dev::NetReduction r;
  r.red = red.op.kind;
  r.scalar = red.op.scalar;
  r.scalarDevice = red.scalarDevice;
  r.divisor = red.op.divisor;
  std::string why;
  LOOM_TRY(net_->runCollective(req, in, op.recvbuff, op.dtype, r, flatAlgo_, op.stream,
                               log::enabled(log::kInfo, log::kColl) ? &why : nullptr));
  LOOM_INFO(kColl, "GPU %s over the network: %zu x %s (%s; flat: %s)",
            collectives::collTypeName(op.type), op.count, dataTypeName(op.dtype), why.c_str(),
            flatText.c_str());
  return recordDone(op.stream, cap);
}

Status CudaExecutor::netP2pList(const std::vector<Operation>& ops, size_t begin, size_t end,
                                std::vector<dev::NetExecutor::P2p>* list,
                                std::vector<const Operation*>* selfSends,
                                std::vector<const Operation*>* selfRecvs) const {
  for (size_t i = begin; i < end; ++i) {
    const Operation& o = ops[i];
    const size_t bytes = o.count * dataTypeSize(o.dtype);
    if (bytes == 0) continue;
    if (o.root == rank_) {
      (o.isSend ? selfSends : selfRecvs)->push_back(&o);
      continue;
    }
    list->push_back(
        {o.isSend ? const_cast<void*>(o.sendbuff) : o.recvbuff, bytes, o.root, o.isSend});
  }
  if (selfSends->size() != selfRecvs->size()) {
    return errorf(Code::kInvalidUsage, "rank %d sends %zu message(s) to itself but receives %zu",
                  rank_, selfSends->size(), selfRecvs->size());
  }
  return Status::ok();
}

Status CudaExecutor::runNetP2p(const std::vector<Operation>& ops, size_t begin, size_t end) {
  DeviceGuard guard(device_);
  cudaStream_t stream = ops[begin].stream;
  // Split by where the peer is: this host's ranks over the GPU mesh first (its kernel
  // only waits for them), then the rest over the network.
  const char* why = nullptr;
  const bool split = splitsP2p(collectives::CollType::kSendRecv, 0, &why);
  // Where the host's ranks share a GPU (a testing mode), the gate between the two passes
  // (GatedCall) takes every rank of the host in this process to call in the same group, as
  // the perf binaries' -g does. A host of two ranks passes it only where the group has
  // messages over the mesh, which both ranks then have (they are each other's, of the same
  // sizes); a larger host always, since a rank may have none while two others do. Decided
  // from the calls themselves, before anything that can fail, so that a failed call still
  // says it is done.
  GatedCall call(this, split && (hier_.local > 2 ||
                                 hierP2pMeshWork(ops, begin, end, rank_, hier_, limits_.algo)));
  // Calls of the group on other streams: those streams' earlier work comes first.
  for (size_t i = begin; i < end; ++i) {
    if (ops[i].stream != stream) LOOM_TRY(join(ops[i].stream, stream));
  }
  LOOM_ASSIGN_OR_RETURN(const bool cap, capturing(stream));
  LOOM_TRY(call.begin(stream, cap));
  NetP2pWork w;
  std::vector<Operation> mesh;
  LOOM_TRY(netP2pWork(ops, begin, end, cap, split, &mesh, stream, &w));
  for (const SendCopy& c : w.copies) {
    LOOM_TRY(cudaStatus(cudaMemcpyAsync(c.to, c.from, c.bytes, cudaMemcpyDeviceToDevice, stream),
                        "cudaMemcpyAsync of a send in place"));
  }
  LOOM_TRY(copySelfMessages(w.selfSends, w.selfRecvs, stream));
  if (!mesh.empty()) LOOM_TRY(local_->runP2p(mesh, 0, mesh.size()));
  call.pass(1);
  if (split) {
    LOOM_INFO(kColl,
              "rank %d: %zu send/receive message(s) with this host's ranks over the GPU mesh, "
              "%zu over the network",
              rank_, mesh.size(), w.net.size());
  }
  if (!w.net.empty()) LOOM_TRY(net_->runP2p(w.net, stream));
  return call.end(stream);
}

}  // namespace loom::collectives::device
