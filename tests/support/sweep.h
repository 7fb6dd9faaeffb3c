// How much of an exhaustive sweep a test runs: all of it, unless LOOM_TEST_SWEEP=short.
//
// The pure-function sweeps (every schedule for rank counts 1..64, every chunk plan) run in
// full in the release pass of scripts/test.sh. The sanitizer passes set
// LOOM_TEST_SWEEP=short: they look for memory and thread errors in the same code, which a
// sample of the cases reaches as well as all of them, at a tenth of the time under ASan
// and TSan.
#pragma once

#include <cstdlib>
#include <cstring>

namespace loom::test {

inline bool shortSweep() {
  const char* s = std::getenv("LOOM_TEST_SWEEP");
  return s && std::strcmp(s, "short") == 0;
}

}  // namespace loom::test
