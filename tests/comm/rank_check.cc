// One rank of a multi-process check, launched by a script or a launcher (netns_test.sh,
// mpirun): makes its communicator with loomCommInitFromEnv, runs all-reduce (small and
// large, and an in-place average that must be bitwise the same on every rank), all-gather,
// reduce-scatter (out of place, and in place with ncclAvg), reduce and a send/recv ring on
// known data, and exits 0 when all are right.
// With `--loop SECONDS` it then keeps checking all-reduces of 1 MiB for that long (a peer
// can be killed meanwhile: the failure is printed with loom's message, exit 1); with
// `--stagger-ms MS` as well, rank 0 sleeps MS before every 100th of them, so that the
// others wait on it that long. With `--shrink-excluding R` as well, a rank whose loop fails
// (rank R was killed meanwhile) makes a communicator of the others with ncclCommShrink
// (NCCL_SHRINK_ABORT), checks an all-reduce on it and exits 0 when that is right; with
// `--revoke 1`, it revokes the communicator first (ncclCommRevoke, then
// ncclCommGetAsyncError must say ncclSuccess) and shrinks it with NCCL_SHRINK_DEFAULT.
#include <loom/launch.h>
#include <nccl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

int fail(const char* what, ncclComm_t comm, int rank) {
  std::fprintf(stderr, "rank %d: %s failed: %s\n", rank, what, ncclGetLastError(comm));
  return 1;
}

}  // namespace

// All-reduces of a known pattern for `seconds`; 0 when every one was right.
int loop(ncclComm_t comm, int rank, int n, double seconds, int staggerMs) {
  const size_t count = 1 << 18;
  std::vector<float> in(count), out(count);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(rank + i % 97);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  long calls = 0;
  std::printf("rank %d: looping\n", rank);  // a script may wait for this before a kill
  std::fflush(stdout);
  while (true) {
    if (rank == 0 && staggerMs > 0 && calls % 100 == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(staggerMs));
    }
    if (ncclAllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, comm, nullptr)) {
      return fail("looped all-reduce", comm, rank);
    }
    for (size_t i = 0; i < count; ++i) {
      if (out[i] != static_cast<float>(n * (n - 1) / 2 + n * (i % 97))) {
        std::fprintf(stderr, "rank %d: looped all-reduce element %zu wrong\n", rank, i);
        return 1;
      }
    }
    ++calls;
    // Every rank stops after the same call: the first whose time is up says so.
    int up = std::chrono::steady_clock::now() >= end ? 1 : 0, anyUp = 0;
    if (ncclAllReduce(&up, &anyUp, 1, ncclInt32, ncclMax, comm, nullptr))
      return fail("stop vote", comm, rank);
    if (anyUp) break;
  }
  std::printf("rank %d: %ld looped all-reduces right\n", rank, calls);
  return 0;
}

// After a peer's failure: the others shrink it away and check an all-reduce without it.
int shrinkAndCheck(ncclComm_t comm, int rank, int gone, bool revoke) {
  if (revoke) {
    if (ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT) != ncclSuccess)
      return fail("ncclCommRevoke", comm, rank);
    ncclResult_t state = ncclInternalError;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess || state != ncclSuccess) {
      std::fprintf(stderr, "rank %d: after the revoke the state is %s, not ncclSuccess\n", rank,
                   ncclGetErrorString(state));
      return 1;
    }
  }
  ncclComm_t small = nullptr;
  if (ncclCommShrink(comm, &gone, 1, &small, nullptr,
                     revoke ? NCCL_SHRINK_DEFAULT : NCCL_SHRINK_ABORT) != ncclSuccess)
    return fail("ncclCommShrink", comm, rank);
  int m = 0, me = -1;
  ncclCommCount(small, &m);
  ncclCommUserRank(small, &me);
  std::vector<int> v(4099);
  for (size_t i = 0; i < v.size(); ++i) v[i] = me + static_cast<int>(i);
  if (ncclAllReduce(v.data(), v.data(), v.size(), ncclInt32, ncclSum, small, nullptr))
    return fail("all-reduce after the shrink", small, rank);
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != m * (m - 1) / 2 + m * static_cast<int>(i)) {
      std::fprintf(stderr, "rank %d: all-reduce after the shrink: element %zu wrong\n", rank, i);
      return 1;
    }
  }
  if (ncclCommDestroy(small) != ncclSuccess || ncclCommDestroy(comm) != ncclSuccess) {
    std::fprintf(stderr, "rank %d: destroy after the shrink failed\n", rank);
    return 1;
  }
  std::printf("rank %d: %sshrunk to rank %d of %d without rank %d; all-reduce right\n", rank,
              revoke ? "revoked, " : "", me, m, gone);
  return 0;
}

