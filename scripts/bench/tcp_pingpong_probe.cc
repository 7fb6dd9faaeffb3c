// tcp_pingpong_probe: the time of one small message over loopback TCP between two
// processes, both spinning on non-blocking sockets (what loom's proxy does): 8 bytes there
// and back, many times, and half the round trip printed as the one-way time. With
// TWO_SOCKETS=1 each direction has a connection of its own, as NCCL's and loom's network
// transports have it (which costs more, presumably because the receiver then acknowledges
// every message in a packet of its own, inside its recv() call, where with one connection
// the reply carries the acknowledgement).
//
//   c++ -O2 -std=c++17 -o tcp_pingpong_probe tcp_pingpong_probe.cc
//   tcp_pingpong_probe [ROUND_TRIPS [TWO_SOCKETS]]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

namespace {

bool move8(int fd, char* b, bool send) {
  size_t d = 0;
  while (d < 8) {
    const ssize_t n = send ? ::send(fd, b + d, 8 - d, MSG_DONTWAIT | MSG_NOSIGNAL)
                           : ::recv(fd, b + d, 8 - d, MSG_DONTWAIT);
    if (n > 0) d += static_cast<size_t>(n);
    if (n == 0) return false;
  }
  return true;
}

int nodelay(int fd) {
  const int one = 1;
  if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::max(1, std::atoi(argv[1])) : 100000;
  const bool two = argc > 2 && std::atoi(argv[2]) == 1;
  const int l = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 2) != 0 ||
      getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("tcp_pingpong_probe: listen");
    return 1;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    auto dial = [&] {
      const int fd = socket(AF_INET, SOCK_STREAM, 0);
      return connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 ? nodelay(fd) : -1;
    };
    const int in = dial();
    const int out = two ? dial() : in;
    if (in < 0 || out < 0) return 1;
    char b[8];
    for (int i = 0; i < iters + 1000; ++i) {
      if (!move8(in, b, false) || !move8(out, b, true)) return 1;
    }
    return 0;
  }
  const int out = nodelay(accept(l, nullptr, nullptr));  // the child's first: it reads there
  const int in = two ? nodelay(accept(l, nullptr, nullptr)) : out;
  if (out < 0 || in < 0) return 1;
  char b[8] = {1};
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters + 1000; ++i) {
    if (i == 1000) t0 = std::chrono::steady_clock::now();  // after 1000 of warm-up
    if (!move8(out, b, true) || !move8(in, b, false)) return 1;
  }
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
      iters;
  std::printf("tcp_pingpong_probe, %s: round trip %.2f us, one way %.2f us\n",
              two ? "a connection each way" : "one connection both ways", us, us / 2);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
