// The engine's vision path on CUDA against the same path on the CPU: a ModelBundle loaded with the CUDA
// backend encodes the images of the VisionZip reference cases (tests/fixtures/ref/visionzip, tiny Qwen3-VL-MoE
// fixture) through vision::VisionEncoder on the device (tower, scores, selection and gathers stay on the
// device; the kept rows feed the CUDA decoder from device memory); its embeddings, DeepStack features,
// VisionZip scores, selections and greedy tokens are compared with the CPU bundle's (the f32 reference).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>

#include <nlohmann/json.hpp>

#include "engine/chat_request.h"
#include "engine/encoder_cache.h"
#include "engine/engine.h"
#include "engine/model_bundle.h"
#include "engine/sere.h"
#include "engine/vision_encode.h"
#include "io/image.h"
#include "kernels/backend.h"
#include "model/golden_util.h"
#include "vision/encoder.h"
#include "vision/preprocess.h"

namespace zest {
namespace {

using nlohmann::json;

// bf16 weights and activations through the tower's blocks (as tests/cuda/vision_tower_test.cpp): every output
// value within 5e-2 * max |cpu| of the CPU value.
constexpr double kTol = 5e-2;

const std::filesystem::path kCases = std::filesystem::path(ZEST_FIXTURES_DIR) / "ref" / "visionzip";
const std::string kModel = std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_vl_moe_tiny";

std::vector<std::pair<std::string, json>> reference_cases() {
  std::vector<std::pair<std::string, json>> out;
  for (const auto& e : std::filesystem::directory_iterator(kCases)) {
    if (e.path().extension() != ".json") continue;
    std::ifstream f(e.path());
    out.emplace_back(e.path().stem().string(), json::parse(f));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

// The request of a reference case with its VisionZip settings.
json pruned_request(const json& ref) {
  json body = ref["request"];
  body["vision_prune"] = {{"rate", ref["rate"].get<double>()},
                          {"mode", ref["mode"].get<std::string>()},
                          {"min_tokens", ref["min_tokens"].get<int64_t>()},
                          {"score_layer", ref["score_layer_from_end"].get<int64_t>()}};
  return body;
}

std::vector<io::Image> request_images(const engine::ChatRequest& req) {
  std::vector<io::Image> images;
  for (const auto& m : req.messages)
    if (m["content"].is_array())
      for (const auto& part : m["content"])
        if (part.value("type", "") == "image_url") {
          const std::string url = part["image_url"]["url"].get<std::string>();
          auto img = io::load_image(std::string(ZEST_SOURCE_DIR) + "/" + url.substr(std::string("file://").size()));
          EXPECT_TRUE(img.ok()) << img.status().to_string();
          if (img.ok()) images.push_back(std::move(*img));
        }
  return images;
}

// max |got - want| and max |want| over rows [begin, end) of two [rows, D] tensors.
struct Err {
  double err = 0, ref = 0;
};
void accumulate(Err& e, const float* got, const float* want, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::isnan(got[i]) ? INFINITY : std::fabs(static_cast<double>(got[i]) - want[i]);
    e.err = std::max(e.err, d);
    e.ref = std::max(e.ref, std::fabs(static_cast<double>(want[i])));
  }
}

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  Err e;
  accumulate(e, got.data<float>(), want.data<float>(), want.numel());
  EXPECT_GT(e.ref, 0.0) << what;
  EXPECT_LE(e.err, kTol * e.ref) << what << ": max err " << e.err << " max |cpu| " << e.ref;
}

// The encoded rows as host f32 tensors (the CUDA bundle keeps them on the device).
void to_host(const engine::ModelBundle& m, engine::EncodedImages& enc) {
  ASSERT_EQ(enc.embeds.device(), Device::CUDA) << "the CUDA bundle should keep the visual rows on the device";
  auto e = m.vision->to_host(enc.embeds);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  enc.embeds = *e;
  for (Tensor& d : enc.deepstack) {
    auto h = m.vision->to_host(d);
    ASSERT_TRUE(h.ok()) << h.status().to_string();
    d = *h;
  }
}

// One prefill of the prompt on `dec`, then `steps` greedy decode steps (golden_util.h): the first step's logits,
// the tokens and every step's top-2 margin.
void greedy(const model::TextDecoder& dec, const engine::Prompt& p, int steps, Tensor& first,
            std::vector<int32_t>& tokens, std::vector<double>& margins) {
  zest::testing::greedy_steps(dec, p, steps, tokens, margins, &first);
}

class CudaVisionEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
    auto c = engine::ModelBundle::load(kModel, model::Backend::kCpu);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    cpu = *c;
    auto g = engine::ModelBundle::load(kModel, model::Backend::kCuda);
    ASSERT_TRUE(g.ok()) << g.status().to_string();
    gpu = *g;
    ASSERT_TRUE(cpu->vision && gpu->vision);
    ASSERT_STREQ(cpu->vision->backend_name(), "cpu");
    ASSERT_STREQ(gpu->vision->backend_name(), "cuda");
  }
  std::shared_ptr<engine::ModelBundle> cpu, gpu;
};

