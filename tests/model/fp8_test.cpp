// Block-wise FP8 checkpoints on the CPU backend.
//
// Golden: the FP8 fixture (tests/fixtures/fp8, made by tools/make_fp8_fixtures.py) against transformers in
// float32 on the weights dequantized by the tool's own numpy code (transformers 5.17's FP8 loader mis-sizes
// partial 128-blocks, see tests/fixtures/fp8/README.md): prompt ids equal, last-position logits
// max|zest - ref| <= 1e-3 * max|ref|, 16 greedy tokens equal up to the first step whose reference top-2 margin
// is below 1e-3. Also: the CPU model on FP8 weights equals, bit for bit, the same model on an f32 checkpoint of
// the dequantized weights; per-expert FP8 experts in a Qwen3-VL-MoE checkpoint equal the fused layout; bad
// FP8 checkpoints fail to load with errors naming the problem. (The CUDA backend against this reference:
// tests/cuda/cuda_decoder_test.cpp.)
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "golden_util.h"
#include "backend/cuda.h"
#include "io/safetensors.h"
#include "model/decoder.h"

namespace fs = std::filesystem;
using nlohmann::json;
using namespace zest;
using namespace zest::testing;

namespace {

const fs::path kFp8Root = fs::path(ZEST_FIXTURES_DIR) / "fp8";
const fs::path kFp8Dir = kFp8Root / "models" / "qwen3_moe_fp8_tiny";

std::shared_ptr<engine::ModelBundle> fp8_model() {
  static std::shared_ptr<engine::ModelBundle> m;
  if (!m) {
    auto r = engine::ModelBundle::load(kFp8Dir.string());
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) m = *r;
  }
  return m;
}

// Asserts that `s` failed with `code` and that its message mentions every one of `words`.
void expect_error(const Status& s, ErrorCode code, const std::vector<std::string>& words) {
  ASSERT_FALSE(s.is_ok()) << "expected an error mentioning " << (words.empty() ? "" : words[0]);
  EXPECT_EQ(s.code(), code) << s.to_string();
  for (const std::string& w : words)
    EXPECT_NE(s.message().find(w), std::string::npos) << "message lacks '" << w << "': " << s.message();
}

// A fresh directory, removed at the end of the test.
class Fp8Dir : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    dir_ = fs::temp_directory_path() / ("zest_fp8_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A model directory `name` with src's non-weight files (symlinks followed) and config.json edited by `edit`.
  fs::path model_dir(const std::string& name, const fs::path& src, const std::function<void(json&)>& edit) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    for (const auto& e : fs::directory_iterator(src)) {
      const std::string f = e.path().filename().string();
      if (e.path().extension() == ".safetensors" || f == "model.safetensors.index.json") continue;
      fs::copy_file(e.path(), d / f);
    }
    std::ifstream in(d / "config.json");
    json cfg = json::parse(in);
    in.close();
    edit(cfg);
    std::ofstream(d / "config.json") << cfg.dump(2);
    return d;
  }
  static void write_weights(const fs::path& d, const std::vector<std::pair<std::string, Tensor>>& t) {
    ASSERT_TRUE(io::write_safetensors((d / "model.safetensors").string(), t).is_ok());
  }
  // Every tensor of a loaded (and bound) checkpoint as it is stored, except those `drop` names.
  static std::vector<std::pair<std::string, Tensor>> stored(const io::SafeTensors& st,
                                                            const std::function<bool(const std::string&)>& drop) {
    std::vector<std::pair<std::string, Tensor>> out;
    for (const std::string& n : st.names()) {
      if (drop && drop(n)) continue;
      auto v = st.get(n);
      EXPECT_TRUE(v.ok()) << v.status().to_string();
      out.emplace_back(n, Tensor::wrap(const_cast<void*>(v->data), v->shape, v->dtype));
    }
    return out;
  }

  fs::path dir_;
};

