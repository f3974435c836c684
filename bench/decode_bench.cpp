// Decode benchmark of zest's CUDA text decoder (model::create_cuda_decoder, the serving decoder) at real model
// shapes on random weights (model::random_decoder_weights; the shapes are model::named_model_config's): every
// sequence's KV cache is filled by a prefill of --context random tokens, then each timed step decodes one token per
// sequence at position --context (the same slot every step, so the attended context stays context + 1) through
// forward_sample with greedy rows, as the engine calls it: a CUDA graph replay, the inputs' upload and the sampled
// tokens' download. TPOT = wall clock per step (median, p90); distinct experts per MoE layer (from the routing of
// untimed steps, or SERE's own counts), bytes per step and the HBM floor (bytes / device-to-device copy bandwidth
// measured in the same run).
//   bench_decode_bench --config qwen3-30b-a3b --batch 1,8,32,64 --context 1024 [--sere-primary 2
//                      --sere-threshold 0] [--skew 1.0] [--layers N] [--steps 200] [--pdl 1] [--profile]
//                      [--timeline 1,8] [--dtype fp8] [--tensor-parallel N [--expert-parallel]]
// --tensor-parallel N: the decoder split over GPUs 0 .. N-1 (model::create_cuda_parallel_decoder: tensor-parallel
// attention, experts split by columns or, with --expert-parallel, placed whole; NCCL all-reduces); the floor then
// counts the step's bytes read by N GPUs at once (bytes / (N x copy bandwidth of GPU 0)). --comm-off times the same
// split decoder with its all-reduces skipped (wrong sums, the same kernels otherwise): against the run with them, the
// share of a step spent in communication.
// --profile: the GPU time of every kernel of one eager step (events between launches, summed per kernel name over
// the layers). --timeline (bench_decode_timeline only: the same program on the kernels built with step-timeline
// records) prints when each kernel of one replayed step was released from its PDL wait (kernels.h); with
// ZEST_TIMELINE_RAW=PATH it also writes every per-CTA record of that step to PATH-b<batch>.txt
// (bench/timeline_raw.py reads it).
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#ifdef ZEST_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <random>

#include <chrono>
#include <map>
#include <memory>
#include <set>

#include "backend/cuda.h"
#include "backend/cuda/cuda_decoder.h"
#include "kernels/backend.h"
#include "kernels/cuda/kernels.h"
#include "model/decoder.h"
#include "model/random_weights.h"

namespace {

using namespace zest;
using namespace zest::cuda;

// --comm-off: communicators whose device all-reduce does nothing (the split decoder's step without communication).
class SkipGroup final : public model::CommunicatorGroup {
 public:
  explicit SkipGroup(int world) {
    for (int r = 0; r < world; ++r) members_.push_back(std::make_unique<Member>(r, world));
  }
  int world() const override { return static_cast<int>(members_.size()); }
  model::Communicator& member(int rank) override { return *members_.at(static_cast<size_t>(rank)); }

