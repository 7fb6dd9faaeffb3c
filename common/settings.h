// The settings registry: every environment variable loom reads, declared once in
// settings_list.h with its type, default, NCCL alias and one line of documentation, and
// read through a typed handle (settings::get(settings::kTimeoutMs)).
//
// Values come from the environment at each read (callers that need one value for a
// communicator's life read it once at init); tests override them with ScopedSetting.
// Reads are thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/settings_list.h"

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

// A setting as code names it: one handle per line of settings_list.h, so a misspelt
// setting does not compile.
template <Type T>
struct Setting {
  const char* name;
};
using IntSetting = Setting<Type::kInt>;
using BoolSetting = Setting<Type::kBool>;
using StringSetting = Setting<Type::kString>;

#define LOOM_SETTING_HANDLE(use, id, name, alias, type, dflt, doc) inline constexpr Setting<Type::type> id{name};
LOOM_SETTINGS(LOOM_SETTING_HANDLE)
#undef LOOM_SETTING_HANDLE

// Every setting, in declaration order.
const std::vector<Definition>& all();

// The current value; the LOOM_ name wins over the NCCL_ alias. A value that does not
// parse as the declared type falls back to the default (with a warning logged once).
int64_t get(IntSetting s);
bool get(BoolSetting s);
std::string get(StringSetting s);
// Where the value came from: "LOOM_X", "NCCL_X" or "default".
namespace detail {
std::string sourceOf(const char* name);
}
template <Type T>
std::string sourceOf(Setting<T> s) {
  return detail::sourceOf(s.name);
}
std::string sourceOf(const Definition& d);
// The current value of a registry entry as text (tools that walk all()).
std::string valueText(const Definition& d);

// Forgets which values were warned about (tests).
void reloadForTest();

// Sets a value for the lifetime of the object (tests), restoring the previous state.
class ScopedSetting {
 public:
  template <Type T>
  ScopedSetting(Setting<T> s, std::string value) : ScopedSetting(s.name, std::move(value)) {}
  ~ScopedSetting();
  ScopedSetting(const ScopedSetting&) = delete;
  ScopedSetting& operator=(const ScopedSetting&) = delete;

 private:
  ScopedSetting(const char* name, std::string value);
  std::string name_;
  std::optional<std::string> previous_;
};

}  // namespace loom::settings
