// The table of the model's shape fields (config/model_shape.h): every field round-trips through a
// checkpoint's `model` JSON, a checkpoint without an optional key reads the table's default, the
// files keep the bytes they had, and one limit refuses a value from a config and from a
// checkpoint alike, naming the setting's flag.
#include "config/model_shape.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/resume.h"
#include "checkpoint/train_checkpoint.h"
#include "config/config.h"
#include "config/config_internal.h"
#include "core/json_reader.h"
#include "hf/hf_config.h"

namespace keel {
namespace {

using json = nlohmann::json;

// Every field away from its default (RoPE with Llama 3 scaling; linear scaling is the other
// spec, as the two exclude each other).
GptSpec Everything() {
  GptSpec s;
  s.num_layers = 3;
  s.hidden = 96;
  s.ffn_hidden = 160;
  s.heads = 6;
  s.max_positions = 48;
  s.vocab = 1000;
  s.padded_vocab = 1024;
  s.embed_layernorm = true;
  s.layernorm_eps = 1e-6f;
  s.qk_layernorm = true;
  s.qk_layernorm_eps = 1e-3f;
  s.z_loss = 1e-4;
  s.reset_position_ids = true;
  s.reset_attention_mask = true;
  s.eod_id = 7;
  s.rope = true;
  s.rotary_base = 500000;
  s.rotary_percent = 0.5;
  s.rope_llama3 = true;
  s.rope_llama3_factor = 32;
  s.rope_low_freq_factor = 2;
  s.rope_high_freq_factor = 8;
  s.rope_original_max_positions = 4096;
  s.rmsnorm = true;
  s.swiglu = true;
  s.SetKvHeads(2);
  s.untie_embeddings = true;
  s.bias = false;
  return s;
}

GptSpec RoundTrip(const GptSpec& s) {
  const json doc = {{"model", ShapeToJson(s)}};
  JsonReader r("state.json", doc, "fix");
  GptSpec back;
  ShapeFromJson(r.root()["model"], &back);
  EXPECT_TRUE(r.status().ok()) << r.status().ToString();
  return back;
}

TEST(ModelShapeTest, EveryFieldRoundTripsThroughTheCheckpointJson) {
  GptSpec linear = Everything();
  linear.rope_llama3 = false;
  linear.rope_interpolation_factor = 4;
  for (const GptSpec& s : {GptSpec{}, Everything(), linear}) {
    const GptSpec back = RoundTrip(s);
    EXPECT_EQ(ShapeToJson(back), ShapeToJson(s));
    // And every value the model reads came back, not just the file.
    EXPECT_EQ(back.num_layers, s.num_layers);
    EXPECT_EQ(back.KvHeads(), s.KvHeads());
    EXPECT_EQ(back.RopeLlama3(), s.RopeLlama3());
    EXPECT_EQ(back.RopeLinearFactor(), s.RopeLinearFactor());
    EXPECT_EQ(back.ZLoss(), s.ZLoss());
    EXPECT_EQ(back.layernorm_eps, s.layernorm_eps);
    EXPECT_EQ(back.QkLayerNormEps(), s.QkLayerNormEps());
    EXPECT_EQ(back.bias, s.bias);
    EXPECT_EQ(back.eod_id, s.eod_id);
    // The Llama 3 band edges are kept where the scaling is on (only there are they in the file).
    if (s.RopeLlama3()) {
      EXPECT_EQ(back.rope_original_max_positions, s.rope_original_max_positions);
    }
  }
}

// The bytes keel wrote before the table (checkpoints compare and hash these files): RoPE scaling
// only where it is on, z-loss as the fp32 the model uses, rotary_base as a double.
TEST(ModelShapeTest, TheCheckpointJsonKeepsItsBytes) {
  GptSpec s;
  s.ffn_hidden = 1024;
  s.max_positions = 128;
  s.vocab = 4096;
  s.padded_vocab = 4096;
  s.eod_id = 1;
  s.z_loss = 1e-4;
  EXPECT_EQ(ShapeToJson(s).dump(),
            R"({"alibi":false,"bias":true,"embed_layernorm":false,"eod_id":1,"ffn_hidden":1024,)"
            R"("heads":4,"hidden":256,"kv_heads":0,"layernorm_eps":9.999999747378752e-06,)"
            R"("max_positions":128,"num_layers":4,"padded_vocab":4096,"qk_layernorm":false,)"
            R"("reset_attention_mask":false,"reset_position_ids":false,"rmsnorm":false,)"
            R"("rope":false,"rotary_base":10000.0,"rotary_percent":1.0,"swiglu":false,)"
            R"("untie_embeddings":false,"vocab":4096,"z_loss":9.999999747378752e-05})");
  const json everything = ShapeToJson(Everything());
  EXPECT_EQ(everything["rope_llama3"].dump(),
            R"({"factor":32.0,"high_freq_factor":8.0,"low_freq_factor":2.0,)"
            R"("original_max_positions":4096})");
  EXPECT_EQ(everything["kv_heads"], 2);
  EXPECT_FALSE(everything.contains("rope_linear_factor"));
  EXPECT_EQ(everything["qk_layernorm_eps"], 1e-3f);
  // QK-LayerNorm at the LayerNorm epsilon (the default, or given equal): the file of before.
  s.qk_layernorm = true;
  EXPECT_FALSE(ShapeToJson(s).contains("qk_layernorm_eps"));
  s.qk_layernorm_eps = s.layernorm_eps;
  EXPECT_FALSE(ShapeToJson(s).contains("qk_layernorm_eps"));
}

// The keys added after the first format are optional; a checkpoint without them reads the value
// the model had before they existed.
TEST(ModelShapeTest, ACheckpointWithoutAnOptionalKeyGetsTheTablesDefault) {
  json m = ShapeToJson(Everything());
  for (const char* key :
       {"qk_layernorm", "z_loss", "reset_position_ids", "reset_attention_mask", "eod_id", "rope",
        "rotary_base", "rotary_percent", "rmsnorm", "swiglu", "kv_heads", "untie_embeddings",
        "bias", "rope_llama3", "qk_layernorm_eps"})
    m.erase(key);
  const json doc = {{"model", m}};
  JsonReader r("state.json", doc, "fix");
  GptSpec s;
  ShapeFromJson(r.root()["model"], &s);
  ASSERT_TRUE(r.status().ok()) << r.status().ToString();
  EXPECT_FALSE(s.qk_layernorm);
  EXPECT_EQ(s.qk_layernorm_eps, 0);  // QK-LayerNorm, if on, at the LayerNorm epsilon
  EXPECT_EQ(s.z_loss, 0);
  EXPECT_EQ(s.eod_id, -1);
  EXPECT_FALSE(s.rope);
  EXPECT_EQ(s.rotary_base, 10000);
  EXPECT_EQ(s.rotary_percent, 1.0);
  EXPECT_EQ(s.KvHeads(), s.heads);
  EXPECT_TRUE(s.bias);
  EXPECT_FALSE(s.rope_llama3);
  // The first format's keys stay required.
  m.erase("hidden");
  const json doc2 = {{"model", m}};
  JsonReader r2("state.json", doc2, "fix");
  ShapeFromJson(r2.root()["model"], &s);
  EXPECT_NE(r2.status().message().find("key 'model.hidden' is missing"), std::string::npos)
      << r2.status().ToString();
}

// One limit, two sources: a config's flag and a checkpoint's JSON are refused by the same rule,
// and both messages name the setting's flag.
TEST(ModelShapeTest, AValueOutOfItsLimitsIsRefusedFromAConfigAndFromACheckpoint) {
  struct Case {
    std::vector<std::string> flags;
    std::function<void(json*)> edit;
    std::string words;
  };
  const std::vector<Case> cases = {
      {{"--num-layers", "0"},
       [](json* m) { (*m)["num_layers"] = 0; },
       "--num-layers 0 must be positive"},
      {{"--hidden-size", "600000000"},
       [](json* m) { (*m)["hidden"] = 600000000; },
       "--hidden-size 600000000 is more than 536870911"},
      {{"--layernorm-epsilon", "0"},
       [](json* m) { (*m)["layernorm_eps"] = 0.0; },
       "--layernorm-epsilon 0 must be positive"},
      {{"--position-embedding-type", "rope", "--rotary-percent", "1.5"},
       [](json* m) {
         (*m)["rope"] = true;
         (*m)["rotary_percent"] = 1.5;
       },
       "--rotary-percent 1.5 must be in (0, 1]"},
      {{"--qk-layernorm-epsilon", "1e-06"},
       [](json* m) { (*m)["qk_layernorm_eps"] = 1e-6; },
       "--qk-layernorm-epsilon 1e-06 is the epsilon of QK-LayerNorm, which is off"},
      {{"--group-query-attention", "--num-query-groups", "3"},
       [](json* m) { (*m)["kv_heads"] = 3; },
       "--num-query-groups 3 must divide --num-attention-heads 4"},
  };
  GptSpec good;
  good.ffn_hidden = 1024;
  good.max_positions = 128;
  good.vocab = 100;
  good.padded_vocab = 128;
  for (const Case& c : cases) {
    std::vector<std::string> args = {"train"};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    ParsedConfig p;
    const Status from_config = ParseTrainArgs(static_cast<int>(argv.size()), argv.data(), &p);
    EXPECT_EQ(from_config.code(), Status::Code::kInvalidArgument) << c.words;
    EXPECT_NE(from_config.message().find(c.words), std::string::npos) << from_config.ToString();

    json m = ShapeToJson(good);
    c.edit(&m);
    GptSpec s;
    const Status from_checkpoint = SpecFromJson(m, "iter_0000001/state.json", &s);
    EXPECT_EQ(from_checkpoint.code(), Status::Code::kCorruption) << c.words;
    EXPECT_NE(from_checkpoint.message().find("describes no model keel can build: " + c.words),
              std::string::npos)
        << from_checkpoint.ToString();
  }
}

// The table names settings that exist, and every setting of the shape is one a resume refuses
// to change (but z-loss and the document resets, which are the scheduler's and the data's).
TEST(ModelShapeTest, TheTableNamesSettingsAndTheResumeRules) {
  std::set<std::string> keys;
  for (const ShapeField& f : ShapeFields()) {
    if (!f.json_key.empty()) keys.insert(f.json_key);
    if (f.setting.empty()) continue;
    EXPECT_NE(config_internal::FindSetting(f.setting), nullptr) << f.setting;
    const ConfigChange::Kind kind = ResumeKindOfKey(f.setting);
    if (f.resumable)
      EXPECT_NE(kind, ConfigChange::Kind::kShape) << f.setting;
    else
      EXPECT_EQ(kind, ConfigChange::Kind::kShape) << f.setting;
  }
  // Every key a checkpoint holds is a row's.
  const json everything = ShapeToJson(Everything());
  for (auto it = everything.begin(); it != everything.end(); ++it)
    EXPECT_TRUE(keys.count(it.key())) << it.key();
}

// The sizes that are one config.json integer are written under the table's Hugging Face key of
// each architecture (and read from it: tests/hf's imports).
TEST(ModelShapeTest, TheHuggingFaceKeysOfTheSizesAreTheTables) {
  GptSpec s = Everything();
  int rows = 0;
  for (HfArch arch : {HfArch::kGpt2, HfArch::kLlama, HfArch::kBloom}) {
    const nlohmann::ordered_json c = HfConfigJson(arch, s, 0);
    for (const ShapeField& f : ShapeFields()) {
      const auto& keys = f.hf_keys[static_cast<int>(arch)];
      if (f.hf_member == nullptr || keys.empty()) continue;
      ++rows;
      ASSERT_TRUE(c.contains(keys[0])) << keys[0];
      EXPECT_EQ(c[keys[0]], s.*f.hf_member) << keys[0];
    }
  }
  EXPECT_EQ(rows, 5 + 6 + 4);  // GPT-2's FFN and BLOOM's positions are not 1:1
}

}  // namespace
}  // namespace keel
