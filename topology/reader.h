// How detection sees the file system: every sysfs/procfs read goes through a Reader,
// so tests (and `loom-topo --sysfs-root`) point detection at a recorded tree.
//
// Paths are always the machine's absolute paths ("/sys/bus/pci/devices"); a Reader
// rooted elsewhere maps them under its root. Implementations are thread-safe for
// concurrent reads.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::topology {

class Reader {
 public:
  virtual ~Reader() = default;
  // Whole contents of a file. kSystemError when missing or unreadable.
  virtual Result<std::string> readFile(const std::string& path) const = 0;
  // Entry names of a directory (no "." or ".."), sorted. kSystemError when missing.
  virtual Result<std::vector<std::string>> listDir(const std::string& path) const = 0;
  // The path with every symlink resolved, as an absolute path of the machine
  // (symlinks in a recorded tree may be relative or absolute-from-its-root).
  virtual Result<std::string> realPath(const std::string& path) const = 0;
  // True when the path exists (file, directory or resolvable link).
  virtual bool exists(const std::string& path) const = 0;
  // True when this reader looks at the running machine, so live sources (NVML,
  // ibverbs, getifaddrs) describe the same machine.
  virtual bool isLive() const = 0;
  // Where this reader is rooted, for messages ("/" or a recorded tree's folder).
  virtual std::string describe() const = 0;

  // readFile with surrounding whitespace trimmed; `fallback` on any error.
  std::string readTrimmed(const std::string& path, const std::string& fallback = "") const;
};

// Reads the file system under `root` ("/" for the live machine).
//
// Cost: on the live machine the kernel follows symlinks; under another root each link
// must be resolved inside the tree, so the resolved directories are cached (a recorded
// tree does not change while it is read), and a read costs one lstat beyond the open.
class DirReader : public Reader {
 public:
  explicit DirReader(std::string root = "/");
  Result<std::string> readFile(const std::string& path) const override;
  Result<std::vector<std::string>> listDir(const std::string& path) const override;
  Result<std::string> realPath(const std::string& path) const override;
  bool exists(const std::string& path) const override;
  bool isLive() const override { return root_.empty(); }
  std::string describe() const override { return root_.empty() ? "/" : root_; }

 private:
  struct DirCache;
  std::string host(const std::string& path) const { return root_ + path; }
  // Where `path` is on this machine's file system (root included), links resolved.
  Result<std::string> hostPath(const std::string& path) const;
  std::string root_;                 // "" for "/", else without a trailing slash
  std::shared_ptr<DirCache> cache_;  // resolved directories (recorded trees only)
};

// An in-memory tree for unit tests: files by absolute path, directories implied by
// them, symlinks as a map from link path to absolute target.
class MapReader : public Reader {
 public:
  void addFile(const std::string& path, std::string contents);
  void addLink(const std::string& path, const std::string& target);
  void addDir(const std::string& path);  // an empty directory
  Result<std::string> readFile(const std::string& path) const override;
  Result<std::vector<std::string>> listDir(const std::string& path) const override;
  Result<std::string> realPath(const std::string& path) const override;
  bool exists(const std::string& path) const override;
  bool isLive() const override { return false; }
  std::string describe() const override { return "<memory>"; }

 private:
  std::map<std::string, std::string> files_;
  std::map<std::string, std::string> links_;
  std::map<std::string, bool> dirs_;
};

// Joins and normalizes ("/a/b/../c" -> "/a/c").
std::string normalizePath(const std::string& path);

}  // namespace loom::topology
