// The files `keel train --save DIR` leaves for `keel sample` (the checkpoint issue extends this to
// complete, resumable checkpoints): model.safetensors (fp32 weights by name), run.json (the model
// shape and the tokenizer), config.toml (the resolved config), and the tokenizer's model file.
#pragma once

#include <memory>
#include <string>

#include "core/env.h"
#include "core/status.h"
#include "data/indexed_dataset.h"
#include "data/tokenizer.h"
#include "model/gpt.h"

namespace keel::cli {

Status SaveRunFiles(Env* env, const std::string& dir, GptModel& model,
                    const std::string& config_text, const std::string& dataset_prefix,
                    const DatasetMeta& meta);

struct LoadedRun {
  GptSpec spec;
  std::unique_ptr<Tokenizer> tokenizer;
};
// Reads run.json and the tokenizer, creates the model on `backend` and loads its weights.
Status LoadRunFiles(Env* env, const std::string& dir, Backend* backend, LoadedRun* run,
                    std::unique_ptr<GptModel>* model);

}  // namespace keel::cli
