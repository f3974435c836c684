// VisionZip global budget on the bundled real images: all images of assets/images in one request
// compete for one budget; prints the share of its visual tokens each image keeps at rates 0.3 and 0.5,
// and the mean share per kind (dense: documents, receipts, tickets, charts, screenshots, diagrams;
// photo: natural photos). Usage: bench_visionzip_shares [MODEL_DIR] [MAX_TOKENS_PER_IMAGE]
// The scores come from the model's own vision tower: run it on real Qwen3-VL weights for meaningful
// shares (the bundled fixture has random weights).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "engine/vision_encode.h"
#include "io/image.h"

using namespace zest;

int main(int argc, char** argv) {
  const std::string root = ZEST_BENCH_SOURCE_DIR;
  const std::string dir = argc > 1 ? argv[1] : root + "/tests/fixtures/models/qwen3_vl_moe_tiny";
  const int64_t max_tokens = argc > 2 ? std::stoll(argv[2]) : 256;
  auto model_r = engine::ModelBundle::load(dir);
  if (!model_r.ok()) {
    std::fprintf(stderr, "error: %s\n", model_r.status().to_string().c_str());
    return 1;
  }
  auto& model = **model_r;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(root + "/assets/images")) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  std::vector<io::Image> images;
  for (const auto& n : names) {
    auto img = io::load_image(root + "/assets/images/" + n);
    if (!img.ok()) {
      std::fprintf(stderr, "error: %s: %s\n", n.c_str(), img.status().to_string().c_str());
      return 1;
    }
    images.push_back(*img);
  }
  vision::PixelBudget budget;
  budget.max_pixels = max_tokens * 32 * 32;
  budget.min_pixels = 16 * 32 * 32;
  std::printf("model %s, %zu images, <= %lld tokens each, global mode, min_tokens 16\n", dir.c_str(), names.size(),
              static_cast<long long>(max_tokens));
  std::printf("| image | tokens | kept @0.3 | kept @0.5 |\n|---|---|---|---|\n");
  std::map<std::string, std::vector<double>> share[2];
  std::vector<std::vector<int64_t>> kept[2];
  std::vector<std::pair<int64_t, int64_t>> grids;
  const double rates[2] = {0.3, 0.5};
  for (int r = 0; r < 2; ++r) {
    accel::VisionPruneOptions prune = model.vision_prune;
    prune.rate = static_cast<float>(rates[r]);
    prune.mode = accel::VisionPruneOptions::Mode::kGlobal;
    auto enc = engine::encode_images(model, images, budget, prune);
    if (!enc.ok()) {
      std::fprintf(stderr, "error: %s\n", enc.status().to_string().c_str());
      return 1;
    }
    kept[r] = enc->kept;
    grids = enc->merged_grids;
  }
  for (size_t i = 0; i < names.size(); ++i) {
    const double total = static_cast<double>(grids[i].first * grids[i].second);
    const std::string kind = names[i].rfind("photo_", 0) == 0 ? "photo" : "dense";
    std::printf("| %s | %.0f |", names[i].c_str(), total);
    for (int r = 0; r < 2; ++r) {
      const double s = kept[r][i].size() / total;
      share[r][kind].push_back(s);
      std::printf(" %.0f%% |", 100 * s);
    }
    std::printf("\n");
  }
  std::printf("\n| kind | images | mean kept @0.3 | mean kept @0.5 |\n|---|---|---|---|\n");
  for (const char* kind : {"dense", "photo"}) {
    std::printf("| %s | %zu |", kind, share[0][kind].size());
    for (int r = 0; r < 2; ++r) {
      double m = 0;
      for (double s : share[r][kind]) m += s / share[r][kind].size();
      std::printf(" %.0f%% |", 100 * m);
    }
    std::printf("\n");
  }
  return 0;
}
