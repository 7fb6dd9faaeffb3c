// Status and Result<T>: how every internal function reports failure.
//
// Codes mirror ncclResult_t so the C API boundary converts without a table. A Status
// carries a message written by the function that first saw the error; callers add
// context with `withContext`, never a repeat of the message.
#pragma once

#include <cstdarg>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace loom {

enum class Code : int {
  kOk = 0,
  kCudaError = 1,      // ncclUnhandledCudaError
  kSystemError = 2,    // ncclSystemError: OS call failed, socket closed, timeout
  kInternalError = 3,  // ncclInternalError: a bug in loom
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,  // a peer failed or sent something wrong
  kInProgress = 7,
};

const char* codeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool isOk() const { return code_ == Code::kOk; }
  explicit operator bool() const { return isOk(); }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prefixes the message with what the caller was doing ("connecting to rank 3: ...").
  Status withContext(const std::string& context) const {
    if (isOk()) return *this;
    return Status(code_, context + ": " + message_);
  }
  // Explicitly ignores a status (cleanup paths where the first error already won).
  void ignore() const {}

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// printf-style constructors for errors.
Status errorf(Code code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
// A system error with strerror(errnum) appended.
Status sysError(int errnum, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT
  bool isOk() const { return status_.isOk(); }
  explicit operator bool() const { return isOk(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace loom

#define LOOM_CONCAT_INNER(a, b) a##b
#define LOOM_CONCAT(a, b) LOOM_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function when it is an error.
#define LOOM_TRY(expr)                                     \
  do {                                                     \
    ::loom::Status loom_try_status_ = (expr);              \
    if (!loom_try_status_.isOk()) return loom_try_status_; \
  } while (0)

// Declares `lhs` from a Result<T> expression, returning its Status on error.
#define LOOM_ASSIGN_OR_RETURN(lhs, expr) \
  LOOM_ASSIGN_OR_RETURN_IMPL(LOOM_CONCAT(loom_result_, __LINE__), lhs, expr)
#define LOOM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.isOk()) return tmp.status();            \
  lhs = std::move(tmp).value()
