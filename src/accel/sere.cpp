#include "accel/sere.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/thread_pool.h"

namespace zest::accel {
namespace {

bool all_finite(std::span<const float> v) {
  return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

int64_t count_distinct(std::span<const int32_t> ids, int64_t n_tokens, int64_t top_k,
                       std::span<const uint8_t> valid, int64_t n_experts) {
  std::vector<char> seen(static_cast<size_t>(n_experts), 0);
  int64_t n = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (!valid.empty() && valid[t] == 0) continue;
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t e = ids[t * top_k + k];
      if (e >= 0 && e < n_experts && !seen[e]) {
        seen[e] = 1;
        ++n;
      }
    }
  }
  return n;
}

// Index of the pair (p, q), p <= q, in the upper triangle of an n x n matrix, row by row.
int64_t pair_index(int64_t p, int64_t q, int64_t n) { return p * n - p * (p - 1) / 2 + (q - p); }

// Folds a token's repeated experts into their first slot (later slot: id -1, weight 0), in slot order.
void fold_duplicates(int32_t* id, float* w, int64_t top_k, int64_t n_experts) {
  for (int64_t k2 = 1; k2 < top_k; ++k2) {
    if (id[k2] < 0 || id[k2] >= n_experts) continue;
    for (int64_t k = 0; k < k2; ++k) {
      if (id[k] == id[k2]) {
        w[k] += w[k2];
        id[k2] = -1;
        w[k2] = 0.0f;
        break;
      }
    }
  }
}

}  // namespace

Status protect_experts(std::span<float> sim, int64_t n_experts, std::span<const int32_t> protected_ids,
                       float& threshold) {
  if (n_experts < 1 || static_cast<int64_t>(sim.size()) != n_experts * n_experts)
    return invalid_argument("protect_experts: the similarity must be [n_experts, n_experts]");
  for (int32_t u : protected_ids) {
    if (u < 0 || u >= n_experts)
      return invalid_argument("protected expert " + std::to_string(u) + " is outside [0, " +
                              std::to_string(n_experts) + ")");
    for (int64_t v = 0; v < n_experts; ++v)
      if (v != u) sim[static_cast<size_t>(u * n_experts + v)] = -1.0f;
  }
  if (!protected_ids.empty() && threshold <= 0.0f) threshold = std::numeric_limits<float>::min();
  return Status::ok();
}

int64_t substitute_expert(std::span<int32_t> ids, std::span<float> weights, int64_t n_tokens, int64_t top_k,
                          int64_t n_experts, int32_t from, int32_t to, int64_t first_slot) {
  int64_t replaced = 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    int32_t* id = ids.data() + t * top_k;
    bool changed = false;
    for (int64_t k = first_slot; k < top_k; ++k)
      if (id[k] == from) {
        id[k] = to;
        changed = true;
        ++replaced;
      }
    if (changed) fold_duplicates(id, weights.data() + t * top_k, top_k, n_experts);
  }
  return replaced;
}

Status SereParams::validate(int64_t layers) const {
  if (primary < 0) return invalid_argument("SERE primary count S must be >= 0 (got " + std::to_string(primary) + ")");
  if (!std::isfinite(threshold)) return invalid_argument("SERE threshold rho must be finite");
  if (!layer_thresholds.empty() && static_cast<int64_t>(layer_thresholds.size()) != layers)
    return invalid_argument("per-layer SERE thresholds: expected " + std::to_string(layers) + " values, got " +
                            std::to_string(layer_thresholds.size()));
  for (float r : layer_thresholds)
    if (!std::isfinite(r)) return invalid_argument("per-layer SERE thresholds must be finite");
  return Status::ok();
}

