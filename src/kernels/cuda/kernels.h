// CUDA kernels of the zest decoder (CUDA-side header: only code built with the CUDA backend includes it).
//
// Conventions shared by every function here:
// - Storage is bf16, accumulation fp32; norms and softmax run in fp32.
// - Every pointer is device memory; every launch is asynchronous on `stream` and allocates nothing,
//   so a sequence of launches can be captured into a CUDA graph.
// - A function returns an error Status for bad sizes (checked on the host, before launching) or when
//   the launch itself fails; it never synchronises the stream.
// - Linear weights use the nn.Linear layout W[out, in]: y = x * W^T.
//
// Paged KV cache layout (one pair of tensors per layer):
//   k_cache, v_cache: [num_blocks, kKvBlock (16 token slots), kv_heads, head_dim] bf16.
//   A token at position p of a sequence whose block table row is `bt` lives in block bt[p / 16], slot
//   p % 16. A "slot index" is block * 16 + slot (what qk_norm_rope_kv takes per token).
//   block_table: [batch, max_blocks] int32 row-major.
//
// MoE expert weight layout on device (nn.Linear layouts, all experts of a layer in one tensor):
//   gate_up: [E, 2I, H] row-major; rows [0, I) of expert e are the gate projection, rows [I, 2I) up.
//   down:    [E, H, I] row-major.
//   Routing: ids [N, K] int32 and weights [N, K] fp32 per token, sorted by descending weight;
//   id -1 marks an empty slot (weight 0), e.g. a duplicate folded by sere_reroute.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace zest::cuda {

using bf16 = __nv_bfloat16;

constexpr int kKvBlock = 16;  // token slots per KV cache block

// Programmatic dependent launch: when on, kernels of this library launch with the programmatic
// stream serialisation attribute so their start overlaps the tail of the previous kernel. On by default (the
// benchmarks' --pdl 0 turns it off for a comparison); every kernel launched with it waits before touching memory.
void set_programmatic_launch(bool on);
bool programmatic_launch();

// Step timeline, for benchmarks: while a device buffer is set, the first thread of every CTA of this library's
// kernels records, after its PDL wait, one StepTimelineRecord: the launch's %gridid, SM and linear CTA index, and
// %globaltimer ns before and after the wait; kernels may add phase stamps (sm_cta bits 56-63 = phase + 1, ready_ns =
// the time). Buffer layout (unsigned 64-bit words): [0] S = SM slots, [1] C =
// capacity per SM, [2, 2 + S) per-SM record counts (atomically incremented; counts above C mean dropped records),
// then S x C records (SM s's i-th at record index s * C + i). Null stops recording. Set it while no kernel of this
// library runs. Recording adds an atomic round trip after each CTA's wait. Only the library built with
// ZEST_STEP_TIMELINE records (CMake target zest_kernels_cuda_timeline, linked by bench_decode_timeline and
// test_cuda_timeline); elsewhere the waits carry no check and set_step_timeline returns kUnsupported.
struct StepTimelineRecord {
  unsigned long long grid;         // %gridid: one value per launch (graph replays included)
  unsigned long long sm_cta;       // SM id << 32 | blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)
  unsigned long long ready_ns;     // before the wait (after any prologue the kernel runs before it)
  unsigned long long released_ns;  // after the wait
};
bool step_timeline_built();
Status set_step_timeline(void* device_buffer);
// A step timeline buffer: allocated, header written, counts zero (sms slots of `capacity` records each);
// read_step_timeline groups its records by launch, in the order the launches were released (first release
// time), and reports the records dropped for lack of capacity.
struct TimelineLaunch {
  unsigned long long grid = 0;
  int ctas = 0;                     // records (CTAs that passed the wait)
  unsigned int max_cta = 0;         // largest linear CTA index seen
  bool ctas_unique = true;          // no CTA index twice
  unsigned long long first_ready = 0, last_ready = 0, first_release = 0, last_release = 0;  // globaltimer ns
  // Phase stamps (step_timeline_phase k < 8, common.cuh; 0: the kernel's first instruction): count, first, last.
  int phase_count[8] = {};
  unsigned long long phase_first[8] = {}, phase_last[8] = {};
};
Result<void*> alloc_step_timeline(int sms, int capacity);
// `orphans` (optional): phase stamps whose %gridid matches no wait record (seen for the phase-0 stamps of cluster
// launches, taken before the wait).
Result<std::vector<TimelineLaunch>> read_step_timeline(const void* device_buffer, long long* dropped,
                                                       long long* orphans = nullptr);
