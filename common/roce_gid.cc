#include "common/roce_gid.h"

#include <arpa/inet.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/log.h"
#include "common/settings.h"

namespace loom::roce {

namespace {

const char* familyName(int family) {
  return family == 6 ? "AF_INET6" : "AF_INET";
}

// The first `bits` bits of a and b are equal.
bool samePrefix(const unsigned char* a, const unsigned char* b, int bits) {
  const int bytes = bits / 8, rest = bits % 8;
  if (std::memcmp(a, b, static_cast<size_t>(bytes)) != 0) return false;
  if (rest == 0) return true;
  const unsigned char mask = static_cast<unsigned char>(0xff << (8 - rest));
  return (a[bytes] & mask) == (b[bytes] & mask);
}

// The entry is an address of the rule's family (a global one for AF_INET6) inside its range.
bool fits(const Gid& g, const GidRule& rule) {
  if (rule.family == 4) {
    if (!g.ipv4Mapped()) return false;
    return !rule.ranged || samePrefix(g.raw + 12, rule.prefix, rule.prefixBits);
  }
  if (g.ipv4Mapped() || g.linkLocal()) return false;
  return !rule.ranged || samePrefix(g.raw, rule.prefix, rule.prefixBits);
}

int versionOf(Gid::Type t) {
  return t == Gid::Type::kRoceV2 ? 2 : 1;
}

// The entry is an address of the rule's family, whatever the range.
bool ofFamily(const Gid& g, const GidRule& rule) {
  return rule.family == 4 ? g.ipv4Mapped() : !g.ipv4Mapped() && !g.linkLocal();
}

// Lower is preferred: an entry that fits the rule, then one of its family outside the
// range, then the others; among those the rule's RoCE version, then IPv4, global IPv6,
// link-local.
int rank(const Gid& g, const GidRule& rule) {
  const int kind = g.ipv4Mapped() ? 0 : (g.linkLocal() ? 2 : 1);
  const int fit = fits(g, rule) ? 0 : (ofFamily(g, rule) ? 10 : 20);
  return fit + (versionOf(g.type) == rule.version ? 0 : 3) + kind;
}

std::string tableText(const std::vector<Gid>& table) {
  std::string s;
  for (const Gid& g : table) {
    if (!s.empty()) s += "; ";
    s += std::to_string(g.index) + ": " + g.text() + " " + typeName(g.type);
    if (!g.netdev.empty()) s += " (" + g.netdev + ")";
  }
  return s.empty() ? std::string("no populated entry") : s;
}

}  // namespace

bool Gid::ipv4Mapped() const {
  static const unsigned char prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(raw, prefix, sizeof(prefix)) == 0;
}

bool Gid::linkLocal() const {
  return raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80;
}

std::string Gid::text() const {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, raw, buf, sizeof(buf));
  return buf;
}

const char* typeName(Gid::Type t) {
  switch (t) {
    case Gid::Type::kIb: return "IB";
    case Gid::Type::kRoceV1: return "RoCE v1";
    case Gid::Type::kRoceV2: return "RoCE v2";
  }
  return "?";
}

bool parseGid(const std::string& text, unsigned char raw[16]) {
  return inet_pton(AF_INET6, text.c_str(), raw) == 1;
}

