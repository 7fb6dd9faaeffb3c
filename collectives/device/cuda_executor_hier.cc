// The hierarchical forms across hosts (collectives/hierarchy.h): the ranks of each
// host run the in-host steps on their GPU mesh (a CudaExecutor of the host's ranks, on a
// sub-channel of the bootstrap), and the ranks of each rail the across-host step over the
// network (a NetExecutor of the rail's ranks). Every step is a kernel on the caller's
// stream, so a call stays asynchronous and capturable in CUDA graphs.
#include <algorithm>
#include <chrono>

#include "collectives/device/cuda_executor.h"
#include "common/log.h"
#include "nccl.h"

namespace loom::collectives::device {

namespace {

// Connections of the host's mesh and of the rail tell themselves from the flat form's.
constexpr uint64_t kLocalHashSalt = 0x686965722d6c6f63ull;  // "hier-loc"
constexpr uint64_t kRailHashSalt = 0x686965722d72616cull;   // "hier-ral"

}  // namespace

std::string CudaExecutor::describe() const {
  if (mesh_) return "p2p mesh";
  std::string d = "network (" + why_ + ")";
  if (local_ && rail_) {
    d += "; hierarchical forms: " + std::to_string(hier_.local) +
         " ranks per host on a GPU mesh, " + std::to_string(hier_.hosts) +
         " hosts over the network";
  }
  return d;
}

Status CudaExecutor::initHierarchy(transport::SetupChannel& bootstrap,
                                   const std::vector<transport::PeerInfo>& peers) {
  // Set up unless LOOM_ALGO leaves it out (every rank agreed on LOOM_ALGO at init, so all
  // decide alike); each call then takes it where the cost model says (takesHier).
  if (!limits_.algo.allows(AlgoName::kHier)) {
    LOOM_INFO(kInit, "rank %d: no hierarchical GPU forms: LOOM_ALGO leaves out hier", rank_);
    return Status::ok();
  }
  // A failed set-up is a warning only where LOOM_ALGO asked for the form.
  const log::Level failLevel = limits_.algo.names(AlgoName::kHier) ? log::kWarn : log::kInfo;
  std::vector<uint64_t> hosts;
  for (const auto& p : peers) hosts.push_back(p.hostHash);
  std::string why;
  if (!findHierarchy(hosts, rank_, &hier_, &why)) {
    LOOM_INFO(kInit, "rank %d: no hierarchical GPU forms: %s", rank_, why.c_str());
    return Status::ok();
  }
  // Every rank gets here (findHierarchy saw the same hosts on all): each host's ranks set
  // up their mesh, then all agree whether every host has one.
  localChannel_ = std::make_unique<transport::SubChannel>(bootstrap, hier_.localRanks, 1,
                                                          timeoutMs_, context_.abortFlag);
  std::vector<transport::PeerInfo> localPeers;
  for (int r : hier_.localRanks) {
    localPeers.push_back(peers[r]);
    localPeers.back().rank = static_cast<int>(localPeers.size()) - 1;
  }
  auto local = std::make_unique<CudaExecutor>();
  local->meshOnly_ = true;
  ExecutorContext lc = context_;
  lc.commHash = context_.commHash ^ kLocalHashSalt;
  Status st = local->init(*localChannel_, localPeers, hier_.localIndex, device_, lc);
  // A member that failed tells the others at once (they may wait in an exchange for it).
  if (!st) localChannel_->abandon();
  if (st && !local->mesh())
    st = Status(Code::kSystemError, "no GPU mesh in this host: " + local->why_);
  // The rail's network executor (this rank is its host's member of the rail), made before
  // the vote so that its failure counts in it.
  std::unique_ptr<dev::NetExecutor> rail;
  if (st) {
    dev::NetOptions o = netOptions_;
    o.rank = hier_.hostIndex;
    o.nranks = hier_.hosts;
    o.commHash = context_.commHash ^ kRailHashSalt;
    if (context_.fabric) o.fabric = model::netExecutorFabric(*context_.fabric, /*rail=*/true);
    auto net = dev::NetExecutor::create(
        o, bootstrapExchange(&bootstrap, rank_, hier_.railRanks, kRailHandles));
    if (net) {
      rail = std::move(net).value();
    } else {
      st = net.status().withContext("setting up the hierarchical form's rail");
    }
  }
  if (!st) {
    LOOM_LOG(failLevel, kInit, "rank %d: the hierarchical GPU forms: %s", rank_,
             st.message().c_str());
  }
  // Every rank takes the form, or none.
  std::vector<int32_t> all(nranks_);
  all[rank_] = st ? 1 : 0;
  LOOM_TRY(bootstrap.allGather(all.data(), sizeof(int32_t)));
  for (int r = 0; r < nranks_; ++r) {
    if (all[r]) continue;
    LOOM_LOG(failLevel, kInit,
             "rank %d: no hierarchical GPU forms: rank %d could not set up its part (its log "
             "says why); every call takes the flat form",
             rank_, r);
    localChannel_.reset();  // rail and local go with this scope
    return Status::ok();
  }
  rail_ = std::move(rail);
  local_ = std::move(local);
  LOOM_INFO(kInit,
            "rank %d: hierarchical GPU forms: host %d of %d (local rank %d of %d, a GPU mesh), "
            "rail %d across the hosts over the network",
            rank_, hier_.hostIndex, hier_.hosts, hier_.localIndex, hier_.local, hier_.localIndex);
  return Status::ok();
}

bool CudaExecutor::splitsRails(const Operation& op) const {
  if (op.type != CollType::kBroadcast && op.type != CollType::kReduce) return false;
  if (op.count % static_cast<size_t>(hier_.local) != 0 || !context_.fabric) return false;
  return model::hierSplitsRails(op.type, op.count * dataTypeSize(op.dtype), *context_.fabric);
}

bool CudaExecutor::railCall(const Operation& op, bool split, collectives::CollRequest* req) const {
  *req = collectives::requestFor(op, hier_.hosts, hier_.hostIndex);
  req->root = 0;
  switch (op.type) {
    case CollType::kAllReduce:  // this rank's part of the buffer, with its rail
      req->count = op.count / static_cast<size_t>(hier_.local);
      return true;
    case CollType::kBroadcast:
    case CollType::kReduce:
      // Split: this rank's part, on every rail; else the whole buffer, on the root's rail.
      req->root = hier_.hostOf[op.root];
      if (split) {
        req->count = op.count / static_cast<size_t>(hier_.local);
        return true;
      }
      return hier_.localIndex == hier_.localOf[op.root];
    case CollType::kAllGather:
    case CollType::kReduceScatter:  // a block a host: this rank's, and its rail's
      return true;
    default: return false;
  }
}

CudaExecutor::HierScratch CudaExecutor::hierScratchBytes(const Operation& op) const {
  // All-gather and reduce-scatter: the rail's H blocks, and the host's G x H blocks in
  // local-rank order (the call's buffers are in rank order, host by host).
  HierScratch s;
  if (op.type != CollType::kAllGather && op.type != CollType::kReduceScatter) return s;
  const size_t block = op.count * dataTypeSize(op.dtype);
  s.railBytes = (size_t(hier_.hosts) * block + 255) / 256 * 256;
  s.hostBytes = size_t(hier_.local) * size_t(hier_.hosts) * block;
  return s;
}

Status CudaExecutor::transposeBlocks(const char* src, char* dst, size_t block, bool toRankOrder,
                                     cudaStream_t stream) {
  // A 2D copy's pitch has a limit (cudaDevAttrMaxPitch, 2^31 - 1 bytes on current GPUs):
  // past it, one copy per block.
  int maxPitch = 0;
  if (cudaDeviceGetAttribute(&maxPitch, cudaDevAttrMaxPitch, device_) != cudaSuccess) {
    cudaGetLastError();
    maxPitch = 0;
  }
  for (const BlockCopy2D& c : hierBlockOrderCopies(hier_.hosts, hier_.local, block, toRankOrder)) {
    if (std::max(c.srcPitch, c.dstPitch) > static_cast<size_t>(maxPitch)) {
      for (size_t row = 0; row < c.height; ++row) {
        LOOM_TRY(cudaStatus(cudaMemcpyAsync(dst + c.dstOffset + row * c.dstPitch,
                                            src + c.srcOffset + row * c.srcPitch, c.width,
                                            cudaMemcpyDeviceToDevice, stream),
                            "cudaMemcpyAsync (the hierarchical form's blocks between rank and "
                            "local order)"));
      }
      continue;
    }
    LOOM_TRY(
        cudaStatus(cudaMemcpy2DAsync(dst + c.dstOffset, c.dstPitch, src + c.srcOffset, c.srcPitch,
                                     c.width, c.height, cudaMemcpyDeviceToDevice, stream),
                   "cudaMemcpy2DAsync (the hierarchical form's blocks between rank and "
                   "local order)"));
  }
  return Status::ok();
}

Status CudaExecutor::prepareHier(const Operation& op) {
  collectives::CollRequest req;
  if (!railCall(op, splitsRails(op), &req)) return Status::ok();
  // A rank of the root's rail other than the root reduces into scratch memory (runHier),
  // as does every rank but the root where the reduce splits over the rails, and all-gather
  // and reduce-scatter reorder their blocks through it.
  if (op.type == CollType::kReduce && rank_ != op.root)
    LOOM_TRY(netScratch(op.count * req.elemSize).status());
  if (const HierScratch s = hierScratchBytes(op); s.railBytes > 0)
    LOOM_TRY(netScratch(s.railBytes + s.hostBytes).status());
  return rail_->prepareCollective(req, railRequest(limits_.algo));
}

void CudaExecutor::passEnqueued(int pass, bool wait) {
  PhaseGate* gate = local_ && local_->clique_ ? local_->clique_->gate.get() : nullptr;
  if (!gate) return;
  const uint64_t mark = hierCalls_ * 8 + static_cast<uint64_t>(pass);
  // After one wait that gave up, this rank still says where it is but no longer waits: with
  // ranks that are evidently not enqueued side by side, each call would stall.
  if (!wait || warnedGate_) {
    gate->arrive(hier_.localIndex, mark);
    return;
  }
  const int64_t waitMs = timeoutMs_ > 0 ? std::min<int64_t>(timeoutMs_, 30000) : 30000;
  const auto start = std::chrono::steady_clock::now();
  if (gate->arriveAndWait(hier_.localIndex, mark, waitMs, context_.abortFlag) ||
      (context_.abortFlag && context_.abortFlag->load())) {
    return;
  }
  warnedGate_ = true;
  LOOM_WARN(kColl,
            "rank %d: the ranks of its host that share its GPU in this process did not enqueue "
            "their part of a hierarchical call within %lld ms; going on without waiting for "
            "them from now on (kernels on one GPU may then wait for each other until "
            "LOOM_TIMEOUT_MS). A peer may have failed or been aborted; ranks driven by one "
            "thread must call inside ncclGroupStart/ncclGroupEnd",
            rank_,
            (long long)std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - start)
                .count());
}

