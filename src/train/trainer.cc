#include "train/trainer.h"

#include <xxhash.h>

#include <chrono>
#include <cmath>
#include <cstring>

#include "core/log.h"
#include "model/flops.h"
#include "model/tensor_split.h"
#include "pipeline/pipeline_step.h"
#include "pipeline/stage_partition.h"

namespace keel {

TrainerData::TrainerData(SampleFn train, SampleFn valid) {
  if (valid) valid_sets.push_back({"data", 1.0});
  samples =
      std::make_shared<FunctionSamples>(std::move(train), std::vector<SampleFn>{std::move(valid)});
}

Trainer::Trainer(const TrainConfig& cfg, Backend* backend, Communicator* comm, TrainerData data)
    : Trainer(cfg, backend, TrainerGroups{comm, comm, nullptr}, std::move(data)) {}

Trainer::Trainer(const TrainConfig& cfg, Backend* backend, TrainerGroups groups, TrainerData data)
    : cfg_(cfg),
      backend_(backend),
      comm_(groups.world),
      data_comm_(groups.data != nullptr ? groups.data : groups.world),
      tensor_comm_(groups.tensor != nullptr && groups.tensor->world_size() > 1 ? groups.tensor
                                                                               : nullptr),
      pipeline_comm_(groups.pipeline != nullptr && groups.pipeline->world_size() > 1
                         ? groups.pipeline
                         : nullptr),
      data_(std::move(data)),
      rampup_(BatchRampup::FromConfig(cfg)),
      schedule_(LrSchedule::FromConfig(cfg)) {
  KEEL_CHECK(!data_.dataset_names.empty(), "a run has at least one dataset");
  watch_ = cfg_.guard != GuardLevel::kOff;
  // The products' precision is the backend's; the model follows it (and keeps 16-bit weights).
  backend_->SetPrecision(cfg_.precision);
  if (tensor_comm_ != nullptr) {
    tp_size_ = tensor_comm_->world_size();
    tp_rank_ = tensor_comm_->rank();
  }
  if (pipeline_comm_ != nullptr) {
    pp_size_ = pipeline_comm_->world_size();
    pp_rank_ = pipeline_comm_->rank();
  }
  KEEL_CHECK(comm_->world_size() == tp_size_ * pp_size_ * data_comm_->world_size(),
             "the world is the tensor group times the pipeline group times the data group");
  const TensorParallel tp{tensor_comm_, cfg_.sequence_parallel};
  if (pp_size_ > 1) {
    // This rank's stage: its model chunks (virtual stages rank, P + rank, ... when interleaved),
    // one model over one buffer (GptModel::MakeChunked).
    const int per = cfg_.num_layers_per_virtual_pipeline_stage;
    const int V = per > 0 ? cfg_.model.num_layers / (pp_size_ * per) : 1;
    const Status st = PartitionStages(cfg_.pp_partition_method, PartitionModelOf(cfg_.model),
                                      pp_size_, V, &parts_);
    KEEL_CHECK(st.ok(), "unvalidated pipeline layout: " + st.message());
    std::vector<ModelStage> stages;
    for (int c = 0; c < V; ++c) stages.push_back(ModelStageOf(parts_, pp_size_, pp_rank_, c));
    model_ = GptModel::MakeChunked(backend_, cfg_.model, tp, stages);
    for (int c = 0; c < V; ++c) chunks_.push_back(&model_->chunk(c));
  } else {
    model_ = std::make_unique<GptModel>(backend_, cfg_.model, tp);
  }
  model_->set_recompute(cfg_.recompute_granularity, cfg_.full_recompute_layers());
  ResetLossScaler();
  AdamWConfig oc;
  oc.beta1 = cfg_.adam_beta1;
  oc.beta2 = cfg_.adam_beta2;
  oc.eps = cfg_.adam_eps;
  oc.weight_decay = cfg_.weight_decay;
  const size_t n = model_->num_params();
  // n is this rank's slice of the model under tensor parallelism: ZeRO-1 shards it over the data
  // group (the ranks holding the same slice).
  shard_ = ShardOf(n, data_comm_->rank(), data_comm_->world_size());
  zero_ = cfg_.use_distributed_optimizer && data_comm_->world_size() > 1;
  optimizer_ = std::make_unique<AdamW>(backend_, n, oc, zero_ ? shard_ : ShardRange{0, n});
  reducer_ =
      std::make_unique<GradientReducer>(data_comm_, static_cast<size_t>(cfg_.ddp_bucket_size));
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

Trainer::~Trainer() = default;

void Trainer::ResetLossScaler() {
  // The LR schedule's lag behind the consumed samples stays: it is history, not scaler state.
  const int64_t lag = state_.loss_scaler.skipped_samples;
  if (cfg_.precision == Precision::kFp16) {
    scaler_ = std::make_unique<LossScaler>(LossScalerOptions::FromConfig(cfg_));
    scaler_->AddSkippedSamples(lag);
    state_.loss_scaler = scaler_->state();
  } else {
    scaler_.reset();
    state_.loss_scaler = LossScalerState{};  // scale 1: fp32 and bf16 do not scale the loss
    state_.loss_scaler.skipped_samples = lag;
  }
}

bool Trainer::IsSkipped(int64_t iteration) const {
  for (const auto* list : {&state_.skip_ranges, &config_skip_ranges_})
    for (const IterationRange& r : *list)
      if (r.Contains(iteration)) return true;
  return false;
}

int64_t Trainer::SamplesBefore(int64_t iteration) const {
  int64_t pos = state_.counters.consumed_samples;
  for (int64_t it = state_.counters.iteration + 1; it < iteration; ++it)
    pos += rampup_.GlobalBatchAt(pos);
  return pos;
}

void Trainer::InitializeWeights() {
  model_->Initialize(cfg_.seed, cfg_.ResolvedInitStd());
}

double Trainer::FlopsPerIteration(int64_t global_batch) const {
  // Full recomputation runs the recomputed layers' forward twice: 4 forwards' worth instead of 3
  // when all are, as Megatron-DeepSpeed counts its TFLOPs with --checkpoint-activations.
  const GptSpec& spec = model_->spec();
  const int full =
      GptModel::FullRecomputeLayers(spec, cfg_.recompute_granularity, cfg_.full_recompute_layers());
  const double recompute = 1.0 + static_cast<double>(full) / spec.num_layers / 3.0;
  return TrainingFlopsPerToken(model_->spec(), cfg_.seq_length) * recompute *
         static_cast<double>(global_batch) * cfg_.seq_length;
}

IterationPlan Trainer::PlanIteration() {
  iteration_start_ = std::chrono::steady_clock::now();
  const TrainCounters& c = state_.counters;
  IterationPlan p;
  p.iteration = c.iteration + 1;
  p.global_batch = rampup_.GlobalBatchAt(c.consumed_samples);
  // The update of this iteration uses the LR at the position after its batch (see lr_schedule.h).
  p.lr = state_.lr_scale * schedule_.LrAt(ScheduleSamples() + p.global_batch);
  if (faults_) p.lr *= faults_->LrFactor(p.iteration);
  p.data_salt = state_.data_salt;
  p.data_skipped = IsSkipped(p.iteration);
  // The tensor ranks of a replica read the same samples: the schedule is the data group's.
  const int dp = data_comm_->world_size();
  p.schedule = {c.consumed_samples, cfg_.micro_batch_size,
                p.global_batch / (static_cast<int64_t>(cfg_.micro_batch_size) * dp), dp,
                data_comm_->rank()};
  if (phases_) phases_->BeginIteration(p.iteration);
  return p;
}

Status Trainer::LoadSequence(const IterationPlan& plan, int64_t m, int b) {
  const int T = cfg_.seq_length;
  int32_t* s = batch_tokens_.data() + static_cast<size_t>(b) * (T + 1);
  const SampleRequest req{plan.schedule.SampleIndex(m, b), plan.iteration, plan.data_salt};
  KEEL_RETURN_IF_ERROR(data_.samples->ReadTrain(req, s, &dataset_of_[b]));
  KEEL_CHECK(
      dataset_of_[b] >= 0 && static_cast<size_t>(dataset_of_[b]) < data_.dataset_names.size(),
      "sample from an unknown dataset");
  std::copy(s, s + T, inputs_.data() + static_cast<size_t>(b) * T);
  std::copy(s + 1, s + T + 1, targets_.data() + static_cast<size_t>(b) * T);
  if (watch_) cur_batch_.tokens.insert(cur_batch_.tokens.end(), s, s + T + 1);
  return Status::OK();
}

Status Trainer::LoadPipelineBatch(const IterationPlan& plan, int64_t num_micro) {
  const size_t mbs = static_cast<size_t>(cfg_.micro_batch_size), T = cfg_.seq_length;
  pp_inputs_.resize(num_micro * mbs * T);
  pp_targets_.resize(num_micro * mbs * T);
  pp_dataset_of_.resize(num_micro * mbs);
  for (int64_t m = 0; m < num_micro; ++m) {
    for (size_t b = 0; b < mbs; ++b)
      KEEL_RETURN_IF_ERROR(LoadSequence(plan, m, static_cast<int>(b)));
    std::copy(inputs_.begin(), inputs_.end(), pp_inputs_.begin() + m * mbs * T);
    std::copy(targets_.begin(), targets_.end(), pp_targets_.begin() + m * mbs * T);
    std::copy(dataset_of_.begin(), dataset_of_.end(), pp_dataset_of_.begin() + m * mbs);
  }
  return Status::OK();
}

const PipelineSchedule& Trainer::ScheduleFor(int64_t micro) {
  auto it = schedules_.find(micro);
  if (it != schedules_.end()) return it->second;
  PipelineSchedule s;
  const Status st =
      MakePipelineSchedule(pp_size_, static_cast<int>(micro), static_cast<int>(chunks_.size()), &s);
  KEEL_CHECK(st.ok(), "unvalidated pipeline layout: " + st.message());
  return schedules_.emplace(micro, std::move(s)).first->second;
}

double Trainer::PipelineForwardLoss(const int32_t* samples, int64_t micro) {
  const size_t mbs = static_cast<size_t>(cfg_.micro_batch_size), T = cfg_.seq_length;
  std::vector<int32_t> in(micro * mbs * T), tg(micro * mbs * T);
  for (size_t i = 0; i < static_cast<size_t>(micro) * mbs; ++i) {
    const int32_t* s = samples + i * (T + 1);
    std::copy(s, s + T, in.data() + i * T);
    std::copy(s + 1, s + T + 1, tg.data() + i * T);
  }
  std::vector<PipelineMicroBatch> batches(static_cast<size_t>(micro));
  for (int64_t m = 0; m < micro; ++m)
    batches[m] = {in.data() + m * mbs * T, tg.data() + m * mbs * T};
  double sum = 0;
  const Status st = RunPipelineForward(pipeline_comm_, chunks_, batches, static_cast<int>(mbs),
                                       static_cast<int>(T), &sum);
  KEEL_CHECK(st.ok(), st.message());
  return sum;
}

std::vector<int32_t> Trainer::Generate(const std::vector<int32_t>& prompt,
                                       const GenerateOptions& opts) {
  if (pp_size_ == 1) return keel::Generate(*model_, prompt, opts);
  const int P = pp_size_, V = static_cast<int>(chunks_.size());
  auto next = [&](const std::vector<int32_t>& window, int last, size_t position) {
    // The window through the virtual stages in order (v on rank v % P as chunk v / P, as
    // RunPipelineForward); causal attention: the padding after `last` cannot reach its logits.
    const int W = static_cast<int>(window.size());
    const size_t floats = chunks_[0]->StageActivationFloats(1, W);
    std::vector<float> in(floats), out(floats);
    int32_t token = 0;
    for (int v = 0; v < P * V; ++v) {
      if (v % P != pp_rank_) continue;
      const bool first = v == 0, head = v == P * V - 1;
      GptModel* chunk = chunks_[v / P];
      if (!first) pipeline_comm_->Recv(in.data(), floats, (v - 1) % P);
      chunk->StageForward(0, window.data(), first ? nullptr : in.data(), nullptr, 1, W, 0.0f,
                          head ? nullptr : out.data());
      if (head)
        token = SampleToken(chunk->LogitsAt(0, last), position, opts);
      else
        pipeline_comm_->Send(out.data(), floats, (v + 1) % P);
    }
    // The last stage's choice, to every stage (the next window's tokens).
    std::vector<std::string> all;
    pipeline_comm_->AllGatherBytes(
        pp_rank_ == P - 1 ? std::string(reinterpret_cast<const char*>(&token), sizeof token) : "",
        &all);
    KEEL_CHECK(all[P - 1].size() == sizeof token, "the last stage sent no token");
    std::memcpy(&token, all[P - 1].data(), sizeof token);
    return token;
  };
  return GenerateWith(next, prompt, opts, model_->spec().max_positions);
}

std::string Trainer::DescribeStage() const {
  if (pp_size_ == 1) return "the whole model";
  std::string s = fmt::format("stage {} of {}: ", pp_rank_, pp_size_);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (c > 0) s += ", ";
    if (chunks_.size() > 1)
      s += fmt::format("chunk {} (virtual stage {}) ", c, c * pp_size_ + pp_rank_);
    s += chunks_[c]->stage().Describe(cfg_.model.num_layers);
  }
  return s;
}

Status Trainer::ComputeGradients(const IterationPlan& plan, StepResult* r) {
  const MicroBatchSchedule& sched = plan.schedule;
  const int mbs = sched.micro_batch_size, T = cfg_.seq_length, dp = sched.data_parallel_size;
  const int64_t num_micro = sched.micro_batches;
  r->lr = plan.lr;
  r->global_batch = plan.global_batch;
  // Every token of the global batch weighs the same in the loss: mean over gbs * T tokens. fp16
  // multiplies the loss (so every gradient) by the loss scale, keeping small gradients above
  // fp16's underflow; the update divides it out again.
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  const float dloss = static_cast<float>(loss_scale / static_cast<double>(plan.global_batch * T));
  const size_t nd = data_.dataset_names.size();
  double loss = 0, log_z = 0, max_attn_logit = -INFINITY;
  std::vector<double> dataset_loss_sum(nd, 0.0), dataset_sequences(nd, 0.0);
  if (watch_) {  // the guard's probes read the batches back
    std::swap(prev_batch_, cur_batch_);
    cur_batch_.tokens.clear();
    cur_batch_.micro_batches = num_micro;
  }
  // Test-only: a transient fault, one weight every token reads (the final norm's first) scaled
  // for this iteration's arithmetic only.
  const bool corrupt = faults_ && faults_->CorruptWeights(plan.iteration);
  const ParamInfo* corrupted = corrupt ? model_->FindParam("final_layernorm.weight") : nullptr;
  float corrupted_weight = 0;
  if (corrupted != nullptr) {
    float* w = model_->mutable_param_data() + corrupted->offset;  // marks any 16-bit copy stale
    backend_->CopyToHost(&corrupted_weight, w, 1);
    const float bad = corrupted_weight * 1e3f + 10.0f;
    backend_->CopyToDevice(w, &bad, 1);
  }
  model_->StartGradAccumulation();  // the first micro-batch's backward writes the gradients
  float* grads = model_->grad_data();
  const size_t n = model_->num_params();
  if (pp_size_ > 1) {
    // Pipeline parallel: every stage reads the iteration's samples, then the schedule runs the
    // micro-batches through the stages; the last stage's chunk measures the loss and its parts.
    EnterPhase(Phase::kData);
    Status st = LoadPipelineBatch(plan, num_micro);
    if (!st.ok()) {
      if (corrupted != nullptr)
        backend_->CopyToDevice(model_->mutable_param_data() + corrupted->offset, &corrupted_weight,
                               1);
      return st;
    }
    std::vector<PipelineMicroBatch> batches(static_cast<size_t>(num_micro));
    for (int64_t m = 0; m < num_micro; ++m) {
      const size_t at = static_cast<size_t>(m) * mbs * T;
      batches[m] = {pp_inputs_.data() + at, pp_targets_.data() + at};
    }
    PipelineStepHooks hooks;
    hooks.on_compute = [this](bool backward) {
      EnterPhase(backward ? Phase::kBackward : Phase::kForward);
    };
    hooks.on_transfer = [this] { EnterPhase(Phase::kReduce); };
    hooks.after_forward = [&](int mb, int c) {
      GptModel& chunk = *chunks_[c];
      if (chunk.stage().head) {
        if (nd > 1) {
          for (int b = 0; b < mbs; ++b) {
            const int d = pp_dataset_of_[static_cast<size_t>(mb) * mbs + b];
            dataset_loss_sum[d] += chunk.SequenceLoss(b);
            dataset_sequences[d] += 1.0;
          }
        }
        if (watch_) log_z += chunk.MeanLogZ();
      }
      if (watch_) max_attn_logit = std::max(max_attn_logit, chunk.LastMaxAttentionLogit());
    };
    PipelineStepResult res;
    st = RunPipelineStep(ScheduleFor(num_micro), pipeline_comm_, chunks_, batches, mbs, T, dloss,
                         &res, hooks);
    KEEL_CHECK(st.ok(), st.message());  // the schedule and chunks are built to match
    loss = res.loss_sum;
    reducer_->Begin(grads, n);
    reducer_->Ready(0);
  }
  for (int64_t m = 0; m < num_micro && pp_size_ == 1; ++m) {
    EnterPhase(Phase::kData);
    for (int b = 0; b < mbs; ++b) {
      Status st = LoadSequence(plan, m, b);
      if (!st.ok()) {
        if (corrupted != nullptr)
          backend_->CopyToDevice(model_->mutable_param_data() + corrupted->offset,
                                 &corrupted_weight, 1);
        return st;
      }
    }
    EnterPhase(Phase::kForward);
    loss += model_->Forward(inputs_.data(), targets_.data(), mbs, T, dloss);
    if (nd > 1) {
      for (int b = 0; b < mbs; ++b) {
        dataset_loss_sum[dataset_of_[b]] += model_->SequenceLoss(b);
        dataset_sequences[dataset_of_[b]] += 1.0;
      }
    }
    if (watch_) {
      log_z += model_->MeanLogZ();
      max_attn_logit = std::max(max_attn_logit, model_->LastMaxAttentionLogit());
    }
    if (m + 1 == num_micro) {
      // The last micro-batch: its backward finishes the gradients layer by layer, and each
      // finished bucket is reduced while the layers below still compute.
      reducer_->Begin(grads, n);
      if (cfg_.overlap_grad_reduce)
        model_->set_grad_ready([this](size_t from) {
          backend_->Synchronize();  // the collectives read the finished gradients
          reducer_->Ready(from);
        });
    }
    EnterPhase(Phase::kBackward);
    model_->Backward();
  }
  model_->set_grad_ready(nullptr);
  backend_->Synchronize();  // the gradients go to collectives, the losses to the host
  if (corrupted != nullptr)
    backend_->CopyToDevice(model_->mutable_param_data() + corrupted->offset, &corrupted_weight, 1);
  if (faults_) {
    // The pipeline step ends in a transfer phase: a slowed rank's sleep (the test-only straggler)
    // must count as its compute, as it does after a data-parallel backward.
    if (pp_size_ > 1) EnterPhase(Phase::kBackward);
    faults_->AfterBackward(plan.iteration, phases_ ? phases_->ComputeSeconds() : 0.0);
  }
  EnterPhase(Phase::kReduce);
  reducer_->Finish();
  // Each rank now holds the sums of its shard. ZeRO-1 updates only that shard; without it every
  // rank needs every sum.
  if (!zero_) data_comm_->AllGather(grads, n);
  // (The model's maximum is its tensor group's already; the stages' each their own.)
  if (watch_ && pp_size_ > 1) {
    comm_->AllReduceMaxHost(&max_attn_logit, 1);
  } else if (watch_ && dp > 1) {
    data_comm_->AllReduceMaxHost(&max_attn_logit, 1);
  }
  // One host all-reduce for the scalars: loss and log Z (sums of micro-batch means), then the
  // per-dataset sums and counts.
  local_loss_sum_ = loss;  // this rank's, for the guard's rerun
  std::vector<double> sums = {loss, log_z};
  sums.insert(sums.end(), dataset_loss_sum.begin(), dataset_loss_sum.end());
  sums.insert(sums.end(), dataset_sequences.begin(), dataset_sequences.end());
  SumOverReplicas(sums.data(), sums.size());
  const double micro_batches = static_cast<double>(num_micro * dp);
  r->loss = sums[0] / micro_batches;
  log_z = sums[1] / micro_batches;
  if (nd > 1) {
    r->dataset_loss.resize(nd);
    r->dataset_sequences.resize(nd);
    for (size_t d = 0; d < nd; ++d) {
      const double count = sums[2 + nd + d];
      r->dataset_sequences[d] = static_cast<int64_t>(count);
      r->dataset_loss[d] = count > 0 ? sums[2 + d] / count : NAN;
    }
  }

  if (faults_) faults_->OnGradients(plan.iteration, grads, n);
  // Statistics of the global gradient: each rank measures the shard it owns (the summed values),
  // the ranks add their parts, so every rank sees the same norm and makes the same decisions.
  // Tensor parallel: each rank's part of the whole model (LocalGradStats), summed over the world.
  const ShardRange own = dp > 1 ? shard_ : ShardRange{0, n};
  EnterPhase(Phase::kOptimizer);
  GradStats gs = LocalGradStats(grads, own);
  if (comm_->world_size() > 1) {
    EnterPhase(Phase::kReduce);
    double v[3] = {gs.sum_sq, static_cast<double>(gs.num_zeros), gs.finite ? 0.0 : 1.0};
    comm_->AllReduceSumHost(v, 3);
    gs.sum_sq = v[0];
    gs.norm = std::sqrt(v[0]);
    gs.num_zeros = static_cast<size_t>(v[1]);
    gs.finite = v[2] == 0.0 && std::isfinite(v[0]);
  }
  double unscale = 1.0;  // fp16: 1 / the loss scale
  if (scaler_) {
    // fp16 (Megatron's rule): the scaler hears every iteration; an overflow skips the update.
    const double scale = scaler_->scale();
    r->loss_scale_change = scaler_->Update(!gs.finite);
    r->loss_scale = scaler_->scale();
    state_.loss_scaler = scaler_->state();
    if (!gs.finite) {
      r->overflow = true;
      r->grad_norm = NAN;
      scaler_->AddSkippedSamples(plan.global_batch);
      state_.loss_scaler = scaler_->state();
      return Status::OK();
    }
    // Unscale the norm here; the gradients themselves are unscaled as the update reads them.
    gs.norm /= scale;
    gs.sum_sq /= scale * scale;
    unscale = 1.0 / scale;
  }
  r->grad_norm = gs.norm;
  r->num_zeros = gs.num_zeros;
  // Clipping (and fp16's unscaling) multiply the gradients inside the update's own pass.
  grad_scale_ = unscale * ClipCoefficient(gs.norm, cfg_.clip_grad);
  GuardSignals& g = r->signals;
  g.iteration = plan.iteration;
  g.consumed_samples = state_.counters.consumed_samples;
  g.loss = r->loss;
  g.grad_norm = r->grad_norm;
  g.nonfinite = !(gs.finite && std::isfinite(r->loss));
  g.log_z = log_z;
  g.update_ratio = last_update_ratio_;
  g.max_exp_avg_sq = last_max_v_;
  g.max_attn_logit = max_attn_logit;  // this rank's; the guard reads it for the journal
  g.loss_scale = scaler_ ? r->loss_scale : NAN;
  g.dataset_loss = r->dataset_loss;
  return Status::OK();
}

void Trainer::Update(bool apply, StepResult* r) {
  TrainCounters& c = state_.counters;
  if (r->overflow || r->signals.nonfinite || !apply) {
    // Never let a NaN/Inf reach the weights: skip the update, count it, keep going. An fp16
    // overflow with a finite loss is the loss scaler's business, not a NaN iteration.
    r->skipped = true;
    ++c.skipped_iterations;
    if (r->overflow ? !std::isfinite(r->loss) : r->signals.nonfinite) ++c.nan_iterations;
    return;
  }
  EnterPhase(Phase::kOptimizer);
  // The optimizer reads its shard (ZeRO-1) or all of the gradients. Measured inside the update's
  // own pass over memory: the guard's signals, and the weights' squared norm, non-finite exactly
  // when a weight is (or its square overflows).
  Backend::AdamWStats st;
  // bf16/fp16: the update's pass also rewrites the weights' 16-bit compute copy. ZeRO-1 changes
  // only this rank's shard (the rest arrives by all-gather), so the next Forward converts them.
  const GptModel::UpdatableWeights w =
      zero_ ? GptModel::UpdatableWeights{model_->mutable_param_data(), nullptr}
            : model_->weights_for_update();
  // Tensor parallel: the replicated tensors the update changes here are counted by tensor rank 0
  // only (pipeline parallel: the tied embedding by the first stage), so the other ranks take
  // their share back out of the update's statistics.
  const ShardRange updated = zero_ ? shard_ : ShardRange{0, model_->num_params()};
  std::vector<std::pair<size_t, size_t>> replicated;  // [begin, end) within `updated`
  std::vector<float> before;
  if (tp_rank_ != 0 || pp_size_ > 1) {
    for (const ParamInfo& p : model_->params()) {
      const size_t lo = std::max(p.offset, updated.begin);
      const size_t hi = std::min(p.offset + p.numel, updated.end);
      if (CountsParam(p) || lo >= hi) continue;
      replicated.emplace_back(lo, hi);
      before.resize(before.size() + (hi - lo));
      backend_->CopyToHost(before.data() + before.size() - (hi - lo), model_->param_data() + lo,
                           hi - lo);
    }
  }
  optimizer_->Step(w.fp32, model_->grad_data(), model_->params(), r->lr, &st,
                   static_cast<float>(grad_scale_), w.lowp);
  if (!replicated.empty()) {
    std::vector<float> after;
    size_t k = 0;
    double update_sq = 0, param_sq = 0;
    for (auto [lo, hi] : replicated) {
      after.resize(hi - lo);
      backend_->CopyToHost(after.data(), model_->param_data() + lo, hi - lo);
      for (size_t i = 0; i < hi - lo; ++i, ++k) {
        const double d = static_cast<double>(after[i]) - before[k];
        update_sq += d * d;
        param_sq += static_cast<double>(after[i]) * after[i];
      }
    }
    st.update_sq -= update_sq;
    st.param_sq -= param_sq;
  }
  if (zero_ || tp_size_ > 1 || pp_size_ > 1) {
    // Every rank updated its shard (ZeRO-1) or its slice and stage (tensor and pipeline
    // parallel): the statistics are summed over the ranks that hold different parts, the weights
    // all-gathered over the data group. Without ZeRO-1 the data ranks hold the same: under
    // pipeline parallelism (no group of one replica's ranks) data rank 0 alone adds its part.
    EnterPhase(Phase::kReduce);
    Communicator* over = zero_ || pp_size_ > 1 ? comm_ : tensor_comm_;
    if (!zero_ && pp_size_ > 1 && data_comm_->rank() != 0) st.update_sq = st.param_sq = 0;
    double sums[2] = {st.update_sq, st.param_sq}, max_v = st.max_v;
    over->AllReduceSumHost(sums, 2);
    over->AllReduceMaxHost(&max_v, 1);
    st.update_sq = sums[0];
    st.param_sq = sums[1];
    st.max_v = static_cast<float>(max_v);
    if (zero_) data_comm_->AllGather(model_->mutable_param_data(), model_->num_params());
  }
  last_update_ratio_ = std::sqrt(st.update_sq / std::max(st.param_sq, 1e-30));
  last_max_v_ = st.max_v;
  r->weights_nonfinite = !std::isfinite(st.param_sq);
  state_.optimizer_step = optimizer_->step();
}

void Trainer::EndIteration(const IterationPlan& plan, StepResult* r) {
  TrainCounters& c = state_.counters;
  r->global_batch = plan.global_batch;
  r->lr = plan.lr;
  if (plan.data_skipped) {
    // A skipped data window: its samples are read past (the cursor and the schedule move on as
    // if trained, Megatron's --skip-train-iteration-range), nothing is computed.
    r->data_skipped = r->skipped = true;
    r->loss = r->grad_norm = NAN;
    ++c.data_skipped_iterations;
    if (!prev_data_skipped_) {
      int64_t last = plan.iteration;
      while (last < total_iters_ && IsSkipped(last + 1)) ++last;
      r->window_begins = SkippedWindow{plan.iteration, last, c.consumed_samples, 0};
    }
  }
  prev_data_skipped_ = plan.data_skipped;
  c.iteration = plan.iteration;
  c.consumed_samples += plan.global_batch;
  c.consumed_tokens += plan.global_batch * cfg_.seq_length;
  if (r->window_begins) r->window_begins->end_sample = SamplesBefore(r->window_begins->last + 1);
  r->iteration = c.iteration;
  r->consumed_samples = c.consumed_samples;
  r->consumed_tokens = c.consumed_tokens;
  r->flops = plan.data_skipped ? 0.0 : FlopsPerIteration(plan.global_batch);
  backend_->Synchronize();  // the step's time includes its last op, whatever the backend queues
  // By the run's Env clock where the phases are tracked (a test's clock can be its own).
  r->step_ms = phases_ ? 1e3 * phases_->IterationWallSeconds()
                       : std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - iteration_start_)
                             .count();
  const double compute_ms = phases_ ? 1e3 * phases_->ComputeSeconds() : r->step_ms;
  r->rank_compute_ms.assign(1, compute_ms);
  if (comm_->world_size() > 1) {
    // One gather: the iteration line's time is the slowest rank's; every rank's compute time
    // goes to the straggler detector.
    EnterPhase(Phase::kReduce);
    const double mine[2] = {r->step_ms, compute_ms};
    std::vector<std::string> all;
    comm_->AllGatherBytes(std::string(reinterpret_cast<const char*>(mine), sizeof(mine)), &all);
    r->rank_compute_ms.resize(all.size());
    for (size_t k = 0; k < all.size(); ++k) {
      double v[2] = {NAN, NAN};
      if (all[k].size() == sizeof(v)) std::memcpy(v, all[k].data(), sizeof(v));
      r->step_ms = std::max(r->step_ms, v[0]);
      r->rank_compute_ms[k] = v[1];
    }
  }
  if (phases_) {
    phases_->EndIteration();
    for (auto [name, phase] : {std::pair{"batch-generator", Phase::kData},
                               {"forward-compute", Phase::kForward},
                               {"backward-compute", Phase::kBackward},
                               {"backward-params-all-reduce", Phase::kReduce},
                               {"optimizer", Phase::kOptimizer}})
      r->timers_ms.emplace_back(name, 1e3 * phases_->IterationSeconds(phase));
  }
  AccountIteration(r);
}

