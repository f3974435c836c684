// CUDA vision-tower kernels and VisionZip scores/gathers against plain loops written here, on random inputs
// (grids with odd merged sides, one and several images, a two-frame video, head_dim 72 and 16).
#ifdef ZEST_HAVE_CUDA
#include "kernels/cuda/vision_kernels.h"

#include <cstring>
#include <numeric>

#include "backend/cuda/visionzip_plan.h"
#include "cuda/cuda_test_util.h"

namespace zest::cuda::test {
namespace {

struct Grid {
  int t, h, w;
};

// Patch (row, col) of every row in 2x2-block order (spec §1.4), repeated per frame.
void block_order_coords(const std::vector<Grid>& grids, std::vector<int>& rows, std::vector<int>& cols) {
  for (const Grid& g : grids)
    for (int t = 0; t < g.t; ++t)
      for (int br = 0; br < g.h / 2; ++br)
        for (int bc = 0; bc < g.w / 2; ++bc)
          for (int ir = 0; ir < 2; ++ir)
            for (int ic = 0; ic < 2; ++ic) {
              rows.push_back(br * 2 + ir);
              cols.push_back(bc * 2 + ic);
            }
}

std::vector<int32_t> grid_meta(const std::vector<Grid>& grids) {
  std::vector<int32_t> m;
  int row = 0;
  for (const Grid& g : grids) {
    m.insert(m.end(), {row, g.t, g.h, g.w});
    row += g.t * g.h * g.w;
  }
  return m;
}

std::vector<int32_t> cu_seqlens(const std::vector<Grid>& grids) {
  std::vector<int32_t> cu = {0};
  for (const Grid& g : grids)
    for (int t = 0; t < g.t; ++t) cu.push_back(cu.back() + g.h * g.w);
  return cu;
}

TEST(CudaVision, LayerNormAndResidualLayerNorm) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(1);
  for (int dim : {1152, 200, 4608}) {
    const int rows = 37;
    std::uniform_real_distribution<float> ud(-3.f, 3.f);
    std::vector<float> x(static_cast<size_t>(rows) * dim);
    for (float& v : x) v = ud(rng) + 0.5f;
    auto w = random_bf16(dim, rng, 0.5f, 1.5f), b = random_bf16(dim, rng, -0.5f, 0.5f);
    auto delta = random_bf16(x.size(), rng, -1.f, 1.f), bias = random_bf16(dim, rng, -0.2f, 0.2f);
    DevBuf<float> dx(x);
    auto dw = upload_bf16(w), db = upload_bf16(b), dd = upload_bf16(delta), dbias = upload_bf16(bias);
    DevBuf<bf16> y(x.size());
    y.poison();
    ZEST_ASSERT_OK(vision_layernorm(dx.get(), dw->get(), db->get(), y.get(), rows, dim, 1e-6f, nullptr));
    sync_ok();
    auto ln = [&](const std::vector<float>& in) {
      std::vector<float> out(in.size());
      for (int r = 0; r < rows; ++r) {
        double mean = 0, var = 0;
        for (int i = 0; i < dim; ++i) mean += in[r * dim + i];
        mean /= dim;
        for (int i = 0; i < dim; ++i) var += (in[r * dim + i] - mean) * (in[r * dim + i] - mean);
        var /= dim;
        for (int i = 0; i < dim; ++i)
          out[r * dim + i] = static_cast<float>((in[r * dim + i] - mean) / std::sqrt(var + 1e-6) * w.f[i] + b.f[i]);
      }
      return out;
    };
    ZEST_EXPECT_CLOSE(download_bf16(y), ln(x), 1e-2);  // bf16 output: max err <= 1e-2 * max |ref|

    ZEST_ASSERT_OK(vision_residual_layernorm(dx.get(), dd->get(), dbias->get(), dw->get(), db->get(), y.get(), rows,
                                             dim, 1e-6f, nullptr));
    sync_ok();
    std::vector<float> x2 = x;
    for (size_t i = 0; i < x2.size(); ++i) x2[i] += delta.f[i] + bias.f[i % dim];
    const auto xg = dx.download();
    ZEST_EXPECT_CLOSE(xg, x2, 1e-6);  // fp32 residual: only rounding of one add
    ZEST_EXPECT_CLOSE(download_bf16(y), ln(x2), 1e-2);
  }
}

TEST(CudaVision, BiasGeluTanhAndErf) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(2);
  for (int cols : {4304, 37}) {
    const int rows = 19;
    auto h = random_bf16(static_cast<size_t>(rows) * cols, rng, -4.f, 4.f), bias = random_bf16(cols, rng, -1.f, 1.f);
    for (bool tanh_mode : {true, false}) {
      auto dh = upload_bf16(h), db = upload_bf16(bias);
      ZEST_ASSERT_OK(vision_bias_gelu(dh->get(), db->get(), rows, cols, tanh_mode, nullptr));
      sync_ok();
      std::vector<float> ref(h.f.size());
      for (size_t i = 0; i < ref.size(); ++i) {
        const double v = static_cast<double>(h.f[i]) + bias.f[i % cols];
        ref[i] =
            static_cast<float>(tanh_mode ? 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))
                                         : 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))));
      }
      ZEST_EXPECT_CLOSE(download_bf16(*dh), ref, 1e-2);
    }
    auto dh = upload_bf16(h), db = upload_bf16(bias);
    ZEST_ASSERT_OK(vision_bias_add(dh->get(), db->get(), rows, cols, nullptr));
    sync_ok();
    std::vector<float> ref(h.f.size());
    for (size_t i = 0; i < ref.size(); ++i) ref[i] = h.f[i] + bias.f[i % cols];
    ZEST_EXPECT_CLOSE(download_bf16(*dh), ref, 1e-2);
  }
}