TEST_F(CudaVisionEngine, EncodeImagesMatchesCpuBundleOnVisionZipCases) {
  const auto cases = reference_cases();
  ASSERT_FALSE(cases.empty());
  for (const auto& [name, ref] : cases) {
    SCOPED_TRACE(name);
    auto req = engine::parse_chat_request(pruned_request(ref), *cpu);
    ASSERT_TRUE(req.ok()) << req.status().to_string();
    const std::vector<io::Image> images = request_images(*req);
    ASSERT_FALSE(images.empty());

    // Unpruned: every merged token's embedding and DeepStack features.
    const accel::VisionPruneOptions off = cpu->vision_prune;  // the model's: rate 0
    ASSERT_EQ(off.rate, 0.0f);
    auto cpu_full = engine::encode_images(*cpu, images, req->pixels, off);
    auto gpu_full = engine::encode_images(*gpu, images, req->pixels, off);
    ASSERT_TRUE(cpu_full.ok()) << cpu_full.status().to_string();
    ASSERT_TRUE(gpu_full.ok()) << gpu_full.status().to_string();
    to_host(*gpu, *gpu_full);
    EXPECT_EQ(gpu_full->merged_grids, cpu_full->merged_grids);
    EXPECT_EQ(gpu_full->kept, cpu_full->kept);
    expect_close(gpu_full->embeds, cpu_full->embeds, "embeds");
    ASSERT_EQ(gpu_full->deepstack.size(), cpu_full->deepstack.size());
    for (size_t l = 0; l < cpu_full->deepstack.size(); ++l)
      expect_close(gpu_full->deepstack[l], cpu_full->deepstack[l], "deepstack " + std::to_string(l));

    // The VisionZip scores the two encoders give at the case's score layer, on one preprocessed batch.
    auto batch = vision::preprocess_images(images, cpu->preprocessor, req->pixels);
    ASSERT_TRUE(batch.ok()) << batch.status().to_string();
    const int64_t layer = cpu->config.vision->depth + ref["score_layer_from_end"].get<int64_t>();
    auto cpu_enc = cpu->vision->forward(*batch, layer);
    auto gpu_enc = gpu->vision->forward(*batch, layer);
    ASSERT_TRUE(cpu_enc.ok()) << cpu_enc.status().to_string();
    ASSERT_TRUE(gpu_enc.ok()) << gpu_enc.status().to_string();
    ASSERT_EQ(gpu_enc->scores.size(), images.size());
    ASSERT_EQ(cpu_enc->scores.size(), images.size());
    Err score;
    for (size_t i = 0; i < images.size(); ++i) {
      ASSERT_EQ(gpu_enc->scores[i].size(), cpu_enc->scores[i].size());
      accumulate(score, gpu_enc->scores[i].data(), cpu_enc->scores[i].data(),
                 static_cast<int64_t>(cpu_enc->scores[i].size()));
    }
    EXPECT_LE(score.err, kTol * score.ref) << "scores: max err " << score.err << " max |cpu| " << score.ref;
    std::cout << "[" << name << "] bf16 VisionZip score error " << score.err << " (max |cpu score| " << score.ref
              << ")\n";

    // Pruned: the same kept counts; the kept tokens equal except near-ties at the cut. A token may be kept by
    // one backend and not the other only when its CPU score is within 2 * (measured max score error) of the
    // CPU cut (the k-th largest CPU score of its image): the token's score and the cut token's score can each
    // move by up to that error, so such a pair can swap order under bf16.
    auto cpu_p = engine::encode_images(*cpu, images, req->pixels, req->vision_prune);
    auto gpu_p = engine::encode_images(*gpu, images, req->pixels, req->vision_prune);
    ASSERT_TRUE(cpu_p.ok()) << cpu_p.status().to_string();
    ASSERT_TRUE(gpu_p.ok()) << gpu_p.status().to_string();
    to_host(*gpu, *gpu_p);
    ASSERT_EQ(gpu_p->kept.size(), cpu_p->kept.size());
    const int64_t D = cpu_full->embeds.dim(1);
    int64_t cpu_off = 0, gpu_off = 0, full_off = 0, differing = 0;
    Err pruned_err;
    for (size_t i = 0; i < cpu_p->kept.size(); ++i) {
      const auto& a = cpu_p->kept[i];
      const auto& b = gpu_p->kept[i];
      ASSERT_EQ(b.size(), a.size()) << "image " << i;
      std::vector<float> sorted = cpu_enc->scores[i];
      std::sort(sorted.rbegin(), sorted.rend());
      const float cut = sorted[a.size() - 1];
      std::vector<int64_t> diff;
      std::set_symmetric_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(diff));
      for (int64_t j : diff)
        EXPECT_LE(std::fabs(cpu_enc->scores[i][j] - cut), 2 * score.err) << "image " << i << " token " << j;
      differing += static_cast<int64_t>(diff.size()) / 2;

      // The kept rows: the device bundle's rows are its own unpruned rows, gathered exactly; rows kept by both
      // backends agree within the tolerance.
      for (size_t r = 0; r < b.size(); ++r) {
        const float* got = gpu_p->embeds.data<float>() + (gpu_off + static_cast<int64_t>(r)) * D;
        const float* full = gpu_full->embeds.data<float>() + (full_off + b[r]) * D;
        EXPECT_TRUE(std::equal(got, got + D, full)) << "image " << i << " kept row " << r;
        const auto it = std::lower_bound(a.begin(), a.end(), b[r]);
        if (it != a.end() && *it == b[r])
          accumulate(pruned_err, got, cpu_p->embeds.data<float>() + (cpu_off + (it - a.begin())) * D, D);
      }
      cpu_off += static_cast<int64_t>(a.size());
      gpu_off += static_cast<int64_t>(b.size());
      full_off += cpu_full->merged_grids[i].first * cpu_full->merged_grids[i].second;
    }
    EXPECT_LE(pruned_err.err, kTol * pruned_err.ref) << "pruned embeds: max err " << pruned_err.err;
    std::cout << "[" << name << "] tokens kept by only one backend: " << differing << " pair(s)\n";
  }
}

