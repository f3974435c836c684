// VisionZip for Qwen-VL vision towers: attention-received scores (from q, k and the row
// log-sum-exp, without materialising the attention matrix), per-image or request-global token
// selection with floors, optional contextual (merged) tokens, and the gather index lists the
// engine uses for embeddings, deepstack features and M-RoPE position rows.
// Pure CPU functions over plain row-major f32 arrays; see docs/visionzip.md.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace zest::accel {

// The decimal a float was written as (0.3f -> 0.3), so fractions of counts floor as users expect.
double decimal_value(float f);
// floor(m * frac) with a guard against the last-bit error of the product. Every VisionZip count (CPU
// and device selection) is computed with these two, so both agree on every rate.
int64_t floor_fraction(int64_t m, double frac);

// q/k of ONE image at the scoring vision block, after rotary: [n_patches, heads, head_dim] f32.
struct AttentionShape {
  int64_t n_patches = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
};

// Row log-sum-exp of the scaled logits: lse[h][i] = ln sum_j exp(scale * q_{i,h} . k_{j,h})
// (natural log, the quantity FlashAttention returns). Returns [heads, n_patches] f32.
Result<std::vector<float>> attention_row_lse(std::span<const float> q, std::span<const float> k,
                                             const AttentionShape& shape, float scale);

// Attention mass each patch receives, head-averaged column sum of the softmax:
// a_j = (1/H) * sum_h sum_i exp(scale * q_{i,h} . k_{j,h} - lse[h][i]). lse is [heads, n_patches]
// (natural log). Returns [n_patches] f32; sum_j a_j = n_patches when lse is exact.
// Each a_j is reduced in a fixed order (head ascending, then query ascending, in f64), so the
// result is bit-identical for any thread count and any key_block (keys per work item, >= 1).
Result<std::vector<float>> attention_received_scores(std::span<const float> q,
                                                     std::span<const float> k,
                                                     std::span<const float> lse,
                                                     const AttentionShape& shape, float scale,
                                                     int64_t key_block = 64);

// LLM-token scores: s_m = sum of patch_scores over [m*group_size, (m+1)*group_size), i.e. the
// group_size (= spatial_merge_size^2 = 4) consecutive patches in tower order that the patch
// merger fuses into LLM token m. Returns [n_patches / group_size] f32.
Result<std::vector<float>> merge_group_scores(std::span<const float> patch_scores,
                                              int64_t group_size = 4);

// How an image's information density is measured for the optional global-budget weighting.
// kTailShare is the recommended one: on synthetic score distributions it separates flat from
// peaky images as well as the entropy measure, but does not depend on the image size and moves
// less under attention sinks (tests/accel/tools/density_eval.py, docs/visionzip.md).
enum class DensityMeasure {
  kNone,            // no weighting
  kEffectiveShare,  // exp(entropy of s / sum s) / M: share of tokens that carry the attention
  kTailShare,       // 1 - share of the total score held by the top ceil(M/10) tokens
};

struct VisionPruneOptions {
  enum class Mode {
    kUniform,  // every image keeps k_i = max(min(M_i, min_tokens), floor(M_i * (1 - rate)))
    kGlobal,   // one budget B shared by all images of the request (docs/visionzip.md)
  };
  // Fraction of LLM tokens dropped, in [0, 1]. 0 keeps everything. Read as the decimal it was
  // written as (0.3f means 0.3), so floor(10 * (1 - 0.3)) is 7.
  float rate = 0.0f;
  Mode mode = Mode::kUniform;
  // kGlobal only: absolute number of LLM tokens kept over all images; -1 = floor((1 - rate) *
  // sum M_i). Clamped to [sum of floors, sum M_i].
  int64_t budget = -1;
  // Floor per image: min(M_i, min_tokens) tokens are always kept (>= 1); images with
  // M_i <= min_tokens are never pruned.
  int64_t min_tokens = 16;
  // Fraction in [0, 1) of each image's kept count that becomes contextual (merged) tokens.
  float contextual = 0.0f;
  // kGlobal only: normalised scores of image i are multiplied by (d_i / mean_i d_i)^density_gamma,
  // d_i = density of image i. kNone or gamma 0 disables it.
  DensityMeasure density = DensityMeasure::kNone;
  float density_gamma = 0.5f;
  // The vision block whose attention scores the tokens; negative counts from the end of the tower.
  int64_t score_layer = -2;
};

