#include "perf_tests/harness/values.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

namespace loom::perf {
namespace {

// ---- encoding helpers ----

double roundHalfEven(double x) {
  return std::nearbyint(x);
}  // default FP env: to nearest even

int exponentBias(int exponentBits) {
  return (1 << (exponentBits - 1)) - 1;
}

double largestFinite(int exponentBits, int mantissaBits, bool finiteOnly) {
  const int bias = exponentBias(exponentBits);
  if (finiteOnly) {
    // Top exponent field is usable; mantissa all-ones there is NaN.
    const int maxField = (1 << exponentBits) - 1;
    const double mant = 1.0 + ((1 << mantissaBits) - 2) / double(1 << mantissaBits);
    return std::ldexp(mant, maxField - bias);
  }
  const int maxField = (1 << exponentBits) - 2;
  const double mant = 1.0 + ((1 << mantissaBits) - 1) / double(1 << mantissaBits);
  return std::ldexp(mant, maxField - bias);
}

double smallestNormal(const TypeInfo& info) {
  switch (info.type) {
    case ncclFloat32: return std::numeric_limits<float>::min();
    case ncclFloat64: return std::numeric_limits<double>::min();
    default: return std::ldexp(1.0, 1 - exponentBias(info.exponentBits));
  }
}

bool isFiniteOnly(ncclDataType_t type) {
  return type == ncclFloat8e4m3;
}

// ---- generator helpers ----

uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The largest integer magnitude the type holds exactly (capped: we never need more).
int64_t exactLimit(const TypeInfo& info) {
  switch (info.type) {
    case ncclInt8: return 127;
    case ncclUint8: return 127;  // keeps results below the 0xA5 poison
    case ncclFloat16: return 2048;
    case ncclBfloat16: return 256;
    case ncclFloat8e4m3: return 16;
    case ncclFloat8e5m2: return 8;
    default: return int64_t{1} << 20;
  }
}

int64_t valueRange(const DataParams& p, const TypeInfo& info) {
  const int64_t limit = exactLimit(info);
  if (p.op == OpKind::kMax || p.op == OpKind::kMin) return std::min<int64_t>(64, limit);
  const int64_t perRank = p.op == OpKind::kMulSum ? 2 * int64_t{p.nranks} : p.nranks;
  return std::clamp<int64_t>(limit / std::max<int64_t>(perRank, 1), 2, 64);
}

uint64_t widthMask(size_t size) {
  return size >= 8 ? ~uint64_t{0} : ((uint64_t{1} << (8 * size)) - 1);
}

// `valueOf(r)`: rank r's input at the element (the checks pass precomputed generators).
template <typename ValueOf>
Expected integerReduce(const DataParams& p, const TypeInfo& info, ValueOf valueOf) {
  uint64_t acc = 0;
  int64_t best = 0;
  for (int r = 0; r < p.nranks; ++r) {
    const int64_t x = valueOf(r);
    const uint64_t ux = static_cast<uint64_t>(x);
    switch (p.op) {
      case OpKind::kSum:
      case OpKind::kAvg: acc = r == 0 ? ux : acc + ux; break;
      case OpKind::kProd: acc = r == 0 ? ux : acc * ux; break;
      case OpKind::kMulSum: {
        const uint64_t term = ux * static_cast<uint64_t>(mulSumScalar(r));
        acc = r == 0 ? term : acc + term;
        break;
      }
      case OpKind::kMax: best = r == 0 ? x : std::max(best, x); break;
      case OpKind::kMin: best = r == 0 ? x : std::min(best, x); break;
    }
  }
  Expected e;
  if (p.op == OpKind::kMax || p.op == OpKind::kMin) acc = static_cast<uint64_t>(best);
  // avg inputs are non-negative and their sum fits the type, so this is NCCL's sum-then-divide.
  if (p.op == OpKind::kAvg) acc = static_cast<uint64_t>(static_cast<int64_t>(acc) / p.nranks);
  e.bits = acc & widthMask(info.size);
  return e;
}

template <typename ValueOf>
Expected floatReduce(const DataParams& p, const TypeInfo& info, double smallest, ValueOf valueOf) {
  double acc = 0, absSum = 0;
  for (int r = 0; r < p.nranks; ++r) {
    const double x = static_cast<double>(valueOf(r));
    switch (p.op) {
      case OpKind::kSum:
      case OpKind::kAvg:
        acc += x;
        absSum += std::fabs(x);
        break;
      case OpKind::kMulSum: {
        const double term = x * static_cast<double>(mulSumScalar(r));
        acc += term;
        absSum += std::fabs(term);
        break;
      }
      case OpKind::kProd: acc = r == 0 ? x : acc * x; break;
      case OpKind::kMax: acc = r == 0 ? x : std::max(acc, x); break;
      case OpKind::kMin: acc = r == 0 ? x : std::min(acc, x); break;
    }
  }
  const double eps = std::ldexp(1.0, -info.mantissaBits);
  const double n = p.nranks;
  Expected e;
  e.isFloat = true;
  e.value = acc;
  switch (p.op) {
    case OpKind::kAvg:
      e.value = acc / n;
      e.tolerance = (n + 1) * eps * absSum / n;
      break;
    case OpKind::kSum:
    case OpKind::kMulSum: e.tolerance = (n + 1) * eps * absSum; break;
    case OpKind::kProd: e.tolerance = (n + 1) * eps * std::fabs(acc); break;
    case OpKind::kMax:
    case OpKind::kMin: e.tolerance = 0; break;
  }
  if (e.tolerance > 0) e.tolerance += smallest;
  return e;
}

}  // namespace

// ---- encoding ----

uint32_t encodeSmallFloat(double value, int exponentBits, int mantissaBits, bool finiteOnly) {
  const int bias = exponentBias(exponentBits);
  const uint32_t signBit = 1u << (exponentBits + mantissaBits);
  const uint32_t expMask = (1u << exponentBits) - 1;
  const uint32_t nanBits = finiteOnly ? ((expMask << mantissaBits) | ((1u << mantissaBits) - 1))
                                      : ((expMask << mantissaBits) | (1u << (mantissaBits - 1)));
  if (std::isnan(value)) return nanBits;
  const uint32_t sign = std::signbit(value) ? signBit : 0;
  double a = std::fabs(value);
  const double maxFinite = largestFinite(exponentBits, mantissaBits, finiteOnly);
  if (std::isinf(a))
    return finiteOnly ? (sign | (nanBits & ~signBit)) : (sign | (expMask << mantissaBits));
  if (a == 0) return sign;
  const int minExp = 1 - bias;
  int e2 = 0;
  std::frexp(a, &e2);
  int exp = e2 - 1;  // a = 1.f * 2^exp
  if (exp < minExp) {
    // Subnormal: quantum 2^(minExp - mantissaBits); a carry into 1 << mantissaBits is exactly
    // the smallest normal's encoding.
    const double m = roundHalfEven(std::ldexp(a, mantissaBits - minExp));
    return sign | static_cast<uint32_t>(m);
  }
  double m = roundHalfEven(std::ldexp(a, mantissaBits - exp));  // in [2^mb, 2^(mb+1)]
  if (m >= std::ldexp(1.0, mantissaBits + 1)) {
    m /= 2;
    exp += 1;
  }
  const double rounded = std::ldexp(m, exp - mantissaBits);
  if (rounded > maxFinite) {
    if (finiteOnly) return sign | encodeSmallFloat(maxFinite, exponentBits, mantissaBits, true);
    return sign | (expMask << mantissaBits);
  }
  const uint32_t field = static_cast<uint32_t>(exp + bias);
  const uint32_t frac = static_cast<uint32_t>(m) - (1u << mantissaBits);
  return sign | (field << mantissaBits) | frac;
}

double decodeSmallFloat(uint32_t bits, int exponentBits, int mantissaBits, bool finiteOnly) {
  const int bias = exponentBias(exponentBits);
  const uint32_t expMask = (1u << exponentBits) - 1;
  const uint32_t fracMask = (1u << mantissaBits) - 1;
  const bool negative = (bits >> (exponentBits + mantissaBits)) & 1;
  const uint32_t field = (bits >> mantissaBits) & expMask;
  const uint32_t frac = bits & fracMask;
  double v;
  if (field == 0) {
    v = std::ldexp(static_cast<double>(frac), 1 - bias - mantissaBits);
  } else if (field == expMask && !finiteOnly) {
    v = frac ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (field == expMask && finiteOnly && frac == fracMask) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(1.0 + static_cast<double>(frac) / (1u << mantissaBits),
                   static_cast<int>(field) - bias);
  }
  return negative ? -v : v;
}

void storeFloat(ncclDataType_t type, double value, void* dst) {
  const TypeInfo& info = typeInfo(type);
  if (type == ncclFloat32) {
    const float f = static_cast<float>(value);
    std::memcpy(dst, &f, sizeof f);
  } else if (type == ncclFloat64) {
    std::memcpy(dst, &value, sizeof value);
  } else {
    const uint32_t bits =
        encodeSmallFloat(value, info.exponentBits, info.mantissaBits, isFiniteOnly(type));
    std::memcpy(dst, &bits, info.size);  // little-endian: the low bytes
  }
}

double loadFloat(ncclDataType_t type, const void* src) {
  const TypeInfo& info = typeInfo(type);
  if (type == ncclFloat32) {
    float f;
    std::memcpy(&f, src, sizeof f);
    return f;
  }
  if (type == ncclFloat64) {
    double d;
    std::memcpy(&d, src, sizeof d);
    return d;
  }
  uint32_t bits = 0;
  std::memcpy(&bits, src, info.size);
  return decodeSmallFloat(bits, info.exponentBits, info.mantissaBits, isFiniteOnly(type));
}

void storeInteger(ncclDataType_t type, uint64_t value, void* dst) {
  std::memcpy(dst, &value, typeInfo(type).size);
}

uint64_t loadIntegerBits(ncclDataType_t type, const void* src) {
  uint64_t v = 0;
  std::memcpy(&v, src, typeInfo(type).size);
  return v;
}

void storeValue(ncclDataType_t type, int64_t value, void* dst) {
  if (typeInfo(type).isFloat) {
    storeFloat(type, static_cast<double>(value), dst);
  } else {
    storeInteger(type, static_cast<uint64_t>(value), dst);
  }
}

// ---- generator ----

int64_t mulSumScalar(int rank) {
  return 1 + rank % 2;
}

namespace {

// One rank's inputs, with everything that does not depend on the index worked out once
// (the GiB-sized checks call this billions of times).
class InputGen {
 public:
  InputGen(const DataParams& p, int rank)
      : prod_(p.op == OpKind::kProd),
        seed_(p.seed),
        rank_(static_cast<uint64_t>(rank)),
        slots_(static_cast<uint64_t>(p.nranks) + 1),
        rankHash_(mix(p.seed * 0x100000001B3ull + rank_)) {
    const TypeInfo& info = typeInfo(p.type);
    signed_ = info.isSigned;
    k_ = prod_ ? 1 : valueRange(p, info);
    const bool nonNegative = !info.isSigned || (p.op == OpKind::kAvg && !info.isFloat);
    offset_ = nonNegative ? 0 : k_ / 2;
  }
  int64_t operator()(size_t index) const {
    if (prod_) {
      // One rank in n+1 positions holds 2 (none for the remaining index), another holds -1.
      const uint64_t h = mix(seed_ ^ index);
      if (rank_ == h % slots_) return 2;
      if (signed_ && rank_ == (h >> 32) % slots_) return -1;
      return 1;
    }
    return static_cast<int64_t>(mix(rankHash_ ^ index) % static_cast<uint64_t>(k_)) - offset_;
  }

