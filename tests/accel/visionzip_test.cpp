// Tests of src/accel/visionzip: scores against a naive full-matrix softmax, block/thread
// independence, selection against plain sort-based references, contextual merging, gather lists.
#include "accel/visionzip.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>

namespace zest::accel {
namespace {

std::vector<float> random_normal(size_t n, float stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Naive reference: the full softmax matrix per head in double, head-averaged column sums.
std::vector<double> naive_column_scores(const std::vector<float>& q, const std::vector<float>& k,
                                        int64_t n, int64_t nh, int64_t d, double scale,
                                        std::vector<double>* lse_out) {
  std::vector<double> cols(n, 0.0);
  if (lse_out) lse_out->assign(nh * n, 0.0);
  std::vector<double> p(n * n);
  for (int64_t h = 0; h < nh; ++h) {
    for (int64_t i = 0; i < n; ++i) {
      double mx = -1e300;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0.0;
        for (int64_t c = 0; c < d; ++c) dot += double(q[(i * nh + h) * d + c]) * k[(j * nh + h) * d + c];
        p[i * n + j] = scale * dot;
        mx = std::max(mx, p[i * n + j]);
      }
      double z = 0.0;
      for (int64_t j = 0; j < n; ++j) z += std::exp(p[i * n + j] - mx);
      if (lse_out) (*lse_out)[h * n + i] = mx + std::log(z);
      for (int64_t j = 0; j < n; ++j) cols[j] += std::exp(p[i * n + j] - mx) / z;
    }
  }
  for (auto& c : cols) c /= double(nh);
  return cols;
}

struct ScoreCase {
  int64_t grid_h, grid_w, heads, head_dim;
};

TEST(VisionZipScores, MatchNaiveSoftmaxColumnSums) {
  // Patch grids are in units of patches; groups of 2x2 patches are contiguous in tower order,
  // so n_patches = grid_h * grid_w with both even. 6x10 = a 3x5 (odd) LLM grid.
  const ScoreCase cases[] = {{2, 2, 1, 8}, {6, 10, 1, 16}, {6, 10, 3, 8}, {4, 8, 4, 12}, {10, 6, 2, 72}};
  uint32_t seed = 1;
  for (const auto& c : cases) {
    const int64_t n = c.grid_h * c.grid_w;
    const AttentionShape shape{n, c.heads, c.head_dim};
    // stddev 1.5 makes the softmax rows peaky, so column sums differ a lot between patches.
    const auto q = random_normal(n * c.heads * c.head_dim, 1.5f, seed++);
    const auto k = random_normal(n * c.heads * c.head_dim, 1.5f, seed++);
    const float scale = 1.0f / std::sqrt(float(c.head_dim));
    std::vector<double> ref_lse;
    const auto ref = naive_column_scores(q, k, n, c.heads, c.head_dim, scale, &ref_lse);

    auto lse = attention_row_lse(q, k, shape, scale);
    ASSERT_TRUE(lse.ok()) << lse.status().to_string();
    for (int64_t r = 0; r < c.heads * n; ++r) {
      EXPECT_NEAR((*lse)[r], ref_lse[r], 1e-4 * std::max(1.0, std::abs(ref_lse[r]))) << "row " << r;
    }
    auto a = attention_received_scores(q, k, *lse, shape, scale);
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_EQ(a->size(), size_t(n));
    double total = 0.0;
    for (int64_t j = 0; j < n; ++j) {
      // f32 logits and exp against an f64 reference: 1e-4 relative plus a small absolute floor.
      EXPECT_NEAR((*a)[j], ref[j], 1e-4 * ref[j] + 1e-6) << "patch " << j << " n=" << n;
      total += (*a)[j];
    }
    EXPECT_NEAR(total, double(n), 1e-3 * n);

    auto s = merge_group_scores(*a, 4);
    ASSERT_TRUE(s.ok());
    ASSERT_EQ(s->size(), size_t(n / 4));
    for (int64_t m = 0; m < n / 4; ++m) {
      const double want = ref[4 * m] + ref[4 * m + 1] + ref[4 * m + 2] + ref[4 * m + 3];
      EXPECT_NEAR((*s)[m], want, 1e-4 * want + 1e-6);
    }
  }
}

TEST(VisionZipScores, BitIdenticalForAnyKeyBlock) {
  // Different key blocks give different work splits over the thread pool; every a_j must still
  // be reduced in the same order, so the results are bit-identical.
  const int64_t n = 60, nh = 3, d = 8;
  const AttentionShape shape{n, nh, d};
  const auto q = random_normal(n * nh * d, 2.0f, 11);
  const auto k = random_normal(n * nh * d, 2.0f, 12);
  const float scale = 0.35f;
  auto lse = attention_row_lse(q, k, shape, scale);
  ASSERT_TRUE(lse.ok());
  auto base = attention_received_scores(q, k, *lse, shape, scale, n);
  ASSERT_TRUE(base.ok());
  for (int64_t kb : {1, 2, 7, 16, 59, 64, 1000}) {
    auto other = attention_received_scores(q, k, *lse, shape, scale, kb);
    ASSERT_TRUE(other.ok());
    EXPECT_EQ(*other, *base) << "key_block " << kb;
  }
}

TEST(VisionZipScores, BadInputsAreErrors) {
  const AttentionShape shape{8, 2, 4};
  const std::vector<float> q(64, 0.5f), k(64, 0.25f), lse(16, 1.0f);
  EXPECT_FALSE(attention_row_lse(std::span<const float>(q).first(63), k, shape, 0.5f).ok());
  EXPECT_FALSE(attention_row_lse(q, k, AttentionShape{0, 2, 4}, 0.5f).ok());
  EXPECT_FALSE(attention_row_lse(q, k, shape, 0.0f).ok());
  EXPECT_FALSE(attention_received_scores(q, k, std::span<const float>(lse).first(15), shape, 0.5f).ok());
  EXPECT_FALSE(attention_received_scores(q, k, lse, shape, 0.5f, 0).ok());
  std::vector<float> bad = q;
  bad[3] = std::nanf("");
  EXPECT_FALSE(attention_received_scores(bad, k, lse, shape, 0.5f).ok());
  EXPECT_FALSE(merge_group_scores(std::vector<float>(6, 1.0f), 4).ok());
}

// Scores with many ties: small integers plus occasional larger values.
std::vector<float> tie_scores(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> v(0, 6);
  std::vector<float> s(n);
  for (auto& x : s) x = float(v(rng));
  return s;
}

// Reference top-k: sort (score desc, index asc) and keep the first k, returned ascending.
std::vector<int64_t> ref_topk(std::span<const float> s, int64_t k) {
  std::vector<std::pair<float, int64_t>> v;
  for (int64_t i = 0; i < int64_t(s.size()); ++i) v.push_back({-s[i], i});
  std::sort(v.begin(), v.end());
  std::vector<int64_t> out;
  for (int64_t i = 0; i < k; ++i) out.push_back(v[i].second);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(VisionZipSelect, UniformMatchesSortReference) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 60; ++trial) {
    const int n_img = 1 + trial % 4;
    std::vector<int64_t> counts;
    std::vector<float> scores;
    for (int i = 0; i < n_img; ++i) {
      const int64_t m = 1 + int64_t(rng() % 90);
      counts.push_back(m);
      const auto s = trial % 2 ? tie_scores(m, rng()) : random_normal(m, 1.0f, rng());
      for (float x : s) scores.push_back(std::abs(x));
    }
    const int rate_pct = int(rng() % 101);  // rate = rate_pct / 100, exactly as a decimal
    VisionPruneOptions o;
    o.rate = float(rate_pct) / 100.0f;
    o.min_tokens = 1 + int64_t(rng() % 20);
    auto kept = select_vision_tokens(scores, counts, o);
    ASSERT_TRUE(kept.ok()) << kept.status().to_string();
    int64_t off = 0;
    for (int i = 0; i < n_img; ++i) {
      const int64_t m = counts[i];
      const int64_t k = std::max(std::min(m, o.min_tokens), m * (100 - rate_pct) / 100);
      const auto want = ref_topk(std::span<const float>(scores).subspan(off, m), k);
      EXPECT_EQ((*kept)[i], want) << "trial " << trial << " image " << i << " rate " << rate_pct;
      off += m;
    }
  }
}

TEST(VisionZipSelect, RateZeroKeepsEverythingAndDecimalRatesFloorAsWritten) {
  const std::vector<int64_t> counts = {10, 37};
  const auto scores = tie_scores(47, 3);
  for (auto mode : {VisionPruneOptions::Mode::kUniform, VisionPruneOptions::Mode::kGlobal}) {
    VisionPruneOptions o;
    o.mode = mode;
    o.rate = 0.0f;
    auto c = vision_keep_counts(scores, counts, o);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(*c, counts);
  }
  VisionPruneOptions o;
  o.rate = 0.3f;  // 10 * (1 - 0.3) = 7, although 10 * (1 - 0.3f) = 6.9999...
  o.min_tokens = 1;
  auto c = vision_keep_counts(scores, counts, o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0], 7);
  EXPECT_EQ((*c)[1], 37 * 7 / 10);
}

