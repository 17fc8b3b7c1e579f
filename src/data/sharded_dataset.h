// ShardedDataset: one dataset stored as several Megatron indexed datasets (shards), read as one
// stream of documents in shard order. A --data-path PREFIX with '*' or '?' names the shards:
// every PREFIX-pattern match of a .idx file, sorted by name (cm4/part_* -> part_00, part_01 ...).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/env.h"
#include "core/status.h"
#include "data/document_stream.h"
#include "data/indexed_dataset.h"

namespace keel {

class ShardedDataset : public DocumentStream {
 public:
  // Opens each shard (IndexedDataset::Open checks it). Shards must agree on the tokenizer
  // (kind, vocabulary, EOD); an error names the first that does not.
  static Status Open(Env* env, const std::vector<std::string>& prefixes,
                     std::unique_ptr<ShardedDataset>* out);

  size_t NumDocuments() const override { return doc_starts_.size() - 1; }
  int64_t NumTokens() const override { return doc_starts_.back(); }
  const std::vector<int64_t>& DocumentStarts() const override { return doc_starts_; }
  void ReadStream(int64_t start, int64_t count, int32_t* out) const override;

  // Where stream position `pos` (0 <= pos < NumTokens()) lies: its shard, the document within
  // that shard and the token within that document (what `keel data verify SHARD` reports).
  struct Position {
    size_t shard = 0;
    int64_t document = 0;
    int64_t token = 0;
  };
  Position Locate(int64_t pos) const;

  size_t NumShards() const { return shards_.size(); }
  const IndexedDataset& shard(size_t i) const { return *shards_[i]; }
  const DatasetMeta& meta() const { return shards_[0]->meta(); }

 private:
  std::vector<std::unique_ptr<IndexedDataset>> shards_;
  std::vector<int64_t> shard_starts_;  // first stream token of each shard, then the total
  std::vector<int64_t> doc_starts_;
};

// The prefixes a --data-path PREFIX names: itself, or, if it holds '*' or '?', the sorted
// matches of PREFIX.idx (an error if none match).
Status ExpandShardPattern(Env* env, const std::string& prefix, std::vector<std::string>* out);

}  // namespace keel
