// zest bench serve: load generator for an OpenAI-compatible chat server (zest serve, or any other),
// shaped like vLLM's `bench serve`: Poisson arrivals at --rate, at most --concurrency in flight, fixed
// output length (ignore_eos + max_tokens), streaming; reports TTFT, TPOT, ITL and end-to-end latency
// (mean, median, p90, p99) and request / token throughput; against a zest server also what its engine measured of
// the run's decode steps (the zest_engine_decode_* counters of /metrics before and after).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/timer.h"
#include "io/image.h"
#include "server/http.h"
#include "server/openai.h"

namespace zest::cli {
namespace {

using nlohmann::json;

struct BenchServeArgs {
  std::string url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/chat/completions";
  std::string model;
  int64_t requests = 100;
  double rate = 0;  // requests per second; <= 0 or inf = all at once
  int64_t concurrency = 0;
  int64_t images = 0;
  std::string image;
  std::string image_size;    // WxH: resize --image first (empty = as it is)
  bool same_images = false;  // send --image unchanged (hits the server's encoder cache after the first)
  std::string table_row;     // also print one markdown table row with this label
  std::string extra_body;    // JSON object merged into every request body
  int64_t output_len = 128;
  int64_t prompt_len = 256;
  uint64_t seed = 0;
  double timeout_s = 600;
  std::string output_json;
};

struct RequestResult {
  bool ok = false;
  std::string error;
  double ttft_ms = 0, e2e_ms = 0;
  std::vector<double> itl_ms;
  int64_t prompt_tokens = 0, output_tokens = 0;
};

std::string base64_encode(const std::vector<uint8_t>& in) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  for (size_t i = 0; i < in.size(); i += 3) {
    const uint32_t b0 = in[i], b1 = i + 1 < in.size() ? in[i + 1] : 0, b2 = i + 2 < in.size() ? in[i + 2] : 0;
    const uint32_t v = (b0 << 16) | (b1 << 8) | b2;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < in.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += i + 2 < in.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

// The image as a data: URL, or an error naming the file.
Result<std::string> image_data_url(const std::string& path) {
  auto bytes = io::read_image_source(path);
  if (!bytes.ok()) return bytes.status().with_context("--image " + path);
  const io::ImageFormat f = io::sniff_image_format(bytes->data(), bytes->size());
  const char* mime = f == io::ImageFormat::kPng    ? "image/png"
                     : f == io::ImageFormat::kJpeg ? "image/jpeg"
                     : f == io::ImageFormat::kWebp ? "image/webp"
                                                   : nullptr;
  if (!mime) return invalid_argument("--image " + path + " is not a JPEG, PNG or WebP file");
  return "data:" + std::string(mime) + ";base64," + base64_encode(*bytes);
}

// Width and height from "WxH".
Result<std::pair<int, int>> parse_size(const std::string& s) {
  int w = 0, h = 0;
  char x = 0, extra = 0;
  if (std::sscanf(s.c_str(), "%d%c%d%c", &w, &x, &h, &extra) != 3 || (x != 'x' && x != 'X') || w <= 0 || h <= 0 ||
      w > 16384 || h > 16384)
    return invalid_argument("--image-size '" + s + "' is not WxH (e.g. 640x480)");
  return std::make_pair(w, h);
}

// Nearest-neighbour resize (a load generator needs the size, not the quality).
io::Image resize_nearest(const io::Image& src, int w, int h) {
  io::Image out;
  out.width = w;
  out.height = h;
  out.rgb.resize(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    const int64_t sy = static_cast<int64_t>(y) * src.height / h;
    for (int x = 0; x < w; ++x) {
      const int64_t sx = static_cast<int64_t>(x) * src.width / w;
      std::memcpy(&out.rgb[(static_cast<size_t>(y) * w + x) * 3], &src.rgb[(sy * src.width + sx) * 3], 3);
    }
  }
  return out;
}

// The JPEG data: URLs of every request's images: copies of --image (resized to --image-size), each made
// distinct from all others (a stripe of pixels in its first row encodes its index and the seed) unless
// --same-images,
// so that the server's vision encoder cache does not serve repeats.
Result<std::vector<std::string>> request_images(const BenchServeArgs& a, int64_t count) {
  if (a.same_images && a.image_size.empty()) {
    ZEST_ASSIGN_OR_RETURN(std::string url, image_data_url(a.image));
    return std::vector<std::string>(static_cast<size_t>(count), url);
  }
  ZEST_ASSIGN_OR_RETURN(io::Image img, io::load_image(a.image));
  if (!a.image_size.empty()) {
    ZEST_ASSIGN_OR_RETURN(auto wh, parse_size(a.image_size));
    img = resize_nearest(img, wh.first, wh.second);
  }
  std::vector<std::string> urls;
  for (int64_t i = 0; i < (a.same_images ? 1 : count); ++i) {
    io::Image v = img;
    // 48 black/white pixels: the image index mixed with the seed (runs with other seeds get other images).
    uint64_t mark = a.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i);
    mark = (mark ^ (mark >> 31)) * 0xBF58476D1CE4E5B9ull;
    mark ^= mark >> 29;
    for (int b = 0; b < 48 && b < v.width; ++b) {
      uint8_t* px = &v.rgb[static_cast<size_t>(b) * 3];
      px[0] = px[1] = px[2] = ((mark >> b) & 1) ? 255 : 0;
    }
    ZEST_ASSIGN_OR_RETURN(std::vector<uint8_t> jpeg, io::encode_jpeg(v, 90));
    urls.push_back("data:image/jpeg;base64," + base64_encode(jpeg));
  }
  if (a.same_images) urls.resize(static_cast<size_t>(count), urls[0]);
  return urls;
}

// About `n` words of random text: common English words mixed with made-up ones (consonant-vowel
// syllables), so that prompts differ in content and not only in word order (a model's routing and output
// then differ from request to request). A common word is about one token of Qwen's tokenizer, a made-up
// one about two.
std::string random_prompt(int64_t n, std::mt19937_64& rng) {
  static const char* kWords[] = {
      "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school",
      "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week",
      "company", "system", "program", "question", "work", "government", "number", "night", "point", "home",
      "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book",
      "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service", "friend",
      "father", "power", "hour", "game", "line", "end", "member", "law", "car", "city", "community", "name"};
  static const char kConsonants[] = "bcdfghjklmnprstvwz";
  static const char kVowels[] = "aeiou";
  constexpr size_t kCount = sizeof(kWords) / sizeof(kWords[0]);
  std::string s;
  for (int64_t i = 0; i < n; ++i) {
    if (i) s += ' ';
    if (rng() % 2 == 0) {
      s += kWords[rng() % kCount];
    } else {
      const int syllables = 2 + static_cast<int>(rng() % 2);
      for (int k = 0; k < syllables; ++k) {
        s += kConsonants[rng() % (sizeof(kConsonants) - 1)];
        s += kVowels[rng() % (sizeof(kVowels) - 1)];
      }
    }
  }
  return s;
}

// Linear-interpolation percentile (as numpy.percentile), p in [0, 100]; 0 for no samples.
double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

RequestResult send_one(const BenchServeArgs& a, const std::string& body) {
  RequestResult r;
  httplib::Client cli(a.url);
  cli.set_connection_timeout(static_cast<time_t>(a.timeout_s));
  cli.set_read_timeout(static_cast<time_t>(a.timeout_s));
  cli.set_write_timeout(static_cast<time_t>(a.timeout_s));
  httplib::Request req;
  req.method = "POST";
  req.path = a.endpoint;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.body = body;
  int status = 0;
  std::string error_text;
  server::SseReader sse;
  std::vector<std::string> events;
  const double start = now_ms();
  double last = 0;
  bool first = true, seen_content = false;
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status != 200) {
      error_text.append(data, n);
      return true;
    }
    const double t = now_ms();
    events.clear();
    sse.feed(data, n, events);
    for (const std::string& e : events) {
      if (e == "[DONE]") continue;
      json j = json::parse(e, nullptr, false);
      if (j.is_discarded()) {
        r.error = "unparsable event: " + e.substr(0, 200);
        return false;
      }
      if (j.contains("error")) {
        r.error = j["error"].value("message", "error event");
        continue;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        r.prompt_tokens = j["usage"].value("prompt_tokens", int64_t{0});
        r.output_tokens = j["usage"].value("completion_tokens", int64_t{0});
      }
      if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) continue;
      if (first) {
        r.ttft_ms = t - start;
        first = false;
      }
      const json& delta = j["choices"][0].contains("delta") ? j["choices"][0]["delta"] : json();
      if (delta.is_object() && delta.contains("content") && delta["content"].is_string() &&
          !delta["content"].get<std::string>().empty()) {
        if (seen_content) r.itl_ms.push_back(t - last);
        seen_content = true;
        last = t;
      }
    }
    return true;
  };
  auto res = cli.send(req);
  r.e2e_ms = now_ms() - start;
  if (!res) {
    r.error = "HTTP error: " + httplib::to_string(res.error());
  } else if (status != 200) {
    json j = json::parse(error_text, nullptr, false);
    r.error = "status " + std::to_string(status) + ": " +
              (!j.is_discarded() && j.contains("error") ? j["error"].value("message", error_text) : error_text);
  } else if (r.error.empty() && first) {
    r.error = "the stream ended without a chunk";
  }
  r.ok = r.error.empty();
  return r;
}

