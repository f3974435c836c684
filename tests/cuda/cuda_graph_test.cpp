// CUDA graphs of decode steps in the CUDA decoder (model::DeviceDecodeOptions): a schedule of decode steps with growing
// contexts (crossing context buckets) and a batch composition that changes every few steps gives bit-identical
// logits and identical sampled tokens whether the steps replay graphs or launch the same kernels eagerly
// ("eager": the graphs' context bounds without graphs). Checked on the tiny MoE fixture (generic paged attention)
// and on a random-weight model of the Qwen3-30B-A3B shapes cut to 2 layers (decode attention with its bucketed
// bound, the decode MoE kernels), with and without SERE re-routing on the device, through forward (logits) and
// forward_sample (greedy, temperature and top-k/top-p rows), three times, each run over a KV cache of its own
// (graphs captured over another cache must not replay), the third keeping at most 2 graphs (LRU eviction). A replay really happened: the decoder's graph launch
// counter grows. Padded graphs (graph_padding): steps of 3, 5, 6, 7, 11 and 13 sequences replayed as steps of
// 4, 8, 12 and 16 rows (contexts of about 200 and 2000 tokens), and of 17 to 57 sequences as steps of 24 to 64 rows,
// give the unpadded eager steps' logits bit for bit, the same sampled tokens, the same K/V of the real tokens and the
// same SERE statistics, with fewer graphs captured than without padding; so do steps of 65 to 96 sequences as 80 and
// 96 rows, and models with 3 and 12 kv heads. Also forward_sample against forward on one
// prefill step, whole-row fallbacks included. Programmatic dependent launches (on by default) give the bits of
// steps without them, eager and replayed, prefill and decode steps of 1 and of several sequences. A new SERE spec made
// at the address of an earlier one is uploaded and captured anew (device state is keyed by the spec's id).
#if defined(ZEST_HAVE_CUDA)
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda.h"
#include "backend/cuda/cuda_decoder.h"
#include "core/dtype.h"
#include "engine/model_bundle.h"
#include "kernels/backend.h"
#include "kernels/cuda/kernels.h"
#include "model/decoder.h"
#include "model/random_weights.h"
#include "model/sampling.h"

