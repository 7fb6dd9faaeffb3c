// An RDMA port's GID table as sysfs shows it, and the entry NCCL would use by default.
//
// /sys/class/infiniband/<dev>/ports/<port>/gids/<i> holds entry i (one file per slot, up
// to 256, unpopulated slots all zero); gid_attrs/types/<i> says "IB/RoCE v1" or
// "RoCE v2" and gid_attrs/ndevs/<i> the network interface of a RoCE entry.
#pragma once

#include <string>
#include <vector>

#include "topology/reader.h"
#include "topology/system.h"

namespace loom::topology {

// The populated (non-zero) entries of the GID table under `portDir`
// ("/sys/class/infiniband/mlx5_0/ports/1"), by index, read up to the first missing slot.
// Type and netdev are read only for populated entries, so an empty slot costs one read.
// Empty when the port has no table.
std::vector<GidEntry> readGidTable(const Reader& reader, const std::string& portDir);

// The GID index NCCL uses by default on a port with this table; -1 when it is empty.
// InfiniBand: index 0 (the port GID). RoCE, as NCCL with its defaults
// (NCCL_IB_ADDR_FAMILY=AF_INET, NCCL_IB_ROCE_VERSION_NUM=2) does when the port has an
// IPv4 address: RoCE v2 with an IPv4-mapped address (::ffff:a.b.c.d), else another RoCE
// v2 entry (global before link-local), else RoCE v1 in the same order; the lowest
// index among equals.
int defaultGidIndex(const std::vector<GidEntry>& table, bool infiniband);

// "0000:0000:0000:0000:0000:ffff:0a00:0001" (::ffff:10.0.0.1).
bool isIpv4MappedGid(const GidEntry& entry);
// The entry's type says RoCE v2.
bool isRoceV2Gid(const GidEntry& entry);

}  // namespace loom::topology
