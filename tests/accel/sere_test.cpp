// Tests of src/accel/sere: re-routing against a plain reference on random routings, the no-op
// cases, and the similarity accumulators against direct all-tokens f64 references.
#include "accel/sere.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>

namespace zest::accel {
namespace {

struct Routing {
  int64_t n = 0, k = 0, e = 0;
  std::vector<int32_t> ids;
  std::vector<float> w;
  std::vector<uint8_t> valid;
  std::vector<float> sim;
};

// Random routing: distinct experts per token in descending weight order, some invalid ids,
// some padding tokens, and a symmetric similarity matrix with many ties (values on a 0.25 grid).
Routing random_routing(std::mt19937& rng) {
  Routing r;
  r.n = 1 + rng() % 24;
  r.e = 3 + rng() % 30;
  r.k = 1 + rng() % std::min<int64_t>(8, r.e);
  std::vector<int32_t> perm(r.e);
  for (int64_t t = 0; t < r.n; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<float> w(r.k);
    for (auto& x : w) x = 0.05f + float(rng() % 1000) / 1000.0f;
    std::sort(w.rbegin(), w.rend());
    const float total = std::accumulate(w.begin(), w.end(), 0.0f);
    for (int64_t k = 0; k < r.k; ++k) {
      int32_t id = perm[k];
      if (rng() % 17 == 0) id = rng() % 2 ? -1 : int32_t(r.e + rng() % 5);
      r.ids.push_back(id);
      r.w.push_back(w[k] / total);
    }
    r.valid.push_back(rng() % 6 == 0 ? 0 : 1);
  }
  r.sim.assign(r.e * r.e, 1.0f);
  for (int64_t u = 0; u < r.e; ++u) {
    for (int64_t v = u + 1; v < r.e; ++v) r.sim[u * r.e + v] = r.sim[v * r.e + u] = 0.25f * float(rng() % 5);
  }
  return r;
}

struct RefResult {
  std::vector<int32_t> ids;
  std::vector<float> w;
  std::set<int32_t> p, before, after, critical;
  int64_t rerouted = 0;
};

// Plain reference, written from the description in research/sere.md §1 with simple loops.
RefResult reference_reroute(const Routing& r, int64_t s, float rho) {
  RefResult out;
  out.ids = r.ids;
  out.w = r.w;
  auto ok_id = [&](int32_t x) { return x >= 0 && x < r.e; };
  for (int64_t t = 0; t < r.n; ++t) {
    if (!r.valid[t]) continue;
    for (int64_t k = 0; k < r.k; ++k) {
      if (ok_id(r.ids[t * r.k + k])) {
        out.before.insert(r.ids[t * r.k + k]);
        if (k < s) out.p.insert(r.ids[t * r.k + k]);
      }
    }
  }
  if (s == 0 || s >= r.k) {
    out.after = out.before;
    return out;
  }
  for (int64_t t = 0; t < r.n; ++t) {
    if (!r.valid[t]) continue;
    bool changed = false;
    for (int64_t k = s; k < r.k; ++k) {
      const int32_t u = out.ids[t * r.k + k];
      if (!ok_id(u) || out.p.count(u)) continue;
      int32_t best = -1;
      for (int32_t v : out.p) {  // std::set iterates in ascending order: ties go to the lowest v
        if (best < 0 || r.sim[u * r.e + v] > r.sim[u * r.e + best]) best = v;
      }
      if (best < 0 || (rho > 0 && r.sim[u * r.e + best] < rho)) {
        out.critical.insert(u);
        continue;
      }
      out.ids[t * r.k + k] = best;
      ++out.rerouted;
      changed = true;
    }
    if (!changed) continue;
    for (int64_t k = 0; k < r.k; ++k) {
      const int32_t id = out.ids[t * r.k + k];
      if (!ok_id(id)) continue;
      for (int64_t later = k + 1; later < r.k; ++later) {
        if (out.ids[t * r.k + later] == id) {
          out.w[t * r.k + k] += out.w[t * r.k + later];
          out.ids[t * r.k + later] = -1;
          out.w[t * r.k + later] = 0.0f;
        }
      }
    }
  }
  for (int64_t t = 0; t < r.n; ++t) {
    if (!r.valid[t]) continue;
    for (int64_t k = 0; k < r.k; ++k) {
      if (ok_id(out.ids[t * r.k + k])) out.after.insert(out.ids[t * r.k + k]);
    }
  }
  return out;
}

TEST(SereReroute, MatchesPlainReferenceOnRandomRoutings) {
  std::mt19937 rng(2024);
  int checked_changes = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const Routing r = random_routing(rng);
    const int64_t s = rng() % (r.k + 2);
    const float rhos[] = {0.0f, 0.3f, 0.5f, 1.0f};
    const float rho = rhos[rng() % 4];
    const RefResult want = reference_reroute(r, s, rho);
    std::vector<int32_t> ids = r.ids;
    std::vector<float> w = r.w;
    auto st = sere_reroute(ids, w, r.n, r.k, r.valid, r.sim, r.e, s, rho);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    ASSERT_EQ(ids, want.ids) << "trial " << trial;
    ASSERT_EQ(0, std::memcmp(w.data(), want.w.data(), w.size() * sizeof(float))) << "trial " << trial;
    EXPECT_EQ(st->slots, std::count(r.valid.begin(), r.valid.end(), uint8_t{1}) * r.k);
    EXPECT_EQ(st->distinct_before, int64_t(want.before.size()));
    EXPECT_EQ(st->distinct_after, int64_t(want.after.size()));
    EXPECT_EQ(st->critical, int64_t(want.critical.size()));
    EXPECT_EQ(st->rerouted_slots, want.rerouted);
    if (s > 0 && s < r.k) {
      EXPECT_EQ(st->distinct_after, int64_t(want.p.size()) + st->critical) << "trial " << trial;
    }
    // Padding tokens are never touched.
    for (int64_t t = 0; t < r.n; ++t) {
      if (r.valid[t]) continue;
      for (int64_t k = 0; k < r.k; ++k) EXPECT_EQ(ids[t * r.k + k], r.ids[t * r.k + k]);
    }
    checked_changes += st->rerouted_slots > 0;
  }
  EXPECT_GT(checked_changes, 500);  // the random cases really exercise re-routing
}

TEST(SereReroute, NoOpCasesAreBitIdentical) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const Routing r = random_routing(rng);
    for (int64_t s : {int64_t{0}, r.k, r.k + 3}) {
      std::vector<int32_t> ids = r.ids;
      std::vector<float> w = r.w;
      auto st = sere_reroute(ids, w, r.n, r.k, r.valid, r.sim, r.e, s, 0.0f);
      ASSERT_TRUE(st.ok());
      EXPECT_EQ(0, std::memcmp(ids.data(), r.ids.data(), ids.size() * sizeof(int32_t)));
      EXPECT_EQ(0, std::memcmp(w.data(), r.w.data(), w.size() * sizeof(float)));
      EXPECT_EQ(st->rerouted_slots, 0);
      EXPECT_EQ(st->distinct_after, st->distinct_before);
    }
  }
}

