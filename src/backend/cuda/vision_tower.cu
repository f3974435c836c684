// The Qwen3-VL vision tower runner on CUDA (see vision_tower.h).
#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "backend/cuda/vision_tower.h"
#include "core/dtype.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_kernels.h"

namespace zest::cuda {

namespace {

constexpr float kNormEps = 1e-6f;
constexpr float kRopeTheta = 10000.0f;

std::string str(int64_t v) { return std::to_string(v); }

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

Status check_config(const io::VisionConfig& c) {
  if (c.depth <= 0 || c.hidden_size <= 0 || c.num_heads <= 0 || c.intermediate_size <= 0 || c.out_hidden_size <= 0 ||
      c.patch_size <= 0 || c.temporal_patch_size <= 0 || c.spatial_merge_size <= 0 || c.in_channels <= 0)
    return invalid_argument("vision config has a non-positive size");
  if (c.hidden_size % c.num_heads != 0)
    return invalid_argument("vision hidden_size " + str(c.hidden_size) + " is not divisible by num_heads " +
                            str(c.num_heads));
  const int64_t hd = c.hidden_size / c.num_heads;
  if (hd % 8 != 0 || hd > 128)
    return unsupported("vision head_dim " + str(hd) + " is not supported on CUDA (multiples of 8 up to 128)");
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(c.num_position_embeddings))));
  if (c.num_position_embeddings <= 0 || side * side != c.num_position_embeddings)
    return invalid_argument("vision num_position_embeddings " + str(c.num_position_embeddings) +
                            " must be a positive perfect square");
  std::set<int64_t> seen;
  for (int64_t i : c.deepstack_visual_indexes)
    if (i < 0 || i >= c.depth || !seen.insert(i).second)
      return invalid_argument("deepstack_visual_indexes entry " + str(i) + " is out of [0, depth) or repeated");
  if (c.hidden_act != "gelu_pytorch_tanh" && c.hidden_act != "gelu")
    return unsupported("vision hidden_act '" + c.hidden_act + "' is not supported (gelu_pytorch_tanh, gelu)");
  if ((c.hidden_size * 2) % 8 != 0) return unsupported("vision hidden_size must be a multiple of 4");
  return Status::ok();
}

}  // namespace

VisionTowerCuda::~VisionTowerCuda() {
  if (weights_) cudaFree(weights_);
  if (act_) cudaFree(act_);
}

int VisionTowerCuda::in_features() const {
  return static_cast<int>(cfg_.in_channels * cfg_.temporal_patch_size * cfg_.patch_size * cfg_.patch_size);
}

std::vector<VisionTowerCuda::Param> VisionTowerCuda::params() {
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size,
                M = H * cfg_.spatial_merge_size * cfg_.spatial_merge_size;
  const int64_t p = cfg_.patch_size, O = cfg_.out_hidden_size;
  std::vector<Param> ps;
  ps.push_back({"patch_embed.proj.weight", {H, cfg_.in_channels, cfg_.temporal_patch_size, p, p}, &patch_w_, 0});
  ps.push_back({"patch_embed.proj.bias", {H}, &patch_b_, 2});
  ps.push_back({"pos_embed.weight", {cfg_.num_position_embeddings, H}, &pos_, 3});
  for (int64_t b = 0; b < cfg_.depth; ++b) {
    Block& k = blocks_[b];
    const std::string n = "blocks." + str(b) + ".";
    ps.push_back({n + "norm1.weight", {H}, &k.norm1_w, 1});
    ps.push_back({n + "norm1.bias", {H}, &k.norm1_b, 2});
    ps.push_back({n + "norm2.weight", {H}, &k.norm2_w, 1});
    ps.push_back({n + "norm2.bias", {H}, &k.norm2_b, 2});
    ps.push_back({n + "attn.qkv.weight", {3 * H, H}, &k.qkv_w, 0});
    ps.push_back({n + "attn.qkv.bias", {3 * H}, &k.qkv_b, 2});
    ps.push_back({n + "attn.proj.weight", {H, H}, &k.proj_w, 0});
    ps.push_back({n + "attn.proj.bias", {H}, &k.proj_b, 2});
    ps.push_back({n + "mlp.linear_fc1.weight", {I, H}, &k.fc1_w, 0});
    ps.push_back({n + "mlp.linear_fc1.bias", {I}, &k.fc1_b, 2});
    ps.push_back({n + "mlp.linear_fc2.weight", {H, I}, &k.fc2_w, 0});
    ps.push_back({n + "mlp.linear_fc2.bias", {H}, &k.fc2_b, 2});
  }
  auto merger = [&](const std::string& n, Merger& m, int64_t norm_dim) {
    ps.push_back({n + "norm.weight", {norm_dim}, &m.norm_w, 1});
    ps.push_back({n + "norm.bias", {norm_dim}, &m.norm_b, 2});
    ps.push_back({n + "linear_fc1.weight", {M, M}, &m.fc1_w, 0});
    ps.push_back({n + "linear_fc1.bias", {M}, &m.fc1_b, 2});
    ps.push_back({n + "linear_fc2.weight", {O, M}, &m.fc2_w, 0});
    ps.push_back({n + "linear_fc2.bias", {O}, &m.fc2_b, 2});
  };
  merger("merger.", merger_, H);
  for (size_t j = 0; j < deepstack_.size(); ++j) merger("deepstack_merger_list." + str(j) + ".", deepstack_[j], M);
  return ps;
}

