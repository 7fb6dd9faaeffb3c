// The proxy: one thread per communicator that moves FIFO slots (net_fifo.h) between the
// GPU and the network. It knows nothing of collectives: a send FIFO's slots go out in
// order as the kernel posts them, and every receive FIFO has a receive posted for each
// free slot, so bytes flow whenever both ends' kernels run. Kernels therefore never wait
// on the host thread that called them, and a kernel captured in a CUDA graph drives the
// proxy by itself on every replay.
//
// The thread spins while there is work (LOOM_PROXY_SPIN_US after the last), then sleeps
// in 1 ms steps; kick() (each launch) wakes it at once.
//
// A failing connection is closed for whoever waits on it (its FIFO's `closed`), and its
// status kept (status(peer)); the proxy goes on with the others.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "transports/net/connect.h"
#include "transports/net/net.h"
#include "transports/net/net_fifo.h"

namespace loom::transport::net {

// Where a FIFO's slots live, for their registration with the backend: page-locked host
// memory, or GPU memory (GPUDirect RDMA), registered through dma-buf where `dmaBufFd` is an
// exported descriptor, else as plain GPU memory (nvidia_peermem). It owns the descriptor:
// closed with it, or by closeDmaBuf once the registration holds the pages.
struct SlotMemory {
  MemType type = MemType::kHost;
  int dmaBufFd = -1;
  uint64_t dmaBufOffset = 0;  // where the slots begin in the exported pages
  // Receives: the CUDA context whose GPU's writes from the NIC are flushed after each
  // receive, before the kernel is told (cuda::flushRdmaWrites); null: none needed.
  void* flushContext = nullptr;

  SlotMemory() = default;
  SlotMemory(SlotMemory&& o) noexcept { *this = std::move(o); }
  SlotMemory& operator=(SlotMemory&& o) noexcept;
  ~SlotMemory() { closeDmaBuf(); }
  void closeDmaBuf();
};

class Proxy {
 public:
  // `rank` names this side in messages; `spinUs` as LOOM_PROXY_SPIN_US.
  Proxy(int rank, int64_t spinUs);
  ~Proxy();  // drains the send FIFOs (at most drainMs), then closes everything

  // Hands over a connected comm and its FIFO (which must outlive the proxy). Any thread.
  void addSend(std::unique_ptr<SendComm> comm, const Fifo& fifo);
  void addRecv(std::unique_ptr<RecvComm> comm, const Fifo& fifo);
  // Hands over a FIFO whose connection is still being made: the thread calls `dial`
  // until it gives the comm (kernels may post to the FIFO meanwhile), or fails the
  // channel when it fails or `timeoutMs` have passed.
  void addSend(SendDialer dial, const Fifo& fifo, int64_t timeoutMs, SlotMemory mem = {});
  void addRecv(RecvDialer dial, const Fifo& fifo, int64_t timeoutMs, SlotMemory mem = {});

  // Wakes the thread (a kernel that will post to its FIFOs was launched).
  void kick();

  // The first failure of the connection to (send) or from (recv) `peer`; ok if none.
  Status status(int peer, bool send) const;
  // The first failure of any connection; ok if none.
  Status firstError() const;

  // Closes every connection (abort): FIFOs read `closed` = kNetShutdown.
  void shutdown();

  // CPU time the proxy thread has used so far, in seconds (getrusage of the thread).
  double cpuSeconds() const;

  int64_t drainMs = 10000;  // how long the destructor waits for posted sends to leave

 private:
  struct Channel;
  void run();
  bool progressSend(Channel& c);
  bool progressRecv(Channel& c);
  template <typename Post, typename Test, typename Retired>
  bool pump(Channel& c, uint64_t room, Post post, Test test, Retired retired, bool* moved);
  // Calls the channel's dialer; true once it is connected.
  bool dial(Channel& c, Clock::time_point now);
  void add(std::unique_ptr<Channel> c);
  void registerFifo(Channel& c);
  void fail(Channel& c, const Status& st);
  void adoptNew();

  const int rank_;
  const int64_t spinUs_;
  std::vector<std::unique_ptr<Channel>> channels_;  // the thread's own
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Channel>> incoming_;  // handed over, not yet taken
  std::vector<std::pair<std::pair<int, bool>, Status>> failures_;
  std::atomic<bool> haveIncoming_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> shutdown_{false};
  std::atomic<bool> sleeping_{false};
  std::atomic<uint64_t> kicks_{0};
  std::atomic<int64_t> cpuNs_{0};
  std::condition_variable wake_;
  std::thread thread_;
};

}  // namespace loom::transport::net
