// `keel report` end to end: a converted Megatron log with known events becomes one HTML page that
// headless Chromium loads without a console line or script error, whose script drew every chart,
// and whose screenshot shows the curves and the event markers in their colours.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../logs/megatron_log_fixture.h"
#include "headless_chromium.h"
#include "keel_process.h"
#include "keel_test_paths.h"  // KEEL_BINARY, KEEL_SOURCE_DIR, KEEL_ASSETS_DIR

namespace {

namespace fs = std::filesystem;
using keel_test::ReadText;
using keel_test::RunKeelShell;

TEST(ReportCliTest, ConvertedLogReportLoadsInChromiumAndShowsThePlots) {
  if (!keel_test::HaveChromium())
    GTEST_SKIP() << "chromium is not installed (scripts/test.sh installs it)";
  const std::string dir = keel_test::FreshTempDir("report_cli");
  std::ofstream(dir + "/main_log.txt") << keel_test::GenerateMegatronLog({});
  auto r = RunKeelShell("", "logs analyze " + dir + "/main_log.txt --to-metrics " + dir + "/run");
  ASSERT_EQ(r.code, 0) << r.out;
  std::ofstream(dir + "/run/CHRONICLE.md")
      << "## started at iteration 0\n- iteration 150: lm loss <b>jumped</b> from `3.7` to 6.5\n";
  r = RunKeelShell("", "report " + dir + "/run -o " + dir + "/report.html");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("400 iterations, 4 evaluations, 8 marked events"), std::string::npos)
      << r.out;
  const std::string html = ReadText(dir + "/report.html");
  // Self-contained: uPlot inlined, nothing fetched.
  EXPECT_NE(html.find("uPlot"), std::string::npos);
  EXPECT_EQ(html.find("<script src"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  // The chronicle is rendered and escaped; the events table lists the findings.
  EXPECT_NE(html.find("<h4>started at iteration 0</h4>"), std::string::npos);
  EXPECT_NE(html.find("lm loss &lt;b&gt;jumped&lt;/b&gt; from <code>3.7</code>"),
            std::string::npos);
  EXPECT_NE(html.find("<td>resume_spike</td>"), std::string::npos);
  EXPECT_NE(html.find("metrics-archive/restart-iter260-to-iter240"), std::string::npos);

  const std::string shot = dir + "/report.png";
  const keel_test::PageLoad page = keel_test::LoadInChromium(dir + "/report.html", dir, shot);
  ASSERT_TRUE(page.ran) << page.log;
  EXPECT_EQ(page.status, "ok") << page.log;
  EXPECT_EQ(page.charts, "7");  // no per-dataset chart (one dataset), no loss scale (always 1)
  EXPECT_EQ(page.errors, "");
  EXPECT_EQ(keel_test::ConsoleLines(page.log), "");
  // The screenshot: pixels of the rolling-mean loss, the grad norm, the TFLOPs curve, the
  // divergence marker (red) and the throughput-drop marker (brown). A page whose script failed
  // has none of them.
  r = keel_test::RunShell("python3 " + std::string(KEEL_SOURCE_DIR) +
                          "/tests/report/png_color_count.py " + shot +
                          " 0b3d91 2ca02c e377c2 d62728 8c564b");
  ASSERT_EQ(r.code, 0) << r.out;
  std::istringstream counts(r.out);
  for (const char* what : {"loss mean", "grad norm", "TFLOPs", "divergence", "drop"}) {
    int n = 0;
    counts >> n;
    EXPECT_GT(n, 150) << what << " pixels: " << r.out;
  }
  fs::remove_all(dir);
}

TEST(ReportCliTest, WrongInputsAreRefusedAndNothingIsWritten) {
  const std::string dir = keel_test::FreshTempDir("report_bad");
  auto r = RunKeelShell("", "report " + dir + "/nope");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("is not a directory"), std::string::npos) << r.out;
  r = RunKeelShell("", "report " + dir);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("has no metrics.jsonl"), std::string::npos) << r.out;
  std::ofstream(dir + "/metrics.jsonl")
      << "{\"kind\": \"train\", \"iteration\": 1}\n{\"kind\": \"tr\n";
  r = RunKeelShell("", "report " + dir);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("metrics.jsonl:2: not a JSON object"), std::string::npos) << r.out;
  std::ofstream(dir + "/metrics.jsonl") << "{\"kind\": \"train\", \"iteration\": 1}\n";
  r = RunKeelShell("KEEL_ASSETS_DIR=" + dir, "report " + dir);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("uPlot is not installed"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir + "/report.html"));
  fs::remove_all(dir);
}

}  // namespace
