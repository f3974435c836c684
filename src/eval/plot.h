// The `zest eval --plot` figure: two scatter panels side by side, accuracy against visual tokens kept
// (left) and accuracy against TPOT (right), one numbered point per sweep setting (point n = row n of the
// report). Drawn into an RGB image with a built-in 5x7 bitmap font (digits, letters shown upper-case,
// . - % ( ) = , /; other characters are left blank) and written as a PNG.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "io/image.h"

namespace zest::eval {

struct PlotPoint {
  double visual_tokens = 0;  // mean visual tokens kept per item
  double tpot_ms = 0;        // mean TPOT
  double accuracy = 0;       // in [0, 1]
};

struct PlotStyle {
  int width = 1200, height = 480;  // the whole image (both panels)
  std::string accuracy_label = "accuracy";
};

inline constexpr uint8_t kPlotBackground[3] = {255, 255, 255};
inline constexpr uint8_t kPlotPoint[3] = {31, 119, 180};

// The figure; kInvalidArgument for an image under 320x200, no points, or a non-finite value.
Result<io::Image> render_plot(const std::vector<PlotPoint>& points, const PlotStyle& style = {});
// render_plot, encoded as PNG into `file`.
Status write_plot(const std::string& file, const std::vector<PlotPoint>& points, const PlotStyle& style = {});

}  // namespace zest::eval