Status VisionTowerCuda::init(const io::VisionConfig& cfg) {
  ZEST_RETURN_IF_ERROR(check_config(cfg).with_context("vision config"));
  cfg_ = cfg;
  side_ = static_cast<int>(std::llround(std::sqrt(static_cast<double>(cfg.num_position_embeddings))));
  blocks_.assign(cfg.depth, Block{});
  deepstack_.assign(cfg.deepstack_visual_indexes.size(), Merger{});
  std::vector<Param> ps = params();
  size_t bytes = 0;
  for (const Param& p : ps) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    bytes += align256(static_cast<size_t>(n) * sizeof(bf16));
  }
  ZEST_RETURN_IF_ERROR(cuda_status(cudaMalloc(&weights_, bytes), "vision tower weights"));
  weights_bytes_ = bytes;
  char* base = static_cast<char*>(weights_);
  for (Param& p : ps) {
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    *p.slot = reinterpret_cast<bf16*>(base);
    base += align256(static_cast<size_t>(n) * sizeof(bf16));
  }
  return Status::ok();
}

Result<std::unique_ptr<VisionTowerCuda>> VisionTowerCuda::create_random(const io::VisionConfig& cfg, uint64_t seed) {
  std::unique_ptr<VisionTowerCuda> t(new VisionTowerCuda());
  ZEST_RETURN_IF_ERROR(t->init(cfg));
  uint64_t s = seed;
  for (const Param& p : t->params()) {
    size_t n = 1;
    for (int64_t d : p.shape) n *= static_cast<size_t>(d);
    if (p.kind == 0) {
      size_t fan_in = n / static_cast<size_t>(p.shape[0]);
      const float a = std::sqrt(3.0f / static_cast<float>(fan_in));
      ZEST_RETURN_IF_ERROR(fill_random_bf16(*p.slot, n, ++s, -a, a, nullptr));
    } else if (p.kind == 1) {
      ZEST_RETURN_IF_ERROR(fill_random_bf16(*p.slot, n, ++s, 0.8f, 1.2f, nullptr));
    } else if (p.kind == 2) {
      ZEST_RETURN_IF_ERROR(fill_random_bf16(*p.slot, n, ++s, -0.05f, 0.05f, nullptr));
    } else {
      ZEST_RETURN_IF_ERROR(fill_random_bf16(*p.slot, n, ++s, -0.5f, 0.5f, nullptr));
    }
  }
  ZEST_RETURN_IF_ERROR(cuda_status(cudaDeviceSynchronize(), "vision tower random init"));
  return std::move(t);
}

