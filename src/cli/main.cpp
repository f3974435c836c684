// zest: inference engine and server for Qwen3-MoE / Qwen3-VL models.
#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <iostream>

#include "cli/commands.h"

namespace {

// A fatal signal prints the signal and the call stack (function names: the executable exports its symbols) to
// stderr, then dies of the same signal, so that a crash in the field comes with the place it happened.
void on_fatal_signal(int sig) {
  const char* name = strsignal(sig);
  const char head[] = "zest: fatal signal: ";
  (void)!write(STDERR_FILENO, head, sizeof(head) - 1);
  (void)!write(STDERR_FILENO, name, std::strlen(name));
  (void)!write(STDERR_FILENO, "\n", 1);
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_crash_report() {
  void* warm[1];
  backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sa.sa_flags = SA_RESETHAND;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &sa, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  install_crash_report();
  CLI::App app{"zest: inference engine for Qwen3, Qwen3-MoE and Qwen3-VL models"};
  app.require_subcommand(1);
  std::function<int()> run;
  zest::cli::register_generate(app, run);
  zest::cli::register_logits(app, run);
  zest::cli::register_tokenize(app, run);
  zest::cli::register_serve(app, run);
  zest::cli::register_front(app, run);
  zest::cli::register_bench(app, run);
  zest::cli::register_calibrate_sere(app, run);
  zest::cli::register_eval(app, run);
  zest::cli::register_sere_protect(app, run);
  zest::cli::register_calibrate_visionzip(app, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return run ? run() : 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
