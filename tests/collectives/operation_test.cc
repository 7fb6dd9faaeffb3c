// collectives::sendsOverwrittenByReceives: which sends of a Send/Recv group must leave from a
// copy, checked against every pair compared directly, on ranges placed at random.
#include "collectives/operation.h"

#include <gtest/gtest.h>

#include <random>

namespace loom::collectives {
namespace {

Operation call(bool isSend, uintptr_t at, size_t count, DataType t = DataType::kUint8) {
  Operation o;
  o.type = CollType::kSendRecv;
  o.isSend = isSend;
  o.count = count;
  o.dtype = t;
  if (isSend)
    o.sendbuff = reinterpret_cast<const void*>(at);
  else
    o.recvbuff = reinterpret_cast<void*>(at);
  return o;
}

TEST(SendsOverwrittenByReceives, InPlaceAdjacentAndEmpty) {
  // In place; touching ends (half-open ranges do not overlap); empty calls never count;
  // the element size counts; only [begin, end) is looked at.
  std::vector<Operation> ops = {
      call(true, 0x1000, 256),                    // 0: overwritten by 1
      call(false, 0x1000, 256),                   // 1
      call(true, 0x2000, 16),                     // 2: ends where 3 starts
      call(false, 0x2010, 16),                    // 3
      call(true, 0x3000, 0),                      // 4: empty
      call(false, 0x3000, 64),                    // 5
      call(true, 0x4000, 4, DataType::kFloat64),  // 6: 32 bytes, reaches 7
      call(false, 0x401f, 1),                     // 7
      call(true, 0x5000, 8),                      // 8: its receive is outside the range asked about
      call(false, 0x5000, 8),                     // 9
  };
  EXPECT_EQ(sendsOverwrittenByReceives(ops, 0, ops.size()), (std::vector<size_t>{0, 6, 8}));
  EXPECT_EQ(sendsOverwrittenByReceives(ops, 2, 9), (std::vector<size_t>{6}));
  EXPECT_TRUE(sendsOverwrittenByReceives(ops, 2, 4).empty());
}

TEST(SendsOverwrittenByReceives, AgreesWithEveryPairCompared) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 300; ++round) {
    std::vector<Operation> ops;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i)
      ops.push_back(call(rng() % 2 == 0, 0x10000 + rng() % 4096, rng() % 300));
    std::vector<size_t> want;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!ops[i].isSend || ops[i].count == 0) continue;
      const uintptr_t a = reinterpret_cast<uintptr_t>(ops[i].sendbuff), b = a + ops[i].count;
      for (const Operation& r : ops) {
        const uintptr_t c = reinterpret_cast<uintptr_t>(r.recvbuff), d = c + r.count;
        if (!r.isSend && r.count > 0 && a < d && c < b) {
          want.push_back(i);
          break;
        }
      }
    }
    ASSERT_EQ(sendsOverwrittenByReceives(ops, 0, ops.size()), want) << "round " << round;
  }
}

}  // namespace
}  // namespace loom::collectives
