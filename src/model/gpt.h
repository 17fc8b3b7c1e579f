// GptModel: a decoder-only transformer described once and executed by any Backend: GPT-2's
// shape, with BLOOM's options (ALiBi, a LayerNorm after the word embedding) and the Llama family's
// (RoPE, RMSNorm, SwiGLU, grouped-query attention, untied output layer, no linear biases).
//
//   x0 = wte[tok] (+ wpe[pos])            (optionally x0 = Norm_emb(x0), BLOOM)
//   for each layer:  x = x + Wo . attn(rope(Norm1(x) Wqkv))  (causal, Q,K pre-scaled by
//                                                           hs^-1/4; ALiBi or RoPE positions;
//                                                           with qk_layernorm, each head's Q and
//                                                           K LayerNorm-ed first; G <= NH
//                                                           key/value heads)
//                    x = x + W2 . act(Norm2(x) W1)       (act: GELU(tanh), or SwiGLU on the
//                                                           two halves [g | u] of x W1)
//   logits = Norm_f(x) Wout^T              (Wout = wte, tied, or output_layer; padded vocab masked)
//   objective = mean CE + z_loss * mean (log Z)^2     (z_loss: PaLM's auxiliary loss, 0 = off)
// Norm is LayerNorm (weight and bias) or RMSNorm (weight only); every linear layer has a bias
// unless `bias` is off.
//
// All parameters live in one contiguous buffer, all gradients in another, each tensor a named
// slice (ParamInfo), so the optimizer, clipping, communication and checkpoints see flat memory and
// topology-free names.
//
// Tensor parallelism (TensorParallel; Megatron-LM, Shoeybi et al. 2019): each of the T ranks of the
// tensor group holds its slice of every split tensor (model/tensor_split.h): column-parallel QKV
// and FC1 (its heads and key/value groups, NH/T and G/T; SwiGLU's halves g and u each cut),
// row-parallel attention output and FC2 whose partial products are summed over the group
// (AllReduceSum; the replicated bias enters the sum once, in rank 0's product), the
// vocabulary-parallel embedding (each rank looks up its rows, zeros elsewhere, summed) and
// cross-entropy (row maximum, sum of exp and target logit reduced; no rank holds the full logits).
// In the backward the gradient of each column-parallel input is summed over the group. Every
// replicated tensor sees the same inputs on every rank, so its gradient is the same bits there;
// the QK-LayerNorm weights, shared by heads on different ranks, get their partial gradients summed.
// Sequence parallelism (Korthikanti et al. 2022) keeps the norms' and residuals' rows split across
// the group (B*T/T rows each, in rank order): an all-gather before the column-parallel products, a
// reduce-scatter after the row-parallel ones; the norms' weight gradients are then partial sums,
// summed over the group after each layer.
//
// Pipeline parallelism (ModelStage): a model can hold one pipeline stage (or one virtual chunk of
// an interleaved stage) of the whole: transformer layers [first, last) (pipeline/stage_partition.h
// picks them), the embedding only where first == 0, the final norm, output layer and loss only
// where last == num_layers. Parameter names stay the whole model's (layers.L with the global L)
// and each value is drawn at its whole-model key, so a stage holds the whole model's values and a
// checkpoint does not depend on the layout. With a tied output layer the last stage holds its own
// copy of embedding.word_embeddings.weight (initialised identically); the pipeline step sums the
// two copies' gradients (Megatron's embedding group) so they stay the same bits. StageForward and
// StageBackward take and give the boundary activations and their gradients, and keep each
// in-flight micro-batch's activations in its own slot (1F1B holds up to P per stage).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/model_shape.h"
#include "config/train_config.h"
#include "core/status.h"
#include "model/tensor_split.h"

