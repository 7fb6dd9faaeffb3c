// Progresses lane 0 of a backend's send comms between their callers' calls.
//
// A send that UCX reports done may still be partly in UCX's hands: its tcp transport
// finishes a send it has copied into its own buffer (up to a segment, 256 KiB as loom sets
// it) at once, and writes what the socket did not take later, in the worker's progress.
// The caller's thread progresses lane 0 only inside its calls; after its last test nothing
// would, and the peer would wait for the rest forever (4 ranks in two network namespaces,
// CI 2026-12-06: a lane's part lost about 1 run in 16 under load, every run with 32 KiB
// socket buffers). The lanes past 0 have threads of their own that keep progressing
// (striped.h); lane 0 has the sweeper: one thread per backend, asleep in poll() on the
// event descriptors of the lane-0 workers, that progresses a worker whose descriptor says
// it has events (its socket took more, or something arrived) while its caller is not in
// a call. UCX's tcp transport asks for those write events only while it holds bytes, so a
// sweeper sleeps through steady traffic.
#pragma once

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

namespace loom::transport::net::ucx {

class Striped;

class Sweeper {
 public:
  Sweeper() = default;
  ~Sweeper();  // joins the thread; every comm has left by then (they share ownership)
  Sweeper(const Sweeper&) = delete;
  Sweeper& operator=(const Sweeper&) = delete;

  // A send comm joins once its lane 0's descriptor is known (Striped::lane0Fd) and leaves
  // in its destructor; once leave() returns, the thread no longer touches it.
  void join(Striped* comm);
  void leave(Striped* comm);

 private:
  void run(int wakeFd);
  void wake();

  std::mutex mutex_;  // comms_, stop_, failed_, thread_, and the thread's use of each comm
  std::vector<Striped*> comms_;
  bool stop_ = false;
  bool failed_ = false;          // the thread could not start (said once)
  std::atomic<int> wakeFd_{-1};  // the thread's eventfd while it runs: comms_ changed
  std::thread thread_;
};

}  // namespace loom::transport::net::ucx
