// The split of a model over several GPUs (model/parallel.h) and the math it implies, emulated on the CPU: every query
// head, MLP column and expert on exactly one rank (key/value heads where each rank's query heads read them), and the
// per-rank partial results (attention output projection over a rank's heads, MLP over its columns, MoE over its
// experts or expert columns) summing to the unsplit layer's, as the all-reduce will sum them; then the same sums
// computed from each rank's cut of real decoder weights (shard_decoder_weights, bf16 and block-wise FP8). Tolerance:
// f32 summation order, 1e-5 of the largest output.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "model/parallel.h"
#include "model/parallel_decoder.h"
#include "model/qwen3.h"
#include "model/random_weights.h"

namespace zest::model {
namespace {

using Mat = std::vector<float>;  // row-major

Mat random_mat(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  Mat m(n);
  for (float& v : m) v = d(rng);
  return m;
}

// y[r] = sum over c in [c0, c1) of w[r, c] * x[c], w [rows, cols].
std::vector<float> matvec(const Mat& w, int64_t rows, int64_t cols, const std::vector<float>& x, int64_t c0, int64_t c1) {
  std::vector<float> y(static_cast<size_t>(rows), 0.f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = c0; c < c1; ++c) y[r] += w[r * cols + c] * x[c];
  return y;
}

float silu(float v) { return v / (1.f + std::exp(-v)); }

// A SwiGLU MLP over intermediate columns [i0, i1): down[:, i0:i1] (silu(gate[i0:i1] x) * up[i0:i1] x).
std::vector<float> mlp_cols(const Mat& gate, const Mat& up, const Mat& down, int64_t H, int64_t I,
                            const std::vector<float>& x, int64_t i0, int64_t i1) {
  std::vector<float> h(static_cast<size_t>(I), 0.f);
  const auto g = matvec(gate, I, H, x, 0, H), u = matvec(up, I, H, x, 0, H);
  for (int64_t i = i0; i < i1; ++i) h[i] = silu(g[i]) * u[i];
  return matvec(down, H, I, h, i0, i1);
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want) {
  float m = 0.f, e = 0.f;
  for (size_t i = 0; i < want.size(); ++i) {
    m = std::max(m, std::fabs(want[i]));
    e = std::max(e, std::fabs(got[i] - want[i]));
  }
  EXPECT_GT(m, 0.f);
  EXPECT_LE(e, 1e-5f * m);
}

io::TextConfig named(const std::string& name) {
  auto c = named_model_config(name);
  EXPECT_TRUE(c.ok());
  return c->text;
}

TEST(ParallelPlan, EveryHeadColumnAndExpertOnExactlyOneRank) {
  for (const std::string name : {"qwen3-30b-a3b", "qwen3-vl-235b-a22b", "qwen3-vl-32b", "qwen3-8b"}) {
    const io::TextConfig c = named(name);
    for (int world : {1, 2, 4, 8})
      for (bool ep : {false, true}) {
        if (ep && c.num_experts == 0) continue;
        SCOPED_TRACE(name + " world " + std::to_string(world) + (ep ? " EP" : " TP"));
        auto p = plan_parallel(c, world, ep);
        ASSERT_TRUE(p.ok()) << p.status().to_string();
        ASSERT_EQ(static_cast<int>(p->ranks.size()), world);
        std::vector<int> q(c.num_heads), cols(c.intermediate_size), experts(c.num_experts), ecols(c.moe_intermediate_size);
        const int64_t group = c.num_heads / c.num_kv_heads;
        for (const RankShard& r : p->ranks) {
          for (int64_t h = r.q_head0; h < r.q_head0 + r.q_heads; ++h) {
            ++q[h];
            // The key/value head this query head reads is on the rank.
            EXPECT_GE(h / group, r.kv_head0);
            EXPECT_LT(h / group, r.kv_head0 + r.kv_heads);
          }
          for (int64_t i = r.inter0; i < r.inter0 + r.inter; ++i) ++cols[i];
          if (c.num_experts > 0) {
            for (int64_t e = r.expert0; e < r.expert0 + r.experts; ++e) ++experts[e];
            for (int64_t i = r.expert_inter0; i < r.expert_inter0 + r.expert_inter; ++i) ++ecols[i];
          }
        }
        for (int v : q) EXPECT_EQ(v, 1);
        if (c.num_experts == 0) {
          for (int v : cols) EXPECT_EQ(v, 1);
        } else {
          for (int v : experts) EXPECT_EQ(v, ep ? 1 : world);
          for (int v : ecols) EXPECT_EQ(v, ep ? world : 1);
          for (int64_t e = 0; e < c.num_experts; ++e)
            EXPECT_EQ(p->owner_of_expert(e), ep ? static_cast<int>(e / (c.num_experts / world)) : -1);
        }
      }
  }
}

TEST(ParallelPlan, SizesThatDoNotSplitAreRefusedByName) {
  const io::TextConfig c = named("qwen3-30b-a3b");  // 32 query heads, 4 key/value heads, 128 experts of 768 columns
  auto expect = [](const Result<ParallelPlan>& r, const std::string& what) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().to_string();
  };
  expect(plan_parallel(c, 3, true), "query heads (32)");
  expect(plan_parallel(c, 0, true), "at least 1");
  io::TextConfig odd = c;
  odd.num_kv_heads = 3, odd.num_heads = 24;
  expect(plan_parallel(odd, 4, true), "key/value heads (3)");
  odd = c;
  odd.num_experts = 60;
  expect(plan_parallel(odd, 8, true), "the experts (60)");
  expect(plan_parallel(named("qwen3-8b"), 2, true), "needs a MoE model");
  // World 8 over 4 key/value heads: each pair of ranks holds one of them.
  auto p = plan_parallel(c, 8, true);
  ASSERT_TRUE(p.ok());
  for (const RankShard& r : p->ranks) {
    EXPECT_EQ(r.kv_heads, 1);
    EXPECT_EQ(r.kv_head0, r.rank / 2);
  }
}

// The partial results of every rank sum to the unsplit layer's (what the all-reduce after attention and after the
// MLP/MoE computes), for a small layer of each kind split over 1, 2 and 4 ranks.
TEST(ParallelPlan, PartialResultsSumToTheUnsplitLayer) {
  std::mt19937 rng(17);
  io::TextConfig c;
  c.hidden_size = 32, c.num_heads = 8, c.num_kv_heads = 2, c.head_dim = 4, c.num_layers = 2;
  c.intermediate_size = 48, c.num_experts = 8, c.num_experts_per_tok = 3, c.moe_intermediate_size = 12;
  c.mlp_only_layers = {1};  // layer 1 dense
  const int64_t H = c.hidden_size, QD = c.num_heads * c.head_dim;
  const Mat wo = random_mat(H * QD, rng);
  const std::vector<float> attn = random_mat(QD, rng);  // the heads' outputs, concatenated
  const std::vector<float> x = random_mat(H, rng);
  const Mat g = random_mat(c.intermediate_size * H, rng), u = random_mat(c.intermediate_size * H, rng),
            d = random_mat(H * c.intermediate_size, rng);
  const int64_t EI = c.moe_intermediate_size;
  std::vector<Mat> eg, eu, ed;
  for (int64_t e = 0; e < c.num_experts; ++e) {
    eg.push_back(random_mat(EI * H, rng));
    eu.push_back(random_mat(EI * H, rng));
    ed.push_back(random_mat(H * EI, rng));
  }
  const std::vector<int64_t> slots = {5, 1, 6};
  const std::vector<float> slot_w = {0.5f, 0.3f, 0.2f};
  auto moe = [&](auto take) {  // sum over the token's slots of weight * expert columns the rank holds
    std::vector<float> y(static_cast<size_t>(H), 0.f);
    for (size_t s = 0; s < slots.size(); ++s) {
      const auto [ok, i0, i1] = take(slots[s]);
      if (!ok) continue;
      const auto o = mlp_cols(eg[slots[s]], eu[slots[s]], ed[slots[s]], H, EI, x, i0, i1);
      for (int64_t j = 0; j < H; ++j) y[j] += slot_w[s] * o[j];
    }
    return y;
  };
  const auto full_attn = matvec(wo, H, QD, attn, 0, QD);
  const auto full_mlp = mlp_cols(g, u, d, H, c.intermediate_size, x, 0, c.intermediate_size);
  const auto full_moe = moe([&](int64_t) { return std::tuple{true, int64_t{0}, EI}; });
  for (int world : {1, 2, 4})
    for (bool ep : {false, true}) {
      SCOPED_TRACE("world " + std::to_string(world) + (ep ? " EP" : " TP"));
      auto p = plan_parallel(c, world, ep);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      std::vector<float> a(H, 0.f), m(H, 0.f), e(H, 0.f);
      for (const RankShard& r : p->ranks) {
        const auto pa = matvec(wo, H, QD, attn, r.q_head0 * c.head_dim, (r.q_head0 + r.q_heads) * c.head_dim);
        const auto pm = mlp_cols(g, u, d, H, c.intermediate_size, x, r.inter0, r.inter0 + r.inter);
        const auto pe = moe([&](int64_t ex) {
          return std::tuple{ex >= r.expert0 && ex < r.expert0 + r.experts, r.expert_inter0,
                            r.expert_inter0 + r.expert_inter};
        });
        for (int64_t j = 0; j < H; ++j) a[j] += pa[j], m[j] += pm[j], e[j] += pe[j];
      }
      expect_close(a, full_attn);
      expect_close(m, full_mlp);
      expect_close(e, full_moe);
    }
}

// The f32 values of a 2-D weight view (FP8 dequantized with its scale).
Mat values(const io::TensorView& t) {
  const Tensor f = t.to_f32();
  return Mat(f.data<float>(), f.data<float>() + f.numel());
}

// y = W x for W [rows, cols] row-major.
std::vector<float> apply(const Mat& w, int64_t rows, int64_t cols, const std::vector<float>& x) {
  return matvec(w, rows, cols, x, 0, cols);
}

// SwiGLU through one (gate, up, down) triple of views: down (silu(gate x) * (up x)).
std::vector<float> swiglu(const io::TensorView& g, const io::TensorView& u, const io::TensorView& d,
                          const std::vector<float>& x) {
  const int64_t I = g.shape[0], H = g.shape[1];
  const auto gx = apply(values(g), I, H, x), ux = apply(values(u), I, H, x);
  std::vector<float> h(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) h[i] = silu(gx[i]) * ux[i];
  return apply(values(d), H, I, h);
}

io::TextConfig tiny_parallel_config() {
  io::TextConfig c;
  c.hidden_size = 32, c.num_heads = 8, c.num_kv_heads = 2, c.head_dim = 4, c.num_layers = 2, c.vocab_size = 64;
  c.intermediate_size = 48, c.num_experts = 8, c.num_experts_per_tok = 3, c.moe_intermediate_size = 12;
  c.mlp_only_layers = {1};  // layer 1 dense
  c.norm_topk_prob = true;
  return c;
}

// Each rank's cut of random decoder weights, run through the layer math with plain loops, sums to the whole model's:
// the attention output projection over the rank's heads (its o_proj columns against its heads' outputs), the q
// projection of its heads (rows of the whole q), the dense MLP over its columns and the MoE over its experts or
// expert columns. World 1 is the source's views unchanged.
void check_shards(const DecoderWeights& w, const std::string& label) {
  SCOPED_TRACE(label);
  std::mt19937 rng(19);
  const io::TextConfig& c = w.config;
  const int64_t H = c.hidden_size, D = c.head_dim, QD = c.num_heads * D;
  const std::vector<float> x = random_mat(H, rng), attn = random_mat(QD, rng);
  const DecoderLayerWeights& L0 = w.layers[0];  // MoE
  const DecoderLayerWeights& L1 = w.layers[1];  // dense
  const auto full_o = apply(values(L0.o), H, QD, attn);
  const auto full_q = apply(values(L0.q), QD, H, x);
  const auto full_mlp = swiglu(L1.gate[0], L1.up[0], L1.down[0], x);
  const std::vector<int64_t> slots = {5, 1, 6};
  const std::vector<float> slot_w = {0.5f, 0.3f, 0.2f};
  auto moe = [&](const DecoderLayerWeights& L) {
    std::vector<float> y(static_cast<size_t>(H), 0.f);
    for (size_t s = 0; s < slots.size(); ++s) {
      if (L.gate[slots[s]].data == nullptr) continue;  // another rank's expert
      const auto o = swiglu(L.gate[slots[s]], L.up[slots[s]], L.down[slots[s]], x);
      for (int64_t j = 0; j < H; ++j) y[j] += slot_w[s] * o[j];
    }
    return y;
  };
  const auto full_moe = moe(L0);
  for (int world : {1, 2, 4})
    for (bool ep : {false, true}) {
      SCOPED_TRACE("world " + std::to_string(world) + (ep ? " EP" : " TP"));
      auto p = plan_parallel(c, world, ep);
      ASSERT_TRUE(p.ok()) << p.status().to_string();
      std::vector<float> o(H, 0.f), m(H, 0.f), e(H, 0.f);
      for (const RankShard& r : p->ranks) {
        auto s = shard_decoder_weights(w, *p, r.rank);
        ASSERT_TRUE(s.ok()) << s.status().to_string();
        const DecoderWeights& sw = s->weights;
        EXPECT_EQ(sw.config.num_heads, r.q_heads);
        EXPECT_EQ(sw.config.num_kv_heads, r.kv_heads);
        const DecoderLayerWeights& S0 = sw.layers[0];
        const DecoderLayerWeights& S1 = sw.layers[1];
        if (world == 1) {
          EXPECT_EQ(S0.o.data, L0.o.data);
          EXPECT_EQ(S0.down[0].data, L0.down[0].data);
          EXPECT_TRUE(s->owned.empty());
        }
        ASSERT_EQ(S0.k.shape[0], r.kv_heads * D);
        const std::vector<float> my_attn(attn.begin() + r.q_head0 * D, attn.begin() + (r.q_head0 + r.q_heads) * D);
        const auto po = apply(values(S0.o), H, r.q_heads * D, my_attn);
        const auto pq = apply(values(S0.q), r.q_heads * D, H, x);
        for (int64_t i = 0; i < r.q_heads * D; ++i) EXPECT_EQ(pq[i], full_q[r.q_head0 * D + i]) << "q row " << i;
        const auto pm = swiglu(S1.gate[0], S1.up[0], S1.down[0], x);
        const auto pe = moe(S0);
        for (int64_t j = 0; j < H; ++j) o[j] += po[j], m[j] += pm[j], e[j] += pe[j];
      }
      expect_close(o, full_o);
      expect_close(m, full_mlp);
      expect_close(e, full_moe);
    }
}

TEST(ParallelShard, RanksCutsOfRealWeightsSumToTheWholeLayer) {
  RandomTensors store(23);
  const DecoderWeights w = random_decoder_weights(tiny_parallel_config(), store);
  check_shards(w, "bf16");
  // Block-wise FP8 in 4 x 4 blocks, expert width 16: every cut (heads of 4 rows, 48 / 4 MLP and 16 / 4 expert
  // columns) on block edges at 1, 2 and 4 ranks.
  io::TextConfig c = tiny_parallel_config();
  c.moe_intermediate_size = 16;
  RandomTensors fstore(23);
  DecoderWeights f = random_decoder_weights(c, fstore);
  quantize_fp8_blockwise(f, fstore, 4);
  check_shards(f, "fp8");
}

TEST(ParallelShard, RefusesCutsOffFp8BlocksAndBadRanks) {
  RandomTensors store(29);
  DecoderWeights w = random_decoder_weights(tiny_parallel_config(), store);
  quantize_fp8_blockwise(w, store, 4);  // expert columns 12 / 2 = 6: off the 4-column blocks
  auto p = plan_parallel(w.config, 2, false);
  ASSERT_TRUE(p.ok());
  auto s = shard_decoder_weights(w, *p, 0);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(s.status().message().find("scale blocks"), std::string::npos) << s.status().to_string();
  auto ep = plan_parallel(w.config, 2, true);  // whole experts: no cut inside a block
  ASSERT_TRUE(ep.ok());
  EXPECT_TRUE(shard_decoder_weights(w, *ep, 1).ok());
  EXPECT_EQ(shard_decoder_weights(w, *ep, 2).status().code(), ErrorCode::kInvalidArgument);
}

// Two steps of a decoder: a prefill of two sequences (5 and 3 tokens), then one decode token each; the logits of both
// steps, concatenated.
std::vector<float> run_two_steps(const TextDecoder& m, const MoeHooks* hooks = nullptr) {
  auto made = m.allocate_cache(8, 4);
  EXPECT_TRUE(made.ok()) << made.status().to_string();
  if (!made.ok()) return {};
  PagedKVCache cache = std::move(*made);
  std::vector<int32_t> t0 = {0, 1}, t1 = {2, 3};
  ForwardBatch b;
  b.tokens = {7, 3, 11, 40, 2, 9, 63, 5};
  for (int r = 0; r < 3; ++r)
    for (int p : {0, 1, 2, 3, 4, 0, 1, 2}) b.positions.push_back(p);
  b.seqs = {{&t0, 0, 5}, {&t1, 0, 3}};
  auto l1 = m.forward(b, cache, hooks);
  EXPECT_TRUE(l1.ok()) << l1.status().to_string();
  ForwardBatch d;
  d.tokens = {17, 30};
  for (int r = 0; r < 3; ++r)
    for (int p : {5, 3}) d.positions.push_back(p);
  d.seqs = {{&t0, 5, 1}, {&t1, 3, 1}};
  auto l2 = m.forward(d, cache, hooks);
  EXPECT_TRUE(l2.ok()) << l2.status().to_string();
  if (!l1.ok() || !l2.ok()) return {};
  std::vector<float> out(l1->data<float>(), l1->data<float>() + l1->numel());
  out.insert(out.end(), l2->data<float>(), l2->data<float>() + l2->numel());
  return out;
}

// The decoder run as `world` CPU ranks (threads joined by a LocalGroup), each on its shard of w with its own KV cache
// of its key/value heads: every rank's logits.
std::vector<std::vector<float>> run_ranks(const DecoderWeights& w, int world, bool ep) {
  auto plan = plan_parallel(w.config, world, ep);
  EXPECT_TRUE(plan.ok()) << plan.status().to_string();
  if (!plan.ok()) return {};
  LocalGroup group(world);
  std::vector<ShardWeights> shards;
  std::vector<Qwen3TextModel> models;
  for (int r = 0; r < world; ++r) {
    auto s = shard_decoder_weights(w, *plan, r);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    if (!s.ok()) return {};
    shards.push_back(std::move(*s));
    auto m = Qwen3TextModel::from_weights(shards.back().weights);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    if (!m.ok()) return {};
    models.push_back(std::move(*m));
  }
  std::vector<std::vector<float>> out(static_cast<size_t>(world));
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(models[r].set_communicator(&group.member(r)).is_ok());
    ranks.emplace_back([&, r] { out[r] = run_two_steps(models[r]); });
  }
  for (auto& t : ranks) t.join();
  return out;
}