// Per translation unit of the library: registers the setter of its copy of the buffer pointer (common.cuh).
bool register_step_timeline_unit(cudaError_t (*setter)(void*));
// Launch log, for benchmarks: while on, every kernel launch of this library appends its name (host side).
void set_launch_log(bool on);
std::vector<std::string> take_launch_log();
// Launch timing, for benchmarks: while on, every kernel launch of this library and every cuBLASLt matmul records a
// CUDA event on its stream just before it. take_launch_times synchronises and returns, per launch in launch order, its
// name and the milliseconds from its event to the next one on its stream (the last launch of a stream: to an event
// recorded by take_launch_times). For eager steps only (an event between two launches also ends programmatic
// dependent launch overlap), never while a stream is being captured.
void set_launch_timing(bool on);
Result<std::vector<std::pair<std::string, float>>> take_launch_times();
void note_launch(const char* name, cudaStream_t stream);

// ---- dense ops ----------------------------------------------------------------------------------

// y[M,N] = x[M,K] * w[N,K]^T, bf16 in/out, fp32 accumulation. M <= 16 (with N % 16 == 0, K % 32 == 0) streams
// the weights once through tensor cores, the kernel chosen by size (rows_mma.cu): each 16-row weight tile copied into
// shared memory by a CTA of its own when every tile's CTA fits on the GPU (M <= 8, or K > 2048), a persistent ring of
// tiles for at least 4 tiles per SM (the lm_head), else register streaming; all give the same bits. Other small M
// use a CUDA-core streaming kernel; larger M cuBLASLt (handle, heuristics and a 32 MiB workspace are cached per
// device).
Status gemm(const bf16* x, const bf16* w, bf16* y, int M, int N, int K, cudaStream_t stream);
// The same product always through cuBLASLt (for tests and comparisons).
Status gemm_cublaslt(const bf16* x, const bf16* w, bf16* y, int M, int N, int K, cudaStream_t stream);

// ---- block-wise FP8 weights (fp8.cu) ---------------------------------------------------------------------

// A float8_e4m3fn weight as the FP8 kernels read it: q [rows, K] (row-major, 16-byte aligned), scales [rows / 16,
// ceil(K / 64)] f32, the scale of each 16-row x 64-column chunk (a checkpoint's 128x128 block scales repeated); the
// real weight is f32(q) * scale. Needs fp8_weight_ok(rows, K): both positive multiples of 16.
struct Fp8Weight {
  const uint8_t* q = nullptr;
  const float* scales = nullptr;
};
bool fp8_weight_ok(int rows, int K);
constexpr int kFp8StreamMaxM = 64;  // gemm_fp8's largest M
size_t fp8_scale_count(int rows, int K);
// y[M, N] = x[M, K] * W^T for 0 < M <= 64 (decode): the FP8 bytes streamed once, turned into bf16 exactly in registers
// and multiplied on tensor cores, each 16 x 64 chunk's products scaled in f32.
// A residual add and RMSNorm folded into an FP8 product at one token (fp8_add_norm_ok(1, H): H <= 2048, a multiple of
// 8), run by the product's last CTA with the arithmetic of add_rmsnorm / moe_combine_add_rmsnorm (the same bits):
// x = bf16(x + bf16(the sum of the rows)) - gemm_fp8: its one output row; moe_experts_fp8: the token's slots with ids
// >= 0, in slot order - then, with w, y = w * bf16(x * rsqrt(mean(x^2) + eps)). done: a counter, zero before and
// after the launch.
struct Fp8AddNorm {
  bf16* x = nullptr;             // [1, H] residual, updated in place
  const int32_t* ids = nullptr;  // moe_experts_fp8: the token's K routing ids (-1: empty slot); gemm_fp8: unused
  const bf16* w = nullptr;       // the RMSNorm's weight, or null (x only)
  bf16* y = nullptr;             // [1, H] the normalised row
  float eps = 0.f;
  unsigned* done = nullptr;
};
bool fp8_add_norm_ok(int M, int H);
Status gemm_fp8(const bf16* x, Fp8Weight w, bf16* y, int M, int N, int K, cudaStream_t stream,
                const Fp8AddNorm* add_norm = nullptr);
// Activations for FP8 tensor-core products, per row per 128 columns (the DeepSeek-V3 scheme): scales[r, b] = amax / 448
// of x[r, 128b .. 128b + 127] (1 when all zero), q[r, k] = e4m3(x[r, k] * 448 / amax), nearest even, saturating.
// K a multiple of 128; scales [rows, K / 128] f32.
Status quantize_rows_fp8(const bf16* x, uint8_t* q, float* scales, int rows, int K, cudaStream_t stream);
// FP8 tensor-core products for prefill and 33-64 row decode products (gemm_fp8_tc.cu; wgmma e4m3, fp32 sums): the
// activations quantized by quantize_rows_fp8 (x8, scales [rows, width / 128]), the weight's scales uniform over 128 x
// 128 blocks (the official checkpoints' blocks; each 128-column chunk of a 64-row box is scaled by the scale of its
// first 16 x 64 chunk). y [M, N] = x W^T for N, K multiples of 128.
bool gemm_fp8_tc_ok(int N, int K);
Status gemm_fp8_tc(const uint8_t* x8, const float* x_scale, Fp8Weight w, bf16* y, int M, int N, int K,
                   cudaStream_t stream);