// Prompts built by the CUDA bundle (visual rows selected, gathered and kept on the device) against the CPU
// bundle's: the same selections (exactly, unless a near-tie at the cut swapped a pair, as above) and the same
// greedy tokens up to the first step whose CPU top-2 margin is below 2x the measured first-step logit error;
// and the device rows against the same rows handed over from the host, through the CUDA decoder and through
// the engine with prefill chunks of 16 tokens: identical logits and tokens.
TEST_F(CudaVisionEngine, DevicePromptsMatchCpuAndHostRows) {
  constexpr int kSteps = 8;
  const auto cases = reference_cases();
  ASSERT_FALSE(cases.empty());
  engine::PromptOptions po;
  po.base_dir = ZEST_SOURCE_DIR;
  int same_selection = 0;
  for (const auto& [name, ref] : cases) {
    SCOPED_TRACE(name);
    auto req_c = engine::parse_chat_request(pruned_request(ref), *cpu);
    auto req_g = engine::parse_chat_request(pruned_request(ref), *gpu);
    ASSERT_TRUE(req_c.ok() && req_g.ok());
    auto pc = engine::build_prompt(*cpu, *req_c, po);
    auto pg = engine::build_prompt(*gpu, *req_g, po);
    ASSERT_TRUE(pc.ok()) << pc.status().to_string();
    ASSERT_TRUE(pg.ok()) << pg.status().to_string();
    ASSERT_EQ(pg->mm_embeds.device(), Device::CUDA);
    ASSERT_EQ(pg->mm_index.size(), pc->mm_index.size());
    ASSERT_EQ(pg->ids.size(), pc->ids.size());

    // Device rows vs the same rows from the host, on the CUDA decoder: bit-identical logits.
    engine::Prompt ph = *pg;
    {
      auto e = gpu->vision->to_host(pg->mm_embeds);
      ASSERT_TRUE(e.ok()) << e.status().to_string();
      ph.mm_embeds = *e;
      for (Tensor& d : ph.deepstack) {
        auto h = gpu->vision->to_host(d);
        ASSERT_TRUE(h.ok());
        d = *h;
      }
    }
    Tensor l_dev, l_host, l_cpu;
    std::vector<int32_t> t_dev, t_host, t_cpu;
    std::vector<double> m_dev, m_host, m_cpu;
    greedy(gpu->decoder(), *pg, kSteps, l_dev, t_dev, m_dev);
    greedy(gpu->decoder(), ph, kSteps, l_host, t_host, m_host);
    ASSERT_TRUE(l_dev.defined() && l_host.defined());
    EXPECT_TRUE(std::equal(l_dev.data<float>(), l_dev.data<float>() + l_dev.numel(), l_host.data<float>()))
        << "device rows and host rows give different logits";
    EXPECT_EQ(t_dev, t_host);

    // Through the engine with 16-token prefill chunks (one device segment per chunk).
    engine::EngineOptions eo;
    eo.max_batched_tokens = 16;
    for (const engine::Prompt* p : {&*pg, &ph}) {
      engine::Request r;
      r.prompt = *p;
      r.sampling.temperature = 0;
      r.sampling.max_tokens = kSteps;
      r.sampling.ignore_eos = true;
      auto out = engine::generate_one(gpu, r, eo);
      ASSERT_TRUE(out.ok()) << out.status().to_string();
      EXPECT_EQ(out->token_ids, t_dev) << (p == &ph ? "host rows" : "device rows") << " through the engine";
    }

    // Against the CPU bundle: when both selected the same tokens, the greedy tokens agree above the noise.
    if (pg->positions != pc->positions) {
      std::cout << "[" << name << "] selections differ at a near-tie (checked in EncodeImagesMatchesCpuBundle)\n";
      continue;
    }
    ++same_selection;
    greedy(cpu->decoder(), *pc, kSteps, l_cpu, t_cpu, m_cpu);
    ASSERT_TRUE(l_cpu.defined());
    Err e;
    accumulate(e, l_dev.data<float>(), l_cpu.data<float>(), l_cpu.numel());
    EXPECT_LE(e.err, kTol * e.ref) << "first-step logits: max err " << e.err;
    size_t compared = 0;
    for (size_t i = 0; i < t_cpu.size() && m_cpu[i] >= 2 * e.err; ++i, ++compared)
      EXPECT_EQ(t_dev[i], t_cpu[i]) << "greedy step " << i << " (cpu margin " << m_cpu[i] << ")";
    std::cout << "[" << name << "] greedy tokens compared " << compared << " of " << t_cpu.size()
              << " (logit error " << e.err << ")\n";
  }
  EXPECT_GT(same_selection, 0) << "no case selected the same tokens on both backends";
}

