// VisionZip end to end against the transformers reference (tools/make_accel_fixtures.py): scores from
// the C++ vision tower, uniform selection, gathered embeddings / deepstack / M-RoPE positions, pruned
// prompt, logits and greedy tokens. Tolerances as the golden tests (1e-3 relative logits).
#include "engine/vision_encode.h"
#include "golden_util.h"
#include "io/image.h"

using namespace zest;
using namespace zest::testing;

namespace {

const std::filesystem::path kDir = std::filesystem::path(ZEST_FIXTURES_DIR) / "ref" / "visionzip";

nlohmann::json with_prune(const nlohmann::json& ref) {
  nlohmann::json body = ref["request"];
  body["vision_prune"] = {{"rate", ref["rate"].get<double>()},
                          {"mode", ref["mode"].get<std::string>()},
                          {"min_tokens", ref["min_tokens"].get<int64_t>()},
                          {"score_layer", ref["score_layer_from_end"].get<int64_t>()}};
  return body;
}

TEST(VisionZipGolden, MatchesTransformersReference) {
  const auto cases = json_cases(kDir);
  ASSERT_FALSE(cases.empty());
  for (const auto& [name, ref] : cases) {
    SCOPED_TRACE(name);
    auto model = fixture_model(ref["model"].get<std::string>());
    ASSERT_TRUE(model);
    auto req = engine::parse_chat_request(with_prune(ref), *model);
    ASSERT_TRUE(req.ok()) << req.status().to_string();

    // The selection itself: the kept indices per image equal the reference's.
    std::vector<io::Image> images;
    for (const auto& m : req->messages)
      if (m["content"].is_array())
        for (const auto& part : m["content"])
          if (part.value("type", "") == "image_url") {
            const std::string url = part["image_url"]["url"].get<std::string>();
            auto img = io::load_image(std::string(ZEST_SOURCE_DIR) + "/" + url.substr(std::string("file://").size()));
            ASSERT_TRUE(img.ok()) << img.status().to_string();
            images.push_back(*img);
          }
    auto enc = engine::encode_images(*model, images, req->pixels, req->vision_prune);
    ASSERT_TRUE(enc.ok()) << enc.status().to_string();
    EXPECT_EQ(enc->kept, ref["kept"].get<std::vector<std::vector<int64_t>>>());

    auto prompt = engine::build_prompt(*model, *req, fixture_prompt_options());
    ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
    expect_prompt(*prompt, ref);
    expect_logits_close(last_logits(*model, *prompt), (kDir / ref["logits_file"].get<std::string>()).string(), 1e-3f);
    expect_greedy(model, *prompt, ref["greedy_tokens"].get<std::vector<int32_t>>(),
                  ref["greedy_margins"].get<std::vector<double>>());
  }
}

// Rate 0 is "off": the prompt and the logits are bit-identical to a request without pruning.
TEST(VisionZipGolden, RateZeroIsExactlyUnpruned) {
  auto model = fixture_model("qwen3_vl_moe_tiny");
  ASSERT_TRUE(model);
  const auto cases = json_cases(kDir);
  ASSERT_FALSE(cases.empty());
  nlohmann::json body = cases.front().second["request"];
  auto plain = engine::parse_chat_request(body, *model);
  body["vision_prune"] = {{"rate", 0.0}, {"mode", "global"}};
  auto zero = engine::parse_chat_request(body, *model);
  ASSERT_TRUE(plain.ok() && zero.ok());
  auto p0 = engine::build_prompt(*model, *plain, fixture_prompt_options());
  auto p1 = engine::build_prompt(*model, *zero, fixture_prompt_options());
  ASSERT_TRUE(p0.ok() && p1.ok());
  EXPECT_EQ(p0->ids, p1->ids);
  EXPECT_EQ(p0->positions, p1->positions);
  const Tensor a = last_logits(*model, *p0), b = last_logits(*model, *p1);
  ASSERT_EQ(a.numel(), b.numel());
  EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), a.nbytes()));
}

// Global mode keeps exactly the budget over the request's images and never less than the floors.
TEST(VisionZipGolden, GlobalModeKeepsExactBudget) {
  auto model = fixture_model("qwen3_vl_moe_tiny");
  ASSERT_TRUE(model);
  for (const auto& [name, ref] : json_cases(kDir)) {
    if (ref["tokens_per_image"].size() < 2) continue;
    SCOPED_TRACE(name);
    nlohmann::json body = ref["request"];
    for (int64_t budget : {40, 100, 150}) {
      body["vision_prune"] = {{"mode", "global"}, {"budget", budget}, {"min_tokens", 16}};
      auto req = engine::parse_chat_request(body, *model);
      ASSERT_TRUE(req.ok());
      auto p = engine::build_prompt(*model, *req, fixture_prompt_options());
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      int64_t kept = 0;
      for (size_t i = 0; i < p->visual_tokens_after.size(); ++i) {
        kept += p->visual_tokens_after[i];
        EXPECT_GE(p->visual_tokens_after[i], std::min<int64_t>(16, p->visual_tokens_before[i]));
      }
      EXPECT_EQ(kept, budget);
    }
  }
}

}  // namespace
