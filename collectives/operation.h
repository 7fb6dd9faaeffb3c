// One call of the C API as the executors take it: what to move, where from and to, on
// which stream. Plain data; the communicator (comm/) queues these inside a group and hands
// them to the host executor or the GPU executor (collectives/device/executor.h).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

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

// The sends among the Send/Recv calls [begin, end) of one group whose bytes a receive of
// the same group overwrites (in place: nccl-tests' sendrecv passes one buffer for both),
// as indices into `ops`. Such a send must leave from a copy made before the group moves
// anything: its receive may land before the send has read the bytes. O(n log n): groups
// of thousands of calls (an all-to-all of send/receive) pass here on every call.
inline std::vector<size_t> sendsOverwrittenByReceives(const std::vector<Operation>& ops,
                                                      size_t begin, size_t end) {
  auto range = [](const Operation& o) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(o.isSend ? o.sendbuff : o.recvbuff);
    return std::make_pair(p, p + o.count * dataTypeSize(o.dtype));
  };
  // The receives by start; reach[k]: the furthest end among the first k + 1 of them.
  std::vector<std::pair<uintptr_t, uintptr_t>> recvs;
  for (size_t i = begin; i < end; ++i)
    if (!ops[i].isSend && ops[i].count > 0) recvs.push_back(range(ops[i]));
  std::vector<size_t> out;
  if (recvs.empty()) return out;
  std::sort(recvs.begin(), recvs.end());
  std::vector<uintptr_t> reach(recvs.size());
  for (size_t k = 0; k < recvs.size(); ++k)
    reach[k] = k == 0 ? recvs[k].second : std::max(reach[k - 1], recvs[k].second);
  for (size_t i = begin; i < end; ++i) {
    if (!ops[i].isSend || ops[i].count == 0) continue;
    const auto [a, b] = range(ops[i]);
    // The receives that start before this send ends; one of them reaches past its start.
    const size_t k = static_cast<size_t>(
        std::lower_bound(recvs.begin(), recvs.end(), std::make_pair(b, uintptr_t{0})) -
        recvs.begin());
    if (k > 0 && reach[k - 1] > a) out.push_back(i);
  }
  return out;
}

}  // namespace loom::collectives
