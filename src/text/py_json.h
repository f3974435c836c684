// JSON text exactly as Python's json.dumps(x, ensure_ascii=False) writes it (what transformers'
// `tojson` chat-template filter produces): ", " and ": " separators, insertion key order, repr()
// floats, non-ASCII kept, control characters as lowercase \u00xx.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace zest::text {

// Python repr() of a double ("1.0", "1e-07", "1e+20", "inf" as "Infinity" like json.dumps).
std::string py_float_repr(double x);

// json.dumps(value, ensure_ascii=False).
std::string py_json_dumps(const nlohmann::ordered_json& value);

}  // namespace zest::text
