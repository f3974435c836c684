// The zest subcommands; each registers itself on the app and returns the callback's exit code.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace zest::cli {

// Registers a subcommand; *run is set to its entry point when it is the one selected.
void register_generate(CLI::App& app, std::function<int()>& run);
void register_logits(CLI::App& app, std::function<int()>& run);
void register_tokenize(CLI::App& app, std::function<int()>& run);
void register_serve(CLI::App& app, std::function<int()>& run);
void register_front(CLI::App& app, std::function<int()>& run);
void register_bench(CLI::App& app, std::function<int()>& run);
void register_calibrate_sere(CLI::App& app, std::function<int()>& run);
void register_eval(CLI::App& app, std::function<int()>& run);
void register_sere_protect(CLI::App& app, std::function<int()>& run);
void register_calibrate_visionzip(CLI::App& app, std::function<int()>& run);

}  // namespace zest::cli
