#include "core/status.h"

namespace keel {

std::string Status::ToString() const {
  switch (code_) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidArgument:
      return "invalid argument: " + msg_;
    case Code::kNotFound:
      return "not found: " + msg_;
    case Code::kIOError:
      return "I/O error: " + msg_;
    case Code::kCorruption:
      return "corruption: " + msg_;
    case Code::kInternal:
      return "internal error: " + msg_;
    case Code::kOutOfMemory:
      return "out of memory: " + msg_;
  }
  return msg_;
}

}  // namespace keel
