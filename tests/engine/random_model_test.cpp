// Random-weight models: named shapes, the host synthesis, the checkpoint the CPU backend loads, and
// ModelBundle::random on the CPU backend with a tiny config.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <algorithm>
#include <functional>
#include <random>
#include <set>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "engine/model_bundle.h"
#include "io/safetensors.h"
#include "model/random_weights.h"
#include "vision/encoder.h"

namespace zest {
namespace {

const std::string kTinyVl = std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_vl_moe_tiny";
const std::string kTokenizer = std::string(ZEST_SOURCE_DIR) + "/assets/tokenizer";

std::string temp_file(const std::string& stem) {
  return (std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(::getpid()) + ".safetensors")).string();
}

TEST(RandomModel, NamedConfigsAreConsistent) {
  for (const std::string& name : model::named_model_configs()) {
    SCOPED_TRACE(name);
    auto c = model::named_model_config(name);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    const io::TextConfig& t = c->text;
    EXPECT_GT(t.num_layers, 0);
    EXPECT_EQ(t.num_heads % t.num_kv_heads, 0);
    EXPECT_EQ(t.vocab_size, 151936);
    if (t.num_experts > 0) {
      EXPECT_TRUE(c->is_moe());
      EXPECT_LE(t.num_experts_per_tok, t.num_experts);
      EXPECT_GT(t.moe_intermediate_size, 0);
    } else {
      EXPECT_GT(t.intermediate_size, 0);
    }
    EXPECT_EQ(io::has_vision(c->arch), c->vision.has_value());
    if (c->vision) {
      EXPECT_EQ(c->vision->out_hidden_size, t.hidden_size);  // the vision rows replace text embeddings
      for (int64_t d : c->vision->deepstack_visual_indexes) EXPECT_LT(d, c->vision->depth);
      ASSERT_EQ(t.mrope_section.size(), 3u);
      EXPECT_EQ(t.mrope_section[0] + t.mrope_section[1] + t.mrope_section[2], t.head_dim / 2);
    }
    auto two = model::named_model_config(name, 2);
    ASSERT_TRUE(two.ok());
    EXPECT_EQ(two->text.num_layers, 2);
  }
  // Parameter counts of the published models (Qwen3-30B-A3B: 30.5B in total, 3.3B active).
  auto m30 = model::named_model_config("qwen3-30b-a3b");
  ASSERT_TRUE(m30.ok());
  EXPECT_NEAR(static_cast<double>(model::text_parameters(m30->text)), 30.5e9, 0.2e9);
  auto m235 = model::named_model_config("qwen3-235b-a22b");  // Qwen3-235B-A22B: 235B in total
  ASSERT_TRUE(m235.ok());
  EXPECT_EQ(m235->arch, io::Arch::kQwen3Moe);
  EXPECT_NEAR(static_cast<double>(model::text_parameters(m235->text)), 235.1e9, 0.5e9);
  auto m8 = model::named_model_config("qwen3-8b");  // Qwen3-8B: 8.2B
  ASSERT_TRUE(m8.ok());
  EXPECT_EQ(m8->arch, io::Arch::kQwen3);
  EXPECT_NEAR(static_cast<double>(model::text_parameters(m8->text)), 8.2e9, 0.1e9);
}

TEST(RandomModel, UnknownNameAndBadLayerCountAreErrors) {
  auto bad = model::named_model_config("qwen3-7b");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("qwen3-7b"), std::string::npos);
  EXPECT_NE(bad.status().message().find("qwen3-vl-30b-a3b"), std::string::npos);  // lists the known names
  EXPECT_FALSE(model::named_model_config("qwen3-30b-a3b", -1).ok());
}

