// zest: inference engine and server for Qwen3-MoE / Qwen3-VL models.
#include <iostream>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"zest: inference engine for Qwen3-MoE and Qwen3-VL models"};
  app.require_subcommand(1);
  std::function<int()> run;
  zest::cli::register_generate(app, run);
  zest::cli::register_logits(app, run);
  zest::cli::register_tokenize(app, run);
  zest::cli::register_serve(app, run);
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