Result<std::unique_ptr<VisionTowerCuda>> VisionTowerCuda::create_from(const io::VisionConfig& cfg,
                                                                      const TensorSource& source) {
  std::unique_ptr<VisionTowerCuda> t(new VisionTowerCuda());
  ZEST_RETURN_IF_ERROR(t->init(cfg));
  std::vector<uint16_t> staging;
  for (const Param& p : t->params()) {
    ZEST_ASSIGN_OR_RETURN(Tensor host, source(p.name, p.shape));
    int64_t n = 1;
    for (int64_t d : p.shape) n *= d;
    if (host.device() != Device::CPU || host.dtype() != DType::F32 || host.numel() != n)
      return invalid_argument("vision tensor '" + p.name + "' must be a CPU f32 tensor of " + str(n) + " values, got " +
                              host.shape_str());
    staging.resize(static_cast<size_t>(n));
    const float* f = host.data<float>();
    for (int64_t i = 0; i < n; ++i) staging[i] = zest::f32_to_bf16(f[i]);
    ZEST_RETURN_IF_ERROR(cuda_status(cudaMemcpy(*p.slot, staging.data(), n * sizeof(bf16), cudaMemcpyHostToDevice),
                                     "vision tower weight upload"));
  }
  return std::move(t);
}

Status VisionTowerCuda::ensure_buffers(int N, int nseg, int n_images, bool capture) {
  if (N <= cap_N_ && nseg <= cap_seg_ && n_images <= cap_img_ && (!capture || cap_capture_)) return Status::ok();
  if (act_) {
    ZEST_RETURN_IF_ERROR(cuda_status(cudaDeviceSynchronize(), "vision tower buffer growth"));
    cudaFree(act_);
    act_ = nullptr;
  }
  cap_N_ = std::max(N, cap_N_);
  cap_seg_ = std::max(nseg, cap_seg_);
  cap_img_ = std::max(n_images, cap_img_);
  cap_capture_ = cap_capture_ || capture;
  const size_t n = cap_N_, H = cfg_.hidden_size, I = cfg_.intermediate_size, O = cfg_.out_hidden_size;
  const size_t T = n / (cfg_.spatial_merge_size * cfg_.spatial_merge_size), half = head_dim() / 2;
  size_t off = 0;
  std::vector<std::pair<void**, size_t>> parts;
  auto add = [&](void** slot, size_t bytes) { parts.emplace_back(slot, bytes); };
  add(reinterpret_cast<void**>(&x_), n * H * sizeof(float));
  add(reinterpret_cast<void**>(&rope_), n * half * sizeof(float2));
  add(reinterpret_cast<void**>(&u_), n * H * sizeof(bf16));
  add(reinterpret_cast<void**>(&qkv_), n * 3 * H * sizeof(bf16));
  add(reinterpret_cast<void**>(&attn_), n * H * sizeof(bf16));
  add(reinterpret_cast<void**>(&tmp_), n * H * sizeof(bf16));
  add(reinterpret_cast<void**>(&h_), n * std::max(I, H) * sizeof(bf16));
  add(reinterpret_cast<void**>(&embeds_), T * O * sizeof(bf16));
  add(reinterpret_cast<void**>(&coords_), n * 2 * sizeof(int32_t));
  add(reinterpret_cast<void**>(&grids_dev_), cap_img_ * 4 * sizeof(int32_t));
  add(reinterpret_cast<void**>(&cu_dev_), (cap_seg_ + 1) * sizeof(int32_t));
  ds_out_.assign(deepstack_.size(), nullptr);
  for (bf16*& d : ds_out_) add(reinterpret_cast<void**>(&d), T * O * sizeof(bf16));
  if (cap_capture_) {
    add(reinterpret_cast<void**>(&qkv_score_), n * 3 * H * sizeof(bf16));
    add(reinterpret_cast<void**>(&lse_), cfg_.num_heads * n * sizeof(float));
  }
  for (auto& [slot, bytes] : parts) off += align256(bytes);
  ZEST_RETURN_IF_ERROR(cuda_status(cudaMalloc(&act_, off), "vision tower activations"));
  char* base = static_cast<char*>(act_);
  for (auto& [slot, bytes] : parts) {
    *slot = base;
    base += align256(bytes);
  }
  return Status::ok();
}

