#include "report/run_report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

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
// the per-dataset charts (8 in all: its loss scale is always 1, so no loss-scale chart), and runs
// no injected script.
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
  EXPECT_NE(html.find("a\\u003c/script\\u003e"), std::string::npos);
  std::ofstream(dir + "/report.html") << html;
  if (!keel_test::HaveChromium())
    GTEST_SKIP() << "chromium is not installed (scripts/test.sh installs it)";
  const keel_test::PageLoad page = keel_test::LoadInChromium(dir + "/report.html", dir);
  ASSERT_TRUE(page.ran) << page.log;
  EXPECT_EQ(page.status, "ok") << page.log;
  EXPECT_EQ(page.charts, "8");
  EXPECT_EQ(page.errors, "");
  EXPECT_NE(page.dom.find("<title>keel report: "), std::string::npos);  // no injected script ran
  EXPECT_EQ(keel_test::ConsoleLines(page.log), "");
  fs::remove_all(dir);
}

nlohmann::json TrainRecord(int64_t it) {
  return {{"kind", "train"},
          {"iteration", it},
          {"lm_loss", 5.0 - it * 0.01},
          {"learning_rate", 1e-4},
          {"global_batch_size", 8},
          {"grad_norm", 0.5},
          {"loss_scale", 1.0},
          {"samples_per_second", 10.0},
          {"tflops", 1.0},
          {"data_skipped", false}};
}

void WriteMetrics(const std::string& dir, const std::vector<nlohmann::json>& records) {
  std::ofstream m(dir + "/metrics.jsonl");
  for (const auto& r : records) m << r.dump() << "\n";
}

// The page's data, parsed back from its <script type="application/json">.
nlohmann::json EmbeddedData(const std::string& html) {
  const std::string open = "<script id=\"keel-data\" type=\"application/json\">";
  const size_t a = html.find(open) + open.size(), b = html.find("</script>", a);
  return nlohmann::json::parse(html.substr(a, b - a));
}

// The opening tag of the chart whose title is `title` in a dumped DOM ("" if none), and one of its
// attributes.
std::string ChartTag(const std::string& dom, const std::string& title) {
  const size_t t = dom.find("data-title=\"" + title + "\"");
  if (t == std::string::npos) return "";
  const size_t open = dom.rfind('<', t);
  return dom.substr(open, dom.find('>', t) - open + 1);
}
std::string TagAttribute(const std::string& tag, const std::string& name) {
  const size_t a = tag.find(" " + name + "=\"");
  if (a == std::string::npos) return "";
  const size_t v = a + name.size() + 3;
  return tag.substr(v, tag.find('"', v) - v);
}

// The notes list at the top of a page (the page's own script holds the same sentences as source
// text, so the DOM as a whole would not do).
std::string Notes(const std::string& dom) {
  const size_t a = dom.find("<ul id=\"notes\">");
  if (a == std::string::npos) return "";
  return dom.substr(a, dom.find("</ul>", a) - a);
}

// What a browser would do with markup: an onerror that, if it ever ran, marks <html>.
std::string Payload(const std::string& where) {
  return "<img src=x onerror=\"document.documentElement.setAttribute('data-pwned','" + where +
         "')\">";
}

