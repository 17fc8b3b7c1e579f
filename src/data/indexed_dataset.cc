// Megatron MMIDIDX v1 reader and writer. keel assumes a little-endian host, like Megatron's numpy
// memmaps; every multi-byte read goes through memcpy because the .idx arrays start at offset 34
// and are not aligned.
#include "data/indexed_dataset.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/json_reader.h"

namespace keel {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr uint64_t kVersion = 1;
constexpr size_t kHeaderSize = 9 + 8 + 1 + 8 + 8;
constexpr uint8_t kDtypeU16 = 8, kDtypeI32 = 4;
constexpr size_t kWriteBufferBytes = 1 << 20;

// Element size of a dtype code, 0 if unknown.
int DtypeSize(uint8_t code) {
  switch (code) {
    case 1:
    case 2:
      return 1;  // u8, i8
    case 3:
    case 8:
      return 2;  // i16, u16
    case 4:
    case 7:
      return 4;  // i32, f32
    case 5:
    case 6:
      return 8;  // i64, f64
    default:
      return 0;
  }
}

template <typename T>
T LoadLE(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void AppendLE(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
void ConvertTokens(const char* src, int64_t count, int32_t* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(LoadLE<T>(src + i * sizeof(T)));
}

void ConvertTokens(uint8_t dtype, const char* src, int64_t count, int32_t* out) {
  switch (dtype) {
    case 1:
      return ConvertTokens<uint8_t>(src, count, out);
    case 2:
      return ConvertTokens<int8_t>(src, count, out);
    case 3:
      return ConvertTokens<int16_t>(src, count, out);
    case 4:
      return ConvertTokens<int32_t>(src, count, out);
    case 5:
      return ConvertTokens<int64_t>(src, count, out);
    case 8:
      return ConvertTokens<uint16_t>(src, count, out);
    default:
      KEEL_CHECK(false, "unsupported dtype code " + std::to_string(dtype));
  }
}

constexpr const char* kPrefixHelp =
    "two files PREFIX.bin and PREFIX.idx, named by their common PREFIX (e.g. data/my-corpus for "
    "data/my-corpus.bin and data/my-corpus.idx); make one with `keel data prepare`";

// A directory where a dataset prefix belongs: say what a prefix is and which ones it holds.
Status DirectoryGivenAsPrefix(Env* env, const std::string& dir) {
  std::vector<std::string> names, found;
  if (env->GetChildren(dir, &names).ok()) {
    std::sort(names.begin(), names.end());
    for (const std::string& n : names)
      if (n.size() > 4 && n.compare(n.size() - 4, 4, ".idx") == 0)
        found.push_back(JoinPath(dir, n.substr(0, n.size() - 4)));
  }
  std::string held = "it holds no PREFIX.idx file";
  if (!found.empty()) {
    held = "it holds the dataset" + std::string(found.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < found.size() && i < 5; ++i) held += (i ? ", " : "") + found[i];
    if (found.size() > 5) held += ", ...";
    held += found.size() > 1 ? ": pass one of them (--data-path also takes a shard pattern, " +
                                   JoinPath(dir, "*") + ")"
                             : ": pass that";
  }
  return Status::InvalidArgument("'" + dir +
                                 "' is a directory, not a dataset prefix: a dataset is " +
                                 kPrefixHelp + "; " + held);
}

std::string MetaPath(const std::string& prefix) {
  return prefix + ".meta.json";
}

Status ReadMeta(Env* env, const std::string& prefix, DatasetMeta* meta) {
  const std::string path = MetaPath(prefix);
  *meta = DatasetMeta();
  if (!env->FileExists(path)) return Status::OK();  // Megatron datasets from elsewhere have none
  std::string text;
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(path, &text));
  const std::string fix =
      "rebuild the dataset with `keel data prepare`, or correct the file (tokenizer and "
      "tokenizer_model are strings, vocab_size and eod_id integers)";
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object())
    return Status::Corruption("dataset metadata '" + path + "' is not a JSON object; " + fix);
  JsonReader r("dataset metadata '" + path + "'", j, fix);
  meta->tokenizer = r.root().Optional("tokenizer").Get<std::string>();
  meta->tokenizer_model = r.root().Optional("tokenizer_model").Get<std::string>();
  meta->vocab_file = r.root().Optional("vocab_file").Get<std::string>();
  meta->merge_file = r.root().Optional("merge_file").Get<std::string>();
  meta->vocab_size = r.root().Optional("vocab_size").Get<int>(0);
  meta->eod_id = r.root().Optional("eod_id").Get<int>(-1);
  KEEL_RETURN_IF_ERROR(r.status());
  if (!meta->tokenizer.empty() && meta->tokenizer != "gpt2" && meta->tokenizer != "sentencepiece" &&
      meta->tokenizer != "hf") {
    return Status::Corruption("dataset metadata '" + path + "' names unknown tokenizer '" +
                              meta->tokenizer + "' (expected gpt2, sentencepiece or hf)");
  }
  return Status::OK();
}

}  // namespace

