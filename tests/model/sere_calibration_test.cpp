// SERE calibration against the transformers/numpy reference (tests/fixtures/ref/sere, made by
// tools/make_accel_fixtures.py): engine::calibrate_sere on the tiny MoE fixtures with the committed
// corpus (assets/calibration, first 256 tokens) must reproduce the float64 reference similarity of
// every MoE layer for the frobenius, cosine and linear-CKA metrics to 1e-5 absolute.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/model_bundle.h"
#include "engine/sere.h"
#include "io/npy.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace zest;

namespace {

constexpr float kTolerance = 1e-5f;

json reference(const std::string& model) {
  std::ifstream f(fs::path(ZEST_FIXTURES_DIR) / "ref" / "sere" / (model + ".json"));
  return json::parse(f);
}

std::shared_ptr<engine::ModelBundle> load(const std::string& model) {
  static std::map<std::string, std::shared_ptr<engine::ModelBundle>> cache;
  auto& m = cache[model];
  if (!m) {
    auto r = engine::ModelBundle::load((fs::path(ZEST_FIXTURES_DIR) / "models" / model).string());
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) m = *r;
  }
  return m;
}

std::vector<std::string> corpus_files(const json& ref) {
  std::vector<std::string> out;
  for (const auto& f : ref.at("corpus_files")) out.push_back((fs::path(ZEST_SOURCE_DIR) / f.get<std::string>()).string());
  return out;
}

struct Metric {
  accel::SimilarityMetric metric;
  std::string name;
};

const std::vector<Metric> kMetrics = {{accel::SimilarityMetric::kFrobenius, "frobenius"},
                                      {accel::SimilarityMetric::kCosine, "cosine"},
                                      {accel::SimilarityMetric::kLinearCka, "cka"}};

// Runs calibrate_sere into a temporary file and returns max |zest - reference| over all layers.
float calibrate_and_compare(const engine::ModelBundle& model, const json& ref, const Metric& m, int64_t chunk,
                            const std::string& tag) {
  const int64_t n = ref.at("n_tokens").get<int64_t>();
  engine::CalibrationOptions o;
  o.text_files = corpus_files(ref);
  o.max_tokens = n;
  o.chunk_tokens = chunk;
  o.metric = m.metric;
  o.progress = false;
  o.out_file = (fs::path(::testing::TempDir()) / ("zest_sere_" + tag + "_" + m.name + ".safetensors")).string();
  auto path = engine::calibrate_sere(model, o);
  EXPECT_TRUE(path.ok()) << path.status().to_string();
  if (!path.ok()) return INFINITY;
  auto st = io::SafeTensors::open_file(*path);
  EXPECT_TRUE(st.ok()) << st.status().to_string();
  if (!st.ok()) return INFINITY;
  EXPECT_EQ(st->metadata().at("tokens"), std::to_string(n));
  EXPECT_EQ(st->metadata().at("metric"), m.name);

  auto want = io::read_npy((fs::path(ZEST_FIXTURES_DIR) / "ref" / "sere" /
                            ref.at("metrics").at(m.name).at("file").get<std::string>()).string());
  EXPECT_TRUE(want.ok()) << want.status().to_string();
  if (!want.ok()) return INFINITY;
  const int64_t e = ref.at("n_experts").get<int64_t>();
  const auto layers = ref.at("moe_layers").get<std::vector<int64_t>>();
  EXPECT_EQ(want->numel(), static_cast<int64_t>(layers.size()) * e * e);
  float worst = 0.0f;
  for (size_t li = 0; li < layers.size(); ++li) {
    auto v = st->get("layers." + std::to_string(layers[li]) + ".similarity", {e, e});
    EXPECT_TRUE(v.ok()) << v.status().to_string();
    if (!v.ok()) return INFINITY;
    Tensor got = v->to_f32();
    const float* ref_layer = want->data<float>() + li * e * e;
    for (int64_t i = 0; i < e * e; ++i) worst = std::max(worst, std::fabs(got.data<float>()[i] - ref_layer[i]));
  }
  fs::remove(*path);
  return worst;
}

class SereCalibration : public ::testing::TestWithParam<std::string> {};

// The tokenizer gives the reference's ids: each corpus file encoded on its own without special-token
// parsing, concatenated, first n_tokens.
TEST_P(SereCalibration, TokenizesCorpusLikeReference) {
  const json ref = reference(GetParam());
  auto model = load(GetParam());
  ASSERT_TRUE(model);
  std::vector<int32_t> ids;
  for (const std::string& f : corpus_files(ref)) {
    std::ifstream in(f, std::ios::binary);
    ASSERT_TRUE(in) << f;
    std::stringstream ss;
    ss << in.rdbuf();
    const auto file_ids = model->tokenizer.encode(ss.str(), /*parse_special=*/false);
    ids.insert(ids.end(), file_ids.begin(), file_ids.end());
  }
  const auto want = ref.at("token_ids").get<std::vector<int32_t>>();
  ASSERT_GE(ids.size(), want.size());
  ids.resize(want.size());
  EXPECT_EQ(ids, want);
}

TEST_P(SereCalibration, MatchesReferenceForEveryMetric) {
  const json ref = reference(GetParam());
  auto model = load(GetParam());
  ASSERT_TRUE(model);
  for (const Metric& m : kMetrics) {
    const float diff = calibrate_and_compare(*model, ref, m, 256, GetParam());
    EXPECT_LE(diff, kTolerance) << GetParam() << " " << m.name;
  }
}

// Feeding the same 256 tokens in chunks of 100 (KV cache across chunks) gives the same similarity.
TEST_P(SereCalibration, ChunkedForwardMatchesReference) {
  const json ref = reference(GetParam());
  auto model = load(GetParam());
  ASSERT_TRUE(model);
  const float diff = calibrate_and_compare(*model, ref, kMetrics[0], 100, GetParam() + "_chunked");
  EXPECT_LE(diff, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Models, SereCalibration, ::testing::Values("qwen3_moe_tiny", "qwen3_vl_moe_tiny"));

}  // namespace
