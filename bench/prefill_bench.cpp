// Prefill benchmark of zest's CUDA text decoder (model::create_cuda_decoder) at real model shapes: random
// bf16 weights synthesised in host memory, one prefill forward of T tokens (one sequence from position 0)
// timed end to end (forward() returns host logits, so it synchronises), median of --runs after one warm-up.
// --layers 0 (the default) runs the whole model, every layer on the device with weights of its own there
// (the host synthesises at most 4 distinct layers and the others view them, so host memory stays small):
// the measured figure is the model's prefill time. With 2 <= --layers < the model's depth, a second,
// 1-layer decoder over the same weights separates the per-layer time from the embed/final-norm/lm_head
// part, which extrapolates the full-depth prefill time.
//   bench_prefill_bench --config qwen3-30b-a3b --tokens 512,2048,8192 [--layers 0] [--runs 5] [--dtype fp8]
// --dtype fp8 (block-wise FP8 weights; FP8 tensor cores unless --fp8-tensor-cores 0) also measures the card's FP8
// tensor-core peak in the same run (cuBLASLt's e4m3 product of 8192^3) and gives each prefill's share of it.
// --ops times each kernel of one decoder layer instead (kernels called directly on random device data,
// CUDA events around each launch, median of --runs after warm-up), with the TFLOP/s of the matmul ops; then the
// paths a layer of this shape does not take (fp32 slots, the decode plan, the wmma experts) for comparison.
//   bench_prefill_bench --config qwen3-30b-a3b --tokens 2048,8192 --ops [--runs 10]
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

#include "backend/cuda.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/backend.h"
#include "model/decoder.h"
#include "model/random_weights.h"

#ifdef ZEST_HAVE_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <functional>

#include "kernels/cuda/kernels.h"
#endif

namespace {

using namespace zest;

constexpr double kPeakFlops = 989e12;  // H200 dense bf16 tensor-core peak, FLOP/s
constexpr int kFp8PeakN = 8192;       // the FP8 peak's product: n x n x n

// The text shape of a named MoE model (model::named_model_config) with `layers` decoder layers;
// full_layers gets the model's depth.
bool named_config(const std::string& name, int64_t layers, io::TextConfig* c, int64_t* full_layers) {
  auto full = model::named_model_config(name);
  if (!full.ok() || !full->is_moe()) return false;
  *c = full->text;
  *full_layers = c->num_layers;
  c->num_layers = layers;
  return true;
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
Result<std::vector<Timing>> run_decoder(const model::DecoderWeights& w, const std::vector<int64_t>& Ts, int runs,
                                        const model::DeviceDecodeOptions& opts = {}) {
  ZEST_ASSIGN_OR_RETURN(std::unique_ptr<model::TextDecoder> dec, model::create_cuda_decoder(w, opts));
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


#ifdef ZEST_HAVE_CUDA
// ---- --ops: per-kernel timing of one decoder layer ---------------------------------------------------------

// Device allocations freed together.
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <class T>
  T* take(size_t n) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)) != cudaSuccess) {
      cudaGetLastError();
      ok_ = false;
      return nullptr;
    }
    ptrs_.push_back(p);
    return static_cast<T*>(p);
  }
  bool ok() const { return ok_; }

 private:
  std::vector<void*> ptrs_;
  bool ok_ = true;
};

