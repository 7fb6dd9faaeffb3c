// The CUDA side of DeviceExecutor (executor.h), shared by the files that implement it:
//   cuda_executor.cc               set-up, each call's plan (mesh_plan.h) run on the mesh
//   cuda_executor_net.cc           device buffers over the network (net_executor.h)
//   cuda_executor_local.cc         the forms for ranks of one process, which see each other's
//                                  buffers: pulled all-reduce, copy-engine copies, chunked reduce
//   cuda_executor_registration.cc  ncclCommRegister between processes of one host
//   cuda_executor_hier.cc          the hierarchical forms across hosts (hierarchy.h): a
//                                  mesh executor of the host's ranks, a network executor
//                                  of the rail's
// Internal to collectives/device (built only with CUDA).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/device/chunk_plan.h"
#include "collectives/device/copy_plan.h"
#include "collectives/device/executor.h"
#include "collectives/device/mesh.h"
#include "collectives/device/mesh_plan.h"
#include "collectives/device/net_executor.h"
#include "collectives/device/phase_gate.h"
#include "collectives/hierarchy.h"
#include "transports/p2p/p2p_window.h"
#include "transports/p2p/post_board.h"
#include "transports/sub_channel.h"

namespace loom::collectives::device {

namespace dev = ::loom::collectives::device;
using transport::p2p::cudaErrorText;

inline Status cudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  cudaGetLastError();
  return errorf(Code::kCudaError, "%s failed: %s", what, cudaErrorText(e).c_str());
}

// What a kernel launcher of collectives/device/mesh.h returned (a cudaError_t value, 0 for
// success), as a status naming the kernel.
inline Status launchStatus(int e, const char* what) {
  if (e == 0) return Status::ok();
  return errorf(Code::kCudaError, "launching %s failed: %s", what, cudaErrorText(e).c_str());
}

// Makes `device` current for the scope and restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = -1;
    cudaGetDevice(&now);
    if (previous_ >= 0 && now != previous_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
};

// The ranks of one communicator that live in this process, and the calls each posted
// for the group being run (DeviceExecutor::postGroup): how a rank learns its peers' buffers.
struct Clique {
  struct Call {
    collectives::CollType type;
    size_t count;
    DataType dtype;
    int root;
    int ncclOp;
    const void* in;
    void* out;
    bool inMapped;   // `in` is cudaMalloc memory, which peer access maps into the peers
    bool outMapped;  // and `out` (stream-ordered pools and VMM memory are not mapped;
                     // a reduce's non-root: true, its output is never read nor written)
    bool captured;   // its stream is capturing a CUDA graph (asked where it matters)
  };
  explicit Clique(int nranks)
      : group(nranks, 0),
        calls(nranks),
        abortFlags(nranks, nullptr),
        devices(nranks, -1),
        scratch(nranks, nullptr) {}
  // Only the ranks' kernels write the scratch and the mirror, and every rank's
  // ~CudaExecutor waits for its GPU before it lets go of the Clique.
  ~Clique() {
    for (size_t r = 0; r < scratch.size(); ++r) {
      if (!scratch[r]) continue;
      DeviceGuard guard(devices[r]);
      cudaFree(scratch[r]);
    }
    if (freeMirror) cudaFreeHost(freeMirror);
    cudaGetLastError();
  }
  std::mutex mutex;
  std::vector<uint64_t> group;            // per rank: the group its calls belong to
  std::vector<std::vector<Call>> calls;   // per rank: its device collectives, in order
  std::vector<volatile int*> abortFlags;  // per rank: its kernels' abort flag (host-mapped)
  std::vector<int> devices;               // per rank: its GPU
  // Per rank: the slots its peers push chunks into (the chunked all-reduce and reduce),
  // allocated for every rank by the first call that needs them.
  std::vector<void*> scratch;
  // Where these ranks share a GPU (LOOM_P2P_SHARE_GPU): the hierarchical forms' gate
  // between their passes (phase_gate.h), used by a host's mesh; null otherwise.
  std::unique_ptr<PhaseGate> gate;
  bool scratchFailed = false;  // that allocation failed once: the kernels from then on
  // Host-mapped copies of the chunk slots' free counters, [pusher * kMaxRanks + owner]:
  // each owner's reduction writes them after the counter in the pusher's window, so a
  // pusher's host thread can leave out a wait for a slot already free (allocated with the
  // scratch; null if that failed). freeMirrorDevice: the same memory as the GPUs see it.
  uint64_t* freeMirror = nullptr;
  uint64_t* freeMirrorDevice = nullptr;
};

