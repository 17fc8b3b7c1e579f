// The flags of Megatron-LM / Megatron-DeepSpeed launch scripts that are not keel settings, so a
// script runs with only the program name changed: Megatron's spellings of keel settings, flags
// that change nothing here (each accepted with a note saying why), and flags whose feature keel
// does not have yet (exit 2 naming every one of them at once). docs/config.md lists them all.
#include <fmt/format.h>

#include <functional>
#include <map>
#include <optional>

#include "config/config.h"
#include "config/config_internal.h"

namespace keel::config_internal {
namespace {

using Kind = ForeignFlag::Kind;

ForeignFlag Alias(std::string name, std::string of, bool is_flag = false) {
  ForeignFlag f;
  f.name = std::move(name);
  f.kind = Kind::kAlias;
  f.is_flag = is_flag;
  f.alias_of = of;
  f.help = "Megatron's spelling of --" + of;
  return f;
}

ForeignFlag Value(std::string name, Kind kind, std::string help, bool is_list = false) {
  ForeignFlag f;
  f.name = std::move(name);
  f.kind = kind;
  f.is_list = is_list;
  f.help = std::move(help);
  return f;
}

ForeignFlag Switch(std::string name, Kind kind, std::string help) {
  ForeignFlag f = Value(std::move(name), kind, std::move(help));
  f.is_flag = true;
  return f;
}

// What resolving one flag can say.
struct Outcome {
  std::vector<std::string>* notes;
  std::vector<std::string> not_yet, errors;
};

// The foreign flags given, by name, and the config the settings made.
struct Context {
  std::map<std::string, const ForeignGiven*> given;
  const TrainConfig* cfg = nullptr;

