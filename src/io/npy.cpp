#include "io/npy.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>

namespace zest::io {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

Status file_error(const std::string& what, const std::string& path, int err) {
  std::string msg = what + " " + path + ": " + std::strerror(err);
  if (err == ENOENT) return not_found(msg);
  return internal_error(msg);
}

// One value of the header dictionary: a string, a boolean or a tuple of integers.
struct HeaderValue {
  enum Kind { kString, kBool, kTuple } kind = kString;
  std::string str;
  bool boolean = false;
  std::vector<int64_t> ints;
};

// Parses the Python dict literal of an .npy header, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }.
class HeaderParser {
 public:
  explicit HeaderParser(const std::string& s) : s_(s) {}

  Status parse(std::map<std::string, HeaderValue>* out) {
    skip_ws();
    if (!eat('{')) return error("expected '{'");
    skip_ws();
    while (!eat('}')) {
      std::string key;
      ZEST_RETURN_IF_ERROR(parse_string(&key));
      skip_ws();
      if (!eat(':')) return error("expected ':' after key '" + key + "'");
      skip_ws();
      HeaderValue v;
      ZEST_RETURN_IF_ERROR(parse_value(&v));
      if (!out->emplace(key, std::move(v)).second) return error("key '" + key + "' appears twice");
      skip_ws();
      if (eat(',')) {
        skip_ws();
      } else if (peek() != '}') {
        return error("expected ',' or '}'");
      }
    }
    skip_ws();
    if (pos_ != s_.size()) return error("unexpected text after the dictionary");
    return Status::ok();
  }

 private:
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  bool eat(char c) {
    if (pos_ >= s_.size() || s_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' || s_[pos_] == '\r')) ++pos_;
  }
  Status error(const std::string& what) const {
    return corrupt("malformed .npy header at byte " + std::to_string(pos_) + ": " + what + " in " + s_);
  }
  Status parse_string(std::string* out) {
    const char q = peek();
    if (q != '\'' && q != '"') return error("expected a quoted string");
    ++pos_;
    const size_t end = s_.find(q, pos_);
    if (end == std::string::npos) return error("unterminated string");
    *out = s_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return Status::ok();
  }
  Status parse_int(int64_t* out) {
    const size_t start = pos_;
    int64_t v = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, s_[pos_] - '0', &v)) {
        return error("dimension too large");
      }
      ++pos_;
    }
    if (pos_ == start) return error("expected a non-negative integer");
    eat('L');
    *out = v;
    return Status::ok();
  }
  Status parse_value(HeaderValue* v) {
    const char c = peek();
    if (c == '\'' || c == '"') {
      v->kind = HeaderValue::kString;
      return parse_string(&v->str);
    }
    if (s_.compare(pos_, 4, "True") == 0 || s_.compare(pos_, 5, "False") == 0) {
      v->kind = HeaderValue::kBool;
      v->boolean = s_[pos_] == 'T';
      pos_ += v->boolean ? 4 : 5;
      return Status::ok();
    }
    if (c == '(' || c == '[') {
      const char close = c == '(' ? ')' : ']';
      ++pos_;
      v->kind = HeaderValue::kTuple;
      skip_ws();
      while (!eat(close)) {
        int64_t d = 0;
        ZEST_RETURN_IF_ERROR(parse_int(&d));
        v->ints.push_back(d);
        skip_ws();
        if (eat(',')) {
          skip_ws();
        } else if (peek() != close) {
          return error(std::string("expected ',' or '") + close + "' in shape");
        }
      }
      return Status::ok();
    }
    return error("expected a string, True/False or a tuple");
  }

  const std::string& s_;
  size_t pos_ = 0;
};

std::string shape_tuple(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

}  // namespace

