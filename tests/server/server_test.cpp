// End-to-end tests of `zest serve` in-process on a free loopback port with the tiny fixture models.
// References: the same request bodies run through engine::generate_one directly (one request on a
// fresh engine, no server); greedy decoding, so server text and token counts must equal them exactly.
// The CPU decoder computes every row independently of the batch it is in, so this also holds for
// requests batched together.
#include <atomic>
#include <fstream>
#include <random>
#include <thread>
#include <map>
#include <set>

#include "server_test_util.h"

namespace zest::server::testing {
namespace {

json image_body(int n_images, const std::string& url, int64_t max_tokens) {
  json content = json::array();
  for (int i = 0; i < n_images; ++i) content.push_back({{"type", "image_url"}, {"image_url", {{"url", url}}}});
  content.push_back({{"type", "text"}, {"text", "Describe the chart."}});
  return {{"messages", json::array({{{"role", "user"}, {"content", content}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"mm_processor_kwargs", {{"min_pixels", 32 * 32}, {"max_pixels", 128 * 128}}}};
}

class ServerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ServerOptions o;
    o.engine.max_num_seqs = 8;
    o.engine.max_context = 2048;
    o.max_body_bytes = 256 << 10;
    o.max_images = 2;
    o.stream_keepalive_ms = 50;
    srv_ = start_server(GetParam(), o);
    ASSERT_TRUE(srv_);
    cli_ = client(*srv_);
  }
  void TearDown() override {
    if (cli_) {
      auto m = wait_metrics(*cli_, idle);
      EXPECT_EQ(m["zest_kv_blocks_used"], 0) << "KV blocks left in use after the test";
    }
  }
  std::unique_ptr<Server> srv_;
  std::unique_ptr<httplib::Client> cli_;
};

TEST_P(ServerTest, PlainCompletionMatchesEngine) {
  const json body = chat_body("Name three colors.", 12);
  int64_t n_prompt = 0;
  const engine::RequestOutput ref = reference_output(GetParam(), body, &n_prompt);
  HttpReply r = post_json(*cli_, body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json& j = r.j;
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["model"], srv_->model_name());
  EXPECT_TRUE(j["created"].is_number_integer());
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], ref.text);
  EXPECT_EQ(j["choices"][0]["finish_reason"], engine::finish_reason_name(ref.finish));
  EXPECT_EQ(j["usage"]["prompt_tokens"], n_prompt);
  EXPECT_EQ(j["usage"]["completion_tokens"], static_cast<int64_t>(ref.token_ids.size()));
  EXPECT_EQ(j["usage"]["total_tokens"], n_prompt + static_cast<int64_t>(ref.token_ids.size()));
  EXPECT_EQ(j["usage"]["visual_tokens_before"], 0);
  EXPECT_EQ(j["usage"]["visual_tokens_after"], 0);

