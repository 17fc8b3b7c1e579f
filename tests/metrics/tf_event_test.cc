// TensorBoard event encoding: golden bytes of a scalar event, CRC-32C against its check value and
// a bitwise reference, the TFRecord frame layout, parsing back (and refusing a flipped byte),
// retagging, and an independent decoder (`protoc --decode_raw`) reading what keel wrote.
#include "metrics/tf_event.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace keel {
namespace {

// Bitwise CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the test's own reference.
uint32_t ReferenceCrc32c(std::string_view s) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

std::string Hex(const std::string& s) {
  std::string out;
  char b[4];
  for (unsigned char c : s) {
    std::snprintf(b, sizeof(b), "%02x ", c);
    out += b;
  }
  return out;
}

TEST(TfEventTest, ScalarEventGoldenBytes) {
  // Event{wall_time=1.5 (09 + LE double), step=3 (10 03), summary (2a 0a){value (0a 08){tag "a"
  // (0a 01 61), simple_value 2.0f (15 + LE float)}}}
  EXPECT_EQ(Hex(EncodeScalarEvent(1.5, 3, "a", 2.0f)),
            "09 00 00 00 00 00 00 f8 3f 10 03 2a 0a 0a 08 0a 01 61 15 00 00 00 40 ");
  // file_version "brain.Event:2" is field 3; step 0 is left out (the proto default).
  EXPECT_EQ(Hex(EncodeFileVersionEvent(0.0)),
            "09 00 00 00 00 00 00 00 00 1a 0d 62 72 61 69 6e 2e 45 76 65 6e 74 3a 32 ");
}

TEST(TfEventTest, Crc32cAndFrame) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);  // the CRC-32C check value
  for (const std::string& s :
       std::vector<std::string>{"", "a", "hello tensorboard", std::string(1000, 0x7f)})
    EXPECT_EQ(Crc32c(s), ReferenceCrc32c(s));
  const uint32_t c = Crc32c("abc");
  EXPECT_EQ(MaskedCrc32c("abc"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
  const std::string data = EncodeScalarEvent(2.0, 7, "x", 1.0f);
  const std::string rec = FrameRecord(data);
  ASSERT_EQ(rec.size(), 8 + 4 + data.size() + 4);
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= uint64_t(uint8_t(rec[i])) << (8 * i);
  EXPECT_EQ(len, data.size());
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(rec[at + i])) << (8 * i);
    return v;
  };
  auto masked = [](uint32_t x) { return ((x >> 15) | (x << 17)) + 0xa282ead8u; };
  EXPECT_EQ(u32(8), masked(ReferenceCrc32c(rec.substr(0, 8))));
  EXPECT_EQ(rec.substr(12, data.size()), data);
  EXPECT_EQ(u32(12 + data.size()), masked(ReferenceCrc32c(data)));
}

TEST(TfEventTest, ParseBackRetagAndRefuseCorruption) {
  std::string file = FrameRecord(EncodeFileVersionEvent(10.0)) +
                     FrameRecord(EncodeScalarEvent(11.0, 5, "grad-norm/grad-norm", 0.25f)) +
                     FrameRecord(EncodeTextEvent(12.0, 6, "guard/events", "rolled back"));
  std::vector<DecodedEvent> evs;
  ASSERT_TRUE(ParseEventFile(file, "f", &evs).ok());
  ASSERT_EQ(evs.size(), 3u);
  EXPECT_EQ(evs[0].file_version, "brain.Event:2");
  EXPECT_EQ(evs[1].step, 5);
  EXPECT_EQ(evs[1].wall_time, 11.0);
  EXPECT_EQ(evs[1].tag, "grad-norm/grad-norm");
  EXPECT_TRUE(evs[1].has_scalar);
  EXPECT_EQ(evs[1].scalar, 0.25f);
  EXPECT_EQ(evs[2].tag, "guard/events");
  EXPECT_EQ(evs[2].text, "rolled back");
  EXPECT_EQ(RetagEvent(evs[1].data, "gn/gn"), EncodeScalarEvent(11.0, 5, "gn/gn", 0.25f));
  const std::string text2 = RetagEvent(evs[2].data, "chronicle");
  EXPECT_EQ(text2, EncodeTextEvent(12.0, 6, "chronicle", "rolled back"));

  std::string bad = file;
  bad[bad.size() - 10] ^= 1;  // inside the last record's data
  Status st = ParseEventFile(bad, "events.x", &evs);
  EXPECT_EQ(st.code(), Status::Code::kCorruption);
  EXPECT_NE(st.message().find("events.x: record at byte"), std::string::npos) << st.message();
  EXPECT_FALSE(ParseEventFile(file.substr(0, file.size() - 3), "f", &evs).ok());
}

// A header whose length is near 2^64 (its CRC right) is truncated data: the length check used to
// add 4 to it, which wrapped around and sent the reader to a data CRC inside the header.
TEST(TfEventTest, LengthNear2To64IsTruncatedData) {
  for (uint64_t len : {~uint64_t{0}, ~uint64_t{0} - 1, ~uint64_t{0} - 3}) {
    std::string header;
    for (int i = 0; i < 8; ++i) header.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
    const uint32_t crc = MaskedCrc32c(header);
    for (int i = 0; i < 4; ++i) header.push_back(static_cast<char>((crc >> (8 * i)) & 0xff));
    std::vector<DecodedEvent> evs;
    Status st = ParseEventFile(header + std::string(20, 'x'), "f", &evs);
    EXPECT_EQ(st.code(), Status::Code::kCorruption);
    EXPECT_NE(st.message().find("truncated data"), std::string::npos) << st.message();
  }
}

TEST(TfEventTest, ProtocDecodesWhatKeelWrites) {
  ASSERT_EQ(std::system("command -v protoc >/dev/null 2>&1"), 0)
      << "protoc (Debian protobuf-compiler) is needed: run scripts/test.sh";
  const auto path = std::filesystem::temp_directory_path() / "keel_tf_event_protoc.bin";
  std::ofstream(path, std::ios::binary)
      << EncodeScalarEvent(1.5, 42, "lm-loss-training/lm loss", 2.0f)
      << EncodeTextEvent(1.5, 43, "guard/events", "spike at 42");
  // Two messages back to back decode as one message with repeated fields.
  FILE* p = popen(("protoc --decode_raw < " + path.string()).c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("1: 0x3ff8000000000000"), std::string::npos) << out;  // wall_time 1.5
  EXPECT_NE(out.find("2: 42"), std::string::npos) << out;
  EXPECT_NE(out.find("1: \"lm-loss-training/lm loss\""), std::string::npos) << out;
  EXPECT_NE(out.find("2: 0x40000000"), std::string::npos) << out;  // 2.0f
  EXPECT_NE(out.find("8: \"spike at 42\""), std::string::npos) << out;
  EXPECT_NE(out.find("1: \"text\""), std::string::npos) << out;  // the text plugin
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace keel