// out[r, k] = bf16(f32(q[r, k]) * scale) (the prefill GEMMs' bf16 copy of an FP8 weight).
Status dequantize_fp8(Fp8Weight w, bf16* out, int rows, int K, cudaStream_t stream);

// out[t, :] = table[ids[t], :] for t < n (rows of `hidden` bf16); ids outside [0, vocab) give zeros.
Status embedding(const int32_t* ids, const bf16* table, bf16* out, int n, int hidden, int vocab,
                 cudaStream_t stream);

// RMSNorm per row: y = w * bf16(x * rsqrt(mean(x^2) + eps)), statistics in fp32.
Status rmsnorm(const bf16* x, const bf16* w, bf16* y, int rows, int hidden, float eps, cudaStream_t stream);

// Fused residual add + RMSNorm: x = bf16(x + r); y = rmsnorm(x) (x updated in place; w == nullptr: x only).
Status add_rmsnorm(bf16* x, const bf16* r, const bf16* w, bf16* y, int rows, int hidden, float eps,
                   cudaStream_t stream);

// MoE combine fused with the residual add and the next RMSNorm: x[n] = bf16(x[n] + sum_{k<K, ids[n,k]>=0}
// slot_out[n,k,:]) summed in fp32 in fixed k order (deterministic); then y = rmsnorm(x) when w != nullptr.
Status moe_combine_add_rmsnorm(bf16* x, const float* slot_out, const int32_t* ids, int K, const bf16* w,
                               bf16* y, int rows, int hidden, float eps, cudaStream_t stream);
// The same over bf16 slot outputs (moe_prefill_down's bf16 form): the same bits as the fp32 form over the same values.
Status moe_combine_add_rmsnorm(bf16* x, const bf16* slot_out, const int32_t* ids, int K, const bf16* w,
                               bf16* y, int rows, int hidden, float eps, cudaStream_t stream);

// h[r, i] = bf16(silu(gu[r, i]) * gu[r, I + i]) for gu [rows, 2I] (dense SwiGLU MLP).
Status silu_mul(const bf16* gu, bf16* h, int rows, int I, cudaStream_t stream);

// out[r] = argmax_j logits[r, j] (ties: lowest j; NaN never wins; 0 when no element compares), r < rows. Each row is
// split over a cluster of 8 CTAs.
Status argmax_rows(const bf16* logits, int32_t* out, int rows, int vocab, cudaStream_t stream);

// ---- attention ------------------------------------------------------------------------------------

struct RopeParams {
  float theta = 1e6f;   // rope_theta
  int section_h = 0;    // interleaved M-RoPE: frequency j uses axis h if j%3==1 && j < 3*section_h,
  int section_w = 0;    // axis w if j%3==2 && j < 3*section_w, otherwise axis t
};

// For each token t < T of qkv [T, (Hq + 2*Hkv) * D] (q heads, then k heads, then v heads):
// per-head RMSNorm of q and k (weights q_norm/k_norm [D]), then rotate-half RoPE with angle
// pos[axis * pos_stride + t] * theta^(-2j/D) (pos_stride 0: 1-D RoPE from row 0), written back in place;
// then k and v are stored into the paged cache at slot_mapping[t] (skipped when < 0).
Status qk_norm_rope_kv(bf16* qkv, const bf16* q_norm, const bf16* k_norm, const int32_t* pos, int pos_stride,
                       RopeParams rope, const int32_t* slot_mapping, bf16* k_cache, bf16* v_cache, int T,
                       int Hq, int Hkv, int D, float eps, cudaStream_t stream);