StepResult Trainer::TrainStep() {
  const IterationPlan plan = PlanIteration();
  StepResult r;
  if (!plan.data_skipped) {
    const Status st = ComputeGradients(plan, &r);
    KEEL_CHECK(st.ok(), st.message());
    Update(/*apply=*/true, &r);
  }
  EndIteration(plan, &r);
  return r;
}

// This rank's sum of micro-batch losses of the current weights on a recorded batch, summed in
// the order the iteration summed them (so a rerun of a healthy pass gives the same bits).
double Trainer::ReplayLocalLoss(const BatchRecord& b) {
  const int mbs = cfg_.micro_batch_size, T = cfg_.seq_length;
  const size_t sample = static_cast<size_t>(T) + 1;
  double sum = 0;
  // (Every rank calls this, so the pipeline's collectives meet; a rank without the batch would
  // have none on every rank: the records are kept alike.)
  if (b.tokens.size() != static_cast<size_t>(b.micro_batches) * mbs * sample) return NAN;
  if (pp_size_ > 1) return PipelineForwardLoss(b.tokens.data(), b.micro_batches);
  for (int64_t m = 0; m < b.micro_batches; ++m) {
    for (int i = 0; i < mbs; ++i) {
      const int32_t* s = b.tokens.data() + (static_cast<size_t>(m) * mbs + i) * sample;
      std::copy(s, s + T, inputs_.data() + static_cast<size_t>(i) * T);
      std::copy(s + 1, s + T + 1, targets_.data() + static_cast<size_t>(i) * T);
    }
    sum += model_->Forward(inputs_.data(), targets_.data(), mbs, T, 0.0f);
  }
  return sum;
}

