// The CUDA text decoder behind model::TextDecoder: bf16 weights uploaded once from the checkpoint mapping
// (through pinned staging buffers, converting BF16/F16/F32 and both expert layouts to the kernels' layouts),
// a paged bf16 KV cache on the device, and a forward step made of zest CUDA kernels: embedding (+ visual rows),
// per layer q/k/v GEMM, q/k norm + M-RoPE + KV write, attention (fast decode / prefill kernels for head_dim 128
// where they apply, the generic paged kernel otherwise), o GEMM, residual + norm, router top-k, SERE on the
// device (or the host hooks), MoE experts or dense MLP, DeepStack additions, final norm and lm_head. Step
// buffers grow to the largest batch seen and are reused, so a step allocates nothing once warm; the logits
// come back to the host in one copy per step.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda.h"
#include "backend/cuda/cuda_decoder.h"
#include "core/dtype.h"
#include "kernels/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_copy.h"
#include "kernels/cuda/moe_stream.h"
#include "model/decoder.h"
#include "model/parallel.h"

namespace zest::cuda {

namespace {

#define ZEST_CU(expr, what) ZEST_RETURN_IF_ERROR(cuda_status((expr), what))

constexpr size_t kAlign = 256;
size_t align_up(size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

// A device allocation owned by the decoder (cudaMalloc'ed once, freed on destruction).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  ~DeviceMemory() { release(); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  Status allocate(size_t bytes, const std::string& what) {
    release();
    if (bytes == 0) return Status::ok();
    if (cudaMalloc(&p_, bytes) != cudaSuccess) {
      cudaGetLastError();
      p_ = nullptr;
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      return resource_exhausted(what + " needs " + std::to_string(bytes >> 20) + " MiB of GPU memory but only " +
                                std::to_string(free_b >> 20) + " MiB are free");
    }
    size_ = bytes;
    return Status::ok();
  }
  void release() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    size_ = 0;
  }
  char* get() const { return static_cast<char*>(p_); }
  size_t size() const { return size_; }

 private:
  void* p_ = nullptr;
  size_t size_ = 0;
};

// Page-locked host memory (for transfers that overlap and for one-copy step inputs/outputs).
class PinnedMemory {
 public:
  PinnedMemory() = default;
  ~PinnedMemory() { release(); }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
  Status allocate(size_t bytes) {
    release();
    if (bytes == 0) return Status::ok();
    if (cudaMallocHost(&p_, bytes) != cudaSuccess) {
      cudaGetLastError();
      p_ = nullptr;
      return resource_exhausted("cannot pin " + std::to_string(bytes >> 20) + " MiB of host memory");
    }
    return Status::ok();
  }
  void release() {
    if (p_) cudaFreeHost(p_);
    p_ = nullptr;
  }
  char* get() const { return static_cast<char*>(p_); }

 private:
  void* p_ = nullptr;
};

// Bump allocator over a byte range (sizes first with base == nullptr, then for real).
struct Carver {
  char* base = nullptr;
  size_t used = 0;
  template <typename T>
  T* take(size_t elems) {
    T* p = reinterpret_cast<T*>(base ? base + used : nullptr);
    used += align_up(elems * sizeof(T));
    return p;
  }
};

// Step inputs: int32 sections, then bf16 visual rows (mm_embeds, then each DeepStack feature). The same layout
// serves the pinned host staging buffer and its device copy.
struct StepInputs {
  int32_t *tokens, *pos, *slots, *tok_seq, *tok_ctx, *gen, *cu, *seq_ctx, *block_table, *rows, *mm_index;
  int32_t* n_real;       // [1] the real (unpadded) tokens of the step
  SampleRowSpec* specs;  // [R] sampling plans of the logits rows (forward_sample)
  uint16_t* mm_rows;
};
size_t layout_inputs(char* base, int64_t T, int64_t S, int64_t max_blocks, int64_t R, int64_t M, int64_t nds,
                     int64_t H, StepInputs* in) {
  Carver c{base, 0};
  in->tokens = c.take<int32_t>(T);
  in->pos = c.take<int32_t>(3 * T);
  in->slots = c.take<int32_t>(T);
  in->tok_seq = c.take<int32_t>(T);
  in->tok_ctx = c.take<int32_t>(T);
  in->gen = c.take<int32_t>(T);
  in->cu = c.take<int32_t>(S + 1);
  in->seq_ctx = c.take<int32_t>(S);
  in->block_table = c.take<int32_t>(S * max_blocks);
  in->rows = c.take<int32_t>(R);
  in->mm_index = c.take<int32_t>(std::max<int64_t>(M, 1));
  in->n_real = c.take<int32_t>(1);
  in->specs = c.take<SampleRowSpec>(R);
  in->mm_rows = c.take<uint16_t>(std::max<int64_t>(M, 1) * H * (1 + nds));
  return c.used;
}

// Per-step inputs and outputs of rows with logit edits, token masks or log-probabilities (the same layout on the host
// and the device): the inputs first (one H2D copy), then the outputs.
struct RowExtras {
  int32_t* edit_begin;        // [R + 1]
  SampleRowSpec* lp_specs;    // [R] the log-probability summaries (candidates at temperature 1) of the raw rows
  LogitEditSpec* edits;       // [n_edits]
  int32_t* mask_row;          // [R] the row's mask in `masks`, or -1
  uint32_t* masks;            // [n_masks, W] guided decoding's token masks (W = (vocab + 31) / 32)
  char* inputs_end;
  float* edit_raw;            // [n_edits]
  SampleRowOut* lp_out;       // [R]
  int32_t* lp_ids;            // [R, kSampleMaxCandidates]
  float* lp_logits;           // [R, kSampleMaxCandidates]
};
size_t layout_extras(char* base, int64_t R, int64_t n_edits, int64_t n_masks, int64_t W, RowExtras* x) {
  Carver c{base, 0};
  x->edit_begin = c.take<int32_t>(R + 1);
  x->lp_specs = c.take<SampleRowSpec>(R);
  x->edits = c.take<LogitEditSpec>(std::max<int64_t>(n_edits, 1));
  x->mask_row = c.take<int32_t>(R);
  x->masks = c.take<uint32_t>(std::max<int64_t>(n_masks * W, 1));
  x->inputs_end = base ? base + c.used : nullptr;
  x->edit_raw = c.take<float>(std::max<int64_t>(n_edits, 1));
  x->lp_out = c.take<SampleRowOut>(R);
  x->lp_ids = c.take<int32_t>(R * kSampleMaxCandidates);
  x->lp_logits = c.take<float>(R * kSampleMaxCandidates);
  return c.used;
}

// KV blocks on the device: per layer K then V, each [num_blocks, 16, kv_heads, head_dim] bf16.
class CudaKvStorage : public model::KvStorage {
 public:
  const void* owner = nullptr;  // the decoder that made it
  uint64_t id = 0;               // unique per cache made (see graph_fingerprint)
  int64_t layers = 0, blocks = 0, per_layer = 0, kv_heads = 0, head_dim = 0;
  DeviceMemory mem;
  bf16* k(int64_t l) const { return reinterpret_cast<bf16*>(mem.get()) + (2 * l) * per_layer; }
  bf16* v(int64_t l) const { return reinterpret_cast<bf16*>(mem.get()) + (2 * l + 1) * per_layer; }

  // Between steps (the decoder waits for each step's work before it returns), on the legacy default stream: a
  // gather (scatter) kernel between the blocks and a device buffer, one copy between that buffer and the host.
  Result<model::KvSnapshot> read(const std::vector<int32_t>& table, int64_t block_size, int64_t tokens,
                                 bool on_device) const override {
    if (tokens <= 0 || static_cast<int64_t>(table.size()) * block_size < tokens)
      return invalid_argument("KV snapshot of " + std::to_string(tokens) + " tokens from a table of " +
                              std::to_string(table.size()) + " blocks");
    model::KvSnapshot s;
    s.tokens = tokens;
    s.layers = layers;
    s.kv_heads = kv_heads;
    s.head_dim = head_dim;
    s.dtype = DType::BF16;
    if (on_device) {
      // Its own allocation (cudaMalloc), so that CUDA IPC can hand it to another process as a whole.
      auto buf = std::make_shared<DeviceMemory>();
      ZEST_RETURN_IF_ERROR(buf->allocate(static_cast<size_t>(s.expected_bytes()), "the KV snapshot"));
      ZEST_RETURN_IF_ERROR(copy(table, block_size, tokens, buf->get(), true, true));
      s.device_data = buf->get();
      s.device = std::move(buf);
      return s;
    }
    s.bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(s.expected_bytes()));
    ZEST_RETURN_IF_ERROR(copy(table, block_size, tokens, s.bytes->data(), true));
    return s;
  }
  Status write(const model::KvSnapshot& snap, const std::vector<int32_t>& table, int64_t block_size) override {
    if (snap.layers != layers || snap.kv_heads != kv_heads || snap.head_dim != head_dim || snap.dtype != DType::BF16)
      return invalid_argument("the KV snapshot (" + std::to_string(snap.layers) + " layers, " +
                              std::to_string(snap.kv_heads) + " kv heads of " + std::to_string(snap.head_dim) + ", " +
                              dtype_name(snap.dtype) + ") does not fit this cache (" + std::to_string(layers) +
                              " layers, " + std::to_string(kv_heads) + " kv heads of " + std::to_string(head_dim) +
                              ", BF16)");
    if (static_cast<int64_t>(table.size()) * block_size < snap.tokens)
      return invalid_argument("the block table cannot hold the KV snapshot's " + std::to_string(snap.tokens) + " tokens");
    if (snap.device_data != nullptr)
      return copy(table, block_size, snap.tokens, const_cast<void*>(snap.device_data), false, true);
    if (!snap.bytes || static_cast<int64_t>(snap.bytes->size()) != snap.expected_bytes())
      return invalid_argument("the KV snapshot holds the wrong number of bytes");
    return copy(table, block_size, snap.tokens, snap.bytes->data(), false);
  }

 private:
  // Between the blocks of `table` and `other` (host memory, or device memory when other_on_device); out = cache to
  // other.
  Status copy(const std::vector<int32_t>& table, int64_t block_size, int64_t tokens, void* other, bool out,
              bool other_on_device = false) const {
    const size_t bytes = static_cast<size_t>(2 * layers * tokens * kv_heads * head_dim) * sizeof(bf16);
    ZEST_CU(cudaDeviceSynchronize(), "KV snapshot: the decoder's last step");
    DeviceMemory staging, tab;
    void* buf = other;
    if (!other_on_device) {
      ZEST_RETURN_IF_ERROR(staging.allocate(bytes, "the KV snapshot's staging buffer"));
      buf = staging.get();
    }
    ZEST_RETURN_IF_ERROR(tab.allocate(table.size() * sizeof(int32_t), "the KV snapshot's block table"));
    ZEST_CU(cudaMemcpy(tab.get(), table.data(), table.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "KV table");
    if (!out && !other_on_device) ZEST_CU(cudaMemcpy(buf, other, bytes, cudaMemcpyHostToDevice), "KV snapshot upload");
    ZEST_RETURN_IF_ERROR(cuda::kv_copy_rows(reinterpret_cast<uint16_t*>(mem.get()), per_layer, layers,
                                            reinterpret_cast<const int32_t*>(tab.get()), tokens, block_size,
                                            kv_heads * head_dim, reinterpret_cast<uint16_t*>(buf), out, 0));
    if (out && !other_on_device) ZEST_CU(cudaMemcpy(other, buf, bytes, cudaMemcpyDeviceToHost), "KV snapshot download");
    ZEST_CU(cudaDeviceSynchronize(), "KV snapshot copy");
    return Status::ok();
  }
};

// Element i of a block scale grid as f32.
inline float scale_f32(const io::BlockScale& s, size_t i) {
  switch (s.dtype) {
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(s.data)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(s.data)[i]);
    default: return static_cast<const float*>(s.data)[i];
  }
}

// Element i of a BF16, F16 or F32 checkpoint tensor, as bf16 bits (FP8 tensors: Uploader::put_fp8).
inline uint16_t elem_bf16(const io::TensorView& t, size_t i) {
  switch (t.dtype) {
    case DType::BF16: return static_cast<const uint16_t*>(t.data)[i];
    case DType::F16: return f32_to_bf16(f16_to_f32(static_cast<const uint16_t*>(t.data)[i]));
    default: return f32_to_bf16(static_cast<const float*>(t.data)[i]);
  }
}

// Weight upload through two pinned staging buffers: while one chunk is copied, the next is converted.
class Uploader {
 public:
  static constexpr size_t kChunk = size_t{8} << 20;  // bf16 elements per staging buffer

