// `keel ckpt import --hf` in process (hf/hf_import.h): round trips in both directions for
// every architecture (export -> import gives the same weight bits, tensor by tensor; import ->
// export the same safetensors tensors), F16 / BF16 / sharded folders converted exactly, the names
// save_pretrained writes, and every refusal: what keel's model cannot compute (config.json) and
// damaged or inconsistent weights, each with nothing written.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/train_checkpoint.h"
#include "hf/hf_config.h"
#include "hf/hf_export.h"
#include "hf/hf_weights.h"
#include "hf_test_util.h"

namespace keel {
namespace {

using namespace hf_test;  // NOLINT

GptSpec Base(int hidden = 64, int heads = 4) {
  GptSpec s;
  s.num_layers = 2;
  s.hidden = hidden;
  s.heads = heads;
  s.ffn_hidden = 4 * hidden;
  s.max_positions = 32;
  s.vocab = 300;
  s.padded_vocab = 384;
  return s;
}

GptSpec Llama(bool gqa, bool tied, bool bias) {
  GptSpec s = Base();
  s.rope = s.rmsnorm = s.swiglu = true;
  s.ffn_hidden = 96;
  s.SetKvHeads(gqa ? 2 : 0);
  s.untie_embeddings = !tied;
  s.bias = bias;
  s.rotary_base = 500000;
  return s;
}

// Llama 3.x's RoPE scaling, with a pretraining context short enough that this small model's
// frequencies fall in all three bands; or linear interpolation.
GptSpec ScaledLlama(bool llama3) {
  GptSpec s = Llama(true, false, false);
  s.rotary_base = 10000;
  if (llama3) {
    s.rope_llama3 = true;
    s.rope_llama3_factor = 8;
    s.rope_original_max_positions = 64;
  } else {
    s.rope_interpolation_factor = 4;
  }
  return s;
}

GptSpec Bloom() {
  GptSpec s = Base(48, 6);
  s.alibi = s.embed_layernorm = true;
  return s;
}

GptSpec Gpt2(bool tied) {
  GptSpec s = Base();
  s.ffn_hidden = 96;
  s.untie_embeddings = !tied;
  return s;
}

// The architecture fields of a spec (eod, z-loss and the packed-document options are a run's).
json Shape(const GptSpec& s) {
  json j = SpecToJson(s);
  for (const char* k : {"eod_id", "z_loss", "reset_position_ids", "reset_attention_mask"})
    j.erase(k);
  if (j["kv_heads"] == j["heads"]) j["kv_heads"] = 0;
  return j;
}

struct Tensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
using Tensors = std::vector<std::pair<std::string, Tensor>>;

// A safetensors file of any dtypes (keel's writer writes F32 only).
void WriteRaw(const std::string& path, const Tensors& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  out += h;
  for (const auto& [name, t] : tensors) out += t.bytes;
  std::ofstream(path, std::ios::binary) << out;
}

// The F32 tensors of a folder's model.safetensors, in file order.
Tensors ReadF32(const std::string& path) {
  std::map<std::string, LoadedTensor> t;
  Status st = ReadSafetensors(Env::Default(), path, &t, nullptr);
  EXPECT_TRUE(st.ok()) << st.ToString();
  Tensors out;
  for (auto& [name, lt] : t)
    out.push_back({name,
                   {"F32", lt.shape,
                    std::string(reinterpret_cast<const char*>(lt.data.data()),
                                lt.data.size() * sizeof(float))}});
  return out;
}

// A copy of the folder `from` (config and tokenizer files) with `tensors` as its weights.
std::string Folder(const std::string& from, const std::string& to, const Tensors& tensors) {
  fs::remove_all(to);
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from))
    if (e.path().filename() != "model.safetensors")
      fs::copy_file(e.path(), to + "/" + e.path().filename().string());
  WriteRaw(to + "/model.safetensors", tensors);
  return to;
}

