#include "data/indexed_dataset.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "data_test_util.h"

namespace keel {
namespace {

using datatest::ReadTextFile;
using datatest::TempDir;
using datatest::WriteTextFile;

const std::vector<std::vector<int32_t>> kDocs = {{1, 2, 3}, {}, {4, 5}, {6}, {7, 8, 9, 10}};

Status WriteDataset(const std::string& prefix, int vocab_size,
                    const std::vector<std::vector<int32_t>>& docs, DatasetMeta meta = {}) {
  IndexedDatasetWriter writer(Env::Default(), prefix, vocab_size);
  KEEL_RETURN_IF_ERROR(writer.Open());
  for (const auto& d : docs) KEEL_RETURN_IF_ERROR(writer.AddDocument(d));
  return writer.Finish(meta);
}

std::vector<int32_t> Concat(const std::vector<std::vector<int32_t>>& docs) {
  std::vector<int32_t> all;
  for (const auto& d : docs) all.insert(all.end(), d.begin(), d.end());
  return all;
}

// Checks that `ds` holds exactly `docs`, through every accessor.
void ExpectHolds(const IndexedDataset& ds, const std::vector<std::vector<int32_t>>& docs) {
  ASSERT_EQ(ds.NumDocuments(), docs.size());
  const std::vector<int32_t> all = Concat(docs);
  EXPECT_EQ(ds.NumTokens(), static_cast<int64_t>(all.size()));
  ASSERT_EQ(ds.DocumentStarts().size(), docs.size() + 1);
  int64_t start = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    EXPECT_EQ(ds.DocumentStarts()[d], start);
    EXPECT_EQ(ds.DocumentLength(d), static_cast<int32_t>(docs[d].size()));
    for (size_t i = 0; i < docs[d].size(); ++i) EXPECT_EQ(ds.Token(d, i), docs[d][i]);
    start += docs[d].size();
  }
  // Every window of the stream, including ones spanning (empty) documents.
  for (int64_t b = 0; b <= static_cast<int64_t>(all.size()); ++b) {
    for (int64_t n = 0; b + n <= static_cast<int64_t>(all.size()); ++n) {
      std::vector<int32_t> got(n);
      ds.ReadStream(b, n, got.data());
      EXPECT_EQ(got, std::vector<int32_t>(all.begin() + b, all.begin() + b + n));
    }
  }
}

uint8_t DtypeByte(const std::string& prefix) {
  return ReadTextFile(prefix + ".idx")[17];
}

TEST(IndexedDataset, RoundTripU16WithMeta) {
  TempDir dir;
  const std::string prefix = dir.Join("ds");
  DatasetMeta meta{"sentencepiece", "ds.model", 1000, 1};
  ASSERT_TRUE(WriteDataset(prefix, 1000, kDocs, meta).ok());
  EXPECT_EQ(DtypeByte(prefix), 8);  // u16
  uint64_t bin_size = 0;
  ASSERT_TRUE(Env::Default()->GetFileSize(prefix + ".bin", &bin_size).ok());
  EXPECT_EQ(bin_size, 2 * Concat(kDocs).size());
  std::unique_ptr<IndexedDataset> ds;
  Status st = IndexedDataset::Open(Env::Default(), prefix, &ds);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ExpectHolds(*ds, kDocs);
  EXPECT_EQ(ds->meta().tokenizer, "sentencepiece");
  EXPECT_EQ(ds->meta().tokenizer_model, "ds.model");
  EXPECT_EQ(ds->meta().vocab_size, 1000);
  EXPECT_EQ(ds->meta().eod_id, 1);
  // No temporary files remain.
  std::vector<std::string> names;
  ASSERT_TRUE(Env::Default()->GetChildren(dir.path(), &names).ok());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"ds.bin", "ds.idx", "ds.meta.json"}));
}

