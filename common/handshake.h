// Connections that must introduce themselves: a listener's arrivals, each reading its
// first `helloBytes` on a clock of its own, all at once. A port scanner, a health check
// or a stranger that connects and says nothing costs a listener nothing but a file
// descriptor until its own deadline, while the connections that do say hello are
// handed out as soon as they have (the bootstrap root, the bootstrap's listener and the
// tcp transport's all take them this way).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/socket.h"
#include "common/status.h"

namespace loom {

struct Arrival {
  Socket sock;
  std::vector<char> hello;  // exactly helloBytes
  std::string from;         // the peer's address, for messages
};

class Arrivals {
 public:
  // `listener` must be non-blocking (Socket::listen makes it so) and outlive this.
  // `what` names the listener in the log ("bootstrap root").
  Arrivals(Socket* listener, size_t helloBytes, int64_t perConnectionMs, std::string what);

  // A connection that has said its hello, waiting until `deadline` for one (then an
  // error: nothing arrived). Connections that close first, or stay silent past their
  // own deadline, are dropped and logged.
  Result<Arrival> next(const Deadline& deadline);
  // One that has said its hello by now, if any (never waits).
  Result<std::optional<Arrival>> poll();
  // Logs and closes a connection whose hello the caller refuses.
  void drop(const Arrival& a, const char* why) const;
  size_t pending() const { return pending_.size(); }

 private:
  struct Pending {
    Socket sock;
    std::vector<char> hello;
    size_t got = 0;
    Clock::time_point deadline;
    std::string from;
  };
  Status takeNew();
  std::optional<Arrival> advance();  // reads what is there; a finished one, if any

  Socket* listener_;
  size_t helloBytes_;
  int64_t perConnectionMs_;
  std::string what_;
  std::vector<Pending> pending_;
};

}  // namespace loom
