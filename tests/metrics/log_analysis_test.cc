#include "metrics/log_analysis.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "megatron_log_fixture.h"
#include "keel_test_paths.h"  // KEEL_BINARY, KEEL_SOURCE_DIR, KEEL_ASSETS_DIR

namespace keel {
namespace {

std::string ReadTestData(const std::string& name) {
  std::ifstream f(std::string(KEEL_SOURCE_DIR) + "/tests/metrics/testdata/" + name);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_FALSE(ss.str().empty()) << name;
  return ss.str();
}

LogAnalysis Analyze(const std::string& text, const LogAnalysisOptions& opt, ParsedLog* log) {
  EXPECT_TRUE(ParseMegatronLog(text, "test.log", log).ok());
  LogAnalysis a;
  Status st = AnalyzeLog(*log, opt, &a);
  EXPECT_TRUE(st.ok()) << st.message();
  return a;
}

const LogEvent* Find(const LogAnalysis& a, const std::string& kind) {
  for (const LogEvent& e : a.events)
    if (e.kind == kind) return &e;
  return nullptr;
}

TEST(MegatronLogTest, ReadsTheSeedsWrappedPrefixedLinesField) {
  ParsedLog log;
  ASSERT_TRUE(ParseMegatronLog(ReadTestData("tr11-176B-excerpt.log"), "tr11", &log).ok());
  ASSERT_EQ(log.records.size(), 17u);
  EXPECT_EQ(log.wrapped, 5);
  const LogRecord& r = log.records[11];  // 42780, wrapped over three lines
  EXPECT_EQ(r.iteration, 42780);
  EXPECT_EQ(r.train_iters, 115311);
  EXPECT_EQ(r.consumed_samples, 71455664);
  EXPECT_EQ(r.consumed_tokens, 146341199872);
  EXPECT_DOUBLE_EQ(r.iteration_seconds, 105.16);
  EXPECT_DOUBLE_EQ(r.learning_rate, 4.475e-05);  // "learning\nrate"
  EXPECT_DOUBLE_EQ(r.lm_loss, 2.117073);
  EXPECT_EQ(r.nan, 0);  // "number of nan\niterations"
  EXPECT_DOUBLE_EQ(r.tflops, 149.10);
  ASSERT_EQ(log.validations.size(), 1u);
  EXPECT_EQ(log.validations[0].iteration, 45000);
  EXPECT_DOUBLE_EQ(log.validations[0].ppl, 10.24808);

  ParsedLog ms;
  ASSERT_TRUE(ParseMegatronLog(ReadTestData("tr8-104B-excerpt.log"), "tr8", &ms).ok());
  ASSERT_EQ(ms.records.size(), 8u);
  EXPECT_DOUBLE_EQ(ms.records[0].iteration_seconds, 18.7061);  // 18706.1 ms
  EXPECT_DOUBLE_EQ(ms.records[0].loss_scale, 2048);
  EXPECT_DOUBLE_EQ(ms.records[1].lm_loss, 11.42026);
}

// Found by fuzz/megatron_log_fuzz: a count printed as inf or beyond int64 ("consumed tokens:
// 1e30") was converted with undefined behaviour. It now reads as unknown.
TEST(MegatronLogTest, CountsThatDoNotFitReadAsUnknown) {
  ParsedLog log;
  ASSERT_TRUE(
      ParseMegatronLog("iteration5/|consumedtokens:1e30\n"
                       " iteration 6/ 10 | consumed samples: inf | consumed tokens: 1536 | "
                       "number of skipped iterations: -inf | number of nan iterations: nan |\n",
                       "x.log", &log)
          .ok());
  ASSERT_EQ(log.records.size(), 2u);
  EXPECT_EQ(log.records[0].iteration, 5);
  EXPECT_EQ(log.records[0].consumed_tokens, -1);
  EXPECT_EQ(log.records[1].consumed_samples, -1);
  EXPECT_EQ(log.records[1].consumed_tokens, 1536);
  EXPECT_EQ(log.records[1].skipped, 0);
  EXPECT_EQ(log.records[1].nan, 0);
}

TEST(LogAnalysisTest, SeedsSpikeAndSlowGpuAreFoundWhereTheChroniclesSay) {
  LogAnalysisOptions opt;
  opt.detector.min_history = 1;  // an excerpt of a dozen records
  ParsedLog log;
  const LogAnalysis a = Analyze(ReadTestData("tr11-176B-excerpt.log"), opt, &log);
  ASSERT_EQ(a.events.size(), 2u) << FormatLogAnalysis(log, a);
  // The grad norm led (0.947 at 31215), the loss peaked at 5.098 at 31219, back by 31250.
  EXPECT_EQ(a.events[0].kind, "spike_recovered");
  EXPECT_EQ(a.events[0].start, 31215);
  EXPECT_EQ(a.events[0].end, 31250);
  EXPECT_NE(a.events[0].detail.find("peak lm loss 5.09812 (iteration 31219)"), std::string::npos)
      << a.events[0].detail;
  // "The performance of the system dropped from 149 to 140 TFLOPs and remained there."
  EXPECT_EQ(a.events[1].kind, "throughput_drop");
  EXPECT_EQ(a.events[1].start, 42783);
  EXPECT_NEAR(a.events[1].baseline, 149.09, 0.01);
  EXPECT_NEAR(a.events[1].value, 141.26, 0.01);
  EXPECT_EQ(a.events[1].end, 45000);
  EXPECT_EQ(a.restarts, 0);

  // "(115311-12695)*105/(3600*24)=124.7": the same sum at the logged 105.22 s.
  ParsedLog one;
  const LogAnalysis eta = Analyze(ReadTestData("tr11-176B-eta.log"), opt, &one);
  EXPECT_NEAR(eta.eta_seconds / 86400, (115311 - 12695) * 105.22 / 86400, 1e-9);

  ParsedLog tr8;
  const LogAnalysis r = Analyze(ReadTestData("tr8-104B-excerpt.log"), opt, &tr8);
  ASSERT_NE(Find(r, "restart"), nullptr);
  EXPECT_EQ(Find(r, "restart")->start, 7220);
  EXPECT_EQ(Find(r, "restart")->end, 6900);
  EXPECT_EQ(r.min_iteration, 6900);
  EXPECT_EQ(r.max_iteration, 7220);
}

TEST(LogAnalysisTest, GeneratedLogEventsAreFoundAndClassified) {
  ParsedLog log;
  const LogAnalysis a = Analyze(keel_test::GenerateMegatronLog({}), {}, &log);
  const std::string text = FormatLogAnalysis(log, a);
  EXPECT_EQ(a.records, 420);
  EXPECT_EQ(log.wrapped, 1);
  EXPECT_EQ(a.validations, 4);  // 100, 200, then 300, 400 after the restart
  EXPECT_EQ(a.restarts, 1);
  EXPECT_EQ(a.nan_iterations, 1);
  EXPECT_EQ(a.skipped_iterations, 1);  // Megatron counts a NaN iteration as skipped too

  const LogEvent* spike = Find(a, "spike_recovered");
  ASSERT_NE(spike, nullptr) << text;
  EXPECT_EQ(spike->start, 150);
  EXPECT_EQ(spike->end, 153);
  const LogEvent* nan = Find(a, "nan");
  ASSERT_NE(nan, nullptr) << text;
  EXPECT_EQ(nan->start, 200);
  EXPECT_EQ(nan->end, 200);
  const LogEvent* restart = Find(a, "restart");
  ASSERT_NE(restart, nullptr) << text;
  EXPECT_EQ(restart->start, 260);
  EXPECT_EQ(restart->end, 241);
  const LogEvent* resume = Find(a, "resume_spike");
  ASSERT_NE(resume, nullptr) << text;
  EXPECT_EQ(resume->start, 245);
  EXPECT_EQ(resume->end, 247);
  const LogEvent* drop = Find(a, "throughput_drop");
  ASSERT_NE(drop, nullptr) << text;
  EXPECT_GE(drop->start, 298);
  EXPECT_LE(drop->start, 302);
  EXPECT_NEAR(drop->baseline, 150, 0.5);
  EXPECT_NEAR(drop->value, 140, 0.5);
  EXPECT_EQ(drop->end, 400);
  const LogEvent* div = Find(a, "divergence");
  ASSERT_NE(div, nullptr) << text;
  EXPECT_GE(div->start, 320);
  EXPECT_LE(div->start, 345);
  EXPECT_EQ(div->end, 400);
  EXPECT_EQ(a.events.size(), 7u) << text;  // nothing else (incl. skipped at 200)
  EXPECT_EQ(a.eta_seconds, 0);             // 400 of 400
}

TEST(LogAnalysisTest, QuietLogHasNoEvents) {
  ParsedLog log;
  const LogAnalysis a =
      Analyze(keel_test::GenerateMegatronLog({false, false, false, false, false, false}), {}, &log);
  EXPECT_TRUE(a.events.empty()) << FormatLogAnalysis(log, a);
  EXPECT_EQ(a.records, 400);
  EXPECT_NEAR(a.tflops.median, 150, 0.5);
}

TEST(LogAnalysisTest, NoIterationLinesIsAnErrorThatSaysWhatWasExpected) {
  ParsedLog log;
  ASSERT_TRUE(ParseMegatronLog("hello\nworld\n", "notes.txt", &log).ok());
  LogAnalysis a;
  Status st = AnalyzeLog(log, {}, &a);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("notes.txt: no Megatron iteration lines"), std::string::npos);
}

}  // namespace
}  // namespace keel