// How a network executor's connection handles travel over the bootstrap (cuda_executor_net.cc):
// its peer i is bootstrap rank ranks[i] (empty: i itself), and `kind`, the top four bits of
// the tags, keeps one executor's handles from another's.
inline constexpr uint64_t kFlatHandles = 3;  // the network form of every rank
inline constexpr uint64_t kRailHandles = 6;  // the hierarchical form's rail
dev::NetHandleExchange bootstrapExchange(transport::SetupChannel* bootstrap, int me,
                                         std::vector<int> ranks, uint64_t kind);

// Bytes of input and output of one call on one rank.
void callBytes(const Operation& op, int nranks, size_t* in, size_t* out);

// One Clique per communicator (its token agreed at init), shared by its ranks here.
std::shared_ptr<Clique> cliqueFor(uint64_t token, int nranks);

struct MeshAgreement {
  int32_t reachable = 0;
  int32_t shareGpu = 0;  // LOOM_P2P_SHARE_GPU
  int32_t blocks = 0;
  int32_t slots = 0;
  int32_t threads = 0;
  uint64_t slotBytes = 0;
  // The sizes as LOOM_P2P_* resolve them for this rank count (cuda_executor.cc).
  dev::MeshSizes sizes;
  uint64_t token = 0;
  uint32_t algoAllowed = 0;  // LOOM_ALGO parsed: what it allows (every rank must agree)
  char algo[64] = {0};       // as given, for the message when they do not
  char proto[24] = {0};
  char why[96] = {0};
};

class CudaExecutor final : public DeviceExecutor {
 public:
  ~CudaExecutor() override;

  Status init(transport::SetupChannel& bootstrap, const std::vector<transport::PeerInfo>& peers,
              int rank, int device, const ExecutorContext& context);

  bool mesh() const override { return mesh_; }

  void postGroup(uint64_t group, const std::vector<Operation>& ops) override;

  Status prepare(const Operation& op) override;
  Status prepareP2p(const std::vector<Operation>& ops, size_t begin, size_t end) override;
  void endGroup() override;
  std::string describe() const override;

  Status kernelError() const override;

  void abort() override;
  bool idle() const override;

  Status run(const Operation& op, const ExecutorRedOp& red) override;

  Status runP2p(const std::vector<Operation>& ops, size_t begin, size_t end) override;

  Result<void*> registerBuffer(void* buff, size_t bytes) override;
  Status deregisterBuffer(void* handle) override;

 private:
  // Registration (cuda_executor_registration.cc): what ncclCommRegister kept, the
  // allocations exported for it, and the peers' allocations mapped here.
  struct Registration {
    uintptr_t begin = 0, end = 0;  // what the user registered
    int exportIndex = -1;          // in exports_, or -1 (not exported)
  };
  struct ExportRef {
    uintptr_t base = 0;
    size_t bytes = 0;
    uint64_t bufferId = 0;  // the driver's id of the allocation (a new one if freed and reused)
    int entry = -1;         // in the board's export table
    uint64_t generation = 0;
    int refs = 0;  // registrations that use it
  };
  struct Import {
    uint64_t generation = 0;
    char* base = nullptr;
    uint64_t bytes = 0;
    bool opened = false;  // cudaIpcOpenMemHandle (closed when replaced, or at the end)
  };

