#include "common/settings.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "common/log.h"

namespace loom::settings {

namespace {

// The one table, from common/settings_list.h.
#define LOOM_SETTING_ENTRY(use, id, name, alias, type, dflt, doc) {Use::use, name, alias, Type::type, dflt, doc},
const std::vector<Definition> kDefinitions = {LOOM_SETTINGS(LOOM_SETTING_ENTRY)};
#undef LOOM_SETTING_ENTRY

struct Cache {
  std::mutex mutex;
  std::map<std::string, std::optional<std::string>> overrides;
  std::map<std::string, std::string> warned;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: used from atexit paths
  return *c;
}

const Definition* find(const char* name) {
  for (const auto& d : kDefinitions) {
    if (std::strcmp(d.name, name) == 0) return &d;
  }
  return nullptr;
}

// Returns the raw text and its source.
std::pair<std::string, std::string> raw(const char* name) {
  const Definition* def = find(name);
  {
    auto& c = cache();
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.overrides.find(name);
    if (it != c.overrides.end() && it->second) return {*it->second, std::string(name)};
  }
  if (const char* v = std::getenv(name); v && *v) return {v, name};
  if (def && def->ncclAlias) {
    if (const char* v = std::getenv(def->ncclAlias); v && *v) return {v, def->ncclAlias};
  }
  return {def ? def->defaultValue : "", "default"};
}

void warnOnce(const std::string& name, const std::string& text) {
  auto& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.warned.count(name)) return;
    c.warned[name] = text;
  }
  LOOM_WARN(kEnv, "%s", text.c_str());
}

}  // namespace

const std::vector<Definition>& all() { return kDefinitions; }

namespace {

int64_t getInt(const char* name) {
  auto [text, source] = raw(name);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 0);
  if (errno != 0 || end == text.c_str() || *end != '\0') {
    const Definition* def = find(name);
    const char* dflt = def ? def->defaultValue : "0";
    warnOnce(name, std::string(source) + "='" + text + "' is not an integer; using " + dflt);
    return std::strtoll(dflt, nullptr, 0);
  }
  return v;
}

namespace {

// 1 / 0 for the spellings of a yes or a no (any case), -1 for anything else.
int parseBool(std::string text) {
  for (auto& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (text == "1" || text == "true" || text == "yes" || text == "on" || text == "y") return 1;
  if (text == "0" || text == "false" || text == "no" || text == "off" || text == "n") return 0;
  return -1;
}

}  // namespace

bool getBool(const char* name) {
  auto [text, source] = raw(name);
  const int v = parseBool(text);
  if (v >= 0) return v == 1;
  // Not a yes or a no: the default, never a value the user did not ask for.
  const Definition* def = find(name);
  const bool dflt = def && parseBool(def->defaultValue) == 1;
  warnOnce(name, std::string(source) + "='" + text + "' is not a yes or a no (1/0, true/false, "
                 "yes/no, on/off); using the default, " + (dflt ? "1" : "0"));
  return dflt;
}

std::string getString(const char* name) { return raw(name).first; }

}  // namespace

int64_t get(IntSetting s) { return getInt(s.name); }
bool get(BoolSetting s) { return getBool(s.name); }
std::string get(StringSetting s) { return getString(s.name); }

namespace detail {
std::string sourceOf(const char* name) { return raw(name).second; }
}  // namespace detail

std::string sourceOf(const Definition& d) { return raw(d.name).second; }

std::string valueText(const Definition& d) {
  switch (d.type) {
    case Type::kInt: return std::to_string(getInt(d.name));
    case Type::kBool: return getBool(d.name) ? "1" : "0";
    case Type::kString: return getString(d.name);
  }
  return "";
}

void reloadForTest() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.warned.clear();
}

ScopedSetting::ScopedSetting(const char* name, std::string value) : name_(name) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.overrides.find(name_);
  if (it != c.overrides.end()) previous_ = it->second;
  c.overrides[name_] = std::move(value);
}

ScopedSetting::~ScopedSetting() {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (previous_) {
    c.overrides[name_] = *previous_;
  } else {
    c.overrides.erase(name_);
  }
}

}  // namespace loom::settings