namespace keel {

class Communicator;

// Activation recomputation (Recompute, config/train_config.h; Korthikanti et al. 2022) trades
// compute for activation memory; the gradients are the same bits either way:
//   kNone       every layer keeps its activations from forward to backward;
//   kSelective  the attention probabilities (B, NH, T, T per layer, the part that grows with T^2)
//               live in one buffer shared by the layers; the backward recomputes each layer's;
//   kFull       each layer keeps only its input (the residual stream); the backward reruns the
//               layer's forward into one set of buffers shared by all layers, then its backward.
//               With a count (Megatron-LM's --recompute-method block --recompute-num-layers N)
//               only the first N layers do; the rest keep their activations as under kNone.
const char* RecomputeName(Recompute r);

struct ParamInfo {
  std::string name;            // e.g. "layers.3.mlp.dense_h_to_4h.weight"
  std::vector<int64_t> shape;  // of this rank's slice (the whole tensor without tensor parallelism)
  size_t offset = 0;           // in floats, into the parameter (and gradient) buffer
  size_t numel = 0;            // of the slice
  bool weight_decay = false;   // matrices and embeddings decay; biases and norms do not
  std::vector<int64_t> full_shape;  // the whole tensor's shape
  TensorSplit split;                // how the whole tensor is cut across tensor ranks
  // The last pipeline stage's copy of the tied word embeddings: the same values as the first
  // stage's, so the whole model's statistics, checkpoints and hashes count it there only.
  bool tied_copy = false;
};

// The part of the whole model a pipeline stage holds (see the top of this file). The default is
// the whole model.
struct ModelStage {
  int first_layer = 0;
  int last_layer = -1;  // exclusive; -1: num_layers
  bool embedding = true, head = true;
  // "layers 2-3 + head" for messages.
  std::string Describe(int num_layers) const;
};

// The tensor-parallel group a model runs in (see the top of this file). A null group, or one of
// size 1, is the single-rank model.
struct TensorParallel {
  Communicator* group = nullptr;
  bool sequence_parallel = false;  // Megatron-LM's --sequence-parallel
};

class GptModel {
 public:
  // With a tensor group, every rank of it constructs its model with the same spec and calls
  // Initialize, Forward and Backward in step (they communicate inside).
  // `stage`: the layers and ends this model holds (ModelStage); its embedding must be where its
  // first layer is 0, its head where its last is num_layers (KeelError otherwise).
  GptModel(Backend* backend, const GptSpec& spec, TensorParallel tp = {}, ModelStage stage = {});
  // The interleaved pipeline schedule's V model chunks of one rank (virtual stages r, P + r, ...)
  // as one model: its parameter and gradient buffers hold the chunks' one after another (params()
  // lists them so), and chunk(c) is a GptModel working on its part, which the pipeline step runs.
  // The whole buffers are what the optimizer, the reductions and checkpoints see; only the chunks
  // compute. One stage: the plain stage model.
  static std::unique_ptr<GptModel> MakeChunked(Backend* backend, const GptSpec& spec,
                                               TensorParallel tp,
                                               const std::vector<ModelStage>& chunks);
  ~GptModel();
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;

  const GptSpec& spec() const { return spec_; }
  int tensor_size() const { return tp_; }
  int tensor_rank() const { return tp_rank_; }
  bool sequence_parallel() const { return sp_; }
  // The pipeline stage this model holds (last_layer resolved), and whether it is the whole model.
  const ModelStage& stage() const { return stage_; }
  bool whole_model() const {
    return chunks_.empty() && stage_.embedding && stage_.head && stage_.first_layer == 0 &&
           stage_.last_layer == spec_.num_layers;
  }
  int num_stage_layers() const { return nl_; }
  // The model chunks this model computes with: itself, or MakeChunked's chunks.
  int num_chunks() const { return chunks_.empty() ? 1 : static_cast<int>(chunks_.size()); }
  GptModel& chunk(int c) { return chunks_.empty() ? *this : *chunks_.at(static_cast<size_t>(c)); }
  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo* FindParam(const std::string& name) const;
  size_t num_params() const { return num_params_; }
  // The fp32 master weights, to read (a save, a hash, a finiteness check): reading leaves the
  // 16-bit compute copy current.
  const float* param_data() const { return params_mem_; }
  // The same, to write (a checkpoint load, a rollback, an all-gather): the 16-bit compute copy is
  // marked stale, and the next Forward converts the weights again (bf16/fp16 only).
  float* mutable_param_data() {
    lowp_stale_ = true;
    for (auto& c : chunks_) c->lowp_stale_ = true;
    return params_mem_;
  }
  // How many times the weights were converted to their 16-bit compute copy (tests check that a
  // save does not force one).
  int64_t lowp_conversions() const {
    int64_t n = lowp_conversions_;
    for (const auto& c : chunks_) n += c->lowp_conversions_;
    return n;
  }
  float* grad_data() { return grads_mem_; }
  // For an optimizer that rewrites every weight: the fp32 weights and the 16-bit compute copy
  // (nullptr in fp32, or when the copy is not current), which the optimizer must then rewrite
  // for every weight it changes (AdamW::Step's param_lowp) — the next Forward does not convert.
  struct UpdatableWeights {
    float* fp32;
    uint16_t* lowp;
  };
  UpdatableWeights weights_for_update();
  Backend* backend() { return backend_; }

