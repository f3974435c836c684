#include "model/sampling.h"

#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace zest::model {

SampleRow plan_sample_row(double temperature, int64_t top_k, double top_p, int64_t vocab) {
  SampleRow r;
  r.temperature = temperature;
  r.top_k = top_k;
  r.top_p = top_p;
  if (temperature <= 0.0 || top_k == 1) {
    r.mode = SampleMode::kGreedy;
  } else if (top_k <= 0 && top_p >= 1.0) {
    r.mode = SampleMode::kTemperature;
  } else if (top_k > kMaxSampleCandidates) {
    r.mode = SampleMode::kFull;
  } else {
    r.mode = SampleMode::kCandidates;
    const int64_t c = top_k > 0 ? top_k : kMaxSampleCandidates;
    r.candidates = static_cast<int32_t>(std::min<int64_t>(c, vocab));
  }
  return r;
}

int32_t temperature_walk(const float* logits, int64_t vocab, float max, double inv_t, double target) {
  double cum = 0;
  int64_t last = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    const double w = std::exp((static_cast<double>(logits[i]) - max) * inv_t);
    if (w > 0) last = i;
    cum += w;
    if (cum > target) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last >= 0 ? last : 0);
}

namespace {

// The norm of top-p: the candidates' own sum when they are the whole kept set.
bool candidates_are_kept_set(const SampleRow& row, int64_t n, int64_t vocab) { return row.top_k > 0 || n >= vocab; }

// Top-k / top-p pick from candidates sorted descending (the kept set when norm_by_sum, else the first n of the
// row with z over the row); the old full-sort sampler's arithmetic. -1 when the candidates cannot decide.
int32_t pick_sorted(const int32_t* ids, const float* logits, int64_t n, bool norm_by_sum, double z,
                    const SampleRow& row) {
  if (n <= 0) return -1;
  const double inv_t = 1.0 / row.temperature;
  const double mx = logits[0];
  std::vector<double> prob(n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += prob[i] = std::exp((logits[i] - mx) * inv_t);
  const double norm = norm_by_sum ? sum : z;
  int64_t keep = n;
  if (row.top_p < 1.0) {
    double cum = 0;
    int64_t cut = -1;
    for (int64_t i = 0; i < n; ++i) {
      cum += prob[i] / norm;
      if (cum >= row.top_p) {
        cut = i + 1;
        break;
      }
    }
    if (cut < 0 && !norm_by_sum) return -1;
    if (cut > 0) keep = cut;
  }
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) total += prob[i];
  double r = row.u * total;
  for (int64_t i = 0; i < keep; ++i) {
    r -= prob[i];
    if (r <= 0) return ids[i];
  }
  return ids[keep - 1];
}

// Ids of the top n logits, descending, ties to the lower id.
std::vector<int32_t> top_ids(const float* logits, int64_t vocab, int64_t n) {
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  auto cmp = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), cmp);
  idx.resize(n);
  return idx;
}

