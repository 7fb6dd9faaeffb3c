#include "transports/net/ucx/sweeper.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <exception>

#include "common/log.h"
#include "transports/net/ucx/striped.h"

namespace loom::transport::net::ucx {

namespace {

// A comm whose caller was in a call when its descriptor woke the sweeper: left out of the
// poll (its descriptor stays readable) for this long, then looked at again.
constexpr int kSoonMs = 1;
// Rounds of a comm whose worker still has events after it was progressed and armed.
constexpr int kAgainRounds = 8;

}  // namespace

Sweeper::~Sweeper() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake();
  if (thread_.joinable()) thread_.join();
  if (const int fd = wakeFd_.load(); fd >= 0) ::close(fd);
}

void Sweeper::join(Striped* comm) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    comms_.push_back(comm);
    if (!thread_.joinable() && !failed_) {
      const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      if (fd < 0) {
        LOOM_WARN(kNet, "net/ucx: the sweeper's eventfd: %s", std::strerror(errno));
      } else {
        try {
          wakeFd_.store(fd, std::memory_order_release);
          thread_ = std::thread([this, fd] { run(fd); });
        } catch (const std::exception& e) {
          LOOM_WARN(kNet, "net/ucx: the sweeper thread did not start: %s", e.what());
          wakeFd_.store(-1, std::memory_order_release);
          ::close(fd);
        }
      }
      // Without it, a send whose bytes UCX still held at the caller's last test waits for
      // the caller's next call on that connection.
      failed_ = !thread_.joinable();
    }
  }
  wake();
}

void Sweeper::leave(Striped* comm) {
  std::lock_guard<std::mutex> lock(mutex_);
  comms_.erase(std::remove(comms_.begin(), comms_.end(), comm), comms_.end());
  // (Its descriptor may be in the poll of the moment: it is looked up again before use.)
}

void Sweeper::wake() {
  const uint64_t one = 1;
  const int fd = wakeFd_.load(std::memory_order_acquire);
  if (fd >= 0 && ::write(fd, &one, sizeof(one)) < 0) {
    // Full (never: the thread drains it each round): it is awake anyway.
  }
}

void Sweeper::run(int wakeFd) {
  std::vector<pollfd> fds;
  std::vector<Striped*> polled, resting;
  for (;;) {
    fds.assign(1, pollfd{wakeFd, POLLIN, 0});
    polled.assign(1, nullptr);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
      for (Striped* comm : comms_) {
        if (std::find(resting.begin(), resting.end(), comm) != resting.end()) continue;
        fds.push_back(pollfd{comm->lane0Fd(), POLLIN, 0});
        polled.push_back(comm);
      }
    }
    const int timeout = resting.empty() ? -1 : kSoonMs;
    resting.clear();
    if (::poll(fds.data(), fds.size(), timeout) <= 0) continue;
    uint64_t drained = 0;
    while (::read(wakeFd, &drained, sizeof(drained)) > 0) {
    }
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Striped* comm = polled[i];
      if (std::find(comms_.begin(), comms_.end(), comm) == comms_.end()) continue;  // left
      Striped::Sweep r = comm->sweep();
      for (int k = 1; k < kAgainRounds && r == Striped::Sweep::kAgain; ++k) r = comm->sweep();
      if (r == Striped::Sweep::kSoon) resting.push_back(comm);
    }
  }
}

}  // namespace loom::transport::net::ucx
