// An address for a test's bootstrap root (LOOM_COMM_ID) on loopback.
//
// The port is taken below the kernel's ephemeral range (net.ipv4.ip_local_port_range,
// 32768 up by default), not from a bind to port 0: a port the kernel hands out there
// and the test then closes can be taken a moment later as the local port of an
// outgoing connection of a test running beside it (ctest -j), and the root's bind then
// fails while the other ranks knock on a port nobody answers. This is the C++ twin of
// scripts/lib/ports.sh. Another test may still pick the same port between this check
// and its bind: the odds are one in several thousand.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <random>
#include <string>

#include "common/socket.h"

namespace loom::test {

inline std::string freeLoopbackAddress() {
  int low = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d", &low) != 1) low = 32768;
    std::fclose(f);
  }
  if (low <= 21000) low = 32768;  // a range starting low leaves no room below it
  std::mt19937 pick(std::random_device{}() ^ static_cast<unsigned>(getpid()));
  std::uniform_int_distribution<int> port(20000, low - 1);
  std::string address;
  for (int i = 0; i < 50; ++i) {
    address = "127.0.0.1:" + std::to_string(port(pick));
    auto probe = Socket::listen(*SocketAddress::parse(address));
    if (probe.isOk()) return address;  // closed as it leaves scope
  }
  return address;
}

}  // namespace loom::test
