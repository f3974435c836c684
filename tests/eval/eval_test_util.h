// The eval tests' shared fixtures: the tiny Qwen3-VL-MoE (random weights: answers are noise, the mechanism is
// real), loaded once per process, and tests/fixtures/eval/items.jsonl.
#pragma once
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "engine/model_bundle.h"
#include "eval/dataset.h"

namespace zest::eval {

inline const std::string kVlTinyDir = std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_vl_moe_tiny";

inline std::shared_ptr<engine::ModelBundle> vl_tiny() {
  static std::shared_ptr<engine::ModelBundle> m = [] {
    auto r = engine::ModelBundle::load(kVlTinyDir);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    return r.ok() ? *r : nullptr;
  }();
  return m;
}

inline EvalData fixture_data() {
  auto d = load_eval_data(std::string(ZEST_FIXTURES_DIR) + "/eval/items.jsonl");
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  return *d;
}

}  // namespace zest::eval
