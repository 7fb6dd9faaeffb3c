// Progresses lane 0 of a backend's send comms while their callers have nothing to test.
//
// A send that UCX reports done may still be partly in UCX's hands: its tcp transport
// finishes a send it has copied into its own buffer (up to a segment, 256 KiB as loom sets
// it) at once, and writes what the socket did not take later, in the worker's progress.
// The caller's thread progresses lane 0 only inside its calls; after its last test nothing
// would, and the peer would wait for the rest forever (4 ranks in two network namespaces,
// CI 2026-12-06: a lane's part lost about 1 run in 16 under load, every run with 32 KiB
// socket buffers). The lanes past 0 have threads of their own that keep progressing
// (striped.h); lane 0 has the sweeper: one thread per backend, asleep in epoll on the
// event descriptors of the send comms' lane-0 workers. When one says its worker has events
// (its socket takes more, or something arrived) and that comm's caller has nothing in
// flight, the sweeper progresses the worker and arms it again; while the caller has
// messages in flight, its own tests move the worker, and the sweeper looks again 1 ms
// later. UCX's tcp transport asks for write events only while it holds bytes, so a sweeper
// sleeps through steady traffic there.
#pragma once

#include <sys/epoll.h>

#include <cstdint>
#include <mutex>
#include <thread>
#include <unordered_set>

namespace loom::transport::net::ucx {

class Striped;

class Sweeper {
 public:
  Sweeper() = default;
  ~Sweeper();  // joins the thread; every comm has left by then (they share ownership)
  Sweeper(const Sweeper&) = delete;
  Sweeper& operator=(const Sweeper&) = delete;

  // A send comm joins once its lane 0's descriptor is known (Striped::lane0Fd) and leaves
  // in its destructor; once leave() returns, the thread no longer touches it. join() says
  // false where the thread could not start (the comm is then not watched; said at WARN).
  bool join(Striped* comm);
  void leave(Striped* comm);
  // The CPU time of the thread so far.
  int64_t cpuNs();

 private:
  void run();
  // (Under mutex_) `comm`'s descriptor into the epoll set (EPOLL_CTL_ADD), or back into it
  // after an event or a rest (EPOLL_CTL_MOD), for one event.
  bool watch(Striped* comm, int op = EPOLL_CTL_MOD);

  std::mutex mutex_;  // all below, and the thread's use of each comm
  std::unordered_set<Striped*> comms_;
  int epollFd_ = -1;
  int wakeFd_ = -1;  // an eventfd in the epoll set: stop
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace loom::transport::net::ucx