// The CPU decoder split over 2 and 4 ranks (tensor-parallel attention with tensor- or expert-parallel MoE, and the
// dense layer's columns split) gives the whole model's logits within f32 summation order (1e-5 of the largest), every
// rank the same bits; world 1 is bit-identical to the whole model without a communicator. bf16 and block-wise FP8
// weights (4 x 4 blocks, expert width 16).
TEST(ParallelDecoder, CpuRanksGiveTheWholeModelsLogits) {
  io::TextConfig c = tiny_parallel_config();
  c.moe_intermediate_size = 16;
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "bf16");
    RandomTensors store(31);
    DecoderWeights w = random_decoder_weights(c, store);
    if (fp8) quantize_fp8_blockwise(w, store, 4);
    auto whole = Qwen3TextModel::from_weights(w);
    ASSERT_TRUE(whole.ok()) << whole.status().to_string();
    const std::vector<float> want = run_two_steps(*whole);
    ASSERT_EQ(want.size(), static_cast<size_t>(4 * c.vocab_size));
    for (int world : {1, 2, 4})
      for (bool ep : {false, true}) {
        SCOPED_TRACE("world " + std::to_string(world) + (ep ? " EP" : " TP"));
        const auto got = run_ranks(w, world, ep);
        ASSERT_EQ(got.size(), static_cast<size_t>(world));
        for (int r = 0; r < world; ++r) {
          ASSERT_EQ(got[r].size(), want.size()) << "rank " << r;
          EXPECT_EQ(got[r], got[0]) << "rank " << r << " differs from rank 0";
        }
        if (world == 1)
          EXPECT_EQ(got[0], want);
        else
          expect_close(got[0], want);
      }
  }
}

