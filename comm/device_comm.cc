#include "comm/device_comm.h"

#include "comm/communicator.h"
#include "common/cuda_probe.h"
#include "common/log.h"
#include "common/settings.h"

#if LOOM_HAVE_CUDA
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>

#include "comm/cuda_device_comm.h"
#endif

namespace loom::comm {

bool isDeviceBuffer(const void* p) {
  return cuda::isDevicePointer(p);
}

#if !LOOM_HAVE_CUDA

int currentDevice() {
  return -1;
}
bool copyDeviceToHost(void*, const void*, size_t) {
  return false;
}
void* deviceAlloc(size_t) {
  return nullptr;
}
void deviceFree(void*) {}
Result<std::unique_ptr<DeviceComm>> DeviceComm::create(Bootstrap&,
                                                       const std::vector<transport::PeerInfo>&, int,
                                                       int, const DeviceCommContext&) {
  return std::unique_ptr<DeviceComm>();
}

#else

namespace detail {

// LOOM_ALGO and LOOM_PROTO are matched without regard to case.
static std::string lowered(const char* text) {
  std::string t = text;
  for (auto& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return t;
}

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

CudaDeviceComm::~CudaDeviceComm() {
  DeviceGuard guard(device_);
  net_.reset();  // waits for its kernels first
  for (void* p : netScratch_) cudaFree(p);
  // Kernels still queued write into the windows: let them finish first.
  if (window_) cudaDeviceSynchronize();
  closeImports();
  board_.reset();
  if (lastEvent_) cudaEventDestroy(lastEvent_);
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
void CudaDeviceComm::capForSharedGpu(const std::vector<transport::p2p::GpuIdentity>& gpus, int rank,
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

Status CudaDeviceComm::init(Bootstrap& bootstrap, const std::vector<transport::PeerInfo>& peers,
                            int rank, int device, const DeviceCommContext& context) {
  context_ = context;
  rank_ = rank;
  nranks_ = static_cast<int>(peers.size());
  device_ = device;
  DeviceGuard guard(device_);
  LOOM_ASSIGN_OR_RETURN(auto self, transport::p2p::describeGpu(rank, device, peers[rank].hostHash));
  std::vector<transport::p2p::GpuIdentity> gpus(nranks_);
  gpus[rank] = self;
  LOOM_TRY(bootstrap.allGather(gpus.data(), sizeof(gpus[0])));
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
  mine.llBytes = get(settings::kP2pLlBytes).upTo(nranks_ <= 2 ? llRegion : 256 << 10);
  mine.ll128Bytes = get(settings::kP2pLl128Bytes).upTo(0);
  mine.oneShotBytes = get(settings::kP2pOneshotBytes).upTo(nranks_ <= 2 ? 4 << 20 : 256 << 10);
  mine.ceBytes = get(settings::kP2pCeBytes).from(16 << 20);
  mine.reduceDirectBytes = get(settings::kP2pReduceDirectBytes).upTo(0);
  mine.pullBytes = get(settings::kP2pPullBytes).upTo(0);
  mine.pullReduceBytes = get(settings::kP2pPullReduceBytes).upTo(0);
  mine.twoShotReduceBytes = get(settings::kP2pTwoshotReduceBytes).upTo(0);
  mine.cePullBytes = get(settings::kP2pCePullBytes).from(never);
  mine.chunkBytes = get(settings::kP2pCeReduceBytes).from(two ? 2 << 20 : never);
  mine.chunkAllReduceBytes = get(settings::kP2pCeAllreduceBytes).from(two ? 256 << 20 : never);
  mine.chunkSize = get(settings::kP2pCeChunkBytes).orAuto(0);
  mine.scratchBytes = get(settings::kP2pCeScratchBytes).orAuto(0);
  if (rank == 0) mine.token = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
  std::snprintf(mine.algo, sizeof(mine.algo), "%s", settings::get(settings::kAlgo).c_str());
  const std::string forcedProto = settings::get(settings::kProto);
  std::snprintf(mine.proto, sizeof(mine.proto), "%s",
                forcedProto == "auto" ? "" : forcedProto.c_str());
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
    if (all[r].llBytes != mine.llBytes || all[r].ll128Bytes != mine.ll128Bytes ||
        all[r].oneShotBytes != mine.oneShotBytes || all[r].ceBytes != mine.ceBytes ||
        all[r].reduceDirectBytes != mine.reduceDirectBytes || all[r].pullBytes != mine.pullBytes ||
        all[r].pullReduceBytes != mine.pullReduceBytes ||
        all[r].twoShotReduceBytes != mine.twoShotReduceBytes ||
        all[r].cePullBytes != mine.cePullBytes || all[r].chunkBytes != mine.chunkBytes ||
        all[r].chunkAllReduceBytes != mine.chunkAllReduceBytes ||
        all[r].chunkSize != mine.chunkSize || all[r].scratchBytes != mine.scratchBytes ||
        std::strcmp(all[r].algo, mine.algo) != 0 || std::strcmp(all[r].proto, mine.proto) != 0) {
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
          r, rank, all[r].algo, all[r].proto, (unsigned long long)all[r].llBytes,
          (unsigned long long)all[r].oneShotBytes, (unsigned long long)all[r].ceBytes, mine.algo,
          mine.proto, (unsigned long long)mine.llBytes, (unsigned long long)mine.oneShotBytes,
          (unsigned long long)mine.ceBytes);
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
  const std::string proto = lowered(mine.proto);
  if (proto == "ll128" || (mine.ll128Bytes > 0 && proto != "simple" && proto != "ll")) {
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
  ctx_.geo = geo;  // chooseForms reads the LL128 capacity
  chooseForms(mine);
  if (sharing > 1) {
    // The LL forms launch a block per 8 KiB (LL) or 16 KiB (LL128) sent to each peer,
    // regardless of LOOM_P2P_BLOCKS: keep them within the blocks that fit.
    llLimit_ = std::min(llLimit_, size_t(geo.maxBlocks) * dev::kLLPayload);
    ll128Limit_ = std::min(ll128Limit_, size_t(geo.maxBlocks) * 16 * 1024);
  }
  timeoutMs_ = settings::get(settings::kTimeoutMs);
  bool oneProcess = true;
  for (const auto& g : gpus)
    oneProcess = oneProcess && g.process == gpus[0].process && g.hostHash == gpus[0].hostHash;
  if (!mesh_) {
    LOOM_INFO(kInit, "GPU %d (%s): no GPU mesh, because %s", device_, self.busId, why_.c_str());
    return initNetwork(bootstrap, peers);
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
  }
  // Registration between processes (comm/device_registration.cc), when each rank is a
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
              device_, ceMin_, chunkReduceMin_, chunkAllReduceMin_, chunkMax_);
  }
  return Status::ok();
}

void CudaDeviceComm::postGroup(uint64_t group, const std::vector<Operation>& ops) {
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
    const bool chunked = chunkedSize(o.type, bytes);
    const bool reduce = o.type == collectives::CollType::kReduce;
    const bool ask = (o.type == collectives::CollType::kAllReduce && pullSize(bytes)) ||
                     (reduce && twoShotReduceSize(bytes)) || bytes >= ceMin_ || chunked;
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

Status CudaDeviceComm::kernelError() const {
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

void CudaDeviceComm::abort() {
  if (hostFlags_) reinterpret_cast<volatile int*>(hostFlags_)[0] = 1;
  if (net_) net_->abort();
}

Status CudaDeviceComm::run(const Operation& op, const DeviceRedOp& red) {
  if (!mesh_) return runNet(op, red);
  const size_t index = cursor_++;  // this call's place among the group's device collectives
  if (op.count == 0) return Status::ok();
  const char* why = "the one direct form on a GPU mesh";
  dev::MeshCall call;
  call.type = op.dtype;
  call.red = red.op.kind;
  call.scalar = red.op.scalar;
  call.scalarDevice = red.scalarDevice;
  call.divisor = red.op.divisor;
  call.in = op.sendbuff;
  call.out = op.recvbuff;
  call.count = op.count;
  call.root = op.root;
  switch (op.type) {
    case collectives::CollType::kAllReduce: call.kind = allReduceKind(op, &why); break;
    case collectives::CollType::kAllGather: call.kind = dev::MeshKind::kAllGather; break;
    case collectives::CollType::kBroadcast: call.kind = dev::MeshKind::kBroadcast; break;
    case collectives::CollType::kReduceScatter: call.kind = reduceScatterKind(op, &why); break;
    case collectives::CollType::kReduce: call.kind = reduceKind(op, &why); break;
    case collectives::CollType::kAllToAll: call.kind = dev::MeshKind::kAllToAll; break;
    default:
      return errorf(Code::kInternalError, "collective %d has no GPU mesh form",
                    static_cast<int>(op.type));
  }
  const size_t block = op.count * dataTypeSize(op.dtype);
  std::vector<dev::RankBuffers> all;
  bool inMapped = false, outMapped = false, captured = true;
  // Mid-size reduce, every rank's buffers known (ranks of this process): rank r reduces
  // part r of every input and stores it into the root's output, so every rank's SMs and
  // both directions of its links carry a share (the two-shot all-reduce, less the stores
  // into the other outputs). No pre-op, as the pulled all-reduce. The root's output must
  // not overlap any input but its own, and that only as the same buffer (each element is
  // then read and written by one thread).
  const bool builtinOp =
      red.op.kind != RedKind::kPreMulSum && !red.scalarDevice && op.ncclOp < ncclNumOps;
  if (op.type == collectives::CollType::kReduce && twoShotReduceSize(block) && builtinOp &&
      peerBuffers(op, index, &all, &inMapped, &outMapped) && inMapped && outMapped &&
      rootOutputApart(all, op.root, block)) {
    dev::PullInputs in;
    in.writer = op.root;
    for (int r = 0; r < nranks_; ++r) in.inputs[r] = all[r].in;
    in.outputs[op.root] = all[op.root].out;
    return failCliqueOn(launchPull(
        call, in, op.stream, "ranks of one process, size <= LOOM_P2P_TWOSHOT_REDUCE_BYTES", true));
  }
  // Large all-reduce and reduce, every rank's buffers known and none in a graph capture:
  // the copy engines move the data in chunks, kernels reduce them locally. A user's
  // PreMulSum scalar may differ between ranks, so only ncclAvg's (1/n) is applied here.
  // Peers write into an all-reduce's outputs, so those must be mapped; a reduce's output
  // is written by the root's own kernel only (the others' may even be null, as NCCL allows).
  if (chunkedSize(op.type, block) && op.ncclOp < ncclNumOps && !red.scalarDevice &&
      peerBuffers(op, index, &all, &inMapped, &outMapped, &captured) && inMapped && !captured &&
      (outMapped || op.type == collectives::CollType::kReduce)) {
    std::vector<void*> scratch = chunkScratch();
    if (!scratch.empty()) return failCliqueOn(launchChunked(op, call, all, scratch));
  }
  // Ranks in several processes, memory registered: an all-reduce or reduce reads the
  // peers' inputs where they lie when every rank whose input is read posted a registered
  // one (registeredInputs; every rank exchanges posts for the same calls, so all decide
  // alike). No pre-op in the pulled kernel: not for PreMulSum (ncclAvg on floats included).
  if (board_ && builtinOp &&
      ((op.type == collectives::CollType::kAllReduce && pullSize(block)) ||
       (op.type == collectives::CollType::kReduce && pastFlagForms(block) &&
        block <= pullReduceMax_))) {
    dev::PullInputs in;
    in.writer = op.type == collectives::CollType::kReduce ? op.root : -1;
    PullRequest req;
    req.reader = in.writer;
    LOOM_ASSIGN_OR_RETURN(int form, registeredInputs(op, req, &in));
    if (form != 0) {
      LOOM_ASSIGN_OR_RETURN(const bool inGraph, capturing(op.stream));
      if (inGraph) importsInGraph_ = true;  // its mappings stay until the end
      if (form == 2) {
        for (int r = 0; r < nranks_; ++r) in.outputs[r] = const_cast<void*>(in.inputs[r]);
        return launchPull(call, in, op.stream,
                          "registered buffers, in place, size <= LOOM_P2P_PULL_BYTES", true);
      }
      if (form == 3) {
        return launchPull(call, in, op.stream,
                          "registered inputs and outputs, size <= LOOM_P2P_PULL_BYTES", true);
      }
      return launchPull(call, in, op.stream,
                        in.writer < 0 ? "registered inputs, size <= LOOM_P2P_PULL_BYTES"
                                      : "registered inputs, size <= LOOM_P2P_PULL_REDUCE_BYTES");
    }
  }
  // Mid-size all-reduce, every rank's buffers known: each rank reduces its part from every
  // input and stores it into every output (two-shot), or, where the outputs cannot be
  // written from here (a stream-ordered pool's), reads every input and writes only its own
  // output (one-shot, out of place only). The kernels apply no pre-op, so not for
  // PreMulSum (a user's, or ncclAvg on floating-point types, which is PreMulSum by 1/n):
  // those keep the slot kernels.
  if (op.type == collectives::CollType::kAllReduce && pullSize(block) && builtinOp &&
      peerBuffers(op, index, &all, &inMapped, &outMapped) && inMapped) {
    dev::PullInputs in;
    for (int r = 0; r < nranks_; ++r) {
      in.inputs[r] = all[r].in;
      in.outputs[r] = all[r].out;
    }
    const bool apart = outputsApart(all, block), inPlace = allInPlace(all);
    if (outMapped && (apart || inPlace)) {
      return failCliqueOn(
          launchPull(call, in, op.stream,
                     inPlace ? "ranks of one process, in place, size <= LOOM_P2P_PULL_BYTES"
                             : "ranks of one process, out of place, size <= LOOM_P2P_PULL_BYTES",
                     true));
    }
    if (apart) {
      return failCliqueOn(launchPull(call, in, op.stream,
                                     "ranks of one process, out of place, output "
                                     "not mapped, size <= LOOM_P2P_PULL_BYTES"));
    }
  }
  // Copies only, ranks in several processes, inputs registered: each rank's copy engine
  // pulls its own output together from the inputs where they lie, between two barriers.
  if (board_ && dev::copyOnly(call.kind) && pullCopyWins(call.kind, block)) {
    PullRequest req;
    if (call.kind == dev::MeshKind::kBroadcast) req.source = op.root;
    req.layout =
        dev::pullSafe(call.kind, rank_, nranks_, op.root, block, op.sendbuff, op.recvbuff) ? 1 : 0;
    dev::PullInputs in;
    LOOM_ASSIGN_OR_RETURN(int form, registeredInputs(op, req, &in));
    if (form != 0) {
      LOOM_ASSIGN_OR_RETURN(const bool inGraph, capturing(op.stream));
      if (inGraph) importsInGraph_ = true;
      return launchCopies(
          call, dev::planPulls(call.kind, rank_, nranks_, op.root, block, in.inputs, op.recvbuff),
          op.stream,
          "registered inputs pulled between processes, size >= "
          "LOOM_P2P_CE_PULL_BYTES");
    }
  }
  // Copies only, every rank's buffers known (ranks of this process): the copy engines,
  // each copy moving one rank's block of `block` bytes.
  if (dev::copyOnly(call.kind) && block >= ceMin_ &&
      peerBuffers(op, index, &all, &inMapped, &outMapped) && inMapped && outMapped &&
      dev::copyPlanSafe(call.kind, nranks_, op.root, block, all.data())) {
    return failCliqueOn(launchCopies(
        call, dev::planCopies(call.kind, rank_, nranks_, op.root, block, all.data()), op.stream));
  }
  return launch(call, op.stream, why);
}

Status CudaDeviceComm::runP2p(const std::vector<Operation>& ops, size_t begin, size_t end) {
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
  LOOM_ASSIGN_OR_RETURN(const bool cap, capturing(stream));
  LOOM_TRY(order(stream, cap));
  for (size_t k = 0; k < selfSends.size(); ++k) {
    size_t sb = selfSends[k]->count * dataTypeSize(selfSends[k]->dtype);
    size_t rb = selfRecvs[k]->count * dataTypeSize(selfRecvs[k]->dtype);
    if (sb != rb) {
      return errorf(Code::kInvalidUsage,
                    "rank %d: send to itself of %zu bytes meets a receive of %zu", rank_, sb, rb);
    }
    LOOM_TRY(cudaStatus(cudaMemcpyAsync(selfRecvs[k]->recvbuff, selfSends[k]->sendbuff, sb,
                                        cudaMemcpyDeviceToDevice, stream),
                        "cudaMemcpyAsync"));
  }
  if (list.nops == 0) return recordDone(stream, cap);
  return launchOrdered(call, stream, cap, &list, "grouped Send/Recv");
}

void CudaDeviceComm::chooseForms(const MeshAgreement& s) {
  algoText_ = s.algo;
  const std::string algo = lowered(s.algo), proto = lowered(s.proto);
  algoSet_ = !algo.empty();
  forceOne_ = algo == "oneshot" || algo == "one-shot";
  forceTwo_ = algo == "twoshot" || algo == "two-shot" || algo == "ring" || algo == "tree";
  forceDirect_ = forceOne_ || algo == "direct";
  protoLL_ = proto == "ll";
  const bool protoLL128 = proto == "ll128";
  // LL: one-shot with the flags inside the data, for small messages (LOOM_PROTO=simple
  // turns it off, LOOM_PROTO=ll uses it up to the region's size). The limit counts what
  // a rank sends each peer: an all-reduce's or reduce's input, a reduce-scatter's part
  // per rank. By default the whole region (1 MiB) on 2 ranks, measured there against the
  // next forms (docs/perf/h200x2.md: at 1 MiB all-reduce 12.4 against 15.5 us, reduce
  // 11.6 against 16.1, a 2 MiB reduce-scatter 12.7-12.9 against 17.4-17.5), 256 KiB above
  // (unmeasured).
  const size_t region = dev::kLLBlocks * dev::kLLPayload;
  llLimit_ = proto == "simple" || protoLL128 ? 0
             : protoLL_                      ? region
                                             : std::min<size_t>(s.llBytes, region);
  // LL128 above the LL limit (LOOM_PROTO=ll128: from 0; simple and ll turn it off).
  const size_t capacity = ctx_.geo.ll128Capacity();
  ll128Limit_ = proto == "simple" || protoLL_ ? 0
                : protoLL128                  ? capacity
                                              : std::min<size_t>(s.ll128Bytes, capacity);
  // The agreed sizes are resolved already (auto for this rank count, off, any).
  oneShotMax_ = s.oneShotBytes;
  ceMin_ = s.ceBytes;
  reduceDirectMax_ = s.reduceDirectBytes;
  pullMax_ = s.pullBytes;
  pullReduceMax_ = s.pullReduceBytes;
  twoShotReduceMax_ = s.twoShotReduceBytes;
  cePullMin_ = s.cePullBytes;
  chunkReduceMin_ = s.chunkBytes;
  chunkAllReduceMin_ = s.chunkAllReduceBytes;
  chunkSize_ = s.chunkSize;
  // Slots per peer; a chunk is a multiple of 64 KiB.
  const size_t scratch = s.scratchBytes;
  chunkMax_ =
      nranks_ > 1 ? scratch / (chunkSlots_ * size_t(nranks_ - 1)) / (64 * 1024) * (64 * 1024) : 0;
  if (chunkMax_ == 0) chunkReduceMin_ = chunkAllReduceMin_ = SIZE_MAX;
  arSlots_ =
      chunkSlots_ * chunkMax_ / 4 >= kChunkAllReduceBytes ? 4 : static_cast<int>(chunkSlots_);
}

dev::MeshKind CudaDeviceComm::allReduceKind(const Operation& op, const char** why) const {
  size_t bytes = op.count * dataTypeSize(op.dtype);
  switch (flagForm(bytes)) {
    case FlagForm::kLL:
      *why = protoLL_ ? "LOOM_PROTO=ll" : "size <= LOOM_P2P_LL_BYTES";
      return dev::MeshKind::kAllReduceLL;
    case FlagForm::kLL128:
      *why = "size <= LOOM_P2P_LL128_BYTES";
      return dev::MeshKind::kAllReduceLL128;
    case FlagForm::kNone: break;
  }
  if (forceOne_) {
    *why = "LOOM_ALGO=oneshot";
    return dev::MeshKind::kAllReduceOneShot;
  }
  if (forceTwo_) {
    *why = "LOOM_ALGO asks for two-shot (ring and tree map to it on a GPU mesh)";
    return dev::MeshKind::kAllReduceTwoShot;
  }
  if (bytes <= oneShotMax_) {
    *why = "size <= LOOM_P2P_ONESHOT_BYTES (one synchronisation, same bytes for 2 ranks)";
    return dev::MeshKind::kAllReduceOneShot;
  }
  *why = "size > LOOM_P2P_ONESHOT_BYTES (each rank reduces 1/n of the data)";
  return dev::MeshKind::kAllReduceTwoShot;
}

dev::MeshKind CudaDeviceComm::reduceScatterKind(const Operation& op, const char** why) const {
  // The LL forms while each rank's part (what it sends each peer) fits their limits.
  switch (flagForm(op.count * dataTypeSize(op.dtype))) {
    case FlagForm::kLL:
      *why = protoLL_ ? "LOOM_PROTO=ll" : "part per rank <= LOOM_P2P_LL_BYTES";
      return dev::MeshKind::kReduceScatterLL;
    case FlagForm::kLL128:
      *why = "part per rank <= LOOM_P2P_LL128_BYTES";
      return dev::MeshKind::kReduceScatterLL128;
    case FlagForm::kNone: break;
  }
  return dev::MeshKind::kReduceScatter;
}

dev::MeshKind CudaDeviceComm::reduceKind(const Operation& op, const char** why) const {
  size_t bytes = op.count * dataTypeSize(op.dtype);
  switch (flagForm(bytes)) {
    case FlagForm::kLL:
      *why = protoLL_ ? "LOOM_PROTO=ll"
                      : "size <= LOOM_P2P_LL_BYTES (the LL all-reduce, only the root writes)";
      return dev::MeshKind::kReduceLL;
    case FlagForm::kLL128:
      *why = "size <= LOOM_P2P_LL128_BYTES (the LL128 all-reduce, only the root writes)";
      return dev::MeshKind::kReduceLL128;
    case FlagForm::kNone: break;
  }
  if (forceDirect_) {
    *why = "LOOM_ALGO asks for one stage (direct to the root)";
    return dev::MeshKind::kReduceDirect;
  }
  if (forceTwo_) {
    *why = "LOOM_ALGO asks for two stages (reduce-scatter + gather)";
    return dev::MeshKind::kReduce;
  }
  if (nranks_ == 2 && bytes <= reduceDirectMax_) {
    *why = "2 ranks and size <= LOOM_P2P_REDUCE_DIRECT_BYTES";
    return dev::MeshKind::kReduceDirect;
  }
  *why = nranks_ == 2 ? "size > LOOM_P2P_REDUCE_DIRECT_BYTES" : "more than 2 ranks";
  return dev::MeshKind::kReduce;
}

Status CudaDeviceComm::order(cudaStream_t stream, bool cap) {
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

Status CudaDeviceComm::join(cudaStream_t earlier, cudaStream_t later) {
  LOOM_ASSIGN_OR_RETURN(const bool earlierCapturing, capturing(earlier));
  LOOM_ASSIGN_OR_RETURN(const bool laterCapturing, capturing(later));
  if (earlierCapturing != laterCapturing) return Status::ok();
  LOOM_TRY(cudaStatus(cudaEventRecord(joinEvent_, earlier), "cudaEventRecord"));
  return cudaStatus(cudaStreamWaitEvent(later, joinEvent_, 0), "cudaStreamWaitEvent");
}

Result<bool> CudaDeviceComm::capturing(cudaStream_t s) {
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

Status CudaDeviceComm::recordDone(cudaStream_t stream, bool cap) {
  LOOM_TRY(cudaStatus(cudaEventRecord(lastEvent_, stream), "cudaEventRecord"));
  lastStream_ = stream;
  lastCaptured_ = cap;
  haveLast_ = true;
  return Status::ok();
}

Status CudaDeviceComm::launch(const dev::MeshCall& call, cudaStream_t stream, const char* why) {
  DeviceGuard guard(device_);
  LOOM_ASSIGN_OR_RETURN(const bool cap, capturing(stream));
  LOOM_TRY(order(stream, cap));
  return launchOrdered(call, stream, cap, nullptr, why);
}

Status CudaDeviceComm::launchOrdered(const dev::MeshCall& call, cudaStream_t stream, bool cap,
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

}  // namespace detail

int currentDevice() {
  if (settings::get(settings::kDevice) == "cpu") return -1;
  int n = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess || n <= 0) {
    cudaGetLastError();
    // No GPU, or no driver: host memory, as asked of a machine without GPUs. Any other
    // error (a driver older than this runtime, say) is said once, since the communicators
    // then work on host memory where the caller may expect its GPUs.
    static std::once_flag said;
    if (e != cudaSuccess && e != cudaErrorNoDevice && e != cudaErrorInsufficientDriver) {
      std::call_once(said, [e] {
        LOOM_WARN(kInit, "CUDA cannot count the GPUs (%s: %s): communicators use host memory",
                  cudaGetErrorName(e), cudaGetErrorString(e));
      });
    }
    return -1;
  }
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return d;
}

bool copyDeviceToHost(void* dst, const void* src, size_t bytes) {
  if (cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return true;
}

void* deviceAlloc(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes == 0 ? 1 : bytes) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void deviceFree(void* p) {
  if (p) cudaFree(p);
  cudaGetLastError();
}

Result<std::unique_ptr<DeviceComm>> DeviceComm::create(
    Bootstrap& bootstrap, const std::vector<transport::PeerInfo>& peers, int rank, int device,
    const DeviceCommContext& context) {
  auto c = std::make_unique<detail::CudaDeviceComm>();
  LOOM_TRY(c->init(bootstrap, peers, rank, device, context));
  return std::unique_ptr<DeviceComm>(std::move(c));
}

#endif  // LOOM_HAVE_CUDA

}  // namespace loom::comm
