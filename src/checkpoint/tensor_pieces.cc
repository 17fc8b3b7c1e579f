#include "checkpoint/tensor_pieces.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "model/gpt.h"

namespace keel {
namespace {

using json = nlohmann::json;

constexpr const char* kPiecesKey = "keel.pieces";

int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The split as stored: replicated whenever one rank holds the whole tensor.
TensorSplit Normalized(const TensorSplit& s, int tensor) {
  return tensor <= 1 ? TensorSplit{} : s;
}

// Whether rank slices of `split` over `tensor` ranks exist for `shape`: every part divides.
bool Divides(const TensorSplit& split, const std::vector<int64_t>& shape, int tensor) {
  if (tensor <= 1 || split.replicated()) return true;
  if (split.dim >= static_cast<int>(shape.size())) return false;
  int64_t sum = 0;
  for (int64_t p : split.parts) {
    // p <= extent - sum: the sum never passes the extent, so it cannot overflow.
    if (p <= 0 || p % tensor != 0 || p > shape[split.dim] - sum) return false;
    sum += p;
  }
  return sum == shape[split.dim];
}

// The most dimensions a piece's shape may have (safetensors' own limit is far below any real
// tensor's need).
constexpr int64_t kMaxDims = 64;

// Whether Numel(shape) of positive extents fits an int64 (so every count derived from it does).
bool NumelFits(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return false;
  return true;
}

// An integer a JSON number holds exactly as an int64 (not a float, not above INT64_MAX).
bool IsInt64(const json& j) {
  return j.is_number_integer() &&
         (!j.is_number_unsigned() ||
          j.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
}

// Field `key` of object `j` as an integer in [lo, hi]; false when it is missing, of another type
// (where json::value would throw) or out of range.
bool IntField(const json& j, const char* key, int64_t lo, int64_t hi, int64_t* out) {
  const auto it = j.find(key);
  if (it == j.end() || !IsInt64(*it)) return false;
  *out = it->get<int64_t>();
  return *out >= lo && *out <= hi;
}

// A contiguous run of a rank's slice: `len` floats at `full` in the full tensor and at `slice`
// in the flattened slice (model/tensor_split.cc cuts slices the same way).
struct Run {
  size_t full = 0, slice = 0, len = 0;
  int rank = 0;
};

void RunsOf(const std::vector<int64_t>& shape, const TensorSplit& split, int rank, int tensor,
            std::vector<Run>* out) {
  if (tensor <= 1 || split.replicated()) {
    out->push_back({0, 0, static_cast<size_t>(Numel(shape)), rank});
    return;
  }
  const int d = split.dim;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= shape[i];
  for (size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t extent = shape[d], local = extent / tensor;
  for (int64_t o = 0; o < outer; ++o) {
    int64_t start = 0, pos = 0;
    for (int64_t part : split.parts) {
      const int64_t len = part / tensor;
      out->push_back({static_cast<size_t>((o * extent + start + rank * len) * inner),
                      static_cast<size_t>((o * local + pos) * inner),
                      static_cast<size_t>(len * inner), rank});
      start += part;
      pos += len;
    }
  }
}

json PieceJson(const LocalTensor& t, bool replicated) {
  json j = {{"shape", t.full_shape}};
  if (replicated) {
    j["split_dim"] = -1, j["parts"] = json::array(), j["rank"] = 0, j["of"] = 1;
  } else {
    j["split_dim"] = t.split.dim, j["parts"] = t.split.parts, j["rank"] = t.tensor_rank;
    j["of"] = t.tensor_size;
  }
  return j;
}

std::string FileCoordsText(const PieceCoords& c, bool moments) {
  std::string s = fmt::format("tp {} of {}, pp {} of {}", c.tp, c.tensor, c.pp, c.pipeline);
  if (moments) s += fmt::format(", dp {} of {}", c.dp, c.data);
  return s;
}

}  // namespace

std::string LayoutText(int tensor, int pipeline, int data) {
  return fmt::format("T={} x P={} x D={}", tensor, pipeline, data);
}

std::string WeightsFileName(const PieceCoords& c) {
  if (c.tensor == 1 && c.pipeline == 1) return "model.safetensors";
  return fmt::format("model.tp-{:02d}-of-{:02d}.pp-{:03d}-of-{:03d}.safetensors", c.tp, c.tensor,
                     c.pp, c.pipeline);
}

std::string MomentsFileName(const PieceCoords& c) {
  if (c.tensor == 1 && c.pipeline == 1) {
    if (c.data <= 1) return "optimizer.safetensors";
    return fmt::format("optimizer.rank-{:03d}-of-{:03d}.safetensors", c.dp, c.data);
  }
  return fmt::format(
      "optimizer.tp-{:02d}-of-{:02d}.pp-{:03d}-of-{:03d}.dp-{:03d}-of-{:03d}"
      ".safetensors",
      c.tp, c.tensor, c.pp, c.pipeline, c.dp, c.data);
}

bool ParsePieceFileName(const std::string& name, bool* moments, PieceCoords* c) {
  static const std::regex weights_re(
      R"(model(\.tp-(\d{2,})-of-(\d{2,})\.pp-(\d{3,})-of-(\d{3,}))?\.safetensors)");
  static const std::regex old_moments_re(R"(optimizer(\.rank-(\d{3,})-of-(\d{3,}))?\.safetensors)");
  static const std::regex moments_re(
      R"(optimizer\.tp-(\d{2,})-of-(\d{2,})\.pp-(\d{3,})-of-(\d{3,})\.dp-(\d{3,})-of-(\d{3,})\.safetensors)");
  std::smatch m;
  PieceCoords r;
  auto num = [&](int i) { return m[i].length() > 9 ? -1 : std::stoi(m[i]); };
  if (std::regex_match(name, m, weights_re)) {
    *moments = false;
    if (m[1].matched) r.tp = num(2), r.tensor = num(3), r.pp = num(4), r.pipeline = num(5);
  } else if (std::regex_match(name, m, old_moments_re)) {
    *moments = true;
    if (m[1].matched) r.dp = num(2), r.data = num(3);
  } else if (std::regex_match(name, m, moments_re)) {
    *moments = true;
    r.tp = num(1), r.tensor = num(2), r.pp = num(3), r.pipeline = num(4), r.dp = num(5);
    r.data = num(6);
  } else {
    return false;
  }
  if (r.tensor < 1 || r.pipeline < 1 || r.data < 1 || r.tp < 0 || r.tp >= r.tensor || r.pp < 0 ||
      r.pp >= r.pipeline || r.dp < 0 || r.dp >= r.data)
    return false;
  *c = r;
  return true;
}

size_t LocalTensor::slice_numel() const {
  return static_cast<size_t>(Numel(ShardShape(split, full_shape, tensor_size)));
}

Status BuildPieceFiles(const PieceCoords& c, const std::vector<LocalTensor>& tensors,
                       bool with_moments, std::vector<CheckpointFile>* out) {
  const std::map<std::string, std::string> base = {{"format", "pt"},
                                                   {"writer", "keel " KEEL_VERSION}};
  CheckpointFile weights{WeightsFileName(c), "", true, {}, base};
  CheckpointFile moments{MomentsFileName(c), "", true, {}, base};
  weights.metadata["layout"] = FileCoordsText(c, false);
  moments.metadata["layout"] = FileCoordsText(c, true);
  json wmeta = json::object(), mmeta = json::object();
  for (const LocalTensor& t : tensors) {
    const bool replicated = t.split.replicated() || t.tensor_size == 1;
    if (t.tensor_size != c.tensor || t.tensor_rank != c.tp ||
        !Divides(t.split, t.full_shape, t.tensor_size))
      return Status::InvalidArgument(fmt::format(
          "{}: slice {} of {} does not belong to tensor rank {} of {} (or its split does not "
          "divide its shape {})",
          t.name, t.tensor_rank, t.tensor_size, c.tp, c.tensor, json(t.full_shape).dump()));
    // Replicated tensors are the same on every tensor rank; rank 0's copy is the one saved.
    if (!t.owner || (replicated && c.tp != 0)) continue;
    const std::vector<int64_t> shape =
        replicated ? t.full_shape : ShardShape(t.split, t.full_shape, t.tensor_size);
    const json piece = PieceJson(t, replicated);
    if (c.dp == 0) {
      if (t.weights == nullptr) return Status::InvalidArgument(t.name + ": no weights to save");
      weights.tensors.push_back({t.name, shape, t.weights});
      wmeta[t.name] = piece;
    }
    if (!with_moments || t.moment_begin >= t.moment_end) continue;
    const size_t n = t.slice_numel();
    if (t.moment_end > n || t.exp_avg == nullptr || t.exp_avg_sq == nullptr)
      return Status::InvalidArgument(
          fmt::format("{}: moment range [{}, {}) of a slice of {} elements, or no moments to save",
                      t.name, t.moment_begin, t.moment_end, n));
    const bool whole = t.moment_begin == 0 && t.moment_end == n;
    for (const auto& [prefix, data] : {std::pair<const char*, const float*>{"exp_avg.", t.exp_avg},
                                       {"exp_avg_sq.", t.exp_avg_sq}}) {
      const std::string name =
          whole ? prefix + t.name
                : fmt::format("{}{}[{}:{}]", prefix, t.name, t.moment_begin, t.moment_end);
      moments.tensors.push_back(
          {name,
           whole ? shape
                 : std::vector<int64_t>{static_cast<int64_t>(t.moment_end - t.moment_begin)},
           data});
      mmeta[name] = piece;
    }
  }
  weights.metadata[kPiecesKey] = wmeta.dump();
  moments.metadata[kPiecesKey] = mmeta.dump();
  out->clear();
  if (c.dp == 0) out->push_back(std::move(weights));
  if (with_moments) out->push_back(std::move(moments));
  return Status::OK();
}

// ---- reading ----

Status CheckpointTensors::Open(Env* env, const std::string& dir, const Options& options,
                               CheckpointTensors* out) {
  Manifest manifest;
  KEEL_RETURN_IF_ERROR(ReadManifest(env, dir, &manifest));
  CheckpointTensors r;
  r.dir_ = dir;
  // The files of the layout, by kind: all of one T x P (x D), every coordinate present.
  struct Found {
    std::string name;
    PieceCoords c;
  };
  std::vector<Found> weight_files, moment_files;
  for (const ManifestEntry& e : manifest.files) {
    bool moments = false;
    PieceCoords c;
    if (!ParsePieceFileName(e.name, &moments, &c)) continue;
    (moments ? moment_files : weight_files).push_back({e.name, c});
    r.entries_.push_back(e);
  }
  auto complete = [&](const std::vector<Found>& found, bool moments) -> Status {
    if (found.empty()) return Status::OK();
    const PieceCoords& first = found[0].c;
    std::set<std::string> names;
    for (const Found& f : found) {
      if (f.c.tensor != first.tensor || f.c.pipeline != first.pipeline ||
          (moments && f.c.data != first.data))
        return Status::Corruption(fmt::format(
            "{}: the {} files are of different layouts ({} is {}, {} is {}); a checkpoint is "
            "saved at one layout; {}",
            dir, moments ? "optimizer" : "weights", found[0].name, FileCoordsText(first, moments),
            f.name, FileCoordsText(f.c, moments), kDamagedCheckpointFix));
      names.insert(f.name);
    }
    for (int tp = 0; tp < first.tensor; ++tp)
      for (int pp = 0; pp < first.pipeline; ++pp)
        for (int dp = 0; dp < (moments ? first.data : 1); ++dp) {
          PieceCoords c = first;
          c.tp = tp, c.pp = pp, c.dp = dp;
          const std::string want = moments ? MomentsFileName(c) : WeightsFileName(c);
          if (names.count(want) == 0)
            return Status::Corruption(fmt::format(
                "{}: {} is missing: the checkpoint was saved at {} and every rank's file is "
                "needed to load it; restore the file or use another checkpoint of the run",
                dir, want, LayoutText(first.tensor, first.pipeline, moments ? first.data : 1)));
        }
    return Status::OK();
  };
  if (weight_files.empty())
    return Status::Corruption(
        fmt::format("{}: its manifest lists no weights file (model.safetensors, or "
                    "model.tp-RR-of-TT.pp-SSS-of-PPP.safetensors); {}",
                    dir, kDamagedCheckpointFix));
  KEEL_RETURN_IF_ERROR(complete(weight_files, false));
  KEEL_RETURN_IF_ERROR(complete(moment_files, true));
  r.tensor_ = weight_files[0].c.tensor;
  r.pipeline_ = weight_files[0].c.pipeline;
  r.data_ = moment_files.empty() ? 0 : moment_files[0].c.data;
  if (!moment_files.empty() &&
      (moment_files[0].c.tensor != r.tensor_ || moment_files[0].c.pipeline != r.pipeline_))
    return Status::Corruption(fmt::format(
        "{}: the weights were saved at T={} x P={} but the optimizer's files at T={} x P={}; {}",
        dir, r.tensor_, r.pipeline_, moment_files[0].c.tensor, moment_files[0].c.pipeline,
        kDamagedCheckpointFix));

  // Map every file (headers only are read here) and collect its pieces.
  struct Pending {  // an old-format element range, whose full shape is its weight's
    std::string name, base;
    int file;
    size_t begin, end;
  };
  std::vector<Pending> pending;
  static const std::regex range_re(R"((.*)\[(\d{1,18}):(\d{1,18})\])");
  r.files_.resize(r.entries_.size());
  r.verified_.assign(r.entries_.size(), options.checksums ? 0 : 1);
  for (size_t i = 0; i < r.entries_.size(); ++i) {
    const ManifestEntry& e = r.entries_[i];
    const std::string path = JoinPath(dir, e.name);
    if (!env->FileExists(path))
      return Status::Corruption(path + " is missing (listed in " + JoinPath(dir, kManifestFile) +
                                "): the checkpoint is incomplete; restore the file or use an "
                                "older checkpoint");
    uint64_t size = 0;
    KEEL_RETURN_IF_ERROR(env->GetFileSize(path, &size));
    if (size != e.size)
      return Status::Corruption(fmt::format(
          "{} has {} bytes but the manifest records {}: the file was truncated or replaced; "
          "restore it or use an older checkpoint",
          path, size, e.size));
    MappedSafetensors& f = r.files_[i];
    KEEL_RETURN_IF_ERROR(MappedSafetensors::Open(env, path, &f));
    json meta = json::object();
    if (auto it = f.metadata().find(kPiecesKey); it != f.metadata().end()) {
      meta = json::parse(it->second, nullptr, false);
      if (meta.is_discarded() || !meta.is_object())
        return Status::Corruption(fmt::format("{}: metadata '{}' is not a JSON object; {}", path,
                                              kPiecesKey, kDamagedCheckpointFix));
    }
    for (const auto& [name, ref] : f.tensors()) {
      if (ref.dtype != "F32")
        return Status::Corruption(fmt::format("{}: tensor '{}' is {}, keel reads F32 only; {}",
                                              path, name, ref.dtype, kDamagedCheckpointFix));
      std::smatch m;
      std::string base = name;
      size_t begin = 0, end = static_cast<size_t>(Numel(ref.shape));
      const bool ranged = std::regex_match(name, m, range_re);
      if (ranged) {
        base = m[1];
        begin = std::stoull(m[2]);
        end = std::stoull(m[3]);
        if (ref.shape.size() != 1 || static_cast<size_t>(ref.shape[0]) != end - begin ||
            end <= begin)
          return Status::Corruption(fmt::format(
              "{}: tensor '{}' has shape {}, not the [{}] its element range says; {}", path, name,
              json(ref.shape).dump(), end > begin ? end - begin : 0, kDamagedCheckpointFix));
      }
      const float* data = reinterpret_cast<const float*>(ref.data);
      if (reinterpret_cast<uintptr_t>(data) % alignof(float) != 0)
        return Status::Corruption(fmt::format("{}: tensor '{}' is not 4-byte aligned; {}", path,
                                              name, kDamagedCheckpointFix));
      Tensor piece_of;
      if (meta.contains(name)) {
        const json& p = meta[name];
        // Every field of its type and range before any is used: a piece is of 1 or of the
        // checkpoint's T ranks, and its full shape has a size (int64 elements) at all.
        int64_t split_dim = -2, of = 0, rank = -1;
        bool ok = p.is_object() && p.contains("shape") && p["shape"].is_array() &&
                  p.contains("parts") && p["parts"].is_array() &&
                  IntField(p, "split_dim", -1, kMaxDims, &split_dim) &&
                  IntField(p, "of", 1, r.tensor_, &of) && (of == 1 || of == r.tensor_) &&
                  IntField(p, "rank", 0, of - 1, &rank);
        if (ok) {
          for (const json& d : p["shape"]) ok = ok && IsInt64(d) && d.get<int64_t>() > 0;
          for (const json& d : p["parts"]) ok = ok && IsInt64(d);
        }
        if (ok) {
          piece_of.shape = p["shape"].get<std::vector<int64_t>>();
          piece_of.tensor = static_cast<int>(of);
          piece_of.split.dim = static_cast<int>(split_dim);
          piece_of.split.parts = p["parts"].get<std::vector<int64_t>>();
          ok = piece_of.shape.size() <= static_cast<size_t>(kMaxDims) &&
               NumelFits(piece_of.shape) && (piece_of.tensor == 1) == piece_of.split.replicated() &&
               Divides(piece_of.split, piece_of.shape, piece_of.tensor);
          piece_of.split = Normalized(piece_of.split, piece_of.tensor);
        }
        if (!ok)
          return Status::Corruption(
              fmt::format("{}: metadata '{}' of tensor '{}' is malformed ({}); {}", path,
                          kPiecesKey, name, p.dump(), kDamagedCheckpointFix));
        const std::vector<int64_t> slice =
            ShardShape(piece_of.split, piece_of.shape, piece_of.tensor);
        if ((!ranged && ref.shape != slice) || end > static_cast<size_t>(Numel(slice)))
          return Status::Corruption(fmt::format(
              "{}: tensor '{}' has shape {} but its slice (rank {} of {} of {}) is {}; {}", path,
              name, json(ref.shape).dump(), rank, piece_of.tensor, json(piece_of.shape).dump(),
              json(slice).dump(), kDamagedCheckpointFix));
        piece_of.ranks.resize(piece_of.tensor);
        piece_of.ranks[rank].push_back({static_cast<int>(i), begin, end, data});
      } else if (ranged) {
        pending.push_back({name, base, static_cast<int>(i), begin, end});
        continue;
      } else {
        piece_of.shape = ref.shape;
        piece_of.ranks.resize(1);
        piece_of.ranks[0].push_back({static_cast<int>(i), begin, end, data});
      }
      piece_of.first_file = e.name;
      auto [it, fresh] = r.tensors_.emplace(base, piece_of);
      if (fresh) continue;
      Tensor& t = it->second;
      if (t.shape != piece_of.shape || t.tensor != piece_of.tensor ||
          t.split.dim != piece_of.split.dim || t.split.parts != piece_of.split.parts)
        return Status::Corruption(fmt::format(
            "{}: the pieces of {} disagree: {} has it as {} cut in {} along {}, {} as {} cut in "
            "{} along {}; {}",
            dir, base, t.first_file, json(t.shape).dump(), t.tensor, t.split.dim, e.name,
            json(piece_of.shape).dump(), piece_of.tensor, piece_of.split.dim,
            kDamagedCheckpointFix));
      for (size_t k = 0; k < piece_of.ranks.size(); ++k)
        for (const Piece& pc : piece_of.ranks[k]) t.ranks[k].push_back(pc);
    }
  }
  // Old element ranges of a moment: of the whole tensor, shaped as its weight.
  for (const Pending& p : pending) {
    const bool moment = p.base.rfind("exp_avg.", 0) == 0 || p.base.rfind("exp_avg_sq.", 0) == 0;
    const auto w = moment ? r.tensors_.find(p.base.substr(p.base.find('.') + 1)) : r.tensors_.end();
    if (w == r.tensors_.end())
      return Status::Corruption(
          fmt::format("{}: tensor '{}' is not a moment of this checkpoint's parameters; {}",
                      JoinPath(dir, r.entries_[p.file].name), p.name, kDamagedCheckpointFix));
    Tensor& t = r.tensors_[p.base];
    if (t.ranks.empty()) {
      t.shape = w->second.shape;
      t.ranks.resize(1);
      t.first_file = r.entries_[p.file].name;
    }
    if (t.tensor != 1 || t.shape != w->second.shape || p.end > static_cast<size_t>(Numel(t.shape)))
      return Status::Corruption(fmt::format("{}: tensor '{}' names elements outside {} (of {}); {}",
                                            JoinPath(dir, r.entries_[p.file].name), p.name, p.base,
                                            Numel(w->second.shape), kDamagedCheckpointFix));
    t.ranks[0].push_back({p.file, p.begin, p.end,
                          reinterpret_cast<const float*>(r.files_[p.file].Find(p.name)->data)});
  }
  // Each rank's pieces tile its slice: no gap, no overlap.
  for (auto& [name, t] : r.tensors_) {
    const size_t n = static_cast<size_t>(Numel(ShardShape(t.split, t.shape, t.tensor)));
    for (int k = 0; k < t.tensor; ++k) {
      auto& list = t.ranks[k];
      std::sort(list.begin(), list.end(),
                [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
      size_t at = 0;
      std::string why;
      for (size_t j = 0; j < list.size() && why.empty(); ++j) {
        if (list[j].begin < at)
          why = fmt::format("elements [{}, {}) in {} overlap what {} holds", list[j].begin, at,
                            r.entries_[list[j].file].name, r.entries_[list[j - 1].file].name);
        else if (list[j].begin > at)
          why = fmt::format("elements [{}, {}) are missing", at, list[j].begin);
        at = list[j].end;
      }
      if (why.empty() && at != n) why = fmt::format("elements [{}, {}) are missing", at, n);
      if (why.empty()) continue;
      std::set<std::string> holders;
      for (const auto& rank : t.ranks)
        for (const Piece& pc : rank) holders.insert(r.entries_[pc.file].name);
      std::string files;
      for (const std::string& h : holders) files += (files.empty() ? "" : ", ") + h;
      return Status::Corruption(fmt::format(
          "{}: the pieces of {} do not tile it: of tensor rank {} of {} ({} elements), {} "
          "(pieces in {}); {}",
          dir, name, k, t.tensor, n, list.empty() ? "all are missing" : why, files,
          kDamagedCheckpointFix));
    }
  }
  *out = std::move(r);
  return Status::OK();
}

std::vector<std::string> CheckpointTensors::Names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : tensors_) out.push_back(name);
  return out;
}

const std::vector<int64_t>& CheckpointTensors::FullShape(const std::string& name) const {
  const auto it = tensors_.find(name);
  KEEL_CHECK(it != tensors_.end(), "CheckpointTensors::FullShape of an unknown tensor " + name);
  return it->second.shape;
}

const float* CheckpointTensors::Whole(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end() || it->second.tensor != 1 || it->second.ranks[0].size() != 1)
    return nullptr;
  const Piece& p = it->second.ranks[0][0];
  if (VerifyFile(p.file, name).ok()) return p.data;
  return nullptr;
}

Status CheckpointTensors::CheckModel(const GptSpec& spec, bool moments) const {
  std::set<std::string> expected;
  auto check = [&](const std::string& name, const std::vector<int64_t>& shape,
                   const TensorSplit& split) -> Status {
    expected.insert(name);
    const auto it = tensors_.find(name);
    if (it == tensors_.end())
      return Status::Corruption(
          fmt::format("{}: tensor '{}' is missing (the model {} has it; files saved at {}); {}",
                      dir_, name, json(shape).dump(), layout(), kDamagedCheckpointFix));
    const Tensor& t = it->second;
    if (t.shape != shape)
      return Status::Corruption(fmt::format("{}: tensor '{}' is F32 {}, expected F32 {} ({}); {}",
                                            dir_, name, json(t.shape).dump(), json(shape).dump(),
                                            t.first_file, kDamagedCheckpointFix));
    if (t.tensor > 1 && (t.split.dim != split.dim || t.split.parts != split.parts))
      return Status::Corruption(fmt::format(
          "{}: tensor '{}' was cut along dim {} in parts {} but the model cuts it along {} in {} "
          "({}); {}",
          dir_, name, t.split.dim, json(t.split.parts).dump(), split.dim, json(split.parts).dump(),
          t.first_file, kDamagedCheckpointFix));
    return Status::OK();
  };
  if (moments && !has_moments())
    return Status::Corruption(fmt::format(
        "{}: the optimizer's files are missing (optimizer.safetensors, or one per rank); {}", dir_,
        kDamagedCheckpointFix));
  for (const ParamInfo& p : GptModel::ParamLayout(spec)) {
    const TensorSplit split = TensorSplitOf(spec, p.name, p.shape);
    KEEL_RETURN_IF_ERROR(check(p.name, p.shape, split));
    if (!moments) continue;
    KEEL_RETURN_IF_ERROR(check("exp_avg." + p.name, p.shape, split));
    KEEL_RETURN_IF_ERROR(check("exp_avg_sq." + p.name, p.shape, split));
  }
  for (const auto& [name, t] : tensors_) {
    const bool moment = name.rfind("exp_avg.", 0) == 0 || name.rfind("exp_avg_sq.", 0) == 0;
    if (expected.count(name) || (moment && !moments)) continue;
    return Status::Corruption(fmt::format(
        "{}: tensor '{}' ({}) is not part of the model {}; {}", dir_, name, t.first_file,
        "(the checkpoint holds more than the model it is loaded into)", kDamagedCheckpointFix));
  }
  return Status::OK();
}

Status CheckpointTensors::VerifyFile(int file, const std::string& tensor) const {
  if (verified_[file]) return Status::OK();
  const ManifestEntry& e = entries_[file];
  const std::string_view bytes = files_[file].bytes();
  const uint64_t h = Xxh3(bytes.data(), bytes.size());
  if (h != e.xxh3)
    return Status::Corruption(fmt::format(
        "{}: xxh3 checksum {} does not match the manifest's {} (reading {}): the file is "
        "corrupt; restore it or use an older checkpoint",
        JoinPath(dir_, e.name), HexDigest(h), HexDigest(e.xxh3), tensor));
  verified_[file] = 1;
  return Status::OK();
}

Status CheckpointTensors::CopyRange(const std::string& name, const Tensor& t, int rank, size_t from,
                                    size_t to, float* dst) const {
  const std::vector<Piece>& list = t.ranks[rank];
  // The first piece that ends after `from` (pieces tile the slice in order).
  auto it = std::upper_bound(list.begin(), list.end(), from,
                             [](size_t v, const Piece& p) { return v < p.end; });
  for (; it != list.end() && it->begin < to; ++it) {
    KEEL_RETURN_IF_ERROR(VerifyFile(it->file, name));
    const size_t lo = std::max(from, it->begin), hi = std::min(to, it->end);
    std::memcpy(dst + (lo - from), it->data + (lo - it->begin), (hi - lo) * sizeof(float));
  }
  return Status::OK();
}

Status CheckpointTensors::Read(const std::string& name, const TensorSplit& split_in, int rank,
                               int tensor, size_t begin, size_t end, float* dst) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end())
    return Status::InvalidArgument(
        fmt::format("{}: no tensor '{}' (saved at {})", dir_, name, layout()));
  const Tensor& t = it->second;
  const TensorSplit split = Normalized(split_in, tensor);
  if (tensor < 1 || rank < 0 || rank >= tensor || !Divides(split, t.shape, tensor))
    return Status::InvalidArgument(fmt::format(
        "{}: tensor '{}' of shape {} has no slice {} of {} along dim {} in parts {}", dir_, name,
        json(t.shape).dump(), rank, tensor, split.dim, json(split.parts).dump()));
  const size_t n = static_cast<size_t>(Numel(ShardShape(split, t.shape, tensor)));
  if (begin > end || end > n)
    return Status::InvalidArgument(fmt::format(
        "{}: elements [{}, {}) of a slice of {} of tensor '{}'", dir_, begin, end, n, name));
  // The same slice as stored: straight from its pieces.
  const bool same =
      (t.tensor == 1 && split.replicated()) ||
      (t.tensor == tensor && t.split.dim == split.dim && t.split.parts == split.parts);
  if (same) return CopyRange(name, t, t.tensor == 1 ? 0 : rank, begin, end, dst);
  // Else by runs: the stored ranks' runs partition the full tensor; each run of the wanted
  // slice is copied from the stored runs it overlaps.
  std::vector<Run> stored, wanted;
  for (int k = 0; k < t.tensor; ++k) RunsOf(t.shape, t.split, k, t.tensor, &stored);
  std::sort(stored.begin(), stored.end(),
            [](const Run& a, const Run& b) { return a.full < b.full; });
  RunsOf(t.shape, split, rank, tensor, &wanted);
  for (const Run& w : wanted) {
    // The part of this run inside [begin, end) of the slice.
    const size_t lo = std::max(begin, w.slice), hi = std::min(end, w.slice + w.len);
    if (lo >= hi) continue;
    size_t f = w.full + (lo - w.slice);
    const size_t f_end = w.full + (hi - w.slice);
    auto s = std::upper_bound(stored.begin(), stored.end(), f,
                              [](size_t v, const Run& r) { return v < r.full + r.len; });
    for (; f < f_end; ++s) {
      KEEL_CHECK(s != stored.end() && s->full <= f, "stored runs do not cover the tensor");
      const size_t m = std::min(f_end, s->full + s->len) - f;
      const size_t from = s->slice + (f - s->full);
      float* to = dst + (w.slice + (f - w.full) - begin);
      KEEL_RETURN_IF_ERROR(CopyRange(name, t, s->rank, from, from + m, to));
      f += m;
    }
  }
  return Status::OK();
}

