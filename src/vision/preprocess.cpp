#include "vision/preprocess.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

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
// with int16 weights w[i * stride + k] in units of 2^-precision. stride is a multiple of 4 above
// the tap count, and the weights past count[i] are zero, so kernels may read whole groups of
// taps. pairs[i * stride / 2 + j] packs weights 2j (low half) and 2j+1 (high half) of output i.
struct AxisWeights {
  int64_t stride = 0;
  unsigned precision = 0;
  std::vector<int64_t> first, count;
  std::vector<int16_t> w;
  std::vector<int32_t> pairs;
};

// PyTorch's _compute_indices_min_size_weights_aa + _compute_index_ranges_int16_weights
// (align_corners=False, no explicit scale factor), computed in double then rounded to int16.
AxisWeights axis_weights(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0;
  const int64_t taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  AxisWeights a;
  a.stride = (taps + 4) / 4 * 4;
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
  a.w.assign(static_cast<size_t>(out_size * a.stride), 0);
  for (int64_t i = 0; i < out_size; ++i) {
    for (int64_t j = 0; j < taps; ++j) {
      const double v = wf[i * taps + j] * (1 << precision);
      // int16 storage, as PyTorch keeps the weights.
      a.w[i * a.stride + j] = static_cast<int16_t>(v < 0 ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v));
    }
  }
  a.pairs.resize(a.w.size() / 2);
  for (size_t j = 0; j < a.pairs.size(); ++j) {
    const uint32_t lo = static_cast<uint16_t>(a.w[2 * j]), hi = static_cast<uint16_t>(a.w[2 * j + 1]);
    a.pairs[j] = static_cast<int32_t>(lo | (hi << 16));
  }
  return a;
}

