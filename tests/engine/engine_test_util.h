// Helpers shared by the engine tests: the tiny qwen3_moe fixture and one-message prompts.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>

#include "engine/chat_request.h"
#include "engine/model_bundle.h"
#include "engine/sere.h"

namespace zest::testing {

// The tiny qwen3_moe fixture, loaded once per process.
inline std::shared_ptr<engine::ModelBundle> tiny() {
  static std::shared_ptr<engine::ModelBundle> m = [] {
    auto r = engine::ModelBundle::load(std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_moe_tiny");
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? *r : nullptr;
  }();
  return m;
}

// The decoder prompt of one user message.
inline engine::Prompt text_prompt(const engine::ModelBundle& m, const std::string& text) {
  nlohmann::json body = {{"messages", {{{"role", "user"}, {"content", text}}}}};
  auto req = engine::parse_chat_request(body, m);
  EXPECT_TRUE(req.ok());
  auto p = engine::build_prompt(m, *req, {});
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  return *p;
}

// A SERE similarity file of the tiny fixture calibrated on 256 tokens of the bundled corpus, made once per
// process, under a name of its own (ctest runs the tests of one binary in parallel processes).
inline std::string tiny_similarity_file() {
  static std::string file = [] {
    engine::CalibrationOptions co;
    for (const auto& e : std::filesystem::directory_iterator(std::string(ZEST_SOURCE_DIR) + "/assets/calibration"))
      if (e.path().extension() == ".txt") co.text_files.push_back(e.path().string());
    std::sort(co.text_files.begin(), co.text_files.end());
    co.max_tokens = 256;
    co.progress = false;
    co.out_file = ::testing::TempDir() + "/sere_engine_test-" + std::to_string(::getpid()) + ".safetensors";
    auto r = engine::calibrate_sere(*tiny(), co);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return co.out_file;
  }();
  return file;
}

}  // namespace zest::testing