// Max |a - b| over two logits tensors of the same size.
float max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  float d = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i)
    d = std::max(d, std::fabs(a.data<float>()[i] - b.data<float>()[i]));
  return d;
}

Tensor case_logits(std::shared_ptr<engine::ModelBundle> model, const json& request) {
  auto req = engine::parse_chat_request(request, *model);
  EXPECT_TRUE(req.ok()) << req.status().to_string();
  if (!req.ok()) return Tensor();
  auto prompt = engine::build_prompt(*model, *req, fixture_prompt_options());
  EXPECT_TRUE(prompt.ok()) << prompt.status().to_string();
  if (!prompt.ok()) return Tensor();
  return last_logits(*model, *prompt);
}

TEST(Fp8Golden, MatchesTransformersOnTheDequantizedWeights) {
  auto model = fp8_model();
  ASSERT_TRUE(model);
  const fs::path dir = kFp8Root / "ref" / "qwen3_moe_fp8_tiny";
  const auto cases = json_cases(dir);
  ASSERT_EQ(cases.size(), 3u);
  for (const auto& [case_name, ref] : cases) {
    SCOPED_TRACE(case_name);
    auto req = engine::parse_chat_request(ref["request"], *model);
    ASSERT_TRUE(req.ok()) << req.status().to_string();
    auto prompt = engine::build_prompt(*model, *req, fixture_prompt_options());
    ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
    expect_prompt(*prompt, ref);
    const std::string npy = (dir / ref["logits_file"].get<std::string>()).string();
    const Tensor logits = last_logits(*model, *prompt);
    expect_logits_close(logits, npy, 1e-3f);
    auto want = io::read_npy(npy);
    ASSERT_TRUE(want.ok());
    float max_ref = 0;
    for (int64_t i = 0; i < want->numel(); ++i) max_ref = std::max(max_ref, std::fabs(want->data<float>()[i]));
    RecordProperty("max_rel_logit_diff_" + case_name, std::to_string(max_abs_diff(logits, *want) / max_ref));
    std::printf("[ fp8 ] %s: max |zest - transformers| / max |ref| = %.3g\n", case_name.c_str(),
                max_abs_diff(logits, *want) / max_ref);
    expect_greedy(model, *prompt, ref["greedy_tokens"].get<std::vector<int32_t>>(),
                  ref["greedy_margins"].get<std::vector<double>>());
  }
}

TEST(Fp8Load, FixtureKeepsFp8AndBf16TensorsApart) {
  auto model = fp8_model();
  ASSERT_TRUE(model);
  ASSERT_TRUE(model->config.fp8.has_value());
  EXPECT_EQ(model->config.fp8->block_rows, 128);
  auto q = model->weights.get("model.layers.0.self_attn.q_proj.weight");
  ASSERT_TRUE(q.ok()) << q.status().to_string();
  EXPECT_EQ(q->dtype, DType::F8E4M3);
  EXPECT_EQ(q->shape, (std::vector<int64_t>{256, 160}));
  EXPECT_EQ(q->scale.rows, 2);
  EXPECT_EQ(q->scale.cols, 2);
  auto e = model->weights.get("model.layers.2.mlp.experts.7.down_proj.weight");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->dtype, DType::F8E4M3);
  // modules_to_not_convert: lm_head, the routers and layer 2's o_proj stay bf16.
  for (const char* n : {"lm_head.weight", "model.layers.0.mlp.gate.weight", "model.layers.2.self_attn.o_proj.weight",
                        "model.embed_tokens.weight"}) {
    auto v = model->weights.get(n);
    ASSERT_TRUE(v.ok()) << n;
    EXPECT_EQ(v->dtype, DType::BF16) << n;
    EXPECT_FALSE(model->weights.contains(std::string(n) + "_scale_inv")) << n;
  }
}

