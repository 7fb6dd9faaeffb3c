// Closes the send directions of a backend's connections on a thread of its own.
//
// A closing send lane flushes its endpoint so that what it sent reaches the peer, and
// UCX's flush completes only while the peer's worker progresses. A receive lane moves only
// while its rank tests it; a closing rank tests none and closes its comms one after
// another: two ranks that each closed a send comm before their receive comms waited for
// each other's flush until the lane's close limit (1 s a lane; 4 s for a connection of 4
// lanes at communicator destroy). Handed to the closer, a send comm flushes while the
// caller goes on to close its receive comms; its flush ends when UCX completes it, when
// the peer has closed its receive side (the heartbeat, lane.h), or after 1 s.
//
// Only a send comm with nothing in flight comes here (Striped::idle): its caller frees the
// buffers it sent from as soon as the comm is destroyed, and a send still in flight reads
// them until its close ends, so such a comm is closed on the caller's thread, as before.
//
// The destructor runs where the last reference goes (the backend's destructor, or the
// last send comm that outlives the backend) and waits for the queue: up to 1 s a lane of
// each comm still in it.
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
  ~Closer();  // waits for the thread to close what is queued, then joins it
  Closer(const Closer&) = delete;
  Closer& operator=(const Closer&) = delete;

  // Takes `comm` and closes it on the closer's thread (started on first use); closes it
  // on the caller's where that thread cannot start.
  void close(std::unique_ptr<Striped> comm) noexcept;
  // Returns once every comm handed over so far is closed (their lane threads' CPU time is
  // then in the context's count): up to 1 s a lane of each comm still queued.
  void drain();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;  // the queue emptied and nothing is being closed
  std::deque<std::unique_ptr<Striped>> queue_;
  bool closing_ = false;  // the thread is closing one it took from the queue
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace loom::transport::net::ucx
