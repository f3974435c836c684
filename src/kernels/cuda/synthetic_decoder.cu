// Synthetic Qwen3-shaped decoder for benchmarks: random weights on device, a filled paged KV cache, and a
// decode step made only of zest CUDA kernels, captured into one CUDA graph per (batch, SERE on/off).
#include "kernels/cuda/synthetic_decoder.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "kernels/cuda/common.cuh"

namespace zest::cuda {

namespace {

constexpr float kEps = 1e-6f;

__global__ void advance_inputs_kernel(int32_t* __restrict__ ids, int32_t* __restrict__ counter, int batch, int vocab) {
  pdl_wait();
  const uint32_t step = static_cast<uint32_t>(*counter);
  for (int b = threadIdx.x; b < batch; b += blockDim.x) {
    uint32_t z = step * 2654435761u ^ (static_cast<uint32_t>(b) * 2246822519u + 374761393u);
    z ^= z >> 15;
    z *= 2246822519u;
    z ^= z >> 13;
    z *= 3266489917u;
    z ^= z >> 16;
    ids[b] = static_cast<int32_t>(z % static_cast<uint32_t>(vocab));
  }
  __syncthreads();
  if (threadIdx.x == 0) *counter = static_cast<int32_t>(step + 1);
}

#define ZEST_CU(expr, what) ZEST_RETURN_IF_ERROR(cuda_status((expr), what))

}  // namespace

SyntheticDecoder::~SyntheticDecoder() {
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g);
  for (void* p : allocations_) cudaFree(p);
  if (stream_) cudaStreamDestroy(stream_);
}

Result<std::unique_ptr<SyntheticDecoder>> SyntheticDecoder::create(const SyntheticConfig& cfg,
                                                                   const SyntheticOptions& opt) {
  std::unique_ptr<SyntheticDecoder> d(new SyntheticDecoder());
  ZEST_RETURN_IF_ERROR(d->init(cfg, opt));
  return Result<std::unique_ptr<SyntheticDecoder>>(std::move(d));
}

bf16* SyntheticDecoder::carve(size_t elems) {
  const size_t bytes = (elems * sizeof(bf16) + 255) / 256 * 256;
  bf16* p = reinterpret_cast<bf16*>(arena_ + arena_used_);
  arena_used_ += bytes;
  return p;
}

