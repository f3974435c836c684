#include "model/random_weights.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "model/architecture.h"

namespace zest::model {
namespace {

uint64_t mix64(uint64_t z) {  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The stream key of one tensor: FNV-1a of its name, mixed with the seed.
uint64_t tensor_key(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return mix64(h ^ mix64(seed + 0x9E3779B97F4A7C15ull));
}

// Value i of a tensor's stream: approximately N(0, 1) (normal) or uniform in [0, 1).
inline float stream_value(uint64_t key, int64_t i, bool normal) {
  const uint64_t r = mix64(key + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull);
  if (!normal) return static_cast<float>(r >> 40) / 16777216.f;
  const float s = static_cast<float>(r & 0xffff) + static_cast<float>((r >> 16) & 0xffff) +
                  static_cast<float>((r >> 32) & 0xffff) + static_cast<float>(r >> 48);
  return (s / 65536.f - 2.f) * 1.7320508f;  // four uniforms: mean 2, variance 1/3
}

// out[i] = f(stream value i) for i < n, in parallel chunks.
template <typename T, typename F>
void fill_stream(T* out, int64_t n, uint64_t key, bool normal, F f) {
  constexpr int64_t kChunk = 1 << 16;
  parallel_for((n + kChunk - 1) / kChunk, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c)
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) out[i] = f(stream_value(key, i, normal));
  });
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

io::TextConfig moe_text(int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t experts,
                        int64_t top_k, int64_t expert_inter, int64_t dense_inter) {
  io::TextConfig t;
  t.vocab_size = 151936;
  t.hidden_size = hidden;
  t.num_layers = layers;
  t.num_heads = heads;
  t.num_kv_heads = kv_heads;
  t.head_dim = 128;
  t.intermediate_size = dense_inter;
  t.moe_intermediate_size = expert_inter;
  t.num_experts = experts;
  t.num_experts_per_tok = top_k;
  t.norm_topk_prob = true;
  t.rms_norm_eps = 1e-6;
  t.tie_word_embeddings = false;
  return t;
}

void make_vl(io::ModelConfig& c, int64_t out_hidden) {
  c.text.rope_theta = 5e6;
  c.text.mrope_section = {24, 20, 20};
  c.text.mrope_interleaved = true;
  c.text.max_position_embeddings = 262144;
  io::VisionConfig v;
  v.depth = 27;
  v.hidden_size = 1152;
  v.num_heads = 16;
  v.intermediate_size = 4304;
  v.patch_size = 16;
  v.temporal_patch_size = 2;
  v.spatial_merge_size = 2;
  v.in_channels = 3;
  v.out_hidden_size = out_hidden;
  v.num_position_embeddings = 2304;
  v.hidden_act = "gelu_pytorch_tanh";
  v.deepstack_visual_indexes = {8, 16, 24};
  c.vision = v;
}

// Element i of a tensor the store owns.
void set_bf16(const io::TensorView& v, int64_t i, float x) {
  const_cast<uint16_t*>(static_cast<const uint16_t*>(v.data))[i] = f32_to_bf16(x);
}

constexpr float kContextGain = 3.f;  // layer 0's o_proj rows that write the token channels

// The per-layer part of the reserved hidden coordinates (see random_decoder_weights): [0, 1 + K) are never
// written by a layer and never read by attention or the experts; the router reads them (column 0 the bias,
// columns 1..K unit-norm random rows over the token channels, every other column zero).
void reserve_channels(DecoderLayerWeights& L, int64_t own_experts, int64_t H, int64_t K, float channel,
                      const std::vector<float>& bias) {
  const int64_t R = 1 + K;
  for (int64_t j = 0; j < R; ++j) {
    set_bf16(L.in_norm, j, 0.f);
    set_bf16(L.post_norm, j, 1.f);
  }
  const int64_t o_cols = L.o.shape[1];
  for (int64_t j = 0; j < o_cols; ++j) set_bf16(L.o, j, 0.f);  // row 0 of o_proj (rows 1..K: by the caller)
  for (int64_t e = 0; e < own_experts; ++e) {
    const int64_t I = L.gate[e].shape[0];
    for (int64_t r = 0; r < I; ++r)
      for (int64_t j = 0; j < R; ++j) {
        set_bf16(L.gate[e], r * H + j, 0.f);  // columns [0, R) of gate and up
        set_bf16(L.up[e], r * H + j, 0.f);
      }
    for (int64_t j = 0; j < R * I; ++j) set_bf16(L.down[e], j, 0.f);  // rows [0, R) of down
  }
  if (!L.moe) return;
  const int64_t E = L.router.shape[0];
  const uint16_t* w = static_cast<const uint16_t*>(L.router.data);
  for (int64_t e = 0; e < E; ++e) {
    double norm = 0;
    for (int64_t j = 1; j < R; ++j) norm += static_cast<double>(bf16_to_f32(w[e * H + j])) * bf16_to_f32(w[e * H + j]);
    const float inv = norm > 0 ? static_cast<float>(1.0 / std::sqrt(norm)) : 0.f;
    for (int64_t j = 1; j < R; ++j) set_bf16(L.router, e * H + j, inv * bf16_to_f32(w[e * H + j]));
    for (int64_t j = R; j < H; ++j) set_bf16(L.router, e * H + j, 0.f);
    set_bf16(L.router, e * H, bias[static_cast<size_t>(e)] / channel);
  }
}

}  // namespace