// ParallelDecoder::create_cpu over w at 1, 2 and 4 ranks, TP and EP, against the whole model's logits `want` (world 1: the
// same bits).
void expect_decoders_match(const DecoderWeights& w, const std::vector<float>& want) {
  for (int world : {1, 2, 4})
    for (bool ep : {false, true}) {
      SCOPED_TRACE("world " + std::to_string(world) + (ep ? " EP" : " TP"));
      auto d = ParallelDecoder::create_cpu(w, world, ep);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      EXPECT_EQ((*d)->world(), world);
      const auto got = run_two_steps(**d);
      if (world == 1)
        EXPECT_EQ(got, want);
      else
        expect_close(got, want);
    }
}

// The same through the engine-facing decoder (one TextDecoder over the ranks, one cache whose storage holds each
// rank's heads): two and four ranks give the whole model's logits; sizes that do not split and foreign caches are
// refused.
TEST(ParallelDecoder, OneDecoderOverRanks) {
  io::TextConfig c = tiny_parallel_config();
  c.moe_intermediate_size = 16;
  RandomTensors store(37);
  const DecoderWeights w = random_decoder_weights(c, store);
  auto whole = Qwen3TextModel::from_weights(w);
  ASSERT_TRUE(whole.ok());
  expect_decoders_match(w, run_two_steps(*whole));
  auto bad = ParallelDecoder::create_cpu(w, 3, false);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  auto two = ParallelDecoder::create_cpu(w, 2, true);
  ASSERT_TRUE(two.ok());
  auto cache = (*two)->allocate_cache(4, 4);
  ASSERT_TRUE(cache.ok());
  std::vector<int32_t> table = {0};
  ForwardBatch b;
  b.tokens = {1};
  b.positions = {0, 0, 0};
  b.seqs = {{&table, 0, 1}};
  PagedKVCache other = whole->make_cache(4, 4);
  EXPECT_EQ((*two)->forward(b, other).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE((*two)->forward(b, *cache).ok());
}

// w's experts in the fused input-major layout of the Qwen3-VL-MoE checkpoints (gate_up [E, H, 2I], down [E, I, H]),
// f32 copies held by `keep`.
DecoderWeights fuse_experts(const DecoderWeights& w, std::vector<std::vector<float>>& keep) {
  DecoderWeights f = w;
  for (DecoderLayerWeights& L : f.layers) {
    if (!L.moe) continue;
    const int64_t E = static_cast<int64_t>(L.gate.size()), I = L.gate[0].shape[0], H = L.gate[0].shape[1];
    std::vector<float> gu(static_cast<size_t>(E * H * 2 * I)), dn(static_cast<size_t>(E * I * H));
    for (int64_t e = 0; e < E; ++e) {
      const Mat g = values(L.gate[e]), u = values(L.up[e]), d = values(L.down[e]);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < I; ++i) {
          gu[(e * H + h) * 2 * I + i] = g[i * H + h];
          gu[(e * H + h) * 2 * I + I + i] = u[i * H + h];
          dn[(e * I + i) * H + h] = d[h * I + i];
        }
    }
    keep.push_back(std::move(gu));
    keep.push_back(std::move(dn));
    auto view = [](const std::vector<float>& v, std::vector<int64_t> shape, const std::string& name) {
      io::TensorView t;
      t.name = name;
      t.dtype = DType::F32;
      t.shape = std::move(shape);
      t.data = v.data();
      t.nbytes = v.size() * sizeof(float);
      return t;
    };
    L.fused_gate_up = view(keep[keep.size() - 2], {E, H, 2 * I}, "experts.gate_up_proj");
    L.fused_down = view(keep.back(), {E, I, H}, "experts.down_proj");
    L.gate.clear();
    L.up.clear();
    L.down.clear();
  }
  return f;
}

