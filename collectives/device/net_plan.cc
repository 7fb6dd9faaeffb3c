#include "collectives/device/net_plan.h"

#include <algorithm>
#include <cstring>
#include <map>

namespace loom::collectives::device {

namespace {

// The connections a step uses: (peer << 1) | isSend.
template <typename F>
void forConnections(const Step& st, F&& f) {
  for (int j = 0; j < st.nrecv; ++j) f(st.recvPeers[j] << 1);
  for (int j = 0; j < st.nsend; ++j) f((st.sendPeers[j] << 1) | 1);
}

}  // namespace

Schedule splitByConnection(const Schedule& schedule) {
  Schedule out;
  out.reduces = schedule.reduces;
  out.inputCount = schedule.inputCount;
  out.outputCount = schedule.outputCount;
  out.listedInOrder = schedule.listedInOrder;
  for (const Phase& phase : schedule.phases) {
    std::map<int, int> uses;  // connection -> steps of this phase that used it so far
    std::vector<Phase> subs;
    std::vector<int> subOf(phase.size(), -1);  // each step's sub-phase
    int floor = 0;  // listedInOrder: the sub-phase of the step listed last
    for (size_t i = 0; i < phase.size(); ++i) {
      const Step& st = phase[i];
      if (st.count == 0) continue;
      int sub = schedule.listedInOrder ? floor : 0;
      forConnections(st, [&](int c) { sub = std::max(sub, uses[c]); });
      // After the step whose results it reads (sub-phases run one after the other).
      if (st.after >= 0 && subOf[st.after] >= 0) sub = std::max(sub, subOf[st.after] + 1);
      forConnections(st, [&](int c) { uses[c] = sub + 1; });
      floor = sub;
      if (static_cast<int>(subs.size()) <= sub) subs.resize(sub + 1);
      subOf[i] = sub;
      subs[sub].push_back(st);
      subs[sub].back().after = -1;
    }
    for (auto& s : subs) out.phases.push_back(std::move(s));
  }
  return out;
}

Result<std::vector<uint64_t>> makeNetPlan(const std::vector<Schedule>& schedules,
                                          size_t pieceElems) {
  if (schedules.empty() || schedules.size() > kNetMaxLanes) {
    return errorf(Code::kInternalError, "network plan: %zu lanes (1 to %u)", schedules.size(),
                  kNetMaxLanes);
  }
  std::vector<NetLane> lanes;
  std::vector<NetPhase> phases;
  std::vector<NetStep> steps;
  uint32_t blocks = 0;
  bool reduces = false;
  for (size_t l = 0; l < schedules.size(); ++l) {
    const Schedule& schedule = schedules[l];
    reduces = reduces || schedule.reduces;
    NetLane lane;
    lane.firstPhase = static_cast<uint32_t>(phases.size());
    lane.firstBlock = blocks;
    lane.blocks = 1;
    for (size_t p = 0; p < schedule.phases.size(); ++p) {
      NetPhase ph;
      ph.firstStep = static_cast<uint32_t>(steps.size());
      std::vector<int> used;
      for (const Step& st : schedule.phases[p]) {
        if (st.count == 0) continue;
        bool clash = false;
        forConnections(st, [&](int c) {
          clash = clash || std::find(used.begin(), used.end(), c) != used.end();
          used.push_back(c);
        });
        if (clash) {
          return errorf(Code::kInternalError,
                        "network plan: two steps of phase %zu use one connection (split it first)",
                        p);
        }
        NetStep n;
        n.srcOffset = st.src.offset;
        n.dstOffset = st.dst.offset;
        n.count = st.count;
        n.srcBuffer = static_cast<uint8_t>(st.src.buffer);
        n.dstBuffer = static_cast<uint8_t>(st.dst.buffer);
        n.nrecv = static_cast<uint8_t>(st.nrecv);
        n.nsend = static_cast<uint8_t>(st.nsend);
        n.final = st.final ? 1 : 0;
        n.srcPartial = st.srcPartial ? 1 : 0;
        n.lane = static_cast<uint8_t>(l);
        n.srcAt = st.srcAt >= 0 ? static_cast<uint8_t>(st.srcAt) : uint8_t{0xff};
        for (int j = 0; j < kMaxStepPeers; ++j) {
          n.recvPeers[j] = j < st.nrecv ? st.recvPeers[j] : -1;
          n.sendPeers[j] = j < st.nsend ? st.sendPeers[j] : -1;
        }
        steps.push_back(n);
      }
      ph.nsteps = static_cast<uint32_t>(steps.size()) - ph.firstStep;
      if (ph.nsteps == 0) continue;
      lane.blocks = std::max(lane.blocks, ph.nsteps);
      phases.push_back(ph);
    }
    lane.nphases = static_cast<uint32_t>(phases.size()) - lane.firstPhase;
    blocks += lane.blocks;
    lanes.push_back(lane);
  }
  if (blocks > kNetMaxBlocks) {
    return errorf(Code::kInternalError, "network plan: %u blocks at once (at most %u)", blocks,
                  kNetMaxBlocks);
  }
  NetPlanHeader h;
  h.nlanes = static_cast<uint32_t>(lanes.size());
  h.nphases = static_cast<uint32_t>(phases.size());
  h.nsteps = static_cast<uint32_t>(steps.size());
  h.blocks = blocks;
  h.reduces = reduces ? 1 : 0;
  h.pieceElems = std::max<size_t>(1, pieceElems);
  const size_t laneBytes = lanes.size() * sizeof(NetLane);
  const size_t phaseBytes = (phases.size() * sizeof(NetPhase) + 7) / 8 * 8;
  h.bytes = sizeof(NetPlanHeader) + laneBytes + phaseBytes + steps.size() * sizeof(NetStep);
  std::vector<uint64_t> out((h.bytes + 7) / 8, 0);
  char* base = reinterpret_cast<char*>(out.data());
  std::memcpy(base, &h, sizeof(h));
  std::memcpy(base + sizeof(h), lanes.data(), laneBytes);
  if (!phases.empty())
    std::memcpy(base + sizeof(h) + laneBytes, phases.data(), phases.size() * sizeof(NetPhase));
  if (!steps.empty()) {
    std::memcpy(base + sizeof(h) + laneBytes + phaseBytes, steps.data(),
                steps.size() * sizeof(NetStep));
  }
  return out;
}

Schedule netSchedule(const CollRequest& deviceReq, Algorithm algo) {
  // GPU buffers: the schedules' forms for them (CollRequest::device).
  CollRequest req = deviceReq;
  req.device = true;
  // A direct all-to-all takes a block per peer and direction: with many ranks, in rounds.
  if (req.type == CollType::kAllToAll && 2 * req.nranks - 1 > static_cast<int>(kNetMaxBlocks)) {
    return splitByConnection(
        roundsAllToAll(req.rank, req.nranks, req.count, kNetMaxBlocks / 2 - 1));
  }
  return splitByConnection(buildSchedule(req, algo));
}

std::vector<Schedule> netLaneSchedules(const CollRequest& req, Algorithm algo, int lanes) {
  // Lane l takes the l-th share of every rank's block: of the whole buffer for all-reduce,
  // broadcast and reduce; of each of the nranks blocks of all-gather's output and
  // reduce-scatter's input (the other buffer is one block).
  const bool contiguous = req.type == CollType::kAllReduce || req.type == CollType::kBroadcast ||
                          req.type == CollType::kReduce;
  const bool blocked = req.type == CollType::kAllGather || req.type == CollType::kReduceScatter;
  const size_t vec = std::max<size_t>(1, 16 / std::max<size_t>(1, req.elemSize));
  const size_t vectors = req.count / vec;
  lanes = std::clamp(lanes, 1, static_cast<int>(kNetMaxLanes));
  if (!(contiguous || blocked) || lanes == 1 || vectors < static_cast<size_t>(lanes)) {
    return {netSchedule(req, algo)};
  }
  const Buffer blockedBuffer = req.type == CollType::kAllGather ? Buffer::kOutput : Buffer::kInput;
  std::vector<Schedule> out;
  for (int l = 0; l < lanes; ++l) {
    size_t first, n;  // whole vectors; the last lane also takes the tail
    chunkRange(req.count, lanes, l, &first, &n, vec);
    CollRequest part = req;
    part.count = n;
    Schedule s = netSchedule(part, algo);
    for (Phase& ph : s.phases) {
      for (Step& st : ph) {
        for (Region* r : {&st.src, &st.dst}) {
          if (r->buffer != Buffer::kInput && r->buffer != Buffer::kOutput) continue;
          if (!blocked || r->buffer != blockedBuffer) {
            r->offset += first;
            continue;
          }
          // Block b of the part is block b of the whole, `first` elements in. A step that
          // spans blocks cannot be split this way.
          const size_t b = r->offset / n;
          if (st.count > 0 && (r->offset + st.count - 1) / n != b) return {netSchedule(req, algo)};
          r->offset = b * req.count + first + r->offset % n;
        }
      }
    }
    s.inputCount = req.count * (blocked && blockedBuffer == Buffer::kInput ? req.nranks : 1);
    s.outputCount = req.count * (blocked && blockedBuffer == Buffer::kOutput ? req.nranks : 1);
    out.push_back(std::move(s));
  }
  // A lane takes a block for each step of its fullest phase, and every lane's blocks run
  // at once: where they would be more than kNetMaxBlocks (recursive doubling's pipelined
  // rounds on many ranks, the direct forms with 8 lanes), as many lanes as fit.
  uint32_t blocks = 0, widest = 1;
  for (const Schedule& s : out) {
    uint32_t lane = 1;
    for (const Phase& ph : s.phases) {
      lane = std::max<uint32_t>(
          lane, static_cast<uint32_t>(std::count_if(ph.begin(), ph.end(),
                                                    [](const Step& st) { return st.count > 0; })));
    }
    blocks += lane;
    widest = std::max(widest, lane);
  }
  if (blocks > kNetMaxBlocks) {
    return netLaneSchedules(req, algo,
                            std::max<int>(1, std::min<int>(lanes - 1, kNetMaxBlocks / widest)));
  }
  return out;
}

void netPlanLinks(const NetPlanHeader* plan, std::vector<NetLink>* sends,
                  std::vector<NetLink>* recvs) {
  sends->clear();
  recvs->clear();
  const NetStep* steps = netSteps(plan);
  for (uint32_t i = 0; i < plan->nsteps; ++i) {
    for (int j = 0; j < steps[i].nsend; ++j)
      sends->push_back({steps[i].sendPeers[j], steps[i].lane});
    for (int j = 0; j < steps[i].nrecv; ++j)
      recvs->push_back({steps[i].recvPeers[j], steps[i].lane});
  }
  for (auto* v : {sends, recvs}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
}

}  // namespace loom::collectives::device
