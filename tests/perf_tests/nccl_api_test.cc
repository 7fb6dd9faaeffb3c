// --compare's library search and loading (perf_tests/harness/nccl_api.h), with a made-up
// environment and file system, and with loom's own libnccl.so.2 as the library to load.
#include "perf_tests/harness/nccl_api.h"

#include <dlfcn.h>
#include <glob.h>
#include <gtest/gtest.h>

#include <map>

namespace loom::perf {
namespace {

// An environment whose glob answers from a table (pattern -> matches).
NcclSearchEnv fakeEnv(std::map<std::string, std::vector<std::string>> files) {
  NcclSearchEnv env;
  env.glob = [files](const std::string& pattern) {
    const auto it = files.find(pattern);
    return it != files.end() ? it->second : std::vector<std::string>{};
  };
  return env;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(NcclSearch, PatternsInOrder) {
  NcclSearchEnv env = fakeEnv({});
  env.ncclHome = "/opt/nccl";
  env.pythonPath = "/p1::/p2";
  env.home = "/home/u";
  env.virtualEnv = "/venv";
  const std::vector<std::string> p = ncclSearchPatterns(env);
  ASSERT_GE(p.size(), 8u);
  EXPECT_EQ(p[0], "/opt/nccl/lib/libnccl.so.2");
  EXPECT_EQ(p[1], "/p1/nvidia/nccl/lib/libnccl.so.2");
  EXPECT_EQ(p[2], "/p2/nvidia/nccl/lib/libnccl.so.2");
  EXPECT_EQ(p[3], "/venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2");
  EXPECT_EQ(p[4], "/home/u/.local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2");
  auto has = [&](const std::string& s) { return std::find(p.begin(), p.end(), s) != p.end(); };
  EXPECT_TRUE(has("/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2"));
  EXPECT_TRUE(has("/usr/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2"));
  EXPECT_TRUE(has("/opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2"));
  EXPECT_EQ(p[p.size() - 2], "/usr/lib/x86_64-linux-gnu/libnccl.so.2");
  EXPECT_EQ(p.back(), "/usr/local/cuda/lib64/libnccl.so.2");
  // Unset variables add nothing.
  EXPECT_EQ(ncclSearchPatterns(fakeEnv({})).size(), p.size() - 5);
}

TEST(NcclSearch, CandidatesFollowThePatternsWithoutRepeats) {
  NcclSearchEnv env = fakeEnv({
      {"/usr/local/cuda/lib64/libnccl.so.2", {"/usr/local/cuda/lib64/libnccl.so.2"}},
      {"/opt/*/.venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
       {"/opt/a/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
        "/opt/b/.venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"}},
      {"/x/nvidia/nccl/lib/libnccl.so.2", {"/usr/local/cuda/lib64/libnccl.so.2"}},
  });
  env.pythonPath = "/x";
  EXPECT_EQ(ncclCandidates(env),
            (std::vector<std::string>{
                "/usr/local/cuda/lib64/libnccl.so.2",
                "/opt/a/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2",
                "/opt/b/.venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2"}));
}

// The sanitizers' runtimes refuse libraries opened with RTLD_DEEPBIND, which --compare
// needs (docs/perf_tests.md): the loading tests run in the normal build only.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define LOOM_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define LOOM_TEST_SANITIZED 1
#endif
#endif
#if defined(LOOM_TEST_SANITIZED)
#define SKIP_UNDER_ASAN() \
  GTEST_SKIP() << "the sanitizer refuses RTLD_DEEPBIND (dlopen of a second NCCL)"
#else
#define SKIP_UNDER_ASAN() \
  do {                    \
  } while (0)
#endif

TEST(NcclLoad, NothingFoundSaysWhereItLooked) {
  SKIP_UNDER_ASAN();
  NcclSearchEnv env = fakeEnv({});
  env.ncclHome = "/opt/nccl";
  const NcclLoad r = loadCompareNccl("", env, NcclApi{});
  EXPECT_EQ(r.api, nullptr);
  EXPECT_TRUE(contains(r.error, "no libnccl.so.2 found")) << r.error;
  EXPECT_TRUE(contains(r.error, "/opt/nccl/lib/libnccl.so.2")) << r.error;
  EXPECT_TRUE(contains(r.error, "/usr/local/cuda/lib64/libnccl.so.2")) << r.error;
  EXPECT_TRUE(contains(r.error, "--compare nccl=")) << r.error;
}

TEST(NcclLoad, MissingFileNamesIt) {
  SKIP_UNDER_ASAN();
  const NcclLoad r = loadCompareNccl("/nonexistent/libnccl.so.2", fakeEnv({}), NcclApi{});
  EXPECT_EQ(r.api, nullptr);
  EXPECT_TRUE(contains(r.error, "--compare nccl=/nonexistent/libnccl.so.2")) << r.error;
  EXPECT_TRUE(contains(r.error, "cannot open")) << r.error;
}

TEST(NcclLoad, NotAnNcclLibrary) {
  SKIP_UNDER_ASAN();
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&globfree), &info), 0);  // libc
  const NcclLoad r = loadCompareNccl(info.dli_fname, fakeEnv({}), NcclApi{});
  EXPECT_EQ(r.api, nullptr);
  EXPECT_TRUE(contains(r.error, "not an NCCL library (no ncclGetVersion")) << r.error;
}