  // Between processes of one host, a call that may read its peers' inputs where they lie (the
  // pulled all-reduce, the pulled reduce) posts where its own input lies on the post board
  // (transports/p2p/post_board.h) and reads every rank's post; when every rank whose input is read
  // posted a registered one, `in` gets every rank's input as mapped here (IPC handles opened at
  // first use, cached) and the call returns the form: 1 the pulled one-shot all-reduce or reduce, 2
  // the pulled two-shot all-reduce in place (every rank's output its input), 3 the same out of
  // place (every rank's output registered too: `in` gets the outputs). 0: run the call
  // as if nothing were registered (the same on every rank). `reader`: the rank that reads
  // (reduce's root), or -1 for every rank (all-reduce).
  struct PullRequest {
    int reader = -1;  // the one rank that reads (reduce's root), or -1: every rank
    int source = -1;  // the one rank whose input is read (broadcast's root), or -1: every rank's
    int layout = -1;  // the copies: 1 when peers may read our input while we write our
                      // output, 0 when not; -1: the all-reduce's rule (see above)
  };
  Result<int> registeredInputs(const Operation& op, const PullRequest& req, dev::PullInputs* in);
  // A peer's registered allocation (`entry` at `generation` of rank r's export table),
  // mapped here.
  Result<char*> importedBase(int r, uint32_t entry, uint64_t generation);
  // The address `offset` bytes into that allocation, mapped here, where `bytes` bytes (of
  // an "input" or "output", for the error) fit in it.
  Result<char*> postedAt(int r, uint32_t entry, uint64_t generation, uint64_t offset, size_t bytes,
                         const char* what);
  // Closes the mappings of peers' allocations they have since deregistered (after this
  // rank's earlier calls, which may read them, are done).
  Status pruneImports();
  // Unmaps one (after this rank's calls that may read it), and clears it.
  Status closeImport(Import& im);
  void closeImports();

  // LOOM_P2P_SHARE_GPU: caps `blocks` so that every rank's kernel fits on a shared GPU.
  void capForSharedGpu(const std::vector<transport::p2p::GpuIdentity>& gpus, int rank, int sharing,
                       int64_t* blocks);

  // Every rank's buffers for the group's index-th device collective, when every rank of
  // the communicator posted the same call in this group (all in this process). Every
  // rank looks at the same postings, so all decide alike.
  // `inputsMapped` (optional): whether every rank's input is memory peer access maps.
  bool peerBuffers(const Operation& op, size_t index, std::vector<dev::RankBuffers>* all,
                   bool* inputsMapped = nullptr, bool* outputsMapped = nullptr,
                   bool* anyCaptured = nullptr);

  // Runs one step of the call's plan (collectives/device/mesh_plan.h): true when it ran,
  // false when it declined (every rank alike) and the next step is to be tried.
  Result<bool> runStep(const dev::MeshStep& step, const Operation& op, const dev::MeshCall& call,
                       const std::vector<dev::RankBuffers>& all, const dev::MeshCallFacts& facts);

  // A rank that fails after it may have enqueued a barrier or a pulled kernel would
  // leave its peers waiting in theirs until LOOM_TIMEOUT_MS: every rank of this process
  // is stopped at once instead (their kernels see the abort flag and end).
  Status failCliqueOn(Status st);

  // True when no rank's output overlaps any rank's input (the pulled all-reduce reads
  // every input while every output is written).
  static bool outputsApart(const std::vector<dev::RankBuffers>& all, size_t bytes);

