// Critical-expert protection as data (accel::protect_experts) through the re-routing rule, and the forced
// substitution used to rank experts (accel::substitute_expert).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "accel/sere.h"

namespace zest::accel {
namespace {

// Random routings (distinct ids per token, descending weights) and a symmetric similarity in [0.05, 1].
struct Case {
  int64_t n = 24, e = 16, k = 4;
  std::vector<int32_t> ids;
  std::vector<float> w, sim;
};

Case random_case(std::mt19937& rng) {
  Case c;
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  c.sim.assign(c.e * c.e, 1.0f);
  for (int64_t a = 0; a < c.e; ++a)
    for (int64_t b = a + 1; b < c.e; ++b) c.sim[a * c.e + b] = c.sim[b * c.e + a] = u(rng);
  std::vector<int32_t> all(c.e);
  for (int64_t t = 0; t < c.n; ++t) {
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    float left = 1.0f;
    for (int64_t j = 0; j < c.k; ++j) {
      c.ids.push_back(all[j]);
      c.w.push_back(left / 2);
      left /= 2;
    }
  }
  return c;
}

TEST(SereProtect, ProtectedExpertsStayOtherTokensUnchanged) {
  std::mt19937 rng(7);
  const std::vector<int32_t> prot = {1, 4, 9};
  int64_t protected_secondary = 0, rerouted_unprotected = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const Case c = random_case(rng);
    for (float rho : {0.0f, 0.3f, 0.6f}) {
      for (int64_t S : {1, 2}) {
        const SereParams plain{S, rho, {}};
        std::vector<int32_t> ids0 = c.ids, ids1 = c.ids;
        std::vector<float> w0 = c.w, w1 = c.w;
        ASSERT_TRUE(sere_reroute(ids0, w0, c.n, c.k, {}, c.sim, c.e, plain.primary, plain.threshold).ok());
        std::vector<float> sim = c.sim;
        SereParams guarded = plain;
        ASSERT_TRUE(protect_experts(sim, c.e, prot, guarded.threshold).is_ok());
        auto st = sere_reroute(ids1, w1, c.n, c.k, {}, sim, c.e, guarded.primary, guarded.threshold);
        ASSERT_TRUE(st.ok());
        for (int64_t t = 0; t < c.n; ++t) {
          bool has_protected = false;
          for (int64_t j = 0; j < c.k; ++j) {
            const int32_t orig = c.ids[t * c.k + j];
            const bool is_prot = std::find(prot.begin(), prot.end(), orig) != prot.end();
            if (is_prot) {
              // Still in the token with at least its gate weight (a slot re-routed onto it may fold in, and then
              // the later of the two slots becomes -1: the expert itself is never replaced).
              has_protected = true;
              float after = 0.0f;
              for (int64_t i = 0; i < c.k; ++i)
                if (ids1[t * c.k + i] == orig) after += w1[t * c.k + i];
              EXPECT_GE(after, c.w[t * c.k + j]) << "protected expert " << orig << " was re-routed away";
              if (j >= S) ++protected_secondary;
            }
            if (!is_prot && ids0[t * c.k + j] != orig) ++rerouted_unprotected;
          }
          // Protection changes only the rows of protected experts: a token without one is re-routed exactly as
          // before (the similarities here are all above 0, so rho = 0 keeps its meaning).
          if (!has_protected)
            for (int64_t j = 0; j < c.k; ++j) {
              EXPECT_EQ(ids1[t * c.k + j], ids0[t * c.k + j]);
              EXPECT_EQ(w1[t * c.k + j], w0[t * c.k + j]);
            }
        }
      }
    }
  }
  EXPECT_GT(protected_secondary, 100);  // protected experts did sit in re-routable slots
  EXPECT_GT(rerouted_unprotected, 100);  // and re-routing was active
}

TEST(SereProtect, WithoutProtectionTheSameExpertsAreRerouted) {
  // The counterfactual of the test above: the same experts unprotected do get replaced.
  std::mt19937 rng(7);
  int64_t replaced = 0;
  for (int trial = 0; trial < 50; ++trial) {
    Case c = random_case(rng);
    const std::vector<int32_t> orig = c.ids;
    ASSERT_TRUE(sere_reroute(c.ids, c.w, c.n, c.k, {}, c.sim, c.e, 1, 0.0f).ok());
    for (size_t i = 0; i < orig.size(); ++i)
      if ((orig[i] == 1 || orig[i] == 4 || orig[i] == 9) && c.ids[i] != orig[i]) ++replaced;
  }
  EXPECT_GT(replaced, 0);
}

TEST(SereProtect, ThresholdAndErrors) {
  std::vector<float> sim(9, 0.5f);
  float rho = 0.0f;
  ASSERT_TRUE(protect_experts(sim, 3, std::vector<int32_t>{}, rho).is_ok());
  EXPECT_EQ(rho, 0.0f);  // nothing protected: rho = 0 stays off
  ASSERT_TRUE(protect_experts(sim, 3, std::vector<int32_t>{2}, rho).is_ok());
  EXPECT_GT(rho, 0.0f);
  EXPECT_LT(rho, 1e-30f);
  EXPECT_EQ(sim[2 * 3 + 0], -1.0f);
  EXPECT_EQ(sim[2 * 3 + 2], 0.5f);  // the diagonal is left alone
  EXPECT_EQ(sim[0 * 3 + 2], 0.5f);  // and so are the other rows
  float rho2 = 0.4f;
  ASSERT_TRUE(protect_experts(sim, 3, std::vector<int32_t>{0}, rho2).is_ok());
  EXPECT_EQ(rho2, 0.4f);
  EXPECT_FALSE(protect_experts(sim, 3, std::vector<int32_t>{3}, rho2).is_ok());
  EXPECT_FALSE(protect_experts(sim, 3, std::vector<int32_t>{-1}, rho2).is_ok());
  EXPECT_FALSE(protect_experts(sim, 4, std::vector<int32_t>{0}, rho2).is_ok());
}

TEST(SubstituteExpert, HandWorked) {
  // Token 0: 7 in slot 2 becomes 5, which slot 1 already holds: the weight folds into slot 1.
  // Token 1: 7 sits in slot 0, below first_slot: untouched.
  std::vector<int32_t> ids = {2, 5, 7, 1, 7, 2, 0, 3};
  std::vector<float> w = {0.4f, 0.3f, 0.2f, 0.1f, 0.5f, 0.25f, 0.125f, 0.125f};
  EXPECT_EQ(substitute_expert(ids, w, 2, 4, 8, 7, 5, 1), 1);
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 5, -1, 1, 7, 2, 0, 3}));
  EXPECT_EQ(w, (std::vector<float>{0.4f, 0.5f, 0.0f, 0.1f, 0.5f, 0.25f, 0.125f, 0.125f}));
  // Without a duplicate the weight stays in its slot.
  std::vector<int32_t> ids2 = {0, 3};
  std::vector<float> w2 = {0.6f, 0.4f};
  EXPECT_EQ(substitute_expert(ids2, w2, 1, 2, 8, 3, 6, 1), 1);
  EXPECT_EQ(ids2, (std::vector<int32_t>{0, 6}));
  EXPECT_EQ(w2, (std::vector<float>{0.6f, 0.4f}));
}

}  // namespace
}  // namespace zest::accel