TEST(RandomModel, TensorsAreDeterministicPerNameWithTheRequestedStatistics) {
  model::RandomTensors a(7), b(7), c(8);
  const int64_t n = 1 << 20;
  const io::TensorView x = a.normal("w", {n}, 0.5f);
  const io::TensorView u = a.uniform("n", {n}, 0.9f, 1.1f);
  b.uniform("other", {16}, 0.f, 1.f);  // creation order must not matter
  const io::TensorView x2 = b.normal("w", {n}, 0.5f);
  const io::TensorView y = a.normal("w2", {n}, 0.5f);
  const io::TensorView z = c.normal("w", {n}, 0.5f);
  EXPECT_EQ(std::memcmp(x.data, x2.data, x.nbytes), 0);
  EXPECT_NE(std::memcmp(x.data, y.data, x.nbytes), 0);
  EXPECT_NE(std::memcmp(x.data, z.data, x.nbytes), 0);
  EXPECT_EQ(a.bytes(), static_cast<size_t>(3 * n * 2));

  const Tensor xf = x.to_f32(), uf = u.to_f32();
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = xf.data<float>()[i];
    s += v;
    s2 += v * v;
    ASSERT_LT(std::abs(v), 3.47 * 0.5 + 0.01);
    const float w = uf.data<float>()[i];
    // bf16 keeps 8 significant bits: rounding moves a value by at most half a step (2^-8 near 1.0).
    ASSERT_GE(w, 0.9f - 0.004f);
    ASSERT_LE(w, 1.1f + 0.004f);
  }
  const double mean = s / n, sd = std::sqrt(s2 / n - mean * mean);
  // Standard error of the mean 0.5 / 1024; tolerances are several of them.
  EXPECT_NEAR(mean, 0.0, 0.005);
  EXPECT_NEAR(sd, 0.5, 0.01);
}

TEST(RandomModel, SharedLayersViewTheFirstLayersTensors) {
  auto cfg = model::named_model_config("qwen3-30b-a3b", 3);
  ASSERT_TRUE(cfg.ok());
  io::TextConfig t = cfg->text;
  t.vocab_size = 64;  // keep the host memory of the test small
  t.num_experts = 4;
  t.num_experts_per_tok = 2;
  model::RandomTensors shared(1), all(1);
  const model::DecoderWeights ws = model::random_decoder_weights(t, shared, 1);
  const model::DecoderWeights wa = model::random_decoder_weights(t, all, 0);
  ASSERT_EQ(ws.layers.size(), 3u);
  ASSERT_EQ(wa.layers.size(), 3u);
  EXPECT_EQ(ws.layers[2].q.data, ws.layers[0].q.data);
  EXPECT_EQ(ws.layers[1].gate[3].data, ws.layers[0].gate[3].data);
  EXPECT_NE(wa.layers[2].q.data, wa.layers[0].q.data);
  EXPECT_NE(std::memcmp(wa.layers[2].q.data, wa.layers[0].q.data, wa.layers[0].q.nbytes), 0);
  EXPECT_LT(shared.bytes(), all.bytes());
  // Layer 0 is the same either way; the embeddings are untied.
  EXPECT_EQ(std::memcmp(ws.layers[0].down[1].data, wa.layers[0].down[1].data, wa.layers[0].down[1].nbytes), 0);
  EXPECT_NE(ws.lm_head.data, ws.embed.data);
  EXPECT_EQ(ws.layers[0].gate.size(), 4u);
  // One expert shared by all four.
  model::RandomTensors one(1);
  const model::DecoderWeights w1 = model::random_decoder_weights(t, one, 1, 1);
  ASSERT_EQ(w1.layers[2].down.size(), 4u);
  EXPECT_EQ(w1.layers[2].down[3].data, w1.layers[0].down[0].data);
  EXPECT_EQ(w1.layers[1].up[2].data, w1.layers[1].up[0].data);
  EXPECT_EQ(std::memcmp(w1.layers[0].gate[0].data, wa.layers[0].gate[0].data, wa.layers[0].gate[0].nbytes), 0);
  EXPECT_LT(one.bytes(), shared.bytes());
  EXPECT_EQ(ws.layers[0].down[0].shape, (std::vector<int64_t>{t.hidden_size, t.moe_intermediate_size}));
}

