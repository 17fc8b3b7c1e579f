// End-to-end resume tests of the keel binary: kill -9 at many points (inside saves, during the
// marker update, at arbitrary times), the kill switch and SIGTERM, a corrupt newest checkpoint,
// and deliberate config changes on resume. Every interrupted run, resumed with the same command,
// must print the same iteration lines (losses, LRs, grad norms; timing fields aside) and end in
// the same state fingerprint (xxh3 of weights, Adam moments and step, counters) as a run that was
// never interrupted.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "keel_process.h"
#include "keel_test_paths.h"  // KEEL_BINARY, KEEL_SOURCE_DIR, KEEL_ASSETS_DIR

namespace {

namespace fs = std::filesystem;

const char* const kModel =
    "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
    "--micro-batch-size 2 --global-batch-size 8 --lr-warmup-iters 3 --log-interval 1 "
    "--eval-interval 8 --eval-iters 1 --sample-tokens 0 --threads 1 --save-interval 4 "
    "--train-iters 24";

struct Result {
  int code = -1;  // exit code, or 128 + signal
  std::string out;
};

// Runs keel with `args` (split on spaces) and extra environment entries; `on_line` sees each
// output line as it arrives and may act on the process (pid).
Result RunKeelCmd(const std::string& args, const std::vector<std::string>& env_extra = {},
                  const std::function<void(const std::string&, pid_t)>& on_line = nullptr) {
  std::vector<std::string> argv_s = {KEEL_BINARY};
  size_t pos = 0;
  while (pos < args.size()) {
    size_t sp = args.find(' ', pos);
    if (sp == std::string::npos) sp = args.size();
    if (sp > pos) argv_s.push_back(args.substr(pos, sp - pos));
    pos = sp + 1;
  }
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    for (const std::string& e : env_extra) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv;
    for (std::string& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  Result r;
  std::string pending;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) {
    r.out.append(buf, static_cast<size_t>(n));
    pending.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      if (on_line) on_line(pending.substr(0, nl), pid);
      pending.erase(0, nl + 1);
    }
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Iteration and validation lines by iteration, without timing fields; later runs overwrite
// earlier ones (iterations after the last checkpoint are repeated by the resumed run).
void CollectLines(const std::string& out, std::map<std::string, std::string>* lines) {
  size_t pos = 0;
  while (pos < out.size()) {
    size_t nl = out.find('\n', pos);
    if (nl == std::string::npos) nl = out.size();
    const std::string line = out.substr(pos, nl - pos);
    pos = nl + 1;
    std::string key;
    if (line.rfind(" iteration ", 0) == 0) {
      key = "it " + std::to_string(std::stoi(line.substr(11, line.find('/') - 11)));
    } else if (line.rfind(" validation loss at iteration", 0) == 0) {
      key = "val " + std::to_string(std::stoi(line.substr(29, line.find('|') - 29)));
    } else {
      continue;
    }
    (*lines)[key] = keel_test::WithoutTimings(line);
  }
}

std::string Fingerprint(const std::string& out) {
  const std::string tag = "state fingerprint: ";
  const size_t p = out.rfind(tag);
  return p == std::string::npos ? "" : out.substr(p + tag.size(), 16);
}

std::string Dir(const std::string& name) {
  const std::string d =
      (fs::temp_directory_path() / ("keel_resume_" + name + "_" + std::to_string(getpid())))
          .string();
  fs::remove_all(d);
  return d;
}

std::string ReadFile(const std::string& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The uninterrupted reference, computed once.
struct Reference {
  std::map<std::string, std::string> lines;
  std::string fingerprint;
};
const Reference& Ref() {
  static const Reference* ref = [] {
    auto* r = new Reference;
    const std::string d = Dir("reference");
    Result res = RunKeelCmd(std::string(kModel) + " --save " + d);
    EXPECT_EQ(res.code, 0) << res.out;
    CollectLines(res.out, &r->lines);
    r->fingerprint = Fingerprint(res.out);
    fs::remove_all(d);
    return r;
  }();
  return *ref;
}

// Runs the same command until it completes (at most `max_runs`), the first runs with the given
// faults; returns the merged lines and the final output.
void ExpectSameAsReference(const std::map<std::string, std::string>& lines,
                           const std::string& final_out) {
  const Reference& ref = Ref();
  ASSERT_EQ(ref.lines.size(), 27u);  // 24 iteration lines + 3 validations
  EXPECT_EQ(lines, ref.lines);
  EXPECT_EQ(Fingerprint(final_out), ref.fingerprint) << final_out;
}

TEST(ResumeCliTest, KillNineInsideSavesAndMarkerUpdatesThenResumeIsBitIdentical) {
  const std::string d = Dir("crash");
  const std::string cmd = std::string(kModel) + " --save " + d;
  // Crash points: inside the first save's optimizer file, between a checkpoint's rename and the
  // marker update, in the middle of the marker's replacement, in a later save's temporary
  // directory, and inside retention's removal of an old checkpoint.
  const std::vector<std::string> faults = {
      "KEEL_FAULT_INJECTION=crash-at=2:optimizer.safetensors",
      "KEEL_FAULT_INJECTION=crash-at=1:latest_checkpointed_iteration.txt",
      "KEEL_FAULT_INJECTION=crash-at=4:latest_checkpointed_iteration.txt",
      "KEEL_FAULT_INJECTION=crash-at=3:.tmp.iter_0000016",
      "KEEL_FAULT_INJECTION=crash-at=1:iter_0000008",
  };
  std::map<std::string, std::string> lines;
  int crashes = 0;
  for (const std::string& f : faults) {
    Result r = RunKeelCmd(cmd, {f});
    CollectLines(r.out, &lines);
    if (r.code == 128 + SIGKILL) ++crashes;
    ASSERT_TRUE(r.code == 0 || r.code == 128 + SIGKILL) << f << "\n" << r.out;
    // Whatever the crash left, the directory holds no half-written checkpoint under a real name.
    for (const auto& e : fs::directory_iterator(d)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("iter_", 0) == 0 && name.find('.') == std::string::npos) {
        EXPECT_TRUE(fs::exists(e.path() / "manifest.json")) << name << " after " << f;
      }
    }
  }
  EXPECT_GE(crashes, 4);
  Result last = RunKeelCmd(cmd);
  ASSERT_EQ(last.code, 0) << last.out;
  EXPECT_NE(last.out.find("resumed from"), std::string::npos);
  CollectLines(last.out, &lines);
  ExpectSameAsReference(lines, last.out);
  fs::remove_all(d);
}

TEST(ResumeCliTest, KillNineAtArbitraryTimesThenResumeIsBitIdentical) {
  const std::string d = Dir("sigkill");
  const std::string cmd = std::string(kModel) + " --save " + d;
  std::map<std::string, std::string> lines;
  // Kill after the Nth iteration line appears (deterministic points between and around saves).
  for (int after : {3, 5, 9, 14}) {
    Result r = RunKeelCmd(cmd, {}, [after](const std::string& line, pid_t pid) {
      if (line.rfind(" iteration ", 0) == 0) {
        const int it = std::stoi(line.substr(11, line.find('/') - 11));
        if (it == after) kill(pid, SIGKILL);
      }
    });
    CollectLines(r.out, &lines);
    ASSERT_TRUE(r.code == 128 + SIGKILL || r.code == 0) << r.out;
  }
  Result last = RunKeelCmd(cmd);
  ASSERT_EQ(last.code, 0) << last.out;
  CollectLines(last.out, &lines);
  ExpectSameAsReference(lines, last.out);
  fs::remove_all(d);
}

TEST(ResumeCliTest, KillSwitchAndSigtermSaveAtTheStopIterationAndResumeContinues) {
  const std::string d = Dir("stop");
  const std::string ks = d + "-killswitch";
  fs::remove(ks);
  const std::string cmd = std::string(kModel) + " --save " + d + " --kill-switch-path " + ks;
  std::map<std::string, std::string> lines;
  // Kill switch after iteration 6 (not a save interval): a checkpoint at the stop iteration.
  Result r = RunKeelCmd(cmd, {}, [&](const std::string& line, pid_t) {
    if (line.rfind(" iteration        6/", 0) == 0) std::ofstream(ks) << "stop\n";
  });
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("kill switch " + ks + " found at iteration"), std::string::npos) << r.out;
  const std::string marker = ReadFile(d + "/latest_checkpointed_iteration.txt");
  const int stopped_at = std::stoi(marker);
  EXPECT_GE(stopped_at, 6);
  EXPECT_LT(stopped_at, 24);
  EXPECT_NE(r.out.find("stopped at iteration " + std::to_string(stopped_at)), std::string::npos);
  CollectLines(r.out, &lines);
  // With the switch still there, keel does not train.
  r = RunKeelCmd(cmd);
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("not training"), std::string::npos) << r.out;
  fs::remove(ks);