 private:
  bool prod_;
  bool signed_ = false;
  uint64_t seed_, rank_, slots_, rankHash_;
  int64_t k_ = 1, offset_ = 0;
};

}  // namespace

int64_t inputValue(const DataParams& p, int rank, size_t index) {
  return InputGen(p, rank)(index);
}

unsigned usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    return static_cast<unsigned>(std::max(1, CPU_COUNT(&set)));
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

namespace {

// Runs fn(begin, end) over [0, count) on several threads (one per CPU this process may run
// on, at most 32) when count is large (GiB-sized checks would otherwise take minutes per
// row); results do not depend on the split.
template <typename Fn>
void parallelFor(size_t count, Fn fn) {
  constexpr size_t kSerial = size_t{1} << 22;
  const unsigned n = count < kSerial ? 1 : std::min(32u, usableCpus());
  if (n == 1) {
    fn(size_t{0}, count);
    return;
  }
  std::vector<std::thread> threads;
  const size_t per = (count + n - 1) / n;
  for (unsigned t = 0; t < n; ++t) {
    const size_t b = std::min(count, t * per), e = std::min(count, b + per);
    threads.emplace_back([&fn, b, e] { fn(b, e); });
  }
  for (auto& th : threads) th.join();
}

}  // namespace

void fillInput(const DataParams& params, int rank, void* dst, size_t count) {
  const size_t size = typeInfo(params.type).size;
  auto* out = static_cast<char*>(dst);
  const InputGen gen(params, rank);
  parallelFor(count, [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i) storeValue(params.type, gen(i), out + i * size);
  });
}