namespace zest::cuda::test {
namespace {

using Graphs = model::DeviceDecodeOptions::Graphs;

// How one decoder runs its decode steps within a scope (set_decode_options), the defaults after it.
struct DecodeScope {
  DecodeScope(const model::TextDecoder& d, Graphs graphs, bool padding = true, int cap = 256) : dec(d) {
    model::DeviceDecodeOptions o;
    o.graphs = graphs;
    o.graph_padding = padding;
    o.graph_cap = cap;
    const Status st = set_decode_options(dec, o);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  ~DecodeScope() { EXPECT_TRUE(set_decode_options(dec, {}).is_ok()); }
  DecodeScope(const DecodeScope&) = delete;
  DecodeScope& operator=(const DecodeScope&) = delete;
  const model::TextDecoder& dec;
};

struct Trace {
  std::vector<std::vector<float>> logits;  // forward: every decode step's logits
  std::vector<int32_t> tokens;             // every sampled token, in step order
};

// 7 sequences with prompts of 3 .. 300 tokens are prefilled one at a time, then 36 decode steps run; the set of
// sequences in a step changes every 3 steps, so each (batch, context bucket) key recurs and gets captured and
// replayed. The next token of a sequence is the argmax of its logits (forward) or its sampled token.
// The cache stays alive in *keep, so that the next run's cache is at another address.
void run_schedule(const model::TextDecoder& dec, bool sample, const model::MoeHooks* hooks, Trace& out,
                  std::vector<std::unique_ptr<model::PagedKVCache>>* keep) {
  const int64_t V = dec.config().vocab_size;
  const int lens[] = {3, 17, 40, 100, 250, 255, 300};
  constexpr int kSeqs = 7, kSteps = 36;
  auto cache = dec.allocate_cache(kSeqs * ((300 + kSteps) / 16 + 2), 16);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  keep->push_back(std::make_unique<model::PagedKVCache>(std::move(cache).value()));
  model::PagedKVCache* kv = keep->back().get();
  std::mt19937 rng(17);
  std::vector<std::vector<int32_t>> tables(kSeqs);
  std::vector<int64_t> ctx(kSeqs);
  std::vector<int32_t> next(kSeqs);
  for (int j = 0; j < kSeqs; ++j) {
    ASSERT_TRUE(kv->reserve(tables[j], lens[j] + kSteps + 1).is_ok());
    model::ForwardBatch b;
    for (int i = 0; i < lens[j]; ++i) b.tokens.push_back(static_cast<int32_t>(rng() % V));
    b.positions.resize(3 * lens[j]);
    for (int a = 0; a < 3; ++a)
      for (int i = 0; i < lens[j]; ++i) b.positions[a * lens[j] + i] = i;
    b.seqs.push_back({&tables[j], 0, lens[j], false, true});
    auto l = dec.forward(b, *kv, hooks);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    next[j] = static_cast<int32_t>(std::max_element(l->data<float>(), l->data<float>() + V) - l->data<float>());
    ctx[j] = lens[j];
  }
  std::mt19937_64 urng(5);
  for (int step = 0; step < kSteps; ++step) {
    model::ForwardBatch b;
    std::vector<int> members;
    for (int j = 0; j < kSeqs; ++j)
      if ((step / 3 + j) % 3 != 0) members.push_back(j);
    const int n = static_cast<int>(members.size());
    b.positions.resize(3 * n);
    std::vector<model::SampleRow> rows;
    for (int i = 0; i < n; ++i) {
      const int j = members[i];
      b.tokens.push_back(next[j]);
      for (int a = 0; a < 3; ++a) b.positions[a * n + i] = static_cast<int32_t>(ctx[j]);
      b.seqs.push_back({&tables[j], ctx[j], 1, false, true});
      model::SampleRow row;
      switch (j % 3) {
        case 0: row = model::plan_sample_row(0.0, 0, 1.0, V); break;
        case 1: row = model::plan_sample_row(0.8, 0, 1.0, V); break;
        default: row = model::plan_sample_row(1.0, 20, 0.9, V); break;
      }
      if (row.mode != model::SampleMode::kGreedy) row.u = std::uniform_real_distribution<double>(0.0, 1.0)(urng);
      rows.push_back(row);
    }
    if (sample) {
      auto r = dec.forward_sample(b, *kv, hooks, rows);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      ASSERT_EQ(r->size(), static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) {
        const int32_t tok = model::pick_from_summary(rows[i], (*r)[i], V);
        ASSERT_GE(tok, 0);
        ASSERT_LT(tok, V);
        next[members[i]] = tok;
        out.tokens.push_back(tok);
      }
    } else {
      auto l = dec.forward(b, *kv, hooks);
      ASSERT_TRUE(l.ok()) << l.status().to_string();
      out.logits.emplace_back(l->data<float>(), l->data<float>() + n * V);
      for (int i = 0; i < n; ++i) {
        const float* row = l->data<float>() + i * V;
        next[members[i]] = static_cast<int32_t>(std::max_element(row, row + V) - row);
        out.tokens.push_back(next[members[i]]);
      }
    }
    for (int j : members) ++ctx[j];
  }
}

void expect_graphs_equal_eager(const model::TextDecoder& dec, const model::MoeHooks* hooks, const std::string& what) {
  for (bool sample : {false, true}) {
    SCOPED_TRACE(what + (sample ? " forward_sample" : " forward"));
    Trace eager;
    std::vector<std::unique_ptr<model::PagedKVCache>> keep;
    {
      DecodeScope scope(dec, Graphs::kEager);
      run_schedule(dec, sample, hooks, eager, &keep);
    }
    // Twice: the second run has a KV cache of its own, so graphs captured over the first cache must not replay.
    // Then a third time keeping at most 2 instantiated graphs (least recently used ones destroyed and captured
    // again).
    for (int rep = 0; rep < 3; ++rep) {
      SCOPED_TRACE("graph run " + std::to_string(rep));
      Trace graphs;
      const int64_t before = decode_graph_launches();
      {
        DecodeScope scope(dec, Graphs::kOn, true, rep == 2 ? 2 : 256);
        run_schedule(dec, sample, hooks, graphs, &keep);
      }
      EXPECT_GE(decode_graph_launches() - before, 12) << "decode steps were not replayed from graphs";
      ASSERT_EQ(eager.tokens.size(), graphs.tokens.size());
      EXPECT_EQ(eager.tokens, graphs.tokens);
      ASSERT_EQ(eager.logits.size(), graphs.logits.size());
      for (size_t s = 0; s < eager.logits.size(); ++s) {
        ASSERT_EQ(eager.logits[s].size(), graphs.logits[s].size());
        size_t diff = 0;
        for (size_t i = 0; i < eager.logits[s].size(); ++i) diff += eager.logits[s][i] != graphs.logits[s][i];
        EXPECT_EQ(diff, 0u) << "step " << s;
      }
    }
  }
}

// A random-weight decoder of the Qwen3-30B-A3B shapes cut to 2 layers (weights drawn from `seed`).
// kv_heads > 0: that many kv heads, 8 query heads each (the fused decode attention's grouping).
std::unique_ptr<model::TextDecoder> random_30b_decoder(uint64_t seed, io::ModelConfig* cfg_out = nullptr,
                                                       int kv_heads = 0) {
  auto cfg = model::named_model_config("qwen3-30b-a3b", 2);
  EXPECT_TRUE(cfg.ok()) << cfg.status().to_string();
  if (!cfg.ok()) return nullptr;
  if (kv_heads > 0) {
    cfg->text.num_kv_heads = kv_heads;
    cfg->text.num_heads = 8 * kv_heads;
  }
  if (cfg_out) *cfg_out = *cfg;
  model::RandomTensors store(seed);
  const model::DecoderWeights w = model::random_decoder_weights(cfg->text, store, 0, 8);
  auto d = model::create_cuda_decoder(w);
  EXPECT_TRUE(d.ok()) << d.status().to_string();
  return d.ok() ? std::move(*d) : nullptr;
}

// SERE S = 2 of top-8 with rho = 0 and a random symmetric similarity per layer (drawn from `seed`).
model::RerouteSpec random_sere_spec(const io::TextConfig& c, uint32_t seed) {
  const int64_t E = c.num_experts, L = c.num_layers;
  model::RerouteSpec spec;
  spec.params.primary = 2;
  spec.params.layer_thresholds.assign(L, 0.f);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (int64_t l = 0; l < L; ++l) {
    std::vector<float> sim(E * E);
    for (int64_t a = 0; a < E; ++a)
      for (int64_t b = 0; b <= a; ++b) sim[a * E + b] = sim[b * E + a] = a == b ? 1.f : u(rng);
    spec.similarity.push_back(std::move(sim));
  }
  return spec;
}

// Hooks that re-route on the device with `spec`; the host hook must never be called (every token is active).
model::MoeHooks device_sere_hooks(const model::RerouteSpec* spec) {
  model::MoeHooks hooks;
  hooks.reroute = spec;
  hooks.route = [](int64_t, int32_t*, float*, int64_t, int64_t, const std::vector<uint8_t>&) {
    ADD_FAILURE() << "host re-routing called although every token is active";
  };
  return hooks;
}

TEST(CudaGraph, DecodeReplayEqualsEagerOnTinyFixture) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
  auto m = engine::ModelBundle::load(std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_moe_tiny", model::Backend::kCuda);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  expect_graphs_equal_eager((*m)->decoder(), nullptr, "qwen3_moe_tiny");
}

TEST(CudaGraph, DecodeReplayEqualsEagerOnRandomModel) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
  io::ModelConfig cfg;
  std::unique_ptr<model::TextDecoder> dec = random_30b_decoder(7, &cfg);
  ASSERT_TRUE(dec);
  expect_graphs_equal_eager(*dec, nullptr, "random qwen3-30b-a3b x2");
  // SERE on the device (S = 2 of top-8, random symmetric similarity): graphs keyed by the spec.
  const model::RerouteSpec spec = random_sere_spec(cfg.text, 3);
  const model::MoeHooks hooks = device_sere_hooks(&spec);
  expect_graphs_equal_eager(*dec, &hooks, "random qwen3-30b-a3b x2, SERE S=2");
}

// One engine after another (zest eval's sweeps) hands the decoder a new SERE spec, often at the address of the one
// before it. A spec made in the same storage with another similarity must be uploaded again and get graphs of its
// own: the run gives the bits of a decoder that only ever saw the second spec.
TEST(CudaGraph, NewSpecAtTheSameAddressIsNotTheOldOne) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
  io::ModelConfig cfg;
  std::unique_ptr<model::TextDecoder> dec = random_30b_decoder(13, &cfg);
  std::unique_ptr<model::TextDecoder> fresh = random_30b_decoder(13);
  ASSERT_TRUE(dec && fresh);
  std::vector<std::unique_ptr<model::PagedKVCache>> keep;
  std::optional<model::RerouteSpec> spec(random_sere_spec(cfg.text, 3));
  const void* first_address = &*spec;
  model::MoeHooks hooks = device_sere_hooks(&*spec);
  Trace first, second, ref;
  run_schedule(*dec, true, &hooks, first, &keep);
  spec.reset();
  spec.emplace(random_sere_spec(cfg.text, 4));
  ASSERT_EQ(first_address, static_cast<const void*>(&*spec));
  hooks = device_sere_hooks(&*spec);
  run_schedule(*dec, true, &hooks, second, &keep);
  run_schedule(*fresh, true, &hooks, ref, &keep);
  EXPECT_EQ(second.tokens, ref.tokens);
  EXPECT_NE(first.tokens, second.tokens) << "the two similarities should route differently";
}

// ---- programmatic dependent launches (set_programmatic_launch) -------------------------------------------------------

struct PdlScope {
  explicit PdlScope(bool on) : saved(programmatic_launch()) { set_programmatic_launch(on); }
  ~PdlScope() { set_programmatic_launch(saved); }
  bool saved;
};

// One sequence of 37 prompt tokens, then 24 decode steps of one token (the one-token path: the experts' down kernel
// by rows, the norms folded into the qkv GEMM and the lm_head); appended to `out` like run_schedule's steps.
void run_solo(const model::TextDecoder& dec, bool sample, const model::MoeHooks* hooks, Trace& out,
              std::vector<std::unique_ptr<model::PagedKVCache>>* keep) {
  const int64_t V = dec.config().vocab_size;
  constexpr int kPrompt = 37, kSteps = 24;
  auto cache = dec.allocate_cache(8, 16);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  keep->push_back(std::make_unique<model::PagedKVCache>(std::move(cache).value()));
  model::PagedKVCache* kv = keep->back().get();
  std::vector<int32_t> table;
  ASSERT_TRUE(kv->reserve(table, kPrompt + kSteps + 1).is_ok());
  std::mt19937 rng(23);
  model::ForwardBatch p;
  for (int i = 0; i < kPrompt; ++i) p.tokens.push_back(static_cast<int32_t>(rng() % V));
  p.positions.resize(3 * kPrompt);
  for (int a = 0; a < 3; ++a)
    for (int i = 0; i < kPrompt; ++i) p.positions[a * kPrompt + i] = i;
  p.seqs.push_back({&table, 0, kPrompt, false, true});
  auto l = dec.forward(p, *kv, hooks);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  int32_t next = static_cast<int32_t>(std::max_element(l->data<float>(), l->data<float>() + V) - l->data<float>());
  std::mt19937_64 urng(9);
  for (int step = 0; step < kSteps; ++step) {
    const int64_t ctx = kPrompt + step;
    model::ForwardBatch b;
    b.tokens = {next};
    b.positions = {static_cast<int32_t>(ctx), static_cast<int32_t>(ctx), static_cast<int32_t>(ctx)};
    b.seqs.push_back({&table, ctx, 1, false, true});
    if (sample) {
      model::SampleRow row = step % 2 ? model::plan_sample_row(0.8, 0, 1.0, V) : model::plan_sample_row(0.0, 0, 1.0, V);
      if (row.mode != model::SampleMode::kGreedy) row.u = std::uniform_real_distribution<double>(0.0, 1.0)(urng);
      auto r = dec.forward_sample(b, *kv, hooks, {row});
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      next = model::pick_from_summary(row, (*r)[0], V);
      ASSERT_GE(next, 0);
    } else {
      auto d = dec.forward(b, *kv, hooks);
      ASSERT_TRUE(d.ok()) << d.status().to_string();
      out.logits.emplace_back(d->data<float>(), d->data<float>() + V);
      next = static_cast<int32_t>(std::max_element(d->data<float>(), d->data<float>() + V) - d->data<float>());
    }
    out.tokens.push_back(next);
  }
}

// Programmatic launches (on by default) let a kernel's prologue overlap the previous kernel's tail; every kernel
// waits before it touches memory, so the steps give the same bits with them and without: prefill steps, decode steps
// of 1 and of 4-5 sequences, logits and sampled tokens, eager and replayed from graphs, against eager steps with
// programmatic launches off.
void expect_pdl_equal(const model::TextDecoder& dec, const model::MoeHooks* hooks, const std::string& what) {
  for (bool sample : {false, true}) {
    SCOPED_TRACE(what + (sample ? " forward_sample" : " forward"));
    std::vector<std::unique_ptr<model::PagedKVCache>> keep;
    Trace ref;
    {
      PdlScope pdl(false);
      DecodeScope scope(dec, Graphs::kEager);
      run_schedule(dec, sample, hooks, ref, &keep);
      run_solo(dec, sample, hooks, ref, &keep);
    }
    for (Graphs mode : {Graphs::kEager, Graphs::kOn}) {
      SCOPED_TRACE(std::string("programmatic launches, ") + (mode == Graphs::kOn ? "graphs replayed" : "eager"));
      Trace on;
      {
        PdlScope pdl(true);
        DecodeScope scope(dec, mode);
        run_schedule(dec, sample, hooks, on, &keep);
        run_solo(dec, sample, hooks, on, &keep);
      }
      EXPECT_EQ(ref.tokens, on.tokens);
      ASSERT_EQ(ref.logits.size(), on.logits.size());
      for (size_t s = 0; s < ref.logits.size(); ++s) {
        ASSERT_EQ(ref.logits[s].size(), on.logits[s].size());
        size_t diff = 0;
        for (size_t i = 0; i < ref.logits[s].size(); ++i) diff += ref.logits[s][i] != on.logits[s][i];
        EXPECT_EQ(diff, 0u) << "step " << s;
      }
    }
  }
}

TEST(CudaGraph, ProgrammaticLaunchesGiveTheSameBits) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
  io::ModelConfig cfg;
  std::unique_ptr<model::TextDecoder> dec = random_30b_decoder(11, &cfg);
  ASSERT_TRUE(dec);
  expect_pdl_equal(*dec, nullptr, "random qwen3-30b-a3b x2");
  const model::RerouteSpec spec = random_sere_spec(cfg.text, 5);
  const model::MoeHooks hooks = device_sere_hooks(&spec);
  expect_pdl_equal(*dec, &hooks, "random qwen3-30b-a3b x2, SERE S=2");
  auto m = engine::ModelBundle::load(std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_moe_tiny", model::Backend::kCuda);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  expect_pdl_equal((*m)->decoder(), nullptr, "qwen3_moe_tiny");
}

// ---- padded decode graphs (graph_padding) ----------------------------------------------------------

struct PadRun {
  Trace trace;
  std::vector<std::vector<int32_t>> tables;  // block tables of the sequences
  std::vector<int64_t> ctx;                  // their final context lengths
  model::PagedKVCache* kv = nullptr;
  int64_t launches = 0, captures = 0;        // graph launches and captures during the decode steps
};

// Batch sizes of the decode steps, cycled: all but 1 and 16 off the padding ladder (3 -> 4, 5/6/7 -> 8, 11 -> 12,
// 13 -> 16).
const std::vector<int> kPadSizes = {3, 5, 13, 6, 11, 7, 16, 1};

// max(sizes) sequences with prompts of base .. base + 79 tokens are prefilled one at a time (eagerly), then decode
// steps run with the batch sizes `sizes` (three rounds), the members of a step a rotating window over the sequences.
// Contexts stay within one context bucket (base 140: 129 .. 256 tokens; base 1850: 1793 .. 2048), so each batch size
// recurs under one graph key. Next tokens as in run_schedule.
void run_padded_schedule(const model::TextDecoder& dec, bool sample, const model::MoeHooks* hooks, PadRun& out,
                         std::vector<std::unique_ptr<model::PagedKVCache>>* keep, const std::vector<int>& sizes,
                         int base) {
  const int64_t V = dec.config().vocab_size;
  const int kSeqs = *std::max_element(sizes.begin(), sizes.end()), kSteps = 3 * static_cast<int>(sizes.size());
  ASSERT_LE(kSteps, 36);
  auto cache = dec.allocate_cache(kSeqs * ((base + 80 + kSteps) / 16 + 2), 16);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  keep->push_back(std::make_unique<model::PagedKVCache>(std::move(cache).value()));
  out.kv = keep->back().get();
  std::mt19937 rng(29);
  out.tables.assign(kSeqs, {});
  out.ctx.assign(kSeqs, 0);
  std::vector<int32_t> next(kSeqs);
  for (int j = 0; j < kSeqs; ++j) {
    const int len = base + static_cast<int>(rng() % 80);
    ASSERT_TRUE(out.kv->reserve(out.tables[j], len + kSteps).is_ok());
    model::ForwardBatch b;
    for (int i = 0; i < len; ++i) b.tokens.push_back(static_cast<int32_t>(rng() % V));
    b.positions.resize(3 * len);
    for (int a = 0; a < 3; ++a)
      for (int i = 0; i < len; ++i) b.positions[a * len + i] = i;
    b.seqs.push_back({&out.tables[j], 0, len, false, true});
    auto l = dec.forward(b, *out.kv, hooks);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    next[j] = static_cast<int32_t>(std::max_element(l->data<float>(), l->data<float>() + V) - l->data<float>());
    out.ctx[j] = len;
  }
  const int64_t launches0 = decode_graph_launches(), captures0 = decode_graph_captures();
  std::mt19937_64 urng(9);
  for (int step = 0; step < kSteps; ++step) {
    const int n = sizes[step % sizes.size()];
    std::vector<int> members;
    for (int i = 0; i < n; ++i) members.push_back((step * 5 + i) % kSeqs);
    model::ForwardBatch b;
    b.positions.resize(3 * n);
    std::vector<model::SampleRow> rows;
    for (int i = 0; i < n; ++i) {
      const int j = members[i];
      b.tokens.push_back(next[j]);
      for (int a = 0; a < 3; ++a) b.positions[a * n + i] = static_cast<int32_t>(out.ctx[j]);
      b.seqs.push_back({&out.tables[j], out.ctx[j], 1, false, true});
      model::SampleRow row;
      switch (j % 3) {
        case 0: row = model::plan_sample_row(0.0, 0, 1.0, V); break;
        case 1: row = model::plan_sample_row(0.8, 0, 1.0, V); break;
        default: row = model::plan_sample_row(1.0, 20, 0.9, V); break;
      }
      if (row.mode != model::SampleMode::kGreedy) row.u = std::uniform_real_distribution<double>(0.0, 1.0)(urng);
      rows.push_back(row);
    }
    if (sample) {
      auto r = dec.forward_sample(b, *out.kv, hooks, rows);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      ASSERT_EQ(r->size(), static_cast<size_t>(n)) << "padding rows reached the caller";
      for (int i = 0; i < n; ++i) {
        const int32_t tok = model::pick_from_summary(rows[i], (*r)[i], V);
        ASSERT_GE(tok, 0);
        ASSERT_LT(tok, V);
        next[members[i]] = tok;
        out.trace.tokens.push_back(tok);
      }
    } else {
      auto l = dec.forward(b, *out.kv, hooks);
      ASSERT_TRUE(l.ok()) << l.status().to_string();
      ASSERT_EQ(l->dim(0), n) << "padding rows reached the caller";
      out.trace.logits.emplace_back(l->data<float>(), l->data<float>() + n * V);
      for (int i = 0; i < n; ++i) {
        const float* row = l->data<float>() + i * V;
        next[members[i]] = static_cast<int32_t>(std::max_element(row, row + V) - row);
        out.trace.tokens.push_back(next[members[i]]);
      }
    }
    for (int j : members) ++out.ctx[j];
  }
  out.launches = decode_graph_launches() - launches0;
  out.captures = decode_graph_captures() - captures0;
}

// Differing K/V rows (bf16 bits) of every real token of the sequences (positions < ctx), over all layers.
size_t kv_rows_differing(const model::TextDecoder& dec, const PadRun& a, const PadRun& b) {
  std::vector<uint16_t> ka, kb;
  EXPECT_TRUE(decode_kv_cache_copy(*a.kv, &ka).is_ok());
  EXPECT_TRUE(decode_kv_cache_copy(*b.kv, &kb).is_ok());
  EXPECT_EQ(ka.size(), kb.size());
  if (ka.size() != kb.size() || ka.empty()) return SIZE_MAX;
  const auto& c = dec.config();
  const size_t row = static_cast<size_t>(c.num_kv_heads * c.head_dim);
  const size_t per_half = ka.size() / (2 * static_cast<size_t>(c.num_layers));  // one layer's K (or V)
  size_t diff = 0;
  for (size_t j = 0; j < a.tables.size(); ++j) {
    EXPECT_EQ(a.tables[j], b.tables[j]);
    EXPECT_EQ(a.ctx[j], b.ctx[j]);
    for (int64_t p = 0; p < a.ctx[j]; ++p) {
      const size_t slot = static_cast<size_t>(a.tables[j][p / 16]) * 16 + p % 16;
      for (size_t h = 0; h < 2 * static_cast<size_t>(c.num_layers); ++h) {
        const size_t off = h * per_half + slot * row;
        diff += !std::equal(ka.begin() + off, ka.begin() + off + row, kb.begin() + off);
      }
    }
  }
  return diff;
}

// Padded graph replays against unpadded eager steps of the same schedule (Graphs::kEager: the graphs' context
// buckets; graph_padding false): the real rows' logits bit for bit, the same sampled tokens, the
// same K/V of every real token, and, with SERE on the device, the same re-routing statistics (padding rows are not
// counted). Also unpadded graph replays against the same reference, and fewer graphs captured with padding than
// without over the schedule.
void expect_padded_equal_unpadded(const model::TextDecoder& dec, const model::MoeHooks* hooks, const std::string& what,
                                  const std::vector<int>& sizes = kPadSizes, int base = 140) {
  for (bool sample : {false, true}) {
    SCOPED_TRACE(what + (sample ? " forward_sample" : " forward"));
    std::vector<std::unique_ptr<model::PagedKVCache>> keep;
    PadRun ref, padded, unpadded;
    std::vector<accel::RerouteCounts> c0, c1, c2;
    auto counts = [&](std::vector<accel::RerouteCounts>& c) {
      auto r = dec.reroute_counts();
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      c = *r;
    };
    counts(c0);
    {
      DecodeScope scope(dec, Graphs::kEager, false);
      run_padded_schedule(dec, sample, hooks, ref, &keep, sizes, base);
    }
    counts(c1);
    {
      DecodeScope scope(dec, Graphs::kOn, true);
      run_padded_schedule(dec, sample, hooks, padded, &keep, sizes, base);
    }
    counts(c2);
    {
      DecodeScope scope(dec, Graphs::kOn, false);
      run_padded_schedule(dec, sample, hooks, unpadded, &keep, sizes, base);
    }
    EXPECT_EQ(ref.launches, 0);
    EXPECT_GE(padded.launches, 12) << "padded decode steps were not replayed from graphs";
    EXPECT_GE(unpadded.launches, 12);
    EXPECT_GT(padded.captures, 0);
    EXPECT_LT(padded.captures, unpadded.captures) << "padding did not reduce the graphs captured";
    for (const PadRun* run : {&padded, &unpadded}) {
      SCOPED_TRACE(run == &padded ? "padded graphs" : "unpadded graphs");
      EXPECT_EQ(ref.trace.tokens, run->trace.tokens);
      ASSERT_EQ(ref.trace.logits.size(), run->trace.logits.size());
      for (size_t st = 0; st < ref.trace.logits.size(); ++st) {
        ASSERT_EQ(ref.trace.logits[st].size(), run->trace.logits[st].size());
        size_t diff = 0;
        for (size_t i = 0; i < ref.trace.logits[st].size(); ++i) diff += ref.trace.logits[st][i] != run->trace.logits[st][i];
        EXPECT_EQ(diff, 0u) << "step " << st << " (" << sizes[st % sizes.size()] << " sequences)";
      }
      EXPECT_EQ(kv_rows_differing(dec, ref, *run), 0u) << "K/V rows of real tokens differ";
    }
    // SERE statistics of the padded run equal the unpadded eager run's (all zero without SERE).
    ASSERT_EQ(c0.size(), c1.size());
    ASSERT_EQ(c1.size(), c2.size());
    for (size_t l = 0; l < c0.size(); ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      EXPECT_EQ(c1[l].steps - c0[l].steps, c2[l].steps - c1[l].steps);
      EXPECT_EQ(c1[l].distinct_before - c0[l].distinct_before, c2[l].distinct_before - c1[l].distinct_before);
      EXPECT_EQ(c1[l].distinct_after - c0[l].distinct_after, c2[l].distinct_after - c1[l].distinct_after);
      EXPECT_EQ(c1[l].critical - c0[l].critical, c2[l].critical - c1[l].critical);
      EXPECT_EQ(c1[l].rerouted_slots - c0[l].rerouted_slots, c2[l].rerouted_slots - c1[l].rerouted_slots);
      EXPECT_EQ(c1[l].slots - c0[l].slots, c2[l].slots - c1[l].slots);
      if (hooks) {
        EXPECT_GT(c1[l].slots - c0[l].slots, 0);
      }
    }
  }
}

TEST(CudaGraph, PaddedReplayEqualsUnpaddedEagerOnTinyFixture) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
  auto m = engine::ModelBundle::load(std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_moe_tiny", model::Backend::kCuda);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  expect_padded_equal_unpadded((*m)->decoder(), nullptr, "qwen3_moe_tiny");
}

TEST(CudaGraph, PaddedReplayEqualsUnpaddedEagerOnRandomModel) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
  io::ModelConfig cfg;
  std::unique_ptr<model::TextDecoder> dec = random_30b_decoder(11, &cfg);
  ASSERT_TRUE(dec);
  expect_padded_equal_unpadded(*dec, nullptr, "random qwen3-30b-a3b x2");
  // Contexts of about 2k tokens: decode attention with up to 16 splits, its split plan made for the row class.
  expect_padded_equal_unpadded(*dec, nullptr, "random qwen3-30b-a3b x2, 2k contexts", kPadSizes, 1850);
  const model::RerouteSpec spec = random_sere_spec(cfg.text, 4);
  const model::MoeHooks hooks = device_sere_hooks(&spec);
  expect_padded_equal_unpadded(*dec, &hooks, "random qwen3-30b-a3b x2, SERE S=2");
}

