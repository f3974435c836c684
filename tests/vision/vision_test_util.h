// Shared helpers for the vision tests: paths, reference loading and small encoders.
#pragma once
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zest::vision_test {

inline std::string source_path(const std::string& rel) { return std::string(ZEST_SOURCE_DIR) + "/" + rel; }
inline std::string data_path(const std::string& name) { return source_path("tests/vision/data/" + name); }

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// Plain RFC 4648 base64 encoder (with padding), used to build data: URLs.
inline std::string base64_encode(const std::vector<uint8_t>& in) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (in[i] << 16) | (in[i + 1] << 8) | in[i + 2];
    for (int s = 18; s >= 0; s -= 6) out.push_back(kAlphabet[(v >> s) & 63]);
  }
  if (i + 1 == in.size()) {
    const uint32_t v = in[i] << 16;
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    const uint32_t v = (in[i] << 16) | (in[i + 1] << 8);
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], '='};
  }
  return out;
}

}  // namespace zest::vision_test
