// The CUDA text decoder against the CPU f32 decoder: the fixture checkpoints with their reference prompts (last-position
// logits, greedy tokens through the engine; the block-wise FP8 fixture too, dequantized to bf16 at load against the
// CPU's f32 dequantization), a random head_dim-128 checkpoint stored in
// F32 that takes the fast attention and MoE kernels, mixed prefill/decode/chunked batches against one sequence
// at a time, SERE on the device, and bad inputs.
//
// Tolerances (bf16 weights, activations and logits against f32):
//   last-position logits: max|cuda - cpu| <= 5e-2 * max|cpu| (measured on an H200: 0.5% to 1.2% on most prompts,
//   2.4% on qwen3_vl_tiny/vl_text_only and 3.1% on qwen3_vl_moe_tiny/vl_doc, whose router top-k gaps go down
//   to 5e-4, so bf16 rounding can change an expert choice);
//   greedy tokens: equal up to the first step whose CPU top-2 margin is below 2x the largest logit error
//   measured on that fixture's prompts (the bf16 noise);
//   batch layouts (mixed prefill + decode + chunked prefill vs one sequence at a time): 3e-2 (measured: equal
//   for head_dim 16, where every layout takes the same kernels; up to 1% for head_dim 128, where different batch
//   shapes take different kernels with their own bf16 rounding).
#if defined(ZEST_HAVE_CUDA)
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <thread>
#include <tuple>

#include "backend/cuda.h"
#include "cuda/cuda_test_util.h"
#include "cuda/random_checkpoint.h"
#include "engine/sere.h"
#include "kernels/backend.h"
#include "kernels/cuda/kernels.h"
#include "model/golden_util.h"
#include "model/parallel.h"
#include "model/qwen3.h"
#include "model/random_weights.h"