// Two device prompts in one decoder step: each sequence's visual rows come as its own device segment (the
// decoder copies both into its staging rows); the same step with the rows from the host gives bit-identical
// logits.
TEST_F(CudaVisionEngine, TwoDeviceSegmentsInOneStepEqualHostRows) {
  const auto cases = reference_cases();
  ASSERT_GE(cases.size(), 2u);
  engine::PromptOptions po;
  po.base_dir = ZEST_SOURCE_DIR;
  std::vector<engine::Prompt> prompts;
  for (size_t c = 0; c < 2; ++c) {
    auto req = engine::parse_chat_request(pruned_request(cases[c].second), *gpu);
    ASSERT_TRUE(req.ok());
    auto p = engine::build_prompt(*gpu, *req, po);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    ASSERT_EQ(p->mm_embeds.device(), Device::CUDA);
    prompts.push_back(std::move(*p));
  }
  const model::TextDecoder& dec = gpu->decoder();
  int64_t T = 0, M = 0;
  for (const auto& p : prompts) {
    T += static_cast<int64_t>(p.ids.size());
    M += p.mm_embeds.dim(0);
  }
  const int64_t H = prompts[0].mm_embeds.dim(1);
  const size_t nds = prompts[0].deepstack.size();
  auto run = [&](bool device) -> Tensor {
    auto cache = dec.allocate_cache(T / 16 + 4, 16);
    EXPECT_TRUE(cache.ok());
    if (!cache.ok()) return Tensor();
    std::vector<std::vector<int32_t>> tables(prompts.size());
    model::ForwardBatch b;
    b.positions.assign(static_cast<size_t>(3 * T), 0);
    Tensor host_emb = Tensor::empty({M, H});
    std::vector<Tensor> host_ds;
    for (size_t l = 0; l < nds; ++l) host_ds.push_back(Tensor::empty({M, H}));
    int64_t t0 = 0, r0 = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const engine::Prompt& p = prompts[i];
      const int64_t n = static_cast<int64_t>(p.ids.size()), m = p.mm_embeds.dim(0);
      EXPECT_TRUE(cache->reserve(tables[i], n).is_ok());
      b.tokens.insert(b.tokens.end(), p.ids.begin(), p.ids.end());
      for (int a = 0; a < 3; ++a)
        for (int64_t j = 0; j < n; ++j) b.positions[a * T + t0 + j] = p.positions[a * n + j];
      for (int64_t r : p.mm_index) b.mm_index.push_back(t0 + r);
      b.seqs.push_back({&tables[i], 0, n, false, true});
      if (device) {
        model::ForwardBatch::DeviceRows rows;
        rows.embeds = p.mm_embeds.raw();
        for (const Tensor& d : p.deepstack) rows.deepstack.push_back(d.raw());
        rows.rows = m;
        b.mm_device.push_back(rows);
      } else {
        auto e = gpu->vision->to_host(p.mm_embeds);
        EXPECT_TRUE(e.ok());
        std::memcpy(host_emb.data<float>() + r0 * H, e->data<float>(), e->nbytes());
        for (size_t l = 0; l < nds; ++l) {
          auto d = gpu->vision->to_host(p.deepstack[l]);
          EXPECT_TRUE(d.ok());
          std::memcpy(host_ds[l].data<float>() + r0 * H, d->data<float>(), d->nbytes());
        }
      }
      t0 += n;
      r0 += m;
    }
    if (!device) {
      b.mm_embeds = host_emb;
      b.deepstack = host_ds;
    }
    auto logits = dec.forward(b, *cache);
    EXPECT_TRUE(logits.ok()) << logits.status().to_string();
    return logits.ok() ? *logits : Tensor();
  };
  const Tensor ld = run(true), lh = run(false);
  ASSERT_TRUE(ld.defined() && lh.defined());
  ASSERT_EQ(ld.shape(), lh.shape());
  ASSERT_EQ(ld.dim(0), 2);
  EXPECT_EQ(std::memcmp(ld.raw(), lh.raw(), ld.nbytes()), 0) << "two device segments differ from the host rows";
}

