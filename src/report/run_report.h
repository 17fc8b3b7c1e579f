// RunReport: one self-contained HTML page of a run directory (`keel report RUN_DIR`): the curves
// of metrics.jsonl (loss raw and rolling mean, per dataset, validation, LR, batch size, grad norm,
// loss scale, throughput and TFLOPs) drawn by uPlot, with the run's events marked on every curve
// (guard decisions from events.jsonl, rollbacks and restarts from metrics-archive/, findings of
// `keel logs analyze` from log-analysis.json), an event table, and CHRONICLE.md rendered below.
// Everything, uPlot included, is inlined: the file opens offline and can be mailed.
#pragma once

#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace keel {

struct ReportAssets {
  std::string uplot_js;   // uPlot.iife.min.js
  std::string uplot_css;  // uPlot.min.css
};

struct ReportSummary {
  int64_t train_records = 0, validation_records = 0, markers = 0;
};

// Fails when the directory has no metrics.jsonl or a line of it is not JSON (naming the line).
Status BuildRunReport(Env* env, const std::string& run_dir, const ReportAssets& assets,
                      std::string* html, ReportSummary* summary);

// The subset of Markdown keel's chronicles use (headings, lists, code blocks, `code`, **bold**,
// paragraphs), HTML-escaped.
std::string MarkdownToHtml(const std::string& markdown);

}  // namespace keel