Status CheckpointTensors::ReadFull(const std::string& name, float* dst) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end())
    return Status::InvalidArgument(fmt::format("{}: no tensor '{}'", dir_, name));
  return Read(name, TensorSplit{}, 0, 1, 0, static_cast<size_t>(Numel(it->second.shape)), dst);
}

Status FillLocalTensors(const CheckpointTensors& ckpt, bool moments,
                        const std::vector<LocalTensor>& tensors) {
  for (const LocalTensor& t : tensors) {
    auto read = [&](const std::string& name, size_t begin, size_t end, float* dst) -> Status {
      if (!ckpt.Has(name))
        return Status::Corruption(fmt::format("{}: tensor '{}' is missing (saved at {}); {}",
                                              ckpt.dir(), name, ckpt.layout(),
                                              kDamagedCheckpointFix));
      if (ckpt.FullShape(name) != t.full_shape)
        return Status::Corruption(fmt::format("{}: tensor '{}' is {}, this model's is {}",
                                              ckpt.dir(), name, json(ckpt.FullShape(name)).dump(),
                                              json(t.full_shape).dump()));
      return ckpt.Read(name, t.split, t.tensor_rank, t.tensor_size, begin, end, dst);
    };
    if (t.weights != nullptr) KEEL_RETURN_IF_ERROR(read(t.name, 0, t.slice_numel(), t.weights));
    if (!moments || t.moment_begin >= t.moment_end) continue;
    KEEL_RETURN_IF_ERROR(read("exp_avg." + t.name, t.moment_begin, t.moment_end, t.exp_avg));
    KEEL_RETURN_IF_ERROR(read("exp_avg_sq." + t.name, t.moment_begin, t.moment_end, t.exp_avg_sq));
  }
  return Status::OK();
}

