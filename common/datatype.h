// Element types and reduction operations, and the CPU kernels that apply them.
//
// Values of DataType equal ncclDataType_t's. All kernels accept unaligned pointers and
// any element count (including 0), and are vectorised for the common cases. Results are
// deterministic: the same inputs give bitwise the same output on every rank.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace loom {

enum class DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFloat8e4m3 = 10,
  kFloat8e5m2 = 11,
};
inline constexpr int kNumDataTypes = 12;

// Bytes per element; 0 for an invalid type.
size_t dataTypeSize(DataType type);
// "int8", "float", "half", "bfloat16", "f8e4m3", ... (nccl-tests' names).
const char* dataTypeName(DataType type);
bool isValidDataType(int type);
bool isFloatType(DataType type);

// What reaches the kernels. The C API's ncclAvg becomes kPreMulSum with 1/nranks for
// float types and kSumPostDiv(nranks) for integer types, as NCCL defines it.
enum class RedKind : int {
  kSum = 0,
  kProd = 1,
  kMax = 2,
  kMin = 3,
  kPreMulSum = 4,   // each rank's own input is multiplied by `scalar` before summing
  kSumPostDiv = 5,  // sum, then the final result is divided by `divisor` (integers)
};

struct RedOp {
  RedKind kind = RedKind::kSum;
  // For kPreMulSum: the scalar as a double (converted to the element type's arithmetic
  // by the kernels; for integer types it is used as an integer).
  double scalar = 1.0;
  // For kSumPostDiv: the divisor (> 0).
  uint64_t divisor = 1;
};

// "sum", "prod", "max", "min", "premulsum", "sumpostdiv".
const char* redKindName(RedKind kind);

// Kernels. `n` is an element count. dst may alias any input exactly (same pointer), but
// must not partially overlap.
//
// A rank's own contribution enters a reduction through the pre-op (PreMulSum
// multiplies by the scalar; every other kind copies). Partial results combine with
// `reduce`. The rank that produces a final result applies the post-op once
// (SumPostDiv divides; every other kind copies).

// dst = pre(src)
void applyPreOp(DataType type, const RedOp& op, void* dst, const void* src, size_t n);
// dst = a (+) b, where both are already pre-op'd partials.
void reduce(DataType type, const RedOp& op, void* dst, const void* a, const void* b, size_t n);
// dst = pre(local) (+) partial  (fused form of applyPreOp + reduce)
void reduceWithLocal(DataType type, const RedOp& op, void* dst, const void* local,
                     const void* partial, size_t n);
// dst = post(src)
void applyPostOp(DataType type, const RedOp& op, void* dst, const void* src, size_t n);
// True when applyPostOp is not a plain copy for this op.
bool hasPostOp(const RedOp& op);
// True when applyPreOp is not a plain copy for this op.
bool hasPreOp(const RedOp& op);

// Scalar conversions used by tests, the perf binaries' checks and the kernels.
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);  // round to nearest even
float bf16ToFloat(uint16_t h);
uint16_t floatToBf16(float f);  // round to nearest even
float fp8e4m3ToFloat(uint8_t v);
uint8_t floatToFp8e4m3(float f);  // round to nearest even, saturating to +-448 (NaN stays NaN)
float fp8e5m2ToFloat(uint8_t v);
uint8_t floatToFp8e5m2(float f);  // round to nearest even, saturating to +-57344 (inf/NaN kept)

// Reads element i of a buffer of `type` as a double, and writes one from a double
// (rounding as the element type does). For tests and checks, not for hot paths.
double loadAsDouble(DataType type, const void* base, size_t i);
void storeFromDouble(DataType type, void* base, size_t i, double value);

}  // namespace loom
