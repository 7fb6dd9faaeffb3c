#include "transports/net/ib/ib_select.h"

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <cstring>

namespace loom::transport::net::ib {

namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(sep, start);
    if (end == std::string::npos) end = text.size();
    std::string part = text.substr(start, end - start);
    // Spaces around names are typos, not part of them.
    part.erase(0, part.find_first_not_of(" \t"));
    part.erase(part.find_last_not_of(" \t") + 1);
    if (!part.empty()) out.push_back(part);
    start = end + 1;
  }
  return out;
}

}  // namespace

HcaFilter HcaFilter::parse(const std::string& text) {
  HcaFilter f;
  std::string rest = text;
  if (!rest.empty() && rest[0] == '^') {
    f.exclude = true;
    rest.erase(0, 1);
  }
  if (!rest.empty() && rest[0] == '=') {
    f.exact = true;
    rest.erase(0, 1);
  }
  for (const std::string& item : split(rest, ',')) {
    Entry e;
    const size_t colon = item.find(':');
    e.name = item.substr(0, colon);
    if (colon != std::string::npos) e.port = std::atoi(item.c_str() + colon + 1);
    f.entries.push_back(e);
  }
  return f;
}

bool HcaFilter::matches(const std::string& device, int port) const {
  if (entries.empty()) return true;
  bool hit = false;
  for (const Entry& e : entries) {
    const bool name = exact ? device == e.name : device.compare(0, e.name.size(), e.name) == 0;
    if (name && (e.port < 0 || e.port == port)) {
      hit = true;
      break;
    }
  }
  return exclude ? !hit : hit;
}

int portSpeedMbps(int activeWidth, int activeSpeed) {
  int lanes = 0;
  switch (activeWidth) {
    case 1: lanes = 1; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    case 16: lanes = 2; break;
    default: return 0;
  }
  int perLane = 0;  // Mb/s of data per lane, as NCCL counts them
  switch (activeSpeed) {
    case 1: perLane = 2500; break;      // SDR
    case 2: perLane = 5000; break;      // DDR
    case 4: perLane = 10000; break;     // QDR
    case 8: perLane = 10000; break;     // FDR10
    case 16: perLane = 14000; break;    // FDR
    case 32: perLane = 25000; break;    // EDR
    case 64: perLane = 50000; break;    // HDR
    case 128: perLane = 100000; break;  // NDR
    case 256: perLane = 200000; break;  // XDR
    default: return 0;
  }
  return lanes * perLane;
}

std::string explainCompletion(int status, const char* statusText, const std::string& peer,
                              uint32_t qp, const std::string& device) {
  std::string hint;
  switch (status) {
    case IBV_WC_RETRY_EXC_ERR:
      hint =
          "the NICs cannot reach each other (wrong GID or subnet: LOOM_IB_GID_INDEX, "
          "routing, a link down), the peer's process or host is gone, or LOOM_IB_TIMEOUT "
          "is too short for this fabric";
      break;
    case IBV_WC_RNR_RETRY_EXC_ERR:
      hint = "the peer had no receive posted for too long (it stopped making progress)";
      break;
    case IBV_WC_REM_ACCESS_ERR:
      hint =
          "the peer refused the write: the address or key it gave does not cover it (a "
          "peer that restarted or released its buffers; otherwise a bug in loom)";
      break;
    case IBV_WC_LOC_PROT_ERR:
    case IBV_WC_LOC_ACCESS_ERR:
      hint = "a buffer of this process is not registered with " + device +
             " (memory freed while in use, or registered on another device)";
      break;
    case IBV_WC_LOC_LEN_ERR:
    case IBV_WC_REM_INV_REQ_ERR: hint = "a message larger than the buffer meant for it"; break;
    case IBV_WC_WR_FLUSH_ERR:
      hint = "the connection had already failed (an earlier error on it says why)";
      break;
    case IBV_WC_REM_OP_ERR: hint = "the peer's NIC could not complete the operation"; break;
    case IBV_WC_FATAL_ERR:
    case IBV_WC_GENERAL_ERR:
      hint = "the NIC reported a fatal error (see the kernel log, dmesg)";
      break;
    default: hint = "see the NIC's documentation for this status";
  }
  return std::string("net/ib: ") + device + ", queue pair " + std::to_string(qp) + " to " + peer +
         ": " + (statusText ? statusText : "unknown status") + " (status " +
         std::to_string(status) + "): " + hint;
}

}  // namespace loom::transport::net::ib
