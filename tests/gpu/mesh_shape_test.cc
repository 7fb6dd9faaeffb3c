// The GPU mesh's launch shapes and window geometry: pure host functions, so they run
// everywhere (label cpu). Every rank must derive the same grid and tiles from the same
// call, tiles must keep 16-byte alignment, and the LL path must stay inside its region.
#include <gtest/gtest.h>

#include "collectives/device/mesh.h"

namespace {

using namespace loom::collectives::device;
using loom::DataType;

MeshContext context(int nranks, int blocks, size_t slotBytes) {
  MeshContext c;
  c.nranks = nranks;
  c.geo.nranks = nranks;
  c.geo.maxBlocks = blocks;
  c.geo.slotBytes = slotBytes;
  return c;
}

TEST(MeshShape, TilesAreAlignedAndCoverTheData) {
  for (int n : {1, 2, 3, 8}) {
    MeshContext c = context(n, 128, 256 * 1024);
    for (MeshKind kind :
         {MeshKind::kAllReduceOneShot, MeshKind::kAllReduceTwoShot, MeshKind::kAllGather,
          MeshKind::kBroadcast, MeshKind::kReduceScatter, MeshKind::kReduce, MeshKind::kAllToAll}) {
      for (DataType t :
           {DataType::kInt8, DataType::kFloat16, DataType::kFloat32, DataType::kFloat64}) {
        for (size_t count :
             {size_t{1}, size_t{13}, size_t{4099}, size_t{1} << 20, (size_t{3} << 30) + 7}) {
          MeshCall call;
          call.kind = kind;
          call.type = t;
          call.count = count;
          LaunchShape s = meshShape(c, call);
          const size_t es = loom::dataTypeSize(t);
          EXPECT_GE(s.blocks, 1);
          EXPECT_LE(s.blocks, c.geo.maxBlocks);
          EXPECT_EQ(s.tileElems * es % 16, 0u) << "tile of " << s.tileElems << " x " << es;
          EXPECT_LE(s.tileElems * es, c.geo.slotBytes);
          // Same call, same answer (every rank computes it alone).
          LaunchShape again = meshShape(c, call);
          EXPECT_EQ(again.blocks, s.blocks);
          EXPECT_EQ(again.tileElems, s.tileElems);
        }
      }
    }
  }
}

TEST(MeshShape, LLStaysInsideItsRegion) {
  MeshContext c = context(2, 128, 256 * 1024);
  for (size_t bytes : {size_t{4}, size_t{8}, size_t{8192}, size_t{8193}, kLLBlocks * kLLPayload}) {
    MeshCall call;
    call.kind = MeshKind::kAllReduceLL;
    call.type = DataType::kFloat32;
    call.count = bytes / 4;
    LaunchShape s = meshShape(c, call);
    EXPECT_LE(s.blocks, kLLBlocks);
    EXPECT_GE(static_cast<size_t>(s.blocks) * kLLPayload, call.count * 4) << bytes;
    // A reduce-scatter's count is per rank, and each peer gets only its part: the same
    // blocks as an all-reduce of that count.
    call.kind = MeshKind::kReduceScatterLL;
    LaunchShape rs = meshShape(c, call);
    EXPECT_EQ(rs.blocks, s.blocks) << bytes;
  }
}

TEST(MeshShape, LL128StaysInsideItsRegion) {
  MeshContext c = context(2, 128, 256 * 1024);
  c.geo.ll128Lines = 560;
  for (DataType t : {DataType::kInt8, DataType::kFloat16, DataType::kFloat32, DataType::kFloat64}) {
    const size_t es = dataTypeSize(t);
    for (size_t bytes : {es, size_t{120}, size_t{16384}, size_t{16385}, size_t{1} << 20,
                         c.geo.ll128Capacity() / es * es}) {
      for (MeshKind k :
           {MeshKind::kAllReduceLL128, MeshKind::kReduceLL128, MeshKind::kReduceScatterLL128}) {
        MeshCall call;
        call.kind = k;
        call.type = t;
        call.count = bytes / es;
        LaunchShape s = meshShape(c, call);
        EXPECT_GE(s.blocks, 1);
        EXPECT_LE(s.blocks, kLLBlocks);
        const size_t tile = s.tileElems * es;
        EXPECT_EQ(tile % 8, 0u) << bytes;                                 // whole words per block
        EXPECT_LE(tile, size_t(c.geo.ll128Lines) * kLL128Data) << bytes;  // fits a block's lines
        EXPECT_GE(static_cast<size_t>(s.blocks) * tile, call.count * es)
            << bytes;  // covers the call
      }
    }
  }
}

TEST(MeshShape, SendRecvUsesTheWholeGrid) {
  MeshContext c = context(2, 32, 256 * 1024);
  MeshCall call;
  call.kind = MeshKind::kSendRecv;
  call.type = DataType::kUint8;
  LaunchShape s = meshShape(c, call);
  EXPECT_EQ(s.blocks, 32);
  EXPECT_EQ(s.tileElems, 256u * 1024);
}

TEST(MeshShape, DirectReduceKeepsSeveralTilesPerBlock) {
  MeshContext ctx;
  ctx.nranks = 2;
  ctx.geo.nranks = 2;
  ctx.geo.maxBlocks = 128;
  ctx.geo.slotBytes = 256 * 1024;
  MeshCall call;
  call.kind = MeshKind::kReduceDirect;
  call.type = DataType::kFloat32;
  call.count = (size_t{32} << 20) / 4;  // 32 MiB: 4 tiles of 64 KiB per block
  LaunchShape s = meshShape(ctx, call);
  EXPECT_EQ(s.blocks, 128);
  EXPECT_EQ(s.tileElems, 64u * 1024 / 4);
  call.count = (size_t{1} << 30) / 4;  // large: one slot per tile
  EXPECT_EQ(meshShape(ctx, call).tileElems, 256u * 1024 / 4);
  call.count = 1000;  // small: the 16 KiB floor, one block
  EXPECT_EQ(meshShape(ctx, call).blocks, 1);
}

TEST(MeshGeometry, WindowLayoutDoesNotOverlap) {
  Geometry g;
  g.nranks = 2;
  g.maxBlocks = 128;
  g.slots = 4;
  g.slotBytes = 256 * 1024;
  g.ll128Lines = 560;
  EXPECT_EQ(g.ll128Offset(), g.flagBytes() + g.llBytes());
  EXPECT_EQ(g.ll128Offset() % 128, 0u);  // LL128 lines are 128-byte aligned
  EXPECT_EQ(g.ll128Bytes(), size_t{2} * kLLBlocks * 2 * 560 * 128);
  EXPECT_GE(g.ll128Capacity(), size_t{8} << 20);
  EXPECT_EQ(g.barrierOffset(), g.ll128Offset() + g.ll128Bytes());
  EXPECT_EQ(g.chunkFlagOffset(), g.barrierOffset() + kMaxRanks * kFlagStride);
  EXPECT_EQ(g.slotsOffset(), g.chunkFlagOffset() + 2 * kMaxRanks * kFlagStride);
  EXPECT_EQ(g.windowBytes(), g.slotsOffset() + size_t{2} * 128 * 4 * 256 * 1024);
  EXPECT_EQ(g.flagBytes() % 128, 0u);
  EXPECT_EQ(g.llBytes() % 16, 0u);
  // 2 ranks with the defaults: 256 MiB of slots, the LL region (8 MiB), the LL128
  // region (35 MiB) and counters.
  EXPECT_EQ(g.llBytes(), size_t{8} << 20);
  EXPECT_LT(g.windowBytes(), size_t{300} << 20);
  // Sent/received per block and peer, the LL counts, the barrier count and two done counts.
  EXPECT_EQ(g.stateBytes(), (2 * kMaxRanks * 128 + kLLBlocks + 3) * sizeof(uint64_t));
}

}  // namespace
