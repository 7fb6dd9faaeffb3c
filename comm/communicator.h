// The communicator: one rank's membership in a group of ranks, its bootstrap, the
// peers' descriptions, the connections (made on first use, per peer and direction,
// through the best transport the pair allows) and the operations it runs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/device/executor.h"
#include "collectives/hierarchy.h"
#include "collectives/host_executor.h"
#include "collectives/operation.h"
#include "collectives/schedule.h"
#include "collectives/tuner.h"
#include "comm/bootstrap.h"
#include "comm/device_memory.h"
#include "comm/progress_report.h"
#include "comm/spin_worker.h"
#include "comm/topology_view.h"
#include "common/datatype.h"
#include "nccl.h"
#include "transports/select.h"
#include "transports/transport.h"

namespace loom::comm {

// One call of the C API, as queued inside a group.
using Operation = collectives::Operation;

// The set-up message a receiver sends its sender (see ensureConnected).
struct ConnectMessage {
  int32_t transport = -1;
  // Its name too: hosts whose lists differ (ib on one host only) must not take an index
  // for a transport it does not name there.
  char name[16] = {0};
  transport::Blob blob;
};

struct CommOptions {
  std::string name;
  // The CUDA device this rank works on, or -1 for host memory only. The C API resolves
  // it in the calling thread (the device current there, as NCCL does).
  int cudaDev = -1;
};

class Communicator : public collectives::ConnectionProvider {
 public:
  static Result<std::unique_ptr<Communicator>> create(const IdContents& id, int rank, int nranks,
                                                      const CommOptions& options);
  ~Communicator() override;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int cudaDevice() const { return cudaDev_; }
  const std::string& name() const { return options_.name; }
  Bootstrap& bootstrap() { return *bootstrap_; }

  // Runs this communicator's operations of one group, in order (consecutive
  // Send/Recv calls go together). Host memory: returns when they are complete.
  Status execute(const std::vector<Operation>& ops);
  // Before any communicator of a group runs its calls: lets the GPU side see the calls
  // of the group's other ranks in this process (DeviceExecutor::postGroup).
  void postGroup(uint64_t group, const std::vector<Operation>& ops) {
    if (device_) device_->postGroup(group, ops);
  }
  // After postGroup, before any communicator of the group runs its calls: what the GPU
  // network path would make on the way (DeviceExecutor::prepare), made now. A failure
  // fails the communicator as a failed call does.
  Status prepare(const std::vector<Operation>& ops);
  // A group that will not run after postGroup (another communicator's prepare failed).
  void dropGroup() {
    if (device_) device_->endGroup();
  }
  // `st` explained, kept as the communicator's failure (ncclCommGetAsyncError), and told
  // to the connected peers; returned. A failed call, or a group that could not run.
  Status failWith(Status st);
  // ncclCommRegister / ncclCommDeregister (device communicators; host memory: no effect).
  Result<void*> registerBuffer(void* buff, size_t bytes);
  Status deregisterBuffer(void* handle);
  // True when running `ops` only enqueues GPU work (the mesh), never blocking on peers.
  bool enqueuesOnly(const std::vector<Operation>& ops) const;
  // Same, on this communicator's worker thread; `done` is called with the result.
  void executeAsync(std::vector<Operation> ops, std::function<void(Status)> done);
  // The thread that runs this communicator's part of a group spanning several GPU ranks
  // of this process at the same time as the others' (created at first use).
  SpinWorker& launcher();
  bool launchThreads() const { return launchThreads_; }  // LOOM_LAUNCH_THREADS, read at init

  // User reduction operators (PreMulSum). Returns the ncclRedOp_t value.
  Result<int> createPreMulSum(const void* scalar, DataType type, ncclScalarResidence_t residence);
  Status destroyRedOp(int op);
  // The kernels' RedOp for a C API op and type (Avg and PreMulSum resolved).
  Result<RedOp> resolveOp(int ncclOp, DataType type) const;
  bool validOp(int ncclOp) const;
  // A PreMulSum op used with another type than it was made for (checked at the call, so
  // the mistake does not fail the communicator for later calls).
  Status checkOpType(int ncclOp, DataType type) const;

  // Errors and shutdown.
  ncclResult_t asyncError() const;
  void setAsyncError(Code code);
  // The message of the failure that set the async error (empty: none yet). Any thread.
  std::string lastFailure() const;
  // Stops operations in flight and tells connected peers; safe from any thread.
  void abort();
  // ncclCommRevoke: stops the operations in flight as abort() does and rejects later
  // calls, but keeps the bootstrap, so that the communicator stays good as the parent of
  // ncclCommSplit and ncclCommShrink (and for ncclCommDestroy). Waits up to `ms` for the
  // calls running on other threads and the GPU work enqueued to end; true when they did.
  bool revoke(int64_t ms);
  bool revoked() const { return revoked_.load(); }
  // Revoked, and nothing it stopped is left running.
  bool quiescent() const;
  // Before ncclCommSplit or ncclCommShrink uses the bootstrap: an error while a revoke has
  // not ended; once it has, the bootstrap runs again.
  Status readyAsParent(const char* fn);
  const std::atomic<bool>& abortFlag() const { return abortFlag_; }
  // Marks the start and end of a call that uses this object (abort waits for them).
  void enter() { busy_.fetch_add(1); }
  void leave();
  bool waitIdle(int64_t ms);

  // ConnectionProvider.
  Status ensureConnected(const std::vector<int>& sendPeers,
                         const std::vector<int>& recvPeers) override;
  transport::SendConnection* sendConnection(int peer) override;
  transport::RecvConnection* recvConnection(int peer) override;