Result<GidRule> GidRule::parse(int forced, const std::string& family, int version,
                               const std::string& range) {
  GidRule r;
  r.forced = forced;
  if (family == "AF_INET" || family.empty()) {
    r.family = 4;
  } else if (family == "AF_INET6") {
    r.family = 6;
  } else {
    return errorf(Code::kInvalidArgument, "LOOM_IB_ADDR_FAMILY=%s: AF_INET or AF_INET6",
                  family.c_str());
  }
  if (version != 1 && version != 2) {
    return errorf(Code::kInvalidArgument, "LOOM_IB_ROCE_VERSION_NUM=%d: 1 or 2", version);
  }
  r.version = version;
  if (range.empty()) return r;
  // "10.0.0.0/8" for AF_INET, "2001:db8::/32" for AF_INET6, as NCCL_IB_ADDR_RANGE.
  auto bad = [&] {
    return errorf(Code::kInvalidArgument,
                  "LOOM_IB_ADDR_RANGE=%s: an address and a prefix length of LOOM_IB_ADDR_FAMILY "
                  "(%s), as 10.0.0.0/8 or fd00::/8",
                  range.c_str(), familyName(r.family));
  };
  const size_t slash = range.find('/');
  if (slash == std::string::npos) return bad();
  const std::string addr = range.substr(0, slash), bits = range.substr(slash + 1);
  char* end = nullptr;
  const long n = std::strtol(bits.c_str(), &end, 10);
  const int most = r.family == 4 ? 32 : 128;
  if (bits.empty() || *end || n < 0 || n > most) return bad();
  if (inet_pton(r.family == 4 ? AF_INET : AF_INET6, addr.c_str(), r.prefix) != 1) return bad();
  r.ranged = true;
  r.prefixBits = static_cast<int>(n);
  r.rangeText = range;
  return r;
}

GidRule GidRule::fromSettings() {
  const settings::Amount forced = settings::get(settings::kIbGidIndex);
  const int index = forced.isAuto() ? -1 : static_cast<int>(forced.value);
  const std::string family = settings::get(settings::kIbAddrFamily);
  const int version = settings::get(settings::kIbRoceVersionNum) == "1" ? 1 : 2;
  auto rule = parse(index, family, version, settings::get(settings::kIbAddrRange));
  if (rule) return *rule;
  // As NCCL, a range that does not parse is left out, said once.
  static std::once_flag warned;
  std::call_once(warned, [&] {
    LOOM_WARN(kNet, "%s; choosing GIDs without a range", rule.status().message().c_str());
  });
  auto plain = parse(index, family, version, "");
  return plain ? *plain : GidRule{};
}

std::string GidRule::text() const {
  std::string s = std::string(familyName(family)) + ", RoCE v" + std::to_string(version);
  if (ranged) s += ", in " + rangeText;
  return s;
}

GidChoice chooseGid(const std::vector<Gid>& table, bool infiniband, const GidRule& rule,
                    const std::string& where) {
  GidChoice c;
  if (infiniband) {
    for (const Gid& g : table) {
      if (g.index == 0) {
        c.index = 0;
        c.usual = true;
        c.why = "GID 0 (InfiniBand port GID " + g.text() + ")";
        return c;
      }
    }
    c.why = where + ": InfiniBand port without GID 0 (is the subnet manager running?)";
    return c;
  }
  if (rule.forced >= 0) {
    for (const Gid& g : table) {
      if (g.index == rule.forced) {
        c.index = rule.forced;
        c.usual = true;
        c.why = "GID " + std::to_string(rule.forced) + " (" + g.text() + ", " + typeName(g.type) +
                ") as LOOM_IB_GID_INDEX asks";
        return c;
      }
    }
    c.why = where + ": LOOM_IB_GID_INDEX=" + std::to_string(rule.forced) +
            " is not a populated GID; the table holds: " + tableText(table);
    return c;
  }
  const Gid* best = nullptr;
  for (const Gid& g : table) {
    if (g.type == Gid::Type::kIb) continue;
    const int r = rank(g, rule);
    if (!best || r < rank(*best, rule) || (r == rank(*best, rule) && g.index < best->index)) {
      best = &g;
    }
  }
  if (!best) {
    c.why = where +
            ": no RoCE GID (no IP address on its interface?); the table holds: " + tableText(table);
    return c;
  }
  c.index = best->index;
  c.usual = fits(*best, rule) && versionOf(best->type) == rule.version;
  c.why = "GID " + std::to_string(best->index) + " (" + best->text() + ", " + typeName(best->type) +
          ")";
  if (!c.usual) {
    c.why += ": no GID fits " + rule.text() +
             ", so this one is used and the peers must be able to reach it; the table holds: " +
             tableText(table) +
             " (LOOM_IB_GID_INDEX, LOOM_IB_ADDR_FAMILY, LOOM_IB_ROCE_VERSION_NUM or "
             "LOOM_IB_ADDR_RANGE choose another)";
  }
  return c;
}

}  // namespace loom::roce
