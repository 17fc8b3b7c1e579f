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
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "data/blended_dataset.h"
#include "data/gpt_dataset.h"
#include "data/sharded_dataset.h"
#include "data/weighted_split_paths.h"

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

// What a run trains and validates on: Megatron's --data-path (one prefix or a weighted mixture)
// split by --split, or Megatron-DeepSpeed's weighted split groups.
struct DataSpec {
  std::vector<std::pair<double, std::string>> blend;  // --data-path, as ParseDataBlend returns it
  std::string split = "969,30,1";
  // Instead of `blend`: one train group, and validation groups each evaluated on its own.
  std::vector<WeightedSplitGroup> train_groups, valid_groups;
  int seq_length = 0;
  uint64_t seed = 0;
  // The tokenizer of Megatron's flags (data/megatron_tokenizer.h), null when none was given. A
  // dataset without keel metadata (one Megatron's tools wrote) is read with it, every id checked
  // below its vocabulary as the dataset is opened; one with metadata must agree with it.
  const DatasetMeta* flags_tokenizer = nullptr;
  std::string flags_text;  // the flags, for messages ("--tokenizer-type GPT2BPETokenizer ...")
};

class TrainData {
 public:
  struct Source {
    std::string name;                 // for logs and metrics: the prefix's file name (made unique)
    std::string prefix;               // as given (a shard pattern stays a pattern)
    std::vector<std::string> shards;  // the prefixes it stands for
    double weight = 1;                // normalised: the weights sum to 1
    std::shared_ptr<ShardedDataset> data;  // shared by the groups that read the same prefix
    DatasetMeta meta;  // its tokenizer: its own metadata's, or the flags' when it has none
    std::unique_ptr<GptDataset> train, valid;  // either is null when not read from this source
    std::string valid_missing;                 // why, when valid is null
    std::string range;  // weighted split paths: "documents [a, b) of n (START:END)"
  };

  // Errors name the flag, the dataset and a fix. `notes` (may be null) gets what opening did
  // on the user's behalf (a dataset read with the flags' tokenizer and checked).
  static Status Open(Env* env, const DataSpec& spec, std::unique_ptr<TrainData>* out,
                     std::vector<std::string>* notes = nullptr);
  // --data-path and --split only.
  static Status Open(Env* env, const std::vector<std::pair<double, std::string>>& blend,
                     const std::string& split, int seq_length, uint64_t seed,
                     std::unique_ptr<TrainData>* out);

  // The datasets training reads (0..NumDatasets()-1); a mixture reports each one's loss.
  int NumDatasets() const { return num_train_; }
  const Source& source(int d) const { return sources_[static_cast<size_t>(d)]; }
  const DatasetMeta& meta() const { return sources_[0].meta; }
  std::vector<std::string> Names() const;

  // Training sample at position k of the run's sample stream, in the order of `salt` (0: the
  // seed's; the guard's re-seeding rung raises it). Thread-safe: the mixture's cursor and the
  // re-seeded orders are behind a lock, the reads are not.
  SampleOrigin GetTrainSample(int64_t k, uint64_t salt, int32_t* tokens);

  // The validation sets: with --data-path, each dataset's --split share (a mixture's combined
  // loss is their weighted mean); with weighted split paths, each validation group.
  int NumValidSets() const { return static_cast<int>(valid_sets_.size()); }
  const std::string& ValidSetName(int v) const { return valid_sets_[static_cast<size_t>(v)].name; }
  double ValidSetWeight(int v) const { return valid_sets_[static_cast<size_t>(v)].weight; }
  int64_t ValidSetSamples(int v) const;  // one epoch of it
  // Whether the validation line is the sets' weighted mean (no: the groups are separate).
  bool CombineValidation() const { return combine_validation_; }
  // Sample `index` of validation set v (the loop's thread only).
  SampleOrigin GetValidSample(int v, int64_t index, int32_t* tokens);
  // Where token `offset` (0..seq_length) of the sample `origin` came from lies (thread-safe).
  TokenLocation Locate(const SampleOrigin& origin, int offset) const;

 private:
  struct ValidSet {
    std::string name;
    double weight = 1;
    std::vector<int> members;  // indices into sources_
    BlendedDataset blend;      // over the members, when there are several
  };
  Status AddSource(Env* env, const DataSpec& spec, Source s, std::vector<std::string>* notes);

  std::vector<Source> sources_;  // the training datasets, then validation-only ones
  int num_train_ = 0;
  std::vector<ValidSet> valid_sets_;
  bool combine_validation_ = true;
  BlendedDataset blend_;
  std::string split_;
  int seq_length_ = 0;
  uint64_t seed_ = 0;
  std::mutex mu_;  // blend_'s cursor and reseeded_
  std::map<std::pair<uint64_t, int>, std::unique_ptr<GptDataset>> reseeded_;  // (salt, dataset)
  std::map<std::string, std::shared_ptr<ShardedDataset>> opened_;             // by prefix
};

}  // namespace keel
