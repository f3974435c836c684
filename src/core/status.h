// Errors as values: Status carries a code and a user-facing message; Result<T> is a value or a Status.
#pragma once
#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace zest {

enum class ErrorCode {
  kOk = 0,
  kInvalidArgument,  // the caller's input is wrong (bad request, bad flag)
  kNotFound,         // a file, tensor or key is missing
  kCorrupt,          // a file is malformed or truncated
  kUnsupported,      // valid input that zest does not handle (architecture, dtype)
  kOutOfRange,       // a size or count past a limit (context, image size, body size)
  kResourceExhausted,// memory or KV blocks
  kInternal,
};

const char* error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }
  bool is_ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "<code>: <message>" for logs and CLI output.
  std::string to_string() const;
  // Prefixes the message with context ("loading model.safetensors: ...").
  Status with_context(const std::string& ctx) const {
    if (is_ok()) return *this;
    return Status(code_, ctx + ": " + message_);
  }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {ErrorCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {ErrorCode::kNotFound, std::move(m)}; }
inline Status corrupt(std::string m) { return {ErrorCode::kCorrupt, std::move(m)}; }
inline Status unsupported(std::string m) { return {ErrorCode::kUnsupported, std::move(m)}; }
inline Status out_of_range(std::string m) { return {ErrorCode::kOutOfRange, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {ErrorCode::kResourceExhausted, std::move(m)}; }
inline Status internal_error(std::string m) { return {ErrorCode::kInternal, std::move(m)}; }

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).is_ok()); }
  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace zest

#define ZEST_CONCAT_INNER(a, b) a##b
#define ZEST_CONCAT(a, b) ZEST_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` is an error.
#define ZEST_RETURN_IF_ERROR(expr)                 \
  do {                                             \
    ::zest::Status _zest_st = (expr);              \
    if (!_zest_st.is_ok()) return _zest_st;        \
  } while (0)

#define ZEST_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()

// `ZEST_ASSIGN_OR_RETURN(auto x, f());` binds the value or returns the error.
#define ZEST_ASSIGN_OR_RETURN(lhs, expr) \
  ZEST_ASSIGN_OR_RETURN_IMPL(ZEST_CONCAT(_zest_r_, __LINE__), lhs, expr)
