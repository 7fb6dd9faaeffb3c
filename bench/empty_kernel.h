// A kernel that does nothing, for timing launches (gpu_launch_probe).
#pragma once

#include <cuda_runtime.h>

// Launches it with one block of 64 threads on `stream`.
void launchEmptyKernel(cudaStream_t stream);
