#include "config/parallel_layout.h"

#include <fmt/format.h>

namespace keel {

int64_t PaddedVocabFor(int64_t vocab, int64_t divisible_by, int tensor) {
  const int64_t m = divisible_by * tensor;
  return m <= 0 ? vocab : (vocab + m - 1) / m * m;
}

Status CheckParallelLayout(const TrainConfig& c, int world, const std::string& world_what,
                           int tensor, int pipeline, int layers_per_virtual_stage,
                           ParallelLayout* out, std::vector<std::string>* notes) {
  auto invalid = [](std::string m) { return Status::InvalidArgument(std::move(m)); };
  if (tensor < 1)
    return invalid(fmt::format("--tensor-model-parallel-size {} must be at least 1", tensor));
  if (pipeline < 1)
    return invalid(fmt::format("--pipeline-model-parallel-size {} must be at least 1", pipeline));
  if (world % (tensor * pipeline) != 0) {
    return invalid(fmt::format(
        "{} is not a multiple of tensor parallel {} x pipeline parallel {} = {}: every model "
        "replica needs TP x PP ranks; change the number of ranks or the parallel sizes",
        world_what, tensor, pipeline, tensor * pipeline));
  }
  ParallelLayout l;
  l.tensor = tensor, l.pipeline = pipeline, l.data = world / (tensor * pipeline);
  const GptSpec& m = c.model;
  if (m.heads % tensor != 0 || m.ffn_hidden % tensor != 0) {
    return invalid(fmt::format(
        "--tensor-model-parallel-size {} must divide --num-attention-heads {} and the FFN size {}: "
        "each rank holds whole heads and an equal slice of the MLP",
        tensor, m.heads, m.ffn_hidden));
  }
  if (m.KvHeads() % tensor != 0) {
    return invalid(fmt::format(
        "--tensor-model-parallel-size {} must divide --num-query-groups {}: each rank holds whole "
        "key/value heads (as Megatron-LM requires)",
        tensor, m.KvHeads()));
  }
  if (c.pad_vocab_size_to > 0 && c.pad_vocab_size_to % tensor != 0) {
    return invalid(fmt::format(
        "--pad-vocab-size-to {} is not a multiple of --tensor-model-parallel-size {}: each rank "
        "holds an equal slice of the vocabulary; pad to a multiple of {}",
        c.pad_vocab_size_to, tensor, tensor));
  }
  l.padded_vocab = c.pad_vocab_size_to > 0
                       ? c.pad_vocab_size_to
                       : PaddedVocabFor(m.vocab, c.make_vocab_size_divisible_by, tensor);
  if (tensor > 1 && c.pad_vocab_size_to == 0 && m.vocab > 0) {
    notes->push_back(
        fmt::format("vocab {} padded to {} (multiple of --make-vocab-size-divisible-by {} x tensor "
                    "parallel {})",
                    m.vocab, l.padded_vocab, c.make_vocab_size_divisible_by, tensor));
  }
  if (m.num_layers < pipeline) {
    return invalid(fmt::format(
        "--pipeline-model-parallel-size {} is larger than --num-layers {}: every pipeline stage "
        "needs at least one layer; use a pipeline size of at most {}",
        pipeline, m.num_layers, m.num_layers));
  }
  if (m.num_layers % pipeline != 0 && layers_per_virtual_stage == 0) {
    notes->push_back(fmt::format(
        "{} layers over {} pipeline stages: {} stages of {} and {} of {} (Megatron-DeepSpeed's "
        "uniform partition; Megatron-LM needs --num-layers divisible by the pipeline size)",
        m.num_layers, pipeline, m.num_layers % pipeline, m.num_layers / pipeline + 1,
        pipeline - m.num_layers % pipeline, m.num_layers / pipeline));
  }
  const int64_t unit = int64_t{c.micro_batch_size} * l.data;
  if (c.global_batch_size % unit != 0) {
    return invalid(fmt::format(
        "--global-batch-size {} is not divisible by --micro-batch-size {} x data-parallel size {} "
        "= {} ({} / (TP {} x PP {})): change the batch, the micro-batch or the layout",
        c.global_batch_size, c.micro_batch_size, l.data, unit, world_what, tensor, pipeline));
  }
  l.micro_batches = c.global_batch_size / unit;
  if (layers_per_virtual_stage < 0) {
    return invalid(fmt::format("--num-layers-per-virtual-pipeline-stage {} must be positive",
                               layers_per_virtual_stage));
  }
  if (layers_per_virtual_stage > 0) {
    if (pipeline < 2) {
      return invalid(
          "--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size of at "
          "least 2: the interleaved schedule cuts each stage's layers into chunks");
    }
    const int64_t per_stage = m.num_layers / pipeline;
    if (m.num_layers % pipeline != 0 || per_stage % layers_per_virtual_stage != 0) {
      return invalid(fmt::format(
          "--num-layers {} is not pipeline size {} x a multiple of "
          "--num-layers-per-virtual-pipeline-stage {}: every stage holds the same number of "
          "chunks of that many layers",
          m.num_layers, pipeline, layers_per_virtual_stage));
    }
    if (l.micro_batches % pipeline != 0) {
      return invalid(fmt::format(
          "the interleaved schedule needs the micro-batches per data rank ({} = global batch {} / "
          "(micro-batch {} x data-parallel {})) to be a multiple of the pipeline size {} "
          "(Megatron-LM's rule); change the batch or drop "
          "--num-layers-per-virtual-pipeline-stage",
          l.micro_batches, c.global_batch_size, c.micro_batch_size, l.data, pipeline));
    }
    l.layers_per_virtual_stage = layers_per_virtual_stage;
    l.virtual_stages = static_cast<int>(per_stage / layers_per_virtual_stage);
  }
  if (pipeline > 1 && l.micro_batches < pipeline) {
    notes->push_back(fmt::format(
        "{} micro-batches per data rank for {} pipeline stages: the pipeline is never full (the "
        "bubble is (P-1)/(m+P-1) = {:.0f}% of the iteration); more micro-batches shrink it",
        l.micro_batches, pipeline, 100.0 * (pipeline - 1) / (l.micro_batches + pipeline - 1)));
  }
  *out = l;
  return Status::OK();
}

}  // namespace keel
