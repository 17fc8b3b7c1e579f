// DocumentStream: documents laid end to end as one stream of tokens, which is all the sample
// builder (GptDataset) needs. An IndexedDataset is one; a ShardedDataset (several .bin/.idx
// shards read as one dataset) is another.
#pragma once

#include <cstdint>
#include <vector>

namespace keel {

class DocumentStream {
 public:
  virtual ~DocumentStream() = default;
  virtual size_t NumDocuments() const = 0;
  virtual int64_t NumTokens() const = 0;
  // First token index in the stream of each document (size NumDocuments()+1).
  virtual const std::vector<int64_t>& DocumentStarts() const = 0;
  // Copies `count` tokens starting at token `start` of the stream.
  virtual void ReadStream(int64_t start, int64_t count, int32_t* out) const = 0;
};

}  // namespace keel
