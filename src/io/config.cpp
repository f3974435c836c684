#include "io/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

namespace zest::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// What the config parser needs to know of each architecture: its names in config.json and the transformers
// class defaults used when a field is omitted. A new architecture is a line here (and its io::Arch).
struct ArchInfo {
  Arch arch;
  const char* model_type;      // config.json "model_type"
  const char* class_name;      // config.json "architectures"
  bool vision;                 // a VL model: text_config + vision_config, M-RoPE
  bool moe;                    // sparse MoE FFN (else dense SwiGLU)
  int64_t kv_heads;            // num_key_value_heads default
  int64_t max_positions;       // max_position_embeddings default
  double rope_theta;           // rope_theta default
  int64_t head_dim;            // head_dim default; 0 = hidden_size / num_attention_heads
};

constexpr ArchInfo kArchs[] = {
    {Arch::kQwen3Moe, "qwen3_moe", "Qwen3MoeForCausalLM", false, true, 4, 32768, 10000.0, 0},
    {Arch::kQwen3VLMoe, "qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration", true, true, 16, 128000, 500000.0, 0},
    {Arch::kQwen3VL, "qwen3_vl", "Qwen3VLForConditionalGeneration", true, false, 32, 128000, 500000.0, 128},
    {Arch::kQwen3, "qwen3", "Qwen3ForCausalLM", false, false, 32, 32768, 10000.0, 128},
};

const ArchInfo& info(Arch a) {
  for (const ArchInfo& i : kArchs)
    if (i.arch == a) return i;
  return kArchs[0];  // unreachable: every Arch has a line (tests/io/config_test.cpp)
}

std::string supported_list() {
  std::string s;
  for (const ArchInfo& i : kArchs) s += std::string(s.empty() ? "" : ", ") + i.model_type + " (" + i.class_name + ")";
  return s;
}

const std::vector<int64_t> kDefaultMropeSection = {24, 20, 20};

// Typed access to the fields of one JSON object. The first error is recorded in *err and later reads
// return their defaults, so a parser reads every field and checks *err once.
class Fields {
 public:
  Fields(const json& obj, std::string prefix, Status* err) : obj_(obj), prefix_(std::move(prefix)), err_(err) {}

  // The first of `keys` present with a non-null value, or nullptr.
  const json* find(std::initializer_list<const char*> keys, std::string* found = nullptr) const {
    for (const char* k : keys) {
      auto it = obj_.find(k);
      if (it != obj_.end() && !it->is_null()) {
        if (found != nullptr) *found = k;
        return &*it;
      }
    }
    return nullptr;
  }
  bool has(std::initializer_list<const char*> keys) const { return find(keys) != nullptr; }
  bool is_null(const char* key) const {
    auto it = obj_.find(key);
    return it != obj_.end() && it->is_null();
  }

  int64_t integer(std::initializer_list<const char*> keys) { return integer_impl(keys, std::nullopt); }
  int64_t integer(std::initializer_list<const char*> keys, int64_t def) { return integer_impl(keys, def); }

  double number(std::initializer_list<const char*> keys, double def) {
    std::string key;
    const json* v = find(keys, &key);
    if (v == nullptr) return def;
    if (!v->is_number()) return type_error(key, "a number", *v), def;
    return v->get<double>();
  }

  bool boolean(std::initializer_list<const char*> keys, bool def) {
    std::string key;
    const json* v = find(keys, &key);
    if (v == nullptr) return def;
    if (!v->is_boolean()) return type_error(key, "true or false", *v), def;
    return v->get<bool>();
  }

  std::string string(std::initializer_list<const char*> keys, const std::string& def) {
    std::string key;
    const json* v = find(keys, &key);
    if (v == nullptr) return def;
    if (!v->is_string()) return type_error(key, "a string", *v), def;
    return v->get<std::string>();
  }

  std::vector<int64_t> int_list(std::initializer_list<const char*> keys, const std::vector<int64_t>& def) {
    std::string key;
    const json* v = find(keys, &key);
    if (v == nullptr) return def;
    std::vector<int64_t> out;
    if (!v->is_array()) return type_error(key, "a list of integers", *v), def;
    for (const json& e : *v) {
      int64_t x = 0;
      if (!as_integer(e, &x)) return type_error(key, "a list of integers", *v), def;
      out.push_back(x);
    }
    return out;
  }

