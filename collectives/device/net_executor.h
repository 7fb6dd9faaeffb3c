// The network executor: device-buffer collectives between ranks that the GPU mesh cannot
// join (other hosts, or P2P off), stream-ordered and capturable in CUDA graphs. It owns
// the proxy (transports/net/proxy.h), the FIFOs in page-locked host memory, the plans in
// device memory, and launches the kernel of net.h. Nothing here blocks the calling
// thread after the first call that needs a connection (which makes it, collectively), and
// a call prepared ahead (prepareCollective, prepareP2p) neither waits nor allocates.
//
// Internal to the GPU side of a communicator (comm/), built where CUDA is.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/device/net.h"
#include "collectives/schedule.h"
#include "collectives/tuner.h"
#include "common/clock.h"
#include "common/status.h"
#include "transports/net/connect.h"
#include "transports/net/gdr.h"
#include "transports/net/net.h"
#include "transports/net/proxy.h"

namespace loom::collectives::device {

struct NetOptions {
  int rank = 0;
  int nranks = 1;
  int device = 0;
  uint64_t commHash = 0;
  int64_t timeoutMs = 300000;
  uint32_t slots = 8;            // per FIFO (at most transport::net::kFifoMaxSlots)
  uint64_t slotBytes = 1 << 20;  // per slot; a piece fills one at most
  int lanes = 4;                 // at most (LOOM_NET_LANES)
  int threads = 512;             // per block of the kernel
  int64_t proxySpinUs = 5000;    // LOOM_PROXY_SPIN_US
  bool pdl = false;              // LOOM_NET_PDL: programmatic dependent launch
  uint64_t pieceBytes = 0;       // LOOM_CHUNK_BYTES: pieces of this size (0: netPieceBytes)
  // What ring and tree are priced on (model::netExecutorFabric); unset: one class of link.
  std::optional<model::Fabric> fabric;
  const std::atomic<bool>* abortFlag = nullptr;
};

// What a call reduces with (as the communicator resolved it).
struct NetReduction {
  RedKind red = RedKind::kSum;
  double scalar = 1.0;
  const void* scalarDevice = nullptr;
  uint64_t divisor = 1;
};

// How connection handles travel (the bootstrap): as transport::net::HandleExchange, for
// the connection of lane `lane` (each lane's handles must not be taken for another's).
struct NetHandleExchange {
  std::function<Status(int peer, int lane, const transport::net::Handle& handle)> send;
  std::function<Result<bool>(int peer, int lane, transport::net::Handle* handle)> tryRecv;
  std::function<Status(int peer)> peerAlive;  // optional (transport::net::HandleExchange)
};

// Whether `s` is capturing a CUDA graph; an error (not "no") where the stream cannot be
// asked. Shared by the GPU executors.
Result<bool> streamCapturing(cudaStream_t s);

// Set-up calls (allocations, synchronous uploads) may come while the caller's stream
// captures a graph: they touch no captured stream, so the thread may make them. In scope,
// this thread's capture mode is relaxed.
class RelaxedCapture {
 public:
  RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCapture() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

class NetExecutor {
 public:
  static Result<std::unique_ptr<NetExecutor>> create(const NetOptions& options,
                                                     NetHandleExchange exchange);
  // Waits for this executor's kernels (up to the timeout, then stops them), stops the
  // proxy, and frees everything.
  ~NetExecutor();

  // Enqueues a collective (`req` as the host tuner takes it; its pieceElems is set here)
  // on `stream`: in, out, the reduction, and `algo`, LOOM_ALGO parsed. `why` gets the
  // algorithm and the reason, for the log.
  Status runCollective(CollRequest req, const void* in, void* out, DataType type,
                       const NetReduction& red, const AlgoRequest& algo, cudaStream_t stream,
                       std::string* why);
  // Enqueues a group's Send/Recv calls with peers (all on `stream`): `sends[i]` and
  // `recvs[i]` as (buffer, bytes, peer); calls with this rank itself are the caller's.
  struct P2p {
    void* buffer;
    size_t bytes;
    int peer;
    bool isSend;
  };
  Status runP2p(const std::vector<P2p>& ops, cudaStream_t stream);

  // What a call needs before its kernel: its plan in device memory and its connections,
  // made ahead for a group, before the group's first kernel. Making them waits for an
  // upload stream and allocates memory: between two kernels of one group that wait for each
  // other (the ranks of one process) either can stall the GPU for good (CUDA may order a
  // copy behind a waiting kernel, and an allocation may wait for the device).
  // runCollective and runP2p then find them made. endGroup() drops what was prepared and
  // not run.
  Status prepareCollective(CollRequest req, const AlgoRequest& algo);
  Status prepareP2p(const std::vector<P2p>& ops, cudaStream_t stream);
  void endGroup();

  // A kernel's or the network's failure so far, as a status naming the peer; ok if none.
  Status error() const;
  void abort();
  // The proxy thread's CPU time so far.
  double proxyCpuSeconds() const { return proxy_ ? proxy_->cpuSeconds() : 0; }
  uint64_t slotBytes() const { return options_.slotBytes; }

