// TensorBoard event files, written by hand (no protobuf library): a file is a sequence of TFRecords
//   uint64 length | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)
// (little endian; masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8), each data an Event message:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; SummaryMetadata metadata = 9;
//             TensorProto tensor = 8; }
// Text (the guard's events) uses the text plugin: metadata.plugin_data.plugin_name = "text" and a
// DT_STRING tensor of shape [1].
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace keel {

uint32_t Crc32c(std::string_view data);
uint32_t MaskedCrc32c(std::string_view data);

// Event messages (the data of one record).
std::string EncodeFileVersionEvent(double wall_time);  // "brain.Event:2", written first
std::string EncodeScalarEvent(double wall_time, int64_t step, const std::string& tag, float value);
std::string EncodeTextEvent(double wall_time, int64_t step, const std::string& tag,
                            const std::string& text);
// The x-axis suffix of a tag: " vs samples" or " vs tokens" (Megatron's naming), "" when the
// tag is plotted against iterations.
std::string TagAxisSuffix(const std::string& tag);

// One TFRecord around `data`.
std::string FrameRecord(std::string_view data);

// What keel needs back from an event: enough to filter, rename and re-encode it.
struct DecodedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;  // set for the first event of a file
  std::string tag;           // of the first summary value ("" if none)
  bool has_scalar = false;
  float scalar = 0;
  std::string text;  // a text-plugin value
  std::string data;  // the record's data, as read
};
// Splits an event file into records, checking both CRCs of each; an error names the offset.
Status ParseEventFile(std::string_view bytes, const std::string& what,
                      std::vector<DecodedEvent>* out);
// The event with its first value's tag replaced (other fields kept byte for byte).
std::string RetagEvent(const std::string& data, const std::string& new_tag);

}  // namespace keel