int poisonByte(ncclDataType_t type) {
  return typeInfo(type).isFloat ? 0x7F : 0xA5;
}

// ---- expected ----

Expected expectedReduce(const DataParams& params, size_t index) {
  const TypeInfo& info = typeInfo(params.type);
  auto valueOf = [&](int r) { return inputValue(params, r, index); };
  return info.isFloat ? floatReduce(params, info, smallestNormal(info), valueOf)
                      : integerReduce(params, info, valueOf);
}

namespace {

// An input value `x` as a copy must hold it (exact).
Expected copied(const DataParams& params, const TypeInfo& info, int64_t x) {
  Expected e;
  e.isFloat = info.isFloat;
  if (info.isFloat) {
    // The stored input is the exact value rounded into the type; a copy must match it exactly.
    char buf[8] = {};
    storeFloat(params.type, static_cast<double>(x), buf);
    e.value = loadFloat(params.type, buf);
  } else {
    e.bits = static_cast<uint64_t>(x) & widthMask(info.size);
  }
  return e;
}

}  // namespace

Expected expectedCopy(const DataParams& params, int rank, size_t index) {
  return copied(params, typeInfo(params.type), inputValue(params, rank, index));
}

bool matches(ncclDataType_t type, const Expected& expected, const void* element) {
  if (!expected.isFloat) return loadIntegerBits(type, element) == expected.bits;
  const double got = loadFloat(type, element);
  if (std::isnan(got)) return false;
  return std::fabs(got - expected.value) <= expected.tolerance;
}

