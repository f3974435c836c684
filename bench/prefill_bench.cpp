// Prefill benchmark of zest's CUDA text decoder (model::create_cuda_decoder) at real model shapes: random
// bf16 weights of a few decoder layers synthesised in host memory, one prefill forward of T tokens (one
// sequence from position 0) timed end to end (forward() returns host logits, so it synchronises), median
// of --runs after one warm-up. A second, 1-layer decoder over the same weights separates the per-layer
// time from the embed/final-norm/lm_head part, which extrapolates the full-depth prefill time.
//   bench_prefill_bench --config qwen3-30b-a3b --tokens 512,2048,8192 --layers 2 [--runs 5]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/backend.h"
#include "model/decoder.h"

namespace {

using namespace zest;

constexpr double kPeakFlops = 989e12;  // H200 dense bf16 tensor-core peak, FLOP/s

// The text shape of a named real model with `layers` decoder layers; full_layers gets the model's depth.
bool named_config(const std::string& name, int64_t layers, io::TextConfig* c, int64_t* full_layers) {
  if (name != "qwen3-30b-a3b") return false;
  c->vocab_size = 151936;
  c->hidden_size = 2048;
  c->num_layers = layers;
  c->num_heads = 32;
  c->num_kv_heads = 4;
  c->head_dim = 128;
  c->intermediate_size = 6144;
  c->moe_intermediate_size = 768;
  c->num_experts = 128;
  c->num_experts_per_tok = 8;
  c->norm_topk_prob = true;
  c->rms_norm_eps = 1e-6;
  c->rope_theta = 1e6;
  c->max_position_embeddings = 40960;
  c->tie_word_embeddings = false;
  *full_layers = 48;
  return true;
}

// Host bf16 tensors with random contents; views stay valid while the store lives.
class HostWeights {
 public:
  explicit HostWeights(uint64_t seed) : seed_(seed) {}

  // A [shape] bf16 tensor of approximately N(0, std^2) values (Irwin-Hall sum of four uniforms).
  io::TensorView normal(const std::string& name, std::vector<int64_t> shape, float stddev) {
    return make(name, std::move(shape), [stddev](uint64_t r) {
      const float s = static_cast<float>(r & 0xffff) + static_cast<float>((r >> 16) & 0xffff) +
                      static_cast<float>((r >> 32) & 0xffff) + static_cast<float>(r >> 48);
      return (s / 65536.f - 2.f) * 1.7320508f * stddev;  // mean 2, variance 1/3 before scaling
    });
  }
  // A [shape] bf16 tensor of values uniform in [lo, hi) (norm weights).
  io::TensorView uniform(const std::string& name, std::vector<int64_t> shape, float lo, float hi) {
    return make(name, std::move(shape), [lo, hi](uint64_t r) {
      return lo + (hi - lo) * static_cast<float>(r >> 40) / 16777216.f;
    });
  }

 private:
  template <class Dist>
  io::TensorView make(const std::string& name, std::vector<int64_t> shape, Dist dist) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::unique_ptr<uint16_t[]> buf(new uint16_t[static_cast<size_t>(n)]);  // filled below
    uint16_t* p = buf.get();
    const uint64_t base = seed_ * 0x9E3779B97F4A7C15ull + (++count_) * 0xD1B54A32D192ED03ull;
    constexpr int64_t kChunk = 1 << 16;
    parallel_for((n + kChunk - 1) / kChunk, 1, [&](int64_t b, int64_t e) {
      for (int64_t c = b; c < e; ++c) {
        uint64_t state = base ^ (static_cast<uint64_t>(c) * 0xBF58476D1CE4E5B9ull);
        for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
          uint64_t z = (state += 0x9E3779B97F4A7C15ull);  // splitmix64
          z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
          z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
          p[i] = f32_to_bf16(dist(z ^ (z >> 31)));
        }
      }
    });
    io::TensorView v;
    v.name = name;
    v.dtype = DType::BF16;
    v.shape = std::move(shape);
    v.data = p;
    v.nbytes = static_cast<size_t>(n) * 2;
    bufs_.push_back(std::move(buf));
    return v;
  }

  uint64_t seed_;
  uint64_t count_ = 0;
  std::vector<std::unique_ptr<uint16_t[]>> bufs_;
};

