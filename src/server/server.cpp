#include "server/server.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <optional>
#include <random>
#include <thread>

#include "backend/cuda.h"
#include "core/timer.h"
#include "engine/chat_request.h"
#include "server/engine_loop.h"
#include "server/http.h"
#include "server/http_server.h"
#include "server/openai.h"

namespace zest::server {
namespace {

using nlohmann::json;

constexpr const char* kChatPath = "/v1/chat/completions";
constexpr const char* kCompletionsPath = "/v1/completions";
constexpr const char* kJson = "application/json";

int64_t unix_seconds() {
  using namespace std::chrono;
  return duration_cast<seconds>(system_clock::now().time_since_epoch()).count();
}

std::string hex(uint64_t v, int digits) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(digits, '0');
  for (int i = digits - 1; i >= 0; --i, v >>= 4) s[i] = kDigits[v & 15];
  return s;
}

bool starts_with_nocase(const std::string& s, const char* prefix) {
  for (size_t i = 0; prefix[i]; ++i)
    if (i >= s.size() || std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

// The Allow header of the known paths; empty for unknown ones.
const char* allowed_methods(const std::string& path) {
  if (path == kChatPath || path == kCompletionsPath || path == "/tokenize" || path == "/detokenize") return "POST";
  if (path == "/v1/models" || path == "/health" || path == "/metrics") return "GET";
  return "";
}

// Refuses image sources the server will not read: http(s) URLs always, local files unless allowed.
Status check_image_sources(const json& messages, bool allow_local_files) {
  for (size_t mi = 0; mi < messages.size(); ++mi) {
    const json& c = messages[mi].contains("content") ? messages[mi]["content"] : json();
    if (!c.is_array()) continue;
    for (size_t pi = 0; pi < c.size(); ++pi) {
      const json& part = c[pi];
      const std::string type = part.value("type", "");
      if (type != "image_url" && type != "image") continue;
      std::string url;
      if (part.contains("image_url")) {
        const json& u = part["image_url"];
        if (u.is_string()) url = u.get<std::string>();
        else if (u.is_object() && u.contains("url") && u["url"].is_string()) url = u["url"].get<std::string>();
      } else if (part.contains("image") && part["image"].is_string()) {
        url = part["image"].get<std::string>();
      }
      const std::string where = "messages[" + std::to_string(mi) + "].content[" + std::to_string(pi) + "]";
      if (starts_with_nocase(url, "http://") || starts_with_nocase(url, "https://"))
        return invalid_argument(where + ": zest does not fetch remote images; send the image inline as a "
                                        "data:image/<type>;base64,... URL");
      if (!allow_local_files && !starts_with_nocase(url, "data:"))
        return invalid_argument(where + ": local image files are disabled on this server; send the image as a "
                                        "data: URL, or start zest serve with --allow-local-files");
    }
  }
  return Status::ok();
}

// One API request in flight: its choices (one engine request each) and how to answer.
struct Job {
  bool text_completion = false;  // POST /v1/completions (else chat)
  std::shared_ptr<RequestChannel> channel;
  std::vector<int64_t> ids;  // engine request id of each choice
  CompletionId cid;
  Usage usage;               // prompt and visual tokens (completion and cached tokens are added at the end)
  int64_t n = 1;             // choices per prompt (choice i belongs to prompt i / n)
  bool include_usage = false;
  bool logprobs = false;
  bool prompt_logprobs = false;
  // A decode instance's request: the prompt log-probabilities the prefill instance computed (RemotePrefill).
  std::vector<engine::TokenLogprob> remote_prompt_logprobs;
  bool token_ids = false;    // logprob tokens as "token_id:N"
  // Streaming only: the role chunk of each choice was sent; text completions: each choice's text so far (bytes, the
  // logprobs' text_offset).
  std::vector<char> sent_role;
  std::vector<int64_t> text_offset;
  // Chat: how replies are parsed (reasoning, tool calls), and each choice's stream parser.
  engine::ChatOutputOptions parse;
  bool reasoning_field = false;  // messages carry reasoning_content
  std::vector<engine::ChatOutputParser> parsers;
  // Prefill instance, kv_transfer_params {"do_remote_decode": true}: the response offers the prompt's K/V and carries
  // what the decode instance continues from.
  bool export_kv = false;
  std::vector<int32_t> prompt_ids;
  int64_t rope_delta = 0;
};

// The prompt log-probabilities of a choice: the prefill instance's for a decode instance's request, else the engine's.
const std::vector<engine::TokenLogprob>& prompt_lps(const Job& job, const engine::RequestOutput& out) {
  return job.remote_prompt_logprobs.empty() ? out.prompt_logprobs : job.remote_prompt_logprobs;
}

// One choice of a request to submit.
struct ChoiceSpec {
  engine::Prompt prompt;
  engine::SamplingParams sampling;
  bool export_kv = false;                          // engine::Request's disaggregation fields
  std::shared_ptr<const model::KvSnapshot> kv;
  int32_t first_token = -1;
  std::optional<engine::TokenLogprob> first_logprob;
};

}  // namespace

struct Server::Impl {
  std::shared_ptr<engine::ModelBundle> model;
  ServerOptions opts;
  std::string model_name;
  int64_t created = 0;
  uint64_t id_prefix = 0;
  std::atomic<int64_t> next_id{1};
  std::atomic<bool> stopping{false};
  // The reasoning parser (--reasoning-parser) and the think tags' token ids.
  bool reasoning = false;
  int32_t think_open_id = -1, think_close_id = -1, im_start_id = -1;
  Metrics metrics;
  std::unique_ptr<EngineLoop> loop;
  std::unique_ptr<transfer::Offerer> offerer;  // --role prefill
  std::unique_ptr<transfer::Reader> reader;    // --role decode
  std::unique_ptr<HttpServer> http;
  std::thread listener;
  int port = 0;
  std::mutex stop_mu;
  bool stopped = false;
  // Streams whose response is still being written; stop() lets them send their last event.
  std::mutex streams_mu;
  std::condition_variable streams_cv;
  int64_t open_streams = 0;

  void reply_error(httplib::Response& res, int status, const std::string& message, const std::string& param = {}) {
    metrics.record_rejected(status);
    res.status = status;
    res.set_content(dump_json(error_body(status, message, param)), kJson);
  }
  void reply_status(httplib::Response& res, const Status& st) {
    reply_error(res, http_status_for(st), st.message(), error_param(st.message()));
  }

  int http_threads() const;
  ConnectionLimits connection_limits() const;
  void routes();
  // The prompt (of n_prompt tokens) and the completion the request asks for must fit the context, as vLLM
  // checks: 400 naming messages or max_tokens.
  Status check_length(int64_t n_prompt, const engine::GenerationFields& cr, bool chat = true) const;
  // Reads, bounds and parses a JSON body and checks its `model`; false when it already answered with an error.
  bool read_json(httplib::Response& res, const httplib::ContentReader& reader, json& j, std::string* raw = nullptr);
  // Tools and tool-call arguments are rendered with the client's key order (transformers' tojson keeps it; the
  // parsed body's objects sort their keys): re-reads the raw body as an ordered document when they are present.
  void keep_key_order(engine::ChatRequest& cr, const std::string& raw) const;
  // Whether the prompt leaves a think block open (its generation prompt ends inside <think>).
  bool prompt_opens_think(const std::vector<int32_t>& ids) const;
  // The prompt's last think block is closed after the last <|im_start|> (the template turned thinking off).
  bool prompt_closes_think(const std::vector<int32_t>& ids) const;
  void handle_chat(const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader);
  void handle_completions(httplib::Response& res, const httplib::ContentReader& reader);
  void handle_tokenize(httplib::Response& res, const httplib::ContentReader& reader);
  void handle_detokenize(httplib::Response& res, const httplib::ContentReader& reader);
  // Submits the choices of `job` (its ids and channel are made here) to the engine; job.usage is the caller's.
  void submit(Job& job, std::vector<ChoiceSpec> choices, bool sere, double received_ms);
  void abort_all(const Job& job);
  // Non-streaming reply: waits for the end, checking the client's connection once per keep-alive interval
  // (a client gone aborts the request).
  void respond_whole(httplib::Response& res, const Job& job);
  std::pair<int, std::string> whole_body(const ChannelUpdate& u, const Job& job, const json& extra = json()) const;
  // Disaggregation: the kv_transfer_params of a prefill response (offers the K/V), and a decode request's prompt
  // K/V read from the prefill instance.
  Result<json> offer_kv(const ChannelUpdate& u, const Job& job);
  Result<std::shared_ptr<const model::KvSnapshot>> read_kv(const RemotePrefill& rp);
  void respond_stream(httplib::Response& res, std::shared_ptr<Job> job);
  // One provider call: waits for news (up to the keep-alive interval) and writes it; false = stop.
  bool stream_step(Job& job, httplib::DataSink& sink);
};

void Server::Impl::routes() {
  // Connections over the per-address cap may only ask for the health and metrics endpoints.
  http->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const Connection* c = current_connection();
    if (!c || !c->probe_only || req.path == "/health" || req.path == "/metrics")
      return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("Connection", "close");
    reply_error(res, 429,
                "too many connections from " + c->ip() + " (this server allows " +
                    std::to_string(connection_limits().max_per_client) +
                    " per client address: --max-connections-per-client); only /health and /metrics are answered "
                    "on more");
    return httplib::Server::HandlerResponse::Handled;
  });
  http->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const engine::EngineStats s = loop->stats();
    const bool broken = !s.decoder_error.empty();  // e.g. a split decoder that lost a GPU: restart the instance
    json j = {{"status", stopping ? "stopping" : broken ? "unhealthy" : "ok"},
              {"model", model_name},
              {"kv_blocks_used", s.kv_blocks_used},
              {"kv_blocks_total", s.kv_blocks_total},
              {"requests_running", s.running},
              {"requests_waiting", s.waiting}};
    if (broken) j["error"] = s.decoder_error;
    res.status = stopping || broken ? 503 : 200;
    res.set_content(dump_json(j), kJson);
  });
  http->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", model_name},
              {"object", "model"},
              {"created", created},
              {"owned_by", "zest"},
              {"root", model->dir},
              {"max_model_len", loop->max_context()}};
    res.set_content(dump_json({{"object", "list"}, {"data", json::array({m})}}), kJson);
  });
  http->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(loop->stats()), "text/plain; version=0.0.4; charset=utf-8");
  });
  http->Post(kChatPath, [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& r) {
    handle_chat(req, res, r);
  });
  http->Post(kCompletionsPath, [this](const httplib::Request&, httplib::Response& res, const httplib::ContentReader& r) {
    handle_completions(res, r);
  });
  http->Post("/tokenize", [this](const httplib::Request&, httplib::Response& res, const httplib::ContentReader& r) {
    handle_tokenize(res, r);
  });
  http->Post("/detokenize", [this](const httplib::Request&, httplib::Response& res, const httplib::ContentReader& r) {
    handle_detokenize(res, r);
  });
  // Fills the body of every error response that has none: unknown paths (404), wrong methods on
  // known paths (405), bodies over the limit (413), malformed HTTP (400).
  http->set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                      httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const char* allow = allowed_methods(req.path);
    std::string message;
    if (res.status == 404 && *allow) {
      res.status = 405;
      res.set_header("Allow", allow);
      message = "method " + req.method + " is not allowed on " + req.path + "; use " + allow;
    } else if (res.status == 404) {
      message = "unknown path '" + req.path + "'; zest serves POST /v1/chat/completions, POST /v1/completions, "
                "POST /tokenize, POST /detokenize, GET /v1/models, GET /health and GET /metrics";
    } else if (res.status == 413) {
      message = "the request body is larger than the server's limit of " + std::to_string(opts.max_body_bytes) +
                " bytes (--max-body-bytes)";
    } else {
      message = "the HTTP request could not be handled (status " + std::to_string(res.status) + ")";
    }
    metrics.record_rejected(res.status);
    res.set_content(dump_json(error_body(res.status, message)), kJson);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http->set_exception_handler([this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    reply_error(res, 500, "internal error: " + what);
  });
}