 private:
  struct Plan {
    void* device = nullptr;       // the plan's bytes in device memory
    std::vector<uint64_t> small;  // a collective's plan, where it fits in the kernel's parameters
    uint32_t blocks = 1;
    std::vector<NetLink> sends, recvs;
    cudaEvent_t used = nullptr;  // p2p plans: after the kernel that reads it (eager calls)
    bool pinned = false;         // read by a captured graph: kept until the end
    bool reserved = false;       // p2p plans: prepared for a call of the running group
    size_t capacity = 0;
  };
  // A collective's plan, with the choice behind it (runCollective, prepareCollective).
  struct Ready {
    Plan* plan = nullptr;
    TunerChoice choice;
    int lanes = 1;
  };
  // A p2p call prepared ahead: its plan's bytes and the plan reserved for it.
  struct PreparedP2p {
    std::vector<uint64_t> bytes;
    size_t plan = 0;  // index in p2pPlans_
    bool captured = false;
    bool uploaded = false;  // the bytes are in the plan already
  };
  struct PlanKey {
    CollType type;
    Algorithm algo;
    size_t count, elemSize, pieceElems;
    int root;
    int lanes;
    bool operator<(const PlanKey& o) const;
  };

  explicit NetExecutor(const NetOptions& options) : options_(options) {}
  Status init(NetHandleExchange exchange);
  // Every connection the plan needs exists (collective over the peers involved).
  Status connect(const std::vector<NetLink>& sends, const std::vector<NetLink>& recvs);
  Result<Plan*> collectivePlan(const CollRequest& req, Algorithm algo, int lanes);
  // Sets req.pieceElems, chooses the algorithm, makes the plan and the connections.
  Result<Ready> readyCollective(CollRequest& req, const AlgoRequest& algo);
  // A p2p call's plan bytes, and an idle (or new) plan for it, connected.
  Result<std::vector<uint64_t>> p2pPlanBytes(const std::vector<P2p>& ops) const;
  Result<size_t> p2pPlanFor(const std::vector<uint64_t>& bytes, bool captured);
  Status launch(const Plan& plan, const NetCall& call, cudaStream_t stream);
  // Puts a plan of at most kNetInlinePlanWords into the call's parameters; false if larger.
  static bool inlinePlan(const std::vector<uint64_t>& bytes, NetCall* call);
  // Device memory for at least `size` bytes of the plan (what it had, or a new buffer).
  Status planCapacity(Plan* plan, size_t size);
  // A device copy of `bytes` (uploaded once, or on `stream` for eager p2p plans).
  Result<void*> uploadPlan(const std::vector<uint64_t>& bytes, bool captured, cudaStream_t stream,
                           Plan* p2p);

  NetOptions options_;
  NetHandleExchange exchange_;
  transport::net::HandleExchange laneExchanges_[kNetMaxLanes];  // exchange_ for each lane
  const transport::net::HandleExchange& laneExchange(int lane) const {
    return laneExchanges_[lane];
  }
  std::unique_ptr<transport::net::Backend> backend_;
  int dev_ = 0;  // the backend device (NIC) this GPU uses
  std::unique_ptr<transport::net::Proxy> proxy_;
  // Device memory: the FIFO tables, the kernel's counters, the grid barrier.
  transport::net::Fifo* sendTable_ = nullptr;
  transport::net::Fifo* recvTable_ = nullptr;
  NetPeerCounters* counters_ = nullptr;
  unsigned* barrier_ = nullptr;
  // Page-locked, mapped: [0] abort (host writes), [1] error code, [2] its peer (kernels).
  int* hostFlags_ = nullptr;
  int* devFlags_ = nullptr;        // the same as the kernels see them (looked up once)
  std::vector<void*> fifoMemory_;  // page-locked FIFOs (or their headers)
  // The FIFOs' slots in GPU memory (transports/net/gdr.h placeSlots), which the NIC reads and
  // writes (GPUDirect RDMA) or the backend moves itself, registered through dma-buf or not;
  // otherwise in page-locked memory.
  bool slotsOnGpu_ = false;
  bool slotsDmaBuf_ = false;
  void* flushContext_ = nullptr;  // flushed after each receive into GPU slots, where needed
  std::vector<void*> fifoSlotsOnGpu_;
  std::vector<bool> sendConnected_, recvConnected_;  // by link (lane * nranks + peer)
  cudaStream_t uploadStream_ = nullptr;              // plan and table uploads (non-blocking)
  std::map<PlanKey, Plan> plans_;                    // collective plans, kept
  std::vector<Plan> p2pPlans_;                       // reused once their kernel is done
  std::vector<PreparedP2p> preparedP2p_;             // this group's, in call order
  bool launched_ = false;
  Clock::time_point started_{};  // the proxy's start (its CPU share at the end)
};

}  // namespace loom::collectives::device