// Fused experts (the Qwen3-VL-MoE layout) split by each expert's columns (copies) or by experts (views): the whole
// model's logits at 2 and 4 ranks, world 1 bit-identical.
TEST(ParallelDecoder, FusedExpertsSplitByColumnsOrByExperts) {
  io::TextConfig c = tiny_parallel_config();
  c.moe_intermediate_size = 16;
  RandomTensors store(41);
  const DecoderWeights w = random_decoder_weights(c, store);
  std::vector<std::vector<float>> keep;
  const DecoderWeights f = fuse_experts(w, keep);
  auto whole = Qwen3TextModel::from_weights(w);
  ASSERT_TRUE(whole.ok());
  expect_decoders_match(f, run_two_steps(*whole));
}

// Host re-routing hooks (SERE's CPU path) on a split decoder: rank 0 calls them once a MoE layer (the ranks hold the
// same routing inputs) and its re-routing reaches every rank: the logits equal the whole model's with the same hooks,
// and differ from those without them.
TEST(ParallelDecoder, HooksRunOnRankZeroAndItsReroutingReachesEveryRank) {
  io::TextConfig c = tiny_parallel_config();
  c.moe_intermediate_size = 16;
  RandomTensors store(43);
  const DecoderWeights w = random_decoder_weights(c, store);
  std::atomic<int> routes{0}, inputs{0};
  MoeHooks hooks;
  hooks.route = [&](int64_t, int32_t* ids, float*, int64_t n, int64_t k, const std::vector<uint8_t>& active) {
    ++routes;
    for (int64_t t = 0; t < n; ++t)
      if (active[t]) ids[t * k + k - 1] = ids[t * k] == 7 ? 6 : 7;  // the last slot to expert 7 (6 if taken)
  };
  hooks.moe_input = [&](int64_t, const float*, int64_t) { ++inputs; };
  auto whole = Qwen3TextModel::from_weights(w);
  ASSERT_TRUE(whole.ok());
  const std::vector<float> want = run_two_steps(*whole, &hooks);
  const int per_run = routes.load();
  EXPECT_EQ(per_run, 2);  // one MoE layer, two steps
  EXPECT_EQ(inputs.load(), per_run);
  EXPECT_NE(want, run_two_steps(*whole));
  for (int world : {2, 4})
    for (bool ep : {false, true}) {
      SCOPED_TRACE("world " + std::to_string(world) + (ep ? " EP" : " TP"));
      auto d = ParallelDecoder::create_cpu(w, world, ep);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      routes = 0;
      inputs = 0;
      expect_close(run_two_steps(**d, &hooks), want);
      EXPECT_EQ(routes.load(), per_run);
      EXPECT_EQ(inputs.load(), per_run);
    }
}