  // The seeds' formula n*(12h^2+13h) + v*h + s*h + 2h (exact for GPT-2's shape: FFN = 4h, learned
  // positions, no embedding LayerNorm); compare with num_params() to catch a wrong FFN size.
  // IsGpt2Shape: whether the formula describes `spec` at all (no Llama or BLOOM option).
  static int64_t FormulaParamCount(const GptSpec& spec);
  static bool IsGpt2Shape(const GptSpec& spec);
  // Every parameter tensor of `spec` in buffer order, without allocating (keel plan counts these):
  // a rank's slices when the tensors are split across `tensor` ranks (the same for every rank).
  // With a stage: that stage's tensors only, under their whole-model names (a tied last stage
  // lists embedding.word_embeddings.weight after its final norm, where output_layer.weight would
  // be).
  static std::vector<ParamInfo> ParamLayout(const GptSpec& spec, int tensor = 1,
                                            const ModelStage& stage = {});
  // Whether `spec` can be split across `tensor` ranks (heads, key/value groups, FFN and padded
  // vocabulary divisible); else InvalidArgument naming what does not divide.
  static Status CheckTensorParallel(const GptSpec& spec, int tensor);

  // Megatron initialisation: weights ~ N(0, std), output projections (attention dense and
  // dense_4h_to_h) ~ N(0, std / sqrt(2 * num_layers)), biases 0, norms weight 1 bias 0. Each value
  // is a pure function of (seed, parameter index, element index), the element index counted in
  // the whole tensor: a tensor-parallel rank's slice holds the single-rank model's values there.
  void Initialize(uint64_t seed, float std);

  // Runs the forward pass on tokens (B,T) (host memory). With targets (B,T) it also computes the
  // per-token cross-entropy, writes its gradient scaled by `dloss` (the weight of each token in the
  // total loss) ready for Backward, and returns the mean loss of this micro-batch. Without targets
  // it only leaves the logits (see LastLogits) and returns 0.
  // The whole model only (micro-batch slot 0).
  double Forward(const int32_t* tokens, const int32_t* targets, int B, int T, float dloss);
  // Backpropagates the last Forward (which must have had targets); ACCUMULATES into grad_data(),
  // except the first Backward after StartGradAccumulation(), which writes it.
  void Backward();