int64_t token_channels(int64_t hidden) { return hidden >= 8 ? std::min<int64_t>(64, (hidden - 1) / 2) : 0; }

std::vector<std::string> named_model_configs() {
  return {"qwen3-30b-a3b", "qwen3-vl-30b-a3b", "qwen3-235b-a22b", "qwen3-vl-235b-a22b", "qwen3-vl-32b", "qwen3-8b"};
}

Result<io::ModelConfig> named_model_config(const std::string& name, int64_t layers) {
  if (layers < 0) return invalid_argument("the layer count must be positive (0 = the model's), got " + std::to_string(layers));
  io::ModelConfig c;
  if (name == "qwen3-30b-a3b") {
    c.arch = io::Arch::kQwen3Moe;
    c.model_type = "qwen3_moe";
    c.text = moe_text(48, 2048, 32, 4, 128, 8, 768, 6144);
    c.text.rope_theta = 1e6;
    c.text.max_position_embeddings = 40960;
  } else if (name == "qwen3-vl-30b-a3b") {
    c.arch = io::Arch::kQwen3VLMoe;
    c.model_type = "qwen3_vl_moe";
    c.text = moe_text(48, 2048, 32, 4, 128, 8, 768, 6144);
    make_vl(c, 2048);
  } else if (name == "qwen3-235b-a22b") {
    c.arch = io::Arch::kQwen3Moe;
    c.model_type = "qwen3_moe";
    c.text = moe_text(94, 4096, 64, 4, 128, 8, 1536, 12288);
    c.text.rope_theta = 1e6;
    c.text.max_position_embeddings = 40960;
  } else if (name == "qwen3-vl-235b-a22b") {
    c.arch = io::Arch::kQwen3VLMoe;
    c.model_type = "qwen3_vl_moe";
    c.text = moe_text(94, 4096, 64, 4, 128, 8, 1536, 12288);
    make_vl(c, 4096);
  } else if (name == "qwen3-vl-32b") {
    c.arch = io::Arch::kQwen3VL;
    c.model_type = "qwen3_vl";
    c.text = moe_text(64, 5120, 64, 8, 0, 0, 0, 25600);
    make_vl(c, 5120);
  } else if (name == "qwen3-8b") {
    c.arch = io::Arch::kQwen3;
    c.model_type = "qwen3";
    c.text = moe_text(36, 4096, 32, 8, 0, 0, 0, 12288);
    c.text.rope_theta = 1e6;
    c.text.max_position_embeddings = 40960;
  } else {
    std::string known;
    for (const std::string& n : named_model_configs()) known += (known.empty() ? "" : ", ") + n;
    return invalid_argument("unknown model config '" + name + "' (known: " + known + ")");
  }
  if (layers > 0) c.text.num_layers = layers;
  return c;
}

io::TensorView RandomTensors::normal(const std::string& name, std::vector<int64_t> shape, float stddev) {
  return make(name, std::move(shape), true, stddev, 0.f);
}

io::TensorView RandomTensors::uniform(const std::string& name, std::vector<int64_t> shape, float lo, float hi) {
  return make(name, std::move(shape), false, lo, hi);
}

