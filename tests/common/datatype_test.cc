// Tests for common/datatype: the element conversions against formulas written from the
// format definitions, and every kernel for every type and reduction kind against a
// reference computed independently (64-bit modular arithmetic for integers, double for
// floats).
//
// Float bound: the test data are small multiples of 1/16 (see floatValue), so every
// sum and product is exact in float and in double. The kernels compute in float (double
// for fp64) and round once, so they must match the exact result rounded to the element
// type bit for bit. The one inexact operation, SumPostDiv by 3, must be within 1 ulp of
// the element type.
#include "common/datatype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace loom {
namespace {

constexpr DataType kAllTypes[] = {
    DataType::kInt8,    DataType::kUint8,    DataType::kInt32,      DataType::kUint32,
    DataType::kInt64,   DataType::kUint64,   DataType::kFloat16,    DataType::kFloat32,
    DataType::kFloat64, DataType::kBfloat16, DataType::kFloat8e4m3, DataType::kFloat8e5m2,
};
constexpr DataType kFloatTypes[] = {DataType::kFloat16,    DataType::kFloat32,
                                    DataType::kFloat64,    DataType::kBfloat16,
                                    DataType::kFloat8e4m3, DataType::kFloat8e5m2};
constexpr RedKind kAllKinds[] = {RedKind::kSum, RedKind::kProd,      RedKind::kMax,
                                 RedKind::kMin, RedKind::kPreMulSum, RedKind::kSumPostDiv};
constexpr size_t kCounts[] = {0, 1, 7, 1023, 4099};
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

bool isSignedInt(DataType t) {
  return t == DataType::kInt8 || t == DataType::kInt32 || t == DataType::kInt64;
}

// ---- Integer reference: values held as 64-bit patterns, wrapped to the type. ----

uint64_t wrapTo(DataType t, uint64_t v) {
  const int bits = int(dataTypeSize(t)) * 8;
  if (bits == 64) return v;
  const uint64_t mask = (uint64_t(1) << bits) - 1;
  v &= mask;
  if (isSignedInt(t) && (v >> (bits - 1)) != 0) v |= ~mask;  // sign-extend
  return v;
}

uint64_t loadInt(DataType t, const unsigned char* p, size_t i) {
  uint64_t v = 0;
  std::memcpy(&v, p + i * dataTypeSize(t), dataTypeSize(t));  // little-endian host
  return wrapTo(t, v);
}

void storeInt(DataType t, unsigned char* p, size_t i, uint64_t v) {
  std::memcpy(p + i * dataTypeSize(t), &v, dataTypeSize(t));
}

uint64_t refIntBinary(DataType t, RedKind kind, uint64_t x, uint64_t y) {
  const bool less = isSignedInt(t) ? int64_t(x) < int64_t(y) : x < y;
  switch (kind) {
    case RedKind::kProd: return wrapTo(t, x * y);
    case RedKind::kMax: return less ? y : x;
    case RedKind::kMin: return less ? x : y;
    default: return wrapTo(t, x + y);
  }
}

uint64_t refIntPre(DataType t, const RedOp& op, uint64_t x) {
  if (op.kind != RedKind::kPreMulSum) return x;
  return wrapTo(t, x * uint64_t(int64_t(op.scalar)));
}

uint64_t refIntPost(DataType t, const RedOp& op, uint64_t x) {
  if (op.kind != RedKind::kSumPostDiv) return x;
  if (isSignedInt(t)) return wrapTo(t, uint64_t(int64_t(x) / int64_t(op.divisor)));
  return x / op.divisor;
}

// ---- Float reference: exact values in double, rounded to the type by storeFromDouble. --

// A value of the test grid, already rounded to the type: multiples of 1/16, |v| <= 11.25.
double floatValue(DataType t, uint64_t seed, size_t i) {
  static constexpr double kScale[] = {1.0, 0.5, 0.25, 1.5};
  const uint64_t h = splitmix(seed * 1000003u + i);
  const double v = (double(h % 61) - 30.0) / 4.0 * kScale[(h >> 8) % 4];
  unsigned char buf[8];
  storeFromDouble(t, buf, 0, v);
  return loadAsDouble(t, buf, 0);
}

// The bytes of `v` rounded to the type.
uint64_t encodeBits(DataType t, double v) {
  uint64_t bits = 0;
  storeFromDouble(t, &bits, 0, v);
  return bits;
}

uint64_t rawBits(DataType t, const unsigned char* p, size_t i) {
  uint64_t bits = 0;
  std::memcpy(&bits, p + i * dataTypeSize(t), dataTypeSize(t));
  return bits;
}

double roundTo(DataType t, double v) {
  const uint64_t bits = encodeBits(t, v);
  return loadAsDouble(t, &bits, 0);
}

double refFloatBinary(RedKind kind, double x, double y) {
  switch (kind) {
    case RedKind::kProd: return x * y;
    case RedKind::kMax: return std::max(x, y);
    case RedKind::kMin: return std::min(x, y);
    default: return x + y;
  }
}

// The PreMulSum scalar as the kernels see it: rounded to the element type.
double scalarIn(DataType t, double s) {
  return roundTo(t, s);
}

// One unit in the last place of the type at magnitude |v|.
double ulpOf(DataType t, double v) {
  int mantissaBits = 0, minExp = 0;
  switch (t) {
    case DataType::kFloat16:
      mantissaBits = 10;
      minExp = -14;
      break;
    case DataType::kBfloat16:
      mantissaBits = 7;
      minExp = -126;
      break;
    case DataType::kFloat32:
      mantissaBits = 23;
      minExp = -126;
      break;
    case DataType::kFloat64:
      mantissaBits = 52;
      minExp = -1022;
      break;
    case DataType::kFloat8e4m3:
      mantissaBits = 3;
      minExp = -6;
      break;
    case DataType::kFloat8e5m2:
      mantissaBits = 2;
      minExp = -14;
      break;
    default: return 0;
  }
  const int e = v == 0 ? minExp : std::max(std::ilogb(v), minExp);
  return std::ldexp(1.0, e - mantissaBits);
}

// ---- Buffers with a chosen misalignment. ----

struct Buffer {
  Buffer(DataType t, size_t n, size_t offset) : storage(n * dataTypeSize(t) + 16), off(offset) {}
  unsigned char* data() { return storage.data() + off; }
  std::vector<unsigned char> storage;
  size_t off;
};

void fill(DataType t, unsigned char* p, size_t n, uint64_t seed) {
  for (size_t i = 0; i < n; ++i) {
    if (isFloatType(t)) {
      storeFromDouble(t, p, i, floatValue(t, seed, i));
    } else {
      storeInt(t, p, i, splitmix(seed * 7919u + i));
    }
  }
}

// ---- Every type x every kind, through all four kernels. ----

class DatatypeKernelTest : public ::testing::TestWithParam<std::tuple<DataType, RedKind>> {};

std::vector<RedOp> opsFor(DataType t, RedKind kind) {
  if (kind == RedKind::kPreMulSum) {
    // Integers: -3 wraps around; 2.9 is used as (int64)2.9 = 2. Floats: 0.375 is exact
    // in every type; 1/3 must first be rounded to the element type.
    if (!isFloatType(t)) return {{kind, -3.0, 1}, {kind, 2.9, 1}};
    return {{kind, 0.375, 1}, {kind, 1.0 / 3.0, 1}};
  }
  if (kind == RedKind::kSumPostDiv) return {{kind, 1.0, 4}, {kind, 1.0, 3}};
  return {{kind, 1.0, 1}};
}

// Checks reduce, applyPreOp, reduceWithLocal and applyPostOp for one op, count and
// misalignment, including dst aliasing each input.
void checkKernels(DataType t, const RedOp& op, size_t n, size_t offset) {
  const size_t bytes = n * dataTypeSize(t);
  Buffer a(t, n, offset), b(t, n, offset), dst(t, n, offset), alias(t, n, offset);
  fill(t, a.data(), n, 1);
  fill(t, b.data(), n, 2);
  const bool isFloat = isFloatType(t);
  const double s = scalarIn(t, op.scalar);

  auto expectReduce = [&](size_t i) {
    if (!isFloat) return refIntBinary(t, op.kind, loadInt(t, a.data(), i), loadInt(t, b.data(), i));
    const double x = loadAsDouble(t, a.data(), i), y = loadAsDouble(t, b.data(), i);
    return encodeBits(t, refFloatBinary(op.kind, x, y));
  };
  auto expectPre = [&](size_t i) {
    if (!isFloat) return refIntPre(t, op, loadInt(t, a.data(), i));
    const double x = loadAsDouble(t, a.data(), i);
    return encodeBits(t, op.kind == RedKind::kPreMulSum ? x * s : x);
  };
  auto expectFused = [&](size_t i) {
    if (!isFloat) {
      return refIntBinary(t, op.kind, refIntPre(t, op, loadInt(t, a.data(), i)),
                          loadInt(t, b.data(), i));
    }
    const double pre = loadAsDouble(t, a.data(), i) * (op.kind == RedKind::kPreMulSum ? s : 1.0);
    return encodeBits(t, refFloatBinary(op.kind, roundTo(t, pre), loadAsDouble(t, b.data(), i)));
  };
  auto got = [&](unsigned char* p, size_t i) {
    return isFloat ? rawBits(t, p, i) : loadInt(t, p, i);
  };
  auto checkAll = [&](unsigned char* p, auto expect, const char* what) {
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(got(p, i), expect(i)) << what << " element " << i << " of " << n;
    }
  };

