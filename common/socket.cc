#include "common/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "common/log.h"
#include "common/settings.h"

namespace loom {

uint16_t SocketAddress::port() const {
  if (u.sa.sa_family == AF_INET) return ntohs(u.v4.sin_port);
  if (u.sa.sa_family == AF_INET6) return ntohs(u.v6.sin6_port);
  return 0;
}

void SocketAddress::setPort(uint16_t port) {
  if (u.sa.sa_family == AF_INET) u.v4.sin_port = htons(port);
  if (u.sa.sa_family == AF_INET6) u.v6.sin6_port = htons(port);
}

bool SocketAddress::isLoopback() const {
  if (u.sa.sa_family == AF_INET) return (ntohl(u.v4.sin_addr.s_addr) >> 24) == 127;
  if (u.sa.sa_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&u.v6.sin6_addr);
  return false;
}

std::string SocketAddress::toString() const {
  char host[INET6_ADDRSTRLEN + IF_NAMESIZE + 2] = {0};
  if (u.sa.sa_family == AF_INET) {
    inet_ntop(AF_INET, &u.v4.sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(port());
  }
  if (u.sa.sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &u.v6.sin6_addr, host, sizeof(host));
    std::string h = host;
    if (u.v6.sin6_scope_id != 0) {
      char ifname[IF_NAMESIZE] = {0};
      if (if_indextoname(u.v6.sin6_scope_id, ifname)) h += std::string("%") + ifname;
    }
    return "[" + h + "]:" + std::to_string(port());
  }
  return "<invalid address>";
}

Result<SocketAddress> SocketAddress::parse(const std::string& text) {
  std::string host;
  std::string port = "0";
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos) {
      return errorf(Code::kInvalidArgument, "address '%s' has '[' without ']'", text.c_str());
    }
    host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') {
        return errorf(Code::kInvalidArgument, "address '%s': expected ':' after ']'", text.c_str());
      }
      port = text.substr(close + 2);
    }
  } else {
    size_t colon = text.rfind(':');
    if (colon != std::string::npos && text.find(':') == colon) {
      host = text.substr(0, colon);
      port = text.substr(colon + 1);
    } else {
      host = text;  // bare IPv6 (several colons) or a name without a port
    }
  }
  char* end = nullptr;
  long p = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p < 0 || p > 65535) {
    return errorf(Code::kInvalidArgument, "address '%s': bad port '%s'", text.c_str(),
                  port.c_str());
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) {
    return errorf(Code::kInvalidArgument, "address '%s': cannot resolve '%s': %s", text.c_str(),
                  host.c_str(), gai_strerror(rc));
  }
  SocketAddress a;
  std::memcpy(&a.u, res->ai_addr, std::min<size_t>(res->ai_addrlen, sizeof(a.u)));
  freeaddrinfo(res);
  a.setPort(static_cast<uint16_t>(p));
  return a;
}

int interfaceSpeedMbps(const std::string& name) {
  std::ifstream speed("/sys/class/net/" + name + "/speed");
  int mbps = 0;
  return speed >> mbps && mbps > 0 ? mbps : 0;
}

bool matchInterface(const std::string& filter, const std::string& name) {
  if (filter.empty()) return true;
  std::string f = filter;
  bool exclude = false;
  if (f[0] == '^') {
    exclude = true;
    f = f.substr(1);
  }
  bool exact = false;
  if (!f.empty() && f[0] == '=') {
    exact = true;
    f = f.substr(1);
  }
  bool matched = false;
  size_t pos = 0;
  while (pos <= f.size()) {
    size_t comma = f.find(',', pos);
    std::string tok = f.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!tok.empty()) {
      if (exact ? name == tok : name.compare(0, tok.size(), tok) == 0) matched = true;
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return exclude ? !matched : matched;
}

namespace {
bool isVirtualDefaultExcluded(const std::string& name) {
  return name.rfind("docker", 0) == 0 || name.rfind("virbr", 0) == 0 || name.rfind("br-", 0) == 0;
}
}  // namespace

Result<std::vector<NetInterface>> findInterfaces(const std::string& filter,
                                                 const std::string& family) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return sysError(errno, "getifaddrs");
  int wantFamily = AF_UNSPEC;
  if (family == "AF_INET" || family == "4") wantFamily = AF_INET;
  if (family == "AF_INET6" || family == "6") wantFamily = AF_INET6;
  std::vector<NetInterface> chosen;
  std::vector<NetInterface> loopbacks;
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr) continue;
    int fam = it->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (wantFamily != AF_UNSPEC && fam != wantFamily) continue;
    if (!(it->ifa_flags & IFF_UP)) continue;
    NetInterface ni;
    ni.name = it->ifa_name;
    std::memcpy(&ni.address.u, it->ifa_addr,
                fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    ni.loopback = (it->ifa_flags & IFF_LOOPBACK) != 0;
    // Link-local IPv6 needs a scope; keep them, but after global ones.
    if (!filter.empty()) {
      if (matchInterface(filter, ni.name)) chosen.push_back(ni);
      continue;
    }
    if (ni.loopback) {
      loopbacks.push_back(ni);
    } else if (!isVirtualDefaultExcluded(ni.name)) {
      chosen.push_back(ni);
    }
  }
  freeifaddrs(list);
  auto rank = [](const NetInterface& n) {
    // IPv4 first, then global IPv6, then link-local IPv6.
    if (n.address.u.sa.sa_family == AF_INET) return 0;
    if (IN6_IS_ADDR_LINKLOCAL(&n.address.u.v6.sin6_addr)) return 2;
    return 1;
  };
  std::stable_sort(chosen.begin(), chosen.end(),
                   [&](const NetInterface& a, const NetInterface& b) { return rank(a) < rank(b); });
  if (chosen.empty() && filter.empty()) chosen = loopbacks;
  if (chosen.empty()) {
    return errorf(Code::kSystemError,
                  "no network interface matches LOOM_SOCKET_IFNAME='%s'%s%s; "
                  "set it to one of the names `ip addr` shows",
                  filter.c_str(), family.empty() ? "" : " and family ", family.c_str());
  }
  return chosen;
}