Status CudaExecutor::runHier(const Operation& op, const ExecutorRedOp& red) {
  ++cursor_;
  if (op.count == 0) return Status::ok();
  GatedCall call(this);
  DeviceGuard guard(device_);
  LOOM_ASSIGN_OR_RETURN(const bool cap, capturing(op.stream));
  LOOM_TRY(call.begin(op.stream, cap));
  const size_t es = dataTypeSize(op.dtype);
  // The reduction of each level (hierarchy.h): a level whose part is a plain sum runs as
  // one, whatever the call's operation.
  const SplitReduction split = splitReduction(red.op.kind);
  ExecutorRedOp first = red, second = red;
  int firstOp = op.ncclOp;
  if (split.first != red.op.kind) {
    first.op.kind = split.first;
    first.op.divisor = 1;
    firstOp = ncclSum;
  }
  if (split.second != red.op.kind) {
    second.op.kind = split.second;
    second.op.scalar = 1.0;
    second.scalarDevice = nullptr;
  }
  const AlgoRequest railAlgo = railRequest(limits_.algo);
  const bool logging = log::enabled(log::kInfo, log::kColl);
  std::string railWhy;
  collectives::CollRequest railReq;
  const bool splitRails = splitsRails(op);
  const bool onRail = railCall(op, splitRails, &railReq);
  auto across = [&](const void* in, void* out, const ExecutorRedOp& r) {
    dev::NetReduction nr;
    nr.red = r.op.kind;
    nr.scalar = r.op.scalar;
    nr.scalarDevice = r.scalarDevice;
    nr.divisor = r.op.divisor;
    return rail_->runCollective(railReq, in, out, op.dtype, nr, railAlgo, op.stream,
                                logging ? &railWhy : nullptr);
  };
  char* out = static_cast<char*>(op.recvbuff);
  // The mesh passes over parts of `buf`, one of `part` elements per local rank in local
  // order: reduce each part into its rank (in place where `buf` is the input), and gather
  // every rank's part into every rank's `buf` (in place).
  auto partOf = [&](char* buf, size_t part) { return buf + size_t(hier_.localIndex) * part * es; };
  auto reduceParts = [&](char* buf, size_t part) {
    Operation rs = op;
    rs.type = CollType::kReduceScatter;
    rs.recvbuff = partOf(buf, part);
    rs.count = part;
    rs.ncclOp = firstOp;
    return local_->run(rs, first);
  };
  auto gatherParts = [&](char* buf, size_t part) {
    Operation ag = op;
    ag.type = CollType::kAllGather;
    ag.sendbuff = partOf(buf, part);
    ag.recvbuff = buf;
    ag.count = part;
    ag.ncclOp = ncclSum;
    return local_->run(ag, ExecutorRedOp{});
  };
  // All-gather and reduce-scatter: the rail's blocks, then the host's (hierScratchBytes).
  char* railBlocks = nullptr;
  char* hostBlocks = nullptr;
  if (const HierScratch s = hierScratchBytes(op); s.railBytes > 0) {
    LOOM_ASSIGN_OR_RETURN(void* scratch, netScratch(s.railBytes + s.hostBytes, cap));
    railBlocks = static_cast<char*>(scratch);
    hostBlocks = railBlocks + s.railBytes;
  }
  switch (op.type) {
    case CollType::kAllReduce: {
      // Each local rank reduces its part of the buffer over the mesh, all-reduces it with
      // its rail, and the host's ranks gather the parts.
      const size_t part = op.count / static_cast<size_t>(hier_.local);
      LOOM_TRY(reduceParts(out, part));
      call.pass(1);
      LOOM_TRY(across(partOf(out, part), partOf(out, part), second));
      call.pass(2);
      LOOM_TRY(gatherParts(out, part));
      break;
    }
    case CollType::kBroadcast: {
      const int rootLocal = hier_.localOf[op.root];
      if (splitRails) {
        // The root's host passes the buffer to its ranks, each rail carries its part to
        // every host, and each other host's ranks gather the parts.
        const size_t part = op.count / static_cast<size_t>(hier_.local);
        const bool rootHost = hier_.hostIndex == hier_.hostOf[op.root];
        if (rootHost) {
          Operation b = op;
          b.root = rootLocal;
          LOOM_TRY(local_->run(b, red));
        }
        call.pass(1);
        LOOM_TRY(across(partOf(out, part), partOf(out, part), red));
        call.pass(2);
        if (!rootHost) LOOM_TRY(gatherParts(out, part));
        break;
      }
      // The root's rail carries it to every host, then each host's rank on that rail
      // gives it to the others.
      if (onRail) LOOM_TRY(across(op.sendbuff, out, red));
      call.pass(1);
      Operation b = op;
      b.sendbuff = out;
      b.root = rootLocal;
      LOOM_TRY(local_->run(b, red));
      break;
    }
    case CollType::kReduce: {
      if (splitRails) {
        // Each host reduces each part into one of its ranks, each rail reduces its part
        // across the hosts into the root's host, whose ranks gather the parts into the
        // root. Every rank but the root works in scratch memory laid out as the output.
        const size_t part = op.count / static_cast<size_t>(hier_.local);
        char* buf = out;
        if (rank_ != op.root) {
          LOOM_ASSIGN_OR_RETURN(void* s, netScratch(op.count * es, cap));
          buf = static_cast<char*>(s);
        }
        LOOM_TRY(reduceParts(buf, part));
        call.pass(1);
        LOOM_TRY(across(partOf(buf, part), partOf(buf, part), second));
        call.pass(2);
        if (hier_.hostIndex == hier_.hostOf[op.root]) LOOM_TRY(gatherParts(buf, part));
        break;
      }
      // Each host reduces into its rank on the root's rail, and that rail reduces the
      // hosts' results into the root. A rank of that rail other than the root reduces
      // into a scratch buffer (its own output is not the caller's to give).
      const int rootLocal = hier_.localOf[op.root];
      void* target = out;
      if (hier_.localIndex == rootLocal && rank_ != op.root) {
        LOOM_ASSIGN_OR_RETURN(target, netScratch(op.count * es, cap));
      }
      Operation rd = op;
      rd.root = rootLocal;
      rd.recvbuff = target;
      rd.ncclOp = firstOp;
      LOOM_TRY(local_->run(rd, first));
      call.pass(1);
      if (onRail) LOOM_TRY(across(target, target, second));
      break;
    }
    case CollType::kAllGather: {
      // Each rank's rail gathers the hosts' blocks of its local index, the host's ranks
      // gather those over the mesh (in local order), and each puts them in rank order.
      LOOM_TRY(across(op.sendbuff, railBlocks, red));
      call.pass(1);
      Operation ag = op;
      ag.sendbuff = railBlocks;
      ag.recvbuff = hostBlocks;
      ag.count = op.count * size_t(hier_.hosts);
      LOOM_TRY(local_->run(ag, ExecutorRedOp{}));
      call.pass(2);
      LOOM_TRY(transposeBlocks(hostBlocks, out, op.count * es, /*toRankOrder=*/true, op.stream));
      break;
    }
    case CollType::kReduceScatter: {
      // The mirror: the input's blocks in local order, reduced over the mesh so that each
      // rank holds the sum of its local index's H blocks, then reduced across the hosts on
      // its rail, each host keeping its own block. The copy also frees an in-place output.
      LOOM_TRY(transposeBlocks(static_cast<const char*>(op.sendbuff), hostBlocks, op.count * es,
                               /*toRankOrder=*/false, op.stream));
      call.pass(1);
      Operation rs = op;
      rs.sendbuff = hostBlocks;
      rs.recvbuff = railBlocks;
      rs.count = op.count * size_t(hier_.hosts);
      rs.ncclOp = firstOp;
      LOOM_TRY(local_->run(rs, first));
      call.pass(2);
      LOOM_TRY(across(railBlocks, out, second));
      break;
    }
    default:
      return errorf(Code::kInternalError, "%s reached the hierarchical form",
                    collectives::collTypeName(op.type));
  }
  if (logging) {
    std::string text;
    const char* reason = nullptr;
    takesHier(op, &reason, &text);  // the estimates, for the log only
    LOOM_INFO(kColl,
              "GPU %s hierarchical (%s): %zu x %s; in each host over the GPU mesh (%d ranks), "
              "across %d hosts on rail %d over the network (%s)%s",
              collectives::collTypeName(op.type), text.c_str(), op.count, dataTypeName(op.dtype),
              hier_.local, hier_.hosts, hier_.localIndex,
              railWhy.empty() ? "not this rank's rail" : railWhy.c_str(),
              splitRails ? "; the buffer split over every rail" : "");
  }
  return call.end(op.stream);
}

