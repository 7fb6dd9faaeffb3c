// CPU kernels for element types and reduction operations (interface in datatype.h).
//
// The file reads top to bottom: scalar conversions for the narrow float formats, element
// traits (storage type, arithmetic type, decode/encode), the operations as small
// functors, the loops, and the public functions, which switch on type and kind once per
// call and then run one templated loop.
//
// Why it is written this way:
// - Loads and stores go through memcpy on byte pointers, so unaligned buffers are legal;
//   GCC turns them into plain unaligned vector moves.
// - Every per-element function is branch-free (selects, not ifs) and uses no tables
//   except fp8 e4m3 decode, so the loops auto-vectorise at -O3 without intrinsics.
// - Results must be bitwise equal on every rank and every machine: the file is built
//   with -ffp-contract=off (common/CMakeLists.txt) so no FMA fuses a PreMulSum multiply
//   with the following add, and the narrow formats always compute in float and round
//   once per operation, the same way in the fused and unfused forms.
// - dst may equal an input exactly. Iteration i reads its inputs at i before writing dst
//   at i, so there is no loop-carried dependence and `#pragma GCC ivdep` is sound; it
//   lets GCC vectorise without a runtime overlap check (partial overlap is excluded by
//   the header's contract).
#include "common/datatype.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/minmax.h"