  // A list of strings (absent or null: empty).
  std::vector<std::string> string_list(const char* key) {
    const json* v = find({key});
    if (v == nullptr) return {};
    std::vector<std::string> out;
    if (!v->is_array()) return type_error(key, "a list of strings", *v), out;
    for (const json& e : *v) {
      if (!e.is_string()) return type_error(key, "a list of strings", *v), std::vector<std::string>{};
      out.push_back(e.get<std::string>());
    }
    return out;
  }

  // A required nested object (e.g. text_config).
  const json* object(const char* key) {
    const json* v = find({key});
    if (v == nullptr) return fail(corrupt(prefix_ + key + " is missing")), nullptr;
    if (!v->is_object()) return type_error(key, "an object", *v), nullptr;
    return v;
  }

  // An optional nested object; null or absent gives nullptr.
  const json* optional_object(const char* key) {
    const json* v = find({key});
    if (v != nullptr && !v->is_object()) return type_error(key, "an object or null", *v), nullptr;
    return v;
  }

  const std::string& prefix() const { return prefix_; }
  void fail(Status s) {
    if (err_->is_ok()) *err_ = std::move(s);
  }

 private:
  static bool as_integer(const json& v, int64_t* out) {
    if (v.is_number_integer()) {
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return false;
      *out = v.get<int64_t>();
      return true;
    }
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) {
        *out = static_cast<int64_t>(d);
        return true;
      }
    }
    return false;
  }

  int64_t integer_impl(std::initializer_list<const char*> keys, std::optional<int64_t> def) {
    std::string key;
    const json* v = find(keys, &key);
    if (v == nullptr) {
      if (def) return *def;
      std::string names = prefix_ + *keys.begin();
      for (auto it = keys.begin() + 1; it != keys.end(); ++it) names += std::string(" (or ") + *it + ")";
      fail(corrupt("required field " + names + " is missing"));
      return 0;
    }
    int64_t x = 0;
    if (!as_integer(*v, &x)) return type_error(key, "an integer", *v), def.value_or(0);
    return x;
  }

  void type_error(const std::string& key, const char* want, const json& got) {
    std::string shown = got.dump();
    if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
    fail(corrupt("field " + prefix_ + key + " must be " + want + ", got " + shown));
  }

  const json& obj_;
  std::string prefix_;
  Status* err_;
};

