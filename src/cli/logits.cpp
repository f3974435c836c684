// zest logits: the decoder's logits for a request's prompt, as .npy; zest tokenize: token ids of a text.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "engine/chat_request.h"
#include "io/npy.h"

namespace zest::cli {
namespace {

struct LogitsArgs {
  ModelArgs model;
  RequestArgs request;
  AccelArgs accel;
  std::string out;
  bool all_positions = false;
  std::string append_ids;  // JSON array of token ids appended after the prompt (a completion's tokens)
};

int run_logits(const LogitsArgs& a) {
  auto body_r = request_body(a.request);
  if (!body_r.ok()) return fail(body_r.status());
  auto model_r = load_model(a.model);
  if (!model_r.ok()) return fail(model_r.status());
  auto model = std::move(model_r).value();
  engine::EngineOptions unused;
  auto accel = apply_accel(a.accel, *model, unused);
  if (!accel.ok()) return fail(accel.status());
  auto req_r = engine::parse_chat_request(*body_r, *model);
  if (!req_r.ok()) return fail(req_r.status());
  auto prompt_r = engine::build_prompt(*model, *req_r, {});
  if (!prompt_r.ok()) return fail(prompt_r.status());
  engine::Prompt& p = *prompt_r;
  if (!a.append_ids.empty()) {
    // Tokens after the prompt take the decode positions: index + rope delta on every axis.
    nlohmann::json ids = nlohmann::json::parse(a.append_ids, nullptr, false);
    const int64_t vocab = model->config.text.vocab_size;
    if (!ids.is_array()) return fail(invalid_argument("--append-ids must be a JSON array of token ids"));
    const int64_t n0 = static_cast<int64_t>(p.ids.size()), m = static_cast<int64_t>(ids.size());
    std::vector<int32_t> pos(3 * (n0 + m));
    for (int64_t ax = 0; ax < 3; ++ax) {
      for (int64_t i = 0; i < n0; ++i) pos[ax * (n0 + m) + i] = p.positions[ax * n0 + i];
      for (int64_t i = n0; i < n0 + m; ++i) pos[ax * (n0 + m) + i] = static_cast<int32_t>(i + p.rope_delta);
    }
    for (const nlohmann::json& e : ids) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= vocab)
        return fail(invalid_argument("--append-ids: token ids must be integers in [0, " + std::to_string(vocab) + ")"));
      p.ids.push_back(e.get<int32_t>());
    }
    p.positions = std::move(pos);
  }

  const int64_t n = static_cast<int64_t>(p.ids.size());
  auto cache_r = model->decoder().allocate_cache((n + 15) / 16, 16);
  if (!cache_r.ok()) return fail(cache_r.status());
  model::PagedKVCache cache = std::move(cache_r).value();
  std::vector<int32_t> table;
  Status st = cache.reserve(table, n);
  if (!st.is_ok()) return fail(st);
  model::ForwardBatch b;
  b.tokens = p.ids;
  b.positions = p.positions;
  b.seqs.push_back({&table, 0, n, a.all_positions, true});
  engine::attach_visual_rows(p, b);  // host rows, or the CUDA vision path's device rows as they are
  // SERE re-routes prompt (prefill) tokens only with --sere-prefill.
  const model::MoeHooks* hooks = *accel ? (*accel)->hooks(/*decode_only=*/false) : nullptr;
  auto logits = model->decoder().forward(b, cache, hooks);
  if (!logits.ok()) return fail(logits.status());
  Tensor out = *logits;
  if (!a.all_positions) out = out.reshape({out.dim(1)});
  st = io::write_npy(a.out, out);
  if (!st.is_ok()) return fail(st);
  std::cout << nlohmann::json(p.ids).dump() << "\n";
  return 0;
}

struct TokenizeArgs {
  ModelArgs model;
  std::string text;
};

int run_tokenize(const TokenizeArgs& a) {
  auto tok = text::Tokenizer::load(a.model.model);
  if (!tok.ok()) return fail(tok.status());
  std::cout << nlohmann::json(tok->encode(a.text, true)).dump() << "\n";
  return 0;
}

}  // namespace

void register_logits(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<LogitsArgs>();
  CLI::App* sub = app.add_subcommand("logits", "Write the prompt's logits as .npy and print the prompt token ids");
  add_model_args(sub, a->model);
  add_request_args(sub, a->request);
  add_accel_args(sub, a->accel);
  sub->add_option("--out", a->out, "output .npy file")->required();
  sub->add_flag("--all-positions", a->all_positions, "logits of every prompt position [T, vocab]");
  sub->add_option("--append-ids", a->append_ids,
                  "JSON array of token ids appended after the prompt at decode positions (e.g. a completion's "
                  "tokens, to compare its logprobs)");
  sub->callback([a, &run] { run = [a] { return run_logits(*a); }; });
}

void register_tokenize(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<TokenizeArgs>();
  CLI::App* sub = app.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  sub->add_option("--model", a->model.model, "model directory (its tokenizer is used)")->required();
  sub->add_option("--text", a->text, "text to encode (special-token strings become special tokens)")->required();
  sub->callback([a, &run] { run = [a] { return run_tokenize(*a); }; });
}

}  // namespace zest::cli
