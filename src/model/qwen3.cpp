#include "model/qwen3.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/thread_pool.h"
#include "kernels/cpu/ops.h"
#include "model/weights.h"

namespace zest::model {
namespace {

// Top-k of one probability row: descending value, ties to the lower expert id (as torch.topk on CPU).
void top_k(const float* p, int64_t n, int64_t k, int32_t* ids, float* vals) {
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return p[a] > p[b] || (p[a] == p[b] && a < b);
  });
  for (int64_t i = 0; i < k; ++i) {
    ids[i] = order[i];
    vals[i] = p[order[i]];
  }
}

}  // namespace

Result<Qwen3TextModel> Qwen3TextModel::load(const io::SafeTensors& st, const io::ModelConfig& mc) {
  ZEST_ASSIGN_OR_RETURN(DecoderWeights w, collect_decoder_weights(st, mc));
  return from_weights(w);
}

Result<Qwen3TextModel> Qwen3TextModel::from_weights(const DecoderWeights& w) {
  Qwen3TextModel m;
  m.cfg_ = w.config;
  const io::TextConfig& c = m.cfg_;
  const int64_t H = c.hidden_size, hd = c.head_dim;
  m.embed_ = w.embed.to_f32();
  m.final_norm_ = w.final_norm.to_f32();
  m.lm_head_ = w.lm_head.data == w.embed.data ? m.embed_ : w.lm_head.to_f32();
  // gate [I, H] and up [I, H] stacked into one [2I, H] matrix (gate rows first).
  auto stack = [](const io::TensorView& g, const io::TensorView& u) {
    Tensor gt = g.to_f32(), ut = u.to_f32();
    Tensor gu = Tensor::empty({gt.dim(0) + ut.dim(0), gt.dim(1)});
    std::memcpy(gu.data<float>(), gt.data<float>(), gt.nbytes());
    std::memcpy(gu.data<float>() + gt.numel(), ut.data<float>(), ut.nbytes());
    return gu;
  };
  for (const DecoderLayerWeights& lw : w.layers) {
    Layer L;
    L.in_norm = lw.in_norm.to_f32();
    L.post_norm = lw.post_norm.to_f32();
    L.wq = lw.q.to_f32();
    L.wk = lw.k.to_f32();
    L.wv = lw.v.to_f32();
    L.wo = lw.o.to_f32();
    L.q_norm = lw.q_norm.to_f32();
    L.k_norm = lw.k_norm.to_f32();
    L.moe = lw.moe;
    if (L.moe) L.router = lw.router.to_f32();
    if (lw.fused_gate_up.data) {
      // Fused, input-major: gate_up [E, H, 2I] (gate = first I columns), down [E, I, H]; an expert-parallel shard's
      // tensors hold experts [fused_expert0, fused_expert0 + dim 0), the others stay empty.
      const int64_t E = c.num_experts, I = c.moe_intermediate_size;
      const int64_t e0 = lw.fused_expert0, held = lw.fused_gate_up.shape[0];
      Tensor gu = lw.fused_gate_up.to_f32(), dn = lw.fused_down.to_f32();
      L.gate_up.resize(E);
      L.down.resize(E);
      for (int64_t e = e0; e < e0 + held && e < E; ++e) {
        L.gate_up[e] = transpose_2d(gu.rows(e - e0, e - e0 + 1).reshape({H, 2 * I}));
        L.down[e] = transpose_2d(dn.rows(e - e0, e - e0 + 1).reshape({I, H}));
      }
    } else {
      for (size_t e = 0; e < lw.gate.size(); ++e) {
        if (!lw.gate[e].data) {  // an expert another rank holds (expert parallelism)
          L.gate_up.emplace_back();
          L.down.emplace_back();
          continue;
        }
        L.gate_up.push_back(stack(lw.gate[e], lw.up[e]));
        L.down.push_back(lw.down[e].to_f32());
      }
    }
    m.layers_.push_back(std::move(L));
  }

  // RoPE frequencies, computed in f32 as the reference does: theta^(-2j/head_dim).
  const int64_t half = hd / 2;
  m.inv_freq_.resize(half);
  m.freq_axis_.assign(half, 0);
  for (int64_t j = 0; j < half; ++j)
    m.inv_freq_[j] = 1.0f / std::pow(static_cast<float>(c.rope_theta), static_cast<float>(2 * j) / hd);
  if (!c.mrope_section.empty()) {
    // Interleaved M-RoPE: frequency j uses axis h when j % 3 == 1 and j < 3 * section[1], axis w when
    // j % 3 == 2 and j < 3 * section[2], else t.
    for (int64_t j = 0; j < half; ++j) {
      if (c.mrope_section.size() >= 2 && j % 3 == 1 && j < 3 * c.mrope_section[1]) m.freq_axis_[j] = 1;
      if (c.mrope_section.size() >= 3 && j % 3 == 2 && j < 3 * c.mrope_section[2]) m.freq_axis_[j] = 2;
    }
  }
  return m;
}

