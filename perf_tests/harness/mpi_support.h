// MPI, when the binaries are built with it (LOOM_PERF_HAVE_MPI) and launched by mpirun.
// Without MPI, or when not launched by an MPI launcher, there is one process and every call
// here is a no-op on it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace loom::perf {

class Mpi {
 public:
  // Initialises MPI (MPI_THREAD_SERIALIZED) only when built with MPI and an MPI launcher's
  // environment is present (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK, ...), so a plain run
  // never pays MPI start-up.
  void init(int* argc, char*** argv);
  void finalize();
  bool active() const { return active_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // True when this build can use MPI.
  static bool compiledIn();

  void barrier();
  void broadcast(void* data, size_t bytes, int root);
  // In-place reductions over all processes.
  void allreduceSum(double* value);
  void allreduceMin(double* value);
  void allreduceMax(double* value);
  // Every process's string, in rank order (every process gets all).
  std::vector<std::string> allgather(const std::string& mine);
  // Ends every process of the job (MPI_Abort); returns only without MPI.
  void abort(int code);

 private:
  bool active_ = false;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace loom::perf
