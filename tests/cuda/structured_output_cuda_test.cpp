// Structured output on the CUDA decoder: the tiny qwen3_moe fixture on the CUDA backend, 16 requests sampled at
// temperature 1 (half pure temperature, half top-k / top-p) with a json_schema whose strings, arrays and numbers are
// bounded: every reply ends by EOS (finish "stop"), parses, has the required keys with their types, and no other keys.
// The masks reach the device with the step's sampling inputs (apply_token_masks); the picks are the device's.
#if defined(ZEST_HAVE_CUDA)
#include <gtest/gtest.h>

#include <set>

#include "engine/chat_request.h"
#include "engine/engine.h"
#include "engine/model_bundle.h"
#include "kernels/backend.h"

namespace zest::engine {
namespace {

using nlohmann::json;

TEST(CudaStructuredOutput, SampledRepliesFollowTheSchema) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
  auto m = ModelBundle::load(std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_moe_tiny", model::Backend::kCuda);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const json schema = json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}, "ok": {"type": "boolean"},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["name", "n", "ok"], "additionalProperties": false})");
  Engine engine(*m, {});
  constexpr int kRequests = 16;
  std::vector<RequestOutput> outs(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    json body = {{"messages", {{{"role", "user"}, {"content", "JSON please"}}}},
                 {"chat_template_kwargs", {{"enable_thinking", false}}},
                 {"response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", schema}}}}},
                 {"temperature", 1.0}, {"seed", 300 + i}, {"max_tokens", 400}};
    if (i % 2) body.update({{"top_k", 0}, {"top_p", 1.0}});
    auto cr = parse_chat_request(body, **m);
    ASSERT_TRUE(cr.ok()) << cr.status().to_string();
    auto p = build_prompt(**m, *cr, {});
    ASSERT_TRUE(p.ok());
    Request req;
    req.id = i;
    req.prompt = *p;
    req.sampling = cr->sampling;
    ASSERT_TRUE(req.sampling.grammar);
    req.on_update = [&outs, i](const std::string&, const RequestOutput& out, bool finished) {
      if (finished) outs[i] = out;
    };
    ASSERT_TRUE(engine.add(std::move(req)).is_ok());
  }
  while (engine.has_work()) ASSERT_TRUE(engine.step().is_ok());
  std::set<std::string> distinct;
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE("request " + std::to_string(i) + ": " + outs[i].text);
    ASSERT_EQ(outs[i].finish, FinishReason::kStop) << outs[i].error;
    const json v = json::parse(outs[i].text, nullptr, false);
    ASSERT_TRUE(v.is_object());
    EXPECT_TRUE(v["name"].is_string() && v["name"].get<std::string>().size() <= 8 * 4);
    EXPECT_TRUE(v["n"].is_number_integer());
    EXPECT_TRUE(v["ok"].is_boolean());
    for (const auto& [k, x] : v.items()) {
      EXPECT_TRUE(k == "name" || k == "n" || k == "ok" || k == "tags") << k;
      if (k == "tags") {
        ASSERT_TRUE(x.is_array());
        EXPECT_LE(x.size(), 2u);
        for (const json& t : x) EXPECT_TRUE(t == "a" || t == "b");
      }
    }
    distinct.insert(outs[i].text);
  }
  EXPECT_GT(distinct.size(), 12u);
}

}  // namespace
}  // namespace zest::engine
#endif  // ZEST_HAVE_CUDA