std::string ReshardNote(const CheckpointTensors& ckpt, const PieceCoords& now) {
  const int saved_data = std::max(ckpt.data_size(), 1);
  if (ckpt.tensor_size() == now.tensor && ckpt.pipeline_size() == now.pipeline &&
      saved_data == now.data)
    return "";
  std::vector<std::string> what;
  if (ckpt.tensor_size() != now.tensor)
    what.push_back(
        fmt::format("tensor-parallel slices re-cut from {} to {}", ckpt.tensor_size(), now.tensor));
  if (ckpt.pipeline_size() != now.pipeline)
    what.push_back(
        fmt::format("layers regrouped from {} into {} stages", ckpt.pipeline_size(), now.pipeline));
  if (saved_data != now.data)
    what.push_back(
        fmt::format("optimizer shards re-cut from {} to {} data ranks", saved_data, now.data));
  std::string list;
  for (const std::string& w : what) list += (list.empty() ? "" : "; ") + w;
  return fmt::format(
      "note: {} was saved at {} and is loaded at {}: {} (read in place, no "
      "conversion step)",
      ckpt.dir(), ckpt.layout(), LayoutText(now.tensor, now.pipeline, now.data), list);
}

Status ReadAllFull(const CheckpointTensors& ckpt, FullTensors* out) {
  for (const std::string& name : ckpt.Names()) {
    const std::vector<int64_t>& shape = ckpt.FullShape(name);
    const size_t n = static_cast<size_t>(Numel(shape));
    const float* data = ckpt.Whole(name);
    if (data == nullptr) {
      std::vector<float>& v = out->storage[name];
      v.resize(n);
      KEEL_RETURN_IF_ERROR(ckpt.ReadFull(name, v.data()));
      data = v.data();
    }
    const bool moment = name.rfind("exp_avg.", 0) == 0 || name.rfind("exp_avg_sq.", 0) == 0;
    (moment ? out->moments : out->weights)[name] = {
        "F32", shape, reinterpret_cast<const char*>(data), n * sizeof(float)};
  }
  return Status::OK();
}

}  // namespace keel
