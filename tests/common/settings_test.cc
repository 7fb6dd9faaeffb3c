// common/settings.h: how values parse, and that a value that does not parse keeps the
// default (an unparsable boolean used to mean 0 whatever the default: LOOM_PDL=on turned
// PDL off).
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "common/settings.h"

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
