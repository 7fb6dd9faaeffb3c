// Throughput of the CPU reduction kernels (common/datatype.h), with memcpy as the
// reference for what the memory system allows.
//
// Bytes processed count every byte the kernel touches: read a + read b + write dst for
// reduce (3 x the buffer size), read src + write dst for memcpy (2 x). Buffers are
// written once before timing so the first iteration does not pay for page faults.
//
//   reduce_bench --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

#include "common/datatype.h"

namespace loom {
namespace {

struct Buffers {
  explicit Buffers(DataType type, size_t bytes)
      : n(bytes / dataTypeSize(type)), a(bytes), b(bytes), dst(bytes) {
    // Non-trivial values (no denormals, no NaN): 1 + i % 100 / 64 in the element type.
    for (size_t i = 0; i < n; ++i) {
      storeFromDouble(type, a.data(), i, 1.0 + double(i % 100) / 64.0);
      storeFromDouble(type, b.data(), i, 2.0 - double(i % 37) / 64.0);
    }
    std::memset(dst.data(), 0, bytes);
  }
  size_t n;
  std::vector<unsigned char> a, b, dst;
};

void BM_Reduce(benchmark::State& state, DataType type) {
  const size_t bytes = size_t(state.range(0));
  Buffers buf(type, bytes);
  const RedOp sum{RedKind::kSum};
  for (auto _ : state) {
    reduce(type, sum, buf.dst.data(), buf.a.data(), buf.b.data(), buf.n);
    benchmark::DoNotOptimize(buf.dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(3 * buf.n * dataTypeSize(type)));
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = size_t(state.range(0));
  std::vector<unsigned char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(2 * bytes));
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t bytes :
       {int64_t(4) << 10, int64_t(256) << 10, int64_t(8) << 20, int64_t(64) << 20}) {
    b->Arg(bytes);
  }
}

BENCHMARK_CAPTURE(BM_Reduce, float_sum, DataType::kFloat32)->Apply(sizes);
BENCHMARK_CAPTURE(BM_Reduce, bf16_sum, DataType::kBfloat16)->Apply(sizes);
BENCHMARK_CAPTURE(BM_Reduce, half_sum, DataType::kFloat16)->Apply(sizes);
BENCHMARK_CAPTURE(BM_Reduce, int32_sum, DataType::kInt32)->Apply(sizes);
BENCHMARK_CAPTURE(BM_Reduce, double_sum, DataType::kFloat64)->Apply(sizes);
BENCHMARK(BM_Memcpy)->Apply(sizes);

}  // namespace
}  // namespace loom

BENCHMARK_MAIN();
