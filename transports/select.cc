#include "transports/select.h"

#include <cstdio>

namespace loom::transport {

Result<Selection> chooseTransport(const std::vector<Offer>& offers, int self, int peer) {
  Selection best;
  std::string refused;
  for (size_t i = 0; i < offers.size(); ++i) {
    const Capability& c = offers[i].cap;
    if (!c.reachable) {
      refused += std::string(" ") + offers[i].name + ": " + c.reason + ";";
      continue;
    }
    if (best.index >= 0) {
      const Capability& b = offers[best.index].cap;
      const bool faster = c.bandwidthGBs > b.bandwidthGBs;
      const bool sooner = c.bandwidthGBs == b.bandwidthGBs && c.latencyUs < b.latencyUs;
      if (!faster && !sooner) continue;
    }
    best.index = static_cast<int>(i);
  }
  if (best.index < 0) {
    return errorf(Code::kInvalidUsage,
                  "no transport can reach rank %d from rank %d:%s (check LOOM_TRANSPORTS)", peer,
                  self, refused.c_str());
  }
  const Capability& c = offers[best.index].cap;
  char text[160];
  std::snprintf(text, sizeof(text), "%.3g GB/s, %.3g us", c.bandwidthGBs, c.latencyUs);
  best.reason = text;
  for (size_t i = 0; i < offers.size(); ++i) {
    if (static_cast<int>(i) == best.index || !offers[i].cap.reachable) continue;
    char other[96];
    std::snprintf(other, sizeof(other), "; %s: %.3g GB/s, %.3g us", offers[i].name,
                  offers[i].cap.bandwidthGBs, offers[i].cap.latencyUs);
    best.reason += other;
  }
  return best;
}

}  // namespace loom::transport
