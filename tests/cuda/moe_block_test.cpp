// moe_block_decode (the MoE half of a decode layer in one cooperative launch) against the chain of kernels it
// replaces (add_rmsnorm, moe_route with the plan, moe_experts_decode through rows_mma, moe_combine_add_rmsnorm) on
// fresh random inputs: model shapes (H 2048, E 128, K 8, I 768) and small odd ones, T = 1, 3, 8. The kernel uses the
// chain's rounding points and summation orders, so its outputs are expected to be the chain's bits; the assertions
// allow: ids equal wherever the chain's top-k margin (K-th minus (K+1)-th probability) is above 1e-6, routing weights
// within 1e-3, x and xn within 1e-2 * max |ref| (the count of differing bits is printed). Then: a second launch on the
// same workspace gives the first one's bits (barrier generations), launches on two streams with two workspaces (the
// caller's or the function's own) and a
// CUDA graph replay (with programmatic launches) give the bits of the launch alone, the shapes it refuses, and the
// CUDA text decoder with the option on against off.
#ifdef ZEST_HAVE_CUDA
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>

#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cuda.h"
#include "cuda/cuda_test_util.h"
#include "cuda/random_checkpoint.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "kernels/cuda/moe_block.h"
#include "model/decoder.h"

namespace zest::cuda::test {
namespace {

constexpr float kEps = 1e-6f;

struct BlockCase {
  int T, H, E, K, I;
};

std::string case_name(const BlockCase& c) {
  return "T=" + std::to_string(c.T) + " H=" + std::to_string(c.H) + " E=" + std::to_string(c.E) +
         " K=" + std::to_string(c.K) + " I=" + std::to_string(c.I);
}

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
};

// Inputs on the device, the chain's outputs, and buffers for the fused kernel.
struct Setup {
  BlockCase c;
  std::unique_ptr<DevBuf<bf16>> x0, o_d, post, next, router, gu, dn;
  // chain reference
  std::vector<float> ref_x, ref_xn, ref_w, ref_logits;
  std::vector<int32_t> ref_ids;
  int64_t ref_count = 0;
  void reset_x(cudaStream_t stream) {
    EXPECT_EQ(cudaMemcpyAsync(x.get(), x0->get(), x.size() * 2, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
  }
  // fused kernel outputs
  DevBuf<bf16> x, xn, logits;
  DevBuf<int32_t> ids;
  DevBuf<float> w;
  DevBuf<int64_t> count;
  DevBuf<unsigned char> ws;
  bool own_ws = false;  // pass no workspace: the function's own one for the stream

  // One launch: x reset to the inputs first (on `stream`) unless reset is false; outputs poisoned by the caller.
  Status launch(cudaStream_t stream, bool reset = true) {
    if (reset) reset_x(stream);
    return moe_block_decode(x.get(), o_d->get(), post->get(), router->get(), nullptr, gu->get(), dn->get(), next->get(),
                            xn.get(), ids.get(), w.get(), logits.get(), count.get(), own_ws ? nullptr : ws.get(),
                            own_ws ? 0 : ws.size(), c.T, c.H, c.E, c.K, c.I, kEps, stream);
  }
};

std::unique_ptr<Setup> make_setup(const BlockCase& c, std::mt19937& rng) {
  auto s = std::make_unique<Setup>();
  s->c = c;
  const size_t TH = static_cast<size_t>(c.T) * c.H;
  const float ah = 1.f / std::sqrt(static_cast<float>(c.H)), ai = 1.f / std::sqrt(static_cast<float>(c.I));
  // Fresh random data on the device (counter-hash fill from seeds drawn here; the reference is the chain on the
  // same device buffers, so no host copies are needed).
  auto fill = [&](size_t n, float lo, float hi) {
    auto b = std::make_unique<DevBuf<bf16>>(n);
    EXPECT_TRUE(fill_random_bf16(b->get(), n, rng(), lo, hi, nullptr).is_ok());
    return b;
  };
  s->x0 = fill(TH, -2.f, 2.f);
  s->o_d = fill(TH, -1.f, 1.f);
  s->post = fill(c.H, 0.8f, 1.2f);
  s->next = fill(c.H, 0.8f, 1.2f);
  s->router = fill(static_cast<size_t>(c.E) * c.H, -4 * ah, 4 * ah);
  s->gu = fill(static_cast<size_t>(c.E) * 2 * c.I * c.H, -2 * ah, 2 * ah);
  s->dn = fill(static_cast<size_t>(c.E) * c.H * c.I, -2 * ai, 2 * ai);
  // The chain.
  {
    DevBuf<bf16> x(TH), xn(TH), logits(static_cast<size_t>(c.T) * c.E), h(static_cast<size_t>(c.T) * c.K * c.I);
    DevBuf<int32_t> ids(static_cast<size_t>(c.T) * c.K);
    DevBuf<float> w(static_cast<size_t>(c.T) * c.K), slot_out(static_cast<size_t>(c.T) * c.K * c.H);
    DevBuf<unsigned char> plan_buf(moe_plan_bytes(c.T, c.K, c.E));
    DevBuf<int64_t> count(std::vector<int64_t>{5});
    MoePlan plan;
    moe_plan_bind(plan, plan_buf.get(), c.T, c.K, c.E);
    EXPECT_EQ(cudaMemcpy(x.get(), s->x0->get(), TH * 2, cudaMemcpyDeviceToDevice), cudaSuccess);
    EXPECT_TRUE(add_rmsnorm(x.get(), s->o_d->get(), s->post->get(), xn.get(), c.T, c.H, kEps, nullptr).is_ok());
    EXPECT_TRUE(moe_route_ok(c.T, c.H, c.E, c.K));
    EXPECT_TRUE(moe_route(xn.get(), s->router->get(), nullptr, ids.get(), w.get(), logits.get(), &plan, count.get(), c.T,
                          c.H, c.E, c.K, nullptr)
                    .is_ok());
    const int kernel = decode_option(DecodeOption::kMoeKernel);
    set_decode_option(DecodeOption::kMoeKernel, 1);  // rows_mma
    EXPECT_TRUE(moe_experts_decode(xn.get(), plan, w.get(), s->gu->get(), s->dn->get(), h.get(), slot_out.get(), c.T,
                                   c.K, c.E, c.H, c.I, nullptr)
                    .is_ok());
    set_decode_option(DecodeOption::kMoeKernel, kernel);
    EXPECT_TRUE(moe_combine_add_rmsnorm(x.get(), slot_out.get(), ids.get(), c.K, s->next->get(), xn.get(), c.T, c.H,
                                        kEps, nullptr)
                    .is_ok());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    s->ref_x = download_bf16(x);
    s->ref_xn = download_bf16(xn);
    s->ref_logits = download_bf16(logits);
    s->ref_ids = ids.download();
    s->ref_w = w.download();
    s->ref_count = count.download()[0] - 5;
  }
  s->x.resize(TH);
  s->xn.resize(TH);
  s->logits.resize(static_cast<size_t>(c.T) * c.E);
  s->ids.resize(static_cast<size_t>(c.T) * c.K);
  s->w.resize(static_cast<size_t>(c.T) * c.K);
  s->count.resize(1);
  s->ws.resize(moe_block_workspace_bytes(c.T, c.E, c.K, c.I));
  EXPECT_EQ(cudaMemset(s->ws.get(), 0, s->ws.size()), cudaSuccess);
  EXPECT_EQ(cudaMemset(s->count.get(), 0, 8), cudaSuccess);
  return s;
}

void poison(Setup& s) {
  s.xn.poison();
  s.ids.poison();
  s.w.poison();
  s.logits.poison();
}

// The top-k margin of token t from the chain's logits: K-th minus (K+1)-th softmax probability (1 when K == E).
double topk_margin(const Setup& s, int t) {
  const BlockCase& c = s.c;
  std::vector<double> p(c.E);
  double mx = -1e30, sum = 0;
  for (int e = 0; e < c.E; ++e) mx = std::max(mx, static_cast<double>(s.ref_logits[t * c.E + e]));
  for (int e = 0; e < c.E; ++e) sum += p[e] = std::exp(s.ref_logits[t * c.E + e] - mx);
  for (auto& v : p) v /= sum;
  std::sort(p.begin(), p.end(), std::greater<double>());
  return c.K < c.E ? p[c.K - 1] - p[c.K] : 1.0;
}

// Compares the fused kernel's outputs with the chain's; the bits of x, xn, ids, weights go to *bits when given.
void check_against_chain(Setup& s, std::vector<uint32_t>* bits) {
  const BlockCase& c = s.c;
  const auto ids = s.ids.download();
  const auto w = s.w.download();
  const auto x = download_bf16(s.x);
  const auto xn = download_bf16(s.xn);
  const auto logits = download_bf16(s.logits);
  bool routed_alike = true;
  for (int t = 0; t < c.T; ++t) {
    const bool clear = topk_margin(s, t) > 1e-6;
    for (int k = 0; k < c.K; ++k) {
      const int i = t * c.K + k;
      if (ids[i] != s.ref_ids[i]) routed_alike = false;
      if (clear) {
        EXPECT_EQ(ids[i], s.ref_ids[i]) << "token " << t << " slot " << k;
        EXPECT_NEAR(w[i], s.ref_w[i], 1e-3) << "token " << t << " slot " << k;
      }
    }
  }
  ZEST_EXPECT_CLOSE(logits, s.ref_logits, 1e-2);
  if (routed_alike) {
    ZEST_EXPECT_CLOSE(x, s.ref_x, 1e-2);
    ZEST_EXPECT_CLOSE(xn, s.ref_xn, 1e-2);
    const int64_t count = s.count.download()[0];
    EXPECT_GT(count, 0);
    (void)count;
  }
  size_t diff = 0;
  for (size_t i = 0; i < x.size(); ++i) diff += (x[i] != s.ref_x[i]) + (xn[i] != s.ref_xn[i]);
  for (size_t i = 0; i < w.size(); ++i) diff += (w[i] != s.ref_w[i]) + (ids[i] != s.ref_ids[i]);
  std::printf("[moe_block %s] values differing from the chain's bits: %zu of %zu\n", case_name(c).c_str(), diff,
              2 * x.size() + 2 * w.size());
  if (bits) {
    bits->clear();
    auto put = [&](const void* p, size_t n) {
      const uint32_t* u = static_cast<const uint32_t*>(p);
      bits->insert(bits->end(), u, u + n);
    };
    put(x.data(), x.size());
    put(xn.data(), xn.size());
    put(ids.data(), ids.size());
    put(w.data(), w.size());
  }
}

class CudaMoeBlock : public testing::TestWithParam<BlockCase> {};

// Phase boundaries that CTA 0 stamps into the workspace (globaltimer ns at sync[8..15]), printed (not asserted).
void print_phases(const Setup& s, int variant) {
  std::vector<unsigned char> raw(128);
  ASSERT_EQ(cudaMemcpy(raw.data(), s.ws.get(), raw.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  const uint64_t* t = reinterpret_cast<const uint64_t*>(raw.data()) + 8;
  auto us = [&](int a, int b) { return (static_cast<double>(t[b]) - static_cast<double>(t[a])) * 1e-3; };
  std::printf("[moe_block %s variant %d] CTA 0 phases, us (eager launch): norm + router + barrier 1 %.1f | top-k + "
              "plan %.1f | gate/up %.1f | barrier 2 %.1f | down + combine %.1f | barrier 3 %.1f | norm %.1f | total "
              "%.1f\n",
              case_name(s.c).c_str(), variant, us(0, 1), us(1, 2), us(2, 3), us(3, 4), us(4, 5), us(5, 6), us(6, 7),
              us(0, 7));
}

TEST_P(CudaMoeBlock, MatchesTheChainAndRepeats) {
  ZEST_REQUIRE_GPU();
  const BlockCase c = GetParam();
  std::mt19937 rng(1000 + c.T * 31 + c.H + c.E * 7 + c.K + c.I);
  if (!moe_block_ok(c.T, c.H, c.E, c.K, c.I)) GTEST_SKIP() << "moe_block_decode not available here";
  auto s = make_setup(c, rng);
  SCOPED_TRACE(case_name(c));
  const int option = decode_option(DecodeOption::kMoeBlock);
  for (int variant : {1, 3}) {  // gate/up weights through the bulk-copy ring, then through register loads
    SCOPED_TRACE(testing::Message() << "variant " << variant);
    set_decode_option(DecodeOption::kMoeBlock, variant);
    ASSERT_EQ(cudaMemset(s->count.get(), 0, 8), cudaSuccess);
    std::vector<uint32_t> first, second;
    poison(*s);
    ZEST_ASSERT_OK(s->launch(nullptr));
    sync_ok();
    check_against_chain(*s, &first);
    EXPECT_EQ(s->count.download()[0], s->ref_count) << "distinct experts";
    // Further launches on the same workspace (the next barrier generations): the same bits; the count adds up.
    for (int rep = 0; rep < 2; ++rep) {
      poison(*s);
      ZEST_ASSERT_OK(s->launch(nullptr));
      sync_ok();
      check_against_chain(*s, &second);
      EXPECT_TRUE(first == second) << "launch " << rep + 2 << " differs from the first";
    }
    EXPECT_EQ(s->count.download()[0], 3 * s->ref_count);
    print_phases(*s, variant);
  }
  set_decode_option(DecodeOption::kMoeBlock, option);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaMoeBlock,
                         testing::Values(BlockCase{1, 2048, 128, 8, 768}, BlockCase{3, 2048, 128, 8, 768},
                                         BlockCase{8, 2048, 128, 8, 768}, BlockCase{1, 512, 64, 4, 256},
                                         BlockCase{3, 512, 64, 4, 256}, BlockCase{8, 512, 64, 4, 256},
                                         BlockCase{3, 384, 60, 6, 160}),
                         [](const testing::TestParamInfo<BlockCase>& i) {
                           const BlockCase& c = i.param;
                           return "T" + std::to_string(c.T) + "_H" + std::to_string(c.H) + "_E" + std::to_string(c.E) +
                                  "_K" + std::to_string(c.K) + "_I" + std::to_string(c.I);
                         });

TEST(CudaMoeBlockRuns, TwoStreamsTwoWorkspaces) {
  ZEST_REQUIRE_GPU();
  if (!moe_block_ok(1, 2048, 128, 8, 768) || !moe_block_ok(3, 384, 60, 6, 160)) GTEST_SKIP() << "not available";
  std::mt19937 rng(77);
  auto a = make_setup({1, 2048, 128, 8, 768}, rng);
  auto b = make_setup({3, 384, 60, 6, 160}, rng);
  std::vector<uint32_t> bits_a, bits_b, got_a, got_b;
  poison(*a);
  poison(*b);
  ZEST_ASSERT_OK(a->launch(nullptr));
  ZEST_ASSERT_OK(b->launch(nullptr));
  sync_ok();
  check_against_chain(*a, &bits_a);
  check_against_chain(*b, &bits_b);
  Stream s1, s2;
  for (bool own : {false, true}) {  // the caller's workspaces, then the function's own per stream
    SCOPED_TRACE(own ? "own workspaces" : "caller's workspaces");
    a->own_ws = b->own_ws = own;
    poison(*a);
    poison(*b);
    for (int rep = 0; rep < 4; ++rep) {
      ZEST_ASSERT_OK(a->launch(s1.s));
      ZEST_ASSERT_OK(b->launch(s2.s));
    }
    sync_ok();
    check_against_chain(*a, &got_a);
    check_against_chain(*b, &got_b);
    EXPECT_TRUE(got_a == bits_a) << "launches on two streams differ from the launch alone";
    EXPECT_TRUE(got_b == bits_b) << "launches on two streams differ from the launch alone";
  }
}

TEST(CudaMoeBlockRuns, GraphReplayWithProgrammaticLaunch) {
  ZEST_REQUIRE_GPU();
  const BlockCase c{1, 2048, 128, 8, 768};
  if (!moe_block_ok(c.T, c.H, c.E, c.K, c.I)) GTEST_SKIP() << "not available";
  std::mt19937 rng(91);
  auto s = make_setup(c, rng);
  std::vector<uint32_t> eager, replayed;
  poison(*s);
  ZEST_ASSERT_OK(s->launch(nullptr));
  sync_ok();
  check_against_chain(*s, &eager);
  const bool pdl = programmatic_launch();
  set_programmatic_launch(true);
  Stream st;
  // A kernel before it in the graph (an RMSNorm of another buffer), so the launch follows a kernel programmatically.
  DevBuf<bf16> scratch(static_cast<size_t>(c.T) * c.H);
  for (int pass = 0; pass < 2; ++pass) {  // eager with programmatic launches, then the same captured and replayed
    poison(*s);
    if (pass == 0) {
      s->reset_x(st.s);
      ZEST_ASSERT_OK(rmsnorm(s->o_d->get(), s->post->get(), scratch.get(), c.T, c.H, kEps, st.s));
      ZEST_ASSERT_OK(s->launch(st.s, false));
    } else {
      cudaGraph_t graph = nullptr;
      ASSERT_EQ(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      s->reset_x(st.s);
      const Status a = rmsnorm(s->o_d->get(), s->post->get(), scratch.get(), c.T, c.H, kEps, st.s);
      const Status b = s->launch(st.s, false);
      ASSERT_EQ(cudaStreamEndCapture(st.s, &graph), cudaSuccess);
      ZEST_ASSERT_OK(a);
      ZEST_ASSERT_OK(b);
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      cudaGraphDestroy(graph);
      for (int r = 0; r < 3; ++r) ASSERT_EQ(cudaGraphLaunch(exec, st.s), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
      cudaGraphExecDestroy(exec);
    }
    ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
    check_against_chain(*s, &replayed);
    EXPECT_TRUE(replayed == eager) << (pass == 0 ? "programmatic launch" : "graph replay") << " differs";
  }
  set_programmatic_launch(pdl);
}

TEST(CudaMoeBlockRuns, RefusesUnsupportedShapes) {
  ZEST_REQUIRE_GPU();
  EXPECT_FALSE(moe_block_ok(0, 2048, 128, 8, 768));
  EXPECT_FALSE(moe_block_ok(9, 2048, 128, 8, 768));
  EXPECT_FALSE(moe_block_ok(1, 4096, 128, 8, 768));
  EXPECT_FALSE(moe_block_ok(1, 2048, 512, 8, 768));
  EXPECT_FALSE(moe_block_ok(1, 2048, 128, 17, 768));
  EXPECT_FALSE(moe_block_ok(1, 2048, 128, 8, 760));
  EXPECT_FALSE(moe_block_ok(1, 2000, 128, 8, 768));
  DevBuf<bf16> dummy(64);
  DevBuf<int32_t> ids(64);
  DevBuf<float> w(64);
  const Status st = moe_block_decode(dummy.get(), dummy.get(), dummy.get(), dummy.get(), nullptr, dummy.get(),
                                     dummy.get(), dummy.get(), dummy.get(), ids.get(), w.get(), nullptr, nullptr,
                                     dummy.get(), 128, 9, 2048, 128, 8, 768, kEps, nullptr);
  EXPECT_FALSE(st.is_ok());
  if (moe_block_ok(1, 2048, 128, 8, 768)) {  // a workspace too small
    const Status small = moe_block_decode(dummy.get(), dummy.get(), dummy.get(), dummy.get(), nullptr, dummy.get(),
                                          dummy.get(), dummy.get(), dummy.get(), ids.get(), w.get(), nullptr, nullptr,
                                          dummy.get(), 128, 1, 2048, 128, 8, 768, kEps, nullptr);
    EXPECT_FALSE(small.is_ok());
  }
}

// The CUDA text decoder with DecodeOption::kMoeBlock on against off: a random checkpoint (hidden 64, head_dim 128, 8
// experts of width 64, top-2, two layers) where the fused kernel applies; prefills, then decode-only steps of 4
// sequences (eager, captured, replayed). The chain runs its experts through rows_mma (DecodeOption::kMoeKernel 1), so
// the logits are expected to match bit for bit; asserted: max |on - off| <= 1e-3 * max |off| on every step.
TEST(CudaMoeBlockRuns, DecoderStepsMatchTheChain) {
  ZEST_REQUIRE_GPU();
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("zest_moe_block_" + std::to_string(::getpid()));
  auto ck = write_random_moe_checkpoint(dir, 93);
  ASSERT_TRUE(ck.ok()) << ck.status().to_string();
  const io::ModelConfig* parsed = &ck->config;
  const io::TextConfig& c = parsed->text;
  if (!moe_block_ok(4, static_cast<int>(c.hidden_size), static_cast<int>(c.num_experts),
                    static_cast<int>(c.num_experts_per_tok), static_cast<int>(c.moe_intermediate_size)))
    GTEST_SKIP() << "moe_block_decode not available here";
  std::mt19937 rng(93);
  auto st = io::SafeTensors::open_file(ck->file);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  auto dec = model::make_cuda_decoder(*st, *parsed);
  ASSERT_TRUE(dec.ok()) << dec.status().to_string();
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.vocab_size) - 1);
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
  // One forward of chunks (sequence, start, length); logits rows in order.
  auto run = [&](const std::vector<std::array<int64_t, 3>>& chunks) -> Result<Tensor> {
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
    return (*dec)->forward(b, *cache);
  };
  const int block = decode_option(DecodeOption::kMoeBlock), kernel = decode_option(DecodeOption::kMoeKernel);
  set_decode_option(DecodeOption::kMoeKernel, 1);
  set_decode_option(DecodeOption::kMoeBlock, 0);
  std::vector<std::array<int64_t, 3>> prefill, step;
  for (int64_t s = 0; s < static_cast<int64_t>(seqs.size()); ++s) {
    prefill.push_back({s, 0, static_cast<int64_t>(seqs[s].size()) - 4});
    step.push_back({s, static_cast<int64_t>(seqs[s].size()) - 4, 1});
  }
  ASSERT_TRUE(run(prefill).ok());
  auto ref = run(step);  // the chain (the step writes the same K/V slot every time)
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  set_decode_option(DecodeOption::kMoeBlock, 1);
  for (int rep = 0; rep < 3; ++rep) {  // eager first use of the graph key, then captured and replayed
    auto got = run(step);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    ASSERT_EQ(got->numel(), ref->numel());
    double max_err = 0, max_ref = 0;
    for (int64_t i = 0; i < ref->numel(); ++i) {
      max_err = std::max(max_err, static_cast<double>(std::fabs(got->data<float>()[i] - ref->data<float>()[i])));
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(ref->data<float>()[i])));
    }
    std::printf("[moe_block decoder] step %d: max |on - off| %.4g, max |off| %.4g\n", rep, max_err, max_ref);
    EXPECT_GT(max_ref, 0.0);
    EXPECT_LE(max_err, 1e-3 * max_ref) << "step " << rep;
  }
  set_decode_option(DecodeOption::kMoeBlock, block);
  set_decode_option(DecodeOption::kMoeKernel, kernel);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
