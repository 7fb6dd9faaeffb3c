// tcp_ring_probe: how many bytes per second loopback TCP carries on this machine when N
// processes each send to the next and receive from the previous at once (or, with -d,
// each to and from every other), which is the traffic of a ring (or direct) all-reduce
// without its reduction work. An all-reduce of S bytes over N ranks moves at least
// 2(N-1)·S bytes in all, so the probe's total rate divided by N is the nccl-tests busbw
// (S/t · 2(N-1)/N) an all-reduce would reach if the sockets were all it did: a reference
// for "limited by the kernel's socket work", not a hard ceiling (the probe's waits and
// timing are its own; scripts/compare_ompi.sh runs it beside both libraries).
//
//   tcp_ring_probe [-n procs] [-b bytes per process and round] [-p bytes per send]
//                  [-w warm-up rounds] [-i timed rounds] [-d] [-s sockets per peer]
//
// With -s S each pair of neighbours is joined by S sockets, each moved by a thread of its
// own, the bytes split evenly among them: what loom's socket backend does with
// LOOM_SOCKET_NTHREADS x LOOM_NSOCKS_PERTHREAD = S (4 by default).
//
// Defaults: 4 processes, 12 MiB a round (what each rank sends in an 8 MiB all-reduce over
// 4 ranks), 128 KiB per send (loom's piece over sockets), 3 warm-up and 20 timed rounds.
// Prints one line: the total rate over all processes and that busbw ("busbw equivalent").
// Each process ends itself after 60 s (stuck in accept, say, or behind a peer that died),
// which fails the run, as any failing process does; the others are then stopped. The
// defaults take a second or two.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "tcp_ring_probe: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

struct Options {
  int procs = 4;
  size_t bytes = 12 << 20;
  size_t piece = 128 << 10;
  int warmup = 3;
  int iters = 20;
  bool direct = false;  // every process to every other, instead of a ring
  int socks = 1;        // sockets (and threads) per pair of neighbours
};

size_t parseSize(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || v < 0 || v > 1e15) {
    std::fprintf(stderr, "tcp_ring_probe: '%s' is not a size\n", s);
    std::exit(2);
  }
  switch (*end) {
    case 'K':
    case 'k': v *= 1024; break;
    case 'M':
    case 'm': v *= 1024 * 1024; break;
    case 'G':
    case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
  }
  return static_cast<size_t>(v);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-d") {
      o.direct = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "tcp_ring_probe: %s needs a value\n", a.c_str());
      std::exit(2);
    }
    const char* v = argv[++i];
    if (a == "-n")
      o.procs = std::atoi(v);
    else if (a == "-b")
      o.bytes = parseSize(v);
    else if (a == "-p")
      o.piece = parseSize(v);
    else if (a == "-w")
      o.warmup = std::atoi(v);
    else if (a == "-i")
      o.iters = std::atoi(v);
    else if (a == "-s")
      o.socks = std::atoi(v);
    else {
      std::fprintf(stderr, "tcp_ring_probe: unknown option %s (-n -b -p -w -i -d -s)\n", a.c_str());
      std::exit(2);
    }
  }
  if (o.procs < 2 || o.procs > 64 || o.bytes < size_t(o.procs) * size_t(o.socks) || o.piece == 0 ||
      o.iters < 1 || o.warmup < 0 || o.socks < 1 || o.socks > 16) {
    std::fprintf(stderr,
                 "tcp_ring_probe: need 2 <= -n <= 64, 1 <= -s <= 16, -b >= -n x -s, -p > 0, -i >= "
                 "1, -w >= 0\n");
    std::exit(2);
  }
  return o;
}

int listenLoopback(uint16_t* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) die("bind");
  if (listen(fd, 1024) != 0) die("listen");  // -d -s: up to 63 x 16 connections at once
  socklen_t len = sizeof(a);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) die("getsockname");
  *port = ntohs(a.sin_port);
  return fd;
}

int connectLoopback(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) die("connect");
  return fd;
}

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) die("fcntl");
}

// Sends `bytes` on each socket of `outs` while receiving as many on each of `ins`, in
// sends and receives of at most `piece` bytes from and into buffers of `piece` bytes (so
// they stay in cache, as a reducing all-reduce's do not: this is the kernel's share alone).
void exchange(const std::vector<int>& outs, const std::vector<int>& ins, size_t bytes, size_t piece,
              char* sbuf, char* rbuf) {
  std::vector<size_t> sent(outs.size(), 0), got(ins.size(), 0);
  int idle = 0;
  while (true) {
    bool moved = false, done = true;
    for (size_t k = 0; k < outs.size(); ++k) {
      if (sent[k] == bytes) continue;
      done = false;
      ssize_t r =
          send(outs[k], sbuf + sent[k] % piece, std::min(piece - sent[k] % piece, bytes - sent[k]),
               MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r > 0) {
        sent[k] += static_cast<size_t>(r);
        moved = true;
      } else if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        die("send");
      }
    }
    for (size_t k = 0; k < ins.size(); ++k) {
      if (got[k] == bytes) continue;
      done = false;
      ssize_t r = recv(ins[k], rbuf + got[k] % piece,
                       std::min(piece - got[k] % piece, bytes - got[k]), MSG_DONTWAIT);
      if (r > 0) {
        got[k] += static_cast<size_t>(r);
        moved = true;
      } else if (r == 0) {
        errno = ECONNRESET;
        die("recv (peer closed)");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        die("recv");
      }
    }
    if (done) return;
    if (moved) {
      idle = 0;
      continue;
    }
    // Nothing moved: yield the core to a rank that has work (with more processes than
    // cores, blocking at once leaves cores idle and every wake-up costs tens of
    // microseconds in a VM), and block in poll() only after a long wait.
    if (++idle < 10000) {
      sched_yield();
      continue;
    }
    std::vector<pollfd> fds;
    for (size_t k = 0; k < outs.size(); ++k) {
      if (sent[k] < bytes) fds.push_back({outs[k], POLLOUT, 0});
    }
    for (size_t k = 0; k < ins.size(); ++k) {
      if (got[k] < bytes) fds.push_back({ins[k], POLLIN, 0});
    }
    if (poll(fds.data(), fds.size(), 10000) == 0) {
      errno = ETIMEDOUT;
      die("no progress for 10 s");
    }
  }
}

