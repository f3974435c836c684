#include "vision/preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

namespace zest::vision {

Result<std::pair<int64_t, int64_t>> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                                 int64_t max_pixels) {
  if (height <= 0 || width <= 0) {
    return invalid_argument("image size must be positive, got " + std::to_string(width) + "x" +
                            std::to_string(height));
  }
  if (factor <= 0) return invalid_argument("smart_resize factor must be positive");
  const double aspect = static_cast<double>(std::max(height, width)) / static_cast<double>(std::min(height, width));
  if (aspect > 200.0) {
    return invalid_argument("absolute aspect ratio must be at most 200, got " + std::to_string(aspect) + " (" +
                            std::to_string(width) + "x" + std::to_string(height) + ")");
  }
  const double f = static_cast<double>(factor);
  const double h = static_cast<double>(height), w = static_cast<double>(width);
  // std::nearbyint rounds half to even under the default rounding mode, like Python's round().
  int64_t h_bar = static_cast<int64_t>(std::nearbyint(h / f)) * factor;
  int64_t w_bar = static_cast<int64_t>(std::nearbyint(w / f)) * factor;
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(static_cast<double>(height * width) / static_cast<double>(max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / static_cast<double>(height * width));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return std::make_pair(h_bar, w_bar);
}

namespace {

// Keys cubic with a = -0.5 in PyTorch's evaluation order (HelperInterpCubic::aa_filter).
double aa_cubic(double x) {
  const double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
  return 0.0;
}

// Fixed-point resampling weights of one axis: output i reads `count[i]` inputs from `first[i]`
// with weights w[i * taps + k] in units of 2^-precision.
struct AxisWeights {
  int64_t taps = 0;
  unsigned precision = 0;
  std::vector<int64_t> first, count;
  std::vector<int32_t> w;
};

// PyTorch's _compute_indices_min_size_weights_aa + _compute_index_ranges_int16_weights
// (align_corners=False, no explicit scale factor), computed in double then rounded to int16.
AxisWeights axis_weights(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0;
  const int64_t taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  AxisWeights a;
  a.taps = taps;
  a.first.resize(out_size);
  a.count.resize(out_size);
  std::vector<double> wf(static_cast<size_t>(out_size * taps), 0.0);
  double wt_max = 0.0;
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = scale * (static_cast<double>(i) + 0.5);
    const int64_t xmin = std::max(static_cast<int64_t>(center - support + 0.5), int64_t{0});
    int64_t xsize = std::min(static_cast<int64_t>(center + support + 0.5), in_size) - xmin;
    xsize = std::clamp(xsize, int64_t{0}, taps);
    double* row = wf.data() + i * taps;
    double total = 0.0;
    for (int64_t j = 0; j < xsize; ++j) {
      row[j] = aa_cubic((static_cast<double>(j + xmin) - center + 0.5) * invscale);
      total += row[j];
    }
    if (total != 0.0) {
      for (int64_t j = 0; j < xsize; ++j) {
        row[j] /= total;
        wt_max = std::max(wt_max, row[j]);
      }
    }
    a.first[i] = xmin;
    a.count[i] = xsize;
  }
  unsigned precision = 0;
  for (precision = 0; precision < 22; ++precision) {
    const int next_value = static_cast<int>(0.5 + wt_max * (1 << (precision + 1)));
    if (next_value >= (1 << 15)) break;
  }
  a.precision = precision;
  a.w.resize(wf.size());
  for (size_t k = 0; k < wf.size(); ++k) {
    const double v = wf[k] * (1 << precision);
    // int16 storage, as PyTorch keeps the weights.
    a.w[k] = static_cast<int16_t>(v < 0 ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v));
  }
  return a;
}

