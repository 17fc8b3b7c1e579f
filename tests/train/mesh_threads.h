// Ranks as threads for the trainer's model-parallel tests: `world` threads joined by
// MakeThreadGroup, each cut by ProcessMesh into its tensor, pipeline and data groups as keel train
// cuts MPI ranks, each with its own one-thread CPU backend.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "comm/process_mesh.h"
#include "train/trainer.h"

namespace keel_test {

// Runs fn(rank, groups, backend) on every rank at once; returns when all are done.
inline void RunOnMesh(
    int world, int tensor, int pipeline,
    const std::function<void(int, const keel::TrainerGroups&, keel::Backend*)>& fn) {
  auto comms = keel::MakeThreadGroup(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<keel::ProcessMesh> mesh;
      ASSERT_TRUE(keel::ProcessMesh::Make(comms[r].get(), tensor, pipeline, &mesh).ok());
      auto be = keel::MakeCpuBackend(1);
      const keel::TrainerGroups g{comms[r].get(), mesh->data(), mesh->tensor(), mesh->pipeline()};
      fn(r, g, be.get());
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace keel_test
