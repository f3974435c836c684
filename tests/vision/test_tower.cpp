// Vision tower vs transformers (tiny fixtures from tools/make_fixtures.py, reference run in f32,
// eager attention). Tolerance: max |diff| <= 1e-4 * max |ref| for embeddings and DeepStack features.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "io/config.h"
#include "io/npy.h"
#include "io/safetensors.h"
#include "kernels/cpu/vision_ops.h"
#include "vision/preprocess.h"
#include "vision/tower.h"
#include "vision_test_util.h"

namespace zest {
namespace {

namespace fs = std::filesystem;
using vision_test::source_path;

std::string fixtures() { return ZEST_FIXTURES_DIR; }

float max_abs(const float* a, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(a[i]));
  return m;
}

float max_abs_diff(const float* a, const float* b, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

struct Case {
  std::string model, name;
};

std::vector<Case> vision_cases() {
  std::vector<Case> out;
  for (const char* model : {"qwen3_vl_tiny", "qwen3_vl_moe_tiny"}) {
    const fs::path dir = fs::path(fixtures()) / "ref" / model;
    if (!fs::exists(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() != ".json") continue;
      const auto j = vision_test::read_json(e.path().string());
      if (j.contains("vision_embeds_file")) out.push_back({model, e.path().stem().string()});
    }
  }
  std::sort(out.begin(), out.end(), [](const Case& a, const Case& b) { return a.model + a.name < b.model + b.name; });
  return out;
}

TEST(VisionTower, MatchesTransformersOnFixtures) {
  const auto cases = vision_cases();
  ASSERT_GE(cases.size(), 4u) << "tiny VL fixtures missing under " << fixtures();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.model + "/" + c.name);
    const std::string model_dir = fixtures() + "/models/" + c.model;
    const std::string ref_dir = fixtures() + "/ref/" + c.model;
    const auto ref = vision_test::read_json(ref_dir + "/" + c.name + ".json");
    auto cfg = io::load_model_config(model_dir);
    ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
    ASSERT_TRUE(cfg->vision.has_value());
    auto pcfg = io::load_preprocessor_config(model_dir);
    ASSERT_TRUE(pcfg.ok()) << pcfg.status().to_string();
    auto st = io::SafeTensors::open(model_dir);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    auto tower = vision::VisionTower::load(*st, *cfg->vision);
    ASSERT_TRUE(tower.ok()) << tower.status().to_string();

    // Preprocess the request's images as zest would.
    std::vector<io::Image> images;
    for (const auto& img : ref["images"]) {
      auto decoded = io::load_image(source_path(img["path"].get<std::string>()));
      ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
      EXPECT_EQ(decoded->width, img["decoded_width"].get<int64_t>());
      EXPECT_EQ(decoded->height, img["decoded_height"].get<int64_t>());
      images.push_back(std::move(*decoded));
    }
    vision::PixelBudget budget;
    budget.min_pixels = ref["request"]["mm_processor_kwargs"]["min_pixels"].get<int64_t>();
    budget.max_pixels = ref["request"]["mm_processor_kwargs"]["max_pixels"].get<int64_t>();
    auto batch = vision::preprocess_images(images, *pcfg, budget);
    ASSERT_TRUE(batch.ok()) << batch.status().to_string();
    const auto grids = ref["image_grid_thw"].get<std::vector<std::vector<int64_t>>>();
    ASSERT_EQ(batch->grids.size(), grids.size());
    for (size_t i = 0; i < grids.size(); ++i) {
      EXPECT_EQ(batch->grids[i], (vision::GridTHW{grids[i][0], grids[i][1], grids[i][2]}));
    }
    const auto head = ref["pixel_values_head"].get<std::vector<std::vector<float>>>();
    for (size_t r = 0; r < head.size(); ++r)
      for (size_t col = 0; col < head[r].size(); ++col)
        ASSERT_EQ(batch->pixel_values.data<float>()[r * 1536 + col], head[r][col]) << "row " << r << " col " << col;
    double sum = 0;
    for (int64_t i = 0; i < batch->pixel_values.numel(); ++i) sum += batch->pixel_values.data<float>()[i];
    EXPECT_NEAR(sum, ref["pixel_values_sum"].get<double>(), 1e-6 * ref["pixel_values_abs_sum"].get<double>());

    auto out = tower->forward(batch->pixel_values, batch->grids);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    auto want = io::read_npy(ref_dir + "/" + ref["vision_embeds_file"].get<std::string>());
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(out->embeds.shape(), want->shape());
    const float tol = 1e-4f * max_abs(want->data<float>(), want->numel());
    EXPECT_LE(max_abs_diff(out->embeds.data<float>(), want->data<float>(), want->numel()), tol);
    int64_t tokens = 0;
    for (size_t i = 0; i < out->tokens_per_image.size(); ++i) {
      EXPECT_EQ(out->tokens_per_image[i], ref["images"][i]["llm_tokens"].get<int64_t>());
      tokens += out->tokens_per_image[i];
    }
    EXPECT_EQ(tokens, want->dim(0));

    auto ds = io::read_npy(ref_dir + "/" + ref["deepstack_file"].get<std::string>());
    ASSERT_TRUE(ds.ok());
    ASSERT_EQ(static_cast<int64_t>(out->deepstack.size()), ds->dim(0));
    const int64_t per = ds->dim(1) * ds->dim(2);
    for (size_t j = 0; j < out->deepstack.size(); ++j) {
      ASSERT_EQ(out->deepstack[j].numel(), per);
      const float* w = ds->data<float>() + j * per;
      EXPECT_LE(max_abs_diff(out->deepstack[j].data<float>(), w, per), 1e-4f * max_abs(w, per)) << "deepstack " << j;
    }
  }
}

