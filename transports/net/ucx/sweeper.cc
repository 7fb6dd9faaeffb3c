#include "transports/net/ucx/sweeper.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <vector>

#include "common/log.h"
#include "transports/net/ucx/striped.h"

namespace loom::transport::net::ucx {

namespace {

// A comm whose caller had messages in flight (or was in a call) when its descriptor woke
// the sweeper: left out of the epoll set (its descriptor stays readable) for this long.
constexpr int kRestMs = 1;
// Sweeps of a comm whose worker still has events after it was progressed and armed, before
// it rests instead.
constexpr int kAgainRounds = 8;
constexpr int kMaxEvents = 64;

}  // namespace

Sweeper::~Sweeper() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    const uint64_t one = 1;
    if (wakeFd_ >= 0 && ::write(wakeFd_, &one, sizeof(one)) < 0) {
      // Full (never): the thread is awake anyway.
    }
  }
  if (thread_.joinable()) thread_.join();
  if (wakeFd_ >= 0) ::close(wakeFd_);
  if (epollFd_ >= 0) ::close(epollFd_);
}

bool Sweeper::join(Striped* comm) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!thread_.joinable()) {
    // Started with the first comm; tried again with the next where that failed.
    if (epollFd_ < 0) epollFd_ = epoll_create1(EPOLL_CLOEXEC);
    if (wakeFd_ < 0) wakeFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    if (epollFd_ < 0 || wakeFd_ < 0 ||
        (epoll_ctl(epollFd_, EPOLL_CTL_ADD, wakeFd_, &ev) != 0 && errno != EEXIST)) {
      LOOM_WARN(kNet, "net/ucx: the sweeper's descriptors: %s", std::strerror(errno));
      return false;
    }
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::exception& e) {
      LOOM_WARN(kNet, "net/ucx: the sweeper thread did not start: %s", e.what());
      return false;
    }
  }
  comms_.insert(comm);
  if (!watch(comm, EPOLL_CTL_ADD)) {
    LOOM_WARN(kNet, "net/ucx: epoll_ctl for the sweeper: %s", std::strerror(errno));
    comms_.erase(comm);
    return false;
  }
  return true;
}

void Sweeper::leave(Striped* comm) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (comms_.erase(comm) == 0) return;
  epoll_ctl(epollFd_, EPOLL_CTL_DEL, comm->lane0Fd(), nullptr);
  // (An event of it that epoll already returned is dropped: it is no longer in comms_.)
}

bool Sweeper::watch(Striped* comm, int op) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLONESHOT;
  ev.data.ptr = comm;
  return epoll_ctl(epollFd_, op, comm->lane0Fd(), &ev) == 0;
}

int64_t Sweeper::cpuNs() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!thread_.joinable()) return 0;
  clockid_t clock;
  timespec ts{};
  if (pthread_getcpuclockid(thread_.native_handle(), &clock) != 0 ||
      clock_gettime(clock, &ts) != 0) {
    return 0;
  }
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void Sweeper::run() {
  epoll_event events[kMaxEvents];
  std::vector<Striped*> resting;
  for (;;) {
    const int n = epoll_wait(epollFd_, events, kMaxEvents, resting.empty() ? -1 : kRestMs);
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) return;
    // The rested ones are watched again (what is ready among them wakes the next wait).
    for (Striped* comm : resting) {
      if (comms_.count(comm) != 0) watch(comm);
    }
    resting.clear();
    for (int i = 0; i < n; ++i) {
      auto* comm = static_cast<Striped*>(events[i].data.ptr);
      if (comm == nullptr) {
        uint64_t drained = 0;
        while (::read(wakeFd_, &drained, sizeof(drained)) > 0) {
        }
        continue;
      }
      if (comms_.count(comm) == 0) continue;  // it left meanwhile
      Striped::Sweep r = comm->sweep();
      for (int k = 1; k < kAgainRounds && r == Striped::Sweep::kAgain; ++k) r = comm->sweep();
      if (r == Striped::Sweep::kDone) {
        watch(comm);
      } else {
        resting.push_back(comm);  // its caller moves it, or events still wait: soon again
      }
    }
  }
}

}  // namespace loom::transport::net::ucx
