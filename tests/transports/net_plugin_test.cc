// NCCL network plugins (transports/net/plugin): NCCL's rules for the library names, what
// happens when a plugin is missing, too old or fails its init (loom's own backends, and a
// reason), and choosing a loaded plugin by name. The data path through every ABI version
// is the Net suite's (net_backend_test, plugin_vN).
#include <gtest/gtest.h>

#include <string>

#include "common/settings.h"
#include "transports/net/net.h"
#include "transports/net/plugin/plugin.h"

namespace loom::transport::net {
namespace {

using settings::ScopedSetting;

std::string lib(const char* name) {
  return std::string(LOOM_TEST_PLUGIN_DIR) + "/" + name;
}

TEST(NetPluginNames, FollowNcclsRules) {
  using V = std::vector<std::vector<std::string>>;
  EXPECT_EQ(plugin::candidateLibraries(""), (V{{"libnccl-net.so"}}));
  EXPECT_EQ(plugin::candidateLibraries("none"), V{});
  EXPECT_EQ(plugin::candidateLibraries("NONE"), V{});
  EXPECT_EQ(plugin::candidateLibraries("aws-ofi"), (V{{"aws-ofi", "libnccl-net-aws-ofi.so"}}));
  EXPECT_EQ(plugin::candidateLibraries("libnccl-net-x.so"), (V{{"libnccl-net-x.so"}}));
  EXPECT_EQ(plugin::candidateLibraries("/opt/p/libx.so"), (V{{"/opt/p/libx.so"}}));
  EXPECT_EQ(plugin::candidateLibraries("libfoo"), (V{{"libfoo", "libnccl-net-libfoo.so"}}));
  EXPECT_EQ(plugin::candidateLibraries("a,,b"),
            (V{{"a", "libnccl-net-a.so"}, {"b", "libnccl-net-b.so"}}));
}

// Every way of not getting a plugin: null, a reason, and makeBackend goes on with sockets.
void expectFallback(const std::string& setting, const std::string& reason) {
  ScopedSetting p(settings::kNetPlugin, setting);
  std::string why;
  auto b = plugin::makePluginBackend(Context{}, "", &why);
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_EQ(b->get(), nullptr);
  EXPECT_NE(why.find(reason), std::string::npos) << why;
  auto own = makeBackend(Context{});
  ASSERT_TRUE(own.isOk()) << own.status().message();
  EXPECT_STRNE((*own)->name(), "Loom");  // sockets here; ib on a machine with an RDMA port
}

TEST(NetPlugin, MissingLibraryFallsBack) {
  expectFallback("/nonexistent/libnccl-net-gone.so", "/nonexistent/libnccl-net-gone.so");
  expectFallback("gone", "libnccl-net-gone.so");
}

TEST(NetPlugin, LibraryWithoutAKnownVersionFallsBack) {
  expectFallback("libm.so.6", "exports no ncclNetPlugin_vN table");
}

TEST(NetPlugin, FailedInitFallsBack) {
  expectFallback(lib("libnccl-net-loomfail.so"), "init failed");
  expectFallback(lib("libnccl-net-loomfail.so"), "always fails");  // the plugin's own words
}

TEST(NetPlugin, NoneLoadsNothing) {
  ScopedSetting p(settings::kNetPlugin, "none");
  std::string why = "x";
  auto b = plugin::makePluginBackend(Context{}, "", &why);
  ASSERT_TRUE(b.isOk());
  EXPECT_EQ(b->get(), nullptr);
  EXPECT_EQ(why, "");
}

TEST(NetPlugin, NewestVersionIsUsedAndPropertiesComeThrough) {
  ScopedSetting p(settings::kNetPlugin, lib("libnccl-net-loom.so"));
  auto b = makeBackend(Context{});
  ASSERT_TRUE(b.isOk()) << b.status().message();
  EXPECT_STREQ((*b)->name(), "Loom");
  auto own = makeSocketBackend(Context{});
  ASSERT_TRUE(own.isOk());
  ASSERT_EQ((*b)->devices(), (*own)->devices());
  for (int d = 0; d < (*b)->devices(); ++d) {
    Properties a, o;
    ASSERT_TRUE((*b)->properties(d, &a).isOk());
    ASSERT_TRUE((*own)->properties(d, &o).isOk());
    EXPECT_EQ(a.name, o.name);
    EXPECT_EQ(a.pciPath, o.pciPath);
    EXPECT_EQ(a.speedMbps, o.speedMbps);
    EXPECT_EQ(a.ptrSupport, kPtrHost);
  }
  std::string why;
  EXPECT_TRUE(plugin::makePluginBackend(Context{}, "", &why).isOk());
}

TEST(NetPlugin, LoomNetChoosesAPluginByName) {
  ScopedSetting p(settings::kNetPlugin, "/nonexistent/x.so," + lib("libnccl-net-loomv9.so"));
  {
    ScopedSetting n(settings::kNet, "loom");  // any case, as NCCL_NET
    auto b = makeBackend(Context{});
    ASSERT_TRUE(b.isOk()) << b.status().message();
    EXPECT_STREQ((*b)->name(), "Loom");
  }
  {
    ScopedSetting n(settings::kNet, "Socket");  // a built-in one by name: not the plugin
    auto b = makeBackend(Context{});
    ASSERT_TRUE(b.isOk()) << b.status().message();
    EXPECT_STREQ((*b)->name(), "socket");
  }
  {
    ScopedSetting n(settings::kNet, "Other");
    auto b = makeBackend(Context{});
    ASSERT_FALSE(b.isOk());
    EXPECT_NE(b.status().message().find("is the plugin Loom, not LOOM_NET's Other"),
              std::string::npos)
        << b.status().message();
    EXPECT_NE(b.status().message().find("/nonexistent/x.so"), std::string::npos)
        << b.status().message();
  }
}

}  // namespace
}  // namespace loom::transport::net