// Decode attention (one query token per sequence) over the paged cache, GQA-aware and split over the
// context (flash-decoding; the last CTA of each (sequence, kv head) combines the splits in fixed order).
// q: row b at q + b * q_stride, Hq heads of D (128 on the fast path; other even D <= 256 go through
// paged_attention, which needs no workspace). out [B, Hq * D]. context_lens[b] tokens are attended
// (positions 0 .. len-1, the current token included). max_context bounds every context_lens[b].
struct DecodeAttention {
  int batch = 0, q_heads = 0, kv_heads = 0, head_dim = 128;
  int max_context = 0;   // upper bound of context_lens (fixes the grid, so a graph can be replayed)
  int max_blocks = 0;    // row stride of block_table
  float scale = 0.f;     // softmax scale, usually 1/sqrt(head_dim)
  // The splits' arrival counters, batch * kv_heads ints, zero-filled once (every launch leaves them at zero); the
  // workspace then holds partials only (written before they are read), needs no zeroing and serves any shape it is
  // large enough for. nullptr: the counters are in the workspace, after the partials (see below).
  int* counters = nullptr;
};
// Bytes of workspace that decode_attention needs for `p`. Without DecodeAttention::counters the workspace must be
// zero-filled once when allocated (the kernel leaves its counters at zero after every launch) and serves one (batch,
// heads, max_context) shape: use one workspace per shape, or zero it again before using it for another shape.
size_t decode_attention_workspace_bytes(const DecodeAttention& p);
Status decode_attention(const DecodeAttention& p, const bf16* q, int q_stride, const bf16* k_cache,
                        const bf16* v_cache, const int32_t* block_table, const int32_t* context_lens, bf16* out,
                        void* workspace, cudaStream_t stream);

// qk_norm_rope_kv followed by decode_attention for a decode step (token b of qkv is sequence b's current token), in
// one launch: each CTA normalises and rotates its query heads itself; the CTA whose split holds the current token
// (position context_lens[b] - 1) normalises and rotates its k, stores k and v at slot_mapping[b] (skipped when < 0)
// and attends them from on-chip copies; the KV pages are loaded before the wait on the previous kernel. qkv is read
// only (its q and k are not rewritten). Same workspace as decode_attention. Needs decode_attention_fused_ok: head_dim
// 128, q_heads == 8 * kv_heads, qkv 16-byte aligned with q_stride % 8 == 0; every context_lens[b] >= 1.
bool decode_attention_fused_ok(const DecodeAttention& p, const bf16* qkv, int q_stride);
Status decode_attention_fused(const DecodeAttention& p, const bf16* qkv, int q_stride, const bf16* q_norm,
                              const bf16* k_norm, const int32_t* pos, int pos_stride, RopeParams rope,
                              const int32_t* slot_mapping, bf16* k_cache, bf16* v_cache, const int32_t* block_table,
                              const int32_t* context_lens, bf16* out, void* workspace, float eps, cudaStream_t stream);

// The paged KV rows of a decode step's earlier tokens (positions 0 .. context_lens[b] - 2 of sequence b, blocks of
// kKvBlock token rows of row_bytes each in k_cache and v_cache), which the kernel before the decode attention may
// prefetch into L2.
struct KvPrefetch {
  // norm_w != null (gemm_kv_norm_ok): x is the residual row; each CTA normalises it itself first (RMSNorm with
  // weight norm_w and eps, the arithmetic and summation order of the 256-thread norm kernels (rmsnorm,
  // moe_combine_add_rmsnorm): the same bits as gemm of their output).
  const bf16* norm_w = nullptr;
  float norm_eps = 0.f;
  const bf16* k_cache = nullptr;
  const bf16* v_cache = nullptr;
  const int32_t* block_table = nullptr;  // [batch, max_blocks]
  const int32_t* context_lens = nullptr;  // [batch], the current token included
  int batch = 0, max_blocks = 0;
  int row_bytes = 0;  // one token's row of all kv heads: kv_heads * head_dim * 2 (a multiple of 16)
};
// gemm() for the qkv projection of a decode step: for at most 2 token rows on the shared-memory small-M path, its CTAs
// also prefetch kv's rows into L2 before their wait on the previous kernel (a hint: the result is gemm()'s, bit for
// bit; measured faster at batch 1 and 2 only); otherwise gemm().
Status gemm_kv_prefetch(const bf16* x, const bf16* w, bf16* y, int M, int N, int K, const KvPrefetch& kv,
                        cudaStream_t stream);
// gemm_fp8 for the qkv projection of a decode step: for at most 2 token rows its CTAs also prefetch kv's rows into L2
// before their PDL wait, as gemm_kv_prefetch does (a hint: the result is gemm_fp8's, bit for bit; without a cache
// described, gemm_fp8); kv.norm_w must be null (the FP8 products take normalised rows).
Status gemm_fp8_kv_prefetch(const bf16* x, Fp8Weight w, bf16* y, int M, int N, int K, const KvPrefetch& kv,
                            cudaStream_t stream);
// Whether gemm_kv_prefetch takes KvPrefetch::norm_w for these sizes (one token row, 256 <= K <= 2048: the
// shared-memory small-M path, or the ring of tiles for the lm_head's many row tiles).
bool gemm_kv_norm_ok(int M, int N, int K);
// Whether moe_experts_decode_combine with cw and cy null (x only) runs the down kernel by output rows for these sizes
// (one token on the one-token experts, moe_one.h OneCombine::rows).
bool moe_down_rows_on(int N, int K, int E, int H, int I);