TEST(RandomModel, CheckpointLoadsThroughTheCheckpointLoaders) {
  auto cfg = io::load_model_config(kTinyVl);
  ASSERT_TRUE(cfg.ok()) << cfg.status().to_string();
  const std::string file = temp_file("zest-random-test");
  ASSERT_TRUE(model::write_random_checkpoint(*cfg, file, 3).is_ok());
  auto st = io::SafeTensors::open_file(file);
  std::filesystem::remove(file);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  // The text loader resolves and shape-checks every tensor by its checkpoint name.
  auto w = model::collect_decoder_weights(*st, *cfg);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  // The written values are the host synthesis of the same seed.
  model::RandomTensors store(3);
  const model::DecoderWeights ref = model::random_decoder_weights(cfg->text, store);
  EXPECT_EQ(std::memcmp(w->layers[1].o.data, ref.layers[1].o.data, ref.layers[1].o.nbytes), 0);
  EXPECT_EQ(std::memcmp(w->layers[2].router.data, ref.layers[2].router.data, ref.layers[2].router.nbytes), 0);
  // The vision loader finds every tower tensor with its shape.
  auto enc = vision::make_cpu_vision_encoder(*st, *cfg->vision);
  ASSERT_TRUE(enc.ok()) << enc.status().to_string();
  const auto shapes = model::vision_tensor_shapes(*cfg->vision);
  EXPECT_EQ(st->names().size(), shapes.size() + 3 + 8 * 3 + 3 * (1 + 3 * 16));  // vision + text tensors
  const Tensor pos = model::random_vision_tensor("pos_embed.weight", {64, 32}, 3);
  const Tensor pos2 = model::random_vision_tensor("pos_embed.weight", {64, 32}, 3);
  EXPECT_EQ(std::memcmp(pos.data<float>(), pos2.data<float>(), pos.nbytes()), 0);
  const Tensor qkv = model::random_vision_tensor("blocks.0.attn.qkv.weight", {96, 32}, 3);
  const float bound = std::sqrt(3.f / 32.f);
  float lo = 0, hi = 0;
  for (int64_t i = 0; i < qkv.numel(); ++i) {
    lo = std::min(lo, qkv.data<float>()[i]);
    hi = std::max(hi, qkv.data<float>()[i]);
  }
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_LT(lo, -0.5f * bound);  // 3072 draws spread over the range
  EXPECT_GT(hi, 0.5f * bound);
}

TEST(RandomModel, SereSimilarityIsSymmetricWithUnitDiagonal) {
  auto cfg = model::named_model_config("qwen3-vl-30b-a3b", 2);
  ASSERT_TRUE(cfg.ok());
  const auto sim = model::random_sere_similarity(cfg->text, 5);
  ASSERT_EQ(sim.size(), 2u);
  const int64_t E = cfg->text.num_experts;
  for (const auto& s : sim) {
    ASSERT_EQ(static_cast<int64_t>(s.size()), E * E);
    for (int64_t u = 0; u < E; ++u) {
      ASSERT_EQ(s[u * E + u], 1.f);
      for (int64_t v = 0; v < E; ++v) {
        ASSERT_EQ(s[u * E + v], s[v * E + u]);
        if (u != v) {
          ASSERT_GE(s[u * E + v], 0.f);
          ASSERT_LT(s[u * E + v], 1.f);
        }
      }
    }
  }
  EXPECT_NE(sim[0], sim[1]);
  auto dense = model::named_model_config("qwen3-vl-32b", 2);
  ASSERT_TRUE(dense.ok());
  for (const auto& s : model::random_sere_similarity(dense->text, 5)) EXPECT_TRUE(s.empty());
}

// Logits of one short prompt through the bundle's decoder.
Tensor logits_of(const engine::ModelBundle& m) {
  const model::TextDecoder& dec = m.decoder();
  auto cache = dec.allocate_cache(4, 16);
  EXPECT_TRUE(cache.ok());
  std::vector<int32_t> table;
  model::ForwardBatch b;
  b.tokens = m.tokenizer.encode("hello random world");
  const int64_t T = b.num_tokens();
  for (int r = 0; r < 3; ++r)
    for (int64_t i = 0; i < T; ++i) b.positions.push_back(static_cast<int32_t>(i));
  EXPECT_TRUE(cache->reserve(table, T).is_ok());
  b.seqs.push_back({&table, 0, T, false, true});
  auto out = dec.forward(b, *cache);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? *out : Tensor();
}