  auto m = wait_metrics(*cli_, idle);
  EXPECT_EQ(m["zest_prompt_tokens_total"], n_prompt);
  EXPECT_EQ(m["zest_generation_tokens_total"], static_cast<double>(ref.token_ids.size()));
  EXPECT_EQ(finished_total(m), 1);
  EXPECT_EQ(m["zest_time_to_first_token_seconds_count"], 1);
  EXPECT_EQ(m["zest_e2e_request_latency_seconds_count"], 1);
  EXPECT_EQ(m["zest_request_queue_time_seconds_count"], 1);
  EXPECT_EQ(m["zest_e2e_request_latency_seconds_bucket{le=\"+Inf\"}"], 1);
}

TEST_P(ServerTest, StreamingMatchesNonStreaming) {
  json body = chat_body("Count from one to five.", 10);
  body["ignore_eos"] = true;
  int64_t n_prompt = 0;
  const engine::RequestOutput ref = reference_output(GetParam(), body, &n_prompt);
  body["stream"] = true;
  StreamReply r = post_stream(*cli_, body.dump());
  ASSERT_EQ(r.status, 200) << r.error_body;
  EXPECT_EQ(r.content_type.rfind("text/event-stream", 0), 0u);
  StreamParts p = split_stream(r);
  ASSERT_GE(p.chunks.size(), 2u);
  EXPECT_TRUE(p.done_last);
  EXPECT_EQ(p.chunks.front()["choices"][0]["delta"]["role"], "assistant");
  for (const json& c : p.chunks) {
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["id"], p.chunks.front()["id"]);
    EXPECT_FALSE(c.contains("usage")) << "usage appears only with stream_options.include_usage";
  }
  for (size_t i = 0; i + 1 < p.chunks.size(); ++i) EXPECT_TRUE(p.chunks[i]["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(p.chunks.back()["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(p.content, ref.text);

  // include_usage: every chunk has "usage": null, then one chunk with no choices and the usage.
  body["stream_options"] = {{"include_usage", true}};
  r = post_stream(*cli_, body.dump());
  ASSERT_EQ(r.status, 200) << r.error_body;
  p = split_stream(r);
  ASSERT_GE(p.chunks.size(), 3u);
  EXPECT_TRUE(p.done_last);
  const json& last = p.chunks.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["prompt_tokens"], n_prompt);
  EXPECT_EQ(last["usage"]["completion_tokens"], 10);
  EXPECT_EQ(last["usage"]["total_tokens"], n_prompt + 10);
  for (size_t i = 0; i + 1 < p.chunks.size(); ++i) EXPECT_TRUE(p.chunks[i]["usage"].is_null());
  EXPECT_EQ(p.chunks[p.chunks.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(p.content, ref.text);
}

// logprobs / top_logprobs: the engine's values (the model's raw log-softmax, checked against the formula in the engine
// tests and against `zest logits` in the openai-client test) in the OpenAI shape, non-streaming and streamed (the
// chunks' entries add up to the whole response's); absent (null) when not asked for.
TEST_P(ServerTest, LogprobsInTheOpenAIShape) {
  json body = chat_body("Count from one to five.", 6);
  body["ignore_eos"] = true;
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  const engine::RequestOutput ref = reference_output(GetParam(), body);
  ASSERT_EQ(ref.logprobs.size(), 6u);
  HttpReply r = post_json(*cli_, body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json& content = r.j["choices"][0]["logprobs"]["content"];
  ASSERT_TRUE(content.is_array());
  ASSERT_EQ(content.size(), 6u);
  const auto m = fixture_model(GetParam());
  for (size_t i = 0; i < content.size(); ++i) {
    SCOPED_TRACE("token " + std::to_string(i));
    const json& c = content[i];
    const std::string b = m->tokenizer.token_bytes(ref.logprobs[i].token);
    ASSERT_EQ(c["bytes"].size(), b.size());
    for (size_t k = 0; k < b.size(); ++k) EXPECT_EQ(c["bytes"][k], static_cast<int>(static_cast<unsigned char>(b[k])));
    EXPECT_TRUE(c["token"].is_string());
    EXPECT_EQ(c["logprob"].get<double>(), static_cast<double>(ref.logprobs[i].logprob));
    EXPECT_LE(c["logprob"].get<double>(), 0.0);
    ASSERT_EQ(c["top_logprobs"].size(), 3u);
    for (size_t k = 0; k < 3; ++k)
      EXPECT_EQ(c["top_logprobs"][k]["logprob"].get<double>(), static_cast<double>(ref.logprobs[i].top[k].second));
    // Greedy: the token is the most likely one.
    EXPECT_EQ(c["top_logprobs"][0]["logprob"], c["logprob"]);
  }
  body["stream"] = true;
  StreamReply s = post_stream(*cli_, body.dump());
  ASSERT_EQ(s.status, 200) << s.error_body;
  json streamed = json::array();
  for (const json& ch : split_stream(s).chunks) {
    const json& lp = ch["choices"][0]["logprobs"];
    if (lp.is_object())
      for (const json& e : lp["content"]) streamed.push_back(e);
  }
  EXPECT_EQ(streamed, content);
  body.erase("logprobs");
  body.erase("top_logprobs");
  body.erase("stream");
  r = post_json(*cli_, body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_TRUE(r.j["choices"][0]["logprobs"].is_null());
}

// n > 1: n choices, choice i sampled as a single request with seed + i would be (each choice is an engine request
// with its own seed stream), the prompt counted once in usage, streamed per choice index; logprobs per choice.
TEST_P(ServerTest, NChoicesHaveTheirOwnSeedStreams) {
  json body = chat_body("Name three colors.", 5);
  body["temperature"] = 1.0;
  body["seed"] = 1234;
  body["ignore_eos"] = true;
  body["n"] = 3;
  body["logprobs"] = true;
  HttpReply r = post_json(*cli_, body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j["choices"].size(), 3u);
  int64_t n_prompt = 0;
  std::set<std::string> texts;
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE("choice " + std::to_string(i));
    json one = body;
    one.erase("n");
    one["seed"] = 1234 + i;
    const engine::RequestOutput ref = reference_output(GetParam(), one, &n_prompt);
    const json& c = r.j["choices"][i];
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(c["message"]["content"], ref.text);
    EXPECT_EQ(c["finish_reason"], "length");
    EXPECT_EQ(c["logprobs"]["content"].size(), 5u);
    texts.insert(ref.text);
  }
  EXPECT_EQ(texts.size(), 3u) << "three seeds, three different samples";
  EXPECT_EQ(r.j["usage"]["prompt_tokens"], n_prompt);
  EXPECT_EQ(r.j["usage"]["completion_tokens"], 15);
  // Streamed: every choice has its role chunk, its content and its finish chunk; the usage counts all of them.
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  StreamReply s = post_stream(*cli_, body.dump());
  ASSERT_EQ(s.status, 200) << s.error_body;
  StreamParts p = split_stream(s);
  EXPECT_TRUE(p.done_last);
  std::map<int, std::string> content;
  std::map<int, int> roles, finishes;
  for (const json& ch : p.chunks) {
    if (ch["choices"].empty()) continue;
    const json& c = ch["choices"][0];
    const int i = c["index"];
    if (c["delta"].contains("role")) ++roles[i];
    if (c["delta"].contains("content")) content[i] += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) ++finishes[i];
  }
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(roles[i], 1) << i;
    EXPECT_EQ(finishes[i], 1) << i;
    EXPECT_EQ(content[i], r.j["choices"][i]["message"]["content"]) << i;
  }
  EXPECT_EQ(p.chunks.back()["usage"]["completion_tokens"], 15);
  EXPECT_EQ(p.chunks.back()["usage"]["prompt_tokens"], n_prompt);
}

// The engine's output for a token-id prompt (text positions), greedy or seeded as `sp` says.
engine::RequestOutput token_reference(const std::string& model, const std::vector<int32_t>& ids,
                                      const engine::SamplingParams& sp) {
  engine::Request req;
  req.prompt = engine::token_prompt(ids);
  req.sampling = sp;
  auto out = engine::generate_one(fixture_model(model), std::move(req));
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? *out : engine::RequestOutput{};
}

// prompt_logprobs (vLLM's extension): one entry per prompt token, null first, then the prompt token's and the top
// alternatives' {logprob, rank, decoded_token} under their ids, equal to the engine's values; per choice for text
// completions, at the top level for chat. Refused with stream and above 20.
TEST_P(ServerTest, PromptLogprobsInVllmsShape) {
  const auto m = fixture_model(GetParam());
  const std::vector<int32_t> ids = m->tokenizer.encode("The capital of France is", true);
  engine::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 2;
  sp.ignore_eos = true;
  sp.prompt_logprobs = 2;
  const engine::RequestOutput ref = token_reference(GetParam(), ids, sp);
  ASSERT_EQ(ref.prompt_logprobs.size(), ids.size() - 1);
  json body = {{"prompt", ids}, {"max_tokens", 2}, {"temperature", 0}, {"ignore_eos", true}, {"prompt_logprobs", 2}};
  HttpReply r = post_json(*cli_, body.dump(), "/v1/completions");
  ASSERT_EQ(r.status, 200) << r.body;
  const json& pl = r.j["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(pl.size(), ids.size());
  EXPECT_TRUE(pl[0].is_null());
  for (size_t i = 1; i < ids.size(); ++i) {
    SCOPED_TRACE("prompt token " + std::to_string(i));
    const engine::TokenLogprob& e = ref.prompt_logprobs[i - 1];
    const json& d = pl[i];
    ASSERT_TRUE(d.contains(std::to_string(ids[i])));
    const json& own = d[std::to_string(ids[i])];
    EXPECT_EQ(own["logprob"].get<double>(), static_cast<double>(e.logprob));
    EXPECT_EQ(own["rank"], e.rank);
    EXPECT_GE(e.rank, 1);
    EXPECT_EQ(own["decoded_token"], m->tokenizer.token_bytes(ids[i]));
    for (size_t k = 0; k < e.top.size(); ++k) {
      const json& t = d[std::to_string(e.top[k].first)];
      EXPECT_EQ(t["logprob"].get<double>(), static_cast<double>(e.top[k].second));
      if (e.top[k].first != ids[i]) {
        EXPECT_EQ(t["rank"], static_cast<int64_t>(k) + 1);
      }
    }
    EXPECT_EQ(d.size(), e.top.size() + 1 - (std::any_of(e.top.begin(), e.top.end(),
                                                        [&](const auto& t) { return t.first == ids[i]; }) ? 1 : 0));
  }
  // Chat: at the top level, one entry per prompt token.
  json chat = chat_body("Count from one to five.", 2);
  chat["prompt_logprobs"] = 0;
  r = post_json(*cli_, chat.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_TRUE(r.j["prompt_logprobs"].is_array());
  EXPECT_EQ(static_cast<int64_t>(r.j["prompt_logprobs"].size()), r.j["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(r.j["prompt_logprobs"][1].size(), 1u);  // 0 alternatives: the prompt token alone
  chat["stream"] = true;
  r = post_json(*cli_, chat.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("prompt_logprobs"), std::string::npos) << r.body;
  body["prompt_logprobs"] = 21;
  r = post_json(*cli_, body.dump(), "/v1/completions");
  EXPECT_EQ(r.status, 400);
}

// POST /v1/completions: a string prompt is the tokenizer's ids, a token-id prompt is taken as it is, lists of either
// give one choice per prompt (times n, choice p * n + j seeded with seed + j), each equal to the engine run on its
// own; logprobs in the legacy shape; streaming adds up to the whole response.
TEST_P(ServerTest, TextCompletions) {
  const auto m = fixture_model(GetParam());
  const std::string text = "The capital of France is";
  const std::vector<int32_t> ids = m->tokenizer.encode(text, true);
  engine::SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 5;
  sp.ignore_eos = true;
  sp.logprobs = true;
  sp.top_logprobs = 2;
  const engine::RequestOutput ref = token_reference(GetParam(), ids, sp);
  ASSERT_EQ(ref.logprobs.size(), 5u);
  json body = {{"prompt", text}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 2}};
  HttpReply r = post_json(*cli_, body.dump(), "/v1/completions");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j["object"], "text_completion");
  EXPECT_EQ(r.j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ASSERT_EQ(r.j["choices"].size(), 1u);
  const json& c = r.j["choices"][0];
  EXPECT_EQ(c["text"], ref.text);
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(r.j["usage"]["prompt_tokens"], static_cast<int64_t>(ids.size()));
  EXPECT_EQ(r.j["usage"]["completion_tokens"], 5);
  const json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u);
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  ASSERT_EQ(lp["top_logprobs"].size(), 5u);
  int64_t offset = 0;
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(lp["token_logprobs"][i].get<double>(), static_cast<double>(ref.logprobs[i].logprob));
    EXPECT_EQ(lp["text_offset"][i], offset);
    offset += static_cast<int64_t>(m->tokenizer.token_bytes(ref.token_ids[i]).size());
    EXPECT_GE(lp["top_logprobs"][i].size(), 1u);
    EXPECT_LE(lp["top_logprobs"][i].size(), 3u);  // the top 2 and the sampled token
  }
  // The same prompt as token ids; then a list of both with n = 2 (greedy: all four choices alike).
  body["prompt"] = ids;
  body.erase("logprobs");
  r = post_json(*cli_, body.dump(), "/v1/completions");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j["choices"][0]["text"], ref.text);
  EXPECT_TRUE(r.j["choices"][0]["logprobs"].is_null());
  const std::vector<int32_t> other = {ids[0], ids[1]};
  sp.logprobs = false;
  const engine::RequestOutput ref2 = token_reference(GetParam(), other, sp);
  body["prompt"] = json::array({json(text), json(other)});
  body["n"] = 2;
  r = post_json(*cli_, body.dump(), "/v1/completions");
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.j["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r.j["choices"][i]["index"], i);
    EXPECT_EQ(r.j["choices"][i]["text"], i < 2 ? ref.text : ref2.text) << i;
  }
  EXPECT_EQ(r.j["usage"]["prompt_tokens"], static_cast<int64_t>(ids.size() + other.size()));
  EXPECT_EQ(r.j["usage"]["completion_tokens"], 20);
  // Sampled with a seed: choice j of a prompt is the engine run with seed + j.
  body = {{"prompt", ids}, {"max_tokens", 4}, {"temperature", 1.0}, {"top_p", 1.0}, {"top_k", 0},
          {"seed", 99},   {"n", 2},          {"ignore_eos", true}};
  r = post_json(*cli_, body.dump(), "/v1/completions");
  ASSERT_EQ(r.status, 200) << r.body;
  for (int j = 0; j < 2; ++j) {
    engine::SamplingParams s2;
    s2.temperature = 1.0;
    s2.seed = 99 + j;
    s2.max_tokens = 4;
    s2.ignore_eos = true;
    EXPECT_EQ(r.j["choices"][j]["text"], token_reference(GetParam(), ids, s2).text) << j;
  }
  // Streaming: text chunks per choice, a finish_reason on each choice's last chunk, the usage chunk, [DONE].
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  StreamReply st = post_stream(*cli_, body.dump(), nullptr, "/v1/completions");
  ASSERT_EQ(st.status, 200) << st.error_body;
  StreamParts p = split_stream(st);
  EXPECT_TRUE(p.done_last);
  std::map<int, std::string> texts;
  std::map<int, int> finishes;
  for (const json& ch : p.chunks) {
    EXPECT_EQ(ch["object"], "text_completion");
    if (ch["choices"].empty()) continue;
    EXPECT_TRUE(ch["usage"].is_null());
    const json& cc = ch["choices"][0];
    texts[cc["index"]] += cc["text"].get<std::string>();
    if (!cc["finish_reason"].is_null()) ++finishes[cc["index"]];
  }
  for (int j = 0; j < 2; ++j) {
    EXPECT_EQ(texts[j], r.j["choices"][j]["text"]) << j;
    EXPECT_EQ(finishes[j], 1) << j;
  }
  EXPECT_EQ(p.chunks.back()["usage"]["completion_tokens"], 8);
}

// POST /tokenize and /detokenize in vLLM's shapes: a prompt's ids are the tokenizer's, messages give the chat
// template's ids (what /v1/chat/completions feeds the model), and detokenize inverts tokenize.
TEST_P(ServerTest, TokenizeAndDetokenize) {
  const auto m = fixture_model(GetParam());
  HttpReply r = post_json(*cli_, json({{"prompt", "Hello world, again."}, {"return_token_strs", true}}).dump(),
                          "/tokenize");
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<int32_t> ids = m->tokenizer.encode("Hello world, again.", true);
  EXPECT_EQ(r.j["tokens"], ids);
  EXPECT_EQ(r.j["count"], static_cast<int64_t>(ids.size()));
  EXPECT_EQ(r.j["max_model_len"], 2048);
  ASSERT_EQ(r.j["token_strs"].size(), ids.size());
  EXPECT_EQ(r.j["token_strs"][1], m->tokenizer.token_bytes(ids[1]));
  HttpReply d = post_json(*cli_, json({{"tokens", ids}}).dump(), "/detokenize");
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(d.j["prompt"], "Hello world, again.");
  const json chat = chat_body("Name three colors.", 4);
  int64_t n_prompt = 0;
  reference_output(GetParam(), chat, &n_prompt);
  r = post_json(*cli_, json({{"messages", chat["messages"]}}).dump(), "/tokenize");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j["count"], n_prompt);
  EXPECT_TRUE(r.j["token_strs"].is_null());
}

TEST_P(ServerTest, ModelsHealthAndMetricsEndpoints) {
  HttpReply models = get(*cli_, "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.j["object"], "list");
  ASSERT_EQ(models.j["data"].size(), 1u);
  EXPECT_EQ(models.j["data"][0]["id"], GetParam());
  EXPECT_EQ(models.j["data"][0]["max_model_len"], 2048);
  HttpReply health = get(*cli_, "/health");
  ASSERT_EQ(health.status, 200);
  EXPECT_EQ(health.j["status"], "ok");
  EXPECT_EQ(health.j["kv_blocks_used"], 0);
  EXPECT_GT(health.j["kv_blocks_total"].get<int64_t>(), 0);
  auto res = cli_->Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->get_header_value("Content-Type").rfind("text/plain", 0), 0u);
  for (const char* name :
       {"zest_time_to_first_token_seconds", "zest_time_per_output_token_seconds", "zest_e2e_request_latency_seconds",
        "zest_request_queue_time_seconds"})
    EXPECT_NE(res->body.find(std::string("# TYPE ") + name + " histogram"), std::string::npos) << name;
  for (const char* name : {"zest_prompt_tokens_total", "zest_generation_tokens_total",
                           "zest_visual_tokens_before_total", "zest_visual_tokens_after_total", "zest_requests_total",
                           "zest_engine_decode_steps_total", "zest_engine_decode_step_seconds_total",
                           "zest_engine_decode_forward_seconds_total", "zest_engine_decode_intervals_total",
                           "zest_engine_decode_interval_seconds_total"})
    EXPECT_NE(res->body.find(std::string("# TYPE ") + name + " counter"), std::string::npos) << name;
  for (const char* name :
       {"zest_requests_running", "zest_requests_waiting", "zest_kv_cache_usage_ratio", "zest_kv_blocks_used"})
    EXPECT_NE(res->body.find(std::string("# TYPE ") + name + " gauge"), std::string::npos) << name;
}

// A decoder that can run no more steps (a split decoder whose GPU failed and whose collectives were aborted).
class LostDecoder final : public model::TextDecoder {
 public:
  explicit LostDecoder(std::shared_ptr<model::TextDecoder> d) : d_(std::move(d)) {}
  model::Backend backend() const override { return d_->backend(); }
  const io::TextConfig& config() const override { return d_->config(); }
  Result<model::PagedKVCache> allocate_cache(int64_t blocks, int64_t block_size) const override {
    return d_->allocate_cache(blocks, block_size);
  }
  Result<Tensor> forward(const model::ForwardBatch&, model::PagedKVCache&, const model::MoeHooks*) const override {
    return health();
  }
  Status health() const override { return internal_error("the decoder lost a GPU (test)"); }

