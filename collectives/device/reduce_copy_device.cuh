// The device-side pieces every GPU executor shares (the mesh's kernels, and the network
// executor's): element traits (storage type and arithmetic type of each DataType), the
// reduction as a kernel applies it, system-scope counters, and `reduceCopy`, the
// block-wide loop that combines sources into destinations. Internal to the .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "collectives/device/mesh.h"
#include "common/datatype.h"
#include "common/minmax.h"

namespace loom::collectives::device::detail {

// ---- Element traits: storage type S, arithmetic type C. ----

template <typename S, typename C>
struct Plain {
  using Storage = S;
  using Compute = C;
  static __device__ __forceinline__ C load(S v) { return C(v); }
  static __device__ __forceinline__ S store(C v) { return S(v); }
};

struct Half {
  using Storage = uint16_t;
  using Compute = float;
  static __device__ __forceinline__ float load(uint16_t v) {
    return __half2float(__ushort_as_half(v));
  }
  static __device__ __forceinline__ uint16_t store(float v) {
    return __half_as_ushort(__float2half_rn(v));
  }
};

struct Bf16 {
  using Storage = uint16_t;
  using Compute = float;
  static __device__ __forceinline__ float load(uint16_t v) {
    return __bfloat162float(__ushort_as_bfloat16(v));
  }
  static __device__ __forceinline__ uint16_t store(float v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};

// fp8: OCP E4M3 saturates to its largest finite value (it has no infinities); E5M2
// keeps infinities.
template <__nv_fp8_interpretation_t Kind, __nv_saturation_t Saturation>
struct Fp8 {
  using Storage = uint8_t;
  using Compute = float;
  static __device__ __forceinline__ float load(uint8_t v) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(v, Kind);
    return __half2float(__half(h));
  }
  static __device__ __forceinline__ uint8_t store(float v) {
    return __nv_cvt_float_to_fp8(v, Saturation, Kind);
  }
};
using E4m3 = Fp8<__NV_E4M3, __NV_SATFINITE>;
using E5m2 = Fp8<__NV_E5M2, __NV_NOSAT>;

// The reduction as the kernel applies it: pre-op on a rank's own contribution,
// combine, post-op on the final value.
template <typename E>
struct Op {
  using C = typename E::Compute;
  RedKind kind;
  C scalar;
  C divisor;