Status write_npy(const std::string& file, const Tensor& t) {
  const char* descr = nullptr;
  switch (t.dtype()) {
    case DType::F32: descr = "<f4"; break;
    case DType::I32: descr = "<i4"; break;
    case DType::I64: descr = "<i8"; break;
    default:
      return invalid_argument(std::string("write_npy: dtype ") + dtype_name(t.dtype()) +
                              " is not written; convert to F32, I32 or I64 first");
  }
  if (t.device() != Device::CPU) return invalid_argument("write_npy: the tensor must be on the CPU");
  if (t.raw() == nullptr && t.numel() != 0) return invalid_argument("write_npy: the tensor has no storage");
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " +
                       shape_tuple(t.shape()) + ", }";
  // Pad with spaces so that magic + version + length + header + '\n' is a multiple of 64 bytes.
  const size_t preamble = kMagicLen + 2 + 2;
  header.append((64 - (preamble + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  if (header.size() > 0xffff) return invalid_argument("write_npy: shape too long for a version 1.0 header");

  std::FILE* f = std::fopen(file.c_str(), "wb");
  if (f == nullptr) return file_error("cannot create", file, errno);
  const uint8_t pre[4] = {1, 0, static_cast<uint8_t>(header.size() & 0xff), static_cast<uint8_t>(header.size() >> 8)};
  bool ok = std::fwrite(kMagic, 1, kMagicLen, f) == kMagicLen && std::fwrite(pre, 1, 4, f) == 4 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size();
  if (ok && t.nbytes() > 0) ok = std::fwrite(t.raw(), 1, t.nbytes(), f) == t.nbytes();
  const int err = errno;
  if (std::fclose(f) != 0) ok = false;
  if (!ok) return file_error("cannot write", file, err);
  return Status::ok();
}

Result<Tensor> read_npy(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return file_error("cannot open", file, errno);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return file_error("cannot read", file, errno);
  const auto bad = [&](const std::string& what) { return corrupt(file + ": " + what); };

  if (bytes.size() < kMagicLen + 4 || bytes.compare(0, kMagicLen, kMagic, kMagicLen) != 0) {
    return bad("not an .npy file (missing the \\x93NUMPY magic)");
  }
  const auto* u = reinterpret_cast<const uint8_t*>(bytes.data());
  const int major = u[6];
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = u[8] | (static_cast<size_t>(u[9]) << 8);
    header_start = 10;
  } else if (major == 2) {
    if (bytes.size() < 12) return bad("file ends inside the version 2.0 preamble");
    header_len = u[8] | (static_cast<size_t>(u[9]) << 8) | (static_cast<size_t>(u[10]) << 16) |
                 (static_cast<size_t>(u[11]) << 24);
    header_start = 12;
  } else {
    return bad("unknown .npy format version " + std::to_string(major) + "." + std::to_string(u[7]) +
               " (zest reads 1.0 and 2.0)");
  }
  if (header_len > bytes.size() - header_start) {
    return bad("header length " + std::to_string(header_len) + " runs past the end of the file");
  }
  const std::string header = bytes.substr(header_start, header_len);
  std::map<std::string, HeaderValue> dict;
  ZEST_RETURN_IF_ERROR(HeaderParser(header).parse(&dict).with_context(file));
  for (const char* key : {"descr", "fortran_order", "shape"}) {
    if (dict.count(key) == 0) return bad(std::string("header has no '") + key + "' key");
  }
  if (dict.size() != 3) return bad("header has keys other than descr, fortran_order and shape: " + header);
  const HeaderValue& descr = dict["descr"];
  const HeaderValue& order = dict["fortran_order"];
  const HeaderValue& shape = dict["shape"];
  if (descr.kind != HeaderValue::kString) return bad("'descr' is not a string");
  if (order.kind != HeaderValue::kBool) return bad("'fortran_order' is not True/False");
  if (shape.kind != HeaderValue::kTuple) return bad("'shape' is not a tuple");
  if (order.boolean) return unsupported(file + ": Fortran-order arrays are not read; save with C order");

  DType file_dtype;
  if (descr.str == "<f4") {
    file_dtype = DType::F32;
  } else if (descr.str == "<f2") {
    file_dtype = DType::F16;
  } else if (descr.str == "<i4") {
    file_dtype = DType::I32;
  } else if (descr.str == "<i8") {
    file_dtype = DType::I64;
  } else {
    return unsupported(file + ": dtype '" + descr.str + "' is not read (zest reads <f4, <f2, <i4, <i8)");
  }
  uint64_t numel = 1;
  for (int64_t d : shape.ints) {
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) return bad("shape overflows");
  }
  uint64_t need = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(file_dtype)), &need)) {
    return bad("shape overflows");
  }
  const uint64_t have = bytes.size() - header_start - header_len;
  if (have != need) {
    return bad("data holds " + std::to_string(have) + " bytes but shape " + shape_tuple(shape.ints) + " of " +
               descr.str + " needs " + std::to_string(need) + (have < need ? " (truncated file)" : ""));
  }
  const char* data = bytes.data() + header_start + header_len;
  if (file_dtype == DType::F16) {
    Tensor t = Tensor::empty(shape.ints, DType::F32);
    float* dst = t.data<float>();
    for (uint64_t i = 0; i < numel; ++i) {
      uint16_t h;
      std::memcpy(&h, data + 2 * i, 2);
      dst[i] = f16_to_f32(h);
    }
    return t;
  }
  Tensor t = Tensor::empty(shape.ints, file_dtype);
  if (need > 0) std::memcpy(t.raw(), data, need);
  return t;
}

}  // namespace zest::io