// Independent reference of the global mode: floors by sort, then one sort of every remaining
// token by (normalised score * weight desc, image asc, index asc).
std::vector<std::vector<int64_t>> ref_global(const std::vector<float>& scores,
                                             const std::vector<int64_t>& counts, int64_t budget,
                                             int64_t min_tokens, const std::vector<double>& weight) {
  struct C {
    double key;
    int64_t img, idx;
  };
  std::vector<C> rest;
  std::vector<std::vector<int64_t>> kept(counts.size());
  int64_t off = 0, floor_sum = 0, total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const int64_t m = counts[i], f = std::min(m, min_tokens);
    floor_sum += f;
    total += m;
    const auto s = std::span<const float>(scores).subspan(off, m);
    kept[i] = ref_topk(s, f);
    double sum = 0.0;
    for (float x : s) sum += x;
    // key = s / mean(s) * weight, evaluated as s * (M / sum * weight) so that exact cross-image
    // ties stay exact ties.
    const double factor = (sum > 0 ? double(m) / sum : 1.0) * weight[i];
    for (int64_t j = 0; j < m; ++j) {
      if (std::find(kept[i].begin(), kept[i].end(), j) != kept[i].end()) continue;
      rest.push_back({double(s[j]) * factor, int64_t(i), j});
    }
    off += m;
  }
  budget = std::clamp(budget, floor_sum, total);
  std::sort(rest.begin(), rest.end(), [](const C& a, const C& b) {
    if (a.key != b.key) return a.key > b.key;
    return a.img != b.img ? a.img < b.img : a.idx < b.idx;
  });
  for (int64_t r = 0; r < budget - floor_sum; ++r) kept[rest[r].img].push_back(rest[r].idx);
  for (auto& k : kept) std::sort(k.begin(), k.end());
  return kept;
}

