#include "transports/p2p/p2p_window.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "common/process.h"

namespace loom::transport::p2p {

std::string cudaErrorText(int error) {
  auto e = static_cast<cudaError_t>(error);
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

namespace {

Status cudaStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  return errorf(Code::kCudaError, "%s failed: %s", what, cudaErrorText(e).c_str());
}

void setWhy(GpuIdentity* g, const std::string& why) {
  g->reachable = 0;
  std::snprintf(g->why, sizeof(g->why), "%s", why.c_str());
}

}  // namespace

Result<GpuIdentity> describeGpu(int rank, int device, uint64_t hostHash) {
  GpuIdentity g;
  g.rank = rank;
  g.device = device;
  g.process = processToken();
  g.hostHash = hostHash;
  cudaError_t e = cudaDeviceGetPCIBusId(g.busId, sizeof(g.busId), device);
  if (e != cudaSuccess) return cudaStatus(e, "cudaDeviceGetPCIBusId");
  e = cudaDeviceGetAttribute(&g.sms, cudaDevAttrMultiProcessorCount, device);
  if (e != cudaSuccess) return cudaStatus(e, "cudaDeviceGetAttribute(multiprocessor count)");
  g.reachable = 1;
  return g;
}

void checkReachable(GpuIdentity* self, const std::vector<GpuIdentity>& all, bool shareGpu) {
  self->nativeLinks = 1;
  for (const GpuIdentity& o : all) {
    if (o.rank == self->rank) continue;
    if (o.hostHash != self->hostHash)
      return setWhy(self, "rank " + std::to_string(o.rank) + " is on another host");
    if (std::strcmp(o.busId, self->busId) == 0) {
      // Kernels of one process run side by side on a GPU; those of two processes take
      // turns (without MPS), and a kernel waiting for another that cannot run would
      // wait until the timeout.
      if (shareGpu && o.process == self->process) continue;
      return setWhy(self, "rank " + std::to_string(o.rank) + " uses the same GPU " + o.busId +
                              (shareGpu ? " from another process" : ""));
    }
    int dev = -1;
    if (cudaDeviceGetByPCIBusId(&dev, o.busId) != cudaSuccess) {
      cudaGetLastError();
      return setWhy(self, std::string("GPU ") + o.busId + " of rank " + std::to_string(o.rank) +
                              " is not visible here (CUDA_VISIBLE_DEVICES?)");
    }
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, self->device, dev) != cudaSuccess || !can) {
      cudaGetLastError();
      return setWhy(
          self, std::string("CUDA reports no peer access from ") + self->busId + " to " + o.busId);
    }
    int atomics = 0;
    if (cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, self->device,
                                  dev) != cudaSuccess) {
      cudaGetLastError();
      atomics = 0;
    }
    if (!atomics) self->nativeLinks = 0;
  }
}

int ranksPerGpu(const std::vector<GpuIdentity>& all) {
  int most = 1;
  for (const GpuIdentity& a : all) {
    int n = 0;
    for (const GpuIdentity& b : all) {
      n += a.hostHash == b.hostHash && std::strcmp(a.busId, b.busId) == 0 ? 1 : 0;
    }
    most = std::max(most, n);
  }
  return most;
}

int sharedGpuBlockCap(const std::vector<GpuIdentity>& all) {
  const int sharing = ranksPerGpu(all);
  if (sharing <= 1) return 0;
  int sms = 0;
  for (const GpuIdentity& g : all) sms = sms == 0 ? g.sms : std::min(sms, g.sms);
  return std::max(1, sms / (sharing + 1));
}

Result<std::unique_ptr<Window>> Window::create(int rank, int nranks, int device, size_t bytes,
                                               const std::vector<GpuIdentity>& gpus,
                                               const AllGatherFn& allGather) {
  std::unique_ptr<Window> w(new Window());
  w->rank_ = rank;
  w->device_ = device;
  w->bytes_ = bytes;
  w->peers_.assign(nranks, nullptr);
  w->opened_.assign(nranks, false);
  void* mem = nullptr;
  cudaError_t e = cudaMalloc(&mem, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return errorf(Code::kCudaError,
                  "allocating the %zu-byte peer-to-peer window on GPU %d failed: %s (lower "
                  "LOOM_P2P_SLOT_BYTES or LOOM_P2P_BLOCKS)",
                  bytes, device, cudaErrorText(e).c_str());
  }
  w->peers_[rank] = static_cast<char*>(mem);
  LOOM_TRY(cudaStatus(cudaMemset(mem, 0, bytes), "cudaMemset of the window"));
  LOOM_TRY(cudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize after zeroing the window"));

  struct Exported {
    cudaIpcMemHandle_t handle;
    uint64_t address;
    uint64_t process;
    int32_t device;
    int32_t pad;
  };
  std::vector<Exported> all(nranks);
  std::memset(all.data(), 0, sizeof(Exported) * nranks);
  LOOM_TRY(cudaStatus(cudaIpcGetMemHandle(&all[rank].handle, mem), "cudaIpcGetMemHandle"));
  all[rank].address = reinterpret_cast<uint64_t>(mem);
  all[rank].process = processToken();
  all[rank].device = device;
  LOOM_TRY(allGather(all.data(), sizeof(Exported)));
  for (int r = 0; r < nranks; ++r) {
    if (r == rank) continue;
    if (all[r].process == all[rank].process) {
      // Same process: the address is valid here once peer access is on (or at once, for a
      // rank on this same GPU: LOOM_P2P_SHARE_GPU).
      int dev = -1;
      LOOM_TRY(cudaStatus(cudaDeviceGetByPCIBusId(&dev, gpus[r].busId), "cudaDeviceGetByPCIBusId"));
      e = dev == device ? cudaSuccess : cudaDeviceEnablePeerAccess(dev, 0);
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else if (e != cudaSuccess) {
        return cudaStatus(e, "cudaDeviceEnablePeerAccess");
      }
      w->peers_[r] = reinterpret_cast<char*>(all[r].address);
    } else {
      void* p = nullptr;
      e = cudaIpcOpenMemHandle(&p, all[r].handle, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        cudaGetLastError();
        return errorf(Code::kCudaError,
                      "mapping rank %d's window (cudaIpcOpenMemHandle) "
                      "failed: %s",
                      r, cudaErrorText(e).c_str());
      }
      w->peers_[r] = static_cast<char*>(p);
      w->opened_[r] = true;
    }
  }
  return w;
}

Window::~Window() {
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  for (size_t r = 0; r < peers_.size(); ++r) {
    if (opened_[r] && peers_[r]) cudaIpcCloseMemHandle(peers_[r]);
  }
  if (peers_.size() > static_cast<size_t>(rank_) && peers_[rank_]) cudaFree(peers_[rank_]);
  cudaGetLastError();
  if (prev >= 0) cudaSetDevice(prev);
}

}  // namespace loom::transport::p2p