ConnectionLimits Server::Impl::connection_limits() const {
  ConnectionLimits l;
  l.keep_alive_s = opts.keep_alive_timeout_s;
  l.idle_read_s = opts.idle_read_timeout_s;
  l.request_read_s = opts.request_read_timeout_s;
  // By default one address may take all handler threads but 16: a reserve for other clients and, past the
  // cap, for its own health probes.
  l.max_per_client = opts.max_connections_per_client > 0 ? opts.max_connections_per_client
                                                         : std::max(1, http_threads() - 16);
  return l;
}

int Server::Impl::http_threads() const {
  return opts.http_threads > 0 ? opts.http_threads
                               : static_cast<int>(std::max<int64_t>(64, 2 * opts.engine.max_num_seqs + 32));
}

Status Server::Impl::check_length(int64_t n_prompt, const engine::GenerationFields& cr, bool chat) const {
  const int64_t ctx = loop->max_context();
  if (n_prompt >= ctx && chat)
    return invalid_argument("messages: the prompt has " + std::to_string(n_prompt) + " tokens (images included) but "
                            "the context limit is " + std::to_string(ctx) + " tokens; shorten the messages or "
                            "send smaller or fewer images");
  if (n_prompt >= ctx)
    return invalid_argument("'prompt' has " + std::to_string(n_prompt) + " tokens but the context limit is " +
                            std::to_string(ctx) + " tokens");
  if (cr.max_tokens_given && cr.sampling.max_tokens > ctx - n_prompt)
    return invalid_argument("'max_tokens' = " + std::to_string(cr.sampling.max_tokens) + " plus the prompt's " +
                            std::to_string(n_prompt) + " tokens is more than the context limit of " +
                            std::to_string(ctx) + " tokens; ask for at most " + std::to_string(ctx - n_prompt));
  return Status::ok();
}