  // ---- pipeline stages (see the top of this file) -------------------------------------------
  // The floats of a boundary activation (and of its gradient) of a (B,T) micro-batch: B*T*hidden,
  // this rank's B*T/T rows under sequence parallelism.
  size_t StageActivationFloats(int B, int T) const;
  // The forward of one micro-batch on this stage, its activations kept in `slot` (any small
  // index; a slot is reused by the next micro-batch given it, its buffers laid out once per
  // shape) until StageBackward(slot). `tokens` (B,T host): needed on the embedding stage, and on
  // every stage when position ids or the attention mask are reset at documents. `input` (host,
  // StageActivationFloats): the previous stage's output, null on the embedding stage. `targets`
  // and `dloss` as in Forward, read on the head stage only. Writes the outgoing activations to
  // `output` (host) on every stage but the head; returns the head's mean loss (0 elsewhere).
  double StageForward(int slot, const int32_t* tokens, const float* input, const int32_t* targets,
                      int B, int T, float dloss, float* output);
  // The backward of the micro-batch in `slot`: `output_grad` (host), the gradient of the output
  // (null on the head stage, which starts from its loss); writes the gradient of its input to
  // `input_grad` (host; not on the embedding stage, which may pass null). Gradients accumulate as
  // Backward's do.
  void StageBackward(int slot, const float* output_grad, float* input_grad);
  // Frees every slot's activations (the next Forward lays them out again).
  void FreeAllActivations();
  void ZeroGrad();
  // A step's accumulation begins: the next Backward writes every gradient (the same values as
  // ZeroGrad() then Backward(), without a zeroing pass over the buffer or the products reading
  // it back). grad_data() holds stale values until then.
  void StartGradAccumulation() {
    overwrite_grads_ = true;
    for (auto& c : chunks_) c->overwrite_grads_ = true;
  }
  // Called by Backward after each layer with the offset from which on every gradient is final
  // (the data-parallel reduction starts on those while backward goes on); empty: not called.
  void set_grad_ready(std::function<void(size_t from)> f) { grad_ready_ = std::move(f); }

  // Host copy of the logits row (first V entries) at position t of sequence b of the last Forward.
  // Tensor parallel: gathered from the group (every rank calls it).
  std::vector<float> LogitsAt(int b, int t);
  // Mean cross-entropy of sequence b (its T tokens) of the last Forward with targets: the
  // per-dataset loss of a mixture is built from these.
  double SequenceLoss(int b) const;
  // Mean of log Z over the tokens of the last Forward with targets (a guard signal).
  double MeanLogZ();
  // z_loss * mean (log Z)^2 of the last Forward with targets (0 when z_loss is off).
  double LastZLoss();
  // Max pre-softmax attention score over layers, sequences, heads and positions of the last
  // Forward (a guard signal: attention-logit growth precedes a class of divergences). Tensor
  // parallel: the maximum over the group's heads (every rank calls it).
  double LastMaxAttentionLogit();
  // Bytes of the activations and gradient scratch a micro-batch of shape (B,T) needs: what
  // Forward allocates, counted by the same code without allocating (memory estimates). bf16 and
  // fp16 add the 16-bit copies of the matmul inputs. `tensor` > 1: what one rank of a tensor group
  // of that size allocates (with `sequence_parallel`, its share of the residual rows).
  // `head` false: a pipeline stage without the output layer (spec.num_layers its own layers).
  static uint64_t ActivationBytes(const GptSpec& spec, int B, int T,
                                  Precision precision = Precision::kFp32,
                                  Recompute recompute = Recompute::kNone, int full_layers = -1,
                                  int tensor = 1, bool sequence_parallel = false, bool head = true);
  // Activation recomputation for the next Forward/Backward pairs (the buffers are laid out again
  // when it changes). `full_layers`: under kFull, how many leading layers recompute (-1: all).
  void set_recompute(Recompute r, int full_layers = -1);
  Recompute recompute() const { return recompute_; }
  // The layers that rerun their forward in the backward: kFull's count (all, or at most
  // `full_layers`), 0 otherwise.
  static int FullRecomputeLayers(const GptSpec& spec, Recompute r, int full_layers);
  // ParamLayout's total, without listing every layer's tensors (so a config of a billion layers
  // is counted, not allocated).
  static uint64_t ParamCount(const GptSpec& spec);

