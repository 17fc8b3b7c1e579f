#include "checkpoint/safetensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "checkpoint/manifest.h"
#include "core/json_reader.h"

namespace keel {
namespace {

uint64_t Numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

int DtypeBytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

}  // namespace

Status AppendSafetensors(WritableFile* file, const std::vector<TensorView>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    const uint64_t bytes = Numel(t.shape) * sizeof(float);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while ((8 + h.size()) % 64 != 0) h.push_back(' ');  // tensor data starts 64-byte aligned
  std::string prefix;
  const uint64_t hlen = h.size();
  for (int i = 0; i < 8; ++i) prefix.push_back(static_cast<char>((hlen >> (8 * i)) & 0xff));
  prefix += h;
  KEEL_RETURN_IF_ERROR(file->Append(prefix));
  for (const TensorView& t : tensors) {
    const auto* p = reinterpret_cast<const char*>(t.data);
    KEEL_RETURN_IF_ERROR(file->Append(std::string_view(p, Numel(t.shape) * sizeof(float))));
  }
  return Status::OK();
}

Status WriteSafetensors(Env* env, const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  // Same protocol as WriteFileAtomic, streamed: temp file, fsync, rename, fsync directory.
  const std::string tmp = path + ".tmp";
  std::unique_ptr<WritableFile> f;
  KEEL_RETURN_IF_ERROR(env->NewWritableFile(tmp, &f));
  Status st = AppendSafetensors(f.get(), tensors, metadata);
  if (st.ok()) st = f->Sync();
  Status cst = f->Close();
  if (st.ok()) st = cst;
  if (st.ok()) st = env->RenameFile(tmp, path);
  if (!st.ok()) {
    env->RemoveFile(tmp);
    return st;
  }
  const auto slash = path.rfind('/');
  return env->SyncDir(slash == std::string::npos ? "." : path.substr(0, slash ? slash : 1));
}

Status ParseSafetensors(const char* data, size_t size, const std::string& path,
                        std::map<std::string, TensorRef>* out,
                        std::map<std::string, std::string>* metadata) {
  if (size < 8) return Status::Corruption(path + ": shorter than the 8-byte header length");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i)
    hlen |= static_cast<uint64_t>(static_cast<unsigned char>(data[i])) << (8 * i);
  if (hlen > size - 8) return Status::Corruption(path + ": header length exceeds file size");
  if (hlen > kMaxSafetensorsHeaderBytes)
    return Status::Corruption(fmt::format(
        "{}: the header is {} bytes, more than the {} bytes safetensors allows (and keel reads)",
        path, hlen, kMaxSafetensorsHeaderBytes));
  // Keys seen in each object open at the moment, to find one given twice.
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  bool nested = false;  // the key given twice is inside a tensor's entry
  const nlohmann::json::parser_callback_t note_keys = [&](int /*depth*/,
                                                          nlohmann::json::parse_event_t event,
                                                          nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == nlohmann::json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (event == nlohmann::json::parse_event_t::key && !keys.empty() && parsed.is_string() &&
               !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
      nested = keys.size() > 1;
    }
    return true;
  };
  nlohmann::json header = nlohmann::json::parse(data + 8, data + 8 + hlen, note_keys, false);
  if (header.is_discarded() || !header.is_object())
    return Status::Corruption(path + ": header is not a JSON object");
  if (!duplicate.empty())
    return Status::Corruption(fmt::format(
        "{}: the header gives the key \"{}\"{} twice: JSON readers keep one of them, so what "
        "the file holds is ambiguous; re-save the model",
        path, duplicate, nested ? " (inside an entry)" : ""));
  const uint64_t data_start = 8 + hlen;
  out->clear();
  JsonReader r(path + " (safetensors header)", header, kDamagedCheckpointFix);
  for (auto it = header.begin(); it != header.end(); ++it) {
    const JsonValue t = r.root()[it.key()];
    if (it.key() == "__metadata__") {
      if (!it->is_object())
        r.Fail(t.path(), "must be an object of strings, but is " + DescribeJson(*it));
      for (auto m = it->begin(); it->is_object() && m != it->end(); ++m) {
        const std::string v = t[m.key()].Get<std::string>();
        if (metadata) (*metadata)[m.key()] = v;
      }
      KEEL_RETURN_IF_ERROR(r.status());
      continue;
    }
    TensorRef ref;
    ref.dtype = t["dtype"].Get<std::string>();
    // The tensor's bytes must fit in the file, which bounds the product of the dimensions (so it
    // is computed without overflow: a product that wrapped could match a short byte range).
    const uint64_t room = size - data_start;
    const int eb = DtypeBytes(ref.dtype);
    // An empty tensor's other dimensions are still bounded, so that no product of them overflows.
    uint64_t bytes = eb == 0 ? 1 : static_cast<uint64_t>(eb), nonzero = 1;
    for (const JsonValue& d : t["shape"].Items()) {
      const uint64_t n = d.Get<uint64_t>();
      if (n == 0) {
        bytes = 0;
      } else if (nonzero > (uint64_t{1} << 62) / n) {
        if (r.ok()) r.Fail(t["shape"].path(), "describes more elements than any file holds");
      } else {
        nonzero *= n;
        bytes = bytes > room / n ? room + 1 : bytes * n;
      }
      ref.shape.push_back(static_cast<int64_t>(n));
    }
    const JsonValue offsets = t["data_offsets"];
    const uint64_t b = offsets[0].Get<uint64_t>(), e = offsets[1].Get<uint64_t>();
    KEEL_RETURN_IF_ERROR(r.status());
    if (eb == 0)
      return Status::Corruption(path + ": tensor '" + it.key() + "' has unknown dtype " +
                                ref.dtype);
    if (e < b || e - b != bytes || e > room)
      return Status::Corruption(path + ": tensor '" + it.key() +
                                "' has inconsistent offsets or is truncated");
    ref.data = data + data_start + b;
    ref.bytes = e - b;
    (*out)[it.key()] = std::move(ref);
  }
  // No byte belongs to two tensors: writing one would change the other.
  std::vector<std::pair<const char*, std::string>> starts;  // by offset, then name
  for (const auto& [name, ref] : *out)
    if (ref.bytes > 0) starts.emplace_back(ref.data, name);
  std::sort(starts.begin(), starts.end());
  for (size_t i = 1; i < starts.size(); ++i) {
    const TensorRef& prev = out->at(starts[i - 1].second);
    if (starts[i].first < prev.data + prev.bytes) {
      const TensorRef& next = out->at(starts[i].second);
      const char* base = data + data_start;
      const Status st = Status::Corruption(fmt::format(
          "{}: tensors '{}' and '{}' overlap (bytes {}-{} and {}-{} of the data): each tensor "
          "needs bytes of its own; the file is damaged or was not written by a safetensors "
          "writer",
          path, starts[i - 1].second, starts[i].second, prev.data - base,
          prev.data + prev.bytes - base, next.data - base, next.data + next.bytes - base));
      out->clear();
      return st;
    }
  }
  return Status::OK();
}

