// common/settings.h: how values parse, and that a value that does not parse keeps the
// default (an unparsable boolean used to mean 0 whatever the default: LOOM_PDL=on turned
// PDL off).
#include <gtest/gtest.h>

#include <cstdlib>

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
    EXPECT_TRUE(settings::getBool("LOOM_SHM_DISABLE")) << yes;
  }
  for (const char* no : {"0", "false", "False", "no", "off", "OFF", "n"}) {
    Env e("LOOM_PDL", no);  // default 1
    EXPECT_FALSE(settings::getBool("LOOM_PDL")) << no;
  }
}

TEST(Settings, AValueThatDoesNotParseKeepsTheDefault) {
  {
    Env e("LOOM_PDL", "maybe");  // default 1
    EXPECT_TRUE(settings::getBool("LOOM_PDL"));
  }
  {
    Env e("LOOM_SHM_DISABLE", "2");  // default 0
    EXPECT_FALSE(settings::getBool("LOOM_SHM_DISABLE"));
  }
  {
    Env e("LOOM_TIMEOUT_MS", "12s");
    EXPECT_EQ(settings::getInt("LOOM_TIMEOUT_MS"), 300000);
  }
}

TEST(Settings, TheNcclNameWorksAndTheLoomNameWins) {
  {
    Env n("NCCL_SHM_DISABLE", "1");
    EXPECT_TRUE(settings::getBool("LOOM_SHM_DISABLE"));
    EXPECT_EQ(settings::sourceOf("LOOM_SHM_DISABLE"), "NCCL_SHM_DISABLE");
    Env l("LOOM_SHM_DISABLE", "0");
    EXPECT_FALSE(settings::getBool("LOOM_SHM_DISABLE"));
    EXPECT_EQ(settings::sourceOf("LOOM_SHM_DISABLE"), "LOOM_SHM_DISABLE");
  }
  EXPECT_EQ(settings::sourceOf("LOOM_SHM_DISABLE"), "default");
}

}  // namespace