// Prefill attention: causal, GQA, variable-length sequences packed along tokens (cu_seqlens [nseq+1]).
// q/k/v rows at q + t * q_stride (Hq heads of D), k + t * kv_stride, v + t * kv_stride (Hkv heads).
// out [T, Hq * D]. D = 128: wgmma tensor cores, fp32 online softmax: a persistent warp-specialised kernel (TMA
// producer, two consumer warpgroups) when max_seqlen > 256 and nseq * 128 <= max_seqlen, else a pipelined kernel of
// one CTA per (head, 128-row query tile, sequence); other even D <= 256: prefill_attention_generic. Pointers and
// strides must be 16-byte aligned (multiples of 8 elements).
Status prefill_attention(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride,
                         const int32_t* cu_seqlens, int nseq, int max_seqlen, bf16* out, int Hq, int Hkv, int D,
                         float scale, cudaStream_t stream);

// Generic attention over the paged cache for any even head_dim <= 256 (fp32 scores and softmax): query i < n is
// token t = rows ? rows[i] : i, read at q + t * q_stride (Hq heads of D); it attends keys 0 .. ctx_lens[t] - 1 of
// the sequence whose block-table row is seq_rows ? seq_rows[t] : t. Output row t at out + t * out_stride. Decode
// steps, chunked prefill (each token of a chunk is a query with its own length) and mixed batches alike.
Status paged_attention(const bf16* q, int q_stride, const bf16* k_cache, const bf16* v_cache, const int32_t* block_table,
                       int max_blocks, const int32_t* seq_rows, const int32_t* ctx_lens, const int32_t* rows, int n,
                       bf16* out, int out_stride, int Hq, int Hkv, int D, float scale, cudaStream_t stream);

// The function of prefill_attention for any even head_dim <= 256 (CUDA cores, fp32 softmax); prefill_attention
// calls it when head_dim != 128.
Status prefill_attention_generic(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride,
                                 const int32_t* cu_seqlens, int nseq, int max_seqlen, bf16* out, int Hq, int Hkv, int D,
                                 float scale, cudaStream_t stream);

// ---- MoE -----------------------------------------------------------------------------------------------

// Router over logits [N, E] (bf16, the router GEMM output): p = softmax(fp32 logits + bias) (bias [E] fp32
// may be nullptr), top-K by p (ties: lowest index) sorted descending, weights renormalised to sum 1 and
// rounded to bf16 precision. ids [N, K] int32, weights [N, K] fp32. One warp per token; E <= 1024.
Status router_topk(const bf16* logits, const float* bias, int32_t* ids, float* weights, int N, int E, int K,
                   cudaStream_t stream);

// SERE re-routing, one launch per layer, in place on ids/weights [N, K]: P = union over tokens of
// ids[:, 0:S]; every expert u not in P maps to argmax_{v in P} sim[u, v] (fp32 [E, E], ties: lowest v),
// unless rho > 0 and that best similarity is < rho (u kept). Secondary slots (k >= S) are rewritten
// through that map; then duplicates inside a token are folded: the weight adds into the first slot
// holding the expert and the later slot becomes id -1, weight 0. S <= 0 or S >= K: no change.
// Ids < 0 are left alone and do not enter P. Single CTA, O(E^2 + N*K); E <= 1024.
Status sere_reroute(int32_t* ids, float* weights, const float* sim, int N, int E, int K, int S, float rho,
                    cudaStream_t stream);

// Per-layer MoE plan built on device from ids (no host sync): the experts that have tokens, their
// (token, slot) lists sorted by expert then slot, and the row tiles of the prefill grouped GEMM.
struct MoePlan {
  int32_t* num_active = nullptr;      // [1] experts with at least one slot
  int32_t* active_experts = nullptr;  // [E] ascending expert ids, first num_active valid
  int32_t* offsets = nullptr;         // [E + 1] start of active expert j's slots in sorted_slots
  int32_t* sorted_slots = nullptr;    // [N * K] slot = n * K + k
  int32_t* num_tiles = nullptr;       // [1] prefill tiles (kMoeTileM sorted slots of one expert each)
  int32_t* tile_active = nullptr;     // [max tiles] active expert index of each tile
  int32_t* tile_start = nullptr;      // [max tiles] first sorted position of each tile
  uint32_t* ready = nullptr;          // [E + 1] streaming decode experts' per-active-expert ready counts, then the
                                      // item counter; zeroed by every plan build, spent by a streaming launch
  int32_t* cta_counts = nullptr;      // [ceil(N * K / kMoePlanCtaSlots) * E] moe_plan_prefill's per-CTA expert counts
  int max_tokens = 0, top_k = 0, experts = 0;
};
constexpr int kMoeTileM = 64;
constexpr int kMoePlanCtaSlots = 1024;  // slots per CTA of moe_plan_prefill
// Upper bound of prefill tiles for N tokens.
int moe_max_tiles(int N, int K, int E);
// Bytes of device memory for a plan of N tokens; moe_plan_bind carves `buffer` into `plan`.
size_t moe_plan_bytes(int N, int K, int E);
void moe_plan_bind(MoePlan& plan, void* buffer, int N, int K, int E);
// Zeroes the plan's counters (MoePlan::ready), as a plan build does: lets the streaming decode experts run on the same
// plan again.
Status moe_plan_reset_counters(const MoePlan& plan, cudaStream_t stream);
// Builds the plan for ids [N, K] (ids < 0 are skipped). When active_count_sum != nullptr, the number of
// active experts is added to *active_count_sum (for statistics; single-threaded, deterministic).
Status moe_plan(const int32_t* ids, int N, int K, int E, MoePlan& plan, int64_t* active_count_sum,
                cudaStream_t stream);

