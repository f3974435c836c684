#include "io/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "io/io_test_util.h"

namespace zest::io {
namespace {

using nlohmann::json;
using testing::data_dir;
using testing::expect_error;
using testing::write_bytes;

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

const json& expected_all() {
  static const json e = read_json(data_dir() + "/expected_configs.json");
  return e;
}

std::vector<int64_t> moe_layers(const TextConfig& t) {
  std::vector<int64_t> out;
  for (int64_t l = 0; l < t.num_layers; ++l) {
    if (t.is_moe_layer(l)) out.push_back(l);
  }
  return out;
}

// Compares a parsed config with the values transformers 5.17 holds for the same file.
void expect_matches(const ModelConfig& c, const json& e, const std::string& file) {
  SCOPED_TRACE(file);
  EXPECT_STREQ(arch_name(c.arch), e["arch"].get<std::string>().c_str());
  const json& t = e["text"];
  EXPECT_EQ(c.text.vocab_size, t["vocab_size"].get<int64_t>());
  EXPECT_EQ(c.text.hidden_size, t["hidden_size"].get<int64_t>());
  EXPECT_EQ(c.text.num_layers, t["num_layers"].get<int64_t>());
  EXPECT_EQ(c.text.num_heads, t["num_heads"].get<int64_t>());
  EXPECT_EQ(c.text.num_kv_heads, t["num_kv_heads"].get<int64_t>());
  EXPECT_EQ(c.text.head_dim, t["head_dim"].get<int64_t>());
  EXPECT_EQ(c.text.rms_norm_eps, t["rms_norm_eps"].get<double>());
  EXPECT_EQ(c.text.rope_theta, t["rope_theta"].get<double>());
  EXPECT_EQ(c.text.max_position_embeddings, t["max_position_embeddings"].get<int64_t>());
  EXPECT_EQ(c.text.tie_word_embeddings, t["tie_word_embeddings"].get<bool>());
  EXPECT_EQ(c.text.num_experts, t["num_experts"].get<int64_t>());
  EXPECT_EQ(c.is_moe(), t["num_experts"].get<int64_t>() > 0);
  EXPECT_EQ(moe_layers(c.text), t["moe_layers"].get<std::vector<int64_t>>());
  if (t.contains("intermediate_size")) {
    EXPECT_EQ(c.text.intermediate_size, t["intermediate_size"].get<int64_t>());
  }
  if (c.is_moe()) {
    EXPECT_EQ(c.text.moe_intermediate_size, t["moe_intermediate_size"].get<int64_t>());
    EXPECT_EQ(c.text.num_experts_per_tok, t["num_experts_per_tok"].get<int64_t>());
    EXPECT_EQ(c.text.norm_topk_prob, t["norm_topk_prob"].get<bool>());
  }
  if (!has_vision(c.arch)) {
    EXPECT_TRUE(c.text.mrope_section.empty());
    EXPECT_FALSE(c.vision.has_value());
    return;
  }
  EXPECT_EQ(c.text.mrope_section, t["mrope_section"].get<std::vector<int64_t>>());
  EXPECT_TRUE(c.text.mrope_interleaved);
  ASSERT_TRUE(c.vision.has_value());
  const json& v = e["vision"];
  const VisionConfig& vc = *c.vision;
  EXPECT_EQ(vc.depth, v["depth"].get<int64_t>());
  EXPECT_EQ(vc.hidden_size, v["hidden_size"].get<int64_t>());
  EXPECT_EQ(vc.num_heads, v["num_heads"].get<int64_t>());
  EXPECT_EQ(vc.intermediate_size, v["intermediate_size"].get<int64_t>());
  EXPECT_EQ(vc.patch_size, v["patch_size"].get<int64_t>());
  EXPECT_EQ(vc.temporal_patch_size, v["temporal_patch_size"].get<int64_t>());
  EXPECT_EQ(vc.spatial_merge_size, v["spatial_merge_size"].get<int64_t>());
  EXPECT_EQ(vc.in_channels, v["in_channels"].get<int64_t>());
  EXPECT_EQ(vc.out_hidden_size, v["out_hidden_size"].get<int64_t>());
  EXPECT_EQ(vc.num_position_embeddings, v["num_position_embeddings"].get<int64_t>());
  EXPECT_EQ(vc.hidden_act, v["hidden_act"].get<std::string>());
  EXPECT_EQ(vc.deepstack_visual_indexes, v["deepstack_visual_indexes"].get<std::vector<int64_t>>());
  EXPECT_EQ(c.image_token_id, e["image_token_id"].get<int64_t>());
  EXPECT_EQ(c.video_token_id, e["video_token_id"].get<int64_t>());
  EXPECT_EQ(c.vision_start_token_id, e["vision_start_token_id"].get<int64_t>());
  EXPECT_EQ(c.vision_end_token_id, e["vision_end_token_id"].get<int64_t>());
}

TEST(ConfigTest, MatchesTransformersForEveryRecordedConfig) {
  int checked = 0;
  for (const auto& [file, e] : expected_all().items()) {
    if (file.find(".config.json") == std::string::npos) continue;
    auto c = load_model_config(data_dir() + "/" + file);
    if (e.contains("error")) {
      expect_error(c.status(), ErrorCode::kCorrupt, {e["error"].get<std::string>(), file});
    } else {
      ASSERT_TRUE(c.ok()) << file << ": " << c.status().to_string();
      expect_matches(*c, e, file);
    }
    ++checked;
  }
  EXPECT_EQ(checked, 23);
}

TEST(ConfigTest, RealCheckpointFacts) {
  // The facts the research notes list for the three released models, cross-checking the fixtures.
  auto moe = load_model_config(data_dir() + "/qwen3_30b_a3b.config.json");
  ASSERT_TRUE(moe.ok()) << moe.status().to_string();
  EXPECT_EQ(moe->arch, Arch::kQwen3Moe);
  EXPECT_EQ(moe->model_type, "qwen3_moe");
  EXPECT_EQ(moe->text.num_heads * moe->text.head_dim, 2 * moe->text.hidden_size);

  auto vl_moe = load_model_config(data_dir() + "/qwen3_vl_30b_a3b_instruct.config.json");
  ASSERT_TRUE(vl_moe.ok()) << vl_moe.status().to_string();
  EXPECT_EQ(vl_moe->arch, Arch::kQwen3VLMoe);
  EXPECT_EQ(vl_moe->vision->out_hidden_size, vl_moe->text.hidden_size);
  int64_t sections = 0;
  for (int64_t s : vl_moe->text.mrope_section) sections += s;
  EXPECT_EQ(2 * sections, vl_moe->text.head_dim);

  auto vl = load_model_config(data_dir() + "/qwen3_vl_8b_instruct.config.json");
  ASSERT_TRUE(vl.ok()) << vl.status().to_string();
  EXPECT_EQ(vl->arch, Arch::kQwen3VL);
  EXPECT_FALSE(vl->is_moe());
  EXPECT_FALSE(vl->text.is_moe_layer(0));

  auto dense = load_model_config(data_dir() + "/qwen3_8b.config.json");
  ASSERT_TRUE(dense.ok()) << dense.status().to_string();
  EXPECT_EQ(dense->arch, Arch::kQwen3);
  EXPECT_FALSE(dense->is_moe());
  EXPECT_FALSE(dense->vision.has_value());
  EXPECT_EQ(dense->text.intermediate_size, 12288);
}

TEST(ConfigTest, MissingFileIsNotFound) {
  expect_error(load_model_config("/nonexistent/zest/model").status(), ErrorCode::kNotFound, {"/nonexistent/zest/model"});
}

// ---- variations of the real configs ----

class ConfigEditTest : public ::testing::Test {
 protected:
  json moe_ = read_json(data_dir() + "/qwen3_30b_a3b.config.json");
  json vl_moe_ = read_json(data_dir() + "/qwen3_vl_30b_a3b_instruct.config.json");
  json vl_ = read_json(data_dir() + "/qwen3_vl_8b_instruct.config.json");
  static Result<ModelConfig> parse(const json& j) { return parse_model_config(j.dump()); }
};

TEST_F(ConfigEditTest, ArchitecturesFallback) {
  for (json* j : {&moe_, &vl_moe_, &vl_}) {
    const Arch want = parse(*j)->arch;
    j->erase("model_type");
    auto c = parse(*j);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->arch, want);
    EXPECT_EQ(c->model_type, arch_name(want));
  }
}

// Attention forms zest does not run are refused by name rather than run as full attention without biases.
TEST_F(ConfigEditTest, AttentionBiasAndSlidingWindowsAreUnsupported) {
  json dense = read_json(data_dir() + "/qwen3_8b.config.json");
  ASSERT_TRUE(parse(dense).ok());
  for (json* j : {&moe_, &dense}) {
    json bias = *j;
    bias["attention_bias"] = true;
    expect_error(parse(bias).status(), ErrorCode::kUnsupported, {"attention_bias"});
    json window = *j;
    window["use_sliding_window"] = true;
    expect_error(parse(window).status(), ErrorCode::kUnsupported, {"use_sliding_window"});
    json types = *j;
    types["layer_types"] = json::array({"full_attention", "sliding_attention"});
    expect_error(parse(types).status(), ErrorCode::kUnsupported, {"layer_types", "sliding_attention"});
  }
  vl_["text_config"]["attention_bias"] = true;
  expect_error(parse(vl_).status(), ErrorCode::kUnsupported, {"text_config.attention_bias"});
}

TEST_F(ConfigEditTest, UnknownModelType) {
  moe_["model_type"] = "llama";
  expect_error(parse(moe_).status(), ErrorCode::kUnsupported,
               {"'llama'", "qwen3_moe", "qwen3_vl_moe", "qwen3_vl", "qwen3 (Qwen3ForCausalLM)"});
}

TEST_F(ConfigEditTest, UnknownArchitecture) {
  moe_.erase("model_type");
  moe_["architectures"] = {"LlamaForCausalLM"};
  expect_error(parse(moe_).status(), ErrorCode::kUnsupported,
               {"LlamaForCausalLM", "Qwen3MoeForCausalLM", "Qwen3VLForConditionalGeneration"});
}

TEST_F(ConfigEditTest, NeitherModelTypeNorArchitectures) {
  moe_.erase("model_type");
  moe_.erase("architectures");
  expect_error(parse(moe_).status(), ErrorCode::kCorrupt, {"model_type", "architectures"});
}

TEST_F(ConfigEditTest, NotJsonOrNotObject) {
  expect_error(parse_model_config("{\"model_type\": ").status(), ErrorCode::kCorrupt, {"not valid JSON"});
  expect_error(parse_model_config("[1]").status(), ErrorCode::kCorrupt, {"not a JSON object"});
}

TEST_F(ConfigEditTest, MissingTextField) {
  moe_.erase("hidden_size");
  expect_error(parse(moe_).status(), ErrorCode::kCorrupt, {"hidden_size", "missing"});
  vl_moe_["text_config"].erase("num_hidden_layers");
  expect_error(parse(vl_moe_).status(), ErrorCode::kCorrupt, {"text_config.num_hidden_layers", "missing"});
}

TEST_F(ConfigEditTest, MissingExpertCountNamesBothSpellings) {
  moe_.erase("num_experts");
  expect_error(parse(moe_).status(), ErrorCode::kCorrupt, {"num_experts", "num_local_experts", "missing"});
}

TEST_F(ConfigEditTest, MissingSubConfig) {
  vl_.erase("vision_config");
  expect_error(parse(vl_).status(), ErrorCode::kCorrupt, {"vision_config", "missing"});
  vl_moe_["text_config"] = 3;
  expect_error(parse(vl_moe_).status(), ErrorCode::kCorrupt, {"text_config", "must be an object"});
}

TEST_F(ConfigEditTest, MissingVisionField) {
  vl_["vision_config"].erase("out_hidden_size");
  expect_error(parse(vl_).status(), ErrorCode::kCorrupt, {"vision_config.out_hidden_size", "missing"});
}

TEST_F(ConfigEditTest, DenseModelNeedsIntermediateSize) {
  vl_["text_config"].erase("intermediate_size");
  expect_error(parse(vl_).status(), ErrorCode::kCorrupt, {"text_config.intermediate_size"});
}

TEST_F(ConfigEditTest, WrongFieldType) {
  moe_["num_attention_heads"] = "32";
  expect_error(parse(moe_).status(), ErrorCode::kCorrupt, {"num_attention_heads", "must be an integer", "\"32\""});
  vl_moe_["text_config"]["rms_norm_eps"] = true;
  expect_error(parse(vl_moe_).status(), ErrorCode::kCorrupt, {"text_config.rms_norm_eps", "number"});
  vl_["vision_config"]["deepstack_visual_indexes"] = {1, "x"};
  expect_error(parse(vl_).status(), ErrorCode::kCorrupt, {"vision_config.deepstack_visual_indexes", "list of integers"});
}

TEST_F(ConfigEditTest, KvHeadsMustDivideHeads) {
  moe_["num_key_value_heads"] = 5;
  expect_error(parse(moe_).status(), ErrorCode::kCorrupt, {"num_attention_heads 32", "num_key_value_heads 5"});
}

TEST_F(ConfigEditTest, NonPositiveSizes) {
  moe_["num_hidden_layers"] = 0;
  expect_error(parse(moe_).status(), ErrorCode::kCorrupt, {"num_hidden_layers", "positive"});
  vl_["vision_config"]["depth"] = -2;
  expect_error(parse(vl_).status(), ErrorCode::kCorrupt, {"vision_config.depth", "positive"});
}

TEST_F(ConfigEditTest, TopKAboveExpertCount) {
  vl_moe_["text_config"]["num_experts_per_tok"] = 129;
  expect_error(parse(vl_moe_).status(), ErrorCode::kCorrupt, {"num_experts_per_tok 129", "num_experts = 128"});
}

TEST_F(ConfigEditTest, HeadDimDefaultsToHiddenOverHeads) {
  // (Qwen3VLTextConfig instead defaults head_dim to 128; minimal_tiny_qwen3_vl.config.json checks that.)
  vl_moe_["text_config"].erase("head_dim");
  auto c = parse(vl_moe_);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->text.head_dim, c->text.hidden_size / c->text.num_heads);
  moe_.erase("head_dim");
  moe_["num_attention_heads"] = 24;
  moe_["num_key_value_heads"] = 4;
  expect_error(parse(moe_).status(), ErrorCode::kCorrupt, {"head_dim is missing", "hidden_size 2048", "24"});
}

