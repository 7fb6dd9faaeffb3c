#include "comm/unique_id.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

namespace loom::comm {

void encodeId(const IdContents& c, ncclUniqueId* id) {
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, &c, sizeof(c));
}

Result<IdContents> decodeId(const ncclUniqueId& id) {
  IdContents c;
  std::memcpy(&c, id.internal, sizeof(c));
  if (c.magic != kIdMagic) {
    return errorf(Code::kInvalidArgument,
                  "the ncclUniqueId was not made by loom's ncclGetUniqueId (bad magic); "
                  "was it broadcast to every rank intact?");
  }
  if (!c.root.valid()) {
    return errorf(Code::kInvalidArgument, "the ncclUniqueId holds no valid root address");
  }
  return c;
}

Status randomSecret(uint64_t out[2]) {
  size_t got = 0;
  while (got < 16) {
    ssize_t n = getrandom(reinterpret_cast<char*>(out) + got, 16 - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return sysError(errno, "getrandom");
    }
    got += static_cast<size_t>(n);
  }
  return Status::ok();
}

IdContents idFromAddress(const SocketAddress& address) {
  IdContents c;
  c.root = address;
  c.fromEnv = 1;
  // FNV-1a over the address text: not a secret, only a guard against strays.
  std::string text = address.toString();
  uint64_t h = 1469598103934665603ull;
  for (char ch : text) {
    h ^= static_cast<unsigned char>(ch);
    h *= 1099511628211ull;
  }
  c.secret[0] = h;
  c.secret[1] = h * 31 + 7;
  return c;
}

}  // namespace loom::comm
