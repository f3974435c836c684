// Times image decode + Qwen3-VL preprocessing (resize + normalise + patchify) of a 4032x3024 JPEG
// on one thread. The JPEG is synthesised at start-up (smooth gradients plus noise, quality 90).
// Usage: bench_preprocess_bench [repeats] [max_pixels] (both budgets below when max_pixels is omitted)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "core/timer.h"
#include "io/image.h"
#include "vision/preprocess.h"

using namespace zest;

namespace {

std::vector<uint8_t> make_jpeg(int w, int h) {
  io::Image img;
  img.width = w;
  img.height = h;
  img.rgb.resize(static_cast<size_t>(w) * h * 3);
  std::mt19937 rng(1);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* px = &img.rgb[(static_cast<size_t>(y) * w + x) * 3];
      const int n = static_cast<int>(rng() % 24);
      px[0] = static_cast<uint8_t>((x * 255 / w + n) & 255);
      px[1] = static_cast<uint8_t>((y * 255 / h + n) & 255);
      px[2] = static_cast<uint8_t>(((x + y) / 16 * 37 + n) & 255);
    }
  return io::encode_jpeg(img, 90).value();
}

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const std::vector<uint8_t> jpeg = make_jpeg(4032, 3024);
  std::printf("synthetic JPEG 4032x3024, %.2f MB\n", jpeg.size() / 1e6);
  struct Budget {
    const char* name;
    int64_t max_pixels;
  };
  const Budget budgets[] = {{"default max_pixels 16777216", 16777216}, {"max_pixels 1003520 (1280 tokens)", 1003520}};
  const int64_t only = argc > 2 ? std::atoll(argv[2]) : 0;
  for (const Budget& b : budgets) {
    if (only != 0 && b.max_pixels != only) continue;
    io::PreprocessorConfig cfg;
    cfg.max_pixels = b.max_pixels;
    // Cold: fresh allocations for every buffer (decode_image + preprocess_images).
    double cold_total = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const double t = zest::now_ms();
      auto img = zest::io::decode_image(jpeg);
      auto batch = img.ok() ? zest::vision::preprocess_images({*img}, cfg)
                            : zest::Result<zest::vision::PixelBatch>(img.status());
      if (!batch.ok()) {
        std::fprintf(stderr, "failed: %s\n", batch.status().to_string().c_str());
        return 1;
      }
      cold_total = std::min(cold_total, zest::now_ms() - t);
    }
    // Warm: the decoded image, resize scratch and pixel_values staging buffer are reused. The
    // staging buffer is a Tensor (64-byte aligned, as preprocess_images allocates pixel_values).
    std::vector<zest::io::Image> images(1);
    zest::vision::ResizeScratch scratch;
    zest::Tensor staging;
    double best_decode = 1e30, best_pre = 1e30, best_total = 1e30;
    zest::vision::PreprocessPlan plan;
    for (int r = 0; r < repeats + 1; ++r) {
      const double t = zest::now_ms();
      zest::Status st = zest::io::decode_image_into(jpeg.data(), jpeg.size(), images[0]);
      if (!st.is_ok()) {
        std::fprintf(stderr, "decode failed: %s\n", st.to_string().c_str());
        return 1;
      }
      const double t_decode = zest::now_ms() - t;
      auto p = zest::vision::plan_preprocess(images, cfg);
      if (!p.ok()) return 1;
      plan = *p;
      if (staging.numel() != plan.rows * plan.cols) staging = zest::Tensor::empty({plan.rows, plan.cols});
      zest::vision::preprocess_into(images, plan, cfg, staging.data<float>(), scratch);
      const double t_total = zest::now_ms() - t;
      if (r == 0) continue;  // first pass faults the reused buffers in
      best_decode = std::min(best_decode, t_decode);
      best_pre = std::min(best_pre, t_total - t_decode);
      best_total = std::min(best_total, t_total);
    }
    std::printf("%s: grid %lldx%lld, pixel_values [%lld, %lld] (%.0f MB)\n", b.name,
                static_cast<long long>(plan.grids[0].h), static_cast<long long>(plan.grids[0].w),
                static_cast<long long>(plan.rows), static_cast<long long>(plan.cols), plan.rows * plan.cols * 4 / 1e6);
    std::printf("  cold (fresh buffers): total %.1f ms\n", cold_total);
    std::printf("  warm (reused buffers): decode %.1f ms + resize/patchify %.1f ms = %.1f ms (best of %d)\n",
                best_decode, best_pre, best_total, repeats);
  }
  return 0;
}
