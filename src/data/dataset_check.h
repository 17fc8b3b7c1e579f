// What `keel data inspect` and `keel data verify` report about an indexed dataset: counts, the
// document-length distribution, and the token ids that the vocabulary cannot hold. Structural
// problems (bad magic, truncation, a .bin that does not match its .idx, an unknown dtype) are
// already refused by IndexedDataset::Open; this looks at the contents.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/indexed_dataset.h"

namespace keel {

struct DatasetReport {
  int64_t documents = 0, tokens = 0;
  int64_t empty_documents = 0;
  int64_t first_empty_document = -1;
  int64_t min_length = 0, max_length = 0;
  // Document-length histogram: bucket k counts lengths in [2^k, 2^(k+1)) (bucket 0 also holds 0).
  std::vector<int64_t> length_buckets;
  int32_t min_id = 0, max_id = 0;
  int64_t out_of_vocab = 0;  // ids < 0 or >= vocab_size (when vocab_size > 0)
  int64_t first_bad_document = -1, first_bad_position = -1;
  int32_t first_bad_id = 0;
  int64_t eod_tokens = 0;  // occurrences of the EOD id (when known)
};

// Scans every token once (streamed, constant memory). vocab_size <= 0 skips the vocabulary check;
// eod_id < 0 skips the EOD count.
DatasetReport CheckDataset(const IndexedDataset& data, int vocab_size, int32_t eod_id);

// The first token id outside [0, vocab_size), if any: what opening a dataset without keel
// metadata checks against the flags' tokenizer. Documents are scanned on all OpenMP threads.
struct IdCheck {
  int64_t out_of_vocab = 0;  // how many
  int64_t document = -1, position = -1;
  int32_t id = 0;
};
IdCheck CheckIdsBelow(const IndexedDataset& data, int vocab_size);

}  // namespace keel