inline uint8_t clip_shift(int32_t acc, unsigned precision) {
  const int32_t v = acc >> precision;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// Output pixels [x0, x1) of one horizontally resampled RGB row (s: the input row).
void horizontal_pixels(const uint8_t* s, const AxisWeights& a, int64_t x0, int64_t x1, uint8_t* d) {
  const int32_t half = 1 << (a.precision - 1);
  for (int64_t x = x0; x < x1; ++x) {
    const int16_t* w = a.w.data() + x * a.stride;
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

// Bytes [b0, b1) of output row y of the vertical pass over src rows of n bytes.
void vertical_bytes(const uint8_t* src, int64_t n, const AxisWeights& a, int64_t y, int64_t b0, int64_t b1,
                    uint8_t* d) {
  const int32_t half = 1 << (a.precision - 1);
  const int16_t* w = a.w.data() + y * a.stride;
  const uint8_t* base = src + a.first[y] * n;
  for (int64_t x = b0; x < b1; ++x) {
    int32_t acc = half;
    for (int64_t k = 0; k < a.count[y]; ++k) acc += w[k] * base[k * n + x];
    d[x] = clip_shift(acc, a.precision);
  }
}

// Where the pixels of one band of patch rows go: a band is merge * patch image rows, which fill
// (width / patch / merge) merge groups of merge * merge consecutive pixel_values rows.
struct PatchLayout {
  int64_t patch = 0, merge = 0, temporal = 0;
  int64_t groups = 0;  // merge groups across the image width
  int64_t cols = 0;    // floats per pixel_values row
  float mean[3] = {}, stdv[3] = {};
};

// Rescale + normalise of one channel value as the torchvision backend does it:
// (u - mean*255) / (std*255) in f32.
inline float normalise(uint8_t u, float mean, float stdv) { return (static_cast<float>(u) - mean) / stdv; }

// Writes one band (rows[r] = RGB bytes of image row r of the band) as pixel_values rows from
// out; each value is normalised once and stored to every temporal frame.
void write_band_generic(const uint8_t* const* rows, const PatchLayout& l, float* out) {
  const int64_t p = l.patch, m = l.merge, pp = p * p;
  float lut[3][256];
  for (int c = 0; c < 3; ++c) {
    for (int u = 0; u < 256; ++u) lut[c][u] = normalise(static_cast<uint8_t>(u), l.mean[c], l.stdv[c]);
  }
  for (int64_t bc = 0; bc < l.groups; ++bc) {
    for (int64_t ir = 0; ir < m; ++ir) {
      for (int64_t ic = 0; ic < m; ++ic, out += l.cols) {
        const int64_t x0 = (bc * m + ic) * p * 3;
        for (int c = 0; c < 3; ++c) {
          float* frame0 = out + c * l.temporal * pp;
          for (int64_t py = 0; py < p; ++py) {
            const uint8_t* s = rows[ir * p + py] + x0 + c;
            float* d = frame0 + py * p;
            for (int64_t q = 0; q < p; ++q) d[q] = lut[c][s[q * 3]];
          }
          for (int64_t t = 1; t < l.temporal; ++t) std::memcpy(frame0 + t * pp, frame0, sizeof(float) * pp);
        }
      }
    }
  }
}

#if defined(__x86_64__)

// One horizontally resampled RGB row. Taps go in groups of 4 through one 16-byte load: the low
// 128-bit half takes taps 0-1 and the high half taps 2-3 as int16 pairs (c of tap j, c of tap j+1)
// for c = R, G, B, then madd sums each pair times its weight pair. Integer math, so the sum is
// exactly the scalar one. Pixels whose last load would pass the row end take the scalar path.
[[gnu::target("avx2")]] void horizontal_row_avx2(const uint8_t* s, int64_t in_w, const AxisWeights& a, int64_t out_w,
                                                 uint8_t* d) {
  const __m256i pix_mask = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,  //
                                            6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1);
  const __m256i w_mask = _mm256_setr_epi8(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, -1, -1, -1, -1,  //
                                          4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, -1, -1, -1, -1);
  const __m128i half = _mm_set1_epi32(1 << (a.precision - 1));
  const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(a.precision));
  const int64_t row_bytes = in_w * 3;
  for (int64_t x = 0; x < out_w; ++x) {
    const int64_t groups = (a.count[x] + 3) / 4;
    const int64_t start = a.first[x] * 3;
    if (start + 12 * groups + 4 > row_bytes) {
      horizontal_pixels(s, a, x, x + 1, d);
      continue;
    }
    const uint8_t* p = s + start;
    const int16_t* w = a.w.data() + x * a.stride;
    __m256i acc = _mm256_setzero_si256();
    for (int64_t g = 0; g < groups; ++g) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 12 * g));
      const __m256i px = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(raw), pix_mask);
      int64_t wq;
      std::memcpy(&wq, w + 4 * g, sizeof(wq));
      const __m256i wv = _mm256_shuffle_epi8(_mm256_set1_epi64x(wq), w_mask);
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(px, wv));
    }
    __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    sum = _mm_sra_epi32(_mm_add_epi32(sum, half), shift);
    // packs + packus clamp to [0, 255] exactly as clip_shift does.
    const __m128i packed = _mm_packus_epi16(_mm_packs_epi32(sum, sum), sum);
    const uint32_t rgb = static_cast<uint32_t>(_mm_cvtsi128_si32(packed));
    std::memcpy(d + x * 3, &rgb, 3);
  }
}

