// Which GID a RoCE port's connections use, decided once for both readers of a port: the ib
// transport (transports/net/ib, from the verbs' GID table) and topology detection (loom-topo,
// from sysfs), so what loom-topo shows is what the transport takes.
//
// The rule is NCCL's, with its variables: LOOM_IB_GID_INDEX / NCCL_IB_GID_INDEX forces an
// index; otherwise the entries of LOOM_IB_ADDR_FAMILY (AF_INET: ::ffff:a.b.c.d; AF_INET6:
// global IPv6) inside LOOM_IB_ADDR_RANGE come first, of them those of
// LOOM_IB_ROCE_VERSION_NUM (2 by default), the lowest index among equals. Where no entry
// fits, loom still takes the best other (NCCL would take index 0, often link-local) and
// says so with the whole table. InfiniBand ports use index 0.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace loom::roce {

// One entry of a port's GID table.
struct Gid {
  int index = 0;
  unsigned char raw[16] = {};
  enum class Type { kIb, kRoceV1, kRoceV2 } type = Type::kIb;
  std::string netdev;  // the interface of a RoCE entry, "" when unknown

  bool ipv4Mapped() const;   // ::ffff:a.b.c.d
  bool linkLocal() const;    // fe80::/10
  std::string text() const;  // "::ffff:10.0.0.1", "fe80::1"
};

const char* typeName(Gid::Type type);

// The settings of the choice.
struct GidRule {
  int forced = -1;                // LOOM_IB_GID_INDEX; -1: auto
  int family = 4;                 // LOOM_IB_ADDR_FAMILY: 4 (AF_INET) or 6 (AF_INET6)
  int version = 2;                // LOOM_IB_ROCE_VERSION_NUM: 1 or 2
  bool ranged = false;            // LOOM_IB_ADDR_RANGE given
  unsigned char prefix[16] = {};  // its address (IPv4 in the first 4 bytes)
  int prefixBits = 0;
  std::string rangeText;

  // From text as the variables hold it; an error names the variable and what it takes.
  static Result<GidRule> parse(int forced, const std::string& family, int version,
                               const std::string& range);
  // From LOOM_IB_* (or NCCL_IB_*) in the environment. A family or version that is not one
  // falls back to the default (the settings warn); a range that does not parse is left
  // out with a warning, as NCCL does.
  static GidRule fromSettings();
  // "AF_INET, RoCE v2" (and the range, where one is given).
  std::string text() const;
};

struct GidChoice {
  int index = -1;      // -1: none usable
  bool usual = false;  // an entry the rule asks for (or the forced one)
  std::string why;     // what was chosen and why, or why nothing could be
};

// The GID a port with this table uses. `where` names the port in messages ("mlx5_0 port
// 1"). `why` lists the table where the choice is not the usual one.
GidChoice chooseGid(const std::vector<Gid>& table, bool infiniband, const GidRule& rule,
                    const std::string& where);

// A GID as sysfs writes it ("fe80:0000:0000:0000:0000:0000:0000:0001"); false when the
// text is not one.
bool parseGid(const std::string& text, unsigned char raw[16]);

}  // namespace loom::roce