double Trainer::RerunLoss(std::vector<int>* differing_ranks) {
  // The same forward sums again; each rank says whether its own differs, so a transient fault
  // is pinned on the rank whose arithmetic failed (world ranks; the loss is each replica's, added
  // by its tensor rank 0).
  const int dp = comm_->world_size();
  const double sum = ReplayLocalLoss(cur_batch_);
  std::vector<double> v(2 + static_cast<size_t>(dp), 0.0);
  if (replica_representative()) {
    v[0] = sum;
    v[1] = static_cast<double>(cur_batch_.micro_batches);
  }
  v[2 + static_cast<size_t>(comm_->rank())] =
      std::memcmp(&sum, &local_loss_sum_, sizeof(double)) != 0 ? 1.0 : 0.0;
  comm_->AllReduceSumHost(v.data(), v.size());
  if (differing_ranks != nullptr) {
    differing_ranks->clear();
    for (int r = 0; r < dp; ++r)
      if (v[2 + static_cast<size_t>(r)] != 0) differing_ranks->push_back(r);
  }
  return v[1] > 0 ? v[0] / v[1] : NAN;
}

double Trainer::PreviousBatchLoss() {
  const double sum = ReplayLocalLoss(prev_batch_);
  const bool ok = std::isfinite(sum) && prev_batch_.micro_batches > 0;
  double v[2] = {ok ? sum : 0.0, ok ? static_cast<double>(prev_batch_.micro_batches) : 0.0};
  SumOverReplicas(v, 2);
  return v[1] > 0 ? v[0] / v[1] : NAN;
}

