// The values keel chooses on the user's behalf: every setting left at 0 (or unset) that a run
// needs resolved, each choice reported as a note. Validate (config_validate.cc) checks the given
// values first, so that nothing here computes with a size out of range, then calls
// ResolveDefaults, then checks what depends on the resolved values.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "config/config.h"
#include "config/config_internal.h"

namespace keel::config_internal {
namespace {

Status Invalid(std::string msg) {
  return Status::InvalidArgument(std::move(msg));
}

// FFN width: 4h, or Megatron-LM's SwiGLU rule.
Status ResolveFfn(TrainConfig* c, std::vector<std::string>* notes) {
  if (c->model.ffn_hidden == 0 && c->model.swiglu) {
    // Megatron-LM's rule: two thirds of 4h (the gated FFN has three matrices, not two, so this
    // keeps its parameter count near the 4h FFN's), rounded down to a multiple of 64.
    const int64_t f = (int64_t{4} * c->model.hidden * 2 / 3) / 64 * 64;
    if (f == 0) {
      return Invalid(fmt::format(
          "--swiglu with --hidden-size {}: Megatron's FFN size rule (8h/3, rounded down to a "
          "multiple of 64) gives 0; give --ffn-hidden-size (e.g. {})",
          c->model.hidden, std::max(8, (8 * c->model.hidden / 3 + 7) / 8 * 8)));
    }
    c->model.ffn_hidden = static_cast<int>(f);
    notes->push_back(fmt::format(
        "--ffn-hidden-size not given: using Megatron's SwiGLU size int(4 * hidden-size * 2/3 / 64) "
        "* 64 = {} (Llama-2 7B sets 11008 itself: pass --ffn-hidden-size to match a published "
        "shape)",
        c->model.ffn_hidden));
  }
  if (c->model.ffn_hidden == 0) {
    c->model.ffn_hidden = 4 * c->model.hidden;
    notes->push_back(fmt::format("--ffn-hidden-size not given: using 4 * hidden-size = {}",
                                 c->model.ffn_hidden));
  }
  return Status::OK();
}

// The global batch: DeepSpeed's micro-batch x gradient accumulation x data-parallel size, or one
// micro-batch per rank. A DeepSpeed product that does not fit is left at 0 for the check of
// gradient_accumulation_steps to name.
Status ResolveGlobalBatch(TrainConfig* c, std::vector<std::string>* notes) {
  const int64_t m = int64_t{c->micro_batch_size} * c->data_parallel_size;
  const std::string m_text = fmt::format("--micro-batch-size {} * data-parallel size {} = {}",
                                         c->micro_batch_size, c->data_parallel_size, m);
  if (c->gradient_accumulation_steps > 0) {
    const int64_t want = m * c->gradient_accumulation_steps;
    if (c->global_batch_size == 0 && want <= kMaxInt) {
      c->global_batch_size = static_cast<int>(want);
      notes->push_back(fmt::format(
          "--global-batch-size not given: using {} x gradient_accumulation_steps {} = {} (the "
          "DeepSpeed config's)",
          m_text, c->gradient_accumulation_steps, want));
    }
    return Status::OK();
  }
  if (c->global_batch_size == 0) {
    if (m > kMaxInt) {
      return Invalid(fmt::format(
          "--global-batch-size not given, and its default {} is more than {}, the largest global "
          "batch; use a smaller --micro-batch-size",
          m_text, kMaxInt));
    }
    c->global_batch_size = static_cast<int>(m);
    notes->push_back(fmt::format("--global-batch-size not given: using {}", m_text));
  }
  return Status::OK();
}

// The decay length: the whole run, in the run's own unit (iterations or samples).
void ResolveDecay(TrainConfig* c, std::vector<std::string>* notes) {
  const bool constant = c->lr_decay_style == LrDecayStyle::kConstant;
  if (c->train_iters > 0) {
    if (c->lr_decay_iters == 0) {
      c->lr_decay_iters = c->train_iters;
      if (!constant) {
        notes->push_back(
            fmt::format("--lr-decay-iters not given: decaying over the whole run, {} iterations",
                        c->train_iters));
      }
    }
  } else if (c->lr_decay_samples == 0) {
    c->lr_decay_samples = c->train_samples;
    if (!constant) {
      notes->push_back(
          fmt::format("--lr-decay-samples not given: decaying over the whole run, {} samples",
                      c->train_samples));
    }
  }
}

// The precision recipe from --bf16 / --fp16, or the flags from the recipe (a config filled in
// code may name the precision directly). Both flags at once is refused by the checks after.
void ResolvePrecision(TrainConfig* c) {
  if (c->bf16) {
    c->precision = Precision::kBf16;
  } else if (c->fp16) {
    c->precision = Precision::kFp16;
  } else {
    c->bf16 = c->precision == Precision::kBf16;
    c->fp16 = c->precision == Precision::kFp16;
  }
}

// pretrain_gpt.py defaults the tokenizer type to GPT2BPETokenizer, so --vocab-file and
// --merge-file alone select it.
void ResolveTokenizerType(TrainConfig* c, std::vector<std::string>* notes) {
  if (!c->tokenizer_type.empty() || (c->vocab_file.empty() && c->merge_file.empty())) return;
  c->tokenizer_type = "GPT2BPETokenizer";
  notes->push_back(
      "--tokenizer-type not given: GPT2BPETokenizer, as pretrain_gpt.py defaults it, with "
      "--vocab-file and --merge-file");
}

// The padded vocabulary, once the data gave the vocabulary: exactly --pad-vocab-size-to
// (Megatron-DeepSpeed's _vocab_size_with_padding; the checks before made sure it holds the
// vocabulary and is a multiple), or up to a multiple of --make-vocab-size-divisible-by.
Status ResolvePaddedVocab(TrainConfig* c, std::vector<std::string>* notes) {
  if (c->model.vocab <= 0) return Status::OK();
  if (c->pad_vocab_size_to > 0) {
    c->model.padded_vocab = c->pad_vocab_size_to;
    notes->push_back(fmt::format("vocab {} padded to {} (--pad-vocab-size-to)", c->model.vocab,
                                 c->model.padded_vocab));
    return Status::OK();
  }
  // Tensor parallel T: a multiple of divisible-by x T (Megatron's rule; keel plan's too), so
  // every rank holds an equal slice of the rows.
  const int tensor = std::max(1, c->tensor_model_parallel_size);
  const int64_t mult = int64_t{c->make_vocab_size_divisible_by} * tensor;
  const int64_t padded = RoundUp(c->model.vocab, mult);
  if (padded > kMaxInt) {
    return Invalid(fmt::format(
        "--make-vocab-size-divisible-by {} pads the vocabulary of {} tokens to {}, more than "
        "{}: the model counts vocabulary rows in 32-bit integers; try "
        "--make-vocab-size-divisible-by 128",
        mult, c->model.vocab, padded, kMaxInt));
  }
  c->model.padded_vocab = static_cast<int>(padded);
  if (tensor > 1)
    notes->push_back(fmt::format(
        "vocab {} padded to {} (multiple of --make-vocab-size-divisible-by {} x tensor parallel "
        "{})",
        c->model.vocab, c->model.padded_vocab, c->make_vocab_size_divisible_by, tensor));
  else
    notes->push_back(fmt::format("vocab {} padded to {} (multiple of {})", c->model.vocab,
                                 c->model.padded_vocab, mult));
  return Status::OK();
}

}  // namespace

Status ResolveDefaults(TrainConfig* cfg, std::vector<std::string>* notes) {
  KEEL_RETURN_IF_ERROR(ResolveFfn(cfg, notes));
  if (cfg->model.max_positions == 0) {
    cfg->model.max_positions = cfg->seq_length;
    notes->push_back(fmt::format("--max-position-embeddings not given: using --seq-length = {}",
                                 cfg->seq_length));
  }
  KEEL_RETURN_IF_ERROR(ResolveGlobalBatch(cfg, notes));
  ResolveDecay(cfg, notes);
  ResolvePrecision(cfg);
  ResolveTokenizerType(cfg, notes);
  return ResolvePaddedVocab(cfg, notes);
}

}  // namespace keel::config_internal
