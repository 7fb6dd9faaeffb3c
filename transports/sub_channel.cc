#include "transports/sub_channel.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "common/clock.h"

namespace loom::transport {

namespace {

// Parent tags of sub-channels: 5 in the top four bits (comm/'s connection set-up uses 4,
// the GPU executor's network handles 3 and 6), the id in the next eight.
constexpr uint64_t kSubTagBase = 5ull << 60;
// The channel's own messages, above every tag a user of the channel may give: allGather's
// (one tag per exchange), and a member's notice that it gave up.
constexpr uint64_t kGatherTag = SubChannel::kMaxTag;
constexpr uint64_t kAbandonTag = 2 * SubChannel::kMaxTag;

}  // namespace

SubChannel::SubChannel(SetupChannel& parent, std::vector<int> members, uint32_t id,
                       int64_t timeoutMs, const std::atomic<bool>* abortFlag)
    : parent_(parent),
      members_(std::move(members)),
      id_(id >= 1 && id <= 255 ? id : 255),
      timeoutMs_(timeoutMs),
      abortFlag_(abortFlag) {
  const auto it = std::find(members_.begin(), members_.end(), parent_.rank());
  index_ = it == members_.end() ? -1 : static_cast<int>(it - members_.begin());
}

uint64_t SubChannel::parentTag(uint64_t tag) const {
  return kSubTagBase | (uint64_t(id_) << 52) | tag;
}

Status SubChannel::checkMember(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(members_.size())) {
    return errorf(Code::kInternalError, "sub-channel %u: no member %d", id_, peer);
  }
  return Status::ok();
}

Status SubChannel::send(int peer, uint64_t tag, const void* data, size_t size) {
  LOOM_TRY(checkMember(peer));
  if (tag >= kMaxTag) {
    return errorf(Code::kInternalError, "sub-channel %u: tag %llu is out of its range", id_,
                  (unsigned long long)tag);
  }
  return parent_.send(members_[peer], parentTag(tag), data, size);
}

Result<bool> SubChannel::tryRecv(int peer, uint64_t tag, void* data, size_t size) {
  LOOM_TRY(checkMember(peer));
  if (tag >= kMaxTag) {
    return errorf(Code::kInternalError, "sub-channel %u: tag %llu is out of its range", id_,
                  (unsigned long long)tag);
  }
  return parent_.tryRecv(members_[peer], parentTag(tag), data, size);
}

Status SubChannel::probe(int peer, int64_t ms) {
  LOOM_TRY(checkMember(peer));
  return parent_.probe(members_[peer], ms);
}

Status SubChannel::abandonedError() const {
  return errorf(Code::kRemoteError,
                "rank %d: rank %d gave up a set-up exchange of its group (its own part of the "
                "set-up failed; its log says why)",
                parent_.rank(), abandonedBy_);
}

void SubChannel::abandon() {
  const char byte = 1;
  for (int m = 0; m < nranks(); ++m) {
    if (m != index_) (void)parent_.send(members_[m], parentTag(kAbandonTag), &byte, 1);
  }
}

Status SubChannel::allGather(void* data, size_t size) {
  if (index_ < 0) {
    return errorf(Code::kInternalError, "rank %d is not a member of sub-channel %u", parent_.rank(),
                  id_);
  }
  if (abandonedBy_ >= 0) return abandonedError();
  // Each allGather's messages have a tag of their own, so a member that is one exchange
  // ahead never hands its next block in place of this one.
  const uint64_t tag = kGatherTag + (collectives_++ % kMaxTag);
  char* blocks = static_cast<char*>(data);
  const char* mine = blocks + size_t(index_) * size;
  for (int m = 0; m < nranks(); ++m) {
    if (m != index_) LOOM_TRY(parent_.send(members_[m], parentTag(tag), mine, size));
  }
  std::vector<bool> have(members_.size(), false);
  have[index_] = true;
  size_t missing = members_.size() - 1;
  const Deadline deadline = Deadline::afterMs(timeoutMs_, abortFlag_);
  Clock::time_point nextProbe = Clock::now() + std::chrono::seconds(1);
  int sleepUs = 0;
  while (missing > 0) {
    bool progress = false;
    for (int m = 0; m < nranks(); ++m) {
      if (have[m]) continue;
      LOOM_ASSIGN_OR_RETURN(const bool got, parent_.tryRecv(members_[m], parentTag(tag),
                                                            blocks + size_t(m) * size, size));
      if (got) {
        have[m] = true;
        --missing;
        progress = true;
      }
    }
    if (missing == 0) break;
    // A member that gave up never sends its block (nor, perhaps, what another waits for).
    for (int m = 0; m < nranks(); ++m) {
      char byte = 0;
      if (m == index_) continue;
      LOOM_ASSIGN_OR_RETURN(const bool gone,
                            parent_.tryRecv(members_[m], parentTag(kAbandonTag), &byte, 1));
      if (gone) abandonedBy_ = members_[m];  // kept: the exchanges after this one fail too
    }
    if (abandonedBy_ >= 0) return abandonedError();
    int first = 0;
    while (have[first]) ++first;
    if (deadline.aborted()) {
      return errorf(Code::kSystemError, "sub-channel %u: aborted while waiting for rank %d", id_,
                    members_[first]);
    }
    if (deadline.expired()) {
      return errorf(Code::kRemoteError,
                    "rank %d: rank %d did not join a set-up exchange of its group within "
                    "LOOM_TIMEOUT_MS=%lld ms (it died, is stuck, or did not create the "
                    "communicator)",
                    parent_.rank(), members_[first], (long long)timeoutMs_);
    }
    if (Clock::now() >= nextProbe) {
      for (int m = 0; m < nranks(); ++m) {
        if (!have[m]) LOOM_TRY(probe(m, 200));
      }
      nextProbe = Clock::now() + std::chrono::seconds(1);
    }
    // Answers come within microseconds when every member is here; back off to 1 ms.
    sleepUs = progress ? 0 : std::min(1000, sleepUs * 2 + 10);
    if (sleepUs > 0) std::this_thread::sleep_for(std::chrono::microseconds(sleepUs));
  }
  return Status::ok();
}

Status SubChannel::barrier() {
  std::vector<char> token(members_.size(), 1);
  return allGather(token.data(), 1);
}

}  // namespace loom::transport