 private:
  struct Member final : model::Communicator {
    Member(int r, int w) : r_(r), w_(w) {}
    int rank() const override { return r_; }
    int world() const override { return w_; }
    Status all_reduce_sum(float*, int64_t) override { return Status::ok(); }
    Status broadcast(void*, int64_t, int) override { return Status::ok(); }
    bool reduces_on_device() const override { return true; }
    Status all_reduce_sum_device(void*, int64_t, bool, void*) override { return Status::ok(); }
    int r_, w_;
  };
  std::vector<std::unique_ptr<Member>> members_;
};

bool check(const Status& s, const char* what) {
  if (s.is_ok()) return true;
  std::fprintf(stderr, "error: %s: %s\n", what, s.to_string().c_str());
  return false;
}

bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "error: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

struct Timing {
  double median_ms = 0, p90_ms = 0;
};

Timing summarize(std::vector<float> ms) {
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.median_ms = ms[ms.size() / 2];
  t.p90_ms = ms[std::min(ms.size() - 1, ms.size() * 9 / 10)];
  return t;
}

// Device-to-device copy bandwidth in bytes/s (bytes read + bytes written), 2 GiB buffers (> L2).
bool copy_bandwidth(double* bw) {
  const size_t bytes = 2ull << 30;
  void *a = nullptr, *b = nullptr;
  if (!check(cudaMalloc(&a, bytes), "cudaMalloc") || !check(cudaMalloc(&b, bytes), "cudaMalloc")) return false;
  cudaMemset(a, 1, bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 13; ++i) {
    cudaEventRecord(e0);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 3) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  *bw = 2.0 * bytes / (summarize(ms).median_ms * 1e-3);
  return check(cudaGetLastError(), "copy bandwidth");
}

// Mean time of one sere_reroute launch at N tokens (graph of 100 back-to-back launches, median of 20 replays).
bool time_sere(int N, int E, int K, int S, double* us) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(0.f, 1.f);
  std::vector<float> sim(static_cast<size_t>(E) * E);
  for (int u = 0; u < E; ++u) {
    sim[u * E + u] = 1.f;
    for (int v = u + 1; v < E; ++v) sim[u * E + v] = sim[v * E + u] = d(rng);
  }
  bf16* logits = nullptr;
  float *dsim = nullptr, *w = nullptr;
  int32_t* ids = nullptr;
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaMalloc(&logits, static_cast<size_t>(N) * E * 2);
  cudaMalloc(&dsim, sim.size() * 4);
  cudaMalloc(&w, static_cast<size_t>(N) * K * 4);
  cudaMalloc(&ids, static_cast<size_t>(N) * K * 4);
  cudaMemcpy(dsim, sim.data(), sim.size() * 4, cudaMemcpyHostToDevice);
  if (!check(fill_random_bf16(logits, static_cast<size_t>(N) * E, 99, -3.f, 3.f, s), "fill") ||
      !check(router_topk(logits, nullptr, ids, w, N, E, K, s), "router_topk") ||
      !check(sere_reroute(ids, w, dsim, N, E, K, S, 0.f, s), "sere warm-up") || !check(cudaStreamSynchronize(s), "sync"))
    return false;
  cudaGraph_t g;
  cudaGraphExec_t ge;
  constexpr int kLaunches = 100;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < kLaunches; ++i) (void)sere_reroute(ids, w, dsim, N, E, K, S, 0.f, s);
  if (!check(cudaStreamEndCapture(s, &g), "capture") || !check(cudaGraphInstantiate(&ge, g, 0), "instantiate"))
    return false;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int r = 0; r < 23; ++r) {
    cudaEventRecord(e0, s);
    cudaGraphLaunch(ge, s);
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (r >= 3) ms.push_back(t);
  }
  *us = summarize(ms).median_ms * 1e3 / kLaunches;
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaFree(logits);
  cudaFree(dsim);
  cudaFree(w);
  cudaFree(ids);
  cudaStreamDestroy(s);
  return check(cudaGetLastError(), "sere timing");
}

struct Row {
  int batch;
  bool sere;
  Timing t;
  double experts, bytes, floor_ms;
};

// The decoder, its KV cache filled to `context` tokens for `max_batch` sequences, and the decode step.
struct Bench {
  std::unique_ptr<model::TextDecoder> dec;
  io::TextConfig cfg;
  model::PagedKVCache cache;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> next;  // each sequence's next input token (its last sampled one)
  int context = 0;
  model::RerouteSpec sere;
  model::DeviceDecodeOptions graphs;  // graphs on, one graph per batch size (no padding rows)
  // block-wise FP8 weights (kept in FP8 on the device; the floor counts one byte an element and the 128x128 scales)
  bool fp8 = false;