// Output row y of the vertical pass, 32 bytes at a time: bytes of taps k and k+1 are interleaved
// into int16 pairs and madd'ed with the weight pair (an odd last tap pairs with a zero weight).
[[gnu::target("avx2")]] void vertical_row_avx2(const uint8_t* src, int64_t n, const AxisWeights& a, int64_t y,
                                               uint8_t* d) {
  const uint8_t* base = src + a.first[y] * n;
  const int32_t* pairs = a.pairs.data() + y * (a.stride / 2);
  const int64_t count = a.count[y];
  const __m256i init = _mm256_set1_epi32(1 << (a.precision - 1));
  const __m128i shift = _mm_cvtsi32_si128(static_cast<int>(a.precision));
  const __m256i zero = _mm256_setzero_si256();
  int64_t x = 0;
  for (; x + 32 <= n; x += 32) {
    __m256i acc0 = init, acc1 = init, acc2 = init, acc3 = init;
    for (int64_t k = 0; k < count; k += 2) {
      const uint8_t* r0 = base + k * n + x;
      const uint8_t* r1 = k + 1 < count ? r0 + n : r0;
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r0));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r1));
      const __m256i wk = _mm256_set1_epi32(pairs[k / 2]);
      const __m256i lo = _mm256_unpacklo_epi8(v0, v1), hi = _mm256_unpackhi_epi8(v0, v1);
      acc0 = _mm256_add_epi32(acc0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), wk));
      acc1 = _mm256_add_epi32(acc1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), wk));
      acc2 = _mm256_add_epi32(acc2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), wk));
      acc3 = _mm256_add_epi32(acc3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), wk));
    }
    acc0 = _mm256_sra_epi32(acc0, shift);
    acc1 = _mm256_sra_epi32(acc1, shift);
    acc2 = _mm256_sra_epi32(acc2, shift);
    acc3 = _mm256_sra_epi32(acc3, shift);
    // The in-lane unpacks and packs undo each other's byte order; packs + packus clamp to [0, 255].
    const __m256i out = _mm256_packus_epi16(_mm256_packs_epi32(acc0, acc1), _mm256_packs_epi32(acc2, acc3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + x), out);
  }
  vertical_bytes(src, n, a, y, x, n, d);
}

// How write_band16_avx2 stores: non-temporal 32 or 16 bytes at a time (out aligned to that), or
// plain unaligned stores.
enum class StoreMode { kStream32, kStream16, kPlain };

template <StoreMode kMode>
[[gnu::target("avx2")]] inline void store8(float* dst, __m256 v) {
  if constexpr (kMode == StoreMode::kStream32) {
    _mm256_stream_ps(dst, v);
  } else if constexpr (kMode == StoreMode::kStream16) {
    _mm_stream_ps(dst, _mm256_castps256_ps128(v));
    _mm_stream_ps(dst + 4, _mm256_extractf128_ps(v, 1));
  } else {
    _mm256_storeu_ps(dst, v);
  }
}

// write_band_generic for 16x16 patches: each patch's 16 rows of 16 RGB pixels are split into
// channels with byte shuffles, normalised 8 at a time (the same f32 subtract and divide as
// normalise(), so the same floats as its table), and its pixel_values row is written front to
// back in one stream. Non-temporal stores (when out is 16-byte aligned) write whole cache lines
// without first reading them, which more than doubles one core's store bandwidth on the
// hundreds of MB a large image produces.
template <StoreMode kMode>
[[gnu::target("avx2")]] void write_band16_avx2(const uint8_t* const* rows, const PatchLayout& l, float* out) {
  // Channel c of pixels 0-15 sits at bytes 3q + c of the 48 loaded bytes (v0, v1, v2).
  const __m128i m[3][3] = {
      {_mm_setr_epi8(0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
       _mm_setr_epi8(-1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14, -1, -1, -1, -1, -1),
       _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 1, 4, 7, 10, 13)},
      {_mm_setr_epi8(1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
       _mm_setr_epi8(-1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15, -1, -1, -1, -1, -1),
       _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2, 5, 8, 11, 14)},
      {_mm_setr_epi8(2, 5, 8, 11, 14, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1),
       _mm_setr_epi8(-1, -1, -1, -1, -1, 1, 4, 7, 10, 13, -1, -1, -1, -1, -1, -1),
       _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 3, 6, 9, 12, 15)}};
  __m256 mean[3], stdv[3];
  for (int c = 0; c < 3; ++c) {
    mean[c] = _mm256_set1_ps(l.mean[c]);
    stdv[c] = _mm256_set1_ps(l.stdv[c]);
  }
  alignas(16) uint8_t planar[3][256];  // one patch, split by channel
  alignas(32) float frame[256];        // one channel of one patch, normalised
  for (int64_t bc = 0; bc < l.groups; ++bc) {
    for (int64_t ir = 0; ir < l.merge; ++ir) {
      for (int64_t ic = 0; ic < l.merge; ++ic) {
        const int64_t x0 = (bc * l.merge + ic) * 48;
        for (int64_t py = 0; py < 16; ++py) {
          const uint8_t* s = rows[ir * 16 + py] + x0;
          const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
          const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
          const __m128i v2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
          for (int c = 0; c < 3; ++c) {
            const __m128i ch = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(v0, m[c][0]), _mm_shuffle_epi8(v1, m[c][1])),
                                            _mm_shuffle_epi8(v2, m[c][2]));
            _mm_store_si128(reinterpret_cast<__m128i*>(planar[c] + py * 16), ch);
          }
        }
        for (int c = 0; c < 3; ++c) {
          for (int64_t i = 0; i < 256; i += 8) {
            const __m128i u = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(planar[c] + i));
            const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(u));
            const __m256 v = _mm256_div_ps(_mm256_sub_ps(f, mean[c]), stdv[c]);
            store8<kMode>(out + i, v);
            _mm256_store_ps(frame + i, v);
          }
          out += 256;
          for (int64_t t = 1; t < l.temporal; ++t, out += 256) {
            for (int64_t i = 0; i < 256; i += 8) store8<kMode>(out + i, _mm256_load_ps(frame + i));
          }
        }
      }
    }
  }
  if constexpr (kMode != StoreMode::kPlain) _mm_sfence();
}