TEST(CudaVision, GemmNoneBiasAndBiasGeluEpilogues) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(12);
  struct Shape {
    int M, N, K;
  };
  // Odd row counts, the tower's fc1 and qkv widths, and a tiny shape.
  for (const Shape sz : {Shape{37, 72, 40}, Shape{61, 4304, 1152}, Shape{130, 3456, 1152}, Shape{1, 8, 8}}) {
    SCOPED_TRACE("M=" + std::to_string(sz.M) + " N=" + std::to_string(sz.N) + " K=" + std::to_string(sz.K));
    const float a = std::sqrt(3.f / static_cast<float>(sz.K));
    auto x = random_bf16(static_cast<size_t>(sz.M) * sz.K, rng, -2.f, 2.f);
    auto w = random_bf16(static_cast<size_t>(sz.N) * sz.K, rng, -a, a);
    auto bias = random_bf16(sz.N, rng, -1.f, 1.f);
    auto dx = upload_bf16(x), dw = upload_bf16(w), db = upload_bf16(bias);
    std::vector<double> acc(static_cast<size_t>(sz.M) * sz.N);
    for (int m = 0; m < sz.M; ++m)
      for (int n = 0; n < sz.N; ++n) {
        double s = bias.f[n];
        for (int k = 0; k < sz.K; ++k)
          s += static_cast<double>(x.f[static_cast<size_t>(m) * sz.K + k]) * w.f[static_cast<size_t>(n) * sz.K + k];
        acc[static_cast<size_t>(m) * sz.N + n] = s;
      }
    for (VisionEpilogue ep : {VisionEpilogue::kNone, VisionEpilogue::kBias, VisionEpilogue::kBiasGeluTanh}) {
      DevBuf<bf16> y(acc.size());
      y.poison();
      const bf16* b = ep == VisionEpilogue::kNone ? nullptr : db->get();
      ZEST_ASSERT_OK(vision_gemm_epilogue(dx->get(), dw->get(), b, y.get(), sz.M, sz.N, sz.K, ep, nullptr));
      sync_ok();
      std::vector<float> ref(acc.size());
      for (size_t i = 0; i < ref.size(); ++i) {
        const double v = acc[i] - (ep == VisionEpilogue::kNone ? bias.f[i % sz.N] : 0.0);
        ref[i] = static_cast<float>(ep == VisionEpilogue::kBiasGeluTanh
                                        ? 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))
                                        : v);
      }
      ZEST_EXPECT_CLOSE(download_bf16(y), ref, 1e-2);  // bf16 output, fp32 accumulation: <= 1% of max |ref|
    }
  }
  DevBuf<bf16> y(8);
  EXPECT_FALSE(vision_gemm_epilogue(nullptr, y.get(), y.get(), y.get(), 1, 8, 8, VisionEpilogue::kBias, nullptr).is_ok());
  EXPECT_FALSE(vision_gemm_epilogue(y.get(), y.get(), y.get(), y.get(), 0, 8, 8, VisionEpilogue::kBias, nullptr).is_ok());
}

