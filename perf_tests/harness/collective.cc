#include "perf_tests/harness/collective.h"

#include <cmath>

namespace loom::perf {

Bandwidth computeBandwidth(const CollectiveSpec& spec, size_t paramCount, size_t typeSize,
                           double seconds, int nranks) {
  Bandwidth bw;
  const double bytes = static_cast<double>(paramCount) * static_cast<double>(typeSize);
  bw.algBw = bytes * spec.algFactor(nranks) / 1.0e9 / seconds;
  bw.busBw = bw.algBw * spec.busFactor(nranks);
  return bw;
}

double bandwidthRatio(double algBw, double comparedAlgBw) {
  return comparedAlgBw > 0 ? algBw / comparedAlgBw : std::nan("");
}

}  // namespace loom::perf