IndexedDatasetWriter::IndexedDatasetWriter(Env* env, std::string prefix, int vocab_size)
    : env_(env),
      prefix_(std::move(prefix)),
      vocab_size_(vocab_size),
      dtype_code_(vocab_size <= 65535 ? kDtypeU16 : kDtypeI32) {}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  if (bin_ == nullptr || finished_) return;
  (void)bin_->Close();
  const std::string tmp = prefix_ + ".bin.tmp";
  if (env_->FileExists(tmp)) (void)env_->RemoveFile(tmp);
}

Status IndexedDatasetWriter::Open() {
  if (vocab_size_ <= 0) {
    return Status::InvalidArgument("dataset '" + prefix_ + "': vocabulary size must be positive");
  }
  return env_->NewWritableFile(prefix_ + ".bin.tmp", &bin_);
}

Status IndexedDatasetWriter::AddDocument(const std::vector<int32_t>& tokens) {
  if (bin_ == nullptr || finished_) {
    return Status::Internal("dataset '" + prefix_ + "': AddDocument outside Open()..Finish()");
  }
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    return Status::InvalidArgument("dataset '" + prefix_ + "': a document of " +
                                   std::to_string(tokens.size()) + " tokens exceeds 2^31-1");
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= vocab_size_) {
      return Status::InvalidArgument("dataset '" + prefix_ + "': token id " + std::to_string(t) +
                                     " is outside the vocabulary [0, " +
                                     std::to_string(vocab_size_) + ")");
    }
  }
  for (int32_t t : tokens) {
    if (dtype_code_ == kDtypeU16) {
      AppendLE<uint16_t>(&buffer_, static_cast<uint16_t>(t));
    } else {
      AppendLE<int32_t>(&buffer_, t);
    }
  }
  sizes_.push_back(static_cast<int32_t>(tokens.size()));
  pointers_.push_back(offset_);
  offset_ += static_cast<int64_t>(tokens.size()) * DtypeSize(dtype_code_);
  if (buffer_.size() >= kWriteBufferBytes) {
    KEEL_RETURN_IF_ERROR(bin_->Append(buffer_));
    buffer_.clear();
  }
  return Status::OK();
}

