// keel tb rename / truncate on event directories written here: tags renamed in one pass per file
// (other events byte for byte), truncation keeps each curve up to the step and its "vs samples"
// partner in step with it, the originals are archived whole, and a damaged file stops the tool
// before any file changes.
#include "metrics/tb_tools.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "../cli/keel_process.h"
#include "metrics/tf_event.h"

namespace keel {
namespace {

namespace fs = std::filesystem;
using keel_test::FreshTempDir;
using keel_test::RunKeelShell;

void WriteRun(const std::string& path, int iters) {
  std::ofstream f(path, std::ios::binary);
  f << FrameRecord(EncodeFileVersionEvent(1.0));
  for (int it = 1; it <= iters; ++it) {
    f << FrameRecord(EncodeScalarEvent(it, it, "lm loss", 10.0f - it));
    f << FrameRecord(EncodeScalarEvent(it, it * 16, "lm loss vs samples", 10.0f - it));
    f << FrameRecord(EncodeScalarEvent(it, it, "grad-norm", 1.0f));
  }
}

std::map<std::string, std::vector<int64_t>> Steps(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), {});
  std::vector<DecodedEvent> evs;
  EXPECT_TRUE(ParseEventFile(bytes, path, &evs).ok());
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& e : evs)
    if (e.file_version.empty()) out[e.tag].push_back(e.step);
  return out;
}

TEST(TbToolsTest, RenameAndTruncateThroughTheCli) {
  const std::string dir = FreshTempDir("tb_tools");
  WriteRun(dir + "/events.out.tfevents.1.host", 10);
  WriteRun(dir + "/events.out.tfevents.2.host", 4);
  std::ofstream(dir + "/map.json") << R"({"lm loss": "lm-loss-training/lm loss",
      "lm loss vs samples": "lm-loss-training/lm loss vs samples", "absent": "x"})";
  auto r = RunKeelShell("", "tb rename --map " + dir + "/map.json " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("renamed 14 events: lm loss -> lm-loss-training/lm loss"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("no event has the tag 'absent'"), std::string::npos) << r.out;
  auto s = Steps(dir + "/events.out.tfevents.1.host");
  EXPECT_EQ(s.count("lm loss"), 0u);
  EXPECT_EQ(s["lm-loss-training/lm loss"].size(), 10u);
  EXPECT_EQ(s["grad-norm"].size(), 10u);

  r = RunKeelShell("", "tb truncate --after-step 6 " + dir);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("are in " + dir + "/tb-archive/truncate-after-step-6-"), std::string::npos)
      << r.out;
  s = Steps(dir + "/events.out.tfevents.1.host");
  EXPECT_EQ(s["lm-loss-training/lm loss"], (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(s["lm-loss-training/lm loss vs samples"],
            (std::vector<int64_t>{16, 32, 48, 64, 80, 96}));
  EXPECT_EQ(Steps(dir + "/events.out.tfevents.2.host")["grad-norm"].size(), 4u);
  int archived = 0;
  for (const auto& e : fs::directory_iterator(dir + "/tb-archive")) {
    EXPECT_EQ(Steps((e.path() / "events.out.tfevents.1.host").string())["grad-norm"].size(), 10u);
    ++archived;
  }
  EXPECT_EQ(archived, 1);

  // A damaged file: refused, and no file changes.
  std::string bytes;
  {
    std::ifstream f(dir + "/events.out.tfevents.2.host", std::ios::binary);
    bytes.assign((std::istreambuf_iterator<char>(f)), {});
  }
  bytes[bytes.size() / 2] ^= 0x10;
  std::ofstream(dir + "/events.out.tfevents.2.host", std::ios::binary | std::ios::trunc) << bytes;
  const auto before = Steps(dir + "/events.out.tfevents.1.host");
  r = RunKeelShell("", "tb truncate --after-step 2 " + dir);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("CRC mismatch"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nothing was changed"), std::string::npos) << r.out;
  EXPECT_EQ(Steps(dir + "/events.out.tfevents.1.host"), before);
  std::ofstream(dir + "/bad.json") << "[1, 2]";
  r = RunKeelShell("", "tb rename --map " + dir + "/bad.json " + dir);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("must be a JSON object"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(TbToolsTest, RenameHelpSaysTheMapIsAFile) {
  auto r = RunKeelShell("", "tb rename --help");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--map MAP.json"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("a JSON file holding an object"), std::string::npos) << r.out;
  // The option takes a path, not the JSON itself: given inline, it names the missing file.
  const std::string dir = FreshTempDir("tb_inline");
  r = RunKeelShell("", "tb rename --map '{\"a\": \"b\"}' " + dir);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--map {\"a\": \"b\"}"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

// A --map file is a JSON object of non-empty tag names; anything else is refused naming the file.
TEST(TbToolsTest, TagMapMustBeAnObjectOfNonEmptyNames) {
  std::map<std::string, std::string> map;
  ASSERT_TRUE(ParseTagMap(R"({"lm loss": "train/loss", "a": "b"})", "m.json", &map).ok());
  EXPECT_EQ(map, (std::map<std::string, std::string>{{"a", "b"}, {"lm loss", "train/loss"}}));
  for (const char* bad : {"", "[]", "{}", R"({"a": 1})", R"({"a": ""})", R"({"": "b"})",
                          R"({"a": "b")", R"({"a": ["b"]})"}) {
    const Status st = ParseTagMap(bad, "--map m.json", &map);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << bad;
    EXPECT_EQ(st.message().rfind("--map m.json must be a JSON object of non-empty tag names", 0),
              0u)
        << st.message();
  }
}

}  // namespace
}  // namespace keel
