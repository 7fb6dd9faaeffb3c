#include "common/status.h"

#include <cstdio>
#include <cstring>

namespace loom {

const char* codeName(Code code) {
  switch (code) {
    case Code::kOk: return "success";
    case Code::kCudaError: return "unhandled cuda error";
    case Code::kSystemError: return "system error";
    case Code::kInternalError: return "internal error";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kInvalidUsage: return "invalid usage";
    case Code::kRemoteError: return "remote process exited or there was a network error";
    case Code::kInProgress: return "operation in progress";
  }
  return "unknown result code";
}

namespace {
std::string vformat(const char* fmt, va_list ap) {
  char small[512];
  va_list copy;
  va_copy(copy, ap);
  int n = std::vsnprintf(small, sizeof(small), fmt, copy);
  va_end(copy);
  if (n < 0) return fmt;
  if (static_cast<size_t>(n) < sizeof(small)) return std::string(small, n);
  std::string big(n + 1, '\0');
  std::vsnprintf(big.data(), big.size(), fmt, ap);
  big.resize(n);
  return big;
}
}  // namespace

Status errorf(Code code, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string msg = vformat(fmt, ap);
  va_end(ap);
  return Status(code, std::move(msg));
}

Status sysError(int errnum, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string msg = vformat(fmt, ap);
  va_end(ap);
  char buf[256];
  const char* text = strerror_r(errnum, buf, sizeof(buf));
  msg += ": ";
  msg += text;
  return Status(Code::kSystemError, std::move(msg));
}

}  // namespace loom
