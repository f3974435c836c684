// sample_rows (kernels/cuda/sample.cu) against the host reference of model/sampling.h on fresh random bf16
// logits: odd and round vocabulary sizes (the scalar and the 16-byte load paths of the one-CTA kernel, and from 16384
// on the kernel that splits a row over a cluster of 8 CTAs, slices of unequal length included), 1 to 64 rows, every
// mode, rows with many ties (values on a coarse grid; ties across the CTAs' slices), and -0 next to +0.
// Tolerances: argmax, the top-C ids and their logits are exact (the same bf16 values); max is exact;
// Z: |z - z_ref| <= 1e-5 * z_ref (fp32 exponentials against double); the temperature pick is the host's
// id-order walk at a target within 1e-5 relative of u * Z (the two sums round differently, so a target this
// close to a boundary may fall on either side).
#if defined(ZEST_HAVE_CUDA)
#include <algorithm>
#include <cmath>

#include "cuda_test_util.h"
#include "model/sampling.h"

namespace zest::cuda::test {
namespace {

using model::SampleMode;
using model::SampleRow;

struct Case {
  int rows, vocab;
  bool ties;
};

// Random logits as bf16: normal(0, 2.5), or on a grid of 0.25 (many exact ties), with -0 and +0 sprinkled in.
HostBF16 make_logits(int rows, int vocab, bool ties, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 2.5f);
  HostBF16 h;
  h.bits.resize(static_cast<size_t>(rows) * vocab);
  h.f.resize(h.bits.size());
  for (size_t i = 0; i < h.bits.size(); ++i) {
    float v = d(rng);
    if (ties) v = std::round(v * 4.f) / 4.f;
    h.bits[i] = f32_to_bf16(v);
    if (ties && i % 97 == 5) h.bits[i] = (i % 2) ? 0x8000 : 0x0000;
    h.f[i] = bf16_to_f32(h.bits[i]);
  }
  return h;
}

// A plan for row r: the modes in turn, with varied temperatures, top-k and top-p.
SampleRow plan_for(int r, int vocab, std::mt19937& rng) {
  const double temps[] = {0.6, 1.0, 1.7};
  const int64_t ks[] = {0, 1, 2, 7, 50, 1000, 1024};
  const double t = temps[r % 3];
  SampleRow row;
  switch (r % 4) {
    case 0: row = model::plan_sample_row(0.0, 0, 1.0, vocab); break;
    case 1: row = model::plan_sample_row(t, 0, 1.0, vocab); break;
    case 2: row = model::plan_sample_row(t, ks[(r / 4) % 7], 1.0, vocab); break;
    default: row = model::plan_sample_row(t, (r / 4) % 2 ? 40 : 0, 0.9, vocab); break;
  }
  row.u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
  return row;
}

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE("rows " + std::to_string(c.rows) + " vocab " + std::to_string(c.vocab) + (c.ties ? " ties" : ""));
  std::mt19937 rng(seed);
  const HostBF16 h = make_logits(c.rows, c.vocab, c.ties, rng);
  std::vector<SampleRow> plans(c.rows);
  std::vector<SampleRowSpec> specs(c.rows);
  for (int r = 0; r < c.rows; ++r) {
    plans[r] = plan_for(r, c.vocab, rng);
    specs[r].mode = static_cast<int32_t>(plans[r].mode);
    specs[r].candidates = plans[r].candidates;
    specs[r].inv_t = static_cast<float>(1.0 / plans[r].temperature);
    specs[r].u = plans[r].u;
  }
  auto d_logits = upload_bf16(h);
  DevBuf<SampleRowSpec> d_spec(specs);
  DevBuf<SampleRowOut> d_out(c.rows);
  DevBuf<int32_t> d_ids(static_cast<size_t>(c.rows) * kSampleMaxCandidates);
  DevBuf<float> d_cl(static_cast<size_t>(c.rows) * kSampleMaxCandidates);
  d_out.poison();
  d_ids.poison();
  d_cl.poison();
  ZEST_ASSERT_OK(sample_rows(d_logits->get(), c.rows, c.vocab, d_spec.get(), d_out.get(), d_ids.get(), d_cl.get(),
                             nullptr));
  sync_ok();
  const auto out = d_out.download();
  const auto ids = d_ids.download();
  const auto cl = d_cl.download();
  int checked[5] = {0, 0, 0, 0, 0};
  for (int r = 0; r < c.rows; ++r) {
    const float* row = h.f.data() + static_cast<size_t>(r) * c.vocab;
    const SampleRow& p = plans[r];
    SCOPED_TRACE("row " + std::to_string(r) + " mode " + std::to_string(static_cast<int>(p.mode)));
    ++checked[static_cast<int>(p.mode)];
    // The reference summary, candidates never replaced by the whole row.
    SampleRow ref_plan = p;
    ref_plan.top_p = 1.0;
    const model::SampleResult ref = model::summarize_row(row, c.vocab, ref_plan);
    const SampleRowOut& o = out[r];
    if (p.mode == SampleMode::kGreedy) {
      EXPECT_EQ(o.token, ref.token);
      continue;
    }
    EXPECT_EQ(o.max, ref.max);
    EXPECT_NEAR(o.z, ref.z, 1e-5 * ref.z);
    if (p.mode == SampleMode::kTemperature) {
      const double inv_t = 1.0 / p.temperature;
      const double target = p.u * ref.z;
      const int lo = model::temperature_walk(row, c.vocab, ref.max, inv_t, target * (1 - 1e-5));
      const int hi = model::temperature_walk(row, c.vocab, ref.max, inv_t, target * (1 + 1e-5));
      ASSERT_GE(o.token, 0);
      ASSERT_LT(o.token, c.vocab);
      EXPECT_GE(o.token, lo);
      EXPECT_LE(o.token, hi);
      EXPECT_EQ(o.token_logit, row[o.token]);
      continue;
    }
    ASSERT_EQ(p.mode, SampleMode::kCandidates);
    ASSERT_EQ(o.count, p.candidates);
    ASSERT_EQ(ref.ids.size(), static_cast<size_t>(p.candidates));
    for (int i = 0; i < p.candidates; ++i) {
      const size_t at = static_cast<size_t>(r) * kSampleMaxCandidates + i;
      ASSERT_EQ(ids[at], ref.ids[i]) << "candidate " << i;
      ASSERT_EQ(cl[at], ref.logits[i]) << "candidate " << i;
    }
  }
  if (c.rows >= 16) {
    for (int m = 1; m <= 3; ++m) EXPECT_GT(checked[m], 0) << "mode " << m;
  }
}