const bool kHaveAvx2 = __builtin_cpu_supports("avx2");

#endif

// Horizontal pass over `rows` RGB rows of in_w pixels into rows of out_w pixels.
void resample_horizontal(const uint8_t* src, int64_t rows, int64_t in_w, uint8_t* dst, int64_t out_w,
                         const AxisWeights& a) {
  for (int64_t y = 0; y < rows; ++y) {
    const uint8_t* s = src + y * in_w * 3;
    uint8_t* d = dst + y * out_w * 3;
#if defined(__x86_64__)
    if (kHaveAvx2) {
      horizontal_row_avx2(s, in_w, a, out_w, d);
      continue;
    }
#endif
    horizontal_pixels(s, a, 0, out_w, d);
  }
}

// Output row y of the vertical pass over src rows of n bytes.
void resample_vertical_row(const uint8_t* src, int64_t n, const AxisWeights& a, int64_t y, uint8_t* d) {
#if defined(__x86_64__)
  if (kHaveAvx2) return vertical_row_avx2(src, n, a, y, d);
#endif
  vertical_bytes(src, n, a, y, 0, n, d);
}

// Writes one band of merge * patch image rows (rows[r] = RGB bytes of row r) as pixel_values rows from out.
void write_band(const uint8_t* const* rows, const PatchLayout& l, float* out) {
#if defined(__x86_64__)
  if (kHaveAvx2 && l.patch == 16) {
    const uintptr_t addr = reinterpret_cast<uintptr_t>(out);
    if (addr % 32 == 0) return write_band16_avx2<StoreMode::kStream32>(rows, l, out);
    if (addr % 16 == 0) return write_band16_avx2<StoreMode::kStream16>(rows, l, out);
    return write_band16_avx2<StoreMode::kPlain>(rows, l, out);
  }
#endif
  write_band_generic(rows, l, out);
}

// The horizontal pass of a resize (or src itself when the width already matches): h rows of
// out_w RGB pixels.
const uint8_t* resize_width(const uint8_t* src, int64_t h, int64_t w, int64_t out_w, std::vector<uint8_t>& scratch) {
  if (out_w == w) return src;
  const AxisWeights aw = axis_weights(w, out_w);
  scratch.resize(static_cast<size_t>(out_w * h * 3));
  resample_horizontal(src, h, w, scratch.data(), out_w, aw);
  return scratch.data();
}

}  // namespace

