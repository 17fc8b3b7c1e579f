#include "metrics/tf_event.h"

#include <fmt/format.h>
#include <isa-l/crc.h>

#include <cstring>

namespace keel {
namespace {

// ---- protobuf wire format: varints, keys, length-delimited fields --------------------------
void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void PutKey(std::string* out, int field, int wire_type) {
  PutVarint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}
void PutBytes(std::string* out, int field, std::string_view bytes) {
  PutKey(out, field, 2);
  PutVarint(out, bytes.size());
  out->append(bytes);
}
template <typename T>
void PutFixed(std::string* out, int field, T v) {  // double (wire type 1) or float (5)
  PutKey(out, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host (x86-64, aarch64)
  out->append(b, sizeof(T));
}
void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Re-encodes a field as FieldReader returned it.
void PutField(std::string* out, int field, int wire, uint64_t num, std::string_view bytes) {
  if (wire == 2) {
    PutBytes(out, field, bytes);
  } else if (wire == 0) {
    PutKey(out, field, 0);
    PutVarint(out, num);
  } else {
    PutKey(out, field, wire);
    PutLe(out, num, wire == 1 ? 8 : 4);
  }
}

std::string EventHeader(double wall_time, int64_t step) {
  std::string e;
  PutFixed(&e, 1, wall_time);
  if (step != 0) {
    PutKey(&e, 2, 0);
    PutVarint(&e, static_cast<uint64_t>(step));
  }
  return e;
}

// Reads protobuf fields of `msg` one at a time.
class FieldReader {
 public:
  explicit FieldReader(std::string_view msg) : p_(msg) {}
  // False at the end; sets ok() false on malformed input.
  bool Next(int* field, int* wire, uint64_t* num, std::string_view* bytes) {
    if (p_.empty() || !ok_) return false;
    uint64_t key;
    if (!Varint(&key)) return ok_ = false;
    *field = static_cast<int>(key >> 3);
    *wire = static_cast<int>(key & 7);
    switch (*wire) {
      case 0:
        return ok_ = Varint(num);
      case 1:
      case 5: {
        const size_t n = *wire == 1 ? 8 : 4;
        if (p_.size() < n) return ok_ = false;
        *num = 0;
        std::memcpy(num, p_.data(), n);
        p_.remove_prefix(n);
        return true;
      }
      case 2: {
        uint64_t len;
        if (!Varint(&len) || len > p_.size()) return ok_ = false;
        *bytes = p_.substr(0, len);
        p_.remove_prefix(len);
        return true;
      }
      default:
        return ok_ = false;
    }
  }
  bool ok() const { return ok_; }

 private:
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && !p_.empty(); shift += 7) {
      const uint8_t b = static_cast<uint8_t>(p_[0]);
      p_.remove_prefix(1);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  std::string_view p_;
  bool ok_ = true;
};

}  // namespace

uint32_t Crc32c(std::string_view data) {
  // ISA-L's iSCSI CRC is CRC-32C without the final inversion.
  return ~crc32_iscsi(reinterpret_cast<unsigned char*>(const_cast<char*>(data.data())),
                      static_cast<int>(data.size()), 0xFFFFFFFFu);
}

uint32_t MaskedCrc32c(std::string_view data) {
  const uint32_t c = Crc32c(data);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string EncodeFileVersionEvent(double wall_time) {
  std::string e = EventHeader(wall_time, 0);
  PutBytes(&e, 3, "brain.Event:2");
  return e;
}

// Event { wall_time, step, summary = 5 { value = 1 { <value> } } }
std::string EventWithValue(double wall_time, int64_t step, const std::string& value) {
  std::string summary;
  PutBytes(&summary, 1, value);
  std::string e = EventHeader(wall_time, step);
  PutBytes(&e, 5, summary);
  return e;
}

std::string EncodeScalarEvent(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string v;
  PutBytes(&v, 1, tag);
  PutFixed(&v, 2, value);
  return EventWithValue(wall_time, step, v);
}

std::string EncodeTextEvent(double wall_time, int64_t step, const std::string& tag,
                            const std::string& text) {
  std::string plugin;  // PluginData { plugin_name = 1 }
  PutBytes(&plugin, 1, "text");
  std::string meta;  // SummaryMetadata { plugin_data = 1 }
  PutBytes(&meta, 1, plugin);
  std::string dim;  // TensorShapeProto.Dim { size = 1 }
  PutKey(&dim, 1, 0);
  PutVarint(&dim, 1);
  std::string shape;  // TensorShapeProto { dim = 2 }
  PutBytes(&shape, 2, dim);
  // TensorProto { dtype = 1 (DT_STRING = 7); tensor_shape = 2; string_val = 8 }
  std::string tensor;
  PutKey(&tensor, 1, 0);
  PutVarint(&tensor, 7);
  PutBytes(&tensor, 2, shape);
  PutBytes(&tensor, 8, text);
  std::string v;
  PutBytes(&v, 1, tag);
  PutBytes(&v, 8, tensor);
  PutBytes(&v, 9, meta);
  return EventWithValue(wall_time, step, v);
}

std::string TagAxisSuffix(const std::string& tag) {
  for (const std::string suffix : {" vs samples", " vs tokens"})
    if (tag.size() >= suffix.size() &&
        tag.compare(tag.size() - suffix.size(), suffix.size(), suffix) == 0)
      return suffix;
  return "";
}

std::string FrameRecord(std::string_view data) {
  std::string r;
  std::string len;
  PutLe(&len, data.size(), 8);
  r += len;
  PutLe(&r, MaskedCrc32c(len), 4);
  r.append(data);
  PutLe(&r, MaskedCrc32c(data), 4);
  return r;
}

Status ParseEventFile(std::string_view bytes, const std::string& what,
                      std::vector<DecodedEvent>* out) {
  out->clear();
  size_t off = 0;
  auto le = [&](size_t at, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[at + i])) << (8 * i);
    return v;
  };
  while (off < bytes.size()) {
    const auto bad = [&](const std::string& why) {
      return Status::Corruption(fmt::format("{}: record at byte {}: {}", what, off, why));
    };
    if (bytes.size() - off < 12) return bad("truncated header");
    const uint64_t len = le(off, 8);
    if (le(off + 8, 4) != MaskedCrc32c(bytes.substr(off, 8))) return bad("length CRC mismatch");
    // Compared without adding to `len`, which a corrupt header may set to anything.
    const uint64_t rest = bytes.size() - off - 12;
    if (rest < 4 || len > rest - 4) return bad("truncated data");
    const std::string_view data = bytes.substr(off + 12, len);
    if (le(off + 12 + len, 4) != MaskedCrc32c(data)) return bad("data CRC mismatch");
    DecodedEvent ev;
    ev.data = std::string(data);
    FieldReader r(data);
    int field, wire;
    uint64_t num = 0;
    std::string_view b;
    while (r.Next(&field, &wire, &num, &b)) {
      if (field == 1 && wire == 1) std::memcpy(&ev.wall_time, &num, 8);
      if (field == 2 && wire == 0) ev.step = static_cast<int64_t>(num);
      if (field == 3 && wire == 2) ev.file_version = std::string(b);
      if (field == 5 && wire == 2 && ev.tag.empty()) {
        FieldReader sr(b);
        std::string_view value;
        while (sr.Next(&field, &wire, &num, &value)) {
          if (field != 1 || wire != 2) continue;
          FieldReader vr(value);
          std::string_view vb;
          while (vr.Next(&field, &wire, &num, &vb)) {
            if (field == 1 && wire == 2) ev.tag = std::string(vb);
            if (field == 2 && wire == 5) {
              const uint32_t bits = static_cast<uint32_t>(num);
              std::memcpy(&ev.scalar, &bits, 4);
              ev.has_scalar = true;
            }
            if (field == 8 && wire == 2) {
              FieldReader tr(vb);
              std::string_view tb;
              while (tr.Next(&field, &wire, &num, &tb))
                if (field == 8 && wire == 2) ev.text = std::string(tb);
            }
          }
          break;  // the first value
        }
      }
    }
    if (!r.ok()) return bad("malformed Event message");
    out->push_back(std::move(ev));
    off += 12 + len + 4;
  }
  return Status::OK();
}

std::string RetagEvent(const std::string& data, const std::string& new_tag) {
  std::string out;
  FieldReader r(data);
  int field, wire;
  uint64_t num = 0;
  std::string_view b;
  while (r.Next(&field, &wire, &num, &b)) {
    if (field == 5 && wire == 2) {
      std::string summary;
      FieldReader sr(b);
      std::string_view value;
      bool first = true;
      while (sr.Next(&field, &wire, &num, &value)) {
        if (field != 1 || wire != 2) continue;
        std::string v;
        FieldReader vr(value);
        std::string_view vb;
        while (vr.Next(&field, &wire, &num, &vb)) {
          if (field == 1 && wire == 2 && first) {
            PutBytes(&v, 1, new_tag);
          } else {
            PutField(&v, field, wire, num, vb);
          }
        }
        first = false;
        PutBytes(&summary, 1, v);
      }
      PutBytes(&out, 5, summary);
    } else {
      PutField(&out, field, wire, num, b);
    }
  }
  return out;
}

}  // namespace keel