TEST(VisionZipSelect, GlobalMatchesReferenceWithExactBudgetAndFloors) {
  std::mt19937 rng(9);
  for (int trial = 0; trial < 80; ++trial) {
    const int n_img = 1 + trial % 5;
    std::vector<int64_t> counts;
    std::vector<float> scores;
    for (int i = 0; i < n_img; ++i) {
      const int64_t m = 1 + int64_t(rng() % 120);
      counts.push_back(m);
      // Per-image scale differs (column sums of a larger image are larger): normalisation matters.
      const float img_scale = float(1 + rng() % 8);
      const auto s = trial % 3 == 0 ? tie_scores(m, rng()) : random_normal(m, 1.0f, rng());
      for (float x : s) scores.push_back(img_scale * x * x);
    }
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    VisionPruneOptions o;
    o.mode = VisionPruneOptions::Mode::kGlobal;
    o.min_tokens = 1 + int64_t(rng() % 24);
    const int rate_pct = int(rng() % 101);
    o.rate = float(rate_pct) / 100.0f;
    int64_t budget = total * (100 - rate_pct) / 100;
    if (trial % 4 == 1) {
      o.budget = int64_t(rng() % (total + 10));  // absolute, may fall outside the clamp range
      budget = o.budget;
    }
    auto kept = select_vision_tokens(scores, counts, o);
    ASSERT_TRUE(kept.ok()) << kept.status().to_string();
    const auto want = ref_global(scores, counts, budget, o.min_tokens, std::vector<double>(n_img, 1.0));
    EXPECT_EQ(*kept, want) << "trial " << trial;

    int64_t floor_sum = 0, kept_sum = 0;
    for (int i = 0; i < n_img; ++i) {
      const int64_t f = std::min(counts[i], o.min_tokens);
      floor_sum += f;
      kept_sum += int64_t((*kept)[i].size());
      EXPECT_GE(int64_t((*kept)[i].size()), f);
      if (counts[i] <= o.min_tokens) {
        EXPECT_EQ(int64_t((*kept)[i].size()), counts[i]);
      }
      EXPECT_TRUE(std::is_sorted((*kept)[i].begin(), (*kept)[i].end()));
    }
    EXPECT_EQ(kept_sum, std::clamp(budget, floor_sum, total)) << "trial " << trial;
  }
}

