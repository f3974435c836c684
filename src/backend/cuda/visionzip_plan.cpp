// The host-side plan of a device VisionZip selection, counted with accel's VisionZip rounding.
#include "backend/cuda/visionzip_plan.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "accel/visionzip.h"

namespace zest::cuda {

Result<VisionZipPlan> visionzip_plan(const std::vector<int64_t>& tokens_per_image, const VisionZipSelect& opt) {
  if (!std::isfinite(opt.rate) || opt.rate < 0.f || opt.rate > 1.f)
    return invalid_argument("prune rate must be in [0, 1], got " + std::to_string(opt.rate));
  if (opt.min_tokens < 1)
    return invalid_argument("min_tokens must be >= 1 so every image keeps a token, got " +
                            std::to_string(opt.min_tokens));
  if (opt.budget < -1)
    return invalid_argument("budget must be -1 (from rate) or a token count >= 0, got " + std::to_string(opt.budget));
  if (!opt.global && opt.budget != -1)
    return invalid_argument("an absolute budget only applies to the global mode; set budget = -1 or global = true");
  if (tokens_per_image.empty()) return invalid_argument("visionzip selection needs at least one image");
  VisionZipPlan plan;
  plan.global = opt.global;
  plan.tokens = tokens_per_image;
  const double keep_frac = 1.0 - accel::decimal_value(opt.rate);
  int64_t floor_sum = 0;
  for (size_t i = 0; i < tokens_per_image.size(); ++i) {
    const int64_t m = tokens_per_image[i];
    if (m < 1)
      return invalid_argument("image " + std::to_string(i) + " has " + std::to_string(m) +
                              " tokens; every image needs at least 1");
    plan.offsets.push_back(plan.total);
    plan.floors.push_back(std::min(m, opt.min_tokens));
    floor_sum += plan.floors.back();
    plan.total += m;
  }
  if (plan.total > (int64_t{1} << 30)) return invalid_argument("too many vision tokens for one selection");
  if (!opt.global) {
    for (size_t i = 0; i < tokens_per_image.size(); ++i) {
      plan.counts.push_back(std::max(plan.floors[i], accel::floor_fraction(tokens_per_image[i], keep_frac)));
      plan.kept += plan.counts.back();
    }
  } else {
    int64_t budget = opt.budget >= 0 ? opt.budget : accel::floor_fraction(plan.total, keep_frac);
    budget = std::clamp(budget, floor_sum, plan.total);
    plan.counts = plan.floors;
    plan.kept = budget;
    plan.extra = budget - floor_sum;
  }
  const int T = static_cast<int>(plan.total), n = static_cast<int>(tokens_per_image.size());
  plan.workspace_bytes = visionzip_workspace_bytes(T, n);
  return plan;
}

}  // namespace zest::cuda