void EditConfig(const std::string& folder, const std::function<void(json&)>& edit) {
  json cfg = json::parse(Slurp(folder + "/config.json"));
  edit(cfg);
  std::ofstream(folder + "/config.json") << cfg.dump(2);
}

Status Import(const std::string& hf, const std::string& out, HfImportReport* report = nullptr,
              const HfImportOptions& options = {}) {
  HfImportReport r;
  return ImportHf(Env::Default(), hf, out, options, nullptr, report ? report : &r);
}

// An import's weights by keel name.
std::map<std::string, LoadedTensor> ImportedWeights(const std::string& run) {
  std::map<std::string, LoadedTensor> t;
  Status st = ReadSafetensors(Env::Default(), run + "/iter_0000000/model.safetensors", &t, nullptr);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return t;
}

// Every tensor of `model` against the import's: the same bits, except the vocabulary's padding
// rows, which the import makes zero (HF holds V rows).
void ExpectSameWeights(GptModel* model, const std::map<std::string, LoadedTensor>& imported) {
  const GptSpec& s = model->spec();
  EXPECT_EQ(imported.size(), model->params().size());
  for (const ParamInfo& p : model->params()) {
    auto it = imported.find(p.name);
    ASSERT_NE(it, imported.end()) << p.name;
    ASSERT_EQ(it->second.shape, p.shape) << p.name;
    const std::vector<float> want = Param(model, p.name);
    const bool vocab_rows =
        p.name == "embedding.word_embeddings.weight" || p.name == "output_layer.weight";
    const size_t real = vocab_rows ? static_cast<size_t>(s.vocab) * s.hidden : p.numel;
    EXPECT_EQ(std::memcmp(want.data(), it->second.data.data(), real * sizeof(float)), 0) << p.name;
    for (size_t i = real; i < p.numel; ++i)
      ASSERT_EQ(it->second.data[i], 0.0f) << p.name << " " << i;
  }
}

struct Case {
  const char* name;
  GptSpec spec;
};

std::vector<Case> Cases() {
  return {{"llama_gqa_untied", Llama(true, false, false)},
          {"llama_tied_bias", Llama(false, true, true)},
          {"llama3_rope_scaling", ScaledLlama(true)},
          {"llama_linear_rope_scaling", ScaledLlama(false)},
          {"bloom", Bloom()},
          {"gpt2_tied", Gpt2(true)},
          {"gpt2_untied", Gpt2(false)}};
}

TEST(HfImportTest, ExportThenImportGivesTheSameBitsAndImportThenExportTheSameTensors) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    const std::string base = TempDir(std::string("rt_") + c.name);
    auto be = MakeCpuBackend(1);
    auto model = RandomModel(be.get(), c.spec, 11);
    ASSERT_TRUE(WriteCheckpoint(base + "/ckpt", model.get()));
    HfExportReport er;
    ASSERT_TRUE(ExportHf(Env::Default(), base + "/ckpt", base + "/hf", {}, nullptr, &er).ok());
    HfImportReport ir;
    Status st = Import(base + "/hf", base + "/imported", &ir);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(ir.arch, er.arch);
    EXPECT_EQ(ir.vocab, 300);
    EXPECT_EQ(ir.padded_vocab, 384);
    EXPECT_EQ(ir.dtypes, (std::set<std::string>{"F32"}));
    EXPECT_EQ(ir.tokenizer.kind, "none");
    EXPECT_FALSE(fs::exists(base + "/imported.tmp"));
    // A valid checkpoint: strictly verified, read, and of the same model.
    SavedTrainState saved;
    st = ReadVerifiedCheckpoint(Env::Default(), base + "/imported/iter_0000000", &saved);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(Shape(saved.spec), Shape(c.spec));
    EXPECT_EQ(saved.train.counters.iteration, 0);
    EXPECT_TRUE(saved.state.contains(kImportStateKey));
    ExpectSameWeights(model.get(), ImportedWeights(base + "/imported"));
    EXPECT_TRUE(fs::exists(base + "/imported/model.toml"));
    // And back: the same HF tensors and config.
    ASSERT_TRUE(ExportHf(Env::Default(), base + "/imported", base + "/hf2", {}, nullptr, &er).ok());
    const Tensors a = ReadF32(base + "/hf/model.safetensors");
    const Tensors b = ReadF32(base + "/hf2/model.safetensors");
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_EQ(a[i].second.shape, b[i].second.shape) << a[i].first;
      EXPECT_TRUE(a[i].second.bytes == b[i].second.bytes) << a[i].first;
    }
    EXPECT_EQ(json::parse(Slurp(base + "/hf/config.json")),
              json::parse(Slurp(base + "/hf2/config.json")));
    fs::remove_all(base);
  }
}