  Status fill(int max_batch, uint64_t seed) {
    constexpr int64_t kBlock = 16, kChunk = 8192;
    const int64_t per_seq = (context + 1 + kBlock - 1) / kBlock;
    ZEST_ASSIGN_OR_RETURN(cache, dec->allocate_cache(per_seq * max_batch, kBlock));
    tables.assign(static_cast<size_t>(max_batch), {});
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(cfg.vocab_size) - 1);
    next.assign(static_cast<size_t>(max_batch), 0);
    // Prefill chunks of up to kChunk tokens, several sequences per forward.
    model::ForwardBatch fb;
    std::vector<int32_t> pos;  // each token's position (text: the three M-RoPE rows alike)
    auto flush = [&]() -> Status {
      if (fb.seqs.empty()) return Status::ok();
      for (int r = 0; r < 3; ++r) fb.positions.insert(fb.positions.end(), pos.begin(), pos.end());
      ZEST_RETURN_IF_ERROR(dec->forward(fb, cache).status());
      fb = model::ForwardBatch();
      pos.clear();
      return Status::ok();
    };
    for (int s = 0; s < max_batch; ++s) {
      ZEST_RETURN_IF_ERROR(cache.reserve(tables[static_cast<size_t>(s)], context + 1));
      next[static_cast<size_t>(s)] = tok(rng);
      for (int64_t start = 0; start < context;) {
        const int64_t room = kChunk - fb.num_tokens();
        const int64_t len = std::min<int64_t>(room, context - start);
        for (int64_t i = 0; i < len; ++i) {
          fb.tokens.push_back(tok(rng));
          pos.push_back(static_cast<int32_t>(start + i));
        }
        fb.seqs.push_back({&tables[static_cast<size_t>(s)], start, len});
        start += len;
        if (fb.num_tokens() == kChunk) ZEST_RETURN_IF_ERROR(flush());
      }
    }
    ZEST_RETURN_IF_ERROR(flush());
    return Status::ok();
  }

  // One decode step of the first `batch` sequences at position `context`, through forward_sample (greedy).
  Status step(int batch, bool with_sere, const model::MoeHooks* hooks = nullptr) {
    model::ForwardBatch fb;
    fb.tokens.assign(next.begin(), next.begin() + batch);
    fb.positions.assign(3 * static_cast<size_t>(batch), context);
    for (int s = 0; s < batch; ++s) fb.seqs.push_back({&tables[static_cast<size_t>(s)], context, 1});
    model::MoeHooks sere_hooks;
    sere_hooks.reroute = &sere;
    if (!hooks && with_sere) hooks = &sere_hooks;
    ZEST_ASSIGN_OR_RETURN(std::vector<model::SampleResult> out,
                          dec->forward_sample(fb, cache, hooks, std::vector<model::SampleRow>(batch)));
    for (int s = 0; s < batch; ++s) next[static_cast<size_t>(s)] = out[static_cast<size_t>(s)].token;
    return Status::ok();
  }

  // Bytes one step must read at least: the weights it touches (non-expert weights, `distinct_experts` experts per
  // MoE layer, the batch's embedding rows, the final norm, lm_head) plus the batch's KV cache; with FP8 weights the
  // projections and experts at one byte an element plus their f32 block scales (what FP8 kernels would read).
  double bytes_per_step(int batch, double distinct_experts) const {
    const double H = cfg.hidden_size, D = cfg.head_dim, Hq = cfg.num_heads, Hkv = cfg.num_kv_heads;
    const double lin = fp8 ? 1.0 + 4.0 / (128.0 * 128.0) : 2.0;  // bytes per projection / expert element
    double bytes = 0;
    for (int64_t l = 0; l < cfg.num_layers; ++l) {
      bytes += lin * ((Hq + 2 * Hkv) * D * H + H * Hq * D) + 2.0 * (2 * H + 2 * D);
      if (cfg.is_moe_layer(l))
        bytes += 2.0 * cfg.num_experts * H + lin * distinct_experts * 3.0 * cfg.moe_intermediate_size * H;
      else
        bytes += lin * 3.0 * cfg.intermediate_size * H;
      bytes += 2.0 * static_cast<double>(batch) * (context + 1) * Hkv * D * 2;
    }
    return bytes + 2.0 * (batch * H + H + static_cast<double>(cfg.vocab_size) * H);
  }
};

