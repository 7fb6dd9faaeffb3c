// common/settings.h: how values parse, and that a value that does not parse keeps the
// default (an unparsable boolean used to mean 0 whatever the default: LOOM_PDL=on turned
// PDL off).
#include "common/settings.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>

namespace {

using namespace loom;

struct Env {
  const char* name;
  Env(const char* n, const char* v) : name(n) {
    setenv(n, v, 1);
    settings::reloadForTest();
  }
  ~Env() { unsetenv(name); }
};

TEST(Settings, BooleansInEverySpelling) {
  for (const char* yes : {"1", "true", "TRUE", "yes", "Yes", "on", "ON", "y"}) {
    Env e("LOOM_SHM_DISABLE", yes);  // default 0
    EXPECT_TRUE(settings::get(settings::kShmDisable)) << yes;
  }
  for (const char* no : {"0", "false", "False", "no", "off", "OFF", "n"}) {
    Env e("LOOM_PDL", no);  // default 1
    EXPECT_FALSE(settings::get(settings::kPdl)) << no;
  }
}

TEST(Settings, AValueThatDoesNotParseKeepsTheDefault) {
  {
    Env e("LOOM_PDL", "maybe");  // default 1
    EXPECT_TRUE(settings::get(settings::kPdl));
  }
  {
    Env e("LOOM_SHM_DISABLE", "2");  // default 0
    EXPECT_FALSE(settings::get(settings::kShmDisable));
  }
  {
    Env e("LOOM_TIMEOUT_MS", "12s");
    EXPECT_EQ(settings::get(settings::kTimeoutMs), 300000);
  }
}

TEST(Settings, TheNcclNameWorksAndTheLoomNameWins) {
  {
    Env n("NCCL_SHM_DISABLE", "1");
    EXPECT_TRUE(settings::get(settings::kShmDisable));
    EXPECT_EQ(settings::sourceOf(settings::kShmDisable), "NCCL_SHM_DISABLE");
    Env l("LOOM_SHM_DISABLE", "0");
    EXPECT_FALSE(settings::get(settings::kShmDisable));
    EXPECT_EQ(settings::sourceOf(settings::kShmDisable), "LOOM_SHM_DISABLE");
  }
  EXPECT_EQ(settings::sourceOf(settings::kShmDisable), "default");
}

}  // namespace

namespace {

// The handles and the table come from one list (settings_list.h): names are unique,
// LOOM_-prefixed, typed as declared, and every handle reads its own entry.
TEST(Settings, HandlesAndTableAgree) {
  std::set<std::string> names;
  for (const auto& d : settings::all()) {
    EXPECT_EQ(std::string(d.name).rfind("LOOM_", 0), 0u) << d.name;
    EXPECT_TRUE(names.insert(d.name).second) << d.name << " twice";
    EXPECT_NE(std::string(d.doc), "") << d.name;
  }
  EXPECT_EQ(names.size(), settings::all().size());
  EXPECT_EQ(std::string(settings::kTimeoutMs.name), "LOOM_TIMEOUT_MS");
  EXPECT_EQ(settings::get(settings::kTimeoutMs), 300000);
  EXPECT_EQ(settings::get(settings::kDebug), "WARN");
  EXPECT_EQ(settings::sourceOf(settings::kNetLanes), "default");
  {
    settings::ScopedSetting s(settings::kNetLanes, "2");
    EXPECT_EQ(settings::get(settings::kNetLanes), 2);
    EXPECT_EQ(settings::sourceOf(settings::kNetLanes), "LOOM_NET_LANES");
  }
  EXPECT_EQ(settings::get(settings::kNetLanes), 4);
}

}  // namespace

