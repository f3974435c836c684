#include "eval/plot.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>

namespace zest::eval {
namespace {

// 5x7 glyphs: 7 rows, bit 4 = leftmost column.
struct Glyph {
  char c;
  uint8_t rows[7];
};
constexpr Glyph kFont[] = {
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11}}, {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}}, {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}}, {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}}, {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}}, {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}}, {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}}, {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}}, {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}}, {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}}, {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}}, {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}}, {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}}, {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}}, {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}},
    {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}}, {'=', {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00}},
    {',', {0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08}}, {'/', {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00}},
};
constexpr int kScale = 2;                // font pixels are kScale x kScale
constexpr int kAdvance = 6 * kScale;     // glyph width plus one column of space
constexpr int kTextHeight = 7 * kScale;
constexpr uint8_t kInk[3] = {0, 0, 0};
constexpr uint8_t kGrid[3] = {225, 225, 225};

class Canvas {
 public:
  explicit Canvas(io::Image& img) : img_(img) {}
  void pixel(int x, int y, const uint8_t* c) {
    if (x < 0 || y < 0 || x >= img_.width || y >= img_.height) return;
    std::copy(c, c + 3, img_.rgb.data() + (static_cast<size_t>(y) * img_.width + x) * 3);
  }
  void rect(int x0, int y0, int x1, int y1, const uint8_t* c) {  // inclusive corners
    for (int y = y0; y <= y1; ++y)
      for (int x = x0; x <= x1; ++x) pixel(x, y, c);
  }
  void disc(int cx, int cy, int r, const uint8_t* c) {
    for (int y = -r; y <= r; ++y)
      for (int x = -r; x <= r; ++x)
        if (x * x + y * y <= r * r) pixel(cx + x, cy + y, c);
  }
  // Text with its top-left corner at (x, y).
  void text(int x, int y, const std::string& s, const uint8_t* c) {
    for (char ch : s) {
      const char up = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
      for (const Glyph& g : kFont) {
        if (g.c != up) continue;
        for (int r = 0; r < 7; ++r)
          for (int col = 0; col < 5; ++col)
            if (g.rows[r] & (0x10 >> col))
              rect(x + col * kScale, y + r * kScale, x + col * kScale + kScale - 1, y + r * kScale + kScale - 1, c);
      }
      x += kAdvance;
    }
  }
  static int text_width(const std::string& s) { return static_cast<int>(s.size()) * kAdvance; }

 private:
  io::Image& img_;
};

// An axis range rounded out to a "nice" tick step (1, 2 or 5 times a power of ten), about five ticks.
struct Axis {
  double lo = 0, hi = 1, step = 1;
  int decimals = 0;
};

// A single value is padded by `pad` either way.
Axis nice_axis(double lo, double hi, double pad) {
  if (hi - lo < 1e-12) {
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / 5.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  Axis a;
  a.step = (f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 5.0 ? 5.0 : 10.0) * mag;
  a.lo = std::floor(lo / a.step) * a.step;
  a.hi = std::ceil(hi / a.step) * a.step;
  a.decimals = std::max(0, static_cast<int>(-std::floor(std::log10(a.step))));
  return a;
}

std::string tick_label(double v, int decimals) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, std::abs(v) < 1e-12 ? 0.0 : v);
  return buf;
}

