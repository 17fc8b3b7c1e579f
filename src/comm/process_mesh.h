// ProcessMesh: the world's ranks as a (pipeline x data x tensor) grid, in Megatron-LM's order:
// tensor-parallel ranks adjacent (they talk every layer, so they share a node), then data, then
// pipeline:
//
//   world rank = (pp * D + dp) * T + tp        T tensor, D data, P pipeline sizes; T * D * P =
//   world
//
// and one communicator per dimension (MPI_Comm_split of the world): `tensor` holds the T ranks of
// one (pp, dp), `data` the D ranks of one (pp, tp) (ZeRO-1 shards and gradients are reduced
// there), `pipeline` the P ranks of one (dp, tp) (activations pass along it).
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/status.h"

namespace keel {

struct MeshShape {
  int tensor = 1, pipeline = 1, data = 1;
  int world() const { return tensor * pipeline * data; }
};

struct MeshCoords {
  int tp = 0, pp = 0, dp = 0;
  // "dp 1, pp 0, tp 1": what a rank's log line and hang dump name it by.
  std::string ToString() const;
};

// The coordinates of world rank `rank`, and back.
MeshCoords CoordsOf(const MeshShape& shape, int rank);
int RankOf(const MeshShape& shape, const MeshCoords& c);

class ProcessMesh {
 public:
  // Splits `world` (which outlives the mesh) into T x P x D. The world size must be a multiple
  // of T * P (the caller validated the layout: config/parallel_layout.h).
  static Status Make(Communicator* world, int tensor, int pipeline,
                     std::unique_ptr<ProcessMesh>* out);

  const MeshShape& shape() const { return shape_; }
  const MeshCoords& coords() const { return coords_; }
  Communicator* world() const { return world_; }
  Communicator* tensor() const { return tensor_.get(); }
  Communicator* pipeline() const { return pipeline_.get(); }
  Communicator* data() const { return data_.get(); }
  bool first_stage() const { return coords_.pp == 0; }
  bool last_stage() const { return coords_.pp == shape_.pipeline - 1; }

 private:
  ProcessMesh() = default;
  MeshShape shape_;
  MeshCoords coords_;
  Communicator* world_ = nullptr;
  std::unique_ptr<Communicator> tensor_, pipeline_, data_;
};

}  // namespace keel