 private:
  std::shared_ptr<model::TextDecoder> d_;
};

// Such a decoder: a chat gets 500 naming why, and /health answers 503 "unhealthy" with the reason (so that an
// orchestrator restarts the instance) instead of "ok". Mutation: /health without the decoder's health says 200.
TEST(ServerHealth, ADecoderThatCanRunNoMoreStepsMakesTheInstanceUnhealthy) {
  auto loaded = engine::ModelBundle::load((std::filesystem::path(ZEST_FIXTURES_DIR) / "models" / "qwen3_tiny").string());
  ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
  std::shared_ptr<engine::ModelBundle> m = *loaded;
  m->text_decoder = std::make_shared<LostDecoder>(m->text_decoder);
  ServerOptions opts;
  opts.host = "127.0.0.1";
  opts.port = 0;
  auto s = Server::start(m, opts);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  auto c = client(**s);
  HttpReply r = post_json(*c, chat_body("Hello", 4).dump());
  EXPECT_EQ(r.status, 500) << r.body;
  EXPECT_NE(r.body.find("lost a GPU"), std::string::npos) << r.body;
  HttpReply h = get(*c, "/health");
  EXPECT_EQ(h.status, 503) << h.body;
  EXPECT_EQ(h.j["status"], "unhealthy") << h.body;
  EXPECT_NE(h.j.value("error", std::string()).find("lost a GPU"), std::string::npos) << h.body;
}

// A second request with the same long prompt takes its full blocks from the prefix cache: the same answer, its
// cached tokens in usage (OpenAI's prompt_tokens_details), hits and queries in /metrics.
TEST_P(ServerTest, RepeatedPromptReportsCachedTokens) {
  const json body = chat_body(std::string(200, 'z') + " Name three colors.", 6);
  int64_t n_prompt = 0;
  const engine::RequestOutput ref = reference_output(GetParam(), body, &n_prompt);
  ASSERT_GT(n_prompt, 32);
  HttpReply a = post_json(*cli_, body.dump());
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  HttpReply b = post_json(*cli_, body.dump());
  ASSERT_EQ(b.status, 200) << b.body;
  EXPECT_EQ(b.j["choices"][0]["message"]["content"], ref.text);
  const int64_t cached = (n_prompt - 1) / 16 * 16;
  EXPECT_EQ(b.j["usage"]["prompt_tokens_details"]["cached_tokens"], cached);
  auto m = wait_metrics(*cli_, idle);
  EXPECT_EQ(m["zest_prefix_cache_queries_total"], 2 * n_prompt);
  EXPECT_EQ(m["zest_prefix_cache_hits_total"], cached);
  EXPECT_NEAR(m["zest_prefix_cache_hit_rate"], static_cast<double>(cached) / (2.0 * n_prompt), 1e-9);
  EXPECT_GT(m["zest_prefix_cache_blocks"], 0);
}

TEST_P(ServerTest, ConcurrentClientsGetTheirOwnAnswers) {
  constexpr int kClients = 32;
  std::vector<json> bodies;
  std::vector<engine::RequestOutput> refs;
  std::mt19937 rng(7);
  for (int i = 0; i < kClients; ++i) {
    json b = chat_body("Request number " + std::to_string(i) + ": say something about " +
                           std::to_string(rng() % 100000) + ".",
                       3 + static_cast<int64_t>(rng() % 6));
    refs.push_back(reference_output(GetParam(), b));
    bodies.push_back(std::move(b));
  }
  std::vector<std::string> got(kClients);
  std::vector<int> status(kClients, 0);
  std::vector<std::string> errors(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      auto c = client(*srv_);
      json b = bodies[i];
      if (i % 2) {
        b["stream"] = true;
        StreamReply r = post_stream(*c, b.dump());
        status[i] = r.status;
        errors[i] = httplib::to_string(r.error);
        got[i] = split_stream(r).content;
      } else {
        HttpReply r = post_json(*c, b.dump());
        status[i] = r.status;
        errors[i] = httplib::to_string(r.error);
        if (r.status == 200) got[i] = r.j["choices"][0]["message"]["content"];
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(status[i], 200) << "client " << i << ": " << errors[i];
    EXPECT_EQ(got[i], refs[i].text) << "client " << i;
  }
  auto m = wait_metrics(*cli_, idle);
  EXPECT_EQ(finished_total(m), kClients);
}

TEST_P(ServerTest, DisconnectMidStreamAbortsTheRequest) {
  // The request could run to the context limit (about 2000 tokens); the client leaves after 3 events.
  json body = chat_body("Write a very long story.", 2000);
  body["ignore_eos"] = true;
  body["stream"] = true;
  StreamReply r = post_stream(*cli_, body.dump(), [](const std::vector<std::string>& ev) { return ev.size() < 3; });
  EXPECT_EQ(r.status, 200);
  EXPECT_FALSE(r.transport_ok) << "the client cancelled, so the transfer must not complete";
  auto m = wait_metrics(*cli_, [](auto& m) { return idle(m) && finished_total(m) == 1; });
  EXPECT_EQ(m["zest_requests_total{finish_reason=\"abort\"}"], 1);
  EXPECT_EQ(m["zest_requests_total{finish_reason=\"length\"}"], 0);
  EXPECT_EQ(m["zest_kv_blocks_used"], 0);
  EXPECT_LT(m["zest_generation_tokens_total"], 1000) << "the abort must stop generation early";
  // The server keeps serving.
  HttpReply ok = post_json(*cli_, chat_body("Hello", 2).dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST_P(ServerTest, DisconnectDuringNonStreamingRequestAbortsIt) {
  // A non-streaming request that could run to the context limit; its client accepts gzip (as the official
  // OpenAI client does) and hangs up once the request runs. The waiting handler looks at its connection
  // once per keep-alive interval (20 ms here) and aborts the request.
  ServerOptions o;
  o.engine.max_num_seqs = 2;
  o.engine.max_context = 2048;
  o.stream_keepalive_ms = 20;
  auto s = start_server(GetParam(), o);
  ASSERT_TRUE(s);
  json body = chat_body("Write a very long story.", 2000);
  body["ignore_eos"] = true;
  auto mc = client(*s);
  {
    RawConnection c(s->port());
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c.send(raw_post(body.dump(), "Accept-Encoding: gzip, deflate, br\r\n")));
    auto m = wait_metrics(*mc, [](auto& m) { return m["zest_requests_running"] == 1; });
    ASSERT_EQ(m["zest_requests_running"], 1);
  }
  auto m = wait_metrics(*mc, [](auto& m) { return idle(m) && finished_total(m) == 1; });
  EXPECT_EQ(m["zest_requests_total{finish_reason=\"abort\"}"], 1);
  EXPECT_EQ(m["zest_kv_blocks_used"], 0);
  EXPECT_LT(m["zest_generation_tokens_total"], 2000) << "the abort must stop generation early";
  // A request the client waits for longer than an interval gets a plain JSON reply.
  json ok_body = chat_body("Write a very long story.", 200);
  ok_body["ignore_eos"] = true;
  HttpReply ok = post_json(*mc, ok_body.dump());
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.j["usage"]["completion_tokens"], 200);
  EXPECT_EQ(ok.j["choices"][0]["finish_reason"], "length");
}

TEST_P(ServerTest, DisconnectWhileQueuedAbortsTheRequest) {
  // One sequence at a time: the second request waits behind the first and only gets keep-alive
  // comments; its client leaves on the first one. The keep-alive write is how the server notices.
  ServerOptions o;
  o.engine.max_num_seqs = 1;
  o.engine.max_context = 2048;
  o.stream_keepalive_ms = 20;
  auto one = start_server(GetParam(), o);
  ASSERT_TRUE(one);
  json long_body = chat_body("Write a very long story.", 2000);
  long_body["ignore_eos"] = true;
  long_body["stream"] = true;
  std::atomic<bool> first_started{false};
  std::thread first([&] {
    auto c = client(*one);
    // Leaves once the second request has been refused its slot and dropped (checked below).
    post_stream(*c, long_body.dump(), [&](const std::vector<std::string>& ev) {
      if (!ev.empty()) first_started = true;
      auto mc = client(*one);
      auto m = metrics(*mc);
      return m["zest_requests_total{finish_reason=\"abort\"}"] < 1;
    });
  });
  auto mc = client(*one);
  wait_metrics(*mc, [&](auto&) { return first_started.load(); });
  ASSERT_TRUE(first_started.load());
  auto c2 = client(*one);
  StreamReply second = post_stream(*c2, long_body.dump(), [](const std::vector<std::string>&) { return false; });
  EXPECT_EQ(second.status, 200);
  EXPECT_TRUE(second.events.empty()) << "the queued request must not have produced tokens";
  first.join();
  auto m = wait_metrics(*mc, [](auto& m) { return idle(m) && finished_total(m) == 2; });
  EXPECT_EQ(m["zest_requests_total{finish_reason=\"abort\"}"], 2);
  EXPECT_EQ(m["zest_kv_blocks_used"], 0);
}

struct BadCase {
  std::string name, body;
  int status;
  std::string param;     // expected error.param ("" = any)
  std::string message;   // a substring of error.message
};

TEST_P(ServerTest, BadInputsGetOpenAIErrors) {
  const std::string big(300 << 10, 'a');
  std::vector<BadCase> cases = {
      {"malformed JSON", "{\"messages\": [", 400, "", "not valid JSON"},
      {"not an object", "[1, 2]", 400, "", "JSON object"},
      {"messages not an array", R"({"messages": "hi"})", 400, "messages", "non-empty array"},
      {"empty messages", R"({"messages": []})", 400, "messages", "non-empty array"},
      {"unknown role", R"({"messages": [{"role": "wizard", "content": "hi"}]})", 400, "messages", "wizard"},
      {"content wrong type", R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages", "content"},
      {"temperature wrong type", R"({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"})", 400,
       "temperature", "number"},
      {"negative max_tokens", R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -1})", 400,
       "max_tokens", "max_tokens"},
      {"stream wrong type", R"({"messages": [{"role": "user", "content": "hi"}], "stream": "yes"})", 400, "stream",
       "boolean"},
      {"n = 129", R"({"messages": [{"role": "user", "content": "hi"}], "n": 129})", 400, "n", "'n' must be in"},
      {"presence_penalty out of range", R"({"messages": [{"role": "user", "content": "hi"}], "presence_penalty": 3})",
       400, "presence_penalty", "[-2"},
      {"model wrong type", R"({"model": 3, "messages": [{"role": "user", "content": "hi"}]})", 400, "model", "string"},
      {"unknown model", R"({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]})", 404, "model",
       "gpt-9"},
      {"body over the limit", R"({"messages": [{"role": "user", "content": ")" + big + "\"}]}", 413, "",
       "--max-body-bytes"},
  };
  // A prompt longer than the 2048-token context (every " a" is a token of its own or more).
  std::string long_text;
  for (int i = 0; i < 5000; ++i) long_text += " zq" + std::to_string(i);
  cases.push_back({"prompt over the context", chat_body(long_text, 4).dump(), 400, "messages", "context"});

  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    HttpReply r = post_json(*cli_, c.body);
    EXPECT_EQ(r.status, c.status) << r.body;
    ASSERT_TRUE(r.j.is_object() && r.j.contains("error")) << r.body;
    const json& e = r.j["error"];
    EXPECT_TRUE(e["message"].is_string());
    EXPECT_NE(e["message"].get<std::string>().find(c.message), std::string::npos) << e["message"];
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_EQ(e["code"], c.status);
    EXPECT_TRUE(e.contains("param"));
    if (!c.param.empty()) {
      EXPECT_EQ(e["param"], c.param);
    }
  }

  HttpReply r = get(*cli_, "/v1/nothing");
  EXPECT_EQ(r.status, 404);
  EXPECT_TRUE(r.j.contains("error")) << r.body;
  r = get(*cli_, "/v1/chat/completions");
  EXPECT_EQ(r.status, 405);
  EXPECT_TRUE(r.j.contains("error")) << r.body;
  r = post_json(*cli_, "{}", "/health");
  EXPECT_EQ(r.status, 405);
  EXPECT_TRUE(r.j.contains("error")) << r.body;

  auto m = wait_metrics(*cli_, idle);
  EXPECT_EQ(finished_total(m), 0) << "no bad request may reach the engine";
  // Still serving.
  HttpReply ok = post_json(*cli_, chat_body("Hello", 2).dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST_P(ServerTest, ImagesAsDataUrls) {
  auto model = fixture_model(GetParam());
  ASSERT_TRUE(model);
  const std::string url = chart_data_url();
  if (!model->config.vision) {
    // A text-only model refuses images with a 400 naming the part.
    HttpReply r = post_json(*cli_, image_body(1, url, 4).dump());
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("takes no images"), std::string::npos) << r.body;
    return;
  }
  ASSERT_TRUE(model->vision) << "the VL fixture must load its vision tower";
  const json body = image_body(1, url, 4);
  int64_t n_prompt = 0;
  const engine::RequestOutput ref = reference_output(GetParam(), body, &n_prompt);
  HttpReply r = post_json(*cli_, body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.j["choices"][0]["message"]["content"], ref.text);
  EXPECT_EQ(r.j["usage"]["prompt_tokens"], n_prompt);
  EXPECT_GT(r.j["usage"]["visual_tokens_before"].get<int64_t>(), 0);
  EXPECT_GT(r.j["usage"]["visual_tokens_after"].get<int64_t>(), 0);

  // Image errors: too many, undecodable, remote URL, local file without --allow-local-files.
  HttpReply many = post_json(*cli_, image_body(3, url, 4).dump());
  EXPECT_EQ(many.status, 400) << many.body;
  EXPECT_NE(many.body.find("too many images"), std::string::npos) << many.body;
  HttpReply broken = post_json(*cli_, image_body(1, "data:image/png;base64,iVBORw0KGgoAAAANSUhEUg==", 4).dump());
  EXPECT_EQ(broken.status, 400) << broken.body;
  HttpReply remote = post_json(*cli_, image_body(1, "https://example.com/a.png", 4).dump());
  EXPECT_EQ(remote.status, 400) << remote.body;
  EXPECT_NE(remote.body.find("remote"), std::string::npos) << remote.body;
  HttpReply local = post_json(
      *cli_, image_body(1, std::string(ZEST_SOURCE_DIR) + "/assets/images/chart_line_pew_pena_nieto.png", 4).dump());
  EXPECT_EQ(local.status, 400) << local.body;
  EXPECT_NE(local.body.find("--allow-local-files"), std::string::npos) << local.body;
}