TEST(SampleRows, MatchesHostReference) {
  ZEST_REQUIRE_GPU();
  const Case cases[] = {{1, 1, false},     {4, 7, false},      {64, 1000, false},  {64, 1000, true},
                        {8, 1023, true},   {64, 4097, false},  {16, 8192, true},   {1, 151936, false},
                        {64, 151936, false}, {64, 151936, true}, {3, 151935, true},  {64, 32000, true},
                        {2, 16384, true},  {16, 40008, true},  {16, 40008, false}, {8, 16376, true}};
  uint32_t seed = 11;
  for (const Case& c : cases)
    for (int rep = 0; rep < 2; ++rep) run_case(c, seed++);
}

TEST(SampleRows, NoneAndFullRowsAreLeftAlone) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(3);
  const HostBF16 h = make_logits(2, 300, false, rng);
  auto d_logits = upload_bf16(h);
  std::vector<SampleRowSpec> specs(2);
  specs[0].mode = kSampleNone;
  specs[1].mode = kSampleFull;
  DevBuf<SampleRowSpec> d_spec(specs);
  DevBuf<SampleRowOut> d_out(2);
  DevBuf<int32_t> d_ids(2 * kSampleMaxCandidates);
  DevBuf<float> d_cl(2 * kSampleMaxCandidates);
  d_out.poison();
  ZEST_ASSERT_OK(sample_rows(d_logits->get(), 2, 300, d_spec.get(), d_out.get(), d_ids.get(), d_cl.get(), nullptr));
  sync_ok();
  for (const SampleRowOut& o : d_out.download()) {
    EXPECT_EQ(o.token, -1);
    EXPECT_EQ(o.count, 0);
  }
  EXPECT_FALSE(sample_rows(d_logits->get(), 0, 300, d_spec.get(), d_out.get(), d_ids.get(), d_cl.get(), nullptr).is_ok());
}

