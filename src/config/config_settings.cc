// The settings table: every TrainConfig setting once, with its flag/TOML name, --help text, setter
// and TOML literal. The CLI11 options, the TOML keys, the help text, FormatConfig and the "did you
// mean" suggestions all read this one table, so the flag and file spellings can never drift apart.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "config/config.h"
#include "config/config_internal.h"

namespace keel::config_internal {
namespace {

Status TypeError(const Input& in, std::string_view expected) {
  return Status::InvalidArgument(fmt::format("{}: expected {}{}", in.Where(), expected, in.Got()));
}

// Shortest round-trip text, always readable back as a TOML float (1 -> 1.0).
template <typename T>
std::string TomlFloat(T v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// A member of TrainConfig, or of its model shape (cfg.model, config/model_shape.h).
template <typename T>
T& Field(TrainConfig* c, T TrainConfig::*m) {
  return c->*m;
}
template <typename T>
const T& Field(const TrainConfig& c, T TrainConfig::*m) {
  return c.*m;
}
template <typename T>
T& Field(TrainConfig* c, T GptSpec::*m) {
  return c->model.*m;
}
template <typename T>
const T& Field(const TrainConfig& c, T GptSpec::*m) {
  return c.model.*m;
}

template <typename T, typename Owner>
Setting IntSetting(std::string name, std::string help, T Owner::*m) {
  Setting s;
  s.name = std::move(name);
  s.type = "INT";
  s.help = std::move(help);
  s.set = [m](const Input& in, TrainConfig* c) -> Status {
    if constexpr (std::is_unsigned_v<T>) {
      auto v = in.UInt();
      if (!v) return TypeError(in, "a non-negative integer");
      Field(c, m) = static_cast<T>(*v);
    } else {
      auto v = in.Int();
      if (!v) return TypeError(in, "an integer");
      if (*v < std::numeric_limits<T>::min() || *v > std::numeric_limits<T>::max()) {
        return TypeError(in, fmt::format("an integer in [{}, {}]", std::numeric_limits<T>::min(),
                                         std::numeric_limits<T>::max()));
      }
      Field(c, m) = static_cast<T>(*v);
    }
    return Status::OK();
  };
  s.get = [m](const TrainConfig& c) { return fmt::format("{}", Field(c, m)); };
  return s;
}

template <typename T, typename Owner>
Setting RealSetting(std::string name, std::string help, T Owner::*m) {
  Setting s;
  s.name = std::move(name);
  s.type = "FLOAT";
  s.help = std::move(help);
  s.set = [m](const Input& in, TrainConfig* c) -> Status {
    auto v = in.Number();
    if (!v || !std::isfinite(*v)) return TypeError(in, "a finite number");
    if (std::fabs(*v) > static_cast<double>(std::numeric_limits<T>::max())) {
      return TypeError(in, "a number in float range");
    }
    Field(c, m) = static_cast<T>(*v);
    return Status::OK();
  };
  s.get = [m](const TrainConfig& c) { return TomlFloat(Field(c, m)); };
  return s;
}

template <typename Owner>
Setting BoolSetting(std::string name, std::string help, bool Owner::*m) {
  Setting s;
  s.name = std::move(name);
  s.type = "";
  s.help = std::move(help);
  s.is_flag = true;
  s.set = [m](const Input& in, TrainConfig* c) -> Status {
    auto v = in.Bool();
    if (!v) return TypeError(in, "true or false");
    Field(c, m) = *v;
    return Status::OK();
  };
  s.get = [m](const TrainConfig& c) -> std::string { return Field(c, m) ? "true" : "false"; };
  return s;
}

Setting StringSetting(std::string name, std::string type, std::string help,
                      std::string TrainConfig::*m) {
  Setting s;
  s.name = std::move(name);
  s.type = std::move(type);
  s.help = std::move(help);
  s.set = [m](const Input& in, TrainConfig* c) -> Status {
    auto v = in.String();
    if (!v) return TypeError(in, "a string");
    c->*m = *v;
    return Status::OK();
  };
  s.get = [m](const TrainConfig& c) { return TomlString(c.*m); };
  return s;
}

// An enum read and written through `get` and `set` (the model shape keeps some as switches).
template <typename E>
Setting EnumSetting(std::string name, std::string help, std::function<E(const TrainConfig&)> get,
                    std::function<void(TrainConfig*, E)> set,
                    std::vector<std::pair<E, std::string>> names) {
  std::string choices;
  for (const auto& [e, n] : names) choices += (choices.empty() ? "" : ",") + n;
  Setting s;
  s.name = std::move(name);
  s.type = "{" + choices + "}";
  s.help = std::move(help);
  s.set = [set, names, choices](const Input& in, TrainConfig* c) -> Status {
    auto v = in.String();
    if (v) {
      for (const auto& [e, n] : names) {
        if (*v == n) {
          set(c, e);
          return Status::OK();
        }
      }
    }
    return TypeError(in, "one of " + choices);
  };
  s.get = [get, names](const TrainConfig& c) {
    for (const auto& [e, n] : names) {
      if (get(c) == e) return TomlString(n);
    }
    return TomlString("?");
  };
  return s;
}

template <typename E>
Setting EnumSetting(std::string name, std::string help, E TrainConfig::*m,
                    std::vector<std::pair<E, std::string>> names) {
  return EnumSetting<E>(
      std::move(name), std::move(help), [m](const TrainConfig& c) { return c.*m; },
      [m](TrainConfig* c, E e) { c->*m = e; }, std::move(names));
}

Setting IntListSetting(std::string name, std::string type, std::string help,
                       std::vector<int64_t> TrainConfig::*m) {
  Setting s;
  s.name = std::move(name);
  s.type = std::move(type);
  s.help = std::move(help);
  s.is_list = true;
  s.set = [m](const Input& in, TrainConfig* c) -> Status {
    auto v = in.IntList();
    if (!v) return TypeError(in, "a list of integers");
    c->*m = *v;
    return Status::OK();
  };
  s.get = [m](const TrainConfig& c) {
    std::string out = "[";
    for (size_t i = 0; i < (c.*m).size(); ++i) out += (i ? ", " : "") + std::to_string((c.*m)[i]);
    return out + "]";
  };
  return s;
}

Setting StringListSetting(std::string name, std::string type, std::string help,
                          std::vector<std::string> TrainConfig::*m) {
  Setting s;
  s.name = std::move(name);
  s.type = std::move(type);
  s.help = std::move(help);
  s.is_list = true;
  s.set = [m](const Input& in, TrainConfig* c) -> Status {
    auto v = in.StringList();
    if (!v) return TypeError(in, "a list of strings");
    // A lone empty string is no value (configs written before data-path became a list hold "").
    if (v->size() == 1 && (*v)[0].empty()) v->clear();
    c->*m = *v;
    return Status::OK();
  };
  s.get = [m](const TrainConfig& c) {
    std::string out = "[";
    for (size_t i = 0; i < (c.*m).size(); ++i) out += (i ? ", " : "") + TomlString((c.*m)[i]);
    return out + "]";
  };
  return s;
}

using TC = TrainConfig;

}  // namespace

const std::vector<Setting>& Settings() {
  // Filled one entry at a time: under clang 14's AddressSanitizer (the fuzz build) destroying a
  // long initializer_list's backing array of these entries reported stack-use-after-scope; GCC's
  // does not, and no entry outlives its statement either way.
  static const std::vector<Setting>* table = [] {
    auto* t = new std::vector<Setting>;
    // model
    t->push_back(IntSetting("num-layers", "number of transformer layers", &GptSpec::num_layers));
    t->push_back(IntSetting("hidden-size", "transformer hidden size", &GptSpec::hidden));
    t->push_back(
        IntSetting("ffn-hidden-size", "MLP inner size (0: 4 * hidden-size)", &GptSpec::ffn_hidden));
    t->push_back(IntSetting("num-attention-heads", "attention heads; must divide hidden-size",
                            &GptSpec::heads));
    t->push_back(IntSetting("seq-length", "tokens per training sequence", &TC::seq_length));
    t->push_back(IntSetting("max-position-embeddings", "rows of the position table (0: seq-length)",
                            &GptSpec::max_positions));
    t->push_back(EnumSetting<PositionEmbedding>(
        "position-embedding-type", "position encoding",
        [](const TC& c) { return c.model.Position(); },
        [](TC* c, PositionEmbedding p) { c->model.SetPosition(p); },
        {{PositionEmbedding::kLearnedAbsolute, "learned_absolute"},
         {PositionEmbedding::kAlibi, "alibi"},
         {PositionEmbedding::kRope, "rope"}}));
    t->push_back(
        IntSetting("rotary-base", "RoPE base: angle p * base^(-2i/dims)", &GptSpec::rotary_base));
    t->push_back(RealSetting("rotary-percent", "RoPE: share of each head's dims that turn (0, 1]",
                             &GptSpec::rotary_percent));
    t->push_back(BoolSetting("use-rope-scaling",
                             "RoPE: Llama 3.x's frequency scaling (long wavelengths / factor)",
                             &GptSpec::rope_llama3));
    t->push_back(RealSetting("rope-scaling-factor", "Llama 3.x RoPE scaling: the factor (>= 1)",
                             &GptSpec::rope_llama3_factor));
    t->push_back(RealSetting("rope-scaling-low-freq-factor",
                             "Llama 3.x RoPE scaling: wavelengths past original/this are scaled",
                             &GptSpec::rope_low_freq_factor));
    t->push_back(RealSetting("rope-scaling-high-freq-factor",
                             "Llama 3.x RoPE scaling: wavelengths below original/this are kept",
                             &GptSpec::rope_high_freq_factor));
    t->push_back(IntSetting("rope-scaling-original-max-position-embeddings",
                            "Llama 3.x RoPE scaling: the context the model was pretrained on",
                            &GptSpec::rope_original_max_positions));
    t->push_back(IntSetting("rotary-seq-len-interpolation-factor",
                            "RoPE: positions divided by this (linear interpolation; 0: none)",
                            &GptSpec::rope_interpolation_factor));
    t->push_back(EnumSetting<Normalization>(
        "normalization", "the model's norms (QK-LayerNorm stays LayerNorm)",
        [](const TC& c) {
          return c.model.rmsnorm ? Normalization::kRmsNorm : Normalization::kLayerNorm;
        },
        [](TC* c, Normalization n) { c->model.rmsnorm = n == Normalization::kRmsNorm; },
        {{Normalization::kLayerNorm, "LayerNorm"}, {Normalization::kRmsNorm, "RMSNorm"}}));
    t->push_back(BoolSetting("swiglu", "gated FFN silu(x Wg) * (x Wu) (Llama; FFN default 8h/3)",
                             &GptSpec::swiglu));
    t->push_back(BoolSetting("group-query-attention",
                             "grouped-query attention: num-query-groups key/value heads",
                             &GptSpec::group_query_attention));
    t->push_back(IntSetting("num-query-groups",
                            "key/value heads with group-query-attention; divides the heads",
                            &GptSpec::num_query_groups));
    t->push_back(BoolSetting("untie-embeddings-and-output-weights",
                             "an output layer of its own instead of the word embedding's transpose",
                             &GptSpec::untie_embeddings));
    {
      // The model keeps the switch the other way round (bias on).
      Setting s = BoolSetting("disable-bias-linear", "no biases in the linear layers (Llama)",
                              &GptSpec::bias);
      s.set = [](const Input& in, TrainConfig* c) -> Status {
        auto v = in.Bool();
        if (!v) return TypeError(in, "true or false");
        c->model.bias = !*v;
        return Status::OK();
      };
      s.get = [](const TrainConfig& c) -> std::string { return c.model.bias ? "false" : "true"; };
      t->push_back(std::move(s));
    }
    t->push_back(EnumSetting("recompute-granularity",
                             "activation recomputation: selective (attention probabilities) or "
                             "full (whole layers); same bits, less memory, more compute",
                             &TC::recompute_granularity,
                             {{Recompute::kNone, "none"},
                              {Recompute::kSelective, "selective"},
                              {Recompute::kFull, "full"}}));
    t->push_back(
        EnumSetting("recompute-method",
                    "with full: block recomputes the first recompute-num-layers layers "
                    "only; uniform every layer",
                    &TC::recompute_method,
                    {{RecomputeMethod::kUniform, "uniform"}, {RecomputeMethod::kBlock, "block"}}));
    t->push_back(IntSetting("recompute-num-layers",
                            "with full: block's count of recomputed layers (uniform's chunk size)",
                            &TC::recompute_num_layers));
    t->push_back(BoolSetting("embed-layernorm", "LayerNorm after the word embedding (BLOOM)",
                             &GptSpec::embed_layernorm));
    t->push_back(IntSetting("make-vocab-size-divisible-by",
                            "pad the vocabulary to a multiple of this",
                            &TC::make_vocab_size_divisible_by));
    t->push_back(IntSetting("pad-vocab-size-to",
                            "pad the vocabulary to exactly this many rows (0: to a multiple of "
                            "make-vocab-size-divisible-by)",
                            &TC::pad_vocab_size_to));
    t->push_back(RealSetting("layernorm-epsilon", "LayerNorm epsilon", &GptSpec::layernorm_eps));
    t->push_back(EnumSetting("init-method", "weight init: normal uses init-method-std",
                             &TC::init_method,
                             {{InitMethod::kNormal, "normal"},
                              {InitMethod::kSmallInit, "small_init"},
                              {InitMethod::kMegatron530B, "megatron_530b"}}));
    t->push_back(RealSetting("init-method-std", "init standard deviation (init-method normal)",
                             &TC::init_method_std));
    t->push_back(BoolSetting(
        "qk-layernorm",
        "LayerNorm of each head's query and key before attention (stability at high LR)",
        &GptSpec::qk_layernorm));
    t->push_back(RealSetting("qk-layernorm-epsilon",
                             "QK-LayerNorm epsilon (0: layernorm-epsilon); needs qk-layernorm",
                             &GptSpec::qk_layernorm_eps));
    t->push_back(RealSetting(
        "z-loss", "z-loss coefficient: adds z * mean (log Z)^2 to the objective (0: off)",
        &GptSpec::z_loss));
    // batch and length
    t->push_back(IntSetting("micro-batch-size", "sequences per micro-batch per rank",
                            &TC::micro_batch_size));
    t->push_back(IntSetting("global-batch-size",
                            "sequences per iteration (0: micro * data-parallel)",
                            &TC::global_batch_size));
    t->push_back(IntListSetting("rampup-batch-size", "START INCR SAMPLES",
                                "grow the global batch from START by INCR over SAMPLES samples",
                                &TC::rampup_batch_size));
    t->push_back(
        IntSetting("train-iters", "iterations to train (iteration-based run)", &TC::train_iters));
    t->push_back(
        IntSetting("train-samples", "samples to train (samples-based run)", &TC::train_samples));
    // learning rate
    t->push_back(RealSetting("lr", "peak learning rate", &TC::lr));
    t->push_back(RealSetting("min-lr", "learning rate at the end of decay", &TC::min_lr));
    t->push_back(EnumSetting("lr-decay-style", "learning rate decay", &TC::lr_decay_style,
                             {{LrDecayStyle::kConstant, "constant"},
                              {LrDecayStyle::kLinear, "linear"},
                              {LrDecayStyle::kCosine, "cosine"}}));
    t->push_back(
        IntSetting("lr-warmup-samples", "linear warmup length in samples", &TC::lr_warmup_samples));
    t->push_back(
        IntSetting("lr-warmup-iters", "linear warmup length in iterations", &TC::lr_warmup_iters));
    t->push_back(IntSetting("lr-decay-samples", "decay length in samples (0: train-samples)",
                            &TC::lr_decay_samples));
    t->push_back(IntSetting("lr-decay-iters", "decay length in iterations (0: train-iters)",
                            &TC::lr_decay_iters));
    // optimizer
    t->push_back(RealSetting("adam-beta1", "Adam beta1", &TC::adam_beta1));
    t->push_back(RealSetting("adam-beta2", "Adam beta2", &TC::adam_beta2));
    t->push_back(RealSetting("adam-eps", "Adam epsilon", &TC::adam_eps));
    t->push_back(RealSetting("weight-decay", "decoupled weight decay", &TC::weight_decay));
    t->push_back(RealSetting("clip-grad", "global gradient-norm clip (0: off)", &TC::clip_grad));
    // mixed precision
    t->push_back(BoolSetting("bf16",
                             "bf16 products with fp32 accumulation, fp32 master weights and "
                             "moments (docs/mixed-precision.md)",
                             &TC::bf16));
    t->push_back(BoolSetting("fp16",
                             "fp16 activations and gradients (emulated on CPUs) with dynamic loss "
                             "scaling, fp32 master weights and moments",
                             &TC::fp16));
    t->push_back(RealSetting("initial-loss-scale", "fp16: the dynamic loss scale to start from",
                             &TC::initial_loss_scale));
    t->push_back(RealSetting("min-loss-scale", "fp16: the dynamic loss scale never goes below",
                             &TC::min_loss_scale));
    t->push_back(IntSetting("loss-scale-window",
                            "fp16: clean iterations in a row before the loss scale doubles",
                            &TC::loss_scale_window));
    t->push_back(IntSetting("hysteresis",
                            "fp16: overflows tolerated before the loss scale is first halved",
                            &TC::hysteresis));
    t->push_back(
        RealSetting("loss-scale", "fp16: a static loss scale (0: dynamic)", &TC::loss_scale));
    // tensor parallel
    t->push_back(IntSetting("tensor-model-parallel-size",
                            "tensor-parallel size T: each layer's tensors are split across T "
                            "ranks (the data-parallel size is the number of ranks / T)",
                            &TC::tensor_model_parallel_size));
    t->push_back(BoolSetting("sequence-parallel",
                             "with T > 1: the norms' and residuals' rows are split across the "
                             "tensor-parallel ranks (Megatron-LM's sequence parallelism)",
                             &TC::sequence_parallel));
    // pipeline parallel
    t->push_back(IntSetting("pipeline-model-parallel-size",
                            "pipeline-parallel size P: the layers are cut into P stages on "
                            "their own ranks (the data-parallel size is the ranks / (T x P))",
                            &TC::pipeline_model_parallel_size));
    t->push_back(IntSetting("num-layers-per-virtual-pipeline-stage",
                            "with P > 1: layers per model chunk of the interleaved schedule "
                            "(0: one chunk per stage, the 1F1B schedule)",
                            &TC::num_layers_per_virtual_pipeline_stage));
    t->push_back(StringSetting("pp-partition-method", "METHOD",
                               "with P > 1: how layers are cut into stages: \"\" (Megatron-LM's "
                               "split), uniform, parameters, or type:REGEX (Megatron-DeepSpeed's)",
                               &TC::pp_partition_method));
    // data parallel
    t->push_back(
        BoolSetting("use-distributed-optimizer",
                    "ZeRO-1: each data-parallel rank keeps only its shard of the Adam moments "
                    "(=false: a full copy on every rank)",
                    &TC::use_distributed_optimizer));
    t->push_back(BoolSetting("overlap-grad-reduce",
                             "reduce gradient buckets while backward runs (=false: after it)",
                             &TC::overlap_grad_reduce));
    t->push_back(IntSetting("ddp-bucket-size", "gradient elements per data-parallel bucket",
                            &TC::ddp_bucket_size));
    // no limbo
    t->push_back(RealSetting(
        "distributed-timeout-minutes",
        "a loop phase (data wait, forward, backward, reduce, optimizer) lasting longer is a "
        "hang: every rank dumps its stacks to SAVE/hangs/ and the job exits 4 (0: no watchdog)",
        &TC::distributed_timeout_minutes));
    t->push_back(RealSetting("first-iteration-timeout-minutes",
                             "the watchdog's limit for startup and the first iteration",
                             &TC::first_iteration_timeout_minutes));
    t->push_back(RealSetting("save-timeout-minutes", "the watchdog's limit for a checkpoint save",
                             &TC::save_timeout_minutes));
    t->push_back(RealSetting("eval-timeout-minutes", "the watchdog's limit for an evaluation",
                             &TC::eval_timeout_minutes));
    t->push_back(BoolSetting(
        "debug-collectives",
        "data parallel: the ranks agree on each collective's kind and size before running it, "
        "so a rank that skips or adds one is named at once (default: checked every iteration)",
        &TC::debug_collectives));
    t->push_back(IntSetting("check-replicas-interval",
                            "data parallel: iterations between checks that every replica holds "
                            "the same weights and state (also at every save; 0: only at saves)",
                            &TC::check_replicas_interval));
    t->push_back(IntSetting("straggler-window",
                            "data parallel: iterations per window of the straggler detector "
                            "(0: off)",
                            &TC::straggler_window));
    t->push_back(RealSetting("straggler-threshold",
                             "a rank slower than the others by this fraction for 5 windows in a "
                             "row is named a straggler",
                             &TC::straggler_threshold));
    // run
    t->push_back(IntSetting("seed", "random seed", &TC::seed));
    t->push_back(IntSetting("eval-interval", "iterations between evaluations", &TC::eval_interval));
    t->push_back(IntSetting("eval-iters", "iterations per evaluation", &TC::eval_iters));
    t->push_back(IntSetting("log-interval", "iterations between log lines", &TC::log_interval));
    t->push_back(IntSetting(
        "threads",
        fmt::format("CPU threads (0: all cores); at most 4 per hardware thread and never "
                    "above 1024, here {}",
                    MaxThreads()),
        &TC::threads));
    t->push_back(StringSetting("backend", "NAME",
                               "the backend the ops run on (this build has: cpu)", &TC::backend));
    // data
    t->push_back(
        StringListSetting("data-path", "[W] PREFIX ...",
                          "Megatron indexed dataset prefix, or a mixture W1 PREFIX1 W2 PREFIX2 ... "
                          "(empty: default corpus)",
                          &TC::data_path));
    t->push_back(StringSetting("split", "TRAIN,VALID,TEST", "document split weights", &TC::split));
    t->push_back(EnumSetting(
        "tokenizer", "tokenizer for the default corpus", &TC::tokenizer,
        {{TokenizerKind::kGpt2, "gpt2"}, {TokenizerKind::kSentencePiece, "sentencepiece"}}));
    t->push_back(BoolSetting("reset-position-ids",
                             "restart position ids after each end-of-document token",
                             &GptSpec::reset_position_ids));
    t->push_back(BoolSetting("reset-attention-mask",
                             "tokens attend only within their own document of a packed sequence",
                             &GptSpec::reset_attention_mask));
    t->push_back(
        StringSetting("tokenizer-type", "TYPE",
                      "Megatron's tokenizer of datasets without keel metadata: GPT2BPETokenizer, "
                      "SentencePieceTokenizer or PretrainedFromHF (empty: the datasets' own)",
                      &TC::tokenizer_type));
    t->push_back(StringSetting("vocab-file", "FILE", "GPT2BPETokenizer: the vocabulary (JSON)",
                               &TC::vocab_file));
    t->push_back(
        StringSetting("merge-file", "FILE", "GPT2BPETokenizer: the BPE merges", &TC::merge_file));
    t->push_back(StringSetting("tokenizer-model", "FILE",
                               "SentencePieceTokenizer: the SentencePiece .model file",
                               &TC::tokenizer_model));
    t->push_back(StringSetting("tokenizer-name-or-path", "DIR",
                               "PretrainedFromHF: a local Hugging Face tokenizer folder "
                               "(tokenizer.json, tokenizer_config.json)",
                               &TC::tokenizer_name_or_path));
    t->push_back(StringListSetting(
        "train-weighted-split-paths", "GROUP",
        "instead of --data-path: one group \"NAME: W1 START:END PREFIX1, W2 START:END PREFIX2\"",
        &TC::train_weighted_split_paths));
    t->push_back(StringListSetting(
        "valid-weighted-split-paths", "GROUP ...",
        "validation groups, each \"NAME: W START:END PREFIX, ...\", each evaluated on its own",
        &TC::valid_weighted_split_paths));
    t->push_back(StringSetting("train-weighted-split-paths-path", "FILE",
                               "a file holding --train-weighted-split-paths (one quoted group)",
                               &TC::train_weighted_split_paths_path));
    t->push_back(StringSetting("valid-weighted-split-paths-path", "FILE",
                               "a file holding --valid-weighted-split-paths (quoted groups)",
                               &TC::valid_weighted_split_paths_path));
    t->push_back(IntSetting("num-workers",
                            "threads reading training samples ahead of the loop (0: on the loop's "
                            "thread)",
                            &TC::num_workers));
    // checkpoints and stopping
    t->push_back(
        StringSetting("save", "DIR",
                      "run directory: checkpoints and the run's files; keel train with the same "
                      "--save resumes from its newest valid checkpoint",
                      &TC::save));
    t->push_back(StringSetting("load", "DIR",
                               "start from the newest valid checkpoint in DIR (default: --save's)",
                               &TC::load));
    t->push_back(BoolSetting("finetune",
                             "load only the model weights of --load: a fresh optimizer, "
                             "iteration 0, this run's schedule and data (the shape must match)",
                             &TC::finetune));
    t->push_back(IntSetting("save-interval",
                            "iterations between checkpoints (0: only at the end and on stop)",
                            &TC::save_interval));
    t->push_back(
        RealSetting("save-interval-minutes",
                    "also checkpoint when this many minutes passed since the last save (0: off)",
                    &TC::save_interval_minutes));
    t->push_back(
        IntSetting("keep-last-checkpoints",
                   "keep the newest N checkpoints, delete older unpinned ones (0: keep all)",
                   &TC::keep_last_checkpoints));
    t->push_back(BoolSetting("async-save",
                             "periodic saves copy the state and write it on a background thread "
                             "while training goes on (docs/checkpoints.md)",
                             &TC::async_save));
    t->push_back(IntSetting("non-persistent-save-interval",
                            "also save a local checkpoint every N iterations to "
                            "--non-persistent-local-ckpt-dir (0: off; docs/checkpoints.md)",
                            &TC::non_persistent_save_interval));
    t->push_back(StringSetting("non-persistent-ckpt-type", "TYPE",
                               "where the non-persistent checkpoints go: local (the only type "
                               "keel has: node-local files, replicated on a neighbour rank)",
                               &TC::non_persistent_ckpt_type));
    t->push_back(StringSetting("non-persistent-local-ckpt-dir", "DIR",
                               "node-local directory of the local checkpoints (e.g. /dev/shm/keel)",
                               &TC::non_persistent_local_ckpt_dir));
    t->push_back(StringSetting("kill-switch-path", "FILE",
                               "when FILE appears: save a checkpoint and exit 0",
                               &TC::kill_switch_path));
    t->push_back(IntSetting("exit-interval",
                            "save and exit when the iteration is a multiple of N (0: off)",
                            &TC::exit_interval));
    t->push_back(RealSetting("exit-duration-in-mins",
                             "save and exit after this many minutes (0: off)",
                             &TC::exit_duration_in_mins));
    t->push_back(
        BoolSetting("override-scheduler",
                    "on resume, accept LR, warmup, decay, optimizer and batch settings that differ "
                    "from the checkpoint's",
                    &TC::override_scheduler));
    t->push_back(BoolSetting(
        "override-data-order",
        "on resume, accept a seed, data path or split that differs from the checkpoint's",
        &TC::override_data_order));
    t->push_back(
        RealSetting("lr-scale-on-resume",
                    "on resume, multiply the schedule's LR by this from now on (stored in later "
                    "checkpoints; 0: keep the checkpoint's)",
                    &TC::lr_scale_on_resume));
    // guard
    t->push_back(EnumSetting(
        "guard",
        "instability guard: act (skip updates, roll back, cut the LR, reseed), observe "
        "(journal what it would do), off",
        &TC::guard,
        {{GuardLevel::kOff, "off"}, {GuardLevel::kObserve, "observe"}, {GuardLevel::kAct, "act"}}));
    t->push_back(RealSetting("guard-z-threshold", "loss spike: robust z-score above this",
                             &TC::guard_z_threshold));
    t->push_back(RealSetting("guard-grad-z-threshold",
                             "gradient-norm spike: robust z-score above this",
                             &TC::guard_grad_z_threshold));
    t->push_back(
        IntSetting("guard-window", "iterations in the guard's robust windows", &TC::guard_window));
    t->push_back(IntSetting("guard-min-history",
                            "normal iterations seen before spikes are detected",
                            &TC::guard_min_history));
    t->push_back(IntSetting("guard-divergence-window",
                            "iterations whose median loss is compared with its lowest level",
                            &TC::guard_divergence_window));
    t->push_back(RealSetting("guard-divergence-rel",
                             "divergence: that median above (1 + this) x the lowest level",
                             &TC::guard_divergence_rel));
    t->push_back(EnumSetting(
        "guard-divergence",
        "a slow divergence found by the trend test: notify (journal, log line, notification) or "
        "act (roll back before its start, skip the data since, cut the LR by guard-lr-cut)",
        &TC::guard_divergence,
        {{GuardDivergence::kNotify, "notify"}, {GuardDivergence::kAct, "act"}}));
    t->push_back(RealSetting("guard-trend-z",
                             "trend test: standard errors of a rise before it is a divergence",
                             &TC::guard_trend_z));
    t->push_back(IntSetting("guard-max-skips",
                            "anomalous updates skipped in a row before rolling back",
                            &TC::guard_max_skips));
    t->push_back(IntSetting("guard-max-data-skips",
                            "updates of anomalous batches skipped in a row (the weights probed "
                            "healthy on the previous batch) before rolling back",
                            &TC::guard_max_data_skips));
    t->push_back(RealSetting("guard-attn-logit-max",
                             "leading indicator: a max attention logit past this cuts the LR by "
                             "guard-lr-cut in place (again at 10x the logit); 0: off",
                             &TC::guard_attn_logit_max));
    t->push_back(IntSetting("guard-max-lr-cuts", "leading-indicator LR cuts at most",
                            &TC::guard_max_lr_cuts));
    t->push_back(
        IntSetting("guard-recover-iters",
                   "roll back when the loss is not back at its pre-onset level after this many "
                   "iterations",
                   &TC::guard_recover_iters));
    t->push_back(
        IntSetting("guard-rollback-margin",
                   "roll back to a healthy checkpoint at least this many iterations before the "
                   "onset",
                   &TC::guard_rollback_margin));
    t->push_back(IntSetting("guard-skip-before", "skipped data window: iterations before the onset",
                            &TC::guard_skip_before));
    t->push_back(IntSetting("guard-skip-after", "skipped data window: iterations after the onset",
                            &TC::guard_skip_after));
    t->push_back(RealSetting("guard-lr-cut", "LR factor applied by an escalated rollback",
                             &TC::guard_lr_cut));
    t->push_back(IntSetting("guard-max-rollbacks",
                            "rollbacks allowed before the run stops with a report",
                            &TC::guard_max_rollbacks));
    t->push_back(IntSetting("guard-escalation-window",
                            "a rollback within this many iterations of the previous one escalates",
                            &TC::guard_escalation_window));
    t->push_back(
        StringListSetting("skip-train-iteration-range", "A-B ...",
                          "skip the data of these iterations (inclusive ranges): read past, no "
                          "update",
                          &TC::skip_train_iteration_range));
    t->push_back(
        StringListSetting("skip-train-samples-range", "A-B ...",
                          "skip the iterations that read these samples (inclusive, 0-based "
                          "positions in the sample stream)",
                          &TC::skip_train_samples_range));
    // DeepSpeed
    t->push_back(BoolSetting("deepspeed",
                             "read --deepspeed_config (Megatron-DeepSpeed's switch; keel itself "
                             "does not use DeepSpeed)",
                             &TC::deepspeed));
    t->push_back(StringSetting("deepspeed-config", "FILE",
                               "a DeepSpeed config JSON: its batch sizes, clipping, ZeRO stage and "
                               "precision are applied, the rest named (also --deepspeed_config)",
                               &TC::deepspeed_config));
    // output
    t->push_back(StringSetting("tensorboard-dir", "DIR",
                               "TensorBoard event files go here (default: SAVE/tensorboard)",
                               &TC::tensorboard_dir));
    t->push_back(BoolSetting("log-timers-to-tensorboard",
                             "TensorBoard: iteration time, throughput and the time of each phase",
                             &TC::log_timers_to_tensorboard));
    t->push_back(BoolSetting("log-batch-size-to-tensorboard", "TensorBoard: the global batch size",
                             &TC::log_batch_size_to_tensorboard));
    t->push_back(BoolSetting("log-validation-ppl-to-tensorboard",
                             "TensorBoard: the validation perplexity",
                             &TC::log_validation_ppl_to_tensorboard));
    t->push_back(
        IntSetting("sample-tokens",
                   fmt::format("tokens generated at the end (0: none; at most {}, as keel sample)",
                               kMaxSampleTokens),
                   &TC::sample_tokens));
    t->push_back(StringSetting("sample-prompt", "TEXT", "prompt for the end-of-run sample",
                               &TC::sample_prompt));
    return t;
  }();
  return *table;
}

const Setting* FindSetting(std::string_view name) {
  for (const Setting& s : Settings()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

namespace {

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::string Suggest(std::string_view name, std::string_view prefix) {
  const std::string* best = nullptr;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const Setting& s : Settings()) {
    size_t d = EditDistance(name, s.name);
    if (d < best_d) best_d = d, best = &s.name;
  }
  for (const ForeignFlag& f : ForeignFlags()) {
    size_t d = EditDistance(name, f.name);
    if (d < best_d) best_d = d, best = &f.name;
  }
  if (best != nullptr && best_d <= std::max<size_t>(3, name.size() / 2)) {
    return fmt::format("did you mean {}{}? (keel train --help lists all)", prefix, *best);
  }
  return "run `keel train --help` for the list of settings";
}

}  // namespace keel::config_internal
