// JSON output (--json FILE): the configuration, the devices, every row and the summary, in
// nccl-tests' JSON layout (version 1) with a few loom keys added (and --compare's: "compare"
// in the header, "nccl_out_of_place", "nccl_in_place" and "bus_bw_ratio" in each row,
// "nccl_out_of_bounds", "nccl_average_bus_bandwidth" and "bus_bw_ratio" in the summary).
// Written with fprintf.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "perf_tests/harness/args.h"

namespace loom::perf {

// A streaming writer that places commas and checks nothing else; keys and strings are escaped.
class JsonWriter {
 public:
  explicit JsonWriter(FILE* file) : file_(file) {}

  void beginObject();
  void endObject();
  void beginArray();
  void endArray();
  void key(std::string_view name);
  void string(std::string_view text);
  void integer(long long value);
  void number(double value);  // non-finite values become null
  void boolean(bool value);
  void null();

 private:
  void beforeValue();

  FILE* file_;
  std::vector<int> counts_;  // values written so far at each open level
  bool afterKey_ = false;
};

// Escapes quotes, backslashes and control characters for a JSON string body.
std::string jsonEscape(std::string_view text);

struct Measurement {
  double timeUsec = 0;
  double algBw = 0;
  double busBw = 0;
  bool checked = false;
  int64_t wrong = 0;
};

struct ResultRow {
  size_t bytes = 0;
  size_t count = 0;
  std::string type;
  std::string op;
  int root = -1;
  Measurement outOfPlace;
  Measurement inPlace;
  int iterations = 0;
  // --compare: the same calls on the compared library (NCCL); absent otherwise.
  std::optional<Measurement> comparedOutOfPlace;
  std::optional<Measurement> comparedInPlace;
};

// --compare's totals for the footer and the JSON summary.
struct CompareSummary {
  int64_t errors = 0;       // the compared library's measurements with a nonzero #wrong
  double avgBusBw = 0;      // its average bus bandwidth, GB/s
  double avgRatio = 0;      // loom's average busbw / its average busbw
  double geomeanRatio = 0;  // geometric mean of the per-measurement loom/NCCL ratios
};

struct DeviceInfo {
  int rank = 0;
  int group = 0;
  int pid = 0;
  std::string host;
  int device = -1;
  std::string busId;
  std::string name;
};

struct RunInfo {
  std::string program;     // "all_reduce_perf"
  std::string collective;  // "AllReduce"
  std::vector<std::string> args;
  int libraryVersion = 0;
  std::string memory;  // "host" or "device"
  int nranks = 0;
  int nprocs = 1;
  // --compare: the compared library's file and ncclGetVersion; comparePath empty otherwise.
  std::string comparePath;
  int compareVersion = 0;
};

// Writes a whole report. Usage: open(), config(), rows as they come, finish().
class JsonReport {
 public:
  JsonReport() = default;
  ~JsonReport();
  JsonReport(const JsonReport&) = delete;
  JsonReport& operator=(const JsonReport&) = delete;

  // Opens `path` for writing; false (and a message) when it cannot be created.
  bool open(const std::string& path, std::string* error);
  bool isOpen() const { return file_ != nullptr; }
  void config(const RunInfo& run, const Options& options, const std::vector<DeviceInfo>& devices);
  void row(const ResultRow& row, bool reportCputime);
  // Closes the results list and writes the summary (with --compare's when `compare` is set);
  // closes the file.
  void finish(int64_t errors, double avgBusBw, double minBw, const std::string& lastError,
              const CompareSummary* compare = nullptr);

 private:
  FILE* file_ = nullptr;
  std::optional<JsonWriter> writer_;
};

}  // namespace loom::perf
