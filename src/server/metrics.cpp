#include "server/metrics.h"

#include <cstdio>

namespace zest::server {
namespace {

// Prometheus float formatting: shortest round-trip-safe enough for bounds and sums.
std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.12g", v);
  return buf;
}

void header(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void counter(std::string& out, const std::string& name, const std::string& help, int64_t v) {
  header(out, name, "counter", help);
  out += name + " " + std::to_string(v) + "\n";
}

void gauge(std::string& out, const std::string& name, const std::string& help, double v) {
  header(out, name, "gauge", help);
  out += name + " " + num(v) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  header(out, name, "histogram", help);
  int64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + num(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
             20.0, 40.0, 80.0, 160.0, 640.0}),
      tpot_({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
             2.5, 5.0, 7.5, 10.0}),
      e2e_({0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
            60.0, 120.0, 240.0, 480.0, 960.0, 1920.0}),
      queue_({0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0,
              40.0, 80.0, 160.0}) {
  for (const char* r : {"stop", "length", "abort", "error"}) finished_[r] = 0;
}

void Metrics::record_finished(const FinishedRequest& r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (r.time_to_first_token_s >= 0) ttft_.observe(r.time_to_first_token_s);
  if (r.time_per_output_token_s >= 0) tpot_.observe(r.time_per_output_token_s);
  if (r.e2e_latency_s >= 0) e2e_.observe(r.e2e_latency_s);
  if (r.queue_time_s >= 0) queue_.observe(r.queue_time_s);
  prompt_tokens_ += r.prompt_tokens;
  generation_tokens_ += r.generation_tokens;
  visual_before_ += r.visual_tokens_before;
  visual_after_ += r.visual_tokens_after;
  ++finished_[r.finish_reason];
}

void Metrics::record_rejected(int http_status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++rejected_[http_status];
}

void Metrics::add_provider(MetricsProvider provider) {
  std::lock_guard<std::mutex> lock(mu_);
  providers_.push_back(std::move(provider));
}

std::string Metrics::render(const engine::EngineStats& stats) const {
  std::string out;
  std::vector<MetricsProvider> providers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ttft_.render(out, "zest_time_to_first_token_seconds",
                 "Time from HTTP arrival to the first generated token, per request.");
    tpot_.render(out, "zest_time_per_output_token_seconds",
                 "Mean time per output token after the first, per request with more than one token.");
    e2e_.render(out, "zest_e2e_request_latency_seconds", "Time from HTTP arrival to the end of the request.");
    queue_.render(out, "zest_request_queue_time_seconds",
                  "Time a request waited in the engine queue before its first scheduled step.");
    counter(out, "zest_prompt_tokens_total", "Prompt tokens of finished requests (after image expansion).",
            prompt_tokens_);
    counter(out, "zest_generation_tokens_total", "Generated tokens of finished requests.", generation_tokens_);
    counter(out, "zest_visual_tokens_before_total", "Visual tokens produced by the vision tower, before pruning.",
            visual_before_);
    counter(out, "zest_visual_tokens_after_total", "Visual tokens sent to the decoder, after pruning.",
            visual_after_);
    header(out, "zest_requests_total", "counter", "Requests that reached the engine and ended, by finish reason.");
    for (const auto& [reason, n] : finished_)
      out += "zest_requests_total{finish_reason=\"" + reason + "\"} " + std::to_string(n) + "\n";
    header(out, "zest_requests_rejected_total", "counter",
           "Requests refused before they reached the engine, by HTTP status.");
    for (const auto& [status, n] : rejected_)
      out += "zest_requests_rejected_total{status=\"" + std::to_string(status) + "\"} " + std::to_string(n) + "\n";
    providers = providers_;
  }
  gauge(out, "zest_requests_running", "Requests in the running batch.", static_cast<double>(stats.running));
  gauge(out, "zest_requests_waiting", "Requests waiting for admission.", static_cast<double>(stats.waiting));
  gauge(out, "zest_kv_cache_usage_ratio", "Fraction of KV-cache blocks in use (0 to 1).",
        stats.kv_blocks_total > 0 ? static_cast<double>(stats.kv_blocks_used) / stats.kv_blocks_total : 0.0);
  gauge(out, "zest_kv_blocks_used", "KV-cache blocks in use.", static_cast<double>(stats.kv_blocks_used));
  gauge(out, "zest_kv_blocks_total", "KV-cache blocks in the pool.", static_cast<double>(stats.kv_blocks_total));
  counter(out, "zest_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache at admission.",
          stats.prefix_cache_queries);
  counter(out, "zest_prefix_cache_hits_total", "Prompt tokens found in the prefix cache (their prefill skipped).",
          stats.prefix_cache_hits);
  gauge(out, "zest_prefix_cache_hit_rate", "Prefix cache hits over queries since the start (tokens, 0 to 1).",
        stats.prefix_cache_queries > 0
            ? static_cast<double>(stats.prefix_cache_hits) / static_cast<double>(stats.prefix_cache_queries)
            : 0.0);
  counter(out, "zest_kv_exports_total", "Prompts whose K/V were copied out for a decode instance (--role prefill).",
          stats.kv_exports);
  counter(out, "zest_kv_imports_total",
          "Prompts whose K/V, read from a prefill instance, were written into this cache (--role decode).",
          stats.kv_imports);
  counter(out, "zest_prefix_cache_waits_total",
          "Admissions put off by a step to take a prefix block that a running request was computing.",
          stats.prefix_waits);
  gauge(out, "zest_prefix_cache_blocks", "KV-cache blocks registered in the prefix cache (held or evictable).",
        static_cast<double>(stats.prefix_cache_blocks));
  counter(out, "zest_engine_decode_steps_total", "Decode-only engine steps (every scheduled sequence one token).",
          stats.decode_steps);
  header(out, "zest_engine_decode_step_seconds_total", "counter",
         "Host wall time of decode-only steps: scheduling, the forward call, token handling.");
  out += "zest_engine_decode_step_seconds_total " + num(stats.decode_step_s) + "\n";
  header(out, "zest_engine_decode_forward_seconds_total", "counter",
         "Wall time of the decode-only steps' forward calls (input staging, launch, device work, wait).");
  out += "zest_engine_decode_forward_seconds_total " + num(stats.decode_forward_s) + "\n";
  counter(out, "zest_engine_decode_intervals_total", "Decode-only steps that directly followed another.",
          stats.decode_intervals);
  header(out, "zest_engine_decode_interval_seconds_total", "counter",
         "Sum over those steps of the time from the previous step's start to theirs (time per token as the engine "
         "runs it).");
  out += "zest_engine_decode_interval_seconds_total " + num(stats.decode_interval_s) + "\n";
  for (const MetricsProvider& p : providers) p(out);
  return out;
}

}  // namespace zest::server