Status cu(cudaError_t e, const char* what) {
  return e == cudaSuccess ? Status::ok() : internal_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Median device time (ms) of `fn` over `runs` calls after two warm-ups, CUDA events around each call.
Result<double> time_op(cudaStream_t st, int runs, const std::function<Status()>& fn) {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  ZEST_RETURN_IF_ERROR(cu(cudaEventCreate(&e0), "cudaEventCreate"));
  ZEST_RETURN_IF_ERROR(cu(cudaEventCreate(&e1), "cudaEventCreate"));
  std::vector<double> ms;
  Status s = Status::ok();
  for (int r = 0; r < runs + 2 && s.is_ok(); ++r) {
    s = cu(cudaEventRecord(e0, st), "cudaEventRecord");
    if (s.is_ok()) s = fn();
    if (s.is_ok()) s = cu(cudaEventRecord(e1, st), "cudaEventRecord");
    if (s.is_ok()) s = cu(cudaEventSynchronize(e1), "op");
    float t = 0;
    if (s.is_ok()) s = cu(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
    if (r >= 2) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  ZEST_RETURN_IF_ERROR(s);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// max |a - b| and max |b| of two fp32 device arrays of n elements.
Result<std::pair<double, double>> compare_f32(const float* a, const float* b, size_t n) {
  std::vector<float> ha(n), hb(n);
  ZEST_RETURN_IF_ERROR(cu(cudaMemcpy(ha.data(), a, n * 4, cudaMemcpyDeviceToHost), "copy"));
  ZEST_RETURN_IF_ERROR(cu(cudaMemcpy(hb.data(), b, n * 4, cudaMemcpyDeviceToHost), "copy"));
  double err = 0, ref = 0;
  for (size_t i = 0; i < n; ++i) {
    err = std::max(err, std::isnan(ha[i]) ? INFINITY : std::fabs(static_cast<double>(ha[i]) - hb[i]));
    ref = std::max(ref, std::fabs(static_cast<double>(hb[i])));
  }
  return std::make_pair(err, ref);
}

// Times each kernel of one MoE decoder layer over a T-token prefill (one sequence from position 0) on random
// device data: uniform weights with std 1/sqrt(fan_in), activations uniform in [-1, 1).
Status run_ops(const io::TextConfig& c, int64_t T64, int runs) {
  using cuda::bf16;
  const int T = static_cast<int>(T64), H = static_cast<int>(c.hidden_size), D = static_cast<int>(c.head_dim);
  const int Hq = static_cast<int>(c.num_heads), Hkv = static_cast<int>(c.num_kv_heads);
  const int E = static_cast<int>(c.num_experts), K = static_cast<int>(c.num_experts_per_tok);
  const int I = static_cast<int>(c.moe_intermediate_size), QKV = (Hq + 2 * Hkv) * D;
  const float eps = static_cast<float>(c.rms_norm_eps);
  cudaStream_t st = nullptr;
  ZEST_RETURN_IF_ERROR(cu(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate"));
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } guard{st};
  DeviceArena a;
  const size_t blocks = (static_cast<size_t>(T) + cuda::kKvBlock - 1) / cuda::kKvBlock;
  bf16 *x = a.take<bf16>(size_t(T) * H), *xn = a.take<bf16>(size_t(T) * H), *qkv = a.take<bf16>(size_t(T) * QKV);
  bf16* attn = a.take<bf16>(size_t(T) * Hq * D);
  bf16 *o = a.take<bf16>(size_t(T) * H), *rl = a.take<bf16>(size_t(T) * E), *h = a.take<bf16>(size_t(T) * K * I);
  bf16 *wqkv = a.take<bf16>(size_t(QKV) * H), *wo = a.take<bf16>(size_t(H) * Hq * D), *wr = a.take<bf16>(size_t(E) * H);
  bf16 *gate_up = a.take<bf16>(size_t(E) * 2 * I * H), *down = a.take<bf16>(size_t(E) * H * I);
  bf16 *qn = a.take<bf16>(D), *kn = a.take<bf16>(D), *norm = a.take<bf16>(H);
  bf16 *kc = a.take<bf16>(blocks * cuda::kKvBlock * Hkv * D), *vc = a.take<bf16>(blocks * cuda::kKvBlock * Hkv * D);
  int32_t *pos = a.take<int32_t>(T), *slots = a.take<int32_t>(T), *cus = a.take<int32_t>(2);
  int32_t* ids = a.take<int32_t>(size_t(T) * K);
  float *rw = a.take<float>(size_t(T) * K), *slot_out = a.take<float>(size_t(T) * K * H);
  float* slot_out2 = a.take<float>(size_t(T) * K * H);
  bf16* slot_bf = a.take<bf16>(size_t(T) * K * H);  // the bf16 slot outputs of the decoders' default
  void* plan_buf = a.take<char>(cuda::moe_plan_bytes(T, K, E));
  // FP8 tensor-core paths (other paths below): e4m3 weights and activations, block scales.
  constexpr int kPeakN = 8192;  // the dense FP8 product T x 8192 x 8192 of the same kernel: its best case
  uint8_t *x8 = a.take<uint8_t>(size_t(T) * kPeakN), *h8 = a.take<uint8_t>(size_t(T) * K * I);
  uint8_t *wqkv8 = a.take<uint8_t>(size_t(QKV) * H), *wo8 = a.take<uint8_t>(size_t(H) * Hq * D);
  uint8_t *gate_up8 = a.take<uint8_t>(size_t(E) * 2 * I * H), *down8 = a.take<uint8_t>(size_t(E) * H * I);
  uint8_t* wpeak8 = a.take<uint8_t>(size_t(kPeakN) * kPeakN);
  float *xs = a.take<float>(size_t(T) * kPeakN / 128), *hs = a.take<float>(size_t(T) * K * I / 128);
  float* wscale = a.take<float>(size_t(E) * 2 * I * H / 128);  // scale grids and the quantizer's scratch (all 0)
  bf16* ypeak = a.take<bf16>(size_t(T) * kPeakN);
  if (!a.ok()) return resource_exhausted("--ops: not enough GPU memory for T=" + std::to_string(T));
  cuda::MoePlan plan;
  cuda::moe_plan_bind(plan, plan_buf, T, K, E);
  uint64_t seed = 99;
  auto fill = [&](bf16* p, size_t n, float fan_in) {
    const float r = fan_in > 0 ? std::sqrt(3.f / fan_in) : 1.f;
    return cuda::fill_random_bf16(p, n, ++seed, -r, r, st);
  };
  ZEST_RETURN_IF_ERROR(fill(x, size_t(T) * H, 0));
  ZEST_RETURN_IF_ERROR(fill(xn, size_t(T) * H, 0));
  ZEST_RETURN_IF_ERROR(fill(wqkv, size_t(QKV) * H, H));
  ZEST_RETURN_IF_ERROR(fill(wo, size_t(H) * Hq * D, Hq * D));
  ZEST_RETURN_IF_ERROR(fill(wr, size_t(E) * H, H));
  ZEST_RETURN_IF_ERROR(fill(gate_up, size_t(E) * 2 * I * H, H));
  ZEST_RETURN_IF_ERROR(fill(down, size_t(E) * H * I, I));
  ZEST_RETURN_IF_ERROR(cuda::fill_random_bf16(qn, D, ++seed, 0.5f, 1.5f, st));
  ZEST_RETURN_IF_ERROR(cuda::fill_random_bf16(kn, D, ++seed, 0.5f, 1.5f, st));
  ZEST_RETURN_IF_ERROR(cuda::fill_random_bf16(norm, H, ++seed, 0.5f, 1.5f, st));
  // FP8 codes of the bf16 weights (valid e4m3 bytes; the scales, zero, do not change the time)
  ZEST_RETURN_IF_ERROR(cuda::quantize_rows_fp8(gate_up, gate_up8, wscale, E * 2 * I, H, st));
  ZEST_RETURN_IF_ERROR(cuda::quantize_rows_fp8(down, down8, wscale, E * H, I, st));
  ZEST_RETURN_IF_ERROR(cuda::quantize_rows_fp8(wqkv, wqkv8, wscale, QKV, H, st));
  ZEST_RETURN_IF_ERROR(cuda::quantize_rows_fp8(wo, wo8, wscale, H, Hq * D, st));
  ZEST_RETURN_IF_ERROR(cuda::quantize_rows_fp8(gate_up, wpeak8, wscale, kPeakN * kPeakN / H, H, st));
  ZEST_RETURN_IF_ERROR(cuda::quantize_rows_fp8(gate_up, x8, wscale, T * kPeakN / H, H, st));
  ZEST_RETURN_IF_ERROR(cu(cudaMemsetAsync(wscale, 0, size_t(E) * 2 * I * H / 128 * 4, st), "memset"));
  const cuda::Fp8Weight fqkv{wqkv8, wscale}, fo{wo8, wscale}, fgu{gate_up8, wscale}, fdn{down8, wscale},
      fpeak{wpeak8, wscale};
  std::vector<int32_t> hp(T);
  for (int t = 0; t < T; ++t) hp[t] = t;
  ZEST_RETURN_IF_ERROR(cu(cudaMemcpy(pos, hp.data(), size_t(T) * 4, cudaMemcpyHostToDevice), "copy"));
  ZEST_RETURN_IF_ERROR(cu(cudaMemcpy(slots, hp.data(), size_t(T) * 4, cudaMemcpyHostToDevice), "copy"));
  const int32_t hcu[2] = {0, T};
  ZEST_RETURN_IF_ERROR(cu(cudaMemcpy(cus, hcu, 8, cudaMemcpyHostToDevice), "copy"));
  cuda::RopeParams rope;
  rope.theta = static_cast<float>(c.rope_theta);
  const float scale = 1.f / std::sqrt(static_cast<float>(D));
  const bf16* kq = qkv + Hq * D;
  const bf16* vq = qkv + (Hq + Hkv) * D;

  struct Op {
    std::string name;
    double flops;  // 0: not a matmul op
    bool in_layer;  // counted in the per-layer sum (the other paths are not)
    std::function<Status()> fn;
  };
  const double t = T;
  // The decoders' prefill: bf16 slot outputs where moe_prefill_bf16_slots allows.
  const bool bf16_slots = cuda::moe_prefill_bf16_slots(h, down, E, H, I);
  const std::string slots_in_use = bf16_slots ? "bf16 slots" : "fp32 slots";
  const std::vector<Op> ops = {
      {"qkv gemm", 2 * t * QKV * H, true, [&] { return cuda::gemm(xn, wqkv, qkv, T, QKV, H, st); }},
      {"q/k norm + rope + kv write", 0, true,
       [&] {
         return cuda::qk_norm_rope_kv(qkv, qn, kn, pos, 0, rope, slots, kc, vc, T, Hq, Hkv, D, eps, st);
       }},
      {std::string("prefill attention (") + (T > 256 ? "persistent warp-specialised" : "pipelined wgmma") + ")",
       4 * t * t / 2 * Hq * D, true,
       [&] { return cuda::prefill_attention(qkv, QKV, kq, vq, QKV, cus, 1, T, attn, Hq, Hkv, D, scale, st); }},
      {"o gemm", 2 * t * H * Hq * D, true, [&] { return cuda::gemm(attn, wo, o, T, H, Hq * D, st); }},
      {"residual + rmsnorm", 0, true, [&] { return cuda::add_rmsnorm(x, o, norm, xn, T, H, eps, st); }},
      {"router gemm + top-k", 2 * t * E * H, true,
       [&] {
         ZEST_RETURN_IF_ERROR(cuda::gemm(xn, wr, rl, T, E, H, st));
         return cuda::router_topk(rl, nullptr, ids, rw, T, E, K, st);
       }},
      {"moe plan (moe_plan_prefill)", 0, true, [&] { return cuda::moe_plan_prefill(ids, T, K, E, plan, nullptr, st); }},
      {"moe plan (moe_plan, as decode)", 0, false, [&] { return cuda::moe_plan(ids, T, K, E, plan, nullptr, st); }},
      {"experts gate/up", 2 * t * K * 2 * I * H, true,
       [&] { return cuda::moe_prefill_gate_up(xn, plan, gate_up, h, T, K, E, H, I, st); }},
      {"experts down (" + slots_in_use + ")", 2 * t * K * H * I, true,
       [&] {
         return bf16_slots ? cuda::moe_prefill_down(h, plan, rw, down, slot_bf, T, K, E, H, I, st)
                           : cuda::moe_prefill_down(h, plan, rw, down, slot_out, T, K, E, H, I, st);
       }},
      {"experts down (fp32 slots)", 2 * t * K * H * I, false,
       [&] { return cuda::moe_prefill_down(h, plan, rw, down, slot_out, T, K, E, H, I, st); }},
      {"experts gate/up + down (wmma, the path for widths off the main kernels' tiles)", 2 * t * K * 3 * I * H, false,
       [&] {
         return cuda::moe_experts_prefill_wmma(xn, plan, rw, gate_up, down, h, slot_out2, T, K, E, H, I, st);
       }},
      {"combine + residual + rmsnorm (" + slots_in_use + ")", 0, true,
       [&] {
         return bf16_slots ? cuda::moe_combine_add_rmsnorm(x, slot_bf, ids, K, norm, xn, T, H, eps, st)
                           : cuda::moe_combine_add_rmsnorm(x, slot_out, ids, K, norm, xn, T, H, eps, st);
       }},
      {"combine + residual + rmsnorm (fp32 slots)", 0, false,
       [&] { return cuda::moe_combine_add_rmsnorm(x, slot_out, ids, K, norm, xn, T, H, eps, st); }},
      {"fp8: quantize x per token per 128 columns", 0, false,
       [&] { return cuda::quantize_rows_fp8(xn, x8, xs, T, H, st); }},
      {"fp8 tensor cores: qkv gemm", 2 * t * QKV * H, false,
       [&] { return cuda::gemm_fp8_tc(x8, xs, fqkv, qkv, T, QKV, H, st); }},
      {"fp8 tensor cores: o gemm", 2 * t * H * Hq * D, false,
       [&] { return cuda::gemm_fp8_tc(x8, xs, fo, o, T, H, Hq * D, st); }},
      {"fp8 tensor cores: experts gate/up", 2 * t * K * 2 * I * H, false,
       [&] { return cuda::moe_gate_up_fp8_tc(x8, xs, plan, fgu, h, T, K, E, H, I, st); }},
      {"fp8: quantize h", 0, false, [&] { return cuda::quantize_rows_fp8(h, h8, hs, T * K, I, st); }},
      {"fp8 tensor cores: experts down (fp32 slots)", 2 * t * K * H * I, false,
       [&] { return cuda::moe_down_fp8_tc(h8, hs, plan, rw, fdn, slot_out, T, K, E, H, I, st); }},
      {"fp8 tensor cores: dense T x 8192 x 8192 (the kernel's best case)", 2 * t * kPeakN * kPeakN, false,
       [&] { return cuda::gemm_fp8_tc(x8, xs, fpeak, ypeak, T, kPeakN, kPeakN, st); }},
  };
  // One pass of the layer's ops in order first, so every op's inputs exist (routing, plan, h).
  for (const Op& op : ops)
    if (op.in_layer) ZEST_RETURN_IF_ERROR(op.fn());
  ZEST_RETURN_IF_ERROR(cu(cudaStreamSynchronize(st), "warm-up pass"));
  auto tflops = [](const Op& op, double ms) {
    char buf[32] = "-";
    if (op.flops > 0) std::snprintf(buf, sizeof buf, "%.1f", op.flops / (ms * 1e-3) / 1e12);
    return std::string(buf);
  };
  std::vector<double> ms(ops.size());
  double layer_ms = 0, layer_flops = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (!ops[i].in_layer) continue;
    ZEST_ASSIGN_OR_RETURN(ms[i], time_op(st, runs, ops[i].fn));
    layer_ms += ms[i];
    layer_flops += ops[i].flops;
  }
  std::printf("\nT=%d, one layer, device time per op (median of %d, CUDA events):\n", T, runs);
  std::printf("| op | ms | TFLOP/s | share of layer |\n|---|---|---|---|\n");
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].in_layer)
      std::printf("| %s | %.3f | %s | %.1f%% |\n", ops[i].name.c_str(), ms[i], tflops(ops[i], ms[i]).c_str(),
                  100.0 * ms[i] / layer_ms);
  std::printf("| layer (sum of the ops above) | %.3f | %.1f | 100%% |\n", layer_ms,
              layer_flops / (layer_ms * 1e-3) / 1e12);
  std::fflush(stdout);
  // The experts against the wmma kernels on these inputs (a sanity check; the tests hold the references).
  ZEST_RETURN_IF_ERROR(cuda::moe_experts_prefill(xn, plan, rw, gate_up, down, h, slot_out, T, K, E, H, I, st));
  ZEST_RETURN_IF_ERROR(cuda::moe_experts_prefill_wmma(xn, plan, rw, gate_up, down, h, slot_out2, T, K, E, H, I, st));
  ZEST_RETURN_IF_ERROR(cu(cudaStreamSynchronize(st), "comparison pass"));
  const size_t n_slots = std::min<size_t>(size_t(T) * K * H, size_t{1} << 24);
  ZEST_ASSIGN_OR_RETURN(auto ed, compare_f32(slot_out, slot_out2, n_slots));
  std::printf("experts vs the wmma kernels: max |diff| %.3g (max |out| %.3g, first %zu values)\n", ed.first,
              ed.second, n_slots);
  {  // bf16 slots hold the fp32 slots' values exactly (the tests check every slot; here the first ones)
    ZEST_RETURN_IF_ERROR(cuda::moe_prefill_gate_up(xn, plan, gate_up, h, T, K, E, H, I, st));
    ZEST_RETURN_IF_ERROR(cuda::moe_prefill_down(h, plan, rw, down, slot_out, T, K, E, H, I, st));
    ZEST_RETURN_IF_ERROR(cuda::moe_prefill_down(h, plan, rw, down, slot_bf, T, K, E, H, I, st));
    ZEST_RETURN_IF_ERROR(cu(cudaStreamSynchronize(st), "comparison pass"));
    std::vector<uint16_t> hb(n_slots);
    std::vector<float> hf(n_slots);
    ZEST_RETURN_IF_ERROR(cu(cudaMemcpy(hb.data(), slot_bf, n_slots * 2, cudaMemcpyDeviceToHost), "copy"));
    ZEST_RETURN_IF_ERROR(cu(cudaMemcpy(hf.data(), slot_out, n_slots * 4, cudaMemcpyDeviceToHost), "copy"));
    size_t differ = 0;
    for (size_t i = 0; i < n_slots; ++i) differ += bf16_to_f32(hb[i]) != hf[i];
    std::printf("bf16 slots vs fp32 slots: %zu of the first %zu values differ\n", differ, n_slots);
  }
  // The other paths, one row as each is measured.
  std::printf("\nT=%d, other paths:\n| op | ms | TFLOP/s |\n|---|---|---|\n", T);
  std::fflush(stdout);
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].in_layer) continue;
    ZEST_ASSIGN_OR_RETURN(ms[i], time_op(st, runs, ops[i].fn));
    std::printf("| %s | %.3f | %s |\n", ops[i].name.c_str(), ms[i], tflops(ops[i], ms[i]).c_str());
    std::fflush(stdout);
  }
  return Status::ok();
}