TEST(SereReroute, SingleTokenTopOneCollapsesToOneExpert) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 100; ++trial) {
    const int64_t e = 8 + rng() % 56, k = 2 + rng() % 7;
    std::vector<int32_t> perm(e);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> ids(perm.begin(), perm.begin() + k);
    std::vector<float> w(k);
    for (int64_t i = 0; i < k; ++i) w[i] = float(k - i) / float(k * (k + 1) / 2);
    std::vector<float> sim(e * e);
    std::uniform_real_distribution<float> u01(0.0f, 1.0f);
    for (auto& x : sim) x = u01(rng);
    auto st = sere_reroute(ids, w, 1, k, {}, sim, e, 1, 0.0f);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->distinct_after, 1);
    EXPECT_EQ(ids[0], perm[0]);
    for (int64_t i = 1; i < k; ++i) EXPECT_EQ(ids[i], -1);
    // All the gate mass folds into the one remaining slot.
    EXPECT_NEAR(w[0], 1.0f, 1e-6f);
  }
}

TEST(SereReroute, BadInputsAreErrors) {
  std::vector<int32_t> ids = {0, 1, 2, 3};
  std::vector<float> w = {0.5f, 0.5f, 0.5f, 0.5f};
  std::vector<float> sim(16, 0.5f);
  EXPECT_FALSE(sere_reroute(ids, w, 2, 3, {}, sim, 4, 1, 0.0f).ok());
  EXPECT_FALSE(sere_reroute(ids, w, 2, 2, {}, std::span<const float>(sim).first(15), 4, 1, 0.0f).ok());
  EXPECT_FALSE(sere_reroute(ids, w, 2, 2, std::vector<uint8_t>{1}, sim, 4, 1, 0.0f).ok());
  EXPECT_FALSE(sere_reroute(ids, w, 2, 2, {}, sim, 4, -1, 0.0f).ok());
  sim[5] = std::nanf("");
  EXPECT_FALSE(sere_reroute(ids, w, 2, 2, {}, sim, 4, 1, 0.0f).ok());
}