Status SyntheticDecoder::init(const SyntheticConfig& cfg, const SyntheticOptions& opt) {
  cfg_ = cfg;
  opt_ = opt;
  if (opt.max_batch <= 0 || opt.context < 0) return invalid_argument("batch must be positive and context >= 0");
  const bool moe = cfg.experts > 0;
  const size_t H = cfg.hidden, D = cfg.head_dim, Hq = cfg.q_heads, Hkv = cfg.kv_heads, E = cfg.experts;
  const size_t I = moe ? cfg.expert_inter : cfg.dense_inter;
  const size_t QKV = (Hq + 2 * Hkv) * D;
  blocks_per_seq_ = (opt.context + 1 + kKvBlock - 1) / kKvBlock;
  const size_t kv_elems = static_cast<size_t>(opt.max_batch) * blocks_per_seq_ * kKvBlock * Hkv * D;
  auto r256 = [](size_t elems) { return (elems * 2 + 255) / 256 * 256; };
  size_t per_layer = r256(H) * 2 + r256(D) * 2 + r256(QKV * H) + r256(H * Hq * D) + 2 * r256(kv_elems);
  if (moe) per_layer += r256(E * H) + r256(E * 2 * I * H) + r256(E * H * I) + r256(2 * E) + r256(2 * E * E);
  else per_layer += r256(2 * I * H) + r256(H * I);
  arena_size_ = per_layer * cfg.layers + 2 * r256(static_cast<size_t>(cfg.vocab) * H) + r256(H);
  size_t free_b = 0, total_b = 0;
  ZEST_CU(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  if (arena_size_ + (2ull << 30) > free_b)
    return resource_exhausted("synthetic model '" + cfg.name + "' needs " + std::to_string(arena_size_ >> 30) +
                              " GiB but the GPU has " + std::to_string(free_b >> 30) +
                              " GiB free; lower --layers, --batch or --context");
  ZEST_CU(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  void* arena = nullptr;
  ZEST_CU(cudaMalloc(&arena, arena_size_), "cudaMalloc(model)");
  allocations_.push_back(arena);
  arena_ = static_cast<char*>(arena);

  uint64_t seed = opt.seed * 1000003ull;
  auto fill = [&](bf16* p, size_t n, float lo, float hi) { return fill_random_bf16(p, n, ++seed, lo, hi, stream_); };
  std::mt19937_64 rng(opt.seed);
  std::uniform_real_distribution<float> uni(0.f, 1.f);
  std::vector<float> host_bias(E), host_sim(E * E);
  layers_.resize(cfg.layers);
  for (Layer& L : layers_) {
    L = Layer{};
    L.in_norm = carve(H);
    L.post_norm = carve(H);
    L.q_norm = carve(D);
    L.k_norm = carve(D);
    L.wqkv = carve(QKV * H);
    L.wo = carve(H * Hq * D);
    L.k_cache = carve(kv_elems);
    L.v_cache = carve(kv_elems);
    ZEST_RETURN_IF_ERROR(fill(L.in_norm, H, 0.9f, 1.1f));
    ZEST_RETURN_IF_ERROR(fill(L.post_norm, H, 0.9f, 1.1f));
    ZEST_RETURN_IF_ERROR(fill(L.q_norm, D, 0.9f, 1.1f));
    ZEST_RETURN_IF_ERROR(fill(L.k_norm, D, 0.9f, 1.1f));
    const float a_h = std::sqrt(3.f / H), a_o = std::sqrt(3.f / (Hq * D)), a_i = std::sqrt(3.f / I);
    ZEST_RETURN_IF_ERROR(fill(L.wqkv, QKV * H, -a_h, a_h));
    ZEST_RETURN_IF_ERROR(fill(L.wo, H * Hq * D, -a_o, a_o));
    ZEST_RETURN_IF_ERROR(fill(L.k_cache, kv_elems, -1.f, 1.f));
    ZEST_RETURN_IF_ERROR(fill(L.v_cache, kv_elems, -1.f, 1.f));
    if (moe) {
      L.router = carve(E * H);
      L.gate_up = carve(E * 2 * I * H);
      L.down = carve(E * H * I);
      L.router_bias = reinterpret_cast<float*>(carve(2 * E));
      L.sim = reinterpret_cast<float*>(carve(2 * E * E));
      ZEST_RETURN_IF_ERROR(fill(L.router, E * H, -a_h, a_h));
      ZEST_RETURN_IF_ERROR(fill(L.gate_up, E * 2 * I * H, -a_h, a_h));
      ZEST_RETURN_IF_ERROR(fill(L.down, E * H * I, -a_i, a_i));
      // Zipf-like popularity: a random rank per expert, bias = -skew * ln(rank + 1).
      std::vector<int> rank(E);
      std::iota(rank.begin(), rank.end(), 0);
      std::shuffle(rank.begin(), rank.end(), rng);
      for (size_t e = 0; e < E; ++e) host_bias[e] = -opt.skew * std::log(static_cast<float>(rank[e] + 1));
      for (size_t u = 0; u < E; ++u) {
        host_sim[u * E + u] = 1.f;
        for (size_t v = u + 1; v < E; ++v) host_sim[u * E + v] = host_sim[v * E + u] = uni(rng);
      }
      ZEST_CU(cudaMemcpyAsync(L.router_bias, host_bias.data(), E * 4, cudaMemcpyHostToDevice, stream_), "bias copy");
      ZEST_CU(cudaMemcpyAsync(L.sim, host_sim.data(), E * E * 4, cudaMemcpyHostToDevice, stream_), "sim copy");
      ZEST_CU(cudaStreamSynchronize(stream_), "sync");
    } else {
      L.gate_up = carve(2 * I * H);
      L.down = carve(H * I);
      ZEST_RETURN_IF_ERROR(fill(L.gate_up, 2 * I * H, -a_h, a_h));
      ZEST_RETURN_IF_ERROR(fill(L.down, H * I, -a_i, a_i));
    }
  }
  embed_ = carve(static_cast<size_t>(cfg.vocab) * H);
  lm_head_ = carve(static_cast<size_t>(cfg.vocab) * H);
  final_norm_ = carve(H);
  ZEST_RETURN_IF_ERROR(fill(embed_, static_cast<size_t>(cfg.vocab) * H, -1.f, 1.f));
  ZEST_RETURN_IF_ERROR(fill(lm_head_, static_cast<size_t>(cfg.vocab) * H, -std::sqrt(3.f / H), std::sqrt(3.f / H)));
  ZEST_RETURN_IF_ERROR(fill(final_norm_, H, 0.9f, 1.1f));

  // Step buffers, sized for max_batch.
  const size_t B = opt.max_batch, K = moe ? cfg.top_k : 1;
  auto dev = [&](size_t bytes, auto** out) -> Status {
    void* p = nullptr;
    ZEST_CU(cudaMalloc(&p, std::max<size_t>(bytes, 256)), "cudaMalloc(step buffer)");
    allocations_.push_back(p);
    *out = static_cast<std::remove_reference_t<decltype(*out)>>(p);
    return Status::ok();
  };
  ZEST_RETURN_IF_ERROR(dev(B * 4, &ids_));
  ZEST_RETURN_IF_ERROR(dev(B * 4, &out_ids_));
  ZEST_RETURN_IF_ERROR(dev(3 * B * 4, &pos_));
  ZEST_RETURN_IF_ERROR(dev(B * 4, &slots_));
  ZEST_RETURN_IF_ERROR(dev(B * blocks_per_seq_ * 4, &block_table_));
  ZEST_RETURN_IF_ERROR(dev(B * 4, &ctx_lens_));
  ZEST_RETURN_IF_ERROR(dev(B * K * 4, &route_ids_));
  ZEST_RETURN_IF_ERROR(dev(4, &step_counter_));
  ZEST_RETURN_IF_ERROR(dev(B * K * 4, &route_w_));
  ZEST_RETURN_IF_ERROR(dev(B * K * H * 4, &slot_out_));
  ZEST_RETURN_IF_ERROR(dev(B * H * 2, &x_));
  ZEST_RETURN_IF_ERROR(dev(B * H * 2, &xn_));
  ZEST_RETURN_IF_ERROR(dev(B * QKV * 2, &qkv_));
  ZEST_RETURN_IF_ERROR(dev(B * Hq * D * 2, &attn_));
  ZEST_RETURN_IF_ERROR(dev(B * H * 2, &o_));
  ZEST_RETURN_IF_ERROR(dev(B * std::max<size_t>(E, 1) * 2, &router_logits_));
  ZEST_RETURN_IF_ERROR(dev(B * K * I * 2, &h_));
  ZEST_RETURN_IF_ERROR(dev(moe ? 256 : B * 2 * I * 2, &gu_));
  ZEST_RETURN_IF_ERROR(dev(B * static_cast<size_t>(cfg.vocab) * 2, &logits_));
  ZEST_RETURN_IF_ERROR(dev(cfg.layers * sizeof(int64_t), &expert_counts_));
  if (moe) {
    ZEST_RETURN_IF_ERROR(dev(moe_plan_bytes(opt.max_batch, cfg.top_k, cfg.experts), &plan_buf_));
    moe_plan_bind(plan_, plan_buf_, opt.max_batch, cfg.top_k, cfg.experts);
  }
  ZEST_RETURN_IF_ERROR(dev(4, &combine_done_));
  ZEST_CU(cudaMemsetAsync(combine_done_, 0, 4, stream_), "memset");
  ZEST_CU(cudaMemsetAsync(step_counter_, 0, 4, stream_), "memset");
  ZEST_CU(cudaMemsetAsync(expert_counts_, 0, cfg.layers * sizeof(int64_t), stream_), "memset");

  // Sequence b owns blocks [b * bps, (b + 1) * bps); the new token sits at position `context`.
  std::vector<int32_t> bt(B * blocks_per_seq_), pos(3 * B, opt.context), slots(B), lens(B, opt.context + 1);
  for (size_t b = 0; b < B; ++b) {
    for (int i = 0; i < blocks_per_seq_; ++i) bt[b * blocks_per_seq_ + i] = static_cast<int32_t>(b * blocks_per_seq_ + i);
    slots[b] = bt[b * blocks_per_seq_ + opt.context / kKvBlock] * kKvBlock + opt.context % kKvBlock;
  }
  ZEST_CU(cudaMemcpyAsync(block_table_, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice, stream_), "copy");
  ZEST_CU(cudaMemcpyAsync(pos_, pos.data(), pos.size() * 4, cudaMemcpyHostToDevice, stream_), "copy");
  ZEST_CU(cudaMemcpyAsync(slots_, slots.data(), slots.size() * 4, cudaMemcpyHostToDevice, stream_), "copy");
  ZEST_CU(cudaMemcpyAsync(ctx_lens_, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice, stream_), "copy");
  ZEST_CU(cudaStreamSynchronize(stream_), "model init");
  return Status::ok();
}

Status SyntheticDecoder::enqueue_step(int batch, bool sere) {
  if (batch <= 0 || batch > opt_.max_batch)
    return invalid_argument("batch " + std::to_string(batch) + " outside [1, " + std::to_string(opt_.max_batch) + "]");
  const SyntheticConfig& c = cfg_;
  const bool moe = c.experts > 0;
  const int H = c.hidden, D = c.head_dim, QKV = (c.q_heads + 2 * c.kv_heads) * D;
  cudaStream_t s = stream_;
  RopeParams rope;
  rope.theta = c.rope_theta;
  if (c.mrope) {
    rope.section_h = 20;
    rope.section_w = 20;
  }
  DecodeAttention ap;
  ap.batch = batch;
  ap.q_heads = c.q_heads;
  ap.kv_heads = c.kv_heads;
  ap.head_dim = D;
  ap.max_context = opt_.context + 1;
  ap.max_blocks = blocks_per_seq_;
  ap.scale = 1.f / std::sqrt(static_cast<float>(D));

  void*& ws = attn_ws_[batch];
  if (!ws) {  // first step of this batch size: always an eager step, outside any graph capture
    const size_t bytes = decode_attention_workspace_bytes(ap);
    ZEST_CU(cudaMalloc(&ws, bytes), "cudaMalloc(attention workspace)");
    allocations_.push_back(ws);
    ZEST_CU(cudaMemsetAsync(ws, 0, bytes, s), "memset");
  }
  auto mark = [&](const char* label) {
    if (!profile_) return;
    cudaEvent_t e = nullptr;
    cudaEventCreate(&e);
    cudaEventRecord(e, s);
    marks_.emplace_back(label, e);
  };
  // Runs one operation unless it is the ablated one, then marks it.
  auto op = [&](const char* label, auto&& fn) -> Status {
    if (skip_ != label) ZEST_RETURN_IF_ERROR(fn());
    mark(label);
    return Status::ok();
  };
#define ZEST_OP(label, expr) ZEST_RETURN_IF_ERROR(op(label, [&]() -> Status { return (expr); }))
  ZEST_OP("inputs", launch("advance_inputs", advance_inputs_kernel, dim3(1), dim3(256), 0, s, ids_, step_counter_,
                            batch, c.vocab));
  ZEST_OP("embedding", embedding(ids_, embed_, x_, batch, H, c.vocab, s));
  // One token (moe_down_rows_on): the experts' down kernel adds the slots to x by output rows and every qkv GEMM, the
  // first one included, normalises x itself (the final norm runs before the lm_head).
  const bool rows = moe && batch == 1 && moe_down_rows_on(1, c.top_k, c.experts, H, c.expert_inter) && gemm_kv_norm_ok(1, QKV, H);
  if (!rows) ZEST_OP("rmsnorm", rmsnorm(x_, layers_[0].in_norm, xn_, batch, H, kEps, s));
  for (int l = 0; l < c.layers; ++l) {
    const Layer& L = layers_[l];
    const bf16* next_norm = l + 1 < c.layers ? layers_[l + 1].in_norm : final_norm_;
    // The qkv GEMM may prefetch this layer's KV rows into L2 (gemm_kv_prefetch).
    KvPrefetch kvp;
    kvp.k_cache = L.k_cache;
    kvp.v_cache = L.v_cache;
    kvp.block_table = block_table_;
    kvp.context_lens = ctx_lens_;
    kvp.batch = batch;
    kvp.max_blocks = blocks_per_seq_;
    kvp.row_bytes = c.kv_heads * D * 2;
    if (rows) {
      kvp.norm_w = L.in_norm;
      kvp.norm_eps = kEps;
    }
    ZEST_OP("qkv gemm", gemm_kv_prefetch(rows ? x_ : xn_, L.wqkv, qkv_, batch, QKV, H, kvp, s));
    const int pos_stride = c.mrope ? opt_.max_batch : 0;
    if (decode_attention_fused_ok(ap, qkv_, QKV)) {
      ZEST_OP("decode attention (fused)",
              decode_attention_fused(ap, qkv_, QKV, L.q_norm, L.k_norm, pos_, pos_stride, rope, slots_, L.k_cache,
                                     L.v_cache, block_table_, ctx_lens_, attn_, ws, kEps, s));
    } else {
      ZEST_OP("qk norm + rope + kv", qk_norm_rope_kv(qkv_, L.q_norm, L.k_norm, pos_, pos_stride, rope, slots_,
                                                     L.k_cache, L.v_cache, batch, c.q_heads, c.kv_heads, D, kEps, s));
      ZEST_OP("decode attention",
              decode_attention(ap, qkv_, QKV, L.k_cache, L.v_cache, block_table_, ctx_lens_, attn_, ws, s));
    }
    ZEST_OP("o gemm", gemm(attn_, L.wo, o_, batch, H, c.q_heads * D, s));
    ZEST_OP("add + rmsnorm", add_rmsnorm(x_, o_, L.post_norm, xn_, batch, H, kEps, s));
    if (moe) {
      const int E = c.experts, K = c.top_k, I = c.expert_inter;
      const float* bias = opt_.skew > 0.f ? L.router_bias : nullptr;
      // Fused routing: with SERE the re-routing runs between top-k and the plan, so the plan stays separate.
      const bool fused = moe_route_ok(batch, H, E, K);
      if (fused) {
        ZEST_OP("router (fused)", moe_route(xn_, L.router, bias, route_ids_, route_w_, nullptr, sere ? nullptr : &plan_,
                                            sere ? nullptr : expert_counts_ + l, batch, H, E, K, s));
      } else {
        ZEST_OP("router gemm", gemm(xn_, L.router, router_logits_, batch, E, H, s));
        ZEST_OP("router top-k", router_topk(router_logits_, bias, route_ids_, route_w_, batch, E, K, s));
      }
      if (sere)
        ZEST_OP("sere",
                sere_reroute(route_ids_, route_w_, L.sim, batch, E, K, opt_.sere_primary, opt_.sere_threshold, s));
      if (!fused || sere) ZEST_OP("moe plan", moe_plan(route_ids_, batch, K, E, plan_, expert_counts_ + l, s));
      // A streaming experts launch spends the plan's counters: with the op that builds the plan ablated, reset them
      // so that the experts still run (on the last plan).
      if (skip_ == (!fused || sere ? "moe plan" : "router (fused)"))
        ZEST_RETURN_IF_ERROR(moe_plan_reset_counters(plan_, s));
      ZEST_OP("moe experts + combine + rmsnorm",
              moe_experts_decode_combine(xn_, plan_, route_w_, L.gate_up, L.down, h_, slot_out_, batch, K, E, H, I,
                                         x_, route_ids_, rows ? nullptr : next_norm, rows ? nullptr : xn_, kEps,
                                         combine_done_, s));
    } else {
      const int I = c.dense_inter;
      ZEST_OP("mlp gate/up gemm", gemm(xn_, L.gate_up, gu_, batch, 2 * I, H, s));
      ZEST_OP("silu*up", silu_mul(gu_, h_, batch, I, s));
      ZEST_OP("mlp down gemm", gemm(h_, L.down, o_, batch, H, I, s));
      ZEST_OP("add + rmsnorm", add_rmsnorm(x_, o_, next_norm, xn_, batch, H, kEps, s));
    }
  }
  if (rows && gemm_kv_norm_ok(1, c.vocab, H)) {  // the final norm folded into the lm_head's CTAs
    KvPrefetch head;
    head.norm_w = final_norm_;
    head.norm_eps = kEps;
    ZEST_OP("lm_head gemm", gemm_kv_prefetch(x_, lm_head_, logits_, batch, c.vocab, H, head, s));
  } else {
    if (rows) ZEST_OP("final rmsnorm", rmsnorm(x_, final_norm_, xn_, batch, H, kEps, s));
    ZEST_OP("lm_head gemm", gemm(xn_, lm_head_, logits_, batch, c.vocab, H, s));
  }
  ZEST_OP("argmax", argmax_rows(logits_, out_ids_, batch, c.vocab, s));
  if (profile_sampling_ && samp_spec_) {  // not part of the step: what serving's sampling of these logits costs per mode
    const char* labels[4] = {"(serving) sample_rows greedy", "(serving) sample_rows temperature",
                             "(serving) sample_rows top-50", "(serving) sample_rows top-p (1024)"};
    for (int m = 0; m < 4; ++m)
      ZEST_OP(labels[m], sample_rows(logits_, batch, c.vocab, samp_spec_ + static_cast<size_t>(m) * opt_.max_batch,
                                     samp_out_, cand_ids_, cand_logits_, s));
  }
#undef ZEST_OP
  return Status::ok();
}

Status SyntheticDecoder::replay(int batch, bool sere) {
  const auto key = std::make_pair(batch, sere);
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    // One eager step first: creates cuBLASLt plans and sets kernel attributes outside the capture.
    ZEST_RETURN_IF_ERROR(enqueue_step(batch, sere));
    ZEST_CU(cudaStreamSynchronize(stream_), "eager step");
    cudaGraph_t graph = nullptr;
    ZEST_CU(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
    const Status st = enqueue_step(batch, sere);
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    ZEST_RETURN_IF_ERROR(st);
    ZEST_CU(end, "end capture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    ZEST_CU(inst, "graph instantiate");
    it = graphs_.emplace(key, exec).first;
  }
  return cuda_status(cudaGraphLaunch(it->second, stream_), "graph launch");
}

void SyntheticDecoder::clear_graphs() {
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g);
  graphs_.clear();
}

void SyntheticDecoder::set_skip(const std::string& op) {
  skip_ = op;
  clear_graphs();
}

std::vector<std::string> SyntheticDecoder::op_labels(bool sere) const {
  if (cfg_.experts == 0)
    return {"qkv gemm", "qk norm + rope + kv", "decode attention", "o gemm", "add + rmsnorm", "mlp gate/up gemm",
            "silu*up", "mlp down gemm", "lm_head gemm", "argmax"};
  // The union over the sizes (fused attention and routing where they serve, the separate launches otherwise): an op a
  // step does not launch has no cost in the ablation.
  std::vector<std::string> ops = {"qkv gemm", "qk norm + rope + kv", "decode attention", "o gemm", "add + rmsnorm",
                                  "router gemm", "router top-k", "decode attention (fused)", "router (fused)"};
  if (sere) ops.push_back("sere");
  for (const char* o : {"moe plan", "moe experts + combine + rmsnorm", "lm_head gemm"}) ops.push_back(o);
  return ops;
}

Status SyntheticDecoder::reset_expert_counts() {
  return cuda_status(cudaMemsetAsync(expert_counts_, 0, cfg_.layers * sizeof(int64_t), stream_), "memset");
}

Result<double> SyntheticDecoder::mean_distinct_experts(int steps) {
  if (cfg_.experts == 0) return 0.0;
  std::vector<int64_t> counts(cfg_.layers);
  ZEST_CU(cudaMemcpyAsync(counts.data(), expert_counts_, counts.size() * 8, cudaMemcpyDeviceToHost, stream_), "copy");
  ZEST_CU(cudaStreamSynchronize(stream_), "sync");
  double total = 0;
  for (int64_t v : counts) total += static_cast<double>(v);
  return total / (static_cast<double>(steps) * cfg_.layers);
}

double SyntheticDecoder::bytes_per_step(int batch, double distinct_experts) const {
  const SyntheticConfig& c = cfg_;
  const double H = c.hidden, D = c.head_dim, Hq = c.q_heads, Hkv = c.kv_heads;
  double layer = (Hq + 2 * Hkv) * D * H + H * Hq * D + 2 * H + 2 * D;
  if (c.experts > 0) layer += c.experts * H + distinct_experts * 3.0 * c.expert_inter * H;
  else layer += 3.0 * c.dense_inter * H;
  layer += static_cast<double>(batch) * (opt_.context + 1) * Hkv * D * 2;
  const double elems = layer * c.layers + batch * H + H + static_cast<double>(c.vocab) * H;
  return elems * 2.0;
}

Result<std::vector<std::pair<std::string, double>>> SyntheticDecoder::profile_step(int batch, bool sere,
                                                                                         bool sampling) {
  ZEST_RETURN_IF_ERROR(replay(batch, sere));  // first use of this batch size happens outside the profile
  if (sampling && !samp_spec_) {
    const size_t B = static_cast<size_t>(opt_.max_batch);
    std::vector<SampleRowSpec> specs(4 * B);
    for (size_t i = 0; i < B; ++i) {
      const double u = (static_cast<double>(i) + 0.5) / static_cast<double>(B);
      specs[i].mode = kSampleGreedy;
      specs[B + i].mode = kSampleTemperature;
      specs[2 * B + i].mode = specs[3 * B + i].mode = kSampleCandidates;
      specs[2 * B + i].candidates = std::min(50, cfg_.vocab);
      specs[3 * B + i].candidates = std::min(kSampleMaxCandidates, cfg_.vocab);
      for (size_t m = 1; m < 4; ++m) {
        specs[m * B + i].inv_t = 1.f / 0.8f;
        specs[m * B + i].u = u;
      }
    }
    void* p[4] = {};
    const size_t bytes[4] = {specs.size() * sizeof(SampleRowSpec), B * sizeof(SampleRowOut),
                             B * kSampleMaxCandidates * 4, B * kSampleMaxCandidates * 4};
    for (int i = 0; i < 4; ++i) {
      ZEST_CU(cudaMalloc(&p[i], bytes[i]), "cudaMalloc(sampling buffers)");
      allocations_.push_back(p[i]);
    }
    ZEST_CU(cudaMemcpy(p[0], specs.data(), bytes[0], cudaMemcpyHostToDevice), "sampling plans");
    samp_spec_ = static_cast<SampleRowSpec*>(p[0]);
    samp_out_ = static_cast<SampleRowOut*>(p[1]);
    cand_ids_ = static_cast<int32_t*>(p[2]);
    cand_logits_ = static_cast<float*>(p[3]);
  }
  ZEST_CU(cudaStreamSynchronize(stream_), "sync");
  profile_ = true;
  profile_sampling_ = sampling;
  marks_.clear();
  cudaEvent_t start = nullptr;
  cudaEventCreate(&start);
  cudaEventRecord(start, stream_);
  const Status st = enqueue_step(batch, sere);
  profile_ = profile_sampling_ = false;
  const cudaError_t sync = cudaStreamSynchronize(stream_);
  std::vector<std::pair<std::string, double>> out;
  cudaEvent_t prev = start;
  for (auto& [label, e] : marks_) {
    float ms = 0.f;
    cudaEventElapsedTime(&ms, prev, e);
    auto it = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == label; });
    if (it == out.end()) out.emplace_back(label, ms);
    else it->second += ms;
    prev = e;
  }
  for (auto& [label, e] : marks_) cudaEventDestroy(e);
  cudaEventDestroy(start);
  marks_.clear();
  ZEST_RETURN_IF_ERROR(st);
  ZEST_CU(sync, "profiled step");
  return out;
}

Result<std::vector<int32_t>> SyntheticDecoder::last_tokens(int batch) {
  std::vector<int32_t> out(batch);
  ZEST_CU(cudaMemcpyAsync(out.data(), out_ids_, batch * 4, cudaMemcpyDeviceToHost, stream_), "copy");
  ZEST_CU(cudaStreamSynchronize(stream_), "sync");
  return out;
}

}  // namespace zest::cuda