// The card's FP8 tensor-core rate as a well-tuned library reaches it, the yardstick of an FP8 prefill: cuBLASLt's
// e4m3 x e4m3 product of n x n x n (f32 accumulation, bf16 out), the fastest of its heuristic's first four
// candidates (median of `runs` each), in FLOP/s.
Result<double> cublaslt_fp8_peak(int n, int runs) {
  auto ok = [](cublasStatus_t s, const char* what) {
    return s == CUBLAS_STATUS_SUCCESS
               ? Status::ok()
               : internal_error(std::string("cuBLASLt FP8 peak: ") + what + ": status " + std::to_string(int(s)));
  };
  const size_t nn = static_cast<size_t>(n) * n, ws_bytes = 64u << 20;
  DeviceArena arena;
  uint8_t *a = arena.take<uint8_t>(nn), *b = arena.take<uint8_t>(nn), *ws = arena.take<uint8_t>(ws_bytes);
  uint16_t* d = arena.take<uint16_t>(nn);
  if (!arena.ok()) return resource_exhausted("cuBLASLt FP8 peak: not enough GPU memory");
  // codes 0x31 and 0x34 (0.5625, 0.75): finite values, sums far from overflow
  ZEST_RETURN_IF_ERROR(cu(cudaMemset(a, 0x34, nn), "memset"));
  ZEST_RETURN_IF_ERROR(cu(cudaMemset(b, 0x31, nn), "memset"));
  cublasLtHandle_t h = nullptr;
  ZEST_RETURN_IF_ERROR(ok(cublasLtCreate(&h), "handle"));
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;  // FP8 products take A transposed ("TN")
  cublasLtMatmulHeuristicResult_t res[4] = {};
  int found = 0;
  Status st = ok(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  if (st.is_ok()) {
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
    st = ok(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, n, n, n), "layout A");
  }
  if (st.is_ok()) st = ok(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, n, n, n), "layout B");
  if (st.is_ok()) st = ok(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, n, n, n), "layout D");
  if (st.is_ok()) st = ok(cublasLtMatmulPreferenceCreate(&pref), "preference");
  if (st.is_ok()) {
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes));
    st = ok(cublasLtMatmulAlgoGetHeuristic(h, desc, la, lb, ld, ld, pref, 4, res, &found), "heuristic");
  }
  if (st.is_ok() && found == 0) st = internal_error("cuBLASLt FP8 peak: no algorithm for an e4m3 product");
  const float alpha = 1.f, beta = 0.f;
  double best = 0;
  for (int i = 0; st.is_ok() && i < found; ++i) {
    auto ms = time_op(nullptr, runs, [&] {
      return ok(cublasLtMatmul(h, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld, &res[i].algo, ws, ws_bytes,
                               nullptr),
                "matmul");
    });
    if (!ms.ok()) {
      st = ms.status();
      break;
    }
    best = std::max(best, 2.0 * n * n * static_cast<double>(n) / (*ms * 1e-3));
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  for (cublasLtMatrixLayout_t l : {la, lb, ld})
    if (l) cublasLtMatrixLayoutDestroy(l);
  if (desc) cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
  ZEST_RETURN_IF_ERROR(st);
  return best;
}
#endif  // ZEST_HAVE_CUDA
}  // namespace