TEST_F(ConfigEditTest, NullKvHeadsMeansOnePerQueryHead) {
  vl_["text_config"]["num_key_value_heads"] = nullptr;
  auto c = parse(vl_);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->text.num_kv_heads, c->text.num_heads);
}

TEST_F(ConfigEditTest, VisionOutputMustMatchTextWidth) {
  vl_["vision_config"]["out_hidden_size"] = 2048;
  expect_error(parse(vl_).status(), ErrorCode::kCorrupt, {"out_hidden_size 2048", "hidden_size 4096"});
}

TEST_F(ConfigEditTest, DeepstackIndexPastDepth) {
  vl_moe_["vision_config"]["deepstack_visual_indexes"] = {8, 16, 27};
  expect_error(parse(vl_moe_).status(), ErrorCode::kCorrupt, {"deepstack_visual_indexes", "depth = 27"});
  vl_moe_["vision_config"]["deepstack_visual_indexes"] = {8, 8};
  expect_error(parse(vl_moe_).status(), ErrorCode::kCorrupt, {"distinct"});
}

TEST_F(ConfigEditTest, MlpOnlyLayerOutOfRange) {
  moe_["mlp_only_layers"] = {48};
  expect_error(parse(moe_).status(), ErrorCode::kCorrupt, {"mlp_only_layers", "[0, 48)"});
}

