// `zest serve`: an OpenAI-compatible HTTP server over the engine.
//
// Threads: one engine thread (EngineLoop) owns the engine; HTTP handler threads (a cpp-httplib pool)
// parse requests, build prompts (chat template, tokenizer, images, vision tower) and then talk to the
// engine thread only through its command queue and a per-request RequestChannel. Connections (read
// deadlines, per-address caps, seeing a client leave) are server/http_server.h's.
//
// Endpoints: POST /v1/chat/completions and POST /v1/completions (JSON or SSE stream), POST /tokenize and
// POST /detokenize (vLLM's shapes), GET /v1/models, GET /health, GET /metrics (Prometheus text). Errors are OpenAI-style JSON bodies with 4xx/5xx statuses.
// A client that disconnects has its request aborted (its KV blocks freed), also while its images are
// being prepared. Every limit below is checked before work is spent on what it bounds.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "engine/engine.h"
#include "engine/model_bundle.h"
#include "server/disagg.h"
#include "server/metrics.h"

namespace zest::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                   // 0 = any free port (read it back with Server::port())
  std::string served_model_name;     // name in /v1/models and responses; empty = model directory name
  bool allow_local_files = false;    // accept file:// URLs and paths as images (data: URLs always work)
  int64_t max_body_bytes = 32 << 20;  // larger request bodies get 413
  int64_t max_json_depth = 64;       // deeper nesting of arrays/objects in a body gets 400
  int64_t max_messages = 1024;       // messages per request
  int64_t max_content_parts = 4096;  // content parts per request (all messages)
  int64_t max_images = 16;           // images per request
  int64_t max_image_pixels = 32LL << 20;    // width * height of one image (read from its header)
  int64_t max_request_pixels = 64LL << 20;  // width * height summed over a request's images
  int64_t mm_max_pixels = 0;         // largest resized image (pixels) fed to the vision tower: the ceiling of a
                                     // request's mm_processor_kwargs and, below the model's max_pixels, the
                                     // default; 0 = the model's preprocessor max_pixels
  int http_threads = 0;              // handler threads; 0 = max(64, 2 * max_num_seqs + 32)
  int max_connections_per_client = 0;  // connections per client address (more: /health and /metrics only, then
                                       // closed); 0 = the handler threads less 16
  int keep_alive_timeout_s = 5;      // an idle kept-alive connection is closed after this
  int request_read_timeout_s = 30;   // a request (headers and body) must arrive within this (else 408 / close)
  int idle_read_timeout_s = 10;      // longest silence of a client while its request is read
  int stream_keepalive_ms = 1000;    // a silent stream gets a ": keep-alive" comment this often (ms); a
                                     // waiting non-streaming request checks its client's connection as often
  // Reasoning parser of chat replies: "qwen3" splits <think>...</think> into reasoning_content (the tokenizer must
  // have both tags as tokens), "none" leaves the text whole, "auto" is qwen3 for models whose chat template has the
  // enable_thinking switch (the Qwen3 text template) and none otherwise (the Qwen3-VL instruct template).
  std::string reasoning_parser = "auto";
  // Prefill/decode disaggregation (server/disagg.h). kBoth serves whole requests and refuses kv_transfer_params; a
  // prefill instance also answers requests with kv_transfer_params {"do_remote_decode": true} by offering the
  // prompt's K/V, a decode instance also continues requests with the kv_transfer_params a prefill instance returned.
  // Both serve requests without the field whole.
  Role role = Role::kBoth;
  double kv_hold_s = 60;          // prefill: an offered K/V nobody has read is dropped after this
  double kv_read_timeout_s = 30;  // decode: a K/V read that takes longer fails its request (503)
  std::string kv_secret;          // prefill and decode: signs / checks the params (required for those roles)
  KvTransfer kv_transfer = KvTransfer::kUcx;  // prefill: how its K/V is offered (decode follows the params)
  engine::EngineOptions engine;
};

class Server {
 public:
  // Binds host:port, starts the engine thread and the HTTP listener; returns once connections are
  // accepted. Errors: the port cannot be bound, bad options.
  static Result<std::unique_ptr<Server>> start(std::shared_ptr<engine::ModelBundle> model, ServerOptions opts);
  // Stops (see stop()).
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The bound TCP port.
  int port() const;
  // Open connections from the client address `ip` (as the per-address cap counts them).
  int connections_from(const std::string& ip) const;
  // The name the server answers to in "model".
  const std::string& model_name() const;
  // Aborts every request (streams end with an error event, waiting non-streaming calls get 503), stops
  // listening and joins all threads. Idempotent.
  void stop();
  // Adds text to every /metrics exposition (e.g. SERE per-layer expert gauges); see MetricsProvider.
  void add_metrics_provider(MetricsProvider provider);
  // Engine statistics after the engine thread's latest iteration.
  engine::EngineStats stats() const;

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zest::server