// Random weights of the text decoder of `c` (per-expert nn.Linear layout, std 1/sqrt(fan_in)).
model::DecoderWeights synthesise(const io::TextConfig& c, HostWeights& hw) {
  model::DecoderWeights w;
  w.config = c;
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads;
  const int64_t E = c.num_experts, I = c.moe_intermediate_size;
  auto sd = [](int64_t fan_in) { return 1.f / std::sqrt(static_cast<float>(fan_in)); };
  w.embed = hw.normal("embed_tokens", {c.vocab_size, H}, 1.f);
  w.final_norm = hw.uniform("norm", {H}, 0.5f, 1.5f);
  w.lm_head = hw.normal("lm_head", {c.vocab_size, H}, sd(H));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    model::DecoderLayerWeights L;
    L.in_norm = hw.uniform(p + "input_layernorm", {H}, 0.5f, 1.5f);
    L.post_norm = hw.uniform(p + "post_attention_layernorm", {H}, 0.5f, 1.5f);
    L.q = hw.normal(p + "q_proj", {Hq * D, H}, sd(H));
    L.k = hw.normal(p + "k_proj", {Hkv * D, H}, sd(H));
    L.v = hw.normal(p + "v_proj", {Hkv * D, H}, sd(H));
    L.o = hw.normal(p + "o_proj", {H, Hq * D}, sd(Hq * D));
    L.q_norm = hw.uniform(p + "q_norm", {D}, 0.5f, 1.5f);
    L.k_norm = hw.uniform(p + "k_norm", {D}, 0.5f, 1.5f);
    L.moe = true;
    L.router = hw.normal(p + "router", {E, H}, sd(H));
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = p + "experts." + std::to_string(e) + ".";
      L.gate.push_back(hw.normal(ep + "gate_proj", {I, H}, sd(H)));
      L.up.push_back(hw.normal(ep + "up_proj", {I, H}, sd(H)));
      L.down.push_back(hw.normal(ep + "down_proj", {H, I}, sd(I)));
    }
    w.layers.push_back(std::move(L));
  }
  return w;
}

// FLOPs of one decoder layer over a T-token prefill: 2 * (attention projections + router + top-k experts'
// SwiGLU weights) per token, plus causal attention (QK^T and PV over T^2/2 pairs).
double layer_flops(const io::TextConfig& c, int64_t T, double* attention) {
  const double H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads;
  const double params = H * (Hq + 2 * Hkv) * D + Hq * D * H + c.num_experts * H +
                        c.num_experts_per_tok * 3.0 * c.moe_intermediate_size * H;
  *attention = 2.0 * 2.0 * (static_cast<double>(T) * T / 2.0) * Hq * D;
  return 2.0 * params * T + *attention;
}

// FLOPs outside the layers: the lm_head over the one row of logits a prefill returns.
double head_flops(const io::TextConfig& c) { return 2.0 * c.vocab_size * c.hidden_size; }

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
};

