// Multi-image TTFT benchmark of the CUDA vision path: random-weight Qwen3-VL vision tower at real shapes,
// VisionZip scoring + selection + gathers, and the decoder prefill of the resulting prompt.
//   bench_ttft_bench --config qwen3-vl-30b-a3b --images 1,8,30 --image-size 640x480
//                    --vision-prune-rate 0,0.3,0.4,0.5 [--mode uniform|global] [--iters 5] [--text-tokens 64]
//                    [--prefill-iters 3] [--group 8] [--dtype fp8]
// Per (images, rate): CPU preprocessing (JPEG decode + smart_resize + patchify + bf16 of synthetic images,
// one image per worker thread), the host-to-device copy, the tower (CUDA events, median of --iters), scoring
// + selection + gathers (wall clock, including the one device-to-host copy of the kept counts and indices),
// and the decoder prefill.
// Measured prefill: the full-depth CUDA decoder (model::create_cuda_decoder) over random host weights (one
// synthesised layer and one synthesised expert shared by every layer and expert; the values do not change
// the work), one forward of the request's prompt (kept visual tokens, then the text tokens) with M-RoPE
// positions of the kept tokens and the three DeepStack features, visual rows read from device memory
// (ForwardBatch::mm_device); wall clock around forward(), which returns the last token's logits.
// Also per image count: the tower with its epilogues as separate kernels (before the fusion), and the front
// end pipelined in groups of --group images (host decodes/preprocesses group g + 1 while the tower runs g).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#ifdef ZEST_HAVE_CUDA
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>


#include "backend/cuda.h"
#include "backend/cuda/vision_tower.h"
#include "backend/cuda/visionzip_plan.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "io/image.h"
#include "kernels/backend.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/vision_kernels.h"
#include "model/decoder.h"
#include "model/kv_cache.h"
#include "model/random_weights.h"
#include "vision/preprocess.h"

namespace {

using namespace zest;
using namespace zest::cuda;
using Clock = std::chrono::steady_clock;

constexpr double kPeakBf16 = 989.4e12;  // H200 SXM dense bf16 tensor-core peak, FLOP/s

bool ok(const Status& s, const char* what) {
  if (s.is_ok()) return true;
  std::fprintf(stderr, "error: %s: %s\n", what, s.to_string().c_str());
  return false;
}
bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "error: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A synthetic photo-like JPEG (gradients + per-pixel noise, quality 90); seed varies the content.
std::vector<uint8_t> make_jpeg(int w, int h, uint32_t seed) {
  io::Image img;
  img.width = w;
  img.height = h;
  img.rgb.resize(static_cast<size_t>(w) * h * 3);
  std::mt19937 rng(seed);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* px = &img.rgb[(static_cast<size_t>(y) * w + x) * 3];
      const int n = static_cast<int>(rng() % 24);
      px[0] = static_cast<uint8_t>((x * 255 / w + n + seed * 7) & 255);
      px[1] = static_cast<uint8_t>((y * 255 / h + n) & 255);
      px[2] = static_cast<uint8_t>(((x + y) / 16 * 37 + n) & 255);
    }
  return io::encode_jpeg(img, 90).value();
}

template <typename T>
std::vector<T> parse_list(const std::string& s) {
  std::vector<T> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::stringstream is(item);
    T v{};
    is >> v;
    out.push_back(v);
  }
  return out;
}

// M-RoPE positions of the visual tokens of images with merged grids (rows, cols), one frame each, as three
// rows t, h, w of V columns: image tokens at (start, start + r, start + c), the next image starting after
// the previous one's largest position. *next receives the first text position after the images.
std::vector<std::vector<int32_t>> visual_positions(const std::vector<std::pair<int, int>>& merged, int32_t* next) {
  std::vector<std::vector<int32_t>> pos(3);
  int32_t start = 0;
  for (const auto& [rows, cols] : merged) {
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        pos[0].push_back(start);
        pos[1].push_back(start + r);
        pos[2].push_back(start + c);
      }
    start += std::max(rows, cols);
  }
  *next = start;
  return pos;
}

