#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <climits>
#include <cstring>
#include <random>
#include <string>

#include "core/timer.h"

namespace zest::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "none";
}

bool StepPlan::decode_only() const {
  for (const auto& c : chunks)
    if (c.length != 1 || !c.sample) return false;
  return !chunks.empty();
}

int64_t StepPlan::num_tokens() const {
  int64_t n = 0;
  for (const auto& c : chunks) n += c.length;
  return n;
}

struct Engine::Seq {
  Request req;
  Sampler sampler;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int64_t n_prompt = 0;
  int64_t computed = 0;         // tokens whose K/V are in the cache
  std::vector<int32_t> blocks;  // block table
  std::vector<uint64_t> hashes; // prefix hash of each full block of known tokens (chained)
  bool hashable = true;         // false from the first block that cannot be keyed (visual rows without keys)
  int64_t registered = 0;       // leading blocks of the table registered in (or taken from) the prefix cache
  bool admitted = false;        // scheduled at least once
  RequestOutput out;
  text::IncrementalDecoder detok;
  std::string full_text;        // all decoded text (before stop-string cutting)
  size_t emitted = 0;           // bytes of full_text already sent
  bool done = false;

  Seq(Request r, const text::Tokenizer& tok, const std::vector<int32_t>& eos)
      : req(std::move(r)), sampler(req.sampling), detok(tok, /*skip_special=*/true) {
    tokens = req.prompt.ids;
    n_prompt = static_cast<int64_t>(tokens.size());
    hashable = req.kv == nullptr;  // imported K/V: no token hash describes what made it
    if (req.sampling.prompt_logprobs >= 0) out.prompt_logprobs.resize(static_cast<size_t>(n_prompt - 1));
    sampler.set_context(tokens, eos);
  }
  int64_t remaining() const { return static_cast<int64_t>(tokens.size()) - computed; }
  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - n_prompt; }
  // M-RoPE position of token i on axis a.
  int32_t position(int64_t a, int64_t i) const {
    if (i < n_prompt) return req.prompt.positions[a * n_prompt + i];
    return static_cast<int32_t>(i + req.prompt.rope_delta);
  }
};

