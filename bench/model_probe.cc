// model_probe: one rank of a host-memory all-reduce timing, for checking the cost model
// against runs (scripts/model_check.sh launches one per network namespace). The
// communicator comes from the environment (loomCommInitFromEnv: LOOM_RANK, LOOM_NRANKS,
// LOOM_COMM_ID); LOOM_ALGO forces the algorithm as usual.
//
//   model_probe [--sizes 8,65536,...] [--seconds S] [--label TEXT]
//               [--coll all_reduce|all_gather|reduce_scatter|reduce|broadcast]
//
// For all_gather a size is the output's bytes, for reduce_scatter the input's, as
// nccl-tests counts them (each rank gives, or receives, size / nranks of it); a size
// below 4 x nranks moves one float per rank, and its line gives the bytes it moved.
//
// For each size: 2 warm-up calls, 3 calls that say how long one takes, then as many as
// fill about S seconds (default 0.5; at least 3, at most 1000), timed; every rank's input is a
// known pattern, and the last call's output is checked against the exact sum (all-gather: every
// rank's block; reduce-scatter: the sum of this rank's block; reduce: the sum, on rank 0, the
// root; broadcast: rank 0's input, from the root 0). Rank 0 prints one CSV
// line per size:
//   label,nranks,bytes,us_per_call,calls,wrong
// where us_per_call is the slowest rank's mean. Exit 1 on a wrong value or a failed call.
#include <loom/launch.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

// Small integers, so that float sums over any number of ranks are exact.
float value(int rank, size_t i) {
  return static_cast<float>((rank + 1) * ((i % 7) + 1));
}

int fail(const char* what, ncclComm_t comm, int rank) {
  std::fprintf(stderr, "model_probe rank %d: %s failed: %s\n", rank, what,
               comm ? ncclGetLastError(comm) : "");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> sizes = {8, 1 << 16, 1 << 20, 4 << 20};
  double seconds = 0.5;
  std::string label = "default";
  bool gather = false, scatter = false, reduce = false, bcast = false;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "model_probe: %s needs a value\n", k.c_str());
      return 2;
    }
    const char* v = argv[++i];
    if (k == "--sizes") {
      sizes.clear();
      for (const char* p = v; *p;) {
        char* end = nullptr;
        const unsigned long long b = std::strtoull(p, &end, 10);
        if (end == p || b < 4 || b % 4) {
          std::fprintf(stderr, "model_probe: --sizes %s: byte counts, multiples of 4\n", v);
          return 2;
        }
        sizes.push_back(b);
        p = *end == ',' ? end + 1 : end;
      }
    } else if (k == "--seconds") {
      seconds = std::atof(v);
    } else if (k == "--label") {
      label = v;
    } else if (k == "--coll") {
      gather = std::string(v) == "all_gather";
      scatter = std::string(v) == "reduce_scatter";
      reduce = std::string(v) == "reduce";
      bcast = std::string(v) == "broadcast";
      if (!gather && !scatter && !reduce && !bcast && std::string(v) != "all_reduce") {
        std::fprintf(stderr,
                     "model_probe: --coll %s: all_reduce, all_gather, reduce_scatter, reduce or "
                     "broadcast\n",
                     v);
        return 2;
      }
    } else {
      std::fprintf(stderr, "model_probe: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  ncclComm_t comm = nullptr;
  if (loomCommInitFromEnv(&comm) != ncclSuccess) {
    std::fprintf(stderr, "model_probe: %s\n", ncclGetLastError(nullptr));
    return 1;
  }
  int rank = 0, n = 1;
  ncclCommUserRank(comm, &rank);
  ncclCommCount(comm, &n);
  int bad = 0;
  for (size_t bytes : sizes) {
    // All-gather and reduce-scatter: each rank's block of the output (of the input).
    const size_t count = gather || scatter ? std::max<size_t>(1, bytes / 4 / n) : bytes / 4;
    std::vector<float> in(scatter ? count * n : count), out(gather ? count * n : count, -1.0f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = value(rank, i);
    auto call = [&]() {
      if (gather) return ncclAllGather(in.data(), out.data(), count, ncclFloat32, comm, nullptr);
      if (scatter) {
        return ncclReduceScatter(in.data(), out.data(), count, ncclFloat32, ncclSum, comm, nullptr);
      }
      if (bcast) return ncclBroadcast(in.data(), out.data(), count, ncclFloat32, 0, comm, nullptr);
      if (reduce) {
        return ncclReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, 0, comm, nullptr);
      }
      return ncclAllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, comm, nullptr);
    };
    for (int w = 0; w < 2; ++w) {
      if (call()) return fail("the collective", comm, rank);
    }
    // Three calls say how long one takes; rank 0 turns that into the count for about
    // `seconds`, which every rank then runs untimed by any vote.
    auto timed = [&](int calls, double* us) -> bool {
      const auto start = Clock::now();
      for (int k = 0; k < calls; ++k) {
        if (call()) return false;
      }
      *us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / calls;
      return true;
    };
    double probe = 0;
    if (!timed(3, &probe)) return fail("all-reduce", comm, rank);
    int calls =
        rank == 0 ? static_cast<int>(std::clamp(seconds * 1e6 / std::max(probe, 1.0), 3.0, 1000.0))
                  : 0;
    int agreed = 0;
    if (ncclAllReduce(&calls, &agreed, 1, ncclInt32, ncclMax, comm, nullptr))
      return fail("all-reduce", comm, rank);
    calls = agreed;
    double perCall = 0, slowest = 0;
    if (!timed(calls, &perCall)) return fail("all-reduce", comm, rank);
    if (ncclAllReduce(&perCall, &slowest, 1, ncclFloat64, ncclMax, comm, nullptr)) {
      return fail("all-reduce", comm, rank);
    }
    int wrong = 0;
    if (gather) {
      for (size_t i = 0; i < out.size(); ++i) wrong += out[i] != value(int(i / count), i % count);
    } else if (bcast) {
      for (size_t i = 0; i < count; ++i) wrong += out[i] != value(0, i);
    } else if (!reduce || rank == 0) {
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += value(r, scatter ? rank * count + i : i);
        if (out[i] != want) ++wrong;
      }
    }
    int wrongAll = 0;
    if (ncclAllReduce(&wrong, &wrongAll, 1, ncclInt32, ncclSum, comm, nullptr))
      return fail("all-reduce", comm, rank);
    if (rank == 0) {
      // The bytes the call moved: below 4 x n an all-gather or reduce-scatter still moves one
      // float per rank, and is labelled so.
      const size_t moved = (gather || scatter ? count * size_t(n) : count) * sizeof(float);
      std::printf("%s,%d,%zu,%.2f,%d,%d\n", label.c_str(), n, moved, slowest, calls, wrongAll);
      std::fflush(stdout);
    }
    bad |= wrongAll != 0;
  }
  ncclCommDestroy(comm);
  return bad ? 1 : 0;
}
