// Per-row sampling summaries: what a decoder step returns instead of host logits when the caller only needs
// the next token of each row. One uniform number u per row (drawn by the caller from the request's own
// seeded generator) plus a small summary of the row decides the token:
//   greedy       -> the argmax (ties to the lowest id);
//   temperature  -> (max, Z = sum_i exp((l_i - max) / T)) and the inverse-CDF walk in token-id order to u * Z;
//   candidates   -> the top C logits sorted (descending, ties to the lower id), plus max and Z over the row;
//                   the caller cuts top-k / top-p and picks from them (engine::Sampler);
//   full         -> the whole row (top_k > kMaxSampleCandidates, or top_p's mass not inside the candidates).
// summarize_row is the host reference; the CUDA decoder computes the same on the device (kernels/cuda/sample.cu).
#pragma once
#include <cstdint>
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

struct SampleRow {
  SampleMode mode = SampleMode::kGreedy;
  double temperature = 1.0;  // > 0 for kTemperature / kCandidates
  int64_t top_k = 0;         // kCandidates: 0 = off
  double top_p = 1.0;        // kCandidates: 1 = off
  double u = 0.0;            // uniform in [0, 1): kTemperature / kCandidates / kFull
  int32_t candidates = 0;    // kCandidates: C = top_k when 0 < top_k <= kMaxSampleCandidates, else 1024 (<= vocab)
};

struct SampleResult {
  int32_t token = -1;          // kGreedy, kTemperature: the token
  float max = 0.f;             // kTemperature, kCandidates: the largest logit
  double z = 0.0;              // kTemperature, kCandidates: sum over the row of exp((l - max) / T)
  std::vector<int32_t> ids;    // kCandidates: C ids, logit descending, ties to the lower id
  std::vector<float> logits;   // kCandidates: their logits; full == true: the whole row
  bool full = false;           // the whole row is in `logits` (kFull, or a candidates row that fell back)
};

// The row's plan for the given sampling parameters (u is set by the caller).
SampleRow plan_sample_row(double temperature, int64_t top_k, double top_p, int64_t vocab);

// The host reference summary of one row of logits[vocab] (f32). Rows that need the whole row (kFull, and
// candidate rows that cannot decide, see candidates_decide) come back with full == true.
SampleResult summarize_row(const float* logits, int64_t vocab, const SampleRow& row);

// The id-order inverse-CDF walk: the first id whose prefix sum of exp((l - max) / T) exceeds u * z, or the last
// id with a positive weight when rounding leaves the target past the end. Accumulates in double.
int32_t temperature_walk(const float* logits, int64_t vocab, float max, double inv_t, double target);

// The number of leading candidates that top-p keeps, from candidate logits sorted descending:
// probabilities exp((l - max) / T) / norm accumulated in order until they reach top_p (norm = the sum over
// the candidates when top_k > 0 or the candidates are the whole row, else z). Returns n when top_p >= 1, and
// -1 when the candidates' mass stays below top_p with a whole-row norm (the whole row is needed).
int64_t top_p_keep(const float* cand_logits, int64_t n, int64_t vocab, const SampleRow& row, double z);

// Whether a candidates summary decides the token (else the whole row is needed).
bool candidates_decide(const SampleRow& row, const SampleResult& r, int64_t vocab);

// The token from a summary (kGreedy / kTemperature: the summary's token; candidates or a full row: the
// top-k / top-p pick with row.u). -1 when the summary cannot decide.
int32_t pick_from_summary(const SampleRow& row, const SampleResult& r, int64_t vocab);

}  // namespace zest::model