// SERE calibration's host experts through a split decoder: expert e of the MoE layer over a few rows equals the
// whole model's (the owning rank's under expert parallelism, the sum of the ranks' column slices under tensor
// parallelism); a dense layer and an expert out of range keep their errors.
TEST(ParallelDecoder, RunExpertGivesTheWholeExpert) {
  io::TextConfig c = tiny_parallel_config();
  c.moe_intermediate_size = 16;
  RandomTensors store(47);
  const DecoderWeights w = random_decoder_weights(c, store);
  auto whole = Qwen3TextModel::from_weights(w);
  ASSERT_TRUE(whole.ok());
  std::mt19937 rng(48);
  const int64_t n = 3, H = c.hidden_size;
  const Mat x = random_mat(static_cast<size_t>(n * H), rng);
  for (int world : {2, 4})
    for (bool ep : {false, true}) {
      SCOPED_TRACE("world " + std::to_string(world) + (ep ? " EP" : " TP"));
      auto d = ParallelDecoder::create_cpu(w, world, ep);
      ASSERT_TRUE(d.ok());
      for (int64_t e : {0, 5, 7}) {
        std::vector<float> want(static_cast<size_t>(n * H)), got(want.size());
        ASSERT_TRUE(whole->run_expert(0, e, x.data(), n, want.data()).is_ok());
        ASSERT_TRUE((*d)->run_expert(0, e, x.data(), n, got.data()).is_ok()) << "expert " << e;
        expect_close(got, want);
      }
      std::vector<float> y(static_cast<size_t>(n * H));
      EXPECT_EQ((*d)->run_expert(1, 0, x.data(), n, y.data()).code(), ErrorCode::kInvalidArgument);  // dense layer
      EXPECT_EQ((*d)->run_expert(0, 8, x.data(), n, y.data()).code(), ErrorCode::kInvalidArgument);
    }
}

