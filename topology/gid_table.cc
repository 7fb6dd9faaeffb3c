#include "topology/gid_table.h"

#include <algorithm>
#include <cctype>

namespace loom::topology {
namespace {

constexpr int kMaxGids = 256;

bool isZeroGid(const std::string& gid) {
  return std::all_of(gid.begin(), gid.end(), [](char c) { return c == '0' || c == ':'; });
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

std::vector<roce::Gid> roceTable(const std::vector<GidEntry>& table, bool infiniband) {
  std::vector<roce::Gid> out;
  for (const GidEntry& e : table) {
    roce::Gid g;
    if (!roce::parseGid(e.gid, g.raw)) continue;
    g.index = e.index;
    g.netdev = e.netdev;
    g.type = infiniband                               ? roce::Gid::Type::kIb
             : e.type.find("v2") != std::string::npos ? roce::Gid::Type::kRoceV2
                                                      : roce::Gid::Type::kRoceV1;
    out.push_back(g);
  }
  return out;
}

}  // namespace loom::topology