PagedKVCache Qwen3TextModel::make_cache(int64_t num_blocks, int64_t block_size) const {
  return PagedKVCache(cfg_.num_layers, num_blocks, block_size, cfg_.num_kv_heads, cfg_.head_dim);
}

void Qwen3TextModel::rope_tables(const ForwardBatch& b, std::vector<float>& cos, std::vector<float>& sin) const {
  const int64_t T = b.num_tokens(), half = cfg_.head_dim / 2;
  cos.resize(T * half);
  sin.resize(T * half);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < half; ++j) {
      const float pos = static_cast<float>(b.positions[freq_axis_[j] * T + t]);
      const float a = pos * inv_freq_[j];
      cos[t * half + j] = std::cos(a);
      sin[t * half + j] = std::sin(a);
    }
}

void Qwen3TextModel::attention(const Layer& L, int64_t layer, const ForwardBatch& b, PagedKVCache& cache,
                               const float* x, float* out) const {
  const int64_t T = b.num_tokens(), H = cfg_.hidden_size, hd = cfg_.head_dim;
  const int64_t nh = cfg_.num_heads, nkv = cfg_.num_kv_heads, group = nh / nkv;
  std::vector<float> q(T * nh * hd), k(T * nkv * hd), v(T * nkv * hd);
  cpu::linear(q.data(), x, L.wq.data<float>(), nullptr, T, nh * hd, H);
  cpu::linear(k.data(), x, L.wk.data<float>(), nullptr, T, nkv * hd, H);
  cpu::linear(v.data(), x, L.wv.data<float>(), nullptr, T, nkv * hd, H);
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  cpu::rmsnorm(q.data(), q.data(), L.q_norm.data<float>(), T * nh, hd, eps);
  cpu::rmsnorm(k.data(), k.data(), L.k_norm.data<float>(), T * nkv, hd, eps);
  std::vector<float> cs, sn;
  rope_tables(b, cs, sn);
  cpu::rope_rotate_half(q.data(), cs.data(), sn.data(), T, nh, hd);
  cpu::rope_rotate_half(k.data(), cs.data(), sn.data(), T, nkv, hd);

  // Write this step's K/V into the cache, then attend causally over each sequence's cache.
  std::vector<int64_t> tok_seq(T), tok_pos(T);
  int64_t t = 0;
  for (size_t s = 0; s < b.seqs.size(); ++s)
    for (int64_t i = 0; i < b.seqs[s].length; ++i, ++t) {
      tok_seq[t] = static_cast<int64_t>(s);
      tok_pos[t] = b.seqs[s].start + i;
      std::memcpy(cache.k_at(layer, *b.seqs[s].block_table, tok_pos[t]), &k[t * nkv * hd], nkv * hd * 4);
      std::memcpy(cache.v_at(layer, *b.seqs[s].block_table, tok_pos[t]), &v[t * nkv * hd], nkv * hd * 4);
    }
  std::vector<float> attn(T * nh * hd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  parallel_for(T * nh, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t idx = begin; idx < end; ++idx) {
      const int64_t tt = idx / nh, h = idx % nh, kvh = h / group;
      const auto& table = *b.seqs[tok_seq[tt]].block_table;
      const int64_t n = tok_pos[tt] + 1;
      const float* qv = &q[(tt * nh + h) * hd];
      scores.resize(n);
      for (int64_t j = 0; j < n; ++j) scores[j] = cpu::dot(qv, cache.k_at(layer, table, j) + kvh * hd, hd) * scale;
      cpu::softmax_inplace(scores.data(), n);
      float* o = &attn[(tt * nh + h) * hd];
      std::fill(o, o + hd, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float* vv = cache.v_at(layer, table, j) + kvh * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] += scores[j] * vv[d];
      }
    }
  });
  cpu::linear(out, attn.data(), L.wo.data<float>(), nullptr, T, H, nh * hd);
}