// Exhaustive: every 16-bit pattern against the IEEE / bfloat16 definitions.
TEST(HfImportTest, HalfAndBfloat16WidenExactly) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const int sign = (h >> 15) ? -1 : 1, exp = (h >> 10) & 31, mant = h & 1023;
    double want;
    if (exp == 31) {
      want = mant ? NAN : sign * INFINITY;
    } else if (exp == 0) {
      want = sign * std::ldexp(mant, -24);
    } else {
      want = sign * std::ldexp(1024 + mant, exp - 25);
    }
    const float got = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << h;
      ASSERT_EQ(std::signbit(got), sign < 0) << h;
    }
    const int bexp = (h >> 7) & 255, bmant = h & 127;
    double bwant;
    if (bexp == 255) {
      bwant = bmant ? NAN : sign * INFINITY;
    } else if (bexp == 0) {
      bwant = sign * std::ldexp(bmant, -133);
    } else {
      bwant = sign * std::ldexp(128 + bmant, bexp - 134);
    }
    const float bgot = Bf16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(bwant)) {
      ASSERT_TRUE(std::isnan(bgot)) << h;
    } else {
      ASSERT_EQ(static_cast<double>(bgot), bwant) << h;
    }
  }
}

uint16_t TruncateToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

// A half close to f (normal range, mantissa truncated; tiny values to subnormals or zero).
uint16_t ToHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const float a = std::fabs(f);
  if (a < std::ldexp(1.0f, -14)) return sign | static_cast<uint16_t>(a * std::ldexp(1.0f, 24));
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int exp = e - 1 + 15;
  if (exp >= 31) return sign | 0x7bff;
  return sign | static_cast<uint16_t>(exp << 10) |
         static_cast<uint16_t>(static_cast<int>((m * 2 - 1) * 1024) & 1023);
}