int32_t argmax_row(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace

int64_t top_p_keep(const float* cand_logits, int64_t n, int64_t vocab, const SampleRow& row, double z) {
  if (row.top_p >= 1.0 || n <= 0) return n;
  const bool by_sum = candidates_are_kept_set(row, n, vocab);
  const double inv_t = 1.0 / row.temperature;
  const double mx = cand_logits[0];
  std::vector<double> prob(n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += prob[i] = std::exp((cand_logits[i] - mx) * inv_t);
  const double norm = by_sum ? sum : z;
  double cum = 0;
  for (int64_t i = 0; i < n; ++i) {
    cum += prob[i] / norm;
    if (cum >= row.top_p) return i + 1;
  }
  return by_sum ? n : -1;
}

bool candidates_decide(const SampleRow& row, const SampleResult& r, int64_t vocab) {
  if (r.full) return true;
  const int64_t n = static_cast<int64_t>(r.ids.size());
  if (n == 0 || static_cast<int64_t>(r.logits.size()) != n) return false;
  return top_p_keep(r.logits.data(), n, vocab, row, r.z) >= 0;
}

SampleResult summarize_row(const float* logits, int64_t vocab, const SampleRow& row) {
  SampleResult s;
  switch (row.mode) {
    case SampleMode::kNone: return s;
    case SampleMode::kGreedy: s.token = argmax_row(logits, vocab); return s;
    case SampleMode::kFull:
      s.full = true;
      s.logits.assign(logits, logits + vocab);
      return s;
    default: break;
  }
  const double inv_t = 1.0 / row.temperature;
  s.max = logits[argmax_row(logits, vocab)];
  for (int64_t i = 0; i < vocab; ++i) s.z += std::exp((static_cast<double>(logits[i]) - s.max) * inv_t);
  if (row.mode == SampleMode::kTemperature) {
    s.token = temperature_walk(logits, vocab, s.max, inv_t, row.u * s.z);
    return s;
  }
  const int64_t c = std::min<int64_t>(row.candidates, vocab);
  s.ids = top_ids(logits, vocab, c);
  s.logits.resize(c);
  for (int64_t i = 0; i < c; ++i) s.logits[i] = logits[s.ids[i]];
  if (!candidates_decide(row, s, vocab)) {
    s.ids.clear();
    s.full = true;
    s.logits.assign(logits, logits + vocab);
  }
  return s;
}

int32_t pick_from_summary(const SampleRow& row, const SampleResult& r, int64_t vocab) {
  switch (row.mode) {
    case SampleMode::kNone: return -1;
    case SampleMode::kGreedy:
      if (r.full && static_cast<int64_t>(r.logits.size()) == vocab) return argmax_row(r.logits.data(), vocab);
      return r.token;
    case SampleMode::kTemperature:
      if (r.full && static_cast<int64_t>(r.logits.size()) == vocab) {
        const SampleResult s = summarize_row(r.logits.data(), vocab, row);
        return s.token;
      }
      return r.token;
    default: break;
  }
  if (r.full) {
    if (static_cast<int64_t>(r.logits.size()) != vocab) return -1;
    // The whole kept set sorted: top_k (when set) or the whole row.
    const int64_t k = row.top_k > 0 ? std::min<int64_t>(row.top_k, vocab) : vocab;
    const std::vector<int32_t> ids = top_ids(r.logits.data(), vocab, k);
    std::vector<float> l(k);
    for (int64_t i = 0; i < k; ++i) l[i] = r.logits[ids[i]];
    return pick_sorted(ids.data(), l.data(), k, true, 0.0, row);
  }
  const int64_t n = static_cast<int64_t>(r.ids.size());
  if (n == 0 || static_cast<int64_t>(r.logits.size()) != n) return -1;
  return pick_sorted(r.ids.data(), r.logits.data(), n, candidates_are_kept_set(row, n, vocab), r.z, row);
}

}  // namespace zest::model

// ---- TextDecoder::forward_sample (default: host logits, host summaries) ---------------------------------

namespace zest::model {

Result<std::vector<SampleResult>> TextDecoder::forward_sample(const ForwardBatch& batch, PagedKVCache& cache,
                                                              const MoeHooks* hooks,
                                                              const std::vector<SampleRow>& rows) const {
  ZEST_ASSIGN_OR_RETURN(Tensor logits, forward(batch, cache, hooks));
  const int64_t R = logits.dim(0), V = logits.dim(1);
  if (static_cast<int64_t>(rows.size()) != R)
    return invalid_argument("forward_sample: " + std::to_string(rows.size()) + " row plans for " + std::to_string(R) +
                            " logits rows");
  std::vector<SampleResult> out(R);
  for (int64_t r = 0; r < R; ++r) out[r] = summarize_row(logits.data<float>() + r * V, V, rows[r]);
  return out;
}

}  // namespace zest::model
