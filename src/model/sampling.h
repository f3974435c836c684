// Per-row sampling summaries: what a decoder step returns instead of host logits when the caller only needs
// the next token of each row. One uniform number u per row (drawn by the caller from the request's own
// seeded generator) plus a small summary of the row decides the token:
//   greedy       -> the argmax (ties to the lowest id);
//   temperature  -> (max, Z = sum_i exp((l_i - max) / T)) and the inverse-CDF walk in token-id order to u * Z;
//   candidates   -> the top C logits sorted (descending, ties to the lower id), plus max and Z over the row;
//                   the caller cuts top-k / top-p and picks from them (engine::Sampler);
//   full         -> the whole row (top_k > kMaxSampleCandidates, or top_p's mass not inside the candidates).
// summarize_row is the host reference; the CUDA decoder computes the same on the device (kernels/cuda/sample.cu).
//
// Before the summary a row may be edited (LogitEdit: logit_bias, the min_tokens mask, the repetition, frequency and
// presence penalties; engine::Sampler builds the edits), and a row may ask for log-probabilities of the model's own
// distribution: the log-sum-exp of the raw (unedited, temperature 1) row and its top K raw logits. summarize_edited_row
// is the host reference of both; the CUDA decoder applies the edits with apply_logit_edits (kernels/cuda/sample.cu)
// and computes the log-probability summary with sample_rows on the raw row.
//
// Guided decoding adds a dense mask per row (SampleRow::allowed, one bit per token): after the edits, every token the
// mask leaves out is set to -inf, so the summary and the pick see only the allowed tokens; the log-probabilities stay
// those of the raw row (as vLLM reports them). A row without a mask is summarized exactly as before.
// Header-only: the CUDA library uses these without linking the model library.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