io::TensorView RandomTensors::make(const std::string& name, std::vector<int64_t> shape, bool normal, float a, float b) {
  const int64_t n = numel_of(shape);
  std::unique_ptr<uint16_t[]> buf(new uint16_t[static_cast<size_t>(n)]);  // every element written below
  const uint64_t key = tensor_key(seed_, name);
  if (normal)
    fill_stream(buf.get(), n, key, true, [a](float x) { return f32_to_bf16(a * x); });
  else
    fill_stream(buf.get(), n, key, false, [a, b](float x) { return f32_to_bf16(a + (b - a) * x); });
  io::TensorView v;
  v.name = name;
  v.dtype = DType::BF16;
  v.shape = std::move(shape);
  v.data = buf.get();
  v.nbytes = static_cast<size_t>(n) * 2;
  bytes_ += v.nbytes;
  bufs_.push_back(std::move(buf));
  return v;
}

io::TensorView RandomTensors::fp8_blockwise(const io::TensorView& w, int64_t block) {
  const int64_t R = w.shape.at(0), C = w.shape.at(1);
  const int64_t gr = (R + block - 1) / block, gc = (C + block - 1) / block;
  std::unique_ptr<uint8_t[]> q(new uint8_t[static_cast<size_t>(R * C)]);
  std::unique_ptr<float[]> sc(new float[static_cast<size_t>(gr * gc)]);
  const uint16_t* src = static_cast<const uint16_t*>(w.data);
  for (int64_t bi = 0; bi < gr; ++bi)
    for (int64_t bj = 0; bj < gc; ++bj) {
      const int64_t r1 = std::min(R, (bi + 1) * block), c1 = std::min(C, (bj + 1) * block);
      float amax = 0.f;
      for (int64_t r = bi * block; r < r1; ++r)
        for (int64_t c = bj * block; c < c1; ++c) amax = std::max(amax, std::fabs(bf16_to_f32(src[r * C + c])));
      const float scale = amax > 0.f ? amax / 448.f : 1.f;
      sc[static_cast<size_t>(bi * gc + bj)] = scale;
      for (int64_t r = bi * block; r < r1; ++r)
        for (int64_t c = bj * block; c < c1; ++c) q[static_cast<size_t>(r * C + c)] = f32_to_f8e4m3(bf16_to_f32(src[r * C + c]) / scale);
    }
  io::TensorView v;
  v.name = w.name;
  v.dtype = DType::F8E4M3;
  v.shape = w.shape;
  v.data = q.get();
  v.nbytes = static_cast<size_t>(R * C);
  v.scale.name = w.name + "_scale_inv";
  v.scale.dtype = DType::F32;
  v.scale.data = sc.get();
  v.scale.rows = gr;
  v.scale.cols = gc;
  v.scale.block_rows = v.scale.block_cols = block;
  bytes_ += v.nbytes + static_cast<size_t>(gr * gc) * sizeof(float);
  fp8_bufs_.push_back(std::move(q));
  scale_bufs_.push_back(std::move(sc));
  return v;
}

io::Fp8Config quantize_fp8_blockwise(DecoderWeights& w, RandomTensors& store, int64_t block) {
  std::map<const void*, io::TensorView> done;  // by the bf16 data they came from: shared views stay shared
  auto quantize = [&](io::TensorView& t) {
    if (t.data == nullptr || t.dtype != DType::BF16) return;
    auto it = done.find(t.data);
    if (it == done.end()) it = done.emplace(t.data, store.fp8_blockwise(t, block)).first;
    const std::string name = t.name;
    t = it->second;
    t.name = name;
    t.scale.name = name + "_scale_inv";
  };
  for (DecoderLayerWeights& L : w.layers) {
    for (io::TensorView* t : {&L.q, &L.k, &L.v, &L.o}) quantize(*t);
    for (auto* list : {&L.gate, &L.up, &L.down})
      for (io::TensorView& t : *list) quantize(t);
  }
  io::Fp8Config cfg;
  cfg.block_rows = cfg.block_cols = block;
  cfg.modules_to_not_convert = {"lm_head", "mlp.gate"};
  return cfg;
}