Status IndexedDatasetWriter::Finish(const DatasetMeta& meta) {
  if (bin_ == nullptr || finished_) {
    return Status::Internal("dataset '" + prefix_ + "': Finish without Open, or twice");
  }
  finished_ = true;
  const std::string bin_tmp = prefix_ + ".bin.tmp", idx_tmp = prefix_ + ".idx.tmp";
  Status st = bin_->Append(buffer_);
  buffer_.clear();
  if (st.ok()) st = bin_->Sync();
  Status close_st = bin_->Close();
  if (st.ok()) st = close_st;

  std::string idx(kMagic, sizeof(kMagic));
  AppendLE<uint64_t>(&idx, kVersion);
  AppendLE<uint8_t>(&idx, dtype_code_);
  AppendLE<uint64_t>(&idx, sizes_.size());
  AppendLE<uint64_t>(&idx, sizes_.size() + 1);
  for (int32_t s : sizes_) AppendLE<int32_t>(&idx, s);
  for (int64_t p : pointers_) AppendLE<int64_t>(&idx, p);
  for (int64_t d = 0; d <= static_cast<int64_t>(sizes_.size()); ++d) AppendLE<int64_t>(&idx, d);
  if (st.ok()) {
    std::unique_ptr<WritableFile> f;
    st = env_->NewWritableFile(idx_tmp, &f);
    if (st.ok()) st = f->Append(idx);
    if (st.ok()) st = f->Sync();
    if (f != nullptr) {
      Status c = f->Close();
      if (st.ok()) st = c;
    }
  }

  // The .idx is renamed last: until then no reader sees a dataset, and an old .idx is removed
  // first so it can never pair with the new .bin.
  const std::string idx_path = prefix_ + ".idx";
  if (st.ok() && env_->FileExists(idx_path)) st = env_->RemoveFile(idx_path);
  if (st.ok()) st = env_->RenameFile(bin_tmp, prefix_ + ".bin");
  if (st.ok()) {
    nlohmann::json j = {{"format", "keel-dataset-meta"},
                        {"tokenizer", meta.tokenizer},
                        {"tokenizer_model", meta.tokenizer_model},
                        {"vocab_size", meta.vocab_size},
                        {"eod_id", meta.eod_id},
                        {"num_documents", sizes_.size()},
                        {"num_tokens", offset_ / DtypeSize(dtype_code_)}};
    if (!meta.vocab_file.empty()) j["vocab_file"] = meta.vocab_file;
    if (!meta.merge_file.empty()) j["merge_file"] = meta.merge_file;
    st = WriteFileAtomic(env_, MetaPath(prefix_), j.dump(2) + "\n");
  }
  if (st.ok()) st = env_->RenameFile(idx_tmp, idx_path);
  if (st.ok()) {
    auto slash = prefix_.rfind('/');
    std::string dir =
        slash == std::string::npos ? "." : (slash == 0 ? "/" : prefix_.substr(0, slash));
    st = env_->SyncDir(dir);
  }
  if (!st.ok()) {
    // Best effort: leave no temporary files behind.
    if (env_->FileExists(bin_tmp)) env_->RemoveFile(bin_tmp);
    if (env_->FileExists(idx_tmp)) env_->RemoveFile(idx_tmp);
  }
  return st;
}