inline uint8_t clip_shift(int32_t acc, unsigned precision) {
  const int32_t v = acc >> precision;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Resamples along x: src rows of in_w RGB pixels -> rows of out_w pixels.
void resample_horizontal(const uint8_t* src, int64_t rows, int64_t in_w, uint8_t* dst, int64_t out_w,
                         const AxisWeights& a) {
  const int32_t half = 1 << (a.precision - 1);
  for (int64_t y = 0; y < rows; ++y) {
    const uint8_t* s = src + y * in_w * 3;
    uint8_t* d = dst + y * out_w * 3;
    for (int64_t x = 0; x < out_w; ++x) {
      const int32_t* w = a.w.data() + x * a.taps;
      const uint8_t* p = s + a.first[x] * 3;
      int32_t r = half, g = half, b = half;
      for (int64_t k = 0; k < a.count[x]; ++k) {
        r += w[k] * p[k * 3 + 0];
        g += w[k] * p[k * 3 + 1];
        b += w[k] * p[k * 3 + 2];
      }
      d[x * 3 + 0] = clip_shift(r, a.precision);
      d[x * 3 + 1] = clip_shift(g, a.precision);
      d[x * 3 + 2] = clip_shift(b, a.precision);
    }
  }
}

using v8i32 = int32_t __attribute__((vector_size(32)));
using v8u8 = uint8_t __attribute__((vector_size(8)));

// Resamples along y: rows of `n` bytes (width * 3) -> out_h rows, 16 bytes at a time in two
// 8-lane int32 accumulators (GCC vector extensions; integer math, so every instruction set gives
// the same bytes).
[[gnu::always_inline]] inline void resample_vertical_body(const uint8_t* src, int64_t n, uint8_t* dst,
                                                          int64_t out_h, const AxisWeights& a) {
  const int32_t half = 1 << (a.precision - 1);
  const int32_t shift = static_cast<int32_t>(a.precision);
  const v8i32 zero = {};
  const v8i32 top = zero + 255;
  const v8i32 init = zero + half;
  for (int64_t y = 0; y < out_h; ++y) {
    const int32_t* w = a.w.data() + y * a.taps;
    const uint8_t* base = src + a.first[y] * n;
    const int64_t count = a.count[y];
    uint8_t* d = dst + y * n;
    int64_t x0 = 0;
    for (; x0 + 16 <= n; x0 += 16) {
      v8i32 lo = init, hi = init;
      for (int64_t k = 0; k < count; ++k) {
        v8u8 b0, b1;
        std::memcpy(&b0, base + k * n + x0, 8);
        std::memcpy(&b1, base + k * n + x0 + 8, 8);
        const v8i32 wk = zero + w[k];
        lo += __builtin_convertvector(b0, v8i32) * wk;
        hi += __builtin_convertvector(b1, v8i32) * wk;
      }
      lo >>= shift;
      hi >>= shift;
      lo = lo < zero ? zero : lo;
      hi = hi < zero ? zero : hi;
      lo = lo > top ? top : lo;
      hi = hi > top ? top : hi;
      const v8u8 o0 = __builtin_convertvector(lo, v8u8), o1 = __builtin_convertvector(hi, v8u8);
      std::memcpy(d + x0, &o0, 8);
      std::memcpy(d + x0 + 8, &o1, 8);
    }
    for (; x0 < n; ++x0) {
      int32_t acc = half;
      for (int64_t k = 0; k < count; ++k) acc += w[k] * base[k * n + x0];
      d[x0] = clip_shift(acc, a.precision);
    }
  }
}

void resample_vertical_generic(const uint8_t* src, int64_t n, uint8_t* dst, int64_t out_h, const AxisWeights& a) {
  resample_vertical_body(src, n, dst, out_h, a);
}

#if defined(__x86_64__)
[[gnu::target("avx2")]] void resample_vertical_avx2(const uint8_t* src, int64_t n, uint8_t* dst, int64_t out_h,
                                                    const AxisWeights& a) {
  resample_vertical_body(src, n, dst, out_h, a);
}
#endif

void resample_vertical(const uint8_t* src, int64_t n, uint8_t* dst, int64_t out_h, const AxisWeights& a) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) return resample_vertical_avx2(src, n, dst, out_h, a);
#endif
  resample_vertical_generic(src, n, dst, out_h, a);
}

}  // namespace

namespace {

// Resizes src (h x w RGB) to out_h x out_w; returns a pointer to the result, which lives in src or
// in one of the scratch buffers.
const uint8_t* resize_with_scratch(const uint8_t* src, int64_t h, int64_t w, int64_t out_h, int64_t out_w,
                                   ResizeScratch& scratch) {
  const uint8_t* cur = src;
  if (out_w != w) {
    const AxisWeights aw = axis_weights(w, out_w);
    scratch.horizontal.resize(static_cast<size_t>(out_w * h * 3));
    resample_horizontal(src, h, w, scratch.horizontal.data(), out_w, aw);
    cur = scratch.horizontal.data();
  }
  if (out_h != h) {
    const AxisWeights ah = axis_weights(h, out_h);
    scratch.vertical.resize(static_cast<size_t>(out_w * out_h * 3));
    resample_vertical(cur, out_w * 3, scratch.vertical.data(), out_h, ah);
    cur = scratch.vertical.data();
  }
  return cur;
}

}  // namespace

io::Image resize_bicubic_aa(const io::Image& src, int64_t out_h, int64_t out_w) {
  if (out_h == src.height && out_w == src.width) return src;
  ResizeScratch scratch;
  const uint8_t* p = resize_with_scratch(src.rgb.data(), src.height, src.width, out_h, out_w, scratch);
  io::Image out;
  out.width = out_w;
  out.height = out_h;
  out.rgb.assign(p, p + out_w * out_h * 3);
  return out;
}

