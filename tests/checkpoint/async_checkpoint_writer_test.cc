// AsyncCheckpointWriter's deferred snapshot: the staging copies a job lists are made before any
// file is written, and once WaitStaged() returns the loop may change the live memory without
// the change reaching the checkpoint (what --async-save's WaitForSnapshot before the update
// relies on).
#include "checkpoint/async_checkpoint_writer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/env.h"

namespace keel {
namespace {

namespace fs = std::filesystem;

TEST(AsyncCheckpointWriterTest, TheStagedCopiesAreTheLiveValuesAtTheStartNotAfterWaitStaged) {
  const std::string dir = ::testing::TempDir() + "/keel_async_writer_staged";
  fs::remove_all(dir);
  ASSERT_TRUE(Env::Default()->CreateDirs(dir).ok());
  // Large enough that the writer cannot have finished before the loop changes the live values.
  const size_t n = 1 << 22;
  std::vector<float> live(n, 1.0f), staging(n, 0.0f);
  AsyncCheckpointWriter writer(Env::Default(), dir, false);
  AsyncCheckpointWriter::Job job;
  job.iteration = 1;
  job.copies.push_back({live.data(), staging.data(), n});
  CheckpointFile f;
  f.name = "model.safetensors";
  f.safetensors = true;
  f.tensors.push_back({"w", {static_cast<int64_t>(n)}, staging.data()});
  job.files.push_back(std::move(f));
  writer.Start(std::move(job));
  writer.WaitStaged();
  // The loop's update, right after the wait: it must not reach the files.
  std::fill(live.begin(), live.end(), 2.0f);
  const AsyncCheckpointWriter::Result r = writer.Wait();
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  std::map<std::string, LoadedTensor> read;
  std::map<std::string, std::string> meta;
  ASSERT_TRUE(
      ReadSafetensors(Env::Default(), r.stats.path + "/model.safetensors", &read, &meta).ok());
  ASSERT_EQ(read["w"].data.size(), n);
  size_t changed = 0;
  for (float v : read["w"].data) changed += v != 1.0f;
  EXPECT_EQ(changed, 0u) << "values changed after WaitStaged() reached the checkpoint";
  // A job without copies is staged at once.
  AsyncCheckpointWriter::Job plain;
  plain.iteration = 2;
  writer.Start(std::move(plain));
  writer.WaitStaged();
  EXPECT_TRUE(writer.Wait().status.ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace keel
