// The streaming decode-experts kernel (moe_experts_stream, which moe_experts_decode runs for 2 tokens and more)
// against a plain host loop on fresh random inputs: every written slot vs the reference, slots with id -1 never
// written, both its forms bit-identical, a second launch on the same plan (counters reset) identical to the first, a
// launch on a spent plan (counters not reset) doing nothing and ending, launches on two plans running on two streams
// at once, a launch that gets only the multiprocessors another kernel leaves
// free (CTAs that never become resident while it runs), and the shapes it refuses.
#ifdef ZEST_HAVE_CUDA
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>

#include "cuda/cuda_test_util.h"
#include "cuda/moe_decode_case.h"
#include "kernels/cuda/moe_stream.h"

namespace zest::cuda::test {
namespace {

constexpr double kTol = 2e-2;  // max abs err <= 2e-2 * max |ref| (bf16 h and outputs, fp32 sums in another order)

using StreamCase = MoeCase;

struct Inputs {
  Routing route;
  HostBF16 x, gu, dn;
};

// Host reference of one (token, slot): slot_out row of H values.
std::vector<float> ref_slot(const StreamCase& c, const Inputs& in, int n, int k) {
  return ref_slot(c, in.x, in.gu, in.dn, in.route, n, k);
}

// One case on the device: inputs, the built plan, output buffers and the host reference of the written slots.
struct Setup {
  StreamCase c;
  Inputs in;
  std::unique_ptr<DevBuf<bf16>> x, gu, dn;
  DevBuf<int32_t> ids;
  DevBuf<float> w, out;
  DevBuf<bf16> h;
  DevBuf<unsigned char> plan_buf;
  MoePlan plan;
  std::vector<float> ref;

