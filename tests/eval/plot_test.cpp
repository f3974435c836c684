// The plot: a decodable PNG of the stated size, with the points where their values put them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "eval/plot.h"
#include "io/image.h"

namespace zest::eval {
namespace {

// Pixels of the point colour inside [x0, x1) x [y0, y1).
int point_pixels(const io::Image& img, int x0, int x1, int y0, int y1) {
  int n = 0;
  for (int y = y0; y < y1; ++y)
    for (int x = x0; x < x1; ++x) {
      const uint8_t* p = img.rgb.data() + (static_cast<size_t>(y) * img.width + x) * 3;
      n += p[0] == kPlotPoint[0] && p[1] == kPlotPoint[1] && p[2] == kPlotPoint[2];
    }
  return n;
}

TEST(Plot, PngOfTheStatedSizeWithPointsWhereTheyBelong) {
  // Low accuracy at few tokens / low TPOT, high at many / high: in both panels the points sit in the
  // lower-left and upper-right quarters and none in the other two.
  const std::vector<PlotPoint> points = {{100, 10, 0.2}, {400, 40, 0.8}};
  PlotStyle style;
  style.width = 800;
  style.height = 400;
  const std::string file = (std::filesystem::temp_directory_path() / "zest_plot_test.png").string();
  ASSERT_TRUE(write_plot(file, points, style).is_ok());
  std::ifstream f(file, std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::filesystem::remove(file);
  ASSERT_GT(bytes.size(), 8u);
  EXPECT_EQ(io::sniff_image_format(bytes.data(), bytes.size()), io::ImageFormat::kPng);
  auto img = io::decode_image(bytes);
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  ASSERT_EQ(img->width, 800);
  ASSERT_EQ(img->height, 400);
  EXPECT_EQ(img->rgb[0], kPlotBackground[0]);  // a corner is background
  for (int panel = 0; panel < 2; ++panel) {
    const int x0 = panel * 400, xm = x0 + 200, x1 = x0 + 400;
    EXPECT_GT(point_pixels(*img, x0, xm, 200, 400), 20) << "panel " << panel << " lower left";
    EXPECT_GT(point_pixels(*img, xm, x1, 0, 200), 20) << "panel " << panel << " upper right";
    EXPECT_EQ(point_pixels(*img, x0, xm, 0, 200), 0) << "panel " << panel << " upper left";
    EXPECT_EQ(point_pixels(*img, xm, x1, 200, 400), 0) << "panel " << panel << " lower right";
  }
}

TEST(Plot, OnePointAndEqualValuesStillDraw) {
  auto img = render_plot({{50, 5, 0.5}});
  ASSERT_TRUE(img.ok());
  EXPECT_GT(point_pixels(*img, 0, img->width, 0, img->height), 40);  // one disc per panel
}

TEST(Plot, BadInputIsAnError) {
  EXPECT_FALSE(render_plot({}).ok());
  EXPECT_FALSE(render_plot({{1, 1, NAN}}).ok());
  PlotStyle tiny;
  tiny.width = 100;
  EXPECT_FALSE(render_plot({{1, 1, 1}}, tiny).ok());
  EXPECT_EQ(write_plot("/nonexistent-dir/p.png", {{1, 1, 1}}).code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace zest::eval
