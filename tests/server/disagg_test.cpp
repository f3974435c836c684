// Prefill/decode disaggregation on loopback (server/disagg.h, server/front.h): one prefill instance, one decode
// instance and the front, against one --role both instance of the same model. Greedy replies must be identical
// (text, streamed or not, and token counts), the K/V bytes moved must follow the prompt's tokens (VisionZip), SERE
// must run where decode runs, and a prefill instance that is gone must give the client an error and leave the decode
// instance's KV cache empty.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "engine/engine_test_util.h"
#include "engine/sere.h"
#include "io/image.h"
#include "server/disagg.h"
#include "server/front.h"
#include "server_test_util.h"

using namespace zest;
using namespace zest::server;
using namespace zest::server::testing;

namespace {

std::string url(const Server& s) { return "http://127.0.0.1:" + std::to_string(s.port()); }

std::unique_ptr<Front> start_front(const Server& prefill, const Server& decode) {
  FrontOptions o;
  o.port = 0;
  o.prefill = {url(prefill)};
  o.decode = {url(decode)};
  o.http_threads = 16;
  auto f = Front::start(o);
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  return f.ok() ? std::move(f).value() : nullptr;
}

std::unique_ptr<httplib::Client> client_of(int port) {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
  c->set_read_timeout(120);
  return c;
}

const std::string kSecret = "a test deployment secret";

ServerOptions with_role(Role r) {
  ServerOptions o;
  o.role = r;
  o.kv_secret = kSecret;
  o.http_threads = 32;  // (a per-address cap of 16 connections: the tests talk from one address)
  return o;
}

std::string gray_jpeg(int64_t w, int64_t h) {
  io::Image img;
  img.width = w;
  img.height = h;
  img.rgb.resize(static_cast<size_t>(w * h * 3));
  for (size_t i = 0; i < img.rgb.size(); ++i) img.rgb[i] = static_cast<uint8_t>((i * 37 / 3) % 251);
  auto jpg = io::encode_jpeg(img, 90);
  EXPECT_TRUE(jpg.ok());
  return "data:image/jpeg;base64," + base64(std::string(jpg->begin(), jpg->end()));
}

json image_body(const std::string& data_url, int64_t max_tokens) {
  json content = json::array({{{"type", "image_url"}, {"image_url", {{"url", data_url}}}},
                              {{"type", "text"}, {"text", "What is in the picture?"}}});
  return {{"messages", json::array({{{"role", "user"}, {"content", content}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"ignore_eos", true},
          {"mm_processor_kwargs", {{"min_pixels", 64 * 32 * 32}, {"max_pixels", 96 * 32 * 32}}}};
}

double metric(httplib::Client& c, const std::string& name) { return metrics(c)[name]; }

// Polls a server's /metrics until `name` reaches `want` (the offer's release is asynchronous); the last value.
double wait_metric(httplib::Client& c, const std::string& name, double want) {
  auto m = wait_metrics(c, [&](auto& m) { return m[name] == want; }, 30);
  return m[name];
}

struct Deployment {
  std::unique_ptr<Server> both, prefill, decode;
  std::unique_ptr<Front> front;
  explicit Deployment(const std::string& model, ServerOptions decode_opts = with_role(Role::kDecode),
                      ServerOptions both_opts = with_role(Role::kBoth)) {
    both = start_server(model, both_opts);
    prefill = start_server(model, with_role(Role::kPrefill));
    decode = start_server(model, decode_opts);
    if (prefill && decode) front = start_front(*prefill, *decode);
  }
  bool ok() const { return both && prefill && decode && front; }
};

TEST(Disagg, TextRepliesEqualOneInstanceStreamedOrNot) {
  Deployment d("qwen3_moe_tiny");
  ASSERT_TRUE(d.ok());
  auto both = client(*d.both);
  auto front = client_of(d.front->port());
  for (const char* text : {"Name three colors.", "Write a long story about the sea, please."}) {
    SCOPED_TRACE(text);
    json body = chat_body(text, 20);
    body["ignore_eos"] = true;
    HttpReply want = post_json(*both, body.dump());
    ASSERT_EQ(want.status, 200) << want.body;
    HttpReply got = post_json(*front, body.dump());
    ASSERT_EQ(got.status, 200) << got.body;
    EXPECT_EQ(got.j["choices"][0]["message"]["content"], want.j["choices"][0]["message"]["content"]);
    EXPECT_EQ(got.j["choices"][0]["finish_reason"], want.j["choices"][0]["finish_reason"]);
    EXPECT_EQ(got.j["usage"]["prompt_tokens"], want.j["usage"]["prompt_tokens"]);
    EXPECT_EQ(got.j["usage"]["completion_tokens"], want.j["usage"]["completion_tokens"]);
    EXPECT_FALSE(got.j.contains("kv_transfer_params")) << "the decode instance's answer reaches the client as it is";

    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    StreamReply s = post_stream(*front, body.dump());
    ASSERT_EQ(s.status, 200) << s.error_body;
    StreamParts p = split_stream(s);
    EXPECT_TRUE(p.done_last);
    EXPECT_EQ(p.content, want.j["choices"][0]["message"]["content"].get<std::string>());
    ASSERT_FALSE(p.chunks.empty());
    EXPECT_EQ(p.chunks.back()["usage"]["completion_tokens"], want.j["usage"]["completion_tokens"]);
  }
  // Four requests: four K/V exports, reads and imports; every offer released, the decode cache empty.
  auto pc = client(*d.prefill);
  auto dc = client(*d.decode);
  EXPECT_EQ(metric(*pc, "zest_kv_exports_total"), 4);
  EXPECT_EQ(wait_metric(*pc, "zest_kv_transfer_released_total", 4), 4);
  EXPECT_EQ(metric(*pc, "zest_kv_transfer_held"), 0);
  EXPECT_EQ(metric(*dc, "zest_kv_imports_total"), 4);
  EXPECT_EQ(metric(*dc, "zest_kv_transfer_reads_total"), 4);
  EXPECT_GT(metric(*dc, "zest_kv_transfer_read_bytes_total"), 0);
  EXPECT_EQ(wait_metrics(*dc, idle)["zest_kv_blocks_used"], 0);
  EXPECT_EQ(metric(*dc, "zest_prompt_tokens_total"), metric(*pc, "zest_prompt_tokens_total"));
}

// n choices and log-probabilities: the prefill instance samples each choice's first token (with its logprobs) and
// exports the prompt's K/V once; the decode instance continues every choice from it.
TEST(Disagg, SeededChoicesAndLogprobsEqualOneInstance) {
  Deployment d("qwen3_moe_tiny");
  ASSERT_TRUE(d.ok());
  json body = chat_body("Name some animals.", 10);
  body["n"] = 3;
  body["temperature"] = 0.9;
  body["seed"] = 11;
  body["logprobs"] = true;
  body["top_logprobs"] = 3;
  HttpReply want = post_json(*client(*d.both), body.dump());
  HttpReply got = post_json(*client_of(d.front->port()), body.dump());
  ASSERT_EQ(want.status, 200) << want.body;
  ASSERT_EQ(got.status, 200) << got.body;
  ASSERT_EQ(got.j["choices"].size(), 3u);
  std::set<std::string> distinct;
  for (size_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got.j["choices"][i]["message"], want.j["choices"][i]["message"]);
    EXPECT_EQ(got.j["choices"][i]["logprobs"], want.j["choices"][i]["logprobs"]);
    distinct.insert(got.j["choices"][i]["message"]["content"].get<std::string>());
  }
  EXPECT_GT(distinct.size(), 1u) << "seeded choices should differ for the comparison to mean something";
  EXPECT_EQ(got.j["usage"], want.j["usage"]);
  auto pc = client(*d.prefill);
  EXPECT_EQ(metric(*pc, "zest_kv_exports_total"), 1) << "one export for the three choices";
  auto dc = client(*d.decode);
  EXPECT_EQ(metric(*dc, "zest_kv_imports_total"), 3);
  EXPECT_EQ(metric(*dc, "zest_kv_transfer_reads_total"), 1);
  EXPECT_EQ(wait_metrics(*dc, idle)["zest_kv_blocks_used"], 0);
}

// Prompt log-probabilities are computed by the prefill instance (which runs the prompt) and carried in the signed
// params: the reply equals one instance's, at the top level as vLLM puts them; a decode instance asked for them
// without any in the params refuses by name.
TEST(Disagg, PromptLogprobsEqualOneInstance) {
  Deployment d("qwen3_moe_tiny");
  ASSERT_TRUE(d.ok());
  json body = chat_body("Name some animals.", 6);
  body["prompt_logprobs"] = 2;
  body["logprobs"] = true;
  body["top_logprobs"] = 2;
  HttpReply want = post_json(*client(*d.both), body.dump());
  HttpReply got = post_json(*client_of(d.front->port()), body.dump());
  ASSERT_EQ(want.status, 200) << want.body;
  ASSERT_EQ(got.status, 200) << got.body;
  ASSERT_TRUE(want.j.contains("prompt_logprobs"));
  ASSERT_GT(want.j["prompt_logprobs"].size(), 2u);
  EXPECT_EQ(got.j["prompt_logprobs"], want.j["prompt_logprobs"]);
  EXPECT_EQ(got.j["choices"][0]["message"], want.j["choices"][0]["message"]);
  EXPECT_EQ(got.j["choices"][0]["logprobs"], want.j["choices"][0]["logprobs"]);
  EXPECT_EQ(got.j["usage"], want.j["usage"]);
  // The prefill's params without prompt log-probabilities, to a decode instance asked for them.
  json pb = body;
  pb.erase("prompt_logprobs");
  pb["kv_transfer_params"] = {{"do_remote_decode", true}};
  HttpReply p = post_json(*client(*d.prefill), pb.dump());
  ASSERT_EQ(p.status, 200) << p.body;
  json db = body;
  db["kv_transfer_params"] = p.j["kv_transfer_params"];
  HttpReply e = post_json(*client(*d.decode), db.dump());
  EXPECT_EQ(e.status, 400) << e.body;
  EXPECT_EQ(e.j["error"]["param"], "prompt_logprobs") << e.body;
  EXPECT_EQ(wait_metrics(*client(*d.decode), idle)["zest_kv_blocks_used"], 0);
  // The refused request's offer is released at once (the two requests before it were read and released too).
  EXPECT_EQ(wait_metric(*client(*d.prefill), "zest_kv_transfer_released_total", 2), 2);
  EXPECT_EQ(metric(*client(*d.prefill), "zest_kv_transfer_held"), 0);
}

TEST(Disagg, ClientGoneMidStreamAbortsOnTheDecodeInstance) {
  Deployment d("qwen3_moe_tiny");
  ASSERT_TRUE(d.ok());
  json body = chat_body("Tell me a very long story.", 3000);
  body["ignore_eos"] = true;
  body["stream"] = true;
  StreamReply s = post_stream(*client_of(d.front->port()), body.dump(),
                              [](const std::vector<std::string>& events) { return events.size() < 3; });
  EXPECT_EQ(s.status, 200);
  auto dc = client(*d.decode);
  auto m = wait_metrics(*dc, [](auto& m) { return m["zest_requests_total{finish_reason=\"abort\"}"] == 1; }, 60);
  EXPECT_EQ(m["zest_requests_total{finish_reason=\"abort\"}"], 1);
  EXPECT_EQ(wait_metrics(*dc, idle)["zest_kv_blocks_used"], 0);
}

TEST(Disagg, ImageRepliesEqualAndPruningMovesFewerBytes) {
  Deployment d("qwen3_vl_moe_tiny");
  ASSERT_TRUE(d.ok());
  auto both = client(*d.both);
  auto front = client_of(d.front->port());
  auto dc = client(*d.decode);
  const std::string image = gray_jpeg(320, 256);
  double bytes_before = 0;
  std::vector<double> per_request;  // bytes read, prompt tokens
  std::vector<int64_t> prompts;
  for (const char* rate : {"", "0.4"}) {
    SCOPED_TRACE(rate);
    json body = image_body(image, 12);
    if (*rate) body["vision_prune"] = {{"rate", std::stod(rate)}};
    HttpReply want = post_json(*both, body.dump());
    ASSERT_EQ(want.status, 200) << want.body;
    HttpReply got = post_json(*front, body.dump());
    ASSERT_EQ(got.status, 200) << got.body;
    EXPECT_EQ(got.j["choices"][0]["message"]["content"], want.j["choices"][0]["message"]["content"]);
    EXPECT_EQ(got.j["usage"]["prompt_tokens"], want.j["usage"]["prompt_tokens"]);
    EXPECT_EQ(got.j["usage"]["visual_tokens_after"], want.j["usage"]["visual_tokens_after"]);
    const double bytes = metric(*dc, "zest_kv_transfer_read_bytes_total");
    per_request.push_back(bytes - bytes_before);
    bytes_before = bytes;
    prompts.push_back(got.j["usage"]["prompt_tokens"].get<int64_t>());
  }
  ASSERT_EQ(per_request.size(), 2u);
  EXPECT_LT(prompts[1], prompts[0]) << "rate 0.4 must drop visual tokens";
  // The K/V moved is the prompt's, token for token: pruning cuts it in proportion.
  EXPECT_DOUBLE_EQ(per_request[1] / per_request[0], static_cast<double>(prompts[1]) / prompts[0]);
  EXPECT_EQ(wait_metrics(*dc, idle)["zest_kv_blocks_used"], 0);
}

TEST(Disagg, SereRunsWhereDecodeRuns) {
  // SERE on the decode instance (and on the reference's decode steps, which is where it runs by default).
  auto model = fixture_model("qwen3_moe_tiny");
  ASSERT_TRUE(model);
  engine::SereOptions so;
  so.params.primary = 1;
  so.similarity_file = ::zest::testing::tiny_similarity_file();  // calibrated on the same fixture
  auto sere_decode = engine::SereRuntime::create(*model, so);
  auto sere_both = engine::SereRuntime::create(*model, so);
  ASSERT_TRUE(sere_decode.ok() && sere_both.ok());
  ServerOptions dec = with_role(Role::kDecode), both = with_role(Role::kBoth);
  engine::SereRuntime* rd = sere_decode->get();
  engine::SereRuntime* rb = sere_both->get();
  dec.engine.moe_hooks = [rd](bool decode_only) { return rd->hooks(decode_only); };
  both.engine.moe_hooks = [rb](bool decode_only) { return rb->hooks(decode_only); };
  Deployment d("qwen3_moe_tiny", dec, both);
  ASSERT_TRUE(d.ok());
  json body = chat_body("Tell me about the mountains and the rivers.", 16);
  body["ignore_eos"] = true;
  HttpReply want = post_json(*client(*d.both), body.dump());
  HttpReply got = post_json(*client_of(d.front->port()), body.dump());
  ASSERT_EQ(want.status, 200) << want.body;
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(got.j["choices"][0]["message"]["content"], want.j["choices"][0]["message"]["content"]);
  // The decode instance re-routed its decode steps (15 of them) as the single instance did.
  EXPECT_EQ((*sere_decode)->stats_json()["steps"], (*sere_both)->stats_json()["steps"]);
  EXPECT_GT((*sere_decode)->stats_json()["steps"].get<int64_t>(), 0);
}

TEST(Disagg, PrefillGoneGivesAnErrorAndLeavesNoBlocks) {
  Deployment d("qwen3_moe_tiny");
  ASSERT_TRUE(d.ok());
  auto dc = client(*d.decode);
  // The prefill step alone, as the front does it; then the prefill instance goes away before the read.
  json body = chat_body("Hello there", 8);
  json first = body;
  first["kv_transfer_params"] = {{"do_remote_decode", true}};
  HttpReply p = post_json(*client(*d.prefill), first.dump());
  ASSERT_EQ(p.status, 200) << p.body;
  ASSERT_TRUE(p.j.contains("kv_transfer_params")) << p.body;
  EXPECT_EQ(p.j["usage"]["completion_tokens"], 1);
  const std::string prefill_url = url(*d.prefill);
  d.front.reset();
  d.prefill.reset();
  body["kv_transfer_params"] = p.j["kv_transfer_params"];
  const double t0 = now_ms();
  HttpReply r = post_json(*dc, body.dump());
  EXPECT_LT(now_ms() - t0, 60000);
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_NE(r.body.find("prefill instance"), std::string::npos) << r.body;
  EXPECT_EQ(metric(*dc, "zest_kv_transfer_read_failures_total"), 1);
  EXPECT_EQ(wait_metrics(*dc, idle)["zest_kv_blocks_used"], 0);
  EXPECT_EQ(metric(*dc, "zest_kv_imports_total"), 0);
  // Through a front whose prefill instance is down: 502 naming it.
  FrontOptions fo;
  fo.port = 0;
  fo.prefill = {prefill_url};
  fo.decode = {url(*d.decode)};
  auto front = Front::start(fo);
  ASSERT_TRUE(front.ok()) << front.status().to_string();
  HttpReply via = post_json(*client_of((*front)->port()), chat_body("Hello", 4).dump());
  EXPECT_EQ(via.status, 502) << via.body;
  EXPECT_NE(via.body.find(prefill_url), std::string::npos) << via.body;
  // The decode instance still serves whole requests.
  EXPECT_EQ(post_json(*dc, chat_body("Hello", 4).dump()).status, 200);
}

TEST(Disagg, FrontRoutesAndRefuses) {
  Deployment d("qwen3_moe_tiny");
  ASSERT_TRUE(d.ok());
  auto front = client_of(d.front->port());
  EXPECT_EQ(get(*front, "/health").status, 200);
  HttpReply models = get(*front, "/v1/models");
  EXPECT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(models.j["data"][0]["id"], d.decode->model_name());
  // Bodies the front cannot route get 400 without reaching an instance.
  EXPECT_EQ(post_json(*front, "{\"messages\": [").status, 400);
  EXPECT_EQ(post_json(*front, "[1, 2]").status, 400);
  json forged = chat_body("Hello", 4);
  forged["kv_transfer_params"] = {{"do_remote_decode", true}};
  HttpReply f = post_json(*front, forged.dump());
  EXPECT_EQ(f.status, 400) << f.body;
  EXPECT_EQ(f.j["error"]["param"], "kv_transfer_params");
  // An instance's own refusal reaches the client with its status and message.
  json bad = chat_body("Hello", 4);
  bad["temperature"] = "hot";
  HttpReply b = post_json(*front, bad.dump());
  EXPECT_EQ(b.status, 400) << b.body;
  EXPECT_NE(b.body.find("temperature"), std::string::npos) << b.body;
  // Text completions go whole to a decode instance.
  HttpReply c = post_json(*front, json{{"prompt", "Once upon a time"}, {"max_tokens", 4}, {"temperature", 0}}.dump(),
                          "/v1/completions");
  EXPECT_EQ(c.status, 200) << c.body;
  auto m = metrics(*front);
  EXPECT_EQ(m["zest_front_requests_total"], 4);
  EXPECT_EQ(m["zest_front_prefill_errors_total"], 1);
  // With the decode instance gone, /health says which instance is down and chats get 502.
  const std::string decode_url = url(*d.decode);
  d.decode.reset();
  HttpReply h = get(*front, "/health");
  EXPECT_EQ(h.status, 503) << h.body;
  EXPECT_NE(h.body.find(decode_url), std::string::npos) << h.body;
  HttpReply g = post_json(*front, chat_body("Hello", 4).dump());
  EXPECT_EQ(g.status, 502) << g.body;
  EXPECT_NE(g.body.find(decode_url), std::string::npos) << g.body;
}

TEST(Disagg, FrontSkipsInstancesItCannotConnectTo) {
  Deployment d("qwen3_moe_tiny");
  ASSERT_TRUE(d.ok());
  // A port nobody listens on: bound and closed again.
  std::string dead;
  {
    auto gone = start_server("qwen3_moe_tiny", with_role(Role::kBoth));
    ASSERT_TRUE(gone);
    dead = url(*gone);
  }
  FrontOptions fo;
  fo.port = 0;
  fo.prefill = {dead, url(*d.prefill)};
  fo.decode = {dead, url(*d.decode)};
  auto front = Front::start(fo);
  ASSERT_TRUE(front.ok()) << front.status().to_string();
  auto fc = client_of((*front)->port());
  json body = chat_body("Name three colors.", 8);
  body["ignore_eos"] = true;
  HttpReply want = post_json(*client(*d.both), body.dump());
  ASSERT_EQ(want.status, 200);
  for (int i = 0; i < 4; ++i) {  // round robin: both instance orders, streamed and not
    SCOPED_TRACE(i);
    json b = body;
    if (i % 2) b["stream"] = true;
    if (i % 2) {
      StreamReply s = post_stream(*fc, b.dump());
      ASSERT_EQ(s.status, 200) << s.error_body;
      EXPECT_EQ(split_stream(s).content, want.j["choices"][0]["message"]["content"].get<std::string>());
    } else {
      HttpReply r = post_json(*fc, b.dump());
      ASSERT_EQ(r.status, 200) << r.body;
      EXPECT_EQ(r.j["choices"][0]["message"]["content"], want.j["choices"][0]["message"]["content"]);
    }
  }
  EXPECT_GT(metrics(*fc)["zest_front_unreachable_total"], 0);
}

TEST(Disagg, UnreadOffersExpire) {
  ServerOptions po = with_role(Role::kPrefill);
  po.kv_hold_s = 0.3;
  auto prefill = start_server("qwen3_moe_tiny", po);
  auto decode = start_server("qwen3_moe_tiny", with_role(Role::kDecode));
  ASSERT_TRUE(prefill && decode);
  auto pc = client(*prefill);
  json body = chat_body("Hello there", 8);
  json first = body;
  first["kv_transfer_params"] = {{"do_remote_decode", true}};
  HttpReply p = post_json(*pc, first.dump());
  ASSERT_EQ(p.status, 200) << p.body;
  EXPECT_EQ(wait_metric(*pc, "zest_kv_transfer_expired_total", 1), 1);
  EXPECT_EQ(metric(*pc, "zest_kv_transfer_held"), 0);
  body["kv_transfer_params"] = p.j["kv_transfer_params"];
  auto dc = client(*decode);
  HttpReply r = post_json(*dc, body.dump());
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(wait_metrics(*dc, idle)["zest_kv_blocks_used"], 0);
}

TEST(Disagg, RolesNeedTheDeploymentSecret) {
  for (Role r : {Role::kPrefill, Role::kDecode}) {
    ServerOptions o = with_role(r);
    o.kv_secret = "short";
    auto s = Server::start(fixture_model("qwen3_moe_tiny"), o);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("--kv-secret"), std::string::npos) << s.status().message();
  }
  // CUDA IPC needs the CUDA backend (these fixtures run on the CPU).
  ServerOptions ipc = with_role(Role::kPrefill);
  ipc.kv_transfer = KvTransfer::kCudaIpc;
  auto refused = Server::start(fixture_model("qwen3_moe_tiny"), ipc);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("cuda-ipc needs the CUDA backend"), std::string::npos);
  // A decode instance with another secret refuses the prefill instance's params.
  auto prefill = start_server("qwen3_moe_tiny", with_role(Role::kPrefill));
  ServerOptions other = with_role(Role::kDecode);
  other.kv_secret = "another deployment's secret";
  auto decode = start_server("qwen3_moe_tiny", other);
  ASSERT_TRUE(prefill && decode);
  json body = chat_body("Hello", 4);
  json first = body;
  first["kv_transfer_params"] = {{"do_remote_decode", true}};
  HttpReply p = post_json(*client(*prefill), first.dump());
  ASSERT_EQ(p.status, 200) << p.body;
  body["kv_transfer_params"] = p.j["kv_transfer_params"];
  HttpReply r = post_json(*client(*decode), body.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("another --kv-secret"), std::string::npos) << r.body;
}

TEST(Disagg, WhatCannotBeCarriedIsRefusedByName) {
  auto both = start_server("qwen3_moe_tiny", with_role(Role::kBoth));
  auto prefill = start_server("qwen3_moe_tiny", with_role(Role::kPrefill));
  auto decode = start_server("qwen3_moe_tiny", with_role(Role::kDecode));
  ASSERT_TRUE(both && prefill && decode);
  json body = chat_body("Hello", 4);
  body["kv_transfer_params"] = {{"do_remote_decode", true}};
  HttpReply r = post_json(*client(*both), body.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.j["error"]["param"], "kv_transfer_params") << r.body;
  auto pc = client(*prefill);
  {  // The prefill step is answered in one response (the decode instance streams to the client).
    json b = body;
    b["stream"] = true;
    HttpReply e = post_json(*pc, b.dump());
    EXPECT_EQ(e.status, 400) << e.body;
    EXPECT_EQ(e.j["error"]["param"], "stream") << e.body;
  }
  json odd = body;
  odd["kv_transfer_params"] = {{"do_remote_decode", "yes"}};
  EXPECT_EQ(post_json(*pc, odd.dump()).status, 400);
  // A decode instance checks the params before reading anything.
  HttpReply p = post_json(*pc, body.dump());
  ASSERT_EQ(p.status, 200) << p.body;
  auto dc = client(*decode);
  const json good = p.j["kv_transfer_params"];
  // Another model's geometry (5 layers, with the byte count that goes with it).
  json other = good;
  other["kv"]["layers"] = 5;
  other["handle"]["bytes"] = good["handle"]["bytes"].get<int64_t>() / good["kv"]["layers"].get<int64_t>() * 5;
  json b5 = chat_body("Hello", 4);
  b5["kv_transfer_params"] = sign_params(other, kSecret);
  HttpReply e5 = post_json(*dc, b5.dump());
  EXPECT_EQ(e5.status, 400) << e5.body;
  EXPECT_NE(e5.body.find("same model"), std::string::npos) << e5.body;
  for (const auto& [path, value, what] : std::vector<std::tuple<std::string, json, std::string>>{
           {"/kv/layers", 5, "handle.bytes"},
           {"/prompt_token_ids", json::array({1, 2}), "kv.tokens"},
           {"/handle/bytes", 7, "handle.bytes"},
           {"/first_tokens", json::array({-1}), "first_tokens"},
           {"/first_logprobs", json::array({1, 2}), "first_logprobs"},
           {"/kv/kv_heads", 1 << 20, "kv.kv_heads"},
           {"/handle/rkey", "zz", "rkey"}}) {
    json changed = good;
    changed[json::json_pointer(path)] = value;
    json b = chat_body("Hello", 4);
    b["kv_transfer_params"] = changed;  // changed after signing: refused before anything in it is used
    HttpReply forged = post_json(*dc, b.dump());
    EXPECT_EQ(forged.status, 400) << path << ": " << forged.body;
    EXPECT_NE(forged.body.find("signature does not match"), std::string::npos) << forged.body;
    b["kv_transfer_params"] = sign_params(changed, kSecret);  // signed: the checks of the params themselves
    HttpReply e = post_json(*dc, b.dump());
    EXPECT_EQ(e.status, 400) << path << ": " << e.body;
    EXPECT_NE(e.body.find(what), std::string::npos) << path << ": " << e.body;
  }
  json unsigned_params = good;
  unsigned_params.erase("signature");
  json bu = chat_body("Hello", 4);
  bu["kv_transfer_params"] = unsigned_params;
  HttpReply eu = post_json(*dc, bu.dump());
  EXPECT_EQ(eu.status, 400) << eu.body;
  EXPECT_NE(eu.body.find("signature is missing"), std::string::npos) << eu.body;
  EXPECT_EQ(metric(*dc, "zest_kv_transfer_reads_total"), 0);
  // The untouched params still work (the offer was kept), and the prefill instance's offer is then released.
  json ok = chat_body("Hello", 4);
  ok["kv_transfer_params"] = good;
  HttpReply fine = post_json(*dc, ok.dump());
  EXPECT_EQ(fine.status, 200) << fine.body;
  EXPECT_EQ(wait_metric(*pc, "zest_kv_transfer_held", 0), 0);
  // A decode instance that refuses a request with good params (max_tokens past its context) releases the offer at
  // once rather than leave it to --kv-hold-s.
  HttpReply p2 = post_json(*pc, body.dump());
  ASSERT_EQ(p2.status, 200) << p2.body;
  EXPECT_EQ(metric(*pc, "zest_kv_transfer_held"), 1);
  json too_long = chat_body("Hello", 1 << 20);
  too_long["kv_transfer_params"] = p2.j["kv_transfer_params"];
  HttpReply tl = post_json(*dc, too_long.dump());
  EXPECT_EQ(tl.status, 400) << tl.body;
  EXPECT_EQ(wait_metric(*pc, "zest_kv_transfer_held", 0), 0);
  EXPECT_EQ(metric(*pc, "zest_kv_transfer_expired_total"), 0);
}

}  // namespace
