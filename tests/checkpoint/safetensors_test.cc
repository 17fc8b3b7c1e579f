#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>

namespace keel {
namespace {

TEST(SafetensorsTest, RoundTripKeepsNamesShapesValuesAndMetadata) {
  Env* env = Env::Default();
  const std::string path = ::testing::TempDir() + "/keel_st_test.safetensors";
  std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-0.5f};
  ASSERT_TRUE(WriteSafetensors(env, path,
                               {{"layers.0.w", {2, 3}, a.data()}, {"bias", {1}, b.data()}},
                               {{"format", "keel"}})
                  .ok());
  std::string bytes;
  ASSERT_TRUE(env->ReadFileToString(path, &bytes).ok());
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i)
    hlen |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(hlen % 8, 0u);  // tensor data stays 8-byte aligned
  EXPECT_EQ(bytes.size(), 8 + hlen + 7 * sizeof(float));
  EXPECT_NE(bytes.find("\"dtype\":\"F32\""), std::string::npos);

  std::map<std::string, LoadedTensor> t;
  std::map<std::string, std::string> meta;
  ASSERT_TRUE(ReadSafetensors(env, path, &t, &meta).ok());
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t["layers.0.w"].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t["layers.0.w"].data, a);
  EXPECT_EQ(t["bias"].data, b);
  EXPECT_EQ(meta["format"], "keel");

  // A truncated file is refused, naming the file.
  ASSERT_TRUE(WriteFileAtomic(env, path, bytes.substr(0, bytes.size() - 4)).ok());
  Status st = ReadSafetensors(env, path, &t, nullptr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find(path), std::string::npos);
  EXPECT_NE(st.message().find("truncated"), std::string::npos);
  env->RemoveFile(path);
}

}  // namespace
}  // namespace keel
