#include "report/run_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/json_number.h"
#include "journal/journal_event.h"
#include "journal/run_journal.h"
#include "logs/log_analysis.h"
#include "metrics/run_metrics.h"
#include "report/goodput.h"

namespace keel {
namespace {

using nlohmann::json;

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// `code` and **bold** inside an escaped line.
std::string Inline(const std::string& text) {
  std::string s = Escape(text), out;
  bool code = false, bold = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '`') {
      out += code ? "</code>" : "<code>";
      code = !code;
    } else if (!code && s.compare(i, 2, "**") == 0) {
      out += bold ? "</strong>" : "<strong>";
      bold = !bold;
      ++i;
    } else {
      out += s[i];
    }
  }
  if (code) out += "</code>";
  if (bold) out += "</strong>";
  return out;
}

// A JSON number, or null for NaN/missing (uPlot draws a gap).
json Num(const json& r, const char* key) {
  return r.contains(key) && r[key].is_number() ? JsonNumber(r[key].get<double>()) : json(nullptr);
}

// Fields of records read from disk, which people and other tools edit: a value of another type
// than keel writes is "absent", never an exception.
std::string Str(const json& j, const char* key, const std::string& fallback) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : fallback;
}
bool Int(const json& j, const char* key, int64_t* out) {
  if (!j.contains(key) || !j[key].is_number_integer()) return false;
  if (j[key].is_number_unsigned() && j[key].get<uint64_t>() > uint64_t{INT64_MAX}) return false;
  *out = j[key].get<int64_t>();
  return true;
}

// One row of per-dataset loss columns: a dataset first seen now gets a column padded with nulls
// for the `rows` before it; a dataset this record lacks (or all of them, `gap`) gets a null.
void AppendDatasetLosses(const json& r, size_t rows, bool gap, json* columns) {
  const bool has = !gap && r.contains("datasets") && r["datasets"].is_object();
  if (has)
    for (const auto& [name, d] : r["datasets"].items())
      if (!columns->contains(name)) (*columns)[name] = json(std::vector<json>(rows, nullptr));
  for (auto& [name, col] : columns->items())
    col.push_back(has && r["datasets"].contains(name) ? Num(r["datasets"][name], "lm_loss")
                                                      : json(nullptr));
}

// Drops the last rows of `columns` (arrays and per-dataset arrays) down to `rows`.
void Truncate(json* columns, size_t rows) {
  for (auto& [key, col] : columns->items()) {
    if (col.is_object()) {
      Truncate(&col, rows);
    } else {
      if (col.size() > rows) col.get_ref<json::array_t&>().resize(rows);
    }
  }
}

// Trailing mean over the last `w` finite values; a gap where the value itself is missing (an
// iteration that trained nothing has no loss to smooth).
json RollingMean(const json& values, size_t w) {
  json out = json::array();
  std::vector<double> window;
  double sum = 0;
  for (const json& v : values) {
    if (!v.is_number()) {
      out.push_back(nullptr);
      continue;
    }
    window.push_back(v.get<double>());
    sum += window.back();
    if (window.size() > w) {
      sum -= window.front();
      window.erase(window.begin());
    }
    out.push_back(sum / static_cast<double>(window.size()));
  }
  return out;
}

// "<reason>-iter<last>-to-iter<at>-<time>[-<n>]" of metrics-archive/: the iteration the run went
// back to.
bool ParseArchiveName(const std::string& name, std::string* reason, int64_t* from, int64_t* to) {
  const size_t a = name.find("-iter"), b = name.find("-to-iter");
  if (a == std::string::npos || b == std::string::npos || b < a) return false;
  *reason = name.substr(0, a);
  *from = std::strtoll(name.c_str() + a + 5, nullptr, 10);
  *to = std::strtoll(name.c_str() + b + 8, nullptr, 10);
  return true;
}