// Found by fuzz/metrics_jsonl_fuzz and fuzz/events_jsonl_fuzz: a field of another type ("kind": 4,
// "signal": [], "iteration": "2") threw out of BuildRunReport, and an iteration written with an
// exponent was converted with undefined behaviour. Such fields now read as missing.
// Found by fuzz/metrics_jsonl_fuzz and fuzz/events_jsonl_fuzz: fields of another type, or
// integers written with an exponent, threw or were converted with undefined behaviour. A record
// the charts cannot place is an error naming its line; a marker that cannot be placed is left out
// and counted in a note; a value of another type reads as missing.
TEST(RunReportTest, FieldsOfAnotherTypeAreRefusedOrReadAsMissing) {
  const std::string dir = ::testing::TempDir() + "/keel_report_types_" + std::to_string(getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir + "/metrics.jsonl")
      << "{\"kind\":\"train\",\"iteration\":1,\"lm_loss\":5.0}\n"
      << "{\"kind\":\"train\",\"iteration\":2,\"lm_loss\":\"4.0\",\"datasets\":[1]}\n"
      << "{\"kind\":\"validation\",\"iteration\":1,\"lm_loss\":5.5}\n";
  std::ofstream(dir + "/events.jsonl")
      << "{\"iteration\":1,\"signal\":[]}\n"
      << "{\"iteration\":\"3\",\"event\":\"rollback\"}\n"
      << "{\"iteration\":1e300,\"event\":\"rollback\"}\n"
      << "{\"iteration\":2,\"event\":7,\"reason\":{\"a\":1},\"at\":5}\n";
  std::ofstream(dir + "/log-analysis.json")
      << "{\"events\":[1,{\"start\":\"x\",\"kind\":\"spike\"},"
      << "{\"start\":4,\"end\":\"y\",\"kind\":\"restart\",\"detail\":[]}]}\n";
  std::string html;
  ReportSummary summary;
  Status st = BuildRunReport(Env::Default(), dir, ReportAssets{}, &html, &summary);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(summary.train_records, 2);
  EXPECT_EQ(summary.validation_records, 1);
  EXPECT_EQ(summary.markers, 2);  // events.jsonl line 1, the third log-analysis event
  EXPECT_NE(html.find("<td>restart</td><td>log-analysis.json</td>"), std::string::npos);
  EXPECT_NE(html.find("events.jsonl: 3 line(s) are not keel events"), std::string::npos);
  EXPECT_NE(html.find("log-analysis.json: 2 event(s)"), std::string::npos);
  const nlohmann::json data = EmbeddedData(html);
  EXPECT_TRUE(data["train"]["lm_loss"][1].is_null()) << data["train"]["lm_loss"].dump();

  for (const auto& [line, words] : std::vector<std::pair<std::string, std::string>>{
           {"{\"kind\":4}", "\"kind\" is not a string"},
           {"{\"kind\":\"train\",\"iteration\":1e300}", "without an integer \"iteration\""}}) {
    std::ofstream(dir + "/metrics.jsonl") << "{\"kind\":\"train\",\"iteration\":1}\n"
                                          << line << "\n";
    st = BuildRunReport(Env::Default(), dir, ReportAssets{}, &html, &summary);
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << line;
    EXPECT_NE(st.message().find("metrics.jsonl:2: "), std::string::npos) << st.message();
    EXPECT_NE(st.message().find(words), std::string::npos) << st.message();
  }
  fs::remove_all(dir);
}

// Issue 15: an events.jsonl "event" reached the marker legend through innerHTML and ran. Every
// string from the run's files (journal events, log findings, archive directory names, dataset
// names, the chronicle) must reach the page as text: nothing runs, the text is shown literally,
// and lines of the wrong shape are named, not fatal.
TEST(RunReportTest, HostileTextInEveryInputIsShownAsTextAndNeverRuns) {
  const std::string dir = keel_test::FreshTempDir("run_report_hostile");
  std::vector<nlohmann::json> records;
  for (int it = 1; it <= 30; ++it) {
    records.push_back(TrainRecord(it));
    records.back()["datasets"]["<!--<script>"] = {{"lm_loss", 5.0}};  // must not swallow the page
    records.back()["datasets"]["web"] = {{"lm_loss", 5.1}};
  }
  WriteMetrics(dir, records);
  {
    std::ofstream e(dir + "/events.jsonl");
    e << nlohmann::json({{"event", Payload("event")}, {"iteration", 3}}).dump() << "\n";
    e << R"({"event": "__proto__", "iteration": 4})"
      << "\n";
    e << R"({"event": "constructor", "iteration": 5, "reason": 17})"
      << "\n";
    e << R"({"event": 7, "iteration": 6})"
      << "\n";  // wrong types: named, not fatal
    e << R"({"event": "skip", "iteration": "x"})"
      << "\n";
    e << "not json\n";
    e << R"({"event": "stop", "reason": "budget spent"})"
      << "\n";  // no iteration: not a marker
    nlohmann::json analysis = {
        {"events",
         {{{"kind", Payload("kind")}, {"start", 10}, {"end", 12}, {"detail", Payload("detail")}},
          {{"kind", "nan"}, {"start", "ten"}}}}};
    std::ofstream(dir + "/log-analysis.json") << analysis.dump();
    fs::create_directories(dir + "/metrics-archive/" + Payload("archive") +
                           "-iter9-to-iter8-20261123T000000Z-1");
    fs::create_directories(dir + "/metrics-archive/.partial-restart-iter9-to-iter8-x-2");
    std::ofstream(dir + "/CHRONICLE.md") << "- " << Payload("chronicle") << "\n";
  }
  std::string html;
  ReportSummary summary;
  Status st = BuildRunReport(Env::Default(), dir, InstalledUplot(), &html, &summary);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(summary.markers, 5);  // payload, __proto__, constructor, the finding, the archive
  EXPECT_EQ(html.find("<img"), std::string::npos);  // no markup from the data, anywhere
  EXPECT_EQ(html.find("<!--<script>"), std::string::npos);
  EXPECT_NE(html.find("events.jsonl: 3 line(s) are not keel events"), std::string::npos);
  EXPECT_NE(html.find("log-analysis.json: 1 event(s)"), std::string::npos);
  std::ofstream(dir + "/report.html") << html;
  if (!keel_test::HaveChromium()) GTEST_SKIP() << "chromium is not installed (scripts/setup.sh)";
  const keel_test::PageLoad page = keel_test::LoadInChromium(dir + "/report.html", dir);
  ASSERT_TRUE(page.ran) << page.log;
  EXPECT_EQ(page.status, "ok") << page.log;
  EXPECT_EQ(page.errors, "");
  EXPECT_EQ(keel_test::Attribute(page.dom, "html", "data-pwned"), "") << page.dom;
  EXPECT_EQ(page.dom.find("<img"), std::string::npos);
  EXPECT_EQ(page.charts, "7");  // loss, per dataset, LR, batch, grad norm, samples/s, TFLOPs
  // The legend shows each kind literally, as text.
  const size_t legend = page.dom.find("<div id=\"marker-legend\">");
  ASSERT_NE(legend, std::string::npos);
  const std::string keys = page.dom.substr(legend, page.dom.find("</div>", legend) - legend);
  for (const char* where : {"event", "kind", "archive"}) {
    std::string shown = Payload(where);
    for (size_t p = 0; (p = shown.find_first_of("<>", p)) != std::string::npos;)
      shown.replace(p, 1, shown[p] == '<' ? "&lt;" : "&gt;");
    EXPECT_NE(keys.find(shown), std::string::npos) << where << ": " << keys;
  }
  EXPECT_NE(keys.find("__proto__"), std::string::npos);
  EXPECT_NE(keys.find("constructor"), std::string::npos);
  EXPECT_EQ(keel_test::ConsoleLines(page.log), "");
  fs::remove_all(dir);
}