Result<RerouteCounts> sere_reroute(std::span<int32_t> ids, std::span<float> weights, int64_t n_tokens, int64_t top_k,
                                   std::span<const uint8_t> valid, std::span<const float> sim, int64_t n_experts,
                                   int64_t primary_count, float threshold) {
  if (n_tokens < 0 || top_k < 1 || n_experts < 1) {
    return invalid_argument("SERE needs n_tokens >= 0, top_k >= 1 and n_experts >= 1 (got " +
                            std::to_string(n_tokens) + ", " + std::to_string(top_k) + ", " +
                            std::to_string(n_experts) + ")");
  }
  const int64_t slots = n_tokens * top_k;
  if (static_cast<int64_t>(ids.size()) != slots || static_cast<int64_t>(weights.size()) != slots) {
    return invalid_argument("topk ids (" + std::to_string(ids.size()) + ") and weights (" +
                            std::to_string(weights.size()) + ") must both hold n_tokens * top_k = " +
                            std::to_string(slots) + " values");
  }
  if (!valid.empty() && static_cast<int64_t>(valid.size()) != n_tokens) {
    return invalid_argument("validity mask has " + std::to_string(valid.size()) +
                            " entries; pass one per token or none");
  }
  if (static_cast<int64_t>(sim.size()) != n_experts * n_experts) {
    return invalid_argument("similarity matrix has " + std::to_string(sim.size()) +
                            " values; [n_experts, n_experts] needs " +
                            std::to_string(n_experts * n_experts) + " (recalibrate for this model)");
  }
  if (!all_finite(sim)) return invalid_argument("similarity matrix holds a NaN or infinity");
  if (primary_count < 0 || !std::isfinite(threshold)) {
    return invalid_argument("SERE needs primary count S >= 0 and a finite threshold rho (got S=" +
                            std::to_string(primary_count) + ", rho=" + std::to_string(threshold) + ")");
  }

  const int64_t e_count = n_experts, s_count = primary_count;
  auto token_valid = [&](int64_t t) { return valid.empty() || valid[t] != 0; };
  auto id_valid = [&](int32_t e) { return e >= 0 && e < e_count; };

  RerouteCounts stats;
  stats.steps = 1;
  for (int64_t t = 0; t < n_tokens; ++t) stats.slots += token_valid(t) ? top_k : 0;
  stats.distinct_before = count_distinct(ids, n_tokens, top_k, valid, e_count);
  std::vector<char> in_p(static_cast<size_t>(e_count), 0);
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (!token_valid(t)) continue;
    for (int64_t k = 0; k < std::min(s_count, top_k); ++k) {
      const int32_t e = ids[t * top_k + k];
      if (id_valid(e)) in_p[e] = 1;
    }
  }
  std::vector<int32_t> primary;
  for (int32_t e = 0; e < e_count; ++e) {
    if (in_p[e]) primary.push_back(e);
  }
  if (s_count == 0 || s_count >= top_k) {
    stats.distinct_after = stats.distinct_before;
    return stats;
  }

  // Expert -> expert map, once per call: target[u] = u means "keep u" (in P, or critical).
  std::vector<int32_t> target(static_cast<size_t>(e_count));
  for (int32_t u = 0; u < e_count; ++u) {
    target[u] = u;
    if (in_p[u] || primary.empty()) continue;
    const float* row = sim.data() + static_cast<int64_t>(u) * e_count;
    int32_t best = primary[0];
    for (int32_t v : primary) {
      if (row[v] > row[best]) best = v;
    }
    if (!(threshold > 0.0f && row[best] < threshold)) target[u] = best;
  }

  std::vector<char> critical(static_cast<size_t>(e_count), 0);
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (!token_valid(t)) continue;
    int32_t* id = ids.data() + t * top_k;
    float* w = weights.data() + t * top_k;
    bool changed = false;
    for (int64_t k = s_count; k < top_k; ++k) {
      const int32_t u = id[k];
      if (!id_valid(u) || in_p[u]) continue;
      if (target[u] == u) {
        critical[u] = 1;
      } else {
        id[k] = target[u];
        ++stats.rerouted_slots;
        changed = true;
      }
    }
    if (changed) fold_duplicates(id, w, top_k, e_count);
  }
  for (char c : critical) stats.critical += c;
  stats.distinct_after = count_distinct(ids, n_tokens, top_k, valid, e_count);
  return stats;
}

