// How the layers below the communicator exchange set-up data between ranks: the
// bootstrap's services (comm/bootstrap.h implements this), as the GPU executor
// (collectives/device/executor.h) and the transports' set-up need them. Every call has the
// bootstrap's deadline and names the peer that failed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace loom::transport {

class SetupChannel {
 public:
  virtual ~SetupChannel() = default;
  virtual int rank() const = 0;
  virtual int nranks() const = 0;
  // `data` holds nranks blocks of `size` bytes; block rank() is this rank's. Collective.
  virtual Status allGather(void* data, size_t size) = 0;
  virtual Status barrier() = 0;
  // Point to point: `tag` tells messages apart; sizes must match exactly.
  virtual Status send(int peer, uint64_t tag, const void* data, size_t size) = 0;
  // Never waits: false when the message is not here yet. Any thread.
  virtual Result<bool> tryRecv(int peer, uint64_t tag, void* data, size_t size) = 0;
  // kRemoteError when `peer`'s process is gone; ok when it answers within `ms` or cannot
  // be told. Any thread.
  virtual Status probe(int peer, int64_t ms) = 0;
};

}  // namespace loom::transport
