// Shared by the Hugging Face export and import tests: running the independent numpy readers
// (tests/hf/hf_{gpt2,llama,bloom}_reference.py) and comparing their logits with keel's,
// models with random weights written as checkpoints in process, and small file helpers.
#pragma once

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
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/config.h"
#include "hf/hf_import.h"
#include "keel_test_paths.h"  // KEEL_BINARY, KEEL_SOURCE_DIR, KEEL_ASSETS_DIR
#include "model/gpt.h"

namespace keel::hf_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Result {
  int code;
  std::string out;  // stdout (and stderr unless redirected elsewhere)
};

inline Result Run(const std::string& cmd) {
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

inline Result RunKeel(const std::string& args) {
  return Run(std::string(KEEL_BINARY) + " " + args + " 2>&1");
}

inline std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

inline std::string TempDir(const std::string& name) {
  auto dir = fs::temp_directory_path() / ("keel_hf_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// A python3 that can import numpy: $KEEL_PYTHON, python3 on PATH, or Debian's /usr/bin/python3
// (where python3-numpy installs). Empty if none.
inline std::string PythonWithNumpy() {
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
  const std::string var = ::keel::hf_test::PythonWithNumpy();                                \
  ASSERT_FALSE(var.empty()) << "python3 with numpy is required by the HF export tests (the " \
                               "independent reference reader); run scripts/test.sh, which "  \
                               "installs python3-numpy"

// Runs reference reader `script` (hf_gpt2_reference.py, ...) on `folder`; returns its JSON (null
// on failure, with a test failure).
inline json Reference(const std::string& python, const std::string& script,
                      const std::string& folder, const std::vector<int32_t>& tokens,
                      const std::vector<int>& positions) {
  auto join = [](const auto& v) {
    std::string s;
    for (const auto& x : v) {
      if (!s.empty()) s += ',';
      s += std::to_string(x);
    }
    return s;
  };
  const std::string path = std::string(KEEL_SOURCE_DIR) + "/tests/hf/" + script;
  Result r = Run(python + " " + path + " " + folder + " --tokens " + join(tokens) +
                 " --positions " + join(positions) + " 2>&1");
  EXPECT_EQ(r.code, 0) << r.out;
  if (r.code != 0) return nullptr;
  json j = json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out.substr(0, 500);
  return j.is_discarded() ? json(nullptr) : j;
}

struct Comparison {
  double max_diff = 0;   // largest |keel - reference| over every compared logit
  double max_ratio = 0;  // largest row's max |keel - reference| / max(1, max |reference|)
  double max_logit = 0;  // largest |reference logit|
};

// Compares keel's logits with the reference's row by row.
inline Comparison CompareLogits(const std::vector<std::vector<float>>& keel, const json& ref,
                                int vocab) {
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
    c.max_logit = std::max(c.max_logit, scale);
  }
  return c;
}

constexpr double kTolerance = 1e-4;  // relative to the row's largest |logit| (at least 1)

// A model of `spec` on the CPU backend with every weight random: matrices and embeddings N(0,
// std), norm weights 1 + N(0, std), biases N(0, std), so that biases, norm weights and every
// layout reach the logits. Deterministic in `seed`.
inline std::unique_ptr<GptModel> RandomModel(Backend* be, const GptSpec& spec, uint32_t seed,
                                             float std = 0.2f) {
  auto model = std::make_unique<GptModel>(be, spec);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, std);
  std::vector<float> host;
  for (const ParamInfo& p : model->params()) {
    host.resize(p.numel);
    const bool norm_weight = p.name.find("layernorm.weight") != std::string::npos;
    for (float& v : host) v = (norm_weight ? 1.0f : 0.0f) + normal(rng);
    be->CopyToDevice(model->mutable_param_data() + p.offset, host.data(), p.numel);
  }
  return model;
}

// Writes `model` (config from TrainConfigForSpec) as a checkpoint run directory `dir` with no
// tokenizer of keel's; returns false (with a test failure) on error.
inline bool WriteCheckpoint(const std::string& dir, GptModel* model) {
  CheckpointTokenizer tok;
  tok.kind = "none";
  tok.vocab_size = model->spec().vocab;
  tok.eod_id = 0;
  TrainConfig cfg;
  std::vector<std::string> notes;
  Status st = TrainConfigForSpec(model->spec(), tok, &cfg, &notes);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (!st.ok()) return false;
  uint64_t bytes = 0;
  st = WriteImportedCheckpoint(Env::Default(), dir, cfg, model, tok, json::object(), nullptr,
                               &bytes);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return st.ok();
}

// keel's logits for `tokens` at `positions`.
inline std::vector<std::vector<float>> Logits(GptModel* model, const std::vector<int32_t>& tokens,
                                              const std::vector<int>& positions) {
  model->Forward(tokens.data(), nullptr, 1, static_cast<int>(tokens.size()), 0.0f);
  std::vector<std::vector<float>> out;
  for (int p : positions) out.push_back(model->LogitsAt(0, p));
  return out;
}

// A host copy of parameter `name` of `model`.
inline std::vector<float> Param(GptModel* model, const std::string& name) {
  const ParamInfo* p = model->FindParam(name);
  if (p == nullptr) return {};
  std::vector<float> out(p->numel);
  model->backend()->CopyToHost(out.data(), model->param_data() + p->offset, p->numel);
  return out;
}

}  // namespace keel::hf_test
