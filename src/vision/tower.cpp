#include "vision/tower.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/vision_ops.h"

namespace zest::vision {

namespace {

constexpr float kRopeTheta = 10000.0f;  // Qwen3-VL vision rope_parameters.rope_theta
constexpr float kNormEps = 1e-6f;

std::string str(int64_t v) { return std::to_string(v); }

// Loads one tensor as f32 after checking its shape.
Result<Tensor> load_f32(const io::SafeTensors& st, const std::string& name, const std::vector<int64_t>& shape) {
  ZEST_ASSIGN_OR_RETURN(io::TensorView v, st.get(name, shape));
  return v.to_f32();
}

Status check_config(const io::VisionConfig& c) {
  if (c.depth <= 0 || c.hidden_size <= 0 || c.num_heads <= 0 || c.intermediate_size <= 0 || c.out_hidden_size <= 0 ||
      c.patch_size <= 0 || c.temporal_patch_size <= 0 || c.spatial_merge_size <= 0 || c.in_channels <= 0) {
    return invalid_argument("vision config has a non-positive size (depth, hidden_size, num_heads, "
                            "intermediate_size, out_hidden_size, patch/merge sizes must all be > 0)");
  }
  if (c.hidden_size % c.num_heads != 0 || (c.hidden_size / c.num_heads) % 4 != 0) {
    return invalid_argument("vision hidden_size " + str(c.hidden_size) + " / num_heads " + str(c.num_heads) +
                            " must give a head_dim divisible by 4 (2-D rotary)");
  }
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(c.num_position_embeddings))));
  if (c.num_position_embeddings <= 0 || side * side != c.num_position_embeddings) {
    return invalid_argument("vision num_position_embeddings " + str(c.num_position_embeddings) +
                            " must be a positive perfect square");
  }
  std::set<int64_t> seen;
  for (int64_t i : c.deepstack_visual_indexes) {
    if (i < 0 || i >= c.depth || !seen.insert(i).second) {
      return invalid_argument("deepstack_visual_indexes entry " + str(i) + " is out of [0, depth=" + str(c.depth) +
                              ") or repeated");
    }
  }
  if (c.hidden_act != "gelu_pytorch_tanh" && c.hidden_act != "gelu") {
    return unsupported("vision hidden_act '" + c.hidden_act + "' is not supported (gelu_pytorch_tanh, gelu)");
  }
  return Status::ok();
}

// Patch (row, col) in the un-merged grid for every row of pixel_values (block order, §1.4).
void patch_positions(const std::vector<GridTHW>& grids, int64_t m, std::vector<int64_t>& rows,
                     std::vector<int64_t>& cols) {
  for (const GridTHW& g : grids) {
    for (int64_t t = 0; t < g.t; ++t)
      for (int64_t br = 0; br < g.h / m; ++br)
        for (int64_t bc = 0; bc < g.w / m; ++bc)
          for (int64_t ir = 0; ir < m; ++ir)
            for (int64_t ic = 0; ic < m; ++ic) {
              rows.push_back(br * m + ir);
              cols.push_back(bc * m + ic);
            }
  }
}

// Bilinear (align-corners) taps of one axis, as transformers' _interpolation_axis_taps_weights.
void axis_taps(int64_t index, int64_t size, int64_t side, int64_t taps[2], float weights[2]) {
  const float src = static_cast<float>(index) * static_cast<float>(side - 1) /
                    static_cast<float>(std::max<int64_t>(size - 1, 1));
  const float fl = std::floor(src);
  for (int o = 0; o < 2; ++o) {
    taps[o] = std::clamp<int64_t>(static_cast<int64_t>(fl) + o, 0, side - 1);
    weights[o] = std::max(0.0f, 1.0f - std::abs(src - fl - static_cast<float>(o)));
  }
}

}  // namespace