TEST_F(ConfigEditTest, DenseLayersInMoeNeedIntermediateSize) {
  moe_["mlp_only_layers"] = {2};
  moe_.erase("intermediate_size");
  expect_error(parse(moe_).status(), ErrorCode::kCorrupt, {"layer 2", "intermediate_size"});
  moe_["intermediate_size"] = 6144;
  auto c = parse(moe_);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_FALSE(c->text.is_moe_layer(2));
  EXPECT_TRUE(c->text.is_moe_layer(1));
}

TEST_F(ConfigEditTest, RopeFieldsInEitherPlace) {
  // transformers 5 layout: theta and sections inside rope_parameters.
  json t = vl_moe_["text_config"];
  t["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 123456.0}, {"mrope_section", {16, 24, 24}}};
  t.erase("rope_scaling");
  t.erase("rope_theta");
  vl_moe_["text_config"] = t;
  auto c = parse(vl_moe_);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->text.rope_theta, 123456.0);
  EXPECT_EQ(c->text.mrope_section, (std::vector<int64_t>{16, 24, 24}));
  EXPECT_TRUE(c->text.mrope_interleaved);
  // No rope entries at all: the transformers defaults.
  vl_moe_["text_config"].erase("rope_parameters");
  c = parse(vl_moe_);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->text.mrope_section, (std::vector<int64_t>{24, 20, 20}));
  EXPECT_GT(c->text.rope_theta, 0.0);
}

