// A SetupChannel (setup_channel.h) over some of a parent channel's ranks: the ranks of one
// host, or of one rail across hosts, as the hierarchical GPU forms set them up
// (collectives/hierarchy.h). Member i of the sub-channel is parent rank members[i].
// Its messages travel as the parent's point-to-point messages under tags of their own
// (one id per sub-channel), so several sub-channels and the parent never take each
// other's messages. allGather and barrier are point to point between the members, with a
// deadline (LOOM_TIMEOUT_MS) and a probe of the members that have not answered.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "transports/setup_channel.h"

namespace loom::transport {

class SubChannel final : public SetupChannel {
 public:
  // Tags given to send/tryRecv must stay below kMaxTag (the channel's own exchanges use
  // the tags above, the rest of the parent's tag carries the sub-channel's id). `id`: the
  // same on every member, different for every sub-channel of one parent in use at once
  // (1 to 255).
  static constexpr uint64_t kMaxTag = 1ull << 48;

  // `members`: parent ranks, the same list on every member, this rank among them.
  SubChannel(SetupChannel& parent, std::vector<int> members, uint32_t id, int64_t timeoutMs,
             const std::atomic<bool>* abortFlag = nullptr);

  int rank() const override { return index_; }
  int nranks() const override { return static_cast<int>(members_.size()); }
  Status allGather(void* data, size_t size) override;
  Status barrier() override;
  Status send(int peer, uint64_t tag, const void* data, size_t size) override;
  Result<bool> tryRecv(int peer, uint64_t tag, void* data, size_t size) override;
  Status probe(int peer, int64_t ms) override;

  // The parent rank of member `i`.
  int parentRank(int i) const { return members_[i]; }

  // This member gives up on the channel (its part of a set-up failed): every member's
  // allGather, now or later, fails at once naming it instead of waiting for its deadline.
  void abandon();

 private:
  // The parent's tag of one of the channel's tags (any, the channel's own included).
  uint64_t parentTag(uint64_t tag) const;
  Status checkMember(int peer) const;
  Status abandonedError() const;

  SetupChannel& parent_;
  std::vector<int> members_;
  int index_ = -1;
  uint32_t id_ = 0;
  int64_t timeoutMs_ = 0;
  const std::atomic<bool>* abortFlag_ = nullptr;
  uint64_t collectives_ = 0;  // allGathers so far (their tags)
  int abandonedBy_ = -1;      // the parent rank of a member that gave up, once one has
};

}  // namespace loom::transport
