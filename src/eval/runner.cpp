#include "eval/runner.h"

#include <cstdio>

#include "core/timer.h"
#include "engine/chat_request.h"
#include "engine/encoder_cache.h"
#include "eval/metrics.h"

namespace zest::eval {
namespace {

using nlohmann::json;

// The item's body with the eval defaults for what it leaves out.
json with_defaults(const json& body, const RunOptions& opts) {
  json b = body;
  if (!b.contains("max_tokens") && !b.contains("max_completion_tokens")) b["max_tokens"] = opts.max_tokens;
  if (!b.contains("temperature")) b["temperature"] = 0.0;
  return b;
}

void print_progress(const RunOptions& opts, size_t done, size_t total, double elapsed_ms) {
  std::fprintf(stderr, "\r%s%s%zu/%zu items  %.2f items/s", opts.label.c_str(), opts.label.empty() ? "" : ": ", done,
               total, elapsed_ms > 0 ? 1000.0 * static_cast<double>(done) / elapsed_ms : 0.0);
  if (done == total) std::fprintf(stderr, "\n");
}

}  // namespace

Result<RunResult> run_eval(const std::shared_ptr<engine::ModelBundle>& model, const EvalData& data,
                           engine::EngineOptions engine_opts, const RunOptions& opts) {
  if (opts.batch < 1) return invalid_argument("the batch (requests in flight) must be at least 1");
  const size_t n = data.items.size();
  std::vector<engine::ChatRequest> requests;
  requests.reserve(n);
  for (const EvalItem& item : data.items) {
    auto r = engine::parse_chat_request(with_defaults(item.body, opts), *model);
    if (!r.ok()) return r.status().with_context(data.where(item));
    if (r->n != 1)
      return invalid_argument("'n' = " + std::to_string(r->n) + ": zest eval scores one completion per item")
          .with_context(data.where(item));
    requests.push_back(std::move(r).value());
  }
  if (model->encoder_cache) model->encoder_cache->clear();
  engine_opts.max_num_seqs = opts.batch;
  engine::Engine engine(model, engine_opts);
  engine::PromptOptions prompt_opts;
  prompt_opts.base_dir = data.base_dir;

  RunResult result;
  result.items.resize(n);
  std::vector<engine::RequestOutput> outputs(n);
  std::vector<double> prompt_ms(n, 0.0);
  size_t next = 0, finished = 0, shown = 0;
  int64_t in_flight = 0;
  const double t0 = now_ms();
  if (opts.progress) print_progress(opts, 0, n, 0);
  while (next < n || engine.has_work()) {
    for (; next < n && in_flight < opts.batch; ++next) {
      const EvalItem& item = data.items[next];
      ItemResult& res = result.items[next];
      const double t_prompt = now_ms();
      auto prompt = engine::build_prompt(*model, requests[next], prompt_opts);
      if (!prompt.ok()) return prompt.status().with_context(data.where(item));
      prompt_ms[next] = now_ms() - t_prompt;
      res.prompt_tokens = static_cast<int64_t>(prompt->ids.size());
      for (int64_t v : prompt->visual_tokens_before) res.visual_tokens_before += v;
      for (int64_t v : prompt->visual_tokens_after) res.visual_tokens_after += v;
      engine::Request req;
      req.id = static_cast<int64_t>(next);
      req.prompt = std::move(prompt).value();
      req.sampling = requests[next].sampling;
      req.sere = requests[next].sere;
      req.on_update = [&, i = next](const std::string&, const engine::RequestOutput& out, bool done) {
        if (!done) return;
        outputs[i] = out;
        --in_flight;
        ++finished;
      };
      ZEST_RETURN_IF_ERROR(engine.add(std::move(req)).with_context(data.where(item)));
      ++in_flight;
    }
    ZEST_RETURN_IF_ERROR(engine.step());
    if (opts.progress && finished != shown) {
      print_progress(opts, finished, n, now_ms() - t0);
      shown = finished;
    }
  }
  result.wall_s = (now_ms() - t0) / 1000.0;
  const engine::EngineStats stats = engine.stats();
  result.decode_step_ms = stats.decode_steps > 0 ? 1000.0 * stats.decode_step_s / stats.decode_steps : 0.0;

  for (size_t i = 0; i < n; ++i) {
    const EvalItem& item = data.items[i];
    const engine::RequestOutput& out = outputs[i];
    if (out.finish == engine::FinishReason::kError) return internal_error(data.where(item) + ": " + out.error);
    ItemResult& res = result.items[i];
    res.line = item.line;
    res.task = item.task;
    res.answers = item.answers;
    res.prediction = out.text;
    res.token_ids = out.token_ids;
    res.finish_reason = engine::finish_reason_name(out.finish);
    res.ttft_ms = prompt_ms[i] + (out.first_token_ms - out.arrival_ms);
    const size_t tokens = out.token_ids.size();
    res.tpot_ms = tokens > 1 ? (out.finish_ms - out.first_token_ms) / static_cast<double>(tokens - 1) : 0.0;
    res.exact = exact_match(res.prediction, res.answers);
    res.relaxed = relaxed_accuracy(res.prediction, res.answers);
    res.anls = anls(res.prediction, res.answers);
  }
  return result;
}

}  // namespace zest::eval