namespace zest::model {

constexpr int32_t kMaxSampleCandidates = 1024;

enum class SampleMode : int32_t {
  kNone = 0,         // the row needs no token (a prefill chunk that does not reach the end of its prompt)
  kGreedy = 1,
  kTemperature = 2,  // top_k = 0, top_p = 1: the token itself is picked by the id-order walk
  kCandidates = 3,   // top-k and/or top-p
  kFull = 4,         // the whole row of logits
};

// One token's edit of a logits row, in this order (vLLM's): l += bias (-inf masks the token); with rep != 1,
// l = l > 0 ? l / rep : l * rep; l -= sub (frequency_penalty * count + presence_penalty * (count > 0)). f32 arithmetic.
struct LogitEdit {
  int32_t id = 0;
  float bias = 0.f;
  float rep = 1.f;
  float sub = 0.f;
};

inline float apply_logit_edit(float l, const LogitEdit& e) {
  l += e.bias;
  if (e.rep != 1.f) l = l > 0.f ? l / e.rep : l * e.rep;
  return l - e.sub;
}

constexpr int32_t kMaxTopLogprobs = 20;

struct SampleRow {
  SampleMode mode = SampleMode::kGreedy;
  double temperature = 1.0;  // > 0 for kTemperature / kCandidates
  int64_t top_k = 0;         // kCandidates: 0 = off
  double top_p = 1.0;        // kCandidates: 1 = off
  double u = 0.0;            // uniform in [0, 1): kTemperature / kCandidates / kFull
  int32_t candidates = 0;    // kCandidates: C = top_k when 0 < top_k <= kMaxSampleCandidates, else 1024 (<= vocab)
  std::vector<LogitEdit> edits;  // applied before the summary; ids distinct, ascending, in [0, vocab)
  int32_t logprobs = -1;         // >= 0: the log-probability summary with this many top raw logits (<= 20)
  // Guided decoding: null = every token may be sampled; else bit t % 32 of word t / 32 says whether token t may be
  // ((vocab + 31) / 32 words); the others get -inf after the edits.
  std::shared_ptr<const std::vector<uint32_t>> allowed;
};

// Whether the row's mask allows token t (always without a mask).
inline bool row_allows(const SampleRow& row, int32_t t) {
  if (!row.allowed) return true;
  const size_t w = static_cast<size_t>(t) >> 5;
  return t >= 0 && w < row.allowed->size() && (((*row.allowed)[w] >> (t & 31)) & 1u) != 0;
}

// logits[t] = -inf for every token the mask leaves out.
inline void apply_token_mask(float* logits, int64_t vocab, const std::vector<uint32_t>& mask) {
  for (int64_t t = 0; t < vocab; ++t) {
    const size_t w = static_cast<size_t>(t) >> 5;
    if (w >= mask.size() || !((mask[w] >> (t & 31)) & 1u)) logits[t] = -INFINITY;
  }
}

struct SampleResult {
  int32_t token = -1;          // kGreedy, kTemperature: the token
  float max = 0.f;             // kTemperature, kCandidates: the largest logit
  double z = 0.0;              // kTemperature, kCandidates: sum over the row of exp((l - max) / T)
  std::vector<int32_t> ids;    // kCandidates: C ids, logit descending, ties to the lower id
  std::vector<float> logits;   // kCandidates: their logits; full == true: the whole row
  bool full = false;           // the whole row is in `logits` (kFull, or a candidates row that fell back)
  float token_logit = 0.f;     // kTemperature: the (edited) logit of `token`
  // Rows with logprobs >= 0: log-sum-exp of the raw row, its top `logprobs` raw logits (descending, ties to the lower
  // id), and the raw logit of each edited id (edits order).
  double lse = 0.0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logits;
  std::vector<float> edit_raw;
};

// The row's plan for the given sampling parameters (u is set by the caller).
inline SampleRow plan_sample_row(double temperature, int64_t top_k, double top_p, int64_t vocab) {
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

// The id-order inverse-CDF walk: the first id whose prefix sum of exp((l - max) / T) exceeds u * z, or the last
// id with a positive weight when rounding leaves the target past the end. Accumulates in double.
inline int32_t temperature_walk(const float* logits, int64_t vocab, float max, double inv_t, double target) {
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

// Helpers of the functions below.
namespace sampling_detail {

// The norm of top-p: the candidates' own sum when they are the whole kept set.
inline bool candidates_are_kept_set(const SampleRow& row, int64_t n, int64_t vocab) { return row.top_k > 0 || n >= vocab; }

// Top-k / top-p pick from candidates sorted descending (the kept set when norm_by_sum, else the first n of the
// row with z over the row); the old full-sort sampler's arithmetic. -1 when the candidates cannot decide.
inline int32_t pick_sorted(const int32_t* ids, const float* logits, int64_t n, bool norm_by_sum, double z,
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
inline std::vector<int32_t> top_ids(const float* logits, int64_t vocab, int64_t n) {
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  auto cmp = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), cmp);
  idx.resize(n);
  return idx;
}

inline int32_t argmax_row(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace sampling_detail

// The number of leading candidates that top-p keeps, from candidate logits sorted descending:
// probabilities exp((l - max) / T) / norm accumulated in order until they reach top_p (norm = the sum over
// the candidates when top_k > 0 or the candidates are the whole row, else z). Returns n when top_p >= 1, and
// -1 when the candidates' mass stays below top_p with a whole-row norm (the whole row is needed).
inline int64_t top_p_keep(const float* cand_logits, int64_t n, int64_t vocab, const SampleRow& row, double z) {
  if (row.top_p >= 1.0 || n <= 0) return n;
  const bool by_sum = sampling_detail::candidates_are_kept_set(row, n, vocab);
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

// Whether a candidates summary decides the token (else the whole row is needed).
inline bool candidates_decide(const SampleRow& row, const SampleResult& r, int64_t vocab) {
  if (r.full) return true;
  const int64_t n = static_cast<int64_t>(r.ids.size());
  if (n == 0 || static_cast<int64_t>(r.logits.size()) != n) return false;
  return top_p_keep(r.logits.data(), n, vocab, row, r.z) >= 0;
}

// The host reference summary of one row of logits[vocab] (f32). Rows that need the whole row (kFull, and
// candidate rows that cannot decide, see candidates_decide) come back with full == true.
inline SampleResult summarize_row(const float* logits, int64_t vocab, const SampleRow& row) {
  SampleResult s;
  switch (row.mode) {
    case SampleMode::kNone: return s;
    case SampleMode::kGreedy:
      s.token = sampling_detail::argmax_row(logits, vocab);
      s.max = logits[s.token];
      return s;
    case SampleMode::kFull:
      s.full = true;
      s.logits.assign(logits, logits + vocab);
      return s;
    default: break;
  }
  const double inv_t = 1.0 / row.temperature;
  s.max = logits[sampling_detail::argmax_row(logits, vocab)];
  for (int64_t i = 0; i < vocab; ++i) s.z += std::exp((static_cast<double>(logits[i]) - s.max) * inv_t);
  if (row.mode == SampleMode::kTemperature) {
    s.token = temperature_walk(logits, vocab, s.max, inv_t, row.u * s.z);
    s.token_logit = logits[s.token];
    return s;
  }
  const int64_t c = std::min<int64_t>(row.candidates, vocab);
  s.ids = sampling_detail::top_ids(logits, vocab, c);
  s.logits.resize(c);
  for (int64_t i = 0; i < c; ++i) s.logits[i] = logits[s.ids[i]];
  if (!candidates_decide(row, s, vocab)) {
    s.ids.clear();
    s.full = true;
    s.logits.assign(logits, logits + vocab);
  }
  return s;
}

namespace sampling_detail {
inline int32_t pick_unmasked(const SampleRow& row, const SampleResult& r, int64_t vocab) {
  switch (row.mode) {
    case SampleMode::kNone: return -1;
    case SampleMode::kGreedy:
      if (r.full && static_cast<int64_t>(r.logits.size()) == vocab) return sampling_detail::argmax_row(r.logits.data(), vocab);
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
    const std::vector<int32_t> ids = sampling_detail::top_ids(r.logits.data(), vocab, k);
    std::vector<float> l(k);
    for (int64_t i = 0; i < k; ++i) l[i] = r.logits[ids[i]];
    return sampling_detail::pick_sorted(ids.data(), l.data(), k, true, 0.0, row);
  }
  const int64_t n = static_cast<int64_t>(r.ids.size());
  if (n == 0 || static_cast<int64_t>(r.logits.size()) != n) return -1;
  return sampling_detail::pick_sorted(r.ids.data(), r.logits.data(), n, sampling_detail::candidates_are_kept_set(row, n, vocab), r.z, row);
}
}  // namespace sampling_detail

// The token from a summary (kGreedy / kTemperature: the summary's token; candidates or a full row: the
// top-k / top-p pick with row.u). -1 when the summary cannot decide. A masked row whose pick lands on a token the mask
// leaves out (top-k / top-p walking past the allowed candidates by rounding, their weights being 0) takes the most
// likely allowed candidate instead; when no token is allowed the pick stands (the caller's grammar refuses it).
inline int32_t pick_from_summary(const SampleRow& row, const SampleResult& r, int64_t vocab) {
  const int32_t t = sampling_detail::pick_unmasked(row, r, vocab);
  if (!row.allowed || t < 0 || row_allows(row, t)) return t;
  if (r.full && static_cast<int64_t>(r.logits.size()) == vocab) {
    int32_t best = -1;
    for (int32_t i = 0; i < static_cast<int32_t>(vocab); ++i)
      if (row_allows(row, i) && (best < 0 || r.logits[i] > r.logits[best])) best = i;
    return best >= 0 ? best : t;
  }
  for (int32_t id : r.ids)
    if (row_allows(row, id)) return id;
  return t;
}

// The log-probability summary of a raw row: log-sum-exp (max + log of the sum of exp(l - max), double) and the top k.
inline void logprob_summary(const float* raw, int64_t vocab, int32_t k, SampleResult& s) {
  const float mx = raw[sampling_detail::argmax_row(raw, vocab)];
  double z = 0;
  for (int64_t i = 0; i < vocab; ++i) z += std::exp(static_cast<double>(raw[i]) - mx);
  s.lse = mx + std::log(z);
  const int64_t n = std::min<int64_t>(std::max<int32_t>(k, 0), vocab);
  s.top_ids = sampling_detail::top_ids(raw, vocab, n);
  s.top_logits.resize(n);
  for (int64_t i = 0; i < n; ++i) s.top_logits[i] = raw[s.top_ids[i]];
}

// The host reference of a row with edits, a mask and log-probabilities: the log-probability summary of the raw row,
// then the summary of the edited and masked row.
inline SampleResult summarize_edited_row(const float* raw, int64_t vocab, const SampleRow& row) {
  if (row.edits.empty() && row.logprobs < 0 && !row.allowed) return summarize_row(raw, vocab, row);
  SampleResult lp;
  if (row.logprobs >= 0) logprob_summary(raw, vocab, row.logprobs, lp);
  SampleResult s;
  if (row.edits.empty() && !row.allowed) {
    s = summarize_row(raw, vocab, row);
  } else {
    std::vector<float> edited(raw, raw + vocab);
    lp.edit_raw.resize(row.edits.size());
    for (size_t i = 0; i < row.edits.size(); ++i) {
      const LogitEdit& e = row.edits[i];
      lp.edit_raw[i] = raw[e.id];
      edited[e.id] = apply_logit_edit(raw[e.id], e);
    }
    if (row.allowed) apply_token_mask(edited.data(), vocab, *row.allowed);
    s = summarize_row(edited.data(), vocab, row);
  }
  s.lse = lp.lse;
  s.top_ids = std::move(lp.top_ids);
  s.top_logits = std::move(lp.top_logits);
  s.edit_raw = std::move(lp.edit_raw);
  return s;
}

// The raw logit of `token`, picked from the row's summary: the saved raw value where the row edited the token, else
// its (unedited) logit in the summary. NaN when the summary does not hold it.
inline float raw_logit_of(const SampleRow& row, const SampleResult& r, int32_t token, int64_t vocab) {
  auto it = std::lower_bound(row.edits.begin(), row.edits.end(), token,
                             [](const LogitEdit& e, int32_t id) { return e.id < id; });
  if (it != row.edits.end() && it->id == token) {
    const size_t k = static_cast<size_t>(it - row.edits.begin());
    return k < r.edit_raw.size() ? r.edit_raw[k] : NAN;
  }
  if (r.full && static_cast<int64_t>(r.logits.size()) == vocab) return r.logits[token];
  if (row.mode == SampleMode::kGreedy && token == r.token) return r.max;
  if (row.mode == SampleMode::kTemperature && token == r.token) return r.token_logit;
  for (size_t i = 0; i < r.ids.size() && i < r.logits.size(); ++i)
    if (r.ids[i] == token) return r.logits[i];
  return NAN;
}

}  // namespace zest::model
