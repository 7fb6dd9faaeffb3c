// LOOM_ALGO / NCCL_ALGO and LOOM_PROTO / NCCL_PROTO, parsed once: the host tuner
// (collectives/tuner.h), the GPU mesh planner (collectives/device/mesh_plan.h) and the
// GPU network planner read the same parsed request, so a name means the same thing on
// host and device buffers and a misspelt one is an error wherever it is read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace loom::collectives {

// Every name LOOM_ALGO accepts. NCCL's names that loom has no form of (NVLS, CollNet, PAT)
// are accepted so that a script written for NCCL keeps working; loom never runs them.
// "hier" is loom's own: the hierarchical GPU forms across hosts (collectives/device/
// hierarchy.h), mesh inside each host and the network between rails.
enum class AlgoName : uint8_t {
  kRing,
  kTree,
  kChain,
  kDirect,
  kOneShot,
  kTwoShot,
  kDoubling,
  kNvls,
  kNvlsTree,
  kCollNetDirect,
  kCollNetChain,
  kPat,
  kHier,
  kCount
};

const char* algoNameText(AlgoName a);

// A parsed LOOM_ALGO: NCCL's syntax, a comma list of names in any case ("ring,tree"), or
// "^" and a list to leave out ("^tree"). Empty text asks for nothing. Plain value, cheap
// to copy; allows() is a bit test (no parsing on the call path).
class AlgoRequest {
 public:
  // Unknown names are an error that names them and lists the known ones. "one-shot" and
  // "two-shot" are read as oneshot and twoshot.
  static Result<AlgoRequest> parse(std::string_view text);

  // True when LOOM_ALGO said anything (the size rules then stand aside where it applies).
  bool set() const { return set_; }
  // True unless the request leaves `a` out (always true when nothing was asked).
  bool allows(AlgoName a) const { return (mask_ >> static_cast<unsigned>(a)) & 1u; }
  // True when the request allows `a` and none of `others`: it forces `a` among them.
  template <typename... A>
  bool onlyOf(AlgoName a, A... others) const {
    return set_ && allows(a) && !(allows(others) || ...);
  }
  // True when the list names `a` itself (not through "^").
  bool names(AlgoName a) const { return set_ && !exclude_ && allows(a); }
  // What the request allows, as one word that ranks can compare: bit i for AlgoName i,
  // and the top bit when anything was asked.
  uint32_t allowedMask() const { return mask_ | (set_ ? 0x80000000u : 0u); }
  // The text as given (for logs).
  const std::string& text() const { return text_; }

  // The request as the forms other than the hierarchical one read it: one that allows
  // nothing but hier (LOOM_ALGO=hier) asks nothing of them; any other is itself.
  AlgoRequest withoutHier() const;

 private:
  bool set_ = false;
  bool exclude_ = false;
  uint32_t mask_ = (1u << static_cast<unsigned>(AlgoName::kCount)) - 1;
  std::string text_;
};

// LOOM_PROTO: auto (choose), simple, ll or ll128, in any case.
enum class Proto : uint8_t { kAuto, kSimple, kLL, kLL128 };

Result<Proto> parseProto(std::string_view text);
const char* protoText(Proto p);

}  // namespace loom::collectives
