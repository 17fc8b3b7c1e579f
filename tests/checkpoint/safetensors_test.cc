#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

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

// An image of `header` (JSON) followed by `data`.
std::string Image(const std::string& header, const std::string& data) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + data;
}

// Found by fuzz/safetensors_fuzz: offsets and dimensions written as numbers with an exponent were
// converted to integers with undefined behaviour, and negative or huge dimensions whose product
// wrapped around to the byte count were accepted. All are Corruption naming the tensor.
TEST(SafetensorsTest, DimensionsAndOffsetsMustBeIntegersThatFitTheFile) {
  const std::string data(16, '\0');
  for (const std::string& tensor :
       {std::string(R"({"dtype":"F16","shape":[3],"data_offsets":[4818446744737095516160]})"),
        std::string(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8e0]})"),
        std::string(R"({"dtype":"F32","shape":[1e30],"data_offsets":[0,8]})"),
        std::string(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})"),
        std::string(R"({"dtype":"F32","shape":[-1,-1],"data_offsets":[0,4]})"),
        std::string(R"({"dtype":"F32","shape":[1099511627776,1099511627776,1099511627776],)"
                    R"("data_offsets":[0,0]})"),
        std::string(R"({"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]})"),
        std::string(R"({"dtype":"F32","shape":[2305843009213693952,2],"data_offsets":[0,0]})"),
        std::string(R"({"dtype":"F32","shape":[0,9223372036854775808],"data_offsets":[0,0]})"),
        std::string(R"({"dtype":"F32","shape":3,"data_offsets":[0,12]})")}) {
    const std::string image = Image(R"({"w":)" + tensor + "}", data);
    std::map<std::string, TensorRef> out;
    Status st = ParseSafetensors(image.data(), image.size(), "m.safetensors", &out, nullptr);
    ASSERT_FALSE(st.ok()) << tensor;
    EXPECT_EQ(st.code(), Status::Code::kCorruption);
    EXPECT_NE(st.message().find("m.safetensors"), std::string::npos) << st.message();
  }
  // What fits is read: an empty tensor, a scalar, and a [2, 2] F32 tensor.
  const std::string image = Image(R"({"e":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]},)"
                                  R"("s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},)"
                                  R"("w":{"dtype":"F32","shape":[2,2],"data_offsets":[4,20]}})",
                                  data + std::string(4, '\0'));
  std::map<std::string, TensorRef> out;
  Status st = ParseSafetensors(image.data(), image.size(), "m.safetensors", &out, nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(out["e"].bytes, 0u);
  EXPECT_EQ(out["s"].bytes, 4u);
  EXPECT_EQ(out["w"].shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(out["w"].bytes, 16u);
}

// A safetensors image written by hand: a BF16 tensor, and an F32 one whose data is not 4-byte
// aligned (legal in the format; keel's writer never does it).
std::string HandWrittenImage() {
  std::string header = R"({"half":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},)"
                       R"("odd":{"dtype":"F32","shape":[1],"data_offsets":[6,10]}})";
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');
  std::string image;
  for (int i = 0; i < 8; ++i) image.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  image += header;
  image += std::string(6, '\0');
  const float v = 2.5f;
  image.append(reinterpret_cast<const char*>(&v), sizeof(v));
  return image;
}

TEST(MappedSafetensorsTest, ReadsTensorsInPlaceByNameAndShape) {
  Env* env = Env::Default();
  const std::string path = ::testing::TempDir() + "/keel_mapped_test.safetensors";
  std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-0.5f};
  ASSERT_TRUE(WriteSafetensors(env, path,
                               {{"layers.0.w", {2, 3}, a.data()}, {"bias", {1}, b.data()}},
                               {{"format", "pt"}})
                  .ok());
  MappedSafetensors f;
  ASSERT_TRUE(MappedSafetensors::Open(env, path, &f).ok());
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_NE(f.Find("bias"), nullptr);
  EXPECT_EQ(f.Find("bias")->dtype, "F32");
  EXPECT_EQ(f.Find("nope"), nullptr);
  const float* data = nullptr;
  ASSERT_TRUE(f.GetF32("layers.0.w", {2, 3}, &data).ok());
  EXPECT_EQ(std::vector<float>(data, data + 6), a);
  std::vector<float> copy(6, 0.0f);
  ASSERT_TRUE(f.CopyF32("layers.0.w", {2, 3}, copy.data()).ok());
  EXPECT_EQ(copy, a);
  EXPECT_TRUE(f.CheckNoOtherTensors({"layers.0.w", "bias"}).ok());
  // A moved-to object keeps the mapping its views point into.
  MappedSafetensors moved = std::move(f);
  ASSERT_TRUE(moved.GetF32("bias", {1}, &data).ok());
  EXPECT_EQ(*data, -0.5f);
  env->RemoveFile(path);
}

