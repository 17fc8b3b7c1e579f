// Which transformer layers each pipeline stage holds (and, under interleaving, each of its virtual
// chunks), and which stage holds the embedding and which the output layer (docs/pipeline.md).
//
// Methods:
//   ""             Megatron-LM's split: L / P layers per stage (the first L % P stages one more
//                  when P does not divide L, as Megatron-DeepSpeed's uniform split does); with
//                  interleaving, L / (P V) layers per chunk, virtual stage c * P + r on rank r.
//   "uniform"      DeepSpeed's partition_uniform over Megatron-DeepSpeed's layer list
//                  [embedding, L transformer layers, final norm, output layer]: equal counts of
//                  list items, the first stages one more.
//   "parameters"   DeepSpeed's partition_balanced over the same list weighted by each item's
//                  parameter count (the tied output layer counts its embedding matrix again, as
//                  DeepSpeed builds it on the last stage too).
//   "type:REGEX"   the same, each item weighing 1 if REGEX (case-insensitive, searched) matches
//                  its Megatron-DeepSpeed class name, else 0: EmbeddingPipe (embedding; also the
//                  tied output layer), ParallelTransformerLayerPipe, MixedFusedLayerNorm or
//                  MixedFusedRMSNorm (final norm), LMHeadPipe (untied output layer). BLOOM's
//                  "type:transformer|embedding" gives the first and last stage one layer fewer.
// partition_balanced is the 2021-2022 DeepSpeed one the BigScience runs used: the smallest
// bottleneck (heaviest stage) first, then each stage filled greedily up to it from the front.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/model_shape.h"
#include "core/status.h"

namespace keel {

struct StageLayers {
  int first = 0, last = 0;  // transformer layers [first, last)
  bool embedding = false;   // holds the word (and position) embedding
  bool head = false;        // holds the final norm and the output layer (the loss)
  int count() const { return last - first; }
};

// What the partition weighs: the layer count and each kind of item's parameters.
struct PartitionModel {
  int num_layers = 0;
  int64_t embedding_params = 0, layer_params = 0, final_norm_params = 0, head_params = 0;
  bool rmsnorm = false, tied_head = true;  // for the class names "type:" matches
};

// The parameter counts of `spec` (its padded vocabulary, or the vocabulary where not yet padded).
PartitionModel PartitionModelOf(const GptSpec& spec);

// The layers of every (stage, chunk): out[chunk * pipeline + stage] (virtual stage order), so
// with virtual_stages 1, out[stage]. InvalidArgument naming the method or layout and a fix for an
// unknown method, a method other than the default with interleaving, a regex that matches no
// item, or a stage left without a transformer layer.
Status PartitionStages(const std::string& method, const PartitionModel& model, int pipeline,
                       int virtual_stages, std::vector<StageLayers>* out);

// "stage 0: embedding + layers 0-4 (5), stage 1: layers 5-10 (6), ..." for notes and logs.
std::string DescribePartition(const std::vector<StageLayers>& stages, int pipeline);

}  // namespace keel