TEST(VisionZipSelect, GlobalIsInvariantToPerImageScoreScale) {
  const std::vector<int64_t> counts = {50, 80, 30};
  auto scores = random_normal(160, 1.0f, 21);
  for (auto& x : scores) x = x * x;
  VisionPruneOptions o;
  o.mode = VisionPruneOptions::Mode::kGlobal;
  o.rate = 0.6f;
  o.min_tokens = 4;
  auto base = select_vision_tokens(scores, counts, o);
  ASSERT_TRUE(base.ok());
  for (int64_t j = 50; j < 130; ++j) scores[j] *= 64.0f;  // a power of two keeps ratios exact
  auto scaled = select_vision_tokens(scores, counts, o);
  ASSERT_TRUE(scaled.ok());
  EXPECT_EQ(*scaled, *base);
}

TEST(VisionZipSelect, GlobalTiesGoToTheLowerImage) {
  // Two identical images and an odd number of tokens to share: the lower image gets the extra one.
  const auto one = random_normal(20, 1.0f, 4);
  std::vector<float> scores;
  for (int r = 0; r < 2; ++r) {
    for (float x : one) scores.push_back(std::abs(x));
  }
  VisionPruneOptions o;
  o.mode = VisionPruneOptions::Mode::kGlobal;
  o.min_tokens = 2;
  o.budget = 13;
  auto c = vision_keep_counts(scores, std::vector<int64_t>{20, 20}, o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0], 7);
  EXPECT_EQ((*c)[1], 6);
}

// Reference density, written from the definitions in the header.
double ref_density(std::span<const float> s, DensityMeasure m) {
  double total = 0.0;
  for (float x : s) total += x;
  const double n = double(s.size());
  if (m == DensityMeasure::kEffectiveShare) {
    double h = 0.0;
    for (float x : s) {
      if (x > 0) h -= x / total * std::log(x / total);
    }
    return std::exp(h) / n;
  }
  std::vector<float> v(s.begin(), s.end());
  std::sort(v.rbegin(), v.rend());
  const int64_t top = (int64_t(s.size()) + 9) / 10;
  double top_mass = 0.0;
  for (int64_t i = 0; i < top; ++i) top_mass += v[i];
  return std::max((1.0 - top_mass / total) / (1.0 - top / n), 1.0 / n);
}

TEST(VisionZipSelect, DensityWeightingMatchesReference) {
  std::mt19937 rng(31);
  for (auto measure : {DensityMeasure::kEffectiveShare, DensityMeasure::kTailShare}) {
    for (int trial = 0; trial < 20; ++trial) {
      const int n_img = 2 + trial % 3;
      std::vector<int64_t> counts;
      std::vector<float> scores;
      for (int i = 0; i < n_img; ++i) {
        const int64_t m = 20 + int64_t(rng() % 60);
        counts.push_back(m);
        // Heavy tails of different strength per image give different densities.
        const float sigma = 0.3f + 0.4f * float(i);
        for (float x : random_normal(m, sigma, rng())) scores.push_back(std::exp(x));
      }
      VisionPruneOptions o;
      o.mode = VisionPruneOptions::Mode::kGlobal;
      o.rate = 0.5f;
      o.min_tokens = 4;
      o.density = measure;
      o.density_gamma = 0.75f;
      std::vector<double> dens(n_img), weight(n_img);
      double mean = 0.0;
      int64_t off = 0;
      for (int i = 0; i < n_img; ++i) {
        dens[i] = ref_density(std::span<const float>(scores).subspan(off, counts[i]), measure);
        auto got = image_density(std::span<const float>(scores).subspan(off, counts[i]), measure);
        ASSERT_TRUE(got.ok());
        EXPECT_NEAR(*got, dens[i], 1e-9);
        mean += dens[i] / n_img;
        off += counts[i];
      }
      for (int i = 0; i < n_img; ++i) weight[i] = std::pow(dens[i] / mean, 0.75);
      const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
      auto kept = select_vision_tokens(scores, counts, o);
      ASSERT_TRUE(kept.ok());
      EXPECT_EQ(*kept, ref_global(scores, counts, total / 2, 4, weight)) << "trial " << trial;
    }
  }
  const std::vector<float> flat(40, 2.0f);
  std::vector<float> peak(40, 0.0f);
  peak[7] = 3.0f;
  for (auto measure : {DensityMeasure::kEffectiveShare, DensityMeasure::kTailShare}) {
    EXPECT_NEAR(*image_density(flat, measure), 1.0, 1e-12);
    EXPECT_NEAR(*image_density(peak, measure), 1.0 / 40, 1e-12);
  }
}