TEST_F(ConfigEditTest, ScaledRopeIsUnsupported) {
  moe_["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  expect_error(parse(moe_).status(), ErrorCode::kUnsupported, {"rope_scaling.rope_type", "yarn"});
}

TEST_F(ConfigEditTest, MalformedMropeSection) {
  vl_["text_config"]["rope_scaling"]["mrope_section"] = {24, 20};
  expect_error(parse(vl_).status(), ErrorCode::kCorrupt, {"text_config.rope_scaling.mrope_section", "3 integers"});
  vl_["text_config"]["rope_scaling"]["mrope_section"] = {24, -20, 20};
  expect_error(parse(vl_).status(), ErrorCode::kCorrupt, {"mrope_section", "non-negative"});
}

TEST_F(ConfigEditTest, RopeParametersWrongType) {
  moe_["rope_parameters"] = "default";
  expect_error(parse(moe_).status(), ErrorCode::kCorrupt, {"rope_parameters", "object"});
}

TEST_F(ConfigEditTest, TopLevelTieFlagGovernsVisionModels) {
  vl_moe_["text_config"]["tie_word_embeddings"] = true;
  EXPECT_FALSE(parse(vl_moe_)->text.tie_word_embeddings);
  vl_moe_["tie_word_embeddings"] = true;
  EXPECT_TRUE(parse(vl_moe_)->text.tie_word_embeddings);
}

TEST_F(ConfigEditTest, UnknownVisionActivation) {
  vl_["vision_config"]["hidden_act"] = "quick_gelu";
  expect_error(parse(vl_).status(), ErrorCode::kUnsupported, {"quick_gelu"});
}

// ---- config.json from a directory, generation_config.json ----

class SideConfigTest : public testing::TempDirTest {};

TEST_F(SideConfigTest, ModelConfigFromDirectory) {
  std::filesystem::copy_file(data_dir() + "/qwen3_vl_8b_instruct.config.json", path("config.json"));
  auto c = load_model_config(dir_.string());
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  expect_matches(*c, expected_all()["qwen3_vl_8b_instruct.config.json"], "directory");
}

TEST_F(SideConfigTest, GenerationDefaultsMatchTransformers) {
  const json& e = expected_all()["qwen3_vl.generation_config.json"];
  auto g = load_generation_defaults(data_dir() + "/qwen3_vl.generation_config.json");
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->temperature, e["temperature"].get<double>());
  EXPECT_EQ(g->top_p, e["top_p"].get<double>());
  EXPECT_EQ(g->top_k, e["top_k"].get<int64_t>());
  EXPECT_EQ(g->eos_token_ids, e["eos_token_ids"].get<std::vector<int64_t>>());
}