  // The pulled all-reduce, or reduce (in.writer >= 0), or with `twoShot` the two-shot
  // all-reduce (or reduce: in.writer >= 0, only the root's output given): `in` holds every
  // rank's input (and for the two-shot form output) as mapped here; `form` says why
  // (LOOM_DEBUG=INFO).
  Status launchPull(const dev::MeshCall& call, const dev::PullInputs& in, cudaStream_t stream,
                    const char* form, bool twoShot = false);
  // True when the root's output overlaps no rank's input, or only the root's own as the
  // same buffer (the two-shot reduce).
  static bool rootOutputApart(const std::vector<dev::RankBuffers>& all, int root, size_t bytes);
  // True when every rank's output is its input (in place).
  static bool allInPlace(const std::vector<dev::RankBuffers>& all);

  // A barrier, the copies (into peers on the caller's stream, local ones beside them on
  // a second stream), and a barrier: the first says every peer's buffers are free to
  // write, the second that everything written into ours has landed.
  Status launchCopies(const dev::MeshCall& call, const std::vector<dev::CopyStep>& steps,
                      cudaStream_t stream,
                      const char* form =
                          "every rank's buffers known in this group, size >= "
                          "LOOM_P2P_CE_BYTES");

  // Every rank's scratch for the chunked forms, allocated for all of them at the first
  // call that needs it; empty when that failed (the kernels then, on every rank alike).
  std::vector<void*> chunkScratch();

  // The chunked all-reduce and reduce (collectives/device/chunk_plan.h). On our push stream,
  // each chunk of every peer's segment goes into that peer's scratch, and is counted in the
  // peer's window (a stream memory operation, or a kernel); a kernel waits for a slot to be
  // free before it is written again, unless the host already sees it free (the Clique's
  // freeMirror). On the caller's stream, each chunk of our segment is
  // reduced once every peer's copy has been counted; for all-reduce the push stream then
  // copies it into every peer's output. The counters carry over from call to call, so a
  // slot is never overwritten before its owner reduced it. Nothing here may be captured
  // (checked by the caller).
  Status launchChunked(const Operation& op, const dev::MeshCall& call,
                       const std::vector<dev::RankBuffers>& all, const std::vector<void*>& scratch);

  // Operations of one communicator run in call order even across streams: each launch
  // records lastEvent_, and a launch on another stream waits for it. Within one CUDA
  // graph capture, or outside any, that is an edge; across a capture boundary CUDA allows
  // no such wait, and the order is the caller's to keep (said once).
  // `cap`: whether `stream` is capturing (asked once per call, see capturing()).
  Status order(cudaStream_t stream, bool cap);

  // `later` waits for what was queued on `earlier` so far.
  Status join(cudaStream_t earlier, cudaStream_t later);

  static Result<bool> capturing(cudaStream_t s) { return streamCapturing(s); }

  // Sends of a group to this rank itself, copied into its receives of the same group in
  // order (the counts matched already): an error where a pair's sizes differ.
  Status copySelfMessages(const std::vector<const Operation*>& sends,
                          const std::vector<const Operation*>& recvs, cudaStream_t stream);

  Status recordDone(cudaStream_t stream, bool cap);
  // The end of the last call not captured in a graph (null: none yet).
  cudaEvent_t lastEagerEvent() const {
    return !haveEager_ ? nullptr : lastCaptured_ ? eagerEvent_ : lastEvent_;
  }

  Status launch(const dev::MeshCall& call, cudaStream_t stream, const char* why);

  Status launchOrdered(const dev::MeshCall& call, cudaStream_t stream, bool cap,
                       const dev::P2pList* p2p, const char* why);