void Trainer::Restore(const TrainState& state) {
  state_ = state;
  if (scaler_) scaler_->Restore(state.loss_scaler);
  optimizer_->set_step(state.optimizer_step);
}

int64_t Trainer::NextGlobalBatch() const {
  return rampup_.GlobalBatchAt(state_.counters.consumed_samples);
}

double Trainer::NextLr() const {
  return state_.lr_scale * schedule_.LrAt(ScheduleSamples() + NextGlobalBatch());
}

double Trainer::Evaluate(int64_t iters) {
  double loss = NAN;
  if (!HasValidation() || iters <= 0) return loss;
  const Status st = Evaluate(iters, 0, &loss);
  KEEL_CHECK(st.ok(), st.message());
  return loss;
}

Status Trainer::Evaluate(int64_t iters, int set, double* loss) {
  const int mbs = cfg_.micro_batch_size, T = cfg_.seq_length, dp = data_comm_->world_size();
  // The final global batch, not the ramp-up's current one: every evaluation reads the same samples.
  const int64_t num_micro = cfg_.global_batch_size / (static_cast<int64_t>(mbs) * dp);
  double loss_sum = 0.0;
  int64_t count = 0;
  std::vector<int32_t> pipeline_samples;  // pipeline parallel: all of them, then one pass
  for (int64_t it = 0; it < iters; ++it) {
    for (int64_t m = 0; m < num_micro; ++m) {
      const int64_t first = (it * num_micro * dp + m * dp + data_comm_->rank()) * mbs;
      for (int b = 0; b < mbs; ++b) {
        int32_t* s = batch_tokens_.data() + static_cast<size_t>(b) * (T + 1);
        const SampleRequest req{first + b, state_.counters.iteration, state_.data_salt};
        KEEL_RETURN_IF_ERROR(data_.samples->ReadValid(set, req, s));
        if (pp_size_ > 1) pipeline_samples.insert(pipeline_samples.end(), s, s + T + 1);
        std::copy(s, s + T, inputs_.data() + static_cast<size_t>(b) * T);
        std::copy(s + 1, s + T + 1, targets_.data() + static_cast<size_t>(b) * T);
      }
      if (pp_size_ == 1) loss_sum += model_->Forward(inputs_.data(), targets_.data(), mbs, T, 0.0f);
      ++count;
    }
  }
  if (pp_size_ > 1) loss_sum = PipelineForwardLoss(pipeline_samples.data(), count);
  double reduced[2] = {loss_sum, static_cast<double>(count)};
  SumOverReplicas(reduced, 2);
  *loss = reduced[0] / reduced[1];
  return Status::OK();
}