  // Which transport connects to `peer` (empty when not connected yet).
  std::string transportTo(int peer) const;

  // The cost model's time for one operation on this communicator's fabric (the
  // fastest algorithm it has built; collectives/cost_model.h), in microseconds.
  double estimateUs(const Operation& op);

 private:
  Communicator() = default;
  Status init(const IdContents& id, int rank, int nranks, const CommOptions& options);
  Status runCollective(const Operation& op);
  const collectives::Schedule& scheduleFor(const collectives::CollRequest& req,
                                           collectives::Algorithm algo);
  Status runOneShotAllReduce(const Operation& op, const collectives::Schedule& sch,
                             collectives::ExecArgs args);
  // A count of 0 on host memory: one empty message around the ring (collectives::emptyCall).
  Status runEmptyCall(const Operation& op);
  Status runP2p(const std::vector<Operation>& ops, size_t begin, size_t end);
  Status runOnDevice(const std::vector<Operation>& ops, size_t* i);
  // A PreMulSum scalar in host or device memory; an error when the copy fails (never a
  // made-up value).
  Result<double> readScalar(DataType type, const void* p) const;
  // The transport for `peer` from the transports' reports (transports/select.h).
  Result<transport::Selection> chooseTransportTo(int peer) const;
  Result<int> selectTransport(int peer) const;
  void logTopologyChoices();
  void workerMain();
  // abort() and revoke(): the flag the calls and kernels watch, and the connections.
  void stopOperations();

  struct UserOp {
    bool live = false;
    DataType type = DataType::kFloat32;
    double scalar = 1.0;
    const void* devicePtr = nullptr;  // ncclScalarDevice: read at call time
  };

  CommOptions options_;
  int rank_ = 0;
  int nranks_ = 0;
  int cudaDev_ = -1;
  int64_t timeoutMs_ = 300000;
  std::unique_ptr<Bootstrap> bootstrap_;
  std::vector<transport::PeerInfo> peers_;
  transport::TransportContext context_;
  std::vector<std::unique_ptr<transport::Transport>> transports_;
  std::vector<std::unique_ptr<transport::SendConnection>> sends_;
  std::vector<std::unique_ptr<transport::RecvConnection>> recvs_;
  std::mutex connMutex_;  // sends_ and recvs_ change (ensureConnected) while abort() reads them
  std::vector<int> sendTransport_;  // index into transports_, -1 when not connected
  std::vector<int> recvTransport_;
  std::vector<UserOp> userOps_;
  mutable std::mutex opsMutex_;
  collectives::AlgoRequest forcedAlgo_;  // LOOM_ALGO, parsed at init
  int64_t spinUs_ = 50;
  bool launchThreads_ = true;
  bool networkPeers_ = false;  // some peer is reached through a network transport
  struct ScheduleKey {
    collectives::CollType type;
    collectives::Algorithm algo;
    size_t count, elemSize;
    int root;
    size_t pieceElems;
    bool operator==(const ScheduleKey&) const = default;
  };
  ScheduleKey scheduleKey_{};
  bool haveSchedule_ = false;
  collectives::Schedule schedule_;  // the last host schedule built (scheduleFor)
  std::vector<char> scratch_;       // one-shot all-reduce's gathered blocks
  ConnectMessage selfMessage_;
  std::unique_ptr<collectives::device::DeviceExecutor> device_;  // null: host memory only
  TopologyView topo_;
  // The cost model's view of this communicator (comm/estimate.cc), made at first use: for
  // its own buffers' kind (estimateUs), and for host buffers (the host tuner, across hosts).
  const collectives::model::Fabric& fabric(bool hostMemory);
  std::optional<collectives::model::Fabric> fabric_, hostFabric_;
  std::optional<collectives::Hierarchy> hier_;  // hosts and rails, where the ranks have them
  // Who is stuck (progress_report.h): this rank's record, the server that answers with
  // it, and every rank's server address.
  ProgressRecord progress_;
  std::unique_ptr<ProgressServer> progressServer_;
  std::vector<SocketAddress> progressAddresses_;
  uint64_t secret_[2] = {0, 0};
  // `st` (a failure of this rank), with where every rank is when it was a timeout.
  Status explainFailure(Status st);

  std::atomic<bool> abortFlag_{false};
  // The bootstrap's own stop: raised by abort() for good, by revoke() until the calls it
  // stopped have ended.
  std::atomic<bool> bootstrapAbort_{false};
  std::atomic<bool> revoked_{false};
  std::atomic<int> running_{0};  // calls inside execute() and prepare()
  std::atomic<int> asyncError_{ncclSuccess};
  mutable std::mutex failureMutex_;
  mutable std::string failure_;  // lastFailure(); set by asyncError() too
  std::atomic<int> busy_{0};
  std::mutex idleMutex_;
  std::condition_variable idleCv_;

  // Worker for groups that span several communicators of one thread.
  std::mutex workMutex_;
  std::condition_variable workCv_;
  std::deque<std::function<void()>> work_;
  std::thread worker_;
  bool stopWorker_ = false;
  std::unique_ptr<SpinWorker> launcher_;
};

// Converts between internal codes and the C API.
inline ncclResult_t toNccl(Code c) {
  return static_cast<ncclResult_t>(c);
}

// A stable 64-bit hash of this host's identity (LOOM_HOST_ID, else hostname + boot id).
uint64_t hostHash();

}  // namespace loom::comm