// Mean distinct experts per MoE layer per step over `steps` untimed steps (the routing seen by a host hook, which
// makes these steps eager; the routing is the timed steps').
Result<double> distinct_experts(Bench& b, int batch, int steps) {
  int64_t distinct = 0, layers_seen = 0;
  model::MoeHooks hooks;
  hooks.route = [&](int64_t, int32_t* ids, float*, int64_t n, int64_t k, const std::vector<uint8_t>& active) {
    std::set<int32_t> seen;
    for (int64_t t = 0; t < n; ++t)
      if (active.empty() || active[static_cast<size_t>(t)])
        for (int64_t j = 0; j < k; ++j) seen.insert(ids[t * k + j]);
    distinct += static_cast<int64_t>(seen.size());
    ++layers_seen;
  };
  for (int i = 0; i < steps; ++i) ZEST_RETURN_IF_ERROR(b.step(batch, false, &hooks));
  return layers_seen ? static_cast<double>(distinct) / static_cast<double>(layers_seen) : 0.0;
}

Result<accel::RerouteCounts> total_counts(const model::TextDecoder& dec) {
  ZEST_ASSIGN_OR_RETURN(std::vector<accel::RerouteCounts> per_layer, dec.reroute_counts());
  accel::RerouteCounts sum;
  for (const auto& c : per_layer) sum += c;
  return sum;
}

bool run_batch(Bench& b, int batch, bool sere, int warmup, int steps, Row* row) {
  for (int i = 0; i < 1 + warmup; ++i)  // the first step captures the graph
    if (!check(b.step(batch, sere), "warm-up step")) return false;
  auto before = total_counts(*b.dec);
  if (!check(before.status(), "SERE counts")) return false;
  std::vector<float> ms(steps);
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    if (!check(b.step(batch, sere), "decode step")) return false;
    ms[i] = std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  double experts = 0;
  if (sere) {
    auto after = total_counts(*b.dec);
    if (!check(after.status(), "SERE counts")) return false;
    const int64_t layer_steps = after->steps - before->steps;
    experts = layer_steps ? static_cast<double>(after->distinct_after - before->distinct_after) / layer_steps : 0.0;
  } else {
    auto e = distinct_experts(b, batch, 5);
    if (!check(e.status(), "expert counts")) return false;
    experts = *e;
  }
  row->batch = batch;
  row->sere = sere;
  row->t = summarize(ms);
  row->experts = experts;
  row->bytes = b.bytes_per_step(batch, experts);
  return true;
}

// One eager step (the replay's kernels and arguments) with a CUDA event before every launch: GPU time per kernel
// name, summed over the layers, in first-launch order.
bool print_profile(Bench& b, int batch, bool sere) {
  model::DeviceDecodeOptions eager = b.graphs;
  eager.graphs = model::DeviceDecodeOptions::Graphs::kEager;
  if (!check(cuda::set_decode_options(*b.dec, eager), "eager steps") || !check(b.step(batch, sere), "eager step"))
    return false;
  set_launch_timing(true);
  const Status st = b.step(batch, sere);
  set_launch_timing(false);
  auto times = take_launch_times();
  if (!check(cuda::set_decode_options(*b.dec, b.graphs), "graph steps") || !check(st, "profiled step") ||
      !check(times.status(), "launch times"))
    return false;
  std::vector<std::string> order;
  std::map<std::string, std::pair<double, int>> per;
  double total = 0;
  for (const auto& [name, ms] : *times) {
    if (!per.count(name)) order.push_back(name);
    per[name].first += ms;
    per[name].second += 1;
    total += ms;
  }
  std::printf("    eager step %.3f ms on the GPU (events between launches; a graph replay has fewer gaps), %zu launches:\n",
              total, times->size());
  for (const std::string& name : order)
    std::printf("    %-44s %4d x %8.3f ms %5.1f%%\n", name.c_str(), per[name].second, per[name].first,
                100.0 * per[name].first / total);
  return true;
}

