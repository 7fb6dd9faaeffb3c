// Which process this is, in a form that means the same thing in every PID namespace.
//
// Ranks in containers of one pod share a hostname and /dev/shm but not a PID namespace:
// two of them can both be pid 1, and neither can see the other's pid. So a pid says
// nothing about "same process" or "still alive" between ranks; these do.
#pragma once

#include <cstdint>

namespace loom {

// A 64-bit value drawn at random the first time this process asks (and again in a
// child after fork): equal for two ranks exactly when they are the same process.
uint64_t processToken();

}  // namespace loom
