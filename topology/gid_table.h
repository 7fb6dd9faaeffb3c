// An RDMA port's GID table as sysfs shows it.
//
// /sys/class/infiniband/<dev>/ports/<port>/gids/<i> holds entry i (one file per slot, up
// to 256, unpopulated slots all zero); gid_attrs/types/<i> says "IB/RoCE v1" or
// "RoCE v2" and gid_attrs/ndevs/<i> the network interface of a RoCE entry.
#pragma once

#include <string>
#include <vector>

#include "common/roce_gid.h"
#include "topology/reader.h"
#include "topology/system.h"

namespace loom::topology {

// The populated (non-zero) entries of the GID table under `portDir`
// ("/sys/class/infiniband/mlx5_0/ports/1"), by index, read up to the first missing slot.
// Type and netdev are read only for populated entries, so an empty slot costs one read.
// Empty when the port has no table.
std::vector<GidEntry> readGidTable(const Reader& reader, const std::string& portDir);

// The table as the GID choice reads it (common/roce_gid.h: chooseGid, shared with the ib
// transport): "RoCE v2" entries as v2, the others as v1 on a RoCE port and IB on an
// InfiniBand one; an entry whose text is not a GID is left out.
std::vector<roce::Gid> roceTable(const std::vector<GidEntry>& table, bool infiniband);

}  // namespace loom::topology