TEST(CudaVision, PatchCoordsPositionEmbeddingAndRotary) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(3);
  const std::vector<Grid> grids = {{1, 6, 10}, {2, 4, 6}, {1, 2, 2}, {1, 14, 2}};
  const int heads = 3, hd = 72, dim = heads * hd, side = 7, half = hd / 2;
  const float theta = 10000.f;
  std::vector<int> prow, pcol;
  block_order_coords(grids, prow, pcol);
  const int N = static_cast<int>(prow.size());
  const auto meta = grid_meta(grids);
  DevBuf<int32_t> dmeta(meta), coords(2 * N);
  DevBuf<float2> cs(static_cast<size_t>(N) * half);
  ZEST_ASSERT_OK(vision_patch_coords(dmeta.get(), static_cast<int>(grids.size()), N, 2, hd, theta, coords.get(),
                                     cs.get(), nullptr));
  sync_ok();
  const auto cg = coords.download();
  for (int r = 0; r < N; ++r) {
    ASSERT_EQ(cg[2 * r], prow[r]) << "row " << r;
    ASSERT_EQ(cg[2 * r + 1], pcol[r]) << "row " << r;
  }

  // Position embedding: bilinear align-corners resampling of a side x side table per image grid.
  auto pe = random_bf16(static_cast<size_t>(N) * dim, rng), bias = random_bf16(dim, rng),
       table = random_bf16(static_cast<size_t>(side) * side * dim, rng);
  auto dpe = upload_bf16(pe), dbias = upload_bf16(bias), dtable = upload_bf16(table);
  DevBuf<float> x(static_cast<size_t>(N) * dim);
  ZEST_ASSERT_OK(vision_pos_embed_add(dpe->get(), dbias->get(), dtable->get(), side, dmeta.get(),
                                      static_cast<int>(grids.size()), coords.get(), x.get(), N, dim, nullptr));
  sync_ok();
  std::vector<float> xref(x.size());
  {
    int r = 0;
    for (const Grid& g : grids)
      for (int k = 0; k < g.t * g.h * g.w; ++k, ++r) {
        const double sr = g.h > 1 ? prow[r] * (side - 1.0) / (g.h - 1.0) : 0.0;
        const double sc = g.w > 1 ? pcol[r] * (side - 1.0) / (g.w - 1.0) : 0.0;
        const int r0 = static_cast<int>(std::floor(sr)), c0 = static_cast<int>(std::floor(sc));
        const int r1 = std::min(r0 + 1, side - 1), c1 = std::min(c0 + 1, side - 1);
        const double fr = sr - r0, fc = sc - c0;
        for (int d = 0; d < dim; ++d) {
          auto P = [&](int a, int b) { return static_cast<double>(table.f[(a * side + b) * dim + d]); };
          const double pos = (1 - fr) * (1 - fc) * P(r0, c0) + (1 - fr) * fc * P(r0, c1) + fr * (1 - fc) * P(r1, c0) +
                             fr * fc * P(r1, c1);
          xref[static_cast<size_t>(r) * dim + d] = static_cast<float>(pe.f[r * dim + d] + bias.f[d] + pos);
        }
      }
  }
  ZEST_EXPECT_CLOSE(x.download(), xref, 1e-5);  // fp32 output: rounding only

  // Rotary on q and k (bias first), v only gets its bias.
  auto qkv = random_bf16(static_cast<size_t>(N) * 3 * dim, rng, -2.f, 2.f), qb = random_bf16(3 * dim, rng);
  auto dqkv = upload_bf16(qkv), dqb = upload_bf16(qb);
  ZEST_ASSERT_OK(vision_qkv_rope(dqkv->get(), dqb->get(), cs.get(), N, heads, hd, nullptr));
  sync_ok();
  std::vector<float> ref(qkv.f.size());
  for (int r = 0; r < N; ++r) {
    const float* in = &qkv.f[static_cast<size_t>(r) * 3 * dim];
    float* out = &ref[static_cast<size_t>(r) * 3 * dim];
    for (int c = 0; c < 3 * dim; ++c) out[c] = in[c] + qb.f[c];
    for (int hh = 0; hh < 2 * heads; ++hh)
      for (int j = 0; j < half; ++j) {
        const int k = j % (half / 2);
        const double ang = (j < half / 2 ? prow[r] : pcol[r]) * std::pow(10000.0, -2.0 * k / half);
        const double a = in[hh * hd + j] + qb.f[hh * hd + j], b = in[hh * hd + j + half] + qb.f[hh * hd + j + half];
        out[hh * hd + j] = static_cast<float>(a * std::cos(ang) - b * std::sin(ang));
        out[hh * hd + j + half] = static_cast<float>(b * std::cos(ang) + a * std::sin(ang));
      }
  }
  ZEST_EXPECT_CLOSE(download_bf16(*dqkv), ref, 1e-2);
}