// Density d_i in (0, 1] of one image's LLM-token scores (higher = attention spread over more
// tokens). kNone returns 1.
Result<double> image_density(std::span<const float> scores, DensityMeasure measure);

// Number of LLM tokens each image keeps. `scores` holds the LLM-token scores of all images of one
// request back to back (image i has tokens_per_image[i] entries; scores finite and >= 0).
Result<std::vector<int64_t>> vision_keep_counts(std::span<const float> scores,
                                                std::span<const int64_t> tokens_per_image,
                                                const VisionPruneOptions& options);

// Kept LLM-token indices per image (image-local, ascending). Within an image the kept tokens
// are always its top-k_i by score, ties to the lower index; in kGlobal mode the tokens beyond
// the floors go to the highest score / (mean score of its image) [* density weight] across
// images, ties to the lower image then the lower index. options.contextual is ignored here
// (the counts include the tokens that plan_vision_tokens turns into merged tokens).
Result<std::vector<std::vector<int64_t>>> select_vision_tokens(
    std::span<const float> scores, std::span<const int64_t> tokens_per_image,
    const VisionPruneOptions& options);

// One output LLM token of an image: a kept token, or a contextual token that averages an anchor
// and its members and sits at the anchor's position.
struct VisionToken {
  int64_t index = 0;             // image-local position: the kept token, or the anchor
  bool merged = false;           // true for a contextual token
  std::vector<int64_t> members;  // contextual token only: the non-anchor members, ascending
};

// Contextual merging inside ONE image: of `keep` tokens, c = floor(fraction * keep) become merged
// tokens. Dominant = top (keep - c) by score (ties to the lower index); c anchors are taken by
// stride floor(R / c) among the R dropped tokens in index order; every other dropped token joins
// the anchor with the highest cosine similarity of the post-merger embeddings [M, dim] (ties to
// the lower anchor; a zero vector has similarity 0 to everything). Returns the output tokens in
// ascending position order. fraction 0 returns the top-`keep` tokens unmerged.
Result<std::vector<VisionToken>> contextual_merge(std::span<const float> scores,
                                                  std::span<const float> embeddings, int64_t dim,
                                                  int64_t keep, float fraction);

// Selection plus contextual merging for all images of a request. embeddings: the post-merger
// embeddings of all images back to back [sum M_i, dim]; only read when options.contextual > 0
// (pass an empty span and dim 0 otherwise). Returns the output tokens per image.
Result<std::vector<std::vector<VisionToken>>> plan_vision_tokens(
    std::span<const float> scores, std::span<const int64_t> tokens_per_image,
    std::span<const float> embeddings, int64_t dim, const VisionPruneOptions& options);

// Output rows [n_out, dim] for one image: a kept token copies its row of `rows` [M, dim]; a
// merged token is the plain mean (f64 accumulation) of its anchor's and members' rows. Works for
// the main embeddings and for every deepstack feature tensor alike.
Result<std::vector<float>> build_merged_rows(std::span<const float> rows, int64_t dim,
                                             std::span<const VisionToken> tokens);

// Global gather index list: for image i and each kept local index j (in order), emits
// offsets[i] + j. offsets[i] is where image i's tokens start in the tensor being gathered
// (vision-tower output rows, deepstack rows, or the columns of the [3, seq] M-RoPE positions);
// counts[i] = M_i bounds the local indices.
Result<std::vector<int64_t>> build_gather_index(std::span<const std::vector<int64_t>> kept,
                                                std::span<const int64_t> offsets,
                                                std::span<const int64_t> counts);

// Image-local positions of output tokens (kept index or anchor index), in order: the kept list to
// give build_gather_index when contextual tokens are used.
std::vector<int64_t> token_positions(std::span<const VisionToken> tokens);

}  // namespace zest::accel