int bench_prefill_main(int argc, char** argv) {
  CLI::App app{"zest CUDA prefill benchmark on random weights of a real model shape"};
  std::string config = "qwen3-30b-a3b", tokens = "512,2048,8192";
  int64_t layers = 0;
  int runs = 5;
  app.add_option("--config", config, "model shape: qwen3-30b-a3b");
  app.add_option("--tokens", tokens, "comma-separated prefill lengths T");
  app.add_option("--layers", layers,
                 "decoder layers to simulate: 0 (default) = the model's depth, measured whole; 2 up to the depth - 1 "
                 "separates the per-layer time and extrapolates")
      ->check(CLI::Range(0, 1000));
  app.add_option("--runs", runs, "timed forwards per T (median reported)")->check(CLI::Range(1, 100));
  bool per_op = false;
  app.add_flag("--ops", per_op, "time each kernel of one layer (device time, CUDA events) instead of forward()");
  std::string dtype = "bf16";
  app.add_option("--dtype", dtype,
                 "weight format: bf16, or fp8 (block-wise 128x128 as the official -FP8 checkpoints, kept in FP8; "
                 "also measures the card's FP8 tensor-core peak with cuBLASLt for the table's last column)")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  bool fp8_tc = true;
  app.add_option("--fp8-tensor-cores", fp8_tc,
                 "with --dtype fp8: 1 (default) prefill on FP8 tensor cores, activations quantized per token per 128 "
                 "columns; 0 bf16 copies of the weights (DeviceDecodeOptions::fp8_tensor_core_prefill)");
  CLI11_PARSE(app, argc, argv);
  if (per_op && dtype == "fp8") {
    std::fprintf(stderr,
                 "error: --ops times every kernel of a layer, the FP8 ones among the other paths (leave out "
                 "--dtype fp8)\n");
    return 2;
  }

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
    std::fprintf(stderr, "error: unknown --config '%s' (the MoE shapes: qwen3-30b-a3b, qwen3-vl-30b-a3b, qwen3-235b-a22b, qwen3-vl-235b-a22b)\n",
                 config.c_str());
    return 2;
  }
  if (layers == 0) layers = full_layers;
  if (layers > full_layers) {
    std::fprintf(stderr, "error: --layers %lld is more than the %lld layers of %s\n", static_cast<long long>(layers),
                 static_cast<long long>(full_layers), config.c_str());
    return 2;
  }
  cfg.num_layers = layers;
  const bool whole = layers == full_layers;

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
  if (per_op) {
#ifdef ZEST_HAVE_CUDA
    for (int64_t T : Ts) {
      Status s = run_ops(cfg, T, runs);
      if (!s.is_ok()) {
        std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
        return 1;
      }
      std::fflush(stdout);
    }
    return 0;
#else
    std::fprintf(stderr, "error: --ops needs zest built with CUDA\n");
    return 1;
#endif
  }

  const auto g0 = std::chrono::steady_clock::now();
  model::RandomTensors hw(7);
  // At most 4 distinct layers in host memory; the device decoder uploads every layer into its own weights.
  constexpr int64_t kHostLayers = 4;
  model::DecoderWeights w = model::random_decoder_weights(cfg, hw, kHostLayers);
  if (dtype == "fp8") model::quantize_fp8_blockwise(w, hw);
  std::printf("model: %s shapes, %lld of %lld layers on the device (host weights of %lld distinct layers, %.1f GB), "
              "random %s weights synthesised in %.1f s\n",
              config.c_str(), static_cast<long long>(layers), static_cast<long long>(full_layers),
              static_cast<long long>(std::min(layers, kHostLayers)), hw.bytes() / 1e9,
              dtype == "fp8" ? "block-wise FP8" : "bf16", std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count());

  model::DeviceDecodeOptions opts;
  opts.fp8_tensor_core_prefill = fp8_tc;
  auto main_t = run_decoder(w, Ts, runs, opts);
  if (!main_t.ok()) {
    std::fprintf(stderr, "error: %s\n", main_t.status().to_string().c_str());
    return 1;
  }
  std::vector<Timing> one_t;
  if (layers >= 2 && !whole) {
    model::DecoderWeights w1 = w;
    w1.layers.resize(1);
    w1.config.num_layers = 1;
    auto r = run_decoder(w1, Ts, runs, opts);
    if (!r.ok()) {
      std::fprintf(stderr, "error: %s\n", r.status().to_string().c_str());
      return 1;
    }
    one_t = std::move(r).value();
  }

  // FP8: the card's FP8 tensor-core rate measured in this run (cuBLASLt), for the table's last column
  double fp8_peak = 0;