Status VisionTowerCuda::run_merger(const Merger& m, bool postshuffle, bf16* out, cudaStream_t stream) {
  const int H = static_cast<int>(cfg_.hidden_size),
            unit = static_cast<int>(cfg_.spatial_merge_size * cfg_.spatial_merge_size);
  const int M = H * unit, T = N_ / unit, O = static_cast<int>(cfg_.out_hidden_size);
  // The main merger's per-token LayerNorm was fused into the last block's residual update (u_).
  const bf16* z = u_;
  if (postshuffle) {
    ZEST_RETURN_IF_ERROR(vision_layernorm(x_, m.norm_w, m.norm_b, attn_, T, M, kNormEps, stream));
    z = attn_;
  }
  ZEST_RETURN_IF_ERROR(gemm(z, m.fc1_w, h_, T, M, M, stream));
  ZEST_RETURN_IF_ERROR(vision_bias_gelu(h_, m.fc1_b, T, M, false, stream));
  ZEST_RETURN_IF_ERROR(gemm(h_, m.fc2_w, out, T, O, M, stream));
  return vision_bias_add(out, m.fc2_b, T, O, stream);
}

Status VisionTowerCuda::linear(const bf16* x, const bf16* w, bf16* y, int M, int N, int K, cudaStream_t stream) {
  if (fused_epilogues_) {
    const Status st = vision_gemm_epilogue(x, w, nullptr, y, M, N, K, VisionEpilogue::kNone, stream);
    if (st.code() != ErrorCode::kUnsupported) return st;
  }
  return gemm(x, w, y, M, N, K, stream);
}

Status VisionTowerCuda::qkv_rope(const Block& k, bf16* qkv, cudaStream_t stream) {
  const int n = N_, H = static_cast<int>(cfg_.hidden_size), heads = static_cast<int>(cfg_.num_heads);
  if (fused_epilogues_) {
    // Bias in the GEMM epilogue; the rotary pass then touches q and k only.
    const Status st = vision_gemm_epilogue(u_, k.qkv_w, k.qkv_b, qkv, n, 3 * H, H, VisionEpilogue::kBias, stream);
    if (st.is_ok()) return vision_qkv_rope(qkv, nullptr, rope_, n, heads, head_dim(), stream);
    if (st.code() != ErrorCode::kUnsupported) return st;
  }
  ZEST_RETURN_IF_ERROR(gemm(u_, k.qkv_w, qkv, n, 3 * H, H, stream));
  return vision_qkv_rope(qkv, k.qkv_b, rope_, n, heads, head_dim(), stream);
}

Status VisionTowerCuda::fc1_gelu(const Block& k, cudaStream_t stream) {
  const int n = N_, H = static_cast<int>(cfg_.hidden_size), I = static_cast<int>(cfg_.intermediate_size);
  const bool tanh_gelu = cfg_.hidden_act == "gelu_pytorch_tanh";
  if (fused_epilogues_ && tanh_gelu) {
    const Status st = vision_gemm_epilogue(u_, k.fc1_w, k.fc1_b, h_, n, I, H, VisionEpilogue::kBiasGeluTanh, stream);
    if (st.code() != ErrorCode::kUnsupported) return st;
  }
  ZEST_RETURN_IF_ERROR(gemm(u_, k.fc1_w, h_, n, I, H, stream));
  return vision_bias_gelu(h_, k.fc1_b, n, I, tanh_gelu, stream);
}

