// A DeepSpeed config JSON (Megatron-DeepSpeed's --deepspeed --deepspeed_config FILE), as keel
// reads it: the batch sizes, gradient clipping, ZeRO stage, bf16/fp16 and fp16's loss scaling are
// applied to the run's settings (ParseTrainArgs does it); every other key is named in a note
// with the reason it changes nothing in keel. Keys that would change the run in a way keel
// cannot follow (an optimizer or scheduler section, which DeepSpeed would use in place of
// Megatron's) are errors naming the key and the fix.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"

namespace keel {

struct DeepSpeedConfig {
  std::optional<int64_t> train_batch_size;             // train_batch_size
  std::optional<int64_t> micro_batch_size;             // train_micro_batch_size_per_gpu
  std::optional<int64_t> gradient_accumulation_steps;  // gradient_accumulation_steps
  std::optional<double> gradient_clipping;             // gradient_clipping
  std::optional<int> zero_stage;                       // zero_optimization.stage
  std::optional<bool> fp16, bf16;                      // fp16.enabled, bf16.enabled
  bool fp16_section = false;                           // an "fp16" object is present
  // fp16's loss scaling, DeepSpeed's defaults where the section leaves a key out.
  double loss_scale = 0;  // 0: dynamic
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  double min_loss_scale = 1;
  // "KEY (why it changes nothing here)", for the note.
  std::vector<std::string> ignored;
};

// The most keel reads of a DeepSpeed config (real ones are a few KiB): a larger file is refused
// with this cap in the message, before it is parsed.
inline constexpr uint64_t kMaxDeepSpeedConfigBytes = 16 * kMiB;

// Parses the JSON text of `origin`. InvalidArgument naming the file, the key, the value and the
// fix for a wrong type or value, or for a key keel cannot honour.
Status ParseDeepSpeedConfig(const std::string& text, const std::string& origin,
                            DeepSpeedConfig* out);

}  // namespace keel
