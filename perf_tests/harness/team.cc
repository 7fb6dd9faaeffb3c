#include "perf_tests/harness/team.h"

#include <algorithm>

namespace loom::perf {

Combine combineForAverage(int average) {
  switch (average) {
    case 0: return Combine::kFirst;
    case 2: return Combine::kMin;
    case 3: return Combine::kMax;
    default: return Combine::kMean;
  }
}

double Team::combine(int thread, double value, Combine how) {
  std::unique_lock<std::mutex> lock(mutex_);
  values_[thread] = value;
  if (++arrived_ < nThreads_) {
    const unsigned long generation = generation_;
    cv_.wait(lock, [&] { return generation_ != generation; });
    return result_;  // read under the lock: the next round cannot finish without us
  }
  // The last thread to arrive combines, then (alone, so MPI_THREAD_SERIALIZED suffices) joins
  // the other processes.
  double r = values_[0];
  for (int t = 1; t < nThreads_; ++t) {
    switch (how) {
      case Combine::kFirst: break;
      case Combine::kMin: r = std::min(r, values_[t]); break;
      case Combine::kMax: r = std::max(r, values_[t]); break;
      case Combine::kMean:
      case Combine::kSum: r += values_[t]; break;
    }
  }
  switch (how) {
    case Combine::kFirst: mpi_->broadcast(&r, sizeof r, 0); break;
    case Combine::kMin: mpi_->allreduceMin(&r); break;
    case Combine::kMax: mpi_->allreduceMax(&r); break;
    case Combine::kMean:
      mpi_->allreduceSum(&r);
      r /= static_cast<double>(nThreads_) * mpi_->size();
      break;
    case Combine::kSum: mpi_->allreduceSum(&r); break;
  }
  result_ = r;
  arrived_ = 0;
  ++generation_;
  cv_.notify_all();
  return r;
}

}  // namespace loom::perf
