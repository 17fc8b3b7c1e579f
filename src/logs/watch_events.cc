#include "logs/watch_events.h"

namespace keel {

bool IsWatchEntry(const nlohmann::json& line) {
  const auto it = line.is_object() ? line.find(kWatchSourceKey) : line.end();
  return it != line.end() && it->is_string() && it->get<std::string>() == kLogWatchSource;
}

std::vector<EventSchema> WatchEventSchemas() {
  std::vector<EventSchema> out;
  auto add = [&](std::vector<EventSchema> s) { out.insert(out.end(), s.begin(), s.end()); };
  add(EventSchemasOf<WatchFindingEvent>());
  add(EventSchemasOf<WatchKillSwitchEvent>());
  add(EventSchemasOf<HooksDroppedEvent>());
  return out;
}

}  // namespace keel