// One replayed step with the step timeline on (kernels.h): per launch, when its CTAs were resident and when their
// PDL wait released, labelled by the launch log of an eager step (the same kernels). Prints, per kernel of a layer
// (averaged over the layers but the first and last), the time from its release to the next kernel's release ("span":
// its part of the layer's critical path), how long before its release its first CTA was resident, and how long after
// the release its last CTA passed the wait (CTAs not resident at release).
bool print_timeline(Bench& b, int batch, int layers, double tpot_ms) {
  model::DeviceDecodeOptions eager = b.graphs;
  eager.graphs = model::DeviceDecodeOptions::Graphs::kEager;
  if (!check(cuda::set_decode_options(*b.dec, eager), "eager steps")) return false;
  set_launch_log(true);
  const Status eager_step = b.step(batch, false);
  set_launch_log(false);
  const std::vector<std::string> names = take_launch_log();
  if (!check(cuda::set_decode_options(*b.dec, b.graphs), "graph steps") || !check(eager_step, "eager step"))
    return false;
  auto buf = alloc_step_timeline(256, 4096);
  if (!check(buf.status(), "timeline buffer")) return false;
  bool ok = check(b.step(batch, false), "replay") && check(set_step_timeline(*buf), "timeline on");
  const auto t0 = std::chrono::steady_clock::now();
  ok = ok && check(b.step(batch, false), "replay");
  const double rec_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ok = check(set_step_timeline(nullptr), "timeline off") && ok;
  long long dropped = 0, orphans = 0;
  auto launches =
      ok ? read_step_timeline(*buf, &dropped, &orphans) : Result<std::vector<TimelineLaunch>>(internal_error("no run"));
  // ZEST_TIMELINE_RAW=PATH: every record of the step as text, for offline analysis: "L index grid label" per launch
  // (in release order), then "R sm grid tag cta t0 t1" per record (tag 0: wait record, k + 1: phase k; ns).
  if (const char* raw = std::getenv("ZEST_TIMELINE_RAW"); ok && raw && launches.ok()) {
    unsigned long long dims[2] = {0, 0};
    cudaMemcpy(dims, *buf, sizeof(dims), cudaMemcpyDeviceToHost);
    std::vector<unsigned long long> all(2 + dims[0] + 4 * dims[0] * dims[1]);
    cudaMemcpy(all.data(), *buf, all.size() * 8, cudaMemcpyDeviceToHost);
    if (FILE* f = std::fopen((std::string(raw) + "-b" + std::to_string(batch) + ".txt").c_str(), "w")) {
      for (size_t i = 0; i < launches->size(); ++i)
        std::fprintf(f, "L %zu %llu %s\n", i, (*launches)[i].grid,
                     i < names.size() && names.size() == launches->size() ? names[i].c_str() : "?");
      for (size_t sm = 0; sm < dims[0]; ++sm)
        for (unsigned long long i = 0; i < std::min(all[2 + sm], dims[1]); ++i) {
          const unsigned long long* r = &all[2 + dims[0] + 4 * (sm * dims[1] + i)];
          std::fprintf(f, "R %zu %llu %llu %llu %llu %llu\n", sm, r[0], r[1] >> 56, r[1] & 0xffffffffull, r[2], r[3]);
        }
      std::fclose(f);
    }
  }
  cudaFree(*buf);
  if (!ok || !check(launches.status(), "read timeline")) return false;
  const std::vector<TimelineLaunch>& k = *launches;
  const int n = static_cast<int>(k.size());
  std::printf("    timeline: %d launches recorded (%zu launched, %lld records dropped, %lld phase stamps unmatched), "
              "step %.3f ms with recording (TPOT %.3f ms without)\n", n, names.size(), dropped, orphans, rec_ms, tpot_ms);
  const bool named = static_cast<int>(names.size()) == n;
  auto label = [&](int i) { return named ? names[i] : std::string("?"); };
  auto us = [](unsigned long long a, unsigned long long b) { return (static_cast<double>(a) - static_cast<double>(b)) / 1e3; };
  // The layer period: the first (prologue p, period L) under which the labels repeat over every layer.
  int p0 = -1, L = 0;
  for (int p = 0; p <= 8 && p0 < 0 && named; ++p)
    for (int l = 1; l <= 64 && p0 < 0; ++l) {
      if (p + l * layers > n) break;
      bool rep = true;
      for (int j = 0; j + l < l * layers && rep; ++j) rep = names[p + j] == names[p + j + l] && k[p + j].ctas == k[p + j + l].ctas;
      if (rep) p0 = p, L = l;
    }
  if (p0 < 0 || layers < 3) {
    for (int i = 0; i + 1 < n; ++i)
      std::printf("    %4d %-40s ctas %4d span %7.2f us early %7.2f late %7.2f\n", i, label(i).c_str(), k[i].ctas,
                  us(k[i + 1].first_release, k[i].first_release), us(k[i].first_release, k[i].first_ready),
                  us(k[i].last_release, k[i].first_release));
    return true;
  }
  std::printf("    per layer (%d kernels, mean over layers 2-%d; us): span = release to the next kernel's release, early = "
              "first CTA resident before release, late = last CTA's release after the first\n", L, layers - 1);
  std::printf("    phases: the kernel's own stamps (0 = first instruction), us after its release, first / last CTA\n");
  std::printf("    | kernel | CTAs | span | early | late | phases |\n    |---|---|---|---|---|---|\n");
  double total = 0;
  for (int j = 0; j < L; ++j) {
    double span = 0, early = 0, late = 0, ph_first[8] = {}, ph_last[8] = {};
    for (int l = 1; l + 1 < layers; ++l) {
      const int i = p0 + l * L + j;
      span += us(k[i + 1].first_release, k[i].first_release);
      early += us(k[i].first_release, k[i].first_ready);
      late += us(k[i].last_release, k[i].first_release);
      for (int f = 0; f < 8; ++f)
        if (k[i].phase_count[f] > 0) {
          ph_first[f] += us(k[i].phase_first[f], k[i].first_release);
          ph_last[f] += us(k[i].phase_last[f], k[i].first_release);
        }
    }
    const double m = layers - 2;
    total += span / m;
    std::string phases;
    for (int f = 0; f < 8; ++f)
      if (k[p0 + L + j].phase_count[f] > 0) {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%sp%d %.2f / %.2f", phases.empty() ? "" : ", ", f, ph_first[f] / m,
                      ph_last[f] / m);
        phases += buf;
      }
    std::printf("    | %s | %d | %.2f | %.2f | %.2f | %s |\n", label(p0 + L + j).c_str(), k[p0 + L + j].ctas, span / m,
                early / m, late / m, phases.c_str());
  }
  std::printf("    layer: %.2f us (%.3f ms for %d layers); step from first to last release %.3f ms\n", total,
              total * layers / 1e3, layers, us(k[n - 1].first_release, k[0].first_release) / 1e3);
  for (int i = p0 + L * layers; i < n; ++i)
    std::printf("    after the layers: %-32s ctas %4d span to next %s\n", label(i).c_str(), k[i].ctas,
                i + 1 < n ? std::to_string(us(k[i + 1].first_release, k[i].first_release)).c_str() : "-");
  return true;
}

}  // namespace