TEST(HfImportTest, Bf16AndShardedF16FoldersConvertExactly) {
  const std::string base = TempDir("dtypes");
  auto be = MakeCpuBackend(1);
  auto model = RandomModel(be.get(), Llama(true, false, false), 3);
  ASSERT_TRUE(WriteCheckpoint(base + "/ckpt", model.get()));
  HfExportReport er;
  ASSERT_TRUE(ExportHf(Env::Default(), base + "/ckpt", base + "/hf", {}, nullptr, &er).ok());
  const Tensors f32 = ReadF32(base + "/hf/model.safetensors");
  // BF16, one file: each value truncated to bfloat16.
  Tensors bf16;
  std::map<std::string, std::vector<float>> want;
  for (const auto& [name, t] : f32) {
    const size_t n = t.bytes.size() / 4;
    std::string bytes(2 * n, '\0');
    for (size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, t.bytes.data() + 4 * i, 4);
      const uint16_t b = TruncateToBf16(f);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
      want[name].push_back(Bf16ToFloat(b));
    }
    bf16.push_back({name, {"BF16", t.shape, bytes}});
  }
  Folder(base + "/hf", base + "/bf16", bf16);
  HfImportReport ir;
  Status st = Import(base + "/bf16", base + "/imp_bf16", &ir);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ir.dtypes, (std::set<std::string>{"BF16"}));
  HfExportReport er2;
  ASSERT_TRUE(
      ExportHf(Env::Default(), base + "/imp_bf16", base + "/hf_bf16", {}, nullptr, &er2).ok());
  for (const auto& [name, t] : ReadF32(base + "/hf_bf16/model.safetensors")) {
    ASSERT_EQ(t.bytes.size(), want[name].size() * 4) << name;
    EXPECT_EQ(std::memcmp(t.bytes.data(), want[name].data(), t.bytes.size()), 0) << name;
  }
  // F16 in two shards with an index, names split between them.
  Tensors shard1, shard2;
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  want.clear();
  for (size_t k = 0; k < f32.size(); ++k) {
    const auto& [name, t] = f32[k];
    const size_t n = t.bytes.size() / 4;
    std::string bytes(2 * n, '\0');
    for (size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, t.bytes.data() + 4 * i, 4);
      const uint16_t h = ToHalf(f);
      std::memcpy(bytes.data() + 2 * i, &h, 2);
      want[name].push_back(HalfToFloat(h));
    }
    const std::string file =
        k % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    (k % 2 ? shard2 : shard1).push_back({name, {"F16", t.shape, bytes}});
    index["weight_map"][name] = file;
  }
  const std::string sharded = Folder(base + "/hf", base + "/f16", {});
  fs::remove(sharded + "/model.safetensors");
  WriteRaw(sharded + "/model-00001-of-00002.safetensors", shard1);
  WriteRaw(sharded + "/model-00002-of-00002.safetensors", shard2);
  std::ofstream(sharded + "/model.safetensors.index.json") << index.dump(2);
  st = Import(sharded, base + "/imp_f16", &ir);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ir.dtypes, (std::set<std::string>{"F16"}));
  EXPECT_EQ(ir.weight_files.size(), 2u);
  ASSERT_TRUE(
      ExportHf(Env::Default(), base + "/imp_f16", base + "/hf_f16", {}, nullptr, &er2).ok());
  for (const auto& [name, t] : ReadF32(base + "/hf_f16/model.safetensors"))
    EXPECT_EQ(std::memcmp(t.bytes.data(), want[name].data(), t.bytes.size()), 0) << name;
  fs::remove_all(base);
}

