// JsonReader: a wrong type, a missing key, an out-of-range number or a short array in a file a
// person edited is reported with the file, the dotted key and the fix, never as a bare nlohmann
// message; optional keys take their fallbacks; the first failure is the one reported.
#include "core/json_reader.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

using nlohmann::json;

const json kDoc = json::parse(R"({
  "counters": {"iteration": 10, "tokens": 1e3, "big": 5000000000},
  "files": [{"name": "a", "size": 3}],
  "flag": true,
  "loss": null
})");

TEST(JsonReaderTest, ReadsPresentValuesAndOptionalFallbacks) {
  JsonReader r("f.json", kDoc, "FIX");
  const JsonValue root = r.root();
  EXPECT_EQ(root["counters"]["iteration"].Get<int64_t>(), 10);
  EXPECT_EQ(root["counters"]["big"].Get<int64_t>(), 5000000000);
  EXPECT_DOUBLE_EQ(root["counters"]["tokens"].Get<double>(), 1000.0);
  EXPECT_TRUE(root["flag"].Get<bool>());
  EXPECT_TRUE(std::isnan(root["loss"].Number()));
  EXPECT_EQ(root.Optional("absent").Get<int>(-7), -7);
  ASSERT_EQ(root["files"].Items().size(), 1u);
  EXPECT_EQ(root["files"][0]["name"].Get<std::string>(), "a");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
}

// The message of reading `read` from kDoc.
template <typename Read>
std::string ErrorOf(Read read) {
  JsonReader r("runs/x/state.json", kDoc, "restore it");
  read(r.root());
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Status::Code::kCorruption);
  const std::string m = r.status().message();
  EXPECT_EQ(m.find("json.exception"), std::string::npos) << m;
  EXPECT_EQ(m.rfind("runs/x/state.json: ", 0), 0u) << m;
  EXPECT_NE(m.find("; restore it"), std::string::npos) << m;
  return m;
}

TEST(JsonReaderTest, ErrorsNameTheFileTheKeyWhatWasExpectedAndTheFix) {
  EXPECT_NE(ErrorOf([](JsonValue v) {
              v["counters"]["tokens"].Get<int64_t>();
            }).find("key 'counters.tokens' must be an integer, but is the number 1000.0"),
            std::string::npos);
  EXPECT_NE(ErrorOf([](JsonValue v) {
              v["files"][0]["name"].Get<int>();
            }).find("key 'files[0].name' must be an integer, but is the string \"a\""),
            std::string::npos);
  EXPECT_NE(ErrorOf([](JsonValue v) {
              v["counters"]["steps"].Get<int64_t>();
            }).find("key 'counters.steps' is missing"),
            std::string::npos);
  EXPECT_NE(ErrorOf([](JsonValue v) {
              v["counters"]["big"].Get<int32_t>();
            }).find("key 'counters.big' must be an integer from -2147483648 to 2147483647"),
            std::string::npos);
  EXPECT_NE(ErrorOf([](JsonValue v) {
              v["files"][1]["size"].Get<uint64_t>();
            }).find("key 'files[1]' is missing (the array has 1 element)"),
            std::string::npos);
  EXPECT_NE(ErrorOf([](JsonValue v) {
              v["flag"]["x"].Get<bool>();
            }).find("key 'flag' must be an object, but is true"),
            std::string::npos);
  EXPECT_NE(ErrorOf([](JsonValue v) {
              v["counters"].Items();
            }).find("key 'counters' must be an array, but is an object"),
            std::string::npos);
  EXPECT_NE(ErrorOf([](JsonValue v) {
              v.Optional("flag").Get<std::string>();
            }).find("key 'flag' must be a string, but is true"),
            std::string::npos);
}

TEST(JsonReaderTest, TheFirstFailureIsReportedAndLaterReadsFallBack) {
  JsonReader r("f.json", kDoc);
  EXPECT_EQ(r.root()["nope"].Get<int>(3), 3);
  EXPECT_EQ(r.root()["counters"]["iteration"].Get<int64_t>(-1), -1);  // after a failure
  EXPECT_EQ(r.status().message(), "f.json: key 'nope' is missing");
}

}  // namespace
}  // namespace keel
