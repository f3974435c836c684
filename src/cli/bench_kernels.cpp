// zest bench decode | prefill | ttft: the CUDA kernel benchmarks (bench/decode_bench.cpp,
// bench/prefill_bench.cpp, bench/ttft_bench.cpp) as subcommands. Their arguments pass through unchanged
// to the benchmark's own parser, so `zest bench decode --help` prints its options; the same code also
// builds the standalone programs bench_decode_bench, bench_prefill_bench and bench_ttft_bench.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"

#ifdef ZEST_KERNEL_BENCHES
int bench_decode_main(int argc, char** argv);
int bench_prefill_main(int argc, char** argv);
int bench_ttft_main(int argc, char** argv);
#endif

namespace zest::cli {
namespace {

using BenchMain = int (*)(int, char**);

// Calls `main` with argv = {"zest bench <name>", args...}.
int call_bench(const std::string& name, BenchMain main, std::vector<std::string> args) {
  if (!main) {
    std::fprintf(stderr,
                 "error: zest bench %s: zest was built without CUDA (configure with -DZEST_CUDA=ON); "
                 "the %s benchmark runs the CUDA backend\n",
                 name.c_str(), name.c_str());
    return 2;
  }
  args.insert(args.begin(), "zest bench " + name);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return main(static_cast<int>(args.size()), argv.data());
}

void add_kernel_bench(CLI::App& bench, std::function<int()>& run, const std::string& name, const std::string& help,
                      BenchMain main) {
  CLI::App* sub = bench.add_subcommand(name, help + " (options: zest bench " + name + " --help)");
  sub->set_help_flag();  // --help goes to the benchmark's own parser
  sub->prefix_command();
  sub->allow_extras();
  sub->callback([sub, &run, name, main] {
    run = [args = sub->remaining(), name, main] { return call_bench(name, main, args); };
  });
}

}  // namespace

void register_bench_kernels(CLI::App& bench, std::function<int()>& run) {
  BenchMain decode = nullptr, prefill = nullptr, ttft = nullptr;
#if defined(ZEST_KERNEL_BENCHES) && defined(ZEST_HAVE_CUDA)
  decode = &bench_decode_main;
  prefill = &bench_prefill_main;
  ttft = &bench_ttft_main;
#endif
  add_kernel_bench(bench, run, "decode", "CUDA decode TPOT on a synthetic model of a named config", decode);
  add_kernel_bench(bench, run, "prefill", "CUDA prefill time and MFU on random weights of a named config", prefill);
  add_kernel_bench(bench, run, "ttft", "CUDA TTFT of multi-image requests (vision tower, VisionZip, prefill)", ttft);
}

}  // namespace zest::cli