Result<std::string> resolve_model(const BenchServeArgs& a) {
  if (!a.model.empty()) return a.model;
  httplib::Client cli(a.url);
  cli.set_connection_timeout(10);
  auto res = cli.Get("/v1/models");
  if (!res) return not_found("cannot reach " + a.url + "/v1/models: " + httplib::to_string(res.error()));
  json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string())
    return invalid_argument(a.url + "/v1/models lists no model; pass --model");
  return j["data"][0]["id"].get<std::string>();
}

// The server's counters named zest_engine_decode_* (zest's /metrics), or an empty map when the server has none.
std::map<std::string, double> engine_counters(const BenchServeArgs& a) {
  std::map<std::string, double> out;
  httplib::Client cli(a.url);
  cli.set_connection_timeout(5);
  cli.set_read_timeout(5);
  auto res = cli.Get("/metrics");
  if (!res || res->status != 200) return out;
  std::istringstream in(res->body);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("zest_engine_decode_", 0) != 0) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos) continue;
    char* end = nullptr;
    const double v = std::strtod(line.c_str() + sp + 1, &end);
    if (end != line.c_str() + sp + 1) out[line.substr(0, sp)] = v;
  }
  return out;
}

// What the server's engine measured of its decode-only steps during the run (differences of its counters): per
// step, the interval between consecutive decode steps' starts, the forward call, and the host's time outside it.
struct EngineSteps {
  double steps = 0, interval_ms = 0, forward_ms = 0;
};
std::optional<EngineSteps> engine_steps(const std::map<std::string, double>& before,
                                        const std::map<std::string, double>& after) {
  auto delta = [&](const char* name) -> std::optional<double> {
    const auto b = before.find(name), e = after.find(name);
    if (b == before.end() || e == after.end()) return std::nullopt;
    return e->second - b->second;
  };
  const auto n = delta("zest_engine_decode_steps_total"), ni = delta("zest_engine_decode_intervals_total"),
             fs = delta("zest_engine_decode_forward_seconds_total"), is = delta("zest_engine_decode_interval_seconds_total");
  if (!n || !ni || !fs || !is || *n <= 0 || *ni <= 0) return std::nullopt;
  return EngineSteps{*n, 1e3 * *is / *ni, 1e3 * *fs / *n};
}