std::vector<float> random_router_bias(int64_t experts, float skew, uint64_t seed) {
  // A random permutation by sorting hash keys.
  const uint64_t key = tensor_key(seed, "router_rank");
  std::vector<int64_t> order(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) order[static_cast<size_t>(e)] = e;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const uint64_t ka = mix64(key + static_cast<uint64_t>(a)), kb = mix64(key + static_cast<uint64_t>(b));
    return ka < kb || (ka == kb && a < b);
  });
  std::vector<float> bias(static_cast<size_t>(experts));
  for (int64_t rank = 0; rank < experts; ++rank)
    bias[static_cast<size_t>(order[static_cast<size_t>(rank)])] = -skew * std::log(static_cast<float>(rank + 1));
  return bias;
}

DecoderWeights random_decoder_weights(const io::TextConfig& c, RandomTensors& store, int64_t distinct_layers,
                                      int64_t distinct_experts, float router_skew) {
  DecoderWeights w;
  w.config = c;
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads;
  auto sd = [](int64_t fan_in) { return 1.f / std::sqrt(static_cast<float>(fan_in)); };
  w.embed = store.normal("embed_tokens", {c.vocab_size, H}, 1.f);
  w.final_norm = store.uniform("norm", {H}, 0.9f, 1.1f);
  w.lm_head = c.tie_word_embeddings ? w.embed : store.normal("lm_head", {c.vocab_size, H}, sd(H));
  const int64_t distinct = distinct_layers <= 0 ? c.num_layers : std::min(distinct_layers, c.num_layers);
  const int64_t K = token_channels(H);
  const float channel = std::sqrt(static_cast<float>(H));  // the bias channel's constant
  io::TensorView o_later;  // layer 0's o_proj without its token-channel rows, for the layers that share it
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (l >= distinct) {
      DecoderLayerWeights L = w.layers[static_cast<size_t>(l % distinct)];
      L.moe = c.is_moe_layer(l);
      if (L.moe == w.layers[static_cast<size_t>(l % distinct)].moe) {
        if (l % distinct == 0 && K > 0) L.o = o_later;  // only layer 0 writes the token channels
        w.layers.push_back(std::move(L));
        continue;
      }
    }
    const std::string p = "layers." + std::to_string(l) + ".";
    DecoderLayerWeights L;
    L.in_norm = store.uniform(p + "input_layernorm", {H}, 0.9f, 1.1f);
    L.post_norm = store.uniform(p + "post_attention_layernorm", {H}, 0.9f, 1.1f);
    L.q = store.normal(p + "q_proj", {Hq * D, H}, sd(H));
    L.k = store.normal(p + "k_proj", {Hkv * D, H}, sd(H));
    L.v = store.normal(p + "v_proj", {Hkv * D, H}, sd(H));
    L.o = store.normal(p + "o_proj", {H, Hq * D}, sd(Hq * D));
    L.q_norm = store.uniform(p + "q_norm", {D}, 0.9f, 1.1f);
    L.k_norm = store.uniform(p + "k_norm", {D}, 0.9f, 1.1f);
    L.moe = c.is_moe_layer(l);
    const int64_t E = L.moe ? c.num_experts : 1, I = L.moe ? c.moe_intermediate_size : c.intermediate_size;
    int64_t own = E;
    if (L.moe) L.router = store.normal(p + "router", {E, H}, sd(H));
    own = distinct_experts <= 0 ? E : std::min(distinct_experts, E);
    for (int64_t e = 0; e < E; ++e) {
      if (e >= own) {
        L.gate.push_back(L.gate[static_cast<size_t>(e % own)]);
        L.up.push_back(L.up[static_cast<size_t>(e % own)]);
        L.down.push_back(L.down[static_cast<size_t>(e % own)]);
        continue;
      }
      const std::string ep = L.moe ? p + "experts." + std::to_string(e) + "." : p + "mlp.";
      L.gate.push_back(store.normal(ep + "gate_proj", {I, H}, sd(H)));
      L.up.push_back(store.normal(ep + "up_proj", {I, H}, sd(H)));
      L.down.push_back(store.normal(ep + "down_proj", {H, I}, sd(I)));
    }
    if (K > 0) {
      // Layer 0's attention writes the token channels (so the next token and the routing also depend on
      // the context, not only on the current token); later layers do not (rows 1..K of o_proj zero).
      const int64_t o_cols = L.o.shape[1];
      if (l == 0) {
        o_later = store.normal(p + "o_proj.later", {H, Hq * D}, sd(Hq * D));
        for (int64_t j = 0; j < (1 + K) * o_cols; ++j) set_bf16(o_later, j, 0.f);
        // An attention output averages over the context, so it is several times smaller than an embedding
        // value: scaled up so that the context and the current token weigh alike in the token channels.
        const uint16_t* ov = static_cast<const uint16_t*>(L.o.data);
        for (int64_t j = o_cols; j < (1 + K) * o_cols; ++j) set_bf16(L.o, j, kContextGain * bf16_to_f32(ov[j]));
      } else {
        for (int64_t j = o_cols; j < (1 + K) * o_cols; ++j) set_bf16(L.o, j, 0.f);
      }
    }
    if (K > 0)
      reserve_channels(L, L.moe ? own : 1, H, K, channel,
                       L.moe && router_skew > 0.f
                           ? random_router_bias(E, router_skew, store.seed() * 1000003ull + static_cast<uint64_t>(l))
                           : std::vector<float>(static_cast<size_t>(E), 0.f));
    w.layers.push_back(std::move(L));
  }
  if (K > 0) {
    for (int64_t v = 0; v < c.vocab_size; ++v) set_bf16(w.embed, v * H, channel);
    for (int64_t j = 0; j < H; ++j) set_bf16(w.final_norm, j, j >= 1 && j <= K ? 1.f : 0.f);
  }
  return w;
}

