// transports/p2p: GPU peer-to-peer memory. A Window is a block of device memory that
// every rank of a communicator maps into its own address space: directly (peer access)
// between GPUs of one process, through CUDA IPC between processes. Kernels then write
// into the peers' windows over NVLink or PCIe with plain stores.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::transport::p2p {

// What a rank tells the others about its GPU before the mesh is decided.
struct GpuIdentity {
  int32_t rank = -1;
  int32_t device = -1;
  int32_t pad = 0;
  uint64_t process = 0;     // processToken(): equal exactly for ranks of one process
  int32_t reachable = 0;    // 1: this rank can map every other rank's GPU
  int32_t nativeLinks = 0;  // 1: every such pair reports native atomics (NVLink, not PCIe)
  int32_t sms = 0;          // the GPU's multiprocessors
  uint64_t hostHash = 0;
  char busId[32] = {0};  // "0000:19:00.0"
  char why[96] = {0};    // when reachable is 0: the first reason
};

// Fills this rank's identity (device's PCI bus id). Returns false with a reason when
// the device cannot be queried.
Result<GpuIdentity> describeGpu(int rank, int device, uint64_t hostHash);

// Decides from every rank's identity whether this rank can map all the others' GPUs
// (same host, distinct GPUs, CUDA peer access between each pair). Sets reachable/why,
// and nativeLinks (whether CUDA reports native peer atomics for every pair). With
// `shareGpu` (LOOM_P2P_SHARE_GPU), ranks of this process may also share a GPU.
void checkReachable(GpuIdentity* self, const std::vector<GpuIdentity>& all, bool shareGpu = false);

// The most ranks that share one GPU (1 when every rank has its own).
int ranksPerGpu(const std::vector<GpuIdentity>& all);

// With ranks sharing GPUs, the most blocks a mesh kernel may have so that every rank's
// kernel is resident at once (each waits for its peers): a 512-thread block of 128
// registers fills an SM, and one rank's share of the smallest GPU stays free for copies
// and other launches. 0 when no GPU is shared (no cap).
int sharedGpuBlockCap(const std::vector<GpuIdentity>& all);

// Exchanges `size` bytes per rank: data holds nranks blocks, this rank's filled in.
using AllGatherFn = std::function<Status(void* data, size_t size)>;

class Window {
 public:
  // Collective: every rank calls it with the same size. Allocates `bytes` of zeroed
  // device memory on `device` and maps every rank's window.
  static Result<std::unique_ptr<Window>> create(int rank, int nranks, int device, size_t bytes,
                                                const std::vector<GpuIdentity>& gpus,
                                                const AllGatherFn& allGather);
  ~Window();

  char* local() const { return peers_[rank_]; }
  char* peer(int r) const { return peers_[r]; }
  size_t bytes() const { return bytes_; }

 private:
  Window() = default;
  int rank_ = 0;
  int device_ = -1;
  size_t bytes_ = 0;
  std::vector<char*> peers_;
  std::vector<bool> opened_;  // mapped through cudaIpcOpenMemHandle (closed at the end)
};

// "cudaErrorX: description" for a cudaError_t value.
std::string cudaErrorText(int error);

}  // namespace loom::transport::p2p