TEST(RandomModel, BundleOnTheCpuFromAConfigJson) {
  engine::RandomModelOptions o;
  o.config = kTinyVl + "/config.json";
  o.layers = 2;
  o.tokenizer = kTokenizer;
  o.seed = 11;
  auto m = engine::ModelBundle::random(o, model::Backend::kCpu);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ((*m)->config.text.num_layers, 2);
  EXPECT_EQ((*m)->decoder().config().num_layers, 2);
  EXPECT_EQ((*m)->dir, "random-qwen3_vl_moe_tiny");
  ASSERT_TRUE((*m)->random_seed.has_value());
  EXPECT_EQ(*(*m)->random_seed, 11u);
  ASSERT_NE((*m)->vision, nullptr);
  EXPECT_EQ((*m)->chat_template, text::TemplateKind::kQwen3VL);
  // The bundled tokenizer is the fixture's (the Qwen tokenizer).
  auto fixture_tok = text::Tokenizer::load(kTinyVl);
  ASSERT_TRUE(fixture_tok.ok());
  EXPECT_EQ((*m)->tokenizer.encode("<|im_start|>user hello"), fixture_tok->encode("<|im_start|>user hello"));
  EXPECT_FALSE((*m)->eos_ids().empty());

  const Tensor l1 = logits_of(**m);
  ASSERT_EQ(l1.numel(), (*m)->config.text.vocab_size);
  for (int64_t i = 0; i < l1.numel(); ++i) ASSERT_TRUE(std::isfinite(l1.data<float>()[i]));
  // The same seed gives the same model; another seed another one.
  auto again = engine::ModelBundle::random(o, model::Backend::kCpu);
  ASSERT_TRUE(again.ok());
  const Tensor l2 = logits_of(**again);
  EXPECT_EQ(std::memcmp(l1.data<float>(), l2.data<float>(), l1.nbytes()), 0);
  o.seed = 12;
  auto other = engine::ModelBundle::random(o, model::Backend::kCpu);
  ASSERT_TRUE(other.ok());
  const Tensor l3 = logits_of(**other);
  EXPECT_NE(std::memcmp(l1.data<float>(), l3.data<float>(), l1.nbytes()), 0);
}

// Share of routed slots that go to the `top` experts of highest bias, per MoE layer, over T random tokens.
std::vector<double> popular_share(const engine::ModelBundle& m, int64_t top, int64_t T) {
  const io::TextConfig& c = m.config.text;
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(c.num_layers),
                                           std::vector<int64_t>(static_cast<size_t>(c.num_experts), 0));
  model::MoeHooks hooks;
  hooks.route = [&](int64_t layer, int32_t* ids, float*, int64_t n, int64_t k, const std::vector<uint8_t>&) {
    for (int64_t i = 0; i < n * k; ++i) ++counts[static_cast<size_t>(layer)][static_cast<size_t>(ids[i])];
  };
  auto cache = m.decoder().allocate_cache((T + 15) / 16, 16);
  EXPECT_TRUE(cache.ok());
  std::vector<int32_t> table;
  EXPECT_TRUE(cache->reserve(table, T).is_ok());
  model::ForwardBatch b;
  for (int64_t i = 0; i < T; ++i) b.tokens.push_back(static_cast<int32_t>((i * 7919 + 13) % 151000));
  for (int r = 0; r < 3; ++r)
    for (int64_t i = 0; i < T; ++i) b.positions.push_back(static_cast<int32_t>(i));
  b.seqs.push_back({&table, 0, T, false, true});
  auto out = m.decoder().forward(b, *cache, &hooks);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  for (int64_t i = 0; out.ok() && i < out->numel(); ++i) EXPECT_TRUE(std::isfinite(out->data<float>()[i]));
  std::vector<double> share;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    // The experts of highest bias in this layer (the same ranking the synthesis used, from skew 1).
    const std::vector<float> bias = model::random_router_bias(c.num_experts, 1.f, *m.random_seed * 1000003ull + l);
    std::vector<int64_t> order(static_cast<size_t>(c.num_experts));
    for (int64_t e = 0; e < c.num_experts; ++e) order[e] = e;
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t x) { return bias[a] > bias[x]; });
    int64_t hit = 0, all = 0;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      all += counts[l][e];
      if (std::find(order.begin(), order.begin() + top, e) != order.begin() + top) hit += counts[l][e];
    }
    share.push_back(static_cast<double>(hit) / static_cast<double>(all));
  }
  return share;
}

