// loomCommInitFromEnv: a communicator from launcher variables (see include/loom/launch.h).
#include "loom/launch.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <string>

#include "comm/api_state.h"
#include "common/settings.h"
#include "common/status.h"

namespace {

// 1: `name` holds an int (in *out); 0: it is unset; -1: it is set to something else
// (never taken as unset: another launcher's variables would then give another rank).
int readInt(const char* name, int* out) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (errno != 0 || *end != '\0' || x < INT_MIN || x > INT_MAX) return -1;
  *out = static_cast<int>(x);
  return 1;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) ncclResult_t loomRankFromEnv(int* rank,
                                                                               int* nranks) {
  if (!rank || !nranks) {
    return loom::comm::fail(
        loom::errorf(loom::Code::kInvalidArgument, "loomRankFromEnv: NULL argument"));
  }
  static const char* kPairs[][2] = {{"LOOM_RANK", "LOOM_NRANKS"},
                                    {"RANK", "WORLD_SIZE"},
                                    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                    {"PMI_RANK", "PMI_SIZE"}};
  for (const auto& p : kPairs) {
    const int hasRank = readInt(p[0], rank), hasSize = readInt(p[1], nranks);
    if (hasRank < 0 || hasSize < 0) {
      const char* bad = hasRank < 0 ? p[0] : p[1];
      return loom::comm::fail(loom::errorf(loom::Code::kInvalidArgument,
                                           "%s='%s' is not an integer", bad, std::getenv(bad)));
    }
    if (hasRank && hasSize) {
      if (*nranks < 1 || *rank < 0 || *rank >= *nranks) {
        return loom::comm::fail(loom::errorf(loom::Code::kInvalidArgument,
                                             "%s=%d and %s=%d are inconsistent", p[0], *rank, p[1],
                                             *nranks));
      }
      return ncclSuccess;
    }
  }
  return loom::comm::fail(loom::errorf(loom::Code::kInvalidArgument,
                                       "no rank in the environment: set LOOM_RANK/LOOM_NRANKS, "
                                       "RANK/WORLD_SIZE (torchrun) or launch with mpirun"));
}

extern "C" __attribute__((visibility("default"))) ncclResult_t loomCommInitFromEnv(
    ncclComm_t* comm) {
  int rank = 0, nranks = 0;
  ncclResult_t r = loomRankFromEnv(&rank, &nranks);
  if (r != ncclSuccess) return r;
  if (loom::settings::get(loom::settings::kCommId).empty()) {
    const char* addr = std::getenv("MASTER_ADDR");
    const char* port = std::getenv("MASTER_PORT");
    if (!addr || !port) {
      return loom::comm::fail(loom::errorf(loom::Code::kInvalidArgument,
                                           "no root address: set LOOM_COMM_ID=host:port or "
                                           "MASTER_ADDR and MASTER_PORT"));
    }
    std::string host = addr;
    if (host.find(':') != std::string::npos && host.front() != '[') host = "[" + host + "]";
    setenv("LOOM_COMM_ID", (host + ":" + port).c_str(), 1);
  }
  ncclUniqueId id;
  r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return r;
  return ncclCommInitRank(comm, nranks, id, rank);
}