constexpr const char* kPageScript = R"JS(
(function () {
  // Everything from the run's files is data: it reaches the page as text (textContent), never
  // as HTML.
  const D = JSON.parse(document.getElementById('keel-data').textContent);
  const colors = {rollback: '#d62728', divergence: '#d62728', detected: '#ff7f0e',
    spike_recovered: '#ff7f0e', resume_spike: '#ff7f0e', spike_unresolved: '#ff7f0e',
    skip: '#7f7f7f', skipped: '#7f7f7f', skip_range: '#7f7f7f', nan: '#9467bd',
    restart: '#1f77b4', resume: '#1f77b4', resumed: '#1f77b4', throughput_drop: '#8c564b',
    throughput_recovered: '#bcbd22'};
  const colorOf = (k) => Object.prototype.hasOwnProperty.call(colors, k) ? colors[k] : '#17becf';
  const palette = ['#1f77b4', '#2ca02c', '#9467bd', '#8c564b', '#e377c2', '#17becf', '#bcbd22'];

  // Dashed vertical line at each marked iteration, on every chart.
  const markers = {hooks: {draw: [(u) => {
    const ctx = u.ctx;
    ctx.save();
    ctx.lineWidth = 2 * devicePixelRatio;
    ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
    for (const m of D.markers) {
      const x = u.valToPos(m.iteration, 'x', true);
      if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
      ctx.strokeStyle = colorOf(m.kind);
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
    }
    ctx.restore();
  }]}};

  // Axis numbers, short (12.3k, 12M, 3e-4) with as many digits as the ticks need to be exact.
  const SI = [[1e12, 'T'], [1e9, 'G'], [1e6, 'M'], [1e3, 'k']];
  function number(v, p) {  // [label, the value it says]
    if (v === 0) return ['0', 0];
    const a = Math.abs(v);
    if (a < 0.01 || a >= 1e15) {
      const t = v.toExponential(p - 1);
      return [t.replace(/\.?0+e/, 'e').replace('e+', 'e'), Number(t)];
    }
    if (a >= 1e4)
      for (const [d, s] of SI)
        if (a >= d) {
          const m = Number((v / d).toPrecision(p));
          return [String(m) + s, m * d];
        }
    const m = Number(v.toPrecision(p));
    return [String(m), m];
  }
  function tickLabels(u, vals, ai, space, incr) {
    const tol = Math.abs(incr || 0) * 1e-3;
    for (let p = 1; ; p++) {
      const out = vals.map((v) => v === null ? ['', null] : number(v, p));
      if (p >= 9 || out.every(([, n], i) => vals[i] === null || Math.abs(n - vals[i]) <= tol))
        return out.map(([t]) => t);
    }
  }
  // The y axis is as wide as its longest label (a fixed width cut seven-digit numbers).
  const measure = document.createElement('canvas').getContext('2d');
  function axisSize(el, u, values, i) {
    const axis = u.axes[i];
    measure.font = axis.font ? axis.font[0] : '12px sans-serif';
    let w = 0;
    for (const v of values || []) w = Math.max(w, measure.measureText(v).width / devicePixelRatio);
    const size = Math.max(40, Math.ceil(w) + axis.ticks.size + axis.gap + 6);
    if (values) {  // what a reader sees, for tests and anyone inspecting the page
      el.dataset.yLabels = values.join('|');
      el.dataset.yLabelWidth = Math.ceil(w);
      el.dataset.ySize = size;
    }
    return size;
  }

  const width = Math.max(480, Math.min(1100, window.innerWidth - 48));
  let charts = 0;
  function chart(title, x, series) {
    const present = series.filter((s) => s.values.some((v) => v !== null));
    if (present.length === 0 || x.length === 0) return;
    const el = document.createElement('div');
    el.className = 'chart';
    el.dataset.title = title;
    document.getElementById('charts').appendChild(el);
    const opts = {
      title: title, width: width, height: 260, plugins: [markers],
      scales: {x: {time: false}},
      axes: [{label: 'iteration'},
        {size: (u, values, i) => axisSize(el, u, values, i), values: tickLabels}],
      series: [{label: 'iteration'}].concat(present.map((s, i) => ({
        label: s.label, stroke: s.stroke || palette[i % palette.length],
        width: s.width || 1.5, spanGaps: false, points: {show: x.length < 60}}))),
    };
    new uPlot(opts, [x].concat(present.map((s) => s.values)), el);
    charts++;
  }
  function note(text) {
    const li = document.createElement('li');
    li.textContent = text;
    document.getElementById('notes').appendChild(li);
  }

  const T = D.train, V = D.validation;
  chart('lm loss (training)', T.iteration, [
    {label: 'lm loss', values: T.lm_loss, stroke: 'rgba(31,119,180,0.45)', width: 1},
    {label: 'rolling mean (' + D.rolling_window + ')', values: T.lm_loss_mean, stroke: '#0b3d91', width: 2.5}]);
  const ds = Object.keys(T.datasets);
  if (ds.length > 0)
    chart('lm loss per dataset', T.iteration, ds.map((n) => ({label: n, values: T.datasets[n]})));
  chart('validation lm loss', V.iteration, [{label: 'lm loss validation', values: V.lm_loss, stroke: '#d62728'}]
    .concat(Object.keys(V.datasets).map((n) => ({label: n, values: V.datasets[n]}))));
  chart('learning rate', T.iteration, [{label: 'learning rate', values: T.learning_rate}]);
  chart('global batch size', T.iteration, [{label: 'batch size', values: T.global_batch_size}]);
  chart('grad norm', T.iteration, [{label: 'grad norm', values: T.grad_norm, stroke: '#2ca02c'}]);
  const scales = T.loss_scale.filter((v) => v !== null);
  if (scales.length > 0 && scales.every((v) => v === 1))
    note('loss scale: 1 at every iteration (no loss scaling, as in fp32 training); not charted');
  else
    chart('loss scale', T.iteration, [{label: 'loss scale', values: T.loss_scale}]);
  chart('throughput: samples per second', T.iteration,
    [{label: 'samples per second', values: T.samples_per_second, stroke: '#8c564b'}]);
  chart('throughput: TFLOPs per GPU', T.iteration,
    [{label: 'TFLOPs', values: T.tflops, stroke: '#e377c2'}]);

  const legend = document.getElementById('marker-legend');
  for (const k of [...new Set(D.markers.map((m) => m.kind))]) {
    const span = document.createElement('span');
    span.className = 'key';
    const swatch = document.createElement('i');
    swatch.style.borderColor = colorOf(k);
    span.appendChild(swatch);
    span.appendChild(document.createTextNode(k));
    legend.appendChild(span);
  }
  document.body.dataset.charts = charts;
  document.body.dataset.status = 'ok';
})();
)JS";

