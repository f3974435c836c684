// zest calibrate-visionzip's choice of VisionZip's score block (eval/score_layer.h) and the model folder's
// visionzip.json (engine::load_score_layer, ModelBundle::load), on the tiny Qwen3-VL-MoE fixture.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "engine/model_bundle.h"
#include "eval/eval_test_util.h"
#include "eval/runner.h"
#include "eval/score_layer.h"

namespace zest::eval {
namespace {

namespace fs = std::filesystem;

std::string write_text(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

// Every block's accuracy equals a plain run_eval with that block and rate set on the model, the choice is the
// best of them by the stated rule, and the model's own VisionZip defaults are left as they were.
TEST(ScoreLayer, EachBlockIsARunOfItsOwnAndTheBestIsChosen) {
  auto model = vl_tiny();
  ASSERT_TRUE(model);
  const EvalData data = fixture_data();
  ScoreLayerOptions o;
  o.rate = 0.5;
  o.run.batch = 4;
  o.run.max_tokens = 4;
  o.run.progress = false;
  const accel::VisionPruneOptions before = model->vision_prune;
  auto c = choose_score_layer(model, data, {}, o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(model->vision_prune.score_layer, before.score_layer);
  EXPECT_EQ(model->vision_prune.rate, 0.0f);
  const int64_t depth = model->config.vision->depth;
  ASSERT_EQ(static_cast<int64_t>(c->blocks.size()), depth);
  EXPECT_EQ(c->depth, depth);
  EXPECT_EQ(c->items, static_cast<int64_t>(data.items.size()));
  for (int64_t i = 0; i < depth; ++i) {
    const BlockScore& b = c->blocks[i];
    EXPECT_EQ(b.score_layer, -1 - i);
    model->vision_prune.rate = 0.5f;
    model->vision_prune.mode = accel::VisionPruneOptions::Mode::kGlobal;
    model->vision_prune.score_layer = b.score_layer;
    auto r = run_eval(model, data, {}, o.run);
    model->vision_prune = before;
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    double exact = 0, anls = 0;
    for (const ItemResult& it : r->items) exact += it.exact, anls += it.anls;
    EXPECT_DOUBLE_EQ(b.exact, exact / r->items.size()) << "block " << b.score_layer;
    EXPECT_DOUBLE_EQ(b.anls, anls / r->items.size()) << "block " << b.score_layer;
  }
  int64_t best = 0;  // highest exact, then ANLS, the later block on ties
  for (int64_t i = 1; i < depth; ++i) {
    const BlockScore &b = c->blocks[i], &w = c->blocks[best];
    if (b.exact > w.exact || (b.exact == w.exact && b.anls > w.anls)) best = i;
  }
  EXPECT_EQ(c->score_layer, c->blocks[best].score_layer);

  // Written and read back as the model's default.
  const std::string file = ::testing::TempDir() + "/visionzip_roundtrip.json";
  ASSERT_TRUE(write_score_layer(file, *c).is_ok());
  auto back = engine::load_score_layer(file, depth);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_TRUE(back->has_value());
  EXPECT_EQ(**back, c->score_layer);
}

TEST(ScoreLayer, RefusesDataWithoutImagesAndBadRates) {
  auto model = vl_tiny();
  ASSERT_TRUE(model);
  const std::string text_only = write_text(
      "score_layer_text.jsonl", R"({"messages": [{"role": "user", "content": "Say hi."}], "answer": "hi"})" "\n");
  auto data = load_eval_data(text_only);
  ASSERT_TRUE(data.ok()) << data.status().to_string();
  ScoreLayerOptions o;
  o.run.progress = false;
  o.run.max_tokens = 2;
  auto c = choose_score_layer(model, *data, {}, o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("needs images"), std::string::npos) << c.status().message();
  for (double rate : {0.0, 1.0, -0.5}) {
    o.rate = rate;
    EXPECT_FALSE(choose_score_layer(model, fixture_data(), {}, o).ok()) << rate;
  }
}

TEST(ScoreLayer, VisionzipJsonIsCheckedAndBecomesTheModelsDefault) {
  auto missing = engine::load_score_layer(::testing::TempDir() + "/no_such_visionzip.json", 4);
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->has_value());
  const std::pair<std::string, std::string> bad[] = {
      {"{not json", "is not a JSON object"},
      {R"({"score_layer": -1})", "format must be"},
      {R"({"format": "zest-visionzip/1", "score_layer": "last"})", "must be an integer"},
      {R"({"format": "zest-visionzip/1", "score_layer": -5})", "outside the tower's 4 blocks"},
      {R"({"format": "zest-visionzip/1", "score_layer": 4})", "outside the tower's 4 blocks"},
  };
  for (const auto& [text, what] : bad) {
    auto r = engine::load_score_layer(write_text("bad_visionzip.json", text), 4);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  }

  // A copy of the fixture folder (links to its files) with a visionzip.json: ModelBundle::load takes the block.
  const fs::path dir = fs::path(::testing::TempDir()) / "vl_tiny_with_visionzip";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(kVlTinyDir)) fs::create_symlink(e.path(), dir / e.path().filename());
  std::ofstream(dir / "visionzip.json") << R"({"format": "zest-visionzip/1", "score_layer": -1})";
  auto m = engine::ModelBundle::load(dir.string());
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->vision_prune.score_layer, -1);
  ASSERT_TRUE((*m)->calibrated_score_layer.has_value());
  EXPECT_EQ(*(*m)->calibrated_score_layer, -1);
  EXPECT_FALSE(vl_tiny()->calibrated_score_layer.has_value());
  EXPECT_EQ(vl_tiny()->vision_prune.score_layer, accel::VisionPruneOptions{}.score_layer);
  std::ofstream(dir / "visionzip.json", std::ios::trunc) << R"({"format": "zest-visionzip/1", "score_layer": 9})";
  auto bad_model = engine::ModelBundle::load(dir.string());
  ASSERT_FALSE(bad_model.ok());
  EXPECT_NE(bad_model.status().message().find("visionzip.json"), std::string::npos) << bad_model.status().message();
}

}  // namespace
}  // namespace zest::eval
