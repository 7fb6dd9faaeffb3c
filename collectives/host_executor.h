// Runs a Schedule on host memory over transport connections, in the calling thread.
//
// Pieces of at most `pieceBytes` flow through one FIFO slot each; all steps of a phase
// progress together; the thread waits by spinning briefly, then poll()ing the sockets
// or yielding the CPU, so several ranks can share few cores. A wait that makes no
// progress for `timeoutMs` fails with the peer named.
#pragma once

#include <atomic>
#include <cstddef>
#include <string>

#include "collectives/schedule.h"
#include "common/datatype.h"
#include "common/status.h"
#include "transports/transport.h"

namespace loom::collectives {

// Where the executor gets its connections (the communicator, or a test harness).
class ConnectionProvider {
 public:
  virtual ~ConnectionProvider() = default;
  // Makes sure the connections exist (a collective call: every rank named must make the
  // matching call). Peers may include this rank.
  virtual Status ensureConnected(const std::vector<int>& sendPeers,
                                 const std::vector<int>& recvPeers) = 0;
  virtual transport::SendConnection* sendConnection(int peer) = 0;
  virtual transport::RecvConnection* recvConnection(int peer) = 0;
};

struct ExecArgs {
  const Schedule* schedule = nullptr;
  DataType type = DataType::kFloat32;
  RedOp op;
  const void* input = nullptr;
  void* output = nullptr;
  int rank = 0;
  size_t pieceBytes = 512 * 1024;
  int64_t timeoutMs = 300000;
  int64_t spinUs = 50;  // microseconds of busy-polling before yielding (0: yield at once)
  const std::atomic<bool>* abortFlag = nullptr;
  // Names the operation in messages: `what` when set (the p2p calls of a group), else
  // "AllReduce(ring, 1024 x float)" from the fields below, built only when a message
  // needs it (formatting it on every call costs a small collective measurably).
  std::string what;
  CollType coll = CollType::kAllReduce;
  Algorithm algo = Algorithm::kRing;
  size_t count = 0;
};

// The operation's name for messages (see ExecArgs::what).
std::string describe(const ExecArgs& args);

// The peers a schedule sends to and receives from (sorted, unique).
void schedulePeers(const Schedule& schedule, std::vector<int>* sendPeers,
                   std::vector<int>* recvPeers);

Status runSchedule(const ExecArgs& args, ConnectionProvider& conns);

}  // namespace loom::collectives