// Plain double attention per segment and head: out [N, heads * D] and lse [heads, N].
void attention_ref(const std::vector<float>& qkv, int N, int heads, int D, const std::vector<int32_t>& cu,
                   std::vector<float>& out, std::vector<double>& lse) {
  const int H = heads * D, stride = 3 * H;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  out.assign(static_cast<size_t>(N) * H, 0.f);
  lse.assign(static_cast<size_t>(heads) * N, 0.0);
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    for (int h = 0; h < heads; ++h)
      for (int i = cu[s]; i < cu[s + 1]; ++i) {
        std::vector<double> sc;
        double mx = -1e300;
        for (int j = cu[s]; j < cu[s + 1]; ++j) {
          double d = 0;
          for (int e = 0; e < D; ++e)
            d += static_cast<double>(qkv[static_cast<size_t>(i) * stride + h * D + e]) *
                 qkv[static_cast<size_t>(j) * stride + H + h * D + e];
          sc.push_back(d * scale);
          mx = std::max(mx, d * scale);
        }
        double sum = 0;
        for (double& v : sc) sum += (v = std::exp(v - mx));
        lse[static_cast<size_t>(h) * N + i] = mx + std::log(sum);
        for (int e = 0; e < D; ++e) {
          double acc = 0;
          for (int j = cu[s]; j < cu[s + 1]; ++j)
            acc += sc[j - cu[s]] * qkv[static_cast<size_t>(j) * stride + 2 * H + h * D + e];
          out[static_cast<size_t>(i) * H + h * D + e] = static_cast<float>(acc / sum);
        }
      }
}

struct AttnCase {
  std::vector<Grid> grids;
  int heads, D;
};