// Times `runs` prefill forwards of `T` random tokens (one sequence from position 0) after one warm-up;
// the sequence's KV blocks are reserved before and released after each forward (outside the timing).
Result<Timing> time_prefill(const model::TextDecoder& dec, model::PagedKVCache& cache, int64_t T, int runs,
                            uint64_t seed) {
  std::mt19937_64 rng(seed + static_cast<uint64_t>(T));
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(dec.config().vocab_size - 1));
  std::vector<int32_t> table;
  model::ForwardBatch batch;
  batch.tokens.resize(static_cast<size_t>(T));
  batch.positions.resize(static_cast<size_t>(3 * T));
  for (int64_t i = 0; i < T; ++i) {
    batch.tokens[i] = tok(rng);
    for (int r = 0; r < 3; ++r) batch.positions[r * T + i] = static_cast<int32_t>(i);
  }
  model::SeqChunk chunk;
  chunk.block_table = &table;
  chunk.start = 0;
  chunk.length = T;
  batch.seqs.push_back(chunk);
  std::vector<double> ms;
  for (int r = 0; r <= runs; ++r) {
    ZEST_RETURN_IF_ERROR(cache.reserve(table, T));
    const auto t0 = std::chrono::steady_clock::now();
    Result<Tensor> logits = dec.forward(batch, cache);
    const auto t1 = std::chrono::steady_clock::now();
    cache.release(table);
    if (!logits.ok()) return logits.status();
    const float* l = logits->data<float>();
    for (int64_t i = 0; i < logits->numel(); ++i)
      if (!std::isfinite(l[i])) return internal_error("non-finite logit at T=" + std::to_string(T));
    if (r > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return Timing{ms[ms.size() / 2], ms.front(), ms.back()};
}

// Median prefill times (ms) per T of a decoder over `w`.
Result<std::vector<Timing>> run_decoder(const model::DecoderWeights& w, const std::vector<int64_t>& Ts, int runs) {
  ZEST_ASSIGN_OR_RETURN(std::unique_ptr<model::TextDecoder> dec, model::create_cuda_decoder(w));
  const int64_t maxT = *std::max_element(Ts.begin(), Ts.end());
  constexpr int64_t kBlock = 16;  // the CUDA decoder's KV block size
  ZEST_ASSIGN_OR_RETURN(model::PagedKVCache cache, dec->allocate_cache((maxT + kBlock - 1) / kBlock, kBlock));
  std::vector<Timing> out;
  for (int64_t T : Ts) {
    ZEST_ASSIGN_OR_RETURN(Timing t, time_prefill(*dec, cache, T, runs, 1234));
    std::printf("  %lld layer(s), T=%lld: median %.3f ms (min %.3f, max %.3f over %d runs)\n",
                static_cast<long long>(w.config.num_layers), static_cast<long long>(T), t.median_ms, t.min_ms,
                t.max_ms, runs);
    std::fflush(stdout);
    out.push_back(t);
  }
  return out;
}

}  // namespace

