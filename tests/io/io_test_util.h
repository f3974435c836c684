// Helpers shared by the io tests: a per-test temporary directory and raw file writers.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/status.h"

namespace zest::io::testing {

inline std::string data_dir() { return std::string(ZEST_SOURCE_DIR) + "/tests/io/data"; }

// A fresh directory under the system temp dir, removed with its contents when the test ends.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    dir_ = std::filesystem::temp_directory_path() /
           ("zest_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::filesystem::path dir_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Little-endian 8-byte length + header text + data, as the safetensors format lays them out.
inline std::string safetensors_bytes(const std::string& header, const std::string& data, uint64_t header_len) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header_len >> (8 * i)) & 0xff);
  return out + header + data;
}
inline std::string safetensors_bytes(const std::string& header, const std::string& data) {
  return safetensors_bytes(header, data, header.size());
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Asserts that `s` failed with `code` and that its message mentions every one of `words`.
inline void expect_error(const Status& s, ErrorCode code, const std::vector<std::string>& words) {
  ASSERT_FALSE(s.is_ok()) << "expected an error mentioning " << (words.empty() ? "" : words[0]);
  EXPECT_EQ(s.code(), code) << s.to_string();
  for (const std::string& w : words) {
    EXPECT_NE(s.message().find(w), std::string::npos) << "message lacks '" << w << "': " << s.message();
  }
}

}  // namespace zest::io::testing