int run_bench_serve(const BenchServeArgs& a) {
  if (a.requests <= 0) return fail(invalid_argument("--requests must be positive"));
  if (a.output_len <= 0 || a.prompt_len <= 0) return fail(invalid_argument("--output-len and --prompt-len must be positive"));
  if (a.images < 0) return fail(invalid_argument("--images must not be negative"));
  if (a.images > 0 && a.image.empty()) return fail(invalid_argument("--images needs --image PATH (a JPEG, PNG or WebP)"));
  std::vector<std::string> image_urls;
  if (a.images > 0) {
    auto u = request_images(a, a.requests * a.images);
    if (!u.ok()) return fail(u.status().with_context("--image " + a.image));
    image_urls = std::move(u).value();
  }
  json extra = json::object();
  if (!a.extra_body.empty()) {
    extra = json::parse(a.extra_body, nullptr, false);
    if (extra.is_discarded() || !extra.is_object())
      return fail(invalid_argument("--extra-body must be a JSON object, e.g. '{\"sere\": false}'"));
  }
  auto model = resolve_model(a);
  if (!model.ok()) return fail(model.status());

  // Request bodies and Poisson arrival times (seconds from the start), all from the seed.
  std::mt19937_64 rng(a.seed);
  const int64_t n = a.requests;
  std::vector<std::string> bodies(n);
  std::vector<double> arrival(n, 0.0);
  const bool paced = a.rate > 0 && std::isfinite(a.rate);
  std::exponential_distribution<double> gap(paced ? a.rate : 1.0);
  double t = 0;
  for (int64_t i = 0; i < n; ++i) {
    json content = json::array();
    for (int64_t k = 0; k < a.images; ++k)
      content.push_back({{"type", "image_url"}, {"image_url", {{"url", image_urls[i * a.images + k]}}}});
    content.push_back({{"type", "text"}, {"text", random_prompt(a.prompt_len, rng)}});
    json body = {{"model", *model},
                 {"messages", json::array({{{"role", "user"}, {"content", content}}})},
                 {"max_tokens", a.output_len},
                 {"ignore_eos", true},
                 {"temperature", 0},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
    body.update(extra);
    bodies[i] = body.dump();
    if (paced) t += gap(rng);
    arrival[i] = t;
  }

  const std::map<std::string, double> counters_before = engine_counters(a);
  const int64_t workers = a.concurrency > 0 ? std::min(a.concurrency, n) : std::min<int64_t>(n, 256);
  std::vector<RequestResult> results(n);
  std::atomic<int64_t> next{0};
  const auto t0 = std::chrono::steady_clock::now();
  const double start_ms = now_ms();
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
        std::this_thread::sleep_until(t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                               std::chrono::duration<double>(arrival[i])));
        results[i] = send_one(a, bodies[i]);
      }
    });
  for (auto& th : pool) th.join();
  const double duration_s = (now_ms() - start_ms) / 1000.0;
  const std::optional<EngineSteps> eng = engine_steps(counters_before, engine_counters(a));

  int64_t ok = 0, in_tok = 0, out_tok = 0;
  std::vector<double> ttft, tpot, itl, e2e;
  std::string first_error;
  for (const RequestResult& r : results) {
    if (!r.ok) {
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ++ok;
    in_tok += r.prompt_tokens;
    out_tok += r.output_tokens;
    ttft.push_back(r.ttft_ms);
    e2e.push_back(r.e2e_ms);
    if (r.output_tokens > 1) tpot.push_back((r.e2e_ms - r.ttft_ms) / static_cast<double>(r.output_tokens - 1));
    itl.insert(itl.end(), r.itl_ms.begin(), r.itl_ms.end());
  }

  auto line = [](const char* k, double v, int prec = 2) { std::printf("%-40s%-10.*f\n", k, prec, v); };
  auto count = [](const char* k, int64_t v) { std::printf("%-40s%-10lld\n", k, static_cast<long long>(v)); };
  auto section = [&](const char* title, const char* name, const std::vector<double>& v) {
    std::printf("%s\n", title);
    const std::string s(name);
    line(("Mean " + s + " (ms):").c_str(), mean(v));
    line(("Median " + s + " (ms):").c_str(), percentile(v, 50));
    line(("P90 " + s + " (ms):").c_str(), percentile(v, 90));
    line(("P99 " + s + " (ms):").c_str(), percentile(v, 99));
  };
  std::printf("============ Serving Benchmark Result ============\n");
  count("Successful requests:", ok);
  count("Failed requests:", n - ok);
  if (paced) line("Request rate configured (RPS):", a.rate);
  else std::printf("%-40s%-10s\n", "Request rate configured (RPS):", "inf");
  count("Maximum request concurrency:", workers);
  line("Benchmark duration (s):", duration_s);
  count("Total input tokens:", in_tok);
  count("Total generated tokens:", out_tok);
  line("Request throughput (req/s):", ok / duration_s);
  line("Output token throughput (tok/s):", out_tok / duration_s);
  line("Total token throughput (tok/s):", (in_tok + out_tok) / duration_s);
  section("---------------Time to First Token----------------", "TTFT", ttft);
  section("-----Time per Output Token (excl. 1st token)------", "TPOT", tpot);
  section("---------------Inter-token Latency----------------", "ITL", itl);
  section("----------------End-to-end Latency----------------", "E2EL", e2e);
  if (eng) {  // zest servers: their engine's own view of the decode steps of the run
    std::printf("-------Engine decode steps (server /metrics)-------\n");
    count("Decode steps:", static_cast<int64_t>(eng->steps));
    line("Mean interval between steps (ms):", eng->interval_ms, 3);
    line("Mean forward call (ms):", eng->forward_ms, 3);
    line("Mean host time outside forward (ms):", eng->interval_ms - eng->forward_ms, 3);
  }
  std::printf("==================================================\n");
  if (!first_error.empty()) std::fprintf(stderr, "first failure: %s\n", first_error.c_str());
  if (!a.table_row.empty())
    std::printf("| %s | %lld | %lld/%lld | %.1f | %.1f | %.2f | %.2f | %.2f | %.1f |\n", a.table_row.c_str(),
                static_cast<long long>(workers), static_cast<long long>(ok), static_cast<long long>(n),
                percentile(ttft, 50), percentile(ttft, 99), percentile(tpot, 50), percentile(tpot, 99), ok / duration_s,
                out_tok / duration_s);

  if (!a.output_json.empty()) {
    auto stats = [](const std::vector<double>& v) {
      return json{{"mean_ms", mean(v)}, {"median_ms", percentile(v, 50)}, {"p90_ms", percentile(v, 90)},
                  {"p99_ms", percentile(v, 99)}};
    };
    json j = {{"completed", ok},
              {"failed", n - ok},
              {"request_rate", paced ? json(a.rate) : json("inf")},
              {"max_concurrency", workers},
              {"duration_s", duration_s},
              {"total_input_tokens", in_tok},
              {"total_output_tokens", out_tok},
              {"request_throughput", ok / duration_s},
              {"output_throughput", out_tok / duration_s},
              {"total_token_throughput", (in_tok + out_tok) / duration_s},
              {"ttft", stats(ttft)},
              {"tpot", stats(tpot)},
              {"itl", stats(itl)},
              {"e2el", stats(e2e)}};
    if (eng)
      j["engine_decode_steps"] = {{"steps", eng->steps},
                                  {"interval_ms", eng->interval_ms},
                                  {"forward_ms", eng->forward_ms},
                                  {"host_ms", eng->interval_ms - eng->forward_ms}};
    std::ofstream f(a.output_json);
    if (!f) return fail(not_found("cannot write --output-json " + a.output_json));
    f << j.dump(2) << "\n";
  }
  return ok == n ? 0 : 1;
}

}  // namespace