std::string list_to_string(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

Result<Arch> detect_arch(const json& root) {
  auto mt = root.find("model_type");
  if (mt != root.end() && !mt->is_null()) {
    if (!mt->is_string()) return corrupt("field model_type must be a string, got " + mt->dump());
    const std::string t = mt->get<std::string>();
    for (const ArchInfo& i : kArchs) {
      if (t == i.model_type) return i.arch;
    }
    return unsupported("model_type '" + t + "' is not supported; zest runs " + supported_list());
  }
  auto ar = root.find("architectures");
  if (ar == root.end() || ar->is_null()) {
    return corrupt("config has neither \"model_type\" nor \"architectures\"; is this a Hugging Face config.json?");
  }
  if (!ar->is_array() || ar->empty()) {
    return corrupt("field architectures must be a non-empty list of class names, got " + ar->dump());
  }
  for (const json& a : *ar) {
    if (!a.is_string()) return corrupt("field architectures must list class names, got " + ar->dump());
    for (const ArchInfo& i : kArchs) {
      if (a.get<std::string>() == i.class_name) return i.arch;
    }
  }
  return unsupported("architectures " + ar->dump() + " are not supported; zest runs " + supported_list());
}

// Reads the RoPE settings of a text config: rope_parameters (transformers 5) or rope_scaling (4.x), with
// rope_theta inside them or beside them; `outer` is consulted when the text config lacks them.
Status read_rope(Fields& text, Fields* outer, Arch arch, TextConfig* tc) {
  const bool vl = info(arch).vision;
  // transformers prefers rope_scaling (4.x files) over rope_parameters (5.x files) when both exist.
  std::vector<std::pair<const json*, std::string>> dicts;
  for (Fields* f : {&text, outer}) {
    if (f == nullptr) continue;
    for (const char* key : {"rope_scaling", "rope_parameters"}) {
      if (const json* d = f->optional_object(key)) dicts.emplace_back(d, f->prefix() + key + ".");
    }
  }
  auto lookup = [&](const char* key, std::string* where) -> const json* {
    for (const auto& [d, prefix] : dicts) {
      auto it = d->find(key);
      if (it != d->end() && !it->is_null()) {
        *where = prefix + key;
        return &*it;
      }
    }
    return nullptr;
  };
  std::string where;
  const json* type = lookup("rope_type", &where);
  if (type == nullptr) type = lookup("type", &where);
  if (type != nullptr) {
    if (!type->is_string()) return corrupt("field " + where + " must be a string, got " + type->dump());
    const std::string name = type->get<std::string>();
    if (name != "default" && name != "mrope") {
      return unsupported(where + " is '" + name + "'; zest implements only the default RoPE" +
                         std::string(vl ? " with M-RoPE sections" : "") +
                         " (remove the scaling entry to run without it)");
    }
  }
  const double default_theta = info(arch).rope_theta;
  if (const json* th = lookup("rope_theta", &where)) {
    if (!th->is_number()) return corrupt("field " + where + " must be a number, got " + th->dump());
    tc->rope_theta = th->get<double>();
  } else {
    tc->rope_theta = text.number({"rope_theta"}, outer ? outer->number({"rope_theta"}, default_theta) : default_theta);
  }
  if (!vl) return Status::ok();
  // Qwen3-VL always interleaves the T/H/W frequencies (transformers ignores mrope_interleaved).
  tc->mrope_interleaved = true;
  tc->mrope_section = kDefaultMropeSection;
  if (const json* ms = lookup("mrope_section", &where)) {
    tc->mrope_section.clear();
    if (!ms->is_array() || ms->size() != 3) {
      return corrupt("field " + where + " must be a list of 3 integers (T, H, W), got " + ms->dump());
    }
    for (const json& e : *ms) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0) {
        return corrupt("field " + where + " must hold non-negative integers, got " + ms->dump());
      }
      tc->mrope_section.push_back(e.get<int64_t>());
    }
  }
  if (const json* mi = lookup("mrope_interleaved", &where)) {
    if (!mi->is_boolean()) return corrupt("field " + where + " must be true or false, got " + mi->dump());
  }
  return Status::ok();
}

Status read_text(const json& obj, const std::string& prefix, Fields* outer, Arch arch, TextConfig* tc) {
  Status err;
  Fields f(obj, prefix, &err);
  const bool moe = info(arch).moe;
  tc->vocab_size = f.integer({"vocab_size"});
  tc->hidden_size = f.integer({"hidden_size"});
  tc->num_layers = f.integer({"num_hidden_layers"});
  tc->num_heads = f.integer({"num_attention_heads"});
  // Absent: the class default; null: transformers' __post_init__ copies num_attention_heads.
  tc->num_kv_heads = f.is_null("num_key_value_heads") ? tc->num_heads
                                                      : f.integer({"num_key_value_heads"}, info(arch).kv_heads);
  tc->rms_norm_eps = f.number({"rms_norm_eps"}, 1e-6);
  tc->max_position_embeddings = f.integer({"max_position_embeddings"}, info(arch).max_positions);
  if (moe) {
    tc->intermediate_size = f.integer({"intermediate_size"}, 0);
    tc->moe_intermediate_size = f.integer({"moe_intermediate_size"});
    tc->num_experts = f.integer({"num_experts", "num_local_experts"});
    tc->num_experts_per_tok = f.integer({"num_experts_per_tok"});
    // Qwen3-VL-MoE always renormalises the top-k router weights; Qwen3-MoE follows the flag (default off).
    tc->norm_topk_prob = arch == Arch::kQwen3VLMoe ? true : f.boolean({"norm_topk_prob"}, false);
    tc->decoder_sparse_step = f.integer({"decoder_sparse_step"}, 1);
    tc->mlp_only_layers = f.int_list({"mlp_only_layers"}, {});
  } else {
    tc->intermediate_size = f.integer({"intermediate_size"});
    tc->num_experts = 0;
    tc->num_experts_per_tok = 0;
  }
  if (!info(arch).vision) tc->tie_word_embeddings = f.boolean({"tie_word_embeddings"}, false);
  // Forms of attention zest does not run are refused, not ignored.
  if (f.boolean({"attention_bias"}, false)) {
    return unsupported(prefix + "attention_bias is true; zest runs Qwen3 attention without projection biases");
  }
  if (f.boolean({"use_sliding_window"}, false)) {
    return unsupported(prefix + "use_sliding_window is true; zest runs full attention in every layer");
  }
  for (const std::string& t : f.string_list("layer_types")) {
    if (t != "full_attention") {
      return unsupported(prefix + "layer_types lists '" + t + "'; zest runs full attention in every layer");
    }
  }
  ZEST_RETURN_IF_ERROR(err);

  if (f.has({"head_dim"})) {
    tc->head_dim = f.integer({"head_dim"});
  } else if (info(arch).head_dim > 0) {
    tc->head_dim = info(arch).head_dim;
  } else if (tc->num_heads > 0 && tc->hidden_size % tc->num_heads == 0) {
    tc->head_dim = tc->hidden_size / tc->num_heads;
  } else {
    return corrupt(prefix + "head_dim is missing and " + prefix + "hidden_size " + std::to_string(tc->hidden_size) +
                   " is not a multiple of " + prefix + "num_attention_heads " + std::to_string(tc->num_heads));
  }
  ZEST_RETURN_IF_ERROR(err);
  const Status rope = read_rope(f, outer, arch, tc);
  ZEST_RETURN_IF_ERROR(err);
  return rope;
}

