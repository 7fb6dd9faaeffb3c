#include "common/process.h"

#include <unistd.h>

#include <mutex>
#include <random>

namespace loom {

uint64_t processToken() {
  static std::mutex mutex;
  static pid_t owner = 0;
  static uint64_t token = 0;
  std::lock_guard<std::mutex> lock(mutex);
  if (owner != getpid() || token == 0) {
    std::random_device rd;
    do {
      token = (uint64_t(rd()) << 32) ^ rd();
    } while (token == 0);
    owner = getpid();
  }
  return token;
}

}  // namespace loom