Status Trainer::Validate(ValidationResult* out) {
  // Each dataset on its own validation split; the combined loss is their weighted mean, the
  // expected loss of the mixture (or, for validation groups, the first group's).
  double wsum = 0, lsum = 0;
  out->set_loss.clear();
  for (size_t v = 0; v < data_.valid_sets.size(); ++v) {
    double loss = NAN;
    KEEL_RETURN_IF_ERROR(Evaluate(cfg_.eval_iters, static_cast<int>(v), &loss));
    out->set_loss.push_back(loss);
    wsum += data_.valid_sets[v].weight;
    lsum += data_.valid_sets[v].weight * loss;
  }
  out->loss = out->set_loss.empty()                                 ? NAN
              : !data_.report_each_set || !data_.combine_validation ? out->set_loss[0]
                                                                    : lsum / wsum;
  return Status::OK();
}

void Trainer::AccountIteration(StepResult* r) {
  LogIntervalState& iv = state_.interval;
  const size_t nd = data_.dataset_names.size();
  // A skipped data window computes nothing: no loss, no throughput (a gap, not a NaN).
  // An fp16 overflow with a finite loss is the loss scaler's business, not a NaN iteration.
  r->nan = !r->data_skipped && r->skipped &&
           !(std::isfinite(r->loss) && (r->overflow || std::isfinite(r->grad_norm)));
  ++iv.iters;
  iv.ms += r->step_ms;
  if (!r->data_skipped) {
    iv.samples += r->global_batch;
    iv.flops += r->flops;
  }
  if (r->skipped) {
    ++iv.skipped;
    if (r->nan) ++iv.nan;
  } else {
    iv.loss_sum += r->loss;
    ++iv.ok;
    if (nd > 1) {
      iv.dataset_loss_sum.resize(nd, 0.0);
      iv.dataset_sequences.resize(nd, 0);
      for (size_t d = 0; d < nd; ++d) {
        if (r->dataset_sequences[d] == 0) continue;
        iv.dataset_loss_sum[d] += r->dataset_loss[d] * static_cast<double>(r->dataset_sequences[d]);
        iv.dataset_sequences[d] += r->dataset_sequences[d];
      }
    }
  }
  const int64_t it = state_.counters.iteration;
  if (it % cfg_.log_interval != 0 && it != total_iters_) return;
  r->closed_interval = iv;
  iv = LogIntervalState{};
}

