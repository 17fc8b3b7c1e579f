// `keel bench parallel --quick`: the bytes every rank of T2, T2 SP, P2, P2 V2 and T2xP2 (SP) sends
// on the real GPT-2 and Llama stages equal the analytic counts exactly (bytes are deterministic),
// and a few are checked here against the counts worked out by hand; the bubble table runs (its
// timings are only sanity-checked).
#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "keel_process.h"

namespace {

using keel_test::RunKeelShell;

struct Row {
  std::string shape, layout, stage;
  int64_t tensor = -1, tensor_analytic = -1, pipeline = -1, pipeline_analytic = -1;
  std::string ratio;
};

// The table's rows (the layout column may hold two words: "T2 SP", "P2 V2").
std::vector<Row> Rows(const std::string& out) {
  std::vector<Row> rows;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("gpt2 ", 0) != 0 && line.rfind("llama ", 0) != 0) continue;
    std::istringstream f(line);
    std::vector<std::string> w;
    for (std::string x; f >> x;) w.push_back(x);
    if (w.size() != 11 && w.size() != 12) continue;
    const size_t k = w.size() - 11;  // 1 when the layout is two words
    Row r;
    r.shape = w[0];
    r.layout = k ? w[1] + " " + w[2] : w[1];
    r.stage = w[2 + k];
    r.tensor = std::stoll(w[4 + k]);
    r.tensor_analytic = std::stoll(w[5 + k]);
    r.pipeline = std::stoll(w[6 + k]);
    r.pipeline_analytic = std::stoll(w[7 + k]);
    r.ratio = w[9 + k];
    rows.push_back(r);
  }
  return rows;
}

const Row* Find(const std::vector<Row>& rows, const std::string& shape, const std::string& layout,
                const std::string& stage) {
  for (const Row& r : rows) {
    if (r.shape == shape && r.layout == layout && r.stage == stage) return &r;
  }
  return nullptr;
}

TEST(BenchParallelCli, QuickBytesPerRankEqualTheAnalyticCounts) {
  const auto r = RunKeelShell("", "bench parallel --quick --bytes");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("every rank: measured == analytic"), std::string::npos) << r.out;
  const std::vector<Row> rows = Rows(r.out);
  // 2 shapes: T2 and T2 SP one stage, P2, P2 V2, T2xP2, T2xP2 SP two stages each.
  ASSERT_EQ(rows.size(), 20u) << r.out;
  for (const Row& row : rows) {
    EXPECT_EQ(row.tensor, row.tensor_analytic)
        << row.shape << " " << row.layout << " " << row.stage;
    EXPECT_EQ(row.pipeline, row.pipeline_analytic)
        << row.shape << " " << row.layout << " " << row.stage;
    EXPECT_EQ(row.ratio, "1.0000");
  }
  // By hand, for the quick shapes (4 layers, h 64, b 2, s 32: b s h = 4096 floats; m = 4; padded
  // vocabulary 1024). At T = 2 an all-reduce of n floats sends n floats per rank (half in the
  // reduce-scatter, half in the all-gather), an all-gather or reduce-scatter of b s h in halves
  // sends b s h / 2.
  const int64_t m = 4, L = 4, X = 4096, N = 64, f = 4;
  const int64_t ce = m * (N * f + 2 * N * f);  // row max gathered, 2 b s sums all-reduced
  // T2: per layer 4 all-reduces of b s h, plus the embedding's and the output layer's.
  const Row* t2 = Find(rows, "gpt2", "T2", "0");
  ASSERT_NE(t2, nullptr) << r.out;
  EXPECT_EQ(t2->tensor, m * (4 * L + 2) * X * f + ce);
  // Llama T2 SP: 8 half-size transfers per layer, 2 each for the embedding and the output
  // layer, and the RMSNorm weights' gradients (2 per layer + the final one, h each) all-reduced.
  const Row* sp = Find(rows, "llama", "T2 SP", "0");
  ASSERT_NE(sp, nullptr) << r.out;
  EXPECT_EQ(sp->tensor, m * (8 * L + 4) * (X / 2) * f + m * (2 * L + 1) * 64 * f + ce);
  // GPT-2 P2: each stage sends one b s h per micro-batch (activation or gradient), the tied
  // embedding's gradient (1024 x 64) once, and the loss (a double).
  for (const char* stage : {"0", "1"}) {
    const Row* p2 = Find(rows, "gpt2", "P2", stage);
    ASSERT_NE(p2, nullptr) << r.out;
    EXPECT_EQ(p2->pipeline, m * X * f + 1024 * 64 * f + 8) << stage;
    EXPECT_EQ(p2->tensor, 0);
  }
  // Llama (untied) P2 V2: stage 0 holds virtual stages 0 and 2 (3 boundary messages per
  // micro-batch: 0 forward, 2 both ways), stage 1 holds 1 and 3 (also 3).
  for (const char* stage : {"0", "1"}) {
    const Row* v2 = Find(rows, "llama", "P2 V2", stage);
    ASSERT_NE(v2, nullptr) << r.out;
    EXPECT_EQ(v2->pipeline, m * 3 * X * f + 8) << stage;
  }
  // T2xP2 SP: the boundary is each tensor rank's half of the rows.
  const Row* tp = Find(rows, "llama", "T2xP2 SP", "0");
  ASSERT_NE(tp, nullptr) << r.out;
  EXPECT_EQ(tp->pipeline, m * (X / 2) * f + 8);
}

TEST(BenchParallelCli, QuickBubbleTableRuns) {
  const auto r = RunKeelShell("", "bench parallel --quick --bubble");
  ASSERT_EQ(r.code, 0) << r.out;
  // P 2, V 1, m 4: formula 20.0%; P 2, V 2, m 4: 11.1%, and the simulation agrees.
  std::istringstream in(r.out);
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    int P = 0, V = 0, m = 0;
    double iter = 0, busy = 0;
    std::string busiest, mean, replay, replay_mean, formula, simulated, cpu;
    double imbalance = 0;
    if (!(f >> P >> V >> m >> iter >> busy >> busiest >> mean >> replay >> replay_mean >> formula >>
          simulated >> cpu >> imbalance))
      continue;
    ++cases;
    EXPECT_EQ(formula, V == 1 ? "20.0%" : "11.1%") << line;
    EXPECT_EQ(simulated, formula) << line;
    EXPECT_GT(iter, 0) << line;
    EXPECT_GE(imbalance, 1.0) << line;
    EXPECT_LE(busy, iter * 1.05) << line;  // a stage computes within the iteration
    for (const std::string& b : {busiest, mean, replay, replay_mean}) {
      EXPECT_GE(std::stod(b), -5.0) << line;
      EXPECT_LT(std::stod(b), 100.0) << line;
    }
  }
  EXPECT_EQ(cases, 2) << r.out;
}

TEST(BenchParallelCli, BothTablesExclusiveIsAUsageError) {
  EXPECT_EQ(RunKeelShell("", "bench parallel --bytes --bubble").code, 2);
  EXPECT_EQ(RunKeelShell("", "bench parallel --micro-batches 3").code, 2);
}

}  // namespace