TEST_F(Fp8Dir, CpuModelEqualsAnF32CheckpointOfTheDequantizedWeights) {
  auto model = fp8_model();
  ASSERT_TRUE(model);
  const fs::path d = model_dir("f32", kFp8Dir, [](json& c) { c.erase("quantization_config"); });
  std::vector<std::pair<std::string, Tensor>> f32;
  for (const std::string& n : model->weights.names()) {
    if (n.size() > 10 && n.compare(n.size() - 10, 10, "_scale_inv") == 0) continue;
    auto v = model->weights.get(n);
    ASSERT_TRUE(v.ok());
    f32.emplace_back(n, v->to_f32());
  }
  write_weights(d, f32);
  auto ref = engine::ModelBundle::load(d.string());
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  for (const auto& [case_name, c] : json_cases(kFp8Root / "ref" / "qwen3_moe_fp8_tiny")) {
    const Tensor a = case_logits(model, c["request"]), b = case_logits(*ref, c["request"]);
    EXPECT_EQ(max_abs_diff(a, b), 0.0f) << case_name;
  }
}

TEST_F(Fp8Dir, BadCheckpointsFailWithClearErrors) {
  auto model = fp8_model();
  ASSERT_TRUE(model);
  auto all = [&](const fs::path& d) { write_weights(d, stored(model->weights, nullptr)); };
  auto load = [](const fs::path& d) { return engine::ModelBundle::load(d.string()).status(); };

  fs::path d = model_dir("awq", kFp8Dir, [](json& c) { c["quantization_config"]["quant_method"] = "awq"; });
  all(d);
  expect_error(load(d), ErrorCode::kUnsupported, {"config.json", "quant_method 'awq'", "fp8"});

  d = model_dir("block64", kFp8Dir, [](json& c) { c["quantization_config"]["weight_block_size"] = {64, 64}; });
  all(d);
  expect_error(load(d), ErrorCode::kUnsupported, {"config.json", "weight_block_size [64,64]"});

  d = model_dir("noquant", kFp8Dir, [](json& c) { c.erase("quantization_config"); });
  all(d);
  expect_error(load(d), ErrorCode::kUnsupported, {"weights in", "F8_E4M3", "quantization_config"});

  d = model_dir("noscale", kFp8Dir, [](json&) {});
  write_weights(d, stored(model->weights, [](const std::string& n) {
                  return n == "model.layers.0.mlp.experts.3.down_proj.weight_scale_inv";
                }));
  expect_error(load(d), ErrorCode::kCorrupt,
               {"weights in", "'model.layers.0.mlp.experts.3.down_proj.weight'", "down_proj.weight_scale_inv"});

  d = model_dir("scaleshape", kFp8Dir, [](json&) {});
  auto t = stored(model->weights, [](const std::string& n) { return n == "model.layers.1.mlp.up_proj.weight_scale_inv"; });
  Tensor small = Tensor::from_vector({1, 1}, {0.01f});
  t.emplace_back("model.layers.1.mlp.up_proj.weight_scale_inv", small);
  write_weights(d, t);
  expect_error(load(d), ErrorCode::kCorrupt, {"model.layers.1.mlp.up_proj.weight_scale_inv", "[1, 1]", "[2, 2]"});

  d = model_dir("skiplist", kFp8Dir, [](json& c) { c["quantization_config"]["modules_to_not_convert"].push_back("k_proj"); });
  all(d);
  expect_error(load(d), ErrorCode::kCorrupt, {"k_proj.weight'", "modules_to_not_convert"});
}

// ---- Qwen3-VL-MoE with per-expert FP8 experts --------------------------------------------------------------

// Nearest float8_e4m3fn code of x (|x| <= 448; ties resolved either way, any code will do for this test).
uint8_t nearest_e4m3(float x) {
  uint8_t best = 0;
  float bd = INFINITY;
  for (int c = 0; c < 256; ++c) {
    const float v = f8e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    if (std::fabs(v - x) < bd) bd = std::fabs(v - x), best = static_cast<uint8_t>(c);
  }
  return best;
}