constexpr const char* kPageStyle = R"CSS(
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; } td, th { padding: 3px 10px; border-bottom: 1px solid #ddd;
  text-align: left; vertical-align: top; }
.chart { margin: 12px 0 20px; } .key { margin-right: 14px; }
.key i { display: inline-block; width: 18px; border-top: 2px dashed; margin-right: 5px;
  vertical-align: middle; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; }
#chronicle { max-width: 1100px; }
#goodput-bar { display: flex; width: 100%; max-width: 1100px; height: 26px;
  border: 1px solid #999; margin: 8px 0; }
#goodput-bar div { height: 100%; }
.swatch { display: inline-block; width: 12px; height: 12px; margin-right: 6px;
  vertical-align: middle; }
)CSS";

// One colour per goodput category (report/goodput.h), in its order.
constexpr const char* kGoodputColours[] = {"#2e9d4a", "#d62728", "#1f77b4", "#9467bd", "#8c8c8c",
                                           "#ff7f0e", "#8c564b", "#e377c2", "#bcbd22", "#c7c7c7"};

// The job's wall time as a stacked bar, each category's share its width, and a table.
std::string GoodputHtml(const GoodputBreakdown& g) {
  const auto& cats = GoodputCategories();
  const double w = g.wall_seconds > 0 ? g.wall_seconds : 1.0;
  std::string
      bar = "<div id=\"goodput-bar\">",
      table =
          "<table id=\"goodput-table\"><tr><th>category</th><th>seconds</th><th>share</th></tr>\n";
  for (size_t i = 0; i < cats.size() && i < g.seconds.size(); ++i) {
    const double share = 100.0 * std::max(0.0, g.seconds[i]) / w;
    const char* colour = kGoodputColours[i % std::size(kGoodputColours)];
    if (share > 0)
      bar += fmt::format(
          "<div data-category=\"{}\" style=\"width:{:.3f}%;background:{}\" title=\"{}: {:.1f} "
          "s ({:.1f}%)\"></div>",
          cats[i].first, share, colour, Escape(cats[i].second), g.seconds[i], share);
    table += fmt::format(
        "<tr><td><span class=\"swatch\" style=\"background:{}\"></span>{}</td><td>{:.1f}</td>"
        "<td>{:.1f}%</td></tr>\n",
        colour, Escape(cats[i].second), g.seconds[i], share);
  }
  return fmt::format(
             "<p>{:.1f}% of {:.1f} s wall time productive ({} process{}{}): "
             "<code>keel goodput</code> prints the same.</p>\n",
             100.0 * g.Of("productive") / w, g.wall_seconds, g.processes,
             g.processes == 1 ? "" : "es",
             g.attempts > 0 ? fmt::format(", {} keel launch attempts", g.attempts)
                            : std::string()) +
         bar + "</div>\n" + table + "</table>\n";
}

}  // namespace

