#include <algorithm>
#include <bit>
#include <functional>
#include <utility>

#include "collectives/hierarchy.h"
#include "collectives/schedule.h"

namespace loom::collectives {

const char* collTypeName(CollType type) {
  switch (type) {
    case CollType::kAllReduce: return "AllReduce";
    case CollType::kAllGather: return "AllGather";
    case CollType::kReduceScatter: return "ReduceScatter";
    case CollType::kBroadcast: return "Broadcast";
    case CollType::kReduce: return "Reduce";
    case CollType::kAllToAll: return "AllToAll";
    case CollType::kSendRecv: return "SendRecv";
  }
  return "?";
}

const char* algorithmName(Algorithm algo) {
  switch (algo) {
    case Algorithm::kRing: return "ring";
    case Algorithm::kTree: return "tree";
    case Algorithm::kChain: return "chain";
    case Algorithm::kOneShot: return "oneshot";
    case Algorithm::kDirect: return "direct";
    case Algorithm::kDoubling: return "doubling";
    case Algorithm::kHier: return "hier";
  }
  return "?";
}

void chunkRange(size_t count, int n, int i, size_t* offset, size_t* size, size_t unit) {
  const size_t idx = static_cast<size_t>(i);
  if (unit <= 1 || count < static_cast<size_t>(n) * unit) {
    const size_t base = count / n, extra = count % n;
    *offset = idx * base + std::min(idx, extra);
    *size = base + (idx < extra ? 1 : 0);
    return;
  }
  // Whole units, near-equal; the last chunk also takes the tail (less than a unit, and
  // only where the count is not n pieces: no chunk outgrows a piece that is whole units).
  const size_t units = count / unit;
  const size_t base = units / n, extra = units % n;
  *offset = (idx * base + std::min(idx, extra)) * unit;
  *size = (base + (idx < extra ? 1 : 0)) * unit;
  if (i == n - 1) *size = count - *offset;
}

size_t chunkUnit(size_t piece) {
  size_t unit = kChunkAlign;
  while (unit > 1 && piece % unit != 0) unit /= 2;
  return unit;
}

namespace {

int mod(int a, int n) {
  return ((a % n) + n) % n;
}

Region in(size_t off) {
  return {Buffer::kInput, off};
}
Region out(size_t off) {
  return {Buffer::kOutput, off};
}

Phase single(const Step& s) {
  return Phase{s};
}

// One ring pass over n chunks (each at most one piece, so a step is one FIFO slot and
// steps can run one after another without the ring deadlocking on a full FIFO).
// `inOff(c)`, `outOff(c)`, `size(c)` place chunk c. Reduce-scatter: rank r ends with
// chunk r reduced; all-gather: every rank ends with every chunk.
enum class RingMode { kAllReduce, kReduceScatter, kAllGather };

// Ring positions: order[p] is the rank at position p. Chunk c below is a position; the
// offset functions get the rank that owns it (reduce-scatter and all-gather place a
// rank's chunk by rank).
struct RingOrder {
  std::vector<int> order;
  int pos = 0;  // this rank's position
  int rankAt(int p) const { return order[mod(p, static_cast<int>(order.size()))]; }
};

RingOrder ringOrder(int r, int n, const std::vector<int>* ring) {
  RingOrder o;
  if (ring && isRingOrder(*ring, n)) {
    o.order = *ring;
  } else {
    o.order.resize(n);
    for (int i = 0; i < n; ++i) o.order[i] = i;
  }
  for (int i = 0; i < n; ++i) {
    if (o.order[i] == r) o.pos = i;
  }
  return o;
}

template <typename InOff, typename OutOff, typename Size>
void ringPass(Schedule* s, const RingOrder& ro, int n, RingMode mode, InOff inOffRank,
              OutOff outOffRank, Size sizeRank) {
  const int r = ro.pos;
  const int next = ro.rankAt(r + 1);
  const int prev = ro.rankAt(r - 1);
  auto inOff = [&](int c) { return inOffRank(ro.rankAt(c)); };
  auto outOff = [&](int c) { return outOffRank(ro.rankAt(c)); };
  auto size = [&](int c) { return sizeRank(ro.rankAt(c)); };
  if (mode != RingMode::kAllGather) {
    int c = mod(r - 1, n);
    Step first;
    first.src = in(inOff(c));
    first.count = size(c);
    first.sendTo(next);
    s->phases.push_back(single(first));
    for (int st = 1; st <= n - 2; ++st) {
      c = mod(r - st - 1, n);
      Step step;
      step.src = in(inOff(c));
      step.count = size(c);
      step.recvFrom(prev).sendTo(next);
      s->phases.push_back(single(step));
    }
    Step last;
    last.src = in(inOff(r));
    last.count = size(r);
    last.recvFrom(prev);
    last.final = true;
    last.dst = out(outOff(r));
    if (mode == RingMode::kAllReduce) last.sendTo(next);
    s->phases.push_back(single(last));
    if (mode == RingMode::kReduceScatter) return;
  } else {
    Step first;
    first.src = in(inOff(r));
    first.dst = out(outOff(r));
    first.count = size(r);
    first.sendTo(next);
    s->phases.push_back(single(first));
  }
  for (int t = 1; t <= n - 1; ++t) {
    int c = mod(r - t, n);
    Step st;
    st.count = size(c);
    st.dst = out(outOff(c));
    st.recvFrom(prev);
    if (t < n - 1) st.sendTo(next);
    s->phases.push_back(single(st));
  }
}

Schedule localOnly(size_t inCount, size_t outCount, size_t count, bool reduces) {
  Schedule s;
  s.reduces = reduces;
  s.inputCount = inCount;
  s.outputCount = outCount;
  Step st;
  st.src = in(0);
  st.dst = out(0);
  st.count = count;
  st.final = reduces;
  s.phases.push_back(single(st));
  return s;
}

}  // namespace

Schedule emptyCall(int r, int n, const std::vector<int>* ring) {
  Schedule s;
  if (n < 2) return s;
  const RingOrder ro = ringOrder(r, n, ring);
  // Two steps, not one that forwards: a step waits for what it receives before it sends.
  Step send, recv;
  send.empty = recv.empty = true;
  send.sendTo(ro.rankAt(ro.pos + 1));
  recv.recvFrom(ro.rankAt(ro.pos - 1));
  s.phases.push_back(Phase{send, recv});
  return s;
}

bool isRingOrder(const std::vector<int>& ring, int n) {
  if (static_cast<int>(ring.size()) != n) return false;
  std::vector<bool> seen(n, false);
  for (int x : ring) {
    if (x < 0 || x >= n || seen[x]) return false;
    seen[x] = true;
  }
  return true;
}

Schedule ringAllReduce(int r, int n, size_t count, size_t piece, const std::vector<int>* ring) {
  if (n == 1) return localOnly(count, count, count, true);
  const RingOrder ro = ringOrder(r, n, ring);
  Schedule s;
  s.reduces = true;
  s.inputCount = s.outputCount = count;
  const size_t block = piece * n;
  const size_t unit = chunkUnit(piece);
  for (size_t base = 0; base < count; base += block) {
    size_t bc = std::min(block, count - base);
    auto off = [&](int c) {
      size_t o, z;
      chunkRange(bc, n, c, &o, &z, unit);
      return base + o;
    };
    auto size = [&](int c) {
      size_t o, z;
      chunkRange(bc, n, c, &o, &z, unit);
      return z;
    };
    ringPass(&s, ro, n, RingMode::kAllReduce, off, off, size);
  }
  return s;
}

namespace {

// The two rings of the hierarchical forms: the host's ranks, and the rail's.
void hierRings(const Hierarchy& h, RingOrder* local, RingOrder* rail) {
  local->order = h.localRanks;
  local->pos = h.localIndex;
  rail->order = h.railRanks;
  rail->pos = h.hostIndex;
}

// The steps of s's phases from `first` on read what this rank holds in its output (already
// through the pre-op where the schedule reduces) instead of its input. `sendOnly`: a step
// that would copy its source onto itself (an all-gather ring's first) only sends it.
void readOutput(Schedule* s, size_t first, bool sendOnly) {
  for (size_t p = first; p < s->phases.size(); ++p) {
    for (Step& st : s->phases[p]) {
      if (st.src.buffer != Buffer::kInput) continue;
      st.src.buffer = Buffer::kOutput;
      st.srcPartial = true;
      if (sendOnly && st.nrecv == 0 && st.dst.buffer == Buffer::kOutput &&
          st.dst.offset == st.src.offset)
        st.dst = Region{};
    }
  }
}

}  // namespace

Schedule hierAllReduce(const Hierarchy& h, size_t count, size_t piece) {
  const int L = h.local, H = h.hosts;
  RingOrder local, rail;
  hierRings(h, &local, &rail);
  Schedule s;
  s.reduces = true;
  s.inputCount = s.outputCount = count;
  // The buffer in L parts, part l local rank l's to complete across the hosts; the steps
  // inside the host move a slice of at most `piece` of every part at a time.
  size_t most = 0;
  for (int l = 0; l < L; ++l) {
    size_t o, z;
    chunkRange(count, L, l, &o, &z);
    most = std::max(most, z);
  }
  const size_t slices = (most + piece - 1) / piece;
  auto slice = [&](int q, size_t b, size_t* off, size_t* size) {
    size_t o, z;
    chunkRange(count, L, h.localOf[q], &o, &z);
    const size_t start = std::min(z, b * piece);
    *off = o + start;
    *size = std::min(piece, z - start);
  };
  // The in-host rings of slice b (reduce-scatter or all-gather): chunk q is a slice of
  // local rank q's part.
  auto inHost = [&](size_t b, RingMode mode) {
    auto off = [&](int q) {
      size_t o, z;
      slice(q, b, &o, &z);
      return o;
    };
    auto size = [&](int q) {
      size_t o, z;
      slice(q, b, &o, &z);
      return z;
    };
    ringPass(&s, local, L, mode, off, off, size);
  };
  // 1. Reduce-scatter inside the host: each part, summed over the host, to its local rank
  //    (no post-op yet).
  for (size_t b = 0; b < slices; ++b) {
    const size_t first = s.phases.size();
    inHost(b, RingMode::kReduceScatter);
    for (size_t p = first; p < s.phases.size(); ++p) {
      for (Step& st : s.phases[p]) st.final = false;
    }
  }
  // 2. All-reduce of this rank's part across the hosts on its rail, in blocks of H pieces
  //    as the flat ring's (the post-op here).
  const size_t railFirst = s.phases.size();
  size_t po, pz;
  chunkRange(count, L, h.localIndex, &po, &pz);
  const size_t block = piece * static_cast<size_t>(H);
  for (size_t base = 0; base < pz; base += block) {
    const size_t bc = std::min(block, pz - base);
    auto off = [&](int q) {
      size_t o, z;
      chunkRange(bc, H, h.hostOf[q], &o, &z);
      return po + base + o;
    };
    auto size = [&](int q) {
      size_t o, z;
      chunkRange(bc, H, h.hostOf[q], &o, &z);
      return z;
    };
    ringPass(&s, rail, H, RingMode::kAllReduce, off, off, size);
  }
  readOutput(&s, railFirst, false);
  // 3. All-gather inside the host: every part to every local rank.
  const size_t gatherFirst = s.phases.size();
  for (size_t b = 0; b < slices; ++b) inHost(b, RingMode::kAllGather);
  readOutput(&s, gatherFirst, true);
  return s;
}

Schedule hierAllGather(const Hierarchy& h, size_t count, size_t piece) {
  const int L = h.local, H = h.hosts;
  RingOrder local, rail;
  hierRings(h, &local, &rail);
  Schedule s;
  s.reduces = false;
  s.inputCount = count;
  s.outputCount = count * h.hostOf.size();
  // 1. Across the hosts on the rail: every rank of this local index's block, in place.
  for (size_t base = 0; base < count; base += piece) {
    const size_t bc = std::min(piece, count - base);
    ringPass(
        &s, rail, H, RingMode::kAllGather, [&](int) { return base; },
        [&](int q) { return static_cast<size_t>(q) * count + base; }, [&](int) { return bc; });
  }
  // 2. Inside the host, one ring per host k: local rank l's chunk is the block of host k's
  //    rank l, which it holds in its output since step 1 (it only sends it on). One ring
  //    after the other: in the same phases their first steps would put H pieces into one
  //    connection before its receiver takes any, more than its slots hold.
  const size_t inHostFirst = s.phases.size();
  for (int k = 0; k < H; ++k) {
    for (size_t base = 0; base < count; base += piece) {
      const size_t bc = std::min(piece, count - base);
      auto off = [&](int q) {
        return static_cast<size_t>(h.hostRanks[k][h.localOf[q]]) * count + base;
      };
      ringPass(&s, local, L, RingMode::kAllGather, off, off, [&](int) { return bc; });
    }
  }
  readOutput(&s, inHostFirst, true);
  return s;
}

Schedule hierReduceScatter(const Hierarchy& h, size_t count, size_t piece) {
  const int L = h.local, H = h.hosts;
  RingOrder local, rail;
  hierRings(h, &local, &rail);
  Schedule s;
  s.reduces = true;
  s.inputCount = count * h.hostOf.size();
  s.outputCount = count;
  const int railNext = rail.rankAt(rail.pos + 1), railPrev = rail.rankAt(rail.pos - 1);
  for (size_t base = 0; base < count; base += piece) {
    const size_t bc = std::min(piece, count - base);
    // Rail step t reduces the blocks of host d (the ring reduce-scatter's chunk order, this
    // host's own last); all local ranks of a host take the same d at the same step.
    for (int t = 0; t < H; ++t) {
      const int d = mod(h.hostIndex - t - 1, H);
      auto block = [&](int q) {
        return static_cast<size_t>(h.hostRanks[d][h.localOf[q]]) * count + base;
      };
      // The in-host ring reduce-scatter of host d's blocks; its last step, which completes
      // this host's sum of the block of host d's rank with this local index, goes on at
      // once as the rail's step: it adds what the rail's previous host summed and sends
      // the total on, or (host d is this one) writes the result.
      // (A hierarchy has L > 1: findHierarchy.)
      ringPass(
          &s, local, L, RingMode::kReduceScatter, block, [&](int) { return base; },
          [&](int) { return bc; });
      Step fused = s.phases.back().front();
      s.phases.pop_back();
      fused.final = false;
      fused.dst = Region{};
      if (t > 0) fused.recvFrom(railPrev);
      if (t < H - 1) {
        fused.sendTo(railNext);
      } else {
        fused.final = true;
        fused.dst = out(base);
      }
      s.phases.push_back(single(fused));
    }
  }
  return s;
}

Schedule doublingAllReduce(int r, int n, size_t count, size_t piece) {
  if (n == 1) return localOnly(count, count, count, true);
  if ((n & (n - 1)) != 0) return ringAllReduce(r, n, count, piece);
  Schedule s;
  s.reduces = true;
  s.inputCount = s.outputCount = count;
  // The rounds pipeline over the pieces: round j sends piece p in phase p + 2j and
  // receives it in phase p + 2j + 1, so each phase sends a piece while the piece before
  // arrives, in every round at once. A send of round j reads the output that round j - 1
  // received a phase earlier, and a receive overwrites it only in the phase after its own
  // round's send. A rank waits only on what its peers sent in earlier phases, and a
  // connection holds a few pieces at most, so bounded FIFOs cannot deadlock. One piece:
  // send, then receive, round after round.
  piece = std::max<size_t>(piece, 1);
  const size_t pieces = (count + piece - 1) / piece;
  int rounds = 0;
  while ((1 << rounds) < n) ++rounds;
  const size_t nphases = std::max<size_t>(pieces, 1) + 2 * static_cast<size_t>(rounds) - 1;
  for (size_t t = 0; t < nphases; ++t) {
    Phase phase;
    for (int j = 0; j < rounds; ++j) {
      const int mask = 1 << j;
      const bool first = j == 0;
      const size_t lag = 2 * static_cast<size_t>(j);
      // This round's receive of the piece it sent a phase ago, then its send of the next.
      for (int recvs = 1; recvs >= 0; --recvs) {
        if (t < lag + recvs || t - lag - recvs >= pieces) continue;
        const size_t base = (t - lag - recvs) * piece;
        Step st;
        st.src = first ? in(base) : out(base);
        st.srcPartial = !first;
        st.count = std::min(piece, count - base);
        if (recvs) {
          st.recvFrom(r ^ mask);
          st.dst = out(base);
          st.final = 2 * mask >= n;
        } else {
          st.sendTo(r ^ mask);
        }
        phase.push_back(st);
      }
    }
    if (!phase.empty()) s.phases.push_back(std::move(phase));
  }
  return s;
}

Schedule directAllReduce(int r, int n, size_t count, size_t piece) {
  if (n == 1) return localOnly(count, count, count, true);
  if (n - 1 > kMaxStepPeers) return ringAllReduce(r, n, count, piece);
  Schedule s;
  s.reduces = true;
  s.inputCount = s.outputCount = count;
  // Blocks of n chunks of at most one piece: each connection then carries two pieces a
  // block (a contribution, then a result), so FIFOs of two slots cannot deadlock. One
  // phase a block: steps sharing a connection take turns in the order below.
  const size_t block = piece * n;
  const size_t unit = chunkUnit(piece);
  for (size_t base = 0; base < count; base += block) {
    const size_t bc = std::min(block, count - base);
    auto chunk = [&](int c, size_t* off, size_t* size) {
      chunkRange(bc, n, c, off, size, unit);
      *off += base;
    };
    Phase phase;
    phase.reserve(2 * static_cast<size_t>(n) - 1);
    size_t off, size;
    for (int k = 1; k < n; ++k) {  // every other rank's chunk to its owner
      const int to = mod(r + k, n);
      chunk(to, &off, &size);
      Step send;
      send.src = in(off);
      send.count = size;
      send.sendTo(to);
      phase.push_back(send);
    }
    chunk(r, &off, &size);
    Step own;  // this rank's chunk: reduced here, then handed to every rank
    own.src = in(off);
    own.dst = out(off);
    own.count = size;
    own.final = true;
    for (int k = 1; k < n; ++k) own.recvFrom(mod(r - k, n));
    for (int k = 1; k < n; ++k) own.sendTo(mod(r + k, n));
    phase.push_back(own);
    for (int k = 1; k < n; ++k) {  // the other chunks' results
      const int from = mod(r - k, n);
      chunk(from, &off, &size);
      Step get;
      get.dst = out(off);
      get.count = size;
      get.recvFrom(from);
      phase.push_back(get);
    }
    s.phases.push_back(std::move(phase));
  }
  return s;
}

Schedule ringReduceScatter(int r, int n, size_t recvcount, size_t piece,
                           const std::vector<int>* ring) {
  if (n == 1) return localOnly(recvcount, recvcount, recvcount, true);
  const RingOrder ro = ringOrder(r, n, ring);
  Schedule s;
  s.reduces = true;
  s.inputCount = recvcount * n;
  s.outputCount = recvcount;
  for (size_t base = 0; base < recvcount; base += piece) {
    size_t bc = std::min(piece, recvcount - base);
    ringPass(
        &s, ro, n, RingMode::kReduceScatter,
        [&](int c) { return static_cast<size_t>(c) * recvcount + base; }, [&](int) { return base; },
        [&](int) { return bc; });
  }
  return s;
}

Schedule directReduceScatter(int r, int n, size_t recvcount, size_t piece) {
  if (n == 1) return localOnly(recvcount, recvcount, recvcount, true);
  if (n - 1 > kMaxStepPeers) return ringReduceScatter(r, n, recvcount, piece);
  Schedule s;
  s.reduces = true;
  s.inputCount = recvcount * n;
  s.outputCount = recvcount;
  piece = std::max<size_t>(piece, 1);
  for (size_t base = 0; base < recvcount; base += piece) {
    const size_t bc = std::min(piece, recvcount - base);
    Phase phase;
    phase.reserve(static_cast<size_t>(n));
    for (int k = 1; k < n; ++k) {  // each other rank's block to its owner
      const int to = mod(r + k, n);
      Step send;
      send.src = in(static_cast<size_t>(to) * recvcount + base);
      send.count = bc;
      send.sendTo(to);
      phase.push_back(send);
    }
    Step own;  // this rank's block: its input and every other rank's contribution
    own.src = in(static_cast<size_t>(r) * recvcount + base);
    own.dst = out(base);
    own.count = bc;
    own.final = true;
    for (int k = 1; k < n; ++k) own.recvFrom(mod(r - k, n));
    phase.push_back(own);
    s.phases.push_back(std::move(phase));
  }
  return s;
}

bool binomialTreesFit(int n) {
  return n >= 2 && std::has_single_bit(static_cast<unsigned>(n)) &&
         std::bit_width(static_cast<unsigned>(n)) - 1 <= kMaxStepPeers;
}

namespace {

// The highest bit in which a and b differ (a != b).
int highestDifference(int a, int b) {
  return static_cast<int>(std::bit_floor(static_cast<unsigned>(a ^ b)));
}

// One phase a piece of every block, the blocks in ascending order on every rank (what the
// binomial forms need: a connection then carries its blocks in the order its receiver
// takes them, and a block's steps wait only on the same block's steps of other ranks,
// further along its tree). step(b, base, count) is block b's step for that piece.
template <typename F>
void piecesOfEveryBlock(Schedule* s, int n, size_t count, size_t piece, F step) {
  piece = std::max<size_t>(piece, 1);
  for (size_t base = 0; base < count; base += piece) {
    Phase phase;
    phase.reserve(static_cast<size_t>(n));
    for (int b = 0; b < n; ++b) phase.push_back(step(b, base, std::min(piece, count - base)));
    s->phases.push_back(std::move(phase));
  }
}

}  // namespace

Schedule halvingReduceScatter(int r, int n, size_t recvcount, size_t piece) {
  if (n == 1) return localOnly(recvcount, recvcount, recvcount, true);
  if (!binomialTreesFit(n)) return ringReduceScatter(r, n, recvcount, piece);
  Schedule s;
  s.reduces = true;
  s.inputCount = recvcount * n;
  s.outputCount = recvcount;
  // Rank r sends partner r ^ d the blocks that agree with r above bit d and differ in it.
  piecesOfEveryBlock(&s, n, recvcount, piece, [&](int b, size_t base, size_t count) {
    Step st;
    st.src = in(static_cast<size_t>(b) * recvcount + base);
    st.count = count;
    // The partial sums of block b from the partners of the rounds before the one that
    // sends it on (all rounds for this rank's own block), in round order.
    const int sendAt = b == r ? 0 : highestDifference(b, r);
    for (int d = n >> 1; d > sendAt; d >>= 1) st.recvFrom(r ^ d);
    if (b == r) {
      st.dst = out(base);
      st.final = true;
    } else {
      st.sendTo(r ^ sendAt);
    }
    return st;
  });
  return s;
}

Schedule doublingAllGather(int r, int n, size_t sendcount, size_t piece) {
  if (!binomialTreesFit(n)) return ringAllGather(r, n, sendcount, piece);
  Schedule s;
  s.reduces = false;
  s.inputCount = sendcount;
  s.outputCount = sendcount * n;
  // Rank r sends partner r ^ d the blocks that agree with r from bit d up.
  piecesOfEveryBlock(&s, n, sendcount, piece, [&](int b, size_t base, size_t count) {
    Step st;
    st.dst = out(static_cast<size_t>(b) * sendcount + base);
    st.count = count;
    // Block b arrives over the highest bit in which b and r differ, and goes on over
    // every higher one; this rank's own block leaves over every bit.
    const int from = b == r ? 0 : highestDifference(b, r);
    if (b == r) {
      st.src = in(base);
    } else {
      st.recvFrom(r ^ from);
    }
    for (int d = from == 0 ? 1 : from << 1; d < n; d <<= 1) st.sendTo(r ^ d);
    return st;
  });
  return s;
}

Schedule ringAllGather(int r, int n, size_t sendcount, size_t piece, const std::vector<int>* ring) {
  Schedule s;
  s.reduces = false;
  s.inputCount = sendcount;
  s.outputCount = sendcount * n;
  if (n == 1) {
    Step st;
    st.src = in(0);
    st.dst = out(0);
    st.count = sendcount;
    s.phases.push_back(single(st));
    return s;
  }
  for (size_t base = 0; base < sendcount; base += piece) {
    size_t bc = std::min(piece, sendcount - base);
    ringPass(
        &s, ringOrder(r, n, ring), n, RingMode::kAllGather, [&](int) { return base; },
        [&](int c) { return static_cast<size_t>(c) * sendcount + base; }, [&](int) { return bc; });
  }
  return s;
}

namespace {

// Rank r's place in a chain from `root` along `ring` (rank order, or the topology's ring:
// each host's ranks together, whatever the placement): its distance from the root, and
// its neighbours towards the root and away from it.
struct ChainLinks {
  int pos = 0;
  int towardRoot = -1;
  int away = -1;
};

ChainLinks chainLinks(int r, int n, int root, const std::vector<int>* ring) {
  const RingOrder ro = ringOrder(r, n, ring);
  const int rootPos =
      static_cast<int>(std::find(ro.order.begin(), ro.order.end(), root) - ro.order.begin());
  ChainLinks c;
  c.pos = mod(ro.pos - rootPos, n);
  if (c.pos > 0) c.towardRoot = ro.rankAt(ro.pos - 1);
  if (c.pos < n - 1) c.away = ro.rankAt(ro.pos + 1);
  return c;
}

}  // namespace

Schedule chainBroadcast(int r, int n, size_t count, int root, const std::vector<int>* ring) {
  Schedule s;
  s.reduces = false;
  s.inputCount = r == root ? count : 0;
  s.outputCount = count;
  const ChainLinks c = chainLinks(r, n, root, ring);
  Step st;
  st.count = count;
  st.dst = out(0);
  if (c.pos == 0) {
    st.src = in(0);
  } else {
    st.recvFrom(c.towardRoot);
  }
  if (c.away >= 0) st.sendTo(c.away);
  s.phases.push_back(single(st));
  return s;
}

namespace {

// The root's label: the largest power of two <= n.
int treeRootLabel(int n) {
  int root = 1;
  while (root * 2 <= n) root *= 2;
  return root;
}

// The parent of label i (1-based) in the in-order tree of n labels; -1 for the root. The
// level of i is its lowest set bit k; its parent is i -/+ 2^k (towards the other side of
// bit k+1), and where that is past n, that label's parent in turn.
int treeParentLabel(int i, int n) {
  if (i == treeRootLabel(n)) return -1;
  int cur = i;
  int k = __builtin_ctz(static_cast<unsigned>(i));
  while (true) {
    const int step = 1 << k;
    const int par = (cur & (step << 1)) ? cur - step : cur + step;
    if (par <= n) return par;
    cur = par;
    k = __builtin_ctz(static_cast<unsigned>(cur));
  }
}

// The root of the subtree on labels [a, b]: the label there with the most trailing zeros.
int treeRangeRoot(int a, int b) {
  for (int p = treeRootLabel(b); p >= 1; p /= 2) {
    const int m = (a + p - 1) / p * p;
    if (m <= b) return m;
  }
  return a;
}

}  // namespace

TreeLinks binaryTree(int p, int n) {
  // In-order binary tree on 1-based labels i = p + 1. A level-k node spans the labels
  // within 2^k - 1 of it: its left child is i - 2^(k-1), its right child the root of
  // what is left of [i + 1, i + 2^k - 1] below n (the root's right side reaches n).
  TreeLinks t;
  const int i = p + 1;
  const int par = treeParentLabel(i, n);
  t.parent = par < 0 ? -1 : par - 1;
  const int k = __builtin_ctz(static_cast<unsigned>(i));
  if (k == 0) return t;
  t.children[t.nchildren++] = i - (1 << (k - 1)) - 1;
  const int hi = par < 0 ? n : std::min(n, i + (1 << k) - 1);
  if (i + 1 <= hi) t.children[t.nchildren++] = treeRangeRoot(i + 1, hi) - 1;
  return t;
}

int doubleTreePosition(int tree, int rank, int n) {
  if (tree == 0) return rank;
  return n % 2 == 0 ? n - 1 - rank : mod(rank + 1, n);
}

int doubleTreeRank(int tree, int position, int n) {
  if (tree == 0) return position;
  return n % 2 == 0 ? n - 1 - position : mod(position - 1, n);
}

int rootedTreePosition(int rank, int n, int root) {
  return mod(rank - root + treeRootLabel(n) - 1, n);
}

int rootedTreeRank(int position, int n, int root) {
  return mod(position - (treeRootLabel(n) - 1) + root, n);
}

Schedule treeBroadcast(int r, int n, size_t count, int root) {
  Schedule s;
  s.reduces = false;
  s.inputCount = r == root ? count : 0;
  s.outputCount = count;
  const TreeLinks t = binaryTree(rootedTreePosition(r, n, root), n);
  auto rankOf = [&](int pos) { return rootedTreeRank(pos, n, root); };
  Step st;
  st.count = count;
  st.dst = out(0);
  if (t.parent < 0) {
    st.src = in(0);
  } else {
    st.recvFrom(rankOf(t.parent));
  }
  for (int c = 0; c < t.nchildren; ++c) st.sendTo(rankOf(t.children[c]));
  s.phases.push_back(single(st));
  return s;
}

Schedule chainReduce(int r, int n, size_t count, int root, const std::vector<int>* ring) {
  Schedule s;
  s.reduces = true;
  s.inputCount = count;
  s.outputCount = r == root ? count : 0;
  const ChainLinks c = chainLinks(r, n, root, ring);
  Step st;
  st.count = count;
  st.src = in(0);
  if (c.away >= 0) st.recvFrom(c.away);
  if (c.pos == 0) {
    st.dst = out(0);
    st.final = true;
  } else {
    st.sendTo(c.towardRoot);
  }
  s.phases.push_back(single(st));
  return s;
}

Schedule treeReduce(int r, int n, size_t count, int root) {
  Schedule s;
  s.reduces = true;
  s.inputCount = count;
  s.outputCount = r == root ? count : 0;
  const TreeLinks t = binaryTree(rootedTreePosition(r, n, root), n);
  auto rankOf = [&](int pos) { return rootedTreeRank(pos, n, root); };
  Step st;
  st.count = count;
  st.src = in(0);
  for (int c = 0; c < t.nchildren; ++c) st.recvFrom(rankOf(t.children[c]));
  if (t.parent < 0) {
    st.dst = out(0);
    st.final = true;
  } else {
    st.sendTo(rankOf(t.parent));
  }
  s.phases.push_back(single(st));
  return s;
}

namespace {

// A rank's place in one tree of a double binary tree, in ranks: its parent (-1 at the
// root) and up to kMaxStepPeers children (a host's member of the tree across hosts has its
// host's chain below it beside two hosts).
struct RankLinks {
  int parent = -1;
  int children[kMaxStepPeers] = {-1, -1, -1};
  int nchildren = 0;
};
using TreeOf = std::function<RankLinks(int tree, int rank)>;

// The double binary tree over all ranks (in-order labels, tree 1 mirrored or shifted).
RankLinks inOrderLinks(int tree, int rank, int n) {
  const TreeLinks t = binaryTree(doubleTreePosition(tree, rank, n), n);
  RankLinks l;
  if (t.parent >= 0) l.parent = doubleTreeRank(tree, t.parent, n);
  for (int c = 0; c < t.nchildren; ++c)
    l.children[l.nchildren++] = doubleTreeRank(tree, t.children[c], n);
  return l;
}

// How many blocks the results going down trail the reductions going up, in the order in
// which steps take a connection they share. Without it, where one tree's reductions and
// the other's results share a connection (a leaf of one next to its parent, which is its
// child in the other), the next block's reduction waits there for this block's result,
// a round trip of the whole tree per block. Every rank orders its steps by the same slots,
// the roots too: a root reduces in one step and sends the result down in another, at the
// results' slot (Step::after orders the two). Two blocks: with FIFOs of two slots (the
// fewest LOOM_STEPS allows) the schedule simulator found lags up to 4 safe and 5
// deadlocking (2026-12-05, when a root still reduced and sent in one step; not rechecked
// since); at 8 network namespaces of 1 Gb/s (2026-12-05) 2 took the tree from 85 to
// 80 ms at 4 MiB and 1.3-1.7 to 1.1 ms at 64 KiB, 4 about 2 % more.
constexpr int kTreeLag = 2;

// Steps listed by slot (stable: in the order added within one), with Step::after given as
// the id of an earlier added step and turned into its index once sorted.
class Slotted {
 public:
  // Adds `st` at `slot`; returns its id. `after`: the id of a step it reads from, or -1.
  int add(size_t slot, Step st, int after = -1) {
    entries_.push_back({slot, static_cast<int>(entries_.size()), after, st});
    return entries_.back().id;
  }
  Phase phase(bool sort) {
    if (sort) {
      std::stable_sort(entries_.begin(), entries_.end(),
                       [](const Entry& a, const Entry& b) { return a.slot < b.slot; });
    }
    std::vector<int> indexOf(entries_.size());
    for (size_t i = 0; i < entries_.size(); ++i) indexOf[entries_[i].id] = static_cast<int>(i);
    Phase out;
    out.reserve(entries_.size());
    for (Entry& e : entries_) {
      e.step.after = e.after >= 0 ? indexOf[e.after] : -1;
      out.push_back(e.step);
    }
    return out;
  }

