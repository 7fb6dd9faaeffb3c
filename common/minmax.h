// Max and min as every reduction applies them: the host kernels (common/datatype.cc) and
// the device kernels (collectives/device/reduce_copy_device.cuh) call these two
// functions, so host and GPU memory give the same answers.
//
// The rule, for floating-point values (IEEE 754-2019 maximum and minimum):
// - a NaN on either side gives NaN, and always the same one (the compute type's quiet
//   NaN), so neither which rank holds it nor the order in which a rank combines its peers
//   changes a bit of the result (the narrow types' encoders then store it as their own
//   quiet NaN, which differs between the host's and CUDA's for fp16, bf16 and e5m2: every
//   rank of a collective takes the same path, so the ranks still agree bit for bit);
// - -0 is below +0 (max(-0, +0) is +0, min is -0), again whichever side each is on.
// So max and min are commutative and associative bit for bit, and every rank of a
// collective gets the same bits whatever the algorithm. NCCL's kernels use fmaxf/fminf
// (and __hmax/__hmin), which return the other operand when one is NaN: a NaN that one
// rank produced vanishes from a max-reduction there. We keep it, because a NaN in a
// gradient or a loss is a bug that a reduction should not hide (docs/decisions.md).
// Integers compare as usual.
#pragma once

#include <cmath>
#include <type_traits>

#include "common/host_device.h"

namespace loom {

template <typename C>
LOOM_HOST_DEVICE inline C maxOf(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (a != a || b != b) return static_cast<C>(NAN);
    // Equal: the same value, or two zeros, whose sum is +0 unless both are -0.
    if (a == b) return a == C(0) ? a + b : a;
  }
  return a > b ? a : b;
}

template <typename C>
LOOM_HOST_DEVICE inline C minOf(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (a != a || b != b) return static_cast<C>(NAN);
    // Two zeros: -0 unless both are +0 (the negated sum of the negations).
    if (a == b) return a == C(0) ? -(-a + -b) : a;
  }
  return a < b ? a : b;
}

}  // namespace loom