  ~Uploader() {
    for (cudaEvent_t e : done_)
      if (e) cudaEventDestroy(e);
  }
  Status init(cudaStream_t stream) {
    stream_ = stream;
    for (int b = 0; b < 2; ++b) {
      ZEST_RETURN_IF_ERROR(buf_[b].allocate(kChunk * sizeof(uint16_t)));
      ZEST_CU(cudaEventCreateWithFlags(&done_[b], cudaEventDisableTiming), "cudaEventCreate");
      ZEST_CU(cudaEventRecord(done_[b], stream_), "cudaEventRecord");
    }
    return Status::ok();
  }
  // dst[i] = src element map(i) for i < n.
  template <typename Map>
  Status put(bf16* dst, const io::TensorView& src, size_t n, Map map) {
    for (size_t off = 0; off < n; off += kChunk) {
      const size_t cnt = std::min(kChunk, n - off);
      const int b = next_++ & 1;
      ZEST_CU(cudaEventSynchronize(done_[b]), "staging buffer wait");
      uint16_t* h = reinterpret_cast<uint16_t*>(buf_[b].get());
      for (size_t i = 0; i < cnt; ++i) h[i] = elem_bf16(src, map(off + i));
      ZEST_CU(cudaMemcpyAsync(dst + off, h, cnt * sizeof(uint16_t), cudaMemcpyHostToDevice, stream_), "weight upload");
      ZEST_CU(cudaEventRecord(done_[b], stream_), "cudaEventRecord");
    }
    return Status::ok();
  }
  // The whole tensor in its own layout (BF16 is copied as is).
  Status put(bf16* dst, const io::TensorView& src) {
    size_t n = 1;
    for (int64_t d : src.shape) n *= static_cast<size_t>(d);
    if (src.dtype == DType::BF16) return put_bytes(dst, src.data, n * sizeof(uint16_t));
    if (src.dtype == DType::F8E4M3) return put_fp8(dst, src, n);
    return put(dst, src, n, [](size_t i) { return i; });
  }
  // A block-wise FP8 tensor (2-D, its block scale bound: check_dtype), dequantized as the CPU reference does,
  // f32(fp8) * f32(scale), then rounded once to bf16; row by row, one scale per run of a block's columns.
  Status put_fp8(bf16* dst, const io::TensorView& src, size_t n) {
    float lut[256];
    for (int c = 0; c < 256; ++c) lut[c] = f8e4m3_to_f32(static_cast<uint8_t>(c));
    const size_t cols = static_cast<size_t>(src.shape[1]);
    const size_t br = static_cast<size_t>(src.scale.block_rows), bc = static_cast<size_t>(src.scale.block_cols);
    const uint8_t* q = static_cast<const uint8_t*>(src.data);
    size_t r = 0, c = 0;  // the position of element `off` below
    for (size_t off = 0; off < n; off += kChunk) {
      const size_t cnt = std::min(kChunk, n - off);
      const int b = next_++ & 1;
      ZEST_CU(cudaEventSynchronize(done_[b]), "staging buffer wait");
      uint16_t* h = reinterpret_cast<uint16_t*>(buf_[b].get());
      for (size_t i = 0; i < cnt;) {
        // The rest of this row's current scale block.
        const size_t run = std::min({cnt - i, cols - c, bc - c % bc});
        const float s = scale_f32(src.scale, (r / br) * static_cast<size_t>(src.scale.cols) + c / bc);
        for (size_t j = 0; j < run; ++j) h[i + j] = f32_to_bf16(lut[q[off + i + j]] * s);
        i += run;
        c += run;
        if (c == cols) c = 0, ++r;
      }
      ZEST_CU(cudaMemcpyAsync(dst + off, h, cnt * sizeof(uint16_t), cudaMemcpyHostToDevice, stream_), "weight upload");
      ZEST_CU(cudaEventRecord(done_[b], stream_), "cudaEventRecord");
    }
    return Status::ok();
  }
  // An FP8 tensor's bytes as they are (dst: rows [n / cols, cols] of the kernels' Fp8Weight layout) and its block
  // scales repeated per 16-row x 64-column chunk into scales [rows / 16, ceil(cols / 64)] (fp8_layout_ok).
  Status put_fp8_raw(uint8_t* dst, float* scales, const io::TensorView& src) {
    const size_t rows = static_cast<size_t>(src.shape[0]), cols = static_cast<size_t>(src.shape[1]);
    ZEST_RETURN_IF_ERROR(put_bytes(dst, src.data, rows * cols));
    const size_t kc = (cols + 63) / 64, sr = rows / 16;
    const size_t br = static_cast<size_t>(src.scale.block_rows), bc = static_cast<size_t>(src.scale.block_cols);
    std::vector<float> sc(sr * kc);
    for (size_t r = 0; r < sr; ++r)
      for (size_t c = 0; c < kc; ++c)
        sc[r * kc + c] = scale_f32(src.scale, (r * 16 / br) * static_cast<size_t>(src.scale.cols) + c * 64 / bc);
    ZEST_CU(cudaMemcpyAsync(scales, sc.data(), sc.size() * sizeof(float), cudaMemcpyHostToDevice, stream_),
            "weight scale upload");
    return cuda_status(cudaStreamSynchronize(stream_), "weight scale upload");  // sc is freed on return
  }
  Status finish() { return cuda_status(cudaStreamSynchronize(stream_), "weight upload"); }

 private:
  // n bytes as they are, through the staging buffers.
  Status put_bytes(void* dst, const void* src, size_t n) {
    const size_t chunk = kChunk * sizeof(uint16_t);
    for (size_t off = 0; off < n; off += chunk) {
      const size_t cnt = std::min(chunk, n - off);
      const int b = next_++ & 1;
      ZEST_CU(cudaEventSynchronize(done_[b]), "staging buffer wait");
      std::memcpy(buf_[b].get(), static_cast<const uint8_t*>(src) + off, cnt);
      ZEST_CU(cudaMemcpyAsync(static_cast<char*>(dst) + off, buf_[b].get(), cnt, cudaMemcpyHostToDevice, stream_),
              "weight upload");
      ZEST_CU(cudaEventRecord(done_[b], stream_), "cudaEventRecord");
    }
    return Status::ok();
  }

  cudaStream_t stream_ = nullptr;
  PinnedMemory buf_[2];
  cudaEvent_t done_[2] = {nullptr, nullptr};
  uint64_t next_ = 0;
};

// A projection's device weight: bf16, or a block-wise FP8 checkpoint tensor kept in FP8 (the kernels' Fp8Weight
// layout), which decode steps read as it is and prefill steps through a bf16 copy in the decoder's scratch.
struct Proj {
  bf16* bf = nullptr;
  uint8_t* q = nullptr;
  float* s = nullptr;
  bool blocks128 = false;  // FP8 with scale blocks of whole 128 x 128 tiles (what the tensor-core products take)
  bool fp8() const { return q != nullptr; }
  Fp8Weight f8() const { return {q, s}; }
};

// Whether FP8 tensors stay FP8 on the device as rows of one projection (the kernels' layout): each is a block-wise
// FP8 tensor (check_dtype) of rows and columns multiples of 16 with scale blocks multiples of 16 rows and 64 columns.
bool fp8_layout_ok(std::initializer_list<const io::TensorView*> ts) {
  for (const io::TensorView* t : ts) {
    if (t->dtype != DType::F8E4M3 || t->shape.size() != 2 || t->scale.data == nullptr) return false;
    if (!fp8_weight_ok(static_cast<int>(t->shape[0]), static_cast<int>(t->shape[1])) || t->scale.block_rows % 16 != 0 ||
        t->scale.block_cols % 64 != 0)
      return false;
  }
  return true;
}

// Whether FP8 tensors' scale blocks are whole 128 x 128 tiles (the official checkpoints' blocks).
bool fp8_blocks128(std::initializer_list<const io::TensorView*> ts) {
  for (const io::TensorView* t : ts)
    if (t->scale.block_rows % 128 != 0 || t->scale.block_cols % 128 != 0) return false;
  return true;
}

// How one step is composed, chosen in one place (the top of run_step) from the step's shape and the model's sizes,
// then followed by every layer. The ops pick their own tiling and kernel from their sizes (kernels.h); these are the
// choices between sequences of ops.
struct StepForms {
  bool decode_attention = false;   // head_dim 128, every token its sequence's next: split-K decode attention
  bool fused_attention = false;    // ... with q/k norm, RoPE and the KV write folded in (decode_attention_fused)
  bool prefill_attention = false;  // head_dim 128, chunks starting at 0: the contiguous prefill kernel
  // head_dim 128, no chunk from 0 and not decode-only (a chat turn's new message after a prefix-cache hit, a later
  // chunk of a long prompt): every token attends its own context through the decode attention kernels as a one-token
  // row of its own (tensor cores, split over the context, one CTA per kv head for its query heads) instead of the
  // generic kernel (one CTA per token and query head).
  bool token_attention = false;
  // One token (moe_down_rows_on): a MoE layer's experts leave x only (their down kernel adds the slots by output
  // rows) and the next layer's qkv GEMM normalises x itself, the first layer's too; the lm_head takes the final norm
  // when one row is sampled.
  bool one_token = false;
  bool fused_route = false;     // router GEMM, top-k (and the plan when nothing re-routes) in one launch (moe_route)
  bool decode_experts = false;  // up to 64 tokens the experts stream their weights (decode kernels); above, grouped GEMMs
};

class CudaTextDecoder final : public model::TextDecoder {
 public:
  ~CudaTextDecoder() override {
    cudaSetDevice(dev_);
    clear_graphs();
    if (stream_) cudaStreamDestroy(stream_);
  }
  Status init(const model::DecoderWeights& w, const model::DeviceDecodeOptions& opts);
  void set_options(const model::DeviceDecodeOptions& opts) const { opts_ = opts; }

  model::Backend backend() const override { return model::Backend::kCuda; }
  const io::TextConfig& config() const override { return cfg_; }
  Result<model::PagedKVCache> allocate_cache(int64_t num_blocks, int64_t block_size) const override;
  Result<Tensor> forward(const model::ForwardBatch& b, model::PagedKVCache& cache,
                         const model::MoeHooks* hooks) const override;
  Result<std::vector<model::SampleResult>> forward_sample(const model::ForwardBatch& b, model::PagedKVCache& cache,
                                                          const model::MoeHooks* hooks,
                                                          const std::vector<model::SampleRow>& rows) const override;
  Result<std::vector<accel::RerouteCounts>> reroute_counts() const override;
  // A failed GPU context (a kernel's illegal address, an uncorrectable ECC error: every later CUDA call fails the same
  // way) leaves the decoder unusable; the stream's state says so without waiting for it.
  Status health() const override {
    if (cudaSetDevice(dev_) != cudaSuccess) {
      const cudaError_t e = cudaGetLastError();
      return internal_error(std::string("GPU ") + std::to_string(dev_) + " is unusable (" + cudaGetErrorString(e) +
                            "): restart zest");
    }
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e == cudaSuccess || e == cudaErrorNotReady) return Status::ok();
    cudaGetLastError();  // a passing error is cleared (a sticky one stays and is reported again)
    return internal_error(std::string("GPU ") + std::to_string(dev_) + " failed (" + cudaGetErrorString(e) +
                          "): its context is unusable, restart zest");
  }
  Result<model::DeviceExpertWeights> device_expert_weights(int64_t layer) const override {
    if (layer < 0 || layer >= L_ || !layers_[layer].moe)
      return invalid_argument("layer " + std::to_string(layer) + " is not an MoE layer of this decoder");
    if (layers_[layer].gate_up.fp8())
      return unsupported("the CUDA decoder keeps this checkpoint's experts in FP8; SERE calibration on the device "
                         "reads bf16 experts (calibrate with --device cpu)");
    if (comm_ || El_ != E_)
      return unsupported("a rank of a parallel decoder holds a part of the experts; SERE calibration on the device "
                         "reads whole experts (calibrate with --device cpu)");
    return model::DeviceExpertWeights{layers_[layer].gate_up.bf, layers_[layer].down.bf, E_, H_, I_};
  }
  // A rank of a parallel decoder: the partial sums after attention and after the MLP/experts go through comm's
  // all-reduce: on the device, in the decoder's stream, where the communicator does that (NCCL: decode steps still
  // replay graphs), else host-staged (this decoder copies them out, the communicator sums the ranks' values in rank
  // order, every rank copies the same bits back; steps then run eagerly). Split steps run without the fused forms that
  // reach past those sums (the one-token forms, the folded decode combine).
  Status set_communicator(model::Communicator* comm) override {
    ZEST_CU(cudaSetDevice(dev_), "cudaSetDevice");
    ZEST_CU(cudaStreamSynchronize(stream_), "sync before joining a parallel decoder");
    clear_graphs();
    comm_ = comm && comm->world() > 1 ? comm : nullptr;
    return Status::ok();
  }

 private:
  struct Layer {
    bf16 *in_norm = nullptr, *post_norm = nullptr, *q_norm = nullptr, *k_norm = nullptr, *router = nullptr;
    Proj wqkv, wo, gate_up, down;
    bool moe = false;
  };
  // Sizes the step buffers are allocated for.
  struct Caps {
    int64_t T = 0, S = 0, R = 0, M = 0, nds = 0, max_blocks = 0;
  };
  // Per-step state, mutated by the const forward (one caller at a time).
  struct Step {
    Caps caps;
    DeviceMemory act, in_dev, ws, sim, counters;
    DeviceMemory tok_table;  // token_attention: each token's block-table row [T, max_blocks]
    PinnedMemory in_host, logits_host;
    bf16 *x = nullptr, *xn = nullptr, *qkv = nullptr, *attn = nullptr, *o = nullptr, *rl = nullptr, *h = nullptr,
         *gu = nullptr, *xr = nullptr, *logits = nullptr;
    int32_t *ids = nullptr, *ids_before = nullptr;
    int32_t* ids_local = nullptr;  // expert parallelism: ids as this rank's expert indices, -1 for the others'
    std::vector<float> reduce_host;  // a parallel decoder's partial sums on their way through the communicator
    std::vector<uint16_t> reduce_bits;
    float *route_w = nullptr, *slot_out = nullptr;
    unsigned* done = nullptr;  // the folded MoE combine's exit counter (zero between launches)
  int32_t* attn_counters = nullptr;  // decode attention's split counters, T * kv_heads (zero between launches)
    void* plan_buf = nullptr;
    MoePlan plan;
    uint64_t sim_spec = 0;  // the id of the spec whose similarity matrices are on the device (0: none)
    // Bumped whenever a step buffer is allocated again: freed memory can come back at the same address, but a graph
    // captured with the old allocation must not replay (a pinned host buffer's copy node fails the launch).
    uint64_t buffers_epoch = 0;
    const int32_t* n_real = nullptr;               // the current step's real token count (device)
    // Sampling summaries: per-row outputs and top-C candidates on the device, their pinned host copies.
    DeviceMemory samp;
    PinnedMemory samp_host;
    int64_t samp_rows = 0;
    SampleRowOut* samp_out = nullptr;
    int32_t* cand_ids = nullptr;
    float* cand_logits = nullptr;
    // Rows with logit edits or log-probabilities (eager steps only): one device buffer and its pinned host mirror,
    // laid out per step (RowExtras); grown on demand.
    DeviceMemory extras;
    PinnedMemory extras_host;
    size_t extras_bytes = 0;
    // Decode-step graphs: key (sequences, context bound in KV blocks, device SERE spec, summary tail) -> the
    // instantiated graph (nullptr after the key's first, eager, step or after eviction) and its last use. Valid
    // while the buffers they were captured with stay the same (fingerprint). At most
    // opts_.graph_cap are instantiated; the least recently used one is destroyed for a new one.
    struct GraphEntry {
      cudaGraphExec_t exec = nullptr;
      uint64_t last_use = 0;
    };
    std::map<std::tuple<int, int, uint64_t, bool>, GraphEntry> graphs;
    uint64_t graph_clock = 0;
    int live_graphs = 0;
    std::vector<uintptr_t> graph_fingerprint;
    bool graphs_broken = false;  // a capture failed: eager steps from then on
  };

  Status upload_layer(Uploader& up, const model::DecoderLayerWeights& src, Layer& L);
  // y = x W^T for weight w [N, K] (Proj): bf16 through gemm; FP8 streamed by gemm_fp8 up to 32 rows, from 33 on FP8
  // tensor cores (activations quantized per row per 128 columns) where the weight's blocks and sizes allow, else
  // streamed up to 64 rows and above through its bf16 copy in fp8_scratch_ (dequantize_fp8).
  Status project(const bf16* x, const Proj& w, bf16* y, int M, int N, int K, cudaStream_t st) const;
  // One forward step: host logits into *logits_out (rows == nullptr) or the rows' sampling summaries.
  Status run_step(const model::ForwardBatch& b, model::PagedKVCache& cache, const model::MoeHooks* hooks,
                  const std::vector<model::SampleRow>* rows, Tensor* logits_out,
                  std::vector<model::SampleResult>* sampled) const;
  Status ensure_sample(int64_t rows) const;
  void clear_graphs() const;
  std::vector<uintptr_t> graph_fingerprint(const CudaKvStorage& kv) const;
  Status ensure(const Caps& need) const;
  // Routing, experts and the combine into x / xn (next_w: the next RMSNorm's weight, or null for x only).
  Status run_moe(int64_t l, const Layer& L, int T, const StepForms& forms, const model::ForwardBatch& b,
                 const model::MoeHooks* hooks, bool all_active, const bf16* next_w) const;
  // A parallel decoder's sum over the ranks of n values at dev (bf16 or f32), in place (set_communicator).
  Status all_reduce(void* dev, int64_t n, bool bf16_values) const;
  bool split() const { return comm_ != nullptr || El_ != E_; }

  io::TextConfig cfg_;
  // How decode steps run; set_decode_options (tests) changes it between steps.
  mutable model::DeviceDecodeOptions opts_;
  int L_ = 0, H_ = 0, Hq_ = 0, Hkv_ = 0, D_ = 0, QKV_ = 0, E_ = 0, K_ = 0, I_ = 0, Id_ = 0, V_ = 0;
  float eps_ = 1e-6f;
  RopeParams rope_;
  cudaStream_t stream_ = nullptr;
  DeviceMemory weights_;
  std::vector<Layer> layers_;
  bf16 *embed_ = nullptr, *final_norm_ = nullptr, *lm_head_ = nullptr;
  bool fp8_ = false;          // some projection is kept in FP8
  // A rank of a parallel decoder (set_communicator), or null; under expert parallelism its shard holds experts
  // [ep0_, ep0_ + El_) of the E_ the router picks from, stored and planned by their index from ep0_ (El_ == E_: all).
  model::Communicator* comm_ = nullptr;
  int ep0_ = 0, El_ = 0;
  int dev_ = 0;  // the GPU the decoder was made on: every call makes it current (a rank thread may come from anywhere)
  // bf16 copies of FP8 weights for prefill steps (the largest projection, or one layer's experts)
  DeviceMemory fp8_scratch_;
  std::unique_ptr<Step> st_ = std::make_unique<Step>();
};

