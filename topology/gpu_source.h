// Where detection learns about GPUs beyond what sysfs shows: SM version, memory,
// NVLinks, and peer (P2P) access between GPUs. The live source is NVML plus the CUDA
// driver for P2P, both loaded with dlopen (no link-time dependency, so a binary runs on
// machines without a driver); tests and recorded trees use answers recorded as JSON
// (`loom/nvml.json` in a recorded tree, written by `loom-topo --record`).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "topology/reader.h"
#include "topology/system.h"

namespace loom::topology {

enum class NvLinkPeer { kGpu, kSwitch, kCpu, kUnknown };

struct NvLinkRecord {
  int link = 0;             // link number on this GPU
  std::string remoteBusId;  // normalized
  NvLinkPeer peer = NvLinkPeer::kUnknown;
};

struct GpuRecord {
  int index = -1;     // NVML index
  std::string busId;  // normalized
  std::string name;   // "NVIDIA H200"
  int sm = 0;         // 90
  uint64_t memoryBytes = 0;
  std::vector<NvLinkRecord> nvlinks;  // active links only
  // CUDA's peer access to the other GPUs it sees, by their bus id; nullopt when not
  // checked (no CUDA driver, answers recorded without them, a GPU hidden from CUDA).
  std::optional<std::vector<P2pPeer>> p2p;
};

class GpuSource {
 public:
  virtual ~GpuSource() = default;
  // All GPUs this source sees. kSystemError when the source is unavailable (the
  // message says why: library missing, driver not loaded, file missing).
  virtual Result<std::vector<GpuRecord>> query() = 0;
  virtual std::string name() const = 0;  // "NVML", "recorded NVML answers"
  // Why query()'s records carry no P2P answers (GpuRecord::p2p unset), for the one
  // warning detection gives: "cannot load libcuda.so.1 (...)". Asked only then.
  virtual std::string p2pUnavailable() const { return "no P2P answers from " + name(); }
};

// NVML through dlopen("libnvidia-ml.so.1"), and P2P access between the GPUs it lists
// from the CUDA driver (common/cuda_probe, dlopen("libcuda.so.1"); asked only when NVML
// lists two GPUs or more, matched to NVML's by bus id). Thread-compatible (use from one
// thread).
std::unique_ptr<GpuSource> makeNvmlSource();

// Answers recorded as JSON at `path`, read through `reader`.
std::unique_ptr<GpuSource> makeRecordedGpuSource(const Reader& reader, std::string path);

// Fills GpuRecord::p2p of `gpus` from the CUDA driver: for every ordered pair that CUDA
// sees (matched by bus id), cuDeviceCanAccessPeer and the P2P performance rank and
// native atomics. GPUs CUDA does not see keep p2p unset. kSystemError (the records
// untouched) when the driver is missing or fails; the message says why.
Status addCudaP2p(std::vector<GpuRecord>& gpus);

// The JSON that makeRecordedGpuSource reads: {"gpus": [{"index", "busid", "name", "sm",
// "memory_mib", "nvlinks": [{"link", "remote", "peer"}], "p2p": [{"peer" (bus id),
// "access", "rank", "atomics"}]}]}; "p2p" absent when not checked.
std::string gpuRecordsToJson(const std::vector<GpuRecord>& records);
Result<std::vector<GpuRecord>> gpuRecordsFromJson(const std::string& json);

}  // namespace loom::topology