Status IndexedDataset::Open(Env* env, const std::string& prefix,
                            std::unique_ptr<IndexedDataset>* out) {
  const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
  for (const std::string& path : {idx_path, bin_path}) {
    if (env->IsDirectory(path))
      return Status::InvalidArgument("dataset file '" + path +
                                     "' is a directory, not a file of token ids: a dataset is " +
                                     kPrefixHelp);
    if (!env->FileExists(path)) {
      if (env->IsDirectory(prefix)) return DirectoryGivenAsPrefix(env, prefix);
      return Status::NotFound("dataset file '" + path + "' not found (a dataset is PREFIX.bin + " +
                              "PREFIX.idx; make one with `keel data prepare`)");
    }
  }
  auto ds = std::unique_ptr<IndexedDataset>(new IndexedDataset());
  KEEL_RETURN_IF_ERROR(env->MapReadOnly(idx_path, &ds->idx_));
  KEEL_RETURN_IF_ERROR(env->MapReadOnly(bin_path, &ds->bin_));
  const char* idx = ds->idx_->data();
  const uint64_t idx_size = ds->idx_->size(), bin_size = ds->bin_->size();
  auto corrupt = [&](const std::string& path, const std::string& what) {
    return Status::Corruption("dataset file '" + path + "': " + what);
  };

  if (idx_size > 0 && std::memcmp(idx, kMagic, std::min<uint64_t>(idx_size, sizeof(kMagic))) != 0) {
    return corrupt(idx_path, "bad magic (not a Megatron MMIDIDX index)");
  }
  if (idx_size < kHeaderSize) {
    return corrupt(idx_path, "truncated: " + std::to_string(idx_size) +
                                 " bytes is shorter than the " + std::to_string(kHeaderSize) +
                                 "-byte header");
  }
  const uint64_t version = LoadLE<uint64_t>(idx + 9);
  if (version != kVersion) {
    return corrupt(idx_path, "unsupported version " + std::to_string(version) + " (keel reads 1)");
  }
  const uint8_t dtype = static_cast<uint8_t>(idx[17]);
  if (DtypeSize(dtype) == 0)
    return corrupt(idx_path, "unknown dtype code " + std::to_string(dtype));
  if (dtype == 6 || dtype == 7) {
    return corrupt(idx_path, "dtype code " + std::to_string(dtype) +
                                 " (floating point) cannot hold token ids");
  }
  const uint64_t n = LoadLE<uint64_t>(idx + 18);
  const uint64_t doc_count = LoadLE<uint64_t>(idx + 26);
  // Bound the counts by the file size before multiplying, so the arithmetic cannot overflow.
  const uint64_t body = idx_size - kHeaderSize;
  if (n > body / 12 || doc_count > body / 8 || 12 * n + 8 * doc_count > body) {
    return corrupt(idx_path, "truncated: " + std::to_string(idx_size) + " bytes cannot hold " +
                                 std::to_string(n) + " sequences and " + std::to_string(doc_count) +
                                 " document-index entries");
  }
  if (12 * n + 8 * doc_count != body) {
    return corrupt(idx_path, std::to_string(body - 12 * n - 8 * doc_count) +
                                 " unexpected bytes after the index arrays");
  }
  ds->dtype_code_ = dtype;
  ds->elem_size_ = DtypeSize(dtype);
  ds->sizes_.resize(n);
  ds->pointers_.resize(n);
  if (n > 0) {
    std::memcpy(ds->sizes_.data(), idx + kHeaderSize, 4 * n);
    std::memcpy(ds->pointers_.data(), idx + kHeaderSize + 4 * n, 8 * n);
  }
  const char* doc_idx = idx + kHeaderSize + 12 * n;
  int64_t prev = 0;
  for (uint64_t d = 0; d < doc_count; ++d) {
    int64_t v = LoadLE<int64_t>(doc_idx + 8 * d);
    if (v < prev || v > static_cast<int64_t>(n)) {
      return corrupt(idx_path, "document index entry " + std::to_string(d) + " = " +
                                   std::to_string(v) + " is out of order or beyond " +
                                   std::to_string(n) + " sequences");
    }
    prev = v;
  }

  // Each sequence must lie inside the .bin, and together they must account for all of it.
  ds->doc_starts_.resize(n + 1);
  ds->doc_starts_[0] = 0;
  uint64_t end_max = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const int32_t size = ds->sizes_[i];
    const int64_t ptr = ds->pointers_[i];
    if (size < 0 || ptr < 0) {
      return corrupt(idx_path, "sequence " + std::to_string(i) + " has negative size " +
                                   std::to_string(size) + " or pointer " + std::to_string(ptr));
    }
    const uint64_t end = static_cast<uint64_t>(ptr) + static_cast<uint64_t>(size) * ds->elem_size_;
    if (end > bin_size) {
      return corrupt(bin_path, "truncated: " + std::to_string(bin_size) + " bytes, but sequence " +
                                   std::to_string(i) + " of '" + idx_path + "' ends at byte " +
                                   std::to_string(end));
    }
    end_max = std::max(end_max, end);
    ds->doc_starts_[i + 1] = ds->doc_starts_[i] + size;
  }
  if (end_max != bin_size) {
    return corrupt(bin_path, std::to_string(bin_size) + " bytes, but '" + idx_path +
                                 "' accounts for " + std::to_string(end_max) +
                                 " (the .bin and .idx do not belong together)");
  }
  ds->total_tokens_ = ds->doc_starts_[n];
  KEEL_RETURN_IF_ERROR(ReadMeta(env, prefix, &ds->meta_));
  *out = std::move(ds);
  return Status::OK();
}

int32_t IndexedDataset::Token(size_t doc, int64_t i) const {
  KEEL_CHECK(doc < sizes_.size() && i >= 0 && i < sizes_[doc], "token index out of range");
  int32_t v;
  ConvertTokens(dtype_code_, bin_->data() + pointers_[doc] + i * elem_size_, 1, &v);
  return v;
}

void IndexedDataset::ReadStream(int64_t start, int64_t count, int32_t* out) const {
  KEEL_CHECK(start >= 0 && count >= 0 && start + count <= total_tokens_,
             "stream range [" + std::to_string(start) + ", " + std::to_string(start + count) +
                 ") outside the dataset's " + std::to_string(total_tokens_) + " tokens");
  // The document holding `start`: the last one whose first token is <= start (skips empty ones).
  size_t doc = static_cast<size_t>(std::upper_bound(doc_starts_.begin(), doc_starts_.end(), start) -
                                   doc_starts_.begin() - 1);
  while (count > 0) {
    const int64_t offset = start - doc_starts_[doc];
    const int64_t take = std::min<int64_t>(count, sizes_[doc] - offset);
    if (take > 0) {
      ConvertTokens(dtype_code_, bin_->data() + pointers_[doc] + offset * elem_size_, take, out);
      out += take;
      start += take;
      count -= take;
    }
    ++doc;
  }
}

}  // namespace keel
