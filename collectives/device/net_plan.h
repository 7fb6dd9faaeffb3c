// A schedule (collectives/schedule.h) in the form the network executor's kernel reads:
// one flat block of plain structs (a header, the phases, the steps), placed in memory the
// GPU maps. Pure: it is built and checked on the CPU, and its tests run everywhere.
//
// The kernel gives each step of a phase a CUDA block of its own and runs the phases one
// after the other, so two steps of one phase must not use the same connection (peer and
// direction): nothing would order their slots. makeNetPlan checks that, and
// splitByConnection() turns a phase that breaks it into sub-phases: a step goes into the
// first sub-phase after every earlier step of its phase that shares a connection with it
// (for a group's Send/Recv calls, each on one connection: the k-th use of a connection in
// sub-phase k, on both of its ends), and after the step it reads from (Step::after). A
// schedule listed in order (Schedule::listedInOrder: the lagged trees) also keeps every
// step in or after the sub-phase of the step listed before it: the split plan then
// finishes wherever each rank running its steps one at a time in listed order would, which
// such a schedule's order is built for. The host executor instead lets such steps take
// turns on the connection; the schedule tests run every split schedule for 1-64 ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/schedule.h"
#include "collectives/tuner.h"
#include "common/host_device.h"
#include "common/status.h"

namespace loom::collectives::device {

struct NetStep {
  uint64_t srcOffset = 0;  // elements into the buffer (an address for Buffer::kAbsolute)
  uint64_t dstOffset = 0;
  uint64_t count = 0;     // elements
  uint8_t srcBuffer = 0;  // Buffer values
  uint8_t dstBuffer = 0;
  uint8_t nrecv = 0;
  uint8_t nsend = 0;
  uint8_t final = 0;
  uint8_t srcPartial = 0;
  uint8_t lane = 0;      // whose connections the peers below name (see NetLane)
  uint8_t srcAt = 0xff;  // Step::srcAt (0xff: first)
  int32_t recvPeers[kMaxStepPeers] = {-1, -1, -1};
  int32_t sendPeers[kMaxStepPeers] = {-1, -1, -1};
};
static_assert(sizeof(NetStep) == 56);

struct NetPhase {
  uint32_t firstStep = 0;
  uint32_t nsteps = 0;
};

// Lanes: independent schedules of one call (each on a part of the data), each with its
// own connections to every peer and its own blocks, so several pieces of one call cross
// the network at once without waiting on each other. A lane's phases run in order, with
// a barrier of the lane's blocks between them; lanes never wait on each other.
struct NetLane {
  uint32_t firstPhase = 0;
  uint32_t nphases = 0;
  uint32_t firstBlock = 0;
  uint32_t blocks = 0;  // the most steps of any of its phases
};

struct NetPlanHeader {
  uint32_t nlanes = 0;
  uint32_t nphases = 0;
  uint32_t nsteps = 0;
  uint32_t blocks = 0;   // every lane's: the kernel's grid
  uint32_t reduces = 0;  // the schedule reduces (pre-op on sources, recv data combined)
  uint32_t pad = 0;
  uint64_t pieceElems = 0;
  uint64_t bytes = 0;  // of the whole plan
  // Then NetLane[nlanes], NetPhase[nphases] and NetStep[nsteps], each 8-byte aligned.
};

LOOM_HOST_DEVICE inline const NetLane* netLanes(const NetPlanHeader* h) {
  return reinterpret_cast<const NetLane*>(h + 1);
}
LOOM_HOST_DEVICE inline const NetPhase* netPhases(const NetPlanHeader* h) {
  return reinterpret_cast<const NetPhase*>(netLanes(h) + h->nlanes);
}
LOOM_HOST_DEVICE inline const NetStep* netSteps(const NetPlanHeader* h) {
  const size_t phaseBytes = (size_t(h->nphases) * sizeof(NetPhase) + 7) / 8 * 8;
  return reinterpret_cast<const NetStep*>(reinterpret_cast<const char*>(netPhases(h)) + phaseBytes);
}

// The most blocks a plan's phases may take at once (each step a CUDA block, all
// resident together), and the most lanes.
inline constexpr uint32_t kNetMaxBlocks = 64;
inline constexpr uint32_t kNetMaxLanes = 8;

// The plan's bytes (8-byte aligned, starting with the header), one lane per schedule.
// Steps without elements are left out. Fails (kInternalError) when a phase uses a
// connection twice, or the lanes take more than kNetMaxBlocks blocks or kNetMaxLanes.
Result<std::vector<uint64_t>> makeNetPlan(const std::vector<Schedule>& lanes, size_t pieceElems);
inline Result<std::vector<uint64_t>> makeNetPlan(const Schedule& schedule, size_t pieceElems) {
  return makeNetPlan(std::vector<Schedule>{schedule}, pieceElems);
}

// The schedule with every phase whose steps share a connection split as described above.
Schedule splitByConnection(const Schedule& schedule);

// The schedule the network executor runs for a collective: the host's (buildSchedule),
// the all-to-all in rounds where a phase would take more than kNetMaxBlocks blocks, and
// split by connection.
Schedule netSchedule(const CollRequest& req, Algorithm algo);

// The same in `lanes` lanes where the collective's buffers are one contiguous range on
// every rank (all-reduce, broadcast, reduce): lane l takes part l of the elements, its
// parts starting on 16-byte boundaries; one lane otherwise, or when there is less than
// one 16-byte vector per lane; fewer lanes where theirs would take more than
// kNetMaxBlocks blocks at once.
std::vector<Schedule> netLaneSchedules(const CollRequest& req, Algorithm algo, int lanes);

// A connection of a plan: to (or from) `peer`, of lane `lane`.
struct NetLink {
  int peer = -1;
  int lane = 0;
  bool operator==(const NetLink& o) const { return peer == o.peer && lane == o.lane; }
  bool operator<(const NetLink& o) const { return lane != o.lane ? lane < o.lane : peer < o.peer; }
};

// The connections a plan sends on and receives on (sorted, unique).
void netPlanLinks(const NetPlanHeader* plan, std::vector<NetLink>* sends,
                  std::vector<NetLink>* recvs);

}  // namespace loom::collectives::device