void Trainer::SumOverReplicas(double* v, size_t n) {
  if (!replica_representative()) std::fill(v, v + n, 0.0);
  comm_->AllReduceSumHost(v, n);
}

GradStats Trainer::LocalGradStats(const float* grads, ShardRange own) {
  if (tp_size_ == 1 && pp_size_ == 1)
    return ComputeGradStats(backend_, grads + own.begin, own.size());
  GradStats total;
  for (const ParamInfo& p : model_->params()) {
    const size_t lo = std::max(p.offset, own.begin), hi = std::min(p.offset + p.numel, own.end);
    if (lo >= hi) continue;
    const GradStats g = ComputeGradStats(backend_, grads + lo, hi - lo);
    total.finite = total.finite && g.finite;
    if (CountsParam(p)) {
      total.sum_sq += g.sum_sq;
      total.num_zeros += g.num_zeros;
    }
  }
  total.norm = std::sqrt(total.sum_sq);
  return total;
}

namespace {

// The fingerprint's host buffers, counted: the most bytes it held at once is what
// fingerprint_peak_bytes() reports (about one whole tensor, never the model).
class HeldBuffers {
 public:
  std::vector<float> Take(size_t n) {
    now_ += n * sizeof(float);
    peak_ = std::max(peak_, now_);
    return std::vector<float>(n);
  }
  void Give(std::vector<float>* v) {
    now_ -= v->size() * sizeof(float);
    std::vector<float>().swap(*v);
  }
  size_t peak() const { return peak_; }