  reduce(t, op, dst.data(), a.data(), b.data(), n);
  checkAll(dst.data(), expectReduce, "reduce");
  std::memcpy(alias.data(), a.data(), bytes);
  reduce(t, op, alias.data(), alias.data(), b.data(), n);
  checkAll(alias.data(), expectReduce, "reduce dst==a");
  std::memcpy(alias.data(), b.data(), bytes);
  reduce(t, op, alias.data(), a.data(), alias.data(), n);
  checkAll(alias.data(), expectReduce, "reduce dst==b");

  applyPreOp(t, op, dst.data(), a.data(), n);
  checkAll(dst.data(), expectPre, "applyPreOp");
  std::memcpy(alias.data(), a.data(), bytes);
  applyPreOp(t, op, alias.data(), alias.data(), n);
  checkAll(alias.data(), expectPre, "applyPreOp in place");

  reduceWithLocal(t, op, dst.data(), a.data(), b.data(), n);
  checkAll(dst.data(), expectFused, "reduceWithLocal");
  std::memcpy(alias.data(), a.data(), bytes);
  reduceWithLocal(t, op, alias.data(), alias.data(), b.data(), n);
  checkAll(alias.data(), expectFused, "reduceWithLocal dst==local");
  std::memcpy(alias.data(), b.data(), bytes);
  reduceWithLocal(t, op, alias.data(), a.data(), alias.data(), n);
  checkAll(alias.data(), expectFused, "reduceWithLocal dst==partial");

