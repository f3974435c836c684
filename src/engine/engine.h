// The engine: continuous batching over a paged KV cache. Each step() asks the scheduler for a
// StepPlan (decode tokens of running requests first, then prefill chunks under a token budget),
// runs it on the model and samples. Invariants are written down in src/engine/README.md.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/model_bundle.h"
#include "engine/request.h"
#include "model/kv_cache.h"
#include "text/tokenizer.h"

namespace zest::engine {

struct EngineOptions {
  int64_t block_size = 16;
  int64_t kv_blocks = 0;            // 0 = enough for max_num_seqs sequences of max_context tokens
  int64_t max_num_seqs = 32;        // running sequences at once
  int64_t max_batched_tokens = 2048;  // tokens per step (decode + prefill chunks)
  int64_t max_context = 0;          // 0 = min(max_position_embeddings, 32768)
  // Automatic prefix caching: full KV blocks are registered under a chained hash of their tokens (ids, M-RoPE
  // positions, the keys of their visual rows) and shared by later requests with the same prefix.
  bool prefix_caching = true;
  // Sampling summaries from the decoder's forward_sample (computed on the device by a device backend); false: host
  // logits summarised on the host whatever the backend (the form before device sampling, for A/B measurements).
  bool device_sampling = true;
  // Request::export_kv leaves the prompt's K/V in device memory where the backend has one (for a transfer that
  // stays on the GPU: CUDA IPC); else it is copied to the host.
  bool kv_export_on_device = false;
  // Builds the MoE hooks for one step (null = none); `decode_only` says the step has no prefill.
  std::function<const model::MoeHooks*(bool decode_only)> moe_hooks;
};

// One chunk of the plan: `length` tokens of request `seq` starting at token `start`.
struct ScheduledChunk {
  int64_t seq = 0;
  int64_t start = 0;
  int64_t length = 0;
  bool sample = false;  // the chunk reaches the end of the known tokens: sample the next one
};

// What one step runs; plain data handed from the scheduler to the runner.
struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  std::vector<int64_t> preempted;  // requests sent back to waiting (their KV blocks freed)
  bool decode_only() const;
  int64_t num_tokens() const;
};

struct EngineStats {
  int64_t running = 0, waiting = 0, kv_blocks_used = 0, kv_blocks_total = 0;
  int64_t steps = 0, preemptions = 0;
  // Prefix cache: tokens looked up at admission, tokens found (their prefill skipped), blocks registered now.
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0, prefix_cache_blocks = 0;
  // Admissions put off by a step because a running sequence was computing the prefix block the request needs.
  int64_t prefix_waits = 0;
  int64_t tokens_computed = 0;  // tokens run through the decoder (prefill chunks and decode tokens)
  // Prefill/decode disaggregation: prompts whose K/V were copied out (Request::export_kv) and written in (Request::kv,
  // counted again after a preemption).
  int64_t kv_exports = 0, kv_imports = 0;
  // Decode-only steps (every chunk one sampled token), timed on the host: their count, the wall time of each step
  // (schedule, forward, token handling), of its forward call (input staging, launch, the device's work, the wait),
  // and, for a decode step that directly follows another, the interval between their starts (what a running
  // sequence sees as its time per token; minus the device's step time, it is the device's idle time per step).
  int64_t decode_steps = 0, decode_intervals = 0;
  double decode_step_s = 0, decode_forward_s = 0, decode_interval_s = 0;
  std::string decoder_error;  // non-empty: the decoder can run no more steps (TextDecoder::health), and why
};

class Engine {
 public:
  Engine(std::shared_ptr<ModelBundle> model, EngineOptions opts);
  ~Engine();

  // Queues a request; kOutOfRange when prompt + max_tokens cannot fit the context.
  Status add(Request req);
  // Ends a request (client gone); its blocks are freed at once, on_update gets kAbort.
  void abort(int64_t id);
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  // Plans and runs one step; calls on_update of the requests that advanced.
  Status step();
  EngineStats stats() const;
  // The KV allocator's invariants against the block tables of every live request (tests).
  Status check_blocks() const;
  int64_t max_context() const { return max_context_; }
  const ModelBundle& model() const { return *model_; }

 private:
  struct Seq;
  StepPlan schedule();
  Status run(const StepPlan& plan);
  // Frees the blocks and reports the end with the final text (the part not yet sent is the delta).
  void finish(Seq& s, FinishReason r, std::string final_text, const std::string& error = {});
  void preempt(Seq& s);
  // Appends a token sampled for `s` (here, or by a prefill instance) and applies what follows from it: the sampler's
  // state, log-probabilities, stop ids and strings, max_tokens, the text delta sent to on_update.
  void take_token(Seq& s, int32_t tok, TokenLogprob* lp);
  // Prefix caching: hashes of the sequence's full blocks of known tokens, and the registration of its full
  // computed blocks.
  void extend_hashes(Seq& s) const;
  void register_blocks(Seq& s);
  // Whether a running sequence will compute full block `index` with prefix hash `hash` (not registered yet).
  bool computing_block(uint64_t hash, int64_t index) const;
  // Prompt log-probabilities (SamplingParams::prompt_logprobs): the chunk bound and the rows' summaries.
  static constexpr int64_t kPromptLogprobChunk = 256;
  int64_t chunk_limit(const Seq& s) const;
  void record_prompt_logprobs(Seq& s, int64_t start, int64_t n, const float* logits, int64_t V);
  Seq* find(int64_t id);

  std::shared_ptr<ModelBundle> model_;
  std::string decoder_error_;  // the decoder's health after a failed step (EngineStats::decoder_error)
  EngineOptions opts_;
  int64_t max_context_ = 0;
  Status init_status_;  // why the engine cannot run (the KV cache could not be allocated), else ok
  model::PagedKVCache cache_;
  std::list<std::unique_ptr<Seq>> running_;
  std::deque<std::unique_ptr<Seq>> waiting_;
  EngineStats stats_;
  double last_decode_start_ms_ = -1;  // start of the previous step when it was decode-only, else -1
  double forward_ms_ = 0;             // the current step's forward call
  uint64_t hash_seed_ = 0;            // random per engine: block hashes cannot be predicted from outside
};

// Runs one request to completion on a fresh engine (CLI use). Returns its output.
Result<RequestOutput> generate_one(std::shared_ptr<ModelBundle> model, Request req, EngineOptions opts = {});

}  // namespace zest::engine
