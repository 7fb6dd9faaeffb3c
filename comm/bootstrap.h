// The bootstrap: how ranks find each other and exchange set-up data over sockets.
//
// The root (a thread in the process that called ncclGetUniqueId, or in rank 0 when
// the id came from LOOM_COMM_ID) collects every rank's listening address and sends
// the table back. After that, ranks talk directly: each message is one short TCP
// connection to the receiver's listener carrying the id's secret, the sender's rank
// and a tag. A connection without the secret is dropped and logged; every wait has a
// deadline; a peer that disappears is named in the error.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/unique_id.h"
#include "common/handshake.h"
#include "common/socket.h"
#include "common/status.h"
#include "transports/setup_channel.h"

namespace loom::comm {

// Starts a root thread listening on `id.root` (port 0 picks one; id.root is updated)
// for one communicator. The thread ends when all ranks were served or on timeout.
Status startRoot(IdContents* id, int64_t timeoutMs);

class Bootstrap final : public transport::SetupChannel {
 public:
  // Joins the communicator of `id` as `rank` of `nranks`.
  static Result<std::unique_ptr<Bootstrap>> join(const IdContents& id, int rank, int nranks,
                                                 int64_t timeoutMs,
                                                 const std::atomic<bool>* abortFlag);
  ~Bootstrap() override;

  int rank() const override { return rank_; }
  int nranks() const override { return nranks_; }
  const SocketAddress& address(int rank) const { return addresses_[rank]; }

  // Point to point: `tag` tells messages apart; sizes must match exactly.
  Status send(int peer, uint64_t tag, const void* data, size_t size) override;
  Status recv(int peer, uint64_t tag, void* data, size_t size);
  // recv that never waits: false when the message is not here yet (for a thread that
  // polls, such as the network proxy). Any thread.
  Result<bool> tryRecv(int peer, uint64_t tag, void* data, size_t size) override;
  // `data` holds nranks blocks of `size` bytes; block `rank()` is this rank's.
  Status allGather(void* data, size_t size) override;
  Status barrier() override;
  // A fresh tag for one collective exchange (every rank calls in the same order).
  uint64_t nextTag() { return ++tagCounter_ << 8; }
  // kRemoteError when `peer`'s process is gone (its listener refuses connections); ok
  // when it answers within `ms` or cannot be told. Any thread.
  Status probe(int peer, int64_t ms = 1000) override;

 private:
  Bootstrap() = default;
  Deadline deadline() const { return Deadline::afterMs(timeoutMs_, abortFlag_); }
  // The message for (peer, tag) from those already here.
  Result<bool> takeUnexpected(int peer, uint64_t tag, void* data, size_t size);
  // Reads the message of a connection that presented its header into unexpected_ (a
  // stranger's is dropped and logged).
  Status readMessage(Arrival a);
  int rank_ = 0;
  int nranks_ = 0;
  uint64_t secret_[2] = {0, 0};
  int64_t timeoutMs_ = 0;
  const std::atomic<bool>* abortFlag_ = nullptr;
  Socket listener_;
  std::unique_ptr<Arrivals> arrivals_;  // connections to listener_ until their header is in
  std::mutex arrivalsMutex_;
  std::vector<SocketAddress> addresses_;
  std::map<std::pair<int, uint64_t>, std::vector<char>> unexpected_;
  std::mutex mutex_;  // guards unexpected_
  uint64_t tagCounter_ = 0;
};

}  // namespace loom::comm