Engine::Engine(std::shared_ptr<ModelBundle> model, EngineOptions opts) : model_(std::move(model)), opts_(opts) {
  const auto& tc = model_->config.text;
  max_context_ = opts_.max_context > 0 ? opts_.max_context
                                       : std::min<int64_t>(tc.max_position_embeddings > 0 ? tc.max_position_embeddings : 32768, 32768);
  const int64_t per_seq = (max_context_ + opts_.block_size - 1) / opts_.block_size;
  const int64_t blocks = opts_.kv_blocks > 0 ? opts_.kv_blocks : per_seq * 4;
  auto cache = model_->decoder().allocate_cache(blocks, opts_.block_size);
  if (cache.ok()) cache_ = std::move(cache).value();
  else init_status_ = cache.status().with_context("KV cache of " + std::to_string(blocks) + " blocks");
  stats_.kv_blocks_total = blocks;
  std::random_device rd;
  hash_seed_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

namespace {

uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Folds one word into a running hash.
uint64_t fold(uint64_t h, uint64_t v) { return mix64(h ^ mix64(v + 0x9e3779b97f4a7c15ULL)); }

}  // namespace

void Engine::extend_hashes(Seq& s) const {
  const int64_t bs = cache_.block_size();
  const Prompt& p = s.req.prompt;
  const bool keyed = p.mm_keys.size() == p.mm_index.size();
  while (s.hashable && static_cast<int64_t>(s.hashes.size() + 1) * bs <= static_cast<int64_t>(s.tokens.size())) {
    const int64_t k = static_cast<int64_t>(s.hashes.size());
    // Block 0 chains from the engine's seed; every block from its parent's hash.
    uint64_t h = k == 0 ? fold(hash_seed_, static_cast<uint64_t>(bs)) : s.hashes.back();
    auto mm = std::lower_bound(p.mm_index.begin(), p.mm_index.end(), k * bs);
    for (int64_t i = k * bs; i < (k + 1) * bs; ++i) {
      h = fold(h, static_cast<uint32_t>(s.tokens[i]));
      for (int a = 0; a < 3; ++a) h = fold(h, static_cast<uint32_t>(s.position(a, i)));
      if (mm != p.mm_index.end() && *mm == i) {
        if (!keyed) {
          s.hashable = false;
          return;
        }
        h = fold(h, p.mm_keys[mm - p.mm_index.begin()]);
        ++mm;
      }
    }
    s.hashes.push_back(h);
  }
}

void Engine::register_blocks(Seq& s) {
  if (!opts_.prefix_caching) return;
  extend_hashes(s);
  const int64_t full = std::min<int64_t>(s.computed / cache_.block_size(), static_cast<int64_t>(s.hashes.size()));
  for (; s.registered < full; ++s.registered) cache_.register_block(s.blocks[s.registered], s.hashes[s.registered]);
}

Engine::~Engine() = default;

Status Engine::add(Request req) {
  ZEST_RETURN_IF_ERROR(init_status_);
  const int64_t n = static_cast<int64_t>(req.prompt.ids.size());
  if (n == 0) return invalid_argument("the prompt is empty");
  if (n >= max_context_)
    return out_of_range("the prompt has " + std::to_string(n) + " tokens; this model's context limit is " +
                        std::to_string(max_context_) + " tokens: shorten the prompt or its images");
  if (cache_.blocks_for(n + 1) > cache_.num_blocks())
    return out_of_range("the prompt needs more KV-cache blocks than the engine has");
  if (req.kv == nullptr && static_cast<int64_t>(req.prompt.positions.size()) != 3 * n)
    return invalid_argument("prompt positions must have 3 rows of the prompt length");
  if (req.sampling.max_tokens <= 0) return invalid_argument("max_tokens must be positive");
  const int64_t V = model_->decoder().config().vocab_size;
  if (req.kv != nullptr) {
    if (req.kv->tokens != n)
      return invalid_argument("the imported K/V covers " + std::to_string(req.kv->tokens) + " tokens of a " +
                              std::to_string(n) + "-token prompt");
    if (req.first_token < 0 || req.first_token >= V)
      return invalid_argument("the imported request's first token " + std::to_string(req.first_token) +
                              " is not in the vocabulary");
    if (req.sampling.prompt_logprobs >= 0) return invalid_argument("prompt_logprobs need the prompt run here");
    if (req.sampling.logprobs && (!req.first_logprob || req.first_logprob->token != req.first_token))
      return invalid_argument("the imported request asks for logprobs but has none for its first token");
  }
  auto s = std::make_unique<Seq>(std::move(req), model_->tokenizer, model_->eos_ids());
  s->out.arrival_ms = now_ms();
  if (s->req.kv != nullptr) {
    // The token sampled by the prefill instance goes through the same checks as one sampled here (stop ids and
    // strings, max_tokens, the sampler's state) before the request waits for its blocks; its row's plan draws the
    // uniform number the prefill instance drew for it, so a seeded request samples the same tokens as on one instance.
    (void)s->sampler.plan(V);
    std::optional<TokenLogprob> lp = s->req.first_logprob;
    take_token(*s, s->req.first_token, s->req.sampling.logprobs ? &*lp : nullptr);
    if (s->done) return Status::ok();
  }
  waiting_.push_back(std::move(s));
  return Status::ok();
}

Engine::Seq* Engine::find(int64_t id) {
  for (auto& s : running_)
    if (s->req.id == id) return s.get();
  for (auto& s : waiting_)
    if (s->req.id == id) return s.get();
  return nullptr;
}

void Engine::abort(int64_t id) {
  Seq* s = find(id);
  if (!s || s->done) return;
  finish(*s, FinishReason::kAbort, s->out.text);
  running_.remove_if([](const std::unique_ptr<Seq>& p) { return p->done; });
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), [](const std::unique_ptr<Seq>& p) { return p->done; }),
                 waiting_.end());
}