Result<std::pair<int64_t, int64_t>> target_size(int64_t height, int64_t width, const io::PreprocessorConfig& cfg,
                                                const PixelBudget& budget) {
  const int64_t min_pixels = budget.min_pixels.value_or(cfg.min_pixels);
  const int64_t max_pixels = budget.max_pixels.value_or(cfg.max_pixels);
  if (min_pixels <= 0 || max_pixels <= 0) {
    return invalid_argument("min_pixels and max_pixels must be positive, got " + std::to_string(min_pixels) + " and " +
                            std::to_string(max_pixels));
  }
  if (min_pixels > max_pixels) {
    return invalid_argument("min_pixels (" + std::to_string(min_pixels) + ") must not exceed max_pixels (" +
                            std::to_string(max_pixels) + ")");
  }
  return smart_resize(height, width, cfg.patch_size * cfg.merge_size, min_pixels, max_pixels);
}

namespace {

// Writes one resized image as patch rows (spec §1.4) into out[rows, 3 * tp * p * p].
void patchify(const uint8_t* px, int64_t height, int64_t width, const io::PreprocessorConfig& cfg, float* out) {
  const int64_t p = cfg.patch_size, m = cfg.merge_size, tp = cfg.temporal_patch_size;
  const int64_t gh = height / p, gw = width / p;
  const int64_t cols = 3 * tp * p * p;
  // Fused rescale + normalise as the torchvision backend does it: (u - mean*255) / (std*255) in f32.
  float lut[3][256];
  for (int c = 0; c < 3; ++c) {
    const float mean = cfg.image_mean[c] * 255.0f, stdv = cfg.image_std[c] * 255.0f;
    for (int u = 0; u < 256; ++u) lut[c][u] = (static_cast<float>(u) - mean) / stdv;
  }
  int64_t row = 0;
  for (int64_t br = 0; br < gh / m; ++br) {
    for (int64_t bc = 0; bc < gw / m; ++bc) {
      for (int64_t ir = 0; ir < m; ++ir) {
        for (int64_t ic = 0; ic < m; ++ic, ++row) {
          const int64_t y0 = (br * m + ir) * p, x0 = (bc * m + ic) * p;
          float* o = out + row * cols;
          for (int c = 0; c < 3; ++c) {
            float* frame0 = o + c * tp * p * p;
            for (int64_t py = 0; py < p; ++py) {
              const uint8_t* s = px + ((y0 + py) * width + x0) * 3 + c;
              float* d = frame0 + py * p;
              for (int64_t q = 0; q < p; ++q) d[q] = lut[c][s[q * 3]];
            }
            for (int64_t t = 1; t < tp; ++t) std::memcpy(frame0 + t * p * p, frame0, sizeof(float) * p * p);
          }
        }
      }
    }
  }
}

}  // namespace

Result<PreprocessPlan> plan_preprocess(const std::vector<io::Image>& images, const io::PreprocessorConfig& cfg,
                                       const PixelBudget& budget) {
  if (cfg.patch_size <= 0 || cfg.merge_size <= 0 || cfg.temporal_patch_size <= 0) {
    return invalid_argument("preprocessor patch_size, merge_size and temporal_patch_size must be positive");
  }
  PreprocessPlan plan;
  plan.cols = 3 * cfg.temporal_patch_size * cfg.patch_size * cfg.patch_size;
  for (size_t i = 0; i < images.size(); ++i) {
    const io::Image& img = images[i];
    if (img.width <= 0 || img.height <= 0 || img.rgb.size() != static_cast<size_t>(img.width * img.height * 3)) {
      return invalid_argument("image " + std::to_string(i) + " is empty or its pixel buffer does not match " +
                              std::to_string(img.width) + "x" + std::to_string(img.height) + " RGB");
    }
    auto hw = target_size(img.height, img.width, cfg, budget);
    if (!hw.ok()) return hw.status().with_context("image " + std::to_string(i));
    plan.resized.push_back(*hw);
    plan.grids.push_back(GridTHW{1, hw->first / cfg.patch_size, hw->second / cfg.patch_size});
    plan.rows += plan.grids.back().patches();
  }
  return plan;
}

void preprocess_into(const std::vector<io::Image>& images, const PreprocessPlan& plan, const io::PreprocessorConfig& cfg,
                     float* out, ResizeScratch& scratch) {
  for (size_t i = 0; i < images.size(); ++i) {
    const io::Image& img = images[i];
    const auto [h, w] = plan.resized[i];
    const uint8_t* px = resize_with_scratch(img.rgb.data(), img.height, img.width, h, w, scratch);
    patchify(px, h, w, cfg, out);
    out += plan.grids[i].patches() * plan.cols;
  }
}

Result<PixelBatch> preprocess_images(const std::vector<io::Image>& images, const io::PreprocessorConfig& cfg,
                                     const PixelBudget& budget) {
  ZEST_ASSIGN_OR_RETURN(PreprocessPlan plan, plan_preprocess(images, cfg, budget));
  PixelBatch batch;
  batch.pixel_values = Tensor::empty({plan.rows, plan.cols});
  ResizeScratch scratch;
  preprocess_into(images, plan, cfg, batch.pixel_values.data<float>(), scratch);
  batch.grids = std::move(plan.grids);
  return batch;
}

}  // namespace zest::vision