  // The network form (cuda_executor_net.cc): set up at init when the mesh is not, and
  // used for every call then.
  Status initNetwork(transport::SetupChannel& bootstrap,
                     const std::vector<transport::PeerInfo>& peers);
  Status runNet(const Operation& op, const ExecutorRedOp& red);
  Status runNetP2p(const std::vector<Operation>& ops, size_t begin, size_t end);
  // A send's bytes copied into the network scratch before a split send/receive's passes.
  struct SendCopy {
    const void* from;
    void* to;
    size_t bytes;
  };
  // Where a send's bytes are overwritten by a receive of the same group (in place:
  // nccl-tests' sendrecv passes one buffer for both), the calls [begin, end) in `calls` with
  // each such send pointed at a copy in the network scratch, and in `copies` what to copy
  // there first; true then. Otherwise a receive could land before the send has read the
  // bytes: the network kernel moves sends and receives independently, and split between
  // the mesh and the network, one pass overwrites what the other has yet to send. False
  // (nothing filled) where no send is overwritten.
  Result<bool> inPlaceSendsCopied(const std::vector<Operation>& ops, size_t begin, size_t end,
                                  bool captured, std::vector<Operation>* calls,
                                  std::vector<SendCopy>* copies);
  // The work of a group's Send/Recv calls [begin, end) on the network path, made alike by
  // prepareP2p and runNetP2p (the network executor matches prepared plans by address): the
  // sends in place pointed at their copies (inPlaceSendsCopied), the messages with peers
  // and with this rank itself (netP2pList), and where `split`, those over the mesh moved to
  // `mesh` (null: only dropped; preparing needs nothing for them).
  struct NetP2pWork {
    std::vector<Operation> calls;  // the calls, sends in place redirected (empty: none)
    std::vector<SendCopy> copies;
    std::vector<dev::NetExecutor::P2p> net;
    std::vector<const Operation*> selfSends, selfRecvs;  // into `calls` or the group's calls
  };
  Status netP2pWork(const std::vector<Operation>& ops, size_t begin, size_t end, bool captured,
                    bool split, std::vector<Operation>* mesh, cudaStream_t stream, NetP2pWork* w);
  // A group's Send/Recv calls [begin, end) with peers, and those with this rank itself.
  Status netP2pList(const std::vector<Operation>& ops, size_t begin, size_t end,
                    std::vector<dev::NetExecutor::P2p>* list,
                    std::vector<const Operation*>* selfSends,
                    std::vector<const Operation*>* selfRecvs) const;
  // Scratch memory of the network forms (an in-place all-to-all's copy of its input, the
  // hierarchical reduce's partial result, the hierarchical all-gather's and reduce-scatter's
  // blocks), one buffer for the communicator's calls, which run one after another on the
  // GPU. `captured`: for a call captured in a graph, which from then on keeps every buffer
  // (an outgrown one is otherwise freed when the scratch grows).
  Result<void*> netScratch(size_t bytes, bool captured = false);