Result<VisionTower> VisionTower::load(const io::SafeTensors& st, const io::VisionConfig& cfg,
                                      const std::string& prefix) {
  ZEST_RETURN_IF_ERROR(check_config(cfg).with_context("vision config"));
  VisionTower t;
  t.cfg_ = cfg;
  t.pos_side_ = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(cfg.num_position_embeddings))));
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, M = H * cfg.spatial_merge_size * cfg.spatial_merge_size;
  const int64_t p = cfg.patch_size;
  ZEST_ASSIGN_OR_RETURN(Tensor pw, load_f32(st, prefix + "patch_embed.proj.weight",
                                            {H, cfg.in_channels, cfg.temporal_patch_size, p, p}));
  t.patch_w_ = pw.reshape({H, cfg.in_channels * cfg.temporal_patch_size * p * p});
  ZEST_ASSIGN_OR_RETURN(t.patch_b_, load_f32(st, prefix + "patch_embed.proj.bias", {H}));
  ZEST_ASSIGN_OR_RETURN(t.pos_embed_, load_f32(st, prefix + "pos_embed.weight", {cfg.num_position_embeddings, H}));
  for (int64_t b = 0; b < cfg.depth; ++b) {
    const std::string n = prefix + "blocks." + str(b) + ".";
    Block blk;
    ZEST_ASSIGN_OR_RETURN(blk.norm1_w, load_f32(st, n + "norm1.weight", {H}));
    ZEST_ASSIGN_OR_RETURN(blk.norm1_b, load_f32(st, n + "norm1.bias", {H}));
    ZEST_ASSIGN_OR_RETURN(blk.norm2_w, load_f32(st, n + "norm2.weight", {H}));
    ZEST_ASSIGN_OR_RETURN(blk.norm2_b, load_f32(st, n + "norm2.bias", {H}));
    ZEST_ASSIGN_OR_RETURN(blk.qkv_w, load_f32(st, n + "attn.qkv.weight", {3 * H, H}));
    ZEST_ASSIGN_OR_RETURN(blk.qkv_b, load_f32(st, n + "attn.qkv.bias", {3 * H}));
    ZEST_ASSIGN_OR_RETURN(blk.proj_w, load_f32(st, n + "attn.proj.weight", {H, H}));
    ZEST_ASSIGN_OR_RETURN(blk.proj_b, load_f32(st, n + "attn.proj.bias", {H}));
    ZEST_ASSIGN_OR_RETURN(blk.fc1_w, load_f32(st, n + "mlp.linear_fc1.weight", {I, H}));
    ZEST_ASSIGN_OR_RETURN(blk.fc1_b, load_f32(st, n + "mlp.linear_fc1.bias", {I}));
    ZEST_ASSIGN_OR_RETURN(blk.fc2_w, load_f32(st, n + "mlp.linear_fc2.weight", {H, I}));
    ZEST_ASSIGN_OR_RETURN(blk.fc2_b, load_f32(st, n + "mlp.linear_fc2.bias", {H}));
    t.blocks_.push_back(std::move(blk));
  }
  auto load_merger = [&](const std::string& n, bool postshuffle) -> Result<Merger> {
    Merger m;
    m.postshuffle_norm = postshuffle;
    const int64_t norm_dim = postshuffle ? M : H;
    ZEST_ASSIGN_OR_RETURN(m.norm_w, load_f32(st, n + "norm.weight", {norm_dim}));
    ZEST_ASSIGN_OR_RETURN(m.norm_b, load_f32(st, n + "norm.bias", {norm_dim}));
    ZEST_ASSIGN_OR_RETURN(m.fc1_w, load_f32(st, n + "linear_fc1.weight", {M, M}));
    ZEST_ASSIGN_OR_RETURN(m.fc1_b, load_f32(st, n + "linear_fc1.bias", {M}));
    ZEST_ASSIGN_OR_RETURN(m.fc2_w, load_f32(st, n + "linear_fc2.weight", {cfg.out_hidden_size, M}));
    ZEST_ASSIGN_OR_RETURN(m.fc2_b, load_f32(st, n + "linear_fc2.bias", {cfg.out_hidden_size}));
    return m;
  };
  ZEST_ASSIGN_OR_RETURN(t.merger_, load_merger(prefix + "merger.", false));
  for (size_t j = 0; j < cfg.deepstack_visual_indexes.size(); ++j) {
    ZEST_ASSIGN_OR_RETURN(Merger m, load_merger(prefix + "deepstack_merger_list." + str(j) + ".", true));
    t.deepstack_.push_back(std::move(m));
  }
  return t;
}

Tensor VisionTower::run_merger(const Merger& m, const float* x, int64_t n) const {
  const int64_t H = cfg_.hidden_size, unit = cfg_.spatial_merge_size * cfg_.spatial_merge_size, M = H * unit;
  const int64_t rows = n / unit;
  std::vector<float> z(static_cast<size_t>(n * H));
  if (m.postshuffle_norm) {
    cpu::layernorm(z.data(), x, m.norm_w.data<float>(), m.norm_b.data<float>(), rows, M, kNormEps);
  } else {
    cpu::layernorm(z.data(), x, m.norm_w.data<float>(), m.norm_b.data<float>(), n, H, kNormEps);
  }
  std::vector<float> h(static_cast<size_t>(rows * M));
  cpu::linear(h.data(), z.data(), m.fc1_w.data<float>(), m.fc1_b.data<float>(), rows, M, M);
  cpu::gelu_erf_inplace(h.data(), rows * M);
  Tensor out = Tensor::empty({rows, cfg_.out_hidden_size});
  cpu::linear(out.data<float>(), h.data(), m.fc2_w.data<float>(), m.fc2_b.data<float>(), rows, cfg_.out_hidden_size, M);
  return out;
}