TEST(RandomModel, RouterSkewConcentratesTheRoutingOnTheBiasedExperts) {
  engine::RandomModelOptions o;
  o.config = kTinyVl + "/config.json";
  o.tokenizer = kTokenizer;
  o.seed = 21;
  o.layers = 12;  // deep enough to see whether the bias fades with depth
  // 16 experts, top-4: the 4 experts of highest bias get 25% of the slots when routing ignores the bias.
  auto flat = engine::ModelBundle::random(o, model::Backend::kCpu);
  ASSERT_TRUE(flat.ok()) << flat.status().to_string();
  for (double s : popular_share(**flat, 4, 512)) EXPECT_LT(s, 0.45);
  // Reference: top-4 of N(0, 1) + bias (biases 0, -1.4, -2.2, ..., -5.5) by Monte Carlo, 20000 draws
  // (standard error 0.003).
  const float skew = 2.0f;
  double expected = 0;
  {
    std::mt19937_64 rng(5);
    std::normal_distribution<double> nd;
    const int E = 16, K = 4, draws = 20000;
    int64_t hit = 0;
    for (int d = 0; d < draws; ++d) {
      std::vector<std::pair<double, int>> z(E);
      for (int e = 0; e < E; ++e) z[e] = {nd(rng) - skew * std::log(e + 1.0), e};
      std::partial_sort(z.begin(), z.begin() + K, z.end(), std::greater<>());
      for (int j = 0; j < K; ++j) hit += z[j].second < 4;
    }
    expected = static_cast<double>(hit) / (draws * K);
  }
  EXPECT_GT(expected, 0.7);
  o.router_skew = skew;
  auto skewed = engine::ModelBundle::random(o, model::Backend::kCpu);
  ASSERT_TRUE(skewed.ok()) << skewed.status().to_string();
  EXPECT_FLOAT_EQ((*skewed)->random_router_skew, skew);
  // 512 tokens per layer: the measured share is within 0.1 of the reference in every one of 12 layers (the
  // bias does not fade with depth).
  for (double s : popular_share(**skewed, 4, 512)) EXPECT_NEAR(s, expected, 0.1);
  o.router_skew = -1.f;
  EXPECT_FALSE(engine::ModelBundle::random(o, model::Backend::kCpu).ok());
}

