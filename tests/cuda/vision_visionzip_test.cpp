// VisionZip on CUDA against the CPU implementation in src/accel: scores vs attention_received_scores +
// merge_group_scores, and device selection == select_vision_tokens exactly (random scores with many ties,
// uniform and global modes, budgets and floors).
#if defined(ZEST_HAVE_CUDA)
#include "accel/visionzip.h"
#include "backend/cuda/visionzip_plan.h"
#include "cuda/cuda_test_util.h"
#include "kernels/cuda/vision_kernels.h"

namespace zest::cuda::test {
namespace {

// Runs the device selection; returns the kept global indices and the per-image counts.
void device_select(const std::vector<float>& scores, const std::vector<int64_t>& tokens, const VisionZipSelect& opt,
                   std::vector<int32_t>& kept, std::vector<int64_t>& counts) {
  auto plan = visionzip_plan(tokens, opt);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  DevBuf<float> dscores(scores);
  DevBuf<char> ws(plan->workspace_bytes);
  DevBuf<int32_t> dkept(std::max<int64_t>(plan->kept, 1)), dcounts(tokens.size());
  counts.assign(tokens.size(), -1);
  ZEST_ASSERT_OK(visionzip_select(dscores.get(), *plan, ws.get(), dkept.get(), dcounts.get(), counts.data(), nullptr));
  kept = dkept.download();
  kept.resize(plan->kept);
}

TEST(CudaVisionZip, SelectionEqualsCpuSelection) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(11);
  int checked = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int n_img = trial % 5 == 0 ? 1 : 1 + static_cast<int>(rng() % 7);
    std::vector<int64_t> tokens(n_img);
    for (auto& m : tokens) m = 1 + static_cast<int64_t>(rng() % (trial % 3 == 0 ? 12 : 400));
    int64_t total = 0;
    for (int64_t m : tokens) total += m;
    std::vector<float> scores(total);
    // Coarse values (many exact ties, zeros included) or continuous ones.
    const bool coarse = trial % 2 == 0;
    std::uniform_real_distribution<float> ud(0.f, 3.f);
    for (float& s : scores) s = coarse ? static_cast<float>(rng() % 6) * 0.25f : ud(rng);
    for (float rate : {0.f, 0.3f, 0.4f, 0.5f, 0.9f, 1.f}) {
      for (bool global : {false, true}) {
        for (int64_t min_tokens : {int64_t{1}, int64_t{16}}) {
          for (int64_t budget : {int64_t{-1}, total / 3}) {
            if (!global && budget != -1) continue;
            SCOPED_TRACE("trial " + std::to_string(trial) + " rate " + std::to_string(rate) +
                         (global ? " global" : " uniform") + " min " + std::to_string(min_tokens) + " budget " +
                         std::to_string(budget));
            accel::VisionPruneOptions o;
            o.rate = rate;
            o.mode = global ? accel::VisionPruneOptions::Mode::kGlobal : accel::VisionPruneOptions::Mode::kUniform;
            o.budget = budget;
            o.min_tokens = min_tokens;
            auto want = accel::select_vision_tokens(scores, tokens, o);
            ASSERT_TRUE(want.ok()) << want.status().to_string();
            std::vector<int64_t> offsets(n_img, 0);
            for (int i = 1; i < n_img; ++i) offsets[i] = offsets[i - 1] + tokens[i - 1];
            auto want_index = accel::build_gather_index(*want, offsets, tokens);
            ASSERT_TRUE(want_index.ok());

            VisionZipSelect d;
            d.rate = rate;
            d.global = global;
            d.budget = budget;
            d.min_tokens = min_tokens;
            std::vector<int32_t> kept;
            std::vector<int64_t> counts;
            device_select(scores, tokens, d, kept, counts);
            ASSERT_EQ(kept.size(), want_index->size());
            for (size_t i = 0; i < kept.size(); ++i) ASSERT_EQ(kept[i], (*want_index)[i]) << "position " << i;
            for (int i = 0; i < n_img; ++i) ASSERT_EQ(counts[i], static_cast<int64_t>((*want)[i].size()));
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 500);
}

TEST(CudaVisionZip, ScoresMatchCpuScores) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(12);
  struct Img {
    int h, w;
  };
  const std::vector<Img> imgs = {{6, 10}, {18, 10}, {2, 2}};
  const int heads = 4, D = 72, H = heads * D;
  int N = 0;
  std::vector<int32_t> cu = {0};
  for (const Img& im : imgs) cu.push_back(N += im.h * im.w);
  int max_seq = 0;
  for (const Img& im : imgs) max_seq = std::max(max_seq, im.h * im.w);
  // q then k per row (stride 2H), bf16 values; the CPU sees the same values in f32.
  auto qk = random_bf16(static_cast<size_t>(N) * 2 * H, rng, -1.5f, 1.5f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> lse(static_cast<size_t>(heads) * N), want_patch, want_tok;
  for (size_t i = 0; i < imgs.size(); ++i) {
    const int n = cu[i + 1] - cu[i];
    std::vector<float> q(static_cast<size_t>(n) * H), k(q.size());
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < H; ++c) {
        q[static_cast<size_t>(r) * H + c] = qk.f[static_cast<size_t>(cu[i] + r) * 2 * H + c];
        k[static_cast<size_t>(r) * H + c] = qk.f[static_cast<size_t>(cu[i] + r) * 2 * H + H + c];
      }
    const accel::AttentionShape shape{n, heads, D};
    auto l = accel::attention_row_lse(q, k, shape, scale);
    ASSERT_TRUE(l.ok());
    for (int h = 0; h < heads; ++h)
      for (int r = 0; r < n; ++r) lse[static_cast<size_t>(h) * N + cu[i] + r] = (*l)[static_cast<size_t>(h) * n + r];
    auto a = accel::attention_received_scores(q, k, *l, shape, scale);
    ASSERT_TRUE(a.ok());
    auto t = accel::merge_group_scores(*a, 4);
    ASSERT_TRUE(t.ok());
    want_patch.insert(want_patch.end(), a->begin(), a->end());
    want_tok.insert(want_tok.end(), t->begin(), t->end());
  }
  auto dqk = upload_bf16(qk);
  DevBuf<int32_t> dcu(cu);
  DevBuf<float> dlse(lse), tok(N / 4), patch(N);
  ZEST_ASSERT_OK(visionzip_scores(dqk->get(), dqk->get() + H, 2 * H, dlse.get(), dcu.get(),
                                  static_cast<int>(imgs.size()), max_seq, N, heads, D, scale, 4, tok.get(), patch.get(),
                                  nullptr));
  sync_ok();
  ZEST_EXPECT_CLOSE(patch.download(), want_patch, 1e-4);  // fp32 sums vs the CPU's f64 sums
  ZEST_EXPECT_CLOSE(tok.download(), want_tok, 1e-4);
}

}  // namespace
}  // namespace zest::cuda::test
#endif