void Server::Impl::keep_key_order(engine::ChatRequest& cr, const std::string& raw) const {
  bool ordered = !cr.tools.is_null() || cr.constraint.active();
  for (const json& m : cr.messages) ordered = ordered || (m.contains("tool_calls") && !m["tool_calls"].is_null());
  if (!ordered) return;
  const auto body = nlohmann::ordered_json::parse(raw, nullptr, false);
  if (!body.is_discarded()) engine::use_client_key_order(cr, body);
}

bool Server::Impl::prompt_opens_think(const std::vector<int32_t>& ids) const {
  for (size_t k = ids.size(); k-- > 0;) {
    if (ids[k] == think_close_id || ids[k] == im_start_id) return false;
    if (ids[k] == think_open_id) return true;
  }
  return false;
}

bool Server::Impl::prompt_closes_think(const std::vector<int32_t>& ids) const {
  for (size_t k = ids.size(); k-- > 0;) {
    if (ids[k] == think_open_id || ids[k] == im_start_id) return false;
    if (ids[k] == think_close_id) return true;
  }
  return false;
}

bool Server::Impl::read_json(httplib::Response& res, const httplib::ContentReader& reader, json& j, std::string* raw) {
  Connection* conn = current_connection();
  // Read the body, refusing (and draining, so the client sees the answer) anything over the limit.
  std::string body;
  const size_t limit = static_cast<size_t>(opts.max_body_bytes);
  size_t drained = 0;
  bool too_big = false;
  const bool read_ok = reader([&](const char* data, size_t n) {
    if (!too_big && body.size() + n <= limit) {
      body.append(data, n);
      return true;
    }
    too_big = true;
    body.clear();
    body.shrink_to_fit();
    drained += n;
    return drained <= 4 * limit + (1u << 20);
  });
  if (too_big || res.status == 413) {
    res.set_header("Connection", "close");
    reply_error(res, 413,
                "the request body is larger than the server's limit of " + std::to_string(limit) +
                    " bytes (--max-body-bytes)");
    return false;
  }
  if (!read_ok && conn && conn->read_timed_out) {
    res.set_header("Connection", "close");
    reply_error(res, 408,
                "the request body did not arrive in time (--request-read-timeout " +
                    std::to_string(opts.request_read_timeout_s) + " s, --idle-read-timeout " +
                    std::to_string(opts.idle_read_timeout_s) + " s)");
    return false;
  }
  if (!read_ok) {
    reply_error(res, 400, "the request body could not be read");
    return false;
  }
  // Nesting is bounded before parsing: the parser is iterative, but copies, dumps and the chat template of a
  // parsed value recurse.
  if (json_deeper_than(body, opts.max_json_depth)) {
    reply_error(res, 400,
                "the request body nests arrays and objects deeper than this server's limit of " +
                    std::to_string(opts.max_json_depth) + " levels (--max-json-depth)");
    return false;
  }
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    reply_error(res, 400, std::string("the request body is not valid JSON: ") + e.what());
    return false;
  }
  if (raw) *raw = std::move(body);
  if (j.is_object() && j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) {
      reply_error(res, 400, "'model' must be a string", "model");
      return false;
    }
    if (j["model"].get<std::string>() != model_name) {
      reply_error(res, 404,
                  "the model '" + j["model"].get<std::string>() + "' does not exist; this server serves '" +
                      model_name + "'",
                  "model");
      return false;
    }
  }
  return true;
}