void Engine::finish(Seq& s, FinishReason r, std::string final_text, const std::string& error) {
  if (s.req.export_kv && (r == FinishReason::kStop || r == FinishReason::kLength) && s.computed >= s.n_prompt) {
    auto snap = cache_.snapshot(s.blocks, s.n_prompt, opts_.kv_export_on_device);
    if (snap.ok()) {
      ++stats_.kv_exports;
      s.out.kv = std::make_shared<const model::KvSnapshot>(std::move(snap).value());
    } else {
      r = FinishReason::kError;
      s.out.error = snap.status().message();
    }
  }
  cache_.release(s.blocks);
  s.done = true;
  s.out.finish = r;
  if (s.out.error.empty()) s.out.error = error;
  s.out.finish_ms = now_ms();
  std::string delta;
  if (final_text.size() > s.emitted) delta = final_text.substr(s.emitted);
  s.out.text = std::move(final_text);
  s.emitted = s.out.text.size();
  if (s.req.on_update) s.req.on_update(delta, s.out, true);
}

void Engine::preempt(Seq& s) {
  // Recompute policy: drop the KV blocks; the sequence re-prefills prompt + generated tokens later.
  cache_.release(s.blocks);
  s.computed = 0;
  s.registered = 0;
  ++stats_.preemptions;
}

// A prompt whose log-probabilities are asked for runs in chunks of at most kPromptLogprobChunk tokens: every token's
// logits row comes back to the host (152k floats each for Qwen3).
int64_t Engine::chunk_limit(const Seq& s) const {
  return s.req.sampling.prompt_logprobs >= 0 && s.computed < s.n_prompt ? kPromptLogprobChunk : INT64_MAX;
}

bool Engine::computing_block(uint64_t hash, int64_t index) const {
  for (const auto& r : running_)
    if (r->registered <= index && static_cast<int64_t>(r->hashes.size()) > index && r->hashes[index] == hash)
      return true;
  return false;
}

// Rows [0, n) of `logits` are positions start .. start + n - 1 of the sequence; the row at position p gives the
// log-probability of prompt token p + 1 (log-softmax of the raw logits) and the most likely alternatives.
void Engine::record_prompt_logprobs(Seq& s, int64_t start, int64_t n, const float* logits, int64_t V) {
  const int32_t k = s.req.sampling.prompt_logprobs;
  for (int64_t i = 0; i < n && start + i + 1 < s.n_prompt; ++i) {
    const float* row = logits + i * V;
    model::SampleResult sum;  // the sampler's log-probability summary: log-sum-exp and the top k raw logits
    model::logprob_summary(row, V, k, sum);
    TokenLogprob& out = s.out.prompt_logprobs[static_cast<size_t>(start + i)];
    out.token = s.tokens[static_cast<size_t>(start + i + 1)];
    out.logprob = static_cast<float>(row[out.token] - sum.lse);
    out.rank = 1;
    for (int64_t v = 0; v < V; ++v) out.rank += row[v] > row[out.token];
    out.top.clear();
    for (size_t j = 0; j < sum.top_ids.size(); ++j)
      out.top.emplace_back(sum.top_ids[j], static_cast<float>(sum.top_logits[j] - sum.lse));
  }
}