TEST(VisionTower, AttentionCaptureIsConsistentAndDoesNotChangeOutputs) {
  const std::string model_dir = fixtures() + "/models/qwen3_vl_tiny";
  auto cfg = io::load_model_config(model_dir);
  auto st = io::SafeTensors::open(model_dir);
  ASSERT_TRUE(cfg.ok() && st.ok());
  auto tower = vision::VisionTower::load(*st, *cfg->vision);
  ASSERT_TRUE(tower.ok()) << tower.status().to_string();
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  // Two images; the second is a 2-frame video-like grid (two attention segments).
  const std::vector<vision::GridTHW> grids = {{1, 4, 6}, {2, 2, 4}};
  const int64_t rows = 24 + 16;
  Tensor pv = Tensor::empty({rows, 1536});
  for (int64_t i = 0; i < pv.numel(); ++i) pv.data<float>()[i] = uni(rng);
  auto plain = tower->forward(pv, grids);
  auto scored = tower->forward(pv, grids, 1);
  ASSERT_TRUE(plain.ok() && scored.ok());
  ASSERT_EQ(0, std::memcmp(plain->embeds.data<float>(), scored->embeds.data<float>(), plain->embeds.nbytes()));
  ASSERT_TRUE(scored->attention.has_value());
  const auto& cap = *scored->attention;
  EXPECT_EQ(cap.layer, 1);
  ASSERT_EQ(cap.q.size(), 2u);
  const int64_t heads = cfg->vision->num_heads, hd = tower->head_dim();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (size_t im = 0; im < grids.size(); ++im) {
    const int64_t n = grids[im].patches(), seg = grids[im].h * grids[im].w;
    ASSERT_EQ(cap.q[im].shape(), (std::vector<int64_t>{n, heads, hd}));
    ASSERT_EQ(cap.k[im].shape(), (std::vector<int64_t>{n, heads, hd}));
    ASSERT_EQ(cap.lse[im].shape(), (std::vector<int64_t>{heads, n}));
    // Plain double-precision log-sum-exp over each query's own frame.
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t s0 = i / seg * seg;
        double mx = -1e300;
        std::vector<double> sc;
        for (int64_t j = s0; j < s0 + seg; ++j) {
          double d = 0;
          for (int64_t e = 0; e < hd; ++e)
            d += static_cast<double>(cap.q[im].data<float>()[(i * heads + h) * hd + e]) *
                 cap.k[im].data<float>()[(j * heads + h) * hd + e];
          sc.push_back(d * scale);
          mx = std::max(mx, d * scale);
        }
        double s = 0;
        for (double x : sc) s += std::exp(x - mx);
        EXPECT_NEAR(cap.lse[im].data<float>()[h * n + i], mx + std::log(s), 1e-4);
      }
  }
}