// apply_logit_edits against model::apply_logit_edit on the same bf16 values, rounded to bf16: bit-identical rows (the
// kernel does the host's f32 steps without fused multiply-adds), the replaced logits saved, rows without edits and ids
// that no edit names untouched. Edits cover masks (-inf), biases, repetition both signs, and subtractions.
TEST(LogitEdits, MatchHostReferenceBitForBit) {
  ZEST_REQUIRE_GPU();
  for (const auto& [rows, vocab] : std::vector<std::pair<int, int>>{{1, 7}, {5, 1000}, {9, 151936}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + " vocab " + std::to_string(vocab));
    std::mt19937 rng(static_cast<uint32_t>(rows * 7 + vocab));
    const HostBF16 h = make_logits(rows, vocab, false, rng);
    std::vector<int32_t> begin = {0};
    std::vector<LogitEditSpec> edits;
    std::uniform_real_distribution<float> u(0.f, 1.f);
    for (int r = 0; r < rows; ++r) {
      const int n = r == 1 ? 0 : std::min(vocab, 1 + static_cast<int>(rng() % 700));
      std::vector<int32_t> ids(vocab);
      for (int i = 0; i < vocab; ++i) ids[i] = i;
      std::shuffle(ids.begin(), ids.end(), rng);
      ids.resize(n);
      std::sort(ids.begin(), ids.end());
      for (int32_t id : ids) {
        LogitEditSpec e;
        e.id = id;
        const uint32_t kind = rng() % 5;
        if (kind == 0) e.bias = -INFINITY;
        if (kind == 1 || kind == 4) e.bias = -100.f + 200.f * u(rng);
        if (kind >= 2) e.rep = 0.2f + 2.f * u(rng);
        if (kind >= 3) e.sub = -4.f + 8.f * u(rng);
        edits.push_back(e);
      }
      begin.push_back(static_cast<int32_t>(edits.size()));
    }
    auto d_logits = upload_bf16(h);
    DevBuf<int32_t> d_begin(begin);
    DevBuf<LogitEditSpec> d_edits(edits);
    DevBuf<float> d_raw(std::max<size_t>(edits.size(), 1));
    d_raw.poison();
    ZEST_ASSERT_OK(apply_logit_edits(d_logits->get(), rows, vocab, d_begin.get(), d_edits.get(), d_raw.get(), nullptr));
    sync_ok();
    const std::vector<float> got = download_bf16(*d_logits);
    const std::vector<float> raw = d_raw.download();
    std::vector<float> want = h.f;
    for (int r = 0; r < rows; ++r)
      for (int i = begin[r]; i < begin[r + 1]; ++i) {
        const LogitEditSpec& e = edits[i];
        const size_t at = static_cast<size_t>(r) * vocab + e.id;
        ASSERT_EQ(raw[i], h.f[at]) << "saved raw logit of edit " << i;
        model::LogitEdit me;
        me.id = e.id;
        me.bias = e.bias;
        me.rep = e.rep;
        me.sub = e.sub;
        want[at] = bf16_to_f32(f32_to_bf16(model::apply_logit_edit(h.f[at], me)));
      }
    size_t diff = 0;
    for (size_t i = 0; i < want.size(); ++i)
      diff += !(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])));
    EXPECT_EQ(diff, 0u);
  }
}


