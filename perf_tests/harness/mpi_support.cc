#include "perf_tests/harness/mpi_support.h"

#include <cstdlib>

#ifdef LOOM_PERF_HAVE_MPI
#include <mpi.h>
#endif

namespace loom::perf {
namespace {

bool launchedByMpi() {
  const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE",       "PMIX_RANK", "PMI_RANK",
                        "MV2_COMM_WORLD_SIZE",  "MPI_LOCALNRANKS"};
  for (const char* v : vars) {
    if (std::getenv(v) != nullptr) return true;
  }
  return false;
}

}  // namespace

bool Mpi::compiledIn() {
#ifdef LOOM_PERF_HAVE_MPI
  return true;
#else
  return false;
#endif
}

#ifdef LOOM_PERF_HAVE_MPI

void Mpi::init(int* argc, char*** argv) {
  if (!launchedByMpi()) return;
  int provided = 0;
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  active_ = true;
}

void Mpi::finalize() {
  if (active_) MPI_Finalize();
  active_ = false;
}

void Mpi::barrier() {
  if (active_) MPI_Barrier(MPI_COMM_WORLD);
}

void Mpi::broadcast(void* data, size_t bytes, int root) {
  if (active_) MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD);
}

void Mpi::allreduceSum(double* value) {
  if (active_) MPI_Allreduce(MPI_IN_PLACE, value, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}

void Mpi::allreduceMin(double* value) {
  if (active_) MPI_Allreduce(MPI_IN_PLACE, value, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
}

void Mpi::allreduceMax(double* value) {
  if (active_) MPI_Allreduce(MPI_IN_PLACE, value, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
}

std::vector<std::string> Mpi::allgather(const std::string& mine) {
  if (!active_) return {mine};
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(size_);
  MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::vector<int> offsets(size_);
  int total = 0;
  for (int i = 0; i < size_; ++i) {
    offsets[i] = total;
    total += lengths[i];
  }
  std::string all(static_cast<size_t>(total), '\0');
  MPI_Allgatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                 MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> out;
  for (int i = 0; i < size_; ++i) out.push_back(all.substr(offsets[i], lengths[i]));
  return out;
}

void Mpi::abort(int code) {
  if (active_) MPI_Abort(MPI_COMM_WORLD, code);
}

#else  // !LOOM_PERF_HAVE_MPI

void Mpi::init(int*, char***) {}
void Mpi::finalize() {}
void Mpi::barrier() {}
void Mpi::broadcast(void*, size_t, int) {}
void Mpi::allreduceSum(double*) {}
void Mpi::allreduceMin(double*) {}
void Mpi::allreduceMax(double*) {}
std::vector<std::string> Mpi::allgather(const std::string& mine) {
  return {mine};
}
void Mpi::abort(int) {}

#endif

}  // namespace loom::perf
