#include "comm/progress_report.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

#include "collectives/schedule.h"
#include "common/handshake.h"
#include "common/log.h"

namespace loom::comm {

namespace {

constexpr uint64_t kQueryMagic = 0x3f65726568776d6cull;  // "lmwhere?"
constexpr uint64_t kReplyMagic = 0x2165726568776d6cull;  // "lmwhere!"
constexpr int64_t kHelloMs = 1000;  // a question must arrive this soon after connecting
constexpr size_t kBatch = 128;      // ranks asked at once

struct Query {
  uint64_t magic;
  uint64_t secret[2];
  int32_t asker;
  int32_t pad;
};

const char* typeName(int type) {
  if (type < 0 || type > static_cast<int>(collectives::CollType::kSendRecv)) return "?";
  return collectives::collTypeName(static_cast<collectives::CollType>(type));
}

std::string seconds(int64_t ms) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f s", ms / 1000.0);
  return b;
}

// What `r` is doing, as seen by a rank whose own last call is `askerEntered`.
std::string describe(const ProgressReply& r, uint64_t askerEntered, bool withTime) {
  if (r.failure[0]) return std::string("failed: ") + r.failure;
  if (r.entered == 0) return "has entered no call yet";
  std::string call = std::string(typeName(r.type)) + " #" + std::to_string(r.entered);
  if (r.entered > r.returned) {
    std::string s = "in " + call + " (count " + std::to_string(r.count);
    if (r.type == static_cast<int>(collectives::CollType::kBroadcast) ||
        r.type == static_cast<int>(collectives::CollType::kReduce)) {
      s += ", root " + std::to_string(r.root);
    }
    s += r.onDevice ? ", GPU)" : ")";
    if (withTime) s += " for " + seconds(r.sinceMs);
    return s;
  }
  std::string s = "not in a call; its last, " + call + " (count " + std::to_string(r.count) +
                  "), " + (r.onDevice ? "was queued" : "returned");
  if (withTime) s.append(" ").append(seconds(r.sinceMs)).append(" ago");
  if (askerEntered > r.entered) s += ": it has not called #" + std::to_string(r.entered + 1);
  return s;
}

// "rank 3" or "ranks 1-3, 5".
std::string rankList(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

// One rank's answer, or why there is none.
std::string ask(const SocketAddress& address, int self, const uint64_t secret[2],
                uint64_t askerEntered, int64_t deadlineMs) {
  if (!address.valid()) return "has no progress port (it could not open one; see its INFO log)";
  const Deadline deadline = Deadline::afterMs(deadlineMs);
  auto sock = Socket::connect(address, deadline, /*retryRefused=*/false);
  if (!sock) {
    if (sock.status().code() == Code::kRemoteError)
      return "gone (its progress port refuses connections)";
    return "no answer within " + std::to_string(deadlineMs) + " ms (stopped, hung or cut off)";
  }
  Query q{kQueryMagic, {secret[0], secret[1]}, self, 0};
  ProgressReply r;
  if (!sock->sendAll(&q, sizeof(q), deadline) || !sock->recvAll(&r, sizeof(r), deadline)) {
    return deadline.expired()
               ? "no answer within " + std::to_string(deadlineMs) + " ms (stopped, hung or cut off)"
               : "closed the connection without an answer (ending, or gone)";
  }
  if (r.magic != kReplyMagic) return "answered with something that is not a progress report";
  r.failure[sizeof(r.failure) - 1] = '\0';
  return describe(r, askerEntered, false);
}

}  // namespace

void ProgressRecord::enter(int type, uint64_t count, int root, bool onDevice) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++state_.entered;
  state_.type = type;
  state_.count = count;
  state_.root = root;
  state_.onDevice = onDevice ? 1 : 0;
  since_ = Clock::now();
}

void ProgressRecord::leave() {
  std::lock_guard<std::mutex> lock(mutex_);
  state_.returned = state_.entered;
  since_ = Clock::now();
}

void ProgressRecord::setFailure(const std::string& message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_.failure[0]) return;
  std::snprintf(state_.failure, sizeof(state_.failure), "%s", message.c_str());
}

ProgressReply ProgressRecord::snapshot(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  ProgressReply r = state_;
  r.magic = kReplyMagic;
  r.rank = rank;
  r.sinceMs = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - since_).count();
  return r;
}

