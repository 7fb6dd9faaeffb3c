// One call of the C API as the executors take it: what to move, where from and to, on
// which stream. Plain data; the communicator (comm/) queues these inside a group and hands
// them to the host executor or the GPU executor (collectives/device/executor.h).
#pragma once

#include <cstddef>

#include "collectives/schedule.h"
#include "common/datatype.h"
#include "nccl.h"  // cudaStream_t

namespace loom::collectives {

struct Operation {
  CollType type = CollType::kAllReduce;
  const void* sendbuff = nullptr;
  void* recvbuff = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  int ncclOp = 0;  // ncclRedOp_t value
  int root = 0;    // root, or the peer for Send/Recv
  bool isSend = false;
  bool onDevice = false;  // the buffers are GPU memory (decided once, by the C API)
  cudaStream_t stream = nullptr;
};

}  // namespace loom::collectives
