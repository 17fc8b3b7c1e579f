// The Adam moments of a checkpoint, whichever number of ranks wrote them. One process writes
//   optimizer.safetensors                     exp_avg.<param>, exp_avg_sq.<param>, whole tensors
// and N data-parallel ranks write one file each, in parallel, holding their shard of the flat
// parameter buffer (comm/communicator.h ShardOf):
//   optimizer.rank-001-of-004.safetensors     exp_avg.<param> (a whole tensor inside the shard) or
//                                             exp_avg.<param>[a:b] (elements a..b-1 of the
//                                             flattened tensor, 1-D), and the same for exp_avg_sq
// A reader sees logical tensors by name and copies any element range of them, so a checkpoint of
// N ranks loads on M ranks (each reads what its new shard needs) and the tools compare
// checkpoints of different world sizes, with no conversion step.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/env.h"
#include "core/shard_range.h"
#include "core/status.h"
#include "model/gpt.h"

namespace keel {

// The moment file rank `rank` of `world` writes ("optimizer.safetensors" for one process).
std::string OptimizerFileName(int rank, int world);
// Whether `name` is one of the moment files above (any world size).
bool IsOptimizerFileName(const std::string& name);

// The tensors rank `rank` of `world` writes for moment buffer `m` (its elements [shard.begin,
// shard.end) of the flat buffer, m[0] being element shard.begin) under `prefix` ("exp_avg.").
void AppendMomentPieces(const std::vector<ParamInfo>& params, const std::string& prefix,
                        const ShardRange& shard, const float* m, std::vector<TensorView>* out);

class OptimizerMoments {
 public:
  // Maps every moment file of checkpoint `dir` listed in `files` (its manifest's names) and
  // checks that for each parameter of `params` both moments are there exactly once: the pieces
  // of each tile the tensor with no gap or overlap, F32, and nothing else is in the files.
  // Corruption naming the file and tensor otherwise.
  static Status Open(Env* env, const std::string& dir, const std::vector<std::string>& files,
                     const std::vector<ParamInfo>& params, OptimizerMoments* out);

  // Copies elements [from, to) of the flattened tensor `name` (e.g. "exp_avg.final_layernorm.
  // weight") to dst (host memory).
  void Copy(const std::string& name, size_t from, size_t to, float* dst) const;
  // Tensor `name` in place (in the mapped file) when one piece holds all of it: every tensor of a
  // one-process checkpoint, those inside one rank's shard otherwise; nullptr when it is cut.
  const float* Whole(const std::string& name) const;
  // Copies elements [shard.begin, shard.end) of the flat buffer of moment `prefix` to dst.
  void CopyShard(const std::vector<ParamInfo>& params, const std::string& prefix,
                 const ShardRange& shard, float* dst) const;
  // How many files the moments were written in (the writers' world size).
  int num_files() const { return static_cast<int>(files_.size()); }

 private:
  struct Piece {
    size_t begin = 0, end = 0;  // element range within the flattened tensor
    const float* data = nullptr;
  };
  std::vector<MappedSafetensors> files_;
  std::map<std::string, std::vector<Piece>> pieces_;  // by logical name, sorted by begin
};

}  // namespace keel
