// Qwen3-VL image preprocessing: smart_resize, antialiased bicubic resize, rescale + normalise,
// temporal duplication and patch flattening (spec §1). Matches transformers 5.17's
// Qwen2VLImageProcessor (torchvision backend, what AutoImageProcessor picks for qwen3_vl when
// torchvision is installed): torchvision resize on uint8 CHW with antialias=True, bicubic a=-0.5.
#pragma once
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/config.h"
#include "io/image.h"

namespace zest::vision {

// Patch grid of one image or video: t temporal pairs, h x w patches of patch_size pixels.
struct GridTHW {
  int64_t t = 1;
  int64_t h = 0;
  int64_t w = 0;
  int64_t patches() const { return t * h * w; }
  // LLM tokens after the merge_size x merge_size patch merge.
  int64_t merged_tokens(int64_t merge_size) const { return t * (h / merge_size) * (w / merge_size); }
  bool operator==(const GridTHW&) const = default;
};

// Target (height, width) in pixels, both multiples of `factor`, with min_pixels <= h*w <= max_pixels
// where possible (Python round-half-to-even, as transformers' smart_resize). Aspect ratio above 200
// or a non-positive size -> kInvalidArgument.
Result<std::pair<int64_t, int64_t>> smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels,
                                                 int64_t max_pixels);

// Resizes an RGB image to out_h x out_w with torchvision's uint8 antialiased bicubic
// (PyTorch _upsample_bicubic2d_aa on uint8: int16 fixed-point weights, horizontal pass first,
// uint8 intermediate). Returns the input unchanged when the size already matches.
io::Image resize_bicubic_aa(const io::Image& src, int64_t out_h, int64_t out_w);

// Per-request overrides of the processor's pixel budget.
struct PixelBudget {
  std::optional<int64_t> min_pixels;
  std::optional<int64_t> max_pixels;
};

// pixel_values [sum of patches, 3 * temporal_patch * patch^2] f32 (rows of all images
// concatenated, 2x2 merge groups contiguous, §1.4) and one grid per image.
struct PixelBatch {
  Tensor pixel_values;
  std::vector<GridTHW> grids;
};

// Target (height, width) for one image under the config and overrides (validates the overrides).
Result<std::pair<int64_t, int64_t>> target_size(int64_t height, int64_t width, const io::PreprocessorConfig& cfg,
                                                const PixelBudget& budget = {});

// Sizes of a batch, known before any pixel work: each image's resized (height, width) and grid,
// and the pixel_values shape [rows, cols].
struct PreprocessPlan {
  std::vector<std::pair<int64_t, int64_t>> resized;
  std::vector<GridTHW> grids;
  int64_t rows = 0;
  int64_t cols = 0;
};
Result<PreprocessPlan> plan_preprocess(const std::vector<io::Image>& images, const io::PreprocessorConfig& cfg,
                                       const PixelBudget& budget = {});

// Intermediate buffers of the resize: the horizontal pass (input height x output width RGB) and
// one band of merge_size * patch_size vertically resized rows. Keeping one alive across calls
// (one per thread) avoids faulting in fresh pages for every image.
struct ResizeScratch {
  std::vector<uint8_t> horizontal;
  std::vector<uint8_t> band;
};

// Writes the plan's pixel_values into out (plan.rows * plan.cols floats, caller-owned so a
// staging buffer can be reused across requests).
void preprocess_into(const std::vector<io::Image>& images, const PreprocessPlan& plan, const io::PreprocessorConfig& cfg,
                     float* out, ResizeScratch& scratch);

// Full preprocessing of still images (grid_t = 1 each): resize, normalise, duplicate in time, patchify.
Result<PixelBatch> preprocess_images(const std::vector<io::Image>& images, const io::PreprocessorConfig& cfg,
                                     const PixelBudget& budget = {});

// As preprocess_into / preprocess_images with one image per parallel_for task (each task with its own
// scratch): the same bytes as the serial functions, for any thread count.
void preprocess_into_parallel(const std::vector<io::Image>& images, const PreprocessPlan& plan,
                              const io::PreprocessorConfig& cfg, float* out);
Result<PixelBatch> preprocess_images_parallel(const std::vector<io::Image>& images, const io::PreprocessorConfig& cfg,
                                              const PixelBudget& budget = {});

}  // namespace zest::vision
