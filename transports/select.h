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

// Among the offers that are reachable: the highest bandwidth, then the lowest latency,
// then the first offered (the communicator offers them in its list order, so a tie keeps
// the order LOOM_TRANSPORTS gives). An error naming every transport's reason when none is
// reachable.
Result<Selection> chooseTransport(const std::vector<Offer>& offers, int self, int peer);

}  // namespace loom::transport
