// The GPU kernels' data mover (collectives/device/reduce_copy_device.cuh) compiled for the
// host, an emulation: each CUDA thread of a block runs one after another. reduceCopy has no
// barrier and gives each element to one thread, so the order does not change a result.
// It checks what the GPU tests check only where a GPU is: both forms (16-byte vectors; one
// element a load, several in flight, where an address is off 16 bytes), aligned and not, sums of
// one to eight sources, a pre-operation on the first or the last, a post-operation, in place,
// and one to four destinations.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

struct Dim3Shim {
  unsigned x = 0, y = 1, z = 1;
};
static Dim3Shim threadIdx, blockDim;
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif
#include "collectives/device/reduce_copy_device.cuh"

namespace loom::collectives::device::detail {
namespace {

// One block of `threads` threads, one after another. `unaligned`: the network kernel's
// form (reduceCopyUnaligned where an address is off 16 bytes).
template <typename E>
void runBlock(const Io& io, const Op<E>& op, size_t n, unsigned threads, bool unaligned) {
  blockDim.x = threads;
  for (unsigned t = 0; t < threads; ++t) {
    threadIdx.x = t;
    if (unaligned) {
      reduceCopy<E, true>(io, op, n);
    } else {
      reduceCopy<E, false>(io, op, n);
    }
  }
}

// Even integers whose sums of up to 8, doubled, stay exact in every type below.
template <typename T>
T valueAt(int source, size_t i) {
  return static_cast<T>(2 * (1 + (source * 7 + i * 3) % 5));
}

// What is applied besides the sum: nothing; the pre-op (doubling) on source 0; on the last
// source; the post-op (halving: SumPostDiv by 2).
enum class Extra { kNone, kPreFirst, kPreLast, kPost };

template <typename T>
void checkSums(size_t n, int nsrc, int ndst, const size_t* shifts, unsigned threads, bool inPlace,
               Extra extra, bool unaligned) {
  using E = Plain<T, T>;
  // Each buffer 256-byte aligned, then shifted by `shifts` elements.
  constexpr size_t kSlack = 64;
  std::vector<std::vector<T>> store(kMaxRanks + kMaxRanks + 1);
  auto aligned = [&](std::vector<T>& v) {
    v.assign(n + kSlack + 256 / sizeof(T), T{});
    uintptr_t a = reinterpret_cast<uintptr_t>(v.data());
    return reinterpret_cast<T*>((a + 255) / 256 * 256);
  };
  Io io;
  io.nsrc = nsrc;
  io.ndst = ndst;
  std::vector<T*> src(nsrc), dst(ndst);
  for (int s = 0; s < nsrc; ++s) {
    src[s] = aligned(store[s]) + shifts[s];
    for (size_t i = 0; i < n; ++i) src[s][i] = valueAt<T>(s, i);
    io.srcs[s] = reinterpret_cast<const char*>(src[s]);
  }
  for (int d = 0; d < ndst; ++d) {
    dst[d] = inPlace && d == 0 ? src[0] : aligned(store[kMaxRanks + d]) + shifts[nsrc + d];
    io.dsts[d] = reinterpret_cast<char*>(dst[d]);
  }
  Op<E> op;
  const int doubled = extra == Extra::kPreFirst ? 0 : extra == Extra::kPreLast ? nsrc - 1 : -1;
  op.kind = doubled >= 0            ? RedKind::kPreMulSum
            : extra == Extra::kPost ? RedKind::kSumPostDiv
                                    : RedKind::kSum;
  op.scalar = 2;
  op.divisor = 2;
  io.preMask = doubled >= 0 ? 1u << doubled : 0u;
  io.post = extra == Extra::kPost;
  runBlock<E>(io, op, n, threads, unaligned);
  for (size_t i = 0; i < n; ++i) {
    T want = 0;
    for (int s = 0; s < nsrc; ++s) want += valueAt<T>(s, i) * (s == doubled ? 2 : 1);
    if (extra == Extra::kPost) want /= 2;
    for (int d = 0; d < ndst; ++d) {
      ASSERT_EQ(dst[d][i], want) << "element " << i << " of " << n << ", destination " << d << ", "
                                 << nsrc << " sources, shifts " << shifts[0] << "/"
                                 << shifts[nsrc + d];
    }
  }
  // Nothing written past the end.
  for (int d = 0; d < ndst; ++d) {
    if (inPlace && d == 0) continue;
    for (size_t i = n; i < n + 8; ++i) ASSERT_EQ(dst[d][i], T{}) << "past the end, " << i;
  }
}

template <typename T>
void sweep() {
  const size_t counts[] = {0, 1, 3, 17, 100, 1000, 4099};
  for (size_t n : counts) {
    for (int nsrc : {1, 2, 3, 8}) {
      for (int ndst : {1, 2, 3, 4}) {
        if (nsrc == 8 && ndst > 1) continue;  // (a mesh's eight sources go to one place)
        // Every source and destination at the same shift, and mixed shifts.
        for (int pattern = 0; pattern < 4; ++pattern) {
          size_t shifts[2 * kMaxRanks + 1];
          for (int k = 0; k < nsrc + ndst; ++k) {
            const size_t elems = 16 / sizeof(T);
            shifts[k] = pattern == 0 ? 0 : pattern == 1 ? 1 % elems : (k * pattern) % elems;
            if (pattern == 3 && sizeof(T) <= 4) shifts[k] = (k % 2) * (8 / sizeof(T));
          }
          for (unsigned threads : {32u, 96u}) {
            for (Extra extra : {Extra::kNone, Extra::kPreFirst, Extra::kPreLast, Extra::kPost}) {
              for (bool unaligned : {false, true}) {
                checkSums<T>(n, nsrc, ndst, shifts, threads, false, extra, unaligned);
                if (nsrc > 1 || extra != Extra::kNone)
                  checkSums<T>(n, nsrc, ndst, shifts, threads, true, extra, unaligned);
              }
            }
          }
        }
      }
    }
  }
}

TEST(ReduceCopyEmulated, Int8) {
  sweep<int8_t>();
}
TEST(ReduceCopyEmulated, Int16Storage) {
  sweep<uint16_t>();
}
TEST(ReduceCopyEmulated, Int32) {
  sweep<int32_t>();
}
TEST(ReduceCopyEmulated, Float) {
  sweep<float>();
}
TEST(ReduceCopyEmulated, Double) {
  sweep<double>();
}
TEST(ReduceCopyEmulated, Int64) {
  sweep<int64_t>();
}

// Half precision through its own traits: 2-byte storage, float arithmetic.
TEST(ReduceCopyEmulated, HalfOffAlignment) {
  for (size_t shift : {0, 1, 2, 3, 4}) {
    const size_t n = 1001;
    std::vector<uint16_t> a(n + 16), b(n + 16), out(n + 16, 0);
    for (size_t i = 0; i < n; ++i) {
      a[shift + i] = __half_as_ushort(__float2half(float(i % 7)));
      b[shift + i] = __half_as_ushort(__float2half(float(i % 5)));
    }
    Io io;
    io.nsrc = 2;
    io.ndst = 1;
    io.srcs[0] = reinterpret_cast<const char*>(a.data() + shift);
    io.srcs[1] = reinterpret_cast<const char*>(b.data() + shift);
    io.dsts[0] = reinterpret_cast<char*>(out.data() + (shift + 1) % 8);
    Op<Half> op;
    op.kind = RedKind::kSum;
    runBlock<Half>(io, op, n, 64, true);
    const uint16_t* o = out.data() + (shift + 1) % 8;
    for (size_t i = 0; i < n; ++i)
      ASSERT_EQ(__half2float(__ushort_as_half(o[i])), float(i % 7 + i % 5)) << i;
  }
}

}  // namespace
}  // namespace loom::collectives::device::detail