TEST(IndexedDataset, RoundTripI32ForLargeVocabularies) {
  TempDir dir;
  const std::string prefix = dir.Join("big");
  const std::vector<std::vector<int32_t>> docs = {{0, 65535, 65536}, {99999}, {70000, 1}};
  ASSERT_TRUE(WriteDataset(prefix, 100000, docs).ok());
  EXPECT_EQ(DtypeByte(prefix), 4);  // i32
  std::unique_ptr<IndexedDataset> ds;
  ASSERT_TRUE(IndexedDataset::Open(Env::Default(), prefix, &ds).ok());
  ExpectHolds(*ds, docs);
}

TEST(IndexedDataset, EmptyDatasetAndRewrite) {
  TempDir dir;
  const std::string prefix = dir.Join("ds");
  ASSERT_TRUE(WriteDataset(prefix, 50257, {}).ok());
  std::unique_ptr<IndexedDataset> ds;
  ASSERT_TRUE(IndexedDataset::Open(Env::Default(), prefix, &ds).ok());
  EXPECT_EQ(ds->NumDocuments(), 0u);
  EXPECT_EQ(ds->NumTokens(), 0);
  ds.reset();
  // Writing again over an existing dataset replaces it.
  ASSERT_TRUE(WriteDataset(prefix, 50257, kDocs).ok());
  ASSERT_TRUE(IndexedDataset::Open(Env::Default(), prefix, &ds).ok());
  ExpectHolds(*ds, kDocs);
}

TEST(IndexedDataset, WriterRejectsIdsOutsideVocabulary) {
  TempDir dir;
  IndexedDatasetWriter writer(Env::Default(), dir.Join("ds"), 100);
  ASSERT_TRUE(writer.Open().ok());
  EXPECT_EQ(writer.AddDocument({1, 100}).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(writer.AddDocument({-1}).code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(writer.AddDocument({99}).ok());
}

TEST(IndexedDataset, MissingMetaIsAllowed) {
  TempDir dir;
  const std::string prefix = dir.Join("ds");
  ASSERT_TRUE(WriteDataset(prefix, 1000, kDocs, {"gpt2", "", 1000, 3}).ok());
  ASSERT_TRUE(Env::Default()->RemoveFile(prefix + ".meta.json").ok());
  std::unique_ptr<IndexedDataset> ds;
  ASSERT_TRUE(IndexedDataset::Open(Env::Default(), prefix, &ds).ok());
  EXPECT_EQ(ds->meta().tokenizer, "");
  EXPECT_EQ(ds->meta().vocab_size, 0);
  EXPECT_EQ(ds->meta().eod_id, -1);
  ExpectHolds(*ds, kDocs);
}

// Writes a Megatron dataset by hand, as another tool would, with elements of type T.
template <typename T>
void WriteForeign(const std::string& prefix, uint8_t dtype,
                  const std::vector<std::vector<T>>& docs) {
  std::string idx("MMIDIDX\0\0", 9), bin;
  auto put = [](std::string* s, auto v) {
    s->append(reinterpret_cast<const char*>(&v), sizeof(v));
  };
  put(&idx, uint64_t{1});
  put(&idx, dtype);
  put(&idx, uint64_t{docs.size()});
  put(&idx, uint64_t{docs.size() + 1});
  for (const auto& d : docs) put(&idx, static_cast<int32_t>(d.size()));
  int64_t offset = 0;
  for (const auto& d : docs) {
    put(&idx, offset);
    offset += d.size() * sizeof(T);
  }
  for (size_t i = 0; i <= docs.size(); ++i) put(&idx, static_cast<int64_t>(i));
  for (const auto& d : docs)
    for (T v : d) put(&bin, v);
  WriteTextFile(prefix + ".idx", idx);
  WriteTextFile(prefix + ".bin", bin);
}

template <typename T>
void ExpectForeignReads(uint8_t dtype, const std::vector<std::vector<T>>& docs) {
  TempDir dir;
  const std::string prefix = dir.Join("foreign");
  WriteForeign<T>(prefix, dtype, docs);
  std::unique_ptr<IndexedDataset> ds;
  Status st = IndexedDataset::Open(Env::Default(), prefix, &ds);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::vector<std::vector<int32_t>> expected;
  for (const auto& d : docs) expected.emplace_back(d.begin(), d.end());
  ExpectHolds(*ds, expected);
}

TEST(IndexedDataset, ReadsEveryIntegerDtype) {
  ExpectForeignReads<uint8_t>(1, {{0, 200, 255}, {7}});
  ExpectForeignReads<int8_t>(2, {{0, 100, 127}, {5, 6}});
  ExpectForeignReads<int16_t>(3, {{0, 30000}, {12345, 1}});
  ExpectForeignReads<int32_t>(4, {{0, 1 << 20}, {3}});
  ExpectForeignReads<int64_t>(5, {{0, 50256}, {1, 2, 3}});
  ExpectForeignReads<uint16_t>(8, {{65535, 0}, {50256}});
}

// Each malformation must give an error that names the offending file.
class MalformedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = dir_.Join("ds");
    ASSERT_TRUE(WriteDataset(prefix_, 1000, kDocs).ok());
    idx_ = ReadTextFile(prefix_ + ".idx");
    bin_ = ReadTextFile(prefix_ + ".bin");
  }
  // Opens the dataset and expects failure with `code`, naming `file` and containing `words`.
  void ExpectError(Status::Code code, const std::string& file, const std::string& words) {
    std::unique_ptr<IndexedDataset> ds;
    Status st = IndexedDataset::Open(Env::Default(), prefix_, &ds);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), code) << st.ToString();
    EXPECT_NE(st.message().find(file), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find(words), std::string::npos) << st.ToString();
  }
  TempDir dir_;
  std::string prefix_, idx_, bin_;
};

