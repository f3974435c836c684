// The host-side plan of one device VisionZip selection (visionzip_select, kernels/cuda/vision_kernels.h): the
// counts that do not depend on scores, computed with accel's VisionZip rounding (accel::decimal_value,
// accel::floor_fraction) so that the device keeps the counts the CPU selection keeps.
#pragma once
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "kernels/cuda/vision_kernels.h"

namespace zest::cuda {

// Validates the options (as accel::check_options) and plans a selection over images of M_i tokens.
Result<VisionZipPlan> visionzip_plan(const std::vector<int64_t>& tokens_per_image, const VisionZipSelect& opt);

}  // namespace zest::cuda
