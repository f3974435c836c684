// Distinct experts per MoE layer before/after SERE in real batched decode on a model directory
// (default: the tiny qwen3_moe fixture), for a range of batch sizes and primary counts.
// Usage: bench_sere_bench [MODEL_DIR] [SIMILARITY_FILE]
#include <cstdio>
#include <filesystem>
#include <string>

#include "engine/chat_request.h"
#include "engine/engine.h"
#include "engine/sere.h"

using namespace zest;

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : std::string(ZEST_BENCH_SOURCE_DIR) + "/tests/fixtures/models/qwen3_moe_tiny";
  auto model_r = engine::ModelBundle::load(dir);
  if (!model_r.ok()) {
    std::fprintf(stderr, "error: %s\n", model_r.status().to_string().c_str());
    return 1;
  }
  auto model = *model_r;
  std::string sim = argc > 2 ? argv[2] : "";
  if (sim.empty()) {
    engine::CalibrationOptions co;
    for (const auto& e : std::filesystem::directory_iterator(std::string(ZEST_BENCH_SOURCE_DIR) + "/assets/calibration"))
      if (e.path().extension() == ".txt") co.text_files.push_back(e.path().string());
    std::sort(co.text_files.begin(), co.text_files.end());
    co.max_tokens = 1024;
    co.progress = false;
    co.out_file = (std::filesystem::temp_directory_path() / "zest_sere_bench.safetensors").string();
    auto r = engine::calibrate_sere(*model, co);
    if (!r.ok()) {
      std::fprintf(stderr, "error: %s\n", r.status().to_string().c_str());
      return 1;
    }
    sim = co.out_file;
  }
  const auto& tc = model->config.text;
  std::printf("model %s: %lld experts, top-%lld; 16 decode steps per request, greedy; rho = 0\n", dir.c_str(),
              static_cast<long long>(tc.num_experts), static_cast<long long>(tc.num_experts_per_tok));
  std::printf("| batch | S | experts/layer before | after | re-routed slots |\n|---|---|---|---|---|\n");
  for (int batch : {1, 2, 4, 8, 16, 32, 64}) {
    for (int S : {1, 2}) {
      engine::SereOptions so;
      so.params.primary = S;
      so.similarity_file = sim;
      auto rt = engine::SereRuntime::create(*model, so);
      if (!rt.ok()) {
        std::fprintf(stderr, "error: %s\n", rt.status().to_string().c_str());
        return 1;
      }
      engine::EngineOptions o;
      engine::SereRuntime* raw = rt->get();
      o.moe_hooks = [raw](bool decode_only) { return raw->hooks(decode_only); };
      o.max_num_seqs = batch;
      engine::Engine eng(model, o);
      for (int i = 0; i < batch; ++i) {
        nlohmann::json body = {{"messages", {{{"role", "user"}, {"content", "Request " + std::to_string(i * 7919 % 1000) + ": tell me something about topic " + std::to_string(i)}}}}};
        auto req = engine::parse_chat_request(body, *model);
        auto p = engine::build_prompt(*model, *req, {});
        engine::Request r;
        r.id = i;
        r.prompt = *p;
        r.sampling.temperature = 0;
        r.sampling.max_tokens = 17;
        r.sampling.ignore_eos = true;
        if (!eng.add(std::move(r)).is_ok()) return 1;
      }
      while (eng.has_work())
        if (!eng.step().is_ok()) return 1;
      const auto st = raw->stats_json();
      double before = 0, after = 0, share = 0;
      const size_t L = st["experts_per_layer_before"].size();
      for (size_t l = 0; l < L; ++l) {
        before += st["experts_per_layer_before"][l].get<double>() / L;
        after += st["experts_per_layer_after"][l].get<double>() / L;
        share += st["rerouted_share_per_layer"][l].get<double>() / L;
      }
      std::printf("| %d | %d | %.2f | %.2f | %.0f%% |\n", batch, S, before, after, 100 * share);
    }
  }
  return 0;
}
