// The backend-neutral text decoder interface: one forward step over a batch of sequence chunks with a
// paged KV cache, implemented by the CPU f32 model (Qwen3TextModel) and by the CUDA bf16 decoder; the
// MoE hooks both backends honour; and what a device backend needs to build itself from a checkpoint.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accel/sere.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/kv_cache.h"
#include "model/sampling.h"

namespace zest::model {

// One sequence's chunk inside a forward batch.
struct SeqChunk {
  std::vector<int32_t>* block_table = nullptr;  // the sequence's KV blocks (reserved by the caller)
  int64_t start = 0;        // tokens of this sequence already in the KV cache
  int64_t length = 0;       // tokens in this chunk
  bool all_logits = false;  // logits for every token of the chunk instead of only the last
  bool reroute = true;      // the sequence takes part in expert re-routing (SERE) when it is on
};

// A batch of chunks (prefill and decode mixed), flattened: tokens of seqs[0], then seqs[1], ...
struct ForwardBatch {
  std::vector<int32_t> tokens;     // [T]
  std::vector<int32_t> positions;  // [3 * T]: rows t, h, w (all equal for text tokens)
  std::vector<SeqChunk> seqs;
  // Multimodal input: row r of mm_embeds replaces the embedding of token mm_index[r]; deepstack[l]
  // row r is added to that token's hidden state after decoder layer l.
  Tensor mm_embeds;
  std::vector<int64_t> mm_index;
  std::vector<Tensor> deepstack;
  // Device alternative to mm_embeds / deepstack (CUDA decoder only): when not empty, the visual rows come
  // from device memory as consecutive segments in mm_index order; segment s supplies `rows` rows of bf16
  // [rows, hidden] from embeds and from each deepstack pointer, written completely before forward is called.
  // mm_embeds and deepstack are then ignored.
  struct DeviceRows {
    const void* embeds = nullptr;
    std::vector<const void*> deepstack;
    int64_t rows = 0;
  };
  std::vector<DeviceRows> mm_device;
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
};

// SERE re-routing described as data, so that a device backend can apply it without calling back into
// the host: the same rule as accel::sere_reroute on every token of the batch.
struct RerouteSpec {
  // Unique per spec made in this process (copies share it): what a device backend keys its uploaded
  // similarity and its captured graphs on. An address is no key: a spec freed and another made at the same
  // address (one engine after another) would reuse the first one's device state.
  uint64_t id = next_id();
  accel::SereParams params;                     // S, and rho per layer (layer_thresholds holds one per layer)
  std::vector<std::vector<float>> similarity;   // per layer [E, E] f32; empty = layer not re-routed
  bool complete(int64_t layers) const {
    return static_cast<int64_t>(similarity.size()) == layers &&
           static_cast<int64_t>(params.layer_thresholds.size()) == layers;
  }
  static uint64_t next_id() {
    static std::atomic<uint64_t> n{0};
    return n.fetch_add(1, std::memory_order_relaxed) + 1;
  }
};

// Callbacks into the MoE layers (expert re-routing, calibration, statistics).
struct MoeHooks {
  // After top-k + renormalisation: ids/weights [n, k] of the tokens in `active` order may be rewritten;
  // `active[i]` says whether token i takes part (padding and opted-out sequences do not).
  std::function<void(int64_t layer, int32_t* ids, float* weights, int64_t n, int64_t k,
                     const std::vector<uint8_t>& active)> route;
  // The normalised MoE input of a layer, x [n, hidden] f32 (for calibration).
  std::function<void(int64_t layer, const float* x, int64_t n)> moe_input;
  // The re-routing that `route` performs, as data (optional). A device backend applies it on the device
  // (counting into TextDecoder::reroute_counts) instead of calling `route` when every token is active.
  const RerouteSpec* reroute = nullptr;
};

// A device backend's expert weights of one MoE layer, bf16 in device memory: gate_up [E, 2I, H] (per expert
// I gate rows, then I up rows, each over H inputs) and down [E, H, I].
struct DeviceExpertWeights {
  const void* gate_up = nullptr;
  const void* down = nullptr;
  int64_t experts = 0, hidden = 0, inter = 0;
};

enum class Backend { kCpu, kCuda };
class Communicator;  // model/parallel.h
inline const char* backend_name(Backend b) { return b == Backend::kCpu ? "cpu" : "cuda"; }

class TextDecoder {
 public:
  virtual ~TextDecoder() = default;
  virtual Backend backend() const = 0;
  virtual const io::TextConfig& config() const = 0;
  // A KV cache of `num_blocks` blocks of `block_size` token slots in this backend's storage.
  virtual Result<PagedKVCache> allocate_cache(int64_t num_blocks, int64_t block_size) const = 0;
  // Runs one forward step: writes K/V of every token into `cache` (made by allocate_cache of this
  // decoder) and returns host f32 logits [R, vocab], R = sum over chunks of (all_logits ? length : 1), in
  // chunk order. Not safe to call concurrently on one decoder.
  virtual Result<Tensor> forward(const ForwardBatch& batch, PagedKVCache& cache,
                                 const MoeHooks* hooks = nullptr) const = 0;
  // Runs one forward step like forward() but returns, per logits row, the sampling summary that rows[r] asks
  // for (model/sampling.h; rows.size() must be R) instead of host logits, after the row's logit edits, with the
  // log-probability summary of the raw row where asked; rows whose candidates cannot decide come back with the whole
  // (edited) row (full == true). The default calls forward() and summarises on the host; a
  // device backend computes the summaries on the device and copies back only those.
  virtual Result<std::vector<SampleResult>> forward_sample(const ForwardBatch& batch, PagedKVCache& cache,
                                                           const MoeHooks* hooks,
                                                           const std::vector<SampleRow>& rows) const {
    ZEST_ASSIGN_OR_RETURN(Tensor logits, forward(batch, cache, hooks));
    const int64_t R = logits.dim(0), V = logits.dim(1);
    if (static_cast<int64_t>(rows.size()) != R)
      return invalid_argument("forward_sample: " + std::to_string(rows.size()) + " row plans for " +
                              std::to_string(R) + " logits rows");
    std::vector<SampleResult> out(R);
    for (int64_t r = 0; r < R; ++r) out[r] = summarize_edited_row(logits.data<float>() + r * V, V, rows[r]);
    return out;
  }
  // Per-layer counters of the re-routing this backend applied itself from MoeHooks::reroute (all zero for
  // backends that always call MoeHooks::route).
  virtual Result<std::vector<accel::RerouteCounts>> reroute_counts() const {
    return std::vector<accel::RerouteCounts>(static_cast<size_t>(config().num_layers));
  }
  // The host reference of one expert (SERE calibration on the CPU): expert `expert` of MoE layer `layer` on x
  // [n, hidden] f32 (the normalised MoE input), its un-weighted output [n, hidden] into y. kUnsupported for decoders
  // that keep no host weights (device decoders), kInvalidArgument for a dense layer or an expert out of range.
  virtual Status run_expert(int64_t layer, int64_t expert, const float* x, int64_t n, float* y) const {
    (void)layer, (void)expert, (void)x, (void)n, (void)y;
    return unsupported("this decoder backend runs no expert on the host");
  }
  // The device copy of MoE layer `layer`'s expert weights (for device-side SERE calibration); kUnsupported
  // for backends without one, kInvalidArgument for a layer that is not MoE.
  virtual Result<DeviceExpertWeights> device_expert_weights(int64_t layer) const {
    (void)layer;
    return unsupported("this decoder backend keeps no device copy of the expert weights");
  }
  // Ok while the decoder can run steps; else why it cannot, for good (a split decoder whose device collectives were
  // aborted after a rank's GPU failed): the server's /health reports it.
  virtual Status health() const { return Status::ok(); }
  // Makes this decoder a rank of a parallel decoder (model/parallel.h): its weights are its rank's shard
  // (shard_decoder_weights), and forward sums the attention output and the MLP/expert output over the ranks
  // (Communicator::all_reduce_sum) before each residual add; every rank runs the same steps concurrently. Null (the
  // default): the whole model. kUnsupported for decoders that cannot be split.
  virtual Status set_communicator(Communicator* comm) {
    return comm ? unsupported("this decoder backend cannot run as a rank of a parallel decoder") : Status::ok();
  }
};

// ---- building a device decoder ------------------------------------------------------------------------

// Views into the checkpoint (valid while the SafeTensors object lives), shapes checked, in the on-disk dtype.
struct DecoderLayerWeights {
  io::TensorView in_norm, post_norm, q, k, v, o, q_norm, k_norm;
  bool moe = false;
  io::TensorView router;                     // [E, H]
  std::vector<io::TensorView> gate, up, down;  // per expert [I, H], [I, H], [H, I]; dense MLP: one entry each
  io::TensorView fused_gate_up, fused_down;  // input-major [E, H, 2I] and [E, I, H] (data == nullptr: absent)
  int64_t fused_expert0 = 0;  // the expert of the fused tensors' first entry (an expert-parallel shard's first expert)
};

struct DecoderWeights {
  io::TextConfig config;
  io::TensorView embed, final_norm, lm_head;  // lm_head.data == embed.data when the embeddings are tied
  std::vector<DecoderLayerWeights> layers;
};

// Resolves and shape-checks every text-decoder tensor of a Qwen3-MoE / Qwen3-VL(-MoE) checkpoint
// (kNotFound / kCorrupt naming the tensor).
Result<DecoderWeights> collect_decoder_weights(const io::SafeTensors& st, const io::ModelConfig& cfg);

// How a device decoder runs decode steps (zest's --cuda-graphs flags; typed once at the command line and passed
// to the decoder's factory, model::create_cuda_decoder in src/backend/cuda.h).
struct DeviceDecodeOptions {
  enum class Graphs {
    kOn,     // decode steps replay CUDA graphs, decode attention bounded by a context bucket
    kOff,    // every step launched eagerly with the exact context bound
    kEager,  // eager launches with the graphs' context buckets and padding (the same kernels and arguments as a replay)
  };
  Graphs graphs = Graphs::kOn;
  // A decode step of S sequences that can replay a graph runs as a step of the ladder's next row count (padding
  // rows), so that serving's ever-changing batch sizes share a few graphs; false: every sequence count is a key.
  bool graph_padding = true;
  int graph_cap = 256;     // instantiated graphs kept at most (least recently used destroyed first)
  bool graph_log = false;  // one stderr line per captured graph (benchmarks count them)
  // Block-wise FP8 models (fixed at creation): decode steps of two tokens or more run the experts through the
  // persistent weight-streaming kernel over FP8 rows (moe_experts_stream_fp8; where H and I are multiples of 256);
  // prefill steps run the projections and experts on FP8 tensor cores with activations quantized per token per 128
  // columns (gemm_fp8_tc.cu; weights in 128 x 128 blocks) instead of bf16 copies of the weights. false: the per-tile
  // FP8 experts, and prefill through bf16 copies of the weights (exact against the dequantized reference up to bf16
  // rounding; docs/fp8.md).
  bool fp8_stream_experts = true;
  bool fp8_tensor_core_prefill = true;
};

// The CUDA decoder from these weights: model::create_cuda_decoder (src/backend/cuda.h).

}  // namespace zest::model
