// Server metrics in the Prometheus text exposition format (version 0.0.4): latency histograms,
// token and request counters, and engine gauges. Thread-safe: requests record from the engine
// thread, /metrics renders from HTTP handler threads.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace zest::server {

// Cumulative histogram with fixed upper bounds (seconds); not locked by itself.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends HELP, TYPE, the _bucket lines (le = each bound, then +Inf), _sum and _count.
  void render(std::string& out, const std::string& name, const std::string& help) const;
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; last = above every bound
  double sum_ = 0;
  int64_t count_ = 0;
};

// What the server records when a request that reached the engine ends. Times in seconds; a negative
// time means "did not happen" (no token before an abort, never scheduled) and is not observed.
struct FinishedRequest {
  std::string finish_reason;  // stop | length | abort | error
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  int64_t visual_tokens_before = 0, visual_tokens_after = 0;
  double time_to_first_token_s = -1;  // HTTP arrival -> first generated token
  double time_per_output_token_s = -1;  // (finish - first token) / (generated - 1), when generated > 1
  double e2e_latency_s = -1;          // HTTP arrival -> finish
  double queue_time_s = -1;           // engine arrival -> first scheduled
};

// Appends extra exposition text (complete HELP/TYPE/sample lines) when /metrics is rendered. Called
// from an HTTP handler thread, so it must read its own state thread-safely. This is where per-layer
// expert gauges (SERE) plug in.
using MetricsProvider = std::function<void(std::string& out)>;

class Metrics {
 public:
  Metrics();
  void record_finished(const FinishedRequest& r);
  // A request refused before it reached the engine, by HTTP status (400, 404, 413, ...).
  void record_rejected(int http_status);
  void add_provider(MetricsProvider provider);
  // The whole exposition, with gauges taken from `stats`.
  std::string render(const engine::EngineStats& stats) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, tpot_, e2e_, queue_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0, visual_before_ = 0, visual_after_ = 0;
  std::map<std::string, int64_t> finished_;  // by finish_reason
  std::map<int, int64_t> rejected_;          // by HTTP status
  std::vector<MetricsProvider> providers_;
};

}  // namespace zest::server
