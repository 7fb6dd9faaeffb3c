// Finding and loading a second NCCL for --compare (the linked library's table is in
// linked_nccl.cc, the only file here that names the nccl* symbols).
#include "perf_tests/harness/nccl_api.h"

#include <dlfcn.h>
#include <glob.h>

#include <algorithm>
#include <cstdlib>

namespace loom::perf {
namespace {

constexpr const char* kLibrary = "libnccl.so.2";
// The nvidia-nccl-cu12 / -cu13 wheels install the library here inside site-packages.
constexpr const char* kWheelPath = "/nvidia/nccl/lib/libnccl.so.2";

std::string envOrEmpty(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

std::vector<std::string> splitPath(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t end = std::min(list.find(':', start), list.size());
    if (end > start) out.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::vector<std::string> globFiles(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  return out;  // glob(3) sorts unless GLOB_NOSORT
}

template <typename F>
void bind(void* handle, const char* name, F* out, std::vector<std::string>* missing) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  if (*out == nullptr && missing != nullptr) missing->push_back(name);
}

// Fills `api` from `handle`; returns the required symbols that are missing.
std::vector<std::string> bindAll(void* handle, NcclApi* api) {
  std::vector<std::string> missing;
  std::vector<std::string>* required = &missing;
  bind(handle, "ncclGetVersion", &api->getVersion, required);
  bind(handle, "ncclGetUniqueId", &api->getUniqueId, required);
  bind(handle, "ncclCommInitRank", &api->commInitRank, required);
  bind(handle, "ncclCommInitAll", &api->commInitAll, required);
  bind(handle, "ncclCommDestroy", &api->commDestroy, required);
  bind(handle, "ncclCommAbort", &api->commAbort, required);
  bind(handle, "ncclCommGetAsyncError", &api->commGetAsyncError, required);
  bind(handle, "ncclGetErrorString", &api->getErrorString, required);
  bind(handle, "ncclGroupStart", &api->groupStart, required);
  bind(handle, "ncclGroupEnd", &api->groupEnd, required);
  bind(handle, "ncclAllReduce", &api->allReduce, required);
  bind(handle, "ncclAllGather", &api->allGather, required);
  bind(handle, "ncclBroadcast", &api->broadcast, required);
  bind(handle, "ncclReduce", &api->reduce, required);
  bind(handle, "ncclReduceScatter", &api->reduceScatter, required);
  bind(handle, "ncclSend", &api->send, required);
  bind(handle, "ncclRecv", &api->recv, required);
  bind(handle, "ncclRedOpCreatePreMulSum", &api->redOpCreatePreMulSum, required);
  bind(handle, "ncclRedOpDestroy", &api->redOpDestroy, required);
  bind(handle, "ncclCommFinalize", &api->commFinalize, nullptr);
  bind(handle, "ncclGetLastError", &api->getLastError, nullptr);
  bind(handle, "ncclAlltoAll", &api->alltoAll, nullptr);
  bind(handle, "ncclGather", &api->gather, nullptr);
  bind(handle, "ncclScatter", &api->scatter, nullptr);
  bind(handle, "ncclCommRegister", &api->commRegister, nullptr);
  bind(handle, "ncclCommDeregister", &api->commDeregister, nullptr);
  bind(handle, "ncclCommWindowRegister", &api->commWindowRegister, nullptr);
  bind(handle, "ncclCommWindowDeregister", &api->commWindowDeregister, nullptr);
  return missing;
}

// ncclGetVersion as the linked library defines it, looked up the same way as in a dlopen'd
// handle. (&ncclGetVersion can be the executable's PLT stub in a non-PIE binary, which no
// dlsym on a library handle returns.) Falls back to the table when no libnccl.so.2 is loaded.
void* linkedVersionSymbol(const NcclApi& linked) {
  if (void* handle = dlopen(kLibrary, RTLD_LAZY | RTLD_NOLOAD)) {
    void* sym = dlsym(handle, "ncclGetVersion");
    dlclose(handle);  // drops the reference NOLOAD took; the library stays loaded
    if (sym != nullptr) return sym;
  }
  return reinterpret_cast<void*>(linked.getVersion);
}

std::string joined(const std::vector<std::string>& items, const char* separator) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : separator) + s;
  return out;
}

// Tries one file. `linkedSymbol` is linkedVersionSymbol(linked), taken before any candidate
// was loaded (a candidate has the same soname, so a lookup by soname could find it instead).
// Returns "" and sets *api on success, else why it failed.
std::string tryLoad(const std::string& path, bool givenPath, const NcclApi& linked,
                    void* linkedSymbol, std::unique_ptr<NcclApi>* api,
                    std::vector<std::string>* notes) {
  dlerror();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (handle == nullptr) {
    const char* why = dlerror();
    std::string text = why != nullptr ? why : "dlopen failed";
    // glibc's text starts with the path, which the caller prints already.
    if (text.rfind(path + ": ", 0) == 0) text.erase(0, path.size() + 2);
    return text;
  }
  auto table = std::make_unique<NcclApi>();
  table->label = "NCCL";
  table->path = path;
  const std::vector<std::string> missing = bindAll(handle, table.get());
  if (!missing.empty()) {
    dlclose(handle);
    return "not an NCCL library (no " + joined(missing, ", ") + ")";
  }
  if (reinterpret_cast<void*>(table->getVersion) == linkedSymbol) {
    if (!givenPath) {
      dlclose(handle);
      return "the library this binary is already linked against (" + linked.label +
             "), not a second NCCL";
    }
    notes->push_back("--compare: " + path + " is the library this binary is linked against (" +
                     linked.label +
                     "); comparing it with itself on a second set of "
                     "communicators");
  }
  // Never dlclose'd: NCCL's proxy and bootstrap threads may outlive the communicators.
  *api = std::move(table);
  return "";
}

}  // namespace