int bench_prefill_main(int argc, char** argv) {
  CLI::App app{"zest CUDA prefill benchmark on random weights of a real model shape"};
  std::string config = "qwen3-30b-a3b", tokens = "512,2048,8192";
  int64_t layers = 2;
  int runs = 5;
  app.add_option("--config", config, "model shape: qwen3-30b-a3b");
  app.add_option("--tokens", tokens, "comma-separated prefill lengths T");
  app.add_option("--layers", layers, "decoder layers to simulate (>= 2 separates the per-layer time)")
      ->check(CLI::Range(1, 48));
  app.add_option("--runs", runs, "timed forwards per T (median reported)")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);

  std::vector<int64_t> Ts;
  {
    std::stringstream ss(tokens);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
      const long long t = std::atoll(tok.c_str());
      if (t <= 0) {
        std::fprintf(stderr, "error: bad length '%s' in --tokens (want positive integers, e.g. 512,2048)\n",
                     tok.c_str());
        return 2;
      }
      Ts.push_back(t);
    }
  }
  if (Ts.empty()) {
    std::fprintf(stderr, "error: --tokens is empty\n");
    return 2;
  }
  io::TextConfig cfg;
  int64_t full_layers = 0;
  if (!named_config(config, layers, &cfg, &full_layers)) {
    std::fprintf(stderr, "error: unknown --config '%s' (known: qwen3-30b-a3b)\n", config.c_str());
    return 2;
  }

  if (!kernels::cuda_available()) {
    // Ask the decoder factory for its reason before synthesising gigabytes of weights.
    model::DecoderWeights empty;
    empty.config = cfg;
    auto dec = model::create_cuda_decoder(empty);
    std::fprintf(stderr, "error: %s\n",
                 dec.ok() ? "no usable CUDA GPU found" : dec.status().to_string().c_str());
    return 1;
  }
  Status init = kernels::cuda_init(0);
  if (!init.is_ok()) {
    std::fprintf(stderr, "error: %s\n", init.to_string().c_str());
    return 1;
  }
  std::printf("device: %s\n", kernels::cuda_describe().c_str());

  const auto g0 = std::chrono::steady_clock::now();
  HostWeights hw(7);
  model::DecoderWeights w = synthesise(cfg, hw);
  std::printf("model: %s shapes, %lld of %lld layers simulated, random bf16 weights synthesised in %.1f s\n",
              config.c_str(), static_cast<long long>(layers), static_cast<long long>(full_layers),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count());

  auto main_t = run_decoder(w, Ts, runs);
  if (!main_t.ok()) {
    std::fprintf(stderr, "error: %s\n", main_t.status().to_string().c_str());
    return 1;
  }
  std::vector<Timing> one_t;
  if (layers >= 2) {
    model::DecoderWeights w1 = w;
    w1.layers.resize(1);
    w1.config.num_layers = 1;
    auto r = run_decoder(w1, Ts, runs);
    if (!r.ok()) {
      std::fprintf(stderr, "error: %s\n", r.status().to_string().c_str());
      return 1;
    }
    one_t = std::move(r).value();
  }

  std::printf("\nmeasured, %lld layers (median of %d, wall clock around forward()):\n", static_cast<long long>(layers),
              runs);
  std::printf("| T | ms | tokens/s | TFLOP | TFLOP/s | MFU | attention share of FLOPs |\n|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < Ts.size(); ++i) {
    double attn = 0;
    const double lf = layer_flops(cfg, Ts[i], &attn);
    const double fl = layers * lf + head_flops(cfg);
    const double s = (*main_t)[i].median_ms * 1e-3;
    std::printf("| %lld | %.2f | %.0f | %.3f | %.1f | %.1f%% | %.0f%% |\n", static_cast<long long>(Ts[i]),
                s * 1e3, Ts[i] / s, fl / 1e12, fl / s / 1e12, 100.0 * fl / s / kPeakFlops, 100.0 * attn / lf);
  }
  std::printf("\nextrapolated to %lld layers: time = head part + %lld * per-layer part (%s):\n",
              static_cast<long long>(full_layers), static_cast<long long>(full_layers),
              layers >= 2 ? "per layer = (t[L] - t[1]) / (L - 1), head = t[1] - per layer"
                          : "one layer simulated: head part not separated, counted inside the layer");
  std::printf("| T | per-layer ms | head ms | ms | tokens/s | TFLOP | TFLOP/s | MFU |\n|---|---|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < Ts.size(); ++i) {
    double attn = 0;
    const double fl = full_layers * layer_flops(cfg, Ts[i], &attn) + head_flops(cfg);
    const double tl = (*main_t)[i].median_ms;
    const double per_layer = layers >= 2 ? (tl - one_t[i].median_ms) / (layers - 1) : tl;
    const double head = layers >= 2 ? one_t[i].median_ms - per_layer : 0.0;
    const double s = (head + full_layers * per_layer) * 1e-3;
    std::printf("| %lld | %.3f | %.3f | %.1f | %.0f | %.2f | %.1f | %.1f%% |\n", static_cast<long long>(Ts[i]),
                per_layer, head, s * 1e3, Ts[i] / s, fl / 1e12, fl / s / 1e12, 100.0 * fl / s / kPeakFlops);
  }
  std::printf("FLOPs: 2 * (q/k/v/o + router + %lld routed experts' gate/up/down) per token per layer, causal "
              "attention 2*2*(T^2/2)*heads*head_dim per layer, lm_head for the one returned row; peak %.0f TFLOP/s\n",
              static_cast<long long>(cfg.num_experts_per_tok), kPeakFlops / 1e12);
  return 0;
}
