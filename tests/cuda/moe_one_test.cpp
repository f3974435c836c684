// The one-token decode experts (moe_experts_one, which moe_experts_decode runs at one token) against a plain host loop
// on fresh random inputs: every written slot within tolerance of the reference, slots with id -1 never written,
// bit-identical to the rows_mma kernels (rows_mma_moe, called directly) and to itself on a second launch, through
// moe_experts_decode at one token, under CUDA graph replay with programmatic launches while the routing changes between
// replays (the down kernel reads the plan before its wait), the sizes it refuses, and the layer's combine folded into
// its down kernel against the separate launch.
#ifdef ZEST_HAVE_CUDA
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>

#include "cuda/cuda_test_util.h"
#include "cuda/moe_decode_case.h"
#include "kernels/cuda/moe_one.h"

namespace zest::cuda {
// rows_mma.cu (common.cuh): the register-streamed tensor-core experts, which moe_experts_decode runs for sizes the
// one-token and streaming kernels do not take; the bits moe_one must reproduce.
Status rows_mma_moe(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up, const bf16* down,
                    bf16* h, float* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream);
}  // namespace zest::cuda

namespace zest::cuda::test {
namespace {

constexpr double kTol = 2e-2;  // max abs err <= 2e-2 * max |ref| (bf16 h and outputs, fp32 sums in another order)

using OneCase = MoeCase;

struct Weights {
  HostBF16 x, gu, dn;
};

// Host reference of slot (n, k): slot_out row of H values.
std::vector<float> ref_slot(const OneCase& c, const Weights& in, const Routing& route, int n, int k) {
  return ref_slot(c, in.x, in.gu, in.dn, route, n, k);
}

// One case on the device: weights, a routing with its plan, output buffers.
struct Setup {
  OneCase c;
  Weights in;
  Routing route;
  std::unique_ptr<DevBuf<bf16>> x, gu, dn;
  DevBuf<int32_t> ids;
  DevBuf<float> w, out;
  DevBuf<bf16> h;
  DevBuf<unsigned char> plan_buf;
  MoePlan plan;

