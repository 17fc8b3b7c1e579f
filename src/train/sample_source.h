// SampleSource: where an iteration's tokens come from. The trainer asks it for each sequence of
// its micro-batches; a sample that cannot be used (a token outside the vocabulary) is a Status
// naming it, which ends the iteration before any update.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"

namespace keel {

// Which sample, read for which iteration (the error names it) under which data order.
struct SampleRequest {
  int64_t index = 0;      // position in the run's training stream, or in a validation set
  int64_t iteration = 0;  // training: the iteration reading it; validation: the one before
  uint64_t salt = 0;      // the data order's salt (raised by the guard's re-seeding rung)
};

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Training sample `r.index` (seq_length + 1 tokens: inputs and shifted targets) into `tokens`;
  // *dataset: the dataset of a mixture it came from (0 when there is one).
  virtual Status ReadTrain(const SampleRequest& r, int32_t* tokens, int* dataset) = 0;
  // Sample `r.index` of validation set `set` (index into TrainerData::valid_sets, or 0 for the
  // only one).
  virtual Status ReadValid(int set, const SampleRequest& r, int32_t* tokens) = 0;
};

// Writes sample number `index` into `tokens` and returns its dataset: samples from a function
// (the tests' and benchmarks' synthetic data), which never fail.
using SampleFn = std::function<int(int64_t index, int32_t* tokens)>;

class FunctionSamples : public SampleSource {
 public:
  // `valid`: one function per validation set (an empty function: none).
  FunctionSamples(SampleFn train, std::vector<SampleFn> valid)
      : train_(std::move(train)), valid_(std::move(valid)) {}
  Status ReadTrain(const SampleRequest& r, int32_t* tokens, int* dataset) override {
    *dataset = train_(r.index, tokens);
    return Status::OK();
  }
  Status ReadValid(int set, const SampleRequest& r, int32_t* tokens) override {
    valid_.at(static_cast<size_t>(set))(r.index, tokens);
    return Status::OK();
  }
  bool has_valid(int set) const {
    return set >= 0 && static_cast<size_t>(set) < valid_.size() && valid_[set] != nullptr;
  }

 private:
  SampleFn train_;
  std::vector<SampleFn> valid_;
};

}  // namespace keel
