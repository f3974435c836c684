// `zest front`: the router clients talk to when prefill and decode run as separate instances (server/disagg.h).
//
// It follows the two-step proxy pattern vLLM documents for disaggregated prefill: a chat completion goes to a
// prefill instance with kv_transfer_params {"do_remote_decode": true} (not streamed), and the client's request goes
// again, with the kv_transfer_params that instance returned, to a decode instance, whose answer (JSON or SSE stream)
// is passed through unchanged. Instances are taken round robin; one that cannot be connected to is skipped for the
// next (nothing reached it, so the request is safe to send again). An error answer of either step reaches the client
// with its status; 502 names the instances when none could be reached. Other routes (POST /v1/completions, /tokenize,
// /detokenize, GET /v1/models) go whole to a decode instance; GET /health answers 200 when every instance does;
// GET /metrics has the front's counters. A client that hangs up mid-stream closes the decode instance's connection
// too (which aborts the request there and frees its blocks).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace zest::server {

struct FrontOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0 = any free port
  std::vector<std::string> prefill, decode;  // instance URLs, "http://host:port"
  int http_threads = 64;
  int64_t max_body_bytes = 32 << 20;
  int upstream_timeout_s = 600;  // longest wait for an instance's answer (or the next piece of a stream)
};

class Front {
 public:
  // Checks the URLs, binds host:port and starts serving; the instances need not be up yet.
  static Result<std::unique_ptr<Front>> start(FrontOptions opts);
  ~Front();
  Front(const Front&) = delete;
  Front& operator=(const Front&) = delete;
  int port() const;
  void stop();

  struct Impl;

 private:
  explicit Front(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zest::server