bool CudaExecutor::splitsP2p(CollType type, size_t blockBytes, const char** reason) const {
  if (!local_) {
    *reason = "no hierarchy (one rank per host, or a host without a GPU mesh)";
    return false;
  }
  *reason = hierP2pDecline(type, hier_, limits_.algo, blockBytes);
  if (*reason) return false;
  // The other hosts' blocks go as one step of network sends and receives, a kernel block
  // each (the flat form takes rounds where they would not fit).
  if (type == CollType::kAllToAll &&
      2 * size_t(nranks_ - hier_.local) > size_t(dev::kNetMaxBlocks)) {
    *reason = "more peers on other hosts than one step of the network kernel takes";
    return false;
  }
  *reason = type == CollType::kAllToAll
                ? "the ranks of this host over the GPU mesh, the others over the network"
                : "messages of 512 KiB or more (any, where LOOM_ALGO names hier) to the ranks of "
                  "this host over the GPU mesh, the rest over the network";
  return true;
}

void CudaExecutor::takeHostMessages(std::vector<dev::NetExecutor::P2p>* net,
                                    std::vector<Operation>* mesh, cudaStream_t stream) const {
  size_t kept = 0;
  for (const dev::NetExecutor::P2p& m : *net) {
    if (!hierP2pMessageOverMesh(m.peer, m.bytes, rank_, hier_, limits_.algo)) {
      (*net)[kept++] = m;
      continue;
    }
    if (!mesh) continue;
    Operation o;
    o.type = CollType::kSendRecv;
    o.dtype = DataType::kUint8;
    o.count = m.bytes;
    o.isSend = m.isSend;
    o.root = hier_.localOf[m.peer];
    o.onDevice = true;
    o.stream = stream;
    if (m.isSend) {
      o.sendbuff = m.buffer;
    } else {
      o.recvbuff = m.buffer;
    }
    mesh->push_back(o);
  }
  net->resize(kept);
}

