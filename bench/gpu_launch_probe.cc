// gpu_launch_probe: where the time of a small all-reduce goes on 2 GPUs of one process
// (nccl-tests' -g 2). Prints microseconds per call of the CUDA calls on loom's path, of
// kernel launches from one thread and from one thread per GPU, and of loom's 8-byte
// all-reduce issued from the host (as all_reduce_perf does) and replayed from CUDA graphs
// (the GPUs' own time, host launches taken away). Run it with LOOM_LAUNCH_THREADS=0 and
// =1 to compare the two ways a group is launched.
//
//   gpu_launch_probe [iterations]
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "bench/empty_kernel.h"
#include "comm/spin_worker.h"
#include "common/cuda_probe.h"

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

#define CHECK(x)                                                                        \
  do {                                                                                  \
    auto e_ = (x);                                                                      \
    if (e_ != 0) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #x, (int)e_); \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

void row(const char* what, double us) {
  std::printf("%-62s %8.2f us\n", what, us);
}

// Host time per call of `f`, and the wall time per call once `sync` returns.
void timeLoop(const char* what, int iters, const std::function<void()>& f,
              const std::function<void()>& sync) {
  for (int i = 0; i < iters / 10; ++i) f();
  sync();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) f();
  double host = since(t0) / iters;
  sync();
  double wall = since(t0) / iters;
  char text[160];
  std::snprintf(text, sizeof(text), "%s: host", what);
  row(text, host);
  std::snprintf(text, sizeof(text), "%s: until done", what);
  row(text, wall);
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 20000;
  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 2) {
    std::printf("gpu_launch_probe: needs 2 GPUs, this machine has %d\n", ngpu);
    return 0;
  }
  const char* lt = std::getenv("LOOM_LAUNCH_THREADS");
  std::printf("# gpu_launch_probe, %d iterations, LOOM_LAUNCH_THREADS=%s\n", iters,
              lt ? lt : "(unset)");
  cudaStream_t s[2];
  cudaEvent_t ev[2];
  void* buf[2];
  for (int d = 0; d < 2; ++d) {
    CHECK(cudaSetDevice(d));
    CHECK(cudaStreamCreateWithFlags(&s[d], cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&ev[d], cudaEventDisableTiming));
    CHECK(cudaMalloc(&buf[d], 4096));
    CHECK(cudaMemset(buf[d], 1, 4096));
  }
  auto syncAll = [&] {
    for (int d = 0; d < 2; ++d) CHECK(cudaStreamSynchronize(s[d]));
  };
  CHECK(cudaSetDevice(0));
  // The CUDA calls of loom's small all-reduce, one GPU.
  timeLoop(
      "empty kernel, 1 GPU", iters, [&] { launchEmptyKernel(s[0]); }, syncAll);
  timeLoop(
      "cudaEventRecord", iters, [&] { CHECK(cudaEventRecord(ev[0], s[0])); }, syncAll);
  timeLoop(
      "cudaStreamIsCapturing", iters,
      [&] {
        cudaStreamCaptureStatus st;
        CHECK(cudaStreamIsCapturing(s[0], &st));
      },
      syncAll);
  timeLoop(
      "cudaGetDevice + cudaSetDevice (same)", iters,
      [&] {
        int d;
        CHECK(cudaGetDevice(&d));
        CHECK(cudaSetDevice(d));
      },
      syncAll);
  timeLoop(
      "cudaSetDevice 0 then 1", iters,
      [&] {
        CHECK(cudaSetDevice(0));
        CHECK(cudaSetDevice(1));
      },
      syncAll);
  timeLoop(
      "cuPointerGetAttributes (memory type, managed)", iters,
      [&] { (void)loom::cuda::isDevicePointer(buf[0]); }, syncAll);
  // Two GPUs: from one thread, and from one thread per GPU.
  timeLoop(
      "empty kernel on each of 2 GPUs, one thread", iters,
      [&] {
        for (int d = 0; d < 2; ++d) {
          CHECK(cudaSetDevice(d));
          launchEmptyKernel(s[d]);
        }
      },
      syncAll);
  {
    loom::comm::SpinWorker worker(1000);
    worker.post([] { CHECK(cudaSetDevice(1)); });
    worker.wait();
    CHECK(cudaSetDevice(0));
    timeLoop(
        "empty kernel on each of 2 GPUs, a thread per GPU", iters,
        [&] {
          worker.post([&] { launchEmptyKernel(s[1]); });
          launchEmptyKernel(s[0]);
          worker.wait();
        },
        syncAll);
    timeLoop(
        "hand-over to a spinning thread and back (no CUDA)", iters,
        [&] {
          worker.post([] {});
          worker.wait();
        },
        syncAll);
  }
  // loom's all-reduce of 8 bytes, as all_reduce_perf -g 2 issues it.
  ncclComm_t comms[2];
  int devs[2] = {0, 1};
  CHECK(ncclCommInitAll(comms, 2, devs));
  auto allReduce = [&] {
    CHECK(ncclGroupStart());
    for (int d = 0; d < 2; ++d) {
      CHECK(ncclAllReduce(buf[d], static_cast<char*>(buf[d]) + 1024, 2, ncclFloat, ncclSum,
                          comms[d], s[d]));
    }
    CHECK(ncclGroupEnd());
  };
  timeLoop("loom all-reduce 8 B, group of 2 ranks", iters, allReduce, syncAll);
  timeLoop(
      "loom all-reduce 8 B, each rank's call on its own, one after the other", iters / 10,
      [&] {
        CHECK(ncclGroupStart());
        CHECK(ncclAllReduce(buf[0], static_cast<char*>(buf[0]) + 1024, 2, ncclFloat, ncclSum,
                            comms[0], s[0]));
        CHECK(ncclGroupEnd());
        CHECK(ncclAllReduce(buf[1], static_cast<char*>(buf[1]) + 1024, 2, ncclFloat, ncclSum,
                            comms[1], s[1]));
      },
      syncAll);
  // The same, captured in a graph per GPU and replayed: the GPUs' time per call.
  const int perGraph = 100;
  cudaGraphExec_t exec[2];
  for (int d = 0; d < 2; ++d) {
    CHECK(cudaSetDevice(d));
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(s[d], cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < perGraph; ++i) {
      CHECK(ncclAllReduce(buf[d], static_cast<char*>(buf[d]) + 1024, 2, ncclFloat, ncclSum,
                          comms[d], s[d]));
    }
    CHECK(cudaStreamEndCapture(s[d], &g));
    CHECK(cudaGraphInstantiate(&exec[d], g, 0));
    CHECK(cudaGraphDestroy(g));
  }
  const int replays = std::max(10, iters / perGraph / 2);
  for (int r = 0; r < 3; ++r) {
    for (int d = 0; d < 2; ++d) CHECK(cudaGraphLaunch(exec[d], s[d]));
  }
  syncAll();
  auto t0 = Clock::now();
  for (int r = 0; r < replays; ++r) {
    for (int d = 0; d < 2; ++d) CHECK(cudaGraphLaunch(exec[d], s[d]));
  }
  syncAll();
  row("loom all-reduce 8 B replayed from graphs (100 per graph): per call",
      since(t0) / (replays * perGraph));
  for (int d = 0; d < 2; ++d) {
    cudaGraphExecDestroy(exec[d]);
    ncclCommDestroy(comms[d]);
  }
  return 0;
}