TEST(VisionZipSelect, BadOptionsAreErrors) {
  const std::vector<float> s(10, 1.0f);
  const std::vector<int64_t> counts = {10};
  VisionPruneOptions o;
  o.rate = 1.5f;
  EXPECT_FALSE(vision_keep_counts(s, counts, o).ok());
  o = {};
  o.min_tokens = 0;
  EXPECT_FALSE(vision_keep_counts(s, counts, o).ok());
  o = {};
  o.budget = 5;  // uniform mode takes no budget
  EXPECT_FALSE(vision_keep_counts(s, counts, o).ok());
  o = {};
  o.contextual = 1.0f;
  EXPECT_FALSE(vision_keep_counts(s, counts, o).ok());
  EXPECT_FALSE(vision_keep_counts(s, std::vector<int64_t>{9}, VisionPruneOptions{}).ok());
  EXPECT_FALSE(vision_keep_counts(s, std::vector<int64_t>{10, 0}, VisionPruneOptions{}).ok());
  std::vector<float> neg = s;
  neg[2] = -1.0f;
  EXPECT_FALSE(vision_keep_counts(neg, counts, VisionPruneOptions{}).ok());
}

TEST(VisionZipContextual, MatchesReferenceAndStaysInsideEachImage) {
  std::mt19937 rng(77);
  for (int trial = 0; trial < 30; ++trial) {
    const int n_img = 1 + trial % 3;
    const int64_t dim = 3 + trial % 5;
    std::vector<int64_t> counts;
    std::vector<float> scores, emb;
    for (int i = 0; i < n_img; ++i) {
      const int64_t m = 1 + int64_t(rng() % 70);
      counts.push_back(m);
      for (float x : random_normal(m, 1.0f, rng())) scores.push_back(std::abs(x));
      for (float x : random_normal(m * dim, 1.0f, rng())) emb.push_back(x);
    }
    VisionPruneOptions o;
    o.mode = trial % 2 ? VisionPruneOptions::Mode::kGlobal : VisionPruneOptions::Mode::kUniform;
    o.rate = 0.5f;
    o.min_tokens = 3;
    o.contextual = 0.25f;
    auto counts_kept = vision_keep_counts(scores, counts, o);
    ASSERT_TRUE(counts_kept.ok());
    auto plan = plan_vision_tokens(scores, counts, emb, dim, o);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    int64_t off = 0;
    for (int i = 0; i < n_img; ++i) {
      const int64_t m = counts[i], keep = (*counts_kept)[i], n_ctx = keep / 4;
      const auto& toks = (*plan)[i];
      const auto s = std::span<const float>(scores).subspan(off, m);
      const auto e = std::span<const float>(emb).subspan(off * dim, m * dim);
      ASSERT_EQ(int64_t(toks.size()), keep);
      // Reference: dominant = top (keep - n_ctx); anchors by stride among the rest; argmax cosine.
      const auto dom = ref_topk(s, keep - n_ctx);
      std::vector<int64_t> dropped;
      for (int64_t j = 0; j < m; ++j) {
        if (!std::binary_search(dom.begin(), dom.end(), j)) dropped.push_back(j);
      }
      std::vector<int64_t> anchors;
      std::map<int64_t, std::vector<int64_t>> members;
      if (n_ctx > 0) {
        const int64_t step = std::max<int64_t>(1, int64_t(dropped.size()) / n_ctx);
        for (int64_t a = 0; a < n_ctx; ++a) anchors.push_back(dropped[a * step]);
        for (int64_t t : dropped) {
          if (std::find(anchors.begin(), anchors.end(), t) != anchors.end()) continue;
          double best = -2.0;
          int64_t best_a = -1;
          for (int64_t a : anchors) {
            double dot = 0, na = 0, nt = 0;
            for (int64_t c = 0; c < dim; ++c) {
              dot += double(e[t * dim + c]) * e[a * dim + c];
              na += double(e[a * dim + c]) * e[a * dim + c];
              nt += double(e[t * dim + c]) * e[t * dim + c];
            }
            const double cos = dot / std::sqrt(na * nt);
            if (cos > best) {
              best = cos;
              best_a = a;
            }
          }
          members[best_a].push_back(t);
        }
      }
      std::set<int64_t> covered;
      int64_t n_merged = 0;
      int64_t prev = -1;
      for (const auto& t : toks) {
        EXPECT_GT(t.index, prev);
        prev = t.index;
        ASSERT_GE(t.index, 0);
        ASSERT_LT(t.index, m);
        EXPECT_TRUE(covered.insert(t.index).second);
        if (t.merged) {
          ++n_merged;
          EXPECT_NE(std::find(anchors.begin(), anchors.end(), t.index), anchors.end());
          EXPECT_EQ(t.members, members[t.index]);
          for (int64_t mem : t.members) {
            ASSERT_GE(mem, 0);
            ASSERT_LT(mem, m);
            EXPECT_TRUE(covered.insert(mem).second);
          }
        } else {
          EXPECT_TRUE(std::binary_search(dom.begin(), dom.end(), t.index));
        }
      }
      EXPECT_EQ(n_merged, n_ctx);
      // With merged tokens every token of the image is accounted for exactly once.
      if (n_ctx > 0) {
        EXPECT_EQ(int64_t(covered.size()), m);
      }

      auto rows = build_merged_rows(e, dim, toks);
      ASSERT_TRUE(rows.ok());
      for (size_t o_i = 0; o_i < toks.size(); ++o_i) {
        std::vector<int64_t> group = {toks[o_i].index};
        group.insert(group.end(), toks[o_i].members.begin(), toks[o_i].members.end());
        for (int64_t c = 0; c < dim; ++c) {
          double want = 0.0;
          for (int64_t g : group) want += e[g * dim + c];
          want /= double(group.size());
          EXPECT_NEAR((*rows)[o_i * dim + c], want, 1e-6);
        }
      }
      off += m;
    }
  }
}