// Many images of one request in groups (one tower forward per group): preprocessing the next group on the
// worker threads while the tower runs gives the same bytes as running the groups one after the other, and
// the grouped encoding agrees with one forward over all images (GEMM shapes differ, so within bf16 noise)
// with the same selections.
TEST_F(CudaVisionEngine, GroupedOverlappedEncodingEqualsSerial) {
  std::vector<io::Image> images;
  for (const char* name : {"assets/images/photo_birds.jpg", "assets/images/chart_bar_qwen3_downloads.png",
                           "assets/images/photo_street.jpg"}) {
    auto img = io::load_image(std::string(ZEST_SOURCE_DIR) + "/" + name);
    ASSERT_TRUE(img.ok()) << img.status().to_string();
    // Distinct crops (distinct cache keys) of each image.
    for (int c = 0; c < 4; ++c) {
      io::Image crop;
      crop.width = img->width - 37 * c;
      crop.height = img->height - 23 * c;
      crop.rgb.resize(static_cast<size_t>(crop.width) * crop.height * 3);
      for (int y = 0; y < crop.height; ++y)
        std::copy_n(img->rgb.begin() + (static_cast<size_t>(y) * img->width) * 3, crop.width * 3,
                    crop.rgb.begin() + static_cast<size_t>(y) * crop.width * 3);
      images.push_back(std::move(crop));
    }
  }
  vision::PixelBudget kw;
  kw.max_pixels = 65536;
  accel::VisionPruneOptions prune = gpu->vision_prune;
  prune.rate = 0.4f;
  prune.mode = accel::VisionPruneOptions::Mode::kGlobal;
  auto run = [&](int64_t group, bool overlap) {
    gpu->encoder_cache->clear();
    engine::EncodeOptions o;
    o.group_images = group;
    o.overlap = overlap;
    auto r = engine::encode_images(*gpu, images, kw, prune, o);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) to_host(*gpu, *r);
    return r;
  };
  auto overlapped = run(5, true), serial = run(5, false), single = run(0, true);
  ASSERT_TRUE(overlapped.ok() && serial.ok() && single.ok());
  EXPECT_EQ(overlapped->tower_forwards, 3);
  EXPECT_EQ(single->tower_forwards, 1);
  EXPECT_EQ(overlapped->kept, serial->kept);
  ASSERT_EQ(overlapped->embeds.shape(), serial->embeds.shape());
  EXPECT_EQ(std::memcmp(overlapped->embeds.raw(), serial->embeds.raw(), serial->embeds.nbytes()), 0);
  for (size_t l = 0; l < serial->deepstack.size(); ++l)
    EXPECT_EQ(std::memcmp(overlapped->deepstack[l].raw(), serial->deepstack[l].raw(), serial->deepstack[l].nbytes()), 0);
  ASSERT_EQ(single->merged_grids, serial->merged_grids);
  // One forward vs groups: same kept counts; rows of tokens kept by both agree within the tolerance.
  ASSERT_EQ(single->kept.size(), serial->kept.size());
  const int64_t D = serial->embeds.dim(1);
  int64_t off_a = 0, off_b = 0;
  Err e;
  for (size_t i = 0; i < serial->kept.size(); ++i) {
    const auto& a = serial->kept[i];
    const auto& b = single->kept[i];
    for (size_t r = 0; r < a.size(); ++r) {
      const auto it = std::lower_bound(b.begin(), b.end(), a[r]);
      if (it != b.end() && *it == a[r])
        accumulate(e, serial->embeds.data<float>() + (off_a + static_cast<int64_t>(r)) * D,
                   single->embeds.data<float>() + (off_b + (it - b.begin())) * D, D);
    }
    off_a += static_cast<int64_t>(a.size());
    off_b += static_cast<int64_t>(b.size());
  }
  EXPECT_LE(e.err, kTol * e.ref) << "grouped vs one forward: max err " << e.err;
  int64_t kept_a = 0, kept_b = 0;
  for (size_t i = 0; i < serial->kept.size(); ++i) {
    kept_a += static_cast<int64_t>(serial->kept[i].size());
    kept_b += static_cast<int64_t>(single->kept[i].size());
  }
  EXPECT_EQ(kept_a, kept_b);
  gpu->encoder_cache->clear();
}

