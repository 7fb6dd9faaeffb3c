// The perf tests' own version, printed in the first header line and written to JSON.
#pragma once

namespace loom::perf {

inline constexpr const char* kPerfTestsVersion = "0.1.0";
// The nccl-tests release whose output format (columns, number formats, JSON keys) we follow.
inline constexpr const char* kNcclTestsFormat = "2.17";

}  // namespace loom::perf