void Server::Impl::handle_chat(const httplib::Request&, httplib::Response& res,
                               const httplib::ContentReader& reader) {
  const double received_ms = now_ms();
  Connection* conn = current_connection();
  json j;
  std::string raw;
  if (!read_json(res, reader, j, &raw)) return;
  // Disaggregation: the front's kv_transfer_params (server/disagg.h), taken out before the body is parsed.
  json kvp;
  if (auto it = j.find("kv_transfer_params"); it != j.end()) {
    if (opts.role == Role::kBoth)
      return reply_error(res, 400,
                         "'kv_transfer_params' needs a server started with --role prefill or --role decode (this one "
                         "runs --role both)",
                         "kv_transfer_params");
    kvp = std::move(*it);
    j.erase(it);
  }
  const bool export_kv = opts.role == Role::kPrefill && !kvp.is_null();
  const bool import_kv = opts.role == Role::kDecode && !kvp.is_null();
  if (export_kv && !(kvp.is_object() && kvp.size() == 1 && kvp.value("do_remote_decode", json()) == true))
    return reply_error(res, 400, "'kv_transfer_params' of a request to a prefill instance must be {\"do_remote_decode\": true}",
                       "kv_transfer_params");
  engine::RequestLimits rl;
  rl.max_messages = opts.max_messages;
  rl.max_parts = opts.max_content_parts;
  auto parsed = engine::parse_chat_request(j, *model, rl, opts.mm_max_pixels);
  if (!parsed.ok()) return reply_status(res, parsed.status());
  engine::ChatRequest& cr = *parsed;
  keep_key_order(cr, raw);
  std::string().swap(raw);
  // The prefill step answers the front in one response; the client's stream comes from the decode instance.
  if (export_kv && cr.stream)
    return reply_error(res, 400,
                       "'stream' is not supported by a prefill instance (unsupported field 'stream' with "
                       "kv_transfer_params {\"do_remote_decode\": true}): the decode instance streams",
                       "stream");
  std::optional<RemotePrefill> remote;
  if (import_kv) {
    auto checked = check_signature(std::move(kvp), opts.kv_secret);
    if (!checked.ok()) return reply_status(res, checked.status());
    auto rp = RemotePrefill::from_json(*checked);
    if (!rp.ok()) return reply_status(res, rp.status());
    if (Status st = check_geometry(rp->kv, model->config.text); !st.is_ok()) return reply_status(res, st);
    // A request that does not match its params is refused, and the offer dropped now (not at --kv-hold-s).
    const char* param = nullptr;
    std::string why;
    if (static_cast<int64_t>(rp->first_tokens.size()) != cr.n) {
      param = "n";
      why = "'n' = " + std::to_string(cr.n) + " but the prefill instance sampled " +
            std::to_string(rp->first_tokens.size()) + " first tokens: send the same request to both";
    } else if (cr.sampling.logprobs && rp->first_logprobs.size() != rp->first_tokens.size()) {
      param = "logprobs";
      why = "'logprobs' is set but the prefill instance sent no log-probabilities of the first tokens: send the same "
            "request to both";
    } else if (cr.sampling.prompt_logprobs >= 0 && rp->prompt_logprobs.empty() && rp->prompt_ids.size() > 1) {
      param = "prompt_logprobs";
      why = "'prompt_logprobs' is set but the prefill instance sent none: send the same request to both";
    }
    if (param != nullptr) {
      this->reader->release(rp->handle);
      return reply_error(res, 400, why, param);
    }
    remote = std::move(rp).value();
  }
  // A request refused before its K/V is read lets the prefill instance drop the offer now (not at --kv-hold-s).
  auto drop_offer = [&] {
    if (remote) this->reader->release(remote->handle);
  };
  if (Status st = check_image_sources(cr.messages, opts.allow_local_files); !st.is_ok()) {
    drop_offer();
    return reply_status(res, st);
  }

  engine::PromptOptions po;
  po.allow_local_files = opts.allow_local_files;
  po.max_images = opts.max_images;
  po.max_image_pixels = opts.max_image_pixels;
  po.max_request_pixels = opts.max_request_pixels;
  po.cancelled = [this, conn] { return stopping.load() || (conn && conn->client_gone()); };
  Result<engine::Prompt> prompt = engine::Prompt();
  std::shared_ptr<const model::KvSnapshot> imported;
  if (remote) {
    // The prompt as the prefill instance ran it; its K/V is read from there (no template, image or prefill work).
    prompt->ids = remote->prompt_ids;
    prompt->rope_delta = remote->rope_delta;
    if (Status st = check_length(static_cast<int64_t>(prompt->ids.size()), cr); !st.is_ok()) {
      drop_offer();
      return reply_status(res, st);
    }
    auto kv = read_kv(*remote);
    if (!kv.ok()) return reply_error(res, 503, kv.status().message());
    imported = std::move(kv).value();
  } else {
    // Everything that bounds the work, before any pixel is decoded: image headers, template, token count.
    auto plan = engine::plan_prompt(*model, cr, po);
    if (!plan.ok()) return reply_status(res, plan.status());
    if (Status st = check_length(plan->min_prompt_tokens, cr); !st.is_ok()) return reply_status(res, st);
    prompt = engine::finish_prompt(*model, cr, std::move(plan).value(), po);
  }
  // A client gone (or a server stopping) while the images were prepared: nothing goes to the engine.
  if (po.cancelled()) {
    res.set_header("Connection", "close");
    return reply_error(res, 503, "the request was cancelled while its images were prepared");
  }
  if (!prompt.ok()) return reply_status(res, prompt.status());
  const int64_t n_prompt = static_cast<int64_t>(prompt->ids.size());
  if (Status st = check_length(n_prompt, cr); !st.is_ok()) return reply_status(res, st);

  Job job;
  job.include_usage = cr.include_usage;
  job.logprobs = cr.sampling.logprobs;
  job.prompt_logprobs = cr.sampling.prompt_logprobs >= 0;
  job.token_ids = cr.return_tokens_as_token_ids;
  job.reasoning_field = reasoning;
  job.parse.reasoning = reasoning;
  job.parse.reasoning_open = reasoning && prompt_opens_think(prompt->ids);
  job.parse.tools = cr.parse_tool_calls();
  job.parse.parallel_tool_calls = cr.parallel_tool_calls;
  if (cr.constraint.active()) {
    // A reasoning model may think before the constrained reply: an optional think block, or the rest of the one the
    // prompt opened; none when the prompt closed it (thinking turned off).
    grammar::ThinkPrefix think = grammar::ThinkPrefix::kNone;
    if (reasoning)
      think = job.parse.reasoning_open ? grammar::ThinkPrefix::kOpen
              : prompt_closes_think(prompt->ids) ? grammar::ThinkPrefix::kNone
                                                 : grammar::ThinkPrefix::kOptional;
    auto g = engine::output_grammar(*model, cr.constraint, think);
    if (!g.ok()) return reply_status(res, g.status());
    cr.sampling.grammar = *g;
  }
  job.parsers.assign(static_cast<size_t>(cr.n), engine::ChatOutputParser(job.parse));
  const int64_t first = next_id.load();
  job.cid = CompletionId{"chatcmpl-" + hex(id_prefix, 16) + hex(static_cast<uint64_t>(first), 8), unix_seconds(),
                         model_name};
  // n choices of one prompt: the first prefills it, the others take its full blocks from the prefix cache (the
  // engine admits them once those are computed); the prompt is counted once in usage, as OpenAI does.
  job.usage.prompt_tokens = n_prompt;
  job.n = cr.n;
  for (int64_t v : prompt->visual_tokens_before) job.usage.visual_tokens_before += v;
  for (int64_t v : prompt->visual_tokens_after) job.usage.visual_tokens_after += v;
  if (remote) {
    job.usage.cached_tokens = remote->cached_tokens;  // the engine adds its own (none: the prompt is not run here)
    job.remote_prompt_logprobs = remote->prompt_logprobs;
    job.usage.visual_tokens_before = remote->visual_tokens_before;
    job.usage.visual_tokens_after = remote->visual_tokens_after;
  }
  if (export_kv) {
    job.export_kv = true;
    job.prompt_ids = prompt->ids;
    job.rope_delta = prompt->rope_delta;
  }
  std::vector<ChoiceSpec> choices(static_cast<size_t>(cr.n));
  for (int64_t i = 0; i < cr.n; ++i) {
    if (i + 1 < cr.n) choices[i].prompt = *prompt;
    else choices[i].prompt = std::move(prompt).value();
    choices[i].sampling = engine::choice_sampling(cr.sampling, i);
    if (export_kv) {
      // The prefill instance samples each choice's first token only (the request's max_tokens was checked above);
      // the prompt's K/V is the same for every choice and is exported once.
      choices[i].sampling.max_tokens = 1;
      choices[i].sampling.min_tokens = std::min<int64_t>(choices[i].sampling.min_tokens, 1);
      choices[i].export_kv = i == 0;
    }
    if (remote) {
      // The prompt ran on the prefill instance: its log-probabilities come from there (job.remote_prompt_logprobs).
      choices[i].sampling.prompt_logprobs = -1;
      choices[i].kv = imported;
      choices[i].first_token = remote->first_tokens[static_cast<size_t>(i)];
      if (!remote->first_logprobs.empty()) choices[i].first_logprob = remote->first_logprobs[static_cast<size_t>(i)];
    }
  }
  submit(job, std::move(choices), cr.sere, received_ms);
  if (!cr.stream) return respond_whole(res, job);
  respond_stream(res, std::make_shared<Job>(std::move(job)));
}