TEST_F(MalformedDatasetTest, MissingFiles) {
  ASSERT_TRUE(Env::Default()->RemoveFile(prefix_ + ".bin").ok());
  ExpectError(Status::Code::kNotFound, prefix_ + ".bin", "not found");
  ASSERT_TRUE(Env::Default()->RemoveFile(prefix_ + ".idx").ok());
  ExpectError(Status::Code::kNotFound, prefix_ + ".idx", "not found");
}

TEST_F(MalformedDatasetTest, BadMagic) {
  idx_[0] = 'X';
  WriteTextFile(prefix_ + ".idx", idx_);
  ExpectError(Status::Code::kCorruption, prefix_ + ".idx", "bad magic");
}

TEST_F(MalformedDatasetTest, WrongVersion) {
  idx_[9] = 2;
  WriteTextFile(prefix_ + ".idx", idx_);
  ExpectError(Status::Code::kCorruption, prefix_ + ".idx", "unsupported version 2");
}

TEST_F(MalformedDatasetTest, UnknownDtype) {
  idx_[17] = 9;
  WriteTextFile(prefix_ + ".idx", idx_);
  ExpectError(Status::Code::kCorruption, prefix_ + ".idx", "unknown dtype code 9");
  idx_[17] = 7;  // f32 is a known code, but not for token ids
  WriteTextFile(prefix_ + ".idx", idx_);
  ExpectError(Status::Code::kCorruption, prefix_ + ".idx", "dtype code 7");
}

TEST_F(MalformedDatasetTest, TruncatedIndex) {
  for (size_t len : {size_t{0}, size_t{5}, size_t{20}, idx_.size() - 1, idx_.size() - 30}) {
    WriteTextFile(prefix_ + ".idx", idx_.substr(0, len));
    ExpectError(Status::Code::kCorruption, prefix_ + ".idx", "truncated");
  }
}

TEST_F(MalformedDatasetTest, TrailingBytesInIndex) {
  WriteTextFile(prefix_ + ".idx", idx_ + std::string(8, '\0'));
  ExpectError(Status::Code::kCorruption, prefix_ + ".idx", "unexpected bytes");
}

TEST_F(MalformedDatasetTest, TruncatedBin) {
  WriteTextFile(prefix_ + ".bin", bin_.substr(0, bin_.size() - 1));
  ExpectError(Status::Code::kCorruption, prefix_ + ".bin", "truncated");
}

TEST_F(MalformedDatasetTest, BinLongerThanIndexSays) {
  WriteTextFile(prefix_ + ".bin", bin_ + "xx");
  ExpectError(Status::Code::kCorruption, prefix_ + ".bin", "do not belong together");
}