// Above 16 rows the projections run through cuBLASLt, its algorithm chosen for the row class (rows_class): padded
// steps (17/21 -> 24, 26 -> 32, 33 -> 40, 45 -> 48, 57 -> 64 rows) give the unpadded steps' bits.
TEST(CudaGraph, PaddedAbove16RowsOnRandomModel) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
  std::unique_ptr<model::TextDecoder> dec = random_30b_decoder(13);
  ASSERT_TRUE(dec);
  expect_padded_equal_unpadded(*dec, nullptr, "random qwen3-30b-a3b x2, 17-57 sequences", {17, 21, 33, 26, 45, 57});
}

// Above 64 rows the ladder goes in steps of 16: steps of 65 to 96 sequences (contexts of about 200 tokens) replayed
// as 80 and 96 rows give the unpadded steps' bits, as below 64.
TEST(CudaGraph, PaddedAbove64RowsOnRandomModel) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
  std::unique_ptr<model::TextDecoder> dec = random_30b_decoder(17);
  ASSERT_TRUE(dec);
  expect_padded_equal_unpadded(*dec, nullptr, "random qwen3-30b-a3b x2, 65-96 sequences", {70, 90, 65, 81, 75, 96});
}

// sere_stats with the row count on the device counts the first n rows only (what a padded step passes).
// Padding with kv-head counts off the powers of two: 3 (the fused kernel's merges only) and 12 (the bulk-copy ring
// as well, in groups of 4), 8 query heads per kv head; every attention choice is made for the padded row class.
TEST(CudaGraph, PaddedReplayEqualsUnpaddedEagerWithOtherKvHeadCounts) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
  for (int kv : {3, 12}) {
    std::unique_ptr<model::TextDecoder> dec = random_30b_decoder(19 + kv, nullptr, kv);
    ASSERT_TRUE(dec);
    expect_padded_equal_unpadded(*dec, nullptr, "random qwen3-30b-a3b x2, " + std::to_string(kv) + " kv heads");
  }
}

