// Preprocessing vs transformers 5.17 (recorded by tools/make_vision_refs.py).
// Backend matched: Qwen2VLImageProcessor with the torchvision backend (AutoImageProcessor's choice
// for qwen3_vl when torchvision is installed): tvF.resize on uint8 CHW, bicubic, antialias=True,
// which on CPU runs PyTorch's native uint8 antialiased kernel (int16 fixed-point weights).
// Tolerance: bit-exact. Resized bytes and pixel_values must equal the reference exactly (the
// max |diff| <= 1 LSB checks only make a failure report how far off it is).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "io/npy.h"
#include "vision/preprocess.h"
#include "vision_test_util.h"

namespace zest {
namespace {

using vision_test::data_path;
using vision_test::source_path;

TEST(SmartResize, MatchesTransformersOnManySizes) {
  const auto ref = vision_test::read_json(data_path("smart_resize.json"));
  const int64_t factor = ref["factor"].get<int64_t>();
  size_t n = 0;
  for (const auto& c : ref["cases"]) {
    const auto v = c.get<std::vector<int64_t>>();
    auto r = vision::smart_resize(v[0], v[1], factor, v[2], v[3]);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->first, v[4]) << v[0] << "x" << v[1] << " budget " << v[2] << ".." << v[3];
    EXPECT_EQ(r->second, v[5]) << v[0] << "x" << v[1] << " budget " << v[2] << ".." << v[3];
    ++n;
  }
  EXPECT_GT(n, 500u);
}

TEST(SmartResize, RejectsBadInput) {
  EXPECT_EQ(vision::smart_resize(1, 201, 32, 1, 1 << 20).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(vision::smart_resize(0, 10, 32, 1, 1 << 20).status().code(), ErrorCode::kInvalidArgument);
  io::PreprocessorConfig cfg;
  vision::PixelBudget bad;
  bad.min_pixels = 100000;
  bad.max_pixels = 1000;
  EXPECT_EQ(vision::target_size(100, 100, cfg, bad).status().code(), ErrorCode::kInvalidArgument);
  bad.min_pixels = -1;
  EXPECT_EQ(vision::target_size(100, 100, cfg, bad).status().code(), ErrorCode::kInvalidArgument);
}

TEST(Resize, MatchesTorchvisionUint8Antialias) {
  const auto ref = vision_test::read_json(data_path("resize.json"));
  auto src = io::load_image(data_path("resize_src.png"));
  ASSERT_TRUE(src.ok());
  auto out = io::read_npy(data_path("resize_out.npy"));
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const int32_t* want = out->data<int32_t>();
  int64_t offset = 0, exact = 0, total = 0;
  for (const auto& s : ref["sizes"]) {
    const int64_t h = s[0].get<int64_t>(), w = s[1].get<int64_t>();
    SCOPED_TRACE(std::to_string(h) + "x" + std::to_string(w));
    const io::Image r = vision::resize_bicubic_aa(*src, h, w);
    ASSERT_EQ(r.height, h);
    ASSERT_EQ(r.width, w);
    for (size_t i = 0; i < r.rgb.size(); ++i) {
      const int d = std::abs(static_cast<int>(r.rgb[i]) - want[offset + i]);
      EXPECT_LE(d, 1) << "byte " << i;
      exact += d == 0;
      ++total;
    }
    offset += static_cast<int64_t>(r.rgb.size());
  }
  EXPECT_EQ(offset, out->numel());
  EXPECT_EQ(exact, total);
}

TEST(Preprocess, MatchesTransformersPixelValues) {
  const auto ref = vision_test::read_json(data_path("preprocess.json"));
  EXPECT_EQ(ref["auto_image_processor_qwen3_vl"]["torchvision"].get<std::string>(), "Qwen2VLImageProcessor");
  const io::PreprocessorConfig cfg;  // Qwen3-VL defaults: patch 16, temporal 2, merge 2, mean = std = 0.5
  for (const auto& c : ref["cases"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    auto img = io::load_image(source_path(c["path"].get<std::string>()));
    ASSERT_TRUE(img.ok()) << img.status().to_string();
    vision::PixelBudget budget;
    budget.min_pixels = c["min_pixels"].get<int64_t>();
    budget.max_pixels = c["max_pixels"].get<int64_t>();
    auto batch = vision::preprocess_images({*img}, cfg, budget);
    ASSERT_TRUE(batch.ok()) << batch.status().to_string();
    auto want = io::read_npy(data_path("pp_" + name + ".npy"));
    auto grid = io::read_npy(data_path("pp_" + name + "_grid.npy"));
    ASSERT_TRUE(want.ok() && grid.ok());
    ASSERT_EQ(batch->grids.size(), 1u);
    const int64_t* g = grid->data<int64_t>();
    EXPECT_EQ(batch->grids[0], (vision::GridTHW{g[0], g[1], g[2]}));
    ASSERT_EQ(batch->pixel_values.shape(), want->shape());
    const float* a = batch->pixel_values.data<float>();
    const float* b = want->data<float>();
    float max_diff = 0;
    int64_t exact = 0;
    for (int64_t i = 0; i < want->numel(); ++i) {
      max_diff = std::max(max_diff, std::abs(a[i] - b[i]));
      exact += a[i] == b[i];
    }
    EXPECT_LE(max_diff, 1.0f / 127.5f + 1e-6f);
    EXPECT_EQ(exact, want->numel());
  }
}

TEST(Preprocess, BatchIsConcatenationOfSingles) {
  auto a = io::load_image(source_path("assets/images/photo_food_coco.jpg"));
  auto b = io::load_image(source_path("assets/images/chart_line_pew_china.png"));
  ASSERT_TRUE(a.ok() && b.ok());
  const io::PreprocessorConfig cfg;
  vision::PixelBudget budget;
  budget.max_pixels = 128 * 128;
  budget.min_pixels = 32 * 32;
  auto both = vision::preprocess_images({*a, *b}, cfg, budget);
  auto one = vision::preprocess_images({*a}, cfg, budget);
  auto two = vision::preprocess_images({*b}, cfg, budget);
  ASSERT_TRUE(both.ok() && one.ok() && two.ok());
  ASSERT_EQ(both->grids.size(), 2u);
  EXPECT_EQ(both->grids[0], one->grids[0]);
  EXPECT_EQ(both->grids[1], two->grids[0]);
  const int64_t n1 = one->pixel_values.dim(0), n2 = two->pixel_values.dim(0);
  ASSERT_EQ(both->pixel_values.dim(0), n1 + n2);
  const size_t row_bytes = sizeof(float) * 1536;
  EXPECT_EQ(0, std::memcmp(both->pixel_values.data<float>(), one->pixel_values.data<float>(), n1 * row_bytes));
  EXPECT_EQ(0, std::memcmp(both->pixel_values.data<float>() + n1 * 1536, two->pixel_values.data<float>(),
                           n2 * row_bytes));
}

// One image per worker task gives the same bytes as the serial path: random images of odd sizes (upscaled,
// downscaled, one whose height needs no vertical pass), several budgets.
TEST(Preprocess, ParallelEqualsSerialBytes) {
  std::mt19937 rng(5);
  std::vector<io::Image> images;
  for (auto [w, h] : std::vector<std::pair<int, int>>{{97, 61}, {640, 480}, {333, 512}, {1280, 64}, {40, 40},
                                                       {512, 96}, {1023, 767}}) {
    io::Image img;
    img.width = w;
    img.height = h;
    img.rgb.resize(static_cast<size_t>(w) * h * 3);
    for (auto& b : img.rgb) b = static_cast<uint8_t>(rng());
    images.push_back(std::move(img));
  }
  io::PreprocessorConfig cfg;
  for (int64_t max_px : {int64_t{200704}, int64_t{1003520}, int64_t{16777216}}) {
    vision::PixelBudget budget;
    budget.max_pixels = max_px;
    auto serial = vision::preprocess_images(images, cfg, budget);
    auto parallel = vision::preprocess_images_parallel(images, cfg, budget);
    ASSERT_TRUE(serial.ok() && parallel.ok());
    ASSERT_EQ(serial->pixel_values.shape(), parallel->pixel_values.shape());
    ASSERT_EQ(serial->grids.size(), parallel->grids.size());
    for (size_t i = 0; i < serial->grids.size(); ++i) {
      EXPECT_EQ(serial->grids[i].h, parallel->grids[i].h);
      EXPECT_EQ(serial->grids[i].w, parallel->grids[i].w);
    }
    EXPECT_EQ(std::memcmp(serial->pixel_values.raw(), parallel->pixel_values.raw(), serial->pixel_values.nbytes()), 0)
        << "max_pixels " << max_px;
  }
  io::Image empty;
  EXPECT_FALSE(vision::preprocess_images_parallel({empty}, cfg).ok());
}

TEST(Preprocess, TemporalFramesAreIdenticalAndLayoutFollowsSpec) {
  // Plain-loop reference of §1.4 on the recorded photo case: column ((ch*2+tt)*16+py)*16+px of
  // row (br, bc, ir, ic) is pixel (16*(2br+ir)+py, 16*(2bc+ic)+px) of channel ch, normalised.
  auto img = io::load_image(data_path("crop_mild.png"));
  ASSERT_TRUE(img.ok());
  const io::PreprocessorConfig cfg;
  auto batch = vision::preprocess_images({*img}, cfg);
  ASSERT_TRUE(batch.ok());
  const auto g = batch->grids[0];
  const io::Image resized = vision::resize_bicubic_aa(*img, g.h * 16, g.w * 16);
  const float* pv = batch->pixel_values.data<float>();
  int64_t row = 0;
  for (int64_t br = 0; br < g.h / 2; ++br)
    for (int64_t bc = 0; bc < g.w / 2; ++bc)
      for (int64_t ir = 0; ir < 2; ++ir)
        for (int64_t ic = 0; ic < 2; ++ic, ++row)
          for (int ch = 0; ch < 3; ++ch)
            for (int tt = 0; tt < 2; ++tt)
              for (int py = 0; py < 16; ++py)
                for (int px = 0; px < 16; ++px) {
                  const int64_t y = 16 * (2 * br + ir) + py, x = 16 * (2 * bc + ic) + px;
                  const float u = resized.rgb[(y * resized.width + x) * 3 + ch];
                  const float want = (u - 127.5f) / 127.5f;
                  ASSERT_EQ(pv[row * 1536 + ((ch * 2 + tt) * 16 + py) * 16 + px], want);
                }
  EXPECT_EQ(row, g.patches());
}

}  // namespace
}  // namespace zest
