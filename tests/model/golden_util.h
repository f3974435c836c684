// Helpers shared by the golden tests: fixture models, last-position logits, greedy decoding.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "engine/chat_request.h"
#include "engine/engine.h"
#include "io/npy.h"

namespace zest::testing {

// A fixture model under tests/fixtures/models, loaded once per process.
inline std::shared_ptr<engine::ModelBundle> fixture_model(const std::string& name) {
  static std::map<std::string, std::shared_ptr<engine::ModelBundle>> cache;
  auto& m = cache[name];
  if (!m) {
    auto r = engine::ModelBundle::load(std::string(ZEST_FIXTURES_DIR) + "/models/" + name);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) m = *r;
  }
  return m;
}

// Every <dir>/*.json, parsed, sorted by file name.
inline std::vector<std::pair<std::string, nlohmann::json>> json_cases(const std::filesystem::path& dir) {
  std::vector<std::pair<std::string, nlohmann::json>> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream f(e.path());
    out.emplace_back(e.path().stem().string(), nlohmann::json::parse(f));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

// Image paths in fixture requests are relative to the repository root.
inline engine::PromptOptions fixture_prompt_options() {
  engine::PromptOptions po;
  po.base_dir = ZEST_SOURCE_DIR;
  return po;
}

// Logits [vocab] of the prompt's last position on `dec` (any backend), one prefill on a fresh cache.
inline Tensor last_logits(const model::TextDecoder& dec, const engine::Prompt& p) {
  const int64_t n = static_cast<int64_t>(p.ids.size());
  auto cache = dec.allocate_cache((n + 15) / 16 + 1, 16);
  EXPECT_TRUE(cache.ok()) << cache.status().to_string();
  if (!cache.ok()) return Tensor();
  std::vector<int32_t> table;
  EXPECT_TRUE(cache->reserve(table, n).is_ok());
  model::ForwardBatch b;
  b.tokens = p.ids;
  b.positions = p.positions;
  b.seqs.push_back({&table, 0, n, false, true});
  b.mm_embeds = p.mm_embeds;
  b.mm_index = p.mm_index;
  b.deepstack = p.deepstack;
  auto logits = dec.forward(b, *cache);
  EXPECT_TRUE(logits.ok()) << logits.status().to_string();
  return logits.ok() ? *logits : Tensor();
}

// The same on the model's own decoder.
inline Tensor last_logits(const engine::ModelBundle& model, const engine::Prompt& p) {
  return last_logits(model.decoder(), p);
}

// One prefill of the prompt on `dec` (any backend; visual rows from the host or, for device prompts, from device
// memory), then `steps` greedy decode steps: the tokens, every step's top-2 margin and (when `first` is given) the
// first step's logits.
inline void greedy_steps(const model::TextDecoder& dec, const engine::Prompt& p, int steps,
                         std::vector<int32_t>& tokens, std::vector<double>& margins, Tensor* first = nullptr) {
  const int64_t n = static_cast<int64_t>(p.ids.size());
  auto cache = dec.allocate_cache((n + steps + 15) / 16 + 1, 16);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  std::vector<int32_t> table;
  ASSERT_TRUE(cache->reserve(table, n + steps).is_ok());
  model::ForwardBatch b;
  b.tokens = p.ids;
  b.positions = p.positions;
  b.seqs.push_back({&table, 0, n, false, true});
  b.mm_index = p.mm_index;
  if (p.mm_embeds.numel() > 0 && p.mm_embeds.device() != Device::CPU) {
    model::ForwardBatch::DeviceRows rows;
    rows.embeds = p.mm_embeds.raw();
    for (const Tensor& d : p.deepstack) rows.deepstack.push_back(d.raw());
    rows.rows = p.mm_embeds.dim(0);
    b.mm_device.push_back(rows);
  } else {
    b.mm_embeds = p.mm_embeds;
    b.deepstack = p.deepstack;
  }
  for (int s = 0; s < steps; ++s) {
    auto logits = dec.forward(b, *cache);
    ASSERT_TRUE(logits.ok()) << logits.status().to_string();
    if (s == 0 && first) *first = *logits;
    const float* l = logits->data<float>();
    const int64_t V = logits->dim(1);
    int64_t best = 0;
    for (int64_t i = 1; i < V; ++i)
      if (l[i] > l[best]) best = i;
    float second = -INFINITY;
    for (int64_t i = 0; i < V; ++i)
      if (i != best) second = std::max(second, l[i]);
    tokens.push_back(static_cast<int32_t>(best));
    margins.push_back(static_cast<double>(l[best]) - second);
    const int32_t pos = static_cast<int32_t>(n + s + p.rope_delta);
    model::ForwardBatch d;
    d.tokens = {static_cast<int32_t>(best)};
    d.positions = {pos, pos, pos};
    d.seqs.push_back({&table, n + s, 1, false, true});
    b = std::move(d);
  }
}

// Checks max|logits - ref| <= rel * max|ref| for the reference .npy file.
inline void expect_logits_close(const Tensor& logits, const std::string& npy, float rel) {
  auto ref = io::read_npy(npy);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  ASSERT_EQ(ref->numel(), logits.numel());
  float max_ref = 0, max_diff = 0;
  for (int64_t i = 0; i < ref->numel(); ++i) {
    max_ref = std::max(max_ref, std::fabs(ref->data<float>()[i]));
    max_diff = std::max(max_diff, std::fabs(ref->data<float>()[i] - logits.data<float>()[i]));
  }
  EXPECT_LE(max_diff, rel * max_ref) << "max diff " << max_diff << " max ref " << max_ref;
}

// Greedy tokens through the engine, compared to the reference up to the first step whose reference
// top-2 margin is below 1e-3 (where f32 summation order may legitimately flip the choice).
inline void expect_greedy(std::shared_ptr<engine::ModelBundle> model, const engine::Prompt& p,
                          const std::vector<int32_t>& ref_tokens, const std::vector<double>& margins) {
  engine::Request r;
  r.prompt = p;
  r.sampling.temperature = 0;
  r.sampling.max_tokens = static_cast<int64_t>(ref_tokens.size());
  r.sampling.ignore_eos = true;
  auto out = engine::generate_one(model, r);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(out->token_ids.size(), ref_tokens.size());
  for (size_t i = 0; i < ref_tokens.size(); ++i) {
    EXPECT_EQ(out->token_ids[i], ref_tokens[i]) << "greedy step " << i;
    if (margins[i] < 1e-3) break;
  }
}

// Checks prompt ids, the [3, T] M-RoPE positions and the rope delta against a reference case.
inline void expect_prompt(const engine::Prompt& p, const nlohmann::json& ref) {
  ASSERT_EQ(p.ids, ref["prompt_ids"].get<std::vector<int32_t>>());
  if (!ref.contains("position_ids")) return;
  const auto pos = ref["position_ids"].get<std::vector<std::vector<int32_t>>>();
  const size_t n = p.ids.size();
  for (int a = 0; a < 3; ++a)
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(p.positions[a * n + i], pos[a][i]) << "axis " << a << " token " << i;
  EXPECT_EQ(p.rope_delta, ref["rope_delta"].get<int64_t>());
}

}  // namespace zest::testing
