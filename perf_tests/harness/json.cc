#include "perf_tests/harness/json.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>

#include "perf_tests/harness/collective.h"
#include "perf_tests/harness/version.h"

namespace loom::perf {
namespace {

std::string nowText() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

void writeMeasurement(JsonWriter& w, const Measurement& m, bool reportCputime) {
  w.beginObject();
  w.key(reportCputime ? "cpu_time" : "time");
  w.number(m.timeUsec);
  w.key("alg_bw");
  w.number(m.algBw);
  w.key("bus_bw");
  w.number(m.busBw);
  w.key("nwrong");
  if (m.checked) {
    w.integer(m.wrong);
  } else {
    w.null();
  }
  w.endObject();
}

}  // namespace

// ---- JsonWriter ----

void JsonWriter::beforeValue() {
  if (afterKey_) {
    afterKey_ = false;
    return;
  }
  if (!counts_.empty() && counts_.back()++ > 0) std::fputc(',', file_);
}

void JsonWriter::beginObject() {
  beforeValue();
  std::fputc('{', file_);
  counts_.push_back(0);
}

void JsonWriter::endObject() {
  counts_.pop_back();
  std::fputc('}', file_);
}

void JsonWriter::beginArray() {
  beforeValue();
  std::fputc('[', file_);
  counts_.push_back(0);
}

void JsonWriter::endArray() {
  counts_.pop_back();
  std::fputc(']', file_);
}

void JsonWriter::key(std::string_view name) {
  beforeValue();
  std::fprintf(file_, "\"%s\":", jsonEscape(name).c_str());
  afterKey_ = true;
}

void JsonWriter::string(std::string_view text) {
  beforeValue();
  std::fprintf(file_, "\"%s\"", jsonEscape(text).c_str());
}

void JsonWriter::integer(long long value) {
  beforeValue();
  std::fprintf(file_, "%lld", value);
}

void JsonWriter::number(double value) {
  beforeValue();
  if (std::isfinite(value)) {
    std::fprintf(file_, "%.9g", value);
  } else {
    std::fputs("null", file_);
  }
}

void JsonWriter::boolean(bool value) {
  beforeValue();
  std::fputs(value ? "true" : "false", file_);
}

void JsonWriter::null() {
  beforeValue();
  std::fputs("null", file_);
}

std::string jsonEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (u < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", u);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

// ---- JsonReport ----

JsonReport::~JsonReport() {
  if (file_ != nullptr) std::fclose(file_);
}

bool JsonReport::open(const std::string& path, std::string* error) {
  file_ = std::fopen(path.c_str(), "w");
  if (file_ == nullptr) {
    *error = "cannot write JSON output to " + path + ": " + std::strerror(errno);
    return false;
  }
  writer_.emplace(file_);
  return true;
}

void JsonReport::config(const RunInfo& run, const Options& o,
                        const std::vector<DeviceInfo>& devices) {
  if (!writer_) return;
  JsonWriter& w = *writer_;
  w.beginObject();  // closed by finish()
  w.key("version");
  w.integer(1);
  w.key("start_time");
  w.string(nowText());
  w.key("args");
  w.beginArray();
  for (const std::string& a : run.args) w.string(a);
  w.endArray();
  w.key("nccl_version");
  w.integer(run.libraryVersion);
  w.key("loom_perf_tests_version");
  w.string(kPerfTestsVersion);
  if (!run.comparePath.empty()) {
    w.key("compare");
    w.beginObject();
    w.key("library");
    w.string("nccl");
    w.key("path");
    w.string(run.comparePath);
    w.key("nccl_version");
    w.integer(run.compareVersion);
    w.endObject();
  }
  w.key("program");
  w.string(run.program);
  w.key("collective");
  w.string(run.collective);

  w.key("config");
  w.beginObject();
  w.key("nthreads");
  w.integer(o.nThreads);
  w.key("ngpus");
  w.integer(o.nGpus);
  w.key("nprocs");
  w.integer(run.nprocs);
  w.key("nranks");
  w.integer(run.nranks);
  w.key("minimum_bytes");
  w.integer(static_cast<long long>(o.minBytes));
  w.key("maximum_bytes");
  w.integer(static_cast<long long>(o.maxBytes));
  if (o.stepFactor > 1) {
    w.key("step_factor");
    w.integer(static_cast<long long>(o.stepFactor));
  } else {
    w.key("step_bytes");
    w.integer(static_cast<long long>(o.stepBytes));
  }
  w.key("warmup_iters");
  w.integer(o.warmupIters);
  w.key("iterations");
  w.integer(o.iters);
  w.key("aggregated_iterations");
  w.integer(o.aggIters);
  w.key("run_cycles");
  w.integer(o.runCycles);
  w.key("validation");
  w.integer(o.check);
  w.key("graph");
  w.integer(o.graphLaunches);
  w.key("blocking_collectives");
  w.boolean(o.blocking);
  w.key("parallel_init");
  w.boolean(o.parallelInit);
  w.key("average");
  w.integer(o.average);
  w.key("local_register");
  w.integer(o.registration);
  w.key("memory");
  w.string(run.memory);
  w.key("devices");
  w.beginArray();
  for (const DeviceInfo& d : devices) {
    w.beginObject();
    w.key("rank");
    w.integer(d.rank);
    w.key("group");
    w.integer(d.group);
    w.key("pid");
    w.integer(d.pid);
    w.key("hostname");
    w.string(d.host);
    w.key("device");
    w.integer(d.device);
    w.key("device_hex");
    w.string(d.busId);
    w.key("device_info");
    w.string(d.name);
    w.endObject();
  }
  w.endArray();
  w.endObject();  // config

  w.key("results");
  w.beginArray();  // closed by finish()
  std::fflush(file_);
}

void JsonReport::row(const ResultRow& r, bool reportCputime) {
  if (!writer_) return;
  JsonWriter& w = *writer_;
  w.beginObject();
  w.key("size");
  w.integer(static_cast<long long>(r.bytes));
  w.key("count");
  w.integer(static_cast<long long>(r.count));
  w.key("type");
  w.string(r.type);
  w.key("redop");
  w.string(r.op);
  w.key("root");
  w.integer(r.root);
  w.key("out_of_place");
  writeMeasurement(w, r.outOfPlace, reportCputime);
  w.key("in_place");
  writeMeasurement(w, r.inPlace, reportCputime);
  if (r.comparedOutOfPlace && r.comparedInPlace) {
    w.key("nccl_out_of_place");
    writeMeasurement(w, *r.comparedOutOfPlace, reportCputime);
    w.key("nccl_in_place");
    writeMeasurement(w, *r.comparedInPlace, reportCputime);
    w.key("bus_bw_ratio");  // loom / NCCL; null when undefined
    w.beginObject();
    w.key("out_of_place");
    w.number(bandwidthRatio(r.outOfPlace.algBw, r.comparedOutOfPlace->algBw));
    w.key("in_place");
    w.number(bandwidthRatio(r.inPlace.algBw, r.comparedInPlace->algBw));
    w.endObject();
  }
  w.key("actual_iterations");
  w.integer(r.iterations);
  w.key("experiment_name");
  w.string("");
  w.endObject();
  std::fflush(file_);
}

void JsonReport::finish(int64_t errors, double avgBusBw, double minBw, const std::string& lastError,
                        const CompareSummary* compare) {
  if (!writer_) return;
  JsonWriter& w = *writer_;
  w.endArray();  // results
  w.key("out_of_bounds");
  w.beginObject();
  w.key("count");
  w.integer(errors);
  w.key("okay");
  w.boolean(errors == 0);
  w.endObject();
  w.key("average_bus_bandwidth");
  w.beginObject();
  w.key("bandwidth");
  w.number(avgBusBw);
  w.key("okay");
  if (minBw < 0) {
    w.string("unchecked");
  } else {
    w.boolean(avgBusBw >= minBw * 0.9);
  }
  w.endObject();
  if (compare != nullptr) {
    w.key("nccl_out_of_bounds");
    w.beginObject();
    w.key("count");
    w.integer(compare->errors);
    w.key("okay");
    w.boolean(compare->errors == 0);
    w.endObject();
    w.key("nccl_average_bus_bandwidth");
    w.beginObject();
    w.key("bandwidth");
    w.number(compare->avgBusBw);
    w.endObject();
    w.key("bus_bw_ratio");
    w.beginObject();
    w.key("average");
    w.number(compare->avgRatio);
    w.key("geometric_mean");
    w.number(compare->geomeanRatio);
    w.endObject();
  }
  w.key("errors");
  w.beginArray();
  if (!lastError.empty()) w.string(lastError);
  w.endArray();
  w.key("end_time");
  w.string(nowText());
  w.endObject();
  std::fputc('\n', file_);
  std::fclose(file_);
  file_ = nullptr;
  writer_.reset();
}

}  // namespace loom::perf