// One panel inside the box [x0, x0 + w) x [0, h): accuracy (%) against xs.
void draw_panel(Canvas& cv, int x0, int w, int h, const std::vector<double>& xs, const std::vector<double>& acc,
                const std::string& title, const std::string& x_label) {
  const int left = x0 + 90, right = x0 + w - 30, top = 50, bottom = h - 60;
  const auto [xmin, xmax] = std::minmax_element(xs.begin(), xs.end());
  const auto [ymin, ymax] = std::minmax_element(acc.begin(), acc.end());
  const Axis ax = nice_axis(*xmin, *xmax, std::max(std::abs(*xmin) * 0.1, 1e-3));
  Axis ay = nice_axis(*ymin, *ymax, 5.0);  // accuracy in %: within [0, 100]
  ay.lo = std::max(ay.lo, 0.0);
  ay.hi = std::min(ay.hi, 100.0);
  auto px = [&](double v) { return left + static_cast<int>(std::lround((v - ax.lo) / (ax.hi - ax.lo) * (right - left))); };
  auto py = [&](double v) { return bottom - static_cast<int>(std::lround((v - ay.lo) / (ay.hi - ay.lo) * (bottom - top))); };

  cv.text(x0 + (w - Canvas::text_width(title)) / 2, 15, title, kInk);
  for (int i = 0; ax.lo + i * ax.step <= ax.hi + ax.step * 1e-6; ++i) {
    const double v = ax.lo + i * ax.step;
    const int x = px(v);
    cv.rect(x, top, x, bottom, kGrid);
    cv.rect(x, bottom, x, bottom + 5, kInk);
    const std::string s = tick_label(v, ax.decimals);
    cv.text(x - Canvas::text_width(s) / 2, bottom + 10, s, kInk);
  }
  for (int i = 0; ay.lo + i * ay.step <= ay.hi + ay.step * 1e-6; ++i) {
    const double v = ay.lo + i * ay.step;
    const int y = py(v);
    cv.rect(left, y, right, y, kGrid);
    cv.rect(left - 5, y, left, y, kInk);
    const std::string s = tick_label(v, ay.decimals);
    cv.text(left - 10 - Canvas::text_width(s), y - kTextHeight / 2, s, kInk);
  }
  cv.rect(left, top, left, bottom, kInk);
  cv.rect(left, bottom, right, bottom, kInk);
  cv.text(left + (right - left - Canvas::text_width(x_label)) / 2, bottom + 35, x_label, kInk);
  // Points that land (nearly) on the same spot share one label ("1,3").
  std::vector<std::pair<std::pair<int, int>, std::string>> labels;
  for (size_t i = 0; i < xs.size(); ++i) {
    const std::pair<int, int> at{px(xs[i]), py(acc[i])};
    cv.disc(at.first, at.second, 5, kPlotPoint);
    auto same = std::find_if(labels.begin(), labels.end(), [&](const auto& l) {
      return std::abs(l.first.first - at.first) < 2 * kAdvance && std::abs(l.first.second - at.second) < kTextHeight;
    });
    if (same == labels.end()) labels.push_back({at, std::to_string(i + 1)});
    else same->second += "," + std::to_string(i + 1);
  }
  for (const auto& [at, label] : labels) cv.text(at.first + 8, at.second - kTextHeight - 2, label, kInk);
}

}  // namespace

Result<io::Image> render_plot(const std::vector<PlotPoint>& points, const PlotStyle& style) {
  if (style.width < 320 || style.height < 200)
    return invalid_argument("the plot must be at least 320x200 pixels (got " + std::to_string(style.width) + "x" +
                            std::to_string(style.height) + ")");
  if (points.empty()) return invalid_argument("nothing to plot: no settings ran");
  std::vector<double> vis, tpot, acc;
  for (const PlotPoint& p : points) {
    if (!std::isfinite(p.visual_tokens) || !std::isfinite(p.tpot_ms) || !std::isfinite(p.accuracy))
      return invalid_argument("a plot point holds a NaN or infinity");
    vis.push_back(p.visual_tokens);
    tpot.push_back(p.tpot_ms);
    acc.push_back(100.0 * p.accuracy);
  }
  io::Image img;
  img.width = style.width;
  img.height = style.height;
  img.rgb.resize(static_cast<size_t>(img.width) * img.height * 3);
  for (size_t i = 0; i < img.rgb.size(); i += 3) std::copy(kPlotBackground, kPlotBackground + 3, img.rgb.data() + i);
  Canvas cv(img);
  const int half = style.width / 2;
  draw_panel(cv, 0, half, style.height, vis, acc, style.accuracy_label + " % vs visual tokens kept",
             "visual tokens kept (mean per item)");
  draw_panel(cv, half, style.width - half, style.height, tpot, acc, style.accuracy_label + " % vs TPOT", "TPOT (ms)");
  return img;
}

Status write_plot(const std::string& file, const std::vector<PlotPoint>& points, const PlotStyle& style) {
  ZEST_ASSIGN_OR_RETURN(io::Image img, render_plot(points, style));
  ZEST_ASSIGN_OR_RETURN(std::vector<uint8_t> png, io::encode_png(img));
  std::ofstream f(file, std::ios::binary);
  if (!f) return not_found("cannot write the plot '" + file + "'");
  f.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  if (!f) return internal_error("writing the plot '" + file + "' failed");
  return Status::ok();
}

}  // namespace zest::eval
