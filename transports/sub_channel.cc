#include "transports/sub_channel.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "common/clock.h"

namespace loom::transport {

namespace {

// Parent tags of sub-channels: 5 in the top four bits (comm/ and the GPU executor use 1, 3
// and 6 there), the id in the next eight.
constexpr uint64_t kSubTagBase = 5ull << 60;
// allGather's messages: above every tag a user of the channel may give.
constexpr uint64_t kGatherTag = SubChannel::kMaxTag;

}  // namespace

SubChannel::SubChannel(SetupChannel& parent, std::vector<int> members, uint32_t id,
                       int64_t timeoutMs, const std::atomic<bool>* abortFlag)
    : parent_(parent),
      members_(std::move(members)),
      id_(id & 0xff),
      timeoutMs_(timeoutMs),
      abortFlag_(abortFlag) {
  const auto it = std::find(members_.begin(), members_.end(), parent_.rank());
  index_ = it == members_.end() ? -1 : static_cast<int>(it - members_.begin());
}

Result<uint64_t> SubChannel::parentTag(uint64_t tag) const {
  if (tag >= kMaxTag * 2) {
    return errorf(Code::kInternalError, "sub-channel %u: tag %llu is out of its range", id_,
                  (unsigned long long)tag);
  }
  return kSubTagBase | (uint64_t(id_) << 52) | tag;
}

Status SubChannel::send(int peer, uint64_t tag, const void* data, size_t size) {
  if (peer < 0 || peer >= nranks()) {
    return errorf(Code::kInternalError, "sub-channel %u: no member %d", id_, peer);
  }
  LOOM_ASSIGN_OR_RETURN(const uint64_t t, parentTag(tag));
  return parent_.send(members_[peer], t, data, size);
}

Result<bool> SubChannel::tryRecv(int peer, uint64_t tag, void* data, size_t size) {
  if (peer < 0 || peer >= nranks()) {
    return errorf(Code::kInternalError, "sub-channel %u: no member %d", id_, peer);
  }
  LOOM_ASSIGN_OR_RETURN(const uint64_t t, parentTag(tag));
  return parent_.tryRecv(members_[peer], t, data, size);
}

Status SubChannel::probe(int peer, int64_t ms) {
  if (peer < 0 || peer >= nranks()) {
    return errorf(Code::kInternalError, "sub-channel %u: no member %d", id_, peer);
  }
  return parent_.probe(members_[peer], ms);
}

Status SubChannel::allGather(void* data, size_t size) {
  if (index_ < 0) {
    return errorf(Code::kInternalError, "rank %d is not a member of sub-channel %u", parent_.rank(),
                  id_);
  }
  // Each allGather's messages have a tag of their own, so a member that is one exchange
  // ahead never hands its next block in place of this one.
  const uint64_t tag = kGatherTag + (collectives_++ % kMaxTag);
  char* blocks = static_cast<char*>(data);
  const char* mine = blocks + size_t(index_) * size;
  for (int m = 0; m < nranks(); ++m) {
    if (m != index_) LOOM_TRY(send(m, tag, mine, size));
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
      LOOM_ASSIGN_OR_RETURN(const bool got, tryRecv(m, tag, blocks + size_t(m) * size, size));
      if (got) {
        have[m] = true;
        --missing;
        progress = true;
      }
    }
    if (missing == 0) break;
    int first = 0;
    while (have[first]) ++first;
    if (deadline.aborted()) {
      return errorf(Code::kInvalidUsage, "sub-channel %u: aborted while waiting for rank %d", id_,
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