// Direct references over all tokens at once, in f64, from the definitions in research/sere.md §2.
std::vector<double> ref_similarity(const std::vector<float>& a, int64_t e, int64_t t, int64_t h,
                                   SimilarityMetric metric) {
  auto at = [&](int64_t p, int64_t tok, int64_t i) { return double(a[(p * t + tok) * h + i]); };
  std::vector<double> s(e * e, 1.0);
  if (metric == SimilarityMetric::kFrobenius) {
    std::vector<double> d(e * e, 0.0);
    double mx = 0.0;
    for (int64_t p = 0; p < e; ++p) {
      for (int64_t q = 0; q < e; ++q) {
        double acc = 0.0;
        for (int64_t tok = 0; tok < t; ++tok) {
          for (int64_t i = 0; i < h; ++i) acc += std::pow(at(p, tok, i) - at(q, tok, i), 2);
        }
        d[p * e + q] = std::sqrt(acc);
        if (p != q) mx = std::max(mx, d[p * e + q]);
      }
    }
    for (int64_t p = 0; p < e; ++p) {
      for (int64_t q = 0; q < e; ++q) {
        if (p != q) s[p * e + q] = 1.0 - d[p * e + q] / mx;
      }
    }
  } else if (metric == SimilarityMetric::kCosine) {
    for (int64_t p = 0; p < e; ++p) {
      for (int64_t q = 0; q < e; ++q) {
        if (p == q) continue;
        double acc = 0.0;
        for (int64_t tok = 0; tok < t; ++tok) {
          double dot = 0, np = 0, nq = 0;
          for (int64_t i = 0; i < h; ++i) {
            dot += at(p, tok, i) * at(q, tok, i);
            np += at(p, tok, i) * at(p, tok, i);
            nq += at(q, tok, i) * at(q, tok, i);
          }
          if (np > 0 && nq > 0) acc += dot / std::sqrt(np * nq);
        }
        s[p * e + q] = 0.5 * (1.0 + acc / double(t));
      }
    }
  } else {
    // Centre every expert's [T, H] output over tokens, then the H x H products directly.
    std::vector<double> c(e * t * h);
    for (int64_t p = 0; p < e; ++p) {
      for (int64_t i = 0; i < h; ++i) {
        double mean = 0.0;
        for (int64_t tok = 0; tok < t; ++tok) mean += at(p, tok, i);
        mean /= double(t);
        for (int64_t tok = 0; tok < t; ++tok) c[(p * t + tok) * h + i] = at(p, tok, i) - mean;
      }
    }
    auto frob_sq = [&](int64_t p, int64_t q) {  // ||Xc_q^T Xc_p||_F^2
      double acc = 0.0;
      for (int64_t i = 0; i < h; ++i) {
        for (int64_t j = 0; j < h; ++j) {
          double m = 0.0;
          for (int64_t tok = 0; tok < t; ++tok) m += c[(p * t + tok) * h + i] * c[(q * t + tok) * h + j];
          acc += m * m;
        }
      }
      return acc;
    };
    for (int64_t p = 0; p < e; ++p) {
      for (int64_t q = 0; q < e; ++q) {
        if (p != q) {
          s[p * e + q] = std::clamp(frob_sq(p, q) / (std::sqrt(frob_sq(p, p)) * std::sqrt(frob_sq(q, q))), 0.0, 1.0);
        }
      }
    }
  }
  return s;
}