Result<std::vector<NetInterface>> findInterfacesFromSettings() {
  const std::string family = settings::get(settings::kSocketFamily);
  return findInterfaces(settings::get(settings::kSocketIfname), family == "auto" ? "" : family);
}

Result<NetInterface> findInterfaceMatching(const SocketAddress& remote) {
  // A loopback root: every rank is on this host and loopback serves.
  if (remote.isLoopback()) {
    NetInterface lo;
    lo.name = "lo";
    lo.loopback = true;
    lo.address = remote;
    lo.address.setPort(0);
    return lo;
  }
  LOOM_ASSIGN_OR_RETURN(auto list, findInterfacesFromSettings());
  // Otherwise the first interface whose subnet holds the remote address.
  ifaddrs* ifl = nullptr;
  if (getifaddrs(&ifl) == 0) {
    for (ifaddrs* it = ifl; it; it = it->ifa_next) {
      if (!it->ifa_addr || !it->ifa_netmask) continue;
      if (it->ifa_addr->sa_family != AF_INET || remote.u.sa.sa_family != AF_INET) continue;
      uint32_t a = reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr.s_addr;
      uint32_t m = reinterpret_cast<sockaddr_in*>(it->ifa_netmask)->sin_addr.s_addr;
      if ((a & m) == (remote.u.v4.sin_addr.s_addr & m)) {
        for (const auto& n : list) {
          if (n.name == it->ifa_name && n.address.u.sa.sa_family == AF_INET) {
            freeifaddrs(ifl);
            return n;
          }
        }
      }
    }
    freeifaddrs(ifl);
  }
  for (const auto& n : list) {
    if (n.address.u.sa.sa_family == remote.u.sa.sa_family) return n;
  }
  return list.front();
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void Socket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Result<Socket> Socket::listen(const SocketAddress& address, int backlog) {
  int fd = ::socket(address.u.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return sysError(errno, "socket()");
  Socket s(fd);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, &address.u.sa, address.length()) != 0) {
    return sysError(errno, "bind to %s", address.toString().c_str());
  }
  if (::listen(fd, backlog) != 0)
    return sysError(errno, "listen on %s", address.toString().c_str());
  LOOM_TRY(s.setNonBlocking(true));
  return s;
}

Result<Socket> Socket::connect(const SocketAddress& address, const Deadline& deadline,
                               bool retryRefused) {
  int backoffMs = 1;
  while (true) {
    int fd = ::socket(address.u.sa.sa_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return sysError(errno, "socket()");
    Socket s(fd);
    int rc = ::connect(fd, &address.u.sa, address.length());
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      while (true) {
        pollfd p{fd, POLLOUT, 0};
        int prc = ::poll(&p, 1, std::min(deadline.remainingMs(100), 100));
        if (prc > 0) break;
        if (prc < 0 && errno != EINTR) return sysError(errno, "poll while connecting");
        if (deadline.aborted())
          return errorf(Code::kSystemError, "connect to %s aborted", address.toString().c_str());
        if (deadline.expired()) {
          return errorf(Code::kSystemError, "connect to %s timed out after %lld ms",
                        address.toString().c_str(), (long long)deadline.totalMs());
        }
      }
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err == 0) {
      s.setNoDelay();
      return s;
    }
    if (err == ECONNREFUSED && !retryRefused) {
      return Status(Code::kRemoteError,
                    sysError(err, "connect to %s", address.toString().c_str()).message());
    }
    bool retryable = err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH ||
                     err == EHOSTUNREACH || err == ECONNRESET || err == EAGAIN;
    if (!retryable) return sysError(err, "connect to %s", address.toString().c_str());
    if (deadline.aborted()) {
      return errorf(Code::kSystemError, "connect to %s aborted", address.toString().c_str());
    }
    if (deadline.expired()) {
      return sysError(err, "connect to %s: still failing after %lld ms", address.toString().c_str(),
                      (long long)deadline.totalMs());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(backoffMs));
    backoffMs = std::min(backoffMs * 2, 100);
  }
}

