// Manifest: ToJson/FromJson, and manifests keel did not write (found by fuzz/manifest_fuzz).
#include "checkpoint/manifest.h"

#include <gtest/gtest.h>

#include <string>

namespace keel {
namespace {

TEST(ManifestTest, RoundTripKeepsIterationNamesSizesAndChecksums) {
  Manifest m;
  m.iteration = 400;
  m.files = {{"model.safetensors", 123456, 0x0123456789abcdefULL}, {"state.json", 7, 0}};
  Manifest back;
  ASSERT_TRUE(Manifest::FromJson(m.ToJson(), "m.json", &back).ok());
  EXPECT_EQ(back.iteration, 400);
  ASSERT_EQ(back.files.size(), 2u);
  EXPECT_EQ(back.files[0].name, "model.safetensors");
  EXPECT_EQ(back.files[0].size, 123456u);
  EXPECT_EQ(back.files[0].xxh3, 0x0123456789abcdefULL);
  EXPECT_EQ(back.files[1].xxh3, 0u);
}

// Found by fuzz/manifest_fuzz: a field of another type threw out of FromJson ({"format":[]}), and
// a number with an exponent was converted to an integer with undefined behaviour. Each is now a
// Corruption naming the file.
TEST(ManifestTest, FieldsOfTheWrongTypeOrRangeAreCorruption) {
  const std::string head = R"({"format":"keel-checkpoint","format_version":1,)";
  for (const std::string& text :
       {std::string(R"({"format":[]})"), std::string(R"({"format":"keel-checkpoint"})"),
        std::string(R"({"format":"keel-checkpoint","format_version":"1"})"),
        std::string(R"({"format":"keel-checkpoint","format_version":1e300})"),
        head + R"("iteration":1e300,"files":[]})", head + R"("iteration":-1,"files":[]})",
        head + R"("iteration":5,"files":{}})", head + R"("iteration":5,"files":[7]})",
        head + R"("iteration":5,"files":[{"name":"a","size":1e30,"xxh3":"0000000000000000"}]})",
        head + R"("iteration":5,"files":[{"name":"a","size":-1,"xxh3":"0000000000000000"}]})",
        head + R"("iteration":5,"files":[{"name":"a","size":1,"xxh3":"-1"}]})",
        head + R"("iteration":5,"files":[{"name":"a","size":1,"xxh3":"0x00000000000001"}]})",
        head + R"("iteration":5,"files":[{"name":3,"size":1,"xxh3":"0000000000000000"}]})"}) {
    Manifest m;
    Status st = Manifest::FromJson(text, "ckpt/manifest.json", &m);
    ASSERT_FALSE(st.ok()) << text;
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << text;
    EXPECT_NE(st.message().find("ckpt/manifest.json"), std::string::npos) << st.message();
  }
}

}  // namespace
}  // namespace keel