namespace loom {
namespace detail {
namespace {

constexpr uint32_t floatBits(float f) {
  return std::bit_cast<uint32_t>(f);
}
constexpr float bitsFloat(uint32_t u) {
  return std::bit_cast<float>(u);
}

// ---- fp16: 1 sign, 5 exponent (bias 15), 10 mantissa bits; max 65504. ----

inline float halfToFloatFast(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;
  // Normal numbers: shift exponent and mantissa into place, rebias 15 -> 127.
  uint32_t bits = (em << 13) + ((127u - 15u) << 23);
  // Inf/NaN (exponent 31) must reach exponent 255: add the rest of the gap.
  bits = em >= 0x7C00u ? bits + ((128u - 16u) << 23) : bits;
  // Zero and subnormals are em * 2^-24, exact in float.
  const uint32_t sub = floatBits(float(int32_t(em)) * 0x1p-24f);
  bits = em < 0x0400u ? sub : bits;
  return bitsFloat(bits | sign);
}

inline uint16_t floatToHalfFast(float f) {
  const uint32_t x = floatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  // Normal results: rebias, then round to nearest even on the 13 dropped bits (a carry
  // out of the mantissa correctly bumps the exponent).
  uint32_t h = (a - ((127u - 15u) << 23) + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
  // |f| < 2^-14 gives a subnormal (or the smallest normal after rounding). Adding 0.5
  // puts the half's unit 2^-24 on the float's last mantissa bit, so the FPU's own
  // round-to-nearest-even does the rounding and the low bits are the result.
  const uint32_t sub = floatBits(bitsFloat(a) + 0.5f) - floatBits(0.5f);
  h = a < 0x38800000u ? sub : h;
  h = a >= 0x477FF000u ? 0x7C00u : h;                          // >= 65520 rounds to inf
  h = a > 0x7F800000u ? (0x7E00u | ((a >> 13) & 0x3FFu)) : h;  // NaN stays (quiet) NaN
  return uint16_t(h | sign);
}

// ---- bf16: the top half of a float. ----

inline float bf16ToFloatFast(uint16_t h) {
  return bitsFloat(uint32_t(h) << 16);
}

inline uint16_t floatToBf16Fast(float f) {
  const uint32_t x = floatBits(f);
  // Round to nearest even on the low 16 bits; overflow carries into inf by itself.
  uint32_t r = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  r = (x & 0x7FFFFFFFu) > 0x7F800000u ? ((x >> 16) | 0x40u) : r;  // NaN: keep, quieted
  return uint16_t(r);
}

// ---- fp8 e4m3 (OCP E4M3FN): 1 sign, 4 exponent (bias 7), 3 mantissa bits. No
// infinities; S.1111.111 is NaN, so the largest finite value is 448. ----

constexpr float e4m3ToFloatCompute(uint8_t v) {
  const uint32_t sign = uint32_t(v & 0x80u) << 24;
  const uint32_t em = v & 0x7Fu;
  uint32_t bits = (em << 20) + ((127u - 7u) << 23);
  bits = em < 0x08u ? floatBits(float(em) * 0x1p-9f) : bits;  // zero, subnormals
  bits = em == 0x7Fu ? 0x7FC00000u : bits;
  return bitsFloat(bits | sign);
}

constexpr std::array<float, 256> makeE4m3Table() {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) t[i] = e4m3ToFloatCompute(uint8_t(i));
  return t;
}
constexpr std::array<float, 256> kE4m3Table = makeE4m3Table();

inline uint8_t floatToE4m3Fast(float f) {
  const uint32_t x = floatBits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t a = x & 0x7FFFFFFFu;
  uint32_t r = (a - ((127u - 7u) << 23) + 0x7FFFFu + ((a >> 20) & 1u)) >> 20;
  // |f| < 2^-6: subnormal, unit 2^-9 = the last mantissa bit of a float near 2^14.
  const uint32_t sub = floatBits(bitsFloat(a) + 0x1p14f) - floatBits(0x1p14f);
  r = a < 0x3C800000u ? sub : r;
  r = a > 0x43E00000u ? 0x7Eu : r;  // beyond 448, infinities included: saturate
  r = a > 0x7F800000u ? 0x7Fu : r;  // NaN
  return uint8_t(r | sign);
}

// ---- fp8 e5m2: 1 sign, 5 exponent (bias 15), 2 mantissa bits: the top byte of an
// fp16, so decoding goes through the fp16 path. Largest finite value 57344. ----

inline float e5m2ToFloatFast(uint8_t v) {
  return halfToFloatFast(uint16_t(uint16_t(v) << 8));
}

inline uint8_t floatToE5m2Fast(float f) {
  const uint32_t x = floatBits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t a = x & 0x7FFFFFFFu;
  uint32_t r = (a - ((127u - 15u) << 23) + 0xFFFFFu + ((a >> 21) & 1u)) >> 21;
  // |f| < 2^-14: subnormal, unit 2^-16 = the last mantissa bit of a float near 128.
  const uint32_t sub = floatBits(bitsFloat(a) + 128.0f) - floatBits(128.0f);
  r = a < 0x38800000u ? sub : r;
  r = a > 0x47600000u ? 0x7Bu : r;   // finite beyond 57344: saturate
  r = a == 0x7F800000u ? 0x7Cu : r;  // infinity stays infinity
  r = a > 0x7F800000u ? 0x7Eu : r;   // NaN
  return uint8_t(r | sign);
}

// Double to float rounding to odd: a later round-to-nearest-even to any format at
// least two bits narrower than float then gives the correctly rounded result of the
// double (no double rounding). Out-of-range values go to +-FLT_MAX, which every narrow
// format treats as overflow.
float doubleToFloatRoundOdd(double d) {
  if (std::isnan(d))
    return std::signbit(d) ? -std::numeric_limits<float>::quiet_NaN()
                           : std::numeric_limits<float>::quiet_NaN();
  constexpr double kMax = std::numeric_limits<float>::max();
  if (std::isinf(d)) return float(d);
  if (std::fabs(d) > kMax) return d > 0 ? float(kMax) : -float(kMax);
  const float f = float(d);
  if (double(f) == d) return f;
  uint32_t bits = floatBits(f);
  if ((bits & 1u) == 0) bits = std::fabs(double(f)) > std::fabs(d) ? bits - 1 : bits + 1;
  return bitsFloat(bits);
}

// ---- Element traits: Storage is what sits in memory, Compute what arithmetic uses. ----

template <typename T>
struct Native {
  using Storage = T;
  using Compute = T;
  static T decode(T s) { return s; }
  static T encode(T c) { return c; }
};

struct Half {
  using Storage = uint16_t;
  using Compute = float;
  static float decode(uint16_t s) { return halfToFloatFast(s); }
  static uint16_t encode(float c) { return floatToHalfFast(c); }
};

struct Bf16 {
  using Storage = uint16_t;
  using Compute = float;
  static float decode(uint16_t s) { return bf16ToFloatFast(s); }
  static uint16_t encode(float c) { return floatToBf16Fast(c); }
};

struct E4m3 {
  using Storage = uint8_t;
  using Compute = float;
  static float decode(uint8_t s) { return kE4m3Table[s]; }
  static uint8_t encode(float c) { return floatToE4m3Fast(c); }
};

struct E5m2 {
  using Storage = uint8_t;
  using Compute = float;
  static float decode(uint8_t s) { return e5m2ToFloatFast(s); }
  static uint8_t encode(float c) { return floatToE5m2Fast(c); }
};

template <typename E>
constexpr bool kNarrowFloat = !std::is_same_v<typename E::Storage, typename E::Compute>;

// The unsigned type integer arithmetic wraps in (int8 promotes to int, so to unsigned).
template <typename T>
using Wrap = std::make_unsigned_t<decltype(T() + T())>;

// ---- Operations on Compute values. ----

struct SumOp {
  template <typename C>
  C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      return C(Wrap<C>(a) + Wrap<C>(b));
    } else {
      return a + b;
    }
  }
};

struct ProdOp {
  template <typename C>
  C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) {
      return C(Wrap<C>(a) * Wrap<C>(b));
    } else {
      return a * b;
    }
  }
};

