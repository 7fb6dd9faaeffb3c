#include "transports/select.h"

#include <cstdio>

namespace loom::transport {

namespace {

// 0: memory, 1: a network backend, 2: the fallback.
int tier(const Capability& c) {
  return !c.network ? 0 : c.fallback ? 2 : 1;
}

// Whether `c` beats `b` (select.h gives the order); false on a tie.
bool better(const Capability& c, const Capability& b) {
  if (tier(c) != tier(b)) return tier(c) < tier(b);
  if (c.bandwidthGBs > 0 && b.bandwidthGBs > 0 && c.bandwidthGBs != b.bandwidthGBs)
    return c.bandwidthGBs > b.bandwidthGBs;
  if (c.latencyUs > 0 && b.latencyUs > 0) return c.latencyUs < b.latencyUs;
  return false;
}

}  // namespace

Result<Selection> chooseTransport(const std::vector<Offer>& offers, int self, int peer) {
  Selection best;
  std::string refused;
  for (size_t i = 0; i < offers.size(); ++i) {
    const Capability& c = offers[i].cap;
    if (!c.reachable) {
      refused += std::string(" ") + offers[i].name + ": " + c.reason + ";";
      continue;
    }
    if (best.index < 0 || better(c, offers[best.index].cap)) best.index = static_cast<int>(i);
  }
  if (best.index < 0) {
    return errorf(Code::kInvalidUsage,
                  "no transport can reach rank %d from rank %d:%s (check LOOM_TRANSPORTS)", peer,
                  self, refused.c_str());
  }
  const Capability& c = offers[best.index].cap;
  char text[160];
  std::snprintf(text, sizeof(text), "%.3g GB/s, %.3g us%s%s", c.bandwidthGBs, c.latencyUs,
                c.network ? ", over the network" : "", c.needsProxy ? ", a proxy thread" : "");
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