TEST(ParallelDecoder, AllReduceOfDifferentSizesIsAnError) {
  LocalGroup group(2);
  std::vector<float> a(4, 1.f), b(5, 2.f);
  Status sa, sb;
  std::thread t([&] { sb = group.member(1).all_reduce_sum(b.data(), 5); });
  sa = group.member(0).all_reduce_sum(a.data(), 4);
  t.join();
  EXPECT_EQ(sa.code(), ErrorCode::kInternal);
  EXPECT_EQ(sb.code(), ErrorCode::kInternal);
  std::vector<float> x = {1.f, 2.f}, y = {10.f, 20.f};
  std::thread u([&] { sb = group.member(1).all_reduce_sum(y.data(), 2); });
  sa = group.member(0).all_reduce_sum(x.data(), 2);
  u.join();
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ(x, (std::vector<float>{11.f, 22.f}));
  EXPECT_EQ(y, x);
}

// A rank whose steps fail while `fail` is set (before any collective), else the Qwen3 model's.
class FailingRank final : public TextDecoder {
 public:
  explicit FailingRank(Qwen3TextModel m) : m_(std::move(m)) {}
  Backend backend() const override { return m_.backend(); }
  const io::TextConfig& config() const override { return m_.config(); }
  Result<PagedKVCache> allocate_cache(int64_t blocks, int64_t block_size) const override {
    return m_.allocate_cache(blocks, block_size);
  }
  Result<Tensor> forward(const ForwardBatch& b, PagedKVCache& cache, const MoeHooks* hooks) const override {
    if (fail) return resource_exhausted("rank 1 is out of memory (test)");
    return m_.forward(b, cache, hooks);
  }
  Status set_communicator(Communicator* comm) override { return m_.set_communicator(comm); }
  bool fail = false;

 private:
  Qwen3TextModel m_;
};

// One rank's step fails while the other waits for it in an all-reduce: the step returns that rank's error (not a
// hang, not the collective the other abandoned), and the next step, with every rank well, gives the whole model's
// logits (the group was reset). Mutation: without the abort the test hangs; without the reset the second step fails.
TEST(ParallelDecoder, ARankThatFailsMidStepEndsTheStepWithItsError) {
  io::TextConfig c = tiny_parallel_config();
  c.moe_intermediate_size = 16;
  RandomTensors store(41);
  const DecoderWeights w = random_decoder_weights(c, store);
  auto whole = Qwen3TextModel::from_weights(w);
  ASSERT_TRUE(whole.ok());
  const std::vector<float> want = run_two_steps(*whole);
  FailingRank* failing = nullptr;
  auto make = [&](const DecoderWeights& shard, int r) -> Result<std::unique_ptr<TextDecoder>> {
    ZEST_ASSIGN_OR_RETURN(Qwen3TextModel m, Qwen3TextModel::from_weights(shard));
    if (r == 0) return std::unique_ptr<TextDecoder>(std::make_unique<Qwen3TextModel>(std::move(m)));
    auto f = std::make_unique<FailingRank>(std::move(m));
    failing = f.get();
    return std::unique_ptr<TextDecoder>(std::move(f));
  };
  auto d = ParallelDecoder::create(w, 2, false, make, std::make_unique<LocalGroup>(2));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_NE(failing, nullptr);
  auto cache = (*d)->allocate_cache(8, 4);
  ASSERT_TRUE(cache.ok());
  std::vector<int32_t> table = {0, 1};
  ForwardBatch b;
  b.tokens = {7, 3, 11};
  for (int r = 0; r < 3; ++r)
    for (int p : {0, 1, 2}) b.positions.push_back(p);
  b.seqs = {{&table, 0, 3}};
  failing->fail = true;
  for (int i = 0; i < 2; ++i) {
    auto l = (*d)->forward(b, *cache);
    ASSERT_FALSE(l.ok());
    EXPECT_EQ(l.status().code(), ErrorCode::kResourceExhausted) << l.status().to_string();
  }
  failing->fail = false;
  expect_close(run_two_steps(**d), want);
}


// A member of the test groups of device communicators: host collectives refused, the device all-reduce the group's.
struct DeviceMember : Communicator {
  DeviceMember(int r, int w) : r_(r), w_(w) {}
  int rank() const override { return r_; }
  int world() const override { return w_; }
  Status all_reduce_sum(float*, int64_t) override { return unsupported("device sums only"); }
  Status broadcast(void*, int64_t, int) override { return unsupported("device sums only"); }
  bool reduces_on_device() const override { return true; }
  int r_, w_;
};

