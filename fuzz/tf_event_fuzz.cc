// TensorBoard event files (TFRecords of Event protos). Each record carries two CRCs, which random
// mutations almost never get right, so the input is parsed twice: as given, and with every CRC it
// reaches recomputed, which lets the fuzzer into the lengths and the protobuf fields behind them.
// Every event read is then retagged and read back, as `keel tb rename-tags` does.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "metrics/tf_event.h"
#include "tfrecord_crcs.h"

namespace {

void ParseAndRetag(const std::string& bytes) {
  std::vector<keel::DecodedEvent> events;
  (void)keel::ParseEventFile(bytes, "fuzz.tfevents", &events);
  for (const keel::DecodedEvent& e : events) {
    const std::string framed = keel::FrameRecord(keel::RetagEvent(e.data, "fuzz/renamed"));
    std::vector<keel::DecodedEvent> again;
    (void)keel::ParseEventFile(framed, "retagged", &again);
    (void)keel::TagAxisSuffix(e.tag);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string raw = keel::fuzz::AsString(data, size);
  ParseAndRetag(raw);
  ParseAndRetag(keel::fuzz::FixRecordCrcs(raw));
  return 0;
}