Status validate_text(const TextConfig& t, const std::string& p) {
  const std::pair<const char*, int64_t> positive[] = {
      {"vocab_size", t.vocab_size},
      {"hidden_size", t.hidden_size},
      {"num_hidden_layers", t.num_layers},
      {"num_attention_heads", t.num_heads},
      {"num_key_value_heads", t.num_kv_heads},
      {"head_dim", t.head_dim},
      {"max_position_embeddings", t.max_position_embeddings},
  };
  for (const auto& [name, v] : positive) {
    if (v <= 0) return corrupt(p + name + " must be positive, got " + std::to_string(v));
  }
  if (t.num_heads % t.num_kv_heads != 0) {
    return corrupt(p + "num_attention_heads " + std::to_string(t.num_heads) + " is not a multiple of " + p +
                   "num_key_value_heads " + std::to_string(t.num_kv_heads));
  }
  if (t.head_dim % 2 != 0) return corrupt(p + "head_dim " + std::to_string(t.head_dim) + " must be even for RoPE");
  if (!(t.rms_norm_eps > 0)) return corrupt(p + "rms_norm_eps must be positive");
  if (!(t.rope_theta > 0) || !std::isfinite(t.rope_theta)) return corrupt(p + "rope_theta must be positive");
  if (t.num_experts > 0) {
    if (t.moe_intermediate_size <= 0) {
      return corrupt(p + "moe_intermediate_size must be positive, got " + std::to_string(t.moe_intermediate_size));
    }
    if (t.num_experts_per_tok <= 0 || t.num_experts_per_tok > t.num_experts) {
      return corrupt(p + "num_experts_per_tok " + std::to_string(t.num_experts_per_tok) + " must be in [1, " +
                     p + "num_experts = " + std::to_string(t.num_experts) + "]");
    }
    if (t.decoder_sparse_step < 1) {
      return corrupt(p + "decoder_sparse_step must be >= 1, got " + std::to_string(t.decoder_sparse_step));
    }
    for (int64_t l : t.mlp_only_layers) {
      if (l < 0 || l >= t.num_layers) {
        return corrupt(p + "mlp_only_layers " + list_to_string(t.mlp_only_layers) + " names a layer outside [0, " +
                       std::to_string(t.num_layers) + ")");
      }
    }
    for (int64_t l = 0; l < t.num_layers; ++l) {
      if (!t.is_moe_layer(l) && t.intermediate_size <= 0) {
        return corrupt("layer " + std::to_string(l) + " is a dense MLP layer but " + p +
                       "intermediate_size is missing or not positive");
      }
    }
  } else if (t.num_experts < 0) {
    return corrupt(p + "num_experts must not be negative");
  } else if (t.intermediate_size <= 0) {
    return corrupt(p + "intermediate_size must be positive, got " + std::to_string(t.intermediate_size));
  }
  return Status::ok();
}

