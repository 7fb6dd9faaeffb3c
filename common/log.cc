#include "common/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include "common/settings.h"

namespace loom::log {

namespace {

thread_local int tlsRank = -1;

struct State {
  std::once_flag once;
  std::atomic<bool> ready{false};  // set once init has run: the hot path skips call_once
  std::atomic<int> level{kWarn};
  std::atomic<uint32_t> subsys{static_cast<uint32_t>(kInit) | static_cast<uint32_t>(kEnv)};
  std::mutex mutex;
  FILE* out = stderr;
  std::string host;
};

State& state() {
  static State* s = new State();  // never destroyed: logging may run during exit
  return *s;
}

int parseLevel(const std::string& v) {
  if (v == "NONE") return kNone;
  if (v == "VERSION") return kVersion;
  if (v == "WARN" || v.empty()) return kWarn;
  if (v == "INFO") return kInfo;
  if (v == "TRACE" || v == "ABORT") return kTrace;
  return kWarn;
}

uint32_t parseSubsys(const std::string& v) {
  static const struct {
    const char* name;
    uint32_t bit;
  } kNames[] = {{"INIT", kInit}, {"COLL", kColl},           {"P2P", kP2p},     {"SHM", kShm},
                {"NET", kNet},   {"BOOTSTRAP", kBootstrap}, {"GRAPH", kGraph}, {"TUNING", kTuning},
                {"ENV", kEnv},   {"ALLOC", kAlloc},         {"ALL", kAll}};
  bool invert = !v.empty() && v[0] == '^';
  uint32_t mask = invert ? static_cast<uint32_t>(kAll) : 0u;
  size_t pos = invert ? 1 : 0;
  while (pos <= v.size()) {
    size_t comma = v.find(',', pos);
    std::string tok = v.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    for (const auto& n : kNames) {
      if (strcasecmp(tok.c_str(), n.name) == 0) mask = invert ? (mask & ~n.bit) : (mask | n.bit);
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return mask;
}

std::string expandFileName(const std::string& pattern, const std::string& host) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      char c = pattern[++i];
      if (c == 'h')
        out += host;
      else if (c == 'p')
        out += std::to_string(getpid());
      else if (c == 'r')
        out += std::to_string(tlsRank);
      else if (c == '%')
        out += '%';
      else {
        out += '%';
        out += c;
      }
    } else {
      out += pattern[i];
    }
  }
  return out;
}

void init() {
  State& s = state();
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  s.host = host;
  if (char* dot = std::strchr(host, '.')) *dot = '\0';
  s.host = host;
  // Not settings::get: its warning about a bad value would log, and so come back here.
  const std::optional<std::string> level = settings::tryGet(settings::kDebug);
  s.level = parseLevel(level.value_or("WARN"));
  s.subsys = parseSubsys(settings::get(settings::kDebugSubsys));
  std::string file = settings::get(settings::kDebugFile);
  if (!file.empty()) {
    std::string path = expandFileName(file, s.host);
    if (FILE* f = std::fopen(path.c_str(), "w")) {
      setvbuf(f, nullptr, _IOLBF, 0);
      s.out = f;
    }
  }
  s.ready.store(true, std::memory_order_release);
  if (!level) (void)settings::get(settings::kDebug);  // now it may warn
}

const char* levelName(Level level) {
  switch (level) {
    case kWarn: return "WARN";
    case kInfo: return "INFO";
    case kTrace: return "TRACE";
    case kVersion: return "VERSION";
    default: return "";
  }
}

}  // namespace

bool enabled(Level level, uint32_t subsys) {
  State& s = state();
  // Asked on every collective: after the first time, one load (std::call_once costs a
  // thread-local write and a pthread_once call each time).
  if (!s.ready.load(std::memory_order_acquire)) std::call_once(s.once, init);
  if (level > s.level.load(std::memory_order_relaxed)) return false;
  // Warnings are shown whatever the subsystem mask says.
  return level <= kWarn || (s.subsys.load(std::memory_order_relaxed) & subsys) != 0;
}

void write(Level level, uint32_t subsys, const char* file, int line, const char* fmt, ...) {
  State& s = state();
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  long tid = syscall(SYS_gettid);
  std::lock_guard<std::mutex> lock(s.mutex);
  if (level == kTrace) {
    const char* base = std::strrchr(file, '/');
    std::fprintf(s.out, "%s:%d:%ld [%d] loom %s %s:%d %s\n", s.host.c_str(), getpid(), tid, tlsRank,
                 levelName(level), base ? base + 1 : file, line, msg);
  } else {
    std::fprintf(s.out, "%s:%d:%ld [%d] loom %s %s\n", s.host.c_str(), getpid(), tid, tlsRank,
                 levelName(level), msg);
  }
}

void reload() {
  State& s = state();
  std::call_once(s.once, init);
  s.level = parseLevel(settings::get(settings::kDebug));
  s.subsys = parseSubsys(settings::get(settings::kDebugSubsys));
}

RankScope::RankScope(int rank) : previous_(tlsRank) {
  tlsRank = rank;
}
RankScope::~RankScope() {
  tlsRank = previous_;
}

}  // namespace loom::log