 private:
  size_t now_ = 0, peak_ = 0;
};

}  // namespace

uint64_t Trainer::StateFingerprint() {
  const GptSpec& spec = model_->spec();
  const size_t n = model_->num_params();
  // Every rank holds the whole state when nothing is split: each hashes its own, no messages.
  const bool local_only = tp_size_ == 1 && pp_size_ == 1 && !zero_;
  const int dp_rank = local_only ? 0 : data_comm_->rank();
  const int dp = data_comm_->world_size();
  // One rank hashes (tp 0, pp 0, dp 0); the others send it their parts, tensor by tensor.
  const bool hasher = dp_rank == 0 && tp_rank_ == 0 && pp_rank_ == 0;
  // Each whole tensor's stage (the tied embedding's first-stage original, not the copy), and this
  // rank's slice of those of its own stage.
  std::map<std::string, int> owner;
  for (int s = 1; s < pp_size_; ++s)
    for (size_t c = 0; c < chunks_.size(); ++c)
      for (const ParamInfo& p :
           GptModel::ParamLayout(spec, 1, ModelStageOf(parts_, pp_size_, s, static_cast<int>(c))))
        if (!p.tied_copy) owner[p.name] = s;
  std::map<std::string, const ParamInfo*> local;
  for (const ParamInfo& p : model_->params())
    if (!p.tied_copy) local[p.name] = &p;
  const std::vector<ParamInfo> whole = GptModel::ParamLayout(spec, 1);

  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  HeldBuffers held;
  // The same bytes as hashing the one-rank model's buffers whole, one after another: the
  // weights, exp_avg, exp_avg_sq, each tensor whole in the one-rank order (xxh3's streaming
  // digest depends only on the byte sequence), so the value does not depend on the layout.
  const ShardRange& sh = optimizer_->shard();
  const float* bufs[3] = {model_->param_data(), optimizer_->exp_avg(), optimizer_->exp_avg_sq()};
  for (int k = 0; k < 3; ++k) {
    const bool sharded = k > 0 && zero_;  // ZeRO-1: data rank r holds ShardOf(n, r, dp)
    for (const ParamInfo& w : whole) {
      const auto it = owner.find(w.name);
      const int s = it == owner.end() ? 0 : it->second;
      if (pp_rank_ != s) {
        if (!hasher) continue;
        std::vector<float> tensor = held.Take(w.numel);
        pipeline_comm_->Recv(tensor.data(), w.numel, s);
        XXH3_64bits_update(st, tensor.data(), w.numel * sizeof(float));
        held.Give(&tensor);
        continue;
      }
      const ParamInfo& p = *local.at(w.name);
      // 1. This rank's slice on data rank 0, its moments' pieces gathered from their shards.
      std::vector<float> slice;
      if (sharded) {
        const size_t lo = std::max(p.offset, sh.begin), hi = std::min(p.offset + p.numel, sh.end);
        if (dp_rank != 0) {
          if (lo < hi) {
            std::vector<float> piece = held.Take(hi - lo);
            backend_->CopyToHost(piece.data(), bufs[k] + (lo - sh.begin), hi - lo);
            data_comm_->Send(piece.data(), hi - lo, 0);
            held.Give(&piece);
          }
          continue;
        }
        slice = held.Take(p.numel);
        if (lo < hi)
          backend_->CopyToHost(slice.data() + (lo - p.offset), bufs[k] + (lo - sh.begin), hi - lo);
        for (int r = 1; r < dp; ++r) {
          const ShardRange o = ShardOf(n, r, dp);
          const size_t a = std::max(p.offset, o.begin), b = std::min(p.offset + p.numel, o.end);
          if (a < b) data_comm_->Recv(slice.data() + (a - p.offset), b - a, r);
        }
      } else {
        if (dp_rank != 0) continue;  // data rank 0 holds the same values
        slice = held.Take(p.numel);
        backend_->CopyToHost(slice.data(), bufs[k] + p.offset, p.numel);
      }
      // 2. The whole tensor on tensor rank 0: the slices joined (a replicated one is whole).
      std::vector<float> tensor;
      if (tp_size_ == 1 || p.split.replicated()) {
        if (tp_rank_ != 0) {
          held.Give(&slice);
          continue;
        }
        tensor = std::move(slice);
      } else if (tp_rank_ != 0) {
        tensor_comm_->Send(slice.data(), p.numel, 0);
        held.Give(&slice);
        continue;
      } else {
        tensor = held.Take(w.numel);
        InsertShard(slice.data(), p.full_shape, p.split, 0, tp_size_, tensor.data());
        for (int r = 1; r < tp_size_; ++r) {
          tensor_comm_->Recv(slice.data(), p.numel, r);
          InsertShard(slice.data(), p.full_shape, p.split, r, tp_size_, tensor.data());
        }
        held.Give(&slice);
      }
      KEEL_CHECK(tensor.size() == w.numel,
                 "a stage's tensor is not the one-rank model's: " + w.name);
      // 3. To the hasher (pipeline rank 0 of this tensor and data position).
      if (hasher)
        XXH3_64bits_update(st, tensor.data(), w.numel * sizeof(float));
      else
        pipeline_comm_->Send(tensor.data(), w.numel, 0);
      held.Give(&tensor);
    }
  }
  fingerprint_peak_bytes_ = held.peak();
  const TrainState& s = state_;
  XXH3_64bits_update(st, &s.optimizer_step, sizeof(s.optimizer_step));
  XXH3_64bits_update(st, &s.counters, sizeof(s.counters));
  XXH3_64bits_update(st, &s.lr_scale, sizeof(s.lr_scale));
  if (scaler_) {  // fp16 only: fingerprints of fp32 and bf16 runs are as before mixed precision
    XXH3_64bits_update(st, &s.loss_scaler.scale, sizeof(s.loss_scaler.scale));
    XXH3_64bits_update(st, &s.loss_scaler.growth_tracker, sizeof(s.loss_scaler.growth_tracker));
    XXH3_64bits_update(st, &s.loss_scaler.hysteresis_tracker,
                       sizeof(s.loss_scaler.hysteresis_tracker));
    XXH3_64bits_update(st, &s.loss_scaler.skipped_samples, sizeof(s.loss_scaler.skipped_samples));
  }
  XXH3_64bits_update(st, &s.data_salt, sizeof(s.data_salt));
  for (const IterationRange& r : s.skip_ranges) XXH3_64bits_update(st, &r, sizeof(r));
  // The log interval in progress. An empty one (at every log boundary, so at the end of every
  // run) adds nothing: fingerprints of finished runs compare across keel versions.
  const LogIntervalState& iv = s.interval;
  if (iv.iters > 0) {
    for (double v : {iv.loss_sum, iv.ms, iv.flops}) XXH3_64bits_update(st, &v, sizeof(v));
    for (int64_t v : {iv.iters, iv.ok, iv.skipped, iv.nan, iv.samples})
      XXH3_64bits_update(st, &v, sizeof(v));
    XXH3_64bits_update(st, iv.dataset_loss_sum.data(), iv.dataset_loss_sum.size() * sizeof(double));
    XXH3_64bits_update(st, iv.dataset_sequences.data(),
                       iv.dataset_sequences.size() * sizeof(int64_t));
  }
  uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  if (local_only || comm_->world_size() == 1) return h;
  // Every rank logs the hasher's value (the others' states are incomplete).
  std::vector<std::string> all;
  comm_->AllGatherBytes(hasher ? std::string(reinterpret_cast<const char*>(&h), sizeof h) : "",
                        &all);
  int from = -1;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].size() == sizeof h) from = static_cast<int>(r);
  KEEL_CHECK(from >= 0, "no rank hashed the state");
  std::memcpy(&h, all[from].data(), sizeof h);
  return h;
}

}  // namespace keel