Status read_vision(const json& obj, VisionConfig* vc) {
  Status err;
  Fields f(obj, "vision_config.", &err);
  vc->depth = f.integer({"depth"});
  vc->hidden_size = f.integer({"hidden_size"});
  vc->num_heads = f.integer({"num_heads", "num_attention_heads"});
  vc->intermediate_size = f.integer({"intermediate_size"});
  vc->out_hidden_size = f.integer({"out_hidden_size"});
  vc->patch_size = f.integer({"patch_size"}, vc->patch_size);
  vc->temporal_patch_size = f.integer({"temporal_patch_size"}, vc->temporal_patch_size);
  vc->spatial_merge_size = f.integer({"spatial_merge_size"}, vc->spatial_merge_size);
  vc->in_channels = f.integer({"in_channels"}, vc->in_channels);
  vc->num_position_embeddings = f.integer({"num_position_embeddings"}, 2304);
  vc->hidden_act = f.string({"hidden_act"}, vc->hidden_act);
  vc->deepstack_visual_indexes = f.int_list({"deepstack_visual_indexes"}, {8, 16, 24});
  return err;
}

Status validate_vision(const VisionConfig& v, const TextConfig& t) {
  const std::string p = "vision_config.";
  const std::pair<const char*, int64_t> positive[] = {
      {"depth", v.depth},
      {"hidden_size", v.hidden_size},
      {"num_heads", v.num_heads},
      {"intermediate_size", v.intermediate_size},
      {"out_hidden_size", v.out_hidden_size},
      {"patch_size", v.patch_size},
      {"temporal_patch_size", v.temporal_patch_size},
      {"spatial_merge_size", v.spatial_merge_size},
      {"in_channels", v.in_channels},
      {"num_position_embeddings", v.num_position_embeddings},
  };
  for (const auto& [name, x] : positive) {
    if (x <= 0) return corrupt(p + name + " must be positive, got " + std::to_string(x));
  }
  if (v.hidden_size % v.num_heads != 0) {
    return corrupt(p + "hidden_size " + std::to_string(v.hidden_size) + " is not a multiple of " + p + "num_heads " +
                   std::to_string(v.num_heads));
  }
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(v.num_position_embeddings))));
  if (side * side != v.num_position_embeddings) {
    return corrupt(p + "num_position_embeddings " + std::to_string(v.num_position_embeddings) +
                   " is not a square grid size");
  }
  if (v.out_hidden_size != t.hidden_size) {
    return corrupt(p + "out_hidden_size " + std::to_string(v.out_hidden_size) + " differs from text hidden_size " +
                   std::to_string(t.hidden_size) + "; the vision features could not be fed to the decoder");
  }
  std::set<int64_t> seen;
  for (int64_t i : v.deepstack_visual_indexes) {
    if (i < 0 || i >= v.depth || !seen.insert(i).second) {
      return corrupt(p + "deepstack_visual_indexes " + list_to_string(v.deepstack_visual_indexes) +
                     " must be distinct block indexes in [0, depth = " + std::to_string(v.depth) + ")");
    }
  }
  if (v.deepstack_visual_indexes.size() > static_cast<size_t>(t.num_layers)) {
    return corrupt(p + "deepstack_visual_indexes has more entries than the decoder has layers");
  }
  if (v.hidden_act != "gelu_pytorch_tanh") {
    return unsupported(p + "hidden_act '" + v.hidden_act + "' is not implemented (zest runs gelu_pytorch_tanh)");
  }
  return Status::ok();
}

constexpr const char* kQuantSupported =
    "zest loads unquantized (bf16 / f16 / f32) checkpoints and block-wise FP8 ones (quant_method \"fp8\", "
    "fmt \"e4m3\", weight_block_size [128, 128], activation_scheme \"dynamic\", as in Qwen's -FP8 releases)";