TEST_P(ServerTest, RemoteImageUrlsAreRefused) {
  auto model = fixture_model(GetParam());
  ASSERT_TRUE(model);
  HttpReply r = post_json(*cli_, image_body(1, "http://127.0.0.1:1/x.png", 4).dump());
  EXPECT_EQ(r.status, 400) << r.body;
  ASSERT_TRUE(r.j.contains("error")) << r.body;
  EXPECT_EQ(r.j["error"]["param"], "messages");
}

// 1000 mixed requests (good, bad, cancelled) from 8 client threads after a warm-up of 200: the KV
// cache must be empty afterwards, the counters must add up, and RSS must not grow by more than
// 64 MiB between the end of the warm-up and the end of the soak.
TEST_P(ServerTest, SoakMixedRequests) {
  constexpr int kThreads = 8, kWarmup = 200, kSoak = 1000;
  constexpr int64_t kRssBound = 64ll << 20;
  const std::vector<std::string> bad = {
      "{\"messages\": [", R"({"messages": []})", R"({"messages": [{"role": "wizard", "content": "x"}]})",
      R"({"messages": [{"role": "user", "content": "x"}], "n": 0})",
      R"({"messages": [{"role": "user", "content": "x"}], "top_p": "high"})"};
  std::atomic<int> good{0}, rejected{0}, cancelled{0}, failures{0};
  auto run = [&](int total, int seed) {
    std::atomic<int> next{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        auto c = client(*srv_);
        std::mt19937 rng(seed * 100 + t);
        for (int i = next++; i < total; i = next++) {
          const int kind = static_cast<int>(rng() % 10);
          json body = chat_body("Soak request " + std::to_string(i), 2 + static_cast<int64_t>(rng() % 3));
          if (kind < 3) {
            HttpReply r = post_json(*c, body.dump());
            if (r.status == 200) ++good; else ++failures;
          } else if (kind < 6) {
            body["stream"] = true;
            body["stream_options"] = {{"include_usage", rng() % 2 == 0}};
            StreamReply r = post_stream(*c, body.dump());
            if (r.status == 200 && !r.events.empty() && r.events.back() == "[DONE]") ++good; else ++failures;
          } else if (kind < 8) {
            HttpReply r = post_json(*c, bad[rng() % bad.size()]);
            if (r.status == 400) ++rejected; else ++failures;
          } else {
            body["stream"] = true;
            body["ignore_eos"] = true;
            body["max_tokens"] = 1000;
            post_stream(*c, body.dump(), [](const std::vector<std::string>& ev) { return ev.empty(); });
            ++cancelled;
            c = client(*srv_);  // the cancelled connection is gone
          }
        }
      });
    for (auto& th : threads) th.join();
  };
  run(kWarmup, 1);
  auto m = wait_metrics(*cli_, [&](auto& m) { return idle(m) && finished_total(m) == good + cancelled; });
  ASSERT_EQ(failures.load(), 0);
  const int64_t rss_warm = rss_bytes();
  run(kSoak, 2);
  m = wait_metrics(*cli_, [&](auto& m) { return idle(m) && finished_total(m) == good + cancelled; });
  const int64_t rss_end = rss_bytes();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(good + rejected + cancelled, kWarmup + kSoak);
  EXPECT_EQ(m["zest_kv_blocks_used"], 0);
  EXPECT_EQ(m["zest_requests_running"], 0);
  EXPECT_EQ(finished_total(m), good + cancelled);
  EXPECT_EQ(m["zest_requests_rejected_total{status=\"400\"}"], rejected.load());
  EXPECT_EQ(m["zest_requests_total{finish_reason=\"error\"}"], 0);
  EXPECT_LE(rss_end - rss_warm, kRssBound) << "RSS grew from " << rss_warm << " to " << rss_end << " bytes";
  std::printf("soak: %d good, %d rejected, %d cancelled (%.0f aborted); RSS %.1f -> %.1f MiB\n", good.load(),
              rejected.load(), cancelled.load(), m["zest_requests_total{finish_reason=\"abort\"}"],
              rss_warm / 1048576.0, rss_end / 1048576.0);
}

