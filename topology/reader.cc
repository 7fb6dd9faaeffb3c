#include "topology/reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>

namespace loom::topology {
namespace fs = std::filesystem;

std::string normalizePath(const std::string& path) {
  std::vector<std::string> parts;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  std::string out;
  for (const auto& p : parts) out += "/" + p;
  return out.empty() ? "/" : out;
}

namespace {

// Resolves symlinks component by component; `link` returns a link's target or nullopt.
Result<std::string> resolve(
    const std::string& path,
    const std::function<std::optional<std::string>(const std::string&)>& link) {
  std::string pending = normalizePath(path);
  for (int round = 0; round < 64; ++round) {
    std::string done;
    std::stringstream ss(pending);
    std::string part;
    bool restarted = false;
    std::vector<std::string> parts;
    while (std::getline(ss, part, '/'))
      if (!part.empty()) parts.push_back(part);
    for (size_t i = 0; i < parts.size(); ++i) {
      std::string candidate = done + "/" + parts[i];
      if (auto target = link(candidate)) {
        std::string rest;
        for (size_t j = i + 1; j < parts.size(); ++j) rest += "/" + parts[j];
        pending = normalizePath(((*target)[0] == '/' ? *target : done + "/" + *target) + rest);
        restarted = true;
        break;
      }
      done = candidate;
    }
    if (!restarted) return done.empty() ? std::string("/") : done;
  }
  return errorf(Code::kSystemError, "too many levels of symbolic links resolving %s", path.c_str());
}

}  // namespace

std::string Reader::readTrimmed(const std::string& path, const std::string& fallback) const {
  auto r = readFile(path);
  if (!r) return fallback;
  std::string s = r.value();
  size_t b = s.find_first_not_of(" \t\r\n");
  size_t e = s.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, e - b + 1);
}

struct DirReader::DirCache {
  std::mutex mutex;
  std::map<std::string, std::string> dirs;  // directory -> its resolved path
};

DirReader::DirReader(std::string root)
    : root_(std::move(root)), cache_(std::make_shared<DirCache>()) {
  while (!root_.empty() && root_.back() == '/') root_.pop_back();
}

Result<std::string> DirReader::hostPath(const std::string& path) const {
  const std::string norm = normalizePath(path);
  if (root_.empty()) return norm;
  // Resolve the directory once (a GID table is 256 files in one folder), then only
  // the last component.
  const size_t slash = norm.rfind('/');
  const std::string dir = slash == 0 ? "/" : norm.substr(0, slash);
  std::string realDir;
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    auto it = cache_->dirs.find(dir);
    if (it != cache_->dirs.end()) realDir = it->second;
  }
  if (realDir.empty()) {
    LOOM_ASSIGN_OR_RETURN(realDir, realPath(dir));
    std::lock_guard<std::mutex> lock(cache_->mutex);
    cache_->dirs[dir] = realDir;
  }
  std::string candidate = (realDir == "/" ? "" : realDir) + norm.substr(slash);
  std::error_code ec;
  if (fs::is_symlink(host(candidate), ec)) {
    LOOM_ASSIGN_OR_RETURN(candidate, realPath(candidate));
  }
  return host(candidate);
}

Result<std::string> DirReader::readFile(const std::string& path) const {
  LOOM_ASSIGN_OR_RETURN(std::string real, hostPath(path));
  // read(2) itself: a stream would turn a failing read (sysfs answers some with EINVAL
  // or EIO) into an empty file.
  const int fd = ::open(real.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return sysError(errno, "cannot read %s%s", root_.c_str(), path.c_str());
  std::string text;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      text.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const int err = errno;
    ::close(fd);
    if (n < 0) return sysError(err, "reading %s%s", root_.c_str(), path.c_str());
    return text;
  }
}

Result<std::vector<std::string>> DirReader::listDir(const std::string& path) const {
  LOOM_ASSIGN_OR_RETURN(std::string real, hostPath(path));
  std::error_code ec;
  fs::directory_iterator it(real, ec);
  if (ec) return sysError(ec.value(), "cannot list %s%s", root_.c_str(), path.c_str());
  std::set<std::string> names;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) break;
    names.insert(it->path().filename().string());
  }
  return std::vector<std::string>(names.begin(), names.end());
}

Result<std::string> DirReader::realPath(const std::string& path) const {
  return resolve(path, [&](const std::string& p) -> std::optional<std::string> {
    std::error_code ec;
    if (!fs::is_symlink(host(p), ec)) return std::nullopt;
    fs::path target = fs::read_symlink(host(p), ec);
    if (ec) return std::nullopt;
    return target.string();
  });
}

bool DirReader::exists(const std::string& path) const {
  auto real = hostPath(path);
  if (!real) return false;
  std::error_code ec;
  return fs::exists(real.value(), ec);
}

void MapReader::addFile(const std::string& path, std::string contents) {
  files_[normalizePath(path)] = std::move(contents);
}
void MapReader::addLink(const std::string& path, const std::string& target) {
  links_[normalizePath(path)] = target;
}
void MapReader::addDir(const std::string& path) {
  dirs_[normalizePath(path)] = true;
}

Result<std::string> MapReader::realPath(const std::string& path) const {
  return resolve(path, [&](const std::string& p) -> std::optional<std::string> {
    auto it = links_.find(p);
    if (it == links_.end()) return std::nullopt;
    return it->second;
  });
}

Result<std::string> MapReader::readFile(const std::string& path) const {
  LOOM_ASSIGN_OR_RETURN(std::string real, realPath(path));
  auto it = files_.find(real);
  if (it == files_.end()) return sysError(ENOENT, "cannot read %s", path.c_str());
  return it->second;
}

Result<std::vector<std::string>> MapReader::listDir(const std::string& path) const {
  LOOM_ASSIGN_OR_RETURN(std::string real, realPath(path));
  std::string prefix = real;
  if (prefix != "/") prefix += '/';
  std::set<std::string> names;
  bool found = dirs_.count(real) > 0;
  auto collect = [&](const std::string& p) {
    if (p.size() <= prefix.size() || p.compare(0, prefix.size(), prefix) != 0) return;
    names.insert(p.substr(prefix.size(), p.find('/', prefix.size()) - prefix.size()));
    found = true;
  };
  for (const auto& [p, _] : files_) collect(p);
  for (const auto& [p, _] : links_) collect(p);
  for (const auto& [p, _] : dirs_) collect(p);
  if (!found) return sysError(ENOENT, "cannot list %s", path.c_str());
  return std::vector<std::string>(names.begin(), names.end());
}

bool MapReader::exists(const std::string& path) const {
  auto real = realPath(path);
  if (!real) return false;
  if (files_.count(real.value()) || dirs_.count(real.value())) return true;
  return listDir(real.value()).isOk();
}

}  // namespace loom::topology