// Expert outputs with structure: a few base experts, the others noisy copies of them, plus a
// per-expert offset so that centring matters for CKA.
std::vector<float> random_outputs(int64_t e, int64_t t, int64_t h, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> a(e * t * h);
  for (int64_t p = 0; p < e; ++p) {
    const int64_t base = p % 3;
    const float noise = 0.1f * float(p);
    const float offset = nd(rng);
    for (int64_t tok = 0; tok < t; ++tok) {
      for (int64_t i = 0; i < h; ++i) {
        const float shared = std::sin(0.7f * float(tok * h + i) + float(base));
        a[(p * t + tok) * h + i] = shared + noise * nd(rng) + offset;
      }
    }
  }
  return a;
}

TEST(SereCalibration, MatchesDirectReferenceAndChunkingIsExact) {
  const int64_t e = 6, t = 41, h = 5;
  const auto a = random_outputs(e, t, h, 3);
  for (auto metric : {SimilarityMetric::kFrobenius, SimilarityMetric::kCosine, SimilarityMetric::kLinearCka}) {
    const auto want = ref_similarity(a, e, t, h, metric);
    auto whole = ExpertSimilarityAccumulator::create(e, h, metric);
    ASSERT_TRUE(whole.ok());
    ASSERT_TRUE(whole->add_chunk(a, t).is_ok());
    auto sim = whole->similarity();
    ASSERT_TRUE(sim.ok()) << sim.status().to_string();
    for (int64_t p = 0; p < e; ++p) {
      EXPECT_EQ((*sim)[p * e + p], 1.0f);
      for (int64_t q = 0; q < e; ++q) {
        // f32 output of an f64 computation: 1e-6 absolute.
        EXPECT_NEAR((*sim)[p * e + q], want[p * e + q], 1e-6) << "metric " << int(metric) << " p" << p << " q" << q;
        EXPECT_EQ((*sim)[p * e + q], (*sim)[q * e + p]);
      }
    }
    for (int64_t chunk : {1, 4, 17, 40}) {
      auto acc = ExpertSimilarityAccumulator::create(e, h, metric);
      ASSERT_TRUE(acc.ok());
      for (int64_t t0 = 0; t0 < t; t0 += chunk) {
        const int64_t tn = std::min(chunk, t - t0);
        std::vector<float> part(e * tn * h);
        for (int64_t p = 0; p < e; ++p) {
          std::copy(a.begin() + (p * t + t0) * h, a.begin() + (p * t + t0 + tn) * h, part.begin() + p * tn * h);
        }
        ASSERT_TRUE(acc->add_chunk(part, tn).is_ok());
      }
      EXPECT_EQ(acc->tokens_seen(), t);
      auto chunked = acc->similarity();
      ASSERT_TRUE(chunked.ok());
      EXPECT_EQ(*chunked, *sim) << "metric " << int(metric) << " chunk " << chunk;
    }
  }
}

