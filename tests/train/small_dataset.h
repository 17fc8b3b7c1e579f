// The small SentencePiece dataset the in-process run tests train on: 400 generated documents of
// corpus seed `seed`, vocabulary 300, prepared once per test process and seed and removed when
// the process exits.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "../data/data_test_util.h"
#include "core/env.h"
#include "data/prepare.h"

namespace keel::datatest {

inline const std::string& SmallDatasetPrefix(uint32_t seed) {
  struct Prepared {
    TempDir dir;
    std::string prefix;
  };
  static std::map<uint32_t, std::unique_ptr<Prepared>> prepared;
  std::unique_ptr<Prepared>& p = prepared[seed];
  if (p == nullptr) {
    p = std::make_unique<Prepared>();
    PrepareOptions options;
    options.inputs.push_back(p->dir.Join("corpus.txt"));
    WriteTextFile(options.inputs.back(), GeneratedCorpus(400, seed));
    options.output_prefix = p->dir.Join("data/corpus");
    options.tokenizer = "sentencepiece";
    options.vocab_size = 300;
    PrepareStats stats;
    const Status st = PrepareDataset(Env::Default(), options, &stats);
    EXPECT_TRUE(st.ok()) << st.ToString();
    p->prefix = options.output_prefix;
  }
  return p->prefix;
}

}  // namespace keel::datatest