TEST(CudaVision, VarlenAttentionWithLseAndScores) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(4);
  const std::vector<AttnCase> cases = {
      {{{1, 10, 14}}, 2, 72},                                    // one image, 140 patches (partial tiles)
      {{{1, 6, 10}, {2, 4, 6}, {1, 2, 2}, {1, 18, 10}}, 3, 72},  // several images, a 2-frame video, a 4-patch image
      {{{1, 8, 6}, {1, 4, 2}}, 2, 16},                           // the tiny fixture's head_dim
  };
  for (const AttnCase& c : cases) {
    const auto cu = cu_seqlens(c.grids);
    const int N = cu.back(), H = c.heads * c.D, nseg = static_cast<int>(cu.size()) - 1;
    int max_seq = 0;
    for (int s = 0; s < nseg; ++s) max_seq = std::max(max_seq, cu[s + 1] - cu[s]);
    SCOPED_TRACE("N=" + std::to_string(N) + " D=" + std::to_string(c.D));
    auto qkv = random_bf16(static_cast<size_t>(N) * 3 * H, rng, -1.5f, 1.5f);
    auto dqkv = upload_bf16(qkv);
    DevBuf<int32_t> dcu(cu);
    DevBuf<bf16> out(static_cast<size_t>(N) * H);
    DevBuf<float> lse(static_cast<size_t>(c.heads) * N);
    out.poison();
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.D));
    const bf16* q = dqkv->get();
    ZEST_ASSERT_OK(vision_attention(q, q + H, q + 2 * H, 3 * H, dcu.get(), nseg, max_seq, N, c.heads, c.D, scale,
                                    out.get(), lse.get(), nullptr));
    sync_ok();
    std::vector<float> oref;
    std::vector<double> lref;
    attention_ref(qkv.f, N, c.heads, c.D, cu, oref, lref);
    ZEST_EXPECT_CLOSE(download_bf16(out), oref, 2e-2);  // bf16 P and output
    const auto lg = lse.download();
    for (size_t i = 0; i < lg.size(); ++i) ASSERT_NEAR(lg[i], lref[i], 1e-3) << "lse " << i;  // fp32 logits

    // VisionZip scores from the same q, k and the reference lse: a_j = mean_h sum_i exp(s_ij - lse_hi).
    std::vector<float> lse_in(lref.begin(), lref.end());
    DevBuf<float> dlse(lse_in), tok(N / 4), patch(N);
    tok.poison();
    ZEST_ASSERT_OK(visionzip_scores(q, q + H, 3 * H, dlse.get(), dcu.get(), nseg, max_seq, N, c.heads, c.D, scale, 4,
                                    tok.get(), patch.get(), nullptr));
    sync_ok();
    std::vector<float> aref(N, 0.f), tref(N / 4, 0.f);
    for (int s = 0; s < nseg; ++s)
      for (int j = cu[s]; j < cu[s + 1]; ++j) {
        double acc = 0;
        for (int h = 0; h < c.heads; ++h)
          for (int i = cu[s]; i < cu[s + 1]; ++i) {
            double d = 0;
            for (int e = 0; e < c.D; ++e)
              d += static_cast<double>(qkv.f[static_cast<size_t>(i) * 3 * H + h * c.D + e]) *
                   qkv.f[static_cast<size_t>(j) * 3 * H + H + h * c.D + e];
            acc += std::exp(d * scale - lref[static_cast<size_t>(h) * N + i]);
          }
        aref[j] = static_cast<float>(acc / c.heads);
        tref[j / 4] += aref[j];
      }
    ZEST_EXPECT_CLOSE(patch.download(), aref, 1e-4);  // fp32 exp sums
    ZEST_EXPECT_CLOSE(tok.download(), tref, 1e-4);
    // Deterministic: a second launch gives the same bits.
    DevBuf<float> tok2(N / 4);
    ZEST_ASSERT_OK(visionzip_scores(q, q + H, 3 * H, dlse.get(), dcu.get(), nseg, max_seq, N, c.heads, c.D, scale, 4,
                                    tok2.get(), nullptr, nullptr));
    sync_ok();
    const auto t1 = tok.download(), t2 = tok2.download();
    ASSERT_EQ(0, std::memcmp(t1.data(), t2.data(), t1.size() * sizeof(float)));
  }
}

TEST(CudaVision, GatherRowsAndColumns) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(5);
  const int rows = 50, dim = 72;
  auto src = random_bf16(static_cast<size_t>(rows) * dim, rng);
  std::vector<int32_t> idx = {0, 3, 4, 17, 30, 49};
  auto dsrc = upload_bf16(src);
  DevBuf<int32_t> didx(idx);
  DevBuf<bf16> dst(idx.size() * dim);
  ZEST_ASSERT_OK(visionzip_gather_rows(dsrc->get(), dim, didx.get(), static_cast<int>(idx.size()), dst.get(), nullptr));
  std::vector<int32_t> pos(3 * 60);
  std::iota(pos.begin(), pos.end(), 1000);
  DevBuf<int32_t> dpos(pos), dcols(3 * idx.size());
  ZEST_ASSERT_OK(
      visionzip_gather_columns(dpos.get(), 3, 60, didx.get(), 7, static_cast<int>(idx.size()), dcols.get(), nullptr));
  sync_ok();
  const auto got = download_bf16(dst);
  const auto cols = dcols.download();
  for (size_t n = 0; n < idx.size(); ++n) {
    for (int d = 0; d < dim; ++d) ASSERT_EQ(got[n * dim + d], src.f[idx[n] * dim + d]);
    for (int r = 0; r < 3; ++r) ASSERT_EQ(cols[r * idx.size() + n], pos[r * 60 + idx[n] + 7]);
  }
}

TEST(CudaVision, BadSizesAreErrors) {
  ZEST_REQUIRE_GPU();
  EXPECT_FALSE(
      vision_attention(nullptr, nullptr, nullptr, 216, nullptr, 1, 4, 4, 3, 70, 0.1f, nullptr, nullptr, nullptr)
          .is_ok());
  EXPECT_FALSE(vision_layernorm(nullptr, nullptr, nullptr, nullptr, 0, 16, 1e-6f, nullptr).is_ok());
  EXPECT_FALSE(visionzip_plan({4, 0}, VisionZipSelect{}).ok());
  VisionZipSelect bad;
  bad.rate = 1.5f;
  EXPECT_FALSE(visionzip_plan({4}, bad).ok());
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