StepPlan Engine::schedule() {
  StepPlan plan;
  int64_t budget = opts_.max_batched_tokens;
  // Running sequences first, oldest first; a sequence that cannot get blocks preempts the newest ones.
  for (auto it = running_.begin(); it != running_.end() && budget > 0; ++it) {
    Seq& s = **it;
    const int64_t len = std::min({s.remaining(), budget, chunk_limit(s)});
    while (!cache_.reserve(s.blocks, s.computed + len).is_ok()) {
      auto victim = std::prev(running_.end());
      if (victim->get() == &s) break;
      preempt(**victim);
      plan.preempted.push_back((*victim)->req.id);
      waiting_.push_front(std::move(*victim));
      running_.erase(victim);
    }
    if (static_cast<int64_t>(s.blocks.size()) < cache_.blocks_for(s.computed + len)) continue;
    plan.chunks.push_back({s.req.id, s.computed, len, s.computed + len == static_cast<int64_t>(s.tokens.size())});
    budget -= len;
  }
  // Admit waiting requests in arrival order while there is room; one that waits for a prefix block a running
  // request is computing keeps its place and lets the ones behind it in (as vLLM skips requests not ready yet).
  for (size_t w = 0;
       w < waiting_.size() && budget > 0 && static_cast<int64_t>(running_.size()) < opts_.max_num_seqs;) {
    Seq& s = *waiting_[w];
    // An imported prompt's K/V is written into its blocks at admission (and again after a preemption).
    const bool import = s.req.kv != nullptr && s.computed == 0;
    if (import) s.computed = s.n_prompt;
    if (!import && opts_.prefix_caching && s.blocks.empty() && s.computed == 0 && s.req.sampling.prompt_logprobs < 0) {
      // Take the cached full blocks of the longest known prefix; the last token is always computed (its logits
      // are sampled), so a prompt made only of cached blocks recomputes its last block.
      extend_hashes(s);
      const int64_t bs = cache_.block_size();
      const int64_t usable =
          std::min<int64_t>(static_cast<int64_t>(s.hashes.size()), (static_cast<int64_t>(s.tokens.size()) - 1) / bs);
      const int64_t hit = cache_.match_prefix(s.hashes.data(), usable, s.blocks);
      s.computed = hit * bs;
      s.registered = hit;
      // A running sequence is computing the next block this one needs (the n choices of one request, or requests
      // with one long system prompt arriving together): admit this one once that block is cached, instead of
      // computing the same block twice. The running sequence is scheduled first in every step, so it gets there.
      if (hit < usable && computing_block(s.hashes[hit], hit)) {
        cache_.release(s.blocks);
        s.computed = 0;
        s.registered = 0;
        ++stats_.prefix_waits;
        ++w;
        continue;
      }
    }
    const int64_t len = std::min({s.remaining(), budget, chunk_limit(s)});
    if (!cache_.reserve(s.blocks, s.computed + len).is_ok()) {
      cache_.release(s.blocks);  // the cached blocks it took go back to the cache
      s.computed = 0;
      s.registered = 0;
      break;
    }
    if (import) {
      Status st = cache_.restore(*s.req.kv, s.blocks);
      if (!st.is_ok()) {
        finish(s, FinishReason::kError, s.full_text + s.detok.flush(), st.message());
        waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(w));
        continue;
      }
      ++stats_.kv_imports;
    }
    if (opts_.prefix_caching && !import) {
      stats_.prefix_cache_queries += static_cast<int64_t>(s.tokens.size());
      stats_.prefix_cache_hits += s.computed;
    }
    if (!s.admitted) s.out.cached_tokens = import ? 0 : std::min(s.computed, s.n_prompt);
    s.admitted = true;
    if (s.out.first_scheduled_ms == 0) s.out.first_scheduled_ms = now_ms();
    plan.chunks.push_back({s.req.id, s.computed, len, s.computed + len == static_cast<int64_t>(s.tokens.size())});
    budget -= len;
    running_.push_back(std::move(waiting_[w]));
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(w));
  }
  return plan;
}

namespace {

// Rows [r0, r0 + n) of a prompt whose visual rows live in device memory (the CUDA vision path), as one
// segment of the decoder's device input.
model::ForwardBatch::DeviceRows device_rows(const Prompt& p, int64_t r0, int64_t n) {
  auto at = [&](const Tensor& x) {
    return static_cast<const char*>(x.raw()) + static_cast<size_t>(r0 * x.dim(1)) * dtype_size(x.dtype());
  };
  model::ForwardBatch::DeviceRows seg;
  seg.embeds = at(p.mm_embeds);
  for (const Tensor& d : p.deepstack) seg.deepstack.push_back(at(d));
  seg.rows = n;
  return seg;
}

}  // namespace

