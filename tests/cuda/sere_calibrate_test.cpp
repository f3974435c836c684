// Device-side SERE calibration: kernels::ExpertGram against a plain f64 loop over the same bf16 weights, and
// `calibrate-sere` on the CUDA decoder against the CPU calibration of the tiny Qwen3-MoE fixture.
#ifdef ZEST_HAVE_CUDA
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "accel/sere.h"
#include "engine/model_bundle.h"
#include "engine/sere.h"
#include "io/safetensors.h"
#include "kernels/sere_calibration.h"
#include "cuda/cuda_test_util.h"

namespace zest::cuda::test {
namespace {

// Reference: y_e[t] = down_e(bf16(silu(gate_e x_t) * up_e x_t)) with x rounded to bf16, sums in f64.
std::vector<double> reference_gram(const HostBF16& gu, const HostBF16& down, const std::vector<float>& x, int E,
                                   int H, int I, int n, bool cosine) {
  std::vector<double> y(static_cast<size_t>(E) * n * H);
  for (int e = 0; e < E; ++e) {
    for (int t = 0; t < n; ++t) {
      std::vector<float> h(I);
      for (int i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int k = 0; k < H; ++k) {
          const double xv = round_bf16(x[static_cast<size_t>(t) * H + k]);
          g += xv * bf16_to_f32(gu.bits[(static_cast<size_t>(e) * 2 * I + i) * H + k]);
          u += xv * bf16_to_f32(gu.bits[(static_cast<size_t>(e) * 2 * I + I + i) * H + k]);
        }
        h[i] = round_bf16(static_cast<float>(g / (1.0 + std::exp(-g)) * u));
      }
      double norm = 0;
      double* row = y.data() + (static_cast<size_t>(e) * n + t) * H;
      for (int o = 0; o < H; ++o) {
        double s = 0;
        for (int i = 0; i < I; ++i) s += h[i] * bf16_to_f32(down.bits[(static_cast<size_t>(e) * H + o) * I + i]);
        row[o] = s;
        norm += s * s;
      }
      if (cosine) {
        norm = std::sqrt(norm);
        for (int o = 0; o < H; ++o) row[o] = norm > 0 ? row[o] / norm : 0.0;
      }
    }
  }
  std::vector<double> g(static_cast<size_t>(E) * E, 0.0);
  for (int p = 0; p < E; ++p)
    for (int q = 0; q < E; ++q)
      for (size_t i = 0; i < static_cast<size_t>(n) * H; ++i)
        g[p * E + q] += y[static_cast<size_t>(p) * n * H + i] * y[static_cast<size_t>(q) * n * H + i];
  return g;
}

TEST(SereCalibrateCuda, ExpertGramMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(1234);
  // Odd sizes; max_tokens 9 with n = 23 is rejected, and n = 23 spans several sub-chunks only if the workspace
  // is small, so both a one-chunk and a many-token case are run.
  const int E = 5, H = 72, I = 40;
  const HostBF16 gu = random_bf16(static_cast<size_t>(E) * 2 * I * H, rng, -0.3f, 0.3f);
  const HostBF16 down = random_bf16(static_cast<size_t>(E) * H * I, rng, -0.3f, 0.3f);
  auto dgu = upload_bf16(gu);
  auto ddown = upload_bf16(down);
  const kernels::DeviceExpertWeights w{dgu->get(), ddown->get(), E, H, I};
  for (int n : {1, 23}) {
    std::uniform_real_distribution<float> d(-2.f, 2.f);
    std::vector<float> x(static_cast<size_t>(n) * H);
    for (float& v : x) v = d(rng);
    auto g = kernels::make_cuda_expert_gram(E, H, I, 32);
    ZEST_ASSERT_OK(g.status());
    for (bool cosine : {false, true}) {
      std::vector<double> got;
      ZEST_ASSERT_OK((*g)->compute(w, x.data(), n, cosine, got));
      const std::vector<double> ref = reference_gram(gu, down, x, E, H, I, n, cosine);
      ASSERT_EQ(got.size(), ref.size());
      double max_ref = 0;
      for (double v : ref) max_ref = std::max(max_ref, std::abs(v));
      for (size_t i = 0; i < ref.size(); ++i) {
        // bf16 rounding of the SiLU product can differ by one ulp where f32 and f64 straddle a tie.
        EXPECT_NEAR(got[i], ref[i], 2e-3 * max_ref) << "n=" << n << " cosine=" << cosine << " at " << i;
      }
      if (cosine) {
        for (int e = 0; e < E; ++e) EXPECT_NEAR(got[e * E + e], n, 1e-6 * n);  // unit rows
      }
    }
  }
  auto g = kernels::make_cuda_expert_gram(E, H, I, 9);
  ZEST_ASSERT_OK(g.status());
  std::vector<float> x(23 * H, 0.5f);
  std::vector<double> out;
  EXPECT_FALSE((*g)->compute(w, x.data(), 23, false, out).is_ok());  // more tokens than the workspace
  const kernels::DeviceExpertWeights wrong{dgu->get(), ddown->get(), E, H, I + 1};
  EXPECT_FALSE((*g)->compute(wrong, x.data(), 4, false, out).is_ok());  // shape mismatch
  EXPECT_FALSE(kernels::make_cuda_expert_gram(0, H, I, 4).ok());
}

TEST(SereCalibrateCuda, AccumulatorFromDeviceGramMatchesCpuOutputs) {
  ZEST_REQUIRE_GPU();
  // The device statistic fed through add_gram equals the CPU accumulator fed the expert outputs themselves.
  std::mt19937 rng(77);
  const int E = 4, H = 40, I = 24, n = 11;
  const HostBF16 gu = random_bf16(static_cast<size_t>(E) * 2 * I * H, rng, -0.3f, 0.3f);
  const HostBF16 down = random_bf16(static_cast<size_t>(E) * H * I, rng, -0.3f, 0.3f);
  auto dgu = upload_bf16(gu);
  auto ddown = upload_bf16(down);
  std::vector<float> x(static_cast<size_t>(n) * H);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  for (float& v : x) v = d(rng);
  auto g = kernels::make_cuda_expert_gram(E, H, I, n);
  ZEST_ASSERT_OK(g.status());
  for (auto metric : {accel::SimilarityMetric::kFrobenius, accel::SimilarityMetric::kCosine}) {
    std::vector<double> pair;
    ZEST_ASSERT_OK((*g)->compute({dgu->get(), ddown->get(), E, H, I}, x.data(), n,
                                 metric == accel::SimilarityMetric::kCosine, pair));
    auto dev = accel::ExpertSimilarityAccumulator::create(E, H, metric);
    ZEST_ASSERT_OK(dev.status());
    ZEST_ASSERT_OK(dev->add_gram(pair, n));
    // CPU: the expert outputs from the reference loop (unnormalised), through add_chunk.
    std::vector<float> outs(static_cast<size_t>(E) * n * H);
    for (int e = 0; e < E; ++e)
      for (int t = 0; t < n; ++t) {
        std::vector<float> h(I);
        for (int i = 0; i < I; ++i) {
          double gg = 0, u = 0;
          for (int k = 0; k < H; ++k) {
            const double xv = round_bf16(x[t * H + k]);
            gg += xv * bf16_to_f32(gu.bits[(static_cast<size_t>(e) * 2 * I + i) * H + k]);
            u += xv * bf16_to_f32(gu.bits[(static_cast<size_t>(e) * 2 * I + I + i) * H + k]);
          }
          h[i] = round_bf16(static_cast<float>(gg / (1.0 + std::exp(-gg)) * u));
        }
        for (int o = 0; o < H; ++o) {
          double s = 0;
          for (int i = 0; i < I; ++i) s += h[i] * bf16_to_f32(down.bits[(static_cast<size_t>(e) * H + o) * I + i]);
          outs[(static_cast<size_t>(e) * n + t) * H + o] = static_cast<float>(s);
        }
      }
    auto cpu = accel::ExpertSimilarityAccumulator::create(E, H, metric);
    ZEST_ASSERT_OK(cpu.status());
    ZEST_ASSERT_OK(cpu->add_chunk(outs, n));
    auto sd = dev->similarity();
    auto sc = cpu->similarity();
    ZEST_ASSERT_OK(sd.status());
    ZEST_ASSERT_OK(sc.status());
    for (size_t i = 0; i < sd->size(); ++i) EXPECT_NEAR((*sd)[i], (*sc)[i], 2e-3) << i;
  }
}

TEST(SereCalibrateCuda, CalibrationOnCudaDecoderMatchesCpu) {
  ZEST_REQUIRE_GPU();
  const std::string dir = std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_moe_tiny";
  const std::string text = std::string(ZEST_SOURCE_DIR) + "/assets/calibration";
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(text))
    if (e.path().extension() == ".txt") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  ASSERT_FALSE(files.empty());
  for (auto metric : {accel::SimilarityMetric::kFrobenius, accel::SimilarityMetric::kCosine}) {
    std::vector<std::vector<float>> sims;
    for (auto backend : {model::Backend::kCpu, model::Backend::kCuda}) {
      auto m = engine::ModelBundle::load(dir, backend);
      ZEST_ASSERT_OK(m.status());
      engine::CalibrationOptions co;
      co.text_files = files;
      co.max_tokens = 300;  // two chunks of 256 and 44
      co.progress = false;
      co.metric = metric;
      co.out_file = ::testing::TempDir() + "/sere_cuda_calib.safetensors";
      auto r = engine::calibrate_sere(**m, co);
      ZEST_ASSERT_OK(r.status());
      auto st = io::SafeTensors::open(*r);
      ZEST_ASSERT_OK(st.status());
      auto v = st->get("layers.0.similarity");
      ZEST_ASSERT_OK(v.status());
      const float* p = reinterpret_cast<const float*>(v->data);
      sims.emplace_back(p, p + v->numel());
    }
    ASSERT_EQ(sims[0].size(), sims[1].size());
    // The CUDA decoder runs in bf16 (the CPU one in f32), so the MoE inputs differ by ~1e-2 relative; the
    // similarities, all in [0, 1], must agree to 3e-2, and the diagonal is exactly 1 on both.
    double max_diff = 0;
    for (size_t i = 0; i < sims[0].size(); ++i) max_diff = std::max(max_diff, std::abs(double(sims[0][i]) - sims[1][i]));
    EXPECT_LT(max_diff, 3e-2) << "metric " << static_cast<int>(metric);
    const int E = static_cast<int>(std::lround(std::sqrt(static_cast<double>(sims[1].size()))));
    for (int e = 0; e < E; ++e) EXPECT_EQ(sims[1][e * E + e], 1.f);
  }
}

}  // namespace
}  // namespace zest::cuda::test
#endif
