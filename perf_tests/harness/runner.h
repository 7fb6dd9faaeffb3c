// The whole of a perf binary's main(): arguments, ranks (threads x ranks per thread, and MPI
// processes), buffers, communicators, the benchmark, the report.
#pragma once

#include "perf_tests/harness/collective.h"

namespace loom::perf {

// Runs the benchmark of `spec`. Returns the process exit status: 0 when every check passed
// (and NCCL_TESTS_MIN_BW, when set, was met), 1 otherwise, 2 for bad arguments.
int perfMain(int argc, char** argv, const CollectiveSpec& spec);

}  // namespace loom::perf