std::vector<dev::NetExecutor::P2p> CudaExecutor::remoteBlocks(const char* in, char* out,
                                                              size_t block) const {
  std::vector<dev::NetExecutor::P2p> list;
  for (int q = 0; q < nranks_; ++q) {
    if (hier_.hostOf[q] == hier_.hostIndex) continue;
    list.push_back({const_cast<char*>(in) + size_t(q) * block, block, q, true});
    list.push_back({out + size_t(q) * block, block, q, false});
  }
  return list;
}

Status CudaExecutor::runSplitAllToAll(const Operation& op) {
  ++cursor_;
  if (op.count == 0) return Status::ok();
  GatedCall call(this);
  DeviceGuard guard(device_);
  LOOM_ASSIGN_OR_RETURN(const bool cap, capturing(op.stream));
  LOOM_TRY(call.begin(op.stream, cap));
  const size_t block = op.count * dataTypeSize(op.dtype);
  const char* in = static_cast<const char*>(op.sendbuff);
  char* out = static_cast<char*>(op.recvbuff);
  if (op.sendbuff == op.recvbuff) {
    // In place: every block is read by one peer while another's lands in it; from a copy.
    LOOM_ASSIGN_OR_RETURN(void* copy, netScratch(block * size_t(nranks_), cap));
    LOOM_TRY(cudaStatus(
        cudaMemcpyAsync(copy, in, block * size_t(nranks_), cudaMemcpyDeviceToDevice, op.stream),
        "cudaMemcpyAsync (in-place all-to-all)"));
    in = static_cast<const char*>(copy);
  }
  call.pass(1);
  // The host's ranks are one range of blocks (ranks host by host: hierP2pDecline).
  const size_t hostBase = size_t(hier_.hostIndex) * size_t(hier_.local) * block;
  Operation a = op;
  a.sendbuff = in + hostBase;
  a.recvbuff = out + hostBase;
  LOOM_TRY(local_->run(a, ExecutorRedOp{}));
  call.pass(2);
  LOOM_TRY(net_->runP2p(remoteBlocks(in, out, block), op.stream));
  LOOM_INFO(kColl,
            "GPU all-to-all: %zu x %s a peer; the %d ranks of this host over the GPU mesh, the "
            "other %d over the network",
            op.count, dataTypeName(op.dtype), hier_.local, nranks_ - hier_.local);
  return call.end(op.stream);
}

}  // namespace loom::collectives::device