TEST(VisionZipContextual, ZeroFractionIsPlainSelection) {
  const auto s = tie_scores(33, 8);
  auto toks = contextual_merge(s, {}, 0, 12, 0.0f);
  ASSERT_TRUE(toks.ok());
  EXPECT_EQ(token_positions(*toks), ref_topk(s, 12));
  for (const auto& t : *toks) EXPECT_FALSE(t.merged);
  EXPECT_FALSE(contextual_merge(s, {}, 0, 12, 0.5f).ok());  // merging needs embeddings
  EXPECT_FALSE(contextual_merge(s, {}, 0, 34, 0.0f).ok());
}

TEST(VisionZipGather, GlobalIndexListMatchesPlainLoop) {
  const std::vector<std::vector<int64_t>> kept = {{0, 3, 4}, {}, {1, 2, 9}};
  const std::vector<int64_t> offsets = {5, 20, 40}, counts = {6, 8, 10};
  auto idx = build_gather_index(kept, offsets, counts);
  ASSERT_TRUE(idx.ok());
  std::vector<int64_t> want;
  for (size_t i = 0; i < kept.size(); ++i) {
    for (int64_t j : kept[i]) want.push_back(offsets[i] + j);
  }
  EXPECT_EQ(*idx, want);
  EXPECT_FALSE(build_gather_index(kept, offsets, std::vector<int64_t>{6, 8, 9}).ok());
  EXPECT_FALSE(build_gather_index(kept, std::vector<int64_t>{0, 1}, counts).ok());
}

}  // namespace
}  // namespace zest::accel