TEST(VisionTower, ImagesInOneBatchDoNotInteract) {
  const std::string model_dir = fixtures() + "/models/qwen3_vl_moe_tiny";
  auto cfg = io::load_model_config(model_dir);
  auto st = io::SafeTensors::open(model_dir);
  ASSERT_TRUE(cfg.ok() && st.ok());
  auto tower = vision::VisionTower::load(*st, *cfg->vision);
  ASSERT_TRUE(tower.ok());
  std::mt19937 rng(23);
  std::normal_distribution<float> nd;
  Tensor a = Tensor::empty({16, 1536}), b = Tensor::empty({32, 1536}), ab = Tensor::empty({48, 1536});
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = nd(rng);
  for (int64_t i = 0; i < b.numel(); ++i) b.data<float>()[i] = nd(rng);
  std::memcpy(ab.data<float>(), a.data<float>(), a.nbytes());
  std::memcpy(ab.data<float>() + a.numel(), b.data<float>(), b.nbytes());
  auto oa = tower->forward(a, {{1, 4, 4}});
  auto ob = tower->forward(b, {{1, 4, 8}});
  auto oab = tower->forward(ab, {{1, 4, 4}, {1, 4, 8}});
  ASSERT_TRUE(oa.ok() && ob.ok() && oab.ok());
  const int64_t D = cfg->vision->out_hidden_size;
  ASSERT_EQ(oab->embeds.dim(0), 4 + 8);
  EXPECT_LE(max_abs_diff(oab->embeds.data<float>(), oa->embeds.data<float>(), 4 * D), 1e-6f);
  EXPECT_LE(max_abs_diff(oab->embeds.data<float>() + 4 * D, ob->embeds.data<float>(), 8 * D), 1e-6f);
}

TEST(VisionTower, LoadAndForwardErrorsAreClear) {
  const std::string model_dir = fixtures() + "/models/qwen3_vl_tiny";
  auto cfg = io::load_model_config(model_dir);
  auto st = io::SafeTensors::open(model_dir);
  ASSERT_TRUE(cfg.ok() && st.ok());
  io::VisionConfig wrong = *cfg->vision;
  wrong.intermediate_size += 8;
  auto r = vision::VisionTower::load(*st, wrong);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(r.status().message().find("linear_fc1.weight"), std::string::npos) << r.status().message();
  auto missing = vision::VisionTower::load(*st, *cfg->vision, "model.vision.");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  wrong = *cfg->vision;
  wrong.deepstack_visual_indexes = {0, 7};
  EXPECT_EQ(vision::VisionTower::load(*st, wrong).status().code(), ErrorCode::kInvalidArgument);

  auto tower = vision::VisionTower::load(*st, *cfg->vision);
  ASSERT_TRUE(tower.ok());
  Tensor pv = Tensor::zeros({16, 1536});
  EXPECT_EQ(tower->forward(pv, {{1, 4, 8}}).status().code(), ErrorCode::kInvalidArgument);  // 32 patches
  EXPECT_EQ(tower->forward(pv, {{1, 4, 3}}).status().code(), ErrorCode::kInvalidArgument);  // odd width
  EXPECT_EQ(tower->forward(pv, {}).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(tower->forward(pv, {{1, 4, 4}}, 99).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(tower->forward(Tensor::zeros({16, 100}), {{1, 4, 4}}).status().code(), ErrorCode::kInvalidArgument);
}

TEST(VisionOps, SegmentAttentionMatchesPlainSoftmax) {
  std::mt19937 rng(29);
  std::normal_distribution<float> nd;
  for (int64_t n : {1, 5, 64, 150}) {
    const int64_t heads = 3, hd = 8, stride = heads * hd;
    std::vector<float> q(n * stride), k(n * stride), v(n * stride), out(n * stride), lse(heads * n);
    for (auto* buf : {&q, &k, &v})
      for (auto& x : *buf) x = 2.0f * nd(rng);
    const float scale = 0.35f;
    cpu::segment_attention(out.data(), q.data(), k.data(), v.data(), n, heads, hd, scale, lse.data());
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < n; ++i) {
        std::vector<double> s(n);
        double mx = -1e300;
        for (int64_t j = 0; j < n; ++j) {
          double d = 0;
          for (int64_t e = 0; e < hd; ++e) d += static_cast<double>(q[i * stride + h * hd + e]) * k[j * stride + h * hd + e];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (double x : s) z += std::exp(x - mx);
        EXPECT_NEAR(lse[h * n + i], mx + std::log(z), 1e-4);
        for (int64_t e = 0; e < hd; ++e) {
          double o = 0;
          for (int64_t j = 0; j < n; ++j) o += std::exp(s[j] - mx) / z * v[j * stride + h * hd + e];
          EXPECT_NEAR(out[i * stride + h * hd + e], o, 1e-4);
        }
      }
  }
}

}  // namespace
}  // namespace zest
