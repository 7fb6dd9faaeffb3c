#include "topology/gid_table.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>

namespace loom::topology {
namespace {

constexpr int kMaxGids = 256;

// The eight 16-bit groups of a GID as sysfs writes it; false when the text is not one.
bool gidGroups(const std::string& gid, uint16_t groups[8]) {
  int n = 0;
  size_t pos = 0;
  while (n < 8) {
    size_t colon = gid.find(':', pos);
    std::string part =
        gid.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    if (part.empty() || part.size() > 4 ||
        !std::all_of(part.begin(), part.end(), [](unsigned char c) { return std::isxdigit(c); })) {
      return false;
    }
    groups[n++] = static_cast<uint16_t>(std::strtoul(part.c_str(), nullptr, 16));
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  return n == 8;
}

bool isZeroGid(const std::string& gid) {
  return std::all_of(gid.begin(), gid.end(), [](char c) { return c == '0' || c == ':'; });
}

bool isLinkLocalGid(const GidEntry& e) {
  uint16_t g[8];
  return gidGroups(e.gid, g) && g[0] == 0xfe80 && !g[1] && !g[2] && !g[3];
}

// Lower is preferred: RoCE v2 before v1; IPv4-mapped, then global, then link-local.
int roceTier(const GidEntry& e) {
  int family = isIpv4MappedGid(e) ? 0 : (isLinkLocalGid(e) ? 2 : 1);
  return (isRoceV2Gid(e) ? 0 : 3) + family;
}

}  // namespace

std::vector<GidEntry> readGidTable(const Reader& reader, const std::string& portDir) {
  std::vector<GidEntry> table;
  for (int i = 0; i < kMaxGids; ++i) {
    const std::string index = std::to_string(i);
    auto text = reader.readFile(portDir + "/gids/" + index);
    if (!text) break;
    std::string gid = std::move(text.value());
    while (!gid.empty() && std::isspace(static_cast<unsigned char>(gid.back()))) gid.pop_back();
    if (gid.empty() || isZeroGid(gid)) continue;
    GidEntry e;
    e.index = i;
    e.gid = std::move(gid);
    e.type = reader.readTrimmed(portDir + "/gid_attrs/types/" + index);
    e.netdev = reader.readTrimmed(portDir + "/gid_attrs/ndevs/" + index);
    table.push_back(std::move(e));
  }
  return table;
}

int defaultGidIndex(const std::vector<GidEntry>& table, bool infiniband) {
  if (table.empty()) return -1;
  if (infiniband) {
    // Index 0 is the port GID (subnet prefix + port GUID) on every IB port.
    for (const GidEntry& e : table)
      if (e.index == 0) return 0;
    return table.front().index;
  }
  const GidEntry* best = &table.front();
  for (const GidEntry& e : table)
    if (roceTier(e) < roceTier(*best)) best = &e;
  return best->index;
}

bool isIpv4MappedGid(const GidEntry& e) {
  uint16_t g[8];
  return gidGroups(e.gid, g) && !g[0] && !g[1] && !g[2] && !g[3] && !g[4] && g[5] == 0xffff;
}

bool isRoceV2Gid(const GidEntry& e) {
  return e.type.find("v2") != std::string::npos;
}

}  // namespace loom::topology