std::string NcclApi::lastError() const {
  if (getLastError == nullptr) return "";
  const char* text = getLastError(nullptr);
  return text != nullptr ? text : "";
}

NcclSearchEnv processSearchEnv() {
  NcclSearchEnv env;
  env.ncclHome = envOrEmpty("NCCL_HOME");
  env.pythonPath = envOrEmpty("PYTHONPATH");
  env.home = envOrEmpty("HOME");
  env.virtualEnv = envOrEmpty("VIRTUAL_ENV");
  env.condaPrefix = envOrEmpty("CONDA_PREFIX");
  env.glob = globFiles;
  return env;
}

std::vector<std::string> ncclSearchPatterns(const NcclSearchEnv& env) {
  std::vector<std::string> out;
  if (!env.ncclHome.empty()) out.push_back(env.ncclHome + "/lib/" + kLibrary);
  for (const std::string& dir : splitPath(env.pythonPath)) out.push_back(dir + kWheelPath);
  const std::string site = "/lib/python3*/site-packages";
  if (!env.virtualEnv.empty()) out.push_back(env.virtualEnv + site + kWheelPath);
  if (!env.condaPrefix.empty()) out.push_back(env.condaPrefix + site + kWheelPath);
  if (!env.home.empty()) out.push_back(env.home + "/.local" + site + kWheelPath);
  for (const char* prefix : {
           "/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
           "/usr/lib/python3/dist-packages", "/usr/lib/python3*/dist-packages",
           "/usr/lib/python3*/site-packages", "/opt/*/.venv/lib/python3*/site-packages",
           "/opt/*/venv/lib/python3*/site-packages",
           "/opt/*/lib/python3*/site-packages",  // conda and similar installs
       }) {
    out.push_back(std::string(prefix) + kWheelPath);
  }
  out.push_back(std::string("/usr/lib/x86_64-linux-gnu/") + kLibrary);
  out.push_back(std::string("/usr/local/cuda/lib64/") + kLibrary);
  return out;
}

std::vector<std::string> ncclCandidates(const NcclSearchEnv& env) {
  std::vector<std::string> out;
  for (const std::string& pattern : ncclSearchPatterns(env)) {
    for (const std::string& path : env.glob(pattern)) {
      if (std::find(out.begin(), out.end(), path) == out.end()) out.push_back(path);
    }
  }
  return out;
}

NcclLoad loadCompareNccl(const std::string& path, const NcclSearchEnv& env, const NcclApi& linked) {
  NcclLoad result;
  const bool givenPath = !path.empty();
  const std::vector<std::string> candidates = givenPath ? std::vector{path} : ncclCandidates(env);
  if (candidates.empty()) {
    result.error = "--compare nccl: no " + std::string(kLibrary) + " found; looked for " +
                   joined(ncclSearchPatterns(env), ", ") +
                   ". Give the file with --compare nccl=/path/to/libnccl.so.2 or set NCCL_HOME";
    return result;
  }
  void* const linkedSymbol = linkedVersionSymbol(linked);
  std::vector<std::string> failures;
  for (const std::string& candidate : candidates) {
    const std::string why =
        tryLoad(candidate, givenPath, linked, linkedSymbol, &result.api, &result.notes);
    if (why.empty()) {
      for (const std::string& f : failures) result.notes.push_back("--compare: skipped " + f);
      return result;
    }
    failures.push_back(candidate + ": " + why);
  }
  result.error = "--compare nccl" + (givenPath ? "=" + path : std::string()) +
                 ": no NCCL library could be loaded; tried " + joined(failures, "; ");
  if (!givenPath) result.error += ". Give the file with --compare nccl=/path/to/libnccl.so.2";
  return result;
}

}  // namespace loom::perf
