// Shared-memory segments left behind by ranks that were killed while setting up.
//
// A connection's segment (/dev/shm/loom-<16 hex digits>-...) is unlinked as soon as both
// sides have it mapped; a rank killed between creating it and its peer attaching leaves
// it behind. Its creator holds a record lock on the segment's first byte while it lives
// (shm_transport.cc), so a segment that nobody locks and that is older than any set-up
// takes is an orphan. The shm transport removes them once per process.
#pragma once

#include <cstddef>
#include <string>

namespace loom::transport {

// Removes orphans from `dir` older than `minAgeSeconds`; returns how many. Segments of
// other users (no permission) and other names are left alone.
size_t removeOrphanSegments(const std::string& dir, int minAgeSeconds);

}  // namespace loom::transport