Result<std::unique_ptr<ProgressServer>> ProgressServer::start(const SocketAddress& ip, int rank,
                                                              const uint64_t secret[2],
                                                              const ProgressRecord* record) {
  std::unique_ptr<ProgressServer> s(new ProgressServer());
  SocketAddress at = ip;
  at.setPort(0);
  LOOM_ASSIGN_OR_RETURN(s->listener_, Socket::listen(at));
  LOOM_ASSIGN_OR_RETURN(s->address_, s->listener_.localAddress());
  s->rank_ = rank;
  s->secret_[0] = secret[0];
  s->secret_[1] = secret[1];
  s->record_ = record;
  s->stopFd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s->stopFd_ < 0) return sysError(errno, "eventfd for the progress server");
  s->thread_ = std::thread([p = s.get()] { p->run(); });
  return s;
}

ProgressServer::~ProgressServer() {
  if (thread_.joinable()) {
    const uint64_t one = 1;
    if (::write(stopFd_, &one, sizeof(one)) < 0) {
      // Cannot happen for an eventfd we own; the thread would then end at its next tick.
    }
    thread_.join();
  }
  if (stopFd_ >= 0) ::close(stopFd_);
}

void ProgressServer::run() {
  Arrivals arrivals(&listener_, sizeof(Query), kHelloMs,
                    "progress port of rank " + std::to_string(rank_));
  while (true) {
    pollfd fds[2] = {{listener_.fd(), POLLIN, 0}, {stopFd_, POLLIN, 0}};
    // Connections that have not said their question yet are read by arrivals.poll(): look
    // again soon while there are any.
    ::poll(fds, 2, arrivals.pending() > 0 ? 10 : -1);
    if (fds[1].revents != 0) return;
    while (true) {
      auto next = arrivals.poll();
      if (!next) {
        LOOM_INFO(kInit, "rank %d: progress port: %s", rank_, next.status().message().c_str());
        break;
      }
      if (!next->has_value()) break;
      Arrival a = std::move(**next);
      Query q;
      std::memcpy(&q, a.hello.data(), sizeof(q));
      if (q.magic != kQueryMagic || q.secret[0] != secret_[0] || q.secret[1] != secret_[1]) {
        arrivals.drop(a, "not a question of this communicator");
        continue;
      }
      const ProgressReply r = record_->snapshot(rank_);
      Status st = a.sock.sendAll(&r, sizeof(r), Deadline::afterMs(kHelloMs), "the asking rank");
      if (!st)
        LOOM_INFO(kInit, "rank %d: progress port: answering rank %d: %s", rank_, q.asker,
                  st.message().c_str());
    }
  }
}

std::string askWhereRanksAre(const std::vector<SocketAddress>& addresses,
                             const std::vector<char>& whom, int self, const uint64_t secret[2],
                             const ProgressReply& mine, int64_t deadlineMs) {
  const int n = static_cast<int>(addresses.size());
  std::vector<std::string> said(n);
  std::vector<int> asked;
  for (int r = 0; r < n; ++r) {
    if (r != self && whom[r]) asked.push_back(r);
  }
  // kBatch of the ranks asked at a time (not of rank numbers: beyond 128 ranks those asked
  // are scattered, and each batch costs up to one deadline).
  for (size_t first = 0; first < asked.size(); first += kBatch) {
    std::vector<std::thread> askers;
    for (size_t i = first; i < std::min(asked.size(), first + kBatch); ++i) {
      const int r = asked[i];
      askers.emplace_back(
          [&, r] { said[r] = ask(addresses[r], self, secret, mine.entered, deadlineMs); });
    }
    for (auto& t : askers) t.join();
  }
  // The ranks in the same state together, in the order each state first appears.
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  int skipped = 0;
  for (int r = 0; r < n; ++r) {
    if (r == self) continue;
    if (!whom[r]) {
      ++skipped;
      continue;
    }
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == said[r]; });
    if (it == groups.end()) {
      groups.push_back({said[r], {r}});
    } else {
      it->second.push_back(r);
    }
  }
  std::string out = "where the ranks are: rank " + std::to_string(self) +
                    " (this one): " + describe(mine, 0, true);
  for (const auto& [state, ranks] : groups) out += "; " + rankList(ranks) + ": " + state;
  if (skipped > 0) out += "; " + std::to_string(skipped) + " other rank(s) not asked";
  return out;
}

bool isTimeout(const Status& st) {
  return !st.isOk() && st.message().find("LOOM_TIMEOUT_MS") != std::string::npos;
}

}  // namespace loom::comm
