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
  server::ServerOptions opts;
};

int run_serve(const ServeArgs& a) {
  // Block the stop signals in every thread (threads inherit the mask) and wait for them here.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto model = load_model(a.model);
  if (!model.ok()) return fail(model.status());
  auto srv = server::Server::start(std::move(model).value(), a.opts);
  if (!srv.ok()) return fail(srv.status());
  const engine::EngineStats s = (*srv)->stats();
  std::cerr << "zest serve: model '" << (*srv)->model_name() << "' on http://" << a.opts.host << ":" << (*srv)->port()
            << " (KV cache " << s.kv_blocks_total << " blocks)" << std::endl;
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
  CLI::App* sub = app.add_subcommand("serve", "Serve the OpenAI chat-completions API over HTTP");
  add_model_args(sub, a->model);
  sub->add_option("--host", o.host, "address to listen on")->capture_default_str();
  sub->add_option("--port", o.port, "TCP port (0 = any free port, printed at start)")->capture_default_str();
  sub->add_option("--max-num-seqs", o.engine.max_num_seqs, "requests decoded together at most")
      ->capture_default_str();
  sub->add_option("--max-batched-tokens", o.engine.max_batched_tokens, "tokens per engine step at most")
      ->capture_default_str();
  sub->add_option("--max-context", o.engine.max_context, "context limit in tokens (0 = model's, at most 32768)")
      ->capture_default_str();
  sub->add_option("--kv-blocks", o.engine.kv_blocks, "KV-cache blocks of 16 tokens (0 = 4 full contexts)")
      ->capture_default_str();
  sub->add_flag("--allow-local-files", o.allow_local_files, "accept file:// URLs and paths as images");
  sub->add_option("--max-body-bytes", o.max_body_bytes, "largest request body (bytes); larger ones get 413")
      ->capture_default_str();
  sub->add_option("--max-images", o.max_images, "images per request at most")->capture_default_str();
  sub->add_option("--served-model-name", o.served_model_name, "model name in the API (default: directory name)");
  sub->callback([a, &run] { run = [a] { return run_serve(*a); }; });
}

}  // namespace zest::cli