  __device__ __forceinline__ C pre(C x) const {
    return kind == RedKind::kPreMulSum ? x * scalar : x;
  }
  __device__ __forceinline__ C combine(C a, C b) const {
    switch (kind) {
      case RedKind::kProd: return a * b;
      case RedKind::kMax: return maxOf(a, b);  // common/minmax.h: the host's rule
      case RedKind::kMin: return minOf(a, b);
      default: return a + b;
    }
  }
  __device__ __forceinline__ C post(C x) const {
    return kind == RedKind::kSumPostDiv ? x / divisor : x;
  }
};

// Every operation rounds to the element type, as the host kernels do (common/datatype.h),
// so integer sums wrap and narrow floats round once per operation.
template <typename E>
__device__ __forceinline__ typename E::Compute rounded(typename E::Compute v) {
  return E::load(E::store(v));
}

// PreMulSum's scalar: read from device memory when `device` is set, else `host`.
template <typename E>
__device__ typename E::Compute scalarFor(double host, const void* device) {
  using C = typename E::Compute;
  if (device) {
    return E::load(*static_cast<const typename E::Storage*>(device));
  }
  if constexpr (std::is_integral_v<C>) {
    return C(static_cast<long long>(host));
  } else {
    return E::load(E::store(C(host)));  // the scalar rounded to the element type
  }
}

__device__ __forceinline__ uint64_t loadAcquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void storeRelease(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t globalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- The data mover. ----
//
// dsts[0..ndst) = post(combine over s of (s in preMask ? pre(srcs[s]) : srcs[s])), the
// sources combined in the order given. With one source and no pre/post it is a copy.

struct Io {
  const char* srcs[kMaxRanks];
  char* dsts[kMaxRanks + 1];
  int nsrc = 0;
  int ndst = 0;
  unsigned preMask = 0;
  bool post = false;
};

// One element of the result from source s's value at it, value(s), for s < io.nsrc (at
// most NS): the pre-op on the sources in preMask, combined in order, then the post-op.
template <typename E, int NS, typename Value>
__device__ __forceinline__ typename E::Storage combineSources(const Io& io, const Op<E>& op,
                                                              Value value) {
  using C = typename E::Compute;
  C acc{};
#pragma unroll
  for (int s = 0; s < NS; ++s) {
    if (s < io.nsrc) {
      C x = E::load(value(s));
      if (io.preMask & (1u << s)) x = rounded<E>(op.pre(x));
      acc = s == 0 ? x : rounded<E>(op.combine(acc, x));
    }
  }
  if (io.post) acc = op.post(acc);
  return E::store(acc);
}

template <typename E>
__device__ __forceinline__ void reduceElems(const Io& io, const Op<E>& op, size_t i) {
  using S = typename E::Storage;
  const S v = combineSources<E, kMaxRanks>(
      io, op, [&](int s) { return reinterpret_cast<const S*>(io.srcs[s])[i]; });
#pragma unroll
  for (int d = 0; d < kMaxRanks + 1; ++d) {
    if (d < io.ndst) reinterpret_cast<S*>(io.dsts[d])[i] = v;
  }
}

// Addresses off a 16-byte boundary (a reduce-scatter's or all-gather's block whose size is
// not a multiple of 16 bytes): one element a load, but several elements in flight a thread,
// where reduceElems has one element's loads in flight at a time. A read of the network
// FIFOs' mapped host memory takes a PCIe round trip. (Loads of 8 bytes where the addresses
// allow them as well took net_kernels.cu's build to 4.1 minutes on 2 cores, against 2.3
// without and 2.0 before: left out.)
template <typename E, int NS>
__device__ __noinline__ void reduceCopyUnaligned(const Io& io, const Op<E>& op, size_t n) {
  using S = typename E::Storage;
  constexpr int U = NS <= 2 ? 8 : 2;  // elements in flight a thread (registers as vectors')
  const bool copy = io.nsrc == 1 && io.preMask == 0 && !io.post;
  const size_t stride = blockDim.x;
  const S* srcs[NS];
  S* dsts[NS + 1];
#pragma unroll
  for (int s = 0; s < NS; ++s)
    srcs[s] = s < io.nsrc ? reinterpret_cast<const S*>(io.srcs[s]) : nullptr;
#pragma unroll
  for (int d = 0; d < NS + 1; ++d)
    dsts[d] = d < io.ndst ? reinterpret_cast<S*>(io.dsts[d]) : nullptr;
  size_t i = threadIdx.x;
  if (copy) {
    for (; i + 7 * stride < n; i += 8 * stride) {
      S v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = srcs[0][i + u * stride];
#pragma unroll
      for (int d = 0; d < NS + 1; ++d) {
        if (d < io.ndst) {
#pragma unroll
          for (int u = 0; u < 8; ++u) dsts[d][i + u * stride] = v[u];
        }
      }
    }
  } else {
    for (; i + (U - 1) * stride < n; i += U * stride) {
      S in[U][NS];
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int s = 0; s < NS; ++s) {
          if (s < io.nsrc) in[u][s] = srcs[s][i + u * stride];
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const S v = combineSources<E, NS>(io, op, [&](int s) { return in[u][s]; });
#pragma unroll
        for (int d = 0; d < NS + 1; ++d) {
          if (d < io.ndst) dsts[d][i + u * stride] = v;
        }
      }
    }
  }
  for (; i < n; i += stride) reduceElems<E>(io, op, i);
}

// Not inlined: one copy per type and width instead of one per call site keeps the
// compile time and the code size down; the call costs nothing next to a tile. `Unaligned`:
// addresses off 16 bytes take reduceCopyUnaligned (the network kernel, whose FIFOs are
// mostly mapped host memory), not one element at a time (the mesh's kernels, which move device
// memory, whose reads wait far less: a first version of these loops kept ptxas on them past 17
// minutes).
template <typename E, int NS, bool Unaligned>
__device__ __noinline__ void reduceCopyN(const Io& io, const Op<E>& op, size_t n) {
  using S = typename E::Storage;
  constexpr int kPer = 16 / sizeof(S);
  const bool copy = io.nsrc == 1 && io.preMask == 0 && !io.post;
  uintptr_t bits = 0;
  for (int s = 0; s < io.nsrc; ++s) bits |= reinterpret_cast<uintptr_t>(io.srcs[s]);
  for (int d = 0; d < io.ndst; ++d) bits |= reinterpret_cast<uintptr_t>(io.dsts[d]);
  if constexpr (Unaligned) {
    if ((bits & 15) != 0) return reduceCopyUnaligned<E, NS>(io, op, n);
  }
  size_t nvec = (bits & 15) == 0 ? n / kPer : 0;
  const size_t stride = blockDim.x;
  // Pointers into registers (the Io itself sits in local memory).
  const char* srcs[NS];
  char* dsts[NS + 1];
#pragma unroll
  for (int s = 0; s < NS; ++s) srcs[s] = s < io.nsrc ? io.srcs[s] : nullptr;
#pragma unroll
  for (int d = 0; d < NS + 1; ++d) dsts[d] = d < io.ndst ? io.dsts[d] : nullptr;
  union Pack {
    uint4 v;
    S e[kPer];
  };
  if (copy) {
    const uint4* src = reinterpret_cast<const uint4*>(srcs[0]);
    size_t i = threadIdx.x;
    for (; i + 3 * stride < nvec; i += 4 * stride) {
      uint4 v0 = src[i], v1 = src[i + stride], v2 = src[i + 2 * stride], v3 = src[i + 3 * stride];
#pragma unroll
      for (int d = 0; d < NS + 1; ++d) {
        if (d < io.ndst) {
          uint4* dst = reinterpret_cast<uint4*>(dsts[d]);
          dst[i] = v0;
          dst[i + stride] = v1;
          dst[i + 2 * stride] = v2;
          dst[i + 3 * stride] = v3;
        }
      }
    }
    for (; i < nvec; i += stride) {
      uint4 v = src[i];
#pragma unroll
      for (int d = 0; d < NS + 1; ++d) {
        if (d < io.ndst) reinterpret_cast<uint4*>(dsts[d])[i] = v;
      }
    }
  } else {
    // U vectors per thread and iteration, so U * nsrc loads are in flight at once.
    constexpr int U = NS <= 2 ? 4 : 1;
    auto combineVec = [&](Pack* in, Pack& res) {
#pragma unroll
      for (int k = 0; k < kPer; ++k)
        res.e[k] = combineSources<E, NS>(io, op, [&](int s) { return in[s].e[k]; });
    };
    size_t i = threadIdx.x;
    for (; i + (U - 1) * stride < nvec; i += U * stride) {
      Pack in[U][NS];
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int s = 0; s < NS; ++s) {
          if (s < io.nsrc) in[u][s].v = reinterpret_cast<const uint4*>(srcs[s])[i + u * stride];
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        Pack res;
        combineVec(in[u], res);
#pragma unroll
        for (int d = 0; d < NS + 1; ++d) {
          if (d < io.ndst) reinterpret_cast<uint4*>(dsts[d])[i + u * stride] = res.v;
        }
      }
    }
    for (; i < nvec; i += stride) {
      Pack in[NS];
#pragma unroll
      for (int s = 0; s < NS; ++s) {
        if (s < io.nsrc) in[s].v = reinterpret_cast<const uint4*>(srcs[s])[i];
      }
      Pack res;
      combineVec(in, res);
#pragma unroll
      for (int d = 0; d < NS + 1; ++d) {
        if (d < io.ndst) reinterpret_cast<uint4*>(dsts[d])[i] = res.v;
      }
    }
  }
  for (size_t i = nvec * kPer + threadIdx.x; i < n; i += stride) reduceElems<E>(io, op, i);
}