Status Engine::run(const StepPlan& plan) {
  model::ForwardBatch b;
  std::vector<Seq*> seqs;
  const int64_t T = plan.num_tokens();
  const int64_t H = model_->config.text.hidden_size;
  b.tokens.reserve(T);
  b.positions.assign(3 * T, 0);
  std::vector<std::pair<Seq*, int64_t>> mm_rows;  // (sequence, prompt mm row)
  int64_t t = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    Seq* s = find(c.seq);
    seqs.push_back(s);
    const Prompt& p = s->req.prompt;
    for (int64_t i = c.start; i < c.start + c.length; ++i, ++t) {
      b.tokens.push_back(s->tokens[i]);
      for (int a = 0; a < 3; ++a) b.positions[a * T + t] = s->position(a, i);
    }
    // Visual rows that fall inside this chunk.
    auto lo = std::lower_bound(p.mm_index.begin(), p.mm_index.end(), c.start);
    auto hi = std::lower_bound(p.mm_index.begin(), p.mm_index.end(), c.start + c.length);
    const bool on_device = p.mm_embeds.defined() && p.mm_embeds.device() != Device::CPU;
    for (auto it = lo; it != hi; ++it) {
      b.mm_index.push_back(t - c.length + (*it - c.start));
      if (!on_device) mm_rows.emplace_back(s, it - p.mm_index.begin());
    }
    if (on_device && lo != hi) b.mm_device.push_back(device_rows(p, lo - p.mm_index.begin(), hi - lo));
    b.seqs.push_back({&s->blocks, c.start, c.length, false, s->req.sere});
  }
  if (!mm_rows.empty() && !b.mm_device.empty())
    return internal_error("one step mixes host and device visual rows");
  if (!mm_rows.empty()) {
    const int64_t n = static_cast<int64_t>(mm_rows.size());
    b.mm_embeds = Tensor::empty({n, H});
    size_t n_ds = SIZE_MAX;
    for (auto& [s, r] : mm_rows) n_ds = std::min(n_ds, s->req.prompt.deepstack.size());
    for (size_t l = 0; l < n_ds; ++l) b.deepstack.push_back(Tensor::empty({n, H}));
    for (int64_t i = 0; i < n; ++i) {
      const auto& [s, r] = mm_rows[i];
      std::memcpy(b.mm_embeds.data<float>() + i * H, s->req.prompt.mm_embeds.data<float>() + r * H, H * 4);
      for (size_t l = 0; l < n_ds; ++l)
        std::memcpy(b.deepstack[l].data<float>() + i * H, s->req.prompt.deepstack[l].data<float>() + r * H, H * 4);
    }
  }

  const model::MoeHooks* hooks = opts_.moe_hooks ? opts_.moe_hooks(plan.decode_only()) : nullptr;
  // One row per chunk: the sampled chunks plan their row (drawing their uniform number), the others need nothing.
  const int64_t V = model_->decoder().config().vocab_size;
  std::vector<model::SampleRow> rows(plan.chunks.size());
  for (size_t ci = 0; ci < plan.chunks.size(); ++ci) {
    if (plan.chunks[ci].sample) rows[ci] = seqs[ci]->sampler.plan(V);
    else rows[ci].mode = model::SampleMode::kNone;
  }
  const model::TextDecoder& dec = model_->decoder();
  // Chunks of prompts whose log-probabilities are asked for return every row's logits (host summaries then).
  bool prompt_rows = false;
  for (size_t ci = 0; ci < plan.chunks.size(); ++ci)
    if (seqs[ci]->req.sampling.prompt_logprobs >= 0 && plan.chunks[ci].start < seqs[ci]->n_prompt - 1) {
      b.seqs[ci].all_logits = true;
      prompt_rows = true;
    }
  const double t_fwd = now_ms();
  std::vector<model::SampleResult> picked;
  if (prompt_rows) {
    ZEST_ASSIGN_OR_RETURN(Tensor logits, dec.forward(b, cache_, hooks));
    int64_t r = 0;
    for (size_t ci = 0; ci < plan.chunks.size(); ++ci) {
      const int64_t n = b.seqs[ci].all_logits ? plan.chunks[ci].length : 1;
      if (r + n > logits.dim(0)) return internal_error("the decoder returned too few logits rows");
      const float* first = logits.data<float>() + r * V;
      if (b.seqs[ci].all_logits) record_prompt_logprobs(*seqs[ci], plan.chunks[ci].start, n, first, V);
      picked.push_back(model::summarize_edited_row(first + (n - 1) * V, V, rows[ci]));
      r += n;
    }
  } else {
    ZEST_ASSIGN_OR_RETURN(picked, opts_.device_sampling ? dec.forward_sample(b, cache_, hooks, rows)
                                                  : dec.model::TextDecoder::forward_sample(b, cache_, hooks, rows));
  }
  forward_ms_ = now_ms() - t_fwd;
  if (picked.size() != rows.size()) return internal_error("the decoder returned a wrong number of sampled rows");

  for (size_t ci = 0; ci < plan.chunks.size(); ++ci) {
    const ScheduledChunk& c = plan.chunks[ci];
    Seq& s = *seqs[ci];
    s.computed += c.length;
    register_blocks(s);
    if (!c.sample) continue;
    const int32_t tok = Sampler::finish(rows[ci], picked[ci], V);
    if (tok < 0 || tok >= V) return internal_error("sampling did not produce a token");
    TokenLogprob lp;
    if (rows[ci].logprobs >= 0) {
      const model::SampleResult& r = picked[ci];
      lp.token = tok;
      const float raw = model::raw_logit_of(rows[ci], r, tok, V);
      if (std::isnan(raw)) return internal_error("sampling: the row summary lacks the sampled token's logit");
      lp.logprob = static_cast<float>(raw - r.lse);
      for (size_t k = 0; k < r.top_ids.size() && k < r.top_logits.size(); ++k)
        lp.top.emplace_back(r.top_ids[k], static_cast<float>(r.top_logits[k] - r.lse));
    }
    take_token(s, tok, rows[ci].logprobs >= 0 ? &lp : nullptr);
  }
  return Status::ok();
}

