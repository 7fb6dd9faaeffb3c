// gpu_staging_probe: how fast a kernel moves bytes between GPU memory and page-locked host
// memory mapped into the GPU, the way the network executor's kernels fill and drain FIFO
// slots that live in host memory (the socket and ucx backends' path for GPU buffers). The
// cost model's staging term (docs/cost-model.md) takes its rate from here.
//
// For each block count (of 512 threads, 16-byte loads and stores) and piece size it prints
// the GB/s of device -> host (the send side: slots written), host -> device (the receive
// side: slots read) and both at once on two streams, and, for reference, the copy engines'
// cudaMemcpyAsync rates. Run several at once (processes sharing one GPU, under MPS) to see
// how one GPU's link divides among them.
//
//   gpu_staging_probe [--blocks 1,4,16] [--pieces 262144,1048576] [--total BYTES]
//                     [--rounds R] [--at UNIX_SECONDS] [--csv]
// --at: set up, then wait for that time before measuring (processes started together then
// measure together).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

#define CHECK(x)                                                                       \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "gpu_staging_probe: %s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

// Copies `pieces` pieces of `piece` bytes from src to dst, piece after piece, the blocks
// sharing each (as the executor streams a step, without its per-piece fence and post).
__global__ void __launch_bounds__(512)
    copyPieces(uint4* dst, const uint4* src, size_t piece, int pieces) {
  const size_t words = piece / sizeof(uint4);
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  for (int p = 0; p < pieces; ++p) {
    const uint4* s = src + size_t(p) * words;
    uint4* d = dst + size_t(p) * words;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < words; i += stride)
      d[i] = s[i];
  }
}

