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
#define LOOM_SETTING_ENTRY(use, id, name, alias, type, dflt, words, doc) \
  {Use::use, name, alias, Type::type, dflt, words, doc},
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

const std::vector<Definition>& all() {
  return kDefinitions;
}

namespace {

std::string lower(std::string text) {
  for (auto& ch : text) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return text;
}

// The words of "auto|off", one by one.
std::vector<std::string> wordsOf(const char* words) {
  std::vector<std::string> out;
  std::string all = words ? words : "";
  size_t pos = 0;
  while (pos < all.size()) {
    size_t bar = all.find('|', pos);
    if (bar == std::string::npos) bar = all.size();
    if (bar > pos) out.push_back(all.substr(pos, bar - pos));
    pos = bar + 1;
  }
  return out;
}

std::string listed(const char* words, const char* last) {
  std::string out;
  auto w = wordsOf(words);
  for (size_t k = 0; k < w.size(); ++k) {
    if (k > 0) out += k + 1 == w.size() ? last : ", ";
    out += w[k];
  }
  return out;
}

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

// 1 / 0 for the spellings of a yes or a no (any case), -1 for anything else.
int parseBool(std::string text) {
  text = lower(std::move(text));
  if (text == "1" || text == "true" || text == "yes" || text == "on" || text == "y") return 1;
  if (text == "0" || text == "false" || text == "no" || text == "off" || text == "n") return 0;
  return -1;
}

bool getBool(const char* name) {
  auto [text, source] = raw(name);
  const int v = parseBool(text);
  if (v >= 0) return v == 1;
  // Not a yes or a no: the default, never a value the user did not ask for.
  const Definition* def = find(name);
  const bool dflt = def && parseBool(def->defaultValue) == 1;
  warnOnce(name, std::string(source) + "='" + text +
                     "' is not a yes or a no (1/0, true/false, "
                     "yes/no, on/off); using the default, " +
                     (dflt ? "1" : "0"));
  return dflt;
}

Amount getAmount(const char* name, bool size) {
  const Definition* def = find(name);
  const char* words = def ? def->words : "";
  auto [text, source] = raw(name);
  if (auto v = parseAmount(text, words, size)) return *v;
  const char* dflt = def ? def->defaultValue : "0";
  warnOnce(name, std::string(source) + "='" + text + "' is not " + syntaxOf(*def) +
                     "; using the default, " + dflt);
  // The defaults parse (Settings.EveryDefaultParses).
  return parseAmount(dflt, words, size).value_or(Amount{});
}

std::string getChoice(const char* name) {
  const Definition* def = find(name);
  const char* words = def ? def->words : "";
  auto [text, source] = raw(name);
  if (auto v = parseChoice(text, words)) return *v;
  const char* dflt = def ? def->defaultValue : "";
  warnOnce(name, std::string(source) + "='" + text + "' is not " + syntaxOf(*def) +
                     "; using the default, " + dflt);
  return dflt;
}

std::string getString(const char* name) {
  return raw(name).first;
}

// "64M" where the number is a whole count of KiB, MiB, GiB or TiB.
std::string sizeText(uint64_t v) {
  static const char kSuffix[] = {'T', 'G', 'M', 'K'};
  for (int k = 0; k < 4; ++k) {
    const uint64_t unit = uint64_t(1) << (10 * (4 - k));
    if (v != 0 && v % unit == 0) return std::to_string(v / unit) + kSuffix[k];
  }
  return std::to_string(v);
}

std::string amountText(const Amount& a, bool size) {
  switch (a.kind) {
    case Amount::Kind::kAuto: return "auto";
    case Amount::Kind::kOff: return "off";
    case Amount::Kind::kAny: return "any";
    case Amount::Kind::kValue: return size ? sizeText(a.value) : std::to_string(a.value);
  }
  return "";
}

}  // namespace

std::optional<Amount> parseAmount(const std::string& text, const char* words, bool size) {
  const std::string l = lower(text);
  for (const std::string& w : wordsOf(words)) {
    if (l != w) continue;
    if (w == "auto") return Amount{Amount::Kind::kAuto, 0};
    if (w == "off") return Amount{Amount::Kind::kOff, 0};
    if (w == "any") return Amount{Amount::Kind::kAny, 0};
  }
  size_t k = 0;
  uint64_t v = 0;
  while (k < l.size() && l[k] >= '0' && l[k] <= '9') {
    const uint64_t digit = static_cast<uint64_t>(l[k] - '0');
    if (v > (UINT64_MAX - digit) / 10) return std::nullopt;
    v = v * 10 + digit;
    ++k;
  }
  if (k == 0) return std::nullopt;  // no digits, a sign, or a word not in the list
  std::string suffix = l.substr(k);
  if (!size) {
    if (!suffix.empty()) return std::nullopt;
  } else {
    int shift = 0;
    if (!suffix.empty()) {
      const char* units = "kmgt";
      const char* u = std::strchr(units, suffix[0]);
      if (u && *u) {
        shift = 10 * static_cast<int>(u - units + 1);
        suffix.erase(0, 1);
        if (!suffix.empty() && suffix[0] == 'i') suffix.erase(0, 1);
      }
      if (suffix == "b") suffix.clear();
      if (!suffix.empty()) return std::nullopt;
    }
    if (shift > 0 && v > (UINT64_MAX >> shift)) return std::nullopt;
    v <<= shift;
  }
  // Within int64 so that callers can mix it with signed arithmetic.
  if (v > uint64_t(INT64_MAX)) return std::nullopt;
  return Amount{Amount::Kind::kValue, v};
}

std::optional<std::string> parseChoice(const std::string& text, const char* words) {
  const std::string l = lower(text);
  for (const std::string& w : wordsOf(words)) {
    if (lower(w) == l) return w;
  }
  return std::nullopt;
}

std::string syntaxOf(const Definition& d) {
  // "a size, auto or off"; "a whole number or auto".
  const size_t n = wordsOf(d.words).size();
  const std::string w = n == 0 ? "" : (n == 1 ? " or " : ", ") + listed(d.words, " or ");
  switch (d.type) {
    case Type::kInt: return "an integer";
    case Type::kCount: return "a whole number" + w;
    case Type::kSize: return "a size (bytes, or with K, M, G or T)" + w;
    case Type::kBool: return "a yes or a no";
    case Type::kChoice: return "one of " + listed(d.words, ", ");
    case Type::kString: return "text";
  }
  return "";
}

int64_t get(IntSetting s) {
  return getInt(s.name);
}
Amount get(CountSetting s) {
  return getAmount(s.name, false);
}
Amount get(SizeSetting s) {
  return getAmount(s.name, true);
}
bool get(BoolSetting s) {
  return getBool(s.name);
}
std::string get(ChoiceSetting s) {
  return getChoice(s.name);
}
std::optional<std::string> tryGet(ChoiceSetting s) {
  const Definition* def = find(s.name);
  return parseChoice(raw(s.name).first, def ? def->words : "");
}
std::string get(StringSetting s) {
  return getString(s.name);
}

namespace detail {
std::string sourceOf(const char* name) {
  return raw(name).second;
}
}  // namespace detail

std::string sourceOf(const Definition& d) {
  return raw(d.name).second;
}

std::string valueText(const Definition& d) {
  switch (d.type) {
    case Type::kInt: return std::to_string(getInt(d.name));
    case Type::kCount: return amountText(getAmount(d.name, false), false);
    case Type::kSize: return amountText(getAmount(d.name, true), true);
    case Type::kBool: return getBool(d.name) ? "1" : "0";
    case Type::kChoice: return getChoice(d.name);
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