INSTANTIATE_TEST_SUITE_P(TinyModels, ServerTest, ::testing::Values("qwen3_vl_moe_tiny", "qwen3_moe_tiny", "qwen3_tiny"));

TEST(ServerStop, StopEndsStreamsAndRefusesNewRequests) {
  ServerOptions o;
  o.engine.max_context = 2048;
  auto s = start_server("qwen3_moe_tiny", o);
  ASSERT_TRUE(s);
  json body = chat_body("Write a very long story.", 2000);
  body["ignore_eos"] = true;
  body["stream"] = true;
  std::atomic<bool> streaming{false};
  StreamReply r;
  std::thread t([&] {
    auto c = client(*s);
    r = post_stream(*c, body.dump(), [&](const std::vector<std::string>& ev) {
      if (!ev.empty()) streaming = true;
      return true;
    });
  });
  auto mc = client(*s);
  wait_metrics(*mc, [&](auto&) { return streaming.load(); });
  ASSERT_TRUE(streaming.load());
  s->stop();
  t.join();
  ASSERT_GE(r.events.size(), 2u);
  EXPECT_EQ(r.events.back(), "[DONE]");
  json err = json::parse(r.events[r.events.size() - 2], nullptr, false);
  ASSERT_TRUE(err.contains("error")) << r.events[r.events.size() - 2];
  EXPECT_EQ(err["error"]["code"], 503);
  EXPECT_EQ(s->stats().kv_blocks_used, 0);
  auto after = client(*s);
  EXPECT_FALSE(after->Get("/health")) << "a stopped server must not answer";
}

TEST(ServerStart, PortInUseIsAnError) {
  ServerOptions o;
  auto a = start_server("qwen3_moe_tiny", o);
  ASSERT_TRUE(a);
  ServerOptions o2;
  o2.host = "127.0.0.1";
  o2.port = a->port();
  auto b = Server::start(fixture_model("qwen3_moe_tiny"), o2);
  EXPECT_FALSE(b.ok());
}

}  // namespace
}  // namespace zest::server::testing