// GPT-2 and BLOOM files written by save_pretrained carry "transformer."; old GPT-2 files hold the
// attention mask buffers, Llama's the RoPE frequencies; a tied head may be saved anyway.
TEST(HfImportTest, PrefixedNamesBuffersAndATiedHeadCopyAreRead) {
  const std::string base = TempDir("prefixed");
  for (const Case& c : {Case{"gpt2", Gpt2(true)}, Case{"bloom", Bloom()},
                        Case{"llama", Llama(false, true, false)}}) {
    SCOPED_TRACE(c.name);
    auto be = MakeCpuBackend(1);
    auto model = RandomModel(be.get(), c.spec, 5);
    const std::string d = base + "/" + c.name;
    ASSERT_TRUE(WriteCheckpoint(d + "/ckpt", model.get()));
    HfExportReport er;
    ASSERT_TRUE(ExportHf(Env::Default(), d + "/ckpt", d + "/hf", {}, nullptr, &er).ok());
    Tensors t = ReadF32(d + "/hf/model.safetensors");
    std::string embedding;
    for (auto& [name, tensor] : t) {
      if (name == "wte.weight" || name == "word_embeddings.weight" ||
          name == "model.embed_tokens.weight")
        embedding = tensor.bytes;
      if (c.spec.alibi || !c.spec.rope) name = "transformer." + name;
    }
    t.push_back({"lm_head.weight", {"F32", {300, c.spec.hidden}, embedding}});
    if (!c.spec.rope && !c.spec.alibi) {
      t.push_back({"h.0.attn.bias", {"F32", {1, 1, 32, 32}, std::string(32 * 32 * 4, '\0')}});
      t.push_back({"h.1.attn.masked_bias", {"F32", {}, std::string(4, '\0')}});
    }
    if (c.spec.rope)
      t.push_back(
          {"model.layers.0.self_attn.rotary_emb.inv_freq", {"F32", {8}, std::string(32, '\0')}});
    Folder(d + "/hf", d + "/renamed", t);
    HfImportReport ir;
    Status st = Import(d + "/renamed", d + "/imported", &ir);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ExpectSameWeights(model.get(), ImportedWeights(d + "/imported"));
    std::string notes;
    for (const std::string& n : ir.notes) notes += n + "\n";
    EXPECT_NE(notes.find("lm_head.weight left out: it equals the word embedding"),
              std::string::npos)
        << notes;
    if (!c.spec.alibi) {
      EXPECT_NE(notes.find("buffer tensors left out"), std::string::npos) << notes;
    }
    // A tied head that is not the embedding means another model: refused.
    for (auto& [name, tensor] : t)
      if (name == "lm_head.weight") tensor.bytes[5] ^= 1;
    Folder(d + "/hf", d + "/bad_head", t);
    st = Import(d + "/bad_head", d + "/imported2");
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("lm_head.weight differs from the word embedding"),
              std::string::npos)
        << st.message();
    EXPECT_FALSE(fs::exists(d + "/imported2"));
  }
  fs::remove_all(base);
}

// What keel's model cannot compute, named; nothing is written.
TEST(HfImportTest, ConfigKeelCannotRepresentIsRefusedNamingTheKey) {
  const std::string base = TempDir("refuse_config");
  auto be = MakeCpuBackend(1);
  auto model = RandomModel(be.get(), Llama(true, false, false), 1);
  ASSERT_TRUE(WriteCheckpoint(base + "/ckpt", model.get()));
  HfExportReport er;
  ASSERT_TRUE(ExportHf(Env::Default(), base + "/ckpt", base + "/hf", {}, nullptr, &er).ok());
  const Tensors weights = ReadF32(base + "/hf/model.safetensors");
  struct Refusal {
    const char* what;
    std::function<void(json&)> edit;
    const char* message;
  };
  const std::vector<Refusal> refusals = {
      {"dynamic rope_scaling",
       [](json& c) {
         c["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
       },
       "rope_scaling type 'dynamic'"},
      {"llama3 rope_parameters without its factors",
       [](json& c) {
         c["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 1e4}};
       },
       "rope_parameters.factor must be a number for rope type llama3, but is absent"},
      {"llama3 rope_scaling with a setting keel lacks",
       [](json& c) {
         c["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", 8.0},
                              {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 8192},
                              {"mscale", 1.0}};
       },
       "rope_scaling.mscale"},
      {"llama3 bands the wrong way round",
       [](json& c) {
         c["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", 8.0},
                              {"low_freq_factor", 4.0},
                              {"high_freq_factor", 1.0},
                              {"original_max_position_embeddings", 8192}};
       },
       "need 0 < low < high"},
      {"linear interpolation by a fraction",
       [](json& c) {
         c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.5}};
       },
       "takes a whole factor"},
      {"two spellings of the type that differ",
       [](json& c) {
         c["rope_scaling"] = {{"rope_type", "linear"}, {"type", "llama3"}, {"factor", 2.0}};
       },
       "differs from the other spelling"},
      {"sliding window", [](json& c) { c["sliding_window"] = 4096; }, "sliding_window"},
      {"head_dim", [](json& c) { c["head_dim"] = 32; }, "head_dim 32 differs"},
      {"activation", [](json& c) { c["hidden_act"] = "gelu"; }, "hidden_act 'gelu'"},
      {"biases", [](json& c) { c["attention_bias"] = true; },
       "attention_bias is true but mlp_bias"},
      {"rope_theta", [](json& c) { c["rope_theta"] = 10000.5; }, "rope_theta 10000.5"},
      {"partial rotary", [](json& c) { c["partial_rotary_factor"] = 0.5; },
       "partial_rotary_factor"},
      {"model_type", [](json& c) { c["model_type"] = "mistral"; }, "model_type 'mistral'"},
      {"architectures", [](json& c) { c["architectures"] = {"LlamaForSequenceClassification"}; },
       "does not list LlamaForCausalLM"},
      {"kv heads", [](json& c) { c["num_key_value_heads"] = 3; }, "num_key_value_heads 3"},
      {"missing key", [](json& c) { c.erase("intermediate_size"); }, "has no intermediate_size"},
      {"wrong type", [](json& c) { c["hidden_size"] = "64"; }, "hidden_size must be an integer"},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.what);
    const std::string dir = Folder(base + "/hf", base + "/edited", weights);
    EditConfig(dir, r.edit);
    Status st = Import(dir, base + "/out");
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find(r.message), std::string::npos) << st.message();
    EXPECT_FALSE(fs::exists(base + "/out"));
    EXPECT_FALSE(fs::exists(base + "/out.tmp"));
  }
  fs::remove_all(base);
}