void Engine::take_token(Seq& s, int32_t tok, TokenLogprob* lp) {
  const std::vector<int32_t> eos = model_->eos_ids();
  s.sampler.accept(tok);
  if (!s.sampler.status().is_ok()) {
    finish(s, FinishReason::kError, s.full_text + s.detok.flush(), s.sampler.status().message());
    return;
  }
  s.tokens.push_back(tok);
  s.out.token_ids.push_back(tok);
  if (lp != nullptr) s.out.logprobs.push_back(std::move(*lp));
  if (s.out.first_token_ms == 0) s.out.first_token_ms = now_ms();
  const SamplingParams& sp = s.req.sampling;
  const bool is_eos = !sp.ignore_eos && std::find(eos.begin(), eos.end(), tok) != eos.end();
  const bool is_stop_id = std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), tok) != sp.stop_token_ids.end();
  if (is_eos || is_stop_id) {
    finish(s, FinishReason::kStop, s.full_text + s.detok.flush());
    return;
  }
  s.full_text += s.detok.push(tok);
  // Stop strings: cut the text before the first match.
  size_t cut = std::string::npos, hold = 0;
  for (const std::string& st : sp.stop) {
    if (st.empty()) continue;
    const size_t from = s.emitted > st.size() ? s.emitted - st.size() : 0;
    const size_t at = s.full_text.find(st, from);
    if (at != std::string::npos) cut = std::min(cut, at);
    hold = std::max(hold, st.size() - 1);
  }
  if (cut != std::string::npos) {
    finish(s, FinishReason::kStop, s.full_text.substr(0, cut));
    return;
  }
  if (s.generated() >= sp.max_tokens || static_cast<int64_t>(s.tokens.size()) >= max_context_) {
    finish(s, FinishReason::kLength, s.full_text + s.detok.flush());
    return;
  }
  // Send what can no longer become part of a stop string, ending on a character boundary: a delta never
  // splits a multi-byte UTF-8 character.
  size_t safe = s.full_text.size() > hold ? s.full_text.size() - hold : 0;
  while (safe > s.emitted && safe < s.full_text.size() && (static_cast<unsigned char>(s.full_text[safe]) & 0xC0) == 0x80)
    --safe;
  std::string delta;
  if (safe > s.emitted) {
    delta = s.full_text.substr(s.emitted, safe - s.emitted);
    s.emitted = safe;
  }
  s.out.text += delta;  // the text sent so far (appended: a copy of the whole text per token grows with its length)
  if (s.req.on_update) s.req.on_update(delta, s.out, false);
}