void register_bench_serve(CLI::App& bench, std::function<int()>& run) {
  auto a = std::make_shared<BenchServeArgs>();
  CLI::App* sub = bench.add_subcommand("serve", "Load-test an OpenAI-compatible chat server (TTFT, TPOT, throughput)");
  sub->add_option("--url", a->url, "server base URL")->capture_default_str();
  sub->add_option("--endpoint", a->endpoint, "chat-completions path")->capture_default_str();
  sub->add_option("--model", a->model, "model name to send (default: the first of /v1/models)");
  sub->add_option("--requests", a->requests, "number of requests")->capture_default_str();
  sub->add_option("--rate", a->rate, "Poisson arrival rate in requests/s (0 or inf = all at once)")
      ->capture_default_str();
  sub->add_option("--concurrency", a->concurrency, "requests in flight at most (0 = up to 256)")
      ->capture_default_str();
  sub->add_option("--images", a->images, "images per request (copies of --image)")->capture_default_str();
  sub->add_option("--image", a->image, "image file sent as a data: URL (re-encoded as JPEG unless --same-images)");
  sub->add_option("--image-size", a->image_size, "resize --image to WxH first (e.g. 640x480)");
  sub->add_flag("--same-images", a->same_images,
                "send --image unchanged in every request (otherwise each image is made distinct, so that the "
                "server's encoder cache does not serve repeats)");
  sub->add_option("--extra-body", a->extra_body,
                  "JSON object merged into every request body (e.g. '{\"vision_prune\": {\"rate\": 0.4}}')");
  sub->add_option("--table-row", a->table_row,
                  "also print one markdown row: | LABEL | concurrency | ok/n | TTFT p50 | TTFT p99 | TPOT p50 | "
                  "TPOT p99 | req/s | output tok/s |");
  sub->add_option("--output-len", a->output_len, "generated tokens per request (ignore_eos)")->capture_default_str();
  sub->add_option("--prompt-len", a->prompt_len, "prompt words per request (about 1.5 tokens each)")
      ->capture_default_str();
  sub->add_option("--seed", a->seed, "seed of prompts and arrival times")->capture_default_str();
  sub->add_option("--timeout", a->timeout_s, "per-request timeout in seconds")->capture_default_str();
  sub->add_option("--output-json", a->output_json, "also write the results as JSON to this file");
  sub->callback([a, &run] { run = [a] { return run_bench_serve(*a); }; });
}

}  // namespace zest::cli
