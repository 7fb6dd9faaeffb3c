// Open MPI's MPI_Allreduce (float, sum) timed the way nccl-tests times a collective, so its
// figures sit beside all_reduce_perf's. Built and run by scripts/compare_ompi.sh:
//
//   mpicxx -O2 -std=c++17 scripts/bench/ompi_allreduce.cc -o build/ompi_allreduce
//   mpirun -np 4 build/ompi_allreduce [-w WARMUP] [-n ITERS] SIZE_BYTES...
//
// For each size: WARMUP untimed calls, a barrier, ITERS timed calls, then one checked call.
// Time is the mean per call, averaged over ranks (nccl-tests' default, -a 1). algbw =
// bytes / time; busbw = algbw * 2(n-1)/n (nccl-tests' all-reduce bus factor). Prints one
// line per size on rank 0: "size count time_us algbw_GBs busbw_GBs wrong".
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

// Parses "8", "512K", "2M", "1G" (powers of 1024, as nccl-tests does).
bool parseSize(const char* text, size_t* out) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text) return false;
  switch (*end) {
    case 'K':
    case 'k':
      v <<= 10;
      ++end;
      break;
    case 'M':
    case 'm':
      v <<= 20;
      ++end;
      break;
    case 'G':
    case 'g':
      v <<= 30;
      ++end;
      break;
    default: break;
  }
  if (*end != '\0') return false;
  *out = static_cast<size_t>(v);
  return true;
}

// Per-rank, per-index values whose float sum is exact (small integers).
float valueOf(int rank, size_t i) {
  return static_cast<float>(rank + 1 + static_cast<int>(i % 7));
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  int nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);

  int warmup = 5;
  int iters = 20;
  std::vector<size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    if ((std::strcmp(argv[i], "-w") == 0 || std::strcmp(argv[i], "-n") == 0) && i + 1 < argc) {
      int v = std::atoi(argv[i + 1]);
      (argv[i][1] == 'w' ? warmup : iters) = v;
      ++i;
      continue;
    }
    size_t s = 0;
    if (!parseSize(argv[i], &s) || s < sizeof(float)) {
      if (rank == 0) std::fprintf(stderr, "ompi_allreduce: bad size '%s'\n", argv[i]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    sizes.push_back(s);
  }
  if (sizes.empty() || iters < 1 || warmup < 0) {
    if (rank == 0) {
      std::fprintf(stderr, "usage: ompi_allreduce [-w WARMUP] [-n ITERS] SIZE_BYTES...\n");
    }
    MPI_Finalize();
    return 2;
  }

  if (rank == 0) {
    std::printf("# ompi_allreduce: %d ranks, float sum, warmup %d, iters %d\n", nranks, warmup,
                iters);
    std::printf("# %12s %12s %12s %10s %10s %8s\n", "size(B)", "count", "time(us)", "algbw",
                "busbw", "#wrong");
  }
  int failures = 0;
  for (size_t bytes : sizes) {
    const size_t count = bytes / sizeof(float);
    std::vector<float> send(count);
    std::vector<float> recv(count, -1.0f);
    for (size_t i = 0; i < count; ++i) send[i] = valueOf(rank, i);
    const int n = static_cast<int>(count);  // all our sizes fit an int count

    for (int i = 0; i < warmup; ++i) {
      MPI_Allreduce(send.data(), recv.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) {
      MPI_Allreduce(send.data(), recv.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    const double mine = (MPI_Wtime() - t0) / iters;
    double sum = 0;
    MPI_Reduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);

    // One checked call on fresh output.
    std::fill(recv.begin(), recv.end(), -1.0f);
    MPI_Allreduce(send.data(), recv.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    long long wrong = 0;
    const float base = static_cast<float>(nranks * (nranks + 1) / 2);
    for (size_t i = 0; i < count; ++i) {
      if (recv[i] != base + static_cast<float>(nranks * static_cast<int>(i % 7))) ++wrong;
    }
    long long wrongAll = 0;
    MPI_Reduce(&wrong, &wrongAll, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);

    if (rank == 0) {
      const double sec = sum / nranks;
      const double algbw = static_cast<double>(count * sizeof(float)) / sec / 1e9;
      const double busbw = algbw * 2.0 * (nranks - 1) / nranks;
      std::printf("  %12zu %12zu %12.2f %10.3f %10.3f %8lld\n", count * sizeof(float), count,
                  sec * 1e6, algbw, busbw, wrongAll);
      std::fflush(stdout);
      if (wrongAll != 0) failures = 1;
    }
  }
  MPI_Bcast(&failures, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return failures;
}