// One rank: returns the seconds its timed rounds took. Each process sends o.bytes a round
// (a ring: all to the next; direct: o.bytes / (n - 1) to each other, rounded down, which
// bytesPerRound() counts).
double runRank(int rank, const Options& o, const std::vector<int>& listeners,
               const std::vector<uint16_t>& ports) {
  // Ring: connect to the next rank and accept the previous one. Direct: connect to every
  // other rank and accept as many (the listen backlogs make the order safe). -s: that
  // many connections to each.
  std::vector<int> outs, ins;
  const int n = o.procs;
  for (int q = 1; q < (o.direct ? n : 2); ++q)
    for (int k = 0; k < o.socks; ++k) outs.push_back(connectLoopback(ports[(rank + q) % n]));
  for (size_t k = 0; k < outs.size(); ++k) {
    int fd = accept(listeners[rank], nullptr, nullptr);
    if (fd < 0) die("accept");
    ins.push_back(fd);
  }
  for (int fd : outs) tune(fd);
  for (int fd : ins) tune(fd);
  // Every socket carries the same share, so each thread's receives match some senders'.
  const size_t bytes = o.bytes / outs.size();
  const int threads = o.socks;
  std::vector<std::vector<int>> tout(threads), tin(threads);
  for (size_t k = 0; k < outs.size(); ++k) tout[k % threads].push_back(outs[k]);
  for (size_t k = 0; k < ins.size(); ++k) tin[k % threads].push_back(ins[k]);
  std::vector<std::vector<char>> sbuf(threads, std::vector<char>(o.piece)),
      rbuf(threads, std::vector<char>(o.piece));
  for (auto& b : sbuf)
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(i * 131 + rank);
  auto round = [&](size_t each, size_t piece) {
    if (threads == 1) return exchange(outs, ins, each, piece, sbuf[0].data(), rbuf[0].data());
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back(
          [&, t] { exchange(tout[t], tin[t], each, piece, sbuf[t].data(), rbuf[t].data()); });
    for (auto& t : ts) t.join();
  };
  for (int w = 0; w < o.warmup; ++w) round(bytes, o.piece);
  // Start together: one byte on every connection.
  exchange(outs, ins, 1, 1, sbuf[0].data(), rbuf[0].data());
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.iters; ++i) round(bytes, o.piece);
  auto t1 = std::chrono::steady_clock::now();
  for (int fd : outs) close(fd);
  for (int fd : ins) close(fd);
  return std::chrono::duration<double>(t1 - t0).count();
}

// What one process sends a round.
size_t bytesPerRound(const Options& o) {
  const size_t conns = size_t(o.direct ? o.procs - 1 : 1) * size_t(o.socks);
  return o.bytes / conns * conns;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::vector<int> listeners(o.procs);
  std::vector<uint16_t> ports(o.procs);
  for (int r = 0; r < o.procs; ++r) listeners[r] = listenLoopback(&ports[r]);
  int pipefd[2];
  if (pipe(pipefd) != 0) die("pipe");
  std::vector<pid_t> kids;
  for (int r = 0; r < o.procs; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      for (pid_t k : kids) kill(k, SIGKILL);
      die("fork");
    }
    if (pid == 0) {
      alarm(60);  // SIGALRM ends a process that is stuck (in accept, say)
      close(pipefd[0]);
      for (int q = 0; q < o.procs; ++q) {
        if (q != r) close(listeners[q]);
      }
      double secs = runRank(r, o, listeners, ports);
      if (write(pipefd[1], &secs, sizeof(secs)) != sizeof(secs)) die("write");
      _exit(0);
    }
    kids.push_back(pid);
  }
  close(pipefd[1]);
  for (int fd : listeners) close(fd);
  // Wait for every process; the first that fails stops the others (their peers would
  // otherwise wait for it until their alarms).
  int failed = 0;
  for (size_t left = kids.size(); left > 0; --left) {
    int st = 0;
    pid_t k = waitpid(-1, &st, 0);
    if (k < 0) break;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      if (failed++ == 0) {
        for (pid_t other : kids) {
          if (other != k) kill(other, SIGKILL);
        }
      }
    }
  }
  // Every report is in the pipe by now (8 bytes each, far below its capacity).
  double slowest = 0;
  int reports = 0;
  double secs;
  while (read(pipefd[0], &secs, sizeof(secs)) == sizeof(secs)) {
    slowest = std::max(slowest, secs);
    ++reports;
  }
  if (failed || reports != o.procs) {
    std::fprintf(stderr, "tcp_ring_probe: %d of %d processes failed\n",
                 std::max(failed, o.procs - reports), o.procs);
    return 1;
  }
  const double total = double(bytesPerRound(o)) * o.iters * o.procs;
  const double gbs = total / slowest / 1e9;
  std::printf(
      "tcp_ring_probe: %d processes, %s, %d socket(s) and thread(s) per peer, %zu bytes each per "
      "round in sends of %zu, %d rounds: %.3f GB/s in all; all-reduce busbw equivalent %.3f "
      "GB/s\n",
      o.procs, o.direct ? "each to every other" : "a ring", o.socks, o.bytes, o.piece, o.iters, gbs,
      gbs / o.procs);
  return 0;
}
