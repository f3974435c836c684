// Golden tests: the CPU decoder against transformers on the tiny fixture checkpoints
// (tests/fixtures, made by tools/make_fixtures.py). Tolerances: prompt ids and M-RoPE positions equal;
// last-position logits max|zest - ref| <= 1e-3 * max|ref|; 16 greedy tokens equal up to the first step
// whose reference top-2 margin is below 1e-3.
#include "golden_util.h"

using namespace zest;
using namespace zest::testing;

namespace {

class Golden : public ::testing::TestWithParam<std::string> {};

TEST_P(Golden, MatchesTransformers) {
  const std::string name = GetParam();
  auto model = fixture_model(name);
  ASSERT_TRUE(model);
  const std::filesystem::path dir = std::filesystem::path(ZEST_FIXTURES_DIR) / "ref" / name;
  const auto cases = json_cases(dir);
  ASSERT_FALSE(cases.empty());
  for (const auto& [case_name, ref] : cases) {
    SCOPED_TRACE(name + "/" + case_name);
    auto req = engine::parse_chat_request(ref["request"], *model);
    ASSERT_TRUE(req.ok()) << req.status().to_string();
    auto prompt = engine::build_prompt(*model, *req, fixture_prompt_options());
    ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
    expect_prompt(*prompt, ref);
    expect_logits_close(last_logits(*model, *prompt), (dir / ref["logits_file"].get<std::string>()).string(), 1e-3f);
    expect_greedy(model, *prompt, ref["greedy_tokens"].get<std::vector<int32_t>>(),
                  ref["greedy_margins"].get<std::vector<double>>());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Golden,
                         ::testing::Values("qwen3_moe_tiny", "qwen3_vl_moe_tiny", "qwen3_vl_tiny", "qwen3_tiny"));

}  // namespace
