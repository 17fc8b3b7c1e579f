// The Adam moments a data-parallel run writes, whichever number of ranks wrote them. One process
// writes
//   optimizer.safetensors                     exp_avg.<param>, exp_avg_sq.<param>, whole tensors
// and N data-parallel ranks write one file each, in parallel, holding their shard of the flat
// parameter buffer (comm/communicator.h ShardOf):
//   optimizer.rank-001-of-004.safetensors     exp_avg.<param> (a whole tensor inside the shard) or
//                                             exp_avg.<param>[a:b] (elements a..b-1 of the
//                                             flattened tensor, 1-D), and the same for exp_avg_sq
// CheckpointTensors (checkpoint/tensor_pieces.h) reads them back as logical tensors at any
// layout, so a checkpoint of N ranks loads on M ranks with no conversion step.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/shard_range.h"
#include "model/gpt.h"

namespace keel {

// The moment file rank `rank` of `world` writes ("optimizer.safetensors" for one process).
std::string OptimizerFileName(int rank, int world);

// The tensors rank `rank` of `world` writes for moment buffer `m` (its elements [shard.begin,
// shard.end) of the flat buffer, m[0] being element shard.begin) under `prefix` ("exp_avg.").
void AppendMomentPieces(const std::vector<ParamInfo>& params, const std::string& prefix,
                        const ShardRange& shard, const float* m, std::vector<TensorView>* out);

}  // namespace keel