void Server::Impl::handle_completions(httplib::Response& res, const httplib::ContentReader& reader) {
  const double received_ms = now_ms();
  json j;
  if (!read_json(res, reader, j)) return;
  auto parsed = engine::parse_completion_request(j, *model);
  if (!parsed.ok()) return reply_status(res, parsed.status());
  engine::CompletionRequest& cr = *parsed;
  for (const auto& p : cr.prompts)
    if (Status st = check_length(static_cast<int64_t>(p.size()), cr, /*chat=*/false); !st.is_ok())
      return reply_status(res, st);
  Job job;
  job.text_completion = true;
  job.include_usage = cr.include_usage;
  job.logprobs = cr.sampling.logprobs;
  job.prompt_logprobs = cr.sampling.prompt_logprobs >= 0;
  job.token_ids = cr.return_tokens_as_token_ids;
  job.cid = CompletionId{"cmpl-" + hex(id_prefix, 16) + hex(static_cast<uint64_t>(next_id.load()), 8), unix_seconds(),
                         model_name};
  // Prompt p's choices are p * n .. p * n + n - 1, choice j seeded with seed + j; every prompt counted once.
  job.n = cr.n;
  std::vector<ChoiceSpec> choices;
  for (const auto& p : cr.prompts) {
    job.usage.prompt_tokens += static_cast<int64_t>(p.size());
    for (int64_t i = 0; i < cr.n; ++i) {
      ChoiceSpec c;
      c.prompt = engine::token_prompt(p);
      c.sampling = engine::choice_sampling(cr.sampling, i);
      choices.push_back(std::move(c));
    }
  }
  submit(job, std::move(choices), cr.sere, received_ms);
  if (!cr.stream) return respond_whole(res, job);
  respond_stream(res, std::make_shared<Job>(std::move(job)));
}

void Server::Impl::handle_tokenize(httplib::Response& res, const httplib::ContentReader& reader) {
  json j;
  std::string raw;
  if (!read_json(res, reader, j, &raw)) return;
  if (!j.is_object()) return reply_error(res, 400, "the request body must be a JSON object");
  auto flag = [&](const char* key, bool dflt, bool& out) -> bool {
    out = dflt;
    if (!j.contains(key) || j[key].is_null()) return true;
    if (!j[key].is_boolean()) {
      reply_error(res, 400, std::string("'") + key + "' must be a boolean", key);
      return false;
    }
    out = j[key].get<bool>();
    return true;
  };
  bool token_strs = false, add_special = true;
  if (!flag("return_token_strs", false, token_strs)) return;
  std::vector<int32_t> ids;
  const bool has_prompt = j.contains("prompt") && !j["prompt"].is_null();
  const bool has_messages = j.contains("messages") && !j["messages"].is_null();
  if (has_prompt == has_messages) return reply_error(res, 400, "give either 'prompt' (a string) or 'messages'", "prompt");
  if (has_prompt) {
    if (!flag("add_special_tokens", true, add_special)) return;
    if (!j["prompt"].is_string()) return reply_error(res, 400, "'prompt' must be a string", "prompt");
    // Qwen tokenizers add no special tokens of their own (no BOS), so add_special_tokens changes nothing.
    ids = model->tokenizer.encode(j["prompt"].get_ref<const std::string&>(), /*parse_special=*/true);
  } else {
    // The chat template as /v1/chat/completions renders it (generation prompt included); text messages only.
    json body = {{"messages", j["messages"]}};
    if (j.contains("chat_template_kwargs")) body["chat_template_kwargs"] = j["chat_template_kwargs"];
    for (const char* key : {"add_generation_prompt", "continue_final_message", "tools", "chat_template"})
      if (j.contains(key)) body[key] = j[key];
    engine::RequestLimits rl;
    rl.max_messages = opts.max_messages;
    rl.max_parts = opts.max_content_parts;
    auto cr = engine::parse_chat_request(body, *model, rl, opts.mm_max_pixels);
    if (!cr.ok()) return reply_status(res, cr.status());
    keep_key_order(*cr, raw);
    engine::PromptOptions po;
    po.allow_local_files = false;
    po.max_images = 0;
    auto plan = engine::plan_prompt(*model, *cr, po);
    if (!plan.ok()) {
      const Status& st = plan.status();
      if (st.message().rfind("too many images", 0) == 0)
        return reply_error(res, 400, "messages: /tokenize takes text messages only (no images)", "messages");
      return reply_status(res, st);
    }
    ids = std::move(plan->ids);
  }
  json out = {{"count", ids.size()}, {"max_model_len", loop->max_context()}, {"tokens", ids}, {"token_strs", nullptr}};
  if (token_strs) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(model->tokenizer.token_bytes(id));
    out["token_strs"] = std::move(strs);
  }
  res.set_content(dump_json(out), kJson);
}

void Server::Impl::handle_detokenize(httplib::Response& res, const httplib::ContentReader& reader) {
  json j;
  if (!read_json(res, reader, j)) return;
  if (!j.is_object() || !j.contains("tokens") || !j["tokens"].is_array())
    return reply_error(res, 400, "'tokens' must be an array of token ids", "tokens");
  const int64_t n = model->tokenizer.size();
  std::vector<int32_t> ids;
  for (const json& e : j["tokens"]) {
    bool ok = e.is_number_integer();
    if (ok && e.is_number_unsigned()) ok = e.get<uint64_t>() < static_cast<uint64_t>(n);
    else if (ok) ok = e.get<int64_t>() >= 0 && e.get<int64_t>() < n;
    if (!ok) return reply_error(res, 400, "'tokens' must hold token ids in [0, " + std::to_string(n) + ")", "tokens");
    ids.push_back(static_cast<int32_t>(e.get<int64_t>()));
  }
  res.set_content(dump_json({{"prompt", model->tokenizer.decode(ids)}}), kJson);
}

