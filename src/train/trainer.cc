#include "train/trainer.h"

#include <xxhash.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "train/flops.h"
#include "train/iteration_log.h"

namespace keel {

GptSpec SpecFromConfig(const TrainConfig& cfg) {
  GptSpec s;
  s.num_layers = cfg.num_layers;
  s.hidden = cfg.hidden_size;
  s.ffn_hidden = cfg.ffn_hidden_size;
  s.heads = cfg.num_attention_heads;
  s.max_positions = cfg.max_position_embeddings;
  s.vocab = cfg.vocab_size;
  s.padded_vocab = cfg.padded_vocab_size;
  s.alibi = cfg.position_embedding_type == PositionEmbedding::kAlibi;
  s.embed_layernorm = cfg.embed_layernorm;
  s.layernorm_eps = cfg.layernorm_epsilon;
  s.qk_layernorm = cfg.qk_layernorm;
  s.z_loss = static_cast<float>(cfg.z_loss);
  s.reset_position_ids = cfg.reset_position_ids;
  s.reset_attention_mask = cfg.reset_attention_mask;
  s.eod_id = cfg.eod_id;
  return s;
}

Trainer::Trainer(const TrainConfig& cfg, Backend* backend, Communicator* comm, Env* env,
                 SampleFn train_samples, SampleFn valid_samples)
    : cfg_(cfg),
      backend_(backend),
      comm_(comm),
      env_(env),
      train_samples_(std::move(train_samples)),
      valid_samples_(std::move(valid_samples)),
      rampup_(BatchRampup::FromConfig(cfg)),
      schedule_(LrSchedule::FromConfig(cfg)) {
  model_ = std::make_unique<GptModel>(backend_, SpecFromConfig(cfg_));
  AdamWConfig oc;
  oc.beta1 = cfg_.adam_beta1;
  oc.beta2 = cfg_.adam_beta2;
  oc.eps = cfg_.adam_eps;
  oc.weight_decay = cfg_.weight_decay;
  optimizer_ = std::make_unique<AdamW>(backend_, model_->num_params(), oc);
  total_iters_ = TotalTrainIters(cfg_);
  const size_t mb = static_cast<size_t>(cfg_.micro_batch_size);
  batch_tokens_.resize(mb * (cfg_.seq_length + 1));
  inputs_.resize(mb * cfg_.seq_length);
  targets_.resize(mb * cfg_.seq_length);
  dataset_of_.resize(mb);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  KEEL_CHECK(ParseIterationRanges(cfg_.skip_train_iteration_range, &ranges).ok(),
             "unvalidated --skip-train-iteration-range");
  for (auto [a, b] : ranges) config_skip_ranges_.push_back({a, b});
  // --skip-train-samples-range: the iterations whose batches read any of those samples.
  KEEL_CHECK(ParseSampleRanges(cfg_.skip_train_samples_range, &ranges).ok(),
             "unvalidated --skip-train-samples-range");
  for (auto [a, b] : ranges) {
    const IterationRange r = IterationsReading(a, b);
    if (r.first > 0) config_skip_ranges_.push_back(r);
  }
}

IterationRange Trainer::IterationsReading(int64_t first_sample, int64_t last_sample) const {
  IterationRange r{-1, -1};
  int64_t pos = 0;  // samples before iteration `it`, following the batch ramp-up
  for (int64_t it = 1; it <= total_iters_ && pos <= last_sample; ++it) {
    const int64_t gb = rampup_.GlobalBatchAt(pos);
    if (pos + gb - 1 >= first_sample) {
      if (r.first < 0) r.first = it;
      r.last = it;
    }
    pos += gb;
  }
  return r;
}

void Trainer::set_dataset_names(std::vector<std::string> names) {
  KEEL_CHECK(!names.empty(), "a run has at least one dataset");
  dataset_names_ = std::move(names);
}

Trainer::~Trainer() = default;

bool Trainer::IsSkipped(int64_t iteration) const {
  for (const auto* list : {&skip_ranges_, &config_skip_ranges_})
    for (const IterationRange& r : *list)
      if (r.Contains(iteration)) return true;
  return false;
}

int64_t Trainer::SamplesBefore(int64_t iteration) const {
  int64_t pos = counters_.consumed_samples;
  for (int64_t it = counters_.iteration + 1; it < iteration; ++it)
    pos += rampup_.GlobalBatchAt(pos);
  return pos;
}

void Trainer::InitializeWeights() {
  model_->Initialize(cfg_.seed, cfg_.ResolvedInitStd());
}

double Trainer::FlopsPerIteration(int64_t global_batch) const {
  return TrainingFlopsPerToken(model_->spec(), cfg_.seq_length) *
         static_cast<double>(global_batch) * cfg_.seq_length;
}

StepResult Trainer::TrainStep() {
  const auto t0 = std::chrono::steady_clock::now();
  StepResult r;
  const int mbs = cfg_.micro_batch_size, T = cfg_.seq_length, dp = comm_->world_size();
  r.global_batch = rampup_.GlobalBatchAt(counters_.consumed_samples);
  r.lr = lr_scale_ * schedule_.LrAt(counters_.consumed_samples + r.global_batch);
  const int64_t iteration = counters_.iteration + 1;
  if (IsSkipped(iteration)) {
    // A skipped data window: its samples are read past (the cursor and the schedule move on as
    // if trained, Megatron's --skip-train-iteration-range), nothing is computed.
    r.data_skipped = r.skipped = true;
    r.loss = r.grad_norm = NAN;
    ++counters_.data_skipped_iterations;
    counters_.iteration = iteration;
    counters_.consumed_samples += r.global_batch;
    counters_.consumed_tokens += r.global_batch * T;
    r.step_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }
  const int64_t num_micro = r.global_batch / (static_cast<int64_t>(mbs) * dp);
  // Every token of the global batch weighs the same in the loss: mean over gbs * T tokens.
  const float dloss = 1.0f / static_cast<float>(r.global_batch * T);

  model_->ZeroGrad();
  const size_t nd = dataset_names_.size();
  // lm loss, log Z (means over each micro-batch), then per dataset: summed sequence losses and
  // sequence counts.
  std::vector<double> sums(2 + 2 * nd, 0.0);
  double max_attn = -INFINITY;
  for (int64_t m = 0; m < num_micro; ++m) {
    // Sample order: micro-batch m of rank r reads global samples (m * dp + r) * mbs + b.
    const int64_t first =
        counters_.consumed_samples + (m * dp + comm_->rank()) * static_cast<int64_t>(mbs);
    for (int b = 0; b < mbs; ++b) {
      int32_t* s = batch_tokens_.data() + static_cast<size_t>(b) * (T + 1);
      dataset_of_[b] = train_samples_(first + b, s);
      KEEL_CHECK(dataset_of_[b] >= 0 && static_cast<size_t>(dataset_of_[b]) < nd,
                 "sample from an unknown dataset");
      std::copy(s, s + T, inputs_.data() + static_cast<size_t>(b) * T);
      std::copy(s + 1, s + T + 1, targets_.data() + static_cast<size_t>(b) * T);
    }
    sums[0] += model_->Forward(inputs_.data(), targets_.data(), mbs, T, dloss);
    if (nd > 1) {
      for (int b = 0; b < mbs; ++b) {
        sums[2 + 2 * dataset_of_[b]] += model_->SequenceLoss(b);
        sums[3 + 2 * dataset_of_[b]] += 1.0;
      }
    }
    if (gate_) {
      sums[1] += model_->MeanLogZ();
      max_attn = std::max(max_attn, model_->LastMaxAttentionLogit());
    }
    model_->Backward();
  }
  comm_->AllReduceSumHost(sums.data(), sums.size());
  r.loss = sums[0] / static_cast<double>(num_micro * dp);
  if (nd > 1) {
    r.dataset_loss.resize(nd);
    r.dataset_sequences.resize(nd);
    for (size_t d = 0; d < nd; ++d) {
      r.dataset_sequences[d] = static_cast<int64_t>(sums[3 + 2 * d]);
      r.dataset_loss[d] = r.dataset_sequences[d] > 0 ? sums[2 + 2 * d] / sums[3 + 2 * d] : NAN;
    }
  }
  comm_->AllReduceSum(model_->grad_data(), model_->num_params());
  if (grad_fault_) grad_fault_(iteration, model_->grad_data(), model_->num_params());

  const GradStats gs = ComputeGradStats(backend_, model_->grad_data(), model_->num_params());
  r.grad_norm = gs.norm;
  r.num_zeros = gs.num_zeros;
  // The update of this iteration uses the LR at the position after its batch (see lr_schedule.h).
  const bool finite = gs.finite && std::isfinite(r.loss);
  bool apply = finite;
  if (gate_) {
    GuardSignals& g = r.signals;
    g.iteration = iteration;
    g.consumed_samples = counters_.consumed_samples;
    g.loss = r.loss;
    g.grad_norm = r.grad_norm;
    g.nonfinite = !finite;
    g.log_z = sums[1] / static_cast<double>(num_micro * dp);
    g.update_ratio = last_update_ratio_;
    g.max_exp_avg_sq = last_max_v_;
    g.max_attn_logit = max_attn;  // this rank's; the guard reads it for the journal
    apply = gate_(g) && finite;
  }
  if (!finite) {
    // Never let a NaN/Inf reach the weights: skip the update, count it, keep going.
    r.skipped = true;
    ++counters_.skipped_iterations;
    ++counters_.nan_iterations;
  } else if (!apply) {
    r.skipped = true;  // the guard judged this batch anomalous
    ++counters_.skipped_iterations;
  } else {
    ClipGradients(backend_, model_->grad_data(), model_->num_params(), gs.norm, cfg_.clip_grad);
    if (gate_) {
      // The guard's signals, measured inside the update's own pass over memory.
      Backend::AdamWStats st;
      optimizer_->Step(model_->param_data(), model_->grad_data(), model_->params(), r.lr, &st);
      last_update_ratio_ = std::sqrt(st.update_sq / std::max(st.param_sq, 1e-30));
      last_max_v_ = st.max_v;
    } else {
      optimizer_->Step(model_->param_data(), model_->grad_data(), model_->params(), r.lr);
    }
  }
  counters_.iteration = iteration;
  counters_.consumed_samples += r.global_batch;
  counters_.consumed_tokens += r.global_batch * T;
  r.step_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

double Trainer::NextLr() const {
  return lr_scale_ * schedule_.LrAt(counters_.consumed_samples +
                                    rampup_.GlobalBatchAt(counters_.consumed_samples));
}

double Trainer::Evaluate(int64_t iters) {
  return Evaluate(iters, valid_samples_);
}

double Trainer::Evaluate(int64_t iters, const SampleFn& samples) {
  if (!samples || iters <= 0) return NAN;
  const int mbs = cfg_.micro_batch_size, T = cfg_.seq_length, dp = comm_->world_size();
  // The final global batch, not the ramp-up's current one: every evaluation reads the same samples.
  const int64_t num_micro = cfg_.global_batch_size / (static_cast<int64_t>(mbs) * dp);
  double loss_sum = 0.0;
  int64_t count = 0;
  for (int64_t it = 0; it < iters; ++it) {
    for (int64_t m = 0; m < num_micro; ++m) {
      const int64_t first = (it * num_micro * dp + m * dp + comm_->rank()) * mbs;
      for (int b = 0; b < mbs; ++b) {
        int32_t* s = batch_tokens_.data() + static_cast<size_t>(b) * (T + 1);
        samples(first + b, s);
        std::copy(s, s + T, inputs_.data() + static_cast<size_t>(b) * T);
        std::copy(s + 1, s + T + 1, targets_.data() + static_cast<size_t>(b) * T);
      }
      loss_sum += model_->Forward(inputs_.data(), targets_.data(), mbs, T, 0.0f);
      ++count;
    }
  }
  double reduced[2] = {loss_sum, static_cast<double>(count)};
  comm_->AllReduceSumHost(reduced, 2);
  return reduced[0] / reduced[1];
}

namespace {

// JSON has no NaN or Infinity: non-finite values are written as null.
nlohmann::json Finite(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

}  // namespace

Status Trainer::Run(const RunHooks& hooks) {
  LogIntervalState& iv = interval_;
  const size_t nd = dataset_names_.size();
  bool in_skip = false;  // the previous iteration of this loop was a skipped one
  while (counters_.iteration < total_iters_) {
    const StepResult r = TrainStep();
    ++iv.iters;
    iv.ms += r.step_ms;
    iv.samples += r.global_batch;
    iv.flops += FlopsPerIteration(r.global_batch);
    if (r.data_skipped) {
      ++iv.skipped;
      if (!in_skip) {
        int64_t last = counters_.iteration;
        while (last < total_iters_ && IsSkipped(last + 1)) ++last;
        const int64_t first_sample = counters_.consumed_samples - r.global_batch;
        hooks.log(fmt::format(
            "skipping iterations {}..{}: their {} samples are read past without an update "
            "(samples {}..{})",
            counters_.iteration, last, SamplesBefore(last + 1) - first_sample, first_sample,
            SamplesBefore(last + 1) - 1));
      }
    } else if (r.skipped && std::isfinite(r.loss) && std::isfinite(r.grad_norm)) {
      ++iv.skipped;  // the guard skipped it and journals why
    } else if (r.skipped) {
      ++iv.skipped;
      hooks.log(fmt::format(
          "WARNING: iteration {}: non-finite {} (loss {}, grad norm {}): update skipped",
          counters_.iteration, std::isfinite(r.loss) ? "gradients" : "loss", r.loss, r.grad_norm));
    } else {
      iv.loss_sum += r.loss;
      ++iv.ok;
      if (nd > 1) {
        iv.dataset_loss_sum.resize(nd, 0.0);
        iv.dataset_sequences.resize(nd, 0);
        for (size_t d = 0; d < nd; ++d) {
          if (r.dataset_sequences[d] == 0) continue;
          iv.dataset_loss_sum[d] += r.dataset_loss[d] * static_cast<double>(r.dataset_sequences[d]);
          iv.dataset_sequences[d] += r.dataset_sequences[d];
        }
      }
    }
    if (hooks.metrics) {
      nlohmann::json m = {
          {"kind", "train"},
          {"iteration", counters_.iteration},
          {"train_iters", total_iters_},
          {"consumed_samples", counters_.consumed_samples},
          {"consumed_tokens", counters_.consumed_tokens},
          {"iteration_ms", r.step_ms},
          {"learning_rate", r.lr},
          {"global_batch_size", r.global_batch},
          {"lm_loss", Finite(r.loss)},
          {"loss_scale", 1.0},
          {"grad_norm", Finite(r.grad_norm)},
          {"num_zeros", r.num_zeros},
          {"skipped", r.skipped},
          {"data_skipped", r.data_skipped},
          {"nan",
           !r.data_skipped && r.skipped && !(std::isfinite(r.loss) && std::isfinite(r.grad_norm))},
          {"samples_per_second", 1000.0 * r.global_batch / r.step_ms},
          {"tflops", FlopsPerIteration(r.global_batch) / (r.step_ms / 1000.0) / 1e12}};
      if (nd > 1 && !r.data_skipped) {
        nlohmann::json per = nlohmann::json::object();
        for (size_t d = 0; d < nd; ++d)
          per[dataset_names_[d]] = {{"lm_loss", Finite(r.dataset_loss[d])},
                                    {"sequences", r.dataset_sequences[d]}};
        m["datasets"] = per;
      }
      hooks.metrics(m);
    }
    const bool last = counters_.iteration == total_iters_;
    if (counters_.iteration % cfg_.log_interval == 0 || last) {
      IterationStats s;
      s.iteration = counters_.iteration;
      s.train_iters = total_iters_;
      s.consumed_samples = counters_.consumed_samples;
      s.consumed_tokens = counters_.consumed_tokens;
      s.elapsed_ms_per_iter = iv.ms / static_cast<double>(iv.iters);
      s.learning_rate = r.lr;
      s.global_batch_size = r.global_batch;
      s.lm_loss = iv.ok > 0 ? iv.loss_sum / static_cast<double>(iv.ok) : NAN;
      s.grad_norm = r.grad_norm;
      s.num_zeros = static_cast<double>(r.num_zeros);
      s.skipped_iterations = iv.skipped;
      s.nan_iterations = iv.skipped;
      const double secs = iv.ms / 1000.0;
      s.samples_per_second = static_cast<double>(iv.samples) / secs;
      s.tflops = iv.flops / secs / 1e12;
      hooks.log(FormatIterationLine(s));
      // A mixture's loss per dataset, over the same interval (the seeds' cm4/pmd curves).
      if (nd > 1) {
        std::string line = " lm loss per dataset |";
        for (size_t d = 0; d < nd; ++d) {
          const int64_t n = d < iv.dataset_sequences.size() ? iv.dataset_sequences[d] : 0;
          line += n > 0 ? fmt::format(" {}: {:.6E} ({} seq) |", dataset_names_[d],
                                      iv.dataset_loss_sum[d] / static_cast<double>(n), n)
                        : fmt::format(" {}: - (0 seq) |", dataset_names_[d]);
        }
        hooks.log(line);
      }
      // The guard's signals of this iteration, on a line of their own (the iteration line keeps
      // Megatron's format for the tools that parse it).
      if (gate_ && !r.data_skipped)
        hooks.log(fmt::format(
            " guard signals | max attention logit: {:.3f} | log Z: {:.3f} | update/weight: {:.3E} "
            "| max Adam v: {:.3E} |",
            r.signals.max_attn_logit, r.signals.log_z, r.signals.update_ratio,
            r.signals.max_exp_avg_sq));
      iv = LogIntervalState{};
    }
    if (cfg_.eval_iters > 0 && (counters_.iteration % cfg_.eval_interval == 0 || last))
      RunEvaluation(hooks);
    in_skip = r.data_skipped;
    if (hooks.after_iteration && !hooks.after_iteration()) break;
  }
  return Status::OK();
}

void Trainer::RunEvaluation(const RunHooks& hooks) {
  nlohmann::json m = {{"kind", "validation"},
                      {"iteration", counters_.iteration},
                      {"consumed_samples", counters_.consumed_samples}};
  if (valid_sets_.empty()) {
    if (!valid_samples_) return;
    const double loss = Evaluate(cfg_.eval_iters);
    hooks.log(FormatValidationLine(counters_.iteration, loss));
    m["lm_loss"] = Finite(loss);
    m["lm_loss_ppl"] = Finite(LossPpl(loss));
  } else {
    // Each dataset on its own validation split; the combined loss is their weighted mean, the
    // expected loss of the mixture.
    double wsum = 0, lsum = 0;
    nlohmann::json per = nlohmann::json::object();
    std::vector<std::string> lines;
    for (const ValidationSet& v : valid_sets_) {
      const double loss = Evaluate(cfg_.eval_iters, v.samples);
      lines.push_back(FormatValidationLine(counters_.iteration, loss, v.name));
      per[v.name] = {{"lm_loss", Finite(loss)}, {"lm_loss_ppl", Finite(LossPpl(loss))}};
      wsum += v.weight;
      lsum += v.weight * loss;
    }
    const double loss = lsum / wsum;
    hooks.log(FormatValidationLine(counters_.iteration, loss));
    for (const std::string& l : lines) hooks.log(l);
    m["lm_loss"] = Finite(loss);
    m["lm_loss_ppl"] = Finite(LossPpl(loss));
    m["datasets"] = per;
  }
  if (hooks.metrics) hooks.metrics(m);
}

uint64_t Trainer::StateFingerprint() {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  const size_t n = model_->num_params();
  std::vector<float> host(n);
  for (float* buf : {model_->param_data(), optimizer_->exp_avg(), optimizer_->exp_avg_sq()}) {
    backend_->CopyToHost(host.data(), buf, n);
    XXH3_64bits_update(st, host.data(), n * sizeof(float));
  }
  const int64_t step = optimizer_->step();
  XXH3_64bits_update(st, &step, sizeof(step));
  XXH3_64bits_update(st, &counters_, sizeof(counters_));
  XXH3_64bits_update(st, &lr_scale_, sizeof(lr_scale_));
  XXH3_64bits_update(st, &data_salt_, sizeof(data_salt_));
  for (const IterationRange& r : skip_ranges_) XXH3_64bits_update(st, &r, sizeof(r));
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

}  // namespace keel