 private:
  // A chunk of MakeChunked's: its parameters and gradients live at `params` and `grads`, which
  // the owner allocated.
  struct Storage {
    float* params = nullptr;
    float* grads = nullptr;
  };
  GptModel(Backend* backend, const GptSpec& spec, TensorParallel tp, ModelStage stage,
           Storage storage);
  struct LayerParams;
  struct Activations;
  struct BufferSource;
  // The widths one rank works with: the whole model's without tensor parallelism.
  struct Dims {
    int tensor = 1;
    bool sp = false;                   // sequence parallel: the norms' rows split across the group
    int C = 0, hs = 0, NH = 0, G = 0;  // hidden, head size, this rank's heads and kv heads
    int A = 0;                         // attention output width NH * hs
    int W = 0, F = 0, F1 = 0, Vp = 0;  // QKV, FFN, FC1 widths and vocabulary rows
  };
  static Dims DimsOf(const GptSpec& spec, int tensor, bool sp);
  // Layers 1..full_layers-1 share layer 0's buffers (FullRecomputeLayers' count).
  // `head`: whether the final norm, logits and loss buffers are laid out.
  static void LayoutActivations(const GptSpec& spec, const Dims& d, int B, int T, int layers,
                                bool head, Recompute recompute, int full_layers, Activations* acts,
                                BufferSource* src);
  // The forward and backward of the current slot: the whole model's, or a stage's (input/output
  // and their gradients in host memory, null where the stage has an end of the model).
  double ForwardImpl(const int32_t* tokens, const float* input, const int32_t* targets, int B,
                     int T, float dloss, float* output);
  void BackwardImpl(const float* output_grad, float* input_grad);
  // Makes micro-batch slot `s` current: its activations and what the last Forward on it left.
  void UseSlot(int s);
  // Tensor parallelism's communication (backend memory; the backend synchronised first): the sum
  // of n floats over the group, and (sequence parallel) the gather of every rank's `rows` rows
  // (hidden wide) into `full`, and the sum of `full` over the group scattered by rows into `mine`.
  void TpAllReduce(float* x, size_t n);
  void TpGatherRows(const float* mine, float* full, size_t rows);
  void TpReduceScatterRows(const float* full, float* mine, size_t rows);
  // Sums the gradients of params_[from, to) whose per-rank values are partial sums (see
  // partial_grads_) over the group, into their gradients (written when `overwrite`).
  void FlushPartialGrads(size_t from, size_t to, bool overwrite);
  // One layer's weights (null for the tensors the shape lacks), found from its first parameter.
  struct LayerWeights {
    const float *ln1w, *ln1b, *qkvw, *qkvb, *qlnw, *qlnb, *klnw, *klnb, *projw, *projb, *ln2w,
        *ln2b, *fcw, *fcb, *fcpw, *fcpb;
  };
  LayerWeights WeightsOf(int layer) const;
  // res[l+1] = layer l of res[l]; fills the layer's activation buffers (shared ones under
  // recomputation) and its 16-bit matmul inputs. The forward and the recomputing backward run it.
  void LayerForward(int l, const LayerWeights& w);
  void AllocateActivations(int B, int T);
  void NormForward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                   const float* b, int N);
  void NormBackward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                    const float* w, const float* mean, const float* rstd, int N);
  void FreeActivations();

  Backend* backend_;
  GptSpec spec_;
  ModelStage stage_;
  int nl_ = 0;  // this stage's layer count (layer l here is layer stage_.first_layer + l)
  // Per parameter, its index in the whole model's layout: the key of its initial values.
  std::vector<size_t> init_index_;
  Communicator* tp_group_ = nullptr;
  int tp_ = 1, tp_rank_ = 0;
  bool sp_ = false;
  Dims d_;
  int vocab_start_ = 0;  // the first vocabulary row of this rank's slice
  std::vector<ParamInfo> params_;
  // The gradients that are partial sums on each rank (the QK-LayerNorm weights, shared by heads
  // on other ranks; every norm under sequence parallelism) go to this scratch first and are summed
  // over the group: partial_offset_[i] is params_[i]'s place there (SIZE_MAX: not partial).
  std::vector<size_t> partial_offset_;
  float* partial_grads_ = nullptr;
  size_t partial_numel_ = 0;
  size_t num_params_ = 0;
  float* params_mem_ = nullptr;
  float* grads_mem_ = nullptr;
  bool owns_storage_ = true;  // false for a chunk (the owner frees the buffers)
  std::vector<std::unique_ptr<GptModel>> chunks_;  // MakeChunked's, over params_mem_
  float* alibi_slopes_ = nullptr;                  // (NH) on the backend, if ALiBi
  float* rope_cos_sin_ = nullptr;  // (max_positions, rot): cos then sin per position, if RoPE
  // The weights in the backend's 16-bit format (bf16/fp16 precision), converted from params_mem_
  // by the first Forward after mutable_param_data() was handed out; nullptr in fp32.
  void PrepareLowPrecisionWeights();
  const uint16_t* Lowp(const float* w) const {
    return lowp_params_ != nullptr ? lowp_params_ + (w - params_mem_) : nullptr;
  }
  uint16_t* lowp_params_ = nullptr;
  // bf16/fp16: the 16-bit copies of the matmul inputs (per layer ln1, atty, ln2, fch_gelu, then
  // lnf), converted once by Forward and read again by Backward's products; nullptr in fp32.
  enum LowpInput { kLn1, kAtty, kLn2, kFchGelu };
  uint16_t* LowpInputOf(int layer, LowpInput which) const;
  static uint64_t LowpInputElements(const GptSpec& spec, int layers, int B, int T, int full_layers);
  uint16_t* LowpLnfInput() const;
  uint16_t* lowp_acts_ = nullptr;
  Precision lowp_precision_ = Precision::kFp32;
  bool lowp_stale_ = true;
  int64_t lowp_conversions_ = 0;
  bool overwrite_grads_ = false;  // see StartGradAccumulation
  Recompute recompute_ = Recompute::kNone;
  int full_layers_ = 0;  // FullRecomputeLayers of recompute_ and the count asked for
  std::vector<size_t> layer_first_param_;  // index into params_ of each layer's first tensor
  Activations* acts_ = nullptr;
  int cur_B_ = 0, cur_T_ = 0;
  const int32_t* positions_ = nullptr;  // of the last Forward, when position ids are reset
  const int32_t* doc_start_ = nullptr;  // of the last Forward, when attention is reset
  bool has_targets_ = false;
  std::function<void(size_t)> grad_ready_;
  // The parked micro-batch slots (the current one's state lives in the members above).
  struct SlotState {
    Activations* acts = nullptr;
    uint16_t* lowp_acts = nullptr;
    int B = 0, T = 0;
    const int32_t* positions = nullptr;
    const int32_t* doc_start = nullptr;
    bool has_targets = false;
  };
  std::vector<SlotState> slots_;
  int cur_slot_ = 0;
};