void Server::Impl::submit(Job& job, std::vector<ChoiceSpec> choices, bool sere, double received_ms) {
  const int n = static_cast<int>(choices.size());
  job.channel = std::make_shared<RequestChannel>(n);
  job.sent_role.assign(n, 0);
  job.text_offset.assign(n, 0);
  job.ids.clear();
  for (int i = 0; i < n; ++i) {
    const int64_t id = next_id.fetch_add(1);
    job.ids.push_back(id);
    Usage usage;  // this choice's prompt, for its metrics
    usage.prompt_tokens = static_cast<int64_t>(choices[i].prompt.ids.size());
    for (int64_t v : choices[i].prompt.visual_tokens_before) usage.visual_tokens_before += v;
    for (int64_t v : choices[i].prompt.visual_tokens_after) usage.visual_tokens_after += v;
    engine::Request er;
    er.id = id;
    er.prompt = std::move(choices[i].prompt);
    er.sampling = std::move(choices[i].sampling);
    er.sere = sere;
    er.export_kv = choices[i].export_kv;
    er.kv = std::move(choices[i].kv);
    er.first_token = choices[i].first_token;
    er.first_logprob = std::move(choices[i].first_logprob);
    auto channel = job.channel;
    er.on_update = [this, channel, i, received_ms, usage](const std::string& delta, const engine::RequestOutput& out,
                                                          bool finished) {
      if (finished) {
        FinishedRequest f;
        f.finish_reason = engine::finish_reason_name(out.finish);
        f.prompt_tokens = usage.prompt_tokens;
        f.generation_tokens = static_cast<int64_t>(out.token_ids.size());
        f.visual_tokens_before = usage.visual_tokens_before;
        f.visual_tokens_after = usage.visual_tokens_after;
        if (out.first_token_ms > 0) f.time_to_first_token_s = (out.first_token_ms - received_ms) / 1000.0;
        if (f.generation_tokens > 1)
          f.time_per_output_token_s = (out.finish_ms - out.first_token_ms) / 1000.0 / (f.generation_tokens - 1);
        f.e2e_latency_s = (out.finish_ms - received_ms) / 1000.0;
        if (out.first_scheduled_ms > 0) f.queue_time_s = (out.first_scheduled_ms - out.arrival_ms) / 1000.0;
        metrics.record_finished(f);
      }
      channel->push(i, delta, out, finished);
    };
    loop->submit(std::move(er), [this, channel](const Status& st) {
      metrics.record_rejected(http_status_for(st));
      channel->reject(st);
    });
  }
}

void Server::Impl::abort_all(const Job& job) {
  for (int64_t id : job.ids) loop->abort(id);
}

// The body (and status) of a non-streaming response from the request's final update.
std::pair<int, std::string> Server::Impl::whole_body(const ChannelUpdate& u, const Job& job, const json& extra) const {
  if (!u.rejected.is_ok()) {
    // Counted as rejected by the submit callback already.
    const int status = http_status_for(u.rejected);
    return {status, dump_json(error_body(status, u.rejected.message(), error_param(u.rejected.message())))};
  }
  Usage usage = job.usage;
  json choices = json::array();
  for (const ChoiceUpdate& c : u.choices) {
    const engine::RequestOutput& out = c.output;
    if (out.finish == engine::FinishReason::kError)
      return {500, dump_json(error_body(500, "generation failed: " + out.error))};
    if (out.finish == engine::FinishReason::kAbort)
      return {503, dump_json(error_body(503, "the request was aborted: the server is shutting down"))};
    usage.completion_tokens += static_cast<int64_t>(out.token_ids.size());
    if (c.index % job.n == 0) usage.cached_tokens += out.cached_tokens;  // each prompt counted once
    if (job.text_completion) {
      int64_t offset = 0;
      choices.push_back(text_choice_json(
          c.index, out.text, openai_finish_reason(out.finish),
          job.logprobs ? text_logprobs_json(out.logprobs, model->tokenizer, job.token_ids, offset) : json()));
      if (job.prompt_logprobs) choices.back()["prompt_logprobs"] = prompt_logprobs_json(prompt_lps(job, out), model->tokenizer);
    } else {
      const engine::ParsedMessage m = engine::parse_chat_output(out.text, job.parse);
      choices.push_back(chat_choice_json(
          c.index, chat_message_json(m, job.reasoning_field),
          m.tool_calls.empty() ? openai_finish_reason(out.finish) : "tool_calls",
          job.logprobs ? chat_logprobs_json(out.logprobs, model->tokenizer, job.token_ids) : json()));
    }
  }
  if (job.text_completion) return {200, dump_json(text_completion_json(job.cid, choices, &usage, false))};
  json body = completion_json(job.cid, choices, usage);
  for (const auto& [k, v] : extra.items()) body[k] = v;
  // Chat: one prompt, its log-probabilities at the top level (vLLM's place for them).
  if (job.prompt_logprobs && !u.choices.empty())
    body["prompt_logprobs"] = prompt_logprobs_json(prompt_lps(job, u.choices.front().output), model->tokenizer);
  return {200, dump_json(body)};
}

Result<json> Server::Impl::offer_kv(const ChannelUpdate& u, const Job& job) {
  const engine::RequestOutput& out = u.choices.front().output;  // choice 0 exported the prompt's K/V
  if (!out.kv || (!out.kv->bytes && !out.kv->device_data)) return internal_error("the prefill produced no K/V to offer");
  std::vector<int32_t> firsts(u.choices.size(), -1);
  std::vector<engine::TokenLogprob> lps(job.logprobs ? u.choices.size() : 0);
  for (const ChoiceUpdate& c : u.choices) {
    if (c.index < 0 || c.index >= static_cast<int>(firsts.size()) || c.output.token_ids.size() != 1)
      return internal_error("a choice of the prefill did not sample exactly one token");
    firsts[c.index] = c.output.token_ids.front();
    if (job.logprobs) {
      if (c.output.logprobs.size() != 1) return internal_error("a choice of the prefill has no log-probabilities");
      lps[c.index] = c.output.logprobs.front();
    }
  }
  RemotePrefill rp;
  if (out.kv->device_data != nullptr) {
    // CUDA IPC: the decode instance maps the device copy; the UCX offer of no bytes keeps it alive until released.
    ZEST_ASSIGN_OR_RETURN(rp.cuda_ipc, model::cuda_ipc_export(*out.kv));
    struct Holder {
      std::shared_ptr<const model::KvSnapshot> kv;
      std::vector<uint8_t> none;
    };
    auto holder = std::make_shared<Holder>();
    holder->kv = out.kv;
    ZEST_ASSIGN_OR_RETURN(rp.handle, offerer->offer(std::shared_ptr<const std::vector<uint8_t>>(holder, &holder->none)));
  } else {
    ZEST_ASSIGN_OR_RETURN(rp.handle, offerer->offer(out.kv->bytes));
  }
  rp.kv = *out.kv;
  rp.kv.bytes.reset();
  rp.prompt_ids = job.prompt_ids;
  rp.rope_delta = job.rope_delta;
  rp.first_tokens = std::move(firsts);
  rp.first_logprobs = std::move(lps);
  if (job.prompt_logprobs) rp.prompt_logprobs = out.prompt_logprobs;
  rp.cached_tokens = out.cached_tokens;
  rp.visual_tokens_before = job.usage.visual_tokens_before;
  rp.visual_tokens_after = job.usage.visual_tokens_after;
  return sign_params(rp.to_json(), opts.kv_secret);
}

Result<std::shared_ptr<const model::KvSnapshot>> Server::Impl::read_kv(const RemotePrefill& rp) {
  if (!rp.cuda_ipc.empty()) {
    auto imported = model::cuda_ipc_import(rp.cuda_ipc, rp.kv);
    reader->release(rp.handle);  // copied (or failed): the prefill instance can free its device copy
    if (!imported.ok()) return imported.status().with_context("reading the prompt's K/V from the prefill instance");
    return std::shared_ptr<const model::KvSnapshot>(std::make_shared<model::KvSnapshot>(std::move(imported).value()));
  }
  auto snap = std::make_shared<model::KvSnapshot>(rp.kv);
  snap->bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(rp.kv.expected_bytes()));
  Status st = reader->read(rp.handle, snap->bytes->data(), opts.kv_read_timeout_s);
  if (!st.is_ok()) return st.with_context("reading the prompt's K/V from the prefill instance");
  return std::shared_ptr<const model::KvSnapshot>(std::move(snap));
}