TEST_F(SideConfigTest, GenerationDefaultsFromDirectoryAndSingleEos) {
  write_bytes(path("generation_config.json"), R"({"eos_token_id": 151645, "top_k": null})");
  auto g = load_generation_defaults(dir_.string());
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->eos_token_ids, std::vector<int64_t>{151645});
  EXPECT_FALSE(g->top_k.has_value());
  EXPECT_FALSE(g->temperature.has_value());
}

TEST_F(SideConfigTest, DoSampleFalseMeansGreedy) {
  // transformers' generate ignores temperature when do_sample is false; zest's default is then greedy.
  write_bytes(path("generation_config.json"), R"({"do_sample": false, "temperature": 0.7, "top_k": 20})");
  auto g = load_generation_defaults(dir_.string());
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->temperature, 0.0);
  write_bytes(path("generation_config.json"), R"({"do_sample": true, "temperature": 0.7})");
  g = load_generation_defaults(dir_.string());
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_EQ(g->temperature, 0.7);
}

TEST_F(SideConfigTest, MissingGenerationConfigGivesEmptyDefaults) {
  auto g = load_generation_defaults(dir_.string());
  ASSERT_TRUE(g.ok()) << g.status().to_string();
  EXPECT_FALSE(g->temperature || g->top_p || g->top_k);
  EXPECT_TRUE(g->eos_token_ids.empty());
}