// One prefill forward of the full-depth decoder per call: kept visual tokens (their rows and DeepStack
// features on the device), then text tokens; the KV blocks are reserved and released around the call.
class MeasuredPrefill {
 public:
  Status init(io::TextConfig c, int max_tokens, bool fp8) {
    c.tie_word_embeddings = true;  // one host/device copy of the [vocab, hidden] matrix
    const auto t0 = Clock::now();
    // One layer and one expert synthesised; every layer's and expert's views point at them.
    model::DecoderWeights w = model::random_decoder_weights(c, host_, 1, 1);
    if (fp8) model::quantize_fp8_blockwise(w, host_);  // the decoder's projections and experts; the tower stays bf16
    ZEST_ASSIGN_OR_RETURN(dec_, model::create_cuda_decoder(w));
    constexpr int64_t kBlock = 16;
    ZEST_ASSIGN_OR_RETURN(model::PagedKVCache cache, dec_->allocate_cache((max_tokens + kBlock - 1) / kBlock, kBlock));
    cache_ = std::make_unique<model::PagedKVCache>(std::move(cache));
    std::printf("measured prefill: %lld-layer %s decoder built and uploaded in %.1f s\n",
                static_cast<long long>(c.num_layers), fp8 ? "block-wise FP8" : "bf16", ms_since(t0) / 1e3);
    return Status::ok();
  }
  // visual: kept visual tokens (rows of `embeds` / `deepstack` on the device), vis_pos [3][visual] their
  // positions, then `text` text tokens from position text_start. Returns the wall time in ms.
  Result<double> run(int visual, const std::vector<std::vector<int32_t>>& vis_pos, int text, int32_t text_start,
                     const bf16* embeds, const std::vector<const bf16*>& deepstack, uint64_t seed) {
    const int T = visual + text;
    model::ForwardBatch b;
    b.tokens.resize(T);
    b.positions.resize(3 * static_cast<size_t>(T));
    std::mt19937 rng(static_cast<uint32_t>(seed));
    for (int i = 0; i < T; ++i) {
      b.tokens[i] = i < visual ? kImagePad : static_cast<int32_t>(rng() % 150000);
      for (int r = 0; r < 3; ++r)
        b.positions[static_cast<size_t>(r) * T + i] = i < visual ? vis_pos[r][i] : text_start + (i - visual);
      if (i < visual) b.mm_index.push_back(i);
    }
    model::ForwardBatch::DeviceRows rows;
    rows.embeds = embeds;
    for (const bf16* d : deepstack) rows.deepstack.push_back(d);
    rows.rows = visual;
    b.mm_device.push_back(rows);
    model::SeqChunk chunk;
    chunk.block_table = &table_;
    chunk.start = 0;
    chunk.length = T;
    b.seqs.push_back(chunk);
    ZEST_RETURN_IF_ERROR(cache_->reserve(table_, T));
    const auto t0 = Clock::now();
    Result<Tensor> logits = dec_->forward(b, *cache_);
    const double ms = ms_since(t0);
    cache_->release(table_);
    if (!logits.ok()) return logits.status();
    for (int64_t i = 0; i < logits->numel(); ++i)
      if (!std::isfinite(logits->data<float>()[i])) return internal_error("non-finite prefill logit");
    return ms;
  }

 private:
  static constexpr int32_t kImagePad = 151655;
  model::RandomTensors host_{7};
  std::unique_ptr<model::TextDecoder> dec_;
  std::unique_ptr<model::PagedKVCache> cache_;
  std::vector<int32_t> table_;
};

// Median time in ms of `fn` enqueued on `s` (CUDA events), after one warm-up.
template <typename F>
double time_gpu(int iters, cudaStream_t s, F fn, bool* good) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<double> ms;
  for (int i = 0; i <= iters; ++i) {
    cudaEventRecord(e0, s);
    if (!fn()) *good = false;
    cudaEventRecord(e1, s);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i > 0) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return median(ms);
}