  // The hierarchical forms (cuda_executor_hier.cc): set up after the network form where
  // the ranks' hosts allow it (hierarchy.h) and every host's ranks form a GPU mesh; the
  // same outcome on every rank.
  Status initHierarchy(transport::SetupChannel& bootstrap,
                       const std::vector<transport::PeerInfo>& peers);
  Status runHier(const Operation& op, const ExecutorRedOp& red);
  // Whether `op` takes the hierarchical form (the same answer on every rank: the count,
  // the hierarchy, LOOM_ALGO and the fabric are); the reason either way, with the cost
  // model's estimates where it decided (only where `text` is given: it allocates).
  bool takesHier(const Operation& op, const char** reason, std::string* text = nullptr) const;
  // Broadcast and reduce: whether the buffer is split over every rail (the mesh passes
  // the parts inside the hosts) instead of going whole over the root's rail, as the cost
  // model prices them (model::hierSplitsRails; the count a multiple of the ranks per host).
  bool splitsRails(const Operation& op) const;
  // The call this rank makes on its rail for `op` (false: none, as for a broadcast's
  // ranks off the root's rail); `split` is splitsRails(op), which the caller has at hand.
  bool railCall(const Operation& op, bool split, collectives::CollRequest* req) const;
  Status prepareHier(const Operation& op);
  // All-gather and reduce-scatter: scratch for the rail's blocks (railBytes, rounded up),
  // then for the host's (hostBytes); zero for the other collectives.
  struct HierScratch {
    size_t railBytes = 0;
    size_t hostBytes = 0;
  };
  HierScratch hierScratchBytes(const Operation& op) const;
  // Every rank's block between rank order (host by host) and local order (local index by
  // local index, each with its H hosts' blocks), G 2D copies on `stream`.
  Status transposeBlocks(const char* src, char* dst, size_t block, bool toRankOrder,
                         cudaStream_t stream);
  // Where this host's ranks share a GPU in this process (the gate of phase_gate.h): this
  // rank has enqueued pass `pass` of its hierarchical call (0 before its first enqueue,
  // 1, 2, ... after a mesh pass, its rail's kernel or a copy, 7 after its last), and, with
  // `wait`, waits until the others have too before it enqueues the next, so that no rank's
  // pass queues behind another's next one. Gives up after min(LOOM_TIMEOUT_MS, 30 s) with
  // a WARN, and from then on only says where it is: the gate orders the host's enqueues,
  // it never fails a call.
  void passEnqueued(int pass, bool wait);
  // One call that passes the gate (runHier, runSplitAllToAll, a split send/receive; where
  // `gated` is false it only orders the stream and records the end): begin() before the
  // first enqueue (pass 0, then the stream ordered after this executor's earlier work),
  // pass(k) between passes, end() after the last (the call's end event, then pass 7). A
  // call that returns early still says it is done, without waiting, so that its peers do
  // not wait for it; a captured call never waits (its replays' order is the caller's).
  class GatedCall {
   public:
    GatedCall(CudaExecutor* self, bool gated = true) : self_(self), gated_(gated) {
      if (gated_) ++self_->hierCalls_;
    }
    ~GatedCall() {
      if (gated_ && !ended_) self_->passEnqueued(7, /*wait=*/false);
    }
    GatedCall(const GatedCall&) = delete;
    GatedCall& operator=(const GatedCall&) = delete;
    Status begin(cudaStream_t stream, bool captured) {
      captured_ = captured;
      pass(0);
      return self_->order(stream, captured);
    }
    void pass(int k) {
      if (gated_) self_->passEnqueued(k, !captured_);
    }
    Status end(cudaStream_t stream) {
      const Status done = self_->recordDone(stream, captured_);
      ended_ = true;
      if (gated_) self_->passEnqueued(7, !captured_ && done.isOk());
      return done;
    }

   private:
    CudaExecutor* self_;
    bool gated_;
    bool captured_ = false;
    bool ended_ = false;
  };
  // Point-to-point exchanges (send/receive, all-to-all) split by where the peer is: the
  // ranks of this host over its GPU mesh (local_), the others over the network
  // (collectives/hierarchy.h hierP2pDecline says where; `blockBytes`: an all-to-all's
  // block); the reason either way.
  bool splitsP2p(collectives::CollType type, size_t blockBytes, const char** reason) const;
  // Moves the messages that go over the mesh (hierP2pMessageOverMesh) from
  // `net` to `mesh` (as the mesh's calls: the peer as a local index, on `stream`); with
  // `mesh` null, only drops them.
  void takeHostMessages(std::vector<dev::NetExecutor::P2p>* net, std::vector<Operation>* mesh,
                        cudaStream_t stream) const;
  // The all-to-all split so: the host's blocks in one all-to-all over the mesh, every other
  // rank's over the network.
  std::vector<dev::NetExecutor::P2p> remoteBlocks(const char* in, char* out, size_t block) const;
  Status runSplitAllToAll(const Operation& op);