  // Post-op on the sums, in place.
  reduce(t, RedOp{}, alias.data(), a.data(), b.data(), n);
  std::memcpy(dst.data(), alias.data(), bytes);
  applyPostOp(t, op, alias.data(), alias.data(), n);
  for (size_t i = 0; i < n; ++i) {
    if (!isFloat) {
      ASSERT_EQ(loadInt(t, alias.data(), i), refIntPost(t, op, loadInt(t, dst.data(), i)))
          << "applyPostOp element " << i;
      continue;
    }
    const double x = loadAsDouble(t, dst.data(), i);
    const double exact = op.kind == RedKind::kSumPostDiv ? x / double(op.divisor) : x;
    if (op.divisor == 4 || op.kind != RedKind::kSumPostDiv) {
      ASSERT_EQ(rawBits(t, alias.data(), i), encodeBits(t, exact)) << "applyPostOp element " << i;
    } else {
      ASSERT_LE(std::fabs(loadAsDouble(t, alias.data(), i) - exact), ulpOf(t, exact))
          << "applyPostOp element " << i << " of " << x << " / " << op.divisor;
    }
  }
}

TEST_P(DatatypeKernelTest, MatchesReference) {
  const auto [type, kind] = GetParam();
  for (const RedOp& op : opsFor(type, kind)) {
    for (size_t n : kCounts) {
      for (size_t offset : {0, 1}) {
        SCOPED_TRACE("scalar " + std::to_string(op.scalar) + " divisor " +
                     std::to_string(op.divisor) + " n " + std::to_string(n) + " offset " +
                     std::to_string(offset));
        checkKernels(type, op, n, offset);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// The fused form must give the same bits as applyPreOp followed by reduce, on arbitrary
// bit patterns (NaNs, infinities, subnormals, overflow included).
TEST_P(DatatypeKernelTest, FusedEqualsUnfusedOnRandomBits) {
  const auto [type, kind] = GetParam();
  const size_t n = 1000, bytes = n * dataTypeSize(type);
  std::vector<unsigned char> local(bytes), partial(bytes), pre(bytes), unfused(bytes), fused(bytes);
  for (size_t i = 0; i < bytes; ++i) {
    local[i] = uint8_t(splitmix(i));
    partial[i] = uint8_t(splitmix(i + bytes));
  }
  for (const RedOp& op : opsFor(type, kind)) {
    applyPreOp(type, op, pre.data(), local.data(), n);
    reduce(type, op, unfused.data(), pre.data(), partial.data(), n);
    reduceWithLocal(type, op, fused.data(), local.data(), partial.data(), n);
    EXPECT_EQ(std::memcmp(fused.data(), unfused.data(), bytes), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAllKinds, DatatypeKernelTest,
                         ::testing::Combine(::testing::ValuesIn(kAllTypes),
                                            ::testing::ValuesIn(kAllKinds)),
                         [](const auto& info) {
                           return std::string(dataTypeName(std::get<0>(info.param))) + "_" +
                                  redKindName(std::get<1>(info.param));
                         });

TEST(DatatypeKernels, ZeroCountTouchesNothing) {
  for (DataType t : kAllTypes) {
    for (RedKind k : kAllKinds) {
      const RedOp op{k, 3.0, 3};
      reduce(t, op, nullptr, nullptr, nullptr, 0);
      applyPreOp(t, op, nullptr, nullptr, 0);
      reduceWithLocal(t, op, nullptr, nullptr, nullptr, 0);
      applyPostOp(t, op, nullptr, nullptr, 0);
    }
  }
}

TEST(DatatypeKernels, IntegerWrapAround) {
  int8_t a8[] = {100, -128, 127}, b8[] = {100, -1, 127}, d8[3];
  reduce(DataType::kInt8, {RedKind::kSum}, d8, a8, b8, 3);
  EXPECT_EQ(d8[0], int8_t(-56));
  EXPECT_EQ(d8[1], int8_t(127));
  EXPECT_EQ(d8[2], int8_t(-2));
  reduce(DataType::kInt8, {RedKind::kProd}, d8, a8, b8, 3);
  EXPECT_EQ(d8[0], int8_t(16));  // 10000 mod 256
  EXPECT_EQ(d8[1], int8_t(-128));
  EXPECT_EQ(d8[2], int8_t(1));

  uint8_t ua[] = {200, 255}, ub[] = {100, 255}, ud[2];
  reduce(DataType::kUint8, {RedKind::kSum}, ud, ua, ub, 2);
  EXPECT_EQ(ud[0], 44);
  EXPECT_EQ(ud[1], 254);
  reduce(DataType::kUint8, {RedKind::kProd}, ud, ua, ub, 2);
  EXPECT_EQ(ud[0], uint8_t(20000 % 256));
  EXPECT_EQ(ud[1], 1);

  int32_t a32[] = {std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()};
  int32_t b32[] = {1, -1}, d32[2];
  reduce(DataType::kInt32, {RedKind::kSum}, d32, a32, b32, 2);
  EXPECT_EQ(d32[0], std::numeric_limits<int32_t>::min());
  EXPECT_EQ(d32[1], std::numeric_limits<int32_t>::max());

  int64_t a64[] = {std::numeric_limits<int64_t>::max(), int64_t(1) << 62}, b64[] = {2, 4}, d64[2];
  reduce(DataType::kInt64, {RedKind::kProd}, d64, a64, b64, 2);
  EXPECT_EQ(d64[0], -2);
  EXPECT_EQ(d64[1], 0);

  // PreMulSum by a negative scalar on an unsigned type wraps.
  uint32_t u32[] = {1, 5}, r32[2];
  applyPreOp(DataType::kUint32, {RedKind::kPreMulSum, -1.0, 1}, r32, u32, 2);
  EXPECT_EQ(r32[0], 0xFFFFFFFFu);
  EXPECT_EQ(r32[1], 0xFFFFFFFBu);
}

TEST(DatatypeKernels, SignedPostDivTruncatesTowardZero) {
  int32_t v[] = {-7, 7, -8, 9, std::numeric_limits<int32_t>::min()}, r[5];
  applyPostOp(DataType::kInt32, {RedKind::kSumPostDiv, 1.0, 2}, r, v, 5);
  EXPECT_EQ(r[0], -3);
  EXPECT_EQ(r[1], 3);
  EXPECT_EQ(r[2], -4);
  EXPECT_EQ(r[3], 4);
  EXPECT_EQ(r[4], std::numeric_limits<int32_t>::min() / 2);
  int8_t v8[] = {-128, -3}, r8[2];
  applyPostOp(DataType::kInt8, {RedKind::kSumPostDiv, 1.0, 3}, r8, v8, 2);
  EXPECT_EQ(r8[0], -42);
  EXPECT_EQ(r8[1], -1);
  uint64_t u[] = {~uint64_t(0), 10}, ru[2];
  applyPostOp(DataType::kUint64, {RedKind::kSumPostDiv, 1.0, 3}, ru, u, 2);
  EXPECT_EQ(ru[0], ~uint64_t(0) / 3);
  EXPECT_EQ(ru[1], 3u);
  int64_t big[] = {std::numeric_limits<int64_t>::min(), -5}, rbig[2];
  applyPostOp(DataType::kInt64, {RedKind::kSumPostDiv, 1.0, uint64_t(1) << 63}, rbig, big, 2);
  EXPECT_EQ(rbig[0], -1);
  EXPECT_EQ(rbig[1], 0);
}

// Sums whose exact value lies halfway between two neighbours round to the even one.
TEST(DatatypeKernels, SumRoundsHalfwayToEven) {
  struct Case {
    DataType type;
    int mantissaBits;
  };
  for (Case c : {Case{DataType::kFloat16, 10}, Case{DataType::kBfloat16, 7},
                 Case{DataType::kFloat8e4m3, 3}, Case{DataType::kFloat8e5m2, 2}}) {
    SCOPED_TRACE(dataTypeName(c.type));
    const double ulp = std::ldexp(1.0, -c.mantissaBits);
    uint64_t a = 0, b = 0, d = 0;
    // 1 + ulp/2: halfway between 1 (even) and 1 + ulp (odd): stays 1.
    storeFromDouble(c.type, &a, 0, 1.0);
    storeFromDouble(c.type, &b, 0, ulp / 2);
    reduce(c.type, {RedKind::kSum}, &d, &a, &b, 1);
    EXPECT_EQ(loadAsDouble(c.type, &d, 0), 1.0);
    // (1 + ulp) + ulp/2: halfway between 1 + ulp (odd) and 1 + 2 ulp (even): goes up.
    storeFromDouble(c.type, &a, 0, 1.0 + ulp);
    reduce(c.type, {RedKind::kSum}, &d, &a, &b, 1);
    EXPECT_EQ(loadAsDouble(c.type, &d, 0), 1.0 + 2 * ulp);
    // Negative mirror.
    storeFromDouble(c.type, &a, 0, -1.0 - ulp);
    storeFromDouble(c.type, &b, 0, -ulp / 2);
    reduce(c.type, {RedKind::kSum}, &d, &a, &b, 1);
    EXPECT_EQ(loadAsDouble(c.type, &d, 0), -1.0 - 2 * ulp);
  }
}

TEST(DatatypeKernels, Fp8SaturatesInArithmetic) {
  uint8_t a = floatToFp8e4m3(448.0f), b = floatToFp8e4m3(448.0f), d = 0;
  reduce(DataType::kFloat8e4m3, {RedKind::kSum}, &d, &a, &b, 1);
  EXPECT_EQ(d, 0x7E);
  reduce(DataType::kFloat8e4m3, {RedKind::kProd}, &d, &a, &b, 1);
  EXPECT_EQ(d, 0x7E);
  a = floatToFp8e4m3(-448.0f);
  reduce(DataType::kFloat8e4m3, {RedKind::kSum}, &d, &a, &a, 1);
  EXPECT_EQ(d, 0xFE);
  uint8_t e = floatToFp8e5m2(57344.0f), f = 0;
  reduce(DataType::kFloat8e5m2, {RedKind::kSum}, &f, &e, &e, 1);
  EXPECT_EQ(f, 0x7B);
  uint8_t inf = 0x7C;
  reduce(DataType::kFloat8e5m2, {RedKind::kSum}, &f, &inf, &e, 1);
  EXPECT_EQ(f, 0x7C);
}

TEST(DatatypeKernels, MaxMinDoNotDependOnOrder) {
  // common/minmax.h: max(a, b) and max(b, a) give the same bits for every pair of special
  // values (NaN gives the type's one quiet NaN, -0 is below +0), so no rank's result
  // depends on the order in which it combines its peers.
  for (DataType t : kFloatTypes) {
    SCOPED_TRACE(dataTypeName(t));
    const double vals[] = {kNaN, -kNaN, kInf, -kInf, 0.0, -0.0, 1.5, -2.0};
    const size_t m = std::size(vals), n = m * m;
    std::vector<unsigned char> a(n * 8), b(n * 8), ab(n * 8), ba(n * 8);
    for (size_t i = 0; i < m; ++i) {
      for (size_t j = 0; j < m; ++j) {
        storeFromDouble(t, a.data(), i * m + j, vals[i]);
        storeFromDouble(t, b.data(), i * m + j, vals[j]);
      }
    }
    for (RedKind k : {RedKind::kMax, RedKind::kMin}) {
      reduce(t, {k}, ab.data(), a.data(), b.data(), n);
      reduce(t, {k}, ba.data(), b.data(), a.data(), n);
      for (size_t e = 0; e < n; ++e) {
        EXPECT_EQ(rawBits(t, ab.data(), e), rawBits(t, ba.data(), e))
            << redKindName(k) << " of " << vals[e / m] << " and " << vals[e % m];
      }
      // Two zeros: max is +0 unless both are -0; min is -0 unless both are +0.
      for (size_t i : {size_t{4}, size_t{5}}) {
        for (size_t j : {size_t{4}, size_t{5}}) {
          const double r = loadAsDouble(t, ab.data(), i * m + j);
          const bool neg = k == RedKind::kMax ? (i == 5 && j == 5) : (i == 5 || j == 5);
          EXPECT_EQ(r, 0.0);
          EXPECT_EQ(std::signbit(r), neg)
              << redKindName(k) << " of " << vals[i] << " and " << vals[j];
        }
      }
    }
  }
}

TEST(DatatypeKernels, MaxMinPropagateNaN) {
  for (DataType t : kFloatTypes) {
    SCOPED_TRACE(dataTypeName(t));
    const double av[] = {kNaN, 1.0, kNaN, 2.0, -kInf, 0.5};
    const double bv[] = {1.0, kNaN, kNaN, 3.0, 0.25, kNaN};
    const size_t n = std::size(av);
    std::vector<unsigned char> a(n * 8), b(n * 8), d(n * 8);
    for (size_t i = 0; i < n; ++i) {
      storeFromDouble(t, a.data(), i, av[i]);
      storeFromDouble(t, b.data(), i, bv[i]);
    }
    for (RedKind k : {RedKind::kMax, RedKind::kMin}) {
      reduce(t, {k}, d.data(), a.data(), b.data(), n);
      for (size_t i = 0; i < n; ++i) {
        const double r = loadAsDouble(t, d.data(), i);
        if (std::isnan(av[i]) || std::isnan(bv[i])) {
          EXPECT_TRUE(std::isnan(r)) << redKindName(k) << " element " << i;
        } else {
          EXPECT_EQ(
              r, roundTo(t, k == RedKind::kMax ? std::max(av[i], bv[i]) : std::min(av[i], bv[i])))
              << redKindName(k) << " element " << i;
        }
      }
    }
  }
}

// ---- Conversions. ----

// Decoded value of a code, from the format's definition.
double decodeRef(int mantissaBits, int bias, bool hasInf, uint32_t code, int totalBits) {
  const int expBits = totalBits - 1 - mantissaBits;
  const uint32_t m = code & ((1u << mantissaBits) - 1);
  const uint32_t e = (code >> mantissaBits) & ((1u << expBits) - 1);
  const bool neg = (code >> (totalBits - 1)) & 1;
  const uint32_t eMax = (1u << expBits) - 1;
  double v;
  if (hasInf && e == eMax) {
    v = m == 0 ? kInf : kNaN;
  } else if (!hasInf && e == eMax && m == (1u << mantissaBits) - 1) {
    v = kNaN;  // e4m3: only S.1111.111 is NaN
  } else if (e == 0) {
    v = std::ldexp(double(m), 1 - bias - mantissaBits);
  } else {
    v = std::ldexp(double(m + (1u << mantissaBits)), int(e) - bias - mantissaBits);
  }
  return neg ? -v : v;
}

struct Format {
  const char* name;
  int mantissaBits, bias, bits;
  bool hasInf;
  double maxFinite;
  bool saturates;  // finite overflow gives maxFinite instead of inf
  float (*decode)(uint32_t);
  uint32_t (*encode)(float);
};

const Format kFormats[] = {
    {"fp16", 10, 15, 16, true, 65504.0, false, [](uint32_t c) { return halfToFloat(uint16_t(c)); },
     [](float f) { return uint32_t(floatToHalf(f)); }},
    {"bf16", 7, 127, 16, true, 0x1.FEp127, false,
     [](uint32_t c) { return bf16ToFloat(uint16_t(c)); },
     [](float f) { return uint32_t(floatToBf16(f)); }},
    {"e4m3", 3, 7, 8, false, 448.0, true, [](uint32_t c) { return fp8e4m3ToFloat(uint8_t(c)); },
     [](float f) { return uint32_t(floatToFp8e4m3(f)); }},
    {"e5m2", 2, 15, 8, true, 57344.0, true, [](uint32_t c) { return fp8e5m2ToFloat(uint8_t(c)); },
     [](float f) { return uint32_t(floatToFp8e5m2(f)); }},
};

bool isNaNCode(const Format& f, uint32_t code) {
  return std::isnan(decodeRef(f.mantissaBits, f.bias, f.hasInf, code, f.bits));
}

TEST(DatatypeConversions, EveryCodeDecodesAndRoundTrips) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    for (uint32_t code = 0; code < (1u << f.bits); ++code) {
      const double want = decodeRef(f.mantissaBits, f.bias, f.hasInf, code, f.bits);
      const float got = f.decode(code);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << code;
        const uint32_t back = f.encode(got);
        ASSERT_TRUE(isNaNCode(f, back)) << code << " -> " << back;
        ASSERT_EQ(back >> (f.bits - 1), code >> (f.bits - 1)) << "NaN sign of " << code;
        continue;
      }
      ASSERT_EQ(double(got), want) << code;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << code;
      ASSERT_EQ(f.encode(got), code) << code;
    }
  }
}

// Between every two neighbouring finite codes: the midpoint goes to the even code, and
// the floats just either side of it go to the nearer code.
TEST(DatatypeConversions, HalfwayRoundsToEvenEverywhere) {
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    const uint32_t signBit = 1u << (f.bits - 1);
    for (uint32_t c = 0; c + 1 < signBit; ++c) {
      const double lo = decodeRef(f.mantissaBits, f.bias, f.hasInf, c, f.bits);
      const double hi = decodeRef(f.mantissaBits, f.bias, f.hasInf, c + 1, f.bits);
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const float mid = float((lo + hi) / 2);
      ASSERT_EQ(double(mid), (lo + hi) / 2);
      const uint32_t even = (c & 1) ? c + 1 : c;
      ASSERT_EQ(f.encode(mid), even) << "midpoint of " << c;
      ASSERT_EQ(f.encode(-mid), even | signBit) << "negative midpoint of " << c;
      ASSERT_EQ(f.encode(std::nextafter(mid, 0.0f)), c) << "below midpoint of " << c;
      ASSERT_EQ(f.encode(std::nextafter(mid, INFINITY)), c + 1) << "above midpoint of " << c;
    }
  }
}

// Nearest value of the format, computed with ldexp/nearbyint from the definition.
double roundRef(const Format& f, double x) {
  if (std::isnan(x)) return x;
  if (std::isinf(x)) return f.hasInf ? x : std::copysign(f.maxFinite, x);
  double r = 0;
  if (x != 0) {
    const int minExp = 1 - f.bias;
    const int e = std::max(std::ilogb(x), minExp);
    r = std::ldexp(std::nearbyint(std::ldexp(x, f.mantissaBits - e)), e - f.mantissaBits);
  }
  // Rounded with an unbounded exponent, anything past maxFinite overflowed.
  if (std::fabs(r) > f.maxFinite) r = f.saturates ? f.maxFinite : kInf;
  return std::copysign(r, x);
}

TEST(DatatypeConversions, RandomFloatsRoundToNearest) {
  std::mt19937 rng(12345);
  for (const Format& f : kFormats) {
    SCOPED_TRACE(f.name);
    const int loExp = std::max(1 - f.bias - f.mantissaBits - 3, -150);
    const int hiExp = std::min(std::ilogb(f.maxFinite) + 2, 127);
    for (int i = 0; i < 400000; ++i) {
      float x = std::bit_cast<float>(uint32_t(rng()));
      // Half the samples near the format's range, where the interesting cases are.
      if (i % 2 == 0)
        x = std::ldexp(std::bit_cast<float>(uint32_t(0x3F800000u | (rng() & 0x7FFFFFu))),
                       int(rng() % uint32_t(hiExp - loExp + 1)) + loExp);
      if (rng() & 1) x = -x;
      if (std::isnan(x)) {
        ASSERT_TRUE(isNaNCode(f, f.encode(x)));
        continue;
      }
      const double want = roundRef(f, x);
      const float got = f.decode(f.encode(x));
      ASSERT_EQ(double(got), want) << f.name << " of " << x;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << f.name << " of " << x;
    }
  }
}

TEST(DatatypeConversions, Fp8Saturation) {
  EXPECT_EQ(floatToFp8e4m3(448.0f), 0x7E);
  EXPECT_EQ(floatToFp8e4m3(449.0f), 0x7E);
  EXPECT_EQ(floatToFp8e4m3(464.0f), 0x7E);
  EXPECT_EQ(floatToFp8e4m3(1e6f), 0x7E);
  EXPECT_EQ(floatToFp8e4m3(-1e6f), 0xFE);
  EXPECT_EQ(floatToFp8e4m3(INFINITY), 0x7E);
  EXPECT_EQ(floatToFp8e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(floatToFp8e4m3(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(floatToFp8e5m2(57344.0f), 0x7B);
  EXPECT_EQ(floatToFp8e5m2(61440.0f), 0x7B);
  EXPECT_EQ(floatToFp8e5m2(1e30f), 0x7B);
  EXPECT_EQ(floatToFp8e5m2(-1e30f), 0xFB);
  EXPECT_EQ(floatToFp8e5m2(INFINITY), 0x7C);
  EXPECT_EQ(floatToFp8e5m2(-INFINITY), 0xFC);
  EXPECT_TRUE(std::isnan(fp8e5m2ToFloat(floatToFp8e5m2(NAN))));
  // fp16 and bf16 overflow to infinity instead.
  EXPECT_EQ(floatToHalf(65519.0f), 0x7BFF);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7C00);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7F80);
}

TEST(DatatypeConversions, StoreFromDoubleRoundsOnce) {
  // 1 + 2^-11 + 2^-40 is just above the fp16 midpoint between 1 and 1 + 2^-10. Through
  // float it would first become the midpoint and then round to 1.
  uint16_t h = 0;
  storeFromDouble(DataType::kFloat16, &h, 0, 1.0 + 0x1p-11 + 0x1p-40);
  EXPECT_EQ(h, 0x3C01);
  storeFromDouble(DataType::kBfloat16, &h, 0, 1.0 + 0x1p-8 + 0x1p-40);
  EXPECT_EQ(h, 0x3F81);
  storeFromDouble(DataType::kFloat16, &h, 0, 1e300);
  EXPECT_EQ(h, 0x7C00);
  uint8_t e = 0;
  storeFromDouble(DataType::kFloat8e4m3, &e, 0, -1e300);
  EXPECT_EQ(e, 0xFE);
  storeFromDouble(DataType::kFloat8e5m2, &e, 0, 1e-300);  // tiny positive: +0
  EXPECT_EQ(e, 0x00);
  // Integers round to nearest and saturate.
  int8_t i8[3];
  storeFromDouble(DataType::kInt8, i8, 0, 2.6);
  storeFromDouble(DataType::kInt8, i8, 1, -1000.0);
  storeFromDouble(DataType::kInt8, i8, 2, 1000.0);
  EXPECT_EQ(i8[0], 3);
  EXPECT_EQ(i8[1], -128);
  EXPECT_EQ(i8[2], 127);
  uint64_t u = 0;
  storeFromDouble(DataType::kUint64, &u, 0, 1e30);
  EXPECT_EQ(u, ~uint64_t(0));
  storeFromDouble(DataType::kUint64, &u, 0, 0x1p63);
  EXPECT_EQ(u, uint64_t(1) << 63);
  EXPECT_EQ(loadAsDouble(DataType::kUint64, &u, 0), 0x1p63);
}

TEST(DatatypeNames, SizesAndNames) {
  const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  const char* names[] = {"int8", "uint8", "int32",  "uint32",   "int64",  "uint64",
                         "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
  for (int i = 0; i < kNumDataTypes; ++i) {
    EXPECT_TRUE(isValidDataType(i));
    EXPECT_EQ(dataTypeSize(DataType(i)), sizes[i]);
    EXPECT_STREQ(dataTypeName(DataType(i)), names[i]);
    EXPECT_EQ(isFloatType(DataType(i)), i >= 6);
  }
  EXPECT_FALSE(isValidDataType(-1));
  EXPECT_FALSE(isValidDataType(kNumDataTypes));
  EXPECT_EQ(dataTypeSize(DataType(kNumDataTypes)), 0u);
  EXPECT_STREQ(redKindName(RedKind::kPreMulSum), "premulsum");
  EXPECT_STREQ(redKindName(RedKind::kSumPostDiv), "sumpostdiv");
  EXPECT_TRUE(hasPreOp({RedKind::kPreMulSum, 0.5, 1}));
  EXPECT_FALSE(hasPreOp({RedKind::kPreMulSum, 1.0, 1}));
  EXPECT_FALSE(hasPreOp({RedKind::kSum, 0.5, 1}));
  EXPECT_TRUE(hasPostOp({RedKind::kSumPostDiv, 1.0, 4}));
  EXPECT_FALSE(hasPostOp({RedKind::kSumPostDiv, 1.0, 1}));
  EXPECT_FALSE(hasPostOp({RedKind::kMax, 1.0, 4}));
}

}  // namespace
}  // namespace loom