Tensor random_vision_tensor(const std::string& name, const std::vector<int64_t>& shape, uint64_t seed) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  const int64_t n = t.numel();
  const uint64_t key = tensor_key(seed, "visual." + name);
  float lo = -0.02f, hi = 0.02f;
  bool normal = false;
  if (ends_with(name, "pos_embed.weight")) {
    normal = true;
    lo = 0.02f;
  } else if (name.find("norm") != std::string::npos && ends_with(name, ".weight")) {
    lo = 0.9f;
    hi = 1.1f;
  } else if (ends_with(name, ".weight") && shape.size() >= 2) {
    const int64_t fan_in = n / shape[0];
    hi = std::sqrt(3.f / static_cast<float>(fan_in));  // uniform(-a, a) has variance a^2 / 3
    lo = -hi;
  }
  if (normal)
    fill_stream(p, n, key, true, [lo](float x) { return lo * x; });
  else
    fill_stream(p, n, key, false, [lo, hi](float x) { return lo + (hi - lo) * x; });
  return t;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> vision_tensor_shapes(const io::VisionConfig& cfg) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  const int64_t H = cfg.hidden_size, I = cfg.intermediate_size, p = cfg.patch_size;
  const int64_t M = H * cfg.spatial_merge_size * cfg.spatial_merge_size;
  out.push_back({"patch_embed.proj.weight", {H, cfg.in_channels, cfg.temporal_patch_size, p, p}});
  out.push_back({"patch_embed.proj.bias", {H}});
  out.push_back({"pos_embed.weight", {cfg.num_position_embeddings, H}});
  for (int64_t b = 0; b < cfg.depth; ++b) {
    const std::string n = "blocks." + std::to_string(b) + ".";
    for (const char* norm : {"norm1.", "norm2."}) {
      out.push_back({n + norm + "weight", {H}});
      out.push_back({n + norm + "bias", {H}});
    }
    out.push_back({n + "attn.qkv.weight", {3 * H, H}});
    out.push_back({n + "attn.qkv.bias", {3 * H}});
    out.push_back({n + "attn.proj.weight", {H, H}});
    out.push_back({n + "attn.proj.bias", {H}});
    out.push_back({n + "mlp.linear_fc1.weight", {I, H}});
    out.push_back({n + "mlp.linear_fc1.bias", {I}});
    out.push_back({n + "mlp.linear_fc2.weight", {H, I}});
    out.push_back({n + "mlp.linear_fc2.bias", {H}});
  }
  auto merger = [&](const std::string& n, bool postshuffle) {
    const int64_t norm_dim = postshuffle ? M : H;
    out.push_back({n + "norm.weight", {norm_dim}});
    out.push_back({n + "norm.bias", {norm_dim}});
    out.push_back({n + "linear_fc1.weight", {M, M}});
    out.push_back({n + "linear_fc1.bias", {M}});
    out.push_back({n + "linear_fc2.weight", {cfg.out_hidden_size, M}});
    out.push_back({n + "linear_fc2.bias", {cfg.out_hidden_size}});
  };
  merger("merger.", false);
  for (size_t j = 0; j < cfg.deepstack_visual_indexes.size(); ++j)
    merger("deepstack_merger_list." + std::to_string(j) + ".", true);
  return out;
}