Result<ExpertSimilarityAccumulator> ExpertSimilarityAccumulator::create(int64_t n_experts,
                                                                        int64_t hidden,
                                                                        SimilarityMetric metric,
                                                                        int64_t max_state_bytes) {
  if (n_experts < 1 || hidden < 1) {
    return invalid_argument("similarity calibration needs n_experts >= 1 and hidden >= 1 (got " +
                            std::to_string(n_experts) + ", " + std::to_string(hidden) + ")");
  }
  const double e = static_cast<double>(n_experts), h = static_cast<double>(hidden);
  const double bytes = metric == SimilarityMetric::kLinearCka
                           ? 8.0 * (e * h + e * (e + 1.0) / 2.0 * h * h)
                           : 8.0 * e * e;
  if (bytes > static_cast<double>(max_state_bytes)) {
    return resource_exhausted("similarity state needs " + std::to_string(bytes / (1 << 20)) +
                              " MiB, over the limit of " +
                              std::to_string(static_cast<double>(max_state_bytes) / (1 << 20)) +
                              " MiB; use the frobenius or cosine metric, or raise the limit");
  }
  ExpertSimilarityAccumulator acc(n_experts, hidden, metric);
  if (metric == SimilarityMetric::kLinearCka) {
    acc.sums_.assign(static_cast<size_t>(n_experts * hidden), 0.0);
    acc.cross_.assign(static_cast<size_t>(n_experts * (n_experts + 1) / 2 * hidden * hidden), 0.0);
  } else {
    acc.pair_.assign(static_cast<size_t>(n_experts * n_experts), 0.0);
  }
  return acc;
}

Status ExpertSimilarityAccumulator::add_chunk(std::span<const float> outputs, int64_t n_tokens) {
  const int64_t ne = experts_, h = hidden_, t_count = n_tokens;
  if (n_tokens < 0 || static_cast<int64_t>(outputs.size()) != ne * t_count * h) {
    return invalid_argument("expert outputs hold " + std::to_string(outputs.size()) +
                            " values; [n_experts, n_tokens, hidden] = [" + std::to_string(ne) + ", " +
                            std::to_string(n_tokens) + ", " + std::to_string(h) + "] needs " +
                            std::to_string(ne * std::max<int64_t>(t_count, 0) * h));
  }
  if (!all_finite(outputs)) return invalid_argument("expert outputs hold a NaN or infinity");
  auto row = [&](int64_t e, int64_t t) { return outputs.data() + (e * t_count + t) * h; };
  auto dot = [&](const float* a, const float* b) {
    double s = 0.0;
    for (int64_t i = 0; i < h; ++i) s += static_cast<double>(a[i]) * b[i];
    return s;
  };

  if (metric_ == SimilarityMetric::kLinearCka) {
    for (int64_t e = 0; e < ne; ++e) {
      double* s = sums_.data() + e * h;
      for (int64_t t = 0; t < t_count; ++t) {
        const float* a = row(e, t);
        for (int64_t i = 0; i < h; ++i) s[i] += a[i];
      }
    }
    const int64_t n_pairs = ne * (ne + 1) / 2;
    parallel_for(n_pairs, 1, [&](int64_t begin, int64_t end) {
      int64_t p = 0;
      while (pair_index(p, ne - 1, ne) < begin) ++p;
      for (int64_t idx = begin; idx < end; ++idx) {
        while (pair_index(p, ne - 1, ne) < idx) ++p;
        const int64_t q = p + (idx - pair_index(p, p, ne));
        double* c = cross_.data() + idx * h * h;
        for (int64_t t = 0; t < t_count; ++t) {
          const float* a = row(p, t);
          const float* b = row(q, t);
          for (int64_t i = 0; i < h; ++i) {
            const double ai = a[i];
            double* ci = c + i * h;
            for (int64_t j = 0; j < h; ++j) ci[j] += ai * b[j];
          }
        }
      }
    });
  } else {
    std::vector<double> norms;
    if (metric_ == SimilarityMetric::kCosine) {
      norms.resize(static_cast<size_t>(ne * t_count));
      for (int64_t e = 0; e < ne; ++e) {
        for (int64_t t = 0; t < t_count; ++t) norms[e * t_count + t] = std::sqrt(dot(row(e, t), row(e, t)));
      }
    }
    parallel_for(ne, 1, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        for (int64_t q = p; q < ne; ++q) {
          double acc = pair_[p * ne + q];
          for (int64_t t = 0; t < t_count; ++t) {
            const double d = dot(row(p, t), row(q, t));
            if (metric_ == SimilarityMetric::kFrobenius) {
              acc += d;
            } else {
              const double np = norms[p * t_count + t], nq = norms[q * t_count + t];
              if (np > 0.0 && nq > 0.0) acc += d / (np * nq);
            }
          }
          pair_[p * ne + q] = acc;
        }
      }
    });
  }
  tokens_ += t_count;
  return Status::ok();
}