void Server::Impl::respond_whole(httplib::Response& res, const Job& job) {
  // The handler runs on its connection's thread, so it can look at the socket while it waits: a client that
  // went away (whatever encoding it accepted) has its request aborted within one interval.
  const auto interval = std::chrono::milliseconds(opts.stream_keepalive_ms);
  Connection* conn = current_connection();
  ChannelUpdate u;
  while (!job.channel->wait_final_for(u, interval)) {
    if (conn && conn->client_gone()) {
      abort_all(job);
      job.channel->wait_final_for(u, std::chrono::seconds(60));
      res.set_header("Connection", "close");
      res.status = 499;  // nginx's "client closed request"; nobody reads it
      return;
    }
  }
  // A refused choice refuses the request: the others stop.
  if (!u.rejected.is_ok()) abort_all(job);
  json extra;
  if (job.export_kv && u.rejected.is_ok() && !u.choices.empty()) {
    bool all_done = true;  // every choice ended by stop or length (not by an error or an abort)
    for (const ChoiceUpdate& c : u.choices)
      all_done = all_done && (c.output.finish == engine::FinishReason::kStop ||
                              c.output.finish == engine::FinishReason::kLength);
    if (all_done) {
      auto params = offer_kv(u, job);
      if (!params.ok()) return reply_status(res, params.status());
      extra["kv_transfer_params"] = std::move(params).value();
    }
  }
  auto [status, body] = whole_body(u, job, extra);
  res.status = status;
  res.set_content(body, kJson);
}

bool Server::Impl::stream_step(Job& job, httplib::DataSink& sink) {
  ChannelUpdate u;
  if (!job.channel->take(u, std::chrono::milliseconds(opts.stream_keepalive_ms))) {
    static const std::string kKeepAlive = ": keep-alive\n\n";
    return sink.write(kKeepAlive.data(), kKeepAlive.size());
  }
  std::string out;
  bool last = false;
  if (!u.rejected.is_ok()) {
    out += sse_event(error_body(http_status_for(u.rejected), u.rejected.message(), error_param(u.rejected.message())));
    last = true;
  } else {
    for (const ChoiceUpdate& c : u.choices) {
      const int i = c.index;
      if (job.text_completion) {
        const engine::FinishReason fr = c.finished ? c.output.finish : engine::FinishReason::kNone;
        if (fr == engine::FinishReason::kError || fr == engine::FinishReason::kAbort) {
          out += sse_event(fr == engine::FinishReason::kError
                               ? error_body(500, "generation failed: " + c.output.error)
                               : error_body(503, "the request was aborted: the server is shutting down"));
          last = true;
          break;
        }
        if (c.delta.empty() && c.logprobs.empty() && !c.finished) continue;
        json lp = job.logprobs ? text_logprobs_json(c.logprobs, model->tokenizer, job.token_ids, job.text_offset[i])
                               : json();
        json choice = text_choice_json(i, c.delta, c.finished ? openai_finish_reason(fr) : "", std::move(lp));
        out += sse_event(text_completion_json(job.cid, json::array({std::move(choice)}), nullptr,
                                              job.include_usage));
        continue;
      }
      if (!job.sent_role[i] && (c.tokens > 0 || c.finished)) {
        out += sse_event(chunk_json(job.cid, i, {{"role", "assistant"}, {"content", ""}}, "", job.include_usage));
        job.sent_role[i] = 1;
      }
      // The parser splits the text into reasoning, content and tool calls; the logprobs of this update's tokens go
      // with its first chunk.
      const engine::FinishReason fr = c.finished ? c.output.finish : engine::FinishReason::kNone;
      engine::ChatOutputParser& parser = job.parsers[i];
      std::vector<engine::ChatDelta> pieces;
      if (!c.delta.empty()) parser.feed(c.delta, pieces);
      if (fr == engine::FinishReason::kStop || fr == engine::FinishReason::kLength) parser.finish(pieces);
      json lp = job.logprobs && !c.logprobs.empty() ? chat_logprobs_json(c.logprobs, model->tokenizer, job.token_ids)
                                                    : json();
      for (const engine::ChatDelta& d : pieces)
        for (json& delta : chat_delta_json(d)) {
          out += sse_event(chunk_json(job.cid, i, delta, "", job.include_usage, lp));
          lp = nullptr;
        }
      if (!lp.is_null()) out += sse_event(chunk_json(job.cid, i, {{"content", ""}}, "", job.include_usage, lp));
      if (!c.finished) continue;
      if (fr == engine::FinishReason::kError) {
        out += sse_event(error_body(500, "generation failed: " + c.output.error));
        last = true;
        break;
      }
      if (fr == engine::FinishReason::kAbort) {
        out += sse_event(error_body(503, "the request was aborted: the server is shutting down"));
        last = true;
        break;
      }
      out += sse_event(chunk_json(job.cid, i, json::object(),
                                  parser.message().tool_calls.empty() ? openai_finish_reason(fr) : "tool_calls",
                                  job.include_usage));
    }
    if (!last && u.finished) {
      if (job.include_usage) {
        Usage usage = job.usage;
        for (const ChoiceUpdate& c : job.channel->wait_final().choices) {
          usage.completion_tokens += static_cast<int64_t>(c.output.token_ids.size());
          if (c.index % job.n == 0) usage.cached_tokens += c.output.cached_tokens;
        }
        out += sse_event(job.text_completion ? text_completion_json(job.cid, json::array(), &usage, false)
                                             : usage_chunk_json(job.cid, usage));
      }
      last = true;
    }
  }
  if (last) out += "data: [DONE]\n\n";
  if (!out.empty() && !sink.write(out.data(), out.size())) return false;
  if (last) sink.done();
  return true;
}

void Server::Impl::respond_stream(httplib::Response& res, std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(streams_mu);
    ++open_streams;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, job](size_t, httplib::DataSink& sink) {
        try {
          return stream_step(*job, sink);
        } catch (const std::exception& e) {
          std::cerr << "zest serve: stream of request " << job->cid.id << " failed: " << e.what() << "\n";
          return false;
        }
      },
      [this, job](bool) {
        // The response is gone (finished, or the client disconnected): stop generating for it.
        if (!job->channel->closed() || job->channel->size() > 1) abort_all(*job);
        std::lock_guard<std::mutex> lock(streams_mu);
        if (--open_streams == 0) streams_cv.notify_all();
      });
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { stop(); }