// Reads quantization_config (absent or null: an unquantized checkpoint).
Status read_quantization(const json& root, std::optional<Fp8Config>* out) {
  const char* p = "quantization_config.";
  auto it = root.find("quantization_config");
  if (it == root.end() || it->is_null()) return Status::ok();
  if (!it->is_object()) return corrupt("field quantization_config must be an object, got " + it->dump());
  const json& q = *it;
  auto str = [&](const char* key, std::string* v) -> Status {
    auto f = q.find(key);
    if (f == q.end() || f->is_null()) return Status::ok();
    if (!f->is_string()) return corrupt(std::string("field ") + p + key + " must be a string, got " + f->dump());
    *v = f->get<std::string>();
    return Status::ok();
  };
  std::string method;
  ZEST_RETURN_IF_ERROR(str("quant_method", &method));
  if (method.empty()) return corrupt(std::string("quantization_config has no quant_method; ") + kQuantSupported);
  if (method != "fp8") {
    return unsupported("quantization_config.quant_method '" + method + "' is not supported; " + kQuantSupported);
  }
  std::string fmt = "e4m3", scheme = "dynamic", scale_fmt = "float";
  ZEST_RETURN_IF_ERROR(str("fmt", &fmt));
  ZEST_RETURN_IF_ERROR(str("activation_scheme", &scheme));
  ZEST_RETURN_IF_ERROR(str("scale_fmt", &scale_fmt));
  if (fmt != "e4m3") return unsupported(std::string(p) + "fmt '" + fmt + "' is not supported; " + kQuantSupported);
  if (scheme != "dynamic") {
    return unsupported(std::string(p) + "activation_scheme '" + scheme +
                       "' is not supported (static activation scales); " + kQuantSupported);
  }
  if (scale_fmt != "float") {
    return unsupported(std::string(p) + "scale_fmt '" + scale_fmt + "' is not supported; " + kQuantSupported);
  }
  Fp8Config c;
  auto bs = q.find("weight_block_size");
  if (bs != q.end()) {  // absent: transformers' default [128, 128]
    if (bs->is_null()) {
      return unsupported(std::string(p) + "weight_block_size is null (one scale per tensor); " + kQuantSupported);
    }
    if (!bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() || !(*bs)[1].is_number_integer() ||
        (*bs)[0].get<int64_t>() <= 0 || (*bs)[1].get<int64_t>() <= 0) {
      return corrupt(std::string("field ") + p + "weight_block_size must be two positive integers, got " + bs->dump());
    }
    c.block_rows = (*bs)[0].get<int64_t>();
    c.block_cols = (*bs)[1].get<int64_t>();
    if (c.block_rows != 128 || c.block_cols != 128) {
      return unsupported(std::string(p) + "weight_block_size " + bs->dump() + " is not supported; " + kQuantSupported);
    }
  }
  auto skip = q.find("modules_to_not_convert");
  if (skip != q.end() && !skip->is_null()) {
    if (!skip->is_array()) {
      return corrupt(std::string("field ") + p + "modules_to_not_convert must be a list of module names, got " +
                     skip->dump().substr(0, 80));
    }
    for (const json& m : *skip) {
      if (!m.is_string()) {
        return corrupt(std::string("field ") + p + "modules_to_not_convert must list module names, got " + m.dump());
      }
      c.modules_to_not_convert.push_back(m.get<std::string>());
    }
  }
  *out = std::move(c);
  return Status::ok();
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string msg = "cannot open " + path + ": " + std::strerror(err);
    return err == ENOENT ? not_found(msg) : internal_error(msg);
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return internal_error("cannot read " + path);
  return text;
}

Result<json> parse_json_object(const std::string& text, const std::string& what) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    return corrupt(what + " is not valid JSON: " + e.what());
  }
  if (!j.is_object()) return corrupt(what + " is not a JSON object but " + std::string(j.type_name()));
  return j;
}

// DIR/name when `path` is a directory, else `path` itself.
std::string file_in(const std::string& path, const char* name) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return (fs::path(path) / name).string();
  return path;
}

}  // namespace

const char* arch_name(Arch a) { return info(a).model_type; }

bool has_vision(Arch a) { return info(a).vision; }