int64_t countWrong(const DataParams& params, const RankLayout& layout, ExpectFn expect,
                   const void* data, size_t count) {
  const TypeInfo& info = typeInfo(params.type);
  const size_t size = info.size;
  const double smallest = info.isFloat ? smallestNormal(info) : 0;  // (integers have no exponent)
  std::vector<InputGen> gens;
  for (int r = 0; r < params.nranks; ++r) gens.emplace_back(params, r);
  // What `source` must hold: expectedCopy() or expectedReduce(), with the generators above.
  auto expected = [&](const Source& source) {
    if (source.kind == Source::Kind::kCopy)
      return copied(params, info, gens[source.rank](source.index));
    auto valueOf = [&](int r) { return gens[r](source.index); };
    return info.isFloat ? floatReduce(params, info, smallest, valueOf)
                        : integerReduce(params, info, valueOf);
  };
  const auto* bytes = static_cast<const char*>(data);
  std::atomic<int64_t> wrong{0};
  parallelFor(count, [&](size_t b, size_t e) {
    int64_t local = 0;
    for (size_t j = b; j < e; ++j) {
      const Source source = expect(layout, j);
      if (source.kind == Source::Kind::kUnchecked) continue;
      if (!matches(params.type, expected(source), bytes + j * size)) ++local;
    }
    wrong += local;
  });
  return wrong.load();
}

}  // namespace loom::perf