Status Engine::step() {
  StepPlan plan = schedule();
  if (plan.chunks.empty()) {
    last_decode_start_ms_ = -1;
    if (!running_.empty()) {
      // Running requests that cannot grow (the cache holds nothing else to preempt) end by length
      // rather than spin; waiting requests get the freed blocks next step.
      for (auto& s : running_) finish(*s, FinishReason::kLength, s->full_text + s->detok.flush());
      running_.clear();
      return Status::ok();
    }
    // Nothing fits: the oldest waiting request cannot get blocks even with nothing running.
    if (!waiting_.empty()) {
      finish(*waiting_.front(), FinishReason::kError, waiting_.front()->out.text,
             "the request does not fit the KV cache");
      waiting_.pop_front();
    }
    return Status::ok();
  }
  ++stats_.steps;
  stats_.tokens_computed += plan.num_tokens();
  const bool decode = plan.decode_only();
  const double t0 = now_ms();
  if (decode && last_decode_start_ms_ >= 0) {
    ++stats_.decode_intervals;
    stats_.decode_interval_s += (t0 - last_decode_start_ms_) * 1e-3;
  }
  last_decode_start_ms_ = decode ? t0 : -1;
  forward_ms_ = 0;
  Status st = run(plan);
  if (decode) {
    ++stats_.decode_steps;
    stats_.decode_step_s += (now_ms() - t0) * 1e-3;
    stats_.decode_forward_s += forward_ms_ * 1e-3;
  }
  if (!st.is_ok()) {
    for (auto& s : running_) finish(*s, FinishReason::kError, s->out.text, st.message());
    running_.clear();
    // Can the decoder run another step? (Asked only here: a healthy decoder turns unusable only in a failed step.)
    if (Status h = model_->decoder().health(); !h.is_ok()) decoder_error_ = h.message();
    return st;
  }
  running_.remove_if([](const std::unique_ptr<Seq>& p) { return p->done; });
  return Status::ok();
}

EngineStats Engine::stats() const {
  EngineStats s = stats_;
  s.running = static_cast<int64_t>(running_.size());
  s.waiting = static_cast<int64_t>(waiting_.size());
  s.kv_blocks_used = cache_.used_blocks();
  s.prefix_cache_blocks = cache_.cached_blocks();
  s.decoder_error = decoder_error_;
  return s;
}

Status Engine::check_blocks() const {
  std::vector<const std::vector<int32_t>*> tables;
  for (const auto& s : running_) tables.push_back(&s->blocks);
  for (const auto& s : waiting_) tables.push_back(&s->blocks);
  return cache_.check(tables);
}

Result<RequestOutput> generate_one(std::shared_ptr<ModelBundle> model, Request req, EngineOptions opts) {
  Engine engine(std::move(model), opts);
  RequestOutput result;
  auto user_cb = req.on_update;
  req.on_update = [&](const std::string& delta, const RequestOutput& out, bool finished) {
    if (user_cb) user_cb(delta, out, finished);
    if (finished) result = out;
  };
  ZEST_RETURN_IF_ERROR(engine.add(std::move(req)));
  while (engine.has_work()) ZEST_RETURN_IF_ERROR(engine.step());
  if (result.finish == FinishReason::kError) return internal_error(result.error);
  return result;
}

}  // namespace zest::engine
