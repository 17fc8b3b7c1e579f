#include "data/train_data.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <tuple>

#include "data/dataset_check.h"
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
  DataSpec spec;
  spec.blend = blend;
  spec.split = split;
  spec.seq_length = seq_length;
  spec.seed = seed;
  return Open(env, spec, out);
}

// Opens `s.prefix` (once per prefix), settles its tokenizer and checks it against the datasets
// before it, then adds it.
Status TrainData::AddSource(Env* env, const DataSpec& spec, Source s,
                            std::vector<std::string>* notes) {
  const std::string flag = spec.train_groups.empty() ? "--data-path" : "weighted split paths";
  std::shared_ptr<ShardedDataset>& data = opened_[s.prefix];
  KEEL_RETURN_IF_ERROR(ExpandShardPattern(env, s.prefix, &s.shards));
  if (!data) {
    std::unique_ptr<ShardedDataset> opened;
    KEEL_RETURN_IF_ERROR(ShardedDataset::Open(env, s.shards, &opened));
    const DatasetMeta own = opened->meta();
    if (own.tokenizer.empty()) {
      // Megatron's tools write no keel metadata: the flags say which tokenizer made it, and every
      // id is checked against its vocabulary now, before any work.
      if (spec.flags_tokenizer == nullptr)
        return Status::InvalidArgument(fmt::format(
            "{} {}: {}.meta.json is missing (a dataset Megatron's tools wrote?), so its tokenizer "
            "and vocabulary are unknown: pass the tokenizer it was made with, as in Megatron: "
            "--tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json --merge-file "
            "gpt2-merges.txt, --tokenizer-type PretrainedFromHF --tokenizer-name-or-path DIR, or "
            "--tokenizer-type SentencePieceTokenizer --tokenizer-model FILE",
            flag, s.prefix, s.shards[0]));
      const int vocab = spec.flags_tokenizer->vocab_size;
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t i = 0; i < opened->NumShards(); ++i) {
        const IdCheck c = CheckIdsBelow(opened->shard(i), vocab);
        if (c.out_of_vocab > 0)
          return Status::InvalidArgument(fmt::format(
              "{} {}: token {} of document {} of {} is id {}, outside the vocabulary [0, {}) of "
              "{} ({} such ids): the data was tokenized with another tokenizer; pass the one it "
              "was made with (`keel data verify {} --vocab-size N` lists the ids)",
              flag, s.prefix, c.position, c.document, s.shards[i], c.id, vocab, spec.flags_text,
              c.out_of_vocab, s.shards[i]));
      }
      if (notes != nullptr)
        notes->push_back(fmt::format(
            "data: {} has no keel metadata: read with {} (vocab {}, EOD {}); its {} tokens were "
            "checked below {} in {:.2f} s",
            s.prefix, spec.flags_text, vocab, spec.flags_tokenizer->eod_id, opened->NumTokens(),
            vocab, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
    } else if (spec.flags_tokenizer != nullptr) {
      const DatasetMeta& f = *spec.flags_tokenizer;
      if (own.tokenizer != f.tokenizer || own.vocab_size != f.vocab_size || own.eod_id != f.eod_id)
        return Status::InvalidArgument(fmt::format(
            "{} {} was prepared with {} (vocab {}, EOD {}), but {} gives {} (vocab {}, EOD {}): "
            "the flags name the tokenizer of the data; drop them to use the dataset's own, or "
            "prepare it again with them (`keel data prepare ... {}`)",
            flag, s.prefix, own.tokenizer, own.vocab_size, own.eod_id, spec.flags_text, f.tokenizer,
            f.vocab_size, f.eod_id, spec.flags_text));
    }
    data = std::move(opened);
  }
  s.data = data;
  s.meta = data->meta().tokenizer.empty() ? *spec.flags_tokenizer : data->meta();
  if (!sources_.empty()) {
    const Source& first = sources_[0];
    const DatasetMeta &a = first.meta, &b = s.meta;
    if (a.tokenizer != b.tokenizer || a.vocab_size != b.vocab_size || a.eod_id != b.eod_id)
      return Status::InvalidArgument(fmt::format(
          "{}: {} was tokenized with {} (vocab {}, EOD {}) but {} with {} (vocab {}, EOD {}); a "
          "mixture trains one model with one vocabulary, so every dataset needs the same "
          "tokenizer: prepare {} again with `keel data prepare --tokenizer {}{}`",
          flag, s.prefix, b.tokenizer.empty() ? "an unknown tokenizer" : b.tokenizer, b.vocab_size,
          b.eod_id, first.prefix, a.tokenizer, a.vocab_size, a.eod_id, s.prefix, a.tokenizer,
          a.tokenizer == "sentencepiece"
              ? " --tokenizer-model " + TokenizerModelPath(first.shards[0], a)
              : ""));
    // Two sentencepiece models of one size are still different vocabularies.
    if (a.tokenizer == "sentencepiece" && first.prefix != s.prefix) {
      const std::string pa = TokenizerModelPath(first.shards[0], a),
                        pb = TokenizerModelPath(s.shards[0], b);
      std::string ma, mb;
      Status ra = env->ReadFileToString(pa, &ma);
      Status rb = env->ReadFileToString(pb, &mb);
      if (!ra.ok() || !rb.ok() || ma != mb)
        return Status::InvalidArgument(fmt::format(
            "{}: {} and {} were tokenized with different sentencepiece models ({} and {}{}); a "
            "mixture needs one tokenizer: prepare {} again with `keel data prepare --tokenizer "
            "sentencepiece --tokenizer-model {}`",
            flag, first.prefix, s.prefix, pa, pb,
            !ra.ok()   ? ": " + ra.message()
            : !rb.ok() ? ": " + rb.message()
                       : "",
            s.prefix, pa));
    }
  }
  sources_.push_back(std::move(s));
  return Status::OK();
}

namespace {

// A unique name for the dataset at `prefix` among `names`.
std::string UniqueName(const std::string& prefix, std::set<std::string>* names) {
  std::string name = BaseName(prefix);
  for (char& c : name)
    if (c == '*' || c == '?') c = '_';
  for (int i = 2; names->count(name); ++i) name = fmt::format("{}#{}", BaseName(prefix), i);
  names->insert(name);
  return name;
}

}  // namespace

Status TrainData::Open(Env* env, const DataSpec& spec, std::unique_ptr<TrainData>* out,
                       std::vector<std::string>* notes) {
  auto td = std::unique_ptr<TrainData>(new TrainData());
  td->split_ = spec.split;
  td->seq_length_ = spec.seq_length;
  td->seed_ = spec.seed;
  std::vector<double> weights;
  std::set<std::string> names;
  if (spec.train_groups.empty()) {
    if (spec.blend.empty()) return Status::InvalidArgument("--data-path names no dataset");
    for (const auto& [weight, prefix] : spec.blend) {
      Source s;
      s.prefix = prefix;
      s.name = UniqueName(prefix, &names);
      KEEL_RETURN_IF_ERROR(td->AddSource(env, spec, std::move(s), notes));
      Source& added = td->sources_.back();
      Status st = GptDataset::Create(added.data.get(), spec.split, Split::kTrain, spec.seq_length,
                                     spec.seed, &added.train);
      if (!st.ok()) return Status::InvalidArgument("--data-path " + prefix + ": " + st.message());
      Status vst = GptDataset::Create(added.data.get(), spec.split, Split::kValid, spec.seq_length,
                                      spec.seed, &added.valid);
      if (!vst.ok()) {
        added.valid.reset();
        added.valid_missing = vst.message();
      }
      weights.push_back(weight);
    }
    td->num_train_ = static_cast<int>(td->sources_.size());
    KEEL_RETURN_IF_ERROR(BlendedDataset::Create(weights, "--data-path", &td->blend_));
    for (int d = 0; d < td->num_train_; ++d) {
      Source& src = td->sources_[static_cast<size_t>(d)];
      src.weight = td->blend_.weights()[static_cast<size_t>(d)];
      if (!src.valid) continue;
      ValidSet v;
      v.name = src.name;
      v.weight = src.weight;
      v.members = {d};
      td->valid_sets_.push_back(std::move(v));
    }
    *out = std::move(td);
    return Status::OK();
  }

  // Megatron-DeepSpeed's weighted split paths: each dataset over its own document range.
  auto add_member = [&](const WeightedSplitGroup& g, const WeightedSplitEntry& e, Split split,
                        const char* flag) -> Status {
    Source s;
    s.prefix = e.prefix;
    s.name = split == Split::kTrain ? UniqueName(e.prefix, &names) : g.name + "/" + e.prefix;
    KEEL_RETURN_IF_ERROR(td->AddSource(env, spec, std::move(s), notes));
    Source& added = td->sources_.back();
    int64_t first = 0, last = 0;
    const int64_t n = static_cast<int64_t>(added.data->NumDocuments());
    DocumentRange(e, n, &first, &last);
    added.range = fmt::format("documents [{}, {}) of {} ({}:{})", first, last, n, e.start, e.end);
    const std::string where =
        fmt::format("{} group '{}': {} {}", flag, g.name, e.prefix, added.range);
    Status st = GptDataset::CreateForDocuments(
        added.data.get(), first, last, split, spec.seq_length, spec.seed, where,
        split == Split::kTrain ? &added.train : &added.valid);
    if (!st.ok()) return Status::InvalidArgument(st.message());
    return Status::OK();
  };
  const WeightedSplitGroup& train = spec.train_groups[0];
  for (const WeightedSplitEntry& e : train.entries) {
    KEEL_RETURN_IF_ERROR(add_member(train, e, Split::kTrain, "--train-weighted-split-paths"));
    weights.push_back(e.weight);
  }
  td->num_train_ = static_cast<int>(td->sources_.size());
  KEEL_RETURN_IF_ERROR(
      BlendedDataset::Create(weights, "--train-weighted-split-paths", &td->blend_));
  for (int d = 0; d < td->num_train_; ++d)
    td->sources_[static_cast<size_t>(d)].weight = td->blend_.weights()[static_cast<size_t>(d)];
  td->combine_validation_ = false;
  for (const WeightedSplitGroup& g : spec.valid_groups) {
    ValidSet v;
    v.name = g.name;
    std::vector<double> w;
    for (const WeightedSplitEntry& e : g.entries) {
      KEEL_RETURN_IF_ERROR(add_member(g, e, Split::kValid, "--valid-weighted-split-paths"));
      v.members.push_back(static_cast<int>(td->sources_.size()) - 1);
      w.push_back(e.weight);
    }
    KEEL_RETURN_IF_ERROR(
        BlendedDataset::Create(w, "--valid-weighted-split-paths group " + g.name, &v.blend));
    td->valid_sets_.push_back(std::move(v));
  }
  *out = std::move(td);
  return Status::OK();
}

std::vector<std::string> TrainData::Names() const {
  std::vector<std::string> out;
  for (int d = 0; d < num_train_; ++d) out.push_back(sources_[static_cast<size_t>(d)].name);
  return out;
}

SampleOrigin TrainData::GetTrainSample(int64_t k, uint64_t salt, int32_t* tokens) {
  int d = 0;
  int64_t c = k;
  const GptDataset* ds = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (num_train_ > 1) std::tie(d, c) = blend_.Locate(k);
    ds = sources_[static_cast<size_t>(d)].train.get();
    if (salt != 0) {
      std::unique_ptr<GptDataset>& r = reseeded_[{salt, d}];
      if (!r) {
        const Source& src = sources_[static_cast<size_t>(d)];
        Status st;
        if (src.range.empty()) {
          st = GptDataset::Create(src.data.get(), split_, Split::kTrain, seq_length_,
                                  SaltedSeed(seed_, salt), &r);
        } else {
          // Weighted split paths: the same document range, in the re-seeded order.
          const GptDataset* base = src.train.get();
          const DocumentStream* data = src.data.get();
          const auto& starts = data->DocumentStarts();
          const int64_t first =
              std::lower_bound(starts.begin(), starts.end(), base->StreamBegin()) - starts.begin();
          const int64_t last =
              std::lower_bound(starts.begin(), starts.end(), base->StreamEnd()) - starts.begin();
          st = GptDataset::CreateForDocuments(data, first, last, Split::kTrain, seq_length_,
                                              SaltedSeed(seed_, salt), "re-seeded range", &r);
        }
        KEEL_CHECK(st.ok(), "the train split opened before cannot be reopened: " + st.message());
      }
      ds = r.get();
    }
  }
  const int64_t first = ds->GetSample(c, tokens);
  return {d, ds->EpochOf(c), first};
}

int64_t TrainData::ValidSetSamples(int v) const {
  int64_t n = 0;
  for (int m : valid_sets_[static_cast<size_t>(v)].members)
    n += sources_[static_cast<size_t>(m)].valid->SamplesPerEpoch();
  return n;
}

SampleOrigin TrainData::GetValidSample(int v, int64_t index, int32_t* tokens) {
  ValidSet& vs = valid_sets_[static_cast<size_t>(v)];
  int m = 0;
  int64_t c = index;
  if (vs.members.size() > 1) std::tie(m, c) = vs.blend.Locate(index);
  const int src = vs.members[static_cast<size_t>(m)];
  const GptDataset* ds = sources_[static_cast<size_t>(src)].valid.get();
  KEEL_CHECK(ds != nullptr, "validation set " + vs.name + " has no validation split");
  const int64_t first = ds->GetSample(c, tokens);
  return {src, ds->EpochOf(c), first};
}

TokenLocation TrainData::Locate(const SampleOrigin& origin, int offset) const {
  KEEL_CHECK(origin.dataset >= 0 && origin.dataset < static_cast<int>(sources_.size()),
             "no such dataset");
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
