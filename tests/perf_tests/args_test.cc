#include "perf_tests/harness/args.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <vector>

namespace loom::perf {
namespace {

ParseResult parse(std::initializer_list<const char*> args) {
  std::vector<const char*> argv = {"all_reduce_perf"};
  argv.insert(argv.end(), args.begin(), args.end());
  return parseArgs(static_cast<int>(argv.size()), argv.data());
}

TEST(ParseSize, UnitsAreBinary) {
  EXPECT_EQ(parseSize("0"), 0u);
  EXPECT_EQ(parseSize("8"), 8u);
  EXPECT_EQ(parseSize("1K"), 1024u);
  EXPECT_EQ(parseSize("64k"), 65536u);
  EXPECT_EQ(parseSize("1M"), 1048576u);
  EXPECT_EQ(parseSize("2G"), 2147483648u);
  EXPECT_EQ(parseSize("1.5K"), 1536u);
  EXPECT_EQ(parseSize("0x10"), 16u);  // strtod, like nccl-tests' %lf, reads hex
  EXPECT_EQ(parseSize(""), std::nullopt);
  EXPECT_EQ(parseSize("M"), std::nullopt);
  EXPECT_EQ(parseSize("-1"), std::nullopt);
  EXPECT_EQ(parseSize("12Q"), std::nullopt);
  EXPECT_EQ(parseSize("1KB"), std::nullopt);
}

TEST(ParseArgs, DefaultsMatchNcclTests) {
  const ParseResult r = parse({});
  ASSERT_TRUE(r.error.empty());
  const Options& o = r.options;
  EXPECT_EQ(o.nThreads, 1);
  EXPECT_EQ(o.nGpus, 1);
  EXPECT_EQ(o.minBytes, 32u << 20);
  EXPECT_EQ(o.maxBytes, 32u << 20);
  EXPECT_EQ(o.stepBytes, 1u << 20);
  EXPECT_EQ(o.stepFactor, 1u);
  EXPECT_EQ(o.iters, 20);
  EXPECT_EQ(o.warmupIters, 1);
  EXPECT_EQ(o.aggIters, 1);
  EXPECT_EQ(o.check, 1);
  EXPECT_EQ(o.op, OpKind::kSum);
  EXPECT_EQ(o.type, ncclFloat32);
  EXPECT_EQ(o.root, 0);
  EXPECT_EQ(o.average, 1);
  EXPECT_EQ(o.memory, MemoryKind::kAuto);
}

TEST(ParseArgs, EveryShortFlag) {
  const ParseResult r =
      parse({"-t", "2",        "-g", "3",  "-b", "8",  "-e", "128M", "-f", "2", "-i", "4K",
             "-n", "5",        "-w", "0",  "-m", "4",  "-N", "3",    "-c", "0", "-o", "max",
             "-d", "bfloat16", "-r", "-1", "-a", "3",  "-z", "1",    "-G", "0", "-p", "1",
             "-R", "1",        "-C", "1",  "-T", "30", "-y", "1",    "-S", "1"});
  ASSERT_TRUE(r.error.empty()) << r.error;
  const Options& o = r.options;
  EXPECT_EQ(o.nThreads, 2);
  EXPECT_EQ(o.nGpus, 3);
  EXPECT_EQ(o.minBytes, 8u);
  EXPECT_EQ(o.maxBytes, 128u << 20);
  EXPECT_EQ(o.stepFactor, 2u);
  EXPECT_EQ(o.stepBytes, 4096u);
  EXPECT_EQ(o.iters, 5);
  EXPECT_EQ(o.warmupIters, 0);
  EXPECT_EQ(o.aggIters, 4);
  EXPECT_EQ(o.runCycles, 3);
  EXPECT_EQ(o.check, 0);
  EXPECT_EQ(o.op, OpKind::kMax);
  EXPECT_EQ(o.type, ncclBfloat16);
  EXPECT_EQ(o.root, -1);
  EXPECT_EQ(o.average, 3);
  EXPECT_TRUE(o.blocking);
  EXPECT_TRUE(o.parallelInit);
  EXPECT_EQ(o.registration, 1);
  EXPECT_TRUE(o.reportCputime);
  EXPECT_EQ(o.timeoutSec, 30);
  EXPECT_TRUE(o.streamNull);
  EXPECT_TRUE(o.reportTimestamps);
}

TEST(ParseArgs, LongFlagsAndInlineValues) {
  const ParseResult r = parse({"--minbytes=1K", "--maxbytes", "1M", "--op", "all", "--datatype=all",
                               "--memory", "host", "--json", "/tmp/x.json", "-b64"});
  ASSERT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.options.minBytes, 64u);  // the later -b64 wins
  EXPECT_EQ(r.options.maxBytes, 1u << 20);
  EXPECT_FALSE(r.options.op.has_value());
  EXPECT_FALSE(r.options.type.has_value());
  EXPECT_EQ(r.options.memory, MemoryKind::kHost);
  EXPECT_EQ(r.options.jsonPath, "/tmp/x.json");
  EXPECT_EQ(parse({"-J", "out.json"}).options.jsonPath, "out.json");
  EXPECT_EQ(parse({"--memory=device"}).options.memory, MemoryKind::kDevice);
}

TEST(ParseArgs, EveryTypeAndOpName) {
  const char* types[] = {"int8", "uint8", "int32",  "uint32",   "int64",  "uint64",
                         "half", "float", "double", "bfloat16", "f8e4m3", "f8e5m2"};
  int expected = 0;
  for (const char* t : types) {
    const ParseResult r = parse({"-d", t});
    ASSERT_TRUE(r.error.empty()) << t;
    EXPECT_EQ(static_cast<int>(*r.options.type), expected++) << t;
  }
  const char* ops[] = {"sum", "prod", "max", "min", "avg", "mulsum"};
  int kind = 0;
  for (const char* op : ops) {
    const ParseResult r = parse({"-o", op});
    ASSERT_TRUE(r.error.empty()) << op;
    EXPECT_EQ(static_cast<int>(*r.options.op), kind++) << op;
  }
}

TEST(ParseArgs, GraphLaunches) {
  const ParseResult r = parse({"-G", "10"});
  ASSERT_TRUE(r.error.empty());
  EXPECT_EQ(r.options.graphLaunches, 10);
  EXPECT_TRUE(r.notes.empty());
  // A blocking call would wait on a stream under capture.
  EXPECT_NE(parse({"-G", "10", "-z", "1"}).error.find("-z"), std::string::npos);
  EXPECT_TRUE(parse({"-G", "0", "-z", "1"}).error.empty());
  // Nor can the legacy default stream be captured.
  EXPECT_NE(parse({"-G", "10", "-y", "1"}).error.find("-y"), std::string::npos);
}

TEST(ParseArgs, Errors) {
  EXPECT_FALSE(parse({"-x", "1"}).error.empty());
  EXPECT_FALSE(parse({"-b"}).error.empty());
  EXPECT_FALSE(parse({"-b", "lots"}).error.empty());
  EXPECT_FALSE(parse({"-t", "0"}).error.empty());
  EXPECT_FALSE(parse({"-g", "-2"}).error.empty());
  EXPECT_FALSE(parse({"-n", "ten"}).error.empty());
  EXPECT_FALSE(parse({"-o", "xor"}).error.empty());
  EXPECT_FALSE(parse({"-d", "float128"}).error.empty());
  EXPECT_FALSE(parse({"-a", "4"}).error.empty());
  EXPECT_FALSE(parse({"-r", "-2"}).error.empty());
  EXPECT_FALSE(parse({"--memory", "gpu"}).error.empty());
  EXPECT_FALSE(parse({"-b", "2M", "-e", "1M"}).error.empty());
  EXPECT_FALSE(parse({"stray"}).error.empty());
  EXPECT_TRUE(parse({"-h"}).help);
  EXPECT_TRUE(parse({"--help"}).help);
}

TEST(ParseArgs, CompareNccl) {
  EXPECT_FALSE(parse({}).options.compareNccl);
  const ParseResult search = parse({"--compare", "nccl"});
  ASSERT_TRUE(search.error.empty()) << search.error;
  EXPECT_TRUE(search.options.compareNccl);
  EXPECT_EQ(search.options.compareNcclPath, "");
  const ParseResult path = parse({"--compare", "nccl=/opt/nccl/lib/libnccl.so.2"});
  ASSERT_TRUE(path.error.empty()) << path.error;
  EXPECT_TRUE(path.options.compareNccl);
  EXPECT_EQ(path.options.compareNcclPath, "/opt/nccl/lib/libnccl.so.2");
  EXPECT_EQ(parse({"--compare=nccl=/a=b/libnccl.so.2"}).options.compareNcclPath,
            "/a=b/libnccl.so.2");
  EXPECT_TRUE(parse({"--compare=nccl"}).options.compareNccl);
  EXPECT_FALSE(parse({"--compare", "mpi"}).error.empty());
  EXPECT_FALSE(parse({"--compare", "nccl="}).error.empty());
  EXPECT_FALSE(parse({"--compare"}).error.empty());
  EXPECT_FALSE(parse({"-K", "nccl"}).error.empty());  // long only
  EXPECT_FALSE(parse({"-j", "x.json"}).error.empty());
}

TEST(Sizes, FactorAndStep) {
  EXPECT_EQ(sizeSequence(8, 128, 0, 2), (std::vector<size_t>{8, 16, 32, 64, 128}));
  EXPECT_EQ(sizeSequence(8, 100, 0, 2), (std::vector<size_t>{8, 16, 32, 64}));
  EXPECT_EQ(sizeSequence(10, 40, 10, 1), (std::vector<size_t>{10, 20, 30, 40}));
  EXPECT_EQ(sizeSequence(5, 5, 1, 1), (std::vector<size_t>{5}));
  EXPECT_EQ(sizeSequence(0, 4, 0, 2), (std::vector<size_t>{0, 1, 2, 4}));  // no endless 0
  EXPECT_EQ(sizeSequence(3, 9, 0, 1), (std::vector<size_t>{3}));           // 0 step: one size
  EXPECT_EQ(sizeSequence(8, 7, 1, 1), (std::vector<size_t>{}));
  const size_t big = size_t{1} << 63;
  EXPECT_EQ(sizeSequence(big, ~size_t{0}, 0, 4).size(), 1u);  // no overflow wrap
  EXPECT_EQ(warmupSizes(1024, 8192), (std::vector<size_t>{1024, 2048, 4096, 8192}));
}

}  // namespace
}  // namespace loom::perf
