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

namespace {

// 64 bits of `text` mixed from `seed` (splitmix64 over FNV-1a's running hash): every
// input bit moves every output bit, so the secret text cannot be read back from it.
uint64_t mixText(const std::string& text, uint64_t seed) {
  uint64_t h = seed ^ 1469598103934665603ull;
  for (char ch : text) {
    h ^= static_cast<unsigned char>(ch);
    h *= 1099511628211ull;
    h ^= h >> 29;
  }
  h += 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

}  // namespace

IdContents idFromAddress(const SocketAddress& address, const std::string& sharedSecret) {
  IdContents c;
  c.root = address;
  c.fromEnv = 1;
  const std::string text = sharedSecret + "\n" + address.toString();
  c.secret[0] = mixText(text, 0x6c6f6f6d31ull);
  c.secret[1] = mixText(text, 0x6c6f6f6d32ull);
  return c;
}

}  // namespace loom::comm