  // A launch spends the plan's counters: reset them first unless the plan was just built.
  Status launch(int variant, cudaStream_t stream, bool reset = true) const {
    if (reset) ZEST_RETURN_IF_ERROR(moe_plan_reset_counters(plan, stream));
    return moe_experts_stream(x->get(), plan, w.get(), gu->get(), dn->get(), h.get(), out.get(), c.N, c.K, c.E, c.H,
                              c.I, variant, stream);
  }
};

std::unique_ptr<Setup> make_setup(const StreamCase& c, std::mt19937& rng) {
  auto s = std::make_unique<Setup>();
  s->c = c;
  Inputs& in = s->in;
  in.route = make_routing(c, rng);
  in.x = random_bf16(static_cast<size_t>(c.N) * c.H, rng);
  const float ag = std::sqrt(3.f / c.H), ad = std::sqrt(3.f / c.I);
  in.gu = random_bf16(static_cast<size_t>(c.E) * 2 * c.I * c.H, rng, -ag, ag);
  in.dn = random_bf16(static_cast<size_t>(c.E) * c.H * c.I, rng, -ad, ad);
  s->x = upload_bf16(in.x);
  s->gu = upload_bf16(in.gu);
  s->dn = upload_bf16(in.dn);
  s->ids.resize(in.route.ids.size());
  s->ids.upload(in.route.ids);
  s->w.resize(in.route.w.size());
  s->w.upload(in.route.w);
  s->out.resize(static_cast<size_t>(c.N) * c.K * c.H);
  s->h.resize(static_cast<size_t>(c.N) * c.K * c.I);
  s->plan_buf.resize(moe_plan_bytes(c.N, c.K, c.E));
  s->plan_buf.poison();
  moe_plan_bind(s->plan, s->plan_buf.get(), c.N, c.K, c.E);
  EXPECT_TRUE(moe_plan(s->ids.get(), c.N, c.K, c.E, s->plan, nullptr, nullptr).is_ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int n = 0; n < c.N; ++n)
    for (int k = 0; k < c.K; ++k) {
      if (in.route.ids[n * c.K + k] < 0) continue;
      const auto r = ref_slot(c, in, n, k);
      s->ref.insert(s->ref.end(), r.begin(), r.end());
    }
  return s;
}

// Downloads the outputs, checks them (slots with id -1 still poison, the others within kTol of the reference) and
// returns their bits in *bits.
void check_outputs(const Setup& s, std::vector<uint32_t>* bits_out) {
  const StreamCase& c = s.c;
  const auto all = s.out.download();
  std::vector<float> got;
  std::vector<uint32_t> bits(all.size());
  std::memcpy(bits.data(), all.data(), all.size() * 4);
  for (int n = 0; n < c.N; ++n)
    for (int k = 0; k < c.K; ++k) {
      const size_t slot = static_cast<size_t>(n) * c.K + k;
      if (s.in.route.ids[slot] < 0) {
        for (int r = 0; r < c.H; ++r) EXPECT_EQ(bits[slot * c.H + r], 0xffffffffu) << "slot " << slot;
        continue;
      }
      got.insert(got.end(), all.begin() + slot * c.H, all.begin() + (slot + 1) * c.H);
    }
  *bits_out = bits;
  if (!s.ref.empty()) {
    ZEST_EXPECT_CLOSE(got, s.ref, kTol);
  }
}

std::string case_name(const StreamCase& c) {
  return "N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + " E=" + std::to_string(c.E) +
         " H=" + std::to_string(c.H) + " I=" + std::to_string(c.I) + " pool=" + std::to_string(c.pool) +
         " hot=" + std::to_string(c.hot) + " holes=" + std::to_string(c.holes);
}

// Runs the plan, then both forms twice on the same plan (the first launch on the fresh plan, the others after
// moe_plan_reset_counters), then (2 tokens and more) through moe_experts_decode, which runs the streaming kernel there;
// checks each output against the host reference and bit for bit against the first run. Last, a launch on the spent
// plan: it must end and write nothing.
void run_stream_case(const StreamCase& c, std::mt19937& rng) {
  SCOPED_TRACE(case_name(c));
  const auto s = make_setup(c, rng);
  std::vector<uint32_t> first_bits;
  const int direct = 2 * kStreamVariants, runs = direct + (c.N > 1 ? 1 : 0);
  for (int run = 0; run < runs; ++run) {
    const int variant = run < direct ? run / 2 : 0;
    SCOPED_TRACE(testing::Message() << "run " << run << " form " << variant);
    s->out.poison();
    if (run < direct) {
      ZEST_ASSERT_OK(s->launch(variant, nullptr, run > 0));
    } else {
      ZEST_ASSERT_OK(moe_plan_reset_counters(s->plan, nullptr));
      ZEST_ASSERT_OK(moe_experts_decode(s->x->get(), s->plan, s->w.get(), s->gu->get(), s->dn->get(), s->h.get(),
                                        s->out.get(), c.N, c.K, c.E, c.H, c.I, nullptr));
    }
    sync_ok();
    std::vector<uint32_t> bits;
    check_outputs(*s, &bits);
    if (run == 0) {
      first_bits = bits;
    } else {
      EXPECT_TRUE(bits == first_bits) << "outputs differ from the first run";
    }
  }
  s->out.poison();
  ZEST_ASSERT_OK(s->launch(kStreamVariants - 1, nullptr, false));
  sync_ok();
  const auto spent = s->out.download();
  const auto poisoned = [](float v) { return std::isnan(v); };
  EXPECT_TRUE(std::all_of(spent.begin(), spent.end(), poisoned)) << "a launch on a spent plan wrote outputs";
}

// A non-blocking stream, destroyed at scope exit.
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() {
    if (s) cudaStreamDestroy(s);
  }
};

// Host memory mapped into the device, zeroed.
struct Mapped {
  int* p = nullptr;
  explicit Mapped(size_t n) {
    EXPECT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&p), n * sizeof(int), cudaHostAllocMapped), cudaSuccess);
    if (p) std::memset(p, 0, n * sizeof(int));
  }
  ~Mapped() {
    if (p) cudaFreeHost(p);
  }
  int get(size_t i) const { return reinterpret_cast<const volatile int*>(p)[i]; }
  void set(size_t i, int v) { reinterpret_cast<volatile int*>(p)[i] = v; }
};

TEST(CudaMoeStream, BatchOneModelExpertCount) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(51);
  run_stream_case({1, 8, 128, 512, 256, 0, -1, 0}, rng);
}

TEST(CudaMoeStream, ModelWidthsBatchSeven) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(52);
  // H = 2048, I = 768: gate/up chunks 8 x 256 or 4 x 512, down chunks 3 x 256 or 512 + 256; two -1 slots.
  run_stream_case({7, 8, 16, 2048, 768, 0, -1, 2}, rng);
}