// Routing ids as the ids of a range of experts: out[i] = ids[i] - first for first <= ids[i] < first + count, else -1
// (a plan over out skips the others: an expert-parallel rank's own experts, indexed from its first).
Status local_expert_ids(const int32_t* ids, int32_t* out, int n, int first, int count, cudaStream_t stream);

// The plan of moe_plan (the same contents), built for many tokens by two launches over CTAs of kMoePlanCtaSlots
// slots each: per-CTA expert counts, then every CTA places its slots in order after the slots of earlier CTAs
// (per-warp counts and a scan inside the CTA); the scattered sorted_slots stores spread over the SMs. E > 256 goes
// to moe_plan.
Status moe_plan_prefill(const int32_t* ids, int N, int K, int E, MoePlan& plan, int64_t* active_count_sum,
                        cudaStream_t stream);

// Fused decode routing, one launch: logits = xn[T, H] * router_w[E, H]^T (fp32 sums rounded to bf16, as the gemm
// output), then router_topk's softmax/top-k/renormalisation into ids/weights [T, K], then (plan != nullptr) the
// MoE plan of those ids (moe_plan's contents; *active_count_sum += active experts when not null). logits [T, E]
// receives the bf16 logits when not null. One thread-block cluster (CTAs split the experts; distributed shared
// memory, no global fences). Needs moe_route_ok(T, H, E, K): 1 <= T <= 16, K <= min(16, E), E <= 256 in at most
// 16 experts per CTA, H % 32 == 0, and a schedulable cluster.
bool moe_route_ok(int T, int H, int E, int K);
Status moe_route(const bf16* xn, const bf16* router_w, const float* bias, int32_t* ids, float* weights, bf16* logits,
                 MoePlan* plan, int64_t* active_count_sum, int T, int H, int E, int K, cudaStream_t stream);

// Decode/small-batch experts: h = silu(x Wg^T) * (x Wu^T) for each (token, slot) of each active expert, then
// slot_out[n, k, :] = weights[n, k] * (h Wd^T). Each active expert's weights are read once; experts without tokens
// are skipped. By batch: one token the one-token experts (moe_one.h), more the persistent streaming kernel
// (moe_stream.h: up to 8 tokens and above in two forms); sizes those do not take run rows_mma's tensor-core kernels
// (H and I multiples of 32) or CUDA-core kernels.
// x [N, H] bf16; h workspace [N * K, I] bf16 (indexed by sorted position); slot_out [N, K, H] fp32 (slots
// with id -1 are not written; moe_combine_add_rmsnorm skips them). The streaming kernel (moe_stream.h) spends the
// plan's counters: call it on a freshly built plan, or after moe_plan_reset_counters.
Status moe_experts_decode(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up,
                          const bf16* down, bf16* h, float* slot_out, int N, int K, int E, int H, int I,
                          cudaStream_t stream);
// moe_experts_decode followed by the layer's combine, moe_combine_add_rmsnorm(cx, slot_out, ids, K, cw, cy, N, H,
// eps): folded into the experts' last kernel when that kernel can (the one-token experts, moe_one.h, H <= 2048; with
// cw and cy null the down kernel by output rows adds the slots to cx itself), else as the separate launch; the same
// bits either way. done: one device
// word, zero before the first call (the folded form leaves it zero).
Status moe_experts_decode_combine(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up,
                                  const bf16* down, bf16* h, float* slot_out, int N, int K, int E, int H, int I,
                                  bf16* cx, const int32_t* ids, const bf16* cw, bf16* cy, float eps, unsigned* done,
                                  cudaStream_t stream);