Result<std::unique_ptr<Server>> Server::start(std::shared_ptr<engine::ModelBundle> model, ServerOptions opts) {
  if (!model) return invalid_argument("no model loaded");
  if (opts.port < 0 || opts.port > 65535) return invalid_argument("--port must be in [0, 65535]");
  if (opts.max_body_bytes <= 0) return invalid_argument("--max-body-bytes must be positive");
  if (opts.max_images < 0) return invalid_argument("--max-images must not be negative");
  if (opts.stream_keepalive_ms <= 0) return invalid_argument("the stream keep-alive interval must be positive");
  for (const auto& [value, flag] : {std::pair{opts.max_json_depth, "--max-json-depth"},
                                    std::pair{opts.max_messages, "--max-messages"},
                                    std::pair{opts.max_content_parts, "--max-content-parts"},
                                    std::pair{opts.max_image_pixels, "--max-image-pixels"},
                                    std::pair{opts.max_request_pixels, "--max-request-pixels"},
                                    std::pair<int64_t, const char*>{opts.keep_alive_timeout_s, "--keep-alive-timeout"},
                                    std::pair<int64_t, const char*>{opts.request_read_timeout_s,
                                                                    "--request-read-timeout"},
                                    std::pair<int64_t, const char*>{opts.idle_read_timeout_s, "--idle-read-timeout"}})
    if (value <= 0) return invalid_argument(std::string(flag) + " must be positive");
  if (opts.mm_max_pixels < 0) return invalid_argument("--mm-max-pixels must not be negative");
  if (opts.max_connections_per_client < 0) return invalid_argument("--max-connections-per-client must not be negative");
  if (opts.engine.max_num_seqs <= 0) return invalid_argument("--max-num-seqs must be positive");
  if (opts.engine.max_batched_tokens <= 0) return invalid_argument("--max-batched-tokens must be positive");
  if (opts.engine.max_context < 0) return invalid_argument("--max-context must not be negative");
  if (opts.engine.kv_blocks < 0) return invalid_argument("--kv-blocks must not be negative");

  // A client that disconnects must not kill the process through SIGPIPE on the next write.
  std::signal(SIGPIPE, SIG_IGN);

  auto impl = std::make_unique<Impl>();
  impl->model = model;
  impl->opts = opts;
  impl->model_name = opts.served_model_name;
  if (impl->model_name.empty()) impl->model_name = std::filesystem::path(model->dir).filename().string();
  if (impl->model_name.empty()) impl->model_name = std::filesystem::path(model->dir).parent_path().filename().string();
  impl->created = unix_seconds();
  impl->id_prefix = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(impl->created);
  if (opts.reasoning_parser != "auto" && opts.reasoning_parser != "qwen3" && opts.reasoning_parser != "none")
    return invalid_argument("--reasoning-parser must be auto, qwen3 or none");
  impl->think_open_id = model->tokenizer.token_to_id("<think>");
  impl->think_close_id = model->tokenizer.token_to_id("</think>");
  impl->im_start_id = model->tokenizer.token_to_id("<|im_start|>");
  const bool has_tags = impl->think_open_id >= 0 && impl->think_close_id >= 0;
  if (opts.reasoning_parser == "qwen3" && !has_tags)
    return invalid_argument("--reasoning-parser qwen3: the tokenizer has no <think> / </think> tokens");
  impl->reasoning = opts.reasoning_parser == "qwen3" ||
                    (opts.reasoning_parser == "auto" && has_tags && model->chat_template == text::TemplateKind::kQwen3);
  engine::EngineOptions eo = opts.engine;
  eo.kv_export_on_device = opts.role == Role::kPrefill && opts.kv_transfer == KvTransfer::kCudaIpc;
  impl->loop = std::make_unique<EngineLoop>(model, eo);
  if (opts.role != Role::kBoth && opts.kv_secret.size() < 16)
    return invalid_argument(std::string("--role ") + role_name(opts.role) +
                            " needs --kv-secret (or ZEST_KV_SECRET) of at least 16 characters, the same on the prefill "
                            "and decode instances: the decode instance reads only K/V whose params a prefill instance "
                            "signed with it");
  if (opts.role == Role::kPrefill) {
    if (!(opts.kv_hold_s > 0)) return invalid_argument("--kv-hold-s must be positive");
    if (opts.kv_transfer == KvTransfer::kCudaIpc && model->decoder().backend() != model::Backend::kCuda)
      return invalid_argument("--kv-transfer cuda-ipc needs the CUDA backend (--device cuda)");
    auto o = transfer::Offerer::start(opts.kv_hold_s);
    if (!o.ok()) return o.status().with_context("starting the K/V transfer agent (--role prefill)");
    impl->offerer = std::move(o).value();
  }
  if (opts.role == Role::kDecode) {
    if (!(opts.kv_read_timeout_s > 0)) return invalid_argument("--kv-read-timeout-s must be positive");
    auto r = transfer::Reader::start();
    if (!r.ok()) return r.status().with_context("starting the K/V transfer agent (--role decode)");
    impl->reader = std::move(r).value();
  }
  if (impl->offerer || impl->reader) {
    Impl* p = impl.get();
    impl->metrics.add_provider([p](std::string& out) {
      transfer_metrics(p->offerer ? p->offerer->stats() : p->reader->stats(), out);
    });
  }

  impl->http = std::make_unique<HttpServer>(impl->connection_limits());
  impl->http->configure(impl->http_threads(), static_cast<size_t>(opts.max_body_bytes));
  impl->routes();
  ZEST_ASSIGN_OR_RETURN(impl->port, impl->http->bind(opts.host, opts.port));
  impl->loop->start();
  if (Status st = impl->http->listen_on(impl->listener); !st.is_ok()) {
    impl->loop->stop();
    return st;
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const { return impl_->port; }
int Server::connections_from(const std::string& ip) const { return impl_->http->connections_from(ip); }

const std::string& Server::model_name() const { return impl_->model_name; }

void Server::stop() {
  if (!impl_) return;
  std::lock_guard<std::mutex> lock(impl_->stop_mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->stopping = true;
  // Ending the engine first finishes every request, so handler threads waiting on one return; open
  // streams get a bounded time to write their last event before the listener shuts down.
  impl_->loop->stop();
  {
    std::unique_lock<std::mutex> lock(impl_->streams_mu);
    impl_->streams_cv.wait_for(lock, std::chrono::seconds(10), [&] { return impl_->open_streams == 0; });
  }
  impl_->http->stop();
  if (impl_->listener.joinable()) impl_->listener.join();
}

void Server::add_metrics_provider(MetricsProvider provider) { impl_->metrics.add_provider(std::move(provider)); }

engine::EngineStats Server::stats() const { return impl_->loop->stats(); }

}  // namespace zest::server
