// Runs an eval data set through engine::Engine in-process with continuous batching: up to `batch`
// requests in flight, a finished one replaced by the next item at once, so batched decode (and SERE)
// sees real batches. Scores every prediction (eval/metrics.h).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "engine/model_bundle.h"
#include "eval/dataset.h"

namespace zest::eval {

struct RunOptions {
  int64_t batch = 16;       // requests in flight at once
  int64_t max_tokens = 32;  // for items whose body sets neither max_tokens nor max_completion_tokens
  bool progress = true;     // a one-line counter on stderr
  std::string label;        // shown in the progress line
};

struct ItemResult {
  int64_t line = 0;
  std::string task;
  std::vector<std::string> answers;
  std::string prediction;
  std::vector<int32_t> token_ids;
  std::string finish_reason;
  int64_t prompt_tokens = 0, visual_tokens_before = 0, visual_tokens_after = 0;
  // TTFT: building the prompt (images through the vision tower) plus the time from joining the engine to the
  // first token. TPOT: (last token - first token) / (tokens - 1); 0 with one token.
  double ttft_ms = 0, tpot_ms = 0;
  double exact = 0, relaxed = 0, anls = 0;
};

struct RunResult {
  std::vector<ItemResult> items;  // in data order
  double wall_s = 0;
  double decode_step_ms = 0;  // the engine's mean decode-only step (its host wall time)
};

// Items without temperature run greedy (temperature 0). Every body is checked with the server's request
// parser before anything runs; an item that fails (a bad body, a missing image, a prompt over the
// context) ends the run with an error naming FILE:LINE. `engine_opts` carries the SERE hooks;
// max_num_seqs is set to the batch. The model's vision-encoder cache is cleared first, so every setting
// encodes each image once.
Result<RunResult> run_eval(const std::shared_ptr<engine::ModelBundle>& model, const EvalData& data,
                           engine::EngineOptions engine_opts, const RunOptions& opts);

}  // namespace zest::eval
