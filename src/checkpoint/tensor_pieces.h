// The tensors of a checkpoint as pieces, whatever layout (tensor T x pipeline P x data D ranks)
// wrote them, and read back at any other layout with no conversion step.
//
// Files, named by the writer's coordinates (rank 0 of each dimension counts from 0):
//   model.tp-01-of-02.pp-000-of-004.safetensors       the weights of the layers of stage pp, the
//                                                     slice tensor rank tp holds (data rank 0
//                                                     writes them; its replicas hold the same)
//   optimizer.tp-01-of-02.pp-000-of-004.dp-003-of-008.safetensors
//                                                     the Adam moments that data rank dp holds of
//                                                     those slices (ZeRO-1: element ranges)
// At T = P = 1 the names are those of a data-parallel or single-process run (model.safetensors,
// optimizer.safetensors, optimizer.rank-R-of-N.safetensors), which the reader reads the same way.
//
// Tensor names stay layout-free ("layers.3.mlp.dense_h_to_4h.weight", "exp_avg.<name>", and
// "exp_avg.<name>[a:b]" for elements a..b-1 of the flattened slice). Each file's safetensors
// metadata key "keel.pieces" maps every tensor of the file to what it is a piece of:
//   {"<tensor>": {"shape": [full shape], "split_dim": d, "parts": [...], "rank": r, "of": T}}
// (model/tensor_split.h: the slice rank r of T holds). A tensor without an entry (a checkpoint
// of an older keel) is the whole tensor, or an element range of it. Replicated tensors (norms,
// row-parallel biases) are written once, by tensor rank 0, as "rank 0 of 1".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_store.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "config/model_shape.h"
#include "core/env.h"
#include "core/status.h"
#include "model/tensor_split.h"

namespace keel {

// Where a rank sits in the layout a checkpoint is saved at (comm/process_mesh.h's coordinates).
struct PieceCoords {
  int tp = 0, tensor = 1;    // tensor-parallel rank of T
  int pp = 0, pipeline = 1;  // pipeline stage of P
  int dp = 0, data = 1;      // data-parallel rank of D
};

// "T=2 x P=2 x D=1".
std::string LayoutText(int tensor, int pipeline, int data);

// The weights file of position (tp, pp), and the moment file of (tp, pp, dp).
std::string WeightsFileName(const PieceCoords& c);
std::string MomentsFileName(const PieceCoords& c);
// Parses either kind of name (any layout, the old names included); false for any other file.
// For a weights file, c->dp and c->data are 0 and 1.
bool ParsePieceFileName(const std::string& name, bool* moments, PieceCoords* c);

// One tensor a rank holds: its slice (tensor_rank of tensor_size) of the full tensor `name`.
// A trainer fills one per parameter of its stage (GptModel's ParamInfo gives name and slice).
struct LocalTensor {
  std::string name;                 // layout-free: "layers.3.mlp.dense_h_to_4h.weight"
  std::vector<int64_t> full_shape;  // of the whole tensor
  TensorSplit split;                // how the tensor is cut across tensor ranks (TensorSplitOf)
  int tensor_rank = 0, tensor_size = 1;
  float* weights = nullptr;  // the slice, row-major (ShardShape); null: weights not written/read
  // The Adam moments this data rank holds: elements [moment_begin, moment_end) of the flattened
  // slice (ZeRO-1's shard of it; all of it when the optimizer is not sharded), each
  // moment_end - moment_begin floats. Empty (begin == end): none.
  size_t moment_begin = 0, moment_end = 0;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  // false for a copy another rank writes (the tied embedding's copy on the last stage): the
  // pieces of a checkpoint never overlap.
  bool owner = true;

  size_t slice_numel() const;
};

// The safetensors files rank `c` writes for its tensors (one file per call, as named above): its
// data rank 0 writes the weights file, every rank its moment file (`with_moments`). Replicated
// tensors are written by tensor rank 0 only. Tensor data is read in place when the files are
// written (CheckpointStore::WriteSaveFiles), so it must not change until then. InvalidArgument
// when a tensor does not belong to this position (another T, a bad slice, a missing pointer).
Status BuildPieceFiles(const PieceCoords& c, const std::vector<LocalTensor>& tensors,
                       bool with_moments, std::vector<CheckpointFile>* out);

// Reads the tensors of checkpoint `dir` as full tensors or as the slice any rank of any layout
// needs. Files are mapped (only what is read is paged in); the pieces of each tensor are checked
// to tile it exactly when opened.
class CheckpointTensors {
 public:
  struct Options {
    // Checks each file's xxh3 against the manifest before its first read (a rank reading its
    // slices checks only the files they lie in). Off where the directory was verified already.
    bool checksums = true;
  };

