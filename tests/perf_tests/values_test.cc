#include "perf_tests/harness/values.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

namespace loom::perf {
namespace {

uint32_t half(double v) {
  return encodeSmallFloat(v, 5, 10, false);
}
uint32_t bf16(double v) {
  return encodeSmallFloat(v, 8, 7, false);
}
uint32_t e4m3(double v) {
  return encodeSmallFloat(v, 4, 3, true);
}
uint32_t e5m2(double v) {
  return encodeSmallFloat(v, 5, 2, false);
}

TEST(Encoding, KnownBitPatterns) {
  EXPECT_EQ(half(1.0), 0x3C00u);
  EXPECT_EQ(half(-2.0), 0xC000u);
  EXPECT_EQ(half(65504.0), 0x7BFFu);
  EXPECT_EQ(half(1e6), 0x7C00u);                   // overflow: infinity
  EXPECT_EQ(half(std::ldexp(1.0, -24)), 0x0001u);  // smallest subnormal
  EXPECT_EQ(half(std::ldexp(0.5, -24)), 0x0000u);  // tie to even: 0
  EXPECT_EQ(half(std::ldexp(1.5, -24)), 0x0002u);  // tie to even: 2
  EXPECT_EQ(half(2049.0), 0x6800u);                // tie to even: 2048
  EXPECT_EQ(half(2051.0), 0x6802u);                // tie to even: 2052
  EXPECT_EQ(half(-0.0), 0x8000u);
  EXPECT_EQ(bf16(1.0), 0x3F80u);
  EXPECT_EQ(bf16(-1.0), 0xBF80u);
  EXPECT_EQ(bf16(3.0), 0x4040u);
  EXPECT_EQ(e4m3(1.0), 0x38u);
  EXPECT_EQ(e4m3(448.0), 0x7Eu);
  EXPECT_EQ(e4m3(1000.0), 0x7Eu);  // saturates, no infinity
  EXPECT_EQ(e4m3(std::nan("")), 0x7Fu);
  EXPECT_EQ(e4m3(std::ldexp(1.0, -9)), 0x01u);
  EXPECT_EQ(e4m3(-16.0), 0xD8u);
  EXPECT_EQ(e5m2(1.0), 0x3Cu);
  EXPECT_EQ(e5m2(57344.0), 0x7Bu);
  EXPECT_EQ(e5m2(1e6), 0x7Cu);
}

TEST(Encoding, DecodeInvertsEncode) {
  struct Format {
    int e, m;
    bool finiteOnly;
  };
  for (const Format f :
       {Format{5, 10, false}, Format{8, 7, false}, Format{4, 3, true}, Format{5, 2, false}}) {
    const uint32_t n = 1u << (1 + f.e + f.m);
    for (uint32_t bits = 0; bits < n; ++bits) {
      const double v = decodeSmallFloat(bits, f.e, f.m, f.finiteOnly);
      if (std::isnan(v)) continue;
      EXPECT_EQ(encodeSmallFloat(v, f.e, f.m, f.finiteOnly), bits) << f.e << "," << f.m;
    }
  }
}

TEST(Encoding, GenericEncoderAgreesWithFloat) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> exp(-140, 127);
  for (int i = 0; i < 20000; ++i) {
    const double v = std::ldexp(1.0 + (rng() % 1000000) / 1e6, static_cast<int>(exp(rng))) *
                     ((rng() & 1) ? -1 : 1);
    const uint32_t bits = std::bit_cast<uint32_t>(static_cast<float>(v));
    EXPECT_EQ(encodeSmallFloat(v, 8, 23, false), bits) << v;
  }
}

TEST(Encoding, StoreAndLoadEveryType) {
  for (const TypeInfo& t : allTypes()) {
    for (int64_t v : {-3, 0, 1, 7}) {
      if (!t.isSigned && v < 0) continue;
      char buf[8] = {};
      storeValue(t.type, v, buf);
      if (t.isFloat) {
        EXPECT_EQ(loadFloat(t.type, buf), static_cast<double>(v)) << t.name;
      } else {
        const uint64_t mask = t.size == 8 ? ~0ull : (1ull << (8 * t.size)) - 1;
        EXPECT_EQ(loadIntegerBits(t.type, buf), static_cast<uint64_t>(v) & mask) << t.name;
      }
    }
  }
}

TEST(Inputs, VaryByRankAndIndexAndAreNeverConstant) {
  for (const TypeInfo& t : allTypes()) {
    for (const OpInfo& op : allOps()) {
      for (int n : {1, 2, 4, 7}) {
        DataParams p{t.type, op.kind, n, 5};
        std::set<int64_t> values;
        bool rankDiffers = n == 1;
        for (size_t i = 0; i < 64; ++i) {
          for (int r = 0; r < n; ++r) {
            values.insert(inputValue(p, r, i));
            if (r > 0 && inputValue(p, r, i) != inputValue(p, 0, i)) rankDiffers = true;
          }
        }
        EXPECT_GE(values.size(), 2u) << t.name << " " << op.name << " n=" << n;
        EXPECT_TRUE(rankDiffers) << t.name << " " << op.name << " n=" << n;
        if (op.kind == OpKind::kProd) {
          for (int64_t v : values) EXPECT_TRUE(v == 1 || v == 2 || v == -1);
        }
        if (!t.isSigned) {
          for (int64_t v : values) EXPECT_GE(v, 0);
        }
      }
    }
  }
}

TEST(Expected, IntegerResultsAreExactAndWrap) {
  DataParams p{ncclInt32, OpKind::kSum, 3, 11};
  for (size_t i = 0; i < 100; ++i) {
    int64_t sum = 0;
    for (int r = 0; r < 3; ++r) sum += inputValue(p, r, i);
    EXPECT_EQ(expectedReduce(p, i).bits, static_cast<uint64_t>(sum) & 0xFFFFFFFFull);
  }
  p = {ncclUint8, OpKind::kAvg, 4, 3};
  for (size_t i = 0; i < 100; ++i) {
    int64_t sum = 0;
    for (int r = 0; r < 4; ++r) sum += inputValue(p, r, i);
    EXPECT_EQ(expectedReduce(p, i).bits, static_cast<uint64_t>(sum / 4));
  }
  p = {ncclInt8, OpKind::kMulSum, 5, 3};
  for (size_t i = 0; i < 100; ++i) {
    int64_t sum = 0;
    for (int r = 0; r < 5; ++r) sum += inputValue(p, r, i) * mulSumScalar(r);
    EXPECT_EQ(expectedReduce(p, i).bits, static_cast<uint64_t>(sum) & 0xFF);
  }
}

TEST(Expected, MinMaxAndProdAreExactForFloats) {
  for (OpKind op : {OpKind::kMin, OpKind::kMax, OpKind::kProd}) {
    DataParams p{ncclFloat8e4m3, op, 4, 1};
    for (size_t i = 0; i < 100; ++i) {
      const Expected e = expectedReduce(p, i);
      char buf[1];
      storeFloat(p.type, e.value, buf);
      EXPECT_TRUE(matches(p.type, e, buf));
      if (op != OpKind::kProd) {
        EXPECT_EQ(e.tolerance, 0);
      }
    }
  }
}

TEST(Expected, FloatToleranceScalesWithRanksAndEpsilon) {
  DataParams p{ncclFloat32, OpKind::kSum, 8, 2};
  const Expected e = expectedReduce(p, 0);
  double absSum = 0;
  for (int r = 0; r < 8; ++r) absSum += std::fabs(static_cast<double>(inputValue(p, r, 0)));
  EXPECT_NEAR(e.tolerance, 9 * std::ldexp(1.0, -23) * absSum, 1e-30 + std::ldexp(1.0, -126) * 2);
  DataParams h{ncclFloat16, OpKind::kAvg, 3, 2};
  const Expected a = expectedReduce(h, 5);
  EXPECT_GT(a.tolerance, 0);
  EXPECT_LT(a.tolerance, 1.0);  // far below the spacing of the integer inputs
}

TEST(Matching, PoisonNeverMatchesAndCorruptionIsCounted) {
  for (const TypeInfo& t : allTypes()) {
    for (const OpInfo& op : allOps()) {
      const DataParams p{t.type, op.kind, 4, 9};
      char poison[8];
      std::memset(poison, poisonByte(t.type), sizeof poison);
      for (size_t i = 0; i < 200; ++i) {
        EXPECT_FALSE(matches(t.type, expectedReduce(p, i), poison)) << t.name << " " << op.name;
        EXPECT_FALSE(matches(t.type, expectedCopy(p, 1, i), poison)) << t.name << " " << op.name;
      }
    }
  }
}

Source identity(const RankLayout& l, size_t j) {
  return Source::copy(l.rank, j);
}

TEST(Matching, CountWrong) {
  for (const TypeInfo& t : allTypes()) {
    const DataParams p{t.type, OpKind::kSum, 3, 4};
    std::vector<char> data(100 * t.size);
    fillInput(p, 2, data.data(), 100);
    RankLayout layout;
    layout.rank = 2;
    layout.nranks = 3;
    EXPECT_EQ(countWrong(p, layout, identity, data.data(), 100), 0) << t.name;
    std::memset(data.data() + 10 * t.size, poisonByte(t.type), t.size);
    std::memset(data.data() + 99 * t.size, poisonByte(t.type), t.size);
    EXPECT_EQ(countWrong(p, layout, identity, data.data(), 100), 2) << t.name;
  }
}

}  // namespace
}  // namespace loom::perf
