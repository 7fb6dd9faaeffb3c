// Builds without CUDA: no GPU executor (communicators run on host memory only).
#include "collectives/device/executor.h"

namespace loom::collectives::device {

Result<std::unique_ptr<DeviceExecutor>> DeviceExecutor::create(
    transport::SetupChannel&, const std::vector<transport::PeerInfo>&, int, int,
    const ExecutorContext&) {
  return std::unique_ptr<DeviceExecutor>();
}

}  // namespace loom::collectives::device
