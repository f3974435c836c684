// The architectures zest runs, in one table keyed by the config's architecture (io::Arch, parsed from
// config.json's "architectures" / "model_type", with the vision tower's config where there is one): where the
// language model's weights sit in the checkpoint and how its CPU decoder (f32, the reference) is built. ModelBundle, the random-weight
// models and SERE calibration ask this table instead of testing the architecture themselves; a new architecture is
// a config parser case, an entry here and its decoder's file (the CUDA decoder takes the same DecoderWeights).
#pragma once
#include <memory>
#include <span>
#include <string>

#include "core/status.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "model/decoder.h"

namespace zest::model {

struct Architecture {
  io::Arch arch;
  const char* text_prefix;  // the language model's tensors: text_prefix + "layers.0.self_attn.q_proj.weight", ...
  // The CPU decoder bound to a checkpoint's weights.
  Result<std::unique_ptr<TextDecoder>> (*cpu_decoder)(const io::SafeTensors& st, const io::ModelConfig& cfg);
};

// Every architecture zest runs.
std::span<const Architecture> architectures();
// The entry of `arch` (every io::Arch has one).
const Architecture& architecture(io::Arch arch);

}  // namespace zest::model
