// `keel ckpt import --hf DIR --save OUT` and `keel train --finetune` with the real binary: a tiny
// Llama trained by keel is exported, imported and trained on. The imported weights must be the
// source's: a run from the import (loaded as --finetune, automatically) prints the same iteration
// lines, loss and gradient norm, as a --finetune run from the source checkpoint itself, and not
// those of a fresh model. Also the model.toml of the import, a resumed fine-tuning run, a shape
// that does not match, GPT-2 tokenizer files recognised on import, and usage errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "keel_process.h"

namespace {

namespace fs = std::filesystem;
using keel_test::FreshTempDir;
using keel_test::KeelResult;
using keel_test::RunKeelShell;
using keel_test::WithoutTimings;

KeelResult Keel(const std::string& args) {
  return RunKeelShell("", args);
}

const std::string kTiny =
    "train --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 "
    "--micro-batch-size 2 --global-batch-size 4 --lr-warmup-iters 1 --eval-iters 0 "
    "--sample-tokens 0 --log-interval 1 --threads 1 --init-method-std 0.2 --guard off ";
const std::string kLlama =
    "--position-embedding-type rope --normalization RMSNorm --swiglu --ffn-hidden-size 96 "
    "--group-query-attention --num-query-groups 2 --untie-embeddings-and-output-weights "
    "--disable-bias-linear ";

// The iteration lines of a run's output, without their timings.
std::vector<std::string> IterationLines(const std::string& out) {
  std::vector<std::string> lines;
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(" iteration ", 0) == 0 && line.find("lm loss") != std::string::npos)
      lines.push_back(WithoutTimings(line));
  return lines;
}

TEST(HfImportCliTest, ImportedLlamaTrainsOnFromTheSourceWeights) {
  const std::string base = FreshTempDir("hf_import_cli");
  KeelResult r = Keel(kTiny + kLlama + "--train-iters 3 --save " + base + "/src");
  ASSERT_EQ(r.code, 0) << r.out;
  r = Keel("ckpt export " + base + "/src --hf " + base + "/hf");
  ASSERT_EQ(r.code, 0) << r.out;
  r = Keel("ckpt import --hf " + base + "/hf --save " + base + "/imp");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("imported " + base + "/hf (Hugging Face Llama, LlamaForCausalLM) to " +
                       base + "/imp/iter_0000000"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("tokenizer: keel's SentencePiece model"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--position-embedding-type rope"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--num-query-groups 2"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(base + "/imp/iter_0000000/tokenizer.model"));
  r = Keel("ckpt verify " + base + "/imp");
  EXPECT_EQ(r.code, 0) << r.out;

  // From the import (as --finetune, said in a note), and from the source with --finetune.
  const std::string from_import = kTiny + kLlama + "--train-iters 3 --load " + base + "/imp";
  KeelResult b = Keel(from_import + " --save " + base + "/b --exit-interval 2");
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("was imported from Hugging Face (keel ckpt import): loading its weights "
                       "only, as --finetune does"),
            std::string::npos)
      << b.out;
  EXPECT_NE(b.out.find("fine-tuning from " + base + "/imp/iter_0000000"), std::string::npos)
      << b.out;
  // The same command again resumes the fine-tuning run in --save.
  KeelResult b2 = Keel(from_import + " --save " + base + "/b");
  ASSERT_EQ(b2.code, 0) << b2.out;
  EXPECT_NE(b2.out.find("already holds this fine-tuning run's checkpoints: resuming it"),
            std::string::npos)
      << b2.out;
  KeelResult c = Keel(kTiny + kLlama + "--train-iters 3 --finetune --load " + base +
                      "/src --save " + base + "/c");
  ASSERT_EQ(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("--finetune: only the model weights of " + base + "/src/iter_0000003"),
            std::string::npos)
      << c.out;
  KeelResult d = Keel(kTiny + kLlama + "--train-iters 3 --save " + base + "/d");
  ASSERT_EQ(d.code, 0) << d.out;
  std::vector<std::string> lb = IterationLines(b.out), lb2 = IterationLines(b2.out);
  lb.insert(lb.end(), lb2.begin(), lb2.end());
  const std::vector<std::string> lc = IterationLines(c.out), ld = IterationLines(d.out);
  ASSERT_EQ(lb.size(), 3u) << b.out << b2.out;
  ASSERT_EQ(lc.size(), 3u) << c.out;
  ASSERT_EQ(ld.size(), 3u) << d.out;
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(lb[i], lc[i]) << "iteration " << i + 1;
  EXPECT_NE(lb[0], ld[0]) << "a fresh model gives the same loss: the weights did not come through";
  std::printf("[ measured ] first iteration from the import: %s\n", lb[0].c_str());

  // model.toml holds the model's settings as a --config file.
  KeelResult e = Keel("train --config " + base +
                      "/imp/model.toml --seq-length 32 "
                      "--micro-batch-size 2 --global-batch-size 4 --lr-warmup-iters 1 "
                      "--eval-iters 0 --sample-tokens 0 --log-interval 1 --threads 1 --guard off "
                      "--train-iters 3 --exit-interval 1 --load " +
                      base + "/imp --save " + base + "/e");
  ASSERT_EQ(e.code, 0) << e.out;
  ASSERT_EQ(IterationLines(e.out).size(), 1u) << e.out;
  EXPECT_EQ(IterationLines(e.out)[0], lb[0]);

  // Another shape: refused with the diff, before any work.
  KeelResult f = Keel(kTiny + "--train-iters 3 --load " + base + "/imp --save " + base + "/f");
  EXPECT_EQ(f.code, 2) << f.out;
  EXPECT_NE(f.out.find("--finetune loads weights into a model of the same shape"),
            std::string::npos)
      << f.out;
  EXPECT_NE(f.out.find("position-embedding-type: \"rope\" -> \"learned_absolute\""),
            std::string::npos)
      << f.out;
  EXPECT_NE(f.out.find("model.toml"), std::string::npos) << f.out;
  EXPECT_FALSE(fs::exists(base + "/f/iter_0000001"));
  fs::remove_all(base);
}

