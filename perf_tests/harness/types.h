// Element types and reduction operations as the perf binaries name them.
//
// Names follow nccl-tests ("int8", "half", "bfloat16", "f8e4m3", ...; "sum", "prod", "max",
// "min", "avg", "mulsum"). Everything here is pure and uses only the public nccl.h.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string_view>

#include "nccl.h"

namespace loom::perf {

struct TypeInfo {
  ncclDataType_t type;
  const char* name;  // nccl-tests' name
  size_t size;       // bytes per element
  bool isFloat;
  bool isSigned;     // true for signed integers and for every float type
  int mantissaBits;  // explicit mantissa bits (0 for integers)
  int exponentBits;  // 0 for integers
};

// All twelve types in nccl-tests' order (what "-d all" runs).
std::span<const TypeInfo> allTypes();
// The entry for `type`; a valid type is required.
const TypeInfo& typeInfo(ncclDataType_t type);
// Parses a type name (nccl-tests' names, plus aliases such as "fp16", "bf16", "float32").
std::optional<ncclDataType_t> parseTypeName(std::string_view name);

// The operations the binaries run. kMulSum is ncclRedOpCreatePreMulSum with a per-rank
// scalar (nccl-tests' "mulsum").
enum class OpKind : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4, kMulSum = 5 };

struct OpInfo {
  OpKind kind;
  const char* name;
};

// All six operations in nccl-tests' order (what "-o all" runs).
std::span<const OpInfo> allOps();
const char* opName(OpKind kind);
std::optional<OpKind> parseOpName(std::string_view name);
// The built-in ncclRedOp_t for kind; kMulSum has none (it is created per communicator).
ncclRedOp_t builtinRedOp(OpKind kind);

}  // namespace loom::perf