TEST(CudaMoeStream, BatchSixtyFourIdleExpertsAndEmptySlots) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(53);
  // 64 tokens over 40 of 64 experts (24 idle), 37 slots folded to -1; experts with 1-16+ tokens.
  run_stream_case({64, 8, 64, 256, 128, 40, -1, 37}, rng);
}

TEST(CudaMoeStream, OneExpertTakesEveryToken) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(54);
  // Expert 3 holds all 64 tokens (four 16-token passes); the other slots spread over 8 experts.
  run_stream_case({64, 4, 8, 192, 128, 0, 3, 5}, rng);
  // 9-16 tokens on one expert: the second n8 tile of a single pass.
  run_stream_case({13, 2, 4, 128, 64, 0, 1, 0}, rng);
}

TEST(CudaMoeStream, OddWidthsMultipleOf64) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(55);
  // H = 320: a 64-wide last chunk (256 + 64); I = 192 and I = 64 (one k step pair).
  run_stream_case({5, 4, 16, 320, 192, 0, -1, 1}, rng);
  run_stream_case({3, 2, 6, 64, 64, 0, -1, 0}, rng);
  run_stream_case({9, 3, 12, 576, 832, 0, -1, 2}, rng);
}

TEST(CudaMoeStream, EverySlotEmpty) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(56);
  run_stream_case({4, 2, 8, 128, 64, 0, -1, 8}, rng);  // all 8 slots -1: nothing written, counters stay clear
  run_stream_case({2, 2, 8, 128, 64, 0, -1, 0}, rng);  // and the next launch still works
}

TEST(CudaMoeStream, TwoPlansOnTwoStreamsAtOnce) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(57);
  // Two cases with thousands of items (about 64 and 48 active experts, 48-128 items each), so that each launch
  // fills the GPU and the two share the multiprocessors while they overlap.
  const auto a = make_setup({32, 8, 64, 1024, 512, 0, -1, 3}, rng);
  const auto b = make_setup({24, 8, 96, 768, 384, 48, 5, 0}, rng);
  Stream s1, s2;
  for (int variant = 0; variant < kStreamVariants; ++variant) {
    SCOPED_TRACE(testing::Message() << "variant " << variant);
    // Each alone first: the bits every overlapped launch must reproduce.
    a->out.poison();
    b->out.poison();
    ZEST_ASSERT_OK(a->launch(variant, nullptr));
    ZEST_ASSERT_OK(b->launch(variant, nullptr));
    sync_ok();
    std::vector<uint32_t> bits_a, bits_b;
    {
      SCOPED_TRACE(case_name(a->c));
      check_outputs(*a, &bits_a);
    }
    {
      SCOPED_TRACE(case_name(b->c));
      check_outputs(*b, &bits_b);
    }
    // Then three launches on each plan, its own stream each, issued alternately so that they overlap.
    a->out.poison();
    b->out.poison();
    for (int rep = 0; rep < 3; ++rep) {
      ZEST_ASSERT_OK(a->launch(variant, s1.s));
      ZEST_ASSERT_OK(b->launch(variant, s2.s));
    }
    sync_ok();
    std::vector<uint32_t> got_a, got_b;
    {
      SCOPED_TRACE(case_name(a->c));
      check_outputs(*a, &got_a);
      EXPECT_TRUE(got_a == bits_a) << "overlapped launches differ from the launch alone";
    }
    {
      SCOPED_TRACE(case_name(b->c));
      check_outputs(*b, &got_b);
      EXPECT_TRUE(got_b == bits_b) << "overlapped launches differ from the launch alone";
    }
  }
}

