// What the GPU tests share: how many GPUs this machine has, and assertions on CUDA and
// NCCL calls that print the error.
#pragma once

#include <cuda_runtime.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <spawn.h>
#include <unistd.h>

#include <string>
#include <vector>

extern char** environ;

namespace loom::test {

inline int gpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// Starts this test binary again as a child running the one test `filter` names, with this
// process's environment plus `extraEnv` ("NAME=value"), its stdout and stderr into `log`.
// Tests that need processes of their own (hosts, ranks of their own) use it; start them
// before this process touches CUDA where the child must own a fresh context. Returns the
// child's pid, or -1 (with the reason in *why).
inline pid_t spawnSelf(const std::string& filter, const std::vector<std::string>& extraEnv,
                       const std::string& log, std::string* why) {
  char exe[4096] = {0};
  if (readlink("/proc/self/exe", exe, sizeof(exe) - 1) <= 0) {
    *why = "cannot read /proc/self/exe";
    return -1;
  }
  // extraEnv wins over an inherited variable of the same name (getenv takes the first).
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('=') + 1);
    bool replaced = false;
    for (const auto& x : extraEnv) replaced = replaced || x.rfind(name, 0) == 0;
    if (!replaced) env.push_back(entry);
  }
  env.insert(env.end(), extraEnv.begin(), extraEnv.end());
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string filterArg = "--gtest_filter=" + filter;
  char* argv[] = {exe, filterArg.data(), nullptr};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe, &fa, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    *why = "posix_spawn failed: " + std::to_string(rc);
    return -1;
  }
  return pid;
}

}  // namespace loom::test

#define REQUIRE_GPUS(n)                                                                    \
  do {                                                                                     \
    int have = ::loom::test::gpuCount();                                                   \
    if (have < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs, this machine has " << have; \
  } while (0)

#define CUDA_OK(x) \
  ASSERT_EQ((x), cudaSuccess) << #x << ": " << cudaGetErrorString(cudaGetLastError())
#define NCCL_OK(x) ASSERT_EQ((x), ncclSuccess) << #x << ": " << ncclGetLastError(nullptr)