namespace zest::cuda::test {
namespace {

namespace fs = std::filesystem;

constexpr double kLogitTol = 5e-2;
constexpr double kBatchTol = 3e-2;
constexpr double kNoiseFactor = 2.0;

#define ZEST_REQUIRE_GPU_DECODER()                                                    \
  do {                                                                              \
    if (!::zest::kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available"; \
  } while (0)

// A fixture name, or "fp8/<name>" for the block-wise FP8 fixture (tests/fixtures/fp8): its folder of fixtures.
fs::path fixture_root(const std::string& name) {
  return name.rfind("fp8/", 0) == 0 ? fs::path(ZEST_FIXTURES_DIR) / "fp8" : fs::path(ZEST_FIXTURES_DIR);
}
std::string fixture_base(const std::string& name) { return name.rfind("fp8/", 0) == 0 ? name.substr(4) : name; }

std::shared_ptr<engine::ModelBundle> cuda_fixture(const std::string& name) {
  // Never destroyed: device memory must not be freed from static destructors after the CUDA runtime is gone.
  static auto* cache = new std::map<std::string, std::shared_ptr<engine::ModelBundle>>();
  auto& m = (*cache)[name];
  if (!m) {
    auto r = engine::ModelBundle::load((fixture_root(name) / "models" / fixture_base(name)).string(),
                                       model::Backend::kCuda);
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) m = *r;
  }
  return m;
}

std::shared_ptr<engine::ModelBundle> cpu_fixture(const std::string& name) {
  if (fixture_root(name) == fs::path(ZEST_FIXTURES_DIR)) return zest::testing::fixture_model(name);
  auto r = engine::ModelBundle::load((fixture_root(name) / "models" / fixture_base(name)).string());
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : nullptr;
}

struct Err {
  double max_err = 0, max_ref = 0;
};
Err compare_rows(const float* got, const float* ref, int64_t n) {
  Err e;
  for (int64_t i = 0; i < n; ++i) {
    e.max_err = std::max(e.max_err, std::isnan(got[i]) ? INFINITY : std::fabs(static_cast<double>(got[i]) - ref[i]));
    e.max_ref = std::max(e.max_ref, std::fabs(static_cast<double>(ref[i])));
  }
  return e;
}

// Greedy decoding of `steps` tokens on `dec` (prefill, then one decode step per token): tokens and the top-2
// margin of every step.
void greedy(const model::TextDecoder& dec, const engine::Prompt& p, int steps, std::vector<int32_t>& tokens,
            std::vector<double>& margins) {
  zest::testing::greedy_steps(dec, p, steps, tokens, margins);
}

class CudaDecoderFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaDecoderFixture, LogitsAndGreedyMatchCpu) {
  ZEST_REQUIRE_GPU_DECODER();
  const std::string name = GetParam();
  auto cpu = cpu_fixture(name);
  auto gpu = cuda_fixture(name);
  ASSERT_TRUE(cpu && gpu);
  ASSERT_EQ(gpu->decoder().backend(), model::Backend::kCuda);
  const fs::path dir = fixture_root(name) / "ref" / fixture_base(name);
  const auto cases = zest::testing::json_cases(dir);
  ASSERT_FALSE(cases.empty());
  std::vector<engine::Prompt> prompts;
  double noise = 0;
  for (const auto& [case_name, ref] : cases) {
    SCOPED_TRACE(name + "/" + case_name);
    auto req = engine::parse_chat_request(ref["request"], *cpu);
    ASSERT_TRUE(req.ok()) << req.status().to_string();
    auto prompt = engine::build_prompt(*cpu, *req, zest::testing::fixture_prompt_options());
    ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
    const Tensor lc = zest::testing::last_logits(cpu->decoder(), *prompt);
    const Tensor lg = zest::testing::last_logits(gpu->decoder(), *prompt);
    ASSERT_TRUE(lc.defined() && lg.defined());
    ASSERT_EQ(lc.numel(), lg.numel());
    const Err e = compare_rows(lg.data<float>(), lc.data<float>(), lc.numel());
    std::printf("[cuda-vs-cpu] %s/%s: %zu prompt tokens, last logits max|cuda-cpu| %.4g, max|cpu| %.4g, ratio %.3g\n",
                name.c_str(), case_name.c_str(), prompt->ids.size(), e.max_err, e.max_ref, e.max_err / e.max_ref);
    EXPECT_LE(e.max_err, kLogitTol * e.max_ref);
    noise = std::max(noise, e.max_err);
    prompts.push_back(std::move(*prompt));
  }
  const double threshold = kNoiseFactor * noise;
  for (size_t c = 0; c < prompts.size(); ++c) {
    SCOPED_TRACE(name + "/" + cases[c].first + " greedy");
    const auto ref_tokens = cases[c].second["greedy_tokens"].get<std::vector<int32_t>>();
    std::vector<int32_t> cpu_tokens;
    std::vector<double> margins;
    greedy(cpu->decoder(), prompts[c], static_cast<int>(ref_tokens.size()), cpu_tokens, margins);
    engine::Request r;
    r.prompt = prompts[c];
    r.sampling.temperature = 0;
    r.sampling.max_tokens = static_cast<int64_t>(ref_tokens.size());
    r.sampling.ignore_eos = true;
    auto out = engine::generate_one(gpu, r);
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    ASSERT_EQ(out->token_ids.size(), cpu_tokens.size());
    size_t compared = 0;
    for (size_t i = 0; i < cpu_tokens.size() && margins[i] >= threshold; ++i, ++compared)
      EXPECT_EQ(out->token_ids[i], cpu_tokens[i]) << "greedy step " << i << " (cpu margin " << margins[i] << ")";
    std::printf("[cuda-vs-cpu] %s/%s: greedy tokens compared %zu of %zu (noise threshold %.4g)\n", name.c_str(),
                cases[c].first.c_str(), compared, cpu_tokens.size(), threshold);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaDecoderFixture,
                         ::testing::Values("qwen3_moe_tiny", "qwen3_vl_moe_tiny", "qwen3_vl_tiny", "qwen3_tiny",
                                           "fp8/qwen3_moe_fp8_tiny"));

// The random checkpoint of random_checkpoint.h, loaded on the CPU (reference) and on the GPU.
struct RandomModel {
  io::ModelConfig config;
  io::SafeTensors st;
  model::Qwen3TextModel cpu;
  std::unique_ptr<model::TextDecoder> gpu;
};

std::unique_ptr<RandomModel> random_model(const fs::path& dir) {
  auto ck = write_random_moe_checkpoint(dir, 91);
  EXPECT_TRUE(ck.ok()) << ck.status().to_string();
  if (!ck.ok()) return nullptr;
  auto m = std::make_unique<RandomModel>();
  m->config = ck->config;
  auto st = io::SafeTensors::open_file(ck->file);
  EXPECT_TRUE(st.ok()) << st.status().to_string();
  if (!st.ok()) return nullptr;
  m->st = std::move(*st);
  auto cpu = model::Qwen3TextModel::load(m->st, m->config);
  EXPECT_TRUE(cpu.ok()) << cpu.status().to_string();
  auto gpu = model::make_cuda_decoder(m->st, m->config);
  EXPECT_TRUE(gpu.ok()) << gpu.status().to_string();
  if (!cpu.ok() || !gpu.ok()) return nullptr;
  m->cpu = std::move(*cpu);
  m->gpu = std::move(*gpu);
  return m;
}

fs::path temp_dir(const std::string& name) {
  return fs::temp_directory_path() / ("zest_cuda_decoder_" + name + "_" + std::to_string(::getpid()));
}

engine::Prompt text_ids_prompt(const std::vector<int32_t>& ids) {
  engine::Prompt p;
  p.ids = ids;
  for (int a = 0; a < 3; ++a)
    for (size_t i = 0; i < ids.size(); ++i) p.positions.push_back(static_cast<int32_t>(i));
  return p;
}

TEST(CudaDecoder, HeadDim128RandomCheckpointMatchesCpu) {
  ZEST_REQUIRE_GPU_DECODER();
  const fs::path dir = temp_dir("hd128");
  auto m = random_model(dir);
  ASSERT_TRUE(m);
  std::mt19937 rng(92);
  std::uniform_int_distribution<int32_t> tok(0, 511);
  for (int n : {5, 70, 150}) {
    SCOPED_TRACE(::testing::Message() << "prompt of " << n << " tokens");
    std::vector<int32_t> ids(n);
    for (auto& t : ids) t = tok(rng);
    const engine::Prompt p = text_ids_prompt(ids);
    const Tensor lc = zest::testing::last_logits(m->cpu, p);
    const Tensor lg = zest::testing::last_logits(*m->gpu, p);
    ASSERT_TRUE(lc.defined() && lg.defined());
    const Err e = compare_rows(lg.data<float>(), lc.data<float>(), lc.numel());
    std::printf("[cuda-vs-cpu] random head_dim 128, %d tokens: max|cuda-cpu| %.4g, max|cpu| %.4g, ratio %.3g\n", n,
                e.max_err, e.max_ref, e.max_err / e.max_ref);
    EXPECT_LE(e.max_err, kLogitTol * e.max_ref);
    std::vector<int32_t> tc, tg;
    std::vector<double> mc, mg;
    greedy(m->cpu, p, 8, tc, mc);
    greedy(*m->gpu, p, 8, tg, mg);
    for (size_t i = 0; i < tc.size() && mc[i] >= kNoiseFactor * e.max_err; ++i)
      EXPECT_EQ(tg[i], tc[i]) << "greedy step " << i;
  }
  fs::remove_all(dir);
}

// One forward of `chunks` (sequence index, start, length) over the sequences' tokens; logits rows in order.
Result<Tensor> run_chunks(const model::TextDecoder& dec, model::PagedKVCache& cache,
                          std::vector<std::vector<int32_t>>& tables, const std::vector<std::vector<int32_t>>& seqs,
                          const std::vector<std::array<int64_t, 3>>& chunks) {
  model::ForwardBatch b;
  for (const auto& [s, start, len] : chunks) {
    b.tokens.insert(b.tokens.end(), seqs[s].begin() + start, seqs[s].begin() + start + len);
    b.seqs.push_back({&tables[s], start, len, false, true});
  }
  const int64_t T = b.num_tokens();
  b.positions.resize(3 * T);
  int64_t t = 0;
  for (const auto& [s, start, len] : chunks)
    for (int64_t i = 0; i < len; ++i, ++t)
      for (int a = 0; a < 3; ++a) b.positions[a * T + t] = static_cast<int32_t>(start + i);
  return dec.forward(b, cache);
}

// Prefix prefills, then a step of a decode token and a chunk continuing a cached prefix (no chunk from 0: every
// token through the decode attention kernels as a row of its own), a step mixing decode tokens, a fresh prefill and
// a continuing chunk, then a decode-only step; every sequence's logits equal its one-sequence prefill.
void check_mixed_batches(const model::TextDecoder& dec, int32_t vocab, const std::string& label) {
  SCOPED_TRACE(label);
  std::mt19937 rng(93);
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  std::vector<std::vector<int32_t>> seqs;
  for (int len : {8, 18, 2, 34}) {
    std::vector<int32_t> s(len);
    for (auto& t : s) t = tok(rng);
    seqs.push_back(s);
  }
  auto solo = [&](int s, int64_t upto) {
    auto cache = dec.allocate_cache(8, 16);
    EXPECT_TRUE(cache.ok());
    std::vector<std::vector<int32_t>> tables(seqs.size());
    EXPECT_TRUE(cache->reserve(tables[s], upto).is_ok());
    auto l = run_chunks(dec, *cache, tables, seqs, {{s, 0, upto}});
    EXPECT_TRUE(l.ok()) << l.status().to_string();
    return l.ok() ? *l : Tensor();
  };
  auto cache = dec.allocate_cache(64, 16);
  ASSERT_TRUE(cache.ok());
  std::vector<std::vector<int32_t>> tables(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) ASSERT_TRUE(cache->reserve(tables[s], seqs[s].size()).is_ok());
  ASSERT_TRUE(run_chunks(dec, *cache, tables, seqs, {{0, 0, 4}, {1, 0, 10}, {3, 0, 20}}).ok());
  // Continued: decode of 0 (position 4) and chunk 10..15 of 1, nothing from 0.
  const std::vector<std::array<int64_t, 3>> continued = {{0, 4, 1}, {1, 10, 6}};
  // Mixed: decode of 0 (position 5) and 1 (position 16), fresh prefill of 2 (1 token), chunk 20..32 of 3.
  const std::vector<std::array<int64_t, 3>> mixed = {{0, 5, 1}, {1, 16, 1}, {2, 0, 1}, {3, 20, 13}};
  // Decode-only: the next token of every sequence.
  const std::vector<std::array<int64_t, 3>> decode = {{0, 6, 1}, {1, 17, 1}, {2, 1, 1}, {3, 33, 1}};
  for (const auto* step : {&continued, &mixed, &decode}) {
    auto l = run_chunks(dec, *cache, tables, seqs, *step);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    const int64_t V = l->dim(1);
    for (size_t i = 0; i < step->size(); ++i) {
      const auto& [s, start, len] = (*step)[i];
      const Tensor ref = solo(static_cast<int>(s), start + len);
      ASSERT_TRUE(ref.defined());
      const Err e = compare_rows(l->data<float>() + i * V, ref.data<float>(), V);
      std::printf("[batch-vs-solo] %s %s seq %lld: max diff %.4g, max |solo| %.4g\n", label.c_str(),
                  step == &continued ? "continued" : step == &mixed ? "mixed" : "decode", static_cast<long long>(s),
                  e.max_err, e.max_ref);
      EXPECT_LE(e.max_err, kBatchTol * e.max_ref) << "sequence " << s;
    }
  }
}

// One-token decode steps (the experts' down kernel adds the slots to x by output rows, every qkv GEMM normalises x
// itself, the first one included, and the lm_head the final norm) in the CUDA text decoder: a random checkpoint with
// hidden 256 (where the norm-folded GEMM applies) and a vocabulary of 1024 row tiles (where the lm_head's rows_ring
// folds it); after prefills, decode-only steps of one sequence and of four (the folded combine and separate norms),
// each eager, then captured and replayed: every repetition the same logits bit for bit, and sequence 0's logits of the
// one-sequence step within kBatchTol of its row in the four-sequence step (the batch-vs-solo bound).
TEST(CudaDecoder, DownRowsStepsMatchTheChain) {
  ZEST_REQUIRE_GPU_DECODER();
  const fs::path dir = temp_dir("down_rows");
  RandomShape shape;
  shape.hidden = 256;
  shape.vocab = 16 * 1024;
  auto ck = write_random_moe_checkpoint(dir, 95, shape);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const io::TextConfig& c = ck->config.text;
  const int qkv = static_cast<int>((c.num_heads + 2 * c.num_kv_heads) * c.head_dim);
  const bool applies = moe_down_rows_on(1, static_cast<int>(c.num_experts_per_tok), static_cast<int>(c.num_experts),
                                        256, static_cast<int>(c.moe_intermediate_size)) &&
                       gemm_kv_norm_ok(1, qkv, 256) && gemm_kv_norm_ok(1, shape.vocab, 256);
  ASSERT_TRUE(applies) << "the down kernel by rows should serve this checkpoint";
  auto st = io::SafeTensors::open_file(ck->file);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  auto dec = model::make_cuda_decoder(*st, ck->config);
  ASSERT_TRUE(dec.ok()) << dec.status().to_string();
  std::mt19937 rng(95);
  std::uniform_int_distribution<int32_t> tok(0, 511);
  std::vector<std::vector<int32_t>> seqs;
  for (int len : {7, 19, 3, 30}) {
    std::vector<int32_t> s(len + 4);
    for (auto& t : s) t = tok(rng);
    seqs.push_back(s);
  }
  auto cache = (*dec)->allocate_cache(64, 16);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  std::vector<std::vector<int32_t>> tables(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) ASSERT_TRUE(cache->reserve(tables[s], seqs[s].size()).is_ok());
  std::vector<std::array<int64_t, 3>> prefill;
  for (int64_t s = 0; s < static_cast<int64_t>(seqs.size()); ++s)
    prefill.push_back({s, 0, static_cast<int64_t>(seqs[s].size()) - 4});
  ASSERT_TRUE(run_chunks(**dec, *cache, tables, seqs, prefill).ok());
  std::vector<float> one_seq;  // the one-sequence step's logits
  for (int n : {1, 4}) {
    std::vector<std::array<int64_t, 3>> step;
    for (int64_t s = 0; s < n; ++s) step.push_back({s, static_cast<int64_t>(seqs[s].size()) - 4, 1});
    std::vector<float> first;
    for (int rep = 0; rep < 3; ++rep) {  // eager first use of the graph key, then captured and replayed
      auto got = run_chunks(**dec, *cache, tables, seqs, step);  // the step writes the same K/V slots every time
      ASSERT_TRUE(got.ok()) << got.status().to_string();
      if (rep == 0) {
        first.assign(got->data<float>(), got->data<float>() + got->numel());
        continue;
      }
      ASSERT_EQ(static_cast<size_t>(got->numel()), first.size());
      EXPECT_TRUE(std::equal(first.begin(), first.end(), got->data<float>())) << n << " sequences, step " << rep;
    }
    if (n == 1) {
      one_seq = first;
      continue;
    }
    ASSERT_EQ(first.size(), static_cast<size_t>(n) * one_seq.size());
    const Err e = compare_rows(one_seq.data(), first.data(), static_cast<int64_t>(one_seq.size()));
    std::printf("[down by rows] one sequence against its row of four: max diff %.4g, max |four| %.4g\n", e.max_err,
                e.max_ref);
    EXPECT_GT(e.max_ref, 0.0);
    EXPECT_LE(e.max_err, kBatchTol * e.max_ref);
  }
  fs::remove_all(dir);
}

TEST(CudaDecoder, MixedBatchEqualsOneByOne) {
  ZEST_REQUIRE_GPU_DECODER();
  for (const char* name : {"qwen3_moe_tiny", "qwen3_vl_tiny"}) {
    auto gpu = cuda_fixture(name);
    ASSERT_TRUE(gpu);
    check_mixed_batches(gpu->decoder(), 151000, name);
  }
  auto fp8 = cuda_fixture("fp8/qwen3_moe_fp8_tiny");  // projections and experts kept in FP8
  ASSERT_TRUE(fp8);
  check_mixed_batches(fp8->decoder(), 1000, "fp8");
  const fs::path dir = temp_dir("mixed");
  auto m = random_model(dir);
  ASSERT_TRUE(m);
  check_mixed_batches(*m->gpu, 512, "random head_dim 128");
  fs::remove_all(dir);
}

// SERE with S = 1 on a batch of one sequence leaves exactly one expert per MoE layer in every decode step, counted
// on the device and reported by SereRuntime::stats_json.
TEST(CudaDecoder, SereS1BatchOneUsesOneExpertPerLayer) {
  ZEST_REQUIRE_GPU_DECODER();
  auto gpu = cuda_fixture("qwen3_moe_tiny");
  ASSERT_TRUE(gpu);
  const io::TextConfig& tc = gpu->config.text;
  const int64_t E = tc.num_experts;
  std::mt19937 rng(94);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<std::pair<std::string, Tensor>> sims;
  for (int64_t l = 0; l < tc.num_layers; ++l) {
    std::vector<float> s(E * E);
    for (int64_t a = 0; a < E; ++a)
      for (int64_t b = 0; b <= a; ++b) s[a * E + b] = s[b * E + a] = a == b ? 1.f : u(rng);
    sims.emplace_back("layers." + std::to_string(l) + ".similarity", Tensor::from_vector({E, E}, s));
  }
  const fs::path dir = temp_dir("sere");
  fs::create_directories(dir);
  const std::string file = (dir / "sim.safetensors").string();
  ASSERT_TRUE(io::write_safetensors(file, sims, {{"config_hash", engine::sere_config_hash(gpu->config)}}).is_ok());
  engine::SereOptions so;
  so.params.primary = 1;
  so.similarity_file = file;
  auto rt = engine::SereRuntime::create(*gpu, so);
  ASSERT_TRUE(rt.ok()) << rt.status().to_string();
  engine::EngineOptions eo;
  engine::SereRuntime* raw = rt->get();
  eo.moe_hooks = [raw](bool decode_only) { return raw->hooks(decode_only); };
  engine::Request r;
  r.prompt = text_ids_prompt({9707, 11, 1879, 0, 3555, 374});
  r.sampling.temperature = 0;
  r.sampling.max_tokens = 6;
  r.sampling.ignore_eos = true;
  auto out = engine::generate_one(gpu, r, eo);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  const nlohmann::json j = (*rt)->stats_json();
  EXPECT_EQ(j["steps"].get<int64_t>(), 5);  // 6 tokens: the first from the prefill (not re-routed), 5 decode steps
  ASSERT_EQ(j["experts_per_layer_after"].size(), static_cast<size_t>(tc.num_layers));
  for (size_t l = 0; l < j["experts_per_layer_after"].size(); ++l) {
    EXPECT_EQ(j["experts_per_layer_after"][l].get<double>(), 1.0) << "layer " << l;
    EXPECT_EQ(j["experts_per_layer_before"][l].get<double>(), static_cast<double>(tc.num_experts_per_tok))
        << "layer " << l;
  }
  fs::remove_all(dir);
}

TEST(CudaDecoder, RejectsForeignCacheAndOtherBlockSizes) {
  ZEST_REQUIRE_GPU_DECODER();
  auto gpu = cuda_fixture("qwen3_moe_tiny");
  ASSERT_TRUE(gpu);
  const model::TextDecoder& dec = gpu->decoder();
  EXPECT_EQ(dec.allocate_cache(8, 32).status().code(), ErrorCode::kInvalidArgument);
  model::PagedKVCache cpu_cache(3, 8, 16, 2, 16);
  std::vector<int32_t> table;
  ASSERT_TRUE(cpu_cache.reserve(table, 3).is_ok());
  model::ForwardBatch b;
  b.tokens = {1, 2, 3};
  b.positions.assign(9, 0);
  b.seqs.push_back({&table, 0, 3, false, true});
  EXPECT_EQ(dec.forward(b, cpu_cache).status().code(), ErrorCode::kInvalidArgument);
  auto cache = dec.allocate_cache(8, 16);
  ASSERT_TRUE(cache.ok());
  b.tokens = {1, 2, 151936};
  EXPECT_EQ(dec.forward(b, *cache).status().code(), ErrorCode::kInvalidArgument);
}

// The FP8 fixture with its projections and experts kept in FP8 (every FP8 tensor of rows and columns multiples of 16:
// qkv, o_proj and the experts; the dense MLP of width 200 and layer 2's bf16 o_proj are bf16 on the device) against
// the CPU's f32 dequantization: a short prompt (prefill through the FP8 streaming kernels) and one past 64 tokens (the
// prefill's bf16 copies of the FP8 weights), then greedy decode steps where the margin allows.
TEST(CudaDecoder, Fp8FixtureShortAndLongPromptsMatchCpu) {
  ZEST_REQUIRE_GPU_DECODER();
  auto cpu = cpu_fixture("fp8/qwen3_moe_fp8_tiny");
  auto gpu = cuda_fixture("fp8/qwen3_moe_fp8_tiny");
  ASSERT_TRUE(cpu && gpu);
  std::mt19937 rng(94);
  std::uniform_int_distribution<int32_t> tok(0, 999);
  for (int n : {6, 100}) {
    SCOPED_TRACE(::testing::Message() << "prompt of " << n << " tokens");
    std::vector<int32_t> ids(n);
    for (auto& t : ids) t = tok(rng);
    const engine::Prompt p = text_ids_prompt(ids);
    const Tensor lc = zest::testing::last_logits(cpu->decoder(), p);
    const Tensor lg = zest::testing::last_logits(gpu->decoder(), p);
    ASSERT_TRUE(lc.defined() && lg.defined());
    const Err e = compare_rows(lg.data<float>(), lc.data<float>(), lc.numel());
    std::printf("[cuda-vs-cpu] fp8 fixture, %d tokens: max|cuda-cpu| %.4g, max|cpu| %.4g, ratio %.3g\n", n, e.max_err,
                e.max_ref, e.max_err / e.max_ref);
    EXPECT_LE(e.max_err, kLogitTol * e.max_ref);
    std::vector<int32_t> tc, tg;
    std::vector<double> mc, mg;
    greedy(cpu->decoder(), p, 8, tc, mc);
    greedy(gpu->decoder(), p, 8, tg, mg);
    for (size_t i = 0; i < tc.size() && mc[i] >= kNoiseFactor * e.max_err; ++i)
      EXPECT_EQ(tg[i], tc[i]) << "greedy step " << i;
  }
}

// The FP8 paths of DeviceDecodeOptions (on by default) against their off forms on random block-wise FP8 weights in 128 x 128 blocks at widths they take
// (hidden 256, 16 experts of width 256 top-4, head_dim 128, two MoE layers):
// - fp8_tensor_core_prefill: a 150-token prefill (FP8 tensor-core projections and experts, activations quantized per
//   token per 128 columns) against the CPU's f32 reference within kFp8ActTol: e4m3 activations carry about 6% error
//   each (3 mantissa bits), far above bf16 noise; the dequantizing path (option off) within kLogitTol as before.
// - fp8_stream_experts: prefills of four short sequences (up to 64 tokens: decode kernels) then a decode step of all
//   four, the streaming experts against the per-tile FP8 kernel (option off; same FP8 weights, bf16 activations)
//   within kBatchTol.
constexpr double kFp8ActTol = 1e-1;

TEST(CudaDecoder, Fp8StreamExpertsAndTensorCorePrefill) {
  ZEST_REQUIRE_GPU_DECODER();
  io::TextConfig c;
  c.hidden_size = 256, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 128, c.num_layers = 2, c.vocab_size = 512;
  c.num_experts = 16, c.num_experts_per_tok = 4, c.moe_intermediate_size = 256;
  model::RandomTensors store(97);
  model::DecoderWeights w = model::random_decoder_weights(c, store);
  model::quantize_fp8_blockwise(w, store);
  auto cpu = model::Qwen3TextModel::from_weights(w);
  ASSERT_TRUE(cpu.ok()) << cpu.status().to_string();
  model::DeviceDecodeOptions off_opts, tc, stream;
  off_opts.fp8_tensor_core_prefill = off_opts.fp8_stream_experts = false;
  tc = stream = off_opts;
  tc.fp8_tensor_core_prefill = true;
  stream.fp8_stream_experts = true;
  auto off = model::create_cuda_decoder(w, off_opts);
  auto on_tc = model::create_cuda_decoder(w, tc);
  auto on_stream = model::create_cuda_decoder(w, stream);
  ASSERT_TRUE(off.ok() && on_tc.ok() && on_stream.ok()) << off.status().to_string() << on_tc.status().to_string();
  std::mt19937 rng(98);
  std::uniform_int_distribution<int32_t> tok(0, 511);
  std::vector<int32_t> ids(150);
  for (auto& t : ids) t = tok(rng);
  const engine::Prompt p = text_ids_prompt(ids);
  const Tensor lc = zest::testing::last_logits(*cpu, p);
  for (const auto& [dec, tol, label] : {std::tuple{off->get(), kLogitTol, "dequantized copies"},
                                        std::tuple{on_tc->get(), kFp8ActTol, "FP8 tensor cores"}}) {
    const Tensor lg = zest::testing::last_logits(*dec, p);
    ASSERT_TRUE(lc.defined() && lg.defined());
    const Err e = compare_rows(lg.data<float>(), lc.data<float>(), lc.numel());
    std::printf("[cuda-vs-cpu] fp8 random, 150-token prefill through %s: max|cuda-cpu| %.4g, max|cpu| %.4g, ratio "
                "%.3g\n", label, e.max_err, e.max_ref, e.max_err / e.max_ref);
    EXPECT_LE(e.max_err, tol * e.max_ref) << label;
  }
  // four sequences, prefilled in one step, then one decode token each
  std::vector<std::vector<int32_t>> seqs;
  for (int len : {9, 17, 3, 30}) {
    std::vector<int32_t> sq(len + 1);
    for (auto& t : sq) t = tok(rng);
    seqs.push_back(sq);
  }
  auto two_steps = [&](const model::TextDecoder& dec) {
    auto cache = dec.allocate_cache(16, 16);
    EXPECT_TRUE(cache.ok());
    std::vector<std::vector<int32_t>> tables(seqs.size());
    for (size_t i = 0; i < seqs.size(); ++i) EXPECT_TRUE(cache->reserve(tables[i], seqs[i].size()).is_ok());
    std::vector<std::array<int64_t, 3>> pre, dec1;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t n = static_cast<int64_t>(seqs[i].size()) - 1;
      pre.push_back({static_cast<int64_t>(i), 0, n});
      dec1.push_back({static_cast<int64_t>(i), n, 1});
    }
    EXPECT_TRUE(run_chunks(dec, *cache, tables, seqs, pre).ok());
    auto l = run_chunks(dec, *cache, tables, seqs, dec1);
    EXPECT_TRUE(l.ok()) << l.status().to_string();
    return l.ok() ? *l : Tensor();
  };
  const Tensor a = two_steps(**off), b = two_steps(**on_stream);
  ASSERT_TRUE(a.defined() && b.defined());
  const Err e = compare_rows(b.data<float>(), a.data<float>(), a.numel());
  std::printf("[stream-vs-tiles] fp8 random, decode of 4: max diff %.4g, max |tiles| %.4g\n", e.max_err, e.max_ref);
  EXPECT_LE(e.max_err, kBatchTol * e.max_ref);
}

// A decoder split over two ranks (model/parallel.h): each rank a CUDA decoder on its shard (shard_decoder_weights),
// made on devices[r], joined by make_group(), every rank on a thread of its own with its own KV cache. Tensor-parallel
// attention (two query heads and one key/value head a rank) with the experts split by columns or placed whole
// (expert parallelism), bf16 and block-wise FP8 weights, a dense layer split by columns: rank 0's logits over a
// prefill of two sequences (prefill kernels) and then a decode step of both (decode kernels) against the whole
// decoder's within kLogitTol (the ranks' partial sums are rounded to bf16 before the sum), every rank the same bits.
// A shard holding some of the experts refuses to run alone.
void expect_split_gives_whole(const std::vector<int>& devices,
                              const std::function<std::unique_ptr<model::CommunicatorGroup>()>& make_group) {
  struct Case {
    const char* name;
    bool fp8, expert_parallel;
  };
  const int world = static_cast<int>(devices.size());
  for (const Case& k : {Case{"bf16, experts by columns", false, false}, Case{"bf16, experts placed whole", false, true},
                        Case{"fp8, experts by columns", true, false}, Case{"fp8, experts placed whole", true, true}}) {
    SCOPED_TRACE(k.name);
    io::TextConfig c;
    c.hidden_size = 256, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 128, c.num_layers = 2, c.vocab_size = 512;
    c.num_experts = 16, c.num_experts_per_tok = 4, c.moe_intermediate_size = 256, c.intermediate_size = 512;
    c.mlp_only_layers = {1};  // layer 1 dense
    c.norm_topk_prob = true;
    model::RandomTensors store(131);
    model::DecoderWeights w = model::random_decoder_weights(c, store);
    if (k.fp8) model::quantize_fp8_blockwise(w, store);
    ASSERT_EQ(cudaSetDevice(devices[0]), cudaSuccess);
    auto whole = model::create_cuda_decoder(w);
    ASSERT_TRUE(whole.ok()) << whole.status().to_string();
    auto plan = model::plan_parallel(c, world, k.expert_parallel);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    std::vector<model::ShardWeights> shards;
    std::vector<std::unique_ptr<model::TextDecoder>> ranks;
    for (int r = 0; r < world; ++r) {
      auto sh = model::shard_decoder_weights(w, *plan, r);
      ASSERT_TRUE(sh.ok()) << sh.status().to_string();
      shards.push_back(std::move(*sh));
      ASSERT_EQ(cudaSetDevice(devices[r]), cudaSuccess);
      auto d = model::create_cuda_decoder(shards.back().weights);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      ranks.push_back(std::move(*d));
    }
    ASSERT_EQ(cudaSetDevice(devices[0]), cudaSuccess);
    std::mt19937 rng(132);
    std::uniform_int_distribution<int32_t> tok(0, 511);
    std::vector<std::vector<int32_t>> seqs;
    for (int len : {90, 37}) {
      std::vector<int32_t> sq(len + 1);
      for (auto& t : sq) t = tok(rng);
      seqs.push_back(sq);
    }
    // prefill logits of both sequences, then their decode-step logits
    auto two_steps = [&](const model::TextDecoder& dec) {
      std::vector<Tensor> out;
      auto cache = dec.allocate_cache(32, 16);
      EXPECT_TRUE(cache.ok());
      if (!cache.ok()) return out;
      std::vector<std::vector<int32_t>> tables(seqs.size());
      std::vector<std::array<int64_t, 3>> pre, dec1;
      for (size_t i = 0; i < seqs.size(); ++i) {
        EXPECT_TRUE(cache->reserve(tables[i], seqs[i].size()).is_ok());
        const int64_t n = static_cast<int64_t>(seqs[i].size()) - 1;
        pre.push_back({static_cast<int64_t>(i), 0, n});
        dec1.push_back({static_cast<int64_t>(i), n, 1});
      }
      for (const auto* chunks : {&pre, &dec1}) {
        auto l = run_chunks(dec, *cache, tables, seqs, *chunks);
        EXPECT_TRUE(l.ok()) << l.status().to_string();
        if (!l.ok()) return std::vector<Tensor>();
        out.push_back(std::move(*l));
      }
      return out;
    };
    if (k.expert_parallel) {  // a shard of some experts refuses to run alone
      auto cache = ranks[0]->allocate_cache(32, 16);
      ASSERT_TRUE(cache.ok());
      std::vector<std::vector<int32_t>> tables(seqs.size());
      ASSERT_TRUE(cache->reserve(tables[0], seqs[0].size()).is_ok());
      auto l = run_chunks(*ranks[0], *cache, tables, seqs, {{0, 0, 4}});
      ASSERT_FALSE(l.ok()) << "an expert-parallel shard ran without its group";
      EXPECT_NE(l.status().to_string().find("rank of a parallel decoder"), std::string::npos) << l.status().to_string();
    }
    const std::vector<Tensor> ref = two_steps(**whole);
    ASSERT_EQ(ref.size(), 2u);
    std::unique_ptr<model::CommunicatorGroup> group = make_group();
    ASSERT_TRUE(group);
    for (int r = 0; r < world; ++r) ASSERT_TRUE(ranks[r]->set_communicator(&group->member(r)).is_ok());
    std::vector<std::vector<Tensor>> got(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { got[r] = two_steps(*ranks[r]); });
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r) ASSERT_EQ(got[r].size(), 2u) << "rank " << r;
    for (size_t st = 0; st < 2; ++st) {
      const Err e = compare_rows(got[0][st].data<float>(), ref[st].data<float>(), ref[st].numel());
      std::printf("[split-vs-whole] %s, %s: max diff %.4g, max |whole| %.4g\n", k.name,
                  st == 0 ? "prefill of 2" : "decode of 2", e.max_err, e.max_ref);
      EXPECT_LE(e.max_err, kLogitTol * e.max_ref) << (st == 0 ? "prefill" : "decode");
      for (int r = 1; r < world; ++r)
        EXPECT_EQ(std::memcmp(got[r][st].data<float>(), got[0][st].data<float>(), got[0][st].numel() * 4), 0)
            << "rank " << r << " differs from rank 0";
    }
    ranks.clear();  // the decoders leave before their group
  }
}

// Two ranks on one GPU joined by host-staged all-reduces (LocalGroup): the split math on one card.
TEST(CudaDecoder, SplitOverRanksOnOneGpuGivesTheWholeModelsLogits) {
  ZEST_REQUIRE_GPU_DECODER();
  expect_split_gives_whole({0, 0}, [] { return std::make_unique<model::LocalGroup>(2); });
}

// Two ranks on two GPUs joined by NCCL all-reduces in the decoders' streams (decode steps replay CUDA graphs with the
// all-reduces inside). Skipped with fewer than two GPUs.
TEST(CudaDecoder, NcclRanksOnTwoGpusGiveTheWholeModelsLogits) {
  ZEST_REQUIRE_GPU_DECODER();
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 2) GTEST_SKIP() << "needs two GPUs";
  expect_split_gives_whole({0, 1}, [] {
    auto g = model::create_nccl_group({0, 1});
    EXPECT_TRUE(g.ok()) << g.status().to_string();
    return g.ok() ? std::move(*g) : nullptr;
  });
  cudaSetDevice(0);
}

// An FP8 weight reaches the CUDA decoder only with its block scale bound: one without (or with a scale grid of another
// shape) is refused naming the tensor, never read as unscaled bytes.
TEST(CudaDecoder, RefusesFp8WeightsWithoutTheirBlockScale) {
  ZEST_REQUIRE_GPU_DECODER();
  auto cpu = cpu_fixture("fp8/qwen3_moe_fp8_tiny");
  ASSERT_TRUE(cpu);
  auto w = model::collect_decoder_weights(cpu->weights, cpu->config);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  ASSERT_EQ(w->layers[0].q.dtype, DType::F8E4M3);
  model::DecoderWeights bad = *w;
  bad.layers[0].q.scale.data = nullptr;
  auto r = model::create_cuda_decoder(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(w->layers[0].q.name), std::string::npos) << r.status().to_string();
  bad = *w;
  bad.layers[0].q.scale.cols += 1;
  EXPECT_EQ(model::create_cuda_decoder(bad).status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