Status ExpertSimilarityAccumulator::add_gram(std::span<const double> gram, int64_t n_tokens) {
  const int64_t ne = experts_;
  if (metric_ == SimilarityMetric::kLinearCka)
    return invalid_argument("linear CKA needs the expert outputs themselves; a pair statistic cannot feed it");
  if (n_tokens < 1 || static_cast<int64_t>(gram.size()) != ne * ne)
    return invalid_argument("pair statistic holds " + std::to_string(gram.size()) + " values for " +
                            std::to_string(n_tokens) + " tokens; [n_experts, n_experts] needs " +
                            std::to_string(ne * ne) + " and at least one token");
  for (double v : gram)
    if (!std::isfinite(v)) return invalid_argument("pair statistic holds a NaN or infinity");
  for (int64_t p = 0; p < ne; ++p)
    for (int64_t q = p; q < ne; ++q) pair_[p * ne + q] += gram[p * ne + q];
  tokens_ += n_tokens;
  return Status::ok();
}

Result<std::vector<float>> ExpertSimilarityAccumulator::similarity() const {
  const int64_t ne = experts_, h = hidden_;
  const int64_t min_tokens = metric_ == SimilarityMetric::kLinearCka ? 2 : 1;
  if (tokens_ < min_tokens) {
    return invalid_argument("similarity needs at least " + std::to_string(min_tokens) +
                            " calibration token(s); " + std::to_string(tokens_) + " were added");
  }
  std::vector<double> s(static_cast<size_t>(ne * ne), 1.0);
  if (metric_ == SimilarityMetric::kFrobenius) {
    std::vector<double> dist(static_cast<size_t>(ne * ne), 0.0);
    double max_d = 0.0;
    for (int64_t p = 0; p < ne; ++p) {
      for (int64_t q = p + 1; q < ne; ++q) {
        const double d2 = pair_[p * ne + p] + pair_[q * ne + q] - 2.0 * pair_[p * ne + q];
        dist[p * ne + q] = std::sqrt(std::max(0.0, d2));
        max_d = std::max(max_d, dist[p * ne + q]);
      }
    }
    for (int64_t p = 0; p < ne; ++p) {
      for (int64_t q = p + 1; q < ne; ++q) {
        s[p * ne + q] = max_d > 0.0 ? 1.0 - dist[p * ne + q] / max_d : 1.0;
      }
    }
  } else if (metric_ == SimilarityMetric::kCosine) {
    for (int64_t p = 0; p < ne; ++p) {
      for (int64_t q = p + 1; q < ne; ++q) {
        s[p * ne + q] = 0.5 * (1.0 + pair_[p * ne + q] / static_cast<double>(tokens_));
      }
    }
  } else {
    const double inv_t = 1.0 / static_cast<double>(tokens_);
    // ||C_pq||_F^2 with C_pq = sum_t A_p[t] A_q[t]^T - T mean_p mean_q^T, the centred cross moment.
    auto centred_sq = [&](int64_t p, int64_t q) {
      const double* c = cross_.data() + pair_index(p, q, ne) * h * h;
      const double* sp = sums_.data() + p * h;
      const double* sq = sums_.data() + q * h;
      double acc = 0.0;
      for (int64_t i = 0; i < h; ++i) {
        for (int64_t j = 0; j < h; ++j) {
          const double v = c[i * h + j] - sp[i] * sq[j] * inv_t;
          acc += v * v;
        }
      }
      return acc;
    };
    std::vector<double> self(static_cast<size_t>(ne));
    for (int64_t p = 0; p < ne; ++p) self[p] = std::sqrt(centred_sq(p, p));
    for (int64_t p = 0; p < ne; ++p) {
      for (int64_t q = p + 1; q < ne; ++q) {
        const double den = self[p] * self[q];
        s[p * ne + q] = den > 0.0 ? std::clamp(centred_sq(p, q) / den, 0.0, 1.0) : 0.0;
      }
    }
  }
  std::vector<float> out(static_cast<size_t>(ne * ne));
  for (int64_t p = 0; p < ne; ++p) {
    out[p * ne + p] = 1.0f;
    for (int64_t q = p + 1; q < ne; ++q) {
      out[p * ne + q] = out[q * ne + p] = static_cast<float>(s[p * ne + q]);
    }
  }
  return out;
}

}  // namespace zest::accel