// Max and min: common/minmax.h (one rule for host and device: NaN wins, -0 < +0).
struct MaxOp {
  template <typename C>
  C operator()(C a, C b) const {
    return maxOf(a, b);
  }
};

struct MinOp {
  template <typename C>
  C operator()(C a, C b) const {
    return minOf(a, b);
  }
};

// PreMulSum's multiply. `s` is the scalar in the element's arithmetic, already rounded
// to the element type; the product is rounded to the element type too, so the fused
// and the unfused forms give the same bits.
template <typename E>
struct MulScalarOp {
  using C = typename E::Compute;
  C s;
  C operator()(C x) const {
    if constexpr (std::is_integral_v<C>) {
      return C(Wrap<C>(x) * Wrap<C>(s));
    } else if constexpr (kNarrowFloat<E>) {
      return E::decode(E::encode(x * s));
    } else {
      return x * s;
    }
  }
};

// SumPostDiv's divide. Integers: truncating division, signed for signed types.
template <typename E>
struct DivOp {
  using C = typename E::Compute;
  uint64_t d;
  C operator()(C x) const {
    if constexpr (std::is_integral_v<C> && std::is_signed_v<C>) {
      if (d > uint64_t(std::numeric_limits<int64_t>::max())) {
        // Only INT64_MIN / 2^63 is nonzero.
        return (int64_t(x) == std::numeric_limits<int64_t>::min() &&
                d == uint64_t(std::numeric_limits<int64_t>::max()) + 1)
                   ? C(-1)
                   : C(0);
      }
      return C(int64_t(x) / int64_t(d));
    } else if constexpr (std::is_integral_v<C>) {
      return C(uint64_t(x) / d);
    } else {
      return x / C(d);
    }
  }
};

// ---- Loops. ----

// The loops are compiled three times, for baseline x86-64 (SSE2), x86-64-v3 (AVX2) and
// x86-64-v4 (AVX-512), and the loader picks one for the CPU (GCC function multiversioning
// through an ifunc). The source is the same and every operation is an exact integer op
// or one IEEE float op, so all three give the same bits. Wider vectors matter for the
// narrow float types, whose conversions cost more instructions than the memory traffic.
// Building with -DLOOM_KERNEL_CLONES= (empty) and a chosen -march compiles one version
// only, which is how each version is checked against the tests.
#if !defined(LOOM_KERNEL_CLONES)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define LOOM_KERNEL_CLONES \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define LOOM_KERNEL_CLONES
#endif
#endif

template <typename S>
inline S loadAt(const unsigned char* p, size_t i) {
  S v;
  std::memcpy(&v, p + i * sizeof(S), sizeof(S));
  return v;
}

template <typename S>
inline void storeAt(unsigned char* p, size_t i, S v) {
  std::memcpy(p + i * sizeof(S), &v, sizeof(S));
}

// dst[i] = encode(op(decode(a[i]), decode(b[i])))
template <typename E, typename Op>
LOOM_KERNEL_CLONES void binaryLoop(void* dst, const void* a, const void* b, size_t n, Op op) {
  using S = typename E::Storage;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* pa = static_cast<const unsigned char*>(a);
  const auto* pb = static_cast<const unsigned char*>(b);
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) {
    storeAt<S>(d, i, E::encode(op(E::decode(loadAt<S>(pa, i)), E::decode(loadAt<S>(pb, i)))));
  }
}

// dst[i] = encode(op(decode(src[i])))
template <typename E, typename Op>
LOOM_KERNEL_CLONES void unaryLoop(void* dst, const void* src, size_t n, Op op) {
  using S = typename E::Storage;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* ps = static_cast<const unsigned char*>(src);
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) storeAt<S>(d, i, E::encode(op(E::decode(loadAt<S>(ps, i)))));
}

void copyBytes(void* dst, const void* src, size_t bytes) {
  if (dst != src && bytes > 0) std::memcpy(dst, src, bytes);
}

// ---- double <-> element, for loadAsDouble/storeFromDouble and the scalar. ----

