// gpu_exchange_probe: the floor under a small exchange of GPU buffers between two processes
// as two hosts: the shape of a 2-host all-gather of a few bytes with nothing of a library
// in it. Each process launches one kernel per iteration on its stream; the kernel writes
// an 8-byte tag into page-locked host memory it maps and spins until the peer's tag
// arrives in another such word. A host thread of each process sends its kernel's tag to the
// peer over loopback TCP and writes the peer's where its kernel polls. Each iteration: a
// launch, a GPU-to-host store, a TCP hop, a host-to-GPU store and the kernel's end.
//
//   nvcc -O2 -arch=sm_90 -std=c++17 -o gpu_exchange_probe gpu_exchange_probe.cu
//   gpu_exchange_probe [ITERATIONS [TWO_SOCKETS]]
//
// Prints microseconds per iteration as each process saw it, with plain launches and with
// programmatic dependent launch, three rounds each. TWO_SOCKETS=1: each direction on a
// TCP connection of its own (as NCCL's and loom's network transports have it), instead of
// one connection for both. Run it under CUDA MPS (both processes share GPU 0; without MPS
// their kernels take turns in time slices and an iteration takes milliseconds).
#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {

__global__ void step(volatile unsigned long long* out, volatile unsigned long long* in,
                     unsigned long long tag, int pdl) {
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x == 0) {
    *out = tag;
    while (*in != tag) {
    }
  }
  __syncthreads();
}

// Moves 8 bytes on a non-blocking path, spinning; false when the peer closed.
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

int run(int sendFd, int recvFd, const char* who, int iters) {
  unsigned long long *out = nullptr, *in = nullptr;
  if (cudaHostAlloc(&out, 64, cudaHostAllocMapped) != cudaSuccess ||
      cudaHostAlloc(&in, 64, cudaHostAllocMapped) != cudaSuccess) {
    std::fprintf(stderr, "%s: cudaHostAlloc failed (no GPU?)\n", who);
    return 1;
  }
  *reinterpret_cast<volatile unsigned long long*>(out) = 0;
  *reinterpret_cast<volatile unsigned long long*>(in) = 0;
  std::atomic<bool> stop{false};
  std::thread relay([&] {
    unsigned long long last = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      unsigned long long v = *reinterpret_cast<volatile unsigned long long*>(out);
      if (v == last) continue;
      last = v;
      unsigned long long theirs = 0;
      if (!move8(sendFd, reinterpret_cast<char*>(&v), true) ||
          !move8(recvFd, reinterpret_cast<char*>(&theirs), false))
        return;
      *reinterpret_cast<volatile unsigned long long*>(in) = theirs;
    }
  });
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  unsigned long long tag = 0;
  for (int pdl = 0; pdl < 2; ++pdl) {
    for (int round = 0; round < 3; ++round) {
      for (int timed = 0; timed < 2; ++timed) {  // 500 calls of warm-up, then the timed ones
        const int n = timed ? iters : 500;
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < n; ++i) {
          cudaLaunchConfig_t cfg = {};
          cfg.gridDim = dim3(1);
          cfg.blockDim = dim3(256);
          cfg.stream = s;
          cudaLaunchAttribute attr[1];
          attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
          attr[0].val.programmaticStreamSerializationAllowed = 1;
          cfg.attrs = attr;
          cfg.numAttrs = pdl;
          cudaLaunchKernelEx(&cfg, step, reinterpret_cast<volatile unsigned long long*>(out),
                             reinterpret_cast<volatile unsigned long long*>(in), ++tag, pdl);
        }
        cudaStreamSynchronize(s);
        const double us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count() /
            n;
        if (timed) {
          std::printf("%s: %s launches, round %d: %.2f us an iteration (%s)\n", who,
                      pdl ? "PDL" : "plain", round, us, cudaGetErrorString(cudaGetLastError()));
          std::fflush(stdout);
        }
      }
    }
  }
  stop = true;
  relay.join();
  return 0;
}

int dial(const sockaddr_in& a) {
  const int one = 1;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) return -1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int take(int listener) {
  const int one = 1;
  const int fd = accept(listener, nullptr, nullptr);
  if (fd >= 0) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5000;
  const bool two = argc > 2 && std::atoi(argv[2]) == 1;
  std::printf("gpu_exchange_probe: %d iterations, %s\n", iters,
              two ? "a TCP connection each way" : "one TCP connection both ways");
  std::fflush(stdout);
  const int l = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 2) != 0 ||
      getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("gpu_exchange_probe: listen");
    return 1;
  }
  // Connections before the fork's CUDA work: each process then sets up its own context.
  const pid_t pid = fork();
  if (pid == 0) {
    const int c = dial(a);
    const int c2 = two ? dial(a) : c;
    if (c < 0 || c2 < 0) return 1;
    return run(c, c2, "B", iters);
  }
  const int s = take(l);             // B's first connection: B sends on it
  const int s2 = two ? take(l) : s;  // B's second: A sends on it
  if (s < 0 || s2 < 0) return 1;
  const int rc = run(s2, s, "A", iters);
  int status = 0;
  waitpid(pid, &status, 0);
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}