// A device communicator group that only counts the collectives each rank queued (a GPU waits for every one of them
// to be matched by the other ranks').
class CountingDeviceGroup final : public CommunicatorGroup {
 public:
  explicit CountingDeviceGroup(int world) {
    for (int r = 0; r < world; ++r) members_.push_back(std::make_unique<Member>(r, world));
  }
  int world() const override { return static_cast<int>(members_.size()); }
  Communicator& member(int rank) override { return *members_.at(static_cast<size_t>(rank)); }
  int queued(int rank) const { return members_.at(static_cast<size_t>(rank))->queued.load(); }

 private:
  struct Member final : DeviceMember {
    Member(int r, int w) : DeviceMember(r, w) {}
    Status all_reduce_sum_device(void*, int64_t, bool, void*) override {
      ++queued;
      return Status::ok();
    }
    std::atomic<int> queued{0};
  };
  std::vector<std::unique_ptr<Member>> members_;
};

// The gate of device collectives (the NCCL group's): rank 1 fails after queuing two collectives while rank 0 goes
// for a third; rank 0 gets an error for it without queuing it, so both GPUs hold two matched collectives (no stream
// left waiting). After reset() the ranks queue together again. Mutation: without the gate rank 0 queues three.
TEST(ParallelDecoder, DeviceCollectivesAreQueuedOnlyWhenEveryRankQueuesThem) {
  auto* counting = new CountingDeviceGroup(2);
  GatedDeviceGroup g{std::unique_ptr<CommunicatorGroup>(counting)};
  ASSERT_TRUE(g.member(0).reduces_on_device());
  float buf = 0.f;
  Status third = Status::ok();
  std::thread r0([&] {
    for (int i = 0; i < 3; ++i) {
      Status s = g.member(0).all_reduce_sum_device(&buf, 1, false, nullptr);
      if (!s.is_ok()) {
        third = s;
        return;
      }
    }
  });
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(g.member(1).all_reduce_sum_device(&buf, 1, false, nullptr).is_ok());
  g.abort();  // rank 1's step failed (ParallelDecoder::on_ranks)
  r0.join();
  EXPECT_EQ(third.code(), ErrorCode::kInternal) << third.to_string();
  EXPECT_NE(third.to_string().find("another rank"), std::string::npos) << third.to_string();
  EXPECT_EQ(counting->queued(0), 2);
  EXPECT_EQ(counting->queued(1), 2);
  // Aborted: a rank arriving now is refused at once.
  EXPECT_FALSE(g.member(1).all_reduce_sum_device(&buf, 1, false, nullptr).is_ok());
  EXPECT_EQ(counting->queued(1), 2);
  g.reset();
  std::thread r1([&] { EXPECT_TRUE(g.member(1).all_reduce_sum_device(&buf, 1, false, nullptr).is_ok()); });
  EXPECT_TRUE(g.member(0).all_reduce_sum_device(&buf, 1, false, nullptr).is_ok());
  r1.join();
  EXPECT_EQ(counting->queued(0), 3);
  EXPECT_EQ(counting->queued(1), 3);
}

// A replay's launch gate: rank 1's step failed before its replay, so rank 0 does not launch its own (whose
// collectives would wait on rank 1's GPU forever); after reset() the ranks launch together. Mutation: a launch_gate
// that does not meet (the Communicator default) lets rank 0 launch.
TEST(ParallelDecoder, AReplayIsLaunchedOnlyWhenEveryRankLaunchesItsOwn) {
  GatedDeviceGroup g{std::make_unique<CountingDeviceGroup>(2)};
  Status r0 = Status::ok();
  std::thread t([&] { r0 = g.member(0).launch_gate(); });
  g.abort();  // rank 1's step failed before its launch (ParallelDecoder::on_ranks)
  t.join();
  EXPECT_EQ(r0.code(), ErrorCode::kInternal) << r0.to_string();
  g.reset();
  Status r1 = Status::ok();
  std::thread u([&] { r1 = g.member(1).launch_gate(); });
  EXPECT_TRUE(g.member(0).launch_gate().is_ok());
  u.join();
  EXPECT_TRUE(r1.is_ok()) << r1.to_string();
}

// Two GPUs as the host sees them: a collective queued by every rank runs once every rank's GPU reaches it, and a
// rank's stream sync waits for that; abort_device() (ncclCommAbort) ends the wait with an error, for good.
class FakeDevices final : public CommunicatorGroup {
 public:
  explicit FakeDevices(int world) {
    for (int r = 0; r < world; ++r) members_.push_back(std::make_unique<Member>(this, r, world));
  }
  int world() const override { return static_cast<int>(members_.size()); }
  Communicator& member(int rank) override { return *members_.at(static_cast<size_t>(rank)); }
  void abort_device() override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    ++device_aborts;
    cv_.notify_all();
  }
  bool broken() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }
  // Rank r's stream sync: its GPU got past its queued collectives once every rank's GPU has queued as many and
  // reached its sync (a failed GPU never does); false once aborted.
  bool sync(int r) {
    std::unique_lock<std::mutex> lock(mu_);
    reached_[r] = queued_[r];
    cv_.notify_all();
    cv_.wait(lock, [&] {
      if (aborted_) return true;
      for (size_t i = 0; i < members_.size(); ++i)
        if (reached_[i] < queued_[r]) return false;
      return true;
    });
    return !aborted_;
  }
  int device_aborts = 0;

 private:
  struct Member final : DeviceMember {
    Member(FakeDevices* d, int r, int w) : DeviceMember(r, w), d_(d) {}
    Status all_reduce_sum_device(void*, int64_t, bool, void*) override {
      std::lock_guard<std::mutex> lock(d_->mu_);
      if (d_->aborted_) return internal_error("aborted communicator");
      ++d_->queued_[r_];
      return Status::ok();
    }
    FakeDevices* d_;
  };
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool aborted_ = false;
  std::vector<int> queued_ = std::vector<int>(8, 0), reached_ = std::vector<int>(8, 0);  // (up to 8 ranks)
  std::vector<std::unique_ptr<Member>> members_;
};

