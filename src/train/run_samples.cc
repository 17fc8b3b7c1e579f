#include "train/run_samples.h"

#include <fmt/format.h>

#include <tuple>

#include "core/log.h"
#include "data/blended_dataset.h"
#include "data/default_corpus.h"
#include "data/megatron_tokenizer.h"
#include "data/prepare.h"
#include "train/memory_estimate.h"

namespace keel {

Status OpenRunData(Env* env, TrainConfig* cfg, RunData* out, std::vector<std::string>* notes) {
  DataSpec spec;
  spec.split = cfg->split;
  spec.seq_length = cfg->seq_length;
  spec.seed = cfg->seed;
  if (!cfg->train_weighted_split_paths.empty()) {
    for (auto [flag, texts, groups] :
         {std::tuple{"--train-weighted-split-paths", &cfg->train_weighted_split_paths,
                     &spec.train_groups},
          {"--valid-weighted-split-paths", &cfg->valid_weighted_split_paths, &spec.valid_groups}})
      for (const std::string& text : *texts) {
        groups->emplace_back();
        KEEL_RETURN_IF_ERROR(ParseWeightedSplitGroup(text, flag, &groups->back()));
      }
  } else if (cfg->data_path.empty()) {  // (a lone "" is normalised away by the config)
    std::string prefix;
    const std::string tok = cfg->tokenizer == TokenizerKind::kGpt2 ? "gpt2" : "sentencepiece";
    KEEL_RETURN_IF_ERROR(EnsureDefaultCorpus(env, tok, 4096, &prefix, notes));
    spec.blend.emplace_back(1.0, prefix);
  } else {
    KEEL_RETURN_IF_ERROR(ParseDataBlend(cfg->data_path, &spec.blend));
  }
  // Megatron's tokenizer flags: the tokenizer of data without keel metadata.
  DatasetMeta flags_meta;
  if (!cfg->tokenizer_type.empty()) {
    const TokenizerSpec ts{cfg->tokenizer_type, cfg->vocab_file, cfg->merge_file,
                           cfg->tokenizer_model, cfg->tokenizer_name_or_path};
    std::unique_ptr<Tokenizer> tok;
    KEEL_RETURN_IF_ERROR(LoadTokenizerFromSpec(env, ts, &tok, notes));
    flags_meta = MetaForSpec(ts, *tok);
    spec.flags_tokenizer = &flags_meta;
    spec.flags_text = DescribeSpec(ts);
  }
  KEEL_RETURN_IF_ERROR(TrainData::Open(env, spec, &out->data, notes));
  out->prefix = out->data->source(0).shards[0];  // its tokenizer is the run's
  out->meta = out->data->meta();
  if (out->meta.vocab_size <= 0)
    return Status::InvalidArgument(out->prefix + ".meta.json gives no vocabulary size for " +
                                   out->prefix +
                                   ": prepare the data again with `keel data prepare`");
  cfg->model.vocab = out->meta.vocab_size;
  cfg->model.eod_id = out->meta.eod_id;
  if ((cfg->model.reset_position_ids || cfg->model.reset_attention_mask) && out->meta.eod_id < 0)
    return Status::InvalidArgument(
        "--reset-position-ids / --reset-attention-mask find documents by their end-of-document "
        "token, but " +
        out->prefix +
        ".meta.json names none; prepare the data with `keel data prepare` (it records the EOD "
        "id) or drop the flags");
  return Status::OK();
}

void LogRunData(const TrainConfig& cfg, const TrainData& data) {
  const bool mixture = data.NumDatasets() > 1;
  for (int d = 0; d < data.NumDatasets(); ++d) {
    const TrainData::Source& src = data.source(d);
    Log("data: {} ({}{} documents, {} tokens; train split {}{} samples of {} tokens per epoch{})",
        mixture ? fmt::format("{} = {} (weight {:.4f})", src.name, src.prefix, src.weight)
                : src.prefix,
        src.shards.size() > 1 ? fmt::format("{} shards, ", src.shards.size()) : "",
        src.data->NumDocuments(), src.data->NumTokens(), src.range.empty() ? "" : src.range + ", ",
        src.train->SamplesPerEpoch(), cfg.seq_length,
        src.valid ? fmt::format(", validation split {} samples", src.valid->SamplesPerEpoch())
                  : "");
    if (!src.valid && data.CombineValidation())
      Warn("no validation set for {} ({}); it is not evaluated", src.name, src.valid_missing);
  }
  if (mixture)
    Log("data: mixture of {} datasets by error diffusion over the weights: over any window of N "
        "samples each dataset gets its share within 2 samples; the order is a pure function of "
        "(seed, position)",
        data.NumDatasets());
  if (!data.CombineValidation())
    for (int v = 0; v < data.NumValidSets(); ++v)
      Log("data: validation group {}: {} samples of {} tokens per epoch, evaluated on its own",
          data.ValidSetName(v), data.ValidSetSamples(v), cfg.seq_length);
  for (int v = 0; v < data.NumValidSets(); ++v)
    if (cfg.eval_iters * cfg.global_batch_size > data.ValidSetSamples(v))
      Warn(
          "an evaluation of {} reads --eval-iters {} x global batch {} = {} samples but its "
          "validation split has {}: samples repeat within an evaluation; lower --eval-iters or "
          "give the validation split more weight in --split",
          data.ValidSetName(v), cfg.eval_iters, cfg.global_batch_size,
          cfg.eval_iters * cfg.global_batch_size, data.ValidSetSamples(v));
  if (data.NumValidSets() == 0) Warn("no dataset has a validation split: validation is skipped");
}

RunSamples::RunSamples(const TrainConfig& cfg, const RunData& data, const TestHooks* hooks)
    : cfg_(cfg), data_(data.data.get()), meta_(data.meta), hooks_(hooks) {
  // Samples are read ahead on background threads (data/sample_prefetcher.h); the loop's own
  // thread sees each sample's dataset and epoch, and logs a dataset's new epoch as it begins.
  prefetcher_ = std::make_unique<SamplePrefetcher>(
      [d = data_](int64_t index, uint64_t salt, int32_t* tokens) {
        return d->GetTrainSample(index, salt, tokens);
      },
      cfg_.seq_length + 1, SamplePrefetchDepth(cfg_), cfg_.num_workers);
  last_epoch_.assign(static_cast<size_t>(data_->NumDatasets()), -1);
}

RunSamples::~RunSamples() = default;

TrainerData RunSamples::Describe(std::shared_ptr<SampleSource> self) const {
  TrainerData td;
  td.samples = std::move(self);
  td.combine_validation = data_->CombineValidation();
  if (data_->NumDatasets() == 1 && data_->CombineValidation()) {
    // One dataset: its validation split (if any) is reported unnamed.
    if (data_->NumValidSets() == 1) td.valid_sets.push_back({"data", 1.0});
    return td;
  }
  td.dataset_names = data_->Names();
  td.report_each_set = true;
  for (int v = 0; v < data_->NumValidSets(); ++v)
    td.valid_sets.push_back({data_->ValidSetName(v), data_->ValidSetWeight(v)});
  return td;
}

Status RunSamples::ReadValid(int set, const SampleRequest& r, int32_t* tokens) {
  return CheckTokens(data_->GetValidSample(set, r.index, tokens), tokens, /*train=*/false, r);
}

Status RunSamples::CheckTokens(const SampleOrigin& o, const int32_t* tokens, bool train,
                               const SampleRequest& r) const {
  // Against the tokenizer's vocabulary, not the padded one: an id in the padding would train a
  // row the output never predicts. One unsigned compare per token also catches negative ids.
  const uint32_t vocab = static_cast<uint32_t>(cfg_.model.vocab);
  int bad = -1;
  for (int t = 0; t <= cfg_.seq_length && bad < 0; ++t)
    if (static_cast<uint32_t>(tokens[t]) >= vocab) bad = t;
  if (bad < 0) return Status::OK();
  const TokenLocation l = data_->Locate(o, bad);
  return Status::InvalidArgument(fmt::format(
      "dataset {} (--data-path {}{}): token {} of document {} is id {}, outside the vocabulary "
      "[0, {}) of its tokenizer ({}); it was read as {} sample {} {} {}. The data was prepared "
      "with another tokenizer, or is corrupt: `keel data verify {}` lists every such id; prepare "
      "it again with the tokenizer it is meant for (`keel data prepare --tokenizer ...`)",
      l.name, l.prefix, l.sharded ? ", shard " + l.shard : "", l.token, l.document, tokens[bad],
      cfg_.model.vocab, meta_.tokenizer.empty() ? "unknown" : meta_.tokenizer,
      train ? "training" : "validation", r.index,
      train ? "of iteration" : "of the evaluation after iteration", r.iteration, l.shard));
}

Status RunSamples::ReadTrain(const SampleRequest& r, int32_t* tokens, int* dataset) {
  if (hooks_ != nullptr && hooks_->Poisoned(r.iteration)) {
    TestHooks::PoisonSample(cfg_.seed, r.index, cfg_.seq_length, cfg_.model.vocab, tokens);
    *dataset = 0;
    return Status::OK();
  }
  // The guard's re-seeding rung raises the data salt: from then on the samples come from the
  // same splits in the order of seed + salt.
  if (r.salt != last_salt_) {
    Log("data: order re-seeded (salt {}) from sample {}", r.salt, r.index);
    last_salt_ = r.salt;
  }
  const SampleOrigin o = prefetcher_->Get(r.index, r.salt, tokens);
  KEEL_RETURN_IF_ERROR(CheckTokens(o, tokens, /*train=*/true, r));
  int64_t& seen = last_epoch_[static_cast<size_t>(o.dataset)];
  if (o.epoch != seen) {
    const TrainData::Source& src = data_->source(o.dataset);
    if (seen >= 0 && o.epoch > seen)
      Log("data: {} exhausted after {} epoch(s) of {} samples; epoch {} begins with a new "
          "deterministic order (run sample {})",
          src.name, o.epoch, src.train->SamplesPerEpoch(), o.epoch + 1, r.index);
    else if (o.epoch > 0)
      Log("data: {} is in epoch {} (run sample {})", src.name, o.epoch + 1, r.index);
    seen = o.epoch;
  }
  *dataset = o.dataset;
  return Status::OK();
}

}  // namespace keel