Status Qwen3TextModel::mlp(const Layer& L, int64_t layer, const ForwardBatch& b, const float* x, float* out,
                         const MoeHooks* hooks) const {
  const int64_t T = b.num_tokens(), H = cfg_.hidden_size;
  if (!L.moe) {
    const int64_t I = cfg_.intermediate_size;
    std::vector<float> gu(T * 2 * I), a(T * I);
    cpu::linear(gu.data(), x, L.gate_up[0].data<float>(), nullptr, T, 2 * I, H);
    cpu::silu_mul(a.data(), gu.data(), T, I);
    cpu::linear(out, a.data(), L.down[0].data<float>(), nullptr, T, H, I);
    return Status::ok();
  }
  // Under several ranks (identical routing inputs on every rank) only rank 0 calls the hooks; its re-routing is
  // broadcast.
  const bool lead = !comm_ || comm_->rank() == 0;
  if (hooks && hooks->moe_input && lead) hooks->moe_input(layer, x, T);
  const int64_t E = cfg_.num_experts, K = cfg_.num_experts_per_tok;
  std::vector<float> probs(T * E);
  cpu::linear(probs.data(), x, L.router.data<float>(), nullptr, T, E, H);
  std::vector<int32_t> ids(T * K);
  std::vector<float> w(T * K);
  for (int64_t t = 0; t < T; ++t) {
    cpu::softmax_inplace(&probs[t * E], E);
    top_k(&probs[t * E], E, K, &ids[t * K], &w[t * K]);
    if (cfg_.norm_topk_prob) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s += w[t * K + k];
      for (int64_t k = 0; k < K; ++k) w[t * K + k] /= s;
    }
  }
  if (hooks && hooks->route) {
    std::vector<uint8_t> active(T, 1);
    int64_t t = 0;
    for (const SeqChunk& s : b.seqs)
      for (int64_t i = 0; i < s.length; ++i, ++t) active[t] = s.reroute ? 1 : 0;
    if (lead) hooks->route(layer, ids.data(), w.data(), T, K, active);
    if (comm_) {
      ZEST_RETURN_IF_ERROR(comm_->broadcast(ids.data(), T * K * 4, 0));
      ZEST_RETURN_IF_ERROR(comm_->broadcast(w.data(), T * K * 4, 0));
    }
  }
  // Group (token, slot) pairs by expert; each expert's weights are used once for all its tokens.
  std::vector<std::vector<int64_t>> by_expert(E);
  for (int64_t s = 0; s < T * K; ++s)
    if (ids[s] >= 0 && ids[s] < E) by_expert[ids[s]].push_back(s);
  std::vector<float> slot_out(T * K * H, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    const auto& slots = by_expert[e];
    if (slots.empty() || !L.gate_up[e].defined()) continue;  // no tokens, or another rank's expert
    const int64_t n = static_cast<int64_t>(slots.size());
    std::vector<float> xe(n * H), y(n * H);
    for (int64_t r = 0; r < n; ++r) std::memcpy(&xe[r * H], x + (slots[r] / K) * H, H * 4);
    expert_ffn(L, e, xe.data(), n, y.data());
    for (int64_t r = 0; r < n; ++r)
      for (int64_t d = 0; d < H; ++d) slot_out[slots[r] * H + d] = y[r * H + d] * w[slots[r]];
  }
  for (int64_t t = 0; t < T; ++t) {
    float* o = out + t * H;
    std::fill(o, o + H, 0.0f);
    for (int64_t k = 0; k < K; ++k) cpu::add_inplace(o, &slot_out[(t * K + k) * H], H);
  }
  return Status::ok();
}

Status Qwen3TextModel::run_expert(int64_t layer, int64_t expert, const float* x, int64_t n, float* y) const {
  if (layer < 0 || layer >= static_cast<int64_t>(layers_.size()) || !layers_[layer].moe)
    return invalid_argument("layer " + std::to_string(layer) + " is not an MoE layer of this decoder");
  if (expert < 0 || expert >= static_cast<int64_t>(layers_[layer].gate_up.size()))
    return invalid_argument("expert " + std::to_string(expert) + " is outside layer " + std::to_string(layer));
  if (!layers_[layer].gate_up[expert].defined())
    return invalid_argument("expert " + std::to_string(expert) + " of layer " + std::to_string(layer) +
                            " is held by another rank");
  expert_ffn(layers_[layer], expert, x, n, y);
  return Status::ok();
}