namespace {

using settings::Amount;

TEST(Settings, SizesTakeUnitsAndTheirWords) {
  const char* words = "auto|off|any";
  auto size = [&](const char* text) { return settings::parseAmount(text, words, true); };
  EXPECT_EQ(size("4096")->value, 4096u);
  EXPECT_EQ(size("4k")->value, 4096u);
  EXPECT_EQ(size("256KiB")->value, 256u << 10);
  EXPECT_EQ(size("64M")->value, 64u << 20);
  EXPECT_EQ(size("64mb")->value, 64u << 20);
  EXPECT_EQ(size("2G")->value, uint64_t(2) << 30);
  EXPECT_EQ(size("0")->value, 0u);
  EXPECT_EQ(size("AUTO")->kind, Amount::Kind::kAuto);
  EXPECT_EQ(size("off")->kind, Amount::Kind::kOff);
  EXPECT_EQ(size("any")->kind, Amount::Kind::kAny);
  // The old spellings of auto and never are not sizes: -1 and the like must not pass for one.
  for (const char* bad :
       {"-1", "", "M", "4X", "4 M", "1.5M", "99999999999999999999", "16E", "9000000T", "never"}) {
    EXPECT_FALSE(size(bad).has_value()) << bad;
  }
  // A word the setting does not list is not taken.
  EXPECT_FALSE(settings::parseAmount("off", "auto", true).has_value());
  // Counts take no unit.
  EXPECT_FALSE(settings::parseAmount("4k", "auto", false).has_value());
  EXPECT_EQ(settings::parseAmount("12", "auto", false)->value, 12u);
}

TEST(Settings, UpToAndFromReadOffAndAnyTheRightWay) {
  const Amount off{Amount::Kind::kOff, 0}, any{Amount::Kind::kAny, 0},
      autoAmount{Amount::Kind::kAuto, 0}, four{Amount::Kind::kValue, 4};
  EXPECT_EQ(off.upTo(7), 0u);
  EXPECT_EQ(off.from(7), UINT64_MAX);
  EXPECT_EQ(any.upTo(7), UINT64_MAX);
  EXPECT_EQ(any.from(7), 0u);
  EXPECT_EQ(autoAmount.upTo(7), 7u);
  EXPECT_EQ(autoAmount.from(7), 7u);
  EXPECT_EQ(four.upTo(7), 4u);
  EXPECT_EQ(four.from(7), 4u);
}

TEST(Settings, SizeSettingsReadTheirWordsAndKeepTheDefaultOtherwise) {
  {
    Env e("LOOM_P2P_CE_BYTES", "off");
    EXPECT_EQ(settings::get(settings::kP2pCeBytes).kind, Amount::Kind::kOff);
  }
  {
    Env e("LOOM_P2P_CE_BYTES", "32M");
    EXPECT_EQ(settings::get(settings::kP2pCeBytes).value, 32u << 20);
  }
  {
    Env e("LOOM_P2P_CE_BYTES", "-1");  // was auto; now not a size: the default, auto
    EXPECT_TRUE(settings::get(settings::kP2pCeBytes).isAuto());
  }
  {
    Env e("NCCL_BUFFSIZE", "4194304");  // NCCL's plain byte count
    EXPECT_EQ(settings::get(settings::kBuffsize).value, 4u << 20);
  }
  {
    Env e("LOOM_SPIN_US", "0");  // 0 is a value here (yield at once), not auto
    EXPECT_EQ(settings::get(settings::kSpinUs), (Amount{Amount::Kind::kValue, 0}));
  }
  EXPECT_TRUE(settings::get(settings::kSpinUs).isAuto());
  EXPECT_EQ(settings::get(settings::kP2pPullReduceBytes).kind, Amount::Kind::kAny);
  EXPECT_EQ(settings::valueText(*std::find_if(
                settings::all().begin(), settings::all().end(),
                [](const auto& d) { return std::string(d.name) == "LOOM_P2P_PULL_BYTES"; })),
            "64M");
}

TEST(Settings, ChoicesInAnyCaseComeBackInTheirOwnSpelling) {
  {
    Env e("NCCL_DEBUG", "info");
    EXPECT_EQ(settings::get(settings::kDebug), "INFO");
  }
  {
    Env e("LOOM_PROTO", "LL128");
    EXPECT_EQ(settings::get(settings::kProto), "ll128");
  }
  {
    Env e("LOOM_SOCKET_FAMILY", "af_inet6");
    EXPECT_EQ(settings::get(settings::kSocketFamily), "AF_INET6");
  }
  {
    Env e("LOOM_DEVICE", "gpu");  // not a choice: the default, and tryGet says so
    EXPECT_EQ(settings::get(settings::kDevice), "auto");
    EXPECT_FALSE(settings::tryGet(settings::kDevice).has_value());
  }
  {
    Env e("LOOM_PROTO", "LL,LL128");  // NCCL's lists: loom forces one protocol or none
    EXPECT_EQ(settings::get(settings::kProto), "auto");
  }
}

// Every default parses as its own type, and every word list belongs to a type that takes
// words.
TEST(Settings, EveryDefaultParses) {
  for (const auto& d : settings::all()) {
    const std::string words = d.words;
    switch (d.type) {
      case settings::Type::kCount:
      case settings::Type::kSize:
        EXPECT_TRUE(settings::parseAmount(d.defaultValue, d.words, d.type == settings::Type::kSize))
            << d.name;
        break;
      case settings::Type::kChoice:
        EXPECT_TRUE(settings::parseChoice(d.defaultValue, d.words)) << d.name;
        break;
      default: EXPECT_EQ(words, "") << d.name << ": only counts, sizes and choices take words";
    }
  }
}

}  // namespace
