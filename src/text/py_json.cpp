#include "text/py_json.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace zest::text {
namespace {

void dump_string(const std::string& s, std::string& out) {
  out.push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
}

void dump(const nlohmann::ordered_json& v, std::string& out) {
  using T = nlohmann::ordered_json::value_t;
  switch (v.type()) {
    case T::null: out += "null"; break;
    case T::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case T::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case T::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case T::number_float: out += py_float_repr(v.get<double>()); break;
    case T::string: dump_string(v.get_ref<const std::string&>(), out); break;
    case T::array: {
      out.push_back('[');
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        dump(e, out);
      }
      out.push_back(']');
      break;
    }
    case T::object: {
      out.push_back('{');
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        dump_string(it.key(), out);
        out += ": ";
        dump(it.value(), out);
      }
      out.push_back('}');
      break;
    }
    case T::binary:
    case T::discarded:
      out += "null";
      break;
  }
}

}  // namespace

std::string py_float_repr(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  // Shortest round-trip digits, then Python's layout rules for repr().
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  size_t i = 0;
  if (sci[0] == '-') {
    out.push_back('-');
    i = 1;
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t k = i; k < e; ++k) {
    if (sci[k] != '.') digits.push_back(sci[k]);
  }
  const int exp10 = std::atoi(sci.c_str() + e + 1);
  const int n = static_cast<int>(digits.size());
  const int decpt = exp10 + 1;  // position of the decimal point relative to the digits
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (decpt < n) {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    } else {
      out += digits + std::string(static_cast<size_t>(decpt - n), '0') + ".0";
    }
  } else {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += ebuf;
  }
  return out;
}

std::string py_json_dumps(const nlohmann::ordered_json& value) {
  std::string out;
  dump(value, out);
  return out;
}

}  // namespace zest::text
