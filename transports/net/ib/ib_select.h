// The ib backend's choices that depend on nothing but their inputs, so they are tested
// without a device: which ports LOOM_IB_HCA keeps, which GID a RoCE port uses, a port's
// speed, and what a failed work completion usually means.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace loom::transport::net::ib {

// LOOM_IB_HCA / NCCL_IB_HCA, NCCL's syntax: "mlx5_0:1,mlx5_1" (name prefixes, each with
// an optional port), "^mlx5_3" (exclude these), "=mlx5_1" (exact names, no prefixes),
// "^=mlx5_1:1" (exclude exact). Empty: every device and port.
struct HcaFilter {
  struct Entry {
    std::string name;
    int port = -1;  // -1: any
  };
  bool exclude = false;
  bool exact = false;
  std::vector<Entry> entries;

  static HcaFilter parse(const std::string& text);
  bool matches(const std::string& device, int port) const;
};

// One entry of a port's GID table, as the verbs report it.
struct Gid {
  int index = 0;
  unsigned char raw[16] = {};
  enum class Type { kIb, kRoceV1, kRoceV2 } type = Type::kIb;
  std::string netdev;  // the interface of a RoCE entry, "" when unknown

  bool ipv4Mapped() const;   // ::ffff:a.b.c.d
  bool linkLocal() const;    // fe80::/64
  std::string text() const;  // "::ffff:10.0.0.1", "fe80::1"
};

struct GidChoice {
  int index = -1;   // -1: none usable
  std::string why;  // what was chosen and why, or why nothing could be
};

// The GID a port's connections use: InfiniBand index 0; RoCE LOOM_IB_GID_INDEX when it
// is set (`forced` >= 0) and populated, else RoCE v2 with an IPv4 address, else another
// RoCE v2 entry (global before link-local), else RoCE v1 in the same order, the lowest
// index among equals. `why` lists what the table holds when the choice is not the usual one.
GidChoice chooseGid(const std::vector<Gid>& table, bool infiniband, int forced,
                    const std::string& where);

// Mb/s of a port from ibv_port_attr's active_width and active_speed codes; 0 if unknown.
int portSpeedMbps(int activeWidth, int activeSpeed);

// A failed work completion in words: what it is (ibv_wc_status_str's text) and what
// usually causes it. `peer` names the other side ("rank 3"), `qp` the queue pair.
std::string explainCompletion(int status, const char* statusText, const std::string& peer,
                              uint32_t qp, const std::string& device);

}  // namespace loom::transport::net::ib
