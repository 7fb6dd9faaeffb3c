// The ib backend's choices that depend on nothing but their inputs, so they are tested
// without a device: which ports LOOM_IB_HCA keeps, a port's speed, and what a failed work
// completion usually means.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/roce_gid.h"
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

// The GID choice is shared with topology detection (common/roce_gid.h).
using roce::chooseGid;
using roce::Gid;
using roce::GidChoice;
using roce::GidRule;

// Mb/s of a port from ibv_port_attr's active_width and active_speed codes; 0 if unknown.
int portSpeedMbps(int activeWidth, int activeSpeed);

// A failed work completion in words: what it is (ibv_wc_status_str's text) and what
// usually causes it. `peer` names the other side ("rank 3"), `qp` the queue pair.
std::string explainCompletion(int status, const char* statusText, const std::string& peer,
                              uint32_t qp, const std::string& device);

}  // namespace loom::transport::net::ib