std::string MarkdownToHtml(const std::string& md) {
  std::istringstream in(md);
  std::string line, out, para;
  bool list = false, code = false;
  auto close_para = [&] {
    if (!para.empty()) out += "<p>" + Inline(para) + "</p>\n";
    para.clear();
  };
  auto close_list = [&] {
    if (list) out += "</ul>\n";
    list = false;
  };
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) {
      close_para();
      close_list();
      out += code ? "</pre>\n" : "<pre>";
      code = !code;
      continue;
    }
    if (code) {
      out += Escape(line) + "\n";
      continue;
    }
    size_t h = 0;
    while (h < line.size() && line[h] == '#') ++h;
    if (h > 0 && h <= 6 && h < line.size() && line[h] == ' ') {
      close_para();
      close_list();
      out +=
          fmt::format("<h{0}>{1}</h{0}>\n", std::min<size_t>(h + 2, 6), Inline(line.substr(h + 1)));
    } else if (line.rfind("- ", 0) == 0 || line.rfind("* ", 0) == 0) {
      close_para();
      if (!list) out += "<ul>\n";
      list = true;
      out += "<li>" + Inline(line.substr(2)) + "</li>\n";
    } else if (line.find_first_not_of(" \t") == std::string::npos) {
      close_para();
      close_list();
    } else {
      close_list();
      para += (para.empty() ? "" : " ") + line;
    }
  }
  close_para();
  close_list();
  if (code) out += "</pre>\n";
  return out;
}