  // SIGTERM (what a scheduler sends before its grace period ends) after iteration 13.
  r = RunKeelCmd(cmd, {}, [&](const std::string& line, pid_t pid) {
    if (line.rfind(" iteration       13/", 0) == 0) kill(pid, SIGTERM);
  });
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from " + d + "/iter_"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("received SIGTERM"), std::string::npos) << r.out;
  const int term_at = std::stoi(ReadFile(d + "/latest_checkpointed_iteration.txt"));
  EXPECT_GE(term_at, 13);
  EXPECT_TRUE(fs::exists(d + "/iter_00000" + std::to_string(term_at)));
  CollectLines(r.out, &lines);

  r = RunKeelCmd(cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from " + d + "/iter_00000" + std::to_string(term_at)),
            std::string::npos)
      << r.out;
  CollectLines(r.out, &lines);
  ExpectSameAsReference(lines, r.out);
  fs::remove_all(d);
}

TEST(ResumeCliTest, CorruptNewestCheckpointFallsBackToTheNewestValidOne) {
  const std::string d = Dir("corrupt");
  const std::string cmd = std::string(kModel) + " --save " + d;
  std::map<std::string, std::string> lines;
  Result r = RunKeelCmd(cmd + " --exit-interval 12");
  ASSERT_EQ(r.code, 0) << r.out;
  CollectLines(r.out, &lines);
  // Flip a byte in the newest checkpoint's weights; leave a stray backup in the older one's
  // neighbour position (outside any checkpoint directory: allowed).
  {
    std::fstream f(d + "/iter_0000012/model.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4000);
    f.put('\x7f');
  }
  r = RunKeelCmd(cmd);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("checkpoint " + d + "/iter_0000012 is unusable"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("xxh3 checksum"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resumed from " + d + "/iter_0000008"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(d + "/iter_0000012.corrupt"));
  CollectLines(r.out, &lines);
  ExpectSameAsReference(lines, r.out);
  fs::remove_all(d);
}

TEST(ResumeCliTest, StrayFileInACheckpointIsNamedAndNotSilentlySkipped) {
  const std::string d = Dir("orig");
  const std::string cmd = std::string(kModel) + " --save " + d;
  Result r = RunKeelCmd(cmd + " --exit-interval 8");
  ASSERT_EQ(r.code, 0) << r.out;
  fs::copy_file(d + "/iter_0000008/state.json", d + "/iter_0000008/state.json.orig");
  r = RunKeelCmd(cmd + " --exit-interval 10");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("state.json.orig is not listed in"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resumed from " + d + "/iter_0000004"), std::string::npos) << r.out;
  fs::remove_all(d);
}

TEST(ResumeCliTest, ChangedScheduleIsRefusedWithADiffAndAcceptedWithItsFlag) {
  const std::string d = Dir("change");
  const std::string cmd = std::string(kModel) + " --save " + d;
  Result r = RunKeelCmd(cmd + " --exit-interval 8");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string state_before = ReadFile(d + "/iter_0000008/state.json");

  r = RunKeelCmd(cmd + " --lr 0.001");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("lr: 0.002 -> 0.001  (accept with --override-scheduler)"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find(" iteration "), std::string::npos) << "trained despite the refusal";
  EXPECT_EQ(ReadFile(d + "/iter_0000008/state.json"), state_before);

  r = RunKeelCmd(cmd + " --seed 7");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--override-data-order"), std::string::npos) << r.out;

  r = RunKeelCmd(cmd + " --hidden-size 64 --override-scheduler --override-data-order");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("hidden-size: 32 -> 64  (model shape: cannot change on resume)"),
            std::string::npos)
      << r.out;

  r = RunKeelCmd(cmd + " --lr 0.001 --override-scheduler --exit-interval 12");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("accepted change on resume: lr: 0.002 -> 0.001 (--override-scheduler)"),
            std::string::npos)
      << r.out;
  nlohmann::json s = nlohmann::json::parse(ReadFile(d + "/iter_0000012/state.json"));
  ASSERT_TRUE(s["history"].is_array());
  bool journaled = false;
  for (const auto& e : s["history"])
    if (e.value("event", "") == "resume" && e.contains("accepted_changes") &&
        e["accepted_changes"][0]["key"] == "lr")
      journaled = true;
  EXPECT_TRUE(journaled) << s["history"].dump();
  fs::remove_all(d);
}

TEST(ResumeCliTest, LrScaleOnResumeScalesTheLearningRateFromThereOn) {
  const std::string d = Dir("scale");
  const std::string cmd = std::string(kModel) + " --save " + d;
  Result r = RunKeelCmd(cmd + " --exit-interval 8");
  ASSERT_EQ(r.code, 0) << r.out;
  r = RunKeelCmd(cmd + " --lr-scale-on-resume 0.5 --exit-interval 12");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("LR scale 1 -> 0.5 (--lr-scale-on-resume)"), std::string::npos) << r.out;
  std::map<std::string, std::string> lines;
  CollectLines(r.out, &lines);
  auto lr_of = [](const std::string& line) {
    const size_t p = line.find("learning rate: ");
    return std::stod(line.substr(p + 15, line.find(' ', p + 15) - p - 15));
  };
  const double ref_lr = lr_of(Ref().lines.at("it 10"));
  EXPECT_NEAR(lr_of(lines.at("it 10")), 0.5 * ref_lr, 1e-3 * ref_lr);
  // Without the flag, a later resume keeps the checkpoint's scale (never silently dropped).
  r = RunKeelCmd(cmd + " --exit-interval 16");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("LR scale 0.5 (loaded"), std::string::npos) << r.out;
  fs::remove_all(d);
}