// The NaN and Inf values among a model's parameters: how many, and the first tensor (in buffer
// order) holding one, with its count. One pass over the buffer when there are none.
struct NonFiniteParams {
  size_t count = 0;
  std::string first_tensor;
  size_t in_first_tensor = 0;
};
NonFiniteParams FindNonFiniteParams(GptModel& model);

// RoPE's frequencies w_i = rotary_base^(-2i/rot), i < rot/2, after the spec's scaling:
// Llama 3.x's keeps wavelengths 2pi/w below original/high_freq_factor, divides those above
// original/low_freq_factor by the factor, and blends in between with
// s = (original/wavelength - low) / (high - low): w (1 - s) / factor + w s. Linear: w / factor.
std::vector<double> RopeFrequencies(const GptSpec& spec);

// "RoPE (base 10000, 64 of 64 dims)", with its scaling when there is one; for the start-up log.
std::string DescribeRope(const GptSpec& spec);

// RoPE's angle table for `spec`: per position p < max_positions, cos(p w_i) for i < rot/2, then
// sin(p w_i), with RopeFrequencies' w_i (computed in double, stored fp32).
std::vector<float> RopeCosSin(const GptSpec& spec);

// ALiBi head slopes (Press et al.): geometric sequence 2^(-8/n * (i+1)) for n a power of two,
// with the interpolation BLOOM uses for other head counts.
std::vector<float> AlibiSlopes(int heads);

// Whether `backend` implements every op that training `spec` in precision `p` runs (the model,
// the gradient norm and AdamW) on `tensor` tensor-parallel ranks; else InvalidArgument naming the
// first op it lacks and the setting that needs it ("backend cuda lacks RopeForward, needed by
// --position-embedding-type rope").
Status CheckBackendSupports(const Backend& backend, const GptSpec& spec, Precision p,
                            int tensor = 1);

}  // namespace keel