TEST_F(MalformedDatasetTest, NegativeSize) {
  const int32_t minus_one = -1;
  std::memcpy(idx_.data() + 34, &minus_one, 4);
  WriteTextFile(prefix_ + ".idx", idx_);
  ExpectError(Status::Code::kCorruption, prefix_ + ".idx", "negative size");
}

TEST_F(MalformedDatasetTest, BadMetaJson) {
  WriteTextFile(prefix_ + ".meta.json", "{\"tokenizer\": 3");
  ExpectError(Status::Code::kCorruption, prefix_ + ".meta.json", "not a JSON object");
  WriteTextFile(prefix_ + ".meta.json", "{\"tokenizer\": \"bpe-9000\"}");
  ExpectError(Status::Code::kCorruption, prefix_ + ".meta.json", "unknown tokenizer");
}

// Found by fuzz/indexed_dataset_fuzz: a vocab_size written with an exponent (2e22) was converted
// to int with undefined behaviour, and one beyond 32 bits was silently truncated.
TEST_F(MalformedDatasetTest, MetaNumbersMustBe32BitIntegers) {
  for (const char* meta :
       {"{\"vocab_size\": 2e22}", "{\"vocab_size\": 4294967296}", "{\"vocab_size\": 400.5}",
        "{\"eod_id\": \"1\"}", "{\"tokenizer_model\": 7}"}) {
    WriteTextFile(prefix_ + ".meta.json", meta);
    ExpectError(Status::Code::kCorruption, prefix_ + ".meta.json", "must be");
  }
  WriteTextFile(prefix_ + ".meta.json", "{\"vocab_size\": 400, \"eod_id\": 1}");
  std::unique_ptr<IndexedDataset> ds;
  ASSERT_TRUE(IndexedDataset::Open(Env::Default(), prefix_, &ds).ok());
  EXPECT_EQ(ds->meta().vocab_size, 400);
  EXPECT_EQ(ds->meta().eod_id, 1);
}

// A field of the wrong type names the file, the key, what it must be and the fix, never a bare
// nlohmann message.
TEST_F(MalformedDatasetTest, MetaFieldOfTheWrongTypeNamesTheKey) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"vocab_size": "1000"})",
       "key 'vocab_size' must be an integer, but is the string \"1000\""},
      {R"({"eod_id": 1.5})", "key 'eod_id' must be an integer, but is the number 1.5"},
      {R"({"tokenizer": 3})", "key 'tokenizer' must be a string, but is the number 3"},
      {R"({"vocab_size": 99999999999})", "key 'vocab_size' must be an integer from"},
  };
  for (const auto& [meta, words] : cases) {
    WriteTextFile(prefix_ + ".meta.json", meta);
    ExpectError(Status::Code::kCorruption, prefix_ + ".meta.json", words);
    ExpectError(Status::Code::kCorruption, prefix_ + ".meta.json", "`keel data prepare`");
    std::unique_ptr<IndexedDataset> ds;
    const Status st = IndexedDataset::Open(Env::Default(), prefix_, &ds);
    EXPECT_EQ(st.message().find("json.exception"), std::string::npos) << st.ToString();
  }
}

// A directory where a dataset prefix belongs says what a prefix is and which datasets the
// directory holds; a directory named like one of the files says that, not "No such device".
TEST_F(MalformedDatasetTest, DirectoryIsNotADatasetPrefix) {
  std::unique_ptr<IndexedDataset> ds;
  Status st = IndexedDataset::Open(Env::Default(), dir_.path(), &ds);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("'" + dir_.path() + "' is a directory, not a dataset prefix"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("named by their common PREFIX (e.g. data/my-corpus"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("it holds the dataset " + prefix_ + ": pass that"), std::string::npos)
      << st.message();

  const std::string odd = dir_.Join("odd");
  std::filesystem::create_directories(odd + ".idx");
  std::filesystem::create_directories(odd + ".bin");
  st = IndexedDataset::Open(Env::Default(), odd, &ds);
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("dataset file '" + odd + ".idx' is a directory, not a file"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(st.message().find("No such device"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace keel