  ExecutorContext context_;
  int rank_ = 0;
  int nranks_ = 0;
  int device_ = -1;
  bool mesh_ = false;
  std::string why_;
  // What picks the forms (collectives/device/mesh_plan.h), agreed by every rank at init.
  dev::MeshLimits limits_;
  AlgoRequest flatAlgo_;  // limits_.algo as the flat network form reads it (withoutHier)
  int64_t timeoutMs_ = 0;
  std::unique_ptr<transport::p2p::Window> window_;
  uint64_t* state_ = nullptr;
  int* hostFlags_ = nullptr;  // [0] abort (host writes), [1] error (kernels write)
  dev::MeshContext ctx_;
  cudaEvent_t lastEvent_ = nullptr;
  // The last uncaptured call's end where a captured call's came after it (recordDone swaps
  // the two), for idle() and closeImport: lastEagerEvent().
  cudaEvent_t eagerEvent_ = nullptr;
  bool haveEager_ = false;
  cudaEvent_t joinEvent_ = nullptr;
  cudaEvent_t forkEvent_ = nullptr;  // copy-engine collectives: the side stream starts here
  cudaEvent_t sideEvent_ = nullptr;  // and the caller's stream waits for it here
  cudaStream_t side_ = nullptr;      // local copies, beside the copies into peers
  std::shared_ptr<Clique> clique_;   // null unless every rank is in this process
  // The chunked all-reduce and reduce (launchChunked; sizes and slots in limits_): chunks
  // pushed to each peer and reduced from each, so far.
  bool memopOk_ = true;  // cuStreamWriteValue64 has not failed
  static constexpr int kChunkAllReduceBlocks = 48;
  dev::ChunkCounters chunkCounters_;
  cudaStream_t pushStream_ =
      nullptr;  // our copies: input chunks to their owners, reduced chunks to the peers
  cudaEvent_t chunkEvent_ = nullptr;  // a chunk reduced: the push stream may copy it to the peers
  cudaEvent_t pushEvent_ = nullptr;   // the caller's stream waits for the push stream
  uint64_t group_ = 0;                // the group being run (postGroup), 0 outside one
  size_t cursor_ = 0;                 // device collectives of that group run so far
  cudaStream_t lastStream_ = nullptr;
  bool haveLast_ = false;
  bool lastCaptured_ = false;
  bool warnedCapture_ = false;
  // The network form: its executor, and the scratch buffers of in-place all-to-alls
  // (every one made so far, the last the largest).
  std::unique_ptr<dev::NetExecutor> net_;
  std::vector<void*> netScratch_;
  size_t netScratchBytes_ = 0;
  bool netScratchInGraph_ = false;  // a captured call took the scratch: none is freed
  bool aloneInProcess_ = true;      // no other rank of the communicator in this process
  dev::NetOptions netOptions_;      // as agreed at init (the rail's executor takes them too)
  // The hierarchical forms: the host's ranks over their mesh (a CudaExecutor of its own,
  // on a channel of the host's ranks), the rail's over the network. Null: not set up.
  bool meshOnly_ = false;  // this executor is a host's mesh: no network form if no mesh
  Hierarchy hier_;
  uint64_t hierCalls_ = 0;   // hierarchical calls run so far (the same count on every rank)
  bool warnedGate_ = false;  // passEnqueued gave up waiting once (warned)
  std::unique_ptr<transport::SubChannel> localChannel_;
  std::unique_ptr<CudaExecutor> local_;
  std::unique_ptr<dev::NetExecutor> rail_;
  // Registration between processes (null board: one process, or the board failed).
  std::unique_ptr<transport::p2p::PostBoard> board_;
  uint64_t boardSeq_ = 0;  // calls that exchanged posts so far (the same count on every rank)
  std::mutex regMutex_;    // registrations may come from another thread than the calls
  std::vector<std::unique_ptr<Registration>> registrations_;
  std::vector<ExportRef> exports_;
  std::map<std::pair<int, uint32_t>, Import> imports_;  // (rank, entry)
  std::vector<char*> staleImports_;  // replaced while a graph may read them: closed at the end
  bool importsInGraph_ = false;      // a captured call read peers' allocations
  bool warnedExportsFull_ = false;
  std::vector<transport::p2p::Post> posts_;
};

}  // namespace loom::collectives::device
