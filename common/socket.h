// TCP sockets with a deadline on every blocking step, IPv4 and IPv6, and interface
// selection with NCCL's NCCL_SOCKET_IFNAME syntax.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace loom {

// An IPv4 or IPv6 address and port; trivially copyable so it travels in ids and
// bootstrap messages.
struct SocketAddress {
  union {
    sockaddr sa;
    sockaddr_in v4;
    sockaddr_in6 v6;
  } u{};

  bool valid() const { return u.sa.sa_family == AF_INET || u.sa.sa_family == AF_INET6; }
  socklen_t length() const {
    return u.sa.sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  }
  uint16_t port() const;
  void setPort(uint16_t port);
  bool isLoopback() const;
  // "10.0.0.1:5000" or "[fe80::1%eth0]:5000".
  std::string toString() const;
  // Parses "host:port", "[v6]:port" or "v6" forms; resolves names with getaddrinfo.
  static Result<SocketAddress> parse(const std::string& text);
};
static_assert(sizeof(SocketAddress) == 28);

struct NetInterface {
  std::string name;
  SocketAddress address;  // port 0
  bool loopback = false;
};

// Filter in NCCL's syntax: "eth,ib" prefixes; "^docker,lo" excludes prefixes; "=eth0"
// exact names ("^=" exact exclusions). Empty: any but loopback and docker/virtual
// bridges, falling back to loopback when nothing else exists.
bool matchInterface(const std::string& filter, const std::string& name);
// The link speed sysfs gives for interface `name` (/sys/class/net/NAME/speed), in Mb/s; 0
// when it says nothing (loopback, many virtual NICs) or cannot be read.
int interfaceSpeedMbps(const std::string& name);
// What an interface whose speed sysfs does not give is planned as: 10 Gb/s.
inline constexpr int kUnknownLinkMbps = 10000;
// All interfaces with an address, after the filter (LOOM_SOCKET_IFNAME) and the family
// (LOOM_SOCKET_FAMILY), best first. Never empty unless the machine has no interfaces
// at all (then an error naming the filter).
Result<std::vector<NetInterface>> findInterfaces(const std::string& filter,
                                                 const std::string& family);
// The interface addresses from the current settings.
Result<std::vector<NetInterface>> findInterfacesFromSettings();
// The interface whose subnet holds `remote` (else the first from the settings).
Result<NetInterface> findInterfaceMatching(const SocketAddress& remote);

// An owned socket file descriptor.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool isOpen() const { return fd_ >= 0; }
  void close();
  // Half-closes both directions so a peer blocked in recv sees EOF (abort path).
  void shutdown();

  // Listens on `address` (port 0 picks one); the bound address is returned by
  // localAddress().
  static Result<Socket> listen(const SocketAddress& address, int backlog = 4096);
  // Connects, retrying refused/unreachable connections until the deadline. With
  // `retryRefused` false a refused connection fails at once (kRemoteError): for a listener
  // known to exist, a refusal means its process is gone.
  static Result<Socket> connect(const SocketAddress& address, const Deadline& deadline,
                                bool retryRefused = true);
  // Waits for one connection.
  Result<Socket> accept(const Deadline& deadline);

  Result<SocketAddress> localAddress() const;
  Result<SocketAddress> peerAddress() const;

  // Sends/receives exactly `bytes`, or fails at the deadline, on EOF or on error.
  // `what` names the peer in messages ("rank 3").
  Status sendAll(const void* data, size_t bytes, const Deadline& deadline,
                 const char* what = "peer");
  Status recvAll(void* data, size_t bytes, const Deadline& deadline, const char* what = "peer");

  // Non-blocking helpers for progress loops: bytes moved (0 when it would block), or
  // an error (EOF included).
  Result<size_t> sendSome(const void* data, size_t bytes, const char* what = "peer");
  Result<size_t> recvSome(void* data, size_t bytes, const char* what = "peer");

  Status setNonBlocking(bool on);
  void setNoDelay();
  void setBufferSizes(int bytes);
  // A peer host that stops answering (powered off, cut off) breaks the connection within
  // about `withinMs` even while no data flows: TCP keepalive probes, and a cap on how long
  // sent bytes may stay unacknowledged.
  void setKeepAlive(int64_t withinMs);

 private:
  int fd_ = -1;
};

}  // namespace loom