TEST(MappedSafetensorsTest, ErrorsNameTheFileTheTensorAndWhatWasExpectedAndFound) {
  Env* env = Env::Default();
  const std::string path = ::testing::TempDir() + "/keel_mapped_errors.safetensors";
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(WriteSafetensors(env, path, {{"w", {2, 3}, a.data()}}, {}).ok());
  MappedSafetensors f;
  ASSERT_TRUE(MappedSafetensors::Open(env, path, &f).ok());
  std::vector<float> dst(6, 0.0f);
  Status st = f.CopyF32("v", {2, 3}, dst.data());
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_EQ(st.message(), path + ": tensor 'v' is missing (expected F32 [2, 3])");
  st = f.CopyF32("w", {3, 2}, dst.data());
  EXPECT_EQ(st.message(), path + ": tensor 'w' is F32 [2, 3], expected F32 [3, 2]");
  EXPECT_EQ(dst, std::vector<float>(6, 0.0f));  // nothing was copied
  st = f.CheckNoOtherTensors({"v"});
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find(path + ": unexpected tensor 'w' (F32 [2, 3])"), std::string::npos)
      << st.message();

  ASSERT_TRUE(WriteFileAtomic(env, path, HandWrittenImage()).ok());
  ASSERT_TRUE(MappedSafetensors::Open(env, path, &f).ok());
  st = f.CopyF32("half", {2}, dst.data());
  EXPECT_EQ(st.message(), path + ": tensor 'half' is BF16 [2], expected F32 [2]");
  // Misaligned data is copied, but never handed out as a float pointer.
  const float* data = nullptr;
  st = f.GetF32("odd", {1}, &data);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("not 4-byte aligned"), std::string::npos) << st.message();
  EXPECT_EQ(data, nullptr);
  ASSERT_TRUE(f.CopyF32("odd", {1}, dst.data()).ok());
  EXPECT_EQ(dst[0], 2.5f);

  EXPECT_FALSE(MappedSafetensors::Open(env, path + ".absent", &f).ok());
  env->RemoveFile(path);
}

// Issue 35: tensors whose bytes overlap (writing one changes the other) and a header that gives a
// key twice (JSON readers keep one silently) were accepted; both are Corruption naming the file
// and the tensors or the key.
TEST(SafetensorsTest, OverlappingTensorsAndDuplicateKeysAreRefusedByName) {
  const std::string data(16, '\0');
  std::map<std::string, TensorRef> out;
  std::string image = Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            data);
  Status st = ParseSafetensors(image.data(), image.size(), "m.safetensors", &out, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("m.safetensors: tensors 'a' and 'b' overlap (bytes 0-8 and 4-12"),
            std::string::npos)
      << st.message();
  // The same bytes twice (an alias) overlap too; empty tensors hold no bytes and overlap nothing.
  image = Image(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                R"("e":{"dtype":"F32","shape":[0],"data_offsets":[8,8]},)"
                R"("z":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                data);
  st = ParseSafetensors(image.data(), image.size(), "m.safetensors", &out, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("tensors 'a' and 'z' overlap"), std::string::npos) << st.message();
  image = Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                data);
  st = ParseSafetensors(image.data(), image.size(), "m.safetensors", &out, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("m.safetensors: the header gives the key \"a\" twice"),
            std::string::npos)
      << st.message();
  image = Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"dtype":"F16"}})", data);
  st = ParseSafetensors(image.data(), image.size(), "m.safetensors", &out, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("the key \"dtype\" (inside an entry) twice"), std::string::npos)
      << st.message();
  // The same key in two entries is no duplicate.
  image = Image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                data);
  st = ParseSafetensors(image.data(), image.size(), "m.safetensors", &out, nullptr);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// A header over the 100 MB safetensors allows is refused with the cap in the message, before it
// is parsed.
TEST(SafetensorsTest, HeaderOverTheCapIsRefusedWithTheCap) {
  const uint64_t hlen = kMaxSafetensorsHeaderBytes + 1;
  std::string image(8 + hlen, ' ');
  for (int i = 0; i < 8; ++i) image[i] = static_cast<char>((hlen >> (8 * i)) & 0xff);
  image[8] = '{';
  image.back() = '}';
  std::map<std::string, TensorRef> out;
  const Status st = ParseSafetensors(image.data(), image.size(), "m.safetensors", &out, nullptr);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("more than the 100000000 bytes safetensors allows"),
            std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace keel
