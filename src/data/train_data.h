// TrainData: the datasets of a training run: one, or a weighted mixture of several (Megatron's
// --data-path W1 P1 W2 P2 ...), each possibly sharded, each split into train/valid/test by
// documents (--split) and read in its own deterministic order.
//
// Training position k reads dataset d(k), sample c_d(k) of d's train split (BlendedDataset), and
// that sample is the PermuteSample of d's epoch: so the (dataset, sample) sequence is a pure
// function of (weights, seed, position) and a resumed run continues it exactly. Every dataset
// must share one tokenizer (the model has one vocabulary).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "data/blended_dataset.h"
#include "data/gpt_dataset.h"
#include "data/sharded_dataset.h"

namespace keel {

// Which dataset a sample came from, which of its epochs, and where in that dataset's token
// stream it was cut (its first token; TrainData::Locate turns that into a document).
struct SampleOrigin {
  int dataset = 0;
  int64_t epoch = 0;
  int64_t first_token = 0;
};

// Where one token of a sample lies, for errors a user can act on: the dataset, its shard (the
// dataset's own prefix when it has one), the document within that shard and the token within
// that document, as `keel data verify SHARD` counts them.
struct TokenLocation {
  int dataset = 0;
  std::string name;    // the dataset's name in logs and metrics
  std::string prefix;  // as given to --data-path (a shard pattern stays a pattern)
  std::string shard;   // the prefix of the shard holding the token
  bool sharded = false;
  int64_t document = 0;
  int64_t token = 0;
};

class TrainData {
 public:
  struct Source {
    std::string name;                 // for logs and metrics: the prefix's file name (made unique)
    std::string prefix;               // as given (a shard pattern stays a pattern)
    std::vector<std::string> shards;  // the prefixes it stands for
    double weight = 1;                // normalised: the weights sum to 1
    std::unique_ptr<ShardedDataset> data;
    std::unique_ptr<GptDataset> train, valid;  // valid is null when the split leaves none
    std::string valid_missing;                 // why, when valid is null
  };

  // `blend` as ParseDataBlend returns it. Errors name --data-path, the dataset and a fix.
  static Status Open(Env* env, const std::vector<std::pair<double, std::string>>& blend,
                     const std::string& split, int seq_length, uint64_t seed,
                     std::unique_ptr<TrainData>* out);

  int NumDatasets() const { return static_cast<int>(sources_.size()); }
  const Source& source(int d) const { return sources_[static_cast<size_t>(d)]; }
  const DatasetMeta& meta() const { return sources_[0].data->meta(); }
  std::vector<std::string> Names() const;

  // Training sample at position k of the run's sample stream, in the order of `salt` (0: the
  // seed's; the guard's re-seeding rung raises it). Not thread-safe: one reader (the prefetcher).
  SampleOrigin GetTrainSample(int64_t k, uint64_t salt, int32_t* tokens);
  // Sample `index` of dataset d's validation split (thread-safe; d must have one).
  SampleOrigin GetValidSample(int d, int64_t index, int32_t* tokens) const;
  // Where token `offset` (0..seq_length) of the sample `origin` came from lies (thread-safe).
  TokenLocation Locate(const SampleOrigin& origin, int offset) const;

 private:
  std::vector<Source> sources_;
  BlendedDataset blend_;
  std::string split_;
  int seq_length_ = 0;
  uint64_t seed_ = 0;
  std::map<std::pair<uint64_t, int>, std::unique_ptr<GptDataset>> reseeded_;  // (salt, dataset)
};

}  // namespace keel