std::vector<std::vector<float>> random_sere_similarity(const io::TextConfig& cfg, uint64_t seed) {
  std::vector<std::vector<float>> sim(static_cast<size_t>(cfg.num_layers));
  const int64_t E = cfg.num_experts;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    if (!cfg.is_moe_layer(l)) continue;
    std::vector<float>& s = sim[static_cast<size_t>(l)];
    s.assign(static_cast<size_t>(E * E), 0.f);
    const uint64_t key = tensor_key(seed, "sere." + std::to_string(l));
    for (int64_t u = 0; u < E; ++u) {
      s[u * E + u] = 1.f;
      for (int64_t v = u + 1; v < E; ++v) s[u * E + v] = s[v * E + u] = stream_value(key, u * E + v, false);
    }
  }
  return sim;
}

Status write_random_checkpoint(const io::ModelConfig& cfg, const std::string& file, uint64_t seed,
                               float router_skew) {
  RandomTensors store(seed);
  const DecoderWeights w = random_decoder_weights(cfg.text, store, 0, 0, router_skew);
  std::vector<std::pair<std::string, Tensor>> tensors;
  auto add = [&](const std::string& name, const io::TensorView& v) {
    tensors.emplace_back(name, Tensor::wrap(const_cast<void*>(v.data), v.shape, v.dtype));
  };
  const std::string tp = architecture(cfg.arch).text_prefix;
  add(tp + "embed_tokens.weight", w.embed);
  add(tp + "norm.weight", w.final_norm);
  if (!cfg.text.tie_word_embeddings) add("lm_head.weight", w.lm_head);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const DecoderLayerWeights& L = w.layers[l];
    const std::string lp = tp + "layers." + std::to_string(l) + ".";
    add(lp + "input_layernorm.weight", L.in_norm);
    add(lp + "post_attention_layernorm.weight", L.post_norm);
    add(lp + "self_attn.q_proj.weight", L.q);
    add(lp + "self_attn.k_proj.weight", L.k);
    add(lp + "self_attn.v_proj.weight", L.v);
    add(lp + "self_attn.o_proj.weight", L.o);
    add(lp + "self_attn.q_norm.weight", L.q_norm);
    add(lp + "self_attn.k_norm.weight", L.k_norm);
    if (L.moe) {
      add(lp + "mlp.gate.weight", L.router);
      for (size_t e = 0; e < L.gate.size(); ++e) {
        const std::string ep = lp + "mlp.experts." + std::to_string(e) + ".";
        add(ep + "gate_proj.weight", L.gate[e]);
        add(ep + "up_proj.weight", L.up[e]);
        add(ep + "down_proj.weight", L.down[e]);
      }
    } else {
      add(lp + "mlp.gate_proj.weight", L.gate[0]);
      add(lp + "mlp.up_proj.weight", L.up[0]);
      add(lp + "mlp.down_proj.weight", L.down[0]);
    }
  }
  if (cfg.vision)
    for (const auto& [name, shape] : vision_tensor_shapes(*cfg.vision))
      tensors.emplace_back("model.visual." + name, random_vision_tensor(name, shape, seed));
  return io::write_safetensors(file, tensors, {{"format", "pt"}, {"zest_random_weights", std::to_string(seed)}});
}

int64_t text_parameters(const io::TextConfig& c) {
  const int64_t H = c.hidden_size, D = c.head_dim;
  int64_t n = c.vocab_size * H * (c.tie_word_embeddings ? 1 : 2) + H;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    n += 2 * H + 2 * D + (c.num_heads + 2 * c.num_kv_heads) * D * H + H * c.num_heads * D;
    if (c.is_moe_layer(l))
      n += c.num_experts * H + c.num_experts * 3 * c.moe_intermediate_size * H;
    else
      n += 3 * c.intermediate_size * H;
  }
  return n;
}

int64_t vision_parameters(const io::VisionConfig& cfg) {
  int64_t n = 0;
  for (const auto& [name, shape] : vision_tensor_shapes(cfg)) n += numel_of(shape);
  return n;
}

}  // namespace zest::model
