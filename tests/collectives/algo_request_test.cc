// LOOM_ALGO and LOOM_PROTO as one parser reads them for host and GPU buffers.
#include "collectives/algo_request.h"

#include <gtest/gtest.h>

#include "collectives/tuner.h"

namespace loom::collectives {
namespace {

AlgoRequest parsed(const char* text) {
  auto r = AlgoRequest::parse(text);
  EXPECT_TRUE(r.isOk()) << text << ": " << r.status().message();
  return r.isOk() ? r.value() : AlgoRequest();
}

TEST(AlgoRequest, NothingAskedAllowsEverything) {
  for (const char* text : {"", "  "}) {
    const AlgoRequest r = parsed(text);
    EXPECT_FALSE(r.set()) << '"' << text << '"';
    for (int a = 0; a < static_cast<int>(AlgoName::kCount); ++a)
      EXPECT_TRUE(r.allows(static_cast<AlgoName>(a))) << a;
    EXPECT_FALSE(r.names(AlgoName::kRing));
  }
}

TEST(AlgoRequest, ListsInAnyCaseWithSpaces) {
  const AlgoRequest r = parsed(" Ring , TREE");
  EXPECT_TRUE(r.set());
  EXPECT_TRUE(r.allows(AlgoName::kRing));
  EXPECT_TRUE(r.allows(AlgoName::kTree));
  EXPECT_FALSE(r.allows(AlgoName::kOneShot));
  EXPECT_FALSE(r.allows(AlgoName::kDoubling));
  EXPECT_TRUE(r.names(AlgoName::kTree));
  EXPECT_EQ(r.text(), " Ring , TREE");
}

TEST(AlgoRequest, CaretLeavesOut) {
  const AlgoRequest r = parsed("^tree,oneshot");
  EXPECT_TRUE(r.set());
  EXPECT_FALSE(r.allows(AlgoName::kTree));
  EXPECT_FALSE(r.allows(AlgoName::kOneShot));
  EXPECT_TRUE(r.allows(AlgoName::kRing));
  EXPECT_TRUE(r.allows(AlgoName::kTwoShot));
  // Allowed through "^", not named.
  EXPECT_FALSE(r.names(AlgoName::kRing));
}

TEST(AlgoRequest, HyphenatedShotsAndNcclOnlyNames) {
  EXPECT_TRUE(parsed("one-shot").onlyOf(AlgoName::kOneShot, AlgoName::kTwoShot));
  EXPECT_TRUE(parsed("TWO-SHOT").onlyOf(AlgoName::kTwoShot, AlgoName::kOneShot));
  // NCCL's names a script may carry: accepted, and they allow none of loom's forms.
  const AlgoRequest nvls = parsed("NVLS,pat,CollNetDirect");
  EXPECT_TRUE(nvls.set());
  EXPECT_FALSE(nvls.allows(AlgoName::kRing));
  EXPECT_TRUE(nvls.allows(AlgoName::kNvls));
}

TEST(AlgoRequest, OnlyOfForcesOneAmongOthers) {
  const AlgoRequest one = parsed("oneshot,direct");
  EXPECT_TRUE(one.onlyOf(AlgoName::kOneShot, AlgoName::kTwoShot, AlgoName::kRing));
  EXPECT_FALSE(one.onlyOf(AlgoName::kOneShot, AlgoName::kDirect));
  EXPECT_FALSE(AlgoRequest().onlyOf(AlgoName::kRing, AlgoName::kTree));  // nothing asked
}

TEST(AlgoRequest, UnknownNamesAreAnErrorThatNamesThem) {
  for (const char* text : {"warp", "ring,warp", "^warp", "ring,,tree", "allreduce:tree"}) {
    auto r = AlgoRequest::parse(text);
    ASSERT_FALSE(r.isOk()) << text;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(text), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("loom knows ring"), std::string::npos);
  }
}

TEST(AlgoRequest, Protocols) {
  EXPECT_EQ(parseProto("").value(), Proto::kAuto);
  EXPECT_EQ(parseProto("AUTO").value(), Proto::kAuto);
  EXPECT_EQ(parseProto("Simple").value(), Proto::kSimple);
  EXPECT_EQ(parseProto("LL").value(), Proto::kLL);
  EXPECT_EQ(parseProto("ll128").value(), Proto::kLL128);
  auto bad = parseProto("LL64");
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.status().message().find("LL64"), std::string::npos);
  EXPECT_STREQ(protoText(Proto::kLL128), "ll128");
}

// The GPU mesh's name means the same on host memory: twoshot there is the ring's
// reduce-scatter and all-gather, not an error.
TEST(AlgoRequest, TwoShotOnHostMemoryIsTheRing) {
  CollRequest req;
  req.type = CollType::kAllReduce;
  req.count = 1 << 20;
  req.nranks = 8;
  auto c = chooseAlgorithm(req, parsed("twoshot"));
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_EQ(c->algo, Algorithm::kRing) << c->reason;
  // Left out with the others, it leaves the tuner its own choice among what remains.
  auto d = chooseAlgorithm(req, parsed("^twoshot,tree"));
  ASSERT_TRUE(d.isOk());
  EXPECT_NE(d->algo, Algorithm::kTree);
}

}  // namespace
}  // namespace loom::collectives
