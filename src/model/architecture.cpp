#include "model/architecture.h"

#include "model/qwen3.h"

namespace zest::model {
namespace {

Result<std::unique_ptr<TextDecoder>> qwen3_cpu(const io::SafeTensors& st, const io::ModelConfig& cfg) {
  ZEST_ASSIGN_OR_RETURN(Qwen3TextModel m, Qwen3TextModel::load(st, cfg));
  return std::unique_ptr<TextDecoder>(std::make_unique<Qwen3TextModel>(std::move(m)));
}

// Qwen3 and Qwen3-MoE (text), Qwen3-VL-MoE and dense Qwen3-VL share the Qwen3 decoder (a layer's FFN is
// dense or MoE by the config); the VL models keep it under "model.language_model." beside their tower.
constexpr Architecture kArchitectures[] = {
    {io::Arch::kQwen3Moe, "model.", qwen3_cpu},
    {io::Arch::kQwen3VLMoe, "model.language_model.", qwen3_cpu},
    {io::Arch::kQwen3VL, "model.language_model.", qwen3_cpu},
    {io::Arch::kQwen3, "model.", qwen3_cpu},
};

}  // namespace

std::span<const Architecture> architectures() { return kArchitectures; }

const Architecture& architecture(io::Arch arch) {
  for (const Architecture& a : kArchitectures)
    if (a.arch == arch) return a;
  return kArchitectures[0];  // unreachable: every io::Arch has an entry (tests/model/architecture_test.cpp)
}

}  // namespace zest::model
