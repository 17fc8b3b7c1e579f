#include "data/dataset_check.h"

#include <algorithm>
#include <limits>

namespace keel {

DatasetReport CheckDataset(const IndexedDataset& data, int vocab_size, int32_t eod_id) {
  DatasetReport r;
  r.documents = static_cast<int64_t>(data.NumDocuments());
  r.tokens = data.NumTokens();
  r.min_id = std::numeric_limits<int32_t>::max();
  r.max_id = std::numeric_limits<int32_t>::min();
  r.min_length = r.documents > 0 ? std::numeric_limits<int64_t>::max() : 0;
  std::vector<int32_t> buf;
  for (size_t d = 0; d < data.NumDocuments(); ++d) {
    const int64_t len = data.DocumentLength(d);
    r.min_length = std::min(r.min_length, len);
    r.max_length = std::max(r.max_length, len);
    size_t bucket = 0;
    while ((int64_t{2} << bucket) <= len) ++bucket;
    if (r.length_buckets.size() <= bucket) r.length_buckets.resize(bucket + 1, 0);
    ++r.length_buckets[bucket];
    if (len == 0) {
      if (r.empty_documents++ == 0) r.first_empty_document = static_cast<int64_t>(d);
      continue;
    }
    buf.resize(static_cast<size_t>(len));
    data.ReadStream(data.DocumentStarts()[d], len, buf.data());
    for (int64_t i = 0; i < len; ++i) {
      const int32_t v = buf[static_cast<size_t>(i)];
      r.min_id = std::min(r.min_id, v);
      r.max_id = std::max(r.max_id, v);
      if (v == eod_id) ++r.eod_tokens;
      if (vocab_size > 0 && (v < 0 || v >= vocab_size)) {
        if (r.out_of_vocab++ == 0) {
          r.first_bad_document = static_cast<int64_t>(d);
          r.first_bad_position = i;
          r.first_bad_id = v;
        }
      }
    }
  }
  if (r.tokens == 0) r.min_id = r.max_id = 0;
  return r;
}

IdCheck CheckIdsBelow(const IndexedDataset& data, int vocab_size) {
  const int64_t n = static_cast<int64_t>(data.NumDocuments());
  const uint32_t vocab = static_cast<uint32_t>(vocab_size);
  int64_t first_bad = n, count = 0;
#pragma omp parallel reduction(min : first_bad) reduction(+ : count)
  {
    std::vector<int32_t> buf;
#pragma omp for schedule(dynamic, 256)
    for (int64_t d = 0; d < n; ++d) {
      const int64_t len = data.DocumentLength(static_cast<size_t>(d));
      if (len == 0) continue;
      buf.resize(static_cast<size_t>(len));
      data.ReadStream(data.DocumentStarts()[static_cast<size_t>(d)], len, buf.data());
      // One unsigned compare per token also catches negative ids.
      int64_t bad = 0;
      for (int32_t v : buf) bad += static_cast<uint32_t>(v) >= vocab;
      if (bad > 0) {
        count += bad;
        first_bad = std::min(first_bad, d);
      }
    }
  }
  IdCheck r;
  r.out_of_vocab = count;
  if (count == 0) return r;
  r.document = first_bad;
  const int64_t len = data.DocumentLength(static_cast<size_t>(first_bad));
  std::vector<int32_t> buf(static_cast<size_t>(len));
  data.ReadStream(data.DocumentStarts()[static_cast<size_t>(first_bad)], len, buf.data());
  for (int64_t i = 0; i < len; ++i)
    if (static_cast<uint32_t>(buf[static_cast<size_t>(i)]) >= vocab) {
      r.position = i;
      r.id = buf[static_cast<size_t>(i)];
      break;
    }
  return r;
}

}  // namespace keel