// Bad input to the device encoder is a clear error, the same kind as the CPU encoder's, and the encoder
// stays usable afterwards.
TEST_F(CudaVisionEngine, DeviceEncoderRejectsBadInput) {
  auto img = io::load_image(std::string(ZEST_SOURCE_DIR) + "/assets/images/photo_street.jpg");
  ASSERT_TRUE(img.ok()) << img.status().to_string();
  vision::PixelBudget budget;
  budget.max_pixels = 65536;
  auto batch = vision::preprocess_images({*img}, cpu->preprocessor, budget);
  ASSERT_TRUE(batch.ok()) << batch.status().to_string();
  const int64_t depth = cpu->config.vision->depth;
  for (int64_t layer : {int64_t{-1}, depth}) {
    auto c = cpu->vision->forward(*batch, layer);
    auto g = gpu->vision->forward(*batch, layer);
    ASSERT_FALSE(c.ok());
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.status().code(), c.status().code()) << g.status().to_string();
  }
  vision::PixelBatch short_rows;
  short_rows.pixel_values = batch->pixel_values.rows(0, batch->pixel_values.dim(0) - 4).clone();
  short_rows.grids = batch->grids;
  auto c = cpu->vision->forward(short_rows);
  auto g = gpu->vision->forward(short_rows);
  ASSERT_FALSE(c.ok());
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), c.status().code()) << g.status().to_string();

  auto cpu_ok = cpu->vision->forward(*batch);
  auto gpu_ok = gpu->vision->forward(*batch);
  ASSERT_TRUE(cpu_ok.ok()) << cpu_ok.status().to_string();
  ASSERT_TRUE(gpu_ok.ok()) << gpu_ok.status().to_string();
  EXPECT_TRUE(gpu_ok->scores.empty());
  expect_close(gpu_ok->embeds, cpu_ok->embeds, "embeds after errors");
}

}  // namespace
// zest sere-protect --device cuda with image prompts: the CUDA vision path leaves the kept rows in device
// memory, and the ranking's prompt forwards must hand them to the decoder as device rows (they were passed as
// host rows and refused). The CUDA bundle's KL per expert is finite and non-negative, and every layer's KL
// vector is within 20% (L1, relative) of the CPU bundle's f32 reference: bf16 forwards, small KLs.
TEST_F(CudaVisionEngine, SereProtectRanksImagePromptsOnTheDevice) {
  auto cases = reference_cases();
  ASSERT_FALSE(cases.empty());
  // One document and the two-image case: every masked forward copies all of a prompt's logits to the host and sums
  // them there, so each prompt costs about half a minute here.
  if (cases.size() > 2) cases.erase(cases.begin() + 1, cases.end() - 1);
  engine::PromptOptions po;
  po.base_dir = ZEST_SOURCE_DIR;
  std::vector<engine::Prompt> pc, pg;
  for (const auto& [name, ref] : cases) {
    auto rc = engine::parse_chat_request(pruned_request(ref), *cpu);
    auto rg = engine::parse_chat_request(pruned_request(ref), *gpu);
    ASSERT_TRUE(rc.ok() && rg.ok());
    auto c = engine::build_prompt(*cpu, *rc, po);
    auto g = engine::build_prompt(*gpu, *rg, po);
    ASSERT_TRUE(c.ok() && g.ok());
    ASSERT_EQ(g->mm_embeds.device(), Device::CUDA);
    pc.push_back(std::move(c).value());
    pg.push_back(std::move(g).value());
  }
  engine::CalibrationOptions co;
  co.text_files = {std::string(ZEST_SOURCE_DIR) + "/assets/calibration/00_en_zen_of_python.txt"};
  co.max_tokens = 256;
  co.progress = false;
  co.out_file = ::testing::TempDir() + "/sere_protect_cuda_sim.safetensors";
  auto cal = engine::calibrate_sere(*cpu, co);
  ASSERT_TRUE(cal.ok()) << cal.status().to_string();
  engine::ProtectOptions opt;
  opt.similarity_file = co.out_file;
  opt.per_layer = 2;
  opt.progress = false;
  auto rc = engine::rank_protected_experts(*cpu, pc, opt);
  auto rg = engine::rank_protected_experts(*gpu, pg, opt);
  ASSERT_TRUE(rc.ok()) << rc.status().to_string();
  ASSERT_TRUE(rg.ok()) << rg.status().to_string();
  ASSERT_EQ(rg->kl.size(), rc->kl.size());
  for (size_t l = 0; l < rc->kl.size(); ++l) {
    ASSERT_EQ(rg->kl[l].size(), rc->kl[l].size());
    double num = 0, den = 0;
    for (size_t e = 0; e < rc->kl[l].size(); ++e) {
      EXPECT_TRUE(std::isfinite(rg->kl[l][e]) && rg->kl[l][e] >= 0) << "layer " << l << " expert " << e;
      num += std::abs(rg->kl[l][e] - rc->kl[l][e]);
      den += std::abs(rc->kl[l][e]);
    }
    EXPECT_LE(num, 0.2 * den + 1e-6) << "layer " << l;  // bf16 forward vs the f32 reference
  }
}

}  // namespace zest
