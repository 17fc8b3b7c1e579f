// `keel ckpt export PATH --hf OUT`, checked against an independent reader: tiny models are trained
// with the keel binary, exported, and run through tests/hf/hf_gpt2_reference.py (a numpy
// GPT-2 written from the Hugging Face definition that parses the safetensors file itself); its
// logits must match keel's own forward pass on the same tokens. The weights start at std 0.2 so
// that attention is far from uniform and the GELU's tails matter: the check then tells a wrong
// attention scale or GELU variant apart (asserted below). Needs python3 with numpy
// (scripts/test.sh installs python3-numpy): the tests fail, not skip, without them.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "checkpoint/train_checkpoint.h"
#include "hf_test_util.h"

namespace keel {
namespace {

using namespace hf_test;  // NOLINT

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

  const json ref = Reference(python, "hf_gpt2_reference.py", out, kGpt2Tokens, kPositions);
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
    const json wrong = Reference(python, "hf_gpt2_reference.py", AlteredConfig(out, key, value),
                                 kGpt2Tokens, kPositions);
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

  const json ref = Reference(python, "hf_gpt2_reference.py", out, kSpTokens, kPositions);
  ASSERT_FALSE(ref.is_null());
  const Comparison c = CompareLogits(KeelLogits(run, kSpTokens, kPositions), ref, vocab);
  EXPECT_LE(c.max_ratio, kTolerance) << "max |keel - reference| " << c.max_diff;
  std::printf(
      "[ measured ] sentencepiece, FFN 96 variant: max logit difference %.3g (%.3g of "
      "the largest |logit|)\n",
      c.max_diff, c.max_ratio);
  fs::remove_all(fs::path(out).parent_path());
}

TEST(HfExportTest, ModelsNoHfArchitectureRepresentsAreRefused) {
  for (const auto& [name, flag, what, arch] :
       {std::tuple<std::string, std::string, std::string, std::string>{
            "alibi", "--position-embedding-type alibi",
            "ALiBi without a LayerNorm after the word embedding", "BLOOM"},
        {"embln", "--embed-layernorm", "LayerNorm after the word embedding", "GPT-2"},
        {"rope_ln", "--position-embedding-type rope", "RoPE with LayerNorm", "Llama"}}) {
    const std::string run = TrainedRun(name, "--train-iters 2 " + flag);
    ASSERT_FALSE(run.empty());
    const std::string out = TempDir("refused_" + name) + "/hf";
    Result r = RunKeel("ckpt export " + run + " --hf " + out);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(what), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("Hugging Face " + arch + " cannot represent"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("keel exports GPT-2"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(out));
    EXPECT_FALSE(fs::exists(out + ".tmp"));
    fs::remove_all(fs::path(out).parent_path());
  }
}

// A Llama trained with keel's SentencePiece tokenizer: its tokenizer.model goes into the folder
// with a LlamaTokenizer config (no BOS/EOS added; <eod> is both), and the logits match the
// independent Llama reader.
TEST(HfExportTest, LlamaWithSentencepieceWritesLlamaTokenizerFiles) {
  REQUIRE_PYTHON_NUMPY(python);
  const std::string run = TrainedRun(
      "llama_sp",
      "--train-iters 2 --position-embedding-type rope --normalization RMSNorm --swiglu "
      "--group-query-attention --num-query-groups 2 --untie-embeddings-and-output-weights "
      "--disable-bias-linear --ffn-hidden-size 96");
  ASSERT_FALSE(run.empty());
  const std::string out = TempDir("llama_sp") + "/hf";
  Result r = RunKeel("ckpt export " + run + " --hf " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("(Hugging Face Llama, LlamaForCausalLM)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("no Hugging Face tokenizer files"), std::string::npos) << r.out;
  EXPECT_EQ(Slurp(out + "/tokenizer.model"), Slurp(run + "/iter_0000002/tokenizer.model"));
  const json tcfg = json::parse(Slurp(out + "/tokenizer_config.json"));
  EXPECT_EQ(tcfg["tokenizer_class"], "LlamaTokenizer");
  EXPECT_EQ(tcfg["add_bos_token"], false);
  EXPECT_EQ(tcfg["add_eos_token"], false);
  EXPECT_EQ(tcfg["eos_token"], "<eod>");
  EXPECT_EQ(tcfg["unk_token"], "<unk>");
  const json cfg = json::parse(Slurp(out + "/config.json"));
  const json ref = Reference(python, "hf_llama_reference.py", out, kSpTokens, kPositions);
  ASSERT_FALSE(ref.is_null());
  const Comparison c = CompareLogits(KeelLogits(run, kSpTokens, kPositions), ref, 4096);
  EXPECT_LE(c.max_ratio, kTolerance) << "max |keel - reference| " << c.max_diff;
  EXPECT_EQ(cfg["eos_token_id"], cfg["bos_token_id"]);
  std::printf("[ measured ] llama trained by keel (GQA, untied): max logit difference %.3g\n",
              c.max_diff);
  fs::remove_all(fs::path(out).parent_path());
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
