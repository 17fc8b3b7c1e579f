#include "checkpoint/async_checkpoint_writer.h"

#include <algorithm>

#include "core/status.h"

namespace keel {

AsyncCheckpointWriter::AsyncCheckpointWriter(Env* env, std::string root, bool read_only)
    : env_(env), root_(std::move(root)), read_only_(read_only) {}

AsyncCheckpointWriter::~AsyncCheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

void AsyncCheckpointWriter::Start(Job job) {
  KEEL_CHECK(!thread_.joinable(), "a checkpoint save is already in flight");
  job_ = std::move(job);
  result_ = Result{};
  result_.iteration = job_.iteration;
  done_.store(false, std::memory_order_release);
  {
    std::lock_guard<std::mutex> l(staged_mu_);
    staged_ = job_.copies.empty();
  }
  thread_ = std::thread([this] { Run(); });
}

void AsyncCheckpointWriter::Run() {
  const uint64_t t0 = env_->NowMicros();
  if (!job_.copies.empty()) {
    for (const CheckpointStaging::DeferredCopy& c : job_.copies)
      std::copy(c.from, c.from + c.n, c.to);
    {
      std::lock_guard<std::mutex> l(staged_mu_);
      staged_ = true;
    }
    staged_cv_.notify_all();
  }
  std::vector<std::string>* log = &result_.log;
  CheckpointStore store(env_, root_, [log](const std::string& line) { log->push_back(line); });
  store.set_read_only(read_only_);
  if (job_.retention_first > 0) {
    Status st = store.ApplyRetention(job_.retention_first);
    if (!st.ok())
      log->push_back("WARNING: retention could not remove an old checkpoint: " + st.message());
  }
  if (job_.commit) {
    result_.status = store.Save(job_.iteration, job_.files, &result_.stats);
    // Retention after the commit, as a synchronous save does; its failure is a warning.
    if (result_.status.ok()) {
      Status st = store.ApplyRetention(job_.keep_last);
      if (!st.ok())
        log->push_back("WARNING: retention could not remove an old checkpoint: " + st.message());
    }
  } else {
    result_.status = store.WriteSaveFiles(job_.iteration, job_.files, &result_.written);
  }
  result_.seconds = static_cast<double>(env_->NowMicros() - t0) / 1e6;
  done_.store(true, std::memory_order_release);
}

void AsyncCheckpointWriter::WaitStaged() {
  std::unique_lock<std::mutex> l(staged_mu_);
  staged_cv_.wait(l, [this] { return staged_; });
}

AsyncCheckpointWriter::Result AsyncCheckpointWriter::Wait() {
  KEEL_CHECK(thread_.joinable(), "no checkpoint save is in flight");
  thread_.join();
  job_.files.clear();
  return std::move(result_);
}

}  // namespace keel
