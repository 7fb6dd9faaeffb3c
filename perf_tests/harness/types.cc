#include "perf_tests/harness/types.h"

#include <array>
#include <string>

namespace loom::perf {
namespace {

constexpr std::array<TypeInfo, 12> kTypes = {{
    {ncclInt8, "int8", 1, false, true, 0, 0},
    {ncclUint8, "uint8", 1, false, false, 0, 0},
    {ncclInt32, "int32", 4, false, true, 0, 0},
    {ncclUint32, "uint32", 4, false, false, 0, 0},
    {ncclInt64, "int64", 8, false, true, 0, 0},
    {ncclUint64, "uint64", 8, false, false, 0, 0},
    {ncclFloat16, "half", 2, true, true, 10, 5},
    {ncclFloat32, "float", 4, true, true, 23, 8},
    {ncclFloat64, "double", 8, true, true, 52, 11},
    {ncclBfloat16, "bfloat16", 2, true, true, 7, 8},
    {ncclFloat8e4m3, "f8e4m3", 1, true, true, 3, 4},
    {ncclFloat8e5m2, "f8e5m2", 1, true, true, 2, 5},
}};

constexpr std::array<OpInfo, 6> kOps = {{
    {OpKind::kSum, "sum"},
    {OpKind::kProd, "prod"},
    {OpKind::kMax, "max"},
    {OpKind::kMin, "min"},
    {OpKind::kAvg, "avg"},
    {OpKind::kMulSum, "mulsum"},
}};

struct Alias {
  std::string_view name;
  ncclDataType_t type;
};

constexpr std::array<Alias, 13> kTypeAliases = {{
    {"char", ncclInt8},
    {"int", ncclInt32},
    {"fp16", ncclFloat16},
    {"float16", ncclFloat16},
    {"fp32", ncclFloat32},
    {"float32", ncclFloat32},
    {"fp64", ncclFloat64},
    {"float64", ncclFloat64},
    {"bf16", ncclBfloat16},
    {"fp8e4m3", ncclFloat8e4m3},
    {"e4m3", ncclFloat8e4m3},
    {"fp8e5m2", ncclFloat8e5m2},
    {"e5m2", ncclFloat8e5m2},
}};

}  // namespace

std::span<const TypeInfo> allTypes() {
  return kTypes;
}

const TypeInfo& typeInfo(ncclDataType_t type) {
  // Called per element by the -c checks: the table is in enum order, so index it first.
  const auto i = static_cast<size_t>(type);
  if (i < kTypes.size() && kTypes[i].type == type) return kTypes[i];
  for (const TypeInfo& info : kTypes) {
    if (info.type == type) return info;
  }
  return kTypes[7];  // unreachable for valid types; float keeps callers safe
}

std::optional<ncclDataType_t> parseTypeName(std::string_view name) {
  for (const TypeInfo& info : kTypes) {
    if (name == info.name) return info.type;
  }
  for (const Alias& alias : kTypeAliases) {
    if (name == alias.name) return alias.type;
  }
  return std::nullopt;
}

std::span<const OpInfo> allOps() {
  return kOps;
}

const char* opName(OpKind kind) {
  return kOps[static_cast<int>(kind)].name;
}

std::optional<OpKind> parseOpName(std::string_view name) {
  for (const OpInfo& info : kOps) {
    if (name == info.name) return info.kind;
  }
  if (name == "premulsum") return OpKind::kMulSum;
  return std::nullopt;
}

ncclRedOp_t builtinRedOp(OpKind kind) {
  switch (kind) {
    case OpKind::kSum: return ncclSum;
    case OpKind::kProd: return ncclProd;
    case OpKind::kMax: return ncclMax;
    case OpKind::kMin: return ncclMin;
    case OpKind::kAvg: return ncclAvg;
    case OpKind::kMulSum: break;
  }
  return ncclSum;
}

}  // namespace loom::perf