TEST(CudaGraph, SereStatsCountsRowsGivenOnDevice) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
  std::mt19937 rng(31);
  const int N = 24, K = 8, E = 64, S = 2;
  for (int n : {1, 13, 24, 40}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<int32_t> before(N * K), after(N * K);
    for (int i = 0; i < N * K; ++i) {
      before[i] = static_cast<int32_t>(rng() % E);
      after[i] = rng() % 3 == 0 ? static_cast<int32_t>(rng() % E) : (rng() % 5 == 0 ? -1 : before[i]);
    }
    int32_t *db = nullptr, *da = nullptr, *dn = nullptr;
    int64_t* dc = nullptr;
    ASSERT_EQ(cudaMalloc(&db, N * K * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&da, N * K * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dn, 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dc, 6 * 8), cudaSuccess);
    cudaMemcpy(db, before.data(), N * K * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(da, after.data(), N * K * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dn, &n, 4, cudaMemcpyHostToDevice);
    cudaMemset(dc, 0, 6 * 8);
    EXPECT_TRUE(sere_stats(db, da, N, K, S, E, dc, nullptr, dn).is_ok());
    int64_t got[6] = {};
    ASSERT_EQ(cudaMemcpy(got, dc, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(db);
    cudaFree(da);
    cudaFree(dn);
    cudaFree(dc);
    const int rows = std::min(n, N);
    std::vector<int> bset(E, 0), aset(E, 0), pset(E, 0);
    int64_t rerouted = 0;
    for (int i = 0; i < rows * K; ++i) {
      bset[before[i]] = 1;
      if (after[i] >= 0) aset[after[i]] = 1;
      if (i % K < S) pset[before[i]] = 1;
      rerouted += after[i] != before[i];
    }
    const int64_t db_n = std::count(bset.begin(), bset.end(), 1), da_n = std::count(aset.begin(), aset.end(), 1),
                  dp_n = std::count(pset.begin(), pset.end(), 1);
    EXPECT_EQ(got[0], 1);
    EXPECT_EQ(got[1], db_n);
    EXPECT_EQ(got[2], da_n);
    EXPECT_EQ(got[3], da_n - dp_n);
    EXPECT_EQ(got[4], rerouted);
    EXPECT_EQ(got[5], static_cast<int64_t>(rows) * K);
  }
}

// forward_sample against forward on the same prefill step (not graphed; the same kernels up to lm_head): greedy
// rows give the argmax of the logits, candidate rows the host summary's pick, rows that ask for the whole row
// (top_k > 1024) or whose top-p mass is not inside the 1024 candidates (a flat distribution) get the logits row
// bit for bit, and rows of chunks that do not sample get nothing.
TEST(CudaGraph, ForwardSampleMatchesForwardAndFallsBackToWholeRows) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
  auto m = engine::ModelBundle::load(std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_moe_tiny", model::Backend::kCuda);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const model::TextDecoder& dec = (*m)->decoder();
  const int64_t V = dec.config().vocab_size;
  auto c1 = dec.allocate_cache(64, 16), c2 = dec.allocate_cache(64, 16);
  ASSERT_TRUE(c1.ok() && c2.ok());
  std::mt19937 rng(23);
  const int lens[] = {5, 9, 30, 2, 14, 7};
  constexpr int kSeqs = 6;
  std::vector<std::vector<int32_t>> t1(kSeqs), t2(kSeqs);
  model::ForwardBatch b1, b2;
  int total = 0;
  for (int len : lens) total += len;
  b1.positions.resize(3 * total);
  int at = 0;
  for (int j = 0; j < kSeqs; ++j) {
    ASSERT_TRUE(c1->reserve(t1[j], lens[j]).is_ok());
    ASSERT_TRUE(c2->reserve(t2[j], lens[j]).is_ok());
    for (int i = 0; i < lens[j]; ++i, ++at) {
      b1.tokens.push_back(static_cast<int32_t>(rng() % V));
      for (int a = 0; a < 3; ++a) b1.positions[a * total + at] = i;
    }
    b1.seqs.push_back({&t1[j], 0, lens[j], false, true});
  }
  b2 = b1;
  for (int j = 0; j < kSeqs; ++j) b2.seqs[j].block_table = &t2[j];
  auto logits = dec.forward(b1, *c1);
  ASSERT_TRUE(logits.ok()) << logits.status().to_string();
  std::vector<model::SampleRow> rows(kSeqs);
  rows[0] = model::plan_sample_row(0.0, 0, 1.0, V);        // greedy
  rows[1] = model::plan_sample_row(1.0, 2000, 1.0, V);     // top_k > 1024: the whole row
  rows[2] = model::plan_sample_row(1000.0, 0, 0.999, V);   // flat: top-p not reached in 1024 candidates
  rows[3] = model::plan_sample_row(0.7, 30, 0.8, V);       // candidates decide
  rows[4].mode = model::SampleMode::kNone;                 // a chunk that does not sample
  rows[5] = model::plan_sample_row(0.9, 0, 0.5, V);        // top-p over the whole row
  for (int j = 0; j < kSeqs; ++j) rows[j].u = 0.1 + 0.15 * j;
  auto got = dec.forward_sample(b2, *c2, nullptr, rows);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), static_cast<size_t>(kSeqs));
  for (int j = 0; j < kSeqs; ++j) {
    SCOPED_TRACE("row " + std::to_string(j));
    const float* l = logits->data<float>() + j * V;
    const model::SampleResult& r = (*got)[j];
    if (rows[j].mode == model::SampleMode::kNone) {
      EXPECT_EQ(r.token, -1);
      EXPECT_TRUE(r.ids.empty() && r.logits.empty());
      continue;
    }
    const model::SampleResult ref = model::summarize_row(l, V, rows[j]);
    EXPECT_EQ(r.full, ref.full);
    if (ref.full) {
      ASSERT_EQ(r.logits.size(), static_cast<size_t>(V));
      size_t diff = 0;
      for (int64_t i = 0; i < V; ++i) diff += r.logits[i] != l[i];
      EXPECT_EQ(diff, 0u);
    } else if (rows[j].mode == model::SampleMode::kCandidates) {
      EXPECT_EQ(r.ids, ref.ids);
      EXPECT_EQ(r.logits, ref.logits);
    }
    EXPECT_EQ(model::pick_from_summary(rows[j], r, V), model::pick_from_summary(rows[j], ref, V));
  }
  EXPECT_TRUE((*got)[1].full);
  EXPECT_TRUE((*got)[2].full);
  EXPECT_FALSE((*got)[3].full);
  // Bad plans are rejected before anything runs.
  std::vector<model::SampleRow> short_rows(rows.begin(), rows.begin() + 2);
  EXPECT_EQ(dec.forward_sample(b2, *c2, nullptr, short_rows).status().code(), ErrorCode::kInvalidArgument);
}

