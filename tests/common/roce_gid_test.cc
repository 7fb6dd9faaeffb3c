// The GID a RoCE port uses (common/roce_gid.h): NCCL's rule and variables, and the messages
// that say what the table holds when the choice is not the usual one.
#include "common/roce_gid.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include "common/settings.h"

namespace loom::roce {
namespace {

using T = Gid::Type;

Gid gid(int index, const char* text, T type) {
  Gid g;
  g.index = index;
  EXPECT_EQ(inet_pton(AF_INET6, text, g.raw), 1) << text;
  g.type = type;
  return g;
}

GidRule rule(int forced = -1, const char* family = "AF_INET", int version = 2,
             const char* range = "") {
  auto r = GidRule::parse(forced, family, version, range);
  EXPECT_TRUE(r.isOk()) << r.status().message();
  return r.isOk() ? *r : GidRule{};
}

// As NCCL: the address family first (AF_INET: ::ffff:a.b.c.d), then the RoCE version, the
// lowest index among equals; where nothing fits, the best other, with the table in `why`.
TEST(RoceGid, FamilyThenVersionThenIndex) {
  std::vector<Gid> table = {gid(0, "fe80::1", T::kRoceV1), gid(1, "fe80::1", T::kRoceV2),
                            gid(2, "::ffff:10.0.0.1", T::kRoceV1),
                            gid(3, "::ffff:10.0.0.1", T::kRoceV2)};
  GidChoice c = chooseGid(table, false, rule(), "d");
  EXPECT_EQ(c.index, 3);
  EXPECT_TRUE(c.usual);
  table.pop_back();
  c = chooseGid(table, false, rule(), "mlx5_0 port 1");
  EXPECT_EQ(c.index, 2) << "an IPv4 entry of version 1 before a link-local one of version 2";
  EXPECT_FALSE(c.usual);
  EXPECT_NE(c.why.find("no GID fits AF_INET, RoCE v2"), std::string::npos) << c.why;
  EXPECT_NE(c.why.find("1: fe80::1 RoCE v2"), std::string::npos) << c.why;
  EXPECT_EQ(chooseGid(table, false, rule(-1, "AF_INET", 1), "d").index, 2);
  EXPECT_TRUE(chooseGid(table, false, rule(-1, "AF_INET", 1), "d").usual);
  // No IPv4 at all: global IPv6 before link-local.
  std::vector<Gid> v6 = {gid(0, "fe80::1", T::kRoceV2), gid(5, "2001:db8::5", T::kRoceV2)};
  EXPECT_EQ(chooseGid(v6, false, rule(), "d").index, 5);
  EXPECT_FALSE(chooseGid(v6, false, rule(), "d").usual);
  EXPECT_TRUE(chooseGid(v6, false, rule(-1, "AF_INET6"), "d").usual);
  // Equal entries: the lowest index.
  EXPECT_EQ(
      chooseGid({gid(6, "::ffff:10.0.0.2", T::kRoceV2), gid(5, "::ffff:10.0.0.1", T::kRoceV2)},
                false, rule(), "d")
          .index,
      5);
}

// LOOM_IB_ADDR_FAMILY=AF_INET6 takes a global IPv6 entry; LOOM_IB_ADDR_RANGE the entries of
// its range first, in either family.
TEST(RoceGid, FamilyAndRange) {
  const std::vector<Gid> table = {
      gid(0, "fe80::1", T::kRoceV2), gid(1, "::ffff:10.1.0.5", T::kRoceV2),
      gid(2, "::ffff:192.168.7.5", T::kRoceV2), gid(3, "fd00:1::5", T::kRoceV2),
      gid(4, "2001:db8::5", T::kRoceV2)};
  EXPECT_EQ(chooseGid(table, false, rule(), "d").index, 1);
  EXPECT_EQ(chooseGid(table, false, rule(-1, "AF_INET", 2, "192.168.0.0/16"), "d").index, 2);
  EXPECT_EQ(chooseGid(table, false, rule(-1, "AF_INET", 2, "10.1.0.0/24"), "d").index, 1);
  EXPECT_EQ(chooseGid(table, false, rule(-1, "AF_INET6"), "d").index, 3);
  EXPECT_EQ(chooseGid(table, false, rule(-1, "AF_INET6", 2, "2001:db8::/32"), "d").index, 4);
  // Prefixes that end inside a byte: 10.1.0.0/12 holds 10.1.0.5, 10.16.0.0/12 does not.
  EXPECT_EQ(chooseGid(table, false, rule(-1, "AF_INET", 2, "10.1.0.0/12"), "d").index, 1);
  EXPECT_TRUE(chooseGid(table, false, rule(-1, "AF_INET", 2, "10.1.0.0/12"), "d").usual);
  EXPECT_FALSE(chooseGid(table, false, rule(-1, "AF_INET", 2, "10.16.0.0/12"), "d").usual);
  EXPECT_EQ(chooseGid(table, false, rule(-1, "AF_INET6", 2, "fd00::/7"), "d").index, 3);
  // Nothing in the range: the family still comes first.
  EXPECT_EQ(chooseGid(table, false, rule(-1, "AF_INET6", 2, "fc00:1::/32"), "d").index, 3);
  // A range nothing falls in: the best other, said.
  GidChoice none = chooseGid(table, false, rule(-1, "AF_INET", 2, "172.16.0.0/12"), "d");
  EXPECT_EQ(none.index, 1);
  EXPECT_FALSE(none.usual);
  EXPECT_NE(none.why.find("AF_INET, RoCE v2, in 172.16.0.0/12"), std::string::npos) << none.why;
}

TEST(RoceGid, ForcedIndexAndInfiniband) {
  std::vector<Gid> table = {gid(0, "fe80::1", T::kRoceV1), gid(3, "::ffff:10.0.0.1", T::kRoceV2)};
  EXPECT_EQ(chooseGid(table, false, rule(0), "d").index, 0);
  GidChoice bad = chooseGid(table, false, rule(7), "mlx5_0 port 1");
  EXPECT_EQ(bad.index, -1);
  EXPECT_NE(bad.why.find("LOOM_IB_GID_INDEX=7 is not a populated GID"), std::string::npos)
      << bad.why;
  EXPECT_NE(bad.why.find("3: ::ffff:10.0.0.1 RoCE v2"), std::string::npos) << bad.why;
  EXPECT_EQ(chooseGid({}, false, rule(), "d").index, -1);
  // InfiniBand: index 0, whatever is forced for RoCE.
  EXPECT_EQ(chooseGid({gid(0, "fe80::2", T::kIb)}, true, rule(3), "d").index, 0);
  EXPECT_EQ(chooseGid({}, true, rule(), "d").index, -1);
}

TEST(RoceGid, RuleFromTextAndSettings) {
  EXPECT_FALSE(GidRule::parse(-1, "AF_UNIX", 2, "").isOk());
  EXPECT_FALSE(GidRule::parse(-1, "AF_INET", 3, "").isOk());
  for (const char* bad : {"10.0.0.0", "10.0.0.0/33", "10.0.0/8", "fd00::/8", "10.0.0.0/x"}) {
    auto r = GidRule::parse(-1, "AF_INET", 2, bad);
    ASSERT_FALSE(r.isOk()) << bad;
    EXPECT_NE(r.status().message().find("LOOM_IB_ADDR_RANGE"), std::string::npos);
  }
  EXPECT_FALSE(GidRule::parse(-1, "AF_INET6", 2, "fd00::/129").isOk());
  settings::ScopedSetting family(settings::kIbAddrFamily, "AF_INET6");
  settings::ScopedSetting version(settings::kIbRoceVersionNum, "1");
  settings::ScopedSetting range(settings::kIbAddrRange, "fd00::/8");
  settings::ScopedSetting index(settings::kIbGidIndex, "4");
  const GidRule r = GidRule::fromSettings();
  EXPECT_EQ(r.family, 6);
  EXPECT_EQ(r.version, 1);
  EXPECT_EQ(r.forced, 4);
  EXPECT_EQ(r.text(), "AF_INET6, RoCE v1, in fd00::/8");
}

// From the environment, as NCCL: a range that does not parse is left out (with a warning),
// a family or version that is not one falls back to its default.
TEST(RoceGid, SettingsThatDoNotParse) {
  settings::ScopedSetting range(settings::kIbAddrRange, "10.0.0/8");
  settings::ScopedSetting family(settings::kIbAddrFamily, "AF_UNIX");
  settings::ScopedSetting version(settings::kIbRoceVersionNum, "3");
  const GidRule r = GidRule::fromSettings();
  EXPECT_FALSE(r.ranged);
  EXPECT_EQ(r.family, 4);
  EXPECT_EQ(r.version, 2);
  EXPECT_EQ(r.forced, -1);
}

}  // namespace
}  // namespace loom::roce