 private:
  struct Entry {
    size_t slot;
    int id, after;
    Step step;
  };
  std::vector<Entry> entries_;
};

// The all-reduce over two trees given by `links`, each carrying half of every block.
Schedule treeAllReduceOver(int r, size_t count, size_t piece, bool lagResults,
                           const TreeOf& links) {
  Schedule s;
  s.reduces = true;
  s.inputCount = s.outputCount = count;
  // All blocks go in one phase: steps sharing a connection take turns in phase order, so
  // the reduction streams up while results stream down. With a lag, a block's reduction
  // steps take slot 2 x block, its result steps slot 2 x (block + lag) + 1 (kTreeLag), and
  // the phase lists the steps by slot, the two trees in order within one. Without, the
  // steps stay in block order, each tree's reduction before its result, and a root
  // finishes the reduction and starts the broadcast in one pass.
  const int lag = lagResults ? kTreeLag : 0;
  Slotted slotted;
  const size_t block = 2 * piece;
  size_t bi = 0;
  for (size_t base = 0; base < count; base += block, ++bi) {
    size_t bc = std::min(block, count - base);
    const size_t upSlot = 2 * bi, downSlot = 2 * (bi + static_cast<size_t>(lag)) + 1;
    for (int tree = 0; tree < 2; ++tree) {
      size_t off, sz;
      chunkRange(bc, 2, tree, &off, &sz, chunkUnit(piece));
      off += base;
      const RankLinks t = links(tree, r);
      Step up;
      up.src = in(off);
      up.count = sz;
      for (int c = 0; c < t.nchildren; ++c) up.recvFrom(t.children[c]);
      Step down;
      down.count = sz;
      for (int c = 0; c < t.nchildren; ++c) down.sendTo(t.children[c]);
      if (t.parent >= 0) {
        up.sendTo(t.parent);
        slotted.add(upSlot, up);
        down.dst = out(off);
        down.recvFrom(t.parent);
        slotted.add(downSlot, down);
        continue;
      }
      up.final = true;
      up.dst = out(off);
      if (lag == 0) {
        for (int c = 0; c < t.nchildren; ++c) up.sendTo(t.children[c]);
        slotted.add(upSlot, up);
        continue;
      }
      const int reduced = slotted.add(upSlot, up);
      down.src = out(off);
      down.srcPartial = true;
      if (down.nsend > 0) slotted.add(downSlot, down, reduced);
    }
  }
  s.phases.push_back(slotted.phase(lag > 0));
  s.listedInOrder = lag > 0;
  return s;
}

}  // namespace

Schedule treeAllReduce(int r, int n, size_t count, size_t piece, bool lagResults) {
  if (n <= 2) return ringAllReduce(r, n, count, piece);
  return treeAllReduceOver(r, count, piece, lagResults,
                           [n](int tree, int rank) { return inOrderLinks(tree, rank, n); });
}

Schedule hostTreeAllReduce(const Hierarchy& h, size_t count, size_t piece, bool lagResults) {
  const int H = h.hosts, L = h.local;
  const int host = h.hostIndex, local = h.localIndex;
  // Each host's member of both trees is its local rank 0, with the chain local 1, ...,
  // L-1 below it in both: reductions go up the chain and results down it in both trees,
  // so on a connection inside a host the two trees' reductions never queue behind a result
  // (with opposite chains every block waited there for the last one's round trip).
  auto head = [&h](int hostIndex) { return h.hostRanks[hostIndex][0]; };
  const int below = local + 1 < L ? h.hostRanks[host][local + 1] : -1;
  const int above = local > 0 ? h.hostRanks[host][local - 1] : -1;
  if (!lagResults) {
    // One step a block and tree on every rank (the form splitByConnection takes).
    auto links = [&](int tree, int rank) {
      RankLinks l;
      if (rank != head(host)) {
        l.parent = above;
      } else {
        const TreeLinks ht = binaryTree(doubleTreePosition(tree, host, H), H);
        if (ht.parent >= 0) l.parent = head(doubleTreeRank(tree, ht.parent, H));
        for (int c = 0; c < ht.nchildren; ++c)
          l.children[l.nchildren++] = head(doubleTreeRank(tree, ht.children[c], H));
      }
      if (below >= 0) l.children[l.nchildren++] = below;
      return l;
    };
    return treeAllReduceOver(h.hostRanks[host][local], count, piece, false, links);
  }
  // Lagged (the host executor's form), and the member of each host reduces its chain's
  // part and its child hosts' in two steps (Step::after orders them), so that the next
  // block's chain part never waits behind a step that also waits for another host.
  Schedule s;
  s.reduces = true;
  s.inputCount = s.outputCount = count;
  Slotted slotted;
  const size_t block = 2 * piece;
  size_t bi = 0;
  for (size_t base = 0; base < count; base += block, ++bi) {
    const size_t bc = std::min(block, count - base);
    const size_t upSlot = 2 * bi, downSlot = 2 * (bi + static_cast<size_t>(kTreeLag)) + 1;
    for (int tree = 0; tree < 2; ++tree) {
      size_t off, sz;
      chunkRange(bc, 2, tree, &off, &sz, chunkUnit(piece));
      off += base;
      Step up;
      up.count = sz;
      Step down;
      down.count = sz;
      if (local > 0) {  // inside the chain: up towards local 0, the result back down
        up.src = in(off);
        if (below >= 0) up.recvFrom(below);
        up.sendTo(above);
        slotted.add(upSlot, up);
        down.dst = out(off);
        down.recvFrom(above);
        if (below >= 0) down.sendTo(below);
        slotted.add(downSlot, down);
        continue;
      }
      const TreeLinks ht = binaryTree(doubleTreePosition(tree, host, H), H);
      Step chain;  // the host's part: this rank's input and its chain's
      chain.src = in(off);
      chain.count = sz;
      if (below >= 0) chain.recvFrom(below);
      chain.dst = out(off);
      const int part = slotted.add(upSlot, chain);
      up.src = out(off);
      up.srcPartial = true;
      for (int c = 0; c < ht.nchildren; ++c) {
        const int kid = head(doubleTreeRank(tree, ht.children[c], H));
        up.recvFrom(kid);
        down.sendTo(kid);
      }
      if (below >= 0) down.sendTo(below);
      if (ht.parent >= 0) {
        const int parent = head(doubleTreeRank(tree, ht.parent, H));
        up.sendTo(parent);
        slotted.add(upSlot, up, part);
        down.dst = out(off);
        down.recvFrom(parent);
        slotted.add(downSlot, down);
        continue;
      }
      up.final = true;
      up.dst = out(off);
      const int reduced = slotted.add(upSlot, up, part);
      down.src = out(off);
      down.srcPartial = true;
      if (down.nsend > 0) slotted.add(downSlot, down, reduced);
    }
  }
  s.phases.push_back(slotted.phase(true));
  s.listedInOrder = true;
  return s;
}

namespace {

// Every rank exchanges `count` elements with every other at once: block `to` of the
// input (or the whole input, when `sameInputForAll`) goes to rank `to`, and rank `from`'s
// data lands in output block `from`. Peers go in a rotating order so that no rank is
// everyone's first target.
Schedule directExchange(int r, int n, size_t count, bool sameInputForAll) {
  auto inBlock = [&](int peer) { return sameInputForAll ? 0 : static_cast<size_t>(peer) * count; };
  Schedule s;
  s.reduces = false;
  s.inputCount = sameInputForAll ? count : count * n;
  s.outputCount = count * n;
  Phase phase;
  phase.reserve(2 * static_cast<size_t>(n) - 1);
  Step self;
  self.src = in(inBlock(r));
  self.dst = out(static_cast<size_t>(r) * count);
  self.count = count;
  phase.push_back(self);
  for (int k = 1; k < n; ++k) {
    int to = mod(r + k, n);
    int from = mod(r - k, n);
    Step send;
    send.src = in(inBlock(to));
    send.count = count;
    send.sendTo(to);
    phase.push_back(send);
    Step recv;
    recv.dst = out(static_cast<size_t>(from) * count);
    recv.count = count;
    recv.recvFrom(from);
    phase.push_back(recv);
  }
  s.phases.push_back(std::move(phase));
  return s;
}

}  // namespace

Schedule directAllToAll(int r, int n, size_t count) {
  return directExchange(r, n, count, false);
}

Schedule roundsAllToAll(int r, int n, size_t count, int peersPerPhase) {
  Schedule all = directExchange(r, n, count, false);
  const Phase& phase = all.phases[0];
  Schedule s;
  s.reduces = false;
  s.inputCount = all.inputCount;
  s.outputCount = all.outputCount;
  const int per = std::max(1, peersPerPhase);
  // phase[0] is the local copy; then (send to r + k, receive from r - k) for k = 1..n-1.
  for (int k = 1; k < n || s.phases.empty(); k += per) {
    Phase p;
    if (k == 1) p.push_back(phase[0]);
    for (int j = k; j < std::min(n, k + per); ++j) {
      p.push_back(phase[2 * j - 1]);
      p.push_back(phase[2 * j]);
    }
    s.phases.push_back(std::move(p));
  }
  return s;
}

Schedule directAllGather(int r, int n, size_t count) {
  return directExchange(r, n, count, true);
}

Schedule oneShotAllReduce(int r, int n, size_t count) {
  if (n == 1) return localOnly(count, count, count, true);
  Schedule s;
  s.reduces = true;
  s.inputCount = s.outputCount = count;
  // Two phases, so that the sum (which may write the input: in place) starts after the
  // send has read it; one block runs both, one after the other.
  Step send;  // the input (pre-op applied) to every other rank
  send.src = in(0);
  send.count = count;
  Step sum;  // every rank's, in rank order, this rank's own at its place
  sum.src = in(0);
  sum.dst = out(0);
  sum.count = count;
  sum.final = true;
  sum.srcAt = r;
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    send.sendTo(q);
    sum.recvFrom(q);
  }
  s.phases.push_back({send});
  s.phases.push_back({sum});
  return s;
}

}  // namespace loom::collectives
