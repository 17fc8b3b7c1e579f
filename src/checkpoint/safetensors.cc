#include "checkpoint/safetensors.h"

#include <cstring>
#include <nlohmann/json.hpp>

namespace keel {

Status WriteSafetensors(Env* env, const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    const uint64_t bytes = numel * sizeof(float);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');  // keeps the tensor data 8-byte aligned
  std::string out;
  out.reserve(8 + h.size() + offset);
  const uint64_t hlen = h.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((hlen >> (8 * i)) & 0xff));
  out += h;
  for (const TensorView& t : tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    out.append(reinterpret_cast<const char*>(t.data), numel * sizeof(float));
  }
  return WriteFileAtomic(env, path, out);
}

Status ReadSafetensors(Env* env, const std::string& path, std::map<std::string, LoadedTensor>* out,
                       std::map<std::string, std::string>* metadata) {
  std::string buf;
  KEEL_RETURN_IF_ERROR(env->ReadFileToString(path, &buf));
  if (buf.size() < 8) return Status::Corruption(path + ": shorter than the 8-byte header length");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i)
    hlen |= static_cast<uint64_t>(static_cast<unsigned char>(buf[i])) << (8 * i);
  if (hlen > buf.size() - 8) return Status::Corruption(path + ": header length exceeds file size");
  nlohmann::json header = nlohmann::json::parse(buf.substr(8, hlen), nullptr, false);
  if (header.is_discarded() || !header.is_object())
    return Status::Corruption(path + ": header is not a JSON object");
  const uint64_t data_start = 8 + hlen;
  out->clear();
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (metadata)
        for (auto m = it->begin(); m != it->end(); ++m)
          (*metadata)[m.key()] = m->get<std::string>();
      continue;
    }
    const auto& t = *it;
    if (!t.contains("dtype") || t["dtype"] != "F32")
      return Status::Corruption(path + ": tensor '" + it.key() + "' is not F32");
    LoadedTensor lt;
    lt.shape = t["shape"].get<std::vector<int64_t>>();
    const uint64_t b = t["data_offsets"][0].get<uint64_t>(),
                   e = t["data_offsets"][1].get<uint64_t>();
    uint64_t numel = 1;
    for (int64_t d : lt.shape) numel *= static_cast<uint64_t>(d);
    if (e < b || e - b != numel * sizeof(float) || data_start + e > buf.size())
      return Status::Corruption(path + ": tensor '" + it.key() +
                                "' has inconsistent offsets or is truncated");
    lt.data.resize(numel);
    std::memcpy(lt.data.data(), buf.data() + data_start + b, numel * sizeof(float));
    (*out)[it.key()] = std::move(lt);
  }
  return Status::OK();
}

}  // namespace keel