  // Uploads a routing and builds its plan (synchronised).
  void set_routing(const Routing& r) {
    route = r;
    ids.upload(r.ids);
    w.upload(r.w);
    EXPECT_TRUE(moe_plan(ids.get(), c.N, c.K, c.E, plan, nullptr, nullptr).is_ok());
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  Status run_one(cudaStream_t stream) const {
    return moe_experts_one(x->get(), plan, w.get(), gu->get(), dn->get(), h.get(), out.get(), c.N, c.K, c.E, c.H, c.I,
                           stream);
  }
  Status run_rows_mma(cudaStream_t stream) const {
    return rows_mma_moe(x->get(), plan, w.get(), gu->get(), dn->get(), h.get(), out.get(), c.N, c.K, c.E, c.H, c.I,
                        stream);
  }
  Status run_decode(cudaStream_t stream) const {
    return moe_experts_decode(x->get(), plan, w.get(), gu->get(), dn->get(), h.get(), out.get(), c.N, c.K, c.E, c.H,
                              c.I, stream);
  }
  std::vector<uint32_t> bits() const {
    const auto all = out.download();
    std::vector<uint32_t> b(all.size());
    std::memcpy(b.data(), all.data(), all.size() * 4);
    return b;
  }
};

std::unique_ptr<Setup> make_setup(const OneCase& c, std::mt19937& rng) {
  auto s = std::make_unique<Setup>();
  s->c = c;
  s->in.x = random_bf16(static_cast<size_t>(c.N) * c.H, rng);
  const float ag = std::sqrt(3.f / c.H), ad = std::sqrt(3.f / c.I);
  s->in.gu = random_bf16(static_cast<size_t>(c.E) * 2 * c.I * c.H, rng, -ag, ag);
  s->in.dn = random_bf16(static_cast<size_t>(c.E) * c.H * c.I, rng, -ad, ad);
  s->x = upload_bf16(s->in.x);
  s->gu = upload_bf16(s->in.gu);
  s->dn = upload_bf16(s->in.dn);
  s->ids.resize(static_cast<size_t>(c.N) * c.K);
  s->w.resize(static_cast<size_t>(c.N) * c.K);
  s->out.resize(static_cast<size_t>(c.N) * c.K * c.H);
  s->h.resize(static_cast<size_t>(c.N) * c.K * c.I);
  s->plan_buf.resize(moe_plan_bytes(c.N, c.K, c.E));
  s->plan_buf.poison();
  moe_plan_bind(s->plan, s->plan_buf.get(), c.N, c.K, c.E);
  s->set_routing(make_routing(c, rng));
  return s;
}

// Checks output bits against the host reference: slots with id -1 still poison, the others within kTol.
void check_reference(const Setup& s, const std::vector<uint32_t>& bits) {
  const OneCase& c = s.c;
  std::vector<float> got, ref;
  for (int n = 0; n < c.N; ++n)
    for (int k = 0; k < c.K; ++k) {
      const size_t slot = static_cast<size_t>(n) * c.K + k;
      if (s.route.ids[slot] < 0) {
        for (int r = 0; r < c.H; ++r) ASSERT_EQ(bits[slot * c.H + r], 0xffffffffu) << "slot " << slot << " written";
        continue;
      }
      for (int r = 0; r < c.H; ++r) {
        float v;
        std::memcpy(&v, &bits[slot * c.H + r], 4);
        got.push_back(v);
      }
      const auto rr = ref_slot(c, s.in, s.route, n, k);
      ref.insert(ref.end(), rr.begin(), rr.end());
    }
  if (!ref.empty()) {
    ZEST_EXPECT_CLOSE(got, ref, kTol);
  }
}

std::string case_name(const OneCase& c) {
  return "N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) + " E=" + std::to_string(c.E) +
         " H=" + std::to_string(c.H) + " I=" + std::to_string(c.I) + " pool=" + std::to_string(c.pool) +
         " hot=" + std::to_string(c.hot) + " holes=" + std::to_string(c.holes) + " dup=" + std::to_string(c.dup);
}

// rows_mma first: its bits must match the host reference; then moe_experts_one four times, with and without
// programmatic launches, and (one token) once through moe_experts_decode: each bit for bit equal to rows_mma.
void run_case(const OneCase& c, std::mt19937& rng) {
  SCOPED_TRACE(case_name(c));
  ASSERT_TRUE(moe_one_ok(c.N, c.K, c.E, c.H, c.I));
  const auto s = make_setup(c, rng);
  s->out.poison();
  ZEST_ASSERT_OK(s->run_rows_mma(nullptr));
  sync_ok();
  const auto want = s->bits();
  check_reference(*s, want);
  const bool pdl = programmatic_launch();
  for (int run = 0; run < 4; ++run) {
    SCOPED_TRACE(testing::Message() << "run " << run);
    set_programmatic_launch(run >= 2);
    s->out.poison();
    s->h.poison();
    const Status st = s->run_one(nullptr);
    set_programmatic_launch(pdl);
    ZEST_ASSERT_OK(st);
    sync_ok();
    EXPECT_TRUE(s->bits() == want) << "differs from rows_mma";
  }
  if (c.N == 1) {  // moe_experts_decode runs moe_one at one token only
    s->out.poison();
    ZEST_ASSERT_OK(s->run_decode(nullptr));
    sync_ok();
    EXPECT_TRUE(s->bits() == want) << "moe_experts_decode differs from rows_mma";
  }
}

// Model widths (H 2048, I 768, K 8) with E = 12 experts (8 active at one token as in the model; fewer experts keep the
// host-side inputs small).
TEST(CudaMoeOne, ModelShapeOneToken) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(101);
  run_case({1, 8, 12, 2048, 768, 0, -1, 0, false}, rng);
}

TEST(CudaMoeOne, ModelShapeTwoActiveExperts) {  // SERE S=2 at one token: six of the eight slots folded
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(102);
  run_case({1, 8, 12, 2048, 768, 0, -1, 6, false}, rng);
}

TEST(CudaMoeOne, OddWidths) {  // I and H not multiples of 64 (one chunk of 32 over); 10 down items per expert
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(103);
  run_case({3, 6, 60, 160, 96, 0, -1, 2, false}, rng);
  run_case({1, 6, 60, 384, 160, 0, -1, 0, false}, rng);
}

TEST(CudaMoeOne, EightTokensOneHotExpert) {  // one expert takes every token (8 slots in one pass)
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(104);
  run_case({8, 4, 64, 512, 256, 0, 5, 3, false}, rng);
}

TEST(CudaMoeOne, FewExpertsFewTiles) {  // fewer items than CTAs
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(105);
  run_case({5, 2, 4, 64, 64, 0, -1, 1, false}, rng);
  run_case({2, 3, 5, 32, 32, 0, -1, 0, false}, rng);  // one chunk of k each
}

TEST(CudaMoeOne, RepeatedIdsInAToken) {  // an expert with more slots than tokens
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(106);
  run_case({1, 4, 16, 256, 128, 0, -1, 0, true}, rng);
  run_case({2, 4, 16, 256, 128, 0, -1, 1, true}, rng);
}

TEST(CudaMoeOne, EverySlotEmpty) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(107);
  const OneCase c{2, 4, 16, 256, 128, 0, -1, 8, false};
  const auto s = make_setup(c, rng);
  s->out.poison();
  ZEST_ASSERT_OK(s->run_one(nullptr));
  sync_ok();
  for (uint32_t b : s->bits()) ASSERT_EQ(b, 0xffffffffu);
}

// Captures `layers` x (moe_plan, experts(stream)) on `st` with programmatic launches and instantiates the graph;
// nullptr (with a test failure recorded) when a launch, the capture or the instantiation fails.
cudaGraphExec_t capture_plan_and_experts(Setup& s, cudaStream_t st, int layers,
                                         const std::function<Status(cudaStream_t)>& experts) {
  const bool pdl = programmatic_launch();
  set_programmatic_launch(true);
  if (cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
    set_programmatic_launch(pdl);
    ADD_FAILURE() << "begin capture";
    return nullptr;
  }
  Status plan_st = Status::ok(), one_st = Status::ok();
  for (int rep = 0; rep < layers; ++rep) {
    plan_st = moe_plan(s.ids.get(), s.c.N, s.c.K, s.c.E, s.plan, nullptr, st);
    one_st = experts(st);
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(st, &graph);
  set_programmatic_launch(pdl);
  EXPECT_TRUE(plan_st.is_ok()) << plan_st.to_string();
  EXPECT_TRUE(one_st.is_ok()) << one_st.to_string();
  EXPECT_EQ(end, cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  if (plan_st.is_ok() && one_st.is_ok() && end == cudaSuccess) {
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  }
  if (graph) cudaGraphDestroy(graph);
  return exec;
}

// One graph of (moe_plan, moe_experts_one with the combine `cmb`) replayed `reps` times, x restored by reset() before
// each: result() must equal `want` after every replay.
template <class Reset, class Result, class Want>
void expect_replays_equal(Setup& s, const OneCombine& cmb, int reps, Reset&& reset, Result&& result,
                          const Want& want) {
  const OneCase& c = s.c;
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  cudaGraphExec_t exec = capture_plan_and_experts(s, st, 1, [&](cudaStream_t stream) {
    return moe_experts_one(s.x->get(), s.plan, s.w.get(), s.gu->get(), s.dn->get(), s.h.get(), s.out.get(), c.N, c.K,
                           c.E, c.H, c.I, stream, nullptr, &cmb);
  });
  for (int rep = 0; exec && rep < reps; ++rep) {
    SCOPED_TRACE(testing::Message() << "replay " << rep);
    reset();
    EXPECT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_TRUE(result() == want);
  }
  if (exec) cudaGraphExecDestroy(exec);
  cudaStreamDestroy(st);
}

// The experts through moe_experts_one with the combine `cmb`: eager with and without programmatic
// launches, then `reps` graph replays, each from reset() and giving result() == want.
template <class Reset, class Result, class Want>
void expect_eager_and_replays_equal(Setup& s, const OneCombine& cmb, int reps, Reset&& reset, Result&& result,
                                    const Want& want) {
  const OneCase& c = s.c;
  const bool pdl = programmatic_launch();
  for (bool on : {false, true}) {
    SCOPED_TRACE(testing::Message() << "pdl " << on);
    reset();
    set_programmatic_launch(on);
    const Status rs = moe_experts_one(s.x->get(), s.plan, s.w.get(), s.gu->get(), s.dn->get(), s.h.get(),
                                      s.out.get(), c.N, c.K, c.E, c.H, c.I, nullptr, nullptr, &cmb);
    set_programmatic_launch(pdl);
    EXPECT_TRUE(rs.is_ok()) << rs.to_string();
    EXPECT_TRUE(result() == want);
  }
  expect_replays_equal(s, cmb, reps, reset, result, want);
}

// The combine folded into the down kernel (OneCombine: its last CTA runs moe_combine_add_rmsnorm's rows) against the
// experts followed by the separate moe_combine_add_rmsnorm launch: the residual x and the normalised rows y equal bit
// for bit, with the next norm's weight and without it (x only), eager with and without programmatic launches and
// replayed three times from one graph (the exit counter must come back to zero each time), and (one token) through
// moe_experts_decode_combine.
TEST(CudaMoeOne, FoldedCombineMatchesTheSeparateLaunch) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(110);
  const OneCase cases[] = {{1, 8, 12, 2048, 768, 0, -1, 0, false},
                           {1, 8, 12, 2048, 768, 0, -1, 6, false},  // six empty slots (SERE S=2)
                           {1, 4, 9, 256, 512, 0, -1, 1, false},    // the down kernel by rows with 2 chunks per warp
                           {1, 8, 8, 64, 32, 0, -1, 0, false},
                           {3, 6, 60, 160, 96, 0, -1, 2, false},
                           {8, 4, 64, 512, 256, 0, 5, 3, false},
                           {2, 3, 5, 32, 32, 0, -1, 0, false}};
  const float eps = 1e-6f;
  for (const OneCase& c : cases)
    for (bool with_norm : {true, false}) {
      SCOPED_TRACE(case_name(c) + (with_norm ? " norm" : " x only"));
      ASSERT_TRUE(moe_one_combine_ok(c.H));
      const auto s = make_setup(c, rng);
      const size_t n = static_cast<size_t>(c.N) * c.H;
      const auto x0 = upload_bf16(random_bf16(n, rng, -2.f, 2.f));
      const auto nw = upload_bf16(random_bf16(c.H, rng, 0.5f, 1.5f));
      DevBuf<bf16> x(n), y(n);
      DevBuf<unsigned> done(1);
      ASSERT_EQ(cudaMemset(done.get(), 0, 4), cudaSuccess);
      auto reset = [&]() {
        ASSERT_EQ(cudaMemcpy(x.get(), x0->get(), n * 2, cudaMemcpyDeviceToDevice), cudaSuccess);
        y.poison();
        s->out.poison();
        s->h.poison();
      };
      auto result = [&]() {
        sync_ok();
        std::vector<uint16_t> xb(n), yb(n);
        EXPECT_EQ(cudaMemcpy(xb.data(), x.get(), n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(yb.data(), y.get(), n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_EQ(done.download()[0], 0u) << "exit counter left non-zero";
        return std::make_pair(xb, with_norm ? yb : std::vector<uint16_t>{});
      };
      OneCombine cmb;
      cmb.x = x.get();
      cmb.ids = s->ids.get();
      cmb.w = with_norm ? nw->get() : nullptr;
      cmb.y = y.get();
      cmb.eps = eps;
      cmb.done = done.get();
      reset();
      ZEST_ASSERT_OK(s->run_one(nullptr));
      ZEST_ASSERT_OK(moe_combine_add_rmsnorm(x.get(), s->out.get(), s->ids.get(), c.K, cmb.w, y.get(), c.N, c.H, eps,
                                             nullptr));
      const auto want = result();
      std::vector<uint16_t> x0b(n);
      ASSERT_EQ(cudaMemcpy(x0b.data(), x0->get(), n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_NE(want.first, x0b);  // the combine changed x
      const bool pdl = programmatic_launch();
      for (bool on : {false, true}) {
        SCOPED_TRACE(testing::Message() << "pdl " << on);
        reset();
        set_programmatic_launch(on);
        const Status st = moe_experts_one(s->x->get(), s->plan, s->w.get(), s->gu->get(), s->dn->get(), s->h.get(),
                                          s->out.get(), c.N, c.K, c.E, c.H, c.I, nullptr, nullptr, &cmb);
        set_programmatic_launch(pdl);
        ZEST_ASSERT_OK(st);
        EXPECT_TRUE(result() == want);
      }
      // Replays of one graph (plan + folded experts), x restored before each.
      expect_replays_equal(*s, cmb, 3, reset, result, want);
      // Through moe_experts_decode_combine, which folds the combine at one token.
      if (c.N == 1) {
        reset();
        ZEST_ASSERT_OK(moe_experts_decode_combine(s->x->get(), s->plan, s->w.get(), s->gu->get(), s->dn->get(),
                                                  s->h.get(), s->out.get(), c.N, c.K, c.E, c.H, c.I, x.get(),
                                                  s->ids.get(), cmb.w, y.get(), eps, done.get(), nullptr));
        EXPECT_TRUE(result() == want);
      }
      // x only at one token: the down kernel by output rows (OneCombine::rows) gives the same x, eager with and
      // without programmatic launches, replayed from a graph, and through moe_experts_decode_combine (x only).
      if (!with_norm && moe_one_rows_ok(c.N, c.K, c.E, c.H, c.I)) {
        OneCombine rows;
        rows.x = x.get();
        rows.ids = s->ids.get();
        rows.rows = true;
        {
          SCOPED_TRACE("rows");
          expect_eager_and_replays_equal(*s, rows, 2, reset, result, want);
        }
        EXPECT_TRUE(moe_down_rows_on(c.N, c.K, c.E, c.H, c.I));
        reset();
        ZEST_ASSERT_OK(moe_experts_decode_combine(s->x->get(), s->plan, s->w.get(), s->gu->get(), s->dn->get(),
                                                  s->h.get(), s->out.get(), c.N, c.K, c.E, c.H, c.I, x.get(),
                                                  s->ids.get(), nullptr, nullptr, eps, nullptr, nullptr));
        EXPECT_TRUE(result() == want);
      }
    }
}

// The down kernel by output rows (CTA pairs exchanging slot values through distributed shared memory after a cluster
// start barrier): x bit for bit the experts followed by the separate combine (no pair kernel involved there), eager
// with and without programmatic launches and replayed from a graph, on the one-token cases the kernel takes (its
// three chunk counts; SERE's empty slots). Small enough to run alone under compute-sanitizer racecheck
// (bench/gpu/pairstart.sh).
TEST(CudaMoeOne, DownPairWithStartBarrierMatchesTheChain) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(111);
  const OneCase cases[] = {{1, 8, 12, 2048, 768, 0, -1, 0, false},
                           {1, 8, 12, 2048, 768, 0, -1, 6, false},  // six empty slots (SERE S=2)
                           {1, 4, 9, 256, 512, 0, -1, 1, false},    // 2 chunks per warp
                           {1, 8, 8, 64, 32, 0, -1, 0, false}};
  for (const OneCase& c : cases) {
    SCOPED_TRACE(case_name(c));
    ASSERT_TRUE(moe_one_rows_ok(c.N, c.K, c.E, c.H, c.I));
    const auto s = make_setup(c, rng);
    const size_t n = static_cast<size_t>(c.N) * c.H;
    const auto x0 = upload_bf16(random_bf16(n, rng, -2.f, 2.f));
    DevBuf<bf16> x(n);
    auto reset = [&]() {
      ASSERT_EQ(cudaMemcpy(x.get(), x0->get(), n * 2, cudaMemcpyDeviceToDevice), cudaSuccess);
      s->out.poison();
      s->h.poison();
    };
    auto result = [&]() {
      sync_ok();
      std::vector<uint16_t> xb(n);
      EXPECT_EQ(cudaMemcpy(xb.data(), x.get(), n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      return xb;
    };
    reset();
    ZEST_ASSERT_OK(s->run_one(nullptr));
    ZEST_ASSERT_OK(moe_combine_add_rmsnorm(x.get(), s->out.get(), s->ids.get(), c.K, nullptr, nullptr, c.N, c.H,
                                           1e-6f, nullptr));
    const auto want = result();
    std::vector<uint16_t> x0b(n);
    ASSERT_EQ(cudaMemcpy(x0b.data(), x0->get(), n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_NE(want, x0b);  // the combine changed x
    OneCombine rows;
    rows.x = x.get();
    rows.ids = s->ids.get();
    rows.rows = true;
    expect_eager_and_replays_equal(*s, rows, 2, reset, result, want);
  }
}

// Graph of (moe_plan, moe_experts_one) captured once with programmatic launches and replayed for several routings:
// the down kernel reads the plan before its wait, so each replay must use the plan its own moe_plan built.
TEST(CudaMoeOne, GraphReplayWithProgrammaticLaunchAndNewRoutings) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(108);
  const OneCase c{1, 8, 12, 2048, 768, 0, -1, 0, false};
  const auto s = make_setup(c, rng);
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  cudaGraphExec_t exec = capture_plan_and_experts(*s, st, 1, [&](cudaStream_t stream) { return s->run_one(stream); });
  ASSERT_NE(exec, nullptr);
  for (int rep = 0; rep < 3; ++rep) {
    SCOPED_TRACE(testing::Message() << "routing " << rep);
    OneCase rc = c;
    rc.holes = rep == 2 ? 6 : 0;  // the third routing has two active experts
    s->set_routing(make_routing(rc, rng));
    s->out.poison();
    ZEST_ASSERT_OK(s->run_rows_mma(nullptr));
    sync_ok();
    const auto want = s->bits();
    check_reference(*s, want);
    s->out.poison();
    s->h.poison();
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_TRUE(s->bits() == want) << "graph replay differs from rows_mma";
  }
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(st);
}

// Phase times (printed, not asserted) at the model shape inside a replayed graph (moe_plan, then the
// two kernels, programmatic launches): when the gate/up CTAs start and end and the down CTAs enter, leave their wait
// and end, in microseconds from the first gate/up CTA's start. The outputs must match rows_mma.
TEST(CudaMoeOne, PhaseTimesInAGraph) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(109);
  const OneCase c{1, 8, 12, 2048, 768, 0, -1, 0, false};
  const auto s = make_setup(c, rng);
  s->out.poison();
  ZEST_ASSERT_OK(s->run_rows_mma(nullptr));
  sync_ok();
  const auto want = s->bits();
  int gg = 0, dg = 0;
  moe_one_grids(c.N, c.K, c.E, c.H, c.I, &gg, &dg);
  {
    DevBuf<uint64_t> stamps(2 * static_cast<size_t>(gg) + 3 * static_cast<size_t>(dg));
    cudaStream_t st = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    cudaGraphExec_t exec = capture_plan_and_experts(*s, st, 1, [&](cudaStream_t stream) {
      return moe_experts_one(s->x->get(), s->plan, s->w.get(), s->gu->get(), s->dn->get(), s->h.get(), s->out.get(),
                             c.N, c.K, c.E, c.H, c.I, stream, stamps.get());
    });
    ASSERT_NE(exec, nullptr);
    s->out.poison();
    for (int rep = 0; rep < 4; ++rep) ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    cudaGraphExecDestroy(exec);
    cudaStreamDestroy(st);
    EXPECT_TRUE(s->bits() == want) << "differs from rows_mma";
    const auto t = stamps.download();
    uint64_t t0 = ~0ull;
    for (int b = 0; b < gg; ++b) t0 = std::min(t0, t[2 * b]);
    auto us = [&](uint64_t v) { return (static_cast<double>(v) - static_cast<double>(t0)) * 1e-3; };
    auto show = [&](const char* name, size_t base, int stride, int n, int k) {
      std::vector<double> v;
      for (int b = 0; b < n; ++b) v.push_back(us(t[base + static_cast<size_t>(stride) * b + k]));
      std::sort(v.begin(), v.end());
      std::printf(" %s %.2f / %.2f / %.2f", name, v.front(), v[v.size() / 2], v.back());
    };
    std::printf("us from the first gate/up start; min / median / max over CTAs\n  gate/up (%d CTAs)", gg);
    show("start", 0, 2, gg, 0);
    show(", end", 0, 2, gg, 1);
    std::printf("\n  down (%d CTAs)", dg);
    const size_t d = 2 * static_cast<size_t>(gg);
    show("entry", d, 3, dg, 0);
    show(", after wait", d, 3, dg, 1);
    show(", end", d, 3, dg, 2);
    std::printf("\n");
  }
}

// Time per replay (printed, not asserted) of a graph of moe_plan and the experts (moe_one) with programmatic launches,
// at the model shape, so the experts' cost alone can be told apart from their cost inside a decode step.
TEST(CudaMoeOne, GraphReplayTimesPrinted) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(110);
  const OneCase c{1, 8, 12, 2048, 768, 0, -1, 0, false};
  const auto s = make_setup(c, rng);
  cudaStream_t st = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t e0, e1;
  ASSERT_EQ(cudaEventCreate(&e0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&e1), cudaSuccess);
  {
    cudaGraphExec_t exec = capture_plan_and_experts(*s, st, 4, [&](cudaStream_t stream) {  // four layers per replay
      return s->run_one(stream);
    });
    ASSERT_NE(exec, nullptr);
    for (int r = 0; r < 5; ++r) ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(e0, st), cudaSuccess);
    constexpr int kReps = 20;
    for (int r = 0; r < kReps; ++r) ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(e1, st), cudaSuccess);
    ASSERT_EQ(cudaEventSynchronize(e1), cudaSuccess);
    float ms = 0.f;
    ASSERT_EQ(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
    cudaGraphExecDestroy(exec);
    std::printf("moe_one: %.2f us per (plan + experts)\n", ms * 1e3 / (kReps * 4));
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(st);
}

TEST(CudaMoeOne, RefusesUnsupportedSizes) {
  ZEST_REQUIRE_GPU();
  EXPECT_FALSE(moe_one_ok(9, 4, 64, 512, 256));    // more than 8 tokens
  EXPECT_FALSE(moe_one_ok(0, 8, 128, 2048, 768));  // no token
  EXPECT_FALSE(moe_one_ok(1, 9, 8, 2048, 768));    // K above E
  EXPECT_FALSE(moe_one_ok(1, 8, 128, 2040, 768));  // H not a multiple of 32
  EXPECT_FALSE(moe_one_ok(1, 8, 128, 2048, 784));  // I not a multiple of 32
  EXPECT_TRUE(moe_one_ok(1, 8, 128, 2048, 768));
  EXPECT_TRUE(moe_one_ok(8, 8, 128, 2048, 768));
  const bf16* none = nullptr;
  MoePlan plan;
  EXPECT_FALSE(moe_experts_one(none, plan, nullptr, none, none, nullptr, nullptr, 9, 8, 128, 2048, 768, nullptr)
                   .is_ok());
}

}  // namespace
}  // namespace zest::cuda::test
#endif
