// The 128-byte ncclUniqueId: a magic, the bootstrap root's address and a random
// secret that every connection to the root and between ranks must present.
#pragma once

#include <cstdint>
#include <string>

#include "common/socket.h"
#include "common/status.h"
#include "nccl.h"

namespace loom::comm {

inline constexpr uint64_t kIdMagic = 0x4c4f4f4d49443031ull;  // "LOOMID01"

struct IdContents {
  uint64_t magic = kIdMagic;
  SocketAddress root;
  uint64_t secret[2] = {0, 0};
  // 1 when the id was made from LOOM_COMM_ID: rank 0 then runs the root itself.
  uint32_t fromEnv = 0;
};
static_assert(sizeof(IdContents) <= sizeof(ncclUniqueId));

void encodeId(const IdContents& c, ncclUniqueId* id);
// Fails with kInvalidArgument when the bytes are not a loom id.
Result<IdContents> decodeId(const ncclUniqueId& id);
// 128 random bits from the kernel.
Status randomSecret(uint64_t out[2]);
// An id naming `address` (from LOOM_COMM_ID), which every rank computes alone: the
// secret is derived from `sharedSecret` (LOOM_COMM_SECRET, the same on every rank) and the
// address. Without a shared secret it is derived from the address only, which anyone who
// can reach the port can do too: it then guards against strays, not against strangers.
IdContents idFromAddress(const SocketAddress& address, const std::string& sharedSecret = "");

}  // namespace loom::comm
