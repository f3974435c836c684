// Unit tests of the wire-format pieces: the SSE reader against the events a stream was built from
// (split at every byte), and histogram exposition against a plain count of random samples.
#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "server/metrics.h"
#include "server/openai.h"
#include "server_test_util.h"

namespace zest::server::testing {
namespace {

TEST(SseReader, ReassemblesEventsSplitAnywhere) {
  std::mt19937 rng(3);
  std::vector<std::string> expected;
  std::string stream;
  for (int i = 0; i < 20; ++i) {
    std::string data;
    const int len = static_cast<int>(rng() % 30);
    for (int k = 0; k < len; ++k) data += static_cast<char>('a' + rng() % 26);
    if (i % 5 == 0) stream += ": keep-alive\n\n";  // comments carry no event
    if (i % 4 == 1) {
      stream += "data: " + data + "\r\n\r\n";
    } else if (i % 4 == 2) {
      stream += "event: x\ndata: " + data + "\ndata: second\n\n";
      data += "\nsecond";
    } else {
      stream += "data: " + data + "\n\n";
    }
    expected.push_back(data);
  }
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    SseReader r;
    std::vector<std::string> got;
    r.feed(stream.data(), cut, got);
    r.feed(stream.data() + cut, stream.size() - cut, got);
    ASSERT_EQ(got, expected) << "split at byte " << cut;
  }
  SseReader r;
  std::vector<std::string> got;
  for (char c : stream) r.feed(&c, 1, got);
  EXPECT_EQ(got, expected);
}

TEST(Histogram, BucketsAreCumulativeCountsOfRandomSamples) {
  const std::vector<double> bounds = {0.001, 0.01, 0.1, 1.0, 10.0};
  Histogram h(bounds);
  std::mt19937 rng(11);
  std::lognormal_distribution<double> dist(-3.0, 2.0);
  std::vector<double> samples(500);
  double sum = 0;
  for (double& s : samples) {
    s = dist(rng);
    sum += s;
    h.observe(s);
  }
  std::string text;
  h.render(text, "x_seconds", "test");
  auto m = parse_metrics(text);
  for (double b : bounds) {
    int64_t n = 0;
    for (double s : samples) n += s <= b;
    std::ostringstream key;
    key << "x_seconds_bucket{le=\"" << b << "\"}";
    EXPECT_EQ(m[key.str()], n) << key.str();
  }
  EXPECT_EQ(m["x_seconds_bucket{le=\"+Inf\"}"], 500);
  EXPECT_EQ(m["x_seconds_count"], 500);
  EXPECT_NEAR(m["x_seconds_sum"], sum, 1e-9 * sum);  // printed with 12 significant digits
  EXPECT_NE(text.find("# TYPE x_seconds histogram"), std::string::npos);
}

TEST(Metrics, ProvidersAppendToTheExposition) {
  Metrics m;
  m.add_provider([](std::string& out) { out += "# TYPE zest_extra gauge\nzest_extra 7\n"; });
  FinishedRequest f;
  f.finish_reason = "length";
  f.prompt_tokens = 11;
  f.generation_tokens = 5;
  f.e2e_latency_s = 0.5;
  m.record_finished(f);
  engine::EngineStats s;
  s.kv_blocks_used = 3;
  s.kv_blocks_total = 12;
  auto v = parse_metrics(m.render(s));
  EXPECT_EQ(v["zest_extra"], 7);
  EXPECT_EQ(v["zest_prompt_tokens_total"], 11);
  EXPECT_EQ(v["zest_generation_tokens_total"], 5);
  EXPECT_EQ(v["zest_requests_total{finish_reason=\"length\"}"], 1);
  EXPECT_EQ(v["zest_requests_total{finish_reason=\"stop\"}"], 0);
  EXPECT_EQ(v["zest_time_to_first_token_seconds_count"], 0) << "a negative time is not observed";
  EXPECT_EQ(v["zest_kv_blocks_used"], 3);
  EXPECT_DOUBLE_EQ(v["zest_kv_cache_usage_ratio"], 3.0 / 12.0);
  EXPECT_EQ(v["zest_prefix_cache_hit_rate"], 0) << "no queries yet";
  s.prefix_cache_queries = 400;
  s.prefix_cache_hits = 96;
  s.prefix_cache_blocks = 9;
  v = parse_metrics(m.render(s));
  EXPECT_EQ(v["zest_prefix_cache_queries_total"], 400);
  EXPECT_EQ(v["zest_prefix_cache_hits_total"], 96);
  EXPECT_DOUBLE_EQ(v["zest_prefix_cache_hit_rate"], 96.0 / 400.0);
  EXPECT_EQ(v["zest_prefix_cache_blocks"], 9);
}

TEST(OpenAIFormat, ErrorBodiesAndInvalidUtf8) {
  const auto e = error_body(400, "'top_p' must be in (0, 1]", error_param("'top_p' must be in (0, 1]"));
  EXPECT_EQ(e["error"]["param"], "top_p");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["code"], 400);
  EXPECT_TRUE(error_body(500, "x")["error"]["param"].is_null());
  EXPECT_EQ(error_body(500, "x")["error"]["type"], "server_error");
  // A lone continuation byte must not throw; it becomes U+FFFD.
  const std::string ev = sse_event({{"content", std::string("a\x80z")}});
  EXPECT_EQ(ev, "data: {\"content\":\"a\xEF\xBF\xBDz\"}\n\n");
}

}  // namespace
}  // namespace zest::server::testing

namespace zest::server {
namespace {

TEST(JsonDepth, CountsBracketsOutsideStringsOnly) {
  EXPECT_FALSE(json_deeper_than(R"({"a": [[1, {"b": []}]]})", 5));
  EXPECT_TRUE(json_deeper_than(R"({"a": [[1, {"b": []}]]})", 4));
  // Brackets and escaped quotes inside strings do not nest.
  EXPECT_FALSE(json_deeper_than(R"({"a": "[[[[\"{{{{", "b": ["]]]"]})", 2));
  EXPECT_TRUE(json_deeper_than(std::string(100000, '['), 64));
  EXPECT_FALSE(json_deeper_than(std::string(64, '[') + std::string(64, ']'), 64));
}

}  // namespace
}  // namespace zest::server
