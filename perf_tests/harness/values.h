// Test data for -c (check): what each rank puts in its input, what each output element must
// hold, and how closely.
//
// Inputs are small integers that depend on the rank, the element index and a seed, chosen per
// type and operation so that the result is exactly known:
//   sum, avg, mulsum  values in a range [0, K) (signed types: [-K/2, K/2)), with K chosen so
//                     that the sum of nranks of them stays exactly representable where the type
//                     allows it (K = limit / nranks, clamped to [2, 64]; limit is the largest
//                     integer the type holds exactly, e.g. 2048 for half, 16 for f8e4m3, 127
//                     for uint8). avg on
//                     integer types uses non-negative values only (truncation is then unambiguous).
//   prod              1 almost everywhere, 2 on one rank for most indices and -1 on another for
//                     signed types, so products are exact powers of two with varying sign.
//   max, min          values in a range of 64 (fewer where the type holds fewer exact integers).
//   mulsum            each rank's scalar is 1 + rank % 2.
// Integer results are computed exactly in 64-bit modular arithmetic and truncated to the type,
// so they match bit for bit, overflow included. Float results are computed in double and
// compared with a tolerance of (nranks + 1) * eps * sum(|terms|) (divided by nranks for avg;
// prod uses |product|), plus the type's smallest normal number, where eps = 2^-mantissa_bits.
// This bounds the rounding of any summation order in the type, of the 1/nranks scalar for avg,
// and of the final store. Copies (gather, broadcast, send/recv, alltoall) must match exactly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "nccl.h"
#include "perf_tests/harness/types.h"

namespace loom::perf {

// ---- element encoding --------------------------------------------------------------------

// Round-to-nearest-even encoding of `value` in a binary float format with the given field
// widths. `finiteOnly` selects the OCP e4m3 convention (no infinities, only S.1111.111 is NaN,
// overflow saturates to the largest finite value); otherwise IEEE rules (overflow to infinity).
uint32_t encodeSmallFloat(double value, int exponentBits, int mantissaBits, bool finiteOnly);
double decodeSmallFloat(uint32_t bits, int exponentBits, int mantissaBits, bool finiteOnly);

// Stores/loads one element of `type` (unaligned pointers are fine).
void storeFloat(ncclDataType_t type, double value, void* dst);
double loadFloat(ncclDataType_t type, const void* src);
// Integers: the low `size` bytes of `value` in two's complement.
void storeInteger(ncclDataType_t type, uint64_t value, void* dst);
// Zero-extended raw bits of an integer element.
uint64_t loadIntegerBits(ncclDataType_t type, const void* src);
// Stores a small integer in any type (float types convert exactly when representable).
void storeValue(ncclDataType_t type, int64_t value, void* dst);

// ---- inputs and expected results ----------------------------------------------------------

struct DataParams {
  ncclDataType_t type = ncclFloat32;
  OpKind op = OpKind::kSum;
  int nranks = 1;
  uint64_t seed = 0;
};

// The value `rank` holds at element `index` of its input.
int64_t inputValue(const DataParams& params, int rank, size_t index);
// The PreMulSum scalar of `rank` for OpKind::kMulSum.
int64_t mulSumScalar(int rank);
// Fills `count` elements of `dst` with `rank`'s input, element i holding inputValue(rank, i).
void fillInput(const DataParams& params, int rank, void* dst, size_t count);
// The byte output buffers are filled with before a checked run, so that an element the
// collective did not write is counted wrong: it never decodes to a value our inputs can
// produce (0x7F makes NaN or ~3e38 in every float type; 0xA5 is outside every integer range).
int poisonByte(ncclDataType_t type);

// Where an output element's value comes from.
struct Source {
  enum class Kind { kReduce, kCopy, kUnchecked };
  Kind kind = Kind::kUnchecked;
  int rank = 0;      // kCopy: the rank whose input is copied
  size_t index = 0;  // the input element index (of every rank for kReduce)

  static Source reduce(size_t index) { return {Kind::kReduce, 0, index}; }
  static Source copy(int rank, size_t index) { return {Kind::kCopy, rank, index}; }
  static Source unchecked() { return {}; }
};

struct Expected {
  bool isFloat = false;
  uint64_t bits = 0;     // integers: the exact result, truncated to the type's width
  double value = 0;      // floats: the exact result of the operation on the inputs
  double tolerance = 0;  // floats: the largest accepted |got - value|
};

// The result of reducing every rank's input at `index` with params.op.
Expected expectedReduce(const DataParams& params, size_t index);
// rank's input at index, as an expected output (exact).
Expected expectedCopy(const DataParams& params, int rank, size_t index);
// True when the element at `element` is accepted for `expected`.
bool matches(ncclDataType_t type, const Expected& expected, const void* element);

// Per-rank placement of a collective's output, handed to a collective's expect function.
struct RankLayout {
  int rank = 0;
  int nranks = 1;
  int root = 0;
  size_t paramCount = 0;  // the count argument passed to the collective
};
using ExpectFn = Source (*)(const RankLayout& layout, size_t outputIndex);

// The CPUs this process may run on (its affinity), at least 1: how many threads fill and
// check GiB-sized buffers.
unsigned usableCpus();

// Counts the elements of `data` (count elements) that do not match expect(layout, j).
int64_t countWrong(const DataParams& params, const RankLayout& layout, ExpectFn expect,
                   const void* data, size_t count);

}  // namespace loom::perf