TEST(HfImportTest, GptAndBloomConfigRefusals) {
  HfModelConfig mc;
  const json gpt2 = {{"model_type", "gpt2"}, {"vocab_size", 300}, {"n_embd", 64},
                     {"n_layer", 2},         {"n_head", 4},       {"n_positions", 32}};
  ASSERT_TRUE(ParseHfConfig(gpt2.dump(), "config.json", {}, &mc).ok());
  EXPECT_EQ(mc.spec.ffn_hidden, 256);  // n_inner absent: 4h
  EXPECT_FALSE(mc.spec.untie_embeddings);
  ASSERT_FALSE(mc.notes.empty());
  EXPECT_NE(mc.notes[0].find("activation_function gelu_new"), std::string::npos) << mc.notes[0];
  for (const auto& [key, value, message] : std::vector<std::tuple<std::string, json, std::string>>{
           {"activation_function", "gelu", "activation_function 'gelu'"},
           {"scale_attn_weights", false, "scale_attn_weights is false"},
           {"scale_attn_by_inverse_layer_idx", true, "scale_attn_by_inverse_layer_idx"},
           {"add_cross_attention", true, "cross-attention"},
           {"n_embd", 66, "not a multiple of the 4 attention heads"}}) {
    json c = gpt2;
    c[key] = value;
    Status st = ParseHfConfig(c.dump(), "config.json", {}, &mc);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << key;
    EXPECT_NE(st.message().find(message), std::string::npos) << st.message();
  }
  HfConfigOptions positions;
  positions.max_positions = 64;
  EXPECT_NE(ParseHfConfig(gpt2.dump(), "config.json", positions, &mc)
                .message()
                .find("GPT-2's positions are learned weights"),
            std::string::npos);
  const json bloom = {{"model_type", "bloom"},
                      {"vocab_size", 300},
                      {"n_embed", 48},
                      {"n_layer", 2},
                      {"num_attention_heads", 6}};
  ASSERT_TRUE(ParseHfConfig(bloom.dump(), "config.json", {}, &mc).ok());
  EXPECT_EQ(mc.spec.hidden, 48);
  EXPECT_EQ(mc.spec.heads, 6);
  EXPECT_EQ(mc.spec.max_positions, 2048);  // no seq_length: BLOOM's training length, noted
  std::string notes;
  for (const std::string& n : mc.notes) notes += n;
  EXPECT_NE(notes.find("max positions 2048"), std::string::npos) << notes;
  ASSERT_TRUE(ParseHfConfig(bloom.dump(), "config.json", positions, &mc).ok());
  EXPECT_EQ(mc.spec.max_positions, 64);
  for (const auto& [key, value, message] : std::vector<std::tuple<std::string, json, std::string>>{
           {"apply_residual_connection_post_layernorm", true,
            "apply_residual_connection_post_layernorm"},
           {"tie_word_embeddings", false, "tie_word_embeddings is false"},
           {"n_inner", 100, "n_inner 100"}}) {
    json c = bloom;
    c[key] = value;
    Status st = ParseHfConfig(c.dump(), "config.json", {}, &mc);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << key;
    EXPECT_NE(st.message().find(message), std::string::npos) << st.message();
  }
  EXPECT_EQ(ParseHfConfig("[1, 2]", "config.json", {}, &mc).code(), Status::Code::kCorruption);
  EXPECT_EQ(ParseHfConfig("{}", "config.json", {}, &mc).code(), Status::Code::kInvalidArgument);
}

