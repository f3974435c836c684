// zest serve: the OpenAI-compatible HTTP server (see src/server/server.h). Runs until SIGINT/SIGTERM.
#include <pthread.h>
#include <signal.h>

#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "server/server.h"

namespace zest::cli {
namespace {

struct ServeArgs {
  ModelArgs model;
  AccelArgs accel;
  server::ServerOptions opts;
  std::string role = "both";
  std::string kv_transfer = "ucx";
};

// SERE's per-layer averages as Prometheus gauges.
void sere_metrics(const engine::SereRuntime& sere, std::string& out) {
  const auto st = sere.layer_stats();
  out += "# HELP zest_sere_experts_per_layer_before Distinct experts per MoE layer per re-routed step, before SERE.\n"
         "# TYPE zest_sere_experts_per_layer_before gauge\n";
  std::string after = "# HELP zest_sere_experts_per_layer_after Distinct experts per MoE layer per re-routed step, after SERE.\n"
                      "# TYPE zest_sere_experts_per_layer_after gauge\n";
  std::string crit = "# HELP zest_sere_critical_experts_per_layer Experts kept for lack of a similar substitute, per step.\n"
                     "# TYPE zest_sere_critical_experts_per_layer gauge\n";
  for (size_t l = 0; l < st.size(); ++l) {
    if (st[l].steps == 0) continue;
    const double n = static_cast<double>(st[l].steps);
    const std::string lbl = "{layer=\"" + std::to_string(l) + "\"} ";
    out += "zest_sere_experts_per_layer_before" + lbl + std::to_string(st[l].distinct_before / n) + "\n";
    after += "zest_sere_experts_per_layer_after" + lbl + std::to_string(st[l].distinct_after / n) + "\n";
    crit += "zest_sere_critical_experts_per_layer" + lbl + std::to_string(st[l].critical / n) + "\n";
  }
  out += after + crit;
}

int run_serve(const ServeArgs& a) {
  // Block the stop signals in every thread (threads inherit the mask) and wait for them here.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto model = load_model(a.model);
  if (!model.ok()) return fail(model.status());
  const std::string note = random_model_note(**model);
  if (!note.empty()) std::cerr << "zest serve: " << note << std::endl;
  server::ServerOptions opts = a.opts;
  auto role = server::parse_role(a.role);
  if (!role.ok()) return fail(role.status());
  opts.role = *role;
  opts.kv_transfer = a.kv_transfer == "cuda-ipc" ? server::KvTransfer::kCudaIpc : server::KvTransfer::kUcx;
  auto sere_r = apply_accel(a.accel, **model, opts.engine);
  if (!sere_r.ok()) return fail(sere_r.status());
  std::shared_ptr<engine::SereRuntime> sere = std::move(sere_r).value();
  auto srv = server::Server::start(std::move(model).value(), opts);
  if (!srv.ok()) return fail(srv.status());
  if (sere) (*srv)->add_metrics_provider([sere](std::string& out) { sere_metrics(*sere, out); });
  const engine::EngineStats s = (*srv)->stats();
  std::cerr << "zest serve: model '" << (*srv)->model_name() << "' on http://" << a.opts.host << ":" << (*srv)->port()
            << " (KV cache " << s.kv_blocks_total << " blocks, role " << server::role_name(opts.role) << ")"
            << std::endl;
  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::cerr << "zest serve: stopping" << std::endl;
  (*srv)->stop();
  return 0;
}

}  // namespace

void register_serve(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<ServeArgs>();
  server::ServerOptions& o = a->opts;
  CLI::App* sub = app.add_subcommand(
      "serve", "Serve the OpenAI chat-completions API over HTTP (a checkpoint, or random weights with --config)");
  add_model_args(sub, a->model, /*random_model=*/true);
  add_accel_args(sub, a->accel);
  sub->add_option("--host", o.host, "address to listen on")->capture_default_str();
  sub->add_option("--port", o.port, "TCP port (0 = any free port, printed at start)")->capture_default_str();
  sub->add_option("--max-num-seqs", o.engine.max_num_seqs, "requests decoded together at most")
      ->capture_default_str();
  add_engine_args(sub, o.engine);
  sub->add_flag("--allow-local-files", o.allow_local_files, "accept file:// URLs and paths as images");
  sub->add_option("--max-body-bytes", o.max_body_bytes, "largest request body (bytes); larger ones get 413")
      ->capture_default_str();
  sub->add_option("--max-images", o.max_images, "images per request at most")->capture_default_str();
  sub->add_option("--max-json-depth", o.max_json_depth, "deepest nesting of arrays/objects in a request body")
      ->capture_default_str();
  sub->add_option("--max-messages", o.max_messages, "messages per request at most")->capture_default_str();
  sub->add_option("--max-content-parts", o.max_content_parts, "content parts per request at most (all messages)")
      ->capture_default_str();
  sub->add_option("--max-image-pixels", o.max_image_pixels, "width x height of one image at most (from its header)")
      ->capture_default_str();
  sub->add_option("--max-request-pixels", o.max_request_pixels, "width x height summed over a request's images")
      ->capture_default_str();
  sub->add_option("--mm-max-pixels", o.mm_max_pixels,
                  "largest resized image fed to the vision tower, in pixels: the default max_pixels and the most a request's mm_processor_kwargs may ask (0 = the model's max_pixels)")
      ->capture_default_str();
  sub->add_option("--reasoning-parser", o.reasoning_parser,
                  "split <think>...</think> out of chat replies into reasoning_content: qwen3, none, or auto (qwen3 "
                  "for models whose chat template has the thinking switch, the Qwen3 MoE text models)")
      ->check(CLI::IsMember({"auto", "qwen3", "none"}))
      ->capture_default_str();
  sub->add_option("--http-threads", o.http_threads, "HTTP handler threads (0 = max(64, 2 * max-num-seqs + 32))")
      ->capture_default_str();
  sub->add_option("--max-connections-per-client", o.max_connections_per_client,
                  "connections per client address (0 = the handler threads less 16); more get 429")
      ->capture_default_str();
  sub->add_option("--keep-alive-timeout", o.keep_alive_timeout_s, "seconds an idle kept-alive connection stays open")
      ->capture_default_str();
  sub->add_option("--request-read-timeout", o.request_read_timeout_s,
                  "seconds a request (headers and body) has to arrive")
      ->capture_default_str();
  sub->add_option("--idle-read-timeout", o.idle_read_timeout_s, "seconds of client silence allowed while reading a request")
      ->capture_default_str();
  sub->add_option("--served-model-name", o.served_model_name, "model name in the API (default: directory name)");
  sub->add_option("--role", a->role,
                  "prefill/decode disaggregation: both (whole requests), prefill (also offers a prompt's K/V to a "
                  "decode instance), decode (also continues from a prefill instance's K/V); zest front routes")
      ->check(CLI::IsMember({"both", "prefill", "decode"}))
      ->capture_default_str();
  sub->add_option("--kv-hold-s", o.kv_hold_s, "prefill: seconds an offered K/V waits for its reader before it is dropped")
      ->capture_default_str();
  sub->add_option("--kv-read-timeout-s", o.kv_read_timeout_s,
                  "decode: seconds a K/V read from a prefill instance may take before its request fails (503)")
      ->capture_default_str();
  sub->add_option("--kv-transfer", a->kv_transfer,
                  "prefill: how the K/V goes to the decode instance: ucx (a host copy read over UCX, any two hosts) or "
                  "cuda-ipc (the device copy mapped by a decode instance on the same GPU)")
      ->check(CLI::IsMember({"ucx", "cuda-ipc"}))
      ->capture_default_str();
  sub->add_option("--kv-secret", o.kv_secret,
                  "prefill and decode: the deployment's shared secret that signs the K/V params (16+ characters; "
                  "better given as ZEST_KV_SECRET)")
      ->envname("ZEST_KV_SECRET");
  sub->callback([a, &run] { run = [a] { return run_serve(*a); }; });
}

}  // namespace zest::cli