TEST(HfImportCliTest, Gpt2TokenizerFilesAreRecognised) {
  const std::string base = FreshTempDir("hf_import_gpt2");
  KeelResult r = Keel(kTiny + "--tokenizer gpt2 --train-iters 2 --save " + base + "/src");
  ASSERT_EQ(r.code, 0) << r.out;
  r = Keel("ckpt export " + base + "/src --hf " + base + "/hf");
  ASSERT_EQ(r.code, 0) << r.out;
  r = Keel("ckpt import --hf " + base + "/hf/ --save " + base + "/imp");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("tokenizer: keel's gpt2 (vocab.json and merges.txt are GPT-2's); EOD 50256"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("vocabulary 50257 padded to 50304"), std::string::npos) << r.out;
  // Without tokenizer files: imported, with a warning that the data must match.
  fs::remove(base + "/hf/vocab.json");
  r = Keel("ckpt import --hf " + base + "/hf --save " + base + "/imp2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("no tokenizer keel can use"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Training needs data tokenized with this model's tokenizer"),
            std::string::npos)
      << r.out;
  fs::remove_all(base);
}

TEST(HfImportCliTest, UsageErrorsExitTwo) {
  const std::string base = FreshTempDir("hf_import_usage");
  KeelResult r = Keel("ckpt import --save " + base + "/x");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--hf"), std::string::npos) << r.out;
  r = Keel("ckpt import --hf " + base + "/nothing --save " + base + "/x");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("is not a directory"), std::string::npos) << r.out;
  fs::create_directories(base + "/hf");
  std::ofstream(base + "/hf/config.json") << R"({"model_type": "mistral"})";
  r = Keel("ckpt import --hf " + base + "/hf --save " + base + "/x");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("model_type 'mistral' is not one keel imports"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(base + "/x"));
  r = Keel(kTiny + "--train-iters 2 --finetune --save " + base + "/run");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--finetune needs --load DIR"), std::string::npos) << r.out;
  fs::remove_all(base);
}

}  // namespace