io::Image resize_bicubic_aa(const io::Image& src, int64_t out_h, int64_t out_w) {
  if (out_h == src.height && out_w == src.width) return src;
  std::vector<uint8_t> horizontal;
  const uint8_t* cur = resize_width(src.rgb.data(), src.height, src.width, out_w, horizontal);
  io::Image out;
  out.width = out_w;
  out.height = out_h;
  const int64_t n = out_w * 3;
  if (out_h == src.height) {
    out.rgb.assign(cur, cur + out_h * n);
    return out;
  }
  out.rgb.resize(static_cast<size_t>(out_h * n));
  const AxisWeights ah = axis_weights(src.height, out_h);
  for (int64_t y = 0; y < out_h; ++y) resample_vertical_row(cur, n, ah, y, out.rgb.data() + y * n);
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

namespace {

PatchLayout patch_layout(const PreprocessPlan& plan, const io::PreprocessorConfig& cfg) {
  PatchLayout layout;
  layout.patch = cfg.patch_size;
  layout.merge = cfg.merge_size;
  layout.temporal = cfg.temporal_patch_size;
  layout.cols = plan.cols;
  for (int c = 0; c < 3; ++c) {
    layout.mean[c] = cfg.image_mean[c] * 255.0f;
    layout.stdv[c] = cfg.image_std[c] * 255.0f;
  }
  return layout;
}

// Resizes one image to h x w and writes its patch rows at `out`.
void preprocess_one(const io::Image& img, int64_t h, int64_t w, PatchLayout layout, float* out,
                    ResizeScratch& scratch) {
  const int64_t band = layout.merge * layout.patch;  // image rows per band of merge groups
  std::vector<const uint8_t*> rows(static_cast<size_t>(band));
  const uint8_t* cur = resize_width(img.rgb.data(), img.height, img.width, w, scratch.horizontal);
  const int64_t n = w * 3;
  const bool vertical = h != img.height;
  AxisWeights ah;
  if (vertical) {
    ah = axis_weights(img.height, h);
    scratch.band.resize(static_cast<size_t>(band * n));
  }
  layout.groups = w / band;
  const int64_t band_floats = layout.groups * layout.merge * layout.merge * layout.cols;
  // Each band is resized into scratch.band (cache-resident) and written straight to its rows.
  for (int64_t y0 = 0; y0 < h; y0 += band, out += band_floats) {
    for (int64_t r = 0; r < band; ++r) {
      if (vertical) {
        uint8_t* d = scratch.band.data() + r * n;
        resample_vertical_row(cur, n, ah, y0 + r, d);
        rows[r] = d;
      } else {
        rows[r] = cur + (y0 + r) * n;
      }
    }
    write_band(rows.data(), layout, out);
  }
}

}  // namespace

void preprocess_into(const std::vector<io::Image>& images, const PreprocessPlan& plan, const io::PreprocessorConfig& cfg,
                     float* out, ResizeScratch& scratch) {
  const PatchLayout layout = patch_layout(plan, cfg);
  for (size_t i = 0; i < images.size(); ++i) {
    const auto [h, w] = plan.resized[i];
    preprocess_one(images[i], h, w, layout, out, scratch);
    out += plan.grids[i].patches() * plan.cols;
  }
}

void preprocess_into_parallel(const std::vector<io::Image>& images, const PreprocessPlan& plan,
                              const io::PreprocessorConfig& cfg, float* out) {
  const PatchLayout layout = patch_layout(plan, cfg);
  std::vector<int64_t> row0(images.size() + 1, 0);
  for (size_t i = 0; i < images.size(); ++i) row0[i + 1] = row0[i] + plan.grids[i].patches();
  parallel_for(static_cast<int64_t>(images.size()), 1, [&](int64_t b, int64_t e) {
    ResizeScratch scratch;
    for (int64_t i = b; i < e; ++i) {
      const auto [h, w] = plan.resized[i];
      preprocess_one(images[i], h, w, layout, out + row0[i] * plan.cols, scratch);
    }
  });
}

Result<PixelBatch> preprocess_images_parallel(const std::vector<io::Image>& images, const io::PreprocessorConfig& cfg,
                                              const PixelBudget& budget) {
  ZEST_ASSIGN_OR_RETURN(PreprocessPlan plan, plan_preprocess(images, cfg, budget));
  PixelBatch batch;
  batch.pixel_values = Tensor::empty({plan.rows, plan.cols});
  preprocess_into_parallel(images, plan, cfg, batch.pixel_values.data<float>());
  batch.grids = std::move(plan.grids);
  return batch;
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