int main(int argc, char** argv) {
  double loopSeconds = 0;
  int staggerMs = 0;
  int shrinkExcluding = -1;
  bool revoke = false;
  for (int a = 1; a < argc; a += 2) {
    if (a + 1 < argc && std::strcmp(argv[a], "--loop") == 0) {
      loopSeconds = std::atof(argv[a + 1]);
    } else if (a + 1 < argc && std::strcmp(argv[a], "--stagger-ms") == 0) {
      staggerMs = std::atoi(argv[a + 1]);
    } else if (a + 1 < argc && std::strcmp(argv[a], "--shrink-excluding") == 0) {
      shrinkExcluding = std::atoi(argv[a + 1]);
    } else if (a + 1 < argc && std::strcmp(argv[a], "--revoke") == 0) {
      revoke = std::atoi(argv[a + 1]) != 0;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--loop SECONDS [--stagger-ms MS] [--shrink-excluding RANK "
                   "[--revoke 0|1]]]\n",
                   argv[0]);
      return 2;
    }
  }
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
  {
    // In place with ncclAvg, and bitwise the same on every rank (the ranks all-gather a
    // hash of their result).
    const size_t avgCount = 100003;
    std::vector<double> buf(avgCount);
    for (size_t i = 0; i < avgCount; ++i) buf[i] = rank * 0.5 + static_cast<double>(i % 101) * 0.25;
    if (ncclAllReduce(buf.data(), buf.data(), avgCount, ncclFloat64, ncclAvg, comm, nullptr)) {
      return fail("in-place average all-reduce", comm, rank);
    }
    uint64_t hash = 1469598103934665603ull;
    for (size_t i = 0; i < avgCount; ++i) {
      const double want = (n - 1) * 0.25 + static_cast<double>(i % 101) * 0.25;
      if (std::fabs(buf[i] - want) > 1e-12 * (1 + std::fabs(want))) {
        std::fprintf(stderr, "rank %d: average element %zu is %.17g, not %.17g\n", rank, i, buf[i],
                     want);
        return 1;
      }
      uint64_t bits = 0;
      std::memcpy(&bits, &buf[i], sizeof(bits));
      hash = (hash ^ bits) * 1099511628211ull;
    }
    std::vector<uint64_t> hashes(n);
    if (ncclAllGather(&hash, hashes.data(), 1, ncclUint64, comm, nullptr)) {
      return fail("all-gather of the hashes", comm, rank);
    }
    for (int q = 0; q < n; ++q) {
      if (hashes[q] != hash) {
        std::fprintf(stderr, "rank %d: the average's bits differ from rank %d's\n", rank, q);
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
  {
    // Reduce-scatter: out of place on integers (exact), in place with ncclAvg on doubles.
    const size_t rc = 100003;
    std::vector<int> rsIn(rc * n), rsOut(rc, -1);
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < rc; ++i)
        rsIn[q * rc + i] = rank * 7 + q * 3 + static_cast<int>(i % 13);
    }
    if (ncclReduceScatter(rsIn.data(), rsOut.data(), rc, ncclInt32, ncclSum, comm, nullptr)) {
      return fail("reduce-scatter", comm, rank);
    }
    for (size_t i = 0; i < rc; ++i) {
      if (rsOut[i] != 7 * n * (n - 1) / 2 + n * (rank * 3 + static_cast<int>(i % 13))) {
        std::fprintf(stderr, "rank %d: reduce-scatter element %zu wrong\n", rank, i);
        return 1;
      }
    }
    std::vector<double> buf(rc * n);
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < rc; ++i)
        buf[q * rc + i] = rank * 0.5 + q + static_cast<double>(i % 7) * 0.25;
    }
    double* mineOut = buf.data() + static_cast<size_t>(rank) * rc;
    if (ncclReduceScatter(buf.data(), mineOut, rc, ncclFloat64, ncclAvg, comm, nullptr)) {
      return fail("in-place average reduce-scatter", comm, rank);
    }
    for (size_t i = 0; i < rc; ++i) {
      const double want = (n - 1) * 0.25 + rank + static_cast<double>(i % 7) * 0.25;
      if (std::fabs(mineOut[i] - want) > 1e-12 * (1 + std::fabs(want))) {
        std::fprintf(stderr, "rank %d: average reduce-scatter element %zu is %.17g, not %.17g\n",
                     rank, i, mineOut[i], want);
        return 1;
      }
    }
  }
  // Reduce to the last rank, small and large (the tuner's chain or tree, by the model).
  for (size_t rcount : {size_t{5}, size_t{1000003}}) {
    std::vector<int> rin(rcount), rout(rcount, -1);
    for (size_t i = 0; i < rcount; ++i) rin[i] = rank * 11 + static_cast<int>(i % 17);
    if (ncclReduce(rin.data(), rout.data(), rcount, ncclInt32, ncclSum, n - 1, comm, nullptr)) {
      return fail("reduce", comm, rank);
    }
    for (size_t i = 0; rank == n - 1 && i < rcount; ++i) {
      if (rout[i] != 11 * n * (n - 1) / 2 + n * static_cast<int>(i % 17)) {
        std::fprintf(stderr, "rank %d: reduce element %zu wrong\n", rank, i);
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
  if (loopSeconds > 0 && loop(comm, rank, n, loopSeconds, staggerMs) != 0) {
    if (shrinkExcluding < 0 || shrinkExcluding == rank) return 1;
    return shrinkAndCheck(comm, rank, shrinkExcluding, revoke);
  }
  ncclCommDestroy(comm);
  std::printf("rank %d of %d: all checks passed\n", rank, n);
  return 0;
}