// Measured bf16 GEMM throughput through cuda::gemm (FLOP/s) at 8192^3.
double gemm_throughput(cudaStream_t s) {
  const int n = 8192;
  bf16 *a = nullptr, *b = nullptr, *c = nullptr;
  cudaMalloc(&a, size_t(n) * n * 2);
  cudaMalloc(&b, size_t(n) * n * 2);
  cudaMalloc(&c, size_t(n) * n * 2);
  bool good = fill_random_bf16(a, size_t(n) * n, 1, -1, 1, s).is_ok() &&
              fill_random_bf16(b, size_t(n) * n, 2, -1, 1, s).is_ok();
  const double t = time_gpu(
      5, s, [&] { return gemm(a, b, c, n, n, n, s).is_ok(); }, &good);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return good ? 2.0 * n * n * double(n) / (t * 1e-3) : 0.0;
}

struct Options {
  std::string config = "qwen3-vl-30b-a3b", images = "1,8,30", size = "640x480", rates = "0,0.3,0.4,0.5";
  std::string mode = "uniform", dtype = "bf16";
  int iters = 5, prefill_iters = 3, text_tokens = 64, threads = 0, group = 8;
};

int run(const Options& o) {
  if (!ok(kernels::cuda_init(0), "cuda_init")) return 1;
  std::printf("device: %s\n", kernels::cuda_describe().c_str());
  int W = 0, Hh = 0;
  if (std::sscanf(o.size.c_str(), "%dx%d", &W, &Hh) != 2 || W <= 0 || Hh <= 0) {
    std::fprintf(stderr, "error: --image-size must be WxH, e.g. 640x480\n");
    return 1;
  }
  if (o.threads > 0) set_num_threads(o.threads);
  const auto counts = parse_list<int>(o.images);
  const auto rates = parse_list<float>(o.rates);
  if (counts.empty() || rates.empty()) {
    std::fprintf(stderr, "error: --images and --vision-prune-rate need at least one value\n");
    return 1;
  }
  for (int c : counts)
    if (c <= 0) {
      std::fprintf(stderr, "error: --images values must be positive\n");
      return 1;
    }
  auto mcfg = model::named_model_config(o.config);
  if (!ok(mcfg.status(), "config")) return 1;
  if (!mcfg->vision) {
    std::fprintf(stderr, "error: %s has no vision tower (a Qwen3-VL shape is needed)\n", o.config.c_str());
    return 1;
  }
  const io::VisionConfig* vcfg = &*mcfg->vision;
  const io::TextConfig* dcfg = &mcfg->text;
  if (vcfg->out_hidden_size != dcfg->hidden_size) {
    std::fprintf(stderr, "error: vision out_hidden %lld != decoder hidden %lld\n",
                 static_cast<long long>(vcfg->out_hidden_size), static_cast<long long>(dcfg->hidden_size));
    return 1;
  }
  auto tower = VisionTowerCuda::create_random(*vcfg, 1);
  if (!ok(tower.status(), "tower")) return 1;
  cudaStream_t s;
  cudaStreamCreate(&s);
  const double gemm_tps = gemm_throughput(s);
  std::printf("bf16 GEMM 8192^3 through cuda::gemm: %.0f TFLOP/s (peak used for MFU: %.0f TFLOP/s)\n", gemm_tps / 1e12,
              kPeakBf16 / 1e12);

  io::PreprocessorConfig pcfg;
  const int max_images = *std::max_element(counts.begin(), counts.end());
  std::vector<std::vector<uint8_t>> jpegs;
  for (int i = 0; i < max_images; ++i) jpegs.push_back(make_jpeg(W, Hh, static_cast<uint32_t>(i + 1)));
  std::printf("synthetic JPEG %dx%d, %.1f KB each; %d worker threads; mode %s; prefill: the serving decoder's "
              "forward (%lld layers, %s shapes)\n",
              W, Hh, jpegs[0].size() / 1e3, num_threads(), o.mode.c_str(), static_cast<long long>(dcfg->num_layers),
              o.config.c_str());

  // Largest prompt: all visual tokens of the largest request + text.
  auto probe = io::decode_image(jpegs[0]);
  if (!ok(probe.status(), "decode")) return 1;
  auto probe_plan = vision::plan_preprocess({*probe}, pcfg);
  if (!ok(probe_plan.status(), "plan")) return 1;
  const int tok_per_img = static_cast<int>(probe_plan->grids[0].merged_tokens(pcfg.merge_size));
  const int max_prompt = max_images * tok_per_img + o.text_tokens;
  MeasuredPrefill full;
  if (!ok(full.init(*dcfg, max_prompt, o.dtype == "fp8"), "prefill decoder")) return 1;

  std::printf(
      "\n| images | rate | visual tokens | kept | preprocess ms | H2D ms | tower ms | tower MFU | score+select ms "
      "| score/tower | prefill ms | TTFT ms | TTFT vs rate 0 |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  bool good = true;
  std::string breakdown, pipeline, fusion;
  for (int n_img : counts) {
    // Preprocess: one image per worker task (decode, resize, patchify, bf16) into a pinned staging buffer.
    std::vector<vision::PreprocessPlan> plans(n_img);
    std::vector<io::Image> decoded(n_img);
    std::vector<vision::GridTHW> grids(n_img);
    std::vector<int64_t> row0(n_img + 1, 0);
    std::vector<std::pair<int, int>> merged(n_img);
    for (int i = 0; i < n_img; ++i) {
      auto p = vision::plan_preprocess({*probe}, pcfg);
      plans[i] = *p;
      grids[i] = p->grids[0];
      row0[i + 1] = row0[i] + p->rows;
      merged[i] = {static_cast<int>(grids[i].h / pcfg.merge_size), static_cast<int>(grids[i].w / pcfg.merge_size)};
    }
    const int64_t cols = plans[0].cols, rows = row0[n_img];
    uint16_t* pinned = nullptr;
    cudaMallocHost(&pinned, rows * cols * sizeof(uint16_t));
    bf16* pv = nullptr;
    cudaMalloc(&pv, rows * cols * sizeof(uint16_t));
    std::vector<double> pre_ms, h2d_ms;
    for (int it = 0; it < 3; ++it) {
      const auto t0 = Clock::now();
      parallel_for(n_img, 1, [&](int64_t b, int64_t e) {
        vision::ResizeScratch scratch;
        std::vector<float> f32(static_cast<size_t>(plans[0].rows * cols));
        for (int64_t i = b; i < e; ++i) {
          if (!io::decode_image_into(jpegs[i].data(), jpegs[i].size(), decoded[i]).is_ok()) continue;
          vision::preprocess_into({decoded[i]}, plans[i], pcfg, f32.data(), scratch);
          uint16_t* dst = pinned + row0[i] * cols;
          for (size_t k = 0; k < f32.size(); ++k) dst[k] = f32_to_bf16(f32[k]);
        }
      });
      pre_ms.push_back(ms_since(t0));
      const auto t1 = Clock::now();
      cudaMemcpyAsync(pv, pinned, rows * cols * sizeof(uint16_t), cudaMemcpyHostToDevice, s);
      cudaStreamSynchronize(s);
      h2d_ms.push_back(ms_since(t1));
    }
    const double t_pre = median(pre_ms), t_h2d = median(h2d_ms);
    // Tower with the score layer captured (the last block, VisionZip's rule for Qwen3-VL).
    const int score_layer = static_cast<int>(vcfg->depth) - 1;
    const double t_tower = time_gpu(
        o.iters, s, [&] { return (*tower)->forward(pv, grids, score_layer, s).is_ok(); }, &good);
    const double mfu = (*tower)->flops(grids) / (t_tower * 1e-3) / kPeakBf16;
    // The same tower with the bias / bias + GELU epilogues as separate kernels (before the fusion).
    (*tower)->set_fused_epilogues(false);
    const double t_unfused = time_gpu(
        o.iters, s, [&] { return (*tower)->forward(pv, grids, score_layer, s).is_ok(); }, &good);
    (*tower)->set_fused_epilogues(true);
    // Pipelined front end: images in groups of --group, one tower forward per group; while the GPU runs
    // group g, the host decodes and preprocesses group g + 1 (wall clock, median of 3).
    double t_pipe = 0;
    const int G = o.group > 0 ? o.group : n_img;
    if (n_img > G) {
      std::vector<double> runs;
      for (int it = 0; it < 3; ++it) {
        cudaStreamSynchronize(s);
        const auto t0 = Clock::now();
        for (int g0 = 0; g0 < n_img && good; g0 += G) {
          const int g1 = std::min(n_img, g0 + G);
          parallel_for(g1 - g0, 1, [&](int64_t b, int64_t e) {
            vision::ResizeScratch scratch;
            std::vector<float> f32(static_cast<size_t>(plans[0].rows * cols));
            for (int64_t i = g0 + b; i < g0 + e; ++i) {
              if (!io::decode_image_into(jpegs[i].data(), jpegs[i].size(), decoded[i]).is_ok()) continue;
              vision::preprocess_into({decoded[i]}, plans[i], pcfg, f32.data(), scratch);
              uint16_t* dst = pinned + row0[i] * cols;
              for (size_t k = 0; k < f32.size(); ++k) dst[k] = f32_to_bf16(f32[k]);
            }
          });
          const size_t off = static_cast<size_t>(row0[g0] * cols), n = static_cast<size_t>((row0[g1] - row0[g0]) * cols);
          good = good && cudaMemcpyAsync(pv + off, pinned + off, n * sizeof(uint16_t), cudaMemcpyHostToDevice, s) ==
                             cudaSuccess;
          const std::vector<vision::GridTHW> gg(grids.begin() + g0, grids.begin() + g1);
          good = good && (*tower)->forward(pv + off, gg, score_layer, s).is_ok();
        }
        cudaStreamSynchronize(s);
        runs.push_back(ms_since(t0));
      }
      t_pipe = median(runs);
      char line[256];
      std::snprintf(line, sizeof(line), "| %d | %d | %.1f | %.1f | %.1f%% |\n", n_img, G, t_pre + t_h2d + t_tower, t_pipe,
                    -100.0 * (1.0 - t_pipe / (t_pre + t_h2d + t_tower)));
      pipeline += line;
    }
    if (n_img == max_images) {
      // Profile at the shapes of one forward over all images (the pipelined runs left a group's shapes).
      if (!ok((*tower)->forward(pv, grids, score_layer, s), "forward")) return 1;
      auto prof = (*tower)->profile_block(o.iters, s);
      if (!ok(prof.status(), "profile")) return 1;
      breakdown = "\nOne tower block at " + std::to_string(n_img) + " images (" + std::to_string(rows) +
                  " patches), each op timed alone:\n\n| op | ms | TFLOP/s | x " + std::to_string(vcfg->depth) +
                  " blocks ms |\n|---|---|---|---|\n";
      for (const auto& r : *prof) {
        char line[160];
        std::snprintf(line, sizeof(line), "| %s | %.3f | %s | %.2f |\n", r.name.c_str(), r.ms,
                      r.flops > 0 ? std::to_string(static_cast<int>(r.flops / (r.ms * 1e-3) / 1e12)).c_str() : "-",
                      r.ms * vcfg->depth);
        breakdown += line;
      }
      // Restore the outputs (profiling overwrote the buffers) before scoring.
      if (!ok((*tower)->forward(pv, grids, score_layer, s), "forward")) return 1;
    }
    // The outputs of one forward over all images for the scoring below (the pipelined runs overwrote them).
    if (n_img > G && !ok((*tower)->forward(pv, grids, score_layer, s), "forward")) return 1;
    {
      char line[160];
      std::snprintf(line, sizeof(line), "| %d | %.2f | %.1f%% | %.2f | %.1f%% |\n", n_img, t_unfused,
                    100 * (*tower)->flops(grids) / (t_unfused * 1e-3) / kPeakBf16, t_tower, 100 * mfu);
      fusion += line;
    }
    const auto& out = (*tower)->output();
    int32_t text_start = 0;
    const auto all_pos = visual_positions(merged, &text_start);

    float* scores = nullptr;
    int32_t* sel_dev = nullptr;  // kept indices, then the per-image kept counts: one device-to-host copy
    int32_t* sel_host = nullptr;
    bf16 *emb_out = nullptr, *ds_out = nullptr;
    const int O = static_cast<int>(vcfg->out_hidden_size), T = out.tokens;
    cudaMalloc(&scores, T * sizeof(float));
    cudaMalloc(&sel_dev, (T + n_img) * sizeof(int32_t));
    cudaMallocHost(&sel_host, (T + n_img) * sizeof(int32_t));
    cudaMalloc(&emb_out, size_t(T) * O * sizeof(bf16));
    cudaMalloc(&ds_out, out.deepstack.size() * size_t(T) * O * sizeof(bf16));
    double ttft0 = 0;
    for (float rate : rates) {
      VisionZipSelect sel;
      sel.rate = rate;
      sel.global = o.mode == "global";
      auto plan = visionzip_plan(out.tokens_per_image, sel);
      if (!ok(plan.status(), "visionzip plan")) return 1;
      void* ws = nullptr;
      cudaMalloc(&ws, plan->workspace_bytes);
      const int n_out = static_cast<int>(plan->kept);
      double t_sel = 0;
      // The decoder's visual rows: all tower rows at rate 0, else the gathered kept rows.
      const bf16* emb_in = out.embeds;
      std::vector<const bf16*> ds_in(out.deepstack.begin(), out.deepstack.end());
      std::vector<std::vector<int32_t>> kept_pos = all_pos;
      if (rate > 0.f) {
        std::vector<double> sel_ms;
        for (int it = 0; it <= o.iters; ++it) {
          cudaStreamSynchronize(s);
          const auto t0 = Clock::now();
          bool g = (*tower)->scores(scores, nullptr, s).is_ok() &&
                   visionzip_select(scores, *plan, ws, sel_dev, sel_dev + n_out, nullptr, s).is_ok() &&
                   cudaMemcpyAsync(sel_host, sel_dev, (n_out + n_img) * sizeof(int32_t), cudaMemcpyDeviceToHost, s) ==
                       cudaSuccess;
          g = g && visionzip_gather_rows(out.embeds, O, sel_dev, n_out, emb_out, s).is_ok();
          for (size_t j = 0; j < out.deepstack.size(); ++j)
            g = g && visionzip_gather_rows(out.deepstack[j], O, sel_dev, n_out, ds_out + j * size_t(T) * O, s).is_ok();
          g = g && cudaStreamSynchronize(s) == cudaSuccess;
          if (!g) good = false;
          if (it > 0) sel_ms.push_back(ms_since(t0));
        }
        t_sel = median(sel_ms);
        emb_in = emb_out;
        for (size_t j = 0; j < ds_in.size(); ++j) ds_in[j] = ds_out + j * size_t(T) * O;
        int64_t sum = 0;
        for (int i = 0; i < n_img; ++i) sum += sel_host[n_out + i];
        if (sum != n_out) {
          std::fprintf(stderr, "error: kept counts add up to %lld, the plan says %d\n", static_cast<long long>(sum),
                       n_out);
          good = false;
        }
        for (int r = 0; r < 3; ++r) {
          kept_pos[r].resize(n_out);
          for (int i = 0; i < n_out; ++i) kept_pos[r][i] = all_pos[r][sel_host[i]];
        }
      }
      cudaFree(ws);
      std::vector<double> ms;
      for (int it = 0; it <= o.prefill_iters; ++it) {
        auto r = full.run(n_out, kept_pos, o.text_tokens, text_start, emb_in, ds_in, 99 + it);
        if (!ok(r.status(), "prefill forward")) return 1;
        if (it > 0) ms.push_back(*r);
      }
      const double t_prefill = median(ms);
      const double ttft = t_pre + t_h2d + t_tower + t_sel + t_prefill;
      if (rate == 0.f) ttft0 = ttft;
      char red[32] = "-";
      if (rate > 0.f && ttft0 > 0) std::snprintf(red, sizeof(red), "%.1f%%", -100.0 * (1.0 - ttft / ttft0));
      std::printf("| %d | %.2f | %d | %d | %.1f | %.2f | %.2f | %.1f%% | %.3f | %.2f%% | %.2f | %.1f | %s |\n", n_img,
                  rate, T, n_out, t_pre, t_h2d, t_tower, 100 * mfu, t_sel, 100 * t_sel / t_tower, t_prefill, ttft, red);
      std::fflush(stdout);
    }
    for (void* p : {static_cast<void*>(scores), static_cast<void*>(sel_dev), static_cast<void*>(emb_out),
                    static_cast<void*>(ds_out), static_cast<void*>(pv)})
      cudaFree(p);
    cudaFreeHost(sel_host);
    cudaFreeHost(pinned);
  }
  std::printf("\nTower with the epilogues as separate kernels vs fused (bias in the qkv GEMM, bias + GELU in fc1):\n\n"
              "| images | unfused ms | unfused MFU | fused ms | fused MFU |\n|---|---|---|---|---|\n%s",
              fusion.c_str());
  if (!pipeline.empty())
    std::printf("\nFront end (decode + preprocess + H2D + tower): serial (one forward) vs pipelined in groups (host "
                "preprocesses group g + 1 while the tower runs group g):\n\n| images | group | serial ms | "
                "pipelined ms | change |\n|---|---|---|---|---|\n%s",
                pipeline.c_str());
  std::printf("%s", breakdown.c_str());
  cudaStreamDestroy(s);
  if (!good || !ok(cudaGetLastError(), "bench")) return 1;
  return 0;
}

}  // namespace