#ifdef ZEST_HAVE_CUDA
  if (dtype == "fp8") {
    auto pk = cublaslt_fp8_peak(kFp8PeakN, 10);
    if (!pk.ok()) {
      std::fprintf(stderr, "error: %s\n", pk.status().to_string().c_str());
      return 1;
    }
    fp8_peak = *pk;
    std::printf("\nFP8 tensor-core peak in this run: %.1f TFLOP/s (cuBLASLt e4m3 product %d x %d x %d, bf16 out)\n",
                fp8_peak / 1e12, kFp8PeakN, kFp8PeakN, kFp8PeakN);
  }
#endif
  std::printf("\nmeasured, %lld layers%s (median of %d, wall clock around forward()):\n",
              static_cast<long long>(layers), whole ? ", the whole model" : "", runs);
  std::printf("| T | ms | tokens/s | TFLOP | TFLOP/s | MFU | attention share of FLOPs |%s\n|---|---|---|---|---|---|---|%s\n",
              fp8_peak > 0 ? " share of FP8 peak |" : "", fp8_peak > 0 ? "---|" : "");
  for (size_t i = 0; i < Ts.size(); ++i) {
    double attn = 0;
    const double lf = layer_flops(cfg, Ts[i], &attn);
    const double fl = layers * lf + head_flops(cfg);
    const double s = (*main_t)[i].median_ms * 1e-3;
    std::printf("| %lld | %.2f | %.0f | %.3f | %.1f | %.1f%% | %.0f%% |", static_cast<long long>(Ts[i]), s * 1e3,
                Ts[i] / s, fl / 1e12, fl / s / 1e12, 100.0 * fl / s / kPeakFlops, 100.0 * attn / lf);
    if (fp8_peak > 0) std::printf(" %.1f%% |", 100.0 * fl / s / fp8_peak);
    std::printf("\n");
  }
  auto print_flops = [&] {
    std::printf("FLOPs: 2 * (q/k/v/o + router + %lld routed experts' gate/up/down) per token per layer, causal "
                "attention 2*2*(T^2/2)*heads*head_dim per layer, lm_head for the one returned row; peak %.0f TFLOP/s\n",
                static_cast<long long>(cfg.num_experts_per_tok), kPeakFlops / 1e12);
  };
  if (whole) {
    print_flops();
    return 0;
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
  print_flops();
  return 0;
}