// One prefill step of random tokens over sequences of lengths `lens`, set up twice with the same tokens and positions:
// b1 on cache c1 (for forward) and b2 on c2 (for forward_sample), both caches empty. Null if a cache fails.
struct TwinPrefill {
  std::optional<model::PagedKVCache> c1, c2;
  std::vector<std::vector<int32_t>> t1, t2;
  model::ForwardBatch b1, b2;
};
std::unique_ptr<TwinPrefill> twin_prefill(const model::TextDecoder& dec, const std::vector<int>& lens, std::mt19937& rng) {
  const int64_t V = dec.config().vocab_size;
  auto c1 = dec.allocate_cache(64, 16), c2 = dec.allocate_cache(64, 16);
  if (!c1.ok() || !c2.ok()) return nullptr;
  auto p = std::make_unique<TwinPrefill>();
  p->c1.emplace(std::move(c1).value());
  p->c2.emplace(std::move(c2).value());
  const size_t n = lens.size();
  p->t1.resize(n);
  p->t2.resize(n);
  int total = 0;
  for (int len : lens) total += len;
  p->b1.positions.resize(3 * total);
  int at = 0;
  for (size_t j = 0; j < n; ++j) {
    if (!p->c1->reserve(p->t1[j], lens[j]).is_ok() || !p->c2->reserve(p->t2[j], lens[j]).is_ok()) return nullptr;
    for (int i = 0; i < lens[j]; ++i, ++at) {
      p->b1.tokens.push_back(static_cast<int32_t>(rng() % V));
      for (int a = 0; a < 3; ++a) p->b1.positions[a * total + at] = i;
    }
    p->b1.seqs.push_back({&p->t1[j], 0, lens[j], false, true});
  }
  p->b2 = p->b1;
  for (size_t j = 0; j < n; ++j) p->b2.seqs[j].block_table = &p->t2[j];
  return p;
}