// Finding 9: a skipped data window trained nothing. Its loss, grad norm and throughput are gaps
// in the data (null), whether the record says so (nulls, as keel writes from now on) or carries
// a throughput from its near-zero time (as it used to: 1.2e7 samples/s); the rolling mean has a
// gap there too. An fp32 run (loss scale 1 throughout) gets no loss-scale chart, and a note says
// why. Large throughputs get short axis labels that fit.
TEST(RunReportTest, SkippedWindowIsAGapAndFp32HasNoLossScaleChart) {
  const std::string dir = keel_test::FreshTempDir("run_report_gap");
  std::vector<nlohmann::json> records;
  for (int it = 1; it <= 100; ++it) {
    nlohmann::json r = TrainRecord(it);
    r["samples_per_second"] = 12345678.0 + it * 1000;  // a big cluster: eight digits
    if (it >= 41 && it <= 60) {
      r["data_skipped"] = true;
      r["lm_loss"] = nullptr;
      r["grad_norm"] = nullptr;
      r["samples_per_second"] = it <= 50 ? nlohmann::json() : nlohmann::json(1.2e9);
      r["tflops"] = it <= 50 ? nlohmann::json() : nlohmann::json(5e4);
    }
    records.push_back(r);
  }
  WriteMetrics(dir, records);
  std::string html;
  ReportSummary summary;
  ASSERT_TRUE(BuildRunReport(Env::Default(), dir, InstalledUplot(), &html, &summary).ok());
  const nlohmann::json d = EmbeddedData(html);
  const nlohmann::json& t = d["train"];
  for (size_t i = 0; i < 100; ++i) {
    const bool skipped = i >= 40 && i < 60;
    for (const char* k : {"lm_loss", "lm_loss_mean", "grad_norm", "samples_per_second", "tflops"})
      EXPECT_EQ(t[k][i].is_null(), skipped) << k << " at iteration " << i + 1;
    EXPECT_EQ(t["loss_scale"][i], 1.0);
  }
  EXPECT_NE(html.find("20 iterations of skipped data windows trained nothing"), std::string::npos);
  std::ofstream(dir + "/report.html") << html;
  if (!keel_test::HaveChromium()) GTEST_SKIP() << "chromium is not installed (scripts/setup.sh)";
  const keel_test::PageLoad page = keel_test::LoadInChromium(dir + "/report.html", dir);
  ASSERT_TRUE(page.ran) << page.log;
  EXPECT_EQ(page.status, "ok") << page.log;
  EXPECT_EQ(page.errors, "");
  EXPECT_EQ(page.charts, "6");  // loss, LR, batch, grad norm, samples/s, TFLOPs
  EXPECT_EQ(ChartTag(page.dom, "loss scale"), "");
  EXPECT_NE(Notes(page.dom).find("loss scale: 1 at every iteration (no loss scaling, as in fp32 "
                                 "training); not charted"),
            std::string::npos)
      << Notes(page.dom);
  const std::string sps = ChartTag(page.dom, "throughput: samples per second");
  ASSERT_NE(sps, "") << page.dom;
  const std::string labels = TagAttribute(sps, "data-y-labels");
  ASSERT_NE(labels, "") << sps;
  std::istringstream in(labels);
  int n = 0;
  for (std::string label; std::getline(in, label, '|'); ++n) {
    EXPECT_LE(label.size(), 7u) << labels;  // 12.375M, not 12375000
    EXPECT_EQ(label.back(), 'M') << labels;
  }
  EXPECT_GE(n, 2) << labels;
  EXPECT_GE(std::stoi(TagAttribute(sps, "data-y-size")),
            std::stoi(TagAttribute(sps, "data-y-label-width")) + 15)
      << sps;
  EXPECT_EQ(keel_test::ConsoleLines(page.log), "");
  fs::remove_all(dir);
}

