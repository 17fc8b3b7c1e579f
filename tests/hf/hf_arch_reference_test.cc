// `keel ckpt export --hf` for Llama and BLOOM, checked against independent readers: small models
// with random weights (std 0.2, norm weights and biases random too, so every tensor and layout
// reaches the logits) are written as checkpoints in process, exported, and run through
// tests/hf/hf_llama_reference.py / hf_bloom_reference.py (float64 numpy models written
// from the Hugging Face definitions that parse the safetensors themselves); their logits must
// match keel's GptModel::Forward. Each test prints the measured max |logit difference| (quoted in
// docs/hugging-face.md) and shows that the comparison catches a wrong RoPE base or QKV layout.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "hf/hf_export.h"
#include "hf_test_util.h"

namespace keel {
namespace {

using namespace hf_test;  // NOLINT

GptSpec LlamaSpec() {
  GptSpec s;
  s.num_layers = 2;
  s.hidden = 64;
  s.heads = 4;
  s.ffn_hidden = 96;
  s.max_positions = 32;
  s.vocab = 300;
  s.padded_vocab = 384;
  s.rope = true;
  s.rmsnorm = true;
  s.swiglu = true;
  s.layernorm_eps = 1e-5f;
  return s;
}

// Llama with grouped-query attention (2 key/value heads for 4), an untied head, no biases.
GptSpec LlamaGqaUntied() {
  GptSpec s = LlamaSpec();
  s.SetKvHeads(2);
  s.untie_embeddings = true;
  s.bias = false;
  return s;
}

// Llama with multi-head attention, the head tied to the embedding, biases, another RoPE base.
GptSpec LlamaTiedBias() {
  GptSpec s = LlamaSpec();
  s.rotary_base = 500000;
  s.layernorm_eps = 1e-6f;
  return s;
}

// BLOOM with 6 heads (ALiBi slopes interpolated past the power of two 4), FFN 4h.
GptSpec BloomSpec() {
  GptSpec s;
  s.num_layers = 2;
  s.hidden = 48;
  s.heads = 6;
  s.ffn_hidden = 192;
  s.max_positions = 32;
  s.vocab = 300;
  s.padded_vocab = 384;
  s.alibi = true;
  s.embed_layernorm = true;
  return s;
}

const std::vector<int32_t> kTokens = {5, 17, 299, 33, 2, 100, 250, 61, 7, 0, 3, 12, 99, 1, 42, 8};
const std::vector<int> kPositions = {0, 5, 11, 15};

struct Exported {
  std::string base, hf;
  std::unique_ptr<Backend> be;
  std::unique_ptr<GptModel> model;
};

// A random model of `spec`, its checkpoint, and the checkpoint exported to base/hf.
Exported Export(const std::string& name, const GptSpec& spec) {
  Exported e;
  e.base = TempDir(name);
  e.hf = e.base + "/hf";
  e.be = MakeCpuBackend(1);
  e.model = RandomModel(e.be.get(), spec, 7);
  if (!WriteCheckpoint(e.base + "/ckpt", e.model.get())) return e;
  HfExportReport report;
  Status st = ExportHf(Env::Default(), e.base + "/ckpt", e.hf, {}, nullptr, &report);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return e;
}

// A copy of `folder` whose config.json has `key` set to `value` (weights linked).
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

// Runs `script` on the export and compares; prints the measurement under `label`.
Comparison Check(const std::string& python, const std::string& script, Exported& e,
                 const std::string& label) {
  const json ref = Reference(python, script, e.hf, kTokens, kPositions);
  if (ref.is_null()) return {};
  EXPECT_EQ(ref["metadata"], json({{"format", "pt"}}));
  const Comparison c =
      CompareLogits(Logits(e.model.get(), kTokens, kPositions), ref, e.model->spec().vocab);
  EXPECT_LE(c.max_ratio, kTolerance) << label << ": max |keel - reference| " << c.max_diff;
  std::printf(
      "[ measured ] %s: max |keel - reference| logit difference %.3g (%.3g of the largest "
      "|logit|, %.3g)\n",
      label.c_str(), c.max_diff, c.max_ratio, c.max_logit);
  return c;
}

// How far `script`'s logits on `folder` (e's export made wrong on purpose) are from keel's: the
// largest difference over the largest |logit|.
double OffBy(const std::string& python, const std::string& script, Exported& e,
             const std::string& folder) {
  const json ref = Reference(python, script, folder, kTokens, kPositions);
  EXPECT_FALSE(ref.is_null()) << folder;
  if (ref.is_null()) return 0;
  return CompareLogits(Logits(e.model.get(), kTokens, kPositions), ref, e.model->spec().vocab)
      .max_ratio;
}

TEST(HfArchReferenceTest, LlamaGqaUntiedMatchesIndependentReader) {
  REQUIRE_PYTHON_NUMPY(python);
  Exported e = Export("llama_gqa", LlamaGqaUntied());
  const json cfg = json::parse(Slurp(e.hf + "/config.json"));
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_EQ(cfg["architectures"], json({"LlamaForCausalLM"}));
  EXPECT_EQ(cfg["num_key_value_heads"], 2);
  EXPECT_EQ(cfg["num_attention_heads"], 4);
  EXPECT_EQ(cfg["head_dim"], 16);
  EXPECT_EQ(cfg["intermediate_size"], 96);
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  EXPECT_EQ(cfg["attention_bias"], false);
  EXPECT_EQ(cfg["mlp_bias"], false);
  EXPECT_EQ(cfg["hidden_act"], "silu");
  EXPECT_EQ(cfg["rope_theta"].get<double>(), 10000.0);
  EXPECT_TRUE(cfg["rope_scaling"].is_null());
  EXPECT_EQ(cfg["vocab_size"], 300);
  EXPECT_EQ(cfg["max_position_embeddings"], 32);
  std::map<std::string, LoadedTensor> t;
  ASSERT_TRUE(ReadSafetensors(Env::Default(), e.hf + "/model.safetensors", &t, nullptr).ok());
  EXPECT_EQ(t["model.layers.0.self_attn.k_proj.weight"].shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(t["lm_head.weight"].shape, (std::vector<int64_t>{300, 64}));
  EXPECT_EQ(t.count("model.layers.0.self_attn.q_proj.bias"), 0u);
  Check(python, "hf_llama_reference.py", e, "llama, GQA 4/2, untied, no biases");
  // The comparison tells RoPE's base apart (a wrong base turns every q and k differently).
  const double ratio =
      OffBy(python, "hf_llama_reference.py", e, AlteredConfig(e.hf, "rope_theta", 20000.0));
  EXPECT_GT(ratio, kTolerance) << "a wrong rope_theta went unnoticed";
  std::printf("[ measured ] with rope_theta 20000 the reference is off by %.3g\n", ratio);
  fs::remove_all(e.base);
}

TEST(HfArchReferenceTest, LlamaTiedWithBiasesMatchesIndependentReader) {
  REQUIRE_PYTHON_NUMPY(python);
  Exported e = Export("llama_tied", LlamaTiedBias());
  const json cfg = json::parse(Slurp(e.hf + "/config.json"));
  EXPECT_EQ(cfg["num_key_value_heads"], 4);
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  EXPECT_EQ(cfg["attention_bias"], true);
  EXPECT_EQ(cfg["mlp_bias"], true);
  EXPECT_EQ(cfg["rope_theta"].get<double>(), 500000.0);
  EXPECT_EQ(cfg["rms_norm_eps"].get<double>(), 1e-6);
  std::map<std::string, LoadedTensor> t;
  ASSERT_TRUE(ReadSafetensors(Env::Default(), e.hf + "/model.safetensors", &t, nullptr).ok());
  EXPECT_EQ(t.count("lm_head.weight"), 0u);
  EXPECT_EQ(t["model.layers.1.mlp.up_proj.bias"].shape, (std::vector<int64_t>{96}));
  Check(python, "hf_llama_reference.py", e, "llama, MHA, tied, biases");
  fs::remove_all(e.base);
}

// Llama 3.x's RoPE scaling: pretraining context 64, so this model's 8 frequencies per head fall
// in all three bands (wavelengths 6.3 kept, 20 and 63 blended, 199 and longer divided by 8).
// Then linear interpolation (positions / 4). Without the scaling the reader is off.
TEST(HfArchReferenceTest, LlamaRopeScalingMatchesIndependentReader) {
  REQUIRE_PYTHON_NUMPY(python);
  GptSpec s = LlamaGqaUntied();
  s.rope_llama3 = true;
  s.rope_llama3_factor = 8;
  s.rope_low_freq_factor = 1;
  s.rope_high_freq_factor = 4;
  s.rope_original_max_positions = 64;
  Exported e = Export("llama3_scaling", s);
  const json cfg = json::parse(Slurp(e.hf + "/config.json"));
  EXPECT_EQ(cfg["rope_scaling"], json({{"rope_type", "llama3"},
                                       {"factor", 8.0},
                                       {"low_freq_factor", 1.0},
                                       {"high_freq_factor", 4.0},
                                       {"original_max_position_embeddings", 64}}));
  Check(python, "hf_llama_reference.py", e, "llama, Llama 3 RoPE scaling x8");
  const double ratio =
      OffBy(python, "hf_llama_reference.py", e, AlteredConfig(e.hf, "rope_scaling", nullptr));
  EXPECT_GT(ratio, kTolerance) << "the Llama 3 scaling went unnoticed";
  std::printf("[ measured ] without rope_scaling the reference is off by %.3g\n", ratio);
  fs::remove_all(e.base);

  GptSpec lin = LlamaGqaUntied();
  lin.rope_interpolation_factor = 4;
  Exported el = Export("linear_scaling", lin);
  EXPECT_EQ(json::parse(Slurp(el.hf + "/config.json"))["rope_scaling"],
            json({{"rope_type", "linear"}, {"factor", 4.0}}));
  Check(python, "hf_llama_reference.py", el, "llama, linear RoPE scaling x4");
  fs::remove_all(el.base);
}

TEST(HfArchReferenceTest, BloomMatchesIndependentReader) {
  REQUIRE_PYTHON_NUMPY(python);
  Exported e = Export("bloom", BloomSpec());
  const json cfg = json::parse(Slurp(e.hf + "/config.json"));
  EXPECT_EQ(cfg["model_type"], "bloom");
  EXPECT_EQ(cfg["architectures"], json({"BloomForCausalLM"}));
  EXPECT_EQ(cfg["hidden_size"], 48);
  EXPECT_EQ(cfg["n_head"], 6);
  EXPECT_EQ(cfg["n_layer"], 2);
  EXPECT_EQ(cfg["apply_residual_connection_post_layernorm"], false);
  EXPECT_EQ(cfg["seq_length"], 32);
  Check(python, "hf_bloom_reference.py", e, "bloom, 6 heads");
  // The per-head interleave of the fused QKV is needed: the same folder with keel's [q | k | v]
  // row order is caught.
  std::map<std::string, LoadedTensor> t;
  ASSERT_TRUE(ReadSafetensors(Env::Default(), e.hf + "/model.safetensors", &t, nullptr).ok());
  std::vector<TensorView> views;
  std::vector<std::vector<float>> keel_order;
  keel_order.reserve(4);
  for (auto& [name, lt] : t) {
    const float* data = lt.data.data();
    if (name.find("query_key_value") != std::string::npos) {
      const std::string keel = "layers." + name.substr(2, name.find('.', 2) - 2) +
                               ".attention.query_key_value." +
                               (name.back() == 't' ? "weight" : "bias");
      keel_order.push_back(Param(e.model.get(), keel));
      data = keel_order.back().data();
    }
    views.push_back({name, lt.shape, data});
  }
  const std::string wrong = e.base + "/keel_order";
  fs::create_directories(wrong);
  fs::copy_file(e.hf + "/config.json", wrong + "/config.json");
  ASSERT_TRUE(WriteSafetensors(Env::Default(), wrong + "/model.safetensors", views, {}).ok());
  const double ratio = OffBy(python, "hf_bloom_reference.py", e, wrong);
  EXPECT_GT(ratio, kTolerance) << "keel's QKV row order went unnoticed";
  std::printf("[ measured ] with keel's [q | k | v] rows the reference is off by %.3g\n", ratio);
  fs::remove_all(e.base);
}

TEST(HfArchReferenceTest, Gpt2InProcessMatchesIndependentReader) {
  REQUIRE_PYTHON_NUMPY(python);
  GptSpec s;
  s.num_layers = 2;
  s.hidden = 64;
  s.heads = 4;
  s.ffn_hidden = 256;
  s.max_positions = 32;
  s.vocab = 300;
  s.padded_vocab = 384;
  s.untie_embeddings = true;  // GPT-2 with lm_head.weight of its own
  Exported e = Export("gpt2_untied", s);
  const json cfg = json::parse(Slurp(e.hf + "/config.json"));
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  Check(python, "hf_gpt2_reference.py", e, "gpt2, untied");
  fs::remove_all(e.base);
}

}  // namespace
}  // namespace keel