// moe_experts_decode over FP8 experts: gate_up q [E, 2I, H] with scales [E * 2I / 16, ceil(H / 64)], down q [E, H, I]
// with scales [E * H / 16, ceil(I / 64)] (Fp8Weight per expert, experts contiguous); H and I multiples of 16. Each
// active expert's FP8 weights are read once per 32 of its tokens (gemm_fp8's kernel), h = bf16(silu(gate) * up) in
// f32, slot_out as moe_experts_decode (the plan's counters are not used). add_norm (fp8_add_norm_ok(N, H)): the down
// kernel's last CTA runs moe_combine_add_rmsnorm on the token (x += its slots; with w, y = RMSNorm(x) * w).
Status moe_experts_fp8(const bf16* x, const MoePlan& plan, const float* weights, Fp8Weight gate_up, Fp8Weight down,
                       bf16* h, float* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream,
                       const Fp8AddNorm* add_norm = nullptr);
// Prefill experts on FP8 tensor cores (gemm_fp8_tc.cu, the activations and weights as gemm_fp8_tc takes them): gate/up
// writes h at the sorted positions as moe_prefill_gate_up does (x8: the N tokens' rows); down reads h8 (h quantized)
// and writes slot_out (fp32) as moe_prefill_down does. E <= 256, H and I multiples of 128.
bool moe_experts_fp8_tc_ok(int E, int H, int I);
Status moe_gate_up_fp8_tc(const uint8_t* x8, const float* x_scale, const MoePlan& plan, Fp8Weight gate_up, bf16* h,
                          int N, int K, int E, int H, int I, cudaStream_t stream);
Status moe_down_fp8_tc(const uint8_t* h8, const float* h_scale, const MoePlan& plan, const float* weights,
                       Fp8Weight down, float* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream);
// The same slots stored as bf16 (they are bf16-exact values: moe_combine_add_rmsnorm's bf16 form then gives the bits
// of its f32 one, with half the bytes written and read).
Status moe_down_fp8_tc(const uint8_t* h8, const float* h_scale, const MoePlan& plan, const float* weights,
                       Fp8Weight down, bf16* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream);
// Prefill experts: the same function as moe_experts_decode through tensor-core grouped GEMMs over the
// plan's tiles (device-side offsets): moe_prefill_gate_up then moe_prefill_down when H % 128 == 0 and
// I % 64 == 0, else moe_experts_prefill_wmma.
Status moe_experts_prefill(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up,
                           const bf16* down, bf16* h, float* slot_out, int N, int K, int E, int H, int I,
                           cudaStream_t stream);
// The two grouped GEMMs of moe_experts_prefill (H % 128 == 0, I % 64 == 0): h[sorted position] =
// silu(x Wg^T) * (x Wu^T), then slot_out[slot] = weights[slot] * (h Wd^T). Warp-specialised persistent kernels: one
// CTA per SM walks a flat list of (128 sorted slots of one expert) x (256 weight rows) tiles; a producer warpgroup
// fills a 4-stage ring of k-chunks (weights and down's h rows by TMA, gate/up's token rows gathered by cp.async)
// under full/empty mbarriers, two wgmma consumer warpgroups (64 rows each) compute and store. Sizes or operands they
// do not take (I % 128 != 0, H % 256 != 0, E > 256, operands not 16-byte aligned) run a wgmma kernel of 128 x 128
// tiles with a 3-stage cp.async ring. Every output is bf16(bf16(C) * w), a value bf16 holds exactly.
Status moe_prefill_gate_up(const bf16* x, const MoePlan& plan, const bf16* gate_up, bf16* h, int N, int K, int E,
                           int H, int I, cudaStream_t stream);
Status moe_prefill_down(const bf16* h, const MoePlan& plan, const float* weights, const bf16* down, float* slot_out,
                        int N, int K, int E, int H, int I, cudaStream_t stream);
// moe_prefill_down's warp-specialised kernel storing its slot outputs as bf16: half the bytes written here and read
// by the combine, the same results. Sizes or operands that kernel does not take are kInvalidArgument
// (moe_prefill_bf16_slots says when it runs).
Status moe_prefill_down(const bf16* h, const MoePlan& plan, const float* weights, const bf16* down, bf16* slot_out,
                        int N, int K, int E, int H, int I, cudaStream_t stream);
// Whether the bf16-slot moe_prefill_down takes these sizes and operands (h and down 16-byte aligned); the decoders'
// prefill experts use the bf16 slots where it does, fp32 slots elsewhere.
bool moe_prefill_bf16_slots(const bf16* h, const bf16* down, int E, int H, int I);
// Grouped GEMMs on wmma 64x64 tiles when H and I are multiples of 64, else moe_experts_decode; moe_experts_prefill's
// path for widths off the main kernels' tiles.
Status moe_experts_prefill_wmma(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up,
                                const bf16* down, bf16* h, float* slot_out, int N, int K, int E, int H, int I,
                                cudaStream_t stream);

