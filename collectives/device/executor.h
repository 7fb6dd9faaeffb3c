// The GPU executor: a communicator's device side, set up at init when the rank has a CUDA
// device, and used for every operation whose buffers are device memory. The communicator
// (comm/) owns one and hands it each call; the choice of form is collectives/device/
// mesh_plan.h's and net_plan.h's, the executor runs what they choose.
//
// Two modes, decided at init (the same on every rank):
//   mesh     every rank's GPU maps every other's (one host, P2P over NVLink or PCIe): the
//            collectives run as kernels on the caller's stream (collectives/device/mesh.h),
//            fully asynchronous and capturable in CUDA graphs.
//   network  otherwise (ranks on several hosts, P2P disabled or impossible): kernels on
//            the caller's stream move the data through FIFOs in page-locked host memory
//            that a proxy thread carries over the network (collectives/device/
//            net_executor.h); asynchronous and capturable as well.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/operation.h"
#include "common/datatype.h"
#include "common/status.h"
#include "transports/setup_channel.h"
#include "transports/transport.h"

namespace loom::collectives::device {

// What the communicator hands the executor for a reduction.
struct ExecutorRedOp {
  RedOp op;
  const void* scalarDevice = nullptr;  // PreMulSum scalar in device memory, or null
};

// What the executor gets from its communicator besides the set-up channel.
struct ExecutorContext {
  const std::atomic<bool>* abortFlag = nullptr;  // ncclCommAbort
  uint64_t commHash = 0;  // tells this communicator's connections from others'
  // The communicator's fabric for GPU buffers (collectives/cost_model.h gpuFabric) where
  // its ranks span several hosts: what the network executors price their algorithms on
  // (model::netExecutorFabric). Unset: one class of link between every pair.
  std::optional<model::Fabric> fabric;
};

class DeviceExecutor {
 public:
  // Returns null (and no error) when this build has no CUDA. Collective over `setup` (the
  // communicator's bootstrap), which must outlive the object.
  static Result<std::unique_ptr<DeviceExecutor>> create(
      transport::SetupChannel& setup, const std::vector<transport::PeerInfo>& peers, int rank,
      int device, const ExecutorContext& context);
  virtual ~DeviceExecutor() = default;

  virtual bool mesh() const = 0;
  virtual std::string describe() const = 0;
  // Enqueues one collective on its stream.
  virtual Status run(const Operation& op, const ExecutorRedOp& red) = 0;
  // Send/Recv calls of one group (all on device memory).
  virtual Status runP2p(const std::vector<Operation>& ops, size_t begin, size_t end) = 0;
  // A group's calls, posted by every communicator of the group before any of them runs
  // (`group` is new at every ncclGroupEnd). Ranks driven from one process then see each
  // other's buffers, and copy-only collectives go through the copy engines
  // (collectives/device/copy_plan.h). endGroup() after the group's calls ran.
  virtual void postGroup(uint64_t group, const std::vector<Operation>& ops) = 0;
  // After postGroup, for every communicator of the group before any runs a call: what
  // run() and runP2p() would make on the way (network plans, connections, scratch
  // memory), made now in the calling thread. A run then only enqueues: nothing waits for
  // the GPU or allocates between two kernels of one group, which with the ranks of one
  // process could stall the GPU for good. prepareP2p takes the calls [begin, end) that
  // runP2p will get.
  virtual Status prepare(const Operation& op) = 0;
  virtual Status prepareP2p(const std::vector<Operation>& ops, size_t begin, size_t end) = 0;
  virtual void endGroup() = 0;
  // ncclCommRegister: [buff, buff + bytes) may be read by peers in other processes where
  // it lies (the registered forms, cuda_executor_registration.cc). Returns the handle for
  // deregisterBuffer. Memory loom cannot export (not from cudaMalloc) is still accepted,
  // without effect.
  virtual Result<void*> registerBuffer(void* buff, size_t bytes) = 0;
  virtual Status deregisterBuffer(void* handle) = 0;
  // A kernel's failure (timeout, abort), as a status; ok when none.
  virtual Status kernelError() const = 0;
  virtual void abort() = 0;
  // True when the GPU work of the calls enqueued so far has ended (captured calls aside:
  // their replays are the caller's). For ncclCommRevoke: its kernels stop on the abort.
  virtual bool idle() const = 0;
};

}  // namespace loom::collectives::device
