// The settings registry: every environment variable loom reads, declared in one table
// (settings.cc) with its type, default, NCCL alias and one line of documentation.
//
// Values come from the environment on first read and are cached; tests override them
// with ScopedSetting. Reads are thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom::settings {

enum class Type { kInt, kString, kBool };

// Who a setting is for: kUser, what a user may need to set (logging, bootstrap, network
// interfaces, timeouts); kTuning, knobs that exist for measurements, tuning and tests,
// whose defaults were chosen from measurements (docs/perf/) and which a user should not
// need to touch.
enum class Use { kUser, kTuning };

struct Definition {
  Use use;
  const char* name;       // "LOOM_TIMEOUT_MS"
  const char* ncclAlias;  // "NCCL_..." or nullptr
  Type type;
  const char* defaultValue;
  const char* doc;
};

// Every setting, in declaration order.
const std::vector<Definition>& all();

// The current value; the LOOM_ name wins over the NCCL_ alias. An unknown name or a
// value that does not parse as the declared type falls back to the default (with a
// warning logged once).
int64_t getInt(const char* name);
bool getBool(const char* name);
std::string getString(const char* name);
// Where the value came from: "LOOM_X", "NCCL_X" or "default".
std::string sourceOf(const char* name);

// Drops cached values so the next read looks at the environment again (tests).
void reloadForTest();

// Sets a value for the lifetime of the object (tests), restoring the previous state.
class ScopedSetting {
 public:
  ScopedSetting(const char* name, std::string value);
  ~ScopedSetting();
  ScopedSetting(const ScopedSetting&) = delete;
  ScopedSetting& operator=(const ScopedSetting&) = delete;

 private:
  std::string name_;
  std::optional<std::string> previous_;
};

}  // namespace loom::settings