Status BuildRunReport(Env* env, const std::string& run_dir, const ReportAssets& assets,
                      std::string* html, ReportSummary* summary) {
  const std::string metrics_path = JoinPath(run_dir, kMetricsFile);
  std::string text;
  if (!env->FileExists(metrics_path)) {
    return Status::NotFound(fmt::format(
        "{} has no {}: give the --save directory of a `keel train` run (keel writes metrics "
        "there) or the output of `keel logs analyze LOG --to-metrics DIR`",
        run_dir, kMetricsFile));
  }
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(metrics_path, &text));

  json T = {{"iteration", json::array()},          {"lm_loss", json::array()},
            {"learning_rate", json::array()},      {"global_batch_size", json::array()},
            {"grad_norm", json::array()},          {"loss_scale", json::array()},
            {"samples_per_second", json::array()}, {"tflops", json::array()},
            {"datasets", json::object()}};
  json V = {{"iteration", json::array()}, {"lm_loss", json::array()}, {"datasets", json::object()}};
  // What the page says about its inputs besides the charts: lines it could not use, records it
  // did not draw. Nothing is dropped without a word.
  std::vector<std::string> notes;
  std::istringstream lines(text);
  std::string line;
  int lineno = 0;
  size_t n_train = 0, n_valid = 0;
  int64_t skipped_iterations = 0;
  while (std::getline(lines, line)) {
    ++lineno;
    if (line.empty()) continue;
    const json r = json::parse(line, nullptr, false);
    if (r.is_discarded() || !r.is_object()) {
      return Status::Corruption(fmt::format(
          "{}:{}: not a JSON object; the file was edited or cut: fix or remove that line",
          metrics_path, lineno));
    }
    if (r.contains("kind") && !r["kind"].is_string())
      return Status::Corruption(fmt::format(
          "{}:{}: \"kind\" is not a string: fix or remove that line", metrics_path, lineno));
    const std::string kind = Str(r, "kind", "");
    if (kind != "train" && kind != "validation") continue;
    int64_t it = 0;
    if (!Int(r, "iteration", &it))
      return Status::Corruption(
          fmt::format("{}:{}: a {} record without an integer \"iteration\": fix or remove that "
                      "line",
                      metrics_path, lineno, kind));
    json& C = kind == "train" ? T : V;
    size_t& n = kind == "train" ? n_train : n_valid;
    // The file goes back (records appended after a resume without a rewind, or files joined by
    // hand): the later records win, as a rewind would have made them.
    if (n > 0 && it <= C["iteration"].back().get<int64_t>()) {
      size_t keep = n;
      while (keep > 0 && C["iteration"][keep - 1].get<int64_t>() >= it) --keep;
      notes.push_back(fmt::format(
          "{} line {}: {} iteration {} follows iteration {}: the {} earlier {} record(s) from "
          "iteration {} on are replaced by the later ones and not drawn",
          kMetricsFile, lineno, kind, it, C["iteration"].back().get<int64_t>(), n - keep, kind,
          it));
      Truncate(&C, keep);
      n = keep;
    }
    if (kind == "train") {
      // An iteration of a skipped data window trained nothing: its loss and throughput are gaps
      // (older files wrote a throughput for it from its near-zero time).
      const bool gap = r.contains("data_skipped") && r["data_skipped"].is_boolean() &&
                       r["data_skipped"].get<bool>();
      skipped_iterations += gap;
      T["iteration"].push_back(it);
      for (const char* k : {"lm_loss", "learning_rate", "global_batch_size", "grad_norm",
                            "loss_scale", "samples_per_second", "tflops"})
        T[k].push_back(Num(r, k));
      if (gap)
        for (const char* k : {"lm_loss", "grad_norm", "samples_per_second", "tflops"})
          T[k].back() = nullptr;
      AppendDatasetLosses(r, n_train++, gap, &T["datasets"]);
    } else {
      V["iteration"].push_back(it);
      V["lm_loss"].push_back(Num(r, "lm_loss"));
      AppendDatasetLosses(r, n_valid++, false, &V["datasets"]);
    }
  }
  if (skipped_iterations > 0)
    notes.push_back(fmt::format(
        "{} iterations of skipped data windows trained nothing: the loss, grad norm and "
        "throughput charts have gaps there",
        skipped_iterations));
  const size_t window = std::clamp<size_t>(n_train / 50, 5, 200);
  T["lm_loss_mean"] = RollingMean(T["lm_loss"], window);

  // Markers: the guard's journal, the archive of rewinds, and a converted log's findings.
  struct Marker {
    int64_t iteration, end;
    std::string kind, source, detail;
  };
  std::vector<Marker> markers;
  std::string journal;
  if (env->ReadFileToString(JoinPath(run_dir, kEventsFile), &journal).ok()) {
    std::istringstream jl(journal);
    int n = 0, unreadable = 0, first_unreadable = 0;
    while (std::getline(jl, line)) {
      ++n;
      if (line.empty()) continue;
      const json e = json::parse(line, nullptr, false);
      JournalLineHeader h;
      if (!JournalLineHeader::FromJson(e, kEventsFile, &h).ok()) {
        if (unreadable++ == 0) first_unreadable = n;
        continue;
      }
      if (!h.iteration) continue;  // a decision about the run, not an iteration (the guard's stop)
      auto text = [](const std::optional<json>& v) {
        return v && v->is_string() ? v->get<std::string>() : std::string();
      };
      std::string detail = text(h.reason);
      if (detail.empty()) detail = text(h.signal);
      const std::string at = text(h.at);
      if (!at.empty()) detail += (detail.empty() ? "" : "; ") + at;
      markers.push_back(
          {*h.iteration, *h.iteration, h.event.value_or("event"), kEventsFile, detail});
    }
    if (unreadable > 0)
      notes.push_back(fmt::format(
          "events.jsonl: {} line(s) are not keel events (not a JSON object, or an \"iteration\" "
          "or \"event\" of the wrong type; the first is line {}): not marked",
          unreadable, first_unreadable));
  }
  std::vector<std::string> archives;
  if (env->GetChildren(JoinPath(run_dir, kMetricsArchiveDir), &archives).ok()) {
    std::sort(archives.begin(), archives.end());
    for (const std::string& a : archives) {
      if (a.empty() || a[0] == '.') continue;  // an archive being assembled
      std::string reason;
      int64_t from = 0, to = 0;
      if (!ParseArchiveName(a, &reason, &from, &to)) {
        notes.push_back(fmt::format("{}/{}: not named as keel names its archives: not marked",
                                    kMetricsArchiveDir, a));
        continue;
      }
      markers.push_back({to, from, reason, "metrics-archive",
                         fmt::format("the run went back from iteration {} to {}; the curves it "
                                     "left are in {}/{}",
                                     from, to, kMetricsArchiveDir, a)});
    }
  }
  std::string analysis_text;
  if (env->ReadFileToString(JoinPath(run_dir, kLogAnalysisFile), &analysis_text).ok()) {
    const json a = json::parse(analysis_text, nullptr, false);
    int unreadable = 0;
    if (a.is_object() && a.contains("events") && a["events"].is_array()) {
      for (const json& e : a["events"]) {
        int64_t start = 0, end = 0;
        if (!e.is_object() || !Int(e, "start", &start)) {
          ++unreadable;
          continue;
        }
        if (!Int(e, "end", &end)) end = start;
        markers.push_back(
            {start, end, Str(e, "kind", "event"), kLogAnalysisFile, Str(e, "detail", "")});
      }
    } else {
      ++unreadable;
    }
    if (unreadable > 0)
      notes.push_back(fmt::format(
          "{}: {} event(s) (or the whole file) are not as `keel logs analyze` writes them: not "
          "marked",
          kLogAnalysisFile, unreadable));
  }
  std::stable_sort(markers.begin(), markers.end(),
                   [](const Marker& a, const Marker& b) { return a.iteration < b.iteration; });
  json M = json::array();
  for (const Marker& m : markers) M.push_back({{"iteration", m.iteration}, {"kind", m.kind}});

  const json data = {{"train", T}, {"validation", V}, {"markers", M}, {"rolling_window", window}};
  // Inside <script>, "</script" would end the element and "<!--" can keep it from ending: no
  // '<', '>' or '&' appears in the JSON text (they only occur in strings, where \u escapes mean
  // the same). Bytes that are not UTF-8 (a directory name) become U+FFFD.
  std::string data_text;
  for (char c : data.dump(-1, ' ', false, json::error_handler_t::replace)) {
    if (c == '<')
      data_text += "\\u003c";
    else if (c == '>')
      data_text += "\\u003e";
    else if (c == '&')
      data_text += "\\u0026";
    else
      data_text += c;
  }

  // Summary line.
  std::string summary_html;
  if (n_train > 0) {
    const json& its = T["iteration"];
    const json& losses = T["lm_loss"];
    json last_loss = nullptr;
    for (size_t i = losses.size(); i-- > 0;)
      if (losses[i].is_number()) {
        last_loss = losses[i];
        break;
      }
    summary_html += fmt::format("iterations {} to {} ({} records)", its.front().get<int64_t>(),
                                its.back().get<int64_t>(), n_train);
    if (last_loss.is_number())
      summary_html += fmt::format("; last lm loss {:.4f}", last_loss.get<double>());
  }
  if (n_valid > 0 && V["lm_loss"].back().is_number())
    summary_html +=
        fmt::format("; last validation lm loss {:.4f} at iteration {}",
                    V["lm_loss"].back().get<double>(), V["iteration"].back().get<int64_t>());
  summary_html += fmt::format("; {} marked events", markers.size());

  std::string events_html;
  if (markers.empty()) {
    events_html = "<p>No guard decisions, rollbacks, restarts or log findings.</p>\n";
  } else {
    events_html = "<table><tr><th>iteration</th><th>event</th><th>from</th><th>detail</th></tr>\n";
    for (const Marker& m : markers) {
      const std::string range = m.end != m.iteration && m.end > m.iteration
                                    ? fmt::format("{}-{}", m.iteration, m.end)
                                    : std::to_string(m.iteration);
      events_html += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n", range,
                                 Escape(m.kind), Escape(m.source), Escape(m.detail));
    }
    events_html += "</table>\n";
  }
  std::string chronicle;
  std::string chronicle_html = "<p>No CHRONICLE.md in this directory.</p>\n";
  if (env->ReadFileToString(JoinPath(run_dir, "CHRONICLE.md"), &chronicle).ok())
    chronicle_html = MarkdownToHtml(chronicle);

  std::string& h = *html;
  h = "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  h += "<title>keel report: " + Escape(run_dir) + "</title>\n";
  h += "<style>" + assets.uplot_css + "</style>\n<style>" + kPageStyle + "</style>\n";
  // Before anything else runs: record script errors on the page for people and for tests.
  h += "<script>window.addEventListener('error', function (e) { document.documentElement.dataset."
       "errors = (document.documentElement.dataset.errors || '') + e.message + '\\n'; "
       "});</script>\n";
  h += "</head><body>\n";
  h += "<h1>keel report: " + Escape(run_dir) + "</h1>\n<p>" + Escape(summary_html) + "</p>\n";
  h += "<ul id=\"notes\">\n";
  for (const std::string& n : notes) h += "<li>" + Escape(n) + "</li>\n";
  h += "</ul>\n";
  h += "<div id=\"marker-legend\"></div>\n<div id=\"charts\"></div>\n";
  // Where the job's time went, when its journal has goodput records (report/goodput.h).
  if (GoodputBreakdown g; ComputeGoodput(env, run_dir, &g).ok())
    h += "<h2>Goodput</h2>\n<div id=\"goodput\">\n" + GoodputHtml(g) + "</div>\n";
  h += "<h2>Events</h2>\n" + events_html;
  h += "<h2>Chronicle</h2>\n<div id=\"chronicle\">\n" + chronicle_html + "</div>\n";
  h += "<script id=\"keel-data\" type=\"application/json\">" + data_text + "</script>\n";
  h += "<script>" + assets.uplot_js + "</script>\n";
  h += std::string("<script>") + kPageScript + "</script>\n</body></html>\n";
  if (summary) {
    summary->train_records = static_cast<int64_t>(n_train);
    summary->validation_records = static_cast<int64_t>(n_valid);
    summary->markers = static_cast<int64_t>(markers.size());
  }
  return Status::OK();
}

}  // namespace keel
