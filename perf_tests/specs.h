// The nine collectives the perf binaries run; each is defined in <program>.cc.
#pragma once

#include "perf_tests/harness/collective.h"

namespace loom::perf {

extern const CollectiveSpec kAllReduceSpec;      // all_reduce_perf.cc
extern const CollectiveSpec kAllGatherSpec;      // all_gather_perf.cc
extern const CollectiveSpec kBroadcastSpec;      // broadcast_perf.cc
extern const CollectiveSpec kReduceScatterSpec;  // reduce_scatter_perf.cc
extern const CollectiveSpec kReduceSpec;         // reduce_perf.cc
extern const CollectiveSpec kSendRecvSpec;       // sendrecv_perf.cc
extern const CollectiveSpec kAllToAllSpec;       // alltoall_perf.cc
extern const CollectiveSpec kGatherSpec;         // gather_perf.cc
extern const CollectiveSpec kScatterSpec;        // scatter_perf.cc

}  // namespace loom::perf
