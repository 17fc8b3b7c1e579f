#include "core/json_reader.h"

namespace keel {

std::string DescribeJson(const nlohmann::json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "an object " + text;
    case nlohmann::json::value_t::array:
      return "an array " + text;
    case nlohmann::json::value_t::string:
      return "the string " + text;
    case nlohmann::json::value_t::boolean:
      return text;
    default:
      return "the number " + text;
  }
}

JsonReader::JsonReader(std::string file, const nlohmann::json& doc, std::string fix)
    : file_(std::move(file)), fix_(std::move(fix)), doc_(doc) {}

void JsonReader::Fail(const std::string& path, const std::string& message) {
  if (!status_.ok()) return;
  status_ =
      Status::Corruption(file_ + ": " + (path.empty() ? "the document" : "key '" + path + "'") +
                         " " + message + (fix_.empty() ? "" : "; " + fix_));
}

const nlohmann::json& JsonValue::raw() const {
  static const nlohmann::json* const null = new nlohmann::json();
  return v_ != nullptr ? *v_ : *null;
}

std::string JsonValue::Child(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

bool JsonValue::Expect(bool ok, const std::string& what) const {
  if (!ok) r_->Fail(path_, "must be " + what + ", but is " + DescribeJson(*v_));
  return ok;
}

JsonValue JsonValue::operator[](const std::string& key) const {
  JsonValue child = Optional(key);
  if (v_ != nullptr && v_->is_object() && child.v_ == nullptr) r_->Fail(Child(key), "is missing");
  return child;
}

JsonValue JsonValue::operator[](size_t i) const {
  const std::string path = path_ + "[" + std::to_string(i) + "]";
  if (v_ == nullptr || !Expect(v_->is_array(), "an array")) return JsonValue(r_, nullptr, path);
  if (i >= v_->size()) {
    r_->Fail(path, "is missing (the array has " + std::to_string(v_->size()) +
                       (v_->size() == 1 ? " element)" : " elements)"));
    return JsonValue(r_, nullptr, path);
  }
  return JsonValue(r_, &(*v_)[i], path);
}

JsonValue JsonValue::Optional(const std::string& key) const {
  if (v_ == nullptr || !Expect(v_->is_object(), "an object"))
    return JsonValue(r_, nullptr, Child(key));
  const auto it = v_->find(key);
  return JsonValue(r_, it == v_->end() ? nullptr : &*it, Child(key));
}

std::vector<JsonValue> JsonValue::Items() const {
  std::vector<JsonValue> items;
  if (v_ == nullptr || !Expect(v_->is_array(), "an array")) return items;
  for (size_t i = 0; i < v_->size(); ++i)
    items.push_back(JsonValue(r_, &(*v_)[i], path_ + "[" + std::to_string(i) + "]"));
  return items;
}

double JsonValue::Number(double fallback) const {
  if (v_ == nullptr || !r_->ok()) return fallback;
  if (v_->is_null()) return NAN;
  return Expect(v_->is_number(), "a number (or null)") ? v_->get<double>() : fallback;
}

}  // namespace keel