template <typename T>
T integerFromDouble(double v) {
  if (std::isnan(v)) return T(0);
  const double r = std::nearbyint(v);
  const double lo = double(std::numeric_limits<T>::min());  // 0 or -2^k: exact
  const double hiExcl = std::ldexp(1.0, std::numeric_limits<T>::digits);
  if (r < lo) return std::numeric_limits<T>::min();
  if (r >= hiExcl) return std::numeric_limits<T>::max();
  return T(r);
}

template <typename E>
typename E::Storage encodeFromDouble(double v) {
  using S = typename E::Storage;
  if constexpr (std::is_integral_v<typename E::Compute>) {
    return integerFromDouble<S>(v);
  } else if constexpr (std::is_same_v<S, double>) {
    return v;
  } else if constexpr (std::is_same_v<S, float>) {
    return float(v);
  } else {
    return E::encode(doubleToFloatRoundOdd(v));
  }
}

// The PreMulSum scalar in the element's arithmetic: integers take (int64)scalar
// (saturated into range; NaN gives 0) with wrap-around to the element width; float
// types take the scalar rounded to the element type.
template <typename E>
typename E::Compute scalarFor(double scalar) {
  using C = typename E::Compute;
  if constexpr (std::is_integral_v<C>) {
    int64_t s;
    if (std::isnan(scalar)) {
      s = 0;
    } else if (scalar >= 0x1p63) {
      s = std::numeric_limits<int64_t>::max();
    } else if (scalar < -0x1p63) {
      s = std::numeric_limits<int64_t>::min();
    } else {
      s = int64_t(scalar);  // truncation, as a C cast
    }
    return C(s);  // wraps to the element width (well defined since C++20)
  } else {
    return E::decode(encodeFromDouble<E>(scalar));
  }
}

// ---- Typed bodies of the public kernels. ----

template <typename E>
void reduceTyped(RedKind kind, void* dst, const void* a, const void* b, size_t n) {
  switch (kind) {
    case RedKind::kSum:
    case RedKind::kPreMulSum:
    case RedKind::kSumPostDiv: binaryLoop<E>(dst, a, b, n, SumOp{}); return;
    case RedKind::kProd: binaryLoop<E>(dst, a, b, n, ProdOp{}); return;
    case RedKind::kMax: binaryLoop<E>(dst, a, b, n, MaxOp{}); return;
    case RedKind::kMin: binaryLoop<E>(dst, a, b, n, MinOp{}); return;
  }
}

template <typename E>
void reduceWithLocalTyped(const RedOp& op, void* dst, const void* local, const void* partial,
                          size_t n) {
  if (!hasPreOp(op)) {
    reduceTyped<E>(op.kind, dst, local, partial, n);
    return;
  }
  const MulScalarOp<E> mul{scalarFor<E>(op.scalar)};
  binaryLoop<E>(dst, local, partial, n, [mul](auto l, auto p) { return SumOp{}(mul(l), p); });
}

// Calls f(E{}) with the traits of `type`; does nothing for an invalid type.
template <typename F>
void withElem(DataType type, F&& f) {
  switch (type) {
    case DataType::kInt8: f(Native<int8_t>{}); return;
    case DataType::kUint8: f(Native<uint8_t>{}); return;
    case DataType::kInt32: f(Native<int32_t>{}); return;
    case DataType::kUint32: f(Native<uint32_t>{}); return;
    case DataType::kInt64: f(Native<int64_t>{}); return;
    case DataType::kUint64: f(Native<uint64_t>{}); return;
    case DataType::kFloat16: f(Half{}); return;
    case DataType::kFloat32: f(Native<float>{}); return;
    case DataType::kFloat64: f(Native<double>{}); return;
    case DataType::kBfloat16: f(Bf16{}); return;
    case DataType::kFloat8e4m3: f(E4m3{}); return;
    case DataType::kFloat8e5m2: f(E5m2{}); return;
  }
}

}  // namespace
}  // namespace detail

size_t dataTypeSize(DataType type) {
  switch (type) {
    case DataType::kInt8:
    case DataType::kUint8:
    case DataType::kFloat8e4m3:
    case DataType::kFloat8e5m2: return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16: return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32: return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64: return 8;
  }
  return 0;
}

const char* dataTypeName(DataType type) {
  switch (type) {
    case DataType::kInt8: return "int8";
    case DataType::kUint8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kUint32: return "uint32";
    case DataType::kInt64: return "int64";
    case DataType::kUint64: return "uint64";
    case DataType::kFloat16: return "half";
    case DataType::kFloat32: return "float";
    case DataType::kFloat64: return "double";
    case DataType::kBfloat16: return "bfloat16";
    case DataType::kFloat8e4m3: return "f8e4m3";
    case DataType::kFloat8e5m2: return "f8e5m2";
  }
  return "invalid";
}

