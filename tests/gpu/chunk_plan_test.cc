// The chunk plan of the copy-engine all-reduce and reduce (collectives/device/chunk_plan.h):
// every element belongs to exactly one chunk of one owner, chunks start on 16-byte
// boundaries and fit a scratch slot. Runs without a GPU.
#include "collectives/device/chunk_plan.h"

#include <gtest/gtest.h>

#include <vector>

namespace loom::collectives::device {
namespace {

void checkPlan(size_t count, size_t es, int nranks, int root, size_t maxChunk) {
  SCOPED_TRACE(testing::Message() << "count " << count << " es " << es << " nranks " << nranks << " root "
                                  << root << " max " << maxChunk);
  ChunkPlan plan(count, es, nranks, root, maxChunk);
  ASSERT_EQ(plan.nranks(), nranks);
  std::vector<int> owner(count, -1);
  const size_t slot = std::max<size_t>(64 * 1024, maxChunk / (64 * 1024) * (64 * 1024));
  EXPECT_LE(plan.maxChunkBytes(), slot);
  for (int r = 0; r < nranks; ++r) {
    if (root >= 0 && r != root) {
      EXPECT_EQ(plan.chunks(r), 0u);
    }
    size_t covered = 0;
    for (size_t c = 0; c < plan.chunks(r); ++c) {
      const size_t b = plan.chunkBegin(r, c), n = plan.chunkCount(r, c);
      EXPECT_GT(n, 0u);
      EXPECT_LE(n * es, slot);
      EXPECT_EQ(b * es % 16, 0u);
      for (size_t i = b; i < b + n; ++i) {
        ASSERT_LT(i, count);
        EXPECT_EQ(owner[i], -1) << "element " << i << " in two chunks";
        owner[i] = r;
      }
      covered += n;
    }
    EXPECT_EQ(covered, plan.segmentCount(r));
    EXPECT_EQ(plan.chunkCount(r, plan.chunks(r)), 0u);
  }
  for (size_t i = 0; i < count; ++i) ASSERT_NE(owner[i], -1) << "element " << i << " in no chunk";
}

TEST(ChunkPlan, AllReduceSegmentsCoverEveryElementOnce) {
  for (int n : {1, 2, 3, 7, 8}) {
    for (size_t es : {1, 2, 4, 8}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{13}, size_t{70001}, size_t{1} << 20, (size_t{5} << 20) + 3}) {
        for (size_t maxChunk : {size_t{1}, size_t{64} << 10, (size_t{100} << 10) + 7, size_t{1} << 20}) {
          checkPlan(count, es, n, -1, maxChunk);
        }
      }
    }
  }
}

TEST(ChunkPlan, ReduceGivesTheRootEverything) {
  for (int n : {2, 3, 8}) {
    for (int root : {0, n - 1}) {
      checkPlan((size_t{3} << 20) + 5, 4, n, root, size_t{256} << 10);
      checkPlan(17, 2, n, root, size_t{1} << 20);
    }
  }
}

TEST(ChunkPlan, ChunksAreEqualAndAsLargeAsAllowed) {
  // 256 MiB of floats over 2 ranks, 64 MiB slots: two chunks of 64 MiB per segment.
  ChunkPlan plan(size_t{64} << 20, 4, 2, -1, size_t{64} << 20);
  EXPECT_EQ(plan.chunks(0), 2u);
  EXPECT_EQ(plan.chunkCount(0, 0), size_t{16} << 20);
  EXPECT_EQ(plan.chunkCount(0, 1), size_t{16} << 20);
  // A segment a little over two slots: three equal chunks, not two full ones and a sliver.
  ChunkPlan odd((size_t{33} << 20) / 4, 4, 1, 0, size_t{16} << 20);
  ASSERT_EQ(odd.chunks(0), 3u);
  EXPECT_EQ(odd.chunkCount(0, 0), odd.chunkCount(0, 1));
  EXPECT_GT(odd.chunkCount(0, 2) * 4, size_t{10} << 20);
}

}  // namespace
}  // namespace loom::collectives::device