std::vector<size_t> parseList(const char* text) {
  std::vector<size_t> out;
  std::string s = text;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    const std::string item =
        s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (!item.empty()) out.push_back(std::strtoull(item.c_str(), nullptr, 10));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

struct Buffers {
  void* dev = nullptr;
  void* devIn = nullptr;
  void* host = nullptr;     // page-locked, mapped: the slots
  void* hostDev = nullptr;  // its device address
  void* hostIn = nullptr;
  void* hostInDev = nullptr;
};

// Seconds for `reps` rounds of fn(stream) on each of `streams` at once.
template <typename F>
double timed(const std::vector<cudaStream_t>& streams, int reps, F fn) {
  for (cudaStream_t s : streams) fn(s, 0);  // warm
  CHECK(cudaDeviceSynchronize());
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r)
    for (size_t k = 0; k < streams.size(); ++k) fn(streams[k], int(k));
  CHECK(cudaDeviceSynchronize());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> blocks = {1, 2, 4, 8, 16};
  std::vector<size_t> pieces = {256 << 10, 1 << 20};
  size_t total = 64 << 20;
  int reps = 5;
  double at = 0;
  bool csv = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--blocks" && i + 1 < argc) {
      blocks = parseList(argv[++i]);
    } else if (a == "--pieces" && i + 1 < argc) {
      pieces = parseList(argv[++i]);
    } else if (a == "--total" && i + 1 < argc) {
      total = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--rounds" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--at" && i + 1 < argc) {
      at = std::atof(argv[++i]);
    } else if (a == "--csv") {
      csv = true;
    } else {
      std::fprintf(stderr,
                   "usage: gpu_staging_probe [--blocks 1,4,16] [--pieces 262144,1048576] "
                   "[--total BYTES] [--rounds R] [--at UNIX_SECONDS] [--csv]\n");
      return 2;
    }
  }
  total = std::max<size_t>(total / 16 * 16, 16);
  for (size_t& p : pieces) {
    p = std::max<size_t>(16, p / 16 * 16);
    if (p > total) {
      std::fprintf(stderr, "gpu_staging_probe: a piece of %zu bytes is more than --total %zu\n", p,
                   total);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "gpu_staging_probe: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  Buffers b;
  CHECK(cudaMalloc(&b.dev, total));
  CHECK(cudaMalloc(&b.devIn, total));
  CHECK(cudaHostAlloc(&b.host, total, cudaHostAllocMapped));
  CHECK(cudaHostAlloc(&b.hostIn, total, cudaHostAllocMapped));
  CHECK(cudaHostGetDevicePointer(&b.hostDev, b.host, 0));
  CHECK(cudaHostGetDevicePointer(&b.hostInDev, b.hostIn, 0));
  CHECK(cudaMemset(b.dev, 0x5a, total));
  CHECK(cudaMemset(b.devIn, 0x3c, total));
  std::memset(b.host, 0x11, total);
  std::memset(b.hostIn, 0x22, total);
  std::vector<cudaStream_t> two(2);
  for (auto& s : two) CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const std::vector<cudaStream_t> one = {two[0]};
  if (at > 0) {
    const double now =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    if (at > now) std::this_thread::sleep_for(std::chrono::duration<double>(at - now));
  }
  const double gb = double(total) * reps / 1e9;
  if (csv) {
    std::printf("device,blocks,piece,d2h_gbps,h2d_gbps,both_each_gbps\n");
  } else {
    std::printf("# %s; %zu MiB each way per round, %d rounds; GB/s\n", prop.name, total >> 20,
                reps);
    std::printf("# %6s %10s %10s %10s %14s\n", "blocks", "piece", "dev->host", "host->dev",
                "both, each");
  }
  for (size_t piece : pieces) {
    const int n = int(std::min<size_t>(total / piece, 1 << 30));
    const double pieceGb = double(n) * piece * reps / 1e9;  // what each round moves
    for (size_t nb : blocks) {
      const unsigned grid = unsigned(std::max<size_t>(1, nb));
      auto d2h = [&](cudaStream_t s, int) {
        copyPieces<<<grid, 512, 0, s>>>(static_cast<uint4*>(b.hostDev),
                                        static_cast<const uint4*>(b.dev), piece, n);
      };
      auto h2d = [&](cudaStream_t s, int) {
        copyPieces<<<grid, 512, 0, s>>>(static_cast<uint4*>(b.devIn),
                                        static_cast<const uint4*>(b.hostInDev), piece, n);
      };
      const double tOut = timed(one, reps, d2h);
      const double tIn = timed(one, reps, h2d);
      const double tBoth =
          timed(two, reps, [&](cudaStream_t s, int k) { k == 0 ? d2h(s, 0) : h2d(s, 0); });
      CHECK(cudaGetLastError());
      if (csv) {
        std::printf("%s,%zu,%zu,%.2f,%.2f,%.2f\n", prop.name, nb, piece, pieceGb / tOut,
                    pieceGb / tIn, pieceGb / tBoth);
      } else {
        std::printf("  %6zu %10zu %10.2f %10.2f %14.2f\n", nb, piece, pieceGb / tOut, pieceGb / tIn,
                    pieceGb / tBoth);
      }
    }
  }
  // The copy engines, for reference.
  const double tOut = timed(one, reps, [&](cudaStream_t s, int) {
    CHECK(cudaMemcpyAsync(b.host, b.dev, total, cudaMemcpyDeviceToHost, s));
  });
  const double tIn = timed(one, reps, [&](cudaStream_t s, int) {
    CHECK(cudaMemcpyAsync(b.devIn, b.hostIn, total, cudaMemcpyHostToDevice, s));
  });
  // (A comment line in --csv too: the rates beside the table.)
  std::printf("# copy engines (cudaMemcpyAsync): dev->host %.2f, host->dev %.2f\n", gb / tOut,
              gb / tIn);
  for (auto& s : two) cudaStreamDestroy(s);
  cudaFreeHost(b.host);
  cudaFreeHost(b.hostIn);
  cudaFree(b.dev);
  cudaFree(b.devIn);
  return 0;
}