// A mixed-precision run: its dynamic loss scale is charted.
TEST(RunReportTest, MixedPrecisionRunShowsItsLossScale) {
  const std::string dir = keel_test::FreshTempDir("run_report_fp16");
  std::vector<nlohmann::json> records;
  for (int it = 1; it <= 60; ++it) {
    records.push_back(TrainRecord(it));
    records.back()["loss_scale"] = it < 30 ? 65536.0 : 32768.0;
  }
  WriteMetrics(dir, records);
  std::string html;
  ReportSummary summary;
  ASSERT_TRUE(BuildRunReport(Env::Default(), dir, InstalledUplot(), &html, &summary).ok());
  std::ofstream(dir + "/report.html") << html;
  if (!keel_test::HaveChromium()) GTEST_SKIP() << "chromium is not installed (scripts/setup.sh)";
  const keel_test::PageLoad page = keel_test::LoadInChromium(dir + "/report.html", dir);
  ASSERT_TRUE(page.ran) << page.log;
  EXPECT_EQ(page.status, "ok") << page.log;
  EXPECT_EQ(page.charts, "7");
  const std::string scale = ChartTag(page.dom, "loss scale");
  ASSERT_NE(scale, "") << page.dom;
  EXPECT_NE(TagAttribute(scale, "data-y-labels").find("k"), std::string::npos) << scale;
  EXPECT_EQ(Notes(page.dom).find("loss scale"), std::string::npos);
  fs::remove_all(dir);
}

// metrics.jsonl lines of the wrong shape are refused by line; a file that goes back in iterations
// (records appended without a rewind) is drawn as the rewind would have left it, with a note.
TEST(RunReportTest, MistypedRecordsAreNamedAndAFileThatGoesBackIsNoted) {
  const std::string dir = keel_test::FreshTempDir("run_report_types");
  std::ofstream(dir + "/metrics.jsonl") << TrainRecord(1).dump() << "\n"
                                        << R"({"kind": 5, "iteration": 2})"
                                        << "\n";
  std::string html;
  ReportSummary summary;
  Status st = BuildRunReport(Env::Default(), dir, InstalledUplot(), &html, &summary);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("metrics.jsonl:2: \"kind\" is not a string"), std::string::npos)
      << st.message();
  std::ofstream(dir + "/metrics.jsonl") << R"({"kind": "train", "iteration": "2"})"
                                        << "\n";
  st = BuildRunReport(Env::Default(), dir, InstalledUplot(), &html, &summary);
  EXPECT_NE(st.message().find("metrics.jsonl:1: a train record without an integer"),
            std::string::npos)
      << st.message();

  std::vector<nlohmann::json> records;
  for (int it = 1; it <= 10; ++it) records.push_back(TrainRecord(it));
  for (int it = 5; it <= 8; ++it) records.push_back(TrainRecord(it));
  WriteMetrics(dir, records);
  st = BuildRunReport(Env::Default(), dir, InstalledUplot(), &html, &summary);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(EmbeddedData(html)["train"]["iteration"],
            nlohmann::json::parse("[1, 2, 3, 4, 5, 6, 7, 8]"));
  EXPECT_NE(html.find("metrics.jsonl line 11: train iteration 5 follows iteration 10: the 6 "
                      "earlier train record(s) from iteration 5 on are replaced"),
            std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace keel
