// The CUDA executor (cuda_executor.h): set-up, and each call's plan (mesh_plan.h) run on the
// mesh; the network form, the forms of ranks of one process and registration are in
// cuda_executor_net.cc, cuda_executor_local.cc and cuda_executor_registration.cc.
#include "collectives/device/cuda_executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <utility>

#include "common/cuda_probe.h"
#include "common/log.h"
#include "common/settings.h"

namespace loom::collectives::device {

// Bytes of input and output of one call on one rank.
void callBytes(const Operation& op, int nranks, size_t* in, size_t* out) {
  size_t b = op.count * dataTypeSize(op.dtype);
  *in = *out = b;
  switch (op.type) {
    case collectives::CollType::kAllGather: *out = b * nranks; break;
    case collectives::CollType::kReduceScatter: *in = b * nranks; break;
    case collectives::CollType::kAllToAll: *in = *out = b * nranks; break;
    default: break;
  }
}

CudaExecutor::~CudaExecutor() {
  DeviceGuard guard(device_);
  rail_.reset();  // each waits for its kernels first
  local_.reset();
  net_.reset();
  for (void* p : netScratch_) cudaFree(p);
  // Kernels still queued write into the windows: let them finish first.
  if (window_) cudaDeviceSynchronize();
  closeImports();
  board_.reset();
  if (lastEvent_) cudaEventDestroy(lastEvent_);
  if (eagerEvent_) cudaEventDestroy(eagerEvent_);
  if (joinEvent_) cudaEventDestroy(joinEvent_);
  if (forkEvent_) cudaEventDestroy(forkEvent_);
  if (sideEvent_) cudaEventDestroy(sideEvent_);
  if (side_) cudaStreamDestroy(side_);
  for (cudaEvent_t e : {chunkEvent_, pushEvent_}) {
    if (e) cudaEventDestroy(e);
  }
  if (pushStream_) cudaStreamDestroy(pushStream_);
  window_.reset();
  if (state_) cudaFree(state_);
  if (clique_) {  // no peer of this process may raise our flag once it is freed
    std::lock_guard<std::mutex> lock(clique_->mutex);
    clique_->abortFlags[rank_] = nullptr;
  }
  if (hostFlags_) cudaFreeHost(hostFlags_);
  cudaGetLastError();
}

// Ranks sharing a GPU (LOOM_P2P_SHARE_GPU; `sharing` of them at most on one): every rank's
// kernel must be resident at once, since each waits for its peers. Caps the blocks (the
// same on every rank: from every rank's GPU), and warns where CUDA's hardware queues may
// be too few.
void CudaExecutor::capForSharedGpu(const std::vector<transport::p2p::GpuIdentity>& gpus, int rank,
                                   int sharing, int64_t* blocks) {
  const int64_t cap = transport::p2p::sharedGpuBlockCap(gpus);
  if (cap > 0 && *blocks > cap) {
    LOOM_INFO(kInit,
              "GPU %d: %d ranks share it (LOOM_P2P_SHARE_GPU): %lld blocks per kernel "
              "instead of %lld, so that every rank's kernel fits on the GPU at once",
              device_, sharing, (long long)cap, (long long)*blocks);
    *blocks = cap;
  }
  // CUDA maps a process's streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8
  // unless set), and each rank here uses up to three: past that, one rank's kernel can
  // queue behind a peer's that waits for it.
  const char* env = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  const int asked = env ? std::atoi(env) : 0;
  const int connections = asked > 0 ? asked : 8;
  if (rank == 0 && 3 * sharing > connections) {
    LOOM_WARN(kInit,
              "%d ranks share a GPU (LOOM_P2P_SHARE_GPU) with %d hardware queues "
              "(CUDA_DEVICE_MAX_CONNECTIONS): their kernels may queue behind each other and "
              "wait until LOOM_TIMEOUT_MS; set CUDA_DEVICE_MAX_CONNECTIONS=32 before CUDA starts",
              sharing, connections);
  }
}

Status CudaExecutor::init(transport::SetupChannel& bootstrap,
                          const std::vector<transport::PeerInfo>& peers, int rank, int device,
                          const ExecutorContext& context) {
  context_ = context;
  rank_ = rank;
  nranks_ = static_cast<int>(peers.size());
  device_ = device;
  DeviceGuard guard(device_);
  // Every mesh kernel loaded now: under CUDA's lazy loading a first launch may wait for the
  // whole context, and so for a peer's kernel that waits for this one (mesh.h).
  if (const int e = dev::preloadMeshKernels(); e != 0) {
    cudaGetLastError();
    LOOM_WARN(kInit,
              "GPU %d: loading the mesh kernels ahead failed (%s): each loads at its "
              "first launch",
              device_, cudaGetErrorString(static_cast<cudaError_t>(e)));
  }
  LOOM_ASSIGN_OR_RETURN(auto self, transport::p2p::describeGpu(rank, device, peers[rank].hostHash));
  std::vector<transport::p2p::GpuIdentity> gpus(nranks_);
  gpus[rank] = self;
  LOOM_TRY(bootstrap.allGather(gpus.data(), sizeof(gpus[0])));
  for (int r = 0; r < nranks_; ++r) {
    if (r != rank && gpus[r].process == self.process) aloneInProcess_ = false;
  }
  // LOOM_P2P_SHARE_GPU: ranks of this process may share a GPU (to run the mesh's kernels
  // for more ranks than there are GPUs; slow, for testing). Their kernels must all be
  // resident at once, since each waits for its peers: fewer blocks, no early launches.
  const bool shareGpu = settings::get(settings::kP2pShareGpu);
  transport::p2p::checkReachable(&gpus[rank], gpus, shareGpu);
  const int sharing = shareGpu ? transport::p2p::ranksPerGpu(gpus) : 1;

  MeshAgreement mine;
  mine.reachable = gpus[rank].reachable;
  std::snprintf(mine.why, sizeof(mine.why), "%s", gpus[rank].why);
  std::string allowed = settings::get(settings::kTransports);
  if (settings::get(settings::kP2pDisable)) {
    mine.reachable = 0;
    std::snprintf(mine.why, sizeof(mine.why), "LOOM_P2P_DISABLE/NCCL_P2P_DISABLE is set");
  } else if (!allowed.empty() && ("," + allowed + ",").find(",p2p,") == std::string::npos) {
    mine.reachable = 0;
    std::snprintf(mine.why, sizeof(mine.why), "LOOM_TRANSPORTS=%s leaves out p2p", allowed.c_str());
  } else if (nranks_ > dev::kMaxRanks) {
    mine.reachable = 0;
    std::snprintf(mine.why, sizeof(mine.why), "%d ranks (the mesh takes at most %d)", nranks_,
                  dev::kMaxRanks);
  }
  dev::Geometry geo;
  geo.nranks = nranks_;
  int64_t blocks = static_cast<int64_t>(
      std::min<uint64_t>(settings::get(settings::kP2pBlocks).orAuto(nranks_ <= 2 ? 128 : 64), 128));
  if (sharing > 1) capForSharedGpu(gpus, rank, sharing, &blocks);
  geo.maxBlocks = static_cast<int>(std::clamp<int64_t>(blocks, 1, 128));
  geo.slots = static_cast<int>(std::clamp<int64_t>(settings::get(settings::kP2pSlots), 2, 16));
  const uint64_t slot = settings::get(settings::kP2pSlotBytes)
                            .orAuto(nranks_ <= 2   ? 256 * 1024
                                    : nranks_ <= 4 ? 128 * 1024
                                                   : 64 * 1024);
  geo.slotBytes =
      static_cast<size_t>(std::clamp<uint64_t>(slot, 16 * 1024, 16 << 20)) / 4096 * 4096;
  mine.shareGpu = shareGpu ? 1 : 0;
  mine.blocks = geo.maxBlocks;
  mine.slots = geo.slots;
  mine.slotBytes = geo.slotBytes;
  mine.threads =
      static_cast<int32_t>(std::clamp<int64_t>(settings::get(settings::kP2pThreads), 64, 512)) /
      32 * 32;
  // Each size as this communicator uses it, auto resolved for its rank count: "up to"
  // limits are 0 when off and UINT64_MAX for any size, "from" thresholds UINT64_MAX when
  // off (docs/environment.md gives each default).
  using settings::get;
  const bool two = nranks_ == 2;
  const uint64_t never = UINT64_MAX;
  const size_t llRegion = dev::kLLBlocks * dev::kLLPayload;
  dev::MeshSizes& sz = mine.sizes;
  sz.llBytes = get(settings::kP2pLlBytes).upTo(nranks_ <= 2 ? llRegion : 256 << 10);
  sz.ll128Bytes = get(settings::kP2pLl128Bytes).upTo(0);
  sz.oneShotBytes = get(settings::kP2pOneshotBytes).upTo(nranks_ <= 2 ? 4 << 20 : 256 << 10);
  sz.ceBytes = get(settings::kP2pCeBytes).from(16 << 20);
  sz.reduceDirectBytes = get(settings::kP2pReduceDirectBytes).upTo(0);
  sz.pullBytes = get(settings::kP2pPullBytes).upTo(0);
  sz.pullReduceBytes = get(settings::kP2pPullReduceBytes).upTo(0);
  sz.twoShotReduceBytes = get(settings::kP2pTwoshotReduceBytes).upTo(0);
  sz.cePullBytes = get(settings::kP2pCePullBytes).from(never);
  sz.chunkReduceBytes = get(settings::kP2pCeReduceBytes).from(two ? 2 << 20 : never);
  sz.chunkAllReduceBytes = get(settings::kP2pCeAllreduceBytes).from(two ? 256 << 20 : never);
  sz.chunkSize = get(settings::kP2pCeChunkBytes).orAuto(0);
  sz.scratchBytes = get(settings::kP2pCeScratchBytes).orAuto(0);
  if (rank == 0) mine.token = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
  const std::string algoText = settings::get(settings::kAlgo);
  LOOM_ASSIGN_OR_RETURN(const collectives::AlgoRequest algo,
                        collectives::AlgoRequest::parse(algoText));
  LOOM_ASSIGN_OR_RETURN(const collectives::Proto proto,
                        collectives::parseProto(settings::get(settings::kProto)));
  mine.algoAllowed = algo.allowedMask();
  std::snprintf(mine.algo, sizeof(mine.algo), "%s", algoText.c_str());  // for messages only
  std::snprintf(mine.proto, sizeof(mine.proto), "%s", collectives::protoText(proto));
  std::vector<MeshAgreement> all(nranks_);
  all[rank] = mine;
  LOOM_TRY(bootstrap.allGather(all.data(), sizeof(MeshAgreement)));
  mesh_ = true;
  for (int r = 0; r < nranks_; ++r) {
    if (!all[r].reachable) {
      mesh_ = false;
      why_ = "rank " + std::to_string(r) + ": " + all[r].why;
      break;
    }
    if (!(all[r].sizes == mine.sizes) || all[r].algoAllowed != mine.algoAllowed ||
        std::strcmp(all[r].proto, mine.proto) != 0) {
      return errorf(
          Code::kInvalidUsage,
          "rank %d and rank %d differ in LOOM_ALGO/LOOM_PROTO/"
          "LOOM_P2P_LL_BYTES/LOOM_P2P_ONESHOT_BYTES/LOOM_P2P_CE_BYTES (or "
          "LOOM_P2P_LL128_BYTES, LOOM_P2P_REDUCE_DIRECT_BYTES, "
          "LOOM_P2P_PULL_BYTES, LOOM_P2P_PULL_REDUCE_BYTES, LOOM_P2P_TWOSHOT_REDUCE_BYTES, "
          "LOOM_P2P_CE_PULL_BYTES, "
          "LOOM_P2P_CE_REDUCE_BYTES, LOOM_P2P_CE_ALLREDUCE_BYTES, "
          "LOOM_P2P_CE_CHUNK_BYTES, LOOM_P2P_CE_SCRATCH_BYTES) (\"%s\"/\"%s\"/%llu/%llu/%llu "
          "against \"%s\"/\"%s\"/%llu/%llu/%llu): every rank must pick the same GPU algorithm",
          r, rank, all[r].algo, all[r].proto, (unsigned long long)all[r].sizes.llBytes,
          (unsigned long long)all[r].sizes.oneShotBytes, (unsigned long long)all[r].sizes.ceBytes,
          mine.algo, mine.proto, (unsigned long long)sz.llBytes,
          (unsigned long long)sz.oneShotBytes, (unsigned long long)sz.ceBytes);
    }
    if (all[r].shareGpu != mine.shareGpu) {
      return errorf(Code::kInvalidUsage,
                    "rank %d has LOOM_P2P_SHARE_GPU=%d and rank %d %d: set it alike on every rank",
                    r, all[r].shareGpu, rank, mine.shareGpu);
    }
    if (all[r].blocks != mine.blocks || all[r].slots != mine.slots ||
        all[r].slotBytes != mine.slotBytes || all[r].threads != mine.threads) {
      return errorf(Code::kInvalidUsage,
                    "rank %d uses LOOM_P2P_BLOCKS/SLOTS/SLOT_BYTES/THREADS "
                    "%d/%d/%llu/%d and rank %d %d/%d/%llu/%d: set them alike on every rank",
                    r, all[r].blocks, all[r].slots, (unsigned long long)all[r].slotBytes,
                    all[r].threads, rank, mine.blocks, mine.slots,
                    (unsigned long long)mine.slotBytes, mine.threads);
    }
  }
  // LL128 lines per block, peer and parity, only when the agreed settings ask for it (it
  // measured slower than the default forms at most sizes, docs/decisions.md): 8 MiB per
  // peer and call on 2 ranks (17.5 MiB of window per peer), 2 MiB above; at least 16 KiB
  // per block (meshShape). LOOM_PROTO=simple or ll turn LL128 off (chooseForms), so no
  // region then either.
  if (dev::meshNeedsLL128(sz, proto)) {
    geo.ll128Lines = nranks_ <= 2 ? 560 : 144;
    // The protocol needs each 128-byte line to arrive whole, as over NVLink; over PCIe a
    // reader can see a line's flag before its data (NCCL keeps LL128 off there too).
    if (mesh_ && !gpus[rank].nativeLinks) {
      LOOM_WARN(kInit,
                "rank %d: LL128 is on (LOOM_PROTO/LOOM_P2P_LL128_BYTES) but CUDA reports no "
                "native peer atomics between this GPU and every peer (not NVLink?): results "
                "may be wrong; turn it off unless the GPUs are linked by NVLink",
                rank);
    }
  }
  ctx_.geo = geo;
  // Where ranks share a GPU the LL forms, which launch a block per 8 KiB (LL) or 16 KiB
  // (LL128) sent to each peer regardless of LOOM_P2P_BLOCKS, stay within the blocks that fit.
  limits_ = dev::resolveMeshLimits(sz, algo, proto, nranks_, geo.ll128Capacity(),
                                   sharing > 1 ? geo.maxBlocks : 0);
  flatAlgo_ = limits_.algo.withoutHier();
  timeoutMs_ = settings::get(settings::kTimeoutMs);
  bool oneProcess = true;
  for (const auto& g : gpus)
    oneProcess = oneProcess && g.process == gpus[0].process && g.hostHash == gpus[0].hostHash;
  if (!mesh_) {
    if (meshOnly_) return Status::ok();  // a host's part of the hierarchy: its caller says
    LOOM_INFO(kInit, "GPU %d (%s): no GPU mesh, because %s", device_, self.busId, why_.c_str());
    LOOM_TRY(initNetwork(bootstrap, peers));
    return initHierarchy(bootstrap, peers);
  }
  auto window = transport::p2p::Window::create(
      rank, nranks_, device_, geo.windowBytes(), gpus,
      [&](void* data, size_t size) { return bootstrap.allGather(data, size); });
  if (!window) return window.status().withContext("setting up the GPU peer-to-peer mesh");
  window_ = std::move(window).value();
  LOOM_TRY(cudaStatus(cudaMalloc(&state_, geo.stateBytes()), "cudaMalloc of the mesh counters"));
  LOOM_TRY(cudaStatus(cudaMemset(state_, 0, geo.stateBytes()), "cudaMemset of the mesh counters"));
  LOOM_TRY(cudaStatus(
      cudaHostAlloc(reinterpret_cast<void**>(&hostFlags_), 2 * sizeof(int), cudaHostAllocMapped),
      "cudaHostAlloc of the abort flag"));
  hostFlags_[0] = hostFlags_[1] = 0;
  int* devFlags = nullptr;
  LOOM_TRY(cudaStatus(cudaHostGetDevicePointer(reinterpret_cast<void**>(&devFlags), hostFlags_, 0),
                      "cudaHostGetDevicePointer"));
  LOOM_TRY(
      cudaStatus(cudaEventCreateWithFlags(&lastEvent_, cudaEventDisableTiming), "cudaEventCreate"));
  LOOM_TRY(cudaStatus(cudaEventCreateWithFlags(&eagerEvent_, cudaEventDisableTiming),
                      "cudaEventCreate"));
  LOOM_TRY(
      cudaStatus(cudaEventCreateWithFlags(&joinEvent_, cudaEventDisableTiming), "cudaEventCreate"));
  LOOM_TRY(
      cudaStatus(cudaEventCreateWithFlags(&forkEvent_, cudaEventDisableTiming), "cudaEventCreate"));
  LOOM_TRY(
      cudaStatus(cudaEventCreateWithFlags(&sideEvent_, cudaEventDisableTiming), "cudaEventCreate"));
  LOOM_TRY(
      cudaStatus(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cudaStreamCreate"));
  if (oneProcess) {
    LOOM_TRY(cudaStatus(cudaStreamCreateWithFlags(&pushStream_, cudaStreamNonBlocking),
                        "cudaStreamCreate"));
    for (cudaEvent_t* e : {&chunkEvent_, &pushEvent_}) {
      LOOM_TRY(cudaStatus(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate"));
    }
    clique_ = cliqueFor(all[0].token, nranks_);
    std::lock_guard<std::mutex> lock(clique_->mutex);
    clique_->abortFlags[rank_] = reinterpret_cast<volatile int*>(hostFlags_);
    clique_->devices[rank_] = device_;
    if (sharing > 1 && settings::get(settings::kP2pShareGpuGate) && !clique_->gate) {
      clique_->gate = std::make_unique<PhaseGate>(nranks_);
    }
  }
  // Registration between processes (cuda_executor_registration.cc), when each rank is a
  // process of its own: a registered call waits on the host for its peers' posts, and a
  // thread that issued one rank's call before another's of the same process would wait
  // for itself. Every rank gets the same outcome: without the board, registration is kept
  // without effect.
  bool ownProcesses = true;
  for (int a = 0; a < nranks_; ++a) {
    for (int b = a + 1; b < nranks_; ++b)
      ownProcesses = ownProcesses && gpus[a].process != gpus[b].process;
  }
  if (ownProcesses && nranks_ > 1) {
    auto board = transport::p2p::PostBoard::createShared(
        rank, nranks_, [&](void* data, size_t size) { return bootstrap.allGather(data, size); });
    if (board) {
      board_ = std::move(board).value();
    } else {
      LOOM_WARN(kInit,
                "rank %d: no registration post board (%s): ncclCommRegister will have no "
                "effect",
                rank, board.status().message().c_str());
    }
  }
  LOOM_TRY(cudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the mesh set-up"));
  ctx_.rank = rank;
  ctx_.nranks = nranks_;
  for (int r = 0; r < nranks_; ++r) ctx_.windows[r] = window_->peer(r);
  ctx_.state = state_;
  ctx_.abortFlag = devFlags;
  ctx_.errorFlag = devFlags + 1;
  ctx_.timeoutNs = timeoutMs_ > 0 ? static_cast<uint64_t>(timeoutMs_) * 1000000ull : 0;
  ctx_.threads = mine.threads;
  const bool pdlBuilt = dev::kernelsWaitForPredecessor();
  // A kernel launched early holds SM slots while it waits: with ranks sharing a GPU those
  // may be the slots a peer's kernel needs to finish.
  ctx_.pdl = pdlBuilt && settings::get(settings::kPdl) && sharing == 1;
  // Every rank's window must be mapped before anyone writes into it.
  LOOM_TRY(bootstrap.barrier());
  LOOM_INFO(kInit,
            "GPU %d (%s): P2P mesh of %d ranks, %d blocks x %d threads, %d slots x %zu "
            "bytes per peer and block (%.1f MiB window); programmatic dependent launch %s",
            device_, self.busId, nranks_, geo.maxBlocks, ctx_.threads, geo.slots, geo.slotBytes,
            geo.windowBytes() / 1048576.0,
            ctx_.pdl      ? "on"
            : sharing > 1 ? "off (ranks share a GPU)"
            : pdlBuilt    ? "off (LOOM_PDL=0)"
                          : "off (it needs compute capability 9.0, in the GPU and in the build)");
  if (clique_) {
    LOOM_INFO(kInit,
              "GPU %d: every rank is in this process: when the ranks' calls meet in one group, "
              "broadcast, all-gather and all-to-all from %zu bytes per copy use the copy engines "
              "(LOOM_P2P_CE_BYTES); reduce from %zu bytes and all-reduce from %zu move their data "
              "with them in chunks of up to %zu bytes, reduced locally (LOOM_P2P_CE_REDUCE_BYTES, "
              "LOOM_P2P_CE_ALLREDUCE_BYTES, LOOM_P2P_CE_SCRATCH_BYTES; SIZE_MAX: never)",
              device_, limits_.ceMin, limits_.chunkReduceMin, limits_.chunkAllReduceMin,
              limits_.chunkMax);
  }
  return Status::ok();
}

void CudaExecutor::postGroup(uint64_t group, const std::vector<Operation>& ops) {
  group_ = 0;
  cursor_ = 0;
  if (!clique_) return;
  std::lock_guard<std::mutex> lock(clique_->mutex);
  auto& mine = clique_->calls[rank_];
  mine.clear();
  for (const Operation& o : ops) {
    if (!o.onDevice || o.type == collectives::CollType::kSendRecv) continue;
    // The one-process forms reach a peer's buffers through peer access, which maps
    // cudaMalloc memory only: a copy between GPUs from or into a stream-ordered pool
    // (cudaMallocAsync) or VMM memory fails. Ask the driver where such a form may run.
    const size_t bytes = o.count * dataTypeSize(o.dtype);
    const bool chunked = limits_.chunkedSize(o.type, bytes);
    const bool reduce = o.type == collectives::CollType::kReduce;
    const bool ask = (o.type == collectives::CollType::kAllReduce && limits_.pullSize(bytes)) ||
                     (reduce && limits_.twoShotReduceSize(bytes)) || bytes >= limits_.ceMin ||
                     chunked;
    const bool inMapped = ask && cuda::isPeerMappableDevicePointer(o.sendbuff);
    const bool outMapped =
        ask &&
        ((reduce && o.root != rank_) ||
         (o.recvbuff == o.sendbuff ? inMapped : cuda::isPeerMappableDevicePointer(o.recvbuff)));
    // A stream that cannot be asked fails the call itself, in run().
    const Result<bool> cap = chunked ? capturing(o.stream) : Result<bool>(false);
    const bool captured = cap.isOk() && cap.value();
    mine.push_back({o.type, o.count, o.dtype, o.root, o.ncclOp, o.sendbuff, o.recvbuff, inMapped,
                    outMapped, captured});
  }
  clique_->group[rank_] = group;
  group_ = group;
}

Status CudaExecutor::kernelError() const {
  // The hierarchy's executors number their ranks within the host and within the rail.
  if (local_) {
    if (Status st = local_->kernelError(); !st) {
      return st.withContext("in this host's GPU mesh of the hierarchical form, whose rank i is " +
                            hierRanksText(hier_.localRanks));
    }
  }
  if (rail_) {
    if (Status st = rail_->error(); !st) {
      return st.withContext("on the rail of the hierarchical form, whose rank i is " +
                            hierRanksText(hier_.railRanks));
    }
  }
  if (net_) return net_->error();
  if (!hostFlags_) return Status::ok();
  int e = reinterpret_cast<volatile int*>(hostFlags_)[1];
  if (e == dev::kMeshErrorAborted)
    return errorf(Code::kInvalidUsage, "a GPU kernel stopped: the communicator was aborted");
  if (e == dev::kMeshErrorTimeout) {
    return errorf(Code::kRemoteError,
                  "rank %d: a GPU kernel waited more than LOOM_TIMEOUT_MS=%lld ms "
                  "for a peer (a peer died, or ranks issued different collectives)",
                  rank_, (long long)timeoutMs_);
  }
  return Status::ok();
}

void CudaExecutor::abort() {
  if (hostFlags_) reinterpret_cast<volatile int*>(hostFlags_)[0] = 1;
  if (net_) net_->abort();
  if (rail_) rail_->abort();
  if (local_) local_->abort();
}

bool CudaExecutor::idle() const {
  // Every call records its end on its stream (the streams are ordered after one another),
  // so the last uncaptured one stands for all that were enqueued.
  const cudaEvent_t last = lastEagerEvent();
  if (!last) return true;
  const cudaError_t e = cudaEventQuery(last);
  if (e == cudaErrorNotReady) return false;
  // An error here is the kernels' (kernelError says which); cleared so that the caller's
  // thread does not meet it later, and only then: an error of the caller's own stays.
  if (e != cudaSuccess) cudaGetLastError();
  return true;
}

Status CudaExecutor::run(const Operation& op, const ExecutorRedOp& red) {
  if (!mesh_) return runNet(op, red);
  const size_t index = cursor_++;  // this call's place among the group's device collectives
  if (op.count == 0) return Status::ok();
  if (op.type == collectives::CollType::kSendRecv) {
    return errorf(Code::kInternalError, "Send/Recv reached the GPU mesh's collective path");
  }
  // The facts the plan reads (collectives/device/mesh_plan.h); every rank's buffers only
  // where the plan may use them.
  const size_t block = op.count * dataTypeSize(op.dtype);
  dev::MeshCallFacts facts;
  facts.type = op.type;
  facts.bytes = block;
  facts.plainOp = op.ncclOp < ncclNumOps && !red.scalarDevice;
  facts.builtinOp = facts.plainOp && red.op.kind != RedKind::kPreMulSum;
  facts.board = board_ != nullptr;
  std::vector<dev::RankBuffers> all;
  if (dev::meshNeedsPeerFacts(limits_, op.type, block) &&
      peerBuffers(op, index, &all, &facts.inMapped, &facts.outMapped, &facts.captured)) {
    facts.peersKnown = true;
    facts.outputsApart = outputsApart(all, block);
    facts.allInPlace = allInPlace(all);
    if (op.type == collectives::CollType::kReduce)
      facts.rootOutputApart = rootOutputApart(all, op.root, block);
    const char* unused = nullptr;
    const dev::MeshKind kind = dev::meshKind(limits_, op.type, block, &unused);
    if (dev::copyOnly(kind))
      facts.copyPlanSafe = dev::copyPlanSafe(kind, nranks_, op.root, block, all.data());
  }
  const dev::MeshPlan plan = dev::planMeshCall(limits_, facts);
  dev::MeshCall call;
  call.kind = plan.kind;
  call.type = op.dtype;
  call.red = red.op.kind;
  call.scalar = red.op.scalar;
  call.scalarDevice = red.scalarDevice;
  call.divisor = red.op.divisor;
  call.in = op.sendbuff;
  call.out = op.recvbuff;
  call.count = op.count;
  call.root = op.root;
  for (int i = 0; i < plan.nsteps; ++i) {
    const dev::MeshStep& step = plan.steps[i];
    LOOM_ASSIGN_OR_RETURN(const bool ran, runStep(step, op, call, all, facts));
    if (ran) return Status::ok();
  }
  return errorf(Code::kInternalError, "the GPU mesh's plan for %s ran nothing",
                collectives::collTypeName(op.type));
}

Result<bool> CudaExecutor::runStep(const dev::MeshStep& step, const Operation& op,
                                   const dev::MeshCall& call,
                                   const std::vector<dev::RankBuffers>& all,
                                   const dev::MeshCallFacts& facts) {
  const size_t block = facts.bytes;
  switch (step.route) {
    case dev::MeshRoute::kKernel: LOOM_TRY(launch(call, op.stream, step.why)); return true;
    case dev::MeshRoute::kPulledReduce: {
      dev::PullInputs in;
      in.writer = op.root;
      for (int r = 0; r < nranks_; ++r) in.inputs[r] = all[r].in;
      in.outputs[op.root] = all[op.root].out;
      LOOM_TRY(failCliqueOn(launchPull(call, in, op.stream, step.why, true)));
      return true;
    }
    case dev::MeshRoute::kChunked: {
      std::vector<void*> scratch = chunkScratch();
      if (scratch.empty()) return false;  // every rank alike: the next step
      LOOM_TRY(failCliqueOn(launchChunked(op, call, all, scratch)));
      return true;
    }
    case dev::MeshRoute::kRegisteredPull: {
      // Every rank exchanges posts for the same calls, so all decide alike.
      dev::PullInputs in;
      in.writer = op.type == collectives::CollType::kReduce ? op.root : -1;
      PullRequest req;
      req.reader = in.writer;
      LOOM_ASSIGN_OR_RETURN(int form, registeredInputs(op, req, &in));
      if (form == 0) return false;
      LOOM_ASSIGN_OR_RETURN(const bool inGraph, capturing(op.stream));
      if (inGraph) importsInGraph_ = true;  // its mappings stay until the end
      if (form == 2) {
        for (int r = 0; r < nranks_; ++r) in.outputs[r] = const_cast<void*>(in.inputs[r]);
        LOOM_TRY(launchPull(call, in, op.stream,
                            "registered buffers, in place, size <= LOOM_P2P_PULL_BYTES", true));
      } else if (form == 3) {
        LOOM_TRY(launchPull(call, in, op.stream,
                            "registered inputs and outputs, size <= LOOM_P2P_PULL_BYTES", true));
      } else {
        LOOM_TRY(launchPull(call, in, op.stream,
                            in.writer < 0
                                ? "registered inputs, size <= LOOM_P2P_PULL_BYTES"
                                : "registered inputs, size <= LOOM_P2P_PULL_REDUCE_BYTES"));
      }
      return true;
    }
    case dev::MeshRoute::kPulledAllReduce:
    case dev::MeshRoute::kPulledOneShot: {
      dev::PullInputs in;
      for (int r = 0; r < nranks_; ++r) {
        in.inputs[r] = all[r].in;
        in.outputs[r] = all[r].out;
      }
      const bool twoShot = step.route == dev::MeshRoute::kPulledAllReduce;
      LOOM_TRY(failCliqueOn(launchPull(call, in, op.stream, step.why, twoShot)));
      return true;
    }
    case dev::MeshRoute::kRegisteredCopies: {
      PullRequest req;
      if (call.kind == dev::MeshKind::kBroadcast) req.source = op.root;
      req.layout =
          dev::pullSafe(call.kind, rank_, nranks_, op.root, block, op.sendbuff, op.recvbuff) ? 1
                                                                                             : 0;
      dev::PullInputs in;
      LOOM_ASSIGN_OR_RETURN(int form, registeredInputs(op, req, &in));
      if (form == 0) return false;
      LOOM_ASSIGN_OR_RETURN(const bool inGraph, capturing(op.stream));
      if (inGraph) importsInGraph_ = true;
      LOOM_TRY(launchCopies(
          call, dev::planPulls(call.kind, rank_, nranks_, op.root, block, in.inputs, op.recvbuff),
          op.stream, step.why));
      return true;
    }
    case dev::MeshRoute::kCopyEngines:
      LOOM_TRY(failCliqueOn(
          launchCopies(call, dev::planCopies(call.kind, rank_, nranks_, op.root, block, all.data()),
                       op.stream, step.why)));
      return true;
  }
  return false;
}

Status CudaExecutor::runP2p(const std::vector<Operation>& ops, size_t begin, size_t end) {
  if (!mesh_) return runNetP2p(ops, begin, end);
  DeviceGuard guard(device_);
  cudaStream_t stream = ops[begin].stream;
  dev::MeshCall call;
  call.kind = dev::MeshKind::kSendRecv;
  call.type = DataType::kUint8;
  dev::P2pList list;
  std::map<std::pair<int, int>, int> seqOf;
  // Sends to ourselves pair with receives from ourselves, in order.
  std::vector<const Operation*> selfSends, selfRecvs;
  for (size_t i = begin; i < end; ++i) {
    const Operation& o = ops[i];
    size_t bytes = o.count * dataTypeSize(o.dtype);
    if (bytes == 0) continue;
    if (o.root == rank_) {
      (o.isSend ? selfSends : selfRecvs).push_back(&o);
      continue;
    }
    if (list.nops == dev::kMaxP2pOps) {
      return errorf(Code::kInvalidUsage,
                    "more than %d Send/Recv calls with peers in one group on a "
                    "GPU communicator; split the group",
                    dev::kMaxP2pOps);
    }
    dev::P2pOp& p = list.ops[list.nops++];
    p.buffer = o.isSend ? const_cast<void*>(o.sendbuff) : o.recvbuff;
    p.bytes = bytes;
    p.peer = o.root;
    p.isSend = o.isSend ? 1 : 0;
    // The n-th message between two ranks in one direction is the n-th on both ends.
    p.seq = seqOf[{o.root, p.isSend}]++;
  }
  // Calls of the group on other streams: those streams' earlier work comes first.
  for (size_t i = begin; i < end; ++i) {
    if (ops[i].stream != stream) LOOM_TRY(join(ops[i].stream, stream));
  }
  if (selfSends.size() != selfRecvs.size()) {
    return errorf(Code::kInvalidUsage, "rank %d sends %zu message(s) to itself but receives %zu",
                  rank_, selfSends.size(), selfRecvs.size());
  }
  // In place, the kernel's order must read each send before a receive overwrites it.
  std::vector<dev::MeshRange> selfWrites;
  for (const Operation* o : selfRecvs)
    selfWrites.push_back(
        {reinterpret_cast<uintptr_t>(o->recvbuff), o->count * dataTypeSize(o->dtype)});
  if (const char* why = dev::meshP2pUnordered(list, selfWrites)) {
    return errorf(Code::kInvalidUsage,
                  "rank %d: grouped Send/Recv on GPU buffers of one host: %s, which this path "
                  "cannot order; give the send and the receive separate buffers (one buffer of "
                  "one size for both, as nccl-tests' sendrecv in place, is fine)",
                  rank_, why);
  }
  LOOM_ASSIGN_OR_RETURN(const bool cap, capturing(stream));
  LOOM_TRY(order(stream, cap));
  LOOM_TRY(copySelfMessages(selfSends, selfRecvs, stream));
  if (list.nops == 0) return recordDone(stream, cap);
  return launchOrdered(call, stream, cap, &list, "grouped Send/Recv");
}

Status CudaExecutor::copySelfMessages(const std::vector<const Operation*>& sends,
                                      const std::vector<const Operation*>& recvs,
                                      cudaStream_t stream) {
  for (size_t k = 0; k < sends.size() && k < recvs.size(); ++k) {
    const size_t sb = sends[k]->count * dataTypeSize(sends[k]->dtype);
    const size_t rb = recvs[k]->count * dataTypeSize(recvs[k]->dtype);
    if (sb != rb) {
      return errorf(Code::kInvalidUsage,
                    "rank %d: send to itself of %zu bytes meets a receive of %zu", rank_, sb, rb);
    }
    LOOM_TRY(cudaStatus(cudaMemcpyAsync(recvs[k]->recvbuff, sends[k]->sendbuff, sb,
                                        cudaMemcpyDeviceToDevice, stream),
                        "cudaMemcpyAsync"));
  }
  return Status::ok();
}

Status CudaExecutor::order(cudaStream_t stream, bool cap) {
  if (!haveLast_ || stream == lastStream_) return Status::ok();
  if (cap != lastCaptured_) {
    if (!warnedCapture_) {
      LOOM_WARN(kColl,
                "rank %d: consecutive GPU collectives on two streams, one inside a CUDA "
                "graph capture and one outside; loom cannot order them: keep them on one "
                "stream or order the streams yourself",
                rank_);
      warnedCapture_ = true;
    }
    return Status::ok();
  }
  cudaError_t e = cudaStreamWaitEvent(stream, lastEvent_, 0);
  if (e != cudaSuccess)
    return cudaStatus(e, "cudaStreamWaitEvent (ordering after the previous collective)");
  return Status::ok();
}

Status CudaExecutor::join(cudaStream_t earlier, cudaStream_t later) {
  LOOM_ASSIGN_OR_RETURN(const bool earlierCapturing, capturing(earlier));
  LOOM_ASSIGN_OR_RETURN(const bool laterCapturing, capturing(later));
  if (earlierCapturing != laterCapturing) return Status::ok();
  LOOM_TRY(cudaStatus(cudaEventRecord(joinEvent_, earlier), "cudaEventRecord"));
  return cudaStatus(cudaStreamWaitEvent(later, joinEvent_, 0), "cudaStreamWaitEvent");
}

Status CudaExecutor::recordDone(cudaStream_t stream, bool cap) {
  // A captured call's end goes into its graph: the last uncaptured one's event is kept
  // aside first (lastEagerEvent).
  if (cap && haveLast_ && !lastCaptured_) std::swap(lastEvent_, eagerEvent_);
  LOOM_TRY(cudaStatus(cudaEventRecord(lastEvent_, stream), "cudaEventRecord"));
  lastStream_ = stream;
  lastCaptured_ = cap;
  haveLast_ = true;
  haveEager_ = haveEager_ || !cap;
  return Status::ok();
}

Status CudaExecutor::launch(const dev::MeshCall& call, cudaStream_t stream, const char* why) {
  DeviceGuard guard(device_);
  LOOM_ASSIGN_OR_RETURN(const bool cap, capturing(stream));
  LOOM_TRY(order(stream, cap));
  return launchOrdered(call, stream, cap, nullptr, why);
}

Status CudaExecutor::launchOrdered(const dev::MeshCall& call, cudaStream_t stream, bool cap,
                                   const dev::P2pList* p2p, const char* why) {
  if (log::enabled(log::kInfo, log::kColl)) {
    auto shape = dev::meshShape(ctx_, call);
    LOOM_INFO(kColl, "GPU %s: %zu x %s, %d blocks, tile %zu elements (%s)",
              dev::meshKindName(call.kind), call.count, dataTypeName(call.type), shape.blocks,
              shape.tileElems, why);
  }
  if (int e = dev::launchMesh(ctx_, call, stream, p2p); e != 0) {
    return launchStatus(e,
                        (std::string("the ") + dev::meshKindName(call.kind) + " kernel").c_str());
  }
  return recordDone(stream, cap);
}

Result<std::unique_ptr<DeviceExecutor>> DeviceExecutor::create(
    transport::SetupChannel& setup, const std::vector<transport::PeerInfo>& peers, int rank,
    int device, const ExecutorContext& context) {
  auto c = std::make_unique<CudaExecutor>();
  LOOM_TRY(c->init(setup, peers, rank, device, context));
  return std::unique_ptr<DeviceExecutor>(std::move(c));
}

}  // namespace loom::collectives::device