  const ForeignGiven* Get(const std::string& name) const {
    auto it = given.find(name);
    return it == given.end() ? nullptr : it->second;
  }
  // The integer value of a flag that takes one (`fallback` when not given); none after an error
  // (not -1, which is a value a user can give).
  std::optional<int64_t> Int(const std::string& name, int64_t fallback, Outcome* out) const {
    const ForeignGiven* g = Get(name);
    if (g == nullptr) return fallback;
    std::optional<int64_t> v;
    if (g->values.size() == 1) v = ParseCliInt(g->values[0]);
    if (!v) out->errors.push_back(fmt::format("{}: expected an integer", g->where));
    return v;
  }
};

using Resolver = std::function<void(const ForeignGiven&, const Context&, Outcome*)>;

void Note(Outcome* out, const ForeignGiven& g, const std::string& why) {
  out->notes->push_back(fmt::format("{}: {}", g.where, why));
}

// A flag that means something only with more than one tensor-parallel rank.
Resolver NeedsTensorParallel(const char* feature, const char* why_nothing) {
  return [=](const ForeignGiven& g, const Context& c, Outcome* out) {
    if (c.cfg->tensor_model_parallel_size > 1)
      out->not_yet.push_back(fmt::format("{} ({})", g.where, feature));
    else
      Note(out, g, why_nothing);
  };
}

Resolver Accepted(std::string why) {
  return [why](const ForeignGiven& g, const Context&, Outcome* out) { Note(out, g, why); };
}

// An integer of at least `min` (argparse's type=int, and a count or interval that cannot be
// negative), with nothing to do here beyond `why`.
Resolver AcceptedInt(int64_t min, std::string why) {
  return [min, why](const ForeignGiven& g, const Context& c, Outcome* out) {
    const std::optional<int64_t> v = c.Int(g.flag->name, min, out);
    if (!v) return;
    if (*v < min)
      out->errors.push_back(fmt::format("{}: must be at least {}", g.where, min));
    else
      Note(out, g, why);
  };
}

// One of `choices` (each with its note, or a not-yet reason when the note starts with "!").
Resolver Choice(std::vector<std::pair<std::string, std::string>> choices) {
  return [choices](const ForeignGiven& g, const Context&, Outcome* out) {
    std::string names;
    for (const auto& [value, why] : choices) {
      names += (names.empty() ? "" : ", ") + value;
      if (g.values.size() != 1 || g.values[0] != value) continue;
      if (why.empty()) return;
      if (why[0] == '!')
        out->not_yet.push_back(fmt::format("{} ({})", g.where, why.substr(1)));
      else
        Note(out, g, why);
      return;
    }
    out->errors.push_back(fmt::format("{}: expected one of {}", g.where, names));
  };
}

struct Entry {
  ForeignFlag flag;
  Resolver resolve;  // empty for aliases
};

const std::vector<Entry>& Entries() {
  static const std::vector<Entry>* table = [] {
    auto* t = new std::vector<Entry>;
    auto add = [&](ForeignFlag f, Resolver r = nullptr) { t->push_back({std::move(f), r}); };
    // Megatron's spellings of keel settings.
    add(Alias("deepspeed_config", "deepspeed-config"));
    add(Alias("override-lr-scheduler", "override-scheduler", true));         // Megatron-DeepSpeed
    add(Alias("override-opt_param-scheduler", "override-scheduler", true));  // Megatron-LM
    add(Alias("model-parallel-size", "tensor-model-parallel-size"));         // Megatron's old name
    // Megatron-DeepSpeed: --checkpoint-activations' chunk of layers (Megatron-LM's uniform method).
    add(Alias("checkpoint-num-layers", "recompute-num-layers"));
    add(Switch("sync-tp-duplicated-parameters", Kind::kAccepted,
               "syncs parameters duplicated across tensor-parallel ranks"),
        [](const ForeignGiven& g, const Context& c, Outcome* out) {
          Note(out, g,
               c.cfg->tensor_model_parallel_size > 1
                   ? "keel's duplicated parameters (norms, row-parallel biases) stay identical "
                     "across tensor-parallel ranks by construction, and the replica check "
                     "hashes them across those ranks (--check-replicas-interval)"
                   : "with one tensor-parallel rank no parameter is duplicated across ranks");
        });
    // The optimizer: Megatron's adam (with decoupled weight decay) is keel's AdamW.
    add(Value("optimizer", Kind::kAccepted, "adam (keel's AdamW, Megatron's adam)"),
        Choice({{"adam", ""}, {"sgd", "!SGD: keel's optimizer is AdamW"}}));
    // Data.
    add(Value("data-impl", Kind::kAccepted, "indexed dataset format; keel memory-maps MMIDIDX"),
        Choice({{"mmap", "keel always memory-maps the .bin (MMIDIDX, the mmap format)"},
                {"infer", "keel reads the mmap format (MMIDIDX) and always memory-maps it"},
                {"lazy",
                 "!reading the lazy IndexedDataset format: keel reads the mmap format "
                 "(MMIDIDX) only; rebuild the data with --dataset-impl mmap"},
                {"cached",
                 "!reading the cached IndexedDataset format: keel reads the mmap format "
                 "(MMIDIDX) only; rebuild the data with --dataset-impl mmap"}}));
    add(Value("valid-num-workers", Kind::kAccepted, "validation reads on the loop's thread"),
        AcceptedInt(0,
                    "keel reads validation samples on the loop's own thread (an evaluation reads "
                    "--eval-iters batches; there is no loader to parallelise)"));
    add(Value("test-weighted-split-paths", Kind::kAccepted, "keel runs no test evaluation", true),
        Accepted("keel runs no test evaluation (nor of --split's test share), so the groups are "
                 "not read"));
    add(Value("test-weighted-split-paths-path", Kind::kAccepted, "keel runs no test evaluation"),
        Accepted("keel runs no test evaluation (nor of --split's test share), so the file is not "
                 "read"));
    // Kernels: keel's CPU kernels have no fused variants to turn on or off.
    add(Switch("abort-on-unmet-fused-kernel-constraints", Kind::kAccepted,
               "keel has no fused CUDA kernels"),
        Accepted("keel's CPU kernels have no fused-kernel constraints to meet (no fused CUDA "
                 "kernels), so nothing can fall back"));
    for (const char* f : {"no-masked-softmax-fusion", "no-bias-gelu-fusion",
                          "no-bias-dropout-fusion", "no-gradient-accumulation-fusion"})
      add(Switch(f, Kind::kAccepted, "keel has no fused CUDA kernels to turn off"),
          Accepted("keel has no fused CUDA kernels to turn off; its CPU kernels compute the same "
                   "values"));
    add(Switch("use-flash-attn", Kind::kAccepted, "FlashAttention is a CUDA kernel"),
        Accepted("FlashAttention is a CUDA kernel; keel's CPU attention computes the same exact "
                 "softmax attention"));
    add(Switch("attention-softmax-in-fp32", Kind::kAccepted, "keel's softmax is always fp32"),
        Accepted("keel computes the attention softmax in fp32 in every precision"));
    add(Switch("accumulate-allreduce-grads-in-fp32", Kind::kAccepted,
               "keel's gradients are always fp32"),
        Accepted("keel accumulates and reduces gradients in fp32 in every precision"));
    add(Switch("fp16-lm-cross-entropy", Kind::kAccepted, "keel's loss is computed in fp32"),
        Accepted("keel computes the cross-entropy in fp32 (the flag saves GPU memory by computing "
                 "it in fp16; the fp32 loss is the more accurate)"));
    // Output and process.
    add(Value("tensorboard-queue-size", Kind::kAccepted, "keel flushes every event"),
        AcceptedInt(1,
                    "keel writes and flushes each TensorBoard event as it is made: there is no "
                    "queue"));
    add(Value("tensorboard-log-interval", Kind::kAccepted, "keel writes every iteration"),
        AcceptedInt(1, "keel writes the training scalars of every iteration to TensorBoard"));
    add(Switch("log-num-zeros-in-grad", Kind::kAccepted, "keel always logs it"),
        Accepted("keel logs the number of zeros in the gradients always (iteration line, "
                 "TensorBoard num-zeros/)"));
    add(Value("codecarbon-dir", Kind::kAccepted, "keel does not measure energy"),
        Accepted("keel does not measure energy use (CodeCarbon is a Python tracker); nothing is "
                 "written there"));
    add(Value("distributed-backend", Kind::kAccepted, "MPI carries keel's collectives"),
        Choice(
            {{"nccl", "this is a CPU build: MPI carries the collectives (NCCL is CUDA's library)"},
             {"gloo", "MPI carries keel's collectives, not gloo"},
             {"mpi", "MPI carries keel's collectives"},
             {"ccl", "MPI carries keel's collectives, not oneCCL"}}));
    add(Value("DDP-impl", Kind::kAccepted, "keel's data parallel is its own"),
        Choice({{"local",
                 "keel's data parallel is its own (gradient buckets reduced over MPI "
                 "during backward)"},
                {"torch",
                 "keel's data parallel is its own (gradient buckets reduced over MPI "
                 "during backward)"}}));
    add(Value("local_rank", Kind::kAccepted, "the launcher's rank; keel takes MPI's"),
        Accepted("keel takes its rank from MPI (mpirun or srun), not from the launcher's "
                 "--local_rank"));
    add(Switch("exit-signal-handler", Kind::kAccepted, "keel always saves on SIGTERM"),
        Accepted("with --save, keel saves a checkpoint and exits on SIGTERM and SIGINT always"));
    // Activation recomputation: keel's --recompute-granularity (Megatron-LM's own flag).
    add(Switch("checkpoint-activations", Kind::kAccepted,
               "Megatron-DeepSpeed: every layer's forward recomputed in backward; keel's "
               "--recompute-granularity full"));
    add(Switch("recompute-activations", Kind::kAccepted,
               "Megatron-LM: attention recomputed in backward; keel's --recompute-granularity "
               "selective"));
    add(Switch("deepspeed-activation-checkpointing", Kind::kAccepted,
               "DeepSpeed's implementation of --checkpoint-activations; keel uses its own"),
        [](const ForeignGiven& g, const Context& c, Outcome* out) {
          Note(out, g,
               c.Get("checkpoint-activations") != nullptr
                   ? "keel recomputes with its own implementation (the same bits as none); "
                     "DeepSpeed's only adds partitioning and offloading of the checkpoints "
                     "across model-parallel ranks, and keel has one"
                   : "it selects DeepSpeed's implementation of --checkpoint-activations, which "
                     "is not given: nothing is recomputed");
        });
    add(Switch("partition-activations", Kind::kAccepted,
               "splits recomputation checkpoints across model-parallel ranks"),
        NeedsTensorParallel("partitioning activation checkpoints across tensor-parallel ranks: "
                            "each tensor-parallel rank keeps its own recomputation checkpoints",
                            "it splits the recomputation's checkpoints across tensor-parallel "
                            "ranks, and there is one"));
    add(Value("zero-stage", Kind::kAccepted,
              "ZeRO stage: 0 replicated Adam moments, 1 sharded (keel's "
              "--use-distributed-optimizer); 2 and 3 are not in keel"));
    return t;
  }();
  return *table;
}

const Entry* FindEntry(std::string_view name) {
  for (const Entry& e : Entries())
    if (e.flag.name == name) return &e;
  return nullptr;
}

// --zero-stage (or the DeepSpeed config's stage) as keel's --use-distributed-optimizer.
void ApplyZeroStage(int stage, const std::set<std::string>& settings_given, TrainConfig* cfg,
                    Outcome* out) {
  if (stage < 0) return;
  if (stage >= 2) {
    out->not_yet.push_back(fmt::format(
        "ZeRO stage {} ({}): keel shards the Adam moments over data-parallel ranks (ZeRO-1, "
        "--zero-stage 1)",
        stage,
        stage == 2 ? "gradients sharded over the ranks" : "parameters and gradients sharded"));
    return;
  }
  bool sharded = stage == 1;
  std::string why = stage == 1 ? "each data-parallel rank holds its shard of the Adam moments"
                               : "every data-parallel rank holds all the Adam moments";
  if (stage == 0 && cfg->deepspeed && cfg->bf16) {
    // BLOOM's script: "bf16 must use z0! it implements its own zero stage 1 equivalent".
    sharded = true;
    why =
        "under --deepspeed with --bf16, DeepSpeed's BF16_Optimizer shards the optimizer states "
        "over the data-parallel ranks itself (ZeRO-1's equivalent), so keel does the same";
  }
  if (settings_given.count("use-distributed-optimizer") &&
      cfg->use_distributed_optimizer != sharded) {
    out->errors.push_back(fmt::format(
        "ZeRO stage {} means --use-distributed-optimizer={} ({}), but "
        "--use-distributed-optimizer={} is given: drop one of them",
        stage, sharded ? "true" : "false", why, cfg->use_distributed_optimizer ? "true" : "false"));
    return;
  }
  cfg->use_distributed_optimizer = sharded;
  out->notes->push_back(fmt::format("ZeRO stage {} is keel's --use-distributed-optimizer={}: {}",
                                    stage, sharded ? "true" : "false", why));
}

// --checkpoint-activations (full) and --recompute-activations (selective) as keel's
// --recompute-granularity; a granularity given beside them must agree.
void ApplyRecompute(const Context& c, const std::set<std::string>& settings_given, TrainConfig* cfg,
                    Outcome* out) {
  const ForeignGiven* full = c.Get("checkpoint-activations");
  const ForeignGiven* selective = c.Get("recompute-activations");
  if (full == nullptr && selective == nullptr) return;
  if (full != nullptr && selective != nullptr) {
    out->errors.push_back(fmt::format(
        "{} (recompute every layer's forward) and {} (recompute attention only) ask for two "
        "granularities: give one",
        full->where, selective->where));
    return;
  }
  const ForeignGiven& g = full != nullptr ? *full : *selective;
  const Recompute want = full != nullptr ? Recompute::kFull : Recompute::kSelective;
  const char* name = want == Recompute::kFull ? "full" : "selective";
  const char* other = want == Recompute::kFull ? "selective" : "full";
  if (settings_given.count("recompute-granularity") && cfg->recompute_granularity != want) {
    out->errors.push_back(fmt::format(
        "{} means --recompute-granularity {}, but --recompute-granularity {} is given: drop one "
        "of them",
        g.where, name, cfg->recompute_granularity == Recompute::kNone ? "none" : other));
    return;
  }
  cfg->recompute_granularity = want;
  Note(out, g, fmt::format("keel's --recompute-granularity {}", name));
}

}  // namespace

const std::vector<ForeignFlag>& ForeignFlags() {
  static const std::vector<ForeignFlag>* flags = [] {
    auto* f = new std::vector<ForeignFlag>;
    for (const Entry& e : Entries()) f->push_back(e.flag);
    return f;
  }();
  return *flags;
}

const ForeignFlag* FindForeignFlag(std::string_view name) {
  const Entry* e = FindEntry(name);
  return e == nullptr ? nullptr : &e->flag;
}

Status ResolveForeignFlags(const std::vector<ForeignGiven>& given,
                           const std::set<std::string>& settings_given, int zero_stage,
                           TrainConfig* cfg, std::vector<std::string>* notes) {
  Context ctx;
  ctx.cfg = cfg;
  for (const ForeignGiven& g : given) ctx.given[g.flag->name] = &g;
  Outcome out{notes, {}, {}};
  for (const ForeignGiven& g : given) {
    const Entry* e = FindEntry(g.flag->name);
    if (e == nullptr || !e->resolve) continue;  // aliases are applied with the settings
    e->resolve(g, ctx, &out);
  }
  ApplyZeroStage(zero_stage, settings_given, cfg, &out);
  ApplyRecompute(ctx, settings_given, cfg, &out);
  if (!out.errors.empty()) {
    std::string all;
    for (const std::string& e : out.errors) all += (all.empty() ? "" : "; ") + e;
    return Status::InvalidArgument(all);
  }
  if (!out.not_yet.empty()) {
    std::string all;
    for (const std::string& n : out.not_yet) all += "\n  " + n;
    return Status::InvalidArgument(
        "these flags ask for what keel does not implement yet, so the run would not be the one "
        "the script describes:" +
        all + "\n(docs/config.md lists every Megatron flag keel reads and what it does with it)");
  }
  return Status::OK();
}

}  // namespace keel::config_internal