// Damaged or inconsistent weights, named; nothing is written.
TEST(HfImportTest, WeightsThatDoNotFitAreRefusedNamingTheTensor) {
  const std::string base = TempDir("refuse_weights");
  auto be = MakeCpuBackend(1);
  auto model = RandomModel(be.get(), Llama(true, true, false), 1);
  ASSERT_TRUE(WriteCheckpoint(base + "/ckpt", model.get()));
  HfExportReport er;
  ASSERT_TRUE(ExportHf(Env::Default(), base + "/ckpt", base + "/hf", {}, nullptr, &er).ok());
  const Tensors good = ReadF32(base + "/hf/model.safetensors");
  const std::string k = "model.layers.1.self_attn.k_proj.weight";
  struct Refusal {
    const char* what;
    std::function<void(Tensors&)> edit;
    Status::Code code;
    const char* message;
  };
  const std::vector<Refusal> refusals = {
      {"missing",
       [&](Tensors& t) { std::erase_if(t, [&](const auto& e) { return e.first == k; }); },
       Status::Code::kCorruption, "no tensor 'model.layers.1.self_attn.k_proj.weight' [32, 64]"},
      {"misshapen",
       [&](Tensors& t) {
         for (auto& [name, tensor] : t)
           if (name == k) tensor.shape = {64, 32};
       },
       Status::Code::kCorruption, "has shape [64, 32], expected [32, 64]"},
      {"extra",
       [&](Tensors& t) {
         t.push_back({"model.layers.0.extra.weight", {"F32", {2}, std::string(8, 0)}});
       },
       Status::Code::kCorruption, "'model.layers.0.extra.weight'"},
      {"NaN",
       [&](Tensors& t) {
         for (auto& [name, tensor] : t) {
           if (name != k) continue;
           const float nan = std::numeric_limits<float>::quiet_NaN();
           std::memcpy(tensor.bytes.data() + 40, &nan, 4);
         }
       },
       Status::Code::kCorruption, "holds 1 NaN or Inf values"},
      {"F64",
       [&](Tensors& t) {
         for (auto& [name, tensor] : t)
           if (name == k) tensor = {"F64", tensor.shape, tensor.bytes + tensor.bytes};
       },
       Status::Code::kInvalidArgument, "is F64; keel imports F32, F16 and BF16"},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.what);
    Tensors t = good;
    r.edit(t);
    const std::string dir = Folder(base + "/hf", base + "/edited", t);
    Status st = Import(dir, base + "/out");
    EXPECT_EQ(st.code(), r.code) << st.ToString();
    EXPECT_NE(st.message().find(r.message), std::string::npos) << st.message();
    EXPECT_FALSE(fs::exists(base + "/out"));
    EXPECT_FALSE(fs::exists(base + "/out.tmp"));
  }
  // Sharded folders: a shard name leaving the folder, a shard without the tensor the index puts
  // there; and pickled weights only.
  const std::string dir = Folder(base + "/hf", base + "/sharded", {});
  fs::remove(dir + "/model.safetensors");
  std::ofstream(dir + "/model.safetensors.index.json")
      << json({{"weight_map", {{k, "../hf/model.safetensors"}}}}).dump();
  Status st = Import(dir, base + "/out");
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find("not a file of the folder"), std::string::npos) << st.message();
  WriteRaw(dir + "/a.safetensors", {good[0]});
  std::ofstream(dir + "/model.safetensors.index.json")
      << json({{"weight_map", {{good[0].first, "a.safetensors"}, {k, "a.safetensors"}}}}).dump();
  st = Import(dir, base + "/out");
  EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find("which does not hold it"), std::string::npos) << st.message();
  fs::remove(dir + "/model.safetensors.index.json");
  std::ofstream(dir + "/pytorch_model.bin") << "pickle";
  st = Import(dir, base + "/out");
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("pytorch_model.bin"), std::string::npos) << st.message();
  // The output: never overwritten, a leftover .tmp refused.
  fs::create_directories(base + "/full");
  std::ofstream(base + "/full/keep") << "mine";
  st = Import(base + "/hf", base + "/full");
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_EQ(Slurp(base + "/full/keep"), "mine");
  fs::create_directories(base + "/again.tmp");
  st = Import(base + "/hf", base + "/again");
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_FALSE(fs::exists(base + "/again"));
  st = Import(base + "/nothing", base + "/x");
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  fs::remove_all(base);
}