// The weight dtypes the upload converts to bf16: BF16, F16, F32, and block-wise FP8 (2-D with its scale bound),
// dequantized at load: FP8 checkpoints run at bf16 speed and memory until the kernels read FP8 themselves.
Status check_dtype(const io::TensorView& t) {
  if (t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F32) return Status::ok();
  if (t.dtype == DType::F8E4M3) {
    const io::BlockScale& s = t.scale;
    if (t.shape.size() != 2 || s.data == nullptr || s.block_rows <= 0 || s.block_cols <= 0 ||
        s.rows != (t.shape[0] + s.block_rows - 1) / s.block_rows || s.cols != (t.shape[1] + s.block_cols - 1) / s.block_cols)
      return invalid_argument("FP8 tensor '" + t.name + "' has no block scale of its shape bound (load it through "
                              "an FP8 checkpoint's quantization_config)");
    return Status::ok();
  }
  return unsupported("tensor '" + t.name + "' has dtype " + dtype_name(t.dtype) +
                     "; the CUDA decoder loads BF16, F16, F32 or block-wise FP8 weights");
}

Status CudaTextDecoder::init(const model::DecoderWeights& w, const model::DeviceDecodeOptions& opts) {
  if (opts.graph_cap < 1) return invalid_argument("the CUDA graph cap must be at least 1");
  opts_ = opts;
  cfg_ = w.config;
  ZEST_CU(cudaGetDevice(&dev_), "cudaGetDevice");
  const io::TextConfig& c = cfg_;
  L_ = static_cast<int>(c.num_layers);
  H_ = static_cast<int>(c.hidden_size);
  Hq_ = static_cast<int>(c.num_heads);
  Hkv_ = static_cast<int>(c.num_kv_heads);
  D_ = static_cast<int>(c.head_dim);
  QKV_ = (Hq_ + 2 * Hkv_) * D_;
  E_ = static_cast<int>(c.num_experts);
  K_ = static_cast<int>(c.num_experts_per_tok);
  I_ = static_cast<int>(c.moe_intermediate_size);
  Id_ = static_cast<int>(c.intermediate_size);
  V_ = static_cast<int>(c.vocab_size);
  eps_ = static_cast<float>(c.rms_norm_eps);
  rope_.theta = static_cast<float>(c.rope_theta);
  if (c.mrope_section.size() >= 2) rope_.section_h = static_cast<int>(c.mrope_section[1]);
  if (c.mrope_section.size() >= 3) rope_.section_w = static_cast<int>(c.mrope_section[2]);
  bool any_moe = false;
  for (const auto& l : w.layers) any_moe = any_moe || l.moe;
  // The experts the weights hold: all E_, or (an expert-parallel shard, shard_decoder_weights) one range of them,
  // the same in every MoE layer; the others' tensors are empty.
  El_ = E_;
  bool first_moe = true;
  for (const model::DecoderLayerWeights& s : w.layers) {
    if (!s.moe) continue;
    int64_t lo = 0, n = 0;
    if (s.fused_gate_up.data) {
      lo = s.fused_expert0;
      n = s.fused_gate_up.shape.empty() ? 0 : s.fused_gate_up.shape[0];
    } else {
      lo = -1;
      for (int64_t e = 0; e < static_cast<int64_t>(s.gate.size()); ++e) {
        if (!s.gate[e].data) continue;
        if (lo < 0) lo = e;
        if (e != lo + n) return unsupported("CUDA decoder: the experts a layer holds must be one range");
        ++n;
      }
    }
    if (n <= 0 || lo < 0 || lo + n > E_) return invalid_argument("CUDA decoder: an MoE layer holds no experts");
    if (!first_moe && (lo != ep0_ || n != El_))
      return unsupported("CUDA decoder: every MoE layer must hold the same experts");
    ep0_ = static_cast<int>(lo);
    El_ = static_cast<int>(n);
    first_moe = false;
  }
  if (H_ % 8 != 0) return unsupported("CUDA decoder: hidden_size must be a multiple of 8 (is " + std::to_string(H_) + ")");
  if (D_ % 2 != 0 || D_ > 256)
    return unsupported("CUDA decoder: head_dim must be even and at most 256 (is " + std::to_string(D_) + ")");
  if (any_moe && (E_ > 1024 || K_ > 16 || I_ % 8 != 0 || !c.norm_topk_prob))
    return unsupported("CUDA decoder: MoE layers need at most 1024 experts, top-k <= 16, an expert width that is a "
                       "multiple of 8 and norm_topk_prob");

  // Which projections stay FP8 on the device (fp8_layout_ok over their source tensors); everything else, the
  // router, embeddings and norms included, is uploaded as bf16 (block-wise FP8 dequantized at load).
  struct Fp8Choice {
    bool qkv = false, o = false, ffn = false;
    bool qkv128 = false, o128 = false, ffn128 = false;  // ... and in 128 x 128 blocks
  };
  std::vector<Fp8Choice> f8(L_);
  for (int l = 0; l < L_; ++l) {
    const model::DecoderLayerWeights& s = w.layers[l];
    f8[l].qkv = fp8_layout_ok({&s.q, &s.k, &s.v});
    f8[l].o = fp8_layout_ok({&s.o});
    f8[l].qkv128 = f8[l].qkv && fp8_blocks128({&s.q, &s.k, &s.v});
    f8[l].o128 = f8[l].o && fp8_blocks128({&s.o});
    bool ffn =
        !s.fused_gate_up.data && !s.gate.empty() && s.gate.size() == s.up.size() && s.gate.size() == s.down.size();
    for (size_t e = 0; ffn && e < s.gate.size(); ++e)  // the experts it holds (another rank's are empty)
      ffn = !s.gate[e].data || fp8_layout_ok({&s.gate[e], &s.up[e], &s.down[e]});
    f8[l].ffn = ffn;
    f8[l].ffn128 = ffn;
    for (size_t e = 0; f8[l].ffn128 && e < s.gate.size(); ++e)
      f8[l].ffn128 = !s.gate[e].data || fp8_blocks128({&s.gate[e], &s.up[e], &s.down[e]});
    fp8_ = fp8_ || f8[l].qkv || f8[l].o || ffn;
  }

  // Weight arena: sizes first, then one allocation.
  const size_t H = H_, D = D_, QKV = QKV_, E = E_, El = El_, I = I_, Id = Id_, V = V_;
  const bool tied = w.lm_head.data == w.embed.data;
  size_t scratch = 0;  // bytes of the largest bf16 copy a prefill step makes of FP8 weights
  auto take = [&](Carver& cv, Proj& p, bool fp8, size_t rows, size_t K, bool blocks128) {
    if (!fp8) {
      p.bf = cv.take<bf16>(rows * K);
      return;
    }
    p.blocks128 = blocks128;
    p.q = cv.take<uint8_t>(rows * K);
    p.s = cv.take<float>(fp8_scale_count(static_cast<int>(rows), static_cast<int>(K)));
    scratch = std::max(scratch, rows * K * sizeof(bf16));
  };
  auto layout = [&](Carver& cv) {
    layers_.assign(L_, Layer{});
    for (int l = 0; l < L_; ++l) {
      Layer& Ly = layers_[l];
      Ly.moe = w.layers[l].moe;
      Ly.in_norm = cv.take<bf16>(H);
      Ly.post_norm = cv.take<bf16>(H);
      Ly.q_norm = cv.take<bf16>(D);
      Ly.k_norm = cv.take<bf16>(D);
      take(cv, Ly.wqkv, f8[l].qkv, QKV, H, f8[l].qkv128);
      take(cv, Ly.wo, f8[l].o, H, Hq_ * D, f8[l].o128);
      if (Ly.moe) {
        Ly.router = cv.take<bf16>(E * H);
        take(cv, Ly.gate_up, f8[l].ffn, El * 2 * I, H, f8[l].ffn128);
        take(cv, Ly.down, f8[l].ffn, El * H, I, f8[l].ffn128);
        // prefill steps copy a layer's FP8 experts to bf16 at once (the grouped GEMMs read bf16)
        if (f8[l].ffn) scratch = std::max(scratch, El * 3 * I * H * sizeof(bf16));
      } else {
        take(cv, Ly.gate_up, f8[l].ffn, 2 * Id, H, f8[l].ffn128);
        take(cv, Ly.down, f8[l].ffn, H, Id, f8[l].ffn128);
      }
    }
    embed_ = cv.take<bf16>(V * H);
    final_norm_ = cv.take<bf16>(H);
    lm_head_ = tied ? embed_ : cv.take<bf16>(V * H);
  };
  Carver sizing;
  layout(sizing);
  size_t free_b = 0, total_b = 0;
  ZEST_CU(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  if (sizing.used + scratch > free_b)
    return resource_exhausted("the model's weights need " + std::to_string((sizing.used + scratch) >> 20) +
                              " MiB of GPU memory but only " + std::to_string(free_b >> 20) + " MiB are free");
  ZEST_RETURN_IF_ERROR(weights_.allocate(sizing.used, "the model's weights"));
  ZEST_RETURN_IF_ERROR(fp8_scratch_.allocate(scratch, "the bf16 copies of FP8 weights for prefill"));
  Carver real{weights_.get(), 0};
  layout(real);

  ZEST_CU(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  Uploader up;
  ZEST_RETURN_IF_ERROR(up.init(stream_));
  for (const io::TensorView* t : {&w.embed, &w.final_norm, &w.lm_head}) ZEST_RETURN_IF_ERROR(check_dtype(*t));
  ZEST_RETURN_IF_ERROR(up.put(embed_, w.embed));
  ZEST_RETURN_IF_ERROR(up.put(final_norm_, w.final_norm));
  if (!tied) ZEST_RETURN_IF_ERROR(up.put(lm_head_, w.lm_head));
  for (int l = 0; l < L_; ++l) {
    Status s = upload_layer(up, w.layers[l], layers_[l]);
    if (!s.is_ok()) return s.with_context("layer " + std::to_string(l));
  }
  ZEST_RETURN_IF_ERROR(up.finish());
  ZEST_RETURN_IF_ERROR(st_->counters.allocate(static_cast<size_t>(L_) * 6 * sizeof(int64_t), "SERE counters"));
  ZEST_CU(cudaMemsetAsync(st_->counters.get(), 0, st_->counters.size(), stream_), "memset");
  return cuda_status(cudaStreamSynchronize(stream_), "decoder init");
}

Status CudaTextDecoder::upload_layer(Uploader& up, const model::DecoderLayerWeights& s, Layer& L) {
  for (const io::TensorView* t : {&s.in_norm, &s.post_norm, &s.q, &s.k, &s.v, &s.o, &s.q_norm, &s.k_norm})
    ZEST_RETURN_IF_ERROR(check_dtype(*t));
  const size_t H = H_, D = D_, I = L.moe ? I_ : Id_;
  ZEST_RETURN_IF_ERROR(up.put(L.in_norm, s.in_norm));
  ZEST_RETURN_IF_ERROR(up.put(L.post_norm, s.post_norm));
  ZEST_RETURN_IF_ERROR(up.put(L.q_norm, s.q_norm));
  ZEST_RETURN_IF_ERROR(up.put(L.k_norm, s.k_norm));
  // rows r0 .. of an FP8 projection of K columns
  auto put8 = [&](const Proj& p, size_t r0, size_t K, const io::TensorView& t) {
    return up.put_fp8_raw(p.q + r0 * K, p.s + fp8_scale_count(static_cast<int>(r0), static_cast<int>(K)), t);
  };
  if (L.wqkv.fp8()) {
    ZEST_RETURN_IF_ERROR(put8(L.wqkv, 0, H, s.q));
    ZEST_RETURN_IF_ERROR(put8(L.wqkv, Hq_ * D, H, s.k));
    ZEST_RETURN_IF_ERROR(put8(L.wqkv, (Hq_ + Hkv_) * D, H, s.v));
  } else {
    ZEST_RETURN_IF_ERROR(up.put(L.wqkv.bf, s.q));
    ZEST_RETURN_IF_ERROR(up.put(L.wqkv.bf + Hq_ * D * H, s.k));
    ZEST_RETURN_IF_ERROR(up.put(L.wqkv.bf + (Hq_ + Hkv_) * D * H, s.v));
  }
  if (L.wo.fp8()) {
    ZEST_RETURN_IF_ERROR(put8(L.wo, 0, static_cast<size_t>(Hq_) * D, s.o));
  } else {
    ZEST_RETURN_IF_ERROR(up.put(L.wo.bf, s.o));
  }
  if (L.moe) {
    ZEST_RETURN_IF_ERROR(check_dtype(s.router));
    ZEST_RETURN_IF_ERROR(up.put(L.router, s.router));
  }
  if (s.fused_gate_up.data) {
    // Input-major [E, H, 2I] -> [E, 2I, H] and [E, I, H] -> [E, H, I].
    ZEST_RETURN_IF_ERROR(check_dtype(s.fused_gate_up));
    ZEST_RETURN_IF_ERROR(check_dtype(s.fused_down));
    const size_t E = El_;  // the experts the tensors hold (an expert-parallel shard's)
    ZEST_RETURN_IF_ERROR(up.put(L.gate_up.bf, s.fused_gate_up, E * 2 * I * H, [&](size_t i) {
      const size_t e = i / (2 * I * H), rem = i % (2 * I * H), r = rem / H, c = rem % H;
      return e * H * 2 * I + c * 2 * I + r;
    }));
    ZEST_RETURN_IF_ERROR(up.put(L.down.bf, s.fused_down, E * H * I, [&](size_t i) {
      const size_t e = i / (H * I), rem = i % (H * I), r = rem / I, c = rem % I;
      return e * I * H + c * H + r;
    }));
    return Status::ok();
  }
  for (size_t g = 0; g < s.gate.size(); ++g) {
    if (!s.gate[g].data) continue;  // another rank's expert
    const size_t e = g - ep0_;      // its index among the experts this decoder holds
    for (const io::TensorView* t : {&s.gate[g], &s.up[g], &s.down[g]}) ZEST_RETURN_IF_ERROR(check_dtype(*t));
    if (L.gate_up.fp8()) {
      ZEST_RETURN_IF_ERROR(put8(L.gate_up, e * 2 * I, H, s.gate[g]));
      ZEST_RETURN_IF_ERROR(put8(L.gate_up, e * 2 * I + I, H, s.up[g]));
      ZEST_RETURN_IF_ERROR(put8(L.down, e * H, I, s.down[g]));
      continue;
    }
    ZEST_RETURN_IF_ERROR(up.put(L.gate_up.bf + e * 2 * I * H, s.gate[g]));
    ZEST_RETURN_IF_ERROR(up.put(L.gate_up.bf + e * 2 * I * H + I * H, s.up[g]));
    ZEST_RETURN_IF_ERROR(up.put(L.down.bf + e * H * I, s.down[g]));
  }
  return Status::ok();
}

Result<model::PagedKVCache> CudaTextDecoder::allocate_cache(int64_t num_blocks, int64_t block_size) const {
  ZEST_CU(cudaSetDevice(dev_), "cudaSetDevice");
  if (block_size != kKvBlock)
    return invalid_argument("the CUDA KV cache uses blocks of " + std::to_string(kKvBlock) + " tokens (asked for " +
                            std::to_string(block_size) + ")");
  if (num_blocks <= 0) return invalid_argument("the KV cache needs at least one block");
  static std::atomic<uint64_t> caches_made{0};
  auto s = std::make_shared<CudaKvStorage>();
  s->owner = this;
  s->id = caches_made.fetch_add(1, std::memory_order_relaxed) + 1;
  s->layers = L_;
  s->blocks = num_blocks;
  s->per_layer = num_blocks * kKvBlock * Hkv_ * D_;
  s->kv_heads = Hkv_;
  s->head_dim = D_;
  ZEST_RETURN_IF_ERROR(s->mem.allocate(static_cast<size_t>(2 * L_ * s->per_layer) * sizeof(bf16),
                                       "the KV cache (" + std::to_string(num_blocks) + " blocks)"));
  return model::PagedKVCache(num_blocks, block_size, std::move(s));
}

Status CudaTextDecoder::ensure(const Caps& need) const {
  Step& s = *st_;
  Caps& c = s.caps;
  auto grow = [](int64_t have, int64_t want) {
    if (want <= have) return have;
    int64_t v = 16;
    while (v < want) v *= 2;
    return v;
  };
  const bool act = need.T > c.T || need.R > c.R;
  const bool in = act || need.S > c.S || need.M > c.M || need.nds > c.nds || need.max_blocks > c.max_blocks;
  if (!in) return Status::ok();
  ZEST_CU(cudaStreamSynchronize(stream_), "sync before growing step buffers");
  ++s.buffers_epoch;
  Caps n;
  const Caps old = c;
  c = Caps{};  // until every buffer is in place (a failed growth leaves nothing half-bound)
  n.T = grow(old.T, need.T);
  n.R = grow(old.R, need.R);
  n.S = grow(old.S, need.S);
  n.M = grow(old.M, need.M);
  n.nds = std::max(old.nds, need.nds);
  n.max_blocks = grow(old.max_blocks, need.max_blocks);
  if (act || !s.act.get()) {
    const size_t T = n.T, R = n.R, H = H_, K = std::max(K_, 1), E = std::max(E_, 1);
    const size_t hw = std::max<size_t>(K * I_, Id_);
    auto layout = [&](Carver& cv) {
      s.x = cv.take<bf16>(T * H);
      s.xn = cv.take<bf16>(T * H);
      s.o = cv.take<bf16>(T * H);
      s.qkv = cv.take<bf16>(T * QKV_);
      s.attn = cv.take<bf16>(T * Hq_ * D_);
      s.rl = cv.take<bf16>(T * E);
      s.h = cv.take<bf16>(T * hw);
      s.gu = cv.take<bf16>(T * 2 * Id_);
      s.ids = cv.take<int32_t>(T * K);
      s.ids_before = cv.take<int32_t>(T * K);
      s.ids_local = cv.take<int32_t>(El_ != E_ ? T * K : 1);
      s.route_w = cv.take<float>(T * K);
      s.slot_out = cv.take<float>(E_ > 0 ? T * K * H : 1);
      s.plan_buf = cv.take<char>(E_ > 0 ? moe_plan_bytes(static_cast<int>(T), K_, E_) : 1);
      s.xr = cv.take<bf16>(R * H);
      s.logits = cv.take<bf16>(R * V_);
      s.done = cv.take<unsigned>(1);
      s.attn_counters = cv.take<int32_t>(T * std::max(Hkv_, 1));
    };
    Carver sizing;
    layout(sizing);
    ZEST_RETURN_IF_ERROR(s.act.allocate(sizing.used, "step buffers for " + std::to_string(n.T) + " tokens"));
    Carver real{s.act.get(), 0};
    layout(real);
    if (E_ > 0) moe_plan_bind(s.plan, s.plan_buf, static_cast<int>(T), K_, El_);  // over the experts held
    ZEST_CU(cudaMemsetAsync(s.done, 0, sizeof(unsigned), stream_), "combine counter");
    ZEST_CU(cudaMemsetAsync(s.attn_counters, 0, T * std::max(Hkv_, 1) * sizeof(int32_t), stream_),
            "attention counters");
    ZEST_RETURN_IF_ERROR(s.logits_host.allocate(R * V_ * sizeof(uint16_t)));
  }
  StepInputs unused;
  const size_t bytes = layout_inputs(nullptr, n.T, n.S, n.max_blocks, n.R, n.M, n.nds, H_, &unused);
  ZEST_RETURN_IF_ERROR(s.in_dev.allocate(bytes, "step inputs"));
  ZEST_RETURN_IF_ERROR(s.in_host.allocate(bytes));
  c = n;
  return Status::ok();
}

Result<std::vector<accel::RerouteCounts>> CudaTextDecoder::reroute_counts() const {
  ZEST_CU(cudaSetDevice(dev_), "cudaSetDevice");
  std::vector<int64_t> raw(static_cast<size_t>(L_) * 6);
  ZEST_CU(cudaMemcpyAsync(raw.data(), st_->counters.get(), raw.size() * 8, cudaMemcpyDeviceToHost, stream_),
          "SERE counters copy");
  ZEST_CU(cudaStreamSynchronize(stream_), "SERE counters copy");
  std::vector<accel::RerouteCounts> out(L_);
  for (int l = 0; l < L_; ++l) {
    const int64_t* r = &raw[static_cast<size_t>(l) * 6];
    out[l] = {r[0], r[1], r[2], r[3], r[4], r[5]};
  }
  return out;
}

// The fewest rows an FP8 product takes on tensor cores (project). From 17 rows the tensor-core product made batch 32
// 1.4% slower and batch 64 3.1% faster than the streaming kernel (one H100, two rounds): it starts at 33.
constexpr int kFp8TcMinRows = 33;

Status CudaTextDecoder::project(const bf16* x, const Proj& w, bf16* y, int M, int N, int K, cudaStream_t st) const {
  if (!w.fp8()) return gemm(x, w.bf, y, M, N, K, st);
  const bool tc = opts_.fp8_tensor_core_prefill && w.blocks128 && gemm_fp8_tc_ok(N, K);
  // Up to 32 rows the weight-streaming kernel (bf16 activations); from 33 the tensor-core product, whose weight tile
  // is read once for 128 rows where the streaming kernel's 16-row items each read every row of x.
  if (M <= (tc ? kFp8TcMinRows - 1 : kFp8StreamMaxM)) return gemm_fp8(x, w.f8(), y, M, N, K, st);
  if (tc) {
    // x quantized per token per 128 columns into the scratch, then the FP8 tensor-core product
    uint8_t* x8 = reinterpret_cast<uint8_t*>(fp8_scratch_.get());
    const size_t codes = (static_cast<size_t>(M) * K + 255) / 256 * 256;
    if (codes + static_cast<size_t>(M) * (K / 128) * sizeof(float) <= fp8_scratch_.size()) {
      float* xs = reinterpret_cast<float*>(x8 + codes);
      ZEST_RETURN_IF_ERROR(quantize_rows_fp8(x, x8, xs, M, K, st));
      return gemm_fp8_tc(x8, xs, w.f8(), y, M, N, K, st);
    }
  }
  bf16* wb = reinterpret_cast<bf16*>(fp8_scratch_.get());
  ZEST_RETURN_IF_ERROR(dequantize_fp8(w.f8(), wb, N, K, st));
  return gemm(x, wb, y, M, N, K, st);
}

Status CudaTextDecoder::run_moe(int64_t l, const Layer& Ly, int T, const StepForms& forms,
                                const model::ForwardBatch& b, const model::MoeHooks* hooks, bool all_active,
                                const bf16* next_w) const {
  Step& s = *st_;
  cudaStream_t st = stream_;
  if (comm_ && hooks && hooks->moe_input)
    return unsupported("a rank of a parallel CUDA decoder takes no host MoE hooks (SERE runs on the device)");
  if (hooks && hooks->moe_input) {
    std::vector<uint16_t> bits(static_cast<size_t>(T) * H_);
    ZEST_CU(cudaMemcpyAsync(bits.data(), s.xn, bits.size() * 2, cudaMemcpyDeviceToHost, st), "MoE input copy");
    ZEST_CU(cudaStreamSynchronize(st), "MoE input copy");
    std::vector<float> x(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) x[i] = bf16_to_f32(bits[i]);
    hooks->moe_input(l, x.data(), T);
  }
  const model::RerouteSpec* spec = hooks ? hooks->reroute : nullptr;
  const bool spec_ok = spec && spec->complete(L_);
  const bool fuse_route = forms.fused_route;
  const bool rerouted = spec_ok && all_active ? !spec->similarity[l].empty() && spec->params.enabled(K_)
                                              : hooks && hooks->route;
  const bool plan_routed = fuse_route && !rerouted && !split();  // a split decoder plans its own experts below
  if (fuse_route) {
    ZEST_RETURN_IF_ERROR(moe_route(s.xn, Ly.router, nullptr, s.ids, s.route_w, s.rl, plan_routed ? &s.plan : nullptr,
                                   nullptr, T, H_, E_, K_, st));
  } else {
    ZEST_RETURN_IF_ERROR(gemm(s.xn, Ly.router, s.rl, T, E_, H_, st));
    ZEST_RETURN_IF_ERROR(router_topk(s.rl, nullptr, s.ids, s.route_w, T, E_, K_, st));
  }
  if (spec_ok && all_active) {
    if (!spec->similarity[l].empty() && spec->params.enabled(K_)) {
      const size_t ee = static_cast<size_t>(E_) * E_;
      if (spec->similarity[l].size() != ee)
        return invalid_argument("SERE similarity of layer " + std::to_string(l) + " is not [experts, experts]");
      if (s.sim_spec != spec->id) {
        if (!s.sim.get()) ZEST_RETURN_IF_ERROR(s.sim.allocate(static_cast<size_t>(L_) * ee * 4, "SERE similarity"));
        for (int k = 0; k < L_; ++k)
          if (spec->similarity[k].size() == ee)
            ZEST_CU(cudaMemcpyAsync(s.sim.get() + k * ee * 4, spec->similarity[k].data(), ee * 4,
                                    cudaMemcpyHostToDevice, st),
                    "SERE similarity upload");
        ZEST_CU(cudaStreamSynchronize(st), "SERE similarity upload");
        s.sim_spec = spec->id;
      }
      const int S = static_cast<int>(spec->params.primary);
      ZEST_CU(cudaMemcpyAsync(s.ids_before, s.ids, static_cast<size_t>(T) * K_ * 4, cudaMemcpyDeviceToDevice, st),
              "ids copy");
      ZEST_RETURN_IF_ERROR(sere_reroute(s.ids, s.route_w, reinterpret_cast<const float*>(s.sim.get()) + l * ee, T, E_,
                                        K_, S, spec->params.layer_thresholds[l], st));
      ZEST_RETURN_IF_ERROR(sere_stats(s.ids_before, s.ids, T, K_, S, E_,
                                      reinterpret_cast<int64_t*>(s.counters.get()) + l * 6, st, s.n_real));
    }
  } else if (hooks && hooks->route) {
    if (comm_) return unsupported("a rank of a parallel CUDA decoder takes no host MoE hooks (SERE runs on the device)");
    // Host re-routing: the hook sees the routing on the host, with per-token participation.
    const size_t n = static_cast<size_t>(T) * K_;
    std::vector<int32_t> ids(n);
    std::vector<float> wts(n);
    ZEST_CU(cudaMemcpyAsync(ids.data(), s.ids, n * 4, cudaMemcpyDeviceToHost, st), "routing copy");
    ZEST_CU(cudaMemcpyAsync(wts.data(), s.route_w, n * 4, cudaMemcpyDeviceToHost, st), "routing copy");
    ZEST_CU(cudaStreamSynchronize(st), "routing copy");
    std::vector<uint8_t> active(T, 1);
    int64_t t = 0;
    for (const model::SeqChunk& c : b.seqs)
      for (int64_t i = 0; i < c.length; ++i, ++t) active[t] = c.reroute ? 1 : 0;
    hooks->route(l, ids.data(), wts.data(), T, K_, active);
    ZEST_CU(cudaMemcpyAsync(s.ids, ids.data(), n * 4, cudaMemcpyHostToDevice, st), "routing copy");
    ZEST_CU(cudaMemcpyAsync(s.route_w, wts.data(), n * 4, cudaMemcpyHostToDevice, st), "routing copy");
    ZEST_CU(cudaStreamSynchronize(st), "routing copy");
  }
  // Expert parallelism: the plan over this rank's experts (the others' slots stay zero here and come from their
  // ranks in the all-reduce); the combine reads every slot through the whole ids.
  const int32_t* plan_ids = s.ids;
  if (El_ != E_) {
    ZEST_RETURN_IF_ERROR(local_expert_ids(s.ids, s.ids_local, T * K_, ep0_, El_, st));
    plan_ids = s.ids_local;
    ZEST_CU(cudaMemsetAsync(s.slot_out, 0, static_cast<size_t>(T) * K_ * H_ * sizeof(float), st), "slot zeroing");
  }
  if (!plan_routed)
    ZEST_RETURN_IF_ERROR(forms.decode_experts ? moe_plan(plan_ids, T, K_, El_, s.plan, nullptr, st)
                                              : moe_plan_prefill(plan_ids, T, K_, El_, s.plan, nullptr, st));
  // The f32 slot outputs into x (and xn), summed over the ranks first when split.
  auto combine = [&]() -> Status {
    if (comm_) ZEST_RETURN_IF_ERROR(all_reduce(s.slot_out, static_cast<int64_t>(T) * K_ * H_, false));
    return moe_combine_add_rmsnorm(s.x, s.slot_out, s.ids, K_, next_w, s.xn, T, H_, eps_, st);
  };
  if (forms.decode_experts && Ly.gate_up.fp8()) {
    // One token on one GPU: the combine folded into the down kernel (its last CTA), one launch fewer a layer.
    if (T == 1 && !split() && fp8_add_norm_ok(T, H_)) {
      Fp8AddNorm c;
      c.x = s.x;
      c.ids = s.ids;
      c.w = next_w;
      c.y = next_w ? s.xn : nullptr;
      c.eps = eps_;
      c.done = s.done;
      return moe_experts_fp8(s.xn, s.plan, s.route_w, Ly.gate_up.f8(), Ly.down.f8(), s.h, s.slot_out, T, K_, El_, H_,
                             I_, st, &c);
    }
    // With fp8_stream_experts, the persistent weight-streaming kernel from two tokens where its 256-column stages
    // fit the widths (at one token its per-item overhead made it slower: batch 1 TPOT 3.42 against 2.84 ms, one
    // H200); else one CTA per row tile.
    ZEST_RETURN_IF_ERROR(opts_.fp8_stream_experts && T >= 2 && moe_stream_fp8_ok(H_, I_)
                             ? moe_experts_stream_fp8(s.xn, s.plan, s.route_w, Ly.gate_up.f8(), Ly.down.f8(), s.h,
                                                      s.slot_out, T, K_, El_, H_, I_, st)
                             : moe_experts_fp8(s.xn, s.plan, s.route_w, Ly.gate_up.f8(), Ly.down.f8(), s.h,
                                               s.slot_out, T, K_, El_, H_, I_, st));
    return combine();
  }
  if (Ly.gate_up.fp8() && opts_.fp8_tensor_core_prefill && Ly.gate_up.blocks128 &&
      moe_experts_fp8_tc_ok(El_, H_, I_)) {
    // prefill on FP8 tensor cores: x and then h quantized per row per 128 columns into the scratch
    auto aligned = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t NK = static_cast<size_t>(T) * K_;
    const size_t x_codes = aligned(static_cast<size_t>(T) * H_), x_scales = aligned(static_cast<size_t>(T) * H_ / 32);
    const size_t h_codes = aligned(NK * I_), h_scales = aligned(NK * I_ / 32);
    if (x_codes + x_scales + h_codes + h_scales <= fp8_scratch_.size()) {
      uint8_t* x8 = reinterpret_cast<uint8_t*>(fp8_scratch_.get());
      float* xs = reinterpret_cast<float*>(x8 + x_codes);
      uint8_t* h8 = x8 + x_codes + x_scales;
      float* hs = reinterpret_cast<float*>(h8 + h_codes);
      ZEST_RETURN_IF_ERROR(quantize_rows_fp8(s.xn, x8, xs, T, H_, st));
      ZEST_RETURN_IF_ERROR(moe_gate_up_fp8_tc(x8, xs, s.plan, Ly.gate_up.f8(), s.h, T, K_, El_, H_, I_, st));
      ZEST_RETURN_IF_ERROR(quantize_rows_fp8(s.h, h8, hs, static_cast<int>(NK), I_, st));
      if (!split()) {  // bf16-exact slots stored as bf16 in the slot buffer's first half: half the bytes, the same bits
        bf16* slots = reinterpret_cast<bf16*>(s.slot_out);
        ZEST_RETURN_IF_ERROR(moe_down_fp8_tc(h8, hs, s.plan, s.route_w, Ly.down.f8(), slots, T, K_, El_, H_, I_, st));
        return moe_combine_add_rmsnorm(s.x, slots, s.ids, K_, next_w, s.xn, T, H_, eps_, st);
      }
      ZEST_RETURN_IF_ERROR(
          moe_down_fp8_tc(h8, hs, s.plan, s.route_w, Ly.down.f8(), s.slot_out, T, K_, El_, H_, I_, st));
      return combine();
    }
  }
  const bf16 *gate_up = Ly.gate_up.bf, *down = Ly.down.bf;
  if (Ly.gate_up.fp8()) {  // prefill: the layer's experts copied to bf16 for the grouped GEMMs
    bf16* g = reinterpret_cast<bf16*>(fp8_scratch_.get());
    bf16* d = g + static_cast<size_t>(El_) * 2 * I_ * H_;
    ZEST_RETURN_IF_ERROR(dequantize_fp8(Ly.gate_up.f8(), g, El_ * 2 * I_, H_, st));
    ZEST_RETURN_IF_ERROR(dequantize_fp8(Ly.down.f8(), d, El_ * H_, I_, st));
    gate_up = g;
    down = d;
  }
  if (forms.decode_experts && !split())  // next_w null: x only (the down kernel by rows at one token)
    return moe_experts_decode_combine(s.xn, s.plan, s.route_w, gate_up, down, s.h, s.slot_out, T, K_, E_, H_, I_,
                                      s.x, s.ids, next_w, next_w ? s.xn : nullptr, eps_, s.done, st);
  if (!split() && moe_prefill_bf16_slots(s.h, down, E_, H_, I_)) {
    // The default grouped GEMM stores its slot outputs (bf16-exact values) as bf16 in the fp32 slot buffer's first
    // half: half the bytes for its stores and the combine's loads, the same results .
    bf16* slots = reinterpret_cast<bf16*>(s.slot_out);
    ZEST_RETURN_IF_ERROR(moe_prefill_gate_up(s.xn, s.plan, gate_up, s.h, T, K_, E_, H_, I_, st));
    ZEST_RETURN_IF_ERROR(moe_prefill_down(s.h, s.plan, s.route_w, down, slots, T, K_, E_, H_, I_, st));
    return moe_combine_add_rmsnorm(s.x, slots, s.ids, K_, next_w, s.xn, T, H_, eps_, st);
  }
  ZEST_RETURN_IF_ERROR(
      moe_experts_prefill(s.xn, s.plan, s.route_w, gate_up, down, s.h, s.slot_out, T, K_, El_, H_, I_, st));
  return combine();
}

Status CudaTextDecoder::all_reduce(void* dev, int64_t n, bool bf16_values) const {
  if (comm_->reduces_on_device()) return comm_->all_reduce_sum_device(dev, n, bf16_values, stream_);
  Step& s = *st_;
  const size_t un = static_cast<size_t>(n);
  s.reduce_host.resize(un);
  if (bf16_values) {
    s.reduce_bits.resize(un);
    ZEST_CU(cudaMemcpyAsync(s.reduce_bits.data(), dev, un * 2, cudaMemcpyDeviceToHost, stream_), "all-reduce copy");
    ZEST_CU(cudaStreamSynchronize(stream_), "all-reduce copy");
    for (size_t i = 0; i < un; ++i) s.reduce_host[i] = bf16_to_f32(s.reduce_bits[i]);
  } else {
    ZEST_CU(cudaMemcpyAsync(s.reduce_host.data(), dev, un * 4, cudaMemcpyDeviceToHost, stream_), "all-reduce copy");
    ZEST_CU(cudaStreamSynchronize(stream_), "all-reduce copy");
  }
  ZEST_RETURN_IF_ERROR(comm_->all_reduce_sum(s.reduce_host.data(), n));
  if (bf16_values) {
    for (size_t i = 0; i < un; ++i) s.reduce_bits[i] = f32_to_bf16(s.reduce_host[i]);
    ZEST_CU(cudaMemcpyAsync(dev, s.reduce_bits.data(), un * 2, cudaMemcpyHostToDevice, stream_), "all-reduce copy");
  } else {
    ZEST_CU(cudaMemcpyAsync(dev, s.reduce_host.data(), un * 4, cudaMemcpyHostToDevice, stream_), "all-reduce copy");
  }
  return cuda_status(cudaStreamSynchronize(stream_), "all-reduce copy");  // the host buffer is reused
}

// ---- decode graphs and device sampling -------------------------------------------------------------------

// Graphs at most this many sequences (larger decode batches run eagerly).
constexpr int kMaxGraphSeqs = 512;
// The padded row count of a decode step of S sequences: rows_class(S) (kernels.h).
int graph_pad_rows(int S) { return rows_class(S); }
constexpr size_t kMaxGraphKeys = 16384;
// The decode-attention bound of a step whose longest sequence needs `blocks` KV blocks: the next power of two up
// to 16 blocks, then the next multiple of 16 blocks, at most the block-table width.
int context_bucket_blocks(int64_t blocks, int64_t table_width) {
  int64_t b = 1;
  if (blocks <= 16) {
    while (b < blocks) b *= 2;
  } else {
    b = (blocks + 15) / 16 * 16;
  }
  return static_cast<int>(std::min(b, table_width));
}
std::atomic<int64_t> g_graph_launches{0};
std::atomic<int64_t> g_graph_captures{0};
// The part of a graph key that bounds decode attention (0 when the step takes no bound: head_dim != 128).
int use_decode_bound_key(int ctx_bucket, int head_dim) { return head_dim == 128 ? ctx_bucket : 0; }

Status CudaTextDecoder::ensure_sample(int64_t rows) const {
  Step& s = *st_;
  if (rows <= s.samp_rows && s.samp.get()) return Status::ok();
  ZEST_CU(cudaStreamSynchronize(stream_), "sync before growing sampling buffers");
  ++s.buffers_epoch;
  s.samp_rows = 0;
  const size_t R = static_cast<size_t>(rows), C = kSampleMaxCandidates;
  auto layout = [&](Carver& cv) {
    s.samp_out = cv.take<SampleRowOut>(R);
    s.cand_ids = cv.take<int32_t>(R * C);
    s.cand_logits = cv.take<float>(R * C);
  };
  Carver sizing;
  layout(sizing);
  ZEST_RETURN_IF_ERROR(s.samp.allocate(sizing.used, "sampling buffers"));
  ZEST_RETURN_IF_ERROR(s.samp_host.allocate(sizing.used));
  Carver real{s.samp.get(), 0};
  layout(real);
  s.samp_rows = rows;
  return Status::ok();
}

void CudaTextDecoder::clear_graphs() const {
  Step& s = *st_;
  for (auto& [key, g] : s.graphs)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  s.graphs.clear();
  s.live_graphs = 0;
}

// What a captured step depends on besides its key: every buffer (the KV cache's included: its layers' K/V pointers
// are kernel arguments), by address and by allocation (the cache's id, the step buffers' epoch), and whether launches
// are programmatic.
std::vector<uintptr_t> CudaTextDecoder::graph_fingerprint(const CudaKvStorage& kv) const {
  const Step& s = *st_;
  std::vector<uintptr_t> f = {static_cast<uintptr_t>(kv.id), static_cast<uintptr_t>(s.buffers_epoch),
                              reinterpret_cast<uintptr_t>(kv.mem.get()), static_cast<uintptr_t>(kv.per_layer),
                              reinterpret_cast<uintptr_t>(s.act.get()),       reinterpret_cast<uintptr_t>(s.in_dev.get()),
                              reinterpret_cast<uintptr_t>(s.in_host.get()),   reinterpret_cast<uintptr_t>(s.ws.get()),
                              reinterpret_cast<uintptr_t>(s.sim.get()),       reinterpret_cast<uintptr_t>(s.samp.get()),
                              reinterpret_cast<uintptr_t>(s.samp_host.get()), reinterpret_cast<uintptr_t>(s.logits_host.get()),
                              static_cast<uintptr_t>(s.caps.max_blocks),      static_cast<uintptr_t>(programmatic_launch())};
  return f;
}

Result<Tensor> CudaTextDecoder::forward(const model::ForwardBatch& b, model::PagedKVCache& cache,
                                        const model::MoeHooks* hooks) const {
  Tensor out;
  ZEST_RETURN_IF_ERROR(run_step(b, cache, hooks, nullptr, &out, nullptr));
  return out;
}

Result<std::vector<model::SampleResult>> CudaTextDecoder::forward_sample(const model::ForwardBatch& b,
                                                                         model::PagedKVCache& cache,
                                                                         const model::MoeHooks* hooks,
                                                                         const std::vector<model::SampleRow>& rows) const {
  std::vector<model::SampleResult> out;
  ZEST_RETURN_IF_ERROR(run_step(b, cache, hooks, &rows, nullptr, &out));
  return out;
}

Status CudaTextDecoder::run_step(const model::ForwardBatch& b, model::PagedKVCache& cache, const model::MoeHooks* hooks,
                                 const std::vector<model::SampleRow>* sample_rows_in, Tensor* logits_out,
                                 std::vector<model::SampleResult>* sampled) const {
  ZEST_CU(cudaSetDevice(dev_), "cudaSetDevice");
  const int64_t T64 = b.num_tokens();
  auto* kv = dynamic_cast<CudaKvStorage*>(cache.storage());
  if (!kv || kv->owner != this)
    return invalid_argument("forward: the KV cache was not made by this CUDA decoder (use its allocate_cache)");
  if (T64 <= 0) return invalid_argument("forward: the batch has no tokens");
  if (T64 > (int64_t{1} << 24)) return out_of_range("forward: too many tokens in one step");
  if (El_ != E_ && !comm_)
    return invalid_argument("forward: this decoder holds experts " + std::to_string(ep0_) + ".." +
                            std::to_string(ep0_ + El_ - 1) + " of " + std::to_string(E_) +
                            ": it runs only as a rank of a parallel decoder (set_communicator)");
  if (static_cast<int64_t>(b.positions.size()) != 3 * T64) return invalid_argument("forward: positions must be [3, T]");
  Caps need;
  int64_t sum = 0, max_ctx = 0, max_len = 0;
  bool decode_only = true, any_fresh = false, all_active = true;
  for (const model::SeqChunk& c : b.seqs) {
    if (!c.block_table || c.length <= 0) return invalid_argument("forward: empty chunk or missing block table");
    const int64_t blocks = cache.blocks_for(c.start + c.length);
    if (blocks > static_cast<int64_t>(c.block_table->size()))
      return invalid_argument("forward: KV blocks not reserved for the chunk");
    for (int64_t i = 0; i < blocks; ++i) {
      const int32_t blk = (*c.block_table)[i];
      if (blk < 0 || blk >= kv->blocks) return invalid_argument("forward: block id outside the KV cache");
    }
    need.max_blocks = std::max(need.max_blocks, blocks);
    need.R += c.all_logits ? c.length : 1;
    sum += c.length;
    max_ctx = std::max(max_ctx, c.start + c.length);
    max_len = std::max(max_len, c.length);
    decode_only = decode_only && c.length == 1;
    any_fresh = any_fresh || c.start == 0;
    all_active = all_active && c.reroute;
  }
  if (sum != T64) return invalid_argument("forward: chunk lengths do not add up to the token count");
  for (int32_t tok : b.tokens)
    if (tok < 0 || tok >= V_) return invalid_argument("forward: token id " + std::to_string(tok) + " out of range");
  const int64_t M = static_cast<int64_t>(b.mm_index.size());
  const bool mm_dev = !b.mm_device.empty();
  int64_t dev_ds = mm_dev ? INT64_MAX : 0, dev_rows = 0;
  for (const auto& seg : b.mm_device) {
    dev_ds = std::min<int64_t>(dev_ds, static_cast<int64_t>(seg.deepstack.size()));
    dev_rows += seg.rows;
  }
  const int64_t nds = M > 0 ? std::min<int64_t>(mm_dev ? dev_ds : static_cast<int64_t>(b.deepstack.size()), L_) : 0;
  if (M > 0 && mm_dev) {
    if (dev_rows != M) return invalid_argument("forward: device visual row segments do not add up to mm_index");
    for (const auto& seg : b.mm_device) {
      if (seg.rows < 0 || (seg.rows > 0 && !seg.embeds)) return invalid_argument("forward: bad device visual rows");
      for (int64_t l = 0; l < nds && seg.rows > 0; ++l)
        if (!seg.deepstack[l]) return invalid_argument("forward: null device deepstack rows");
    }
    for (int64_t r : b.mm_index)
      if (r < 0 || r >= T64) return invalid_argument("forward: mm_index row outside the batch");
  } else if (M > 0) {
    if (b.mm_embeds.dtype() != DType::F32 || b.mm_embeds.device() != Device::CPU || b.mm_embeds.ndim() != 2 ||
        b.mm_embeds.dim(0) != M || b.mm_embeds.dim(1) != H_)
      return invalid_argument("forward: mm_embeds must be a CPU f32 tensor [mm rows, hidden]");
    for (int64_t l = 0; l < nds; ++l)
      if (b.deepstack[l].dtype() != DType::F32 || b.deepstack[l].device() != Device::CPU ||
          b.deepstack[l].numel() != M * H_)
        return invalid_argument("forward: deepstack features must be CPU f32 tensors [mm rows, hidden]");
    for (int64_t r : b.mm_index)
      if (r < 0 || r >= T64) return invalid_argument("forward: mm_index row outside the batch");
  }
  // A decode step without host hooks or visual rows can replay a CUDA graph: everything its kernels read is at
  // fixed device addresses, and decode attention's bound is the context bucket rather than the exact length.
  using Graphs = model::DeviceDecodeOptions::Graphs;
  const Graphs gmode = opts_.graphs;
  const model::RerouteSpec* gspec = hooks ? hooks->reroute : nullptr;
  const bool sere_dev = gspec && gspec->complete(L_) && all_active;
  const bool host_hooks = hooks && (hooks->moe_input || (hooks->route && !sere_dev));
  const int S_in = static_cast<int>(b.seqs.size());
  // Rows with logit edits, token masks or log-probabilities run in eager, unpadded steps (their inputs vary in size).
  bool row_extras = false;
  if (sample_rows_in)
    for (const model::SampleRow& row : *sample_rows_in)
      row_extras = row_extras || !row.edits.empty() || row.logprobs >= 0 || row.allowed;
  const bool graph_step = !row_extras && gmode != Graphs::kOff && !(gmode == Graphs::kOn && st_->graphs_broken) && decode_only &&
                          M == 0 && S_in <= kMaxGraphSeqs && !host_hooks &&
                          (!comm_ || comm_->reduces_on_device());  // host-staged sums run eagerly
  const bool graphable = gmode == Graphs::kOn && graph_step && (!sere_dev || st_->sim_spec == gspec->id);
  // Padding of a decode step that replays a graph (or, in "eager" mode, launches what a replay would): S_in real
  // sequences run as P = graph_pad_rows(S_in) rows, rows S_in .. P-1 being padding rows. Padding row i repeats real
  // row (i - S_in) % S_in: its token, positions, context length and block table row, so every kernel computes for it
  // bit for bit what it computes for that real row (the same hidden state in every layer). Hence:
  // - KV cache: its slot is -1, so qk_norm_rope_kv and decode_attention_fused write nothing for it; it only reads
  //   its real row's pages, whose current token the fused kernel takes from its own on-chip k/v (equal to what the
  //   real row stores) and the unfused kernels from the cache after the real row's write.
  // - MoE: its experts are its real row's, so the union of the step's experts (the weights read), the SERE primary
  //   set (sere_reroute maps over that union) and so every real row's routing are those of the unpadded step; the
  //   SERE statistics count the first S_in rows only (the real count is a step input). An expert's token count can
  //   at most double (P <= 2 * S_in).
  // - Outputs: its logits row and sampling summary (plan kSampleNone: no candidates, no whole row) stay on the
  //   device or in the staging buffers; the caller gets the first S_in rows only.
  // The kernels take the same paths for S_in and P rows (every path switch is on the ladder, see rows_class) and
  // make their row-count-dependent choices (cuBLASLt algorithm, decode attention split plan) for the row class, so
  // each real row gets the unpadded step's bits.
  const int P = graph_step && opts_.graph_padding ? graph_pad_rows(S_in) : S_in;
  const bool padded = P != S_in;
  const int T = padded ? P : static_cast<int>(T64), S = P;
  need.T = T;
  need.S = S;
  need.M = M;
  need.nds = nds;
  const int R_out = static_cast<int>(need.R);  // the caller's logits rows
  need.R = padded ? P : need.R;
  ZEST_RETURN_IF_ERROR(ensure(need));
  Step& s = *st_;
  const Caps& cap = s.caps;
  const int MB = static_cast<int>(cap.max_blocks), R = static_cast<int>(need.R);
  int64_t n_edits = 0, n_masks = 0;
  const int64_t W = (static_cast<int64_t>(V_) + 31) / 32;
  if (sample_rows_in) {
    if (static_cast<int64_t>(sample_rows_in->size()) != R_out)
      return invalid_argument("forward_sample: " + std::to_string(sample_rows_in->size()) + " row plans for " +
                              std::to_string(R_out) + " logits rows");
    for (const model::SampleRow& row : *sample_rows_in) {
      const bool sampled_mode = row.mode == model::SampleMode::kTemperature || row.mode == model::SampleMode::kCandidates;
      if (static_cast<int>(row.mode) < 0 || static_cast<int>(row.mode) > static_cast<int>(model::SampleMode::kFull))
        return invalid_argument("forward_sample: unknown sampling mode");
      if (sampled_mode && !(row.temperature > 0))
        return invalid_argument("forward_sample: temperature must be positive for sampled rows");
      if (row.mode == model::SampleMode::kCandidates &&
          (row.candidates < 1 || row.candidates > std::min<int64_t>(V_, kSampleMaxCandidates)))
        return invalid_argument("forward_sample: candidates must be in [1, min(vocab, 1024)]");
      if (row.logprobs > model::kMaxTopLogprobs)
        return invalid_argument("forward_sample: at most 20 top logprobs per row");
      for (size_t k = 0; k < row.edits.size(); ++k)
        if (row.edits[k].id < 0 || row.edits[k].id >= V_ || (k > 0 && row.edits[k].id <= row.edits[k - 1].id))
          return invalid_argument("forward_sample: logit edit ids must be ascending and in [0, vocab)");
      n_edits += static_cast<int64_t>(row.edits.size());
      if (row.allowed) {
        if (static_cast<int64_t>(row.allowed->size()) != W)
          return invalid_argument("forward_sample: a token mask must have (vocab + 31) / 32 words");
        ++n_masks;
      }
    }
    ZEST_RETURN_IF_ERROR(ensure_sample(cap.R));
  }
  // Logit edits and log-probability summaries: staged on the host mirror, one copy in the step.
  RowExtras xh{}, xd{};
  size_t extras_in = 0;
  int lp0 = -1, lp1 = -1;  // the range of rows with log-probabilities
  if (row_extras) {
    const size_t bytes = layout_extras(nullptr, R, n_edits, n_masks, W, &xh);
    Step& sx = *st_;
    if (bytes > sx.extras_bytes) {
      ZEST_CU(cudaStreamSynchronize(stream_), "sync before growing the logit edit buffers");
      sx.extras_bytes = 0;
      ZEST_RETURN_IF_ERROR(sx.extras.allocate(bytes * 2, "logit edit buffers"));
      ZEST_RETURN_IF_ERROR(sx.extras_host.allocate(bytes * 2));
      sx.extras_bytes = bytes * 2;
    }
    layout_extras(sx.extras_host.get(), R, n_edits, n_masks, W, &xh);
    layout_extras(sx.extras.get(), R, n_edits, n_masks, W, &xd);
    extras_in = static_cast<size_t>(xh.inputs_end - sx.extras_host.get());
    int32_t at = 0, mk = 0;
    for (int i = 0; i < R; ++i) {
      xh.edit_begin[i] = at;
      xh.mask_row[i] = -1;
      SampleRowSpec lp;  // kSampleNone
      if (i < R_out) {
        const model::SampleRow& row = (*sample_rows_in)[i];
        for (const model::LogitEdit& e : row.edits) xh.edits[at++] = LogitEditSpec{e.id, e.bias, e.rep, e.sub};
        if (row.allowed) {
          std::memcpy(xh.masks + static_cast<size_t>(mk) * W, row.allowed->data(), static_cast<size_t>(W) * 4);
          xh.mask_row[i] = mk++;
        }
        if (row.logprobs >= 0) {
          lp.mode = kSampleCandidates;
          lp.candidates = std::max(1, std::min<int>(row.logprobs, V_));
          lp.inv_t = 1.f;
          if (lp0 < 0) lp0 = i;
          lp1 = i;
        }
      }
      xh.lp_specs[i] = lp;
    }
    xh.edit_begin[R] = at;
  }
  const int ctx_bucket = gmode == Graphs::kOff ? 0 : context_bucket_blocks(need.max_blocks, MB);

  // Host side of the step inputs, one H2D copy.
  StepInputs hi, di;
  const size_t in_bytes = layout_inputs(s.in_host.get(), T, S, MB, R, M, nds, H_, &hi);
  layout_inputs(s.in_dev.get(), T, S, MB, R, M, nds, H_, &di);
  int32_t *h_tokens = hi.tokens, *h_pos = hi.pos, *h_slots = hi.slots, *h_tok_seq = hi.tok_seq, *h_tok_ctx = hi.tok_ctx,
          *h_gen = hi.gen, *h_cu = hi.cu, *h_seq_ctx = hi.seq_ctx, *h_bt = hi.block_table, *h_rows = hi.rows,
          *h_mm = hi.mm_index;
  uint16_t* h_mm_emb = hi.mm_rows;
  const int T_in = static_cast<int>(T64);
  std::memcpy(h_tokens, b.tokens.data(), static_cast<size_t>(T_in) * 4);
  for (int a = 0; a < 3; ++a)
    std::memcpy(h_pos + static_cast<size_t>(a) * T, b.positions.data() + static_cast<size_t>(a) * T_in,
                static_cast<size_t>(T_in) * 4);
  *hi.n_real = T_in;
  int n_gen = 0, t = 0, r = 0;
  h_cu[0] = 0;
  for (int si = 0; si < S_in; ++si) {
    const model::SeqChunk& c = b.seqs[si];
    const std::vector<int32_t>& table = *c.block_table;
    for (int i = 0; i < MB; ++i) h_bt[static_cast<size_t>(si) * MB + i] = i < static_cast<int>(table.size()) ? table[i] : 0;
    for (int64_t i = 0; i < c.length; ++i, ++t) {
      const int64_t p = c.start + i;
      h_slots[t] = table[p / kKvBlock] * kKvBlock + static_cast<int32_t>(p % kKvBlock);
      h_tok_seq[t] = si;
      h_tok_ctx[t] = static_cast<int32_t>(p + 1);
      if (c.start > 0) h_gen[n_gen++] = t;
      if (c.all_logits) h_rows[r++] = t;
    }
    if (!c.all_logits) h_rows[r++] = t - 1;
    h_cu[si + 1] = t;
    h_seq_ctx[si] = static_cast<int32_t>(c.start + c.length);
  }
  // Padding rows (decode-only: row i is token i and sequence i): copies of real row src without a KV slot.
  for (int i = S_in; i < P; ++i) {
    const int src = (i - S_in) % S_in;
    h_tokens[i] = h_tokens[src];
    for (int a = 0; a < 3; ++a) h_pos[static_cast<size_t>(a) * T + i] = h_pos[static_cast<size_t>(a) * T + src];
    h_slots[i] = -1;
    h_tok_seq[i] = i;
    h_tok_ctx[i] = h_tok_ctx[src];
    if (b.seqs[src].start > 0) h_gen[n_gen++] = i;
    std::memcpy(h_bt + static_cast<size_t>(i) * MB, h_bt + static_cast<size_t>(src) * MB, static_cast<size_t>(MB) * 4);
    h_rows[r++] = i;
    h_cu[i + 1] = i + 1;
    h_seq_ctx[i] = h_seq_ctx[src];
  }
  for (int64_t i = 0; i < M; ++i) h_mm[i] = static_cast<int32_t>(b.mm_index[i]);
  for (int64_t k = 0; k <= nds && M > 0 && !mm_dev; ++k) {
    const float* src = k == 0 ? b.mm_embeds.data<float>() : b.deepstack[k - 1].data<float>();
    for (int64_t i = 0; i < M * H_; ++i) h_mm_emb[k * M * H_ + i] = f32_to_bf16(src[i]);
  }
  for (int i = 0; i < R; ++i) {
    SampleRowSpec spec;  // padding rows: kSampleNone
    if (sample_rows_in && i < R_out) {
      const model::SampleRow& row = (*sample_rows_in)[i];
      spec.mode = static_cast<int32_t>(row.mode);
      spec.candidates = row.candidates;
      spec.inv_t = row.temperature > 0 ? static_cast<float>(1.0 / row.temperature) : 1.f;
      spec.u = row.u;
    }
    hi.specs[i] = spec;
  }
  s.n_real = di.n_real;
  cudaStream_t st = stream_;
  // Device visual rows: the staged rows section (the layout's last) is not copied.
  const size_t copy_bytes =
      mm_dev ? static_cast<size_t>(reinterpret_cast<char*>(hi.mm_rows) - s.in_host.get()) : in_bytes;
  // The device work of the step, from the input copy to the output copies: launched eagerly, or captured once per
  // graph key and replayed.
  auto enqueue = [&]() -> Status {
  ZEST_CU(cudaMemcpyAsync(s.in_dev.get(), s.in_host.get(), copy_bytes, cudaMemcpyHostToDevice, st), "step input copy");
  const int32_t *d_tokens = di.tokens, *d_pos = di.pos, *d_slots = di.slots, *d_tok_seq = di.tok_seq,
                *d_tok_ctx = di.tok_ctx, *d_gen = di.gen, *d_cu = di.cu, *d_seq_ctx = di.seq_ctx,
                *d_bt = di.block_table, *d_rows = di.rows, *d_mm = di.mm_index;
  const bf16* d_mm_emb = reinterpret_cast<const bf16*>(di.mm_rows);
  // Visual rows of feature k (0: embeddings, l + 1: DeepStack after layer l): the staged rows, the caller's
  // device rows (one segment), or several device segments copied into the staging area.
  auto seg_ptr = [&](const model::ForwardBatch::DeviceRows& seg, int64_t k) {
    return static_cast<const bf16*>(k == 0 ? seg.embeds : seg.deepstack[k - 1]);
  };
  if (mm_dev && M > 0 && b.mm_device.size() > 1)
    for (int64_t k = 0; k <= nds; ++k) {
      int64_t at = 0;
      for (const auto& seg : b.mm_device) {
        if (seg.rows > 0)
          ZEST_CU(cudaMemcpyAsync(di.mm_rows + (k * M + at) * H_, seg_ptr(seg, k),
                                  static_cast<size_t>(seg.rows * H_) * sizeof(bf16), cudaMemcpyDeviceToDevice, st),
                  "visual row copy");
        at += seg.rows;
      }
    }
  auto mm_src = [&](int64_t k) -> const bf16* {
    if (mm_dev && b.mm_device.size() == 1) return seg_ptr(b.mm_device[0], k);
    return d_mm_emb + k * M * H_;
  };

  // Attention plan: the fast kernels need head_dim 128; decode-only steps use split-K decode attention; steps with a
  // chunk starting at 0 use the contiguous prefill kernel (run on every chunk, the rows of the other chunks and
  // decode tokens are then recomputed by the generic paged kernel); steps without one run every token through the
  // decode attention kernels as a row of its own (token_attention).
  const float scale = 1.f / std::sqrt(static_cast<float>(D_));
  StepForms forms;
  forms.decode_attention = D_ == 128 && decode_only;
  forms.prefill_attention = D_ == 128 && !decode_only && any_fresh;
  forms.token_attention = D_ == 128 && !decode_only && !any_fresh;
  const bool use_decode = forms.decode_attention;
  DecodeAttention dp;
  if (use_decode) {
    dp.batch = S;
    dp.q_heads = Hq_;
    dp.kv_heads = Hkv_;
    dp.head_dim = D_;
    dp.max_context = ctx_bucket > 0 ? ctx_bucket * kKvBlock : static_cast<int>(max_ctx);
    dp.max_blocks = MB;
    dp.scale = scale;
    dp.counters = s.attn_counters;  // zero between launches: the workspace holds partials only, never zeroed
    const size_t ws = decode_attention_workspace_bytes(dp);
    if (ws > s.ws.size()) ZEST_RETURN_IF_ERROR(s.ws.allocate(std::max(ws, 2 * s.ws.size()), "attention workspace"));
  }
  DecodeAttention tp;  // token_attention: row t is token t, its sequence's block-table row gathered for it
  if (forms.token_attention) {
    tp.batch = T;
    tp.q_heads = Hq_;
    tp.kv_heads = Hkv_;
    tp.head_dim = D_;
    tp.max_context = static_cast<int>(max_ctx);
    tp.max_blocks = MB;
    tp.scale = scale;
    tp.counters = s.attn_counters;  // T * kv_heads, zero between launches
    const size_t ws = decode_attention_workspace_bytes(tp);
    if (ws > s.ws.size()) ZEST_RETURN_IF_ERROR(s.ws.allocate(std::max(ws, 2 * s.ws.size()), "attention workspace"));
    const size_t tab = static_cast<size_t>(T) * MB * sizeof(int32_t);
    if (tab > s.tok_table.size())
      ZEST_RETURN_IF_ERROR(s.tok_table.allocate(std::max(tab, 2 * s.tok_table.size()), "per-token block tables"));
    // A bit copy of int32 rows (2 * MB bf16 lanes each) from the sequences' table rows.
    ZEST_RETURN_IF_ERROR(gather_rows(reinterpret_cast<const bf16*>(d_bt), d_tok_seq,
                                     reinterpret_cast<bf16*>(s.tok_table.get()), T, 2 * MB, st));
  }

  // Decoder layers read qkv at the same address every layer: the fused attention's check holds for all of them.
  forms.fused_attention = use_decode && decode_attention_fused_ok(dp, s.qkv, QKV_);
  // (the one-token forms fold norms into bf16 kernels: not with FP8 weights)
  forms.one_token = use_decode && T == 1 && E_ > 0 && !fp8_ && !split() && moe_down_rows_on(1, K_, E_, H_, I_) &&
                    gemm_kv_norm_ok(1, QKV_, H_);
  forms.fused_route = E_ > 0 && moe_route_ok(T, H_, E_, K_);
  forms.decode_experts = T <= 64;
  const bool rows = forms.one_token;

  ZEST_RETURN_IF_ERROR(embedding(d_tokens, embed_, s.x, T, H_, V_, st));
  if (M > 0) ZEST_RETURN_IF_ERROR(scatter_rows(mm_src(0), d_mm, s.x, static_cast<int>(M), H_, false, st));
  if (!rows) ZEST_RETURN_IF_ERROR(rmsnorm(s.x, layers_[0].in_norm, s.xn, T, H_, eps_, st));
  bool x_only = rows;  // xn is stale: the next consumer normalises x
  for (int l = 0; l < L_; ++l) {
    const Layer& Ly = layers_[l];
    const bf16* next = l + 1 < L_ ? layers_[l + 1].in_norm : final_norm_;
    if (use_decode) {  // the qkv GEMM prefetches the layer's KV rows into L2 (gemm_kv_prefetch, gemm_fp8_kv_prefetch)
      KvPrefetch kvp;
      kvp.k_cache = kv->k(l);
      kvp.v_cache = kv->v(l);
      kvp.block_table = d_bt;
      kvp.context_lens = d_seq_ctx;
      kvp.batch = dp.batch;
      kvp.max_blocks = MB;
      kvp.row_bytes = Hkv_ * D_ * 2;
      if (Ly.wqkv.fp8()) {  // (never x only: the one-token forms are off with FP8 weights)
        ZEST_RETURN_IF_ERROR(T <= 2 ? gemm_fp8_kv_prefetch(s.xn, Ly.wqkv.f8(), s.qkv, T, QKV_, H_, kvp, st)
                                    : project(s.xn, Ly.wqkv, s.qkv, T, QKV_, H_, st));
      } else {
        if (x_only) {
          kvp.norm_w = Ly.in_norm;
          kvp.norm_eps = eps_;
        }
        ZEST_RETURN_IF_ERROR(gemm_kv_prefetch(x_only ? s.x : s.xn, Ly.wqkv.bf, s.qkv, T, QKV_, H_, kvp, st));
      }
      x_only = false;
    } else {
      ZEST_RETURN_IF_ERROR(project(s.xn, Ly.wqkv, s.qkv, T, QKV_, H_, st));
    }
    // Decode steps (token b is sequence b's current token) may fold q/k norm + RoPE + KV write into the attention.
    const bool fused_attn = forms.fused_attention;
    if (!fused_attn)
      ZEST_RETURN_IF_ERROR(qk_norm_rope_kv(s.qkv, Ly.q_norm, Ly.k_norm, d_pos, T, rope_, d_slots, kv->k(l), kv->v(l), T,
                                           Hq_, Hkv_, D_, eps_, st));
    if (fused_attn) {
      ZEST_RETURN_IF_ERROR(decode_attention_fused(dp, s.qkv, QKV_, Ly.q_norm, Ly.k_norm, d_pos, T, rope_, d_slots,
                                                  kv->k(l), kv->v(l), d_bt, d_seq_ctx, s.attn, s.ws.get(), eps_, st));
    } else if (use_decode) {
      ZEST_RETURN_IF_ERROR(decode_attention(dp, s.qkv, QKV_, kv->k(l), kv->v(l), d_bt, d_seq_ctx, s.attn, s.ws.get(), st));
    } else if (forms.token_attention) {
      ZEST_RETURN_IF_ERROR(decode_attention(tp, s.qkv, QKV_, kv->k(l), kv->v(l),
                                            reinterpret_cast<const int32_t*>(s.tok_table.get()), d_tok_ctx, s.attn,
                                            s.ws.get(), st));
    } else {
      if (forms.prefill_attention)
        ZEST_RETURN_IF_ERROR(prefill_attention(s.qkv, QKV_, s.qkv + Hq_ * D_, s.qkv + (Hq_ + Hkv_) * D_, QKV_, d_cu, S,
                                               static_cast<int>(max_len), s.attn, Hq_, Hkv_, D_, scale, st));
      const bool all_generic = !forms.prefill_attention;
      const int n = all_generic ? T : n_gen;
      if (n > 0)
        ZEST_RETURN_IF_ERROR(paged_attention(s.qkv, QKV_, kv->k(l), kv->v(l), d_bt, MB, d_tok_seq, d_tok_ctx,
                                             all_generic ? nullptr : d_gen, n, s.attn, Hq_ * D_, Hq_, Hkv_, D_, scale,
                                             st));
    }
    if (T == 1 && !split() && Ly.wo.fp8() && fp8_add_norm_ok(T, H_)) {
      // FP8 at one token: the residual add and the post-attention norm in the o product's last CTA
      Fp8AddNorm an;
      an.x = s.x;
      an.w = Ly.post_norm;
      an.y = s.xn;
      an.eps = eps_;
      an.done = s.done;
      ZEST_RETURN_IF_ERROR(gemm_fp8(s.attn, Ly.wo.f8(), s.o, T, H_, Hq_ * D_, st, &an));
    } else {
      ZEST_RETURN_IF_ERROR(project(s.attn, Ly.wo, s.o, T, H_, Hq_ * D_, st));
      if (comm_) ZEST_RETURN_IF_ERROR(all_reduce(s.o, static_cast<int64_t>(T) * H_, true));  // the ranks' heads
      ZEST_RETURN_IF_ERROR(add_rmsnorm(s.x, s.o, Ly.post_norm, s.xn, T, H_, eps_, st));
    }
    const bool ds = l < nds;
    if (Ly.moe) {
      Status ms = run_moe(l, Ly, T, forms, b, hooks, all_active, ds || rows ? nullptr : next);
      if (!ms.is_ok()) return ms.with_context("layer " + std::to_string(l));
      x_only = rows && !ds;
    } else {
      ZEST_RETURN_IF_ERROR(project(s.xn, Ly.gate_up, s.gu, T, 2 * Id_, H_, st));
      ZEST_RETURN_IF_ERROR(silu_mul(s.gu, s.h, T, Id_, st));
      ZEST_RETURN_IF_ERROR(project(s.h, Ly.down, s.o, T, H_, Id_, st));
      if (comm_) ZEST_RETURN_IF_ERROR(all_reduce(s.o, static_cast<int64_t>(T) * H_, true));  // the ranks' columns
      ZEST_RETURN_IF_ERROR(add_rmsnorm(s.x, s.o, next, s.xn, T, H_, eps_, st));
    }
    if (ds) {
      ZEST_RETURN_IF_ERROR(scatter_rows(mm_src(l + 1), d_mm, s.x, static_cast<int>(M), H_, true, st));
      ZEST_RETURN_IF_ERROR(rmsnorm(s.x, next, s.xn, T, H_, eps_, st));
    }
  }
  // The lm_head's rows: decode-only steps sample every row in order (one per sequence, padding rows included), so
  // the lm_head reads x / xn itself; other steps gather their sampled rows first.
  const bool rows_in_order = decode_only && R == T;
  auto head_rows = [&](bf16* src) -> Result<const bf16*> {
    if (rows_in_order) return static_cast<const bf16*>(src);
    ZEST_RETURN_IF_ERROR(gather_rows(src, d_rows, s.xr, R, H_, st));
    return static_cast<const bf16*>(s.xr);
  };
  if (x_only && R == 1 && gemm_kv_norm_ok(1, V_, H_)) {  // the final norm folded into the lm_head's CTAs
    ZEST_ASSIGN_OR_RETURN(const bf16* in, head_rows(s.x));
    KvPrefetch head;
    head.norm_w = final_norm_;
    head.norm_eps = eps_;
    ZEST_RETURN_IF_ERROR(gemm_kv_prefetch(in, lm_head_, s.logits, R, V_, H_, head, st));
  } else {
    if (x_only) ZEST_RETURN_IF_ERROR(rmsnorm(s.x, final_norm_, s.xn, T, H_, eps_, st));
    ZEST_ASSIGN_OR_RETURN(const bf16* in, head_rows(s.xn));
    ZEST_RETURN_IF_ERROR(gemm(in, lm_head_, s.logits, R, V_, H_, st));
  }
  if (sample_rows_in && row_extras) {
    // The log-probability summaries of the raw rows, then the edits (saving the logits they replace) and the token
    // masks, then the sampling summaries of the edited rows; the extras' outputs come back in the step.
    const size_t C = kSampleMaxCandidates;
    char* const xhb = s.extras_host.get();
    char* const xdb = s.extras.get();
    auto host_of = [&](const void* d) { return xhb + (static_cast<const char*>(d) - xdb); };
    ZEST_CU(cudaMemcpyAsync(xdb, xhb, extras_in, cudaMemcpyHostToDevice, st), "logit edit copy");
    if (lp0 >= 0) {
      ZEST_RETURN_IF_ERROR(sample_rows(s.logits, R, V_, xd.lp_specs, xd.lp_out, xd.lp_ids, xd.lp_logits, st));
      ZEST_CU(cudaMemcpyAsync(host_of(xd.lp_out), xd.lp_out, static_cast<size_t>(R) * sizeof(SampleRowOut),
                              cudaMemcpyDeviceToHost, st),
              "logprob summary copy");
      const size_t off = static_cast<size_t>(lp0) * C, n = static_cast<size_t>(lp1 - lp0 + 1) * C;
      ZEST_CU(cudaMemcpyAsync(host_of(xd.lp_ids + off), xd.lp_ids + off, n * 4, cudaMemcpyDeviceToHost, st),
              "logprob candidates copy");
      ZEST_CU(cudaMemcpyAsync(host_of(xd.lp_logits + off), xd.lp_logits + off, n * 4, cudaMemcpyDeviceToHost, st),
              "logprob candidates copy");
    }
    if (n_edits > 0) {
      ZEST_RETURN_IF_ERROR(apply_logit_edits(s.logits, R, V_, xd.edit_begin, xd.edits, xd.edit_raw, st));
      ZEST_CU(cudaMemcpyAsync(host_of(xd.edit_raw), xd.edit_raw, static_cast<size_t>(n_edits) * 4,
                              cudaMemcpyDeviceToHost, st),
              "edited logits copy");
    }
    if (n_masks > 0)
      ZEST_RETURN_IF_ERROR(apply_token_masks(s.logits, R, V_, static_cast<int>(W), xd.mask_row, xd.masks, st));
  }
  if (sample_rows_in) {
    // Per-row summaries on the device; only they come back in the step (candidates and whole rows after it).
    ZEST_RETURN_IF_ERROR(sample_rows(s.logits, R, V_, di.specs, s.samp_out, s.cand_ids, s.cand_logits, st));
    ZEST_CU(cudaMemcpyAsync(s.samp_host.get(), s.samp_out, static_cast<size_t>(R) * sizeof(SampleRowOut),
                            cudaMemcpyDeviceToHost, st),
            "sampling summary copy");
  } else {
    ZEST_CU(cudaMemcpyAsync(s.logits_host.get(), s.logits, static_cast<size_t>(R) * V_ * 2, cudaMemcpyDeviceToHost, st),
            "logits copy");
  }
  return Status::ok();
  };  // enqueue

  if (!graphable) {
    ZEST_RETURN_IF_ERROR(enqueue());
  } else {
    std::vector<uintptr_t> fp = graph_fingerprint(*kv);
    if (fp != s.graph_fingerprint) {
      ZEST_CU(cudaStreamSynchronize(st), "sync before dropping graphs");
      clear_graphs();
      s.graph_fingerprint = std::move(fp);
    }
    const auto key = std::make_tuple(S, use_decode_bound_key(ctx_bucket, D_), sere_dev ? gspec->id : uint64_t{0},
                                     sample_rows_in != nullptr);
    auto it = s.graphs.find(key);
    if (it == s.graphs.end()) {
      // First step of this key: eager (cuBLASLt plans, kernel attributes and workspaces are set up outside a capture).
      if (s.graphs.size() >= kMaxGraphKeys) clear_graphs();
      s.graphs.emplace(key, Step::GraphEntry{});
      ZEST_RETURN_IF_ERROR(enqueue());
    } else {
      if (!it->second.exec) {
        // Room for one more: the least recently used graph goes (no graph is in flight between steps).
        if (s.live_graphs >= opts_.graph_cap) {
          auto lru = s.graphs.end();
          for (auto g = s.graphs.begin(); g != s.graphs.end(); ++g)
            if (g->second.exec && (lru == s.graphs.end() || g->second.last_use < lru->second.last_use)) lru = g;
          if (lru != s.graphs.end()) {
            cudaGraphExecDestroy(lru->second.exec);
            lru->second.exec = nullptr;
            --s.live_graphs;
          }
        }
        cudaGraph_t graph = nullptr;
        ZEST_CU(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "begin graph capture");
        const Status cs = enqueue();
        const cudaError_t end = cudaStreamEndCapture(st, &graph);
        cudaGraphExec_t exec = nullptr;
        cudaError_t inst = cudaErrorUnknown;
        if (cs.is_ok() && end == cudaSuccess) inst = cudaGraphInstantiate(&exec, graph, 0);
        if (graph) cudaGraphDestroy(graph);
        if (!cs.is_ok() || end != cudaSuccess || inst != cudaSuccess) {
          // Not capturable: eager steps from now on (reported once).
          cudaGetLastError();
          std::fprintf(stderr, "zest: CUDA graph capture of a decode step failed (%s); decode steps run eagerly\n",
                       !cs.is_ok() ? cs.to_string().c_str()
                                   : cudaGetErrorString(end != cudaSuccess ? end : inst));
          s.graphs_broken = true;
          ZEST_RETURN_IF_ERROR(enqueue());
        } else {
          it->second.exec = exec;
          ++s.live_graphs;
          const int64_t n = g_graph_captures.fetch_add(1, std::memory_order_relaxed) + 1;
          if (opts_.graph_log)
            std::fprintf(stderr, "zest: decode graph captured: %d rows (%d sequences), context bucket %d, %d live, %lld captured\n",
                         S, S_in, ctx_bucket, s.live_graphs, static_cast<long long>(n));
        }
      }
      if (it->second.exec) {
        it->second.last_use = ++s.graph_clock;
        // A rank of a split decoder launches a replay (its collectives) only when every rank launches its own.
        if (comm_) ZEST_RETURN_IF_ERROR(comm_->launch_gate());
        ZEST_CU(cudaGraphLaunch(it->second.exec, st), "graph launch");
        g_graph_launches.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  ZEST_CU(cudaStreamSynchronize(st), "forward step");

  if (!sample_rows_in) {
    const size_t nl = static_cast<size_t>(R_out) * V_;
    Tensor out = Tensor::empty({R_out, V_});
    const uint16_t* bits = reinterpret_cast<const uint16_t*>(s.logits_host.get());
    float* dst = out.data<float>();
    for (size_t i = 0; i < nl; ++i) dst[i] = bf16_to_f32(bits[i]);
    *logits_out = std::move(out);
    return Status::ok();
  }
  // Candidates of the rows that have them (one range of rows), then whole rows where the candidates cannot decide.
  const std::vector<model::SampleRow>& plans = *sample_rows_in;
  std::vector<model::SampleResult>& res = *sampled;
  res.assign(R_out, model::SampleResult{});
  std::vector<SampleRowOut> outs(R_out);
  std::memcpy(outs.data(), s.samp_host.get(), static_cast<size_t>(R_out) * sizeof(SampleRowOut));
  int c0 = -1, c1 = -1;
  for (int i = 0; i < R_out; ++i)
    if (plans[i].mode == model::SampleMode::kCandidates) {
      if (c0 < 0) c0 = i;
      c1 = i;
    }
  const size_t C = kSampleMaxCandidates;
  const int32_t* h_ids = reinterpret_cast<const int32_t*>(s.samp_host.get() + (reinterpret_cast<char*>(s.cand_ids) - s.samp.get()));
  const float* h_cl = reinterpret_cast<const float*>(s.samp_host.get() + (reinterpret_cast<char*>(s.cand_logits) - s.samp.get()));
  if (c0 >= 0) {
    const size_t off = static_cast<size_t>(c0) * C, n = static_cast<size_t>(c1 - c0 + 1) * C;
    ZEST_CU(cudaMemcpyAsync(const_cast<int32_t*>(h_ids) + off, s.cand_ids + off, n * 4, cudaMemcpyDeviceToHost, st),
            "candidates copy");
    ZEST_CU(cudaMemcpyAsync(const_cast<float*>(h_cl) + off, s.cand_logits + off, n * 4, cudaMemcpyDeviceToHost, st),
            "candidates copy");
    ZEST_CU(cudaStreamSynchronize(st), "candidates copy");
  }
  std::vector<int> full;
  for (int i = 0; i < R_out; ++i) {
    const model::SampleRow& row = plans[i];
    model::SampleResult& r = res[i];
    const SampleRowOut& o = outs[i];
    switch (row.mode) {
      case model::SampleMode::kGreedy:
      case model::SampleMode::kTemperature:
        r.token = o.token;
        r.max = o.max;
        r.z = o.z;
        r.token_logit = o.token_logit;
        break;
      case model::SampleMode::kCandidates: {
        if (o.count != row.candidates) return internal_error("sampling: the device returned a wrong candidate count");
        r.max = o.max;
        r.z = o.z;
        r.ids.assign(h_ids + i * C, h_ids + i * C + o.count);
        r.logits.assign(h_cl + i * C, h_cl + i * C + o.count);
        if (!model::candidates_decide(row, r, V_)) full.push_back(i);
        break;
      }
      case model::SampleMode::kFull: full.push_back(i); break;
      default: break;
    }
  }
  if (row_extras) {
    for (int i = 0; i < R_out; ++i) {
      const model::SampleRow& row = plans[i];
      model::SampleResult& r = res[i];
      if (!row.edits.empty()) r.edit_raw.assign(xh.edit_raw + xh.edit_begin[i], xh.edit_raw + xh.edit_begin[i + 1]);
      if (row.logprobs < 0) continue;
      const SampleRowOut& o = xh.lp_out[i];
      if (o.count < 1 || !(o.z > 0)) return internal_error("sampling: the device returned a wrong logprob summary");
      r.lse = static_cast<double>(o.max) + std::log(o.z);
      const int k = std::min(row.logprobs, o.count);
      r.top_ids.assign(xh.lp_ids + static_cast<size_t>(i) * C, xh.lp_ids + static_cast<size_t>(i) * C + k);
      r.top_logits.assign(xh.lp_logits + static_cast<size_t>(i) * C, xh.lp_logits + static_cast<size_t>(i) * C + k);
    }
  }
  if (!full.empty()) {
    for (int i : full)
      ZEST_CU(cudaMemcpyAsync(s.logits_host.get() + static_cast<size_t>(i) * V_ * 2, s.logits + static_cast<size_t>(i) * V_,
                              static_cast<size_t>(V_) * 2, cudaMemcpyDeviceToHost, st),
              "logits row copy");
    ZEST_CU(cudaStreamSynchronize(st), "logits row copy");
    for (int i : full) {
      const uint16_t* bits = reinterpret_cast<const uint16_t*>(s.logits_host.get()) + static_cast<size_t>(i) * V_;
      model::SampleResult& r = res[i];
      r.ids.clear();
      r.full = true;
      r.logits.resize(V_);
      for (int v = 0; v < V_; ++v) r.logits[v] = bf16_to_f32(bits[v]);
    }
  }
  return Status::ok();
}

}  // namespace

Status set_decode_options(const model::TextDecoder& dec, const model::DeviceDecodeOptions& opts) {
  const auto* d = dynamic_cast<const CudaTextDecoder*>(&dec);
  if (d == nullptr) return invalid_argument("set_decode_options: not a CUDA text decoder");
  if (opts.graph_cap < 1) return invalid_argument("the CUDA graph cap must be at least 1");
  d->set_options(opts);
  return Status::ok();
}

int64_t decode_graph_launches() { return g_graph_launches.load(std::memory_order_relaxed); }
int64_t decode_graph_captures() { return g_graph_captures.load(std::memory_order_relaxed); }

Status decode_kv_cache_copy(const model::PagedKVCache& cache, std::vector<uint16_t>* out) {
  const auto* kv = dynamic_cast<const CudaKvStorage*>(cache.storage());
  if (!kv) return invalid_argument("decode_kv_cache_copy: not a KV cache of the CUDA decoder");
  out->assign(kv->mem.size() / sizeof(uint16_t), 0);
  return cuda_status(cudaMemcpy(out->data(), kv->mem.get(), kv->mem.size(), cudaMemcpyDeviceToHost), "KV cache copy");
}

}  // namespace zest::cuda

namespace zest::model {

Result<std::unique_ptr<TextDecoder>> create_cuda_decoder(const DecoderWeights& weights,
                                                         const DeviceDecodeOptions& opts) {
  if (!kernels::cuda_available())
    return unsupported("no usable CUDA GPU found (check the driver and CUDA_VISIBLE_DEVICES); use --device cpu");
  auto d = std::make_unique<cuda::CudaTextDecoder>();
  ZEST_RETURN_IF_ERROR(d->init(weights, opts));
  return std::unique_ptr<TextDecoder>(std::move(d));
}

Result<std::string> cuda_ipc_export(const KvSnapshot& snap) {
  using namespace cuda;
  if (snap.device_data == nullptr) return invalid_argument("CUDA IPC needs a KV snapshot in device memory");
  cudaIpcMemHandle_t h;
  ZEST_CU(cudaIpcGetMemHandle(&h, const_cast<void*>(snap.device_data)), "cudaIpcGetMemHandle of the KV snapshot");
  static const char* k = "0123456789abcdef";
  std::string hex;
  for (size_t i = 0; i < sizeof(h.reserved); ++i) {
    const auto b = static_cast<unsigned char>(h.reserved[i]);
    hex += k[b >> 4];
    hex += k[b & 15];
  }
  return hex;
}

Result<KvSnapshot> cuda_ipc_import(const std::string& hex, const KvSnapshot& geometry) {
  using namespace cuda;
  cudaIpcMemHandle_t h;
  if (hex.size() != 2 * sizeof(h.reserved)) return invalid_argument("a CUDA IPC handle is " +
                                                                    std::to_string(2 * sizeof(h.reserved)) + " hex digits");
  for (size_t i = 0; i < sizeof(h.reserved); ++i) {
    int v = 0;
    for (int d = 0; d < 2; ++d) {
      const char c = hex[2 * i + d];
      const int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (x < 0) return invalid_argument("a CUDA IPC handle must be lowercase hex");
      v = v * 16 + x;
    }
    h.reserved[i] = static_cast<char>(v);
  }
  void* peer = nullptr;
  ZEST_CU(cudaIpcOpenMemHandle(&peer, h, cudaIpcMemLazyEnablePeerAccess),
          "opening the prefill instance's K/V (CUDA IPC: both instances must run on this GPU)");
  KvSnapshot out = geometry;
  out.bytes.reset();
  auto buf = std::make_shared<DeviceMemory>();
  const Status st = [&]() -> Status {  // the handle is closed whatever happens here
    ZEST_RETURN_IF_ERROR(buf->allocate(static_cast<size_t>(geometry.expected_bytes()), "the imported KV snapshot"));
    return cuda_status(cudaMemcpy(buf->get(), peer, static_cast<size_t>(geometry.expected_bytes()),
                                  cudaMemcpyDeviceToDevice),
                       "copying the prefill instance's K/V");
  }();
  const cudaError_t closed = cudaIpcCloseMemHandle(peer);
  ZEST_RETURN_IF_ERROR(st);
  ZEST_CU(closed, "cudaIpcCloseMemHandle");
  out.device_data = buf->get();
  out.device = std::move(buf);
  return out;
}

}  // namespace zest::model