int bench_ttft_main(int argc, char** argv) {
  Options o;
  CLI::App app{"TTFT of multi-image requests: vision tower + VisionZip + prefill (CUDA)"};
  app.add_option("--config", o.config, "model shape (qwen3-vl-30b-a3b, qwen3-vl-32b, ...)");
  app.add_option("--images", o.images, "comma-separated image counts per request");
  app.add_option("--image-size", o.size, "synthetic image size WxH");
  app.add_option("--vision-prune-rate", o.rates, "comma-separated VisionZip prune rates (0 = off)");
  app.add_option("--mode", o.mode, "uniform | global budget")->check(CLI::IsMember({"uniform", "global"}));
  app.add_option("--iters", o.iters, "timed iterations (median)");
  app.add_option("--text-tokens", o.text_tokens, "text tokens in the prompt besides the images");
  app.add_option("--threads", o.threads, "preprocessing worker threads (0 = all cores)");
  app.add_option("--prefill-iters", o.prefill_iters, "timed prefill forwards per row (median)");
  app.add_option("--group", o.group, "images per tower forward in the pipelined front-end timing (0 = off)");
  app.add_option("--dtype", o.dtype,
                 "decoder weight format: bf16, or fp8 (block-wise 128x128 as the official -FP8 checkpoints; the vision "
                 "tower stays bf16)")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  CLI11_PARSE(app, argc, argv);
  return run(o);
}

#else
int bench_ttft_main(int, char**) {
  std::fprintf(stderr, "bench_ttft_bench needs the CUDA backend (configure with -DZEST_CUDA=ON)\n");
  return 1;
}
#endif
