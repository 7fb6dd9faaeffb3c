#include "common/handshake.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>

#include "common/log.h"

namespace loom {

Arrivals::Arrivals(Socket* listener, size_t helloBytes, int64_t perConnectionMs, std::string what)
    : listener_(listener),
      helloBytes_(helloBytes),
      perConnectionMs_(perConnectionMs),
      what_(std::move(what)) {}

Status Arrivals::takeNew() {
  while (true) {
    int fd = ::accept4(listener_->fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED ||
          errno == EPROTO) {
        return Status::ok();
      }
      return sysError(errno, "%s: accept", what_.c_str());
    }
    Pending p;
    p.sock = Socket(fd);
    p.sock.setNoDelay();
    auto pa = p.sock.peerAddress();
    p.from = pa ? pa->toString() : "?";
    p.hello.resize(helloBytes_);
    p.deadline = Clock::now() + std::chrono::milliseconds(perConnectionMs_);
    pending_.push_back(std::move(p));
  }
}

std::optional<Arrival> Arrivals::advance() {
  const auto now = Clock::now();
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    const char* why = nullptr;
    auto r = p.sock.recvSome(p.hello.data() + p.got, helloBytes_ - p.got, p.from.c_str());
    if (!r) {
      why = "closed before saying hello";
    } else {
      p.got += *r;
      if (p.got == helloBytes_) {
        Arrival a{std::move(p.sock), std::move(p.hello), std::move(p.from)};
        pending_.erase(pending_.begin() + i);
        return a;
      }
      if (now > p.deadline) why = "said no hello in time";
    }
    if (why) {
      LOOM_WARN(kNet, "%s: dropped a connection from %s: it %s", what_.c_str(), p.from.c_str(),
                why);
      pending_.erase(pending_.begin() + i);
      continue;
    }
    ++i;
  }
  return std::nullopt;
}

Result<std::optional<Arrival>> Arrivals::poll() {
  LOOM_TRY(takeNew());
  return advance();
}

Result<Arrival> Arrivals::next(const Deadline& deadline) {
  std::vector<pollfd> fds;
  while (true) {
    LOOM_TRY(takeNew());
    if (auto a = advance()) return std::move(*a);
    if (deadline.aborted()) return errorf(Code::kSystemError, "%s: aborted", what_.c_str());
    if (deadline.expired()) {
      return errorf(Code::kSystemError, "%s: no connection arrived within %lld ms", what_.c_str(),
                    (long long)deadline.totalMs());
    }
    fds.clear();
    fds.push_back({listener_->fd(), POLLIN, 0});
    for (const auto& p : pending_) fds.push_back({p.sock.fd(), POLLIN, 0});
    ::poll(fds.data(), fds.size(), std::min(deadline.remainingMs(100), 100));
  }
}

void Arrivals::drop(const Arrival& a, const char* why) const {
  LOOM_WARN(kNet, "%s: dropped a connection from %s: %s", what_.c_str(), a.from.c_str(), why);
}

}  // namespace loom
