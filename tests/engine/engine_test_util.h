// Helpers shared by the engine tests: the tiny qwen3_moe fixture and one-message prompts.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "engine/chat_request.h"
#include "engine/model_bundle.h"

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

}  // namespace zest::testing