int bench_decode_main(int argc, char** argv) {
  CLI::App app{"zest CUDA decode benchmark: the serving decoder on random weights at a named model's shapes"};
  std::string config = "qwen3-30b-a3b", batches = "1,8,32,64";
  int context = 1024, layers = 0, steps = 200, warmup = 20, sere_primary = 0, pdl = 1;
  float sere_threshold = 0.f, skew = 0.f;
  app.add_option("--config", config, "a named shape: qwen3-30b-a3b | qwen3-vl-30b-a3b | qwen3-235b-a22b | qwen3-vl-235b-a22b | ...");
  app.add_option("--batch", batches, "comma-separated batch sizes");
  app.add_option("--context", context, "tokens already in each sequence's KV cache")->check(CLI::NonNegativeNumber);
  app.add_option("--layers", layers, "override the number of decoder layers (0: the model's)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--steps", steps, "timed decode steps per batch size")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed decode steps before timing")->check(CLI::NonNegativeNumber);
  app.add_option("--sere-primary", sere_primary, "SERE primary ranks S (0: off); also runs without SERE")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--sere-threshold", sere_threshold, "SERE similarity threshold rho");
  app.add_option("--skew", skew, "Zipf exponent of the random router bias (0: none)")->check(CLI::NonNegativeNumber);
  app.add_option("--pdl", pdl, "programmatic dependent launch between kernels (0/1)");
  std::string dtype = "bf16";
  app.add_option("--dtype", dtype, "weight format: bf16, or fp8 (block-wise 128x128, as the official -FP8 checkpoints)")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  bool stream_fp8 = true;
  app.add_option("--fp8-stream-experts", stream_fp8,
                 "with --dtype fp8: 1 (default) decode experts through the weight-streaming kernel over FP8 rows from "
                 "two tokens, 0 the per-tile FP8 kernel (DeviceDecodeOptions::fp8_stream_experts)");
  bool profile = false;
  app.add_flag("--profile", profile, "also print the GPU time of every kernel of one eager step per batch");
  model::ParallelOptions par;
  app.add_option("--tensor-parallel", par.tensor_parallel, "split the decoder over GPUs 0 .. N-1 (NCCL)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--expert-parallel", par.expert_parallel,
               "with --tensor-parallel: place whole experts on the GPUs instead of splitting each expert's columns");
  bool comm_off = false;
  app.add_flag("--comm-off", comm_off,
               "with --tensor-parallel: skip the all-reduces (wrong sums; the step time without communication)");
  std::string timeline;
  app.add_option("--timeline", timeline,
                 "batch sizes (comma-separated) at which one replayed step's kernel timeline is printed (PDL-wait "
                 "release times per launch; SERE off)");
  CLI11_PARSE(app, argc, argv);

  std::vector<int> bs;
  {
    std::stringstream ss(batches);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
      const int b = std::atoi(tok.c_str());
      if (b <= 0) {
        std::fprintf(stderr, "error: bad batch size '%s' in --batch (want positive integers, e.g. 1,8,32)\n", tok.c_str());
        return 2;
      }
      bs.push_back(b);
    }
  }
  if (bs.empty()) {
    std::fprintf(stderr, "error: --batch is empty\n");
    return 2;
  }
  const int world = par.tensor_parallel;
  if (world > 1 && (profile || !timeline.empty())) {
    std::fprintf(stderr, "error: --profile and --timeline time one GPU's decoder: leave out --tensor-parallel\n");
    return 2;
  }
  if (!timeline.empty() && !step_timeline_built()) {
    std::fprintf(stderr, "error: --timeline needs the kernels built with step-timeline records: run "
                         "bench_decode_timeline (same options)\n");
    return 2;
  }
  auto mcfg = model::named_model_config(config, layers);
  if (!check(mcfg.status(), "config")) return 2;
  if (!check(kernels::cuda_init(0), "cuda_init")) return 1;
  set_programmatic_launch(pdl != 0);
  std::printf("device: %s\n", kernels::cuda_describe().c_str());
  double bw = 0;
  if (!copy_bandwidth(&bw)) return 1;
  std::printf("device-to-device copy bandwidth: %.2f TB/s (read + write, 2 GiB buffers)\n", bw / 1e12);

  Bench b;
  b.cfg = mcfg->text;
  b.context = context;
  b.graphs.graph_padding = false;  // one graph per batch size: each row of the table is that many sequences
  const auto g0 = std::chrono::steady_clock::now();
  model::RandomTensors hw(7);
  // At most 4 distinct layers in host memory; the device decoder uploads every layer into weights of its own.
  model::DecoderWeights w = model::random_decoder_weights(b.cfg, hw, 4, 0, skew);
  b.fp8 = dtype == "fp8";
  b.graphs.fp8_stream_experts = stream_fp8;
  if (b.fp8) model::quantize_fp8_blockwise(w, hw);
  std::unique_ptr<model::CommunicatorGroup> group;
  if (comm_off && world > 1) group = std::make_unique<SkipGroup>(world);
  auto dec = model::create_cuda_parallel_decoder(w, par, b.graphs, std::move(group));  // one GPU unless --tensor-parallel
  if (!check(dec.status(), "decoder")) return 1;
  b.dec = std::move(dec).value();
  const int max_batch = *std::max_element(bs.begin(), bs.end());
  if (!check(b.fill(max_batch, 11), "prefill of the contexts")) return 1;
  if (sere_primary > 0) {
    b.sere.params.primary = sere_primary;
    b.sere.params.threshold = sere_threshold;
    b.sere.params.layer_thresholds.assign(static_cast<size_t>(b.cfg.num_layers), sere_threshold);
    b.sere.similarity = model::random_sere_similarity(b.cfg, 13);
    if (!check(b.sere.params.validate(b.cfg.num_layers), "SERE")) return 2;
  }
  if (world > 1)
    std::printf("split over GPUs 0 .. %d: tensor-parallel attention, experts %s, %s\n", world - 1,
                par.expert_parallel ? "placed whole (expert parallel)" : "split by columns",
                comm_off ? "all-reduces SKIPPED (--comm-off: step time without communication)" : "NCCL all-reduces");
  std::printf("model: %s shapes, %lld layers, random %s weights (skew %.2f), %d sequences prefilled to context %d in "
              "%.1f s; pdl %d, %d steps (median, p90 of the wall clock per forward_sample)\n",
              config.c_str(), static_cast<long long>(b.cfg.num_layers),
              b.fp8 ? "block-wise FP8" : "bf16", skew, max_batch, context,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count(), pdl, steps);

  std::vector<Row> rows;
  for (int batch : bs) {
    for (bool sere : {false, true}) {
      if (sere && sere_primary <= 0) continue;
      Row r;
      if (!run_batch(b, batch, sere, warmup, steps, &r)) return 1;
      r.floor_ms = r.bytes / (bw * world) * 1e3;  // N GPUs read their shares at once
      rows.push_back(r);
      std::printf("  batch %d%s: TPOT %.3f ms\n", batch, sere ? " +SERE" : "", r.t.median_ms);
      if (profile && !print_profile(b, batch, sere)) return 1;
      const bool timeline_here = ("," + timeline + ",").find("," + std::to_string(batch) + ",") != std::string::npos;
      if (!sere && timeline_here && !print_timeline(b, batch, static_cast<int>(b.cfg.num_layers), r.t.median_ms))
        return 1;
      std::fflush(stdout);
    }
  }
  double sere_us = 0, sere_one_us = 0;
  if (!time_sere(256, 128, 8, 2, &sere_us)) return 1;
  if (!time_sere(1, 128, 8, 2, &sere_one_us)) return 1;  // one token: about the launch-to-launch floor

  std::printf("\n| batch | SERE | TPOT median ms | TPOT p90 ms | tokens/s | experts/layer | GB/step | floor ms | floor share |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    char sere_col[64] = "off";
    if (r.sere) std::snprintf(sere_col, sizeof(sere_col), "S=%d rho=%.2f", sere_primary, sere_threshold);
    std::printf("| %d | %s | %.3f | %.3f | %.0f | %.1f | %.3f | %.3f | %.1f%% |\n", r.batch, sere_col, r.t.median_ms,
                r.t.p90_ms, r.batch * 1e3 / r.t.median_ms, r.experts, r.bytes / 1e9, r.floor_ms,
                100.0 * r.floor_ms / r.t.median_ms);
  }
  for (size_t i = 0; i + 1 < rows.size(); ++i)
    if (!rows[i].sere && rows[i + 1].sere && rows[i].batch == rows[i + 1].batch)
      std::printf("SERE at batch %d: TPOT %.3f -> %.3f ms (%.1f%% lower), experts/layer %.1f -> %.1f\n", rows[i].batch,
                  rows[i].t.median_ms, rows[i + 1].t.median_ms,
                  100.0 * (1.0 - rows[i + 1].t.median_ms / rows[i].t.median_ms), rows[i].experts, rows[i + 1].experts);
  std::printf("sere_reroute alone (N=256, E=128, K=8, S=2): %.2f us per launch (graph of 100 launches; N=1: %.2f "
              "us)\n", sere_us, sere_one_us);
  std::fflush(stdout);
  return 0;
}

#else

int bench_decode_main(int argc, char** argv) {
  CLI::App app{"zest CUDA decode benchmark"};
  app.allow_extras();
  CLI11_PARSE(app, argc, argv);
  std::fprintf(stderr, "bench_decode_bench: zest was built without CUDA (configure with -DZEST_CUDA=ON)\n");
  return 2;
}

#endif