TEST(RandomModel, RoutingAndNextTokenDoNotCollapseWithDepth) {
  // A deep random network makes the hidden states of a sequence's tokens alike (attention averages them),
  // which would route them onto the same experts; the reserved token channels keep each token's routing
  // its own. Shape: hidden 128, 16 layers, 64 experts top-4.
  nlohmann::json cfg;
  {
    std::ifstream f(kTinyVl + "/config.json");
    cfg = nlohmann::json::parse(f);
  }
  auto& t = cfg["text_config"];
  t["hidden_size"] = 128;
  t["head_dim"] = 32;
  t["num_hidden_layers"] = 16;
  t["num_experts"] = 64;
  t["num_local_experts"] = 64;
  t["num_experts_per_tok"] = 4;
  t["moe_intermediate_size"] = 32;
  for (const char* k : {"rope_parameters", "rope_scaling"}) t[k]["mrope_section"] = {8, 4, 4};
  cfg["vision_config"]["out_hidden_size"] = 128;
  const std::string file = (std::filesystem::temp_directory_path() /
                            ("zest-random-config-" + std::to_string(::getpid()) + ".json")).string();
  {
    std::ofstream f(file);
    f << cfg.dump();
  }
  engine::RandomModelOptions o;
  o.config = file;
  o.tokenizer = kTokenizer;
  auto m = engine::ModelBundle::random(o, model::Backend::kCpu);
  std::filesystem::remove(file);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const io::TextConfig& c = (*m)->config.text;
  const int64_t T = 64, K = c.num_experts_per_tok, E = c.num_experts;
  std::vector<int32_t> ids_last;
  model::MoeHooks hooks;
  hooks.route = [&](int64_t layer, int32_t* ids, float*, int64_t rows, int64_t k, const std::vector<uint8_t>&) {
    if (layer == c.num_layers - 1) ids_last.assign(ids, ids + rows * k);
  };
  auto cache = (*m)->decoder().allocate_cache(T / 16, 16);
  ASSERT_TRUE(cache.ok());
  std::vector<int32_t> table;
  ASSERT_TRUE(cache->reserve(table, T).is_ok());
  model::ForwardBatch b;
  for (int64_t i = 0; i < T; ++i) b.tokens.push_back(static_cast<int32_t>(1000 + i * 2311));
  for (int r = 0; r < 3; ++r)
    for (int64_t i = 0; i < T; ++i) b.positions.push_back(static_cast<int32_t>(i));
  b.seqs.push_back({&table, 0, T, true, true});
  auto out = (*m)->decoder().forward(b, *cache, &hooks);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  ASSERT_EQ(static_cast<int64_t>(ids_last.size()), T * K);
  // Independent uniform top-K routing shares K/E = 1/16 of the experts between two tokens on average; the
  // sequence's common context adds some. Without the token channels this shape shares about half.
  double overlap = 0;
  int64_t pairs = 0;
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = i + 1; j < T; ++j, ++pairs)
      for (int64_t a = 0; a < K; ++a)
        overlap += std::count(ids_last.begin() + j * K, ids_last.begin() + (j + 1) * K, ids_last[i * K + a]);
  overlap /= static_cast<double>(pairs * K);
  EXPECT_LT(overlap, 3.0 * K / E);
  // Greedy next tokens (all positions' logits) differ between most positions.
  std::set<int64_t> next;
  const int64_t V = out->dim(1);
  for (int64_t i = 0; i < T; ++i) {
    const float* row = out->data<float>() + i * V;
    next.insert(std::max_element(row, row + V) - row);
  }
  EXPECT_GE(next.size(), 48u);
}

TEST(RandomModel, RouterBiasIsAZipfRankingPermutation) {
  const std::vector<float> b = model::random_router_bias(128, 1.5f, 3);
  std::vector<float> sorted = b;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  for (int64_t r = 0; r < 128; ++r) EXPECT_FLOAT_EQ(sorted[r], -1.5f * std::log(static_cast<float>(r + 1)));
  EXPECT_NE(b, sorted);  // a permutation, not the identity ranking
  EXPECT_NE(b, model::random_router_bias(128, 1.5f, 4));
  EXPECT_EQ(b, model::random_router_bias(128, 1.5f, 3));
}