// Block-quantizes an f32 [rows, cols] weight: (FP8 codes, f32 scale_inv [ceil(rows/128), ceil(cols/128)]).
std::pair<Tensor, Tensor> quantize(const Tensor& w) {
  const int64_t rows = w.dim(0), cols = w.dim(1), gr = (rows + 127) / 128, gc = (cols + 127) / 128;
  Tensor q = Tensor::empty({rows, cols}, DType::F8E4M3), s = Tensor::empty({gr, gc});
  for (int64_t br = 0; br < gr; ++br)
    for (int64_t bc = 0; bc < gc; ++bc) {
      float amax = 0;
      for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r)
        for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c)
          amax = std::max(amax, std::fabs(w.data<float>()[r * cols + c]));
      const float sc = amax > 0 ? amax / 448.0f : 1.0f;
      s.data<float>()[br * gc + bc] = sc;
      for (int64_t r = br * 128; r < std::min(rows, br * 128 + 128); ++r)
        for (int64_t c = bc * 128; c < std::min(cols, bc * 128 + 128); ++c)
          q.data<uint8_t>()[r * cols + c] = nearest_e4m3(std::clamp(w.data<float>()[r * cols + c] / sc, -448.f, 448.f));
    }
  return {q, s};
}

Tensor transpose(const Tensor& m) {
  Tensor t = Tensor::empty({m.dim(1), m.dim(0)});
  for (int64_t i = 0; i < m.dim(0); ++i)
    for (int64_t j = 0; j < m.dim(1); ++j) t.data<float>()[j * m.dim(0) + i] = m.data<float>()[i * m.dim(1) + j];
  return t;
}