  CheckpointTensors() = default;
  CheckpointTensors(CheckpointTensors&&) = default;
  CheckpointTensors& operator=(CheckpointTensors&&) = default;

  // Opens the piece files `dir`'s manifest lists: Corruption naming the file when one is missing,
  // its size is not the manifest's, the files of the layout are incomplete or mixed (another T
  // beside them), or a header is malformed; naming the tensor (and files) when its pieces disagree
  // on its full shape or split, leave a gap or overlap, or are not F32.
  static Status Open(Env* env, const std::string& dir, const Options& options,
                     CheckpointTensors* out);
  static Status Open(Env* env, const std::string& dir, CheckpointTensors* out) {
    return Open(env, dir, Options(), out);
  }

  const std::string& dir() const { return dir_; }
  // The layout the checkpoint was saved at, from its files (data: the moment files' D).
  int tensor_size() const { return tensor_; }
  int pipeline_size() const { return pipeline_; }
  int data_size() const { return data_; }
  std::string layout() const { return LayoutText(tensor_, pipeline_, data_); }
  bool has_moments() const { return data_ > 0; }
  // Every tensor: weights by parameter name, moments as "exp_avg.<name>", "exp_avg_sq.<name>".
  std::vector<std::string> Names() const;
  bool Has(const std::string& name) const { return tensors_.count(name) > 0; }
  // The full shape of `name` (which must exist).
  const std::vector<int64_t>& FullShape(const std::string& name) const;
  // Tensor `name` in place (in the mapped file) when one piece holds all of it, else nullptr.
  const float* Whole(const std::string& name) const;

  // Checks the checkpoint holds exactly the model `spec`'s tensors (GptModel::ParamLayout): every
  // weight, and with `moments` both moments, of its full shape, each cut as TensorSplitOf says,
  // and nothing else. Corruption naming the tensor otherwise.
  Status CheckModel(const GptSpec& spec, bool moments) const;

  // Copies elements [begin, end) of the flattened slice (rank of tensor, cut by `split`) of
  // tensor `name` to dst, reading only the pieces it overlaps. tensor 1 (or a replicated split)
  // is the full tensor. Corruption naming the file and tensor when a file it reads fails its
  // checksum; InvalidArgument for an unknown tensor or a slice that does not divide.
  Status Read(const std::string& name, const TensorSplit& split, int rank, int tensor, size_t begin,
              size_t end, float* dst) const;
  // The whole tensor.
  Status ReadFull(const std::string& name, float* dst) const;

 private:
  struct Piece {
    int file = 0;
    size_t begin = 0, end = 0;  // element range within the flattened slice
    const float* data = nullptr;
  };
  struct Tensor {
    std::vector<int64_t> shape;  // full
    TensorSplit split;           // replicated when tensor == 1
    int tensor = 1;
    std::vector<std::vector<Piece>> ranks;  // per tensor rank, sorted by begin
    std::string first_file;                 // for messages
  };
  Status CopyRange(const std::string& name, const Tensor& t, int rank, size_t from, size_t to,
                   float* dst) const;
  Status VerifyFile(int file, const std::string& tensor) const;

  std::string dir_;
  int tensor_ = 1, pipeline_ = 1, data_ = 0;
  std::vector<MappedSafetensors> files_;
  std::vector<ManifestEntry> entries_;  // per file: the manifest's size and checksum
  mutable std::vector<char> verified_;  // per file: checksum checked (or not to be checked)
  std::map<std::string, Tensor> tensors_;
};

// Fills each tensor's slice (and, with `moments`, its moment range) from `ckpt`, whatever layout
// wrote it. Corruption naming the tensor when the checkpoint lacks it or its full shape differs.
Status FillLocalTensors(const CheckpointTensors& ckpt, bool moments,
                        const std::vector<LocalTensor>& tensors);

// What a rank at `now` loading `ckpt` logs: "note: ... saved at T=2 x P=2 x D=1, loaded at
// T=1 x P=1 x D=1: ... resharded", or "" when the layouts are the same.
std::string ReshardNote(const CheckpointTensors& ckpt, const PieceCoords& now);

// Every tensor of `ckpt` whole, by name (weights by parameter name, moments "exp_avg.<name>"):
// in place when one piece holds it (valid while `ckpt` lives), else joined into `storage`.
// For the tools.
struct FullTensors {
  std::map<std::string, TensorRef> weights, moments;
  std::map<std::string, std::vector<float>> storage;
};
Status ReadAllFull(const CheckpointTensors& ckpt, FullTensors* out);

}  // namespace keel