bool Fp8Config::not_converted(const std::string& module) const {
  for (const std::string& key : modules_to_not_convert) {
    if (key.empty()) continue;
    if (module.compare(0, key.size(), key) == 0) return true;
    if (module.size() >= key.size() && module.compare(module.size() - key.size(), key.size(), key) == 0) return true;
    // transformers matches each entry as a regular expression at the start of the name; module names
    // are literal, so only entries with other metacharacters than '.' need the regex.
    if (key.find_first_of("*+?[](){}|^$\\") == std::string::npos) continue;
    try {
      if (std::regex_search(module, std::regex(key), std::regex_constants::match_continuous)) return true;
    } catch (const std::regex_error&) {
    }
  }
  return false;
}

bool TextConfig::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0 || decoder_sparse_step <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

Result<ModelConfig> parse_model_config(const std::string& json_text) {
  ZEST_ASSIGN_OR_RETURN(json root, parse_json_object(json_text, "config"));
  ModelConfig cfg;
  ZEST_ASSIGN_OR_RETURN(cfg.arch, detect_arch(root));
  cfg.model_type = arch_name(cfg.arch);
  if (auto mt = root.find("model_type"); mt != root.end() && mt->is_string()) cfg.model_type = mt->get<std::string>();

  ZEST_RETURN_IF_ERROR(read_quantization(root, &cfg.fp8));
  if (!has_vision(cfg.arch)) {
    ZEST_RETURN_IF_ERROR(read_text(root, "", nullptr, cfg.arch, &cfg.text));
    ZEST_RETURN_IF_ERROR(validate_text(cfg.text, ""));
    return cfg;
  }
  Status err;
  Fields top(root, "", &err);
  const json* text = top.object("text_config");
  const json* vision = top.object("vision_config");
  cfg.image_token_id = top.integer({"image_token_id"}, cfg.image_token_id);
  cfg.video_token_id = top.integer({"video_token_id"}, cfg.video_token_id);
  cfg.vision_start_token_id = top.integer({"vision_start_token_id"}, cfg.vision_start_token_id);
  cfg.vision_end_token_id = top.integer({"vision_end_token_id"}, cfg.vision_end_token_id);
  // transformers ties the VL models' embeddings from the top-level flag only (default false).
  cfg.text.tie_word_embeddings = top.boolean({"tie_word_embeddings"}, false);
  ZEST_RETURN_IF_ERROR(err);
  ZEST_RETURN_IF_ERROR(read_text(*text, "text_config.", &top, cfg.arch, &cfg.text));
  ZEST_RETURN_IF_ERROR(err);
  ZEST_RETURN_IF_ERROR(validate_text(cfg.text, "text_config."));
  VisionConfig vc;
  ZEST_RETURN_IF_ERROR(read_vision(*vision, &vc));
  ZEST_RETURN_IF_ERROR(validate_vision(vc, cfg.text));
  for (const auto& [name, id] : {std::pair<const char*, int64_t>{"image_token_id", cfg.image_token_id},
                                 {"video_token_id", cfg.video_token_id},
                                 {"vision_start_token_id", cfg.vision_start_token_id},
                                 {"vision_end_token_id", cfg.vision_end_token_id}}) {
    if (id < 0) return corrupt(std::string(name) + " " + std::to_string(id) + " is negative");
  }
  cfg.vision = std::move(vc);
  return cfg;
}

Result<ModelConfig> load_model_config(const std::string& path) {
  const std::string file = file_in(path, "config.json");
  ZEST_ASSIGN_OR_RETURN(std::string text, read_file(file));
  auto cfg = parse_model_config(text);
  if (!cfg.ok()) return cfg.status().with_context(file);
  return cfg;
}

