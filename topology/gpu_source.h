// Where detection learns about GPUs beyond what sysfs shows: SM version, memory and
// NVLinks. The live source is NVML loaded with dlopen (no link-time dependency, so a
// binary runs on machines without a driver); tests and recorded trees use answers
// recorded as JSON (`loom/nvml.json` in a recorded tree, written by
// `loom-topo --record`).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "topology/reader.h"

namespace loom::topology {

enum class NvLinkPeer { kGpu, kSwitch, kCpu, kUnknown };

struct NvLinkRecord {
  int link = 0;             // link number on this GPU
  std::string remoteBusId;  // normalized
  NvLinkPeer peer = NvLinkPeer::kUnknown;
};

struct GpuRecord {
  int index = -1;           // NVML index
  std::string busId;        // normalized
  std::string name;         // "NVIDIA H200"
  int sm = 0;               // 90
  uint64_t memoryBytes = 0;
  std::vector<NvLinkRecord> nvlinks;  // active links only
};

class GpuSource {
 public:
  virtual ~GpuSource() = default;
  // All GPUs this source sees. kSystemError when the source is unavailable (the
  // message says why: library missing, driver not loaded, file missing).
  virtual Result<std::vector<GpuRecord>> query() = 0;
  virtual std::string name() const = 0;  // "NVML", "recorded NVML answers"
};

// NVML through dlopen("libnvidia-ml.so.1"). Thread-compatible (use from one thread).
std::unique_ptr<GpuSource> makeNvmlSource();

// Answers recorded as JSON at `path`, read through `reader`.
std::unique_ptr<GpuSource> makeRecordedGpuSource(const Reader& reader, std::string path);

// The JSON that makeRecordedGpuSource reads.
std::string gpuRecordsToJson(const std::vector<GpuRecord>& records);
Result<std::vector<GpuRecord>> gpuRecordsFromJson(const std::string& json);

}  // namespace loom::topology