// SERE statistics of one layer's re-routing, added to counts[6] (int64): steps += 1, distinct experts before
// and after, critical experts (distinct after minus distinct primaries of slots < S), re-routed slots (slots
// whose id changed, folded ones included) and slots += N * K. Ids outside [0, E) are not experts. E <= 1024.
// n_rows (device int32, optional): only the first min(*n_rows, N) tokens count (a step padded with extra rows).
Status sere_stats(const int32_t* ids_before, const int32_t* ids_after, int N, int K, int S, int E, int64_t* counts,
                  cudaStream_t stream, const int32_t* n_rows = nullptr);

// ---- sampling summaries (the device side of model/sampling.h) --------------------------------------------

constexpr int kSampleMaxCandidates = 1024;
enum : int32_t { kSampleNone = 0, kSampleGreedy = 1, kSampleTemperature = 2, kSampleCandidates = 3, kSampleFull = 4 };
// The plan of one logits row (the values of model::SampleMode; kSampleNone / kSampleFull rows get nothing).
struct SampleRowSpec {
  int32_t mode = kSampleNone;
  int32_t candidates = 0;  // kSampleCandidates: C, 1 <= C <= min(vocab, kSampleMaxCandidates)
  float inv_t = 1.f;       // 1 / temperature
  float pad = 0.f;
  double u = 0.0;          // kSampleTemperature: uniform in [0, 1)
};
struct SampleRowOut {
  int32_t token = -1;      // greedy: the argmax (ties to the lowest id); temperature: the id-order pick at u * z
  int32_t count = 0;       // candidates: C
  double z = 0.0;          // temperature, candidates: sum over the row of exp((l - max) * inv_t) (fp32 terms, fp64 sum)
  float max = 0.f;         // the largest logit
  float token_logit = 0.f; // temperature: the logit of `token`
};
// One CTA per row of logits [rows, vocab] bf16: out[r] per spec[r]; candidates rows also write their top C, logit
// descending with ties to the lower id, to cand_ids / cand_logits [rows, kSampleMaxCandidates] (first C of the row).
Status sample_rows(const bf16* logits, int rows, int vocab, const SampleRowSpec* spec, SampleRowOut* out,
                   int32_t* cand_ids, float* cand_logits, cudaStream_t stream);

// One token's edit of a logits row (the layout and arithmetic of model::LogitEdit): l += bias; with rep != 1,
// l = l > 0 ? l / rep : l * rep; l -= sub; in f32 without contraction, rounded to bf16.
struct LogitEditSpec {
  int32_t id = 0;
  float bias = 0.f;
  float rep = 1.f;
  float sub = 0.f;
};
// Edits rows of logits [rows, vocab] bf16 in place: row r takes edits[row_begin[r], row_begin[r + 1]) (ids distinct,
// in [0, vocab)); edit_raw[i] receives the logit edit i replaced (as f32).
Status apply_logit_edits(bf16* logits, int rows, int vocab, const int32_t* row_begin, const LogitEditSpec* edits,
                         float* edit_raw, cudaStream_t stream);

// Guided decoding: masks rows of logits [rows, vocab] bf16 in place. Row r with mask_row[r] >= 0 keeps the ids whose
// bit is set in mask mask_row[r] of `masks` ([masks, words] uint32: bit t % 32 of word t / 32; words >=
// (vocab + 31) / 32) and gets -inf at every other id; rows with mask_row[r] < 0 are left alone. rows <= 65535.
Status apply_token_masks(bf16* logits, int rows, int vocab, int words, const int32_t* mask_row, const uint32_t* masks,
                         cudaStream_t stream);

// The row class of a step of `rows` rows (tokens or sequences): the smallest size >= rows of the ladder 1, 2, 4, 8, 12,
// 16, 24, 32, 40, 48, 56, 64, then multiples of 16 up to 512 (above 512 every count is its own class). A decode step
// replaying a CUDA graph runs that many rows (padding rows after the real ones), and the kernel choices that set a
// row's reduction order (gemm's cuBLASLt algorithm, the decode attention split plans) are made for the class, so a
// row gets the same bits in a step of any row count of its class.
int rows_class(int rows);

// ---- utilities --------------------------------------------------------------------------------------

// dst[r, :] = src[idx[r], :] for r < n (rows of `hidden` bf16).
Status gather_rows(const bf16* src, const int32_t* idx, bf16* dst, int n, int hidden, cudaStream_t stream);
// dst[idx[r], :] = src[r, :] (add: bf16(dst + src)) for r < n; the idx[r] must be distinct.
Status scatter_rows(const bf16* src, const int32_t* idx, bf16* dst, int n, int hidden, bool add, cudaStream_t stream);

// Fills n bf16 values with uniform random numbers in [lo, hi) from a counter hash of (seed, index).
Status fill_random_bf16(bf16* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t stream);

}  // namespace zest::cuda

