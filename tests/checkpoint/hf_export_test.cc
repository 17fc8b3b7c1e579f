// `keel ckpt export PATH --hf OUT`, checked against an independent reader: tiny models are trained
// with the keel binary, exported, and run through tests/checkpoint/hf_gpt2_reference.py (a numpy
// GPT-2 written from the Hugging Face definition that parses the safetensors file itself); its
// logits must match keel's own forward pass on the same tokens. The weights start at std 0.2 so
// that attention is far from uniform and the GELU's tails matter: the check then tells a wrong
// attention scale or GELU variant apart (asserted below). Needs python3 with numpy
// (scripts/test.sh installs python3-numpy): the tests fail, not skip, without them.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/train_checkpoint.h"
#include "keel_test_paths.h"  // KEEL_BINARY, KEEL_SOURCE_DIR, KEEL_ASSETS_DIR

namespace keel {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Result {
  int code;
  std::string out;  // stdout (and stderr unless redirected elsewhere)
};

Result Run(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  Result r{-1, ""};
  if (!p) return r;
  std::array<char, 65536> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

Result RunKeel(const std::string& args) {
  return Run(std::string(KEEL_BINARY) + " " + args + " 2>&1");
}

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string TempDir(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("keel_hf_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// A python3 that can import numpy: $KEEL_PYTHON, python3 on PATH, or Debian's /usr/bin/python3
// (where python3-numpy installs). Empty if none.
std::string PythonWithNumpy() {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("KEEL_PYTHON"); p != nullptr && p[0] != '\0')
    candidates.push_back(p);
  candidates.push_back("python3");
  candidates.push_back("/usr/bin/python3");
  for (const std::string& c : candidates)
    if (Run(c + " -c 'import numpy' >/dev/null 2>&1").code == 0) return c;
  return "";
}

#define REQUIRE_PYTHON_NUMPY(var)                                                            \
  const std::string var = PythonWithNumpy();                                                 \
  ASSERT_FALSE(var.empty()) << "python3 with numpy is required by the HF export tests (the " \
                               "independent reference reader); run scripts/test.sh, which "  \
                               "installs python3-numpy"

// Run directories shared by the tests of this process, removed at exit.
struct RunCache {
  std::map<std::string, std::string> runs;
  ~RunCache() {
    for (const auto& [name, dir] : runs) fs::remove_all(dir);
  }
};

// Trains a tiny model once per name; returns its run directory.
std::string TrainedRun(const std::string& name, const std::string& args) {
  static RunCache cache;
  std::map<std::string, std::string>& runs = cache.runs;
  auto it = runs.find(name);
  if (it != runs.end()) return it->second;
  const std::string dir = TempDir("run_" + name);
  Result r = RunKeel(
      "train --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
      "--micro-batch-size 2 --lr-warmup-iters 1 --init-method-std 0.2 --eval-iters 0 "
      "--sample-tokens 0 --log-interval "
      "1 " +
      args + " --save " + dir);
  EXPECT_EQ(r.code, 0) << r.out;
  if (r.code != 0) {
    fs::remove_all(dir);
    return "";
  }
  runs[name] = dir;
  return dir;
}

const std::string kGpt2Args = "--tokenizer gpt2 --train-iters 4";
const std::string kSpArgs =
    "--train-iters 4 --ffn-hidden-size 96 --max-position-embeddings 48 --layernorm-epsilon 1e-6";

// Keel's logits for `tokens` at `positions`, from the checkpoint through the library.
std::vector<std::vector<float>> KeelLogits(const std::string& run,
                                           const std::vector<int32_t>& tokens,
                                           const std::vector<int>& positions) {
  std::unique_ptr<Backend> be = MakeCpuBackend(1);
  LoadedModel m;
  Status st = LoadModelFromCheckpoint(
      Env::Default(), run, be.get(), [](const std::string&) {}, &m);
  EXPECT_TRUE(st.ok()) << st.message();
  if (!st.ok()) return {};
  m.model->Forward(tokens.data(), nullptr, 1, static_cast<int>(tokens.size()), 0.0f);
  std::vector<std::vector<float>> out;
  for (int p : positions) out.push_back(m.model->LogitsAt(0, p));
  return out;
}

// Runs the reference reader; returns its JSON (null on failure, with a test failure).
json Reference(const std::string& python, const std::string& folder,
               const std::vector<int32_t>& tokens, const std::vector<int>& positions) {
  auto join = [](const auto& v) {
    std::string s;
    for (const auto& x : v) {
      if (!s.empty()) s += ',';
      s += std::to_string(x);
    }
    return s;
  };
  const std::string tok = join(tokens), pos = join(positions);
  const std::string script =
      std::string(KEEL_SOURCE_DIR) + "/tests/checkpoint/hf_gpt2_reference.py";
  Result r = Run(python + " " + script + " " + folder + " --tokens " + tok + " --positions " + pos +
                 " 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  if (r.code != 0) return nullptr;
  json j = json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out.substr(0, 500);
  return j.is_discarded() ? json(nullptr) : j;
}

struct Comparison {
  double max_diff = 0;   // largest |keel - reference| over every compared logit
  double max_ratio = 0;  // largest row's max |keel - reference| / max(1, max |reference|)
};

// Compares keel's logits with the reference's row by row.
Comparison CompareLogits(const std::vector<std::vector<float>>& keel, const json& ref, int vocab) {
  Comparison c;
  EXPECT_EQ(ref.at("vocab_size").get<int>(), vocab);
  const json& rows = ref.at("logits");
  EXPECT_EQ(rows.size(), keel.size());
  for (size_t i = 0; i < keel.size() && i < rows.size(); ++i) {
    const std::vector<double> r = rows[i].get<std::vector<double>>();
    EXPECT_EQ(r.size(), keel[i].size());
    EXPECT_EQ(static_cast<int>(r.size()), vocab);
    double scale = 1.0, row_diff = 0;
    for (double v : r) scale = std::max(scale, std::abs(v));
    for (size_t j = 0; j < r.size() && j < keel[i].size(); ++j)
      row_diff = std::max(row_diff, std::abs(r[j] - static_cast<double>(keel[i][j])));
    c.max_diff = std::max(c.max_diff, row_diff);
    c.max_ratio = std::max(c.max_ratio, row_diff / scale);
  }
  return c;
}

constexpr double kTolerance = 1e-4;  // relative to the row's largest |logit| (at least 1)

// A copy of the exported folder whose config.json has `key` set to `value` (weights linked).
std::string AlteredConfig(const std::string& folder, const std::string& key, const json& value) {
  const std::string dir = folder + "_" + key;
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::create_symlink(fs::absolute(folder + "/model.safetensors"), dir + "/model.safetensors");
  json cfg = json::parse(Slurp(folder + "/config.json"));
  cfg[key] = value;
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  return dir;
}

const std::vector<int32_t> kGpt2Tokens = {464,   6766, 318,  257, 1263,  11, 290, 262,
                                          43170, 373,  2330, 13,  50256, 40, 716, 1049};
const std::vector<int32_t> kSpTokens = {5, 17, 400, 33, 2, 1000, 4095, 61, 7, 250, 3, 12, 99, 1};
const std::vector<int> kPositions = {0, 5, 11, 13};

TEST(HfExportTest, Gpt2TokenizerModelMatchesIndependentReader) {
  REQUIRE_PYTHON_NUMPY(python);
  const std::string run = TrainedRun("gpt2", kGpt2Args);
  ASSERT_FALSE(run.empty());
  const std::string out = TempDir("gpt2") + "/hf";
  Result r = RunKeel("ckpt export " + run + " --hf " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("exported " + run + "/iter_0000004 to " + out), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("28 tensors"), std::string::npos) << r.out;  // 2 + 12 per layer + 2
  EXPECT_NE(r.out.find("sliced from padded 50304 to 50257 rows"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.safetensors"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("no Hugging Face tokenizer files"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out + ".tmp"));

  const json cfg = json::parse(Slurp(out + "/config.json"));
  EXPECT_EQ(cfg["model_type"], "gpt2");
  EXPECT_EQ(cfg["architectures"], json({"GPT2LMHeadModel"}));
  EXPECT_EQ(cfg["n_layer"], 2);
  EXPECT_EQ(cfg["n_embd"], 64);
  EXPECT_EQ(cfg["n_head"], 4);
  EXPECT_TRUE(cfg["n_inner"].is_null()) << cfg.dump();  // FFN = 4h
  EXPECT_EQ(cfg["n_positions"], 32);
  EXPECT_EQ(cfg["n_ctx"], 32);
  EXPECT_EQ(cfg["vocab_size"], 50257);
  EXPECT_EQ(cfg["activation_function"], "gelu_new");
  EXPECT_EQ(cfg["layer_norm_epsilon"].get<double>(), 1e-5);
  EXPECT_EQ(cfg["bos_token_id"], 50256);
  EXPECT_EQ(cfg["eos_token_id"], 50256);
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  EXPECT_EQ(cfg["scale_attn_weights"], true);
  EXPECT_EQ(cfg["torch_dtype"], "float32");

  // Tokenizer files: vocab.json has vocab_size entries, merges.txt the version line.
  const json vocab = json::parse(Slurp(out + "/vocab.json"));
  EXPECT_EQ(vocab.size(), 50257u);
  EXPECT_EQ(vocab["<|endoftext|>"], 50256);
  EXPECT_EQ(Slurp(out + "/merges.txt").rfind("#version: 0.2\n", 0), 0u);
  const json special = json::parse(Slurp(out + "/special_tokens_map.json"));
  EXPECT_EQ(special["eos_token"], "<|endoftext|>");
  const json tcfg = json::parse(Slurp(out + "/tokenizer_config.json"));
  EXPECT_EQ(tcfg["tokenizer_class"], "GPT2Tokenizer");

  const json ref = Reference(python, out, kGpt2Tokens, kPositions);
  ASSERT_FALSE(ref.is_null());
  EXPECT_EQ(ref["metadata"], json({{"format", "pt"}}));
  const auto keel = KeelLogits(run, kGpt2Tokens, kPositions);
  const Comparison c = CompareLogits(keel, ref, 50257);
  EXPECT_LE(c.max_ratio, kTolerance) << "max |keel - reference| " << c.max_diff;
  std::printf(
      "[ measured ] gpt2 variant: max |keel - reference| logit difference %.3g (%.3g of "
      "the largest |logit|)\n",
      c.max_diff, c.max_ratio);
  // The comparison has the power to tell the GELU variants and the attention scale apart (the
  // weights are initialised large enough for attention and the GELU's tails to matter).
  for (const auto& [key, value] : {std::pair<std::string, json>{"activation_function", "gelu"},
                                   {"scale_attn_weights", false}}) {
    const json wrong = Reference(python, AlteredConfig(out, key, value), kGpt2Tokens, kPositions);
    ASSERT_FALSE(wrong.is_null());
    const double ratio = CompareLogits(keel, wrong, 50257).max_ratio;
    EXPECT_GT(ratio, kTolerance) << key << " = " << value.dump() << " went unnoticed";
    std::printf("[ measured ] with %s = %s the reference is off by %.3g of the largest |logit|\n",
                key.c_str(), value.dump().c_str(), ratio);
  }
  fs::remove_all(fs::path(out).parent_path());
}

TEST(HfExportTest, FfnNot4hSentencepieceModelMatchesIndependentReader) {
  REQUIRE_PYTHON_NUMPY(python);
  const std::string run = TrainedRun("sp", kSpArgs);
  ASSERT_FALSE(run.empty());
  const std::string out = TempDir("sp") + "/hf";
  Result r = RunKeel("ckpt export " + run + "/iter_0000004 --hf " + out + "/");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("no Hugging Face tokenizer files were written"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("SentencePiece"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(out + "/vocab.json"));
  EXPECT_FALSE(fs::exists(out + "/merges.txt"));

  const json cfg = json::parse(Slurp(out + "/config.json"));
  EXPECT_EQ(cfg["n_inner"], 96);
  EXPECT_EQ(cfg["n_positions"], 48);
  EXPECT_EQ(cfg["layer_norm_epsilon"].get<double>(), 1e-6);
  const int vocab = cfg["vocab_size"];
  EXPECT_EQ(vocab, 4096);

  const json ref = Reference(python, out, kSpTokens, kPositions);
  ASSERT_FALSE(ref.is_null());
  const Comparison c = CompareLogits(KeelLogits(run, kSpTokens, kPositions), ref, vocab);
  EXPECT_LE(c.max_ratio, kTolerance) << "max |keel - reference| " << c.max_diff;
  std::printf(
      "[ measured ] sentencepiece, FFN 96 variant: max logit difference %.3g (%.3g of "
      "the largest |logit|)\n",
      c.max_diff, c.max_ratio);
  fs::remove_all(fs::path(out).parent_path());
}

TEST(HfExportTest, ModelsHfGpt2CannotRepresentAreRefused) {
  for (const auto& [name, flag, what] :
       {std::tuple<std::string, std::string, std::string>{
            "alibi", "--position-embedding-type alibi", "ALiBi"},
        {"embln", "--embed-layernorm", "LayerNorm after the word embedding"}}) {
    const std::string run = TrainedRun(name, "--train-iters 2 " + flag);
    ASSERT_FALSE(run.empty());
    const std::string out = TempDir("refused_" + name) + "/hf";
    Result r = RunKeel("ckpt export " + run + " --hf " + out);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(what), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("Hugging Face GPT-2 cannot represent"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(out));
    EXPECT_FALSE(fs::exists(out + ".tmp"));
    fs::remove_all(fs::path(out).parent_path());
  }
}

TEST(HfExportTest, ExistingOutputIsNeverOverwritten) {
  const std::string run = TrainedRun("sp", kSpArgs);
  ASSERT_FALSE(run.empty());
  const std::string base = TempDir("existing");
  // A non-empty directory: refused, its content untouched, nothing written beside it.
  fs::create_directories(base + "/full");
  std::ofstream(base + "/full/keep.txt") << "mine";
  Result r = RunKeel("ckpt export " + run + " --hf " + base + "/full");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("already exists and is not empty"), std::string::npos) << r.out;
  EXPECT_EQ(Slurp(base + "/full/keep.txt"), "mine");
  EXPECT_EQ(std::distance(fs::directory_iterator(base + "/full"), fs::directory_iterator()), 1);
  EXPECT_FALSE(fs::exists(base + "/full.tmp"));
  // A plain file: refused.
  std::ofstream(base + "/file") << "x";
  r = RunKeel("ckpt export " + run + " --hf " + base + "/file");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("already exists and is not a directory"), std::string::npos) << r.out;
  EXPECT_EQ(Slurp(base + "/file"), "x");
  // A leftover OUT.tmp of an interrupted export: refused, not deleted.
  fs::create_directories(base + "/again.tmp");
  r = RunKeel("ckpt export " + run + " --hf " + base + "/again");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("again.tmp exists"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(base + "/again.tmp"));
  EXPECT_FALSE(fs::exists(base + "/again"));
  // An empty directory is accepted.
  fs::create_directories(base + "/empty");
  r = RunKeel("ckpt export " + run + " --hf " + base + "/empty");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(base + "/empty/config.json"));
  // Missing flag and missing checkpoint.
  r = RunKeel("ckpt export " + run);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--hf"), std::string::npos) << r.out;
  r = RunKeel("ckpt export " + base + "/nothing --hf " + base + "/x");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("holds no checkpoint"), std::string::npos) << r.out;
  fs::remove_all(base);
}

}  // namespace
}  // namespace keel
