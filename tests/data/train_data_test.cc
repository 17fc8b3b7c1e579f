// TrainData: a mixture's (dataset, sample) sequence is BlendedDataset over each dataset's own
// seeded order, a pure function of the position (a reader that starts anywhere agrees with one
// that read from the start), each dataset's share holds over windows, exhausted datasets go on
// into a reshuffled epoch, shards read as one dataset, and datasets with different tokenizers
// are refused with a fix.
#include "data/train_data.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include "core/rng.h"
#include "data/indexed_dataset.h"
#include "data_test_util.h"

namespace keel {
namespace {

using datatest::TempDir;

// `docs` documents of 5..40 tokens, ids in [1, 200) tagged by `tag` in the first token, EOD 0.
void WriteDataset(const std::string& prefix, int docs, int tag,
                  DatasetMeta meta = {"gpt2", "", 512, 0}) {
  IndexedDatasetWriter w(Env::Default(), prefix, meta.vocab_size);
  ASSERT_TRUE(w.Open().ok());
  for (int d = 0; d < docs; ++d) {
    const int len =
        5 + static_cast<int>(U64At({7, RngPurpose::kTest, static_cast<uint64_t>(tag)}, d) % 36);
    std::vector<int32_t> doc(len);
    for (int i = 0; i < len; ++i)
      doc[i] =
          1 + static_cast<int32_t>(
                  U64At({9, RngPurpose::kTest, static_cast<uint64_t>(tag * 1000 + d)}, i) % 199);
    doc.push_back(0);
    ASSERT_TRUE(w.AddDocument(doc).ok());
  }
  ASSERT_TRUE(w.Finish(meta).ok());
}

std::unique_ptr<TrainData> Open(const std::vector<std::pair<double, std::string>>& blend,
                                uint64_t seed = 1) {
  std::unique_ptr<TrainData> td;
  Status st = TrainData::Open(Env::Default(), blend, "90,10,0", 16, seed, &td);
  EXPECT_TRUE(st.ok()) << st.message();
  return td;
}

TEST(TrainDataTest, MixtureIsBlendOverEachDatasetsOwnOrderAndResumesAnywhere) {
  TempDir dir;
  WriteDataset(dir.Join("a"), 300, 1);
  WriteDataset(dir.Join("b"), 200, 2);
  auto td = Open({{0.7, dir.Join("a")}, {0.3, dir.Join("b")}});
  ASSERT_EQ(td->NumDatasets(), 2);
  EXPECT_EQ(td->Names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_DOUBLE_EQ(td->source(0).weight, 0.7);

  BlendedDataset ref;
  ASSERT_TRUE(BlendedDataset::Create({0.7, 0.3}, "test", &ref).ok());
  std::vector<int32_t> got(17), want(17);
  std::vector<std::vector<int32_t>> seq;
  const int64_t n = 3000;
  int64_t count_a = 0;
  for (int64_t k = 0; k < n; ++k) {
    const SampleOrigin o = td->GetTrainSample(k, 0, got.data());
    const auto [d, c] = ref.Locate(k);
    ASSERT_EQ(o.dataset, d) << k;
    td->source(d).train->GetSample(c, want.data());
    ASSERT_EQ(got, want) << "position " << k;
    EXPECT_EQ(o.epoch, td->source(d).train->EpochOf(c));
    seq.push_back(got);
    if (o.dataset == 0 && k < 1000) ++count_a;
  }
  EXPECT_NEAR(static_cast<double>(count_a), 700.0, 2.0);

  // A reader opened afresh (a resumed run) and started at any position continues the sequence.
  for (int64_t start : {0, 1, 777, 2999, 1500}) {
    auto fresh = Open({{0.7, dir.Join("a")}, {0.3, dir.Join("b")}});
    for (int64_t k = start; k < std::min<int64_t>(n, start + 50); ++k) {
      fresh->GetTrainSample(k, 0, got.data());
      ASSERT_EQ(got, seq[static_cast<size_t>(k)]) << "resumed at " << start << ", position " << k;
    }
  }
  // Another seed is another order; another salt (the guard's re-seeding) too, deterministically.
  auto other = Open({{0.7, dir.Join("a")}, {0.3, dir.Join("b")}}, 2);
  int same = 0;
  for (int64_t k = 0; k < 100; ++k) {
    other->GetTrainSample(k, 0, got.data());
    same += got == seq[static_cast<size_t>(k)];
  }
  EXPECT_LT(same, 10);
  std::vector<int32_t> s1(17), s2(17);
  td->GetTrainSample(5, 1, s1.data());
  Open({{0.7, dir.Join("a")}, {0.3, dir.Join("b")}})->GetTrainSample(5, 1, s2.data());
  EXPECT_EQ(s1, s2);
  EXPECT_NE(s1, seq[5]);
}

TEST(TrainDataTest, ExhaustedDatasetStartsAReshuffledEpoch) {
  TempDir dir;
  WriteDataset(dir.Join("big"), 400, 3);
  WriteDataset(dir.Join("small"), 20, 4);
  auto td = Open({{0.5, dir.Join("big")}, {0.5, dir.Join("small")}});
  const int64_t per_epoch = td->source(1).train->SamplesPerEpoch();
  ASSERT_GT(per_epoch, 3);
  std::vector<std::vector<int32_t>> epochs[2];
  std::vector<int32_t> t(17);
  for (int64_t k = 0; static_cast<int64_t>(epochs[1].size()) < per_epoch; ++k) {
    const SampleOrigin o = td->GetTrainSample(k, 0, t.data());
    if (o.dataset != 1) continue;
    ASSERT_LE(o.epoch, 1);
    epochs[o.epoch].push_back(t);
  }
  ASSERT_EQ(static_cast<int64_t>(epochs[0].size()), per_epoch);
  // Epoch 2 holds the same samples in another order.
  EXPECT_NE(epochs[0], epochs[1]);
  auto sorted = [](std::vector<std::vector<int32_t>> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(epochs[0]), sorted(epochs[1]));
}

TEST(TrainDataTest, ShardsReadAsOneDataset) {
  TempDir dir;
  // The same 60 documents as one file and as three shards of 20.
  DatasetMeta meta{"gpt2", "", 512, 0};
  IndexedDatasetWriter whole(Env::Default(), dir.Join("whole"), 512);
  ASSERT_TRUE(whole.Open().ok());
  for (int s = 0; s < 3; ++s) {
    IndexedDatasetWriter w(Env::Default(), dir.Join("part_0" + std::to_string(s)), 512);
    ASSERT_TRUE(w.Open().ok());
    for (int d = 0; d < 20; ++d) {
      std::vector<int32_t> doc(7 + (s * 20 + d) % 13, 1 + s * 20 + d);
      doc.push_back(0);
      ASSERT_TRUE(w.AddDocument(doc).ok());
      ASSERT_TRUE(whole.AddDocument(doc).ok());
    }
    ASSERT_TRUE(w.Finish(meta).ok());
  }
  ASSERT_TRUE(whole.Finish(meta).ok());
  std::vector<std::string> shards;
  ASSERT_TRUE(ExpandShardPattern(Env::Default(), dir.Join("part_*"), &shards).ok());
  EXPECT_EQ(shards, (std::vector<std::string>{dir.Join("part_00"), dir.Join("part_01"),
                                              dir.Join("part_02")}));
  auto a = Open({{1, dir.Join("whole")}}), b = Open({{1, dir.Join("part_*")}});
  EXPECT_EQ(b->source(0).data->NumShards(), 3u);
  EXPECT_EQ(a->source(0).data->NumTokens(), b->source(0).data->NumTokens());
  std::vector<int32_t> x(17), y(17);
  for (int64_t k = 0; k < 200; ++k) {
    a->GetTrainSample(k, 0, x.data());
    b->GetTrainSample(k, 0, y.data());
    ASSERT_EQ(x, y) << k;
  }
  std::unique_ptr<TrainData> td;
  Status st = TrainData::Open(Env::Default(), {{1, dir.Join("nothing_*")}}, "90,10,0", 16, 1, &td);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("no shard matches"), std::string::npos) << st.message();
}

// Locate names, for every token of train and validation samples (a mixture, shards of different
// sizes, empty documents, a re-seeded order), the shard, document and token from which `keel data
// verify SHARD` reads that very id.
TEST(TrainDataTest, LocateFindsTheShardDocumentAndTokenOfEverySampleToken) {
  TempDir dir;
  for (int s = 0; s < 3; ++s) {
    IndexedDatasetWriter w(Env::Default(), dir.Join("part_0" + std::to_string(s)), 512);
    ASSERT_TRUE(w.Open().ok());
    for (int d = 0; d < 12 + 9 * s; ++d) {
      const int len = d % 5 == 3 ? 0 : 3 + (s * 31 + d * 7) % 17;
      std::vector<int32_t> doc(len);
      for (int i = 0; i < len; ++i)
        doc[i] =
            1 + static_cast<int32_t>(
                    U64At({3, RngPurpose::kTest, static_cast<uint64_t>(s * 100 + d)}, i) % 500);
      ASSERT_TRUE(w.AddDocument(doc).ok());
    }
    ASSERT_TRUE(w.Finish({"gpt2", "", 512, 0}).ok());
  }
  WriteDataset(dir.Join("b"), 80, 2);
  auto td = Open({{0.6, dir.Join("part_*")}, {0.4, dir.Join("b")}});
  ASSERT_EQ(td->source(0).shards.size(), 3u);
  std::map<std::string, std::unique_ptr<IndexedDataset>> files;
  std::set<std::string> shards_seen;
  std::vector<int32_t> t(17);
  auto check = [&](const SampleOrigin& o, const std::string& what) {
    for (int off = 0; off <= 16; ++off) {
      SCOPED_TRACE(what + ", token " + std::to_string(off));
      const TokenLocation l = td->Locate(o, off);
      ASSERT_EQ(l.dataset, o.dataset);
      EXPECT_EQ(l.name, td->source(o.dataset).name);
      EXPECT_EQ(l.prefix, td->source(o.dataset).prefix);
      EXPECT_EQ(l.sharded, o.dataset == 0);
      std::unique_ptr<IndexedDataset>& f = files[l.shard];
      if (!f) {
        ASSERT_TRUE(IndexedDataset::Open(Env::Default(), l.shard, &f).ok()) << l.shard;
      }
      ASSERT_GE(l.document, 0);
      ASSERT_LT(l.document, static_cast<int64_t>(f->NumDocuments()));
      ASSERT_GE(l.token, 0);
      ASSERT_LT(l.token, f->DocumentLength(static_cast<size_t>(l.document)));
      ASSERT_EQ(f->Token(static_cast<size_t>(l.document), l.token), t[off]);
      shards_seen.insert(l.shard);
    }
  };
  for (uint64_t salt : {0, 1}) {
    for (int64_t k = 0; k < 300; ++k) {
      const SampleOrigin o = td->GetTrainSample(k, salt, t.data());
      check(o, "train sample " + std::to_string(k) + " salt " + std::to_string(salt));
      if (HasFatalFailure()) return;
    }
  }
  for (int d = 0; d < 2; ++d) {
    ASSERT_NE(td->source(d).valid, nullptr);
    for (int64_t k = 0; k < 20; ++k) {
      const SampleOrigin o = td->GetValidSample(d, k, t.data());
      check(o, "validation sample " + std::to_string(k) + " of dataset " + std::to_string(d));
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_EQ(shards_seen.size(), 4u);  // every shard of the first dataset, and the second
}

TEST(TrainDataTest, DatasetsWithDifferentTokenizersAreRefusedWithAFix) {
  TempDir dir;
  WriteDataset(dir.Join("a"), 50, 1);
  WriteDataset(dir.Join("b"), 50, 2, {"gpt2", "", 1024, 0});
  std::unique_ptr<TrainData> td;
  Status st = TrainData::Open(Env::Default(), {{1, dir.Join("a")}, {1, dir.Join("b")}}, "90,10,0",
                              16, 1, &td);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("vocab 1024"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("keel data prepare"), std::string::npos) << st.message();
  // Two sentencepiece models of the same size are different vocabularies too.
  std::ofstream(dir.Join("a.model")) << "model one";
  std::ofstream(dir.Join("c.model")) << "model two";
  WriteDataset(dir.Join("sa"), 50, 1, {"sentencepiece", "a.model", 512, 0});
  WriteDataset(dir.Join("sc"), 50, 2, {"sentencepiece", "c.model", 512, 0});
  st = TrainData::Open(Env::Default(), {{1, dir.Join("sa")}, {1, dir.Join("sc")}}, "90,10,0", 16, 1,
                       &td);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("different sentencepiece models"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("--tokenizer-model"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace keel