TEST(NcclLoad, SearchFallsThroughToALibraryThatLoads) {
  SKIP_UNDER_ASAN();
#ifndef LOOM_PERF_TEST_NCCL_LIBRARY
  GTEST_SKIP() << "loom's libnccl.so.2 is not built in this configuration";
#else
  const std::string loom = LOOM_PERF_TEST_NCCL_LIBRARY;
  const NcclSearchEnv env = fakeEnv({{"/p/nvidia/nccl/lib/libnccl.so.2", {"/missing.so", loom}}});
  NcclSearchEnv withPath = env;
  withPath.pythonPath = "/p";
  const NcclLoad r = loadCompareNccl("", withPath, NcclApi{});
  ASSERT_NE(r.api, nullptr) << r.error;
  EXPECT_EQ(r.api->label, "NCCL");
  EXPECT_EQ(r.api->path, loom);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_TRUE(contains(r.notes[0], "skipped /missing.so")) << r.notes[0];
  int version = 0;
  EXPECT_EQ(r.api->getVersion(&version), ncclSuccess);
  EXPECT_GT(version, 0);
  EXPECT_NE(r.api->alltoAll, nullptr);  // loom has the optional ones too
  EXPECT_NE(r.api->getLastError, nullptr);
#endif
}

// The library the binary is linked against is not "a second NCCL": a search skips it, an
// explicit path is taken with a note. (This test binary links no libnccl; loom's, once
// dlopen'd, stands for the linked one, found as the binaries find it: by its soname.)
TEST(NcclLoad, TheLinkedLibraryIsNotASecondNccl) {
  SKIP_UNDER_ASAN();
#ifndef LOOM_PERF_TEST_NCCL_LIBRARY
  GTEST_SKIP() << "loom's libnccl.so.2 is not built in this configuration";
#else
  const std::string loom = LOOM_PERF_TEST_NCCL_LIBRARY;
  void* handle = dlopen(loom.c_str(), RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  NcclApi linked;
  linked.label = "loom";
  linked.getVersion = reinterpret_cast<ncclResult_t (*)(int*)>(dlsym(handle, "ncclGetVersion"));
  ASSERT_NE(linked.getVersion, nullptr);

  NcclSearchEnv env = fakeEnv({{"/usr/local/cuda/lib64/libnccl.so.2", {loom}}});
  const NcclLoad searched = loadCompareNccl("", env, linked);
  EXPECT_EQ(searched.api, nullptr);
  EXPECT_TRUE(contains(searched.error, "already linked against (loom)")) << searched.error;

  const NcclLoad given = loadCompareNccl(loom, env, linked);
  ASSERT_NE(given.api, nullptr) << given.error;
  ASSERT_FALSE(given.notes.empty());
  EXPECT_TRUE(contains(given.notes.back(), "comparing it with itself")) << given.notes.back();
#endif
}

}  // namespace
}  // namespace loom::perf