Result<Socket> Socket::accept(const Deadline& deadline) {
  while (true) {
    int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      Socket s(fd);
      s.setNoDelay();
      return s;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
      return sysError(errno, "accept");
    }
    if (deadline.aborted()) return errorf(Code::kSystemError, "accept aborted");
    if (deadline.expired()) {
      return errorf(Code::kSystemError, "no connection arrived within %lld ms",
                    (long long)deadline.totalMs());
    }
    pollfd p{fd_, POLLIN, 0};
    ::poll(&p, 1, std::min(deadline.remainingMs(100), 100));
  }
}

Result<SocketAddress> Socket::localAddress() const {
  SocketAddress a;
  socklen_t len = sizeof(a.u);
  if (getsockname(fd_, &a.u.sa, &len) != 0) return sysError(errno, "getsockname");
  return a;
}

Result<SocketAddress> Socket::peerAddress() const {
  SocketAddress a;
  socklen_t len = sizeof(a.u);
  if (getpeername(fd_, &a.u.sa, &len) != 0) return sysError(errno, "getpeername");
  return a;
}

Result<size_t> Socket::sendSome(const void* data, size_t bytes, const char* what) {
  while (true) {
    ssize_t n = ::send(fd_, data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<size_t>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return Status(errno == EPIPE || errno == ECONNRESET ? Code::kRemoteError : Code::kSystemError,
                  sysError(errno, "send to %s", what).message());
  }
}

Result<size_t> Socket::recvSome(void* data, size_t bytes, const char* what) {
  while (true) {
    ssize_t n = ::recv(fd_, data, bytes, MSG_DONTWAIT);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) {
      if (bytes == 0) return size_t{0};
      return errorf(Code::kRemoteError, "%s closed the connection", what);
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    return Status(errno == ECONNRESET ? Code::kRemoteError : Code::kSystemError,
                  sysError(errno, "recv from %s", what).message());
  }
}

namespace {
Status waitFd(int fd, short events, const Deadline& deadline, const char* verb, const char* what,
              size_t done, size_t total) {
  if (deadline.aborted()) {
    return errorf(Code::kSystemError, "%s %s aborted", verb, what);
  }
  if (deadline.expired()) {
    return errorf(Code::kSystemError, "%s %s timed out after %lld ms (%zu of %zu bytes done)", verb,
                  what, (long long)deadline.totalMs(), done, total);
  }
  pollfd p{fd, events, 0};
  ::poll(&p, 1, std::min(deadline.remainingMs(100), 100));
  return Status::ok();
}
}  // namespace

Status Socket::sendAll(const void* data, size_t bytes, const Deadline& deadline, const char* what) {
  const char* p = static_cast<const char*>(data);
  size_t done = 0;
  while (done < bytes) {
    LOOM_ASSIGN_OR_RETURN(size_t n, sendSome(p + done, bytes - done, what));
    done += n;
    if (n == 0) LOOM_TRY(waitFd(fd_, POLLOUT, deadline, "sending to", what, done, bytes));
  }
  return Status::ok();
}

Status Socket::recvAll(void* data, size_t bytes, const Deadline& deadline, const char* what) {
  char* p = static_cast<char*>(data);
  size_t done = 0;
  while (done < bytes) {
    LOOM_ASSIGN_OR_RETURN(size_t n, recvSome(p + done, bytes - done, what));
    done += n;
    if (n == 0) LOOM_TRY(waitFd(fd_, POLLIN, deadline, "receiving from", what, done, bytes));
  }
  return Status::ok();
}

Status Socket::setNonBlocking(bool on) {
  int flags = fcntl(fd_, F_GETFL);
  if (flags < 0) return sysError(errno, "fcntl(F_GETFL)");
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (fcntl(fd_, F_SETFL, flags) != 0) return sysError(errno, "fcntl(F_SETFL)");
  return Status::ok();
}

void Socket::setNoDelay() {
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void Socket::setKeepAlive(int64_t withinMs) {
  const int one = 1;
  const int count = 3;
  // Idle time and probe interval alike: the first probe after `step`, failure after
  // three more unanswered ones, so about 4 × step in all.
  const int step = static_cast<int>(std::clamp<int64_t>(withinMs / 4000, 1, 30));
  const unsigned userTimeout = static_cast<unsigned>(std::clamp<int64_t>(withinMs, 1000, 600000));
  setsockopt(fd_, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd_, IPPROTO_TCP, TCP_KEEPIDLE, &step, sizeof(step));
  setsockopt(fd_, IPPROTO_TCP, TCP_KEEPINTVL, &step, sizeof(step));
  setsockopt(fd_, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
  setsockopt(fd_, IPPROTO_TCP, TCP_USER_TIMEOUT, &userTimeout, sizeof(userTimeout));
}

void Socket::setBufferSizes(int bytes) {
  setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

}  // namespace loom
