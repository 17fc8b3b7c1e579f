#include "comm/process_mesh.h"

#include <fmt/format.h>

namespace keel {

std::string MeshCoords::ToString() const {
  return fmt::format("dp {}, pp {}, tp {}", dp, pp, tp);
}

MeshCoords CoordsOf(const MeshShape& s, int rank) {
  MeshCoords c;
  c.tp = rank % s.tensor;
  c.dp = rank / s.tensor % s.data;
  c.pp = rank / (s.tensor * s.data);
  return c;
}

int RankOf(const MeshShape& s, const MeshCoords& c) {
  return (c.pp * s.data + c.dp) * s.tensor + c.tp;
}

Status ProcessMesh::Make(Communicator* world, int tensor, int pipeline,
                         std::unique_ptr<ProcessMesh>* out) {
  const int n = world->world_size();
  if (tensor < 1 || pipeline < 1 || n % (tensor * pipeline) != 0) {
    return Status::InvalidArgument(fmt::format(
        "a world of {} ranks cannot be cut into tensor parallel {} x pipeline parallel {}: the "
        "world size must be a multiple of their product",
        n, tensor, pipeline));
  }
  std::unique_ptr<ProcessMesh> m(new ProcessMesh);
  m->world_ = world;
  m->shape_ = MeshShape{tensor, pipeline, n / (tensor * pipeline)};
  m->coords_ = CoordsOf(m->shape_, world->rank());
  const MeshShape& s = m->shape_;
  const MeshCoords& c = m->coords_;
  // Colors name the fixed coordinates, keys order the group along its own dimension.
  m->tensor_ = world->Split(c.pp * s.data + c.dp, c.tp);
  m->data_ = world->Split(c.pp * s.tensor + c.tp, c.dp);
  m->pipeline_ = world->Split(c.dp * s.tensor + c.tp, c.pp);
  *out = std::move(m);
  return Status::OK();
}

}  // namespace keel