Result<VisionOutput> VisionTower::forward(const Tensor& pixel_values, const std::vector<GridTHW>& grids,
                                          std::optional<int64_t> score_layer) const {
  const int64_t H = cfg_.hidden_size, heads = cfg_.num_heads, hd = head_dim(), I = cfg_.intermediate_size;
  const int64_t m = cfg_.spatial_merge_size, unit = m * m;
  const int64_t in_cols = cfg_.in_channels * cfg_.temporal_patch_size * cfg_.patch_size * cfg_.patch_size;
  if (grids.empty()) return invalid_argument("vision forward needs at least one image grid");
  if (pixel_values.device() != Device::CPU || pixel_values.dtype() != DType::F32 || pixel_values.ndim() != 2 ||
      pixel_values.dim(1) != in_cols) {
    return invalid_argument("pixel_values must be a CPU f32 [patches, " + str(in_cols) + "] tensor, got " +
                            pixel_values.shape_str() + " " + dtype_name(pixel_values.dtype()));
  }
  int64_t N = 0;
  for (size_t i = 0; i < grids.size(); ++i) {
    const GridTHW& g = grids[i];
    if (g.t < 1 || g.h < m || g.w < m || g.h % m != 0 || g.w % m != 0) {
      return invalid_argument("image " + str(static_cast<int64_t>(i)) + " grid (" + str(g.t) + ", " + str(g.h) +
                              ", " + str(g.w) + ") must have t >= 1 and h, w positive multiples of " + str(m));
    }
    N += g.patches();
  }
  if (N != pixel_values.dim(0)) {
    return invalid_argument("pixel_values has " + str(pixel_values.dim(0)) + " rows but the grids describe " +
                            str(N) + " patches");
  }
  if (score_layer && (*score_layer < 0 || *score_layer >= cfg_.depth)) {
    return invalid_argument("score layer " + str(*score_layer) + " is outside [0, " + str(cfg_.depth) + ")");
  }

  // Patch embedding (Conv3d with kernel == stride, as one matrix).
  std::vector<float> x(static_cast<size_t>(N * H));
  cpu::linear(x.data(), pixel_values.data<float>(), patch_w_.data<float>(), patch_b_.data<float>(), N, H, in_cols);

  // Learned position embedding, bilinearly resampled per image, and 2-D rotary tables.
  std::vector<int64_t> prow, pcol;
  patch_positions(grids, m, prow, pcol);
  {
    const float* P = pos_embed_.data<float>();
    int64_t r = 0;
    for (const GridTHW& g : grids) {
      for (int64_t k = 0; k < g.patches(); ++k, ++r) {
        int64_t th[2], tw[2];
        float wh[2], ww[2];
        axis_taps(prow[r], g.h, pos_side_, th, wh);
        axis_taps(pcol[r], g.w, pos_side_, tw, ww);
        float* xr = x.data() + r * H;
        for (int64_t d = 0; d < H; ++d) {
          float acc = 0.0f;
          for (int a = 0; a < 2; ++a)
            for (int b = 0; b < 2; ++b) acc += P[(th[a] * pos_side_ + tw[b]) * H + d] * (wh[a] * ww[b]);
          xr[d] += acc;
        }
      }
    }
  }
  const int64_t half = hd / 2, quarter = hd / 4;
  std::vector<float> cos_t(static_cast<size_t>(N * half)), sin_t(static_cast<size_t>(N * half));
  {
    std::vector<float> inv_freq(quarter);
    for (int64_t k = 0; k < quarter; ++k) {
      inv_freq[k] = 1.0f / std::pow(kRopeTheta, static_cast<float>(2 * k) / static_cast<float>(half));
    }
    for (int64_t r = 0; r < N; ++r) {
      for (int64_t k = 0; k < quarter; ++k) {
        const float ah = static_cast<float>(prow[r]) * inv_freq[k];
        const float aw = static_cast<float>(pcol[r]) * inv_freq[k];
        cos_t[r * half + k] = std::cos(ah);
        sin_t[r * half + k] = std::sin(ah);
        cos_t[r * half + quarter + k] = std::cos(aw);
        sin_t[r * half + quarter + k] = std::sin(aw);
      }
    }
  }

  VisionOutput out;
  out.grids = grids;
  if (score_layer) {
    AttentionCapture cap;
    cap.layer = *score_layer;
    out.attention = std::move(cap);
  }
  std::vector<float> u(static_cast<size_t>(N * H)), qkv(static_cast<size_t>(N * 3 * H));
  std::vector<float> q(static_cast<size_t>(N * H)), k(static_cast<size_t>(N * H)), v(static_cast<size_t>(N * H));
  std::vector<float> attn(static_cast<size_t>(N * H)), mlp(static_cast<size_t>(N * I));
  std::vector<float> seg_lse;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool tanh_gelu = cfg_.hidden_act == "gelu_pytorch_tanh";

  for (int64_t b = 0; b < cfg_.depth; ++b) {
    const Block& blk = blocks_[b];
    cpu::layernorm(u.data(), x.data(), blk.norm1_w.data<float>(), blk.norm1_b.data<float>(), N, H, kNormEps);
    cpu::linear(qkv.data(), u.data(), blk.qkv_w.data<float>(), blk.qkv_b.data<float>(), N, 3 * H, H);
    for (int64_t r = 0; r < N; ++r) {
      std::memcpy(q.data() + r * H, qkv.data() + r * 3 * H, sizeof(float) * H);
      std::memcpy(k.data() + r * H, qkv.data() + r * 3 * H + H, sizeof(float) * H);
      std::memcpy(v.data() + r * H, qkv.data() + r * 3 * H + 2 * H, sizeof(float) * H);
    }
    cpu::rope_rotate_half(q.data(), cos_t.data(), sin_t.data(), N, heads, hd);
    cpu::rope_rotate_half(k.data(), cos_t.data(), sin_t.data(), N, heads, hd);
    const bool capture = score_layer && *score_layer == b;
    int64_t off = 0;
    for (const GridTHW& g : grids) {
      const int64_t seg = g.h * g.w, rows = g.patches();
      Tensor img_lse;
      if (capture) {
        img_lse = Tensor::empty({heads, rows});
        Tensor qi = Tensor::empty({rows, heads, hd}), ki = Tensor::empty({rows, heads, hd});
        std::memcpy(qi.data<float>(), q.data() + off * H, sizeof(float) * rows * H);
        std::memcpy(ki.data<float>(), k.data() + off * H, sizeof(float) * rows * H);
        out.attention->q.push_back(std::move(qi));
        out.attention->k.push_back(std::move(ki));
        seg_lse.resize(static_cast<size_t>(heads * seg));
      }
      for (int64_t t = 0; t < g.t; ++t) {
        const int64_t s0 = off + t * seg;
        cpu::segment_attention(attn.data() + s0 * H, q.data() + s0 * H, k.data() + s0 * H, v.data() + s0 * H, seg,
                               heads, hd, scale, capture ? seg_lse.data() : nullptr);
        if (capture) {
          for (int64_t h = 0; h < heads; ++h) {
            std::memcpy(img_lse.data<float>() + h * rows + t * seg, seg_lse.data() + h * seg, sizeof(float) * seg);
          }
        }
      }
      if (capture) out.attention->lse.push_back(std::move(img_lse));
      off += rows;
    }
    cpu::linear(u.data(), attn.data(), blk.proj_w.data<float>(), blk.proj_b.data<float>(), N, H, H);
    cpu::add_inplace(x.data(), u.data(), N * H);
    cpu::layernorm(u.data(), x.data(), blk.norm2_w.data<float>(), blk.norm2_b.data<float>(), N, H, kNormEps);
    cpu::linear(mlp.data(), u.data(), blk.fc1_w.data<float>(), blk.fc1_b.data<float>(), N, I, H);
    if (tanh_gelu) {
      cpu::gelu_tanh_inplace(mlp.data(), N * I);
    } else {
      cpu::gelu_erf_inplace(mlp.data(), N * I);
    }
    cpu::linear(u.data(), mlp.data(), blk.fc2_w.data<float>(), blk.fc2_b.data<float>(), N, H, I);
    cpu::add_inplace(x.data(), u.data(), N * H);
    const auto& ds = cfg_.deepstack_visual_indexes;
    const auto it = std::find(ds.begin(), ds.end(), b);
    if (it != ds.end()) out.deepstack.push_back(run_merger(deepstack_[it - ds.begin()], x.data(), N));
  }
  out.embeds = run_merger(merger_, x.data(), N);
  for (const GridTHW& g : grids) out.tokens_per_image.push_back(g.patches() / unit);
  return out;
}

}  // namespace zest::vision
