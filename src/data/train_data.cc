#include "data/train_data.h"

#include <fmt/format.h>

#include <set>

#include "data/prepare.h"

namespace keel {
namespace {

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Seed of the data order after the guard's re-seeding rung number `salt`.
uint64_t SaltedSeed(uint64_t seed, uint64_t salt) {
  return seed + salt * 0x9E3779B97F4A7C15ull;
}

}  // namespace

Status TrainData::Open(Env* env, const std::vector<std::pair<double, std::string>>& blend,
                       const std::string& split, int seq_length, uint64_t seed,
                       std::unique_ptr<TrainData>* out) {
  if (blend.empty()) return Status::InvalidArgument("--data-path names no dataset");
  auto td = std::unique_ptr<TrainData>(new TrainData());
  td->split_ = split;
  td->seq_length_ = seq_length;
  td->seed_ = seed;
  std::vector<double> weights;
  std::set<std::string> names;
  for (const auto& [weight, prefix] : blend) {
    Source s;
    s.prefix = prefix;
    KEEL_RETURN_IF_ERROR(ExpandShardPattern(env, prefix, &s.shards));
    KEEL_RETURN_IF_ERROR(ShardedDataset::Open(env, s.shards, &s.data));
    std::string name = BaseName(prefix);
    for (char& c : name)
      if (c == '*' || c == '?') c = '_';
    for (int i = 2; names.count(name); ++i) name = fmt::format("{}#{}", BaseName(prefix), i);
    names.insert(name);
    s.name = name;
    if (!td->sources_.empty()) {
      const DatasetMeta &a = td->sources_[0].data->meta(), &b = s.data->meta();
      if (a.tokenizer != b.tokenizer || a.vocab_size != b.vocab_size || a.eod_id != b.eod_id)
        return Status::InvalidArgument(fmt::format(
            "--data-path: {} was tokenized with {} (vocab {}, EOD {}) but {} with {} (vocab {}, "
            "EOD {}); a mixture trains one model with one vocabulary, so every dataset needs the "
            "same tokenizer: prepare {} again with `keel data prepare --tokenizer {}{}`",
            prefix, b.tokenizer.empty() ? "an unknown tokenizer" : b.tokenizer, b.vocab_size,
            b.eod_id, td->sources_[0].prefix, a.tokenizer, a.vocab_size, a.eod_id, prefix,
            a.tokenizer,
            a.tokenizer == "sentencepiece"
                ? " --tokenizer-model " + TokenizerModelPath(td->sources_[0].shards[0], a)
                : ""));
      // Two sentencepiece models of one size are still different vocabularies.
      if (a.tokenizer == "sentencepiece") {
        std::string ma, mb;
        Status ra = env->ReadFileToString(TokenizerModelPath(td->sources_[0].shards[0], a), &ma);
        Status rb = env->ReadFileToString(TokenizerModelPath(s.shards[0], b), &mb);
        if (!ra.ok() || !rb.ok() || ma != mb)
          return Status::InvalidArgument(fmt::format(
              "--data-path: {} and {} were tokenized with different sentencepiece models ({} and "
              "{}{}); a mixture needs one tokenizer: prepare {} again with `keel data prepare "
              "--tokenizer sentencepiece --tokenizer-model {}`",
              td->sources_[0].prefix, prefix, TokenizerModelPath(td->sources_[0].shards[0], a),
              TokenizerModelPath(s.shards[0], b),
              !ra.ok()   ? ": " + ra.message()
              : !rb.ok() ? ": " + rb.message()
                         : "",
              prefix, TokenizerModelPath(td->sources_[0].shards[0], a)));
      }
    }
    Status st = GptDataset::Create(s.data.get(), split, Split::kTrain, seq_length, seed, &s.train);
    if (!st.ok()) return Status::InvalidArgument("--data-path " + prefix + ": " + st.message());
    Status vst = GptDataset::Create(s.data.get(), split, Split::kValid, seq_length, seed, &s.valid);
    if (!vst.ok()) {
      s.valid.reset();
      s.valid_missing = vst.message();
    }
    weights.push_back(weight);
    td->sources_.push_back(std::move(s));
  }
  KEEL_RETURN_IF_ERROR(BlendedDataset::Create(weights, "--data-path", &td->blend_));
  for (size_t d = 0; d < td->sources_.size(); ++d) td->sources_[d].weight = td->blend_.weights()[d];
  *out = std::move(td);
  return Status::OK();
}

std::vector<std::string> TrainData::Names() const {
  std::vector<std::string> out;
  for (const Source& s : sources_) out.push_back(s.name);
  return out;
}

SampleOrigin TrainData::GetTrainSample(int64_t k, uint64_t salt, int32_t* tokens) {
  const auto [d, c] = sources_.size() == 1 ? std::pair<int, int64_t>{0, k} : blend_.Locate(k);
  const GptDataset* ds = sources_[static_cast<size_t>(d)].train.get();
  if (salt != 0) {
    std::unique_ptr<GptDataset>& r = reseeded_[{salt, d}];
    if (!r) {
      Status st = GptDataset::Create(sources_[static_cast<size_t>(d)].data.get(), split_,
                                     Split::kTrain, seq_length_, SaltedSeed(seed_, salt), &r);
      KEEL_CHECK(st.ok(), "the train split opened before cannot be reopened: " + st.message());
    }
    ds = r.get();
  }
  const int64_t first = ds->GetSample(c, tokens);
  return {d, ds->EpochOf(c), first};
}

SampleOrigin TrainData::GetValidSample(int d, int64_t index, int32_t* tokens) const {
  const Source& s = sources_[static_cast<size_t>(d)];
  KEEL_CHECK(s.valid != nullptr, "dataset " + s.name + " has no validation split");
  const int64_t first = s.valid->GetSample(index, tokens);
  return {d, s.valid->EpochOf(index), first};
}

TokenLocation TrainData::Locate(const SampleOrigin& origin, int offset) const {
  KEEL_CHECK(origin.dataset >= 0 && origin.dataset < NumDatasets(), "no such dataset");
  const Source& s = sources_[static_cast<size_t>(origin.dataset)];
  const ShardedDataset::Position p = s.data->Locate(origin.first_token + offset);
  TokenLocation l;
  l.dataset = origin.dataset;
  l.name = s.name;
  l.prefix = s.prefix;
  l.shard = s.shards[p.shard];
  l.sharded = s.shards.size() > 1;
  l.document = p.document;
  l.token = p.token;
  return l;
}

}  // namespace keel
