// `zest serve` under hostile requests (issue 39): limits enforced before work, wrong types and
// unsupported fields refused with OpenAI-shaped 4xx, slow clients bounded, a generated fuzz run.
// Every test ends with the server still answering and the KV cache empty.
#include <random>
#include <thread>

#include "io/image.h"
#include "server_test_util.h"

namespace zest::server::testing {
namespace {

// The error object of an OpenAI-shaped 4xx reply; failures name `what`.
void expect_openai_error(const HttpReply& r, int status, const std::string& what) {
  EXPECT_EQ(r.status, status) << what << ": " << r.body;
  ASSERT_TRUE(r.j.is_object() && r.j.contains("error") && r.j["error"].is_object()) << what << ": " << r.body;
  const json& e = r.j["error"];
  EXPECT_TRUE(e["message"].is_string()) << what;
  EXPECT_EQ(e["type"], "invalid_request_error") << what;
  EXPECT_EQ(e["code"], r.status) << what;
  EXPECT_TRUE(e.contains("param")) << what;
}

json user_body(const json& content, int64_t max_tokens = 4) {
  return {{"messages", json::array({{{"role", "user"}, {"content", content}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

std::string jpeg_data_url(int64_t w, int64_t h) {
  io::Image img;
  img.width = w;
  img.height = h;
  img.rgb.assign(static_cast<size_t>(w * h * 3), 128);
  auto jpg = io::encode_jpeg(img, 50);
  EXPECT_TRUE(jpg.ok());
  return "data:image/jpeg;base64," + base64(std::string(jpg->begin(), jpg->end()));
}

// A PNG that is only a signature and an IHDR chunk claiming w x h: enough for the header, not an image.
std::string png_header_data_url(uint32_t w, uint32_t h) {
  std::string png = "\x89PNG\r\n\x1a\n";
  png += std::string("\0\0\0\x0dIHDR", 8);
  for (uint32_t v : {w, h})
    for (int s = 24; s >= 0; s -= 8) png += static_cast<char>((v >> s) & 0xFF);
  png += std::string("\x08\x02\0\0\0\0\0\0\0", 9);  // 8-bit RGB, no interlace; CRC not checked by the header read
  return "data:image/png;base64," + base64(png);
}

json image_part(const std::string& url) { return {{"type", "image_url"}, {"image_url", {{"url", url}}}}; }

class HostileTest : public ::testing::Test {
 protected:
  void start(const std::string& model, ServerOptions o = {}) {
    o.engine.max_num_seqs = 4;
    if (o.engine.max_context == 0) o.engine.max_context = 512;
    o.max_body_bytes = 8 << 20;
    o.stream_keepalive_ms = 50;
    srv_ = start_server(model, o);
    ASSERT_TRUE(srv_);
    cli_ = client(*srv_);
  }
  void TearDown() override {
    if (!cli_) return;
    HttpReply ok = post_json(*cli_, chat_body("Hello", 2).dump());
    EXPECT_EQ(ok.status, 200) << "the server must keep serving: " << ok.body;
    auto m = wait_metrics(*cli_, idle);
    EXPECT_EQ(m["zest_kv_blocks_used"], 0) << "KV blocks left in use after the test";
  }
  std::unique_ptr<Server> srv_;
  std::unique_ptr<httplib::Client> cli_;
};

TEST_F(HostileTest, DeepNestingIsRefusedBeforeParsing) {
  start("qwen3_vl_moe_tiny");
  const std::string deep(100000, '[');
  const std::string in_content = R"({"messages": [{"role": "user", "content": )" + deep + "]}";
  expect_openai_error(post_json(*cli_, in_content), 400, "nested content");
  const std::string in_tool_calls = R"({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "a", )"
                                    R"("type": "function", "function": {"name": "f", "arguments": )" +
                                    std::string(100000, '{') + "}}]}]}";
  HttpReply r = post_json(*cli_, in_tool_calls);
  expect_openai_error(r, 400, "nested tool call");
  EXPECT_NE(r.body.find("--max-json-depth"), std::string::npos) << r.body;
  // Brackets inside strings do not count.
  HttpReply ok = post_json(*cli_, user_body(std::string(150, '[') + std::string(150, '{')).dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
}

TEST_F(HostileTest, PixelSettingsAreBoundedByTheServers) {
  start("qwen3_vl_moe_tiny");
  json body = user_body(json::array({image_part(jpeg_data_url(64, 64)), {{"type", "text"}, {"text", "hi"}}}));
  for (const json& kw : {json{{"max_pixels", int64_t{1} << 50}}, json{{"min_pixels", int64_t{1} << 40}},
                         json{{"min_pixels", 1 << 20}, {"max_pixels", 1 << 16}}, json{{"max_pixels", "big"}},
                         json{{"max_pixels", -1}}, json{{"size", 3}}, json(5)}) {
    body["mm_processor_kwargs"] = kw;
    HttpReply r = post_json(*cli_, body.dump());
    expect_openai_error(r, 400, kw.dump());
    EXPECT_EQ(r.j["error"]["param"], "mm_processor_kwargs") << r.body;
  }
}

TEST_F(HostileTest, LargeImagesAreRefusedFromTheirHeaders) {
  ServerOptions o;
  o.max_image_pixels = 20'000'000;
  o.max_request_pixels = 30'000'000;
  start("qwen3_vl_moe_tiny", o);
  // 4000 x 4000 at the model's full size is ~15600 visual tokens, past the 512-token context: refused from
  // the header sizes, before decoding or the vision tower. Timed for the report, not asserted.
  const std::string big = jpeg_data_url(4000, 4000);
  const double t0 = now_ms();
  HttpReply r = post_json(*cli_, user_body(json::array({image_part(big)})).dump());
  const double ms = now_ms() - t0;
  expect_openai_error(r, 400, "4000x4000");
  EXPECT_NE(r.body.find("context"), std::string::npos) << r.body;
  std::printf("4000x4000 JPEG (%zu KB) answered 400 in %.0f ms\n", big.size() / 1024, ms);
  // Header sizes over the per-image and per-request pixel limits; a header with no image behind it.
  r = post_json(*cli_, user_body(json::array({image_part(png_header_data_url(100000, 100000))})).dump());
  expect_openai_error(r, 400, "100000x100000 header");
  EXPECT_NE(r.body.find("pixels"), std::string::npos) << r.body;
  r = post_json(*cli_, user_body(json::array({image_part(big), image_part(big)})).dump());
  expect_openai_error(r, 400, "two 16M-pixel images");
  EXPECT_NE(r.body.find("--max-request-pixels"), std::string::npos) << r.body;
  json small = user_body(json::array({image_part(png_header_data_url(64, 64))}));
  small["mm_processor_kwargs"] = {{"min_pixels", 32 * 32}, {"max_pixels", 128 * 128}};
  expect_openai_error(post_json(*cli_, small.dump()), 400, "header without pixel data");
}

TEST_F(HostileTest, MaxTokensIsCheckedAgainstTheContext) {
  start("qwen3_moe_tiny");
  HttpReply probe = post_json(*cli_, chat_body("Hello there", 1).dump());
  ASSERT_EQ(probe.status, 200) << probe.body;
  const int64_t n_prompt = probe.j["usage"]["prompt_tokens"];
  const int64_t room = 512 - n_prompt;
  HttpReply over = post_json(*cli_, chat_body("Hello there", room + 1).dump());
  expect_openai_error(over, 400, "max_tokens past the context");
  EXPECT_EQ(over.j["error"]["param"], "max_tokens");
  json huge = chat_body("Hello there", 1);
  huge["max_completion_tokens"] = int64_t{1} << 60;
  expect_openai_error(post_json(*cli_, huge.dump()), 400, "huge max_completion_tokens");
  json fits = chat_body("Hello there", room);
  fits["ignore_eos"] = true;
  HttpReply ok = post_json(*cli_, fits.dump());
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(ok.j["usage"]["total_tokens"], 512);
}

TEST_F(HostileTest, UnsupportedFieldsAreRefusedByName) {
  start("qwen3_moe_tiny");
  const std::vector<std::pair<std::string, json>> asks = {
      {"functions", json::array({{{"name", "f"}}})},
      {"min_p", 0.1},
      {"best_of", 2},
      {"guided_regex", "a+"},
      {"guided_grammar", "root ::= \"a\""},
      {"store", true},
      {"modalities", json::array({"text", "audio"})},
  };
  for (const auto& [name, value] : asks) {
    json body = chat_body("hi", 2);
    body[name] = value;
    HttpReply r = post_json(*cli_, body.dump());
    expect_openai_error(r, 400, name);
    EXPECT_EQ(r.j["error"]["param"], name) << r.body;
    EXPECT_NE(r.body.find("unsupported field '" + name + "'"), std::string::npos) << r.body;
  }
  // The values that ask for nothing pass, and so do fields zest has never heard of.
  json neutral = chat_body("hi", 2);
  neutral.update({{"logprobs", false}, {"tools", json::array()}, {"tool_choice", "none"},
                  {"response_format", {{"type", "text"}}}, {"min_p", 0}, {"best_of", 1}, {"n", 1}, {"user", "u1"},
                  {"some_future_field", {1, 2}}});
  HttpReply ok = post_json(*cli_, neutral.dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
  json n2 = chat_body("hi", 2);
  n2["n"] = 129;
  HttpReply many = post_json(*cli_, n2.dump());
  expect_openai_error(many, 400, "n = 129");
  EXPECT_EQ(many.j["error"]["param"], "n") << many.body;
}

TEST_F(HostileTest, WrongTypesGet400NamingTheField) {
  start("qwen3_vl_moe_tiny");
  struct Case {
    json patch;
    std::string param;
  };
  const std::vector<Case> cases = {
      {{{"stream_options", {{"include_usage", "yes"}}}}, "stream_options.include_usage"},
      {{{"chat_template_kwargs", {{"enable_thinking", "no"}}}}, "chat_template_kwargs.enable_thinking"},
      {{{"chat_template_kwargs", {{"tools_in_system", true}}}}, "chat_template_kwargs"},
      {{{"seed", 1.5}}, "seed"},
      {{{"stop_token_ids", {1, "2"}}}, "stop_token_ids"},
      {{{"stop_token_ids", 7}}, "stop_token_ids"},
      {{{"max_tokens", 18446744073709551615ull}}, "max_tokens"},
      {{{"vision_prune", {{"rate", "half"}}}}, ""},
      {{{"user", 5}}, "user"},
      {{{"parallel_tool_calls", "no"}}, "parallel_tool_calls"},
      {{{"tools", "get_weather"}}, "tools"},
      {{{"tools", {{{"type", "function"}, {"function", {{"name", std::string(65, 'a')}}}}}}}, "tools[0].function.name"},
      {{{"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", {1}}}}}}}},
       "tools[0].function.parameters"},
      {{{"tools", {{{"type", "code_interpreter"}}}}}, "tools[0].type"},
      {{{"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}, {"tool_choice", {{"type", "function"}}}},
       "tool_choice"},
      {{{"tool_choice", "required"}}, "tool_choice"},
      {{{"tool_choice", json::array()}}, "tool_choice"},
      {{{"presence_penalty", 2.5}}, "presence_penalty"},
      {{{"presence_penalty", "high"}}, "presence_penalty"},
      {{{"frequency_penalty", -3}}, "frequency_penalty"},
      {{{"repetition_penalty", 0}}, "repetition_penalty"},
      {{{"repetition_penalty", -1.5}}, "repetition_penalty"},
      {{{"logit_bias", json::array({1, 2})}}, "logit_bias"},
      {{{"logit_bias", {{"abc", 1}}}}, "logit_bias"},
      {{{"logit_bias", {{"-5", 1}}}}, "logit_bias"},
      {{{"logit_bias", {{"99999999999", 1}}}}, "logit_bias"},
      {{{"logit_bias", {{"5", 100.5}}}}, "logit_bias"},
      {{{"logit_bias", {{"5", "up"}}}}, "logit_bias"},
      {{{"min_tokens", -1}}, "min_tokens"},
      {{{"min_tokens", 3}, {"max_tokens", 2}}, "min_tokens"},
      {{{"min_tokens", 1.5}}, "min_tokens"},
      {{{"logprobs", "yes"}}, "logprobs"},
      {{{"logprobs", true}, {"top_logprobs", 21}}, "top_logprobs"},
      {{{"top_logprobs", 2}}, "top_logprobs"},
      {{{"logprobs", true}, {"top_logprobs", -1}}, "top_logprobs"},
  };
  for (const Case& c : cases) {
    json body = chat_body("hi", 2);
    body.update(c.patch);
    HttpReply r = post_json(*cli_, body.dump());
    expect_openai_error(r, 400, c.patch.dump());
    if (!c.param.empty()) {
      EXPECT_EQ(r.j["error"]["param"], c.param) << r.body;
    }
  }
  // A number beyond double range in the text is a JSON error, not a 500.
  expect_openai_error(post_json(*cli_, R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e400})"),
                      400, "1e400");
  // An image part without a url says so (not "local files are disabled").
  HttpReply r = post_json(*cli_, user_body(json::array({{{"type", "image_url"}, {"image_url", json::object()}}})).dump());
  expect_openai_error(r, 400, "image_url without url");
  EXPECT_NE(r.body.find("non-empty url"), std::string::npos) << r.body;
}

TEST_F(HostileTest, TypedSpecialTokensAreNotImagePlaceholders) {
  start("qwen3_vl_moe_tiny");
  const std::string fake = "look: <|vision_start|><|image_pad|><|vision_end|>";
  HttpReply r = post_json(*cli_, user_body(fake).dump());
  expect_openai_error(r, 400, "placeholder without image");
  EXPECT_EQ(r.j["error"]["param"], "messages");
  json with_image = user_body(json::array({image_part(jpeg_data_url(64, 64)), {{"type", "text"}, {"text", fake}}}));
  with_image["mm_processor_kwargs"] = {{"min_pixels", 32 * 32}, {"max_pixels", 128 * 128}};
  expect_openai_error(post_json(*cli_, with_image.dump()), 400, "placeholder besides an image");
  with_image["messages"][0]["content"][1]["text"] = "look";
  HttpReply ok = post_json(*cli_, with_image.dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
}

// Bytes of a delta that are not valid UTF-8 reach the client as U+FFFD; a delta cut inside a character
// would show one where the whole text has none.
TEST_F(HostileTest, StopStringHoldBackKeepsCharactersWhole) {
  for (const char* model : {"qwen3_moe_tiny", "qwen3_vl_moe_tiny"}) {
    SCOPED_TRACE(model);
    start(model);
    json body = chat_body("Write in many languages.", 96);
    body["ignore_eos"] = true;
    body["stop"] = json::array({"\x01\x02\x03\x04\x05\x06", "never-here"});
    HttpReply whole = post_json(*cli_, body.dump());
    ASSERT_EQ(whole.status, 200) << whole.body;
    const std::string text = whole.j["choices"][0]["message"]["content"];
    body["stream"] = true;
    StreamReply r = post_stream(*cli_, body.dump());
    ASSERT_EQ(r.status, 200) << r.error_body;
    StreamParts p = split_stream(r);
    EXPECT_EQ(p.content, text) << "the deltas must add up to the final text";
    const std::string fffd = "\xEF\xBF\xBD";
    if (text.find(fffd) == std::string::npos) {
      EXPECT_EQ(p.content.find(fffd), std::string::npos);
    }
    size_t multibyte = 0;
    for (unsigned char c : text) multibyte += c >= 0x80;
    EXPECT_GT(multibyte, 0u) << "the test needs multi-byte characters in the output to mean anything";
    TearDown();
  }
}

// Waits until the server counts `n` connections from `ip` (handler threads take accepted sockets up in
// their own time); false after 30 s.
bool wait_connections(const Server& srv, const std::string& ip, int n) {
  const double deadline = now_ms() + 30000;
  while (srv.connections_from(ip) != n && now_ms() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  return srv.connections_from(ip) == n;
}

TEST_F(HostileTest, SlowClientsCannotStarveTheServer) {
  ServerOptions o;
  o.http_threads = 16;
  o.max_connections_per_client = 4;
  // Read deadlines far beyond the test, so that the stalled connections are surely open while it probes
  // (the deadlines themselves are the next test's).
  o.request_read_timeout_s = 300;
  o.idle_read_timeout_s = 300;
  start("qwen3_moe_tiny", o);
  // From 127.0.0.2: the cap's worth of connections stalled in their headers or their body.
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < 4; ++i) {
    slow.push_back(std::make_unique<RawConnection>(srv_->port(), "127.0.0.2"));
    ASSERT_TRUE(slow.back()->ok());
    ASSERT_TRUE(slow.back()->send(i < 3 ? "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                        : "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                          "application/json\r\nContent-Length: 1000\r\n\r\n{\"messages\":"));
  }
  ASSERT_TRUE(wait_connections(*srv_, "127.0.0.2", 4)) << srv_->connections_from("127.0.0.2");
  // Over the cap, the same address gets the health endpoint and 429 for anything else.
  RawConnection probe(srv_->port(), "127.0.0.2");
  std::string answer;
  ASSERT_TRUE(probe.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_TRUE(probe.read_until_closed(answer, 30));
  EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
  ASSERT_TRUE(wait_connections(*srv_, "127.0.0.2", 4));
  RawConnection refused(srv_->port(), "127.0.0.2");
  answer.clear();
  ASSERT_TRUE(refused.send(raw_post(chat_body("hi", 2).dump())));
  EXPECT_TRUE(refused.read_until_closed(answer, 30));
  EXPECT_EQ(answer.rfind("HTTP/1.1 429", 0), 0u) << answer;
  EXPECT_NE(answer.find("--max-connections-per-client"), std::string::npos) << answer;
  // Past the probe slots (4 more), connections from that address are answered 429 at once, whatever they ask.
  std::vector<std::unique_ptr<RawConnection>> probes;
  for (int i = 0; i < 4; ++i) {
    probes.push_back(std::make_unique<RawConnection>(srv_->port(), "127.0.0.2"));
    ASSERT_TRUE(probes.back()->send("GET /health HTTP/1.1\r\nHost: x\r\n"));
  }
  ASSERT_TRUE(wait_connections(*srv_, "127.0.0.2", 8));
  RawConnection closed(srv_->port(), "127.0.0.2");
  answer.clear();
  ASSERT_TRUE(closed.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_TRUE(closed.read_until_closed(answer, 30));
  EXPECT_EQ(answer.rfind("HTTP/1.1 429", 0), 0u) << answer;
  // Other addresses are served meanwhile.
  HttpReply health = get(*cli_, "/health");
  EXPECT_EQ(health.status, 200);
  HttpReply ok = post_json(*cli_, chat_body("Hello", 2).dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
  // Clients that hang up free their slots.
  slow.clear();
  probes.clear();
  EXPECT_TRUE(wait_connections(*srv_, "127.0.0.2", 0)) << srv_->connections_from("127.0.0.2");
}

// A request must arrive within the read deadlines: one stalled in its headers is dropped, one stalled in
// its body is told 408, and the server answers others meanwhile.
TEST_F(HostileTest, StalledRequestsAreDroppedAtTheReadDeadline) {
  ServerOptions o;
  o.request_read_timeout_s = 1;
  o.idle_read_timeout_s = 1;
  start("qwen3_moe_tiny", o);
  RawConnection headers(srv_->port());
  ASSERT_TRUE(headers.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"));
  RawConnection body(srv_->port());
  ASSERT_TRUE(body.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        "Content-Length: 1000\r\n\r\n{\"messages\":"));
  HttpReply ok = post_json(*cli_, chat_body("Hello", 2).dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
  std::string answer;
  EXPECT_TRUE(headers.read_until_closed(answer, 30)) << "a stalled connection must be closed by the server";
  answer.clear();
  EXPECT_TRUE(body.read_until_closed(answer, 30));
  EXPECT_EQ(answer.rfind("HTTP/1.1 408", 0), 0u) << answer;
}

// A client that sends a request with an image and hangs up at once: the image work stops at the first
// check (before decoding) and nothing reaches the engine.
TEST_F(HostileTest, ClientGoneWhileImagesArePreparedStopsTheWork) {
  start("qwen3_vl_moe_tiny");
  json body = user_body(json::array({image_part(jpeg_data_url(1024, 1024)), {{"type", "text"}, {"text", "hi"}}}));
  body["mm_processor_kwargs"] = {{"min_pixels", 32 * 32}, {"max_pixels", 256 * 256}};
  {
    RawConnection c(srv_->port());
    ASSERT_TRUE(c.send(raw_post(body.dump())));
  }
  auto m = wait_metrics(*cli_, [](auto& m) { return m["zest_requests_rejected_total{status=\"503\"}"] == 1; });
  EXPECT_EQ(m["zest_requests_rejected_total{status=\"503\"}"], 1);
  EXPECT_EQ(finished_total(m), 0) << "a cancelled request must not reach the engine";
}

// POST /v1/completions, /tokenize and /detokenize refuse bad values with a 400 naming the field; a fuzz run over
// the completions body answers 200 or 4xx only.
TEST_F(HostileTest, CompletionsTokenizeAndDetokenizeRefuseByName) {
  start("qwen3_moe_tiny");
  struct Case {
    std::string path;
    json body;
    std::string param;
  };
  json many = json::array();
  for (int i = 0; i < 129; ++i) many.push_back("x");
  const std::vector<Case> cases = {
      {"/v1/completions", {{"max_tokens", 2}}, "prompt"},
      {"/v1/completions", {{"prompt", 123}}, "prompt"},
      {"/v1/completions", {{"prompt", json::array()}}, "prompt"},
      {"/v1/completions", {{"prompt", ""}}, "prompt"},
      {"/v1/completions", {{"prompt", json::array({json::array()})}}, "prompt"},
      {"/v1/completions", {{"prompt", {1.5, 2}}}, "prompt"},
      {"/v1/completions", {{"prompt", {1, -2}}}, "prompt"},
      {"/v1/completions", {{"prompt", {1, 99999999}}}, "prompt"},
      {"/v1/completions", {{"prompt", {"a", 1}}}, "prompt"},
      {"/v1/completions", {{"prompt", {{"a", 1}}}}, "prompt"},
      {"/v1/completions", {{"prompt", many}}, "prompt"},
      {"/v1/completions", {{"prompt", {"a", "b"}}, {"n", 65}}, "n"},
      {"/v1/completions", {{"prompt", "hi"}, {"logprobs", 21}}, "logprobs"},
      {"/v1/completions", {{"prompt", "hi"}, {"logprobs", true}}, "logprobs"},
      {"/v1/completions", {{"prompt", "hi"}, {"suffix", "x"}}, "suffix"},
      {"/v1/completions", {{"prompt", "hi"}, {"echo", true}}, "echo"},
      {"/v1/completions", {{"prompt", "hi"}, {"best_of", 3}}, "best_of"},
      {"/v1/completions", {{"prompt", "hi"}, {"presence_penalty", 9}}, "presence_penalty"},
      {"/v1/completions", {{"prompt", "hi"}, {"max_tokens", 100000}}, "max_tokens"},
      {"/tokenize", json::object(), "prompt"},
      {"/tokenize", {{"prompt", "a"}, {"messages", json::array()}}, "prompt"},
      {"/tokenize", {{"prompt", 5}}, "prompt"},
      {"/tokenize", {{"prompt", "a"}, {"add_special_tokens", "yes"}}, "add_special_tokens"},
      {"/tokenize", {{"prompt", "a"}, {"return_token_strs", 1}}, "return_token_strs"},
      {"/tokenize", {{"messages", "hi"}}, "messages"},
      {"/detokenize", json::object(), "tokens"},
      {"/detokenize", {{"tokens", "abc"}}, "tokens"},
      {"/detokenize", {{"tokens", {1.5}}}, "tokens"},
      {"/detokenize", {{"tokens", {-1}}}, "tokens"},
      {"/detokenize", {{"tokens", {18446744073709551615ull}}}, "tokens"},
  };
  for (const Case& c : cases) {
    HttpReply r = post_json(*cli_, c.body.dump(), c.path);
    expect_openai_error(r, 400, c.path + " " + c.body.dump().substr(0, 200));
    EXPECT_EQ(r.j["error"]["param"], c.param) << c.path << " " << r.body;
  }
  // Wrong method: 405 with Allow.
  HttpReply g = get(*cli_, "/v1/completions");
  EXPECT_EQ(g.status, 405) << g.body;
  // Fuzz: one field of a valid body replaced by a random value.
  std::mt19937 rng(41);
  const std::vector<json> values = {nullptr, true, -1, 0, 3, 1e300, "x", json::array(), json::array({1, 2}),
                                    json::array({"a", "b"}), json::object(), {{"k", 1}}, 18446744073709551615ull};
  const std::vector<std::string> fields = {"prompt", "max_tokens", "n", "logprobs", "temperature", "seed", "stop",
                                           "stream", "logit_bias", "min_tokens", "suffix", "echo", "stream_options"};
  int ok = 0;
  for (int i = 0; i < 150; ++i) {
    json b = {{"prompt", "Count:"}, {"max_tokens", 2}};
    b[fields[rng() % fields.size()]] = values[rng() % values.size()];
    const std::string raw = b.dump();
    SCOPED_TRACE(raw);
    if (b.contains("stream") && b["stream"].is_boolean() && b["stream"].get<bool>()) {
      StreamReply r = post_stream(*cli_, raw, nullptr, "/v1/completions");
      ASSERT_TRUE(r.transport_ok);
      ASSERT_TRUE(r.status == 200 || (r.status >= 400 && r.status < 500)) << r.status << " " << r.error_body;
      ok += r.status == 200;
      continue;
    }
    HttpReply r = post_json(*cli_, raw, "/v1/completions");
    ASSERT_TRUE(r.status == 200 || (r.status >= 400 && r.status < 500)) << r.status << " " << r.body;
    if (r.status == 200) {
      ++ok;
      EXPECT_EQ(r.j["object"], "text_completion");
    } else {
      expect_openai_error(r, r.status, "fuzz " + std::to_string(i));
    }
  }
  EXPECT_GT(ok, 10);
}

// A generated run: valid bodies with one field replaced by a value of a random type, random JSON
// fragments, truncations and broken images. Every answer is 200 with a completion or a 4xx with an
// OpenAI error object; never a 5xx or a dropped connection.
TEST_F(HostileTest, FuzzedBodiesGetCompletionsOr4xx) {
  start("qwen3_vl_moe_tiny");
  std::mt19937 rng(39);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const std::string png = chart_data_url();
  auto random_value = [&](int depth) -> json {
    switch (pick(depth > 2 ? 9 : 11)) {
      case 0: return nullptr;
      case 1: return rng() % 2 == 0;
      case 2: return static_cast<int64_t>(rng()) - (int64_t{1} << 31);
      case 3: return -1;
      case 4: return std::ldexp(static_cast<double>(rng()), static_cast<int>(pick(200)) - 100);
      case 5: return std::numeric_limits<uint64_t>::max();
      case 6: return std::string(pick(20), static_cast<char>('a' + pick(26)));
      case 7: return "<|image_pad|>";
      case 8: return json::array();
      case 9: return json::array({depth, "x", nullptr});
      default: return {{"url", "data:image/png;base64,AAAA"}, {"k", depth}};
    }
  };
  const std::vector<std::string> fields = {
      "messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "n",
      "stop", "stop_token_ids", "ignore_eos", "stream", "stream_options", "sere", "vision_prune",
      "mm_processor_kwargs", "chat_template_kwargs", "logprobs", "tools", "tool_choice", "response_format",
      "logit_bias", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "top_logprobs",
      "user"};
  auto base = [&]() {
    json content = json::array({{{"type", "text"}, {"text", "Describe."}}});
    if (rng() % 3 == 0) content.push_back(image_part(png));
    json b = {{"messages", json::array({{{"role", "user"}, {"content", content}}})},
              {"max_tokens", 1 + static_cast<int64_t>(pick(4))},
              {"mm_processor_kwargs", {{"min_pixels", 32 * 32}, {"max_pixels", 128 * 128}}}};
    return b;
  };
  int by_status[6] = {0};
  for (int i = 0; i < 400; ++i) {
    json b = base();
    std::string raw;
    const size_t kind = pick(10);
    if (kind < 5) {
      b[fields[pick(fields.size())]] = random_value(0);
    } else if (kind == 5) {
      // Inside a message: role, content, a part, an image url.
      json& m = b["messages"][0];
      const char* keys[] = {"role", "content", "name", "tool_calls"};
      m[keys[pick(4)]] = random_value(1);
    } else if (kind == 6) {
      json& part = b["messages"][0]["content"][0];
      part[rng() % 2 ? "type" : "text"] = random_value(2);
    } else if (kind == 7) {
      b["messages"][0]["content"].push_back(
          image_part("data:image/png;base64," + base64(std::string("\x89PNG\r\n\x1a\n", 8) + std::string(pick(64), 'x'))));
    } else if (kind == 8) {
      raw = b.dump();
      raw.resize(pick(raw.size()));  // truncated
    } else {
      raw = b.dump();
      raw.insert(pick(raw.size()), std::string(1 + pick(3), "[{\"]}:,1e999"[pick(12)]));  // corrupted
    }
    if (rng() % 4 == 0 && raw.empty()) b["stream"] = true;
    if (raw.empty()) raw = b.dump(-1, ' ', false, json::error_handler_t::replace);
    const bool stream = raw.find("\"stream\":true") != std::string::npos;
    SCOPED_TRACE(raw.substr(0, 300));
    if (stream) {
      StreamReply r = post_stream(*cli_, raw);
      ASSERT_TRUE(r.transport_ok) << httplib::to_string(r.error);
      ASSERT_TRUE(r.status == 200 || (r.status >= 400 && r.status < 500)) << r.status << " " << r.error_body;
      if (r.status == 200) {
        ASSERT_FALSE(r.events.empty());
        EXPECT_EQ(r.events.back(), "[DONE]");
      }
      ++by_status[r.status / 100];
      continue;
    }
    HttpReply r = post_json(*cli_, raw);
    ASSERT_NE(r.status, 0) << "no answer: " << httplib::to_string(r.error);
    ++by_status[r.status / 100];
    if (r.status == 200) {
      EXPECT_EQ(r.j["object"], "chat.completion") << r.body;
    } else {
      ASSERT_TRUE(r.status >= 400 && r.status < 500) << r.status << " " << r.body;
      expect_openai_error(r, r.status, "fuzz case " + std::to_string(i));
    }
  }
  std::printf("fuzz: %d answered 200, %d answered 4xx\n", by_status[2], by_status[4]);
  EXPECT_GT(by_status[2], 20) << "the generator must also produce valid requests";
  EXPECT_GT(by_status[4], 100);
}

}  // namespace
}  // namespace zest::server::testing
