// LOOM_HOST_DEVICE: a function that host code and CUDA kernels both call (__host__
// __device__ under nvcc, nothing under a host compiler).
#pragma once

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif
