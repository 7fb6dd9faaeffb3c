#include "perf_tests/harness/json.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#ifdef LOOM_PERF_TEST_HAVE_NLOHMANN
#include <nlohmann/json.hpp>
#endif

namespace loom::perf {
namespace {

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(Json, Escape) {
  EXPECT_EQ(jsonEscape("plain"), "plain");
  EXPECT_EQ(jsonEscape("a\"b\\c\n\t"), "a\\\"b\\\\c\\n\\t");
  EXPECT_EQ(jsonEscape(std::string("\x01", 1)), "\\u0001");
}

TEST(Json, WriterPlacesCommas) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  JsonWriter w(f);
  w.beginObject();
  w.key("a");
  w.integer(1);
  w.key("b");
  w.beginArray();
  w.number(1.5);
  w.string("x");
  w.null();
  w.boolean(true);
  w.number(1.0 / 0.0);
  w.endArray();
  w.key("c");
  w.beginObject();
  w.endObject();
  w.endObject();
  std::rewind(f);
  char buf[256] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  EXPECT_EQ(std::string(buf, n), R"({"a":1,"b":[1.5,"x",null,true,null],"c":{}})");
}

TEST(Json, ReportHasConfigRowsAndSummary) {
  const std::string path = ::testing::TempDir() + "/perf_report_test.json";
  JsonReport report;
  std::string error;
  ASSERT_TRUE(report.open(path, &error)) << error;
  Options o;
  o.nGpus = 4;
  RunInfo run;
  run.program = "all_reduce_perf";
  run.collective = "AllReduce";
  run.args = {"all_reduce_perf", "-g", "4"};
  run.libraryVersion = 22809;
  run.memory = "host";
  run.nranks = 4;
  std::vector<DeviceInfo> devices(4);
  for (int i = 0; i < 4; ++i) {
    devices[i].rank = i;
    devices[i].host = "h";
    devices[i].busId = "host";
    devices[i].name = "host memory";
  }
  report.config(run, o, devices);
  for (int i = 0; i < 2; ++i) {
    ResultRow row;
    row.bytes = 1024u << i;
    row.count = 256u << i;
    row.type = "float";
    row.op = "sum";
    row.root = -1;
    row.outOfPlace = {12.5, 0.08, 0.12, true, 0};
    row.inPlace = {11.0, 0.09, 0.14, false, 0};
    row.iterations = 20;
    report.row(row, false);
  }
  report.finish(0, 0.13, -1, "");
  const std::string text = readFile(path);
  EXPECT_NE(text.find("\"results\":[{\"size\":1024,\"count\":256"), std::string::npos) << text;
#ifdef LOOM_PERF_TEST_HAVE_NLOHMANN
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["nccl_version"], 22809);
  EXPECT_EQ(j["config"]["ngpus"], 4);
  EXPECT_EQ(j["config"]["memory"], "host");
  EXPECT_EQ(j["config"]["devices"].size(), 4u);
  ASSERT_EQ(j["results"].size(), 2u);
  EXPECT_EQ(j["results"][1]["size"], 2048);
  EXPECT_EQ(j["results"][0]["redop"], "sum");
  EXPECT_DOUBLE_EQ(j["results"][0]["out_of_place"]["time"].get<double>(), 12.5);
  EXPECT_EQ(j["results"][0]["out_of_place"]["nwrong"], 0);
  EXPECT_TRUE(j["results"][0]["in_place"]["nwrong"].is_null());
  EXPECT_EQ(j["out_of_bounds"]["okay"], true);
  EXPECT_DOUBLE_EQ(j["average_bus_bandwidth"]["bandwidth"].get<double>(), 0.13);
  EXPECT_EQ(j["average_bus_bandwidth"]["okay"], "unchecked");
#endif
  std::remove(path.c_str());
}

TEST(Json, CompareFields) {
  const std::string path = ::testing::TempDir() + "/perf_report_compare_test.json";
  JsonReport report;
  std::string error;
  ASSERT_TRUE(report.open(path, &error)) << error;
  RunInfo run;
  run.program = "all_reduce_perf";
  run.collective = "AllReduce";
  run.nranks = 2;
  run.comparePath = "/opt/nccl/lib/libnccl.so.2";
  run.compareVersion = 22807;
  report.config(run, Options{}, {});
  ResultRow row;
  row.bytes = 1024;
  row.count = 256;
  row.type = "float";
  row.op = "sum";
  row.outOfPlace = {10.0, 2.0, 2.0, true, 0};
  row.inPlace = {10.0, 2.0, 2.0, true, 0};
  row.comparedOutOfPlace = Measurement{5.0, 4.0, 4.0, true, 0};
  row.comparedInPlace = Measurement{20.0, 1.0, 1.0, true, 3};
  report.row(row, false);
  row.comparedOutOfPlace.reset();  // a row without --compare has none of the fields
  row.comparedInPlace.reset();
  report.row(row, false);
  CompareSummary c;
  c.errors = 1;
  c.avgBusBw = 2.5;
  c.avgRatio = 0.8;
  c.geomeanRatio = 1.0;
  report.finish(0, 2.0, -1, "", &c);
  const std::string text = readFile(path);
  EXPECT_NE(text.find("\"nccl_out_of_place\":{\"time\":5,"), std::string::npos) << text;
#ifdef LOOM_PERF_TEST_HAVE_NLOHMANN
  const auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["compare"]["library"], "nccl");
  EXPECT_EQ(j["compare"]["path"], "/opt/nccl/lib/libnccl.so.2");
  EXPECT_EQ(j["compare"]["nccl_version"], 22807);
  const auto& r = j["results"][0];
  EXPECT_DOUBLE_EQ(r["nccl_out_of_place"]["bus_bw"].get<double>(), 4.0);
  EXPECT_EQ(r["nccl_in_place"]["nwrong"], 3);
  EXPECT_DOUBLE_EQ(r["bus_bw_ratio"]["out_of_place"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(r["bus_bw_ratio"]["in_place"].get<double>(), 2.0);
  EXPECT_FALSE(j["results"][1].contains("nccl_out_of_place"));
  EXPECT_EQ(j["nccl_out_of_bounds"]["count"], 1);
  EXPECT_EQ(j["nccl_out_of_bounds"]["okay"], false);
  EXPECT_DOUBLE_EQ(j["nccl_average_bus_bandwidth"]["bandwidth"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(j["bus_bw_ratio"]["average"].get<double>(), 0.8);
  EXPECT_DOUBLE_EQ(j["bus_bw_ratio"]["geometric_mean"].get<double>(), 1.0);
#endif
  std::remove(path.c_str());
}

TEST(Json, OpenFailureIsReported) {
  JsonReport report;
  std::string error;
  EXPECT_FALSE(report.open("/nonexistent-dir/x.json", &error));
  EXPECT_NE(error.find("/nonexistent-dir/x.json"), std::string::npos);
}

}  // namespace
}  // namespace loom::perf