// A rank of a split GPU decoder as the host sees it: a step queues one all-reduce, then syncs its stream. Rank 1's
// host fails before queuing (`host_fails`) or its GPU after (`gpu_fails`: its collective never runs).
class DeviceRank final : public TextDecoder {
 public:
  DeviceRank(Qwen3TextModel m, FakeDevices* devices, int rank) : m_(std::move(m)), devices_(devices), rank_(rank) {}
  Backend backend() const override { return m_.backend(); }
  const io::TextConfig& config() const override { return m_.config(); }
  Result<PagedKVCache> allocate_cache(int64_t blocks, int64_t block_size) const override {
    return m_.allocate_cache(blocks, block_size);
  }
  Status set_communicator(Communicator* comm) override {
    comm_ = comm;
    return Status::ok();
  }
  Result<Tensor> forward(const ForwardBatch&, PagedKVCache&, const MoeHooks*) const override {
    ++steps;
    if (host_fails) return resource_exhausted("rank 1 is out of host memory (test)");
    float v = 0.f;
    ZEST_RETURN_IF_ERROR(comm_->all_reduce_sum_device(&v, 1, false, nullptr));
    if (gpu_fails) return internal_error("rank 1's GPU failed after queuing its all-reduce (test)");
    if (!devices_->sync(rank_)) return internal_error("stream sync: the collective was aborted");
    return Tensor::empty({1, 1});
  }
  bool host_fails = false, gpu_fails = false;
  mutable std::atomic<int> steps{0};

 private:
  Qwen3TextModel m_;
  FakeDevices* devices_;
  int rank_;
  Communicator* comm_ = nullptr;
};

// A rank's GPU fails after its collective was queued: the other rank's GPU waits on its own forever, and its host
// thread in the stream sync. The failed rank finds it still running after the abort grace and aborts the device
// collectives: the step returns the failed rank's error (no hang), and the decoder refuses later steps without
// running them. A rank that fails on the host before queuing leaves the devices alone (the other rank leaves the
// gate), and the next step runs. Mutation: without abort_device the first forward hangs (the test's deadline ends it
// as a failure); with it on every failure the host-side case breaks the decoder.
TEST(ParallelDecoder, ARankWhoseGpuFailsMidStepAbortsTheDeviceCollectives) {
  io::TextConfig c = tiny_parallel_config();
  c.moe_intermediate_size = 16;
  RandomTensors store(43);
  const DecoderWeights w = random_decoder_weights(c, store);
  auto* devices = new FakeDevices(2);
  std::vector<DeviceRank*> ranks(2, nullptr);
  auto make = [&](const DecoderWeights& shard, int r) -> Result<std::unique_ptr<TextDecoder>> {
    ZEST_ASSIGN_OR_RETURN(Qwen3TextModel m, Qwen3TextModel::from_weights(shard));
    auto d = std::make_unique<DeviceRank>(std::move(m), devices, r);
    ranks[r] = d.get();
    return std::unique_ptr<TextDecoder>(std::move(d));
  };
  auto d = ParallelDecoder::create(w, 2, false, make,
                                   std::make_unique<GatedDeviceGroup>(std::unique_ptr<CommunicatorGroup>(devices)));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  // Long enough for a rank released from its gate to return on a loaded machine (the host-side case must not abort
  // the devices), short enough for the test.
  (*d)->set_abort_grace(std::chrono::milliseconds(3000));
  auto cache = (*d)->allocate_cache(8, 4);
  ASSERT_TRUE(cache.ok());
  ForwardBatch b;
  auto step = [&]() -> Status {
    auto f = std::async(std::launch::async, [&] { return (*d)->forward(b, *cache).status(); });
    if (f.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
      devices->abort_device();  // release the hung rank so the test can end
      f.wait();
      return internal_error("the step hung");
    }
    return f.get();
  };
  EXPECT_TRUE(step().is_ok());
  EXPECT_TRUE((*d)->health().is_ok());
  ranks[1]->host_fails = true;
  Status s = step();
  EXPECT_EQ(s.code(), ErrorCode::kResourceExhausted) << s.to_string();
  EXPECT_EQ(devices->device_aborts, 0);
  ranks[1]->host_fails = false;
  EXPECT_TRUE(step().is_ok());  // the queued collectives still match: the devices were left alone
  ranks[1]->gpu_fails = true;
  s = step();
  EXPECT_EQ(s.code(), ErrorCode::kInternal) << s.to_string();
  EXPECT_NE(s.to_string().find("rank 1's GPU failed"), std::string::npos) << s.to_string();
  EXPECT_EQ(devices->device_aborts, 1);
  EXPECT_EQ((*d)->health().code(), ErrorCode::kInternal);  // the server's /health says so
  ranks[1]->gpu_fails = false;
  const int before = ranks[0]->steps.load();
  s = step();
  EXPECT_EQ(s.code(), ErrorCode::kInternal) << s.to_string();
  EXPECT_NE(s.to_string().find("unusable"), std::string::npos) << s.to_string();
  EXPECT_EQ(ranks[0]->steps.load(), before);
}

}  // namespace
}  // namespace zest::model
