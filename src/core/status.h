// Status: the error value returned at every module boundary (LevelDB style). An error carries a
// message meant for the user: what was wrong, the offending value, and how to fix it.
#pragma once

#include <string>
#include <utility>

namespace keel {

class Status {
 public:
  // Sent between ranks as one byte (comm/communicator.h): new codes go at the end.
  enum class Code {
    kOk = 0,
    kInvalidArgument,
    kNotFound,
    kIOError,
    kCorruption,
    kInternal,
    kOutOfMemory,  // an allocation failed: the message says what was being built and what to cut
  };

  Status() = default;
  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return Status(Code::kInvalidArgument, std::move(msg));
  }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status IOError(std::string msg) { return Status(Code::kIOError, std::move(msg)); }
  static Status Corruption(std::string msg) { return Status(Code::kCorruption, std::move(msg)); }
  static Status Internal(std::string msg) { return Status(Code::kInternal, std::move(msg)); }
  static Status OutOfMemory(std::string msg) { return Status(Code::kOutOfMemory, std::move(msg)); }
  // A status of `code` (sent between ranks as a code and a message).
  static Status FromCode(Code code, std::string msg) { return Status(code, std::move(msg)); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return msg_; }
  // "invalid argument: <message>", or "OK".
  std::string ToString() const;

 private:
  Status(Code code, std::string msg) : code_(code), msg_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string msg_;
};

// Propagates a non-OK Status to the caller.
#define KEEL_RETURN_IF_ERROR(expr)       \
  do {                                   \
    ::keel::Status _keel_st = (expr);    \
    if (!_keel_st.ok()) return _keel_st; \
  } while (0)

// Thrown only where a Status cannot travel (constructors, deep inside the math); the CLI catches it
// and prints the message. Library code at boundaries converts it back into a Status.
class KeelError : public std::exception {
 public:
  explicit KeelError(Status st) : st_(std::move(st)), what_(st_.ToString()) {}
  const Status& status() const { return st_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  Status st_;
  std::string what_;
};

// Throws KeelError(Internal) when an invariant the code relies on is broken (a bug, not bad input).
#define KEEL_CHECK(cond, msg)                                                                     \
  do {                                                                                            \
    if (!(cond))                                                                                  \
      throw ::keel::KeelError(::keel::Status::Internal(std::string(__FILE__) + ":" +              \
                                                       std::to_string(__LINE__) + ": " + (msg))); \
  } while (0)

}  // namespace keel
