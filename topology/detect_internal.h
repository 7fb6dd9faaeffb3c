// Pieces of detection shared between detect.cc and detect_net.cc. Not public API.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "topology/detect.h"
#include "topology/reader.h"
#include "topology/system.h"

namespace loom::topology::detail {

// Collects warnings, one per source: the first message for a source wins.
class Warnings {
 public:
  std::string add(const std::string& source, const std::string& message);
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  std::set<std::string> seen_;
  std::vector<std::string> lines_;
};

// Places PCI devices into the System in NCCL's shape (switch upstream ports kept,
// root and downstream ports dropped), under the CPU of their NUMA node.
class PciTreeBuilder {
 public:
  PciTreeBuilder(const Reader& reader, System& system, Warnings& warnings);
  // The node for `busId`, created with its ancestors when new. The pointer is valid
  // until the next insert.
  Result<PciNode*> insert(const std::string& busId);

 private:
  PciNode describe(const std::string& busId) const;
  const Reader& reader_;
  System& system_;
  Warnings& warnings_;
};

bool looksLikeBusId(const std::string& s);
std::string baseName(const std::string& path);

Status detectNics(const Reader& reader, const DetectOptions& options, PciTreeBuilder& tree,
                  System& system, Warnings& warnings);

}  // namespace loom::topology::detail