Result<GenerationDefaults> load_generation_defaults(const std::string& model_dir) {
  const std::string file = file_in(model_dir, "generation_config.json");
  GenerationDefaults g;
  std::error_code ec;
  if (!fs::exists(file, ec)) return g;
  ZEST_ASSIGN_OR_RETURN(std::string text, read_file(file));
  ZEST_ASSIGN_OR_RETURN(json root, parse_json_object(text, file));
  Status err;
  Fields f(root, "", &err);
  if (f.has({"temperature"})) g.temperature = f.number({"temperature"}, 0);
  // do_sample false means greedy decoding in transformers whatever temperature says.
  if (const json* ds = f.find({"do_sample"}); ds && ds->is_boolean() && !ds->get<bool>()) g.temperature = 0.0;
  if (f.has({"top_p"})) g.top_p = f.number({"top_p"}, 0);
  if (f.has({"top_k"})) g.top_k = f.integer({"top_k"}, 0);
  if (const json* eos = f.find({"eos_token_id"})) {
    if (eos->is_array()) {
      g.eos_token_ids = f.int_list({"eos_token_id"}, {});
    } else {
      g.eos_token_ids = {f.integer({"eos_token_id"})};
    }
  }
  ZEST_RETURN_IF_ERROR(err.with_context(file));
  if (g.temperature && (*g.temperature < 0 || !std::isfinite(*g.temperature))) {
    return corrupt(file + ": temperature must be >= 0");
  }
  if (g.top_p && !(*g.top_p > 0 && *g.top_p <= 1)) return corrupt(file + ": top_p must be in (0, 1]");
  if (g.top_k && *g.top_k < 0) return corrupt(file + ": top_k must be >= 0");
  for (int64_t id : g.eos_token_ids) {
    if (id < 0) return corrupt(file + ": eos_token_id " + std::to_string(id) + " is negative");
  }
  return g;
}

Result<PreprocessorConfig> load_preprocessor_config(const std::string& model_dir) {
  const std::string file = file_in(model_dir, "preprocessor_config.json");
  PreprocessorConfig pc;
  std::error_code ec;
  if (!fs::exists(file, ec)) return pc;
  ZEST_ASSIGN_OR_RETURN(std::string text, read_file(file));
  ZEST_ASSIGN_OR_RETURN(json root, parse_json_object(text, file));
  Status err;
  Fields f(root, "", &err);
  pc.patch_size = f.integer({"patch_size"}, pc.patch_size);
  pc.temporal_patch_size = f.integer({"temporal_patch_size"}, pc.temporal_patch_size);
  pc.merge_size = f.integer({"merge_size"}, pc.merge_size);
  if (const json* size = f.optional_object("size")) {
    Fields s(*size, "size.", &err);
    if (!s.has({"shortest_edge", "min_pixels"}) || !s.has({"longest_edge", "max_pixels"})) {
      f.fail(corrupt("\"size\" must hold shortest_edge and longest_edge (min / max pixels), got " + size->dump()));
    }
    pc.min_pixels = s.integer({"shortest_edge", "min_pixels"}, pc.min_pixels);
    pc.max_pixels = s.integer({"longest_edge", "max_pixels"}, pc.max_pixels);
  }
  pc.min_pixels = f.integer({"min_pixels"}, pc.min_pixels);
  pc.max_pixels = f.integer({"max_pixels"}, pc.max_pixels);
  for (const auto& [key, dst] : {std::pair<const char*, float*>{"image_mean", pc.image_mean}, {"image_std", pc.image_std}}) {
    const json* v = f.find({key});
    if (v == nullptr) continue;
    if (!v->is_array() || v->size() != 3 || !std::all_of(v->begin(), v->end(), [](const json& x) { return x.is_number(); })) {
      f.fail(corrupt(std::string("field ") + key + " must be a list of 3 numbers (R, G, B), got " + v->dump()));
      continue;
    }
    for (int c = 0; c < 3; ++c) dst[c] = (*v)[c].get<float>();
  }
  ZEST_RETURN_IF_ERROR(err.with_context(file));
  for (const auto& [name, x] : {std::pair<const char*, int64_t>{"patch_size", pc.patch_size},
                                {"temporal_patch_size", pc.temporal_patch_size},
                                {"merge_size", pc.merge_size},
                                {"min_pixels", pc.min_pixels},
                                {"max_pixels", pc.max_pixels}}) {
    if (x <= 0) return corrupt(file + ": " + name + " must be positive, got " + std::to_string(x));
  }
  if (pc.min_pixels > pc.max_pixels) {
    return corrupt(file + ": min_pixels " + std::to_string(pc.min_pixels) + " exceeds max_pixels " +
                   std::to_string(pc.max_pixels));
  }
  for (int c = 0; c < 3; ++c) {
    if (!(pc.image_std[c] > 0) || !std::isfinite(pc.image_mean[c])) {
      return corrupt(file + ": image_std must be positive and image_mean finite");
    }
  }
  return pc;
}

}  // namespace zest::io
