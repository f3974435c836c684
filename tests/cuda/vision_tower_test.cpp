// The CUDA vision tower against the CPU f32 tower (vision::VisionTower) on the tiny Qwen3-VL-MoE fixture and
// two real bundled images in one request: embeddings, DeepStack features, VisionZip scores of the score
// layer, and the selections made from them.
#if defined(ZEST_HAVE_CUDA)
#include "backend/cuda/vision_tower.h"

#include "accel/visionzip.h"
#include "backend/cuda/visionzip_plan.h"
#include "cuda/cuda_test_util.h"
#include "io/config.h"
#include "io/image.h"
#include "io/safetensors.h"
#include "kernels/cuda/vision_kernels.h"
#include "vision/preprocess.h"
#include "vision/tower.h"

namespace zest::cuda::test {
namespace {

constexpr double kTowerTol = 5e-2;  // bf16 weights and activations through 3 blocks: max err <= 5% of max |ref|

std::vector<float> to_vec(const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); }

std::vector<float> download_rows(const bf16* p, size_t n) {
  std::vector<uint16_t> bits(n);
  EXPECT_EQ(cudaMemcpy(bits.data(), p, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = bf16_to_f32(bits[i]);
  return f;
}

TEST(CudaVisionTower, MatchesCpuTowerOnFixtureAndRealImages) {
  ZEST_REQUIRE_GPU();
  const std::string dir = std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_vl_moe_tiny";
  auto cfg = io::load_model_config(dir);
  ASSERT_TRUE(cfg.ok() && cfg->vision.has_value()) << cfg.status().to_string();
  auto pcfg = io::load_preprocessor_config(dir);
  ASSERT_TRUE(pcfg.ok()) << pcfg.status().to_string();
  auto st = io::SafeTensors::open(dir);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  auto cpu = vision::VisionTower::load(*st, *cfg->vision);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto gpu = load_vision_tower_cuda(*st, *cfg->vision);
  ASSERT_TRUE(gpu.ok()) << gpu.status().to_string();

  std::vector<io::Image> images;
  for (const char* name : {"assets/images/photo_birds.jpg", "assets/images/chart_bar_qwen3_downloads.png"}) {
    auto img = io::load_image(std::string(ZEST_SOURCE_DIR) + "/" + name);
    ASSERT_TRUE(img.ok()) << img.status().to_string();
    images.push_back(std::move(*img));
  }
  vision::PixelBudget budget;
  budget.max_pixels = 200704;  // <= 196 LLM tokens per image
  auto batch = vision::preprocess_images(images, *pcfg, budget);
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  const int score_layer = static_cast<int>(cfg->vision->depth) - 1;
  auto ref = cpu->forward(batch->pixel_values, batch->grids, score_layer);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();

  const size_t pv_n = static_cast<size_t>(batch->pixel_values.numel());
  DevBuf<float> pv32(std::vector<float>(batch->pixel_values.data<float>(), batch->pixel_values.data<float>() + pv_n));
  DevBuf<bf16> pv(pv_n);
  ZEST_ASSERT_OK(vision_f32_to_bf16(pv32.get(), pv.get(), pv_n, nullptr));
  ZEST_ASSERT_OK((*gpu)->forward(pv.get(), batch->grids, score_layer, nullptr));
  sync_ok();
  const VisionTowerOutput& out = (*gpu)->output();
  const int O = static_cast<int>(cfg->vision->out_hidden_size);
  ASSERT_EQ(out.tokens, ref->embeds.dim(0));
  ASSERT_EQ(out.tokens_per_image, ref->tokens_per_image);
  ZEST_EXPECT_CLOSE(download_rows(out.embeds, static_cast<size_t>(out.tokens) * O), to_vec(ref->embeds), kTowerTol);
  ASSERT_EQ(out.deepstack.size(), ref->deepstack.size());
  for (size_t j = 0; j < out.deepstack.size(); ++j) {
    SCOPED_TRACE("deepstack " + std::to_string(j));
    ZEST_EXPECT_CLOSE(download_rows(out.deepstack[j], static_cast<size_t>(out.tokens) * O), to_vec(ref->deepstack[j]),
                      kTowerTol);
  }

  // The unfused path (GEMMs, then the separate bias / bias + GELU kernels) against the same reference; then
  // the fused outputs again for the scores below.
  (*gpu)->set_fused_epilogues(false);
  ZEST_ASSERT_OK((*gpu)->forward(pv.get(), batch->grids, score_layer, nullptr));
  sync_ok();
  ZEST_EXPECT_CLOSE(download_rows(out.embeds, static_cast<size_t>(out.tokens) * O), to_vec(ref->embeds), kTowerTol);
  (*gpu)->set_fused_epilogues(true);
  ZEST_ASSERT_OK((*gpu)->forward(pv.get(), batch->grids, score_layer, nullptr));
  sync_ok();

  // VisionZip scores: device kernel on the device capture vs the CPU scores of the CPU capture.
  DevBuf<float> tok(out.tokens);
  ZEST_ASSERT_OK((*gpu)->scores(tok.get(), nullptr, nullptr));
  sync_ok();
  const std::vector<float> got = tok.download();
  const auto& cap = *ref->attention;
  const int64_t heads = cfg->vision->num_heads, hd = cpu->head_dim();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> want;
  for (size_t i = 0; i < cap.q.size(); ++i) {
    const accel::AttentionShape shape{cap.q[i].dim(0), heads, hd};
    auto a = accel::attention_received_scores(to_vec(cap.q[i]), to_vec(cap.k[i]), to_vec(cap.lse[i]), shape, scale);
    ASSERT_TRUE(a.ok());
    auto t = accel::merge_group_scores(*a, 4);
    ASSERT_TRUE(t.ok());
    want.insert(want.end(), t->begin(), t->end());
  }
  ZEST_EXPECT_CLOSE(got, want, kTowerTol);

  // Selections: the device selection equals the CPU selection on the device scores exactly; against the
  // CPU tower's scores, a token may only differ where its CPU score is within tolerance of the cut.
  const double score_tol = kTowerTol * *std::max_element(want.begin(), want.end());
  for (bool global : {false, true}) {
    SCOPED_TRACE(global ? "global" : "uniform");
    VisionZipSelect d;
    d.rate = 0.4f;
    d.global = global;
    auto plan = visionzip_plan(out.tokens_per_image, d);
    ASSERT_TRUE(plan.ok());
    DevBuf<char> ws(plan->workspace_bytes);
    DevBuf<int32_t> kept(plan->kept), counts(out.tokens_per_image.size());
    std::vector<int64_t> host_counts(out.tokens_per_image.size());
    ZEST_ASSERT_OK(visionzip_select(tok.get(), *plan, ws.get(), kept.get(), counts.get(), host_counts.data(), nullptr));
    const auto kept_dev = kept.download();
    accel::VisionPruneOptions o;
    o.rate = 0.4f;
    o.mode = global ? accel::VisionPruneOptions::Mode::kGlobal : accel::VisionPruneOptions::Mode::kUniform;
    auto on_dev_scores = accel::select_vision_tokens(got, out.tokens_per_image, o);
    ASSERT_TRUE(on_dev_scores.ok());
    std::vector<int64_t> offsets = {0};
    for (int64_t m : out.tokens_per_image) offsets.push_back(offsets.back() + m);
    offsets.pop_back();
    auto idx = accel::build_gather_index(*on_dev_scores, offsets, out.tokens_per_image);
    ASSERT_TRUE(idx.ok());
    ASSERT_EQ(kept_dev.size(), idx->size());
    for (size_t i = 0; i < idx->size(); ++i) ASSERT_EQ(kept_dev[i], (*idx)[i]);

    if (!global) {
      auto on_cpu_scores = accel::select_vision_tokens(want, out.tokens_per_image, o);
      ASSERT_TRUE(on_cpu_scores.ok());
      for (size_t i = 0; i < on_cpu_scores->size(); ++i) {
        const auto& a = (*on_cpu_scores)[i];
        const auto& b = (*on_dev_scores)[i];
        ASSERT_EQ(a.size(), b.size());
        std::vector<float> s(want.begin() + offsets[i], want.begin() + offsets[i] + out.tokens_per_image[i]);
        std::vector<float> sorted = s;
        std::sort(sorted.rbegin(), sorted.rend());
        const float cut = sorted[a.size() - 1];
        std::vector<int64_t> diff;
        std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(diff));
        for (int64_t j : diff) EXPECT_LE(std::fabs(s[j] - cut), 2 * score_tol) << "image " << i << " token " << j;
      }
    }
  }
}

}  // namespace
}  // namespace zest::cuda::test
#endif
