#include "data/sharded_dataset.h"

#include <fmt/format.h>
#include <fnmatch.h>

#include <algorithm>

namespace keel {

Status ExpandShardPattern(Env* env, const std::string& prefix, std::vector<std::string>* out) {
  out->clear();
  if (prefix.find_first_of("*?") == std::string::npos) {
    out->push_back(prefix);
    return Status::OK();
  }
  const size_t slash = prefix.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : prefix.substr(0, slash);
  const std::string pattern = (slash == std::string::npos ? prefix : prefix.substr(slash + 1));
  if (dir.find_first_of("*?") != std::string::npos)
    return Status::InvalidArgument("--data-path " + prefix +
                                   ": a shard pattern may use '*' and '?' in the file name only, "
                                   "not in the directory");
  std::vector<std::string> names;
  Status st = env->GetChildren(dir, &names);
  if (!st.ok())
    return Status::NotFound("--data-path " + prefix + ": cannot list the directory " + dir + " (" +
                            st.message() + ")");
  const std::string idx_pattern = pattern + ".idx";
  for (const std::string& n : names) {
    if (fnmatch(idx_pattern.c_str(), n.c_str(), FNM_PATHNAME) == 0)
      out->push_back((slash == std::string::npos ? "" : dir + "/") + n.substr(0, n.size() - 4));
  }
  std::sort(out->begin(), out->end());
  if (out->empty())
    return Status::NotFound("--data-path " + prefix + ": no shard matches " + dir + "/" +
                            idx_pattern + "; check the pattern (it names PREFIX.idx files)");
  return Status::OK();
}

Status ShardedDataset::Open(Env* env, const std::vector<std::string>& prefixes,
                            std::unique_ptr<ShardedDataset>* out) {
  if (prefixes.empty()) return Status::InvalidArgument("a sharded dataset needs shards");
  auto ds = std::unique_ptr<ShardedDataset>(new ShardedDataset());
  ds->doc_starts_.push_back(0);
  int64_t base = 0;
  for (const std::string& p : prefixes) {
    std::unique_ptr<IndexedDataset> shard;
    KEEL_RETURN_IF_ERROR(IndexedDataset::Open(env, p, &shard));
    if (!ds->shards_.empty()) {
      const DatasetMeta &a = ds->shards_[0]->meta(), &b = shard->meta();
      if (a.tokenizer != b.tokenizer || a.vocab_size != b.vocab_size || a.eod_id != b.eod_id)
        return Status::InvalidArgument(fmt::format(
            "shard {} was tokenized with {} (vocab {}, EOD {}) but shard {} with {} (vocab {}, "
            "EOD {}): the shards of one dataset must share a tokenizer; re-prepare the odd one",
            p, b.tokenizer, b.vocab_size, b.eod_id, prefixes[0], a.tokenizer, a.vocab_size,
            a.eod_id));
    }
    ds->shard_starts_.push_back(base);
    const std::vector<int64_t>& starts = shard->DocumentStarts();
    for (size_t d = 1; d < starts.size(); ++d) ds->doc_starts_.push_back(base + starts[d]);
    base += shard->NumTokens();
    ds->shards_.push_back(std::move(shard));
  }
  ds->shard_starts_.push_back(base);
  *out = std::move(ds);
  return Status::OK();
}

ShardedDataset::Position ShardedDataset::Locate(int64_t pos) const {
  KEEL_CHECK(pos >= 0 && pos < NumTokens(), "stream position outside the sharded dataset");
  // upper_bound - 1: the last shard (document) starting at or before pos, which skips empty ones.
  Position p;
  p.shard = static_cast<size_t>(std::upper_bound(shard_starts_.begin(), shard_starts_.end(), pos) -
                                shard_starts_.begin() - 1);
  const int64_t local = pos - shard_starts_[p.shard];
  const std::vector<int64_t>& starts = shards_[p.shard]->DocumentStarts();
  p.document = std::upper_bound(starts.begin(), starts.end(), local) - starts.begin() - 1;
  p.token = local - starts[static_cast<size_t>(p.document)];
  return p;
}

void ShardedDataset::ReadStream(int64_t start, int64_t count, int32_t* out) const {
  KEEL_CHECK(start >= 0 && count >= 0 && start + count <= NumTokens(),
             "stream range outside the sharded dataset");
  size_t s =
      static_cast<size_t>(std::upper_bound(shard_starts_.begin(), shard_starts_.end(), start) -
                          shard_starts_.begin() - 1);
  while (count > 0) {
    const int64_t offset = start - shard_starts_[s];
    const int64_t take = std::min<int64_t>(count, shards_[s]->NumTokens() - offset);
    if (take > 0) {
      shards_[s]->ReadStream(offset, take, out);
      out += take;
      start += take;
      count -= take;
    }
    ++s;
  }
}

}  // namespace keel
