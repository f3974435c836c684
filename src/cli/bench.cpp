// zest bench: the group of benchmark subcommands (`zest bench <name> ...`).
//
// To add a benchmark: write src/cli/bench_<name>.cpp defining
//   void register_bench_<name>(CLI::App& bench, std::function<int()>& run);
// which adds its subcommand to `bench` (as register_bench_serve does), declare it below and call it
// from register_bench. Nothing else needs to change.
#include "cli/commands.h"

namespace zest::cli {

void register_bench_serve(CLI::App& bench, std::function<int()>& run);
void register_bench_kernels(CLI::App& bench, std::function<int()>& run);
void register_bench_grammar(CLI::App& bench, std::function<int()>& run);

void register_bench(CLI::App& app, std::function<int()>& run) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks (zest bench <name> --help)");
  bench->require_subcommand(1);
  register_bench_serve(*bench, run);
  register_bench_kernels(*bench, run);
  register_bench_grammar(*bench, run);
}

}  // namespace zest::cli