void Qwen3TextModel::expert_ffn(const Layer& L, int64_t expert, const float* x, int64_t n, float* y) const {
  const int64_t H = cfg_.hidden_size, I = cfg_.moe_intermediate_size;
  std::vector<float> gu(n * 2 * I), a(n * I);
  cpu::linear(gu.data(), x, L.gate_up[expert].data<float>(), nullptr, n, 2 * I, H);
  cpu::silu_mul(a.data(), gu.data(), n, I);
  cpu::linear(y, a.data(), L.down[expert].data<float>(), nullptr, n, H, I);
}

Result<Tensor> Qwen3TextModel::forward(const ForwardBatch& b, PagedKVCache& cache, const MoeHooks* hooks) const {
  const int64_t T = b.num_tokens(), H = cfg_.hidden_size, V = cfg_.vocab_size;
  if (static_cast<int64_t>(b.positions.size()) != 3 * T) return invalid_argument("forward: positions must be [3, T]");
  if (!dynamic_cast<CpuKvStorage*>(cache.storage()))
    return invalid_argument("forward: the KV cache was not made by the CPU decoder (use its allocate_cache)");
  int64_t sum = 0;
  for (const SeqChunk& s : b.seqs) {
    if (!s.block_table || s.length <= 0) return invalid_argument("forward: empty chunk or missing block table");
    if (cache.blocks_for(s.start + s.length) > static_cast<int64_t>(s.block_table->size()))
      return invalid_argument("forward: KV blocks not reserved for the chunk");
    sum += s.length;
  }
  if (sum != T) return invalid_argument("forward: chunk lengths do not add up to the token count");
  for (int32_t tok : b.tokens)
    if (tok < 0 || tok >= V) return invalid_argument("forward: token id " + std::to_string(tok) + " out of range");

  Tensor xs = Tensor::empty({T, H});
  float* x = xs.data<float>();
  for (int64_t t = 0; t < T; ++t) std::memcpy(x + t * H, embed_.data<float>() + int64_t{b.tokens[t]} * H, H * 4);
  for (size_t r = 0; r < b.mm_index.size(); ++r)
    std::memcpy(x + b.mm_index[r] * H, b.mm_embeds.data<float>() + r * H, H * 4);

  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  std::vector<float> h(T * H), y(T * H);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const Layer& L = layers_[l];
    cpu::rmsnorm(h.data(), x, L.in_norm.data<float>(), T, H, eps);
    attention(L, l, b, cache, h.data(), y.data());
    if (comm_) ZEST_RETURN_IF_ERROR(comm_->all_reduce_sum(y.data(), T * H));  // the ranks' heads' partial outputs
    cpu::add_inplace(x, y.data(), T * H);
    cpu::rmsnorm(h.data(), x, L.post_norm.data<float>(), T, H, eps);
    ZEST_RETURN_IF_ERROR(mlp(L, l, b, h.data(), y.data(), hooks));
    if (comm_) ZEST_RETURN_IF_ERROR(comm_->all_reduce_sum(y.data(), T * H));  // MLP columns' / experts' partials
    cpu::add_inplace(x, y.data(), T * H);
    if (l < static_cast<int64_t>(b.deepstack.size()))
      for (size_t r = 0; r < b.mm_index.size(); ++r)
        cpu::add_inplace(x + b.mm_index[r] * H, b.deepstack[l].data<float>() + r * H, H);
  }

  // Rows that produce logits: every token of all_logits chunks, else each chunk's last token.
  std::vector<int64_t> rows;
  int64_t t0 = 0;
  for (const SeqChunk& s : b.seqs) {
    if (s.all_logits)
      for (int64_t i = 0; i < s.length; ++i) rows.push_back(t0 + i);
    else
      rows.push_back(t0 + s.length - 1);
    t0 += s.length;
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  std::vector<float> hn(R * H);
  for (int64_t r = 0; r < R; ++r) cpu::rmsnorm(&hn[r * H], x + rows[r] * H, final_norm_.data<float>(), 1, H, eps);
  Tensor logits = Tensor::empty({R, V});
  cpu::linear(logits.data<float>(), hn.data(), lm_head_.data<float>(), nullptr, R, V, H);
  return logits;
}

}  // namespace zest::model