// Two and three sources (two ranks) get their own instantiation: the general one needs
// more registers than a thread has at 512 threads per block.
template <typename E, bool Unaligned = false>
__device__ void reduceCopy(const Io& io, const Op<E>& op, size_t n) {
  if (io.nsrc <= 2 && io.ndst <= 3) {
    reduceCopyN<E, 2, Unaligned>(io, op, n);
  } else {
    reduceCopyN<E, kMaxRanks, Unaligned>(io, op, n);
  }
}

// Calls f with a value of the element traits for `type` (a cudaError_t value back).
template <typename F>
int withElement(DataType type, F&& f) {
  switch (type) {
    case DataType::kInt8: return f(Plain<int8_t, int32_t>{});
    case DataType::kUint8: return f(Plain<uint8_t, uint32_t>{});
    case DataType::kInt32: return f(Plain<int32_t, int32_t>{});
    case DataType::kUint32: return f(Plain<uint32_t, uint32_t>{});
    case DataType::kInt64: return f(Plain<int64_t, int64_t>{});
    case DataType::kUint64: return f(Plain<uint64_t, uint64_t>{});
    case DataType::kFloat16: return f(Half{});
    case DataType::kFloat32: return f(Plain<float, float>{});
    case DataType::kFloat64: return f(Plain<double, double>{});
    case DataType::kBfloat16: return f(Bf16{});
    case DataType::kFloat8e4m3: return f(E4m3{});
    case DataType::kFloat8e5m2: return f(E5m2{});
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace loom::collectives::device::detail
