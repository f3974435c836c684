// zest front: the router of a disaggregated deployment (see src/server/front.h). Runs until SIGINT/SIGTERM.
#include <pthread.h>
#include <signal.h>

#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "server/front.h"

namespace zest::cli {

void register_front(CLI::App& app, std::function<int()>& run) {
  auto o = std::make_shared<server::FrontOptions>();
  CLI::App* sub = app.add_subcommand(
      "front", "Route chat completions through a prefill instance and a decode instance (zest serve --role ...)");
  sub->add_option("--prefill", o->prefill, "prefill instance URL (http://host:port), repeatable")->required();
  sub->add_option("--decode", o->decode, "decode instance URL (http://host:port), repeatable")->required();
  sub->add_option("--host", o->host, "address to listen on")->capture_default_str();
  sub->add_option("--port", o->port, "TCP port (0 = any free port, printed at start)")->capture_default_str();
  sub->add_option("--http-threads", o->http_threads, "HTTP handler threads")->capture_default_str();
  sub->add_option("--upstream-timeout-s", o->upstream_timeout_s,
                  "longest wait for an instance's answer or the next piece of its stream")
      ->capture_default_str();
  sub->callback([o, &run] {
    run = [o] {
      sigset_t stop_signals;
      sigemptyset(&stop_signals);
      sigaddset(&stop_signals, SIGINT);
      sigaddset(&stop_signals, SIGTERM);
      pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
      auto f = server::Front::start(*o);
      if (!f.ok()) return fail(f.status());
      std::cerr << "zest front: on http://" << o->host << ":" << (*f)->port() << " (" << o->prefill.size()
                << " prefill, " << o->decode.size() << " decode instances)" << std::endl;
      int sig = 0;
      sigwait(&stop_signals, &sig);
      std::cerr << "zest front: stopping" << std::endl;
      (*f)->stop();
      return 0;
    };
  });
}

}  // namespace zest::cli
