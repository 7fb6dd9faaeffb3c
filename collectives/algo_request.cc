#include "collectives/algo_request.h"

#include <strings.h>

namespace loom::collectives {

namespace {

struct Known {
  const char* name;
  AlgoName algo;
};
constexpr Known kKnown[] = {
    {"ring", AlgoName::kRing},
    {"tree", AlgoName::kTree},
    {"chain", AlgoName::kChain},
    {"direct", AlgoName::kDirect},
    {"oneshot", AlgoName::kOneShot},
    {"one-shot", AlgoName::kOneShot},
    {"twoshot", AlgoName::kTwoShot},
    {"two-shot", AlgoName::kTwoShot},
    {"doubling", AlgoName::kDoubling},
    {"nvls", AlgoName::kNvls},
    {"nvlstree", AlgoName::kNvlsTree},
    {"collnetdirect", AlgoName::kCollNetDirect},
    {"collnetchain", AlgoName::kCollNetChain},
    {"pat", AlgoName::kPat},
    {"hier", AlgoName::kHier},
};

bool same(std::string_view a, const char* b) {
  return a.size() == std::char_traits<char>::length(b) && strncasecmp(a.data(), b, a.size()) == 0;
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

AlgoRequest AlgoRequest::withoutHier() const {
  const uint32_t hier = 1u << static_cast<unsigned>(AlgoName::kHier);
  if (set_ && (mask_ & hier) && (mask_ & ~hier) == 0) {
    AlgoRequest none;
    none.text_ = text_;
    return none;
  }
  return *this;
}

const char* algoNameText(AlgoName a) {
  for (const Known& k : kKnown)
    if (k.algo == a) return k.name;
  return "?";
}

Result<AlgoRequest> AlgoRequest::parse(std::string_view text) {
  AlgoRequest r;
  r.text_ = std::string(text);
  std::string_view list = trimmed(text);
  if (list.empty()) return r;
  const bool exclude = list.front() == '^';
  if (exclude) list.remove_prefix(1);
  uint32_t named = 0;
  while (true) {
    const size_t comma = list.find(',');
    const std::string_view tok = trimmed(list.substr(0, comma));
    bool found = false;
    for (const Known& k : kKnown) {
      if (same(tok, k.name)) {
        named |= 1u << static_cast<unsigned>(k.algo);
        found = true;
        break;
      }
    }
    if (!found) {
      return errorf(Code::kInvalidArgument,
                    "LOOM_ALGO/NCCL_ALGO=\"%s\" names unknown algorithm '%.*s' (loom knows ring, "
                    "tree, chain, direct, oneshot, twoshot, doubling; NCCL's nvls, nvlstree, "
                    "collnetdirect, collnetchain and pat are accepted and never run)",
                    r.text_.c_str(), static_cast<int>(tok.size()), tok.data());
    }
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  r.set_ = true;
  r.exclude_ = exclude;
  r.mask_ = exclude ? (r.mask_ & ~named) : named;
  return r;
}

Result<Proto> parseProto(std::string_view text) {
  const std::string_view t = trimmed(text);
  if (t.empty() || same(t, "auto")) return Proto::kAuto;
  if (same(t, "simple")) return Proto::kSimple;
  if (same(t, "ll")) return Proto::kLL;
  if (same(t, "ll128")) return Proto::kLL128;
  return errorf(Code::kInvalidArgument,
                "LOOM_PROTO/NCCL_PROTO=\"%.*s\" is not a protocol (auto, simple, ll or ll128)",
                static_cast<int>(t.size()), t.data());
}

const char* protoText(Proto p) {
  switch (p) {
    case Proto::kAuto: return "auto";
    case Proto::kSimple: return "simple";
    case Proto::kLL: return "ll";
    case Proto::kLL128: return "ll128";
  }
  return "?";
}

}  // namespace loom::collectives
