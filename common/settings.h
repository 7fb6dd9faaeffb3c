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

// kInt: an integer. kCount: a whole number >= 0, or one of the setting's words ("auto").
// kSize: bytes, with an optional K, M, G or T (powers of 1024; "4M", "256KiB"), or one of
// the setting's words ("auto", "off", "any"). kChoice: one of the setting's words, in any
// case. kBool: yes or no. kString: free text.
enum class Type { kInt, kCount, kSize, kBool, kChoice, kString };

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
  const char* words;  // the words a kCount, kSize or kChoice takes, '|'-separated ("auto|off")
  const char* doc;
};

// The value of a kCount or kSize setting: a number, or what one of its words says.
struct Amount {
  enum class Kind { kValue, kAuto, kOff, kAny };
  Kind kind = Kind::kValue;
  uint64_t value = 0;  // kValue only

  bool isAuto() const { return kind == Kind::kAuto; }
  // A number, with `automatic` for auto (counts, and sizes without off or any).
  uint64_t orAuto(uint64_t automatic) const { return kind == Kind::kValue ? value : automatic; }
  // The limit of an "up to this size" setting: off is 0, any is no limit.
  uint64_t upTo(uint64_t automatic) const {
    switch (kind) {
      case Kind::kValue: return value;
      case Kind::kAuto: return automatic;
      case Kind::kOff: return 0;
      case Kind::kAny: return UINT64_MAX;
    }
    return value;
  }
  // The start of a "from this size" setting: off never starts (UINT64_MAX), any is 0.
  uint64_t from(uint64_t automatic) const {
    switch (kind) {
      case Kind::kValue: return value;
      case Kind::kAuto: return automatic;
      case Kind::kOff: return UINT64_MAX;
      case Kind::kAny: return 0;
    }
    return value;
  }
  bool operator==(const Amount&) const = default;
};

// A setting as code names it: one handle per line of settings_list.h, so a misspelt
// setting does not compile.
template <Type T>
struct Setting {
  const char* name;
};
using IntSetting = Setting<Type::kInt>;
using CountSetting = Setting<Type::kCount>;
using SizeSetting = Setting<Type::kSize>;
using BoolSetting = Setting<Type::kBool>;
using ChoiceSetting = Setting<Type::kChoice>;
using StringSetting = Setting<Type::kString>;

#define LOOM_SETTING_HANDLE(use, id, name, alias, type, dflt, words, doc) \
  inline constexpr Setting<Type::type> id{name};
LOOM_SETTINGS(LOOM_SETTING_HANDLE)
#undef LOOM_SETTING_HANDLE

// Every setting, in declaration order.
const std::vector<Definition>& all();

// The current value; the LOOM_ name wins over the NCCL_ alias. A value that does not
// parse as the declared type falls back to the default (with a warning logged once).
int64_t get(IntSetting s);
Amount get(CountSetting s);
Amount get(SizeSetting s);
bool get(BoolSetting s);
// A choice comes back spelt as in the setting's words ("ll128" for LOOM_PROTO=LL128).
std::string get(ChoiceSetting s);
// The same without the warning: nullopt where the value is not one of the words (the log
// reads LOOM_DEBUG through it, before it can warn).
std::optional<std::string> tryGet(ChoiceSetting s);
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
// The current value of a registry entry as text (tools that walk all()): sizes as
// "64M" where that is exact.
std::string valueText(const Definition& d);
// What a setting of this type takes, in words (the reference's "type" column).
std::string syntaxOf(const Definition& d);

// The parsers behind get(), for tests: nullopt where the text does not parse.
std::optional<Amount> parseAmount(const std::string& text, const char* words, bool size);
std::optional<std::string> parseChoice(const std::string& text, const char* words);

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
