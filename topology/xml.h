// NCCL's topology XML, read and written.
//
// The format is NCCL's (`NCCL_TOPO_FILE`, `NCCL_TOPO_DUMP_FILE`): elements system, cpu,
// pci, gpu, nvlink, nic, net with NCCL's attribute names. Attributes loom does not know
// are kept and written back, so a dump survives NCCL -> loom -> NCCL. Elements loom
// does not know are skipped (listed in `XmlReadResult::warnings`).
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "topology/system.h"

namespace loom::topology {

struct XmlReadResult {
  System system;
  std::vector<std::string> warnings;  // unknown elements, dangling values; never fatal
};

// Parses XML text. `source` names the text in errors ("topo.xml"). A malformed file
// or a bad attribute value is kInvalidArgument with "<source>:<line>: ...".
Result<XmlReadResult> parseXml(const std::string& text, const std::string& source = "<xml>");

// Reads and parses a file (kSystemError when it cannot be read).
Result<XmlReadResult> readXmlFile(const std::string& path);

// Writes `system` as NCCL-format XML (two-space indent, trailing newline).
std::string toXml(const System& system);

// Writes toXml(system) to `path`.
Status writeXmlFile(const System& system, const std::string& path);

}  // namespace loom::topology