// forward_sample with logit edits and log-probabilities against forward on the same prefill step: the log-probability
// summary is the raw row's (log-sum-exp within 1e-5, the top ids and logits exact), the edits replace the logits the
// host formula gives (rounded to bf16) and save the raw ones, and the summaries (greedy, temperature, candidates, the
// whole row) are those of the edited row; a row without edits or logprobs in the same step is unchanged.
TEST(CudaGraph, ForwardSampleAppliesEditsAndLogprobs) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
  auto m = engine::ModelBundle::load(std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_moe_tiny", model::Backend::kCuda);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const model::TextDecoder& dec = (*m)->decoder();
  const int64_t V = dec.config().vocab_size;
  std::mt19937 rng(29);
  constexpr int kSeqs = 5;
  auto twin = twin_prefill(dec, {6, 11, 3, 8, 5}, rng);
  ASSERT_TRUE(twin);
  auto& [c1, c2, t1, t2, b1, b2] = *twin;
  auto logits = dec.forward(b1, *c1);
  ASSERT_TRUE(logits.ok()) << logits.status().to_string();
  std::vector<model::SampleRow> rows(kSeqs);
  rows[0] = model::plan_sample_row(0.0, 0, 1.0, V);     // greedy
  rows[1] = model::plan_sample_row(0.8, 0, 1.0, V);     // temperature
  rows[2] = model::plan_sample_row(0.7, 40, 0.9, V);    // candidates
  rows[3] = model::plan_sample_row(1.0, 2000, 1.0, V);  // the whole row
  rows[4] = model::plan_sample_row(0.9, 0, 1.0, V);     // neither edits nor logprobs
  std::uniform_real_distribution<float> u(0.f, 1.f);
  for (int j = 0; j < kSeqs; ++j) {
    rows[j].u = 0.2 + 0.15 * j;
    if (j == 4) continue;
    rows[j].logprobs = j == 3 ? -1 : (j * 7) % 21;
    for (int64_t id = static_cast<int64_t>(rng() % 5); id < V; id += 1 + static_cast<int64_t>(rng() % 9)) {
      model::LogitEdit e;
      e.id = static_cast<int32_t>(id);
      e.bias = rng() % 9 == 0 ? -INFINITY : -3.f + 6.f * u(rng);
      e.rep = 0.5f + u(rng);
      e.sub = -1.f + 2.f * u(rng);
      rows[j].edits.push_back(e);
    }
  }
  // The argmax of row 0 is masked, so greedy must move.
  {
    const float* l = logits->data<float>();
    const int32_t top = static_cast<int32_t>(std::max_element(l, l + V) - l);
    auto it = std::lower_bound(rows[0].edits.begin(), rows[0].edits.end(), top,
                               [](const model::LogitEdit& e, int32_t id) { return e.id < id; });
    if (it == rows[0].edits.end() || it->id != top) {
      model::LogitEdit e;
      e.id = top;
      it = rows[0].edits.insert(it, e);
    }
    it->bias = -INFINITY;
  }
  auto got = dec.forward_sample(b2, *c2, nullptr, rows);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), static_cast<size_t>(kSeqs));
  for (int j = 0; j < kSeqs; ++j) {
    SCOPED_TRACE("row " + std::to_string(j));
    const float* l = logits->data<float>() + j * V;
    const model::SampleResult& r = (*got)[j];
    std::vector<float> ed(l, l + V);
    for (const model::LogitEdit& e : rows[j].edits) ed[e.id] = round_bf16(model::apply_logit_edit(l[e.id], e));
    model::SampleRow plain = rows[j];
    plain.edits.clear();
    plain.logprobs = -1;
    const model::SampleResult ref = model::summarize_row(ed.data(), V, plain);
    if (rows[j].logprobs >= 0) {
      model::SampleResult lp;
      model::logprob_summary(l, V, rows[j].logprobs, lp);
      EXPECT_NEAR(r.lse, lp.lse, 1e-5);
      EXPECT_EQ(r.top_ids, lp.top_ids);
      EXPECT_EQ(r.top_logits, lp.top_logits);
    } else {
      EXPECT_TRUE(r.top_ids.empty());
    }
    ASSERT_EQ(r.edit_raw.size(), rows[j].edits.size());
    for (size_t k = 0; k < rows[j].edits.size(); ++k) ASSERT_EQ(r.edit_raw[k], l[rows[j].edits[k].id]);
    EXPECT_EQ(r.full, ref.full);
    if (ref.full) {
      ASSERT_EQ(r.logits.size(), static_cast<size_t>(V));
      size_t diff = 0;
      for (int64_t i = 0; i < V; ++i) diff += !(r.logits[i] == ed[i]);
      EXPECT_EQ(diff, 0u);
    } else if (rows[j].mode == model::SampleMode::kCandidates) {
      EXPECT_EQ(r.ids, ref.ids);
      EXPECT_EQ(r.logits, ref.logits);
    }
    const int32_t tok = model::pick_from_summary(rows[j], r, V);
    if (rows[j].mode == model::SampleMode::kGreedy) {
      EXPECT_EQ(tok, ref.token);
    } else if (rows[j].mode != model::SampleMode::kTemperature) {
      EXPECT_EQ(tok, model::pick_from_summary(plain, ref, V));
    }
    ASSERT_GE(tok, 0);
    EXPECT_EQ(model::raw_logit_of(rows[j], r, tok, V), l[tok]);
  }
}


