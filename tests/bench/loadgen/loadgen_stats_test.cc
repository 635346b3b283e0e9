#include "tests/bench/loadgen/loadgen_stats.h"

#include <cmath>
#include <map>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace tost::loadgen {
namespace {

using ::testing::HasSubstr;

TEST(SamplesTest, NearestRankPercentilesAreObservedValues) {
  Samples s;
  for (int v : {7, 1, 10, 3, 5, 9, 2, 8, 4, 6}) s.Add(v);  // 1..10, shuffled
  EXPECT_EQ(s.Percentile(0), 1);
  EXPECT_EQ(s.Percentile(10), 1);
  EXPECT_EQ(s.Percentile(11), 2);
  EXPECT_EQ(s.Percentile(50), 5);
  EXPECT_EQ(s.Percentile(90), 9);
  EXPECT_EQ(s.Percentile(99), 10);
  EXPECT_EQ(s.Percentile(100), 10);
  EXPECT_EQ(s.Max(), 10);
  EXPECT_DOUBLE_EQ(s.Mean(), 5.5);
}

TEST(SamplesTest, P99OfAThousandIsThe990th) {
  Samples s;
  for (int v = 1000; v >= 1; --v) s.Add(v);
  EXPECT_EQ(s.Percentile(99), 990);
  EXPECT_EQ(s.Percentile(99.9), 999);
  s.Add(5000);  // adding after a percentile was taken re-sorts
  EXPECT_EQ(s.Max(), 5000);
  EXPECT_EQ(s.Percentile(100), 5000);
}

TEST(SamplesTest, EmptyAndMerge) {
  Samples a, b;
  EXPECT_EQ(a.Percentile(50), 0);
  EXPECT_EQ(a.Max(), 0);
  a.Add(3);
  b.Add(1);
  b.Add(2);
  a.Merge(b);
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(a.Percentile(0), 1);
  EXPECT_EQ(a.Percentile(50), 2);
}

TEST(ArrivalScheduleTest, UniformIsExactlyEvenlySpaced) {
  ArrivalSchedule s(Arrivals::kUniform, 250, 1);
  for (int i = 0; i < 1000; ++i) EXPECT_DOUBLE_EQ(s.Next(), i / 250.0);
}

TEST(ArrivalScheduleTest, PoissonHasTheRateAndExponentialGaps) {
  const double rate = 200;
  ArrivalSchedule s(Arrivals::kPoisson, rate, 42);
  const int n = 200000;
  std::vector<double> gaps;
  double prev = s.Next();
  EXPECT_EQ(prev, 0);
  for (int i = 0; i < n; ++i) {
    const double t = s.Next();
    ASSERT_GE(t, prev);
    gaps.push_back(t - prev);
    prev = t;
  }
  double mean = 0, var = 0;
  for (double g : gaps) mean += g;
  mean /= n;
  for (double g : gaps) var += (g - mean) * (g - mean);
  var /= n;
  EXPECT_NEAR(mean, 1 / rate, 0.01 / rate);
  // An exponential's coefficient of variation is 1 (uniform arrivals would give 0).
  EXPECT_NEAR(std::sqrt(var) / mean, 1.0, 0.02);
  // Same seed, same schedule.
  ArrivalSchedule a(Arrivals::kPoisson, rate, 7), b(Arrivals::kPoisson, rate, 7);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.Next(), b.Next());
}

TEST(ArrivalsTest, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseArrivals("poisson"), Arrivals::kPoisson);
  EXPECT_EQ(*ParseArrivals("uniform"), Arrivals::kUniform);
  EXPECT_THAT(ParseArrivals("bursty").status().message(), HasSubstr("got \"bursty\""));
}

TEST(MixTest, ParsesSingleAndWeighted) {
  auto one = ParseMix("generate");
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].workload, Workload::kGenerate);
  EXPECT_EQ((*one)[0].weight, 1.0);
  auto two = ParseMix("classify:3, generate:0.5");
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[0].weight, 3.0);
  EXPECT_EQ((*two)[1].weight, 0.5);
}

TEST(MixTest, RejectsBadSpecsSayingWhatWasExpected) {
  EXPECT_THAT(ParseMix("embed").status().message(), HasSubstr("got \"embed\""));
  EXPECT_THAT(ParseMix("classify:0").status().message(), HasSubstr("positive weight"));
  EXPECT_THAT(ParseMix("classify:x").status().message(), HasSubstr("got \"x\""));
  EXPECT_THAT(ParseMix("classify,classify:2").status().message(), HasSubstr("twice"));
  EXPECT_THAT(ParseMix("").status().message(), HasSubstr("at least one"));
}

TEST(MixTest, PicksInProportionToWeights) {
  MixPicker picker(*ParseMix("classify:3,generate:1"), 5);
  std::map<Workload, int> counts;
  const int n = 100000;
  for (int i = 0; i < n; ++i) ++counts[picker.Pick()];
  EXPECT_NEAR(counts[Workload::kClassify] / static_cast<double>(n), 0.75, 0.01);
  MixPicker only(*ParseMix("generate"), 5);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(only.Pick(), Workload::kGenerate);
}

TEST(ReportTest, JsonHasThroughputsAndPercentiles) {
  RunResult r;
  r.info.mode = "concurrency";
  r.info.concurrency = 4;
  r.info.mix = "classify:1,generate:1";
  r.measured_s = 2.0;
  WorkloadStats& c = r.by_workload[Workload::kClassify];
  c.started = 11;
  c.ok = 10;
  c.images = 80;
  c.errors_by_code["RESOURCE_EXHAUSTED"] = 1;
  for (int i = 1; i <= 10; ++i) c.latency_ms.Add(i);
  WorkloadStats& g = r.by_workload[Workload::kGenerate];
  g.started = g.ok = 2;
  g.tokens = 128;
  g.latency_ms.Add(100);
  g.ttft_ms.Add(10);
  g.itl_ms.Add(1.5);
  const nlohmann::json j = nlohmann::json::parse(ResultJson(r));
  EXPECT_EQ(j["workloads"]["classify"]["images_per_s"], 40.0);
  EXPECT_EQ(j["workloads"]["classify"]["requests_per_s"], 5.0);
  EXPECT_EQ(j["workloads"]["classify"]["errors_by_code"]["RESOURCE_EXHAUSTED"], 1);
  EXPECT_EQ(j["workloads"]["classify"]["latency_ms"]["p90"], 9.0);
  EXPECT_EQ(j["workloads"]["generate"]["tokens_per_s"], 64.0);
  EXPECT_EQ(j["workloads"]["generate"]["itl_ms"]["p50"], 1.5);
  EXPECT_EQ(j["total"]["ok"], 12);
  EXPECT_EQ(j["total"]["errors"], 1);
  EXPECT_EQ(j["total"]["latency_ms"]["max"], 100.0);
  EXPECT_THAT(ResultSummary(r), HasSubstr("RESOURCE_EXHAUSTED 1"));
}

}  // namespace
}  // namespace tost::loadgen
