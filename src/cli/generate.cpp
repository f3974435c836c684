// zest generate: one request, streamed to stdout as text or printed as one JSON object.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/chat_request.h"
#include "core/timer.h"
#include "engine/engine.h"

namespace zest::cli {
namespace {

struct GenerateArgs {
  ModelArgs model;
  RequestArgs request;
  AccelArgs accel;
  int64_t max_tokens = -1;
  double temperature = -1, top_p = -1;
  int64_t top_k = -1;
  int64_t seed = -1;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  std::string output_format = "text";
};

int run_generate(const GenerateArgs& a) {
  using nlohmann::json;
  auto body_r = request_body(a.request);
  if (!body_r.ok()) return fail(body_r.status());
  json body = std::move(body_r).value();
  if (a.max_tokens > 0) body["max_tokens"] = a.max_tokens;
  if (a.temperature >= 0) body["temperature"] = a.temperature;
  if (a.top_p >= 0) body["top_p"] = a.top_p;
  if (a.top_k >= 0) body["top_k"] = a.top_k;
  if (a.seed >= 0) body["seed"] = a.seed;
  if (!a.stop.empty()) body["stop"] = a.stop;
  if (a.ignore_eos) body["ignore_eos"] = true;

  auto model_r = load_model(a.model);
  if (!model_r.ok()) return fail(model_r.status());
  auto model = std::move(model_r).value();
  engine::EngineOptions eopts;
  auto sere_r = apply_accel(a.accel, *model, eopts);
  if (!sere_r.ok()) return fail(sere_r.status());
  auto sere = std::move(sere_r).value();
  auto req_r = engine::parse_chat_request(body, *model);
  if (!req_r.ok()) return fail(req_r.status());
  const double t_start = now_ms();  // TTFT counts prompt building and image encoding too
  engine::PromptOptions po;
  po.allow_local_files = true;
  auto prompt_r = engine::build_prompt(*model, *req_r, po);
  if (!prompt_r.ok()) return fail(prompt_r.status());

  engine::Request req;
  req.prompt = std::move(prompt_r).value();
  req.sampling = req_r->sampling;
  req.sere = req_r->sere;
  const bool stream_text = a.output_format == "text";
  if (stream_text)
    req.on_update = [](const std::string& delta, const engine::RequestOutput&, bool finished) {
      std::cout << delta << std::flush;
      if (finished) std::cout << "\n";
    };
  const std::vector<int32_t> prompt_ids = req.prompt.ids;
  const auto vis_before = req.prompt.visual_tokens_before, vis_after = req.prompt.visual_tokens_after;
  const double vis_pre = req.prompt.vision_preprocess_ms, vis_tower = req.prompt.vision_tower_ms,
               vis_select = req.prompt.vision_select_ms;
  auto out_r = engine::generate_one(model, std::move(req), eopts);
  if (!out_r.ok()) return fail(out_r.status());
  const engine::RequestOutput& out = *out_r;
  if (stream_text) return 0;

  const int64_t n_gen = static_cast<int64_t>(out.token_ids.size());
  const double ttft = out.first_token_ms - t_start;
  const double decode_ms = out.finish_ms - out.first_token_ms;
  json j;
  j["prompt_token_ids"] = prompt_ids;
  j["token_ids"] = out.token_ids;
  j["text"] = out.text;
  j["finish_reason"] = engine::finish_reason_name(out.finish);
  int64_t vb = 0, va = 0;
  for (int64_t v : vis_before) vb += v;
  for (int64_t v : vis_after) va += v;
  j["usage"] = {{"prompt_tokens", prompt_ids.size()},
                {"completion_tokens", n_gen},
                {"total_tokens", static_cast<int64_t>(prompt_ids.size()) + n_gen},
                {"visual_tokens_before", vb},
                {"visual_tokens_after", va},
                {"visual_tokens_per_image_before", vis_before},
                {"visual_tokens_per_image_after", vis_after}};
  j["timings"] = {{"ttft_ms", ttft},
                  {"tpot_ms", n_gen > 1 ? decode_ms / (n_gen - 1) : 0.0},
                  {"total_ms", out.finish_ms - t_start},
                  {"vision_preprocess_ms", vis_pre},
                  {"vision_tower_ms", vis_tower},
                  {"vision_select_ms", vis_select},
                  {"prefill_tokens_per_s", ttft > 0 ? prompt_ids.size() / (ttft / 1000.0) : 0.0},
                  {"decode_tokens_per_s", decode_ms > 0 ? (n_gen - 1) / (decode_ms / 1000.0) : 0.0}};
  if (sere) j["sere"] = sere->stats_json();
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace

void register_generate(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<GenerateArgs>();
  CLI::App* sub = app.add_subcommand("generate", "Generate a reply to one chat request");
  add_model_args(sub, a->model);
  add_request_args(sub, a->request);
  add_accel_args(sub, a->accel);
  sub->add_option("--max-tokens", a->max_tokens, "maximum tokens to generate (default 256)");
  sub->add_option("--temperature", a->temperature, "sampling temperature (0 = greedy)");
  sub->add_option("--top-p", a->top_p, "nucleus sampling mass");
  sub->add_option("--top-k", a->top_k, "sample among the k most likely tokens");
  sub->add_option("--seed", a->seed, "random seed");
  sub->add_option("--stop", a->stop, "stop string (repeatable)");
  sub->add_flag("--ignore-eos", a->ignore_eos, "keep generating past end-of-sequence tokens");
  sub->add_option("--output-format", a->output_format, "text (streamed) or json")
      ->check(CLI::IsMember({"text", "json"}));
  sub->callback([a, &run] { run = [a] { return run_generate(*a); }; });
}

}  // namespace zest::cli
