// The run's data: opening it (the datasets of --data-path or the default corpus, the tokenizer,
// the vocabulary the config takes from it), logging what was opened, and RunSamples, the trainer's
// SampleSource over it: training samples read ahead on background threads, every sample's tokens
// checked against the vocabulary before the model sees them (a bad token is an InvalidArgument
// naming the dataset, document and token), a dataset's new epoch and a re-seeded order logged as
// they begin.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/env.h"
#include "data/sample_prefetcher.h"
#include "data/train_data.h"
#include "train/test_hooks.h"
#include "train/trainer.h"

namespace keel {

struct RunData {
  std::unique_ptr<TrainData> data;
  std::string prefix;  // the dataset whose tokenizer is the run's
  DatasetMeta meta;
};

// Opens the data `cfg` names and sets the config's vocabulary size and EOD id from it.
Status OpenRunData(Env* env, TrainConfig* cfg, RunData* out, std::vector<std::string>* notes);
// Logs each dataset (documents, tokens, samples per epoch, splits) and warns of validation sets
// that are missing or smaller than one evaluation.
void LogRunData(const TrainConfig& cfg, const TrainData& data);

class RunSamples : public SampleSource {
 public:
  // `data` must outlive this; `hooks` (test-only, may be null) poison iterations.
  RunSamples(const TrainConfig& cfg, const RunData& data, const TestHooks* hooks);
  ~RunSamples() override;

  Status ReadTrain(const SampleRequest& r, int32_t* tokens, int* dataset) override;
  Status ReadValid(int set, const SampleRequest& r, int32_t* tokens) override;

  // What the trainer reports the samples under: dataset names, validation sets.
  TrainerData Describe(std::shared_ptr<SampleSource> self) const;
  SamplePrefetcher::Stats prefetch_stats() const { return prefetcher_->stats(); }

 private:
  // The one check every sample passes before the model sees it.
  Status CheckTokens(const SampleOrigin& o, const int32_t* tokens, bool train,
                     const SampleRequest& r) const;

  const TrainConfig& cfg_;
  TrainData* data_;
  const DatasetMeta& meta_;
  const TestHooks* hooks_;
  std::unique_ptr<SamplePrefetcher> prefetcher_;
  std::vector<int64_t> last_epoch_;  // per dataset: the epoch last read
  uint64_t last_salt_ = 0;
};

}  // namespace keel
