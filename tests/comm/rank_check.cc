// One rank of a multi-process check, launched by a script or a launcher (netns_test.sh,
// mpirun): makes its communicator with loomCommInitFromEnv, runs all-reduce (small and
// large), all-gather and a send/recv ring on known data, and exits 0 when all are right.
#include <loom/launch.h>
#include <nccl.h>

#include <cstdio>
#include <vector>

namespace {

int fail(const char* what, ncclComm_t comm, int rank) {
  std::fprintf(stderr, "rank %d: %s failed: %s\n", rank, what, ncclGetLastError(comm));
  return 1;
}

}  // namespace

int main() {
  ncclComm_t comm;
  if (loomCommInitFromEnv(&comm) != ncclSuccess) return fail("init", nullptr, -1);
  int rank = 0, n = 0;
  ncclCommUserRank(comm, &rank);
  ncclCommCount(comm, &n);
  for (size_t count : {size_t{3}, size_t{2000003}}) {
    std::vector<double> in(count), out(count, -1);
    for (size_t i = 0; i < count; ++i) in[i] = rank + static_cast<double>(i % 1009);
    if (ncclAllReduce(in.data(), out.data(), count, ncclFloat64, ncclSum, comm, nullptr)) {
      return fail("all-reduce", comm, rank);
    }
    for (size_t i = 0; i < count; ++i) {
      if (out[i] != n * (n - 1) / 2.0 + n * static_cast<double>(i % 1009)) {
        std::fprintf(stderr, "rank %d: all-reduce element %zu wrong\n", rank, i);
        return 1;
      }
    }
  }
  const size_t count = 300007;
  std::vector<int> mine(count), all(count * n), got(count);
  for (size_t i = 0; i < count; ++i) mine[i] = rank * 1000003 + static_cast<int>(i);
  if (ncclAllGather(mine.data(), all.data(), count, ncclInt32, comm, nullptr)) {
    return fail("all-gather", comm, rank);
  }
  for (int q = 0; q < n; ++q) {
    for (size_t i = 0; i < count; ++i) {
      if (all[q * count + i] != q * 1000003 + static_cast<int>(i)) {
        std::fprintf(stderr, "rank %d: all-gather block %d wrong\n", rank, q);
        return 1;
      }
    }
  }
  ncclGroupStart();
  ncclSend(mine.data(), count, ncclInt32, (rank + 1) % n, comm, nullptr);
  ncclRecv(got.data(), count, ncclInt32, (rank + n - 1) % n, comm, nullptr);
  if (ncclGroupEnd()) return fail("send/recv", comm, rank);
  for (size_t i = 0; i < count; ++i) {
    if (got[i] != ((rank + n - 1) % n) * 1000003 + static_cast<int>(i)) {
      std::fprintf(stderr, "rank %d: send/recv wrong\n", rank);
      return 1;
    }
  }
  ncclCommDestroy(comm);
  std::printf("rank %d of %d: all checks passed\n", rank, n);
  return 0;
}
