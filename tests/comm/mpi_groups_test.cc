// The MPI communicator's groups and point to point: the test launches itself under
// `mpirun -np 4` (T 2 x P 2) and each rank checks its groups, an all-reduce in rank order and a
// send along the pipeline group.
#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "../cli/keel_process.h"
#include "comm/mpi_communicator.h"
#include "comm/process_mesh.h"

namespace keel {
namespace {

std::string SelfPath() {
  char buf[PATH_MAX] = {0};
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

TEST(MpiGroupsTest, GroupsAllReduceAndPointToPointOnFourRanks) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) {
    if (keel_test::RunShell("command -v mpirun").code != 0) GTEST_SKIP() << "no mpirun";
    const keel_test::KeelResult r = keel_test::RunShell(keel_test::Mpirun(4, "", 60) + SelfPath() +
                                                        " --gtest_filter=MpiGroupsTest.*");
    EXPECT_EQ(r.code, 0) << r.out;
    return;
  }
  std::unique_ptr<Communicator> world;
  ASSERT_TRUE(MakeCommunicatorFromEnvironment(&world).ok());
  if (world->world_size() == 1) GTEST_SKIP() << "a build without MPI";
  ASSERT_EQ(world->world_size(), 4);
  std::unique_ptr<ProcessMesh> mesh;
  ASSERT_TRUE(ProcessMesh::Make(world.get(), 2, 2, &mesh).ok());
  const int r = world->rank();
  const MeshCoords c = mesh->coords();
  EXPECT_EQ(mesh->tensor()->rank(), c.tp);
  EXPECT_EQ(mesh->pipeline()->rank(), c.pp);
  EXPECT_EQ(mesh->data()->world_size(), 1);
  // Tensor group of world ranks {2 pp, 2 pp + 1}: 1e8 + 1 - ... in rank order.
  std::vector<float> v(5, c.tp == 0 ? 1e8f : 1.0f);
  mesh->tensor()->AllReduceSum(v.data(), v.size());
  for (float x : v) EXPECT_EQ(x, 1e8f + 1.0f);
  // Sequence parallelism's pair on the tensor group: chunk k of the sum lands on rank k.
  std::vector<float> full = {c.tp == 0 ? 1e8f : 1.0f, 2.0f, c.tp == 0 ? 1e8f : -1e8f, 3.0f};
  std::vector<float> chunk(2), back(4);
  mesh->tensor()->ReduceScatterChunks(full.data(), chunk.data(), 2);
  EXPECT_EQ(chunk,
            c.tp == 0 ? (std::vector<float>{1e8f + 1.0f, 4.0f}) : (std::vector<float>{0.0f, 6.0f}));
  mesh->tensor()->AllGatherChunks(chunk.data(), back.data(), 2);
  EXPECT_EQ(back, (std::vector<float>{1e8f + 1.0f, 4.0f, 0.0f, 6.0f}));
  std::vector<std::string> members;
  mesh->tensor()->AllGatherBytes(std::to_string(r), &members);
  EXPECT_EQ(members,
            (std::vector<std::string>{std::to_string(r - c.tp), std::to_string(r - c.tp + 1)}));
  // Stage 0 sends its world rank to stage 1 of the same tensor coordinate.
  float msg = static_cast<float>(r);
  if (mesh->first_stage()) {
    mesh->pipeline()->Send(&msg, 1, 1);
  } else {
    mesh->pipeline()->Recv(&msg, 1, 0);
    EXPECT_EQ(msg, static_cast<float>(r - 2));
  }
  mesh.reset();
  world->Barrier();
}

}  // namespace
}  // namespace keel
