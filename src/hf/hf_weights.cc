#include "hf/hf_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "hf/hf_config.h"

namespace keel {
namespace {

uint16_t LoadU16(const char* p) {
  return static_cast<uint16_t>(static_cast<unsigned char>(p[0]) |
                               (static_cast<unsigned char>(p[1]) << 8));
}

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // Inf, NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else {
    // Zero or subnormal: mant * 2^-24, exact in fp32.
    const float v = std::ldexp(static_cast<float>(mant), -24);
    std::memcpy(&bits, &v, sizeof bits);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

Status ParseHfWeightsIndex(const std::string& text, const std::string& path,
                           std::map<std::string, std::string>* weight_map) {
  weight_map->clear();
  const nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object())
    return Status::Corruption(path + " is not a JSON object (a safetensors index)");
  auto it = doc.find("weight_map");
  if (it == doc.end() || !it->is_object())
    return Status::Corruption(path + " has no weight_map object (tensor name -> shard file)");
  for (const auto& [name, file] : it->items()) {
    if (!file.is_string())
      return Status::Corruption(fmt::format("{}: weight_map[\"{}\"] must be a file name, but is {}",
                                            path, name, file.dump().substr(0, 60)));
    const std::string f = file.get<std::string>();
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos ||
        f.find('\0') != std::string::npos)
      return Status::Corruption(fmt::format(
          "{}: weight_map[\"{}\"] names '{}', which is not a file of the folder", path, name, f));
    (*weight_map)[name] = f;
  }
  if (weight_map->empty()) return Status::Corruption(path + ": weight_map names no tensor");
  return Status::OK();
}

Status HfWeights::Open(Env* env, const std::string& dir, HfWeights* out) {
  *out = HfWeights();
  HfWeights w;
  const std::string single = JoinPath(dir, kHfWeightsFile);
  const std::string index = JoinPath(dir, kHfWeightsIndexFile);
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> shards;
  if (env->FileExists(single)) {
    shards.push_back(kHfWeightsFile);
  } else if (env->FileExists(index)) {
    std::string text;
    KEEL_RETURN_IF_ERROR(env->ReadFileToString(index, &text, kMaxHfJsonBytes));
    KEEL_RETURN_IF_ERROR(ParseHfWeightsIndex(text, index, &weight_map));
    std::set<std::string> seen;
    for (const auto& [name, file] : weight_map)
      if (seen.insert(file).second) shards.push_back(file);
  } else {
    const bool bin = env->FileExists(JoinPath(dir, "pytorch_model.bin")) ||
                     env->FileExists(JoinPath(dir, "pytorch_model.bin.index.json"));
    return Status::InvalidArgument(
        dir + " has neither " + kHfWeightsFile + " nor " + kHfWeightsIndexFile +
        (bin ? ": its weights are pickled PyTorch files (pytorch_model.bin), which keel does not "
               "read; save the model with save_pretrained(..., safe_serialization=True)"
             : ": it is not a Hugging Face model folder"));
  }
  for (const std::string& shard : shards) {
    const std::string path = JoinPath(dir, shard);
    if (!env->FileExists(path))
      return Status::Corruption(
          fmt::format("{} names the shard {}, which does not exist", index, shard));
    MappedSafetensors m;
    KEEL_RETURN_IF_ERROR(MappedSafetensors::Open(env, path, &m));
    for (const auto& [name, ref] : m.tensors()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(name);
        if (it == weight_map.end() || it->second != shard)
          return Status::Corruption(
              fmt::format("{} holds tensor '{}', which {} {}", path, name, index,
                          it == weight_map.end() ? "does not list" : "puts in " + it->second));
      }
      if (w.info_.count(name))
        return Status::Corruption(
            fmt::format("tensor '{}' is in both {} and {}", name, w.info_[name].file, path));
      w.info_[name] = {ref.dtype, ref.shape, path};
      w.file_of_[name] = w.files_.size();
    }
    w.files_.push_back(std::move(m));
  }
  for (const auto& [name, file] : weight_map)
    if (!w.info_.count(name))
      return Status::Corruption(fmt::format("{} puts tensor '{}' in {}, which does not hold it",
                                            index, name, JoinPath(dir, file)));
  *out = std::move(w);
  return Status::OK();
}

std::vector<std::string> HfWeights::files() const {
  std::vector<std::string> out;
  for (const MappedSafetensors& m : files_) out.push_back(m.path());
  return out;
}

const HfWeights::Info* HfWeights::Find(const std::string& name) const {
  auto it = info_.find(name);
  return it == info_.end() ? nullptr : &it->second;
}

std::set<std::string> HfWeights::dtypes() const {
  std::set<std::string> out;
  for (const auto& [name, i] : info_) out.insert(i.dtype);
  return out;
}

Status HfWeights::ReadF32(const std::string& name, const std::vector<int64_t>& shape,
                          float* dst) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end())
    return Status::Corruption(fmt::format("the weights have no tensor '{}' (expected [{}])", name,
                                          fmt::join(shape, ", ")));
  const MappedSafetensors& file = files_[it->second];
  const TensorRef* t = file.Find(name);
  if (t->shape != shape)
    return Status::Corruption(fmt::format("{}: tensor '{}' has shape [{}], expected [{}]",
                                          file.path(), name, fmt::join(t->shape, ", "),
                                          fmt::join(shape, ", ")));
  if (t->dtype == "F32") {
    const size_t n = t->bytes / 4;
    std::memcpy(dst, t->data, n * sizeof(float));  // any alignment
  } else if (t->dtype == "F16") {
    const size_t n = t->bytes / 2;
    for (size_t i = 0; i < n; ++i) dst[i] = HalfToFloat(LoadU16(t->data + 2 * i));
  } else if (t->dtype == "BF16") {
    const size_t n = t->bytes / 2;
    for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(LoadU16(t->data + 2 * i));
  } else {
    return Status::InvalidArgument(fmt::format(
        "{}: tensor '{}' is {}; keel imports F32, F16 and BF16 weights (each exactly as fp32)",
        file.path(), name, t->dtype));
  }
  return Status::OK();
}

}  // namespace keel
