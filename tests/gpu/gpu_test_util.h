// What the GPU tests share: how many GPUs this machine has, and assertions on CUDA and
// NCCL calls that print the error.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

namespace loom::test {

inline int gpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
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