TEST(HfImportTest, ExportRefusesWhatNoArchitectureRepresents) {
  struct Refusal {
    const char* what;
    std::function<void(GptSpec&)> edit;
    const char* message;
  };
  const std::vector<Refusal> refusals = {
      {"rope with LayerNorm", [](GptSpec& s) { s.rmsnorm = false; }, "RoPE with LayerNorm"},
      {"rope with GELU", [](GptSpec& s) { s.swiglu = false; }, "RoPE with a GELU MLP"},
      {"partial rotary", [](GptSpec& s) { s.rotary_percent = 0.5; }, "partial rotary"},
      {"qk layernorm", [](GptSpec& s) { s.qk_layernorm = true; }, "--qk-layernorm"},
  };
  for (const Refusal& r : refusals) {
    GptSpec s = Llama(false, true, false);
    r.edit(s);
    HfArch arch;
    Status st = HfArchForSpec(s, &arch);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << r.what;
    EXPECT_NE(st.message().find(r.message), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("Hugging Face Llama cannot represent"), std::string::npos);
    EXPECT_NE(st.message().find("keel exports GPT-2"), std::string::npos);
  }
  const std::vector<Refusal> bloom = {
      {"no embedding LayerNorm", [](GptSpec& s) { s.embed_layernorm = false; },
       "ALiBi without a LayerNorm after the word embedding"},
      {"GQA", [](GptSpec& s) { s.SetKvHeads(2); }, "grouped-query attention"},
      {"untied", [](GptSpec& s) { s.untie_embeddings = true; }, "output layer of its own"},
      {"FFN", [](GptSpec& s) { s.ffn_hidden = 100; }, "FFN size 100"},
      {"no bias", [](GptSpec& s) { s.bias = false; }, "no linear biases"},
  };
  for (const Refusal& r : bloom) {
    GptSpec s = Bloom();
    r.edit(s);
    HfArch arch;
    Status st = HfArchForSpec(s, &arch);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << r.what;
    EXPECT_NE(st.message().find(r.message), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("Hugging Face BLOOM cannot represent"), std::string::npos);
  }
  GptSpec s = Gpt2(true);
  s.swiglu = true;
  HfArch arch;
  Status st = HfArchForSpec(s, &arch);
  EXPECT_NE(st.message().find("SwiGLU (--swiglu) with learned positions, which Hugging Face GPT-2 "
                              "cannot represent"),
            std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace keel
