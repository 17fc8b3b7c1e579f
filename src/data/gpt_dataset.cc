#include "data/gpt_dataset.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>

#include "core/rng.h"

namespace keel {
namespace {

const char* SplitName(Split split) {
  switch (split) {
    case Split::kTrain:
      return "train";
    case Split::kValid:
      return "valid";
    case Split::kTest:
      return "test";
  }
  return "?";
}

}  // namespace

Status ParseSplit(const std::string& text, double weights[3]) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("--split '" + text + "': " + why +
                                   " (expected up to three non-negative weights, e.g. 969,30,1)");
  };
  weights[0] = weights[1] = weights[2] = 0.0;
  size_t count = 0, pos = 0;
  while (true) {
    size_t sep = text.find_first_of(",/", pos);
    std::string field = text.substr(pos, sep == std::string::npos ? std::string::npos : sep - pos);
    if (count == 3) return bad("more than three weights");
    if (field.empty()) return bad("empty weight");
    char* end = nullptr;
    double w = std::strtod(field.c_str(), &end);
    if (end != field.c_str() + field.size()) return bad("'" + field + "' is not a number");
    if (!std::isfinite(w) || w < 0) return bad("weight '" + field + "' is negative or not finite");
    weights[count++] = w;
    if (sep == std::string::npos) break;
    pos = sep + 1;
  }
  if (weights[0] + weights[1] + weights[2] <= 0) return bad("all weights are zero");
  return Status::OK();
}

int64_t PermuteSample(int64_t k, int64_t n, uint64_t seed, Split split, int64_t epoch) {
  KEEL_CHECK(n > 0 && k >= 0 && k < n, "sample position out of range");
  if (n == 1) return 0;
  // Balanced Feistel over 2^(2*half) >= n values; cycle walking maps back into [0, n). The domain
  // is < 4n, so a position takes fewer than 4 walks on average.
  const int bits = std::bit_width(static_cast<uint64_t>(n - 1));
  const int half = (bits + 1) / 2;
  const uint64_t mask = (uint64_t{1} << half) - 1;
  const RngKey key{seed, RngPurpose::kDataOrder,
                   static_cast<uint64_t>(epoch) * 4 + static_cast<uint64_t>(split)};
  uint64_t x = static_cast<uint64_t>(k);
  do {
    uint64_t left = x >> half, right = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      uint64_t f = U64At(key, (right << 2) | round) & mask;
      uint64_t next_right = left ^ f;
      left = right;
      right = next_right;
    }
    x = (left << half) | right;
  } while (x >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(x);
}

Status GptDataset::Create(const DocumentStream* data, const std::string& split_weights, Split split,
                          int seq_length, uint64_t seed, std::unique_ptr<GptDataset>* out) {
  if (data == nullptr) return Status::InvalidArgument("GptDataset needs a dataset");
  if (seq_length < 1) {
    return Status::InvalidArgument("--seq-length must be >= 1, got " + std::to_string(seq_length));
  }
  double w[3];
  KEEL_RETURN_IF_ERROR(ParseSplit(split_weights, w));

  // Megatron's get_train_valid_test_split_: round each share of the documents, then shift the
  // boundaries so the last one lands exactly on the document count. nearbyint rounds half to
  // even, like Python's round().
  const int64_t docs = static_cast<int64_t>(data->NumDocuments());
  const double sum = w[0] + w[1] + w[2];
  int64_t bounds[4] = {0, 0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    bounds[i + 1] = bounds[i] + static_cast<int64_t>(std::nearbyint(w[i] / sum * docs));
  }
  const int64_t diff = bounds[3] - docs;
  for (int i = 1; i < 4; ++i) bounds[i] -= diff;

  const int s = static_cast<int>(split);
  const int64_t first_doc = std::max<int64_t>(0, bounds[s]);
  const int64_t last_doc = std::max<int64_t>(first_doc, bounds[s + 1]);
  const std::string where = std::string(SplitName(split)) + " split (documents [" +
                            std::to_string(first_doc) + ", " + std::to_string(last_doc) + ") of " +
                            std::to_string(docs) + " with --split " + split_weights + ")";
  return CreateForDocuments(data, first_doc, last_doc, split, seq_length, seed, where, out);
}

Status GptDataset::CreateForDocuments(const DocumentStream* data, int64_t first_doc,
                                      int64_t last_doc, Split split, int seq_length, uint64_t seed,
                                      const std::string& where, std::unique_ptr<GptDataset>* out) {
  if (data == nullptr) return Status::InvalidArgument("GptDataset needs a dataset");
  if (seq_length < 1)
    return Status::InvalidArgument("--seq-length must be >= 1, got " + std::to_string(seq_length));
  const int64_t docs = static_cast<int64_t>(data->NumDocuments());
  first_doc = std::clamp<int64_t>(first_doc, 0, docs);
  last_doc = std::clamp<int64_t>(last_doc, first_doc, docs);
  auto ds = std::unique_ptr<GptDataset>(new GptDataset());
  ds->data_ = data;
  ds->seq_length_ = seq_length;
  ds->seed_ = seed;
  ds->split_ = split;
  ds->stream_begin_ = data->DocumentStarts()[first_doc];
  ds->stream_end_ = data->DocumentStarts()[last_doc];
  const int64_t tokens = ds->stream_end_ - ds->stream_begin_;
  if (last_doc == first_doc) {
    return Status::InvalidArgument("the " + where + " is empty" +
                                   (split == Split::kTrain
                                        ? "; give the train split a larger weight or use a "
                                          "dataset with more documents"
                                        : ""));
  }
  if (tokens < static_cast<int64_t>(seq_length) + 1) {
    return Status::InvalidArgument("the " + where + " has " + std::to_string(tokens) +
                                   " tokens, fewer than one sample of --seq-length " +
                                   std::to_string(seq_length) + " + 1");
  }
  // Samples overlap by one token (the last target of one is the first input of the next).
  ds->num_samples_ = (tokens - 1) / seq_length;
  *out = std::move(ds);
  return Status::OK();
}

int64_t GptDataset::SampleStart(int64_t index) const {
  KEEL_CHECK(num_samples_ > 0,
             std::string("GetSample on the empty ") + SplitName(split_) + " split");
  KEEL_CHECK(index >= 0, "negative sample index");
  const int64_t epoch = index / num_samples_;
  const int64_t sample = PermuteSample(index % num_samples_, num_samples_, seed_, split_, epoch);
  return stream_begin_ + sample * seq_length_;
}

int64_t GptDataset::GetSample(int64_t index, int32_t* tokens) const {
  const int64_t start = SampleStart(index);
  data_->ReadStream(start, seq_length_ + 1, tokens);
  return start;
}

}  // namespace keel