// apply_token_masks (guided decoding) against model::apply_token_mask, then sample_rows on the masked rows against the
// host reference's picks (model::summarize_edited_row with the mask): masked rows are bit-identical (-inf exactly where
// a bit is clear, every other logit untouched), a row with mask_row -1 is untouched; greedy and candidates picks equal
// the host's exactly (the same bf16 values), temperature picks lie in the 1e-5 target window (Z sums differ in order);
// every pick is allowed. Masks: one allowed id, a handful, about half the vocabulary, all but the argmax.
TEST(TokenMasks, DevicePicksTheHostTokensUnderAMask) {
  ZEST_REQUIRE_GPU();
  for (const int vocab : {1000, 4097, 151936}) {
    SCOPED_TRACE("vocab " + std::to_string(vocab));
    const int rows = 12, W = (vocab + 31) / 32;
    std::mt19937 rng(static_cast<uint32_t>(vocab));
    const HostBF16 h = make_logits(rows, vocab, vocab == 4097, rng);
    std::vector<int32_t> mask_row(rows, -1);
    std::vector<uint32_t> masks;
    std::vector<std::shared_ptr<const std::vector<uint32_t>>> allowed(rows);
    for (int r = 0; r < rows; ++r) {
      if (r % 6 == 5) continue;  // unmasked
      std::vector<uint32_t> m(static_cast<size_t>(W), 0u);
      const int kind = r % 4;
      const float* row = h.f.data() + static_cast<size_t>(r) * vocab;
      const int top = static_cast<int>(std::max_element(row, row + vocab) - row);
      auto set = [&](int id) { m[id >> 5] |= 1u << (id & 31); };
      if (kind == 0) set(static_cast<int>(rng() % vocab));
      if (kind == 1)
        for (int k = 0; k < 7; ++k) set(static_cast<int>(rng() % vocab));
      if (kind == 2)
        for (int id = 0; id < vocab; ++id)
          if (rng() % 2) set(id);
      if (kind == 3) {
        for (int id = 0; id < vocab; ++id) set(id);
        m[top >> 5] &= ~(1u << (top & 31));
      }
      if (vocab % 32) m.back() |= ~0u << (vocab % 32);  // bits past the vocabulary are ignored
      mask_row[r] = static_cast<int32_t>(masks.size() / W);
      masks.insert(masks.end(), m.begin(), m.end());
      allowed[r] = std::make_shared<const std::vector<uint32_t>>(std::move(m));
    }
    std::vector<SampleRow> plans(rows);
    std::vector<SampleRowSpec> specs(rows);
    for (int r = 0; r < rows; ++r) {
      switch (r % 3) {
        case 0: plans[r] = model::plan_sample_row(0.0, 0, 1.0, vocab); break;
        case 1: plans[r] = model::plan_sample_row(0.8, 0, 1.0, vocab); break;
        default: plans[r] = model::plan_sample_row(1.0, 30, 0.95, vocab); break;
      }
      plans[r].u = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
      plans[r].allowed = allowed[r];
      specs[r].mode = static_cast<int32_t>(plans[r].mode);
      specs[r].candidates = plans[r].candidates;
      specs[r].inv_t = static_cast<float>(1.0 / plans[r].temperature);
      specs[r].u = plans[r].u;
    }
    auto d_logits = upload_bf16(h);
    DevBuf<int32_t> d_row(mask_row);
    DevBuf<uint32_t> d_masks(masks.empty() ? std::vector<uint32_t>(1) : masks);
    ZEST_ASSERT_OK(apply_token_masks(d_logits->get(), rows, vocab, W, d_row.get(), d_masks.get(), nullptr));
    sync_ok();
    const std::vector<float> masked = download_bf16(*d_logits);
    std::vector<float> want = h.f;
    for (int r = 0; r < rows; ++r)
      if (allowed[r]) model::apply_token_mask(want.data() + static_cast<size_t>(r) * vocab, vocab, *allowed[r]);
    size_t diff = 0;
    for (size_t i = 0; i < want.size(); ++i) diff += !(masked[i] == want[i]);
    EXPECT_EQ(diff, 0u);
    DevBuf<SampleRowSpec> d_spec(specs);
    DevBuf<SampleRowOut> d_out(rows);
    DevBuf<int32_t> d_ids(static_cast<size_t>(rows) * kSampleMaxCandidates);
    DevBuf<float> d_cl(static_cast<size_t>(rows) * kSampleMaxCandidates);
    ZEST_ASSERT_OK(sample_rows(d_logits->get(), rows, vocab, d_spec.get(), d_out.get(), d_ids.get(), d_cl.get(), nullptr));
    sync_ok();
    const auto out = d_out.download();
    const auto ids = d_ids.download();
    const auto cl = d_cl.download();
    for (int r = 0; r < rows; ++r) {
      SCOPED_TRACE("row " + std::to_string(r));
      const SampleRow& p = plans[r];
      const model::SampleResult ref = model::summarize_edited_row(h.f.data() + static_cast<size_t>(r) * vocab, vocab, p);
      const int32_t want_tok = model::pick_from_summary(p, ref, vocab);
      model::SampleResult dev;
      dev.token = out[r].token;
      dev.max = out[r].max;
      dev.z = out[r].z;
      dev.token_logit = out[r].token_logit;
      if (p.mode == SampleMode::kCandidates) {
        const size_t at = static_cast<size_t>(r) * kSampleMaxCandidates;
        dev.ids.assign(ids.begin() + at, ids.begin() + at + out[r].count);
        dev.logits.assign(cl.begin() + at, cl.begin() + at + out[r].count);
        if (!model::candidates_decide(p, dev, vocab)) {
          dev.ids.clear();
          dev.full = true;
          dev.logits.assign(masked.begin() + static_cast<size_t>(r) * vocab, masked.begin() + static_cast<size_t>(r + 1) * vocab);
        }
      }
      const int32_t tok = model::pick_from_summary(p, dev, vocab);
      ASSERT_GE(tok, 0);
      EXPECT_TRUE(model::row_allows(p, tok)) << "token " << tok;
      if (p.mode == SampleMode::kTemperature) {
        const float* row = want.data() + static_cast<size_t>(r) * vocab;
        const double target = p.u * ref.z;
        EXPECT_GE(tok, model::temperature_walk(row, vocab, ref.max, 1.0 / p.temperature, target * (1 - 1e-5)));
        EXPECT_LE(tok, model::temperature_walk(row, vocab, ref.max, 1.0 / p.temperature, target * (1 + 1e-5)));
      } else {
        EXPECT_EQ(tok, want_tok);
      }
    }
  }
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
