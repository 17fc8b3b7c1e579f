#include "launch/launch_events.h"

namespace keel {

std::vector<EventSchema> LaunchEventSchemas() {
  std::vector<EventSchema> out;
  auto add = [&](std::vector<EventSchema> s) { out.insert(out.end(), s.begin(), s.end()); };
  add(EventSchemasOf<LaunchEvent>());
  add(EventSchemasOf<RestartEvent>());
  add(EventSchemasOf<LaunchStopEvent>());
  add(EventSchemasOf<LaunchFinishedEvent>());
  add(EventSchemasOf<LaunchGaveUpEvent>());
  add(EventSchemasOf<AttemptEndEvent>());
  add(EventSchemasOf<LaunchHostsEvent>());
  add(EventSchemasOf<HostBlameEvent>());
  add(EventSchemasOf<HostExcludedEvent>());
  add(EventSchemasOf<HostReadmittedEvent>());
  return out;
}

}  // namespace keel