Status VisionTowerCuda::forward(const bf16* pixel_values, const std::vector<vision::GridTHW>& grids, int score_layer,
                                cudaStream_t stream) {
  const int64_t m = cfg_.spatial_merge_size, unit = m * m;
  if (grids.empty()) return invalid_argument("vision forward needs at least one image grid");
  if (score_layer < -1 || score_layer >= cfg_.depth)
    return invalid_argument("score layer " + str(score_layer) + " is outside [0, " + str(cfg_.depth) + ") (or -1)");
  int64_t N = 0, nseg = 0, max_seq = 0;
  for (size_t i = 0; i < grids.size(); ++i) {
    const vision::GridTHW& g = grids[i];
    if (g.t < 1 || g.h < m || g.w < m || g.h % m != 0 || g.w % m != 0)
      return invalid_argument("image " + str(static_cast<int64_t>(i)) + " grid (" + str(g.t) + ", " + str(g.h) + ", " +
                              str(g.w) + ") must have t >= 1 and h, w positive multiples of " + str(m));
    N += g.patches();
    nseg += g.t;
    max_seq = std::max(max_seq, g.h * g.w);
  }
  if (N > (int64_t{1} << 26)) return invalid_argument("too many patches for one vision forward: " + str(N));
  const bool capture = score_layer >= 0;
  ZEST_RETURN_IF_ERROR(
      ensure_buffers(static_cast<int>(N), static_cast<int>(nseg), static_cast<int>(grids.size()), capture));
  N_ = static_cast<int>(N);
  const int n_img = static_cast<int>(grids.size());
  host_meta_.clear();
  int64_t row = 0;
  for (const vision::GridTHW& g : grids) {
    host_meta_.insert(host_meta_.end(), {static_cast<int32_t>(row), static_cast<int32_t>(g.t),
                                         static_cast<int32_t>(g.h), static_cast<int32_t>(g.w)});
    row += g.patches();
  }
  host_meta_.push_back(0);
  int64_t acc = 0;
  for (const vision::GridTHW& g : grids)
    for (int64_t t = 0; t < g.t; ++t) {
      acc += g.h * g.w;
      host_meta_.push_back(static_cast<int32_t>(acc));
    }
  ZEST_RETURN_IF_ERROR(cuda_status(
      cudaMemcpyAsync(grids_dev_, host_meta_.data(), n_img * 4 * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
      "vision grids upload"));
  ZEST_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(cu_dev_, host_meta_.data() + n_img * 4, (nseg + 1) * sizeof(int32_t),
                                                   cudaMemcpyHostToDevice, stream),
                                   "vision cu_seqlens upload"));

  const int H = static_cast<int>(cfg_.hidden_size), I = static_cast<int>(cfg_.intermediate_size);
  const int heads = static_cast<int>(cfg_.num_heads), hd = head_dim();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int n = N_;
  ZEST_RETURN_IF_ERROR(
      vision_patch_coords(grids_dev_, n_img, n, static_cast<int>(m), hd, kRopeTheta, coords_, rope_, stream));
  ZEST_RETURN_IF_ERROR(gemm(pixel_values, patch_w_, tmp_, n, H, in_features(), stream));
  ZEST_RETURN_IF_ERROR(vision_pos_embed_add(tmp_, patch_b_, pos_, side_, grids_dev_, n_img, coords_, x_, n, H, stream));
  ZEST_RETURN_IF_ERROR(vision_layernorm(x_, blocks_[0].norm1_w, blocks_[0].norm1_b, u_, n, H, kNormEps, stream));

  const auto& ds = cfg_.deepstack_visual_indexes;
  for (int b = 0; b < cfg_.depth; ++b) {
    const Block& k = blocks_[b];
    const bool cap = b == score_layer;
    bf16* qkv = cap ? qkv_score_ : qkv_;
    ZEST_RETURN_IF_ERROR(qkv_rope(k, qkv, stream));
    ZEST_RETURN_IF_ERROR(vision_attention(qkv, qkv + H, qkv + 2 * H, 3 * H, cu_dev_, static_cast<int>(nseg),
                                          static_cast<int>(max_seq), n, heads, hd, scale, attn_, cap ? lse_ : nullptr,
                                          stream));
    ZEST_RETURN_IF_ERROR(linear(attn_, k.proj_w, tmp_, n, H, H, stream));
    ZEST_RETURN_IF_ERROR(
        vision_residual_layernorm(x_, tmp_, k.proj_b, k.norm2_w, k.norm2_b, u_, n, H, kNormEps, stream));
    ZEST_RETURN_IF_ERROR(fc1_gelu(k, stream));
    ZEST_RETURN_IF_ERROR(linear(h_, k.fc2_w, tmp_, n, H, I, stream));
    const bool last = b + 1 == cfg_.depth;
    const bf16* nw = last ? merger_.norm_w : blocks_[b + 1].norm1_w;
    const bf16* nb = last ? merger_.norm_b : blocks_[b + 1].norm1_b;
    ZEST_RETURN_IF_ERROR(vision_residual_layernorm(x_, tmp_, k.fc2_b, nw, nb, u_, n, H, kNormEps, stream));
    const auto it = std::find(ds.begin(), ds.end(), b);
    if (it != ds.end()) {
      const size_t j = static_cast<size_t>(it - ds.begin());
      ZEST_RETURN_IF_ERROR(run_merger(deepstack_[j], true, ds_out_[j], stream));
    }
  }
  ZEST_RETURN_IF_ERROR(run_merger(merger_, false, embeds_, stream));

  out_ = VisionTowerOutput{};
  out_.embeds = embeds_;
  for (bf16* d : ds_out_) out_.deepstack.push_back(d);
  out_.patches = n;
  out_.tokens = static_cast<int>(N / unit);
  for (const vision::GridTHW& g : grids) out_.tokens_per_image.push_back(g.patches() / unit);
  out_.cu_seqlens = cu_dev_;
  out_.nseg = static_cast<int>(nseg);
  out_.max_seqlen = static_cast<int>(max_seq);
  if (capture) {
    out_.score_layer = score_layer;
    out_.q = qkv_score_;
    out_.k = qkv_score_ + H;
    out_.qkv_stride = 3 * H;
    out_.lse = lse_;
  }
  return Status::ok();
}