// Random FP8 weights as the official checkpoints hold them: projections and experts replaced by block-wise FP8 (edge
// blocks partial) whose dequantization is the bf16 weight to within e4m3's rounding, the rest untouched, shared views
// still shared.
TEST(RandomModel, Fp8BlockwiseQuantizesProjectionsAndExperts) {
  auto cfg = model::named_model_config("qwen3-30b-a3b", 2);
  ASSERT_TRUE(cfg.ok());
  io::TextConfig t = cfg->text;
  t.hidden_size = 200, t.num_heads = 2, t.num_kv_heads = 1, t.head_dim = 64, t.num_experts = 4;
  t.num_experts_per_tok = 2, t.moe_intermediate_size = 72, t.vocab_size = 300;
  model::RandomTensors store(3);
  model::DecoderWeights w = model::random_decoder_weights(t, store, 1, 2);
  const model::DecoderWeights bf = w;
  const io::Fp8Config fc = model::quantize_fp8_blockwise(w, store, 128);
  EXPECT_EQ(fc.block_rows, 128);
  EXPECT_TRUE(fc.not_converted("model.layers.0.mlp.gate"));
  EXPECT_EQ(w.embed.dtype, DType::BF16);
  EXPECT_EQ(w.layers[0].router.dtype, DType::BF16);
  EXPECT_EQ(w.layers[0].in_norm.dtype, DType::BF16);
  auto check = [](const io::TensorView& q, const io::TensorView& b) {
    SCOPED_TRACE(b.name);
    ASSERT_EQ(q.dtype, DType::F8E4M3);
    ASSERT_EQ(q.shape, b.shape);
    EXPECT_EQ(q.name, b.name);
    EXPECT_EQ(q.scale.name, b.name + "_scale_inv");
    const int64_t R = b.shape[0], C = b.shape[1];
    ASSERT_EQ(q.scale.rows, (R + 127) / 128);
    ASSERT_EQ(q.scale.cols, (C + 127) / 128);
    const float* sc = static_cast<const float*>(q.scale.data);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        const float scale = sc[(r / 128) * q.scale.cols + c / 128];
        const float x = bf16_to_f32(static_cast<const uint16_t*>(b.data)[r * C + c]);
        const float deq = f8e4m3_to_f32(static_cast<const uint8_t*>(q.data)[r * C + c]) * scale;
        // Half a step of e4m3: 1/16 of the value for normals, 2^-10 of the scale for subnormals.
        ASSERT_LE(std::fabs(deq - x), std::max(std::fabs(x) / 16.f, scale * std::ldexp(1.f, -10)) * 1.0001f)
            << r << "," << c;
      }
  };
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const auto &L = w.layers[l], &B = bf.layers[l];
    check(L.q, B.q);
    check(L.k, B.k);
    check(L.v, B.v);
    check(L.o, B.o);
    for (size_t e = 0; e < L.gate.size(); ++e) {
      check(L.gate[e], B.gate[e]);
      check(L.up[e], B.up[e]);
      check(L.down[e], B.down[e]);
      // Experts 2 and 3 view experts 0 and 1 (distinct_experts 2), and layer 1 views layer 0: still one tensor.
      EXPECT_EQ(L.gate[e].data, w.layers[0].gate[e % 2].data);
    }
  }
  // A block's largest magnitude maps to 448.
  const io::TensorView& q = w.layers[0].q;
  float amax = 0.f;
  for (int64_t c = 0; c < 128; ++c)
    for (int64_t r = 0; r < 128; ++r) amax = std::max(amax, std::fabs(f8e4m3_to_f32(static_cast<const uint8_t*>(q.data)[r * 200 + c])));
  EXPECT_EQ(amax, 448.f);
}

TEST(RandomModel, BundleErrors) {
  engine::RandomModelOptions o;
  o.tokenizer = kTokenizer;
  o.config = "no-such-model";
  auto r = engine::ModelBundle::random(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("unknown model config 'no-such-model'"), std::string::npos);

  o.config = "qwen3-vl-30b-a3b";  // 30B parameters of f32 do not fit the CPU limit
  r = engine::ModelBundle::random(o, model::Backend::kCpu);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("16 GiB"), std::string::npos);

  o.config = kTinyVl;
  o.tokenizer = "/nonexistent/tokenizer";
  r = engine::ModelBundle::random(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);

  o.tokenizer = kTokenizer;
  o.layers = -2;
  r = engine::ModelBundle::random(o);
  EXPECT_FALSE(r.ok());

  o.layers = 0;
  o.fp8 = true;  // random FP8 weights are made for device backends
  r = engine::ModelBundle::random(o, model::Backend::kCpu);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(r.status().message().find("--device cuda"), std::string::npos) << r.status().to_string();
}

}  // namespace
}  // namespace zest