bool isValidDataType(int type) {
  return type >= 0 && type < kNumDataTypes;
}

bool isFloatType(DataType type) {
  switch (type) {
    case DataType::kFloat16:
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kBfloat16:
    case DataType::kFloat8e4m3:
    case DataType::kFloat8e5m2: return true;
    default: return false;
  }
}

const char* redKindName(RedKind kind) {
  switch (kind) {
    case RedKind::kSum: return "sum";
    case RedKind::kProd: return "prod";
    case RedKind::kMax: return "max";
    case RedKind::kMin: return "min";
    case RedKind::kPreMulSum: return "premulsum";
    case RedKind::kSumPostDiv: return "sumpostdiv";
  }
  return "invalid";
}

// A scalar of exactly 1 and a divisor of 1 are copies for every type (x * 1 and x / 1
// are exact), so callers may skip those passes; the kernels skip them too, which keeps
// the fused and unfused forms bitwise equal.
bool hasPreOp(const RedOp& op) {
  return op.kind == RedKind::kPreMulSum && op.scalar != 1.0;
}

bool hasPostOp(const RedOp& op) {
  return op.kind == RedKind::kSumPostDiv && op.divisor != 1;
}

void applyPreOp(DataType type, const RedOp& op, void* dst, const void* src, size_t n) {
  if (!hasPreOp(op)) {
    detail::copyBytes(dst, src, n * dataTypeSize(type));
    return;
  }
  detail::withElem(type, [&](auto e) {
    using E = decltype(e);
    detail::unaryLoop<E>(dst, src, n, detail::MulScalarOp<E>{detail::scalarFor<E>(op.scalar)});
  });
}

void reduce(DataType type, const RedOp& op, void* dst, const void* a, const void* b, size_t n) {
  detail::withElem(type, [&](auto e) { detail::reduceTyped<decltype(e)>(op.kind, dst, a, b, n); });
}

void reduceWithLocal(DataType type, const RedOp& op, void* dst, const void* local,
                     const void* partial, size_t n) {
  detail::withElem(
      type, [&](auto e) { detail::reduceWithLocalTyped<decltype(e)>(op, dst, local, partial, n); });
}

void applyPostOp(DataType type, const RedOp& op, void* dst, const void* src, size_t n) {
  // A divisor of 0 is a caller bug (the header requires > 0); copying beats SIGFPE.
  if (!hasPostOp(op) || op.divisor == 0) {
    detail::copyBytes(dst, src, n * dataTypeSize(type));
    return;
  }
  detail::withElem(type, [&](auto e) {
    using E = decltype(e);
    detail::unaryLoop<E>(dst, src, n, detail::DivOp<E>{op.divisor});
  });
}

float halfToFloat(uint16_t h) {
  return detail::halfToFloatFast(h);
}
uint16_t floatToHalf(float f) {
  return detail::floatToHalfFast(f);
}
float bf16ToFloat(uint16_t h) {
  return detail::bf16ToFloatFast(h);
}
uint16_t floatToBf16(float f) {
  return detail::floatToBf16Fast(f);
}
float fp8e4m3ToFloat(uint8_t v) {
  return detail::kE4m3Table[v];
}
uint8_t floatToFp8e4m3(float f) {
  return detail::floatToE4m3Fast(f);
}
float fp8e5m2ToFloat(uint8_t v) {
  return detail::e5m2ToFloatFast(v);
}
uint8_t floatToFp8e5m2(float f) {
  return detail::floatToE5m2Fast(f);
}

double loadAsDouble(DataType type, const void* base, size_t i) {
  double out = 0.0;
  detail::withElem(type, [&](auto e) {
    using E = decltype(e);
    const auto s = detail::loadAt<typename E::Storage>(static_cast<const unsigned char*>(base), i);
    out = double(E::decode(s));
  });
  return out;
}

// Integers round to nearest and saturate (NaN gives 0); float types round to nearest
// even directly from the double (no double rounding through float).
void storeFromDouble(DataType type, void* base, size_t i, double value) {
  detail::withElem(type, [&](auto e) {
    using E = decltype(e);
    detail::storeAt(static_cast<unsigned char*>(base), i, detail::encodeFromDouble<E>(value));
  });
}

}  // namespace loom
