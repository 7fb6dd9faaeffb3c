// The threads of one process (and, through MPI, every process) acting together: barriers
// and reductions of a double across every thread of the job.
#pragma once

#include <condition_variable>
#include <mutex>
#include <vector>

#include "perf_tests/harness/mpi_support.h"

namespace loom::perf {

enum class Combine { kFirst, kMean, kMin, kMax, kSum };

// How -a (0 rank 0, 1 mean, 2 min, 3 max) combines times.
Combine combineForAverage(int average);

class Team {
 public:
  Team(int nThreads, Mpi* mpi) : nThreads_(nThreads), mpi_(mpi), values_(nThreads) {}

  // Every thread (0..nThreads-1) of every process must call, in the same order.
  void barrier(int thread) { combine(thread, 0, Combine::kSum); }
  // kFirst: thread 0 of process 0; kMean: mean over every thread of every process.
  double combine(int thread, double value, Combine how);

 private:
  const int nThreads_;
  Mpi* mpi_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<double> values_;
  int arrived_ = 0;
  unsigned long generation_ = 0;
  double result_ = 0;
};

}  // namespace loom::perf