TEST(SereCalibration, PairStatisticFromElsewhereMatchesOutputs) {
  // add_gram with the per-chunk pair statistic (computed here by plain loops, as a device backend would)
  // gives the same similarity as add_chunk on the outputs, for the metrics that support it.
  const int64_t e = 5, t = 23, h = 7;
  const auto a = random_outputs(e, t, h, 9);
  for (auto metric : {SimilarityMetric::kFrobenius, SimilarityMetric::kCosine}) {
    auto direct = ExpertSimilarityAccumulator::create(e, h, metric);
    auto fed = ExpertSimilarityAccumulator::create(e, h, metric);
    ASSERT_TRUE(direct.ok() && fed.ok());
    for (int64_t t0 = 0; t0 < t; t0 += 10) {
      const int64_t tn = std::min<int64_t>(10, t - t0);
      std::vector<float> part(e * tn * h);
      for (int64_t p = 0; p < e; ++p)
        std::copy(a.begin() + (p * t + t0) * h, a.begin() + (p * t + t0 + tn) * h, part.begin() + p * tn * h);
      ASSERT_TRUE(direct->add_chunk(part, tn).is_ok());
      std::vector<double> gram(e * e, 0.0);
      for (int64_t p = 0; p < e; ++p)
        for (int64_t q = 0; q < e; ++q)
          for (int64_t tok = 0; tok < tn; ++tok) {
            double dot = 0, np = 0, nq = 0;
            for (int64_t i = 0; i < h; ++i) {
              const double x = part[(p * tn + tok) * h + i], y = part[(q * tn + tok) * h + i];
              dot += x * y, np += x * x, nq += y * y;
            }
            gram[p * e + q] += metric == SimilarityMetric::kFrobenius ? dot : dot / std::sqrt(np * nq);
          }
      ASSERT_TRUE(fed->add_gram(gram, tn).is_ok());
    }
    EXPECT_EQ(fed->tokens_seen(), t);
    auto s1 = direct->similarity();
    auto s2 = fed->similarity();
    ASSERT_TRUE(s1.ok() && s2.ok());
    for (size_t i = 0; i < s1->size(); ++i) EXPECT_NEAR((*s1)[i], (*s2)[i], 1e-6) << "metric " << int(metric);
  }
  auto cka = ExpertSimilarityAccumulator::create(2, 3, SimilarityMetric::kLinearCka);
  ASSERT_TRUE(cka.ok());
  EXPECT_FALSE(cka->add_gram(std::vector<double>(4, 1.0), 1).is_ok());  // CKA needs the outputs
  auto fro = ExpertSimilarityAccumulator::create(2, 3, SimilarityMetric::kFrobenius);
  ASSERT_TRUE(fro.ok());
  EXPECT_FALSE(fro->add_gram(std::vector<double>(3, 1.0), 1).is_ok());  // wrong size
  EXPECT_FALSE(fro->add_gram(std::vector<double>(4, 1.0), 0).is_ok());  // no tokens
  EXPECT_FALSE(fro->add_gram(std::vector<double>{1.0, std::nan(""), 1.0, 1.0}, 1).is_ok());
}

TEST(SereCalibration, ErrorsAndLimits) {
  EXPECT_FALSE(ExpertSimilarityAccumulator::create(0, 4, SimilarityMetric::kCosine).ok());
  // Linear CKA keeps H x H per pair: 128 experts x hidden 2048 is far over 1 GiB.
  auto big = ExpertSimilarityAccumulator::create(128, 2048, SimilarityMetric::kLinearCka);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE(ExpertSimilarityAccumulator::create(128, 2048, SimilarityMetric::kFrobenius).ok());
  auto acc = ExpertSimilarityAccumulator::create(3, 4, SimilarityMetric::kLinearCka);
  ASSERT_TRUE(acc.ok());
  EXPECT_FALSE(acc->similarity().ok());  // no tokens yet
  EXPECT_FALSE(acc->add_chunk(std::vector<float>(11, 1.0f), 1).is_ok());
  std::vector<float> bad(12, 1.0f);
  bad[4] = std::nanf("");
  EXPECT_FALSE(acc->add_chunk(bad, 1).is_ok());
}

}  // namespace
}  // namespace zest::accel
