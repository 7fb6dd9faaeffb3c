// Closes the send directions of a backend's connections on a thread of its own.
//
// A closing send lane flushes its endpoint so that what it sent reaches the peer, and
// UCX's flush completes only while the peer's worker progresses. The peer's receive lane
// stops progressing when its own comm closes, and a rank closes its comms one after
// another: two ranks that each close a send comm before their receive comms would each
// wait for the other's flush, until the lane's close limit (1 s a lane; 4 s for a
// connection of 4 lanes at communicator destroy). Handed to the closer, a send comm
// flushes while the caller goes on to close its receive comms; its flush ends when the
// data has gone or the peer has closed its receive side (the heartbeat, lane.h).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "transports/net/ucx/striped.h"

namespace loom::transport::net::ucx {

class Closer {
 public:
  Closer() = default;
  ~Closer();  // closes what is still queued, then joins the thread
  Closer(const Closer&) = delete;
  Closer& operator=(const Closer&) = delete;

  // Takes `comm` and closes it on the closer's thread (started on first use); closes it
  // here where that thread cannot start.
  void close(std::unique_ptr<Striped> comm);

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Striped>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace loom::transport::net::ucx