TEST(ResumeCliTest, LoadingAnOlderCheckpointOfTheRunRollsBackInOneCommand) {
  const std::string d = Dir("rollback");
  const std::string cmd = std::string(kModel) + " --keep-last-checkpoints 0 --save " + d;
  Result r = RunKeelCmd(cmd + " --exit-interval 12");
  ASSERT_EQ(r.code, 0) << r.out;
  r = RunKeelCmd(cmd + " --load " + d + "/iter_0000004");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("rolling back to iter_0000004: moved the newer iter_0000012 to " + d +
                       "/iter_0000012.rolled-back"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("resumed from " + d + "/iter_0000004"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(d + "/iter_0000008.rolled-back/manifest.json"));
  // Deterministic training: the rolled-back run reaches the reference's bits again.
  EXPECT_EQ(Fingerprint(r.out), Ref().fingerprint);
  nlohmann::json s = nlohmann::json::parse(ReadFile(d + "/iter_0000024/state.json"));
  EXPECT_EQ(s["history"].back()["event"], "rollback") << s["history"].dump();

  // --load of another directory while --save holds a run is refused: one without checkpoints
  // (which alone would start fresh, as in Megatron) and one with another run's.
  r = RunKeelCmd(cmd + " --load /tmp");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--save " + d + " holds checkpoints of a run"), std::string::npos) << r.out;
  fs::remove_all(d);
}

}  // namespace