TEST_F(SideConfigTest, MalformedGenerationConfig) {
  write_bytes(path("generation_config.json"), "{\"temperature\": ");
  expect_error(load_generation_defaults(dir_.string()).status(), ErrorCode::kCorrupt, {"generation_config.json", "JSON"});
  write_bytes(path("generation_config.json"), R"({"temperature": "hot"})");
  expect_error(load_generation_defaults(dir_.string()).status(), ErrorCode::kCorrupt, {"temperature", "number"});
  write_bytes(path("generation_config.json"), R"({"eos_token_id": [1, "x"]})");
  expect_error(load_generation_defaults(dir_.string()).status(), ErrorCode::kCorrupt, {"eos_token_id"});
  write_bytes(path("generation_config.json"), R"({"top_p": 1.5})");
  expect_error(load_generation_defaults(dir_.string()).status(), ErrorCode::kCorrupt, {"top_p"});
}

// ---- preprocessor_config.json ----

void expect_preprocessor(const PreprocessorConfig& p, const json& e) {
  EXPECT_EQ(p.patch_size, e["patch_size"].get<int64_t>());
  EXPECT_EQ(p.temporal_patch_size, e["temporal_patch_size"].get<int64_t>());
  EXPECT_EQ(p.merge_size, e["merge_size"].get<int64_t>());
  EXPECT_EQ(p.min_pixels, e["min_pixels"].get<int64_t>());
  EXPECT_EQ(p.max_pixels, e["max_pixels"].get<int64_t>());
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(p.image_mean[c], e["image_mean"][c].get<float>());
    EXPECT_EQ(p.image_std[c], e["image_std"][c].get<float>());
  }
}

TEST_F(SideConfigTest, PreprocessorMatchesTransformers) {
  for (const char* name : {"qwen3_vl.preprocessor_config.json", "qwen2_vl_style.preprocessor_config.json"}) {
    SCOPED_TRACE(name);
    auto p = load_preprocessor_config(data_dir() + "/" + name);
    ASSERT_TRUE(p.ok()) << p.status().to_string();
    expect_preprocessor(*p, expected_all()[name]);
  }
}

TEST_F(SideConfigTest, MissingPreprocessorGivesQwen3Defaults) {
  auto p = load_preprocessor_config(dir_.string());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  expect_preprocessor(*p, expected_all()["qwen3_vl.preprocessor_config.json"]);
}

TEST_F(SideConfigTest, TopLevelPixelsOverrideSize) {
  write_bytes(path("preprocessor_config.json"),
              R"({"size": {"shortest_edge": 65536, "longest_edge": 16777216}, "max_pixels": 1000000})");
  auto p = load_preprocessor_config(dir_.string());
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  EXPECT_EQ(p->min_pixels, 65536);
  EXPECT_EQ(p->max_pixels, 1000000);
}

TEST_F(SideConfigTest, MalformedPreprocessor) {
  const std::string f = path("preprocessor_config.json");
  write_bytes(f, R"({"size": {"shortest_edge": 65536}})");
  expect_error(load_preprocessor_config(dir_.string()).status(), ErrorCode::kCorrupt, {"longest_edge"});
  write_bytes(f, R"({"image_mean": [0.5, 0.5]})");
  expect_error(load_preprocessor_config(dir_.string()).status(), ErrorCode::kCorrupt, {"image_mean", "3 numbers"});
  write_bytes(f, R"({"min_pixels": 5000, "max_pixels": 4000})");
  expect_error(load_preprocessor_config(dir_.string()).status(), ErrorCode::kCorrupt, {"min_pixels 5000", "max_pixels 4000"});
  write_bytes(f, R"({"patch_size": 0})");
  expect_error(load_preprocessor_config(dir_.string()).status(), ErrorCode::kCorrupt, {"patch_size", "positive"});
  write_bytes(f, R"({"image_std": [0.5, 0, 0.5]})");
  expect_error(load_preprocessor_config(dir_.string()).status(), ErrorCode::kCorrupt, {"image_std"});
  write_bytes(f, "not json");
  expect_error(load_preprocessor_config(dir_.string()).status(), ErrorCode::kCorrupt, {"preprocessor_config.json"});
}

}  // namespace
}  // namespace zest::io