// forward_sample with guided decoding's token masks against forward on the same prefill step: masked rows (greedy with
// its argmax left out, temperature, candidates, the whole row, one with edits and logprobs too) pick what the host
// reference (model::summarize_edited_row's order: edits rounded to bf16, then -inf outside the mask) picks from the
// same logits: greedy and candidates exactly, temperature an allowed token within the 1e-5 target window of the
// device's Z; every pick is allowed; log-probabilities stay the raw row's (log-sum-exp within 1e-5); a row without a
// mask in the same step is unchanged.
TEST(CudaGraph, ForwardSampleAppliesTokenMasks) {
  if (!kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available";
  auto m = engine::ModelBundle::load(std::string(ZEST_FIXTURES_DIR) + "/models/qwen3_moe_tiny", model::Backend::kCuda);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const model::TextDecoder& dec = (*m)->decoder();
  const int64_t V = dec.config().vocab_size;
  const int64_t W = (V + 31) / 32;
  std::mt19937 rng(31);
  constexpr int kSeqs = 6;
  auto twin = twin_prefill(dec, {4, 9, 3, 7, 5, 6}, rng);
  ASSERT_TRUE(twin);
  auto& [c1, c2, t1, t2, b1, b2] = *twin;
  auto logits = dec.forward(b1, *c1);
  ASSERT_TRUE(logits.ok()) << logits.status().to_string();
  std::vector<model::SampleRow> rows(kSeqs);
  rows[0] = model::plan_sample_row(0.0, 0, 1.0, V);     // greedy
  rows[1] = model::plan_sample_row(1.0, 0, 1.0, V);     // temperature
  rows[2] = model::plan_sample_row(0.7, 40, 0.9, V);    // candidates (fewer allowed tokens than 40 below)
  rows[3] = model::plan_sample_row(1.0, 2000, 1.0, V);  // the whole row
  rows[4] = model::plan_sample_row(0.9, 50, 1.0, V);    // candidates with edits and logprobs
  rows[5] = model::plan_sample_row(0.9, 0, 1.0, V);     // no mask
  for (int j = 0; j < kSeqs; ++j) {
    rows[j].u = 0.15 + 0.14 * j;
    if (j == 5) continue;
    auto mask = std::make_shared<std::vector<uint32_t>>(static_cast<size_t>(W), 0u);
    // Row 2: 25 allowed ids; the others: about a third of the vocabulary.
    const int64_t n = j == 2 ? 25 : V / 3;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t id = static_cast<int64_t>(rng() % V);
      (*mask)[id >> 5] |= 1u << (id & 31);
    }
    if (j == 0) {
      const float* l = logits->data<float>();
      const int64_t top = std::max_element(l, l + V) - l;
      (*mask)[top >> 5] &= ~(1u << (top & 31));
    }
    rows[j].allowed = mask;
  }
  rows[4].logprobs = 5;
  for (int64_t id = 3; id < V; id += 97) rows[4].edits.push_back({static_cast<int32_t>(id), 1.5f, 1.2f, 0.25f});
  auto got = dec.forward_sample(b2, *c2, nullptr, rows);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), static_cast<size_t>(kSeqs));
  for (int j = 0; j < kSeqs; ++j) {
    SCOPED_TRACE("row " + std::to_string(j));
    const float* l = logits->data<float>() + j * V;
    const model::SampleResult& r = (*got)[j];
    std::vector<float> ed(l, l + V);
    for (const model::LogitEdit& e : rows[j].edits) ed[e.id] = round_bf16(model::apply_logit_edit(l[e.id], e));
    if (rows[j].allowed) model::apply_token_mask(ed.data(), V, *rows[j].allowed);
    model::SampleRow plain = rows[j];
    plain.edits.clear();
    plain.logprobs = -1;
    plain.allowed = nullptr;
    const model::SampleResult ref = model::summarize_row(ed.data(), V, plain);
    if (rows[j].logprobs >= 0) {
      model::SampleResult lp;
      model::logprob_summary(l, V, rows[j].logprobs, lp);
      EXPECT_NEAR(r.lse, lp.lse, 1e-5);
      EXPECT_EQ(r.top_ids, lp.top_ids);
    }
    EXPECT_EQ(r.full, ref.full);
    if (ref.full) {
      ASSERT_EQ(r.logits.size(), static_cast<size_t>(V));
      size_t diff = 0;
      for (int64_t i = 0; i < V; ++i) diff += !(r.logits[i] == ed[i]);
      EXPECT_EQ(diff, 0u);
    } else if (rows[j].mode == model::SampleMode::kCandidates) {
      EXPECT_EQ(r.ids, ref.ids);
      EXPECT_EQ(r.logits, ref.logits);
    }
    const int32_t tok = model::pick_from_summary(rows[j], r, V);
    ASSERT_GE(tok, 0);
    EXPECT_TRUE(model::row_allows(rows[j], tok)) << "token " << tok;
    if (rows[j].mode == model::SampleMode::kTemperature) {
      const int32_t lo = model::temperature_walk(ed.data(), V, ref.max, 1.0 / rows[j].temperature, rows[j].u * ref.z * (1 - 1e-5));
      const int32_t hi = model::temperature_walk(ed.data(), V, ref.max, 1.0 / rows[j].temperature, rows[j].u * ref.z * (1 + 1e-5));
      EXPECT_GE(tok, lo);
      EXPECT_LE(tok, hi);
    } else {
      model::SampleRow host = plain;
      host.allowed = rows[j].allowed;
      EXPECT_EQ(tok, model::pick_from_summary(host, ref, V));
    }
    if (rows[j].edits.empty()) {
      EXPECT_EQ(model::raw_logit_of(rows[j], r, tok, V), l[tok]);
    }
  }
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
