// Which transport connects two ranks: chosen from what each transport reports
// (Capability), the same way wherever it is asked. Pure; tests/transports/select_test.cc.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "transports/transport.h"

namespace loom::transport {

struct Offer {
  const char* name = "";
  Capability cap;
};

struct Selection {
  int index = -1;      // into the offers
  std::string reason;  // why this one, for the log
};

// Among the offers that are reachable, in this order:
//   1. memory before the network: a transport that needs no network stack (self, shm)
//      over one that does, whatever the NIC's speed (a 400 GbE port is still loopback
//      TCP between two ranks of one host);
//   2. a network backend (ib, ucx, a plugin: configured, or found) over the fallback (tcp);
//   3. the higher bandwidth, then the lower latency, where both offers know theirs (0:
//      not known, which decides nothing);
//   4. the first offered (the communicator offers them in its list order).
// Whether a peer is over the network thus depends only on which transports exist, the
// same on every rank. An error naming every transport's reason when none is reachable.
Result<Selection> chooseTransport(const std::vector<Offer>& offers, int self, int peer);

}  // namespace loom::transport
