// GptDataset: fixed-length training samples over a DocumentStream, in a deterministic,
// seed-keyed order. Documents are split into train/valid/test by the --split weights (whole
// documents, in order); each split's documents are concatenated (with their EOD tokens) into one
// stream and cut into samples of seq_length+1 tokens that overlap by one token (inputs and
// shifted targets). The order of samples within an epoch is a permutation that is a pure
// function of (seed, split, epoch): sample k of the run is always the same sample.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/document_stream.h"

namespace keel {

enum class Split { kTrain = 0, kValid = 1, kTest = 2 };

class GptDataset {
 public:
  // split_weights: e.g. "969,30,1" (documents are divided as Megatron does). An error if the
  // split is empty (no documents) or has fewer tokens than one sample; callers may treat that as
  // "no validation set" for kValid/kTest.
  static Status Create(const DocumentStream* data, const std::string& split_weights, Split split,
                       int seq_length, uint64_t seed, std::unique_ptr<GptDataset>* out);

  // The documents [first_doc, last_doc) of `data` as one split (Megatron-DeepSpeed's weighted
  // split paths give each dataset its own range); `where` describes them in errors.
  static Status CreateForDocuments(const DocumentStream* data, int64_t first_doc, int64_t last_doc,
                                   Split split, int seq_length, uint64_t seed,
                                   const std::string& where, std::unique_ptr<GptDataset>* out);

  // Samples in one epoch of this split.
  int64_t SamplesPerEpoch() const { return num_samples_; }
  // Writes sample number `index` (0, 1, 2, ... across epochs) into tokens[seq_length+1] and
  // returns SampleStart(index). Epoch e = index / SamplesPerEpoch() uses its own permutation.
  int64_t GetSample(int64_t index, int32_t* tokens) const;
  // Where sample `index` is cut from: its tokens are positions [p, p + seq_length] of the
  // document stream (so an error about one of them can name its document).
  int64_t SampleStart(int64_t index) const;
  int64_t EpochOf(int64_t index) const { return index / num_samples_; }
  int64_t NumTokens() const { return stream_end_ - stream_begin_; }
  // The stream positions [StreamBegin(), StreamEnd()) its documents span.
  int64_t StreamBegin() const { return stream_begin_; }
  int64_t StreamEnd() const { return stream_end_; }

 private:
  const DocumentStream* data_ = nullptr;
  int seq_length_ = 0;
  uint64_t seed_ = 0;
  Split split_ = Split::kTrain;
  int64_t stream_begin_ = 0, stream_end_ = 0;
  int64_t num_samples_ = 0;
};

// Parses "969,30,1" into three non-negative weights that are not all zero ('/' also separates;
// missing trailing weights are 0, as in Megatron).
Status ParseSplit(const std::string& text, double weights[3]);

// Position k of epoch `epoch` maps to sample PermuteSample(...) of [0, n): a permutation that is a
// pure function of (seed, split, epoch), computed in O(1) memory (Feistel network keyed by Philox
// with cycle walking), so no n-sized shuffle table is ever stored.
int64_t PermuteSample(int64_t k, int64_t n, uint64_t seed, Split split, int64_t epoch);

}  // namespace keel