TEST_F(Fp8Dir, VlMoePerExpertFp8EqualsTheFusedLayout) {
  auto vl = fixture_model("qwen3_vl_moe_tiny");
  ASSERT_TRUE(vl);
  const fs::path src = fs::path(ZEST_FIXTURES_DIR) / "models" / "qwen3_vl_moe_tiny";
  const io::TextConfig& tc = vl->config.text;
  const int64_t E = tc.num_experts, H = tc.hidden_size, I = tc.moe_intermediate_size;
  // FP8: attention projections and per-expert experts quantized; reference: the same values in f32, experts in
  // the fused input-major layout of the bf16 Qwen3-VL-MoE checkpoints.
  std::vector<std::pair<std::string, Tensor>> fp8, ref;
  auto add_linear = [&](const std::string& name, const Tensor& w) {
    auto [q, s] = quantize(w);
    fp8.emplace_back(name, q);
    fp8.emplace_back(name + "_scale_inv", s);
    return q;
  };
  std::map<std::string, Tensor> fused_gu, fused_dn;
  for (const std::string& n : vl->weights.names()) {
    auto v = vl->weights.get(n);
    ASSERT_TRUE(v.ok());
    const bool attn = n.find("self_attn.") != std::string::npos && n.find("_norm") == std::string::npos;
    const bool experts = n.find("mlp.experts.") != std::string::npos;
    if (!attn && !experts) {
      fp8.emplace_back(n, Tensor::wrap(const_cast<void*>(v->data), v->shape, v->dtype));
      ref.emplace_back(n, Tensor::wrap(const_cast<void*>(v->data), v->shape, v->dtype));
      continue;
    }
    if (attn) {
      add_linear(n, v->to_f32());
      continue;
    }
    const std::string prefix = n.substr(0, n.rfind('.') + 1);  // "...mlp.experts."
    const Tensor all = v->to_f32();
    const bool gate_up = n.size() >= 12 && n.compare(n.size() - 12, 12, "gate_up_proj") == 0;
    Tensor deq = Tensor::empty(all.shape());
    for (int64_t e = 0; e < E; ++e) {
      const int64_t in = gate_up ? H : I, out = gate_up ? 2 * I : H;
      Tensor m = Tensor::empty({in, out});
      std::memcpy(m.data<float>(), all.data<float>() + e * in * out, in * out * 4);
      const Tensor lin = transpose(m);  // nn.Linear [out, in]
      const std::string ep = prefix + std::to_string(e) + ".";
      std::vector<std::pair<std::string, Tensor>> parts;
      if (gate_up) {
        Tensor g = Tensor::empty({I, H}), u = Tensor::empty({I, H});
        std::memcpy(g.data<float>(), lin.data<float>(), I * H * 4);
        std::memcpy(u.data<float>(), lin.data<float>() + I * H, I * H * 4);
        parts = {{ep + "gate_proj.weight", g}, {ep + "up_proj.weight", u}};
      } else {
        parts = {{ep + "down_proj.weight", lin}};
      }
      Tensor lin_deq = Tensor::empty(lin.shape());
      int64_t row = 0;
      for (const auto& [pn, pw] : parts) {
        add_linear(pn, pw);
        io::TensorView view;  // the dequantized values, through the same code path as a loaded checkpoint
        const Tensor& q = fp8[fp8.size() - 2].second;
        const Tensor& s = fp8.back().second;
        view.dtype = DType::F8E4M3;
        view.shape = q.shape();
        view.data = q.raw();
        view.nbytes = q.nbytes();
        view.scale = {pn + "_scale_inv", DType::F32, s.raw(), s.dim(0), s.dim(1), 128, 128};
        const Tensor dq = view.to_f32();
        std::memcpy(lin_deq.data<float>() + row * lin.dim(1), dq.data<float>(), dq.nbytes());
        row += dq.dim(0);
      }
      const Tensor back = transpose(lin_deq);  // input-major again
      std::memcpy(deq.data<float>() + e * in * out, back.data<float>(), in * out * 4);
    }
    ref.emplace_back(n, deq);
  }
  // The attention projections' reference values are their dequantized FP8 weights.
  for (size_t i = 0; i < fp8.size(); ++i) {
    const std::string& n = fp8[i].first;
    if (n.find("self_attn.") == std::string::npos || fp8[i].second.dtype() != DType::F8E4M3) continue;
    io::TensorView view;
    view.dtype = DType::F8E4M3;
    view.shape = fp8[i].second.shape();
    view.data = fp8[i].second.raw();
    view.nbytes = fp8[i].second.nbytes();
    const Tensor& s = fp8[i + 1].second;
    view.scale = {n + "_scale_inv", DType::F32, s.raw(), s.dim(0), s.dim(1), 128, 128};
    ref.emplace_back(n, view.to_f32());
  }

  const fs::path fp8_dir = model_dir("vl_fp8", src, [](json& c) {
    c["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"activation_scheme", "dynamic"},
                                {"weight_block_size", {128, 128}},
                                {"modules_to_not_convert", {"lm_head", "mlp.gate", "model.visual"}}};
  });
  write_weights(fp8_dir, fp8);
  const fs::path ref_dir = model_dir("vl_ref", src, [](json&) {});
  write_weights(ref_dir, ref);
  auto a = engine::ModelBundle::load(fp8_dir.string());
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  auto b = engine::ModelBundle::load(ref_dir.string());
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  auto g = (*a)->weights.get("model.language_model.layers.1.mlp.experts.5.gate_proj.weight");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->dtype, DType::F8E4M3);
  const fs::path cases = fs::path(ZEST_FIXTURES_DIR) / "ref" / "qwen3_vl_moe_tiny";
  for (const char* name : {"vl_text_only", "vl_doc"}) {
    std::ifstream f(cases / (std::string(name) + ".json"));
    const json c = json::parse(f);
    const Tensor la = case_logits(*a, c["request"]), lb = case_logits(*b, c["request"]);
    ASSERT_GT(la.numel(), 0);
    EXPECT_EQ(max_abs_diff(la, lb), 0.0f) << name;
  }
}

}  // namespace