Status ReadSafetensors(Env* env, const std::string& path, std::map<std::string, LoadedTensor>* out,
                       std::map<std::string, std::string>* metadata) {
  MappedSafetensors file;
  KEEL_RETURN_IF_ERROR(MappedSafetensors::Open(env, path, &file));
  if (metadata) *metadata = file.metadata();
  out->clear();
  for (const auto& [name, r] : file.tensors()) {
    if (r.dtype != "F32")
      return Status::Corruption(path + ": tensor '" + name + "' is " + r.dtype +
                                ", keel reads F32 only");
    LoadedTensor lt;
    lt.shape = r.shape;
    lt.data.resize(r.bytes / sizeof(float));
    std::memcpy(lt.data.data(), r.data, r.bytes);
    (*out)[name] = std::move(lt);
  }
  return Status::OK();
}

Status MappedSafetensors::Open(Env* env, const std::string& path, MappedSafetensors* out) {
  MappedSafetensors m;
  m.path_ = path;
  KEEL_RETURN_IF_ERROR(env->MapReadOnly(path, &m.region_));
  KEEL_RETURN_IF_ERROR(
      ParseSafetensors(m.region_->data(), m.region_->size(), path, &m.tensors_, &m.metadata_));
  *out = std::move(m);
  return Status::OK();
}

std::string_view MappedSafetensors::bytes() const {
  return region_ ? std::string_view(region_->data(), region_->size()) : std::string_view();
}

const TensorRef* MappedSafetensors::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Status MappedSafetensors::FindF32(const std::string& name, const std::vector<int64_t>& shape,
                                  const TensorRef** out) const {
  const TensorRef* t = Find(name);
  if (t == nullptr)
    return Status::Corruption(fmt::format("{}: tensor '{}' is missing (expected F32 [{}])", path_,
                                          name, fmt::join(shape, ", ")));
  if (t->dtype != "F32" || t->shape != shape)
    return Status::Corruption(fmt::format("{}: tensor '{}' is {} [{}], expected F32 [{}]", path_,
                                          name, t->dtype, fmt::join(t->shape, ", "),
                                          fmt::join(shape, ", ")));
  *out = t;
  return Status::OK();
}

Status MappedSafetensors::GetF32(const std::string& name, const std::vector<int64_t>& shape,
                                 const float** data) const {
  const TensorRef* t = nullptr;
  KEEL_RETURN_IF_ERROR(FindF32(name, shape, &t));
  // keel's writer aligns tensor data; another writer's need not, and a misaligned float* must not
  // be handed out (CopyF32 reads such a tensor fine).
  if (reinterpret_cast<uintptr_t>(t->data) % alignof(float) != 0)
    return Status::Corruption(
        fmt::format("{}: tensor '{}' is not 4-byte aligned in the file and cannot be read in place",
                    path_, name));
  *data = reinterpret_cast<const float*>(t->data);
  return Status::OK();
}

Status MappedSafetensors::CopyF32(const std::string& name, const std::vector<int64_t>& shape,
                                  float* dst) const {
  const TensorRef* t = nullptr;
  KEEL_RETURN_IF_ERROR(FindF32(name, shape, &t));
  std::memcpy(dst, t->data, t->bytes);
  return Status::OK();
}

Status MappedSafetensors::CheckNoOtherTensors(const std::set<std::string>& expected) const {
  for (const auto& [name, t] : tensors_)
    if (expected.count(name) == 0)
      return Status::Corruption(
          fmt::format("{}: unexpected tensor '{}' ({} [{}]), which the model does not have", path_,
                      name, t.dtype, fmt::join(t.shape, ", ")));
  return Status::OK();
}

}  // namespace keel
