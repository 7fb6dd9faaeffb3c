// Logging in NCCL's manner: LOOM_DEBUG (or NCCL_DEBUG) picks the level, LOOM_DEBUG_SUBSYS
// the subsystems, LOOM_DEBUG_FILE a file (with %h host, %p pid, %r rank).
//
// Lines look like `host:pid:tid [rank] loom INFO message`. The rank comes from the
// calling thread's LogContext (set by the communicator around its work).
#pragma once

#include <cstdint>

namespace loom::log {

enum Level : int { kNone = 0, kVersion = 1, kWarn = 2, kInfo = 3, kTrace = 4 };

enum Subsys : uint32_t {
  kInit = 1u << 0,
  kColl = 1u << 1,
  kP2p = 1u << 2,
  kShm = 1u << 3,
  kNet = 1u << 4,
  kBootstrap = 1u << 5,
  kGraph = 1u << 6,
  kTuning = 1u << 7,
  kEnv = 1u << 8,
  kAlloc = 1u << 9,
  kAll = ~0u,
};

// True when a message of this level and subsystem would be written.
bool enabled(Level level, uint32_t subsys);
void write(Level level, uint32_t subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
// Re-reads the settings (tests).
void reload();

// Sets the rank shown in this thread's log lines for the object's lifetime.
class RankScope {
 public:
  explicit RankScope(int rank);
  ~RankScope();

 private:
  int previous_;
};

}  // namespace loom::log

#define LOOM_LOG(level, subsys, ...)                                                   \
  do {                                                                                 \
    if (::loom::log::enabled(level, ::loom::log::subsys)) {                            \
      ::loom::log::write(level, ::loom::log::subsys, __FILE__, __LINE__, __VA_ARGS__); \
    }                                                                                  \
  } while (0)
#define LOOM_WARN(subsys, ...) LOOM_LOG(::loom::log::kWarn, subsys, __VA_ARGS__)
#define LOOM_INFO(subsys, ...) LOOM_LOG(::loom::log::kInfo, subsys, __VA_ARGS__)
#define LOOM_TRACE(subsys, ...) LOOM_LOG(::loom::log::kTrace, subsys, __VA_ARGS__)
