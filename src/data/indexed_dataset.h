// Megatron's indexed dataset format (MMIDIDX version 1): PREFIX.bin holds the tokens of every
// document back to back; PREFIX.idx holds the index. Layout of .idx (little endian):
//   magic "MMIDIDX\0\0" (9 bytes) | version u64 = 1 | dtype code u8 |
//   sequence count u64 | document-index count u64 |
//   sizes i32[sequence count] | byte pointers i64[sequence count] | document index i64[count]
// dtype codes: 1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16. keel writes u16 when the
// vocabulary fits, else i32. One sequence per document; document index = 0, 1, ..., n.
// keel also writes PREFIX.meta.json: the tokenizer that produced the ids (kind, vocab size, EOD,
// model file) so training and sampling can decode them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "data/document_stream.h"

namespace keel {

struct DatasetMeta {
  std::string tokenizer;  // "gpt2" | "sentencepiece" | "hf"; empty: unknown (no meta.json)
  // sentencepiece: the .model file; hf: the Hugging Face tokenizer folder (relative to the
  // prefix's directory unless absolute).
  std::string tokenizer_model;
  int vocab_size = 0;
  int32_t eod_id = -1;
  // gpt2 with Megatron's --vocab-file / --merge-file (absolute); empty: the bundled npm files.
  std::string vocab_file{}, merge_file{};
};

class IndexedDatasetWriter {
 public:
  // dtype chosen from vocab_size: u16 if vocab_size <= 65535, else i32.
  IndexedDatasetWriter(Env* env, std::string prefix, int vocab_size);
  // A writer dropped before Finish (an error on the way) removes its temporary .bin: nothing
  // half-written stays behind, and an existing dataset of the same name is untouched.
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;
  Status Open();
  Status AddDocument(const std::vector<int32_t>& tokens);
  // Writes .idx and meta.json; .bin and .idx are written to temporary names and renamed, so a
  // crash never leaves a half-written dataset under the final name.
  Status Finish(const DatasetMeta& meta);

 private:
  Env* env_;
  std::string prefix_;
  int vocab_size_;
  uint8_t dtype_code_;
  std::unique_ptr<WritableFile> bin_;
  std::string buffer_;  // encoded tokens not yet appended to bin_
  bool finished_ = false;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
  int64_t offset_ = 0;
};

class IndexedDataset : public DocumentStream {
 public:
  // Opens PREFIX.idx/.bin (mmap) and checks them: magic, version, dtype, sizes consistent with
  // the .bin length. Errors name the file and the problem.
  static Status Open(Env* env, const std::string& prefix, std::unique_ptr<IndexedDataset>* out);

  size_t NumDocuments() const override { return sizes_.size(); }
  int64_t NumTokens() const override { return total_tokens_; }
  int32_t DocumentLength(size_t doc) const { return sizes_[doc]; }
  // Token `i` (0-based) of document `doc`.
  int32_t Token(size_t doc, int64_t i) const;
  // Copies `count` tokens starting at token `start` of the whole stream (documents concatenated).
  void ReadStream(int64_t start, int64_t count, int32_t* out) const override;
  // First token index in the stream of each document (size NumDocuments()+1).
  const std::vector<int64_t>& DocumentStarts() const override { return doc_starts_; }
  const DatasetMeta& meta() const { return meta_; }

 private:
  std::unique_ptr<ReadOnlyRegion> idx_, bin_;
  uint8_t dtype_code_ = 0;
  int elem_size_ = 0;
  std::vector<int32_t> sizes_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> doc_starts_;
  int64_t total_tokens_ = 0;
  DatasetMeta meta_;
};

}  // namespace keel