Status VisionTowerCuda::scores(float* token_scores, float* patch_scores, cudaStream_t stream) const {
  if (out_.score_layer < 0) return invalid_argument("vision scores need a forward with a score layer");
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim()));
  return visionzip_scores(out_.q, out_.k, out_.qkv_stride, out_.lse, out_.cu_seqlens, out_.nseg, out_.max_seqlen,
                          out_.patches, static_cast<int>(cfg_.num_heads), head_dim(), scale,
                          static_cast<int>(cfg_.spatial_merge_size * cfg_.spatial_merge_size), token_scores,
                          patch_scores, stream);
}

Result<std::vector<VisionTowerCuda::OpTime>> VisionTowerCuda::profile_block(int iters, cudaStream_t stream) {
  if (N_ == 0 || iters < 1) return invalid_argument("profile_block needs a forward first and iters >= 1");
  const int n = N_, H = static_cast<int>(cfg_.hidden_size), I = static_cast<int>(cfg_.intermediate_size);
  const int heads = static_cast<int>(cfg_.num_heads), hd = head_dim();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool tanh_gelu = cfg_.hidden_act == "gelu_pytorch_tanh";
  const Block& k = blocks_[0];
  double attn_flops = 0;
  {
    std::vector<int32_t> cu(out_.nseg + 1);
    ZEST_RETURN_IF_ERROR(cuda_status(
        cudaMemcpy(cu.data(), cu_dev_, cu.size() * sizeof(int32_t), cudaMemcpyDeviceToHost), "profile cu_seqlens"));
    for (int s = 0; s < out_.nseg; ++s) attn_flops += 4.0 * (cu[s + 1] - cu[s]) * double(cu[s + 1] - cu[s]) * H;
  }
  const double dn = n;
  struct Op {
    const char* name;
    double flops;
    std::function<Status()> fn;
  };
  const std::vector<Op> ops = {
      {"qkv GEMM", 2 * dn * H * 3 * H, [&] { return gemm(u_, k.qkv_w, qkv_, n, 3 * H, H, stream); }},
      {"qkv bias + 2-D rotary", 0, [&] { return vision_qkv_rope(qkv_, k.qkv_b, rope_, n, heads, hd, stream); }},
      {"qkv GEMM + bias epilogue (fused)", 2 * dn * H * 3 * H,
       [&] {
         return vision_gemm_epilogue(u_, k.qkv_w, k.qkv_b, qkv_, n, 3 * H, H, VisionEpilogue::kBias, stream);
       }},
      {"2-D rotary of q, k (fused path)", 0,
       [&] { return vision_qkv_rope(qkv_, nullptr, rope_, n, heads, hd, stream); }},
      {"attention", attn_flops,
       [&] {
         return vision_attention(qkv_, qkv_ + H, qkv_ + 2 * H, 3 * H, cu_dev_, out_.nseg, out_.max_seqlen, n, heads, hd,
                                 scale, attn_, nullptr, stream);
       }},
      {"attention + lse", attn_flops,
       [&] {
         return vision_attention(qkv_, qkv_ + H, qkv_ + 2 * H, 3 * H, cu_dev_, out_.nseg, out_.max_seqlen, n, heads, hd,
                                 scale, attn_, lse_, stream);
       }},
      {"proj GEMM", 2 * dn * H * H, [&] { return gemm(attn_, k.proj_w, tmp_, n, H, H, stream); }},
      {"proj GEMM (timed algorithm)", 2 * dn * H * H,
       [&] { return vision_gemm_epilogue(attn_, k.proj_w, nullptr, tmp_, n, H, H, VisionEpilogue::kNone, stream); }},
      {"residual + LayerNorm", 0,
       [&] { return vision_residual_layernorm(x_, tmp_, k.proj_b, k.norm2_w, k.norm2_b, u_, n, H, kNormEps, stream); }},
      {"fc1 GEMM", 2 * dn * H * I, [&] { return gemm(u_, k.fc1_w, h_, n, I, H, stream); }},
      {"bias + GELU", 0, [&] { return vision_bias_gelu(h_, k.fc1_b, n, I, tanh_gelu, stream); }},
      {"fc1 GEMM + bias + GELU epilogue (fused)", 2 * dn * H * I,
       [&] {
         return vision_gemm_epilogue(u_, k.fc1_w, k.fc1_b, h_, n, I, H, VisionEpilogue::kBiasGeluTanh, stream);
       }},
      {"fc2 GEMM", 2 * dn * H * I, [&] { return gemm(h_, k.fc2_w, tmp_, n, H, I, stream); }},
      {"fc2 GEMM (timed algorithm)", 2 * dn * H * I,
       [&] { return vision_gemm_epilogue(h_, k.fc2_w, nullptr, tmp_, n, H, I, VisionEpilogue::kNone, stream); }},
  };
  cudaEvent_t e0, e1;
  ZEST_RETURN_IF_ERROR(cuda_status(cudaEventCreate(&e0), "event"));
  ZEST_RETURN_IF_ERROR(cuda_status(cudaEventCreate(&e1), "event"));
  auto time_op = [&](const Op& op, double* ms) -> Status {
    ZEST_RETURN_IF_ERROR(op.fn());
    cudaEventRecord(e0, stream);
    for (int i = 0; i < iters; ++i) ZEST_RETURN_IF_ERROR(op.fn());
    cudaEventRecord(e1, stream);
    ZEST_RETURN_IF_ERROR(cuda_status(cudaEventSynchronize(e1), "profile sync"));
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    *ms = t / iters;
    return Status::ok();
  };
  std::vector<OpTime> rows;
  for (const Op& op : ops) {
    double ms = 0;
    const Status st = time_op(op, &ms);
    if (st.code() == ErrorCode::kUnsupported) continue;  // a fused form cuBLASLt does not offer
    if (!st.is_ok()) {
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      return st;
    }
    rows.push_back({op.name, ms, op.flops});
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return rows;
}

double VisionTowerCuda::flops(const std::vector<vision::GridTHW>& grids) const {
  const double H = cfg_.hidden_size, I = cfg_.intermediate_size, O = cfg_.out_hidden_size;
  const double unit = static_cast<double>(cfg_.spatial_merge_size * cfg_.spatial_merge_size), M = H * unit;
  double N = 0, attn = 0;
  for (const vision::GridTHW& g : grids) {
    N += static_cast<double>(g.patches());
    const double L = static_cast<double>(g.h * g.w);
    attn += static_cast<double>(g.t) * 4.0 * L * L * H;  // q k^T and p v per frame
  }
  const double T = N / unit;
  const double per_block = 2.0 * N * (3 * H * H + H * H + 2 * H * I) + attn;
  const double mergers = (1.0 + static_cast<double>(deepstack_.size())) * 2.0 * T * (M * M + M * O);
  return 2.0 * N * in_features() * H + cfg_.depth * per_block + mergers;
}

}  // namespace zest::cuda
