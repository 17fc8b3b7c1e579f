#include "metrics/run_report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../cli/headless_chromium.h"
#include "../cli/keel_process.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

ReportAssets InstalledUplot() {
  const std::string dist = AssetsDir() + "/uplot/dist/";
  ReportAssets a;
  a.uplot_js = keel_test::ReadText(dist + "uPlot.iife.min.js");
  a.uplot_css = keel_test::ReadText(dist + "uPlot.min.css");
  return a;
}

TEST(RunReportTest, MarkdownIsRenderedAndEscaped) {
  const std::string html = MarkdownToHtml(
      "## resumed at iteration 20\n- iteration 21: **rolled back** to `iter_0000010`\n- <img "
      "src=x onerror=alert(1)>\n\nplain\ntext & more\n```\n<raw>\n```\n");
  EXPECT_EQ(html,
            "<h4>resumed at iteration 20</h4>\n<ul>\n<li>iteration 21: <strong>rolled "
            "back</strong> to <code>iter_0000010</code></li>\n<li>&lt;img src=x "
            "onerror=alert(1)&gt;</li>\n</ul>\n<p>plain text &amp; more</p>\n<pre>&lt;raw&gt;\n"
            "</pre>\n");
}

// A mixture run whose dataset name tries to close the data <script>: the page still loads, draws
// the per-dataset charts (9 in all), and runs no injected script.
TEST(RunReportTest, MixtureRunWithHostileNamesLoadsInChromium) {
  const std::string dir = keel_test::FreshTempDir("run_report");
  {
    std::ofstream m(dir + "/metrics.jsonl");
    const std::string bad = "a</script><script>document.title='pwned'</script>";
    for (int it = 1; it <= 60; ++it) {
      nlohmann::json r = {{"kind", "train"},
                          {"iteration", it},
                          {"lm_loss", 5.0 - it * 0.01},
                          {"learning_rate", 1e-4},
                          {"global_batch_size", 8},
                          {"grad_norm", 0.5},
                          {"loss_scale", 1.0},
                          {"samples_per_second", 10.0},
                          {"tflops", 1.0}};
      r["datasets"]["sotu"] = {{"lm_loss", 5.1 - it * 0.01}};
      if (it > 20) r["datasets"][bad] = {{"lm_loss", 4.9 - it * 0.01}};  // joins later
      m << r.dump() << "\n";
      if (it % 20 == 0) {
        nlohmann::json v = {{"kind", "validation"}, {"iteration", it}, {"lm_loss", 5.0}};
        v["datasets"]["sotu"] = {{"lm_loss", 5.2}};
        m << v.dump() << "\n";
      }
    }
    std::ofstream(dir + "/events.jsonl")
        << R"({"event": "rollback", "iteration": 30, "reason": "4 anomalous iterations"})"
        << "\n";
    fs::create_directories(dir + "/metrics-archive/resume-iter50-to-iter40-20261123T000000Z");
  }
  std::string html;
  ReportSummary summary;
  ASSERT_TRUE(BuildRunReport(Env::Default(), dir, InstalledUplot(), &html, &summary).ok());
  EXPECT_EQ(summary.train_records, 60);
  EXPECT_EQ(summary.validation_records, 3);
  EXPECT_EQ(summary.markers, 2);  // the journal's rollback, the archived resume
  EXPECT_EQ(html.find("a</script>"), std::string::npos);
  EXPECT_NE(html.find("a<\\/script>"), std::string::npos);
  std::ofstream(dir + "/report.html") << html;
  if (!keel_test::HaveChromium())
    GTEST_SKIP() << "chromium is not installed (scripts/test.sh installs it)";
  const keel_test::PageLoad page = keel_test::LoadInChromium(dir + "/report.html", dir);
  ASSERT_TRUE(page.ran) << page.log;
  EXPECT_EQ(page.status, "ok") << page.log;
  EXPECT_EQ(page.charts, "9");
  EXPECT_EQ(page.errors, "");
  EXPECT_NE(page.dom.find("<title>keel report: "), std::string::npos);  // no injected script ran
  EXPECT_EQ(keel_test::ConsoleLines(page.log), "");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace keel
