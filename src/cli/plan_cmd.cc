// `keel plan`: the cost of a run before launching it. Takes the model and batch flags of
// `keel train` plus the layout (nodes, GPUs per node, TP, PP) and prints parameters, memory per
// GPU, the data-parallel size, which ramp-up stages it can run, FLOPs and days (plan/run_plan.h).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/usage_exit.h"
#include "config/config.h"
#include "core/log.h"
#include "plan/run_plan.h"

namespace keel::cli {
namespace {

Status ParseModelFlags(const std::vector<std::string>& args, ParsedConfig* parsed) {
  std::vector<const char*> argv{"plan"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  return ParseTrainArgs(static_cast<int>(argv.size()), argv.data(), parsed);
}

}  // namespace

int PlanCommand(int argc, const char* const* argv) {
  CLI::App app(
      "Plan a run: exact parameters, memory per GPU, data-parallel size, feasible batch ramp-up "
      "stages, FLOPs and days to finish. Takes every `keel train` flag for the model and the "
      "batch schedule (--num-layers --hidden-size --num-attention-heads --seq-length "
      "--micro-batch-size --global-batch-size --rampup-batch-size --train-samples ...).",
      "keel plan");
  app.allow_extras();
  PlanInput in;
  int vocab = 0;
  int64_t train_tokens = 0;
  bool json = false;
  app.add_option("--vocab-size", vocab, "vocabulary before padding (default: GPT-2's 50257)");
  app.add_option("--num-nodes", in.num_nodes, "nodes")->capture_default_str();
  app.add_option("--gpus-per-node", in.gpus_per_node, "GPUs per node")->capture_default_str();
  app.add_option("--tensor-model-parallel-size", in.tensor_parallel, "TP")->capture_default_str();
  app.add_option("--pipeline-model-parallel-size", in.pipeline_parallel, "PP")
      ->capture_default_str();
  app.add_option("--zero-stage", in.zero_stage, "1: optimizer states sharded over DP ranks")
      ->capture_default_str();
  app.add_option("--train-tokens", train_tokens,
                 "tokens to train (sets --train-samples = tokens / seq-length, rounded up)");
  app.add_option("--iteration-time", in.iteration_seconds,
                 "measured seconds per iteration at the full global batch");
  app.add_option("--tflops-per-gpu", in.tflops_per_gpu,
                 "assumed achieved TFLOPs per GPU (when no iteration time is known)");
  app.add_option("--hours-per-day", in.hours_per_day, "hours of allocation per day")
      ->capture_default_str();
  app.add_flag("--recompute-activations", in.recompute_activations,
               "count FLOPs with the forward recomputed (4x forward, as BLOOM's TFLOPs)");
  app.add_flag("--json", json, "print the plan as JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    return UsageExit(app, e);
  }
  auto usage_error = [](const std::string& msg) {
    LogError("error: " + msg);
    return 2;
  };
  std::vector<std::string> rest = app.remaining();
  std::vector<std::string> notes;
  if (train_tokens < 0) return usage_error("--train-tokens must be positive");
  for (const std::string& a : rest) {
    if (train_tokens > 0 && (a == "--train-iters" || a == "--train-samples"))
      return usage_error("--train-tokens and " + a + " both give the run length; give one");
  }
  ParsedConfig parsed;
  // With --train-tokens the sequence length is needed first: parse once with the token count as a
  // stand-in sample count (never smaller than the real one), then again with the real one.
  std::vector<std::string> first = rest;
  if (train_tokens > 0) {
    first.push_back("--train-samples");
    first.push_back(std::to_string(train_tokens));
  }
  Status st = ParseModelFlags(first, &parsed);
  if (!st.ok()) return usage_error(st.message());
  if (train_tokens > 0) {
    const int64_t seq = parsed.config.seq_length;
    const int64_t samples = (train_tokens + seq - 1) / seq;
    rest.push_back("--train-samples");
    rest.push_back(std::to_string(samples));
    notes.push_back(fmt::format("--train-tokens {}: --train-samples {} of {} tokens", train_tokens,
                                samples, seq));
    st = ParseModelFlags(rest, &parsed);
    if (!st.ok()) return usage_error(st.message());
  }
  if (vocab < 0) return usage_error("--vocab-size must be positive");
  if (vocab == 0) {
    vocab = 50257;
    notes.push_back("--vocab-size not given: using GPT-2's 50257");
  }
  in.cfg = parsed.config;
  in.cfg.model.vocab = vocab;
  notes.insert(notes.begin(), parsed.notes.begin(), parsed.notes.end());

  RunPlan plan;
  st = MakeRunPlan(in, &plan);
  if (!st.ok()) return usage_error(st.message());
  notes.insert(notes.end(), plan.notes.begin(), plan.notes.end());
  plan.notes = notes;
  if (json) {
    std::printf("%s\n", RunPlanJson(in, plan).dump(2).c_str());
  } else {
    for (const std::string& n : notes) std::printf("note: %s\n", n.c_str());
    std::printf("%s", FormatRunPlan(in, plan).c_str());
    std::fflush(stdout);
  }
  for (const std::string& p : plan.problems) LogError("error: " + p);
  return plan.problems.empty() ? 0 : 1;
}

}  // namespace keel::cli