TEST(CudaMoeStream, FinishesOnTheMultiprocessorsAnotherKernelLeaves) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(58);
  int dev = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), cudaSuccess);
  if (sms < 3) GTEST_SKIP() << "needs at least 3 multiprocessors";
  // About 48 active experts x (16 or 32 gate/up + 16 or 32 down items): a grid of far more CTAs than the two free
  // multiprocessors hold at once.
  const auto s = make_setup({32, 8, 48, 512, 256, 0, -1, 2}, rng);
  const int held = sms - 2;
  Stream hold_stream, run_stream;
  for (int variant = 0; variant < kStreamVariants; ++variant) {
    SCOPED_TRACE(testing::Message() << "variant " << variant);
    s->out.poison();
    ZEST_ASSERT_OK(s->launch(variant, nullptr));
    sync_ok();
    std::vector<uint32_t> alone, beside;
    check_outputs(*s, &alone);

    Mapped started(held), release(1);
    ASSERT_NE(started.p, nullptr);
    ASSERT_NE(release.p, nullptr);
    ZEST_ASSERT_OK(hold_multiprocessors(held, started.p, release.p, hold_stream.s));
    // Every holding CTA resident before the streaming launch (deadline: it fails rather than waits forever).
    using Clock = std::chrono::steady_clock;
    auto deadline = Clock::now() + std::chrono::seconds(20);
    int running = 0;
    while (Clock::now() < deadline) {
      running = 0;
      for (int i = 0; i < held; ++i) running += started.get(i);
      if (running == held) break;
    }
    if (running != held) {
      release.set(0, 1);
      cudaDeviceSynchronize();
    }
    ASSERT_EQ(running, held) << "the holding kernel did not start on every multiprocessor it asked for";

    s->out.poison();
    const Status st = s->launch(variant, run_stream.s);
    cudaError_t done = cudaErrorNotReady;
    bool hold_running = false;
    deadline = Clock::now() + std::chrono::seconds(25);
    while (st.is_ok() && Clock::now() < deadline) {
      done = cudaStreamQuery(run_stream.s);
      if (done != cudaErrorNotReady) {
        hold_running = cudaStreamQuery(hold_stream.s) == cudaErrorNotReady;
        break;
      }
    }
    release.set(0, 1);
    const cudaError_t all = cudaDeviceSynchronize();
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(done, cudaSuccess) << cudaGetErrorString(done);
    EXPECT_TRUE(hold_running) << "the holding kernel ended before the streaming launch finished";
    ASSERT_EQ(all, cudaSuccess) << cudaGetErrorString(all);
    check_outputs(*s, &beside);
    EXPECT_TRUE(beside == alone) << "the launch beside the holding kernel differs from the launch alone";
  }
}

TEST(CudaMoeStream, RefusesUnsupportedShapes) {
  ZEST_REQUIRE_GPU();
  const int N = 2, K = 2, E = 4;
  DevBuf<unsigned char> buf(moe_plan_bytes(N, K, E));
  MoePlan plan;
  moe_plan_bind(plan, buf.get(), N, K, E);
  DevBuf<bf16> x(N * 1024), gu(E * 2 * 1024 * 1024), dn(E * 1024 * 1024), h(N * K * 1024);
  DevBuf<float> w(N * K), out(N * K * 1024);
  for (auto [H, I] : {std::tuple{72, 64}, {64, 40}, {96, 64}, {0, 64}}) {
    SCOPED_TRACE(testing::Message() << "H=" << H << " I=" << I);
    EXPECT_FALSE(moe_stream_ok(H, I));
    const Status st = moe_experts_stream(x.get(), plan, w.get(), gu.get(), dn.get(), h.get(), out.get(), N, K, E, H, I,
                                         0, nullptr);
    EXPECT_FALSE(st.is_ok());
    EXPECT_NE(st.to_string().find("multiples of 64"), std::string::npos) << st.to_string();
  }
  // A plan bound for other sizes, and an unknown variant.
  EXPECT_FALSE(moe_experts_stream(x.get(), plan, w.get(), gu.get(), dn.get(), h.get(), out.get(), N + 1, K, E, 128, 64,
                                  0, nullptr)
                   .is_ok());
  EXPECT_FALSE(moe_experts_stream(x.get(), plan, w.get(), gu.get(), dn.get(), h.get(), out.get(), N, K, E, 128, 64,
                                  kStreamVariants, nullptr)
                   .is_ok());
  // Resetting the counters of a plan that was never bound.
  const Status unbound = moe_plan_reset_counters(MoePlan{}, nullptr);
  EXPECT_FALSE(unbound.is_ok());
  EXPECT_NE(unbound.to_string().find("not bound"), std::string::npos) << unbound.to_string();
  sync_ok();
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
