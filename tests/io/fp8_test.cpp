// Block-wise FP8 checkpoints at the io level: the exact float8_e4m3fn decoding (every byte against torch's
// conversion table, tests/fixtures/fp8/e4m3_table.npy exported by tools/make_fp8_fixtures.py, and against the
// format definition computed here), quantization_config parsing, binding of "<weight>_scale_inv" block
// scales (partial edge blocks included) and the errors for malformed FP8 checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/dtype.h"
#include "io/config.h"
#include "io/io_test_util.h"
#include "io/npy.h"
#include "io/safetensors.h"

namespace zest::io {
namespace {

using testing::expect_error;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// float8_e4m3fn from its definition in double arithmetic: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits.
double e4m3_definition(uint8_t c) {
  const double sign = (c & 0x80) ? -1.0 : 1.0;
  const int e = (c >> 3) & 0xf, m = c & 7;
  if (e == 15 && m == 7) return std::copysign(NAN, sign);
  if (e == 0) return sign * m * std::ldexp(1.0, -9);
  return sign * (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
}

TEST(Fp8Decode, EveryByteMatchesTorchTable) {
  auto table = read_npy(std::string(ZEST_FIXTURES_DIR) + "/fp8/e4m3_table.npy");
  ASSERT_TRUE(table.ok()) << table.status().to_string();
  ASSERT_EQ(table->numel(), 256);
  int nans = 0;
  for (int c = 0; c < 256; ++c) {
    const float want = table->data<float>()[c];
    const float got = f8e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      ++nans;
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << "code " << c;
    } else {
      EXPECT_EQ(bits(got), bits(want)) << "code " << c << ": " << got << " vs " << want;  // -0 included
    }
  }
  EXPECT_EQ(nans, 2);  // 0x7f and 0xff
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(Fp8Decode, EveryByteMatchesTheFormatDefinition) {
  std::vector<uint8_t> all(256);
  for (int c = 0; c < 256; ++c) all[c] = static_cast<uint8_t>(c);
  std::vector<float> conv(256);
  convert_to_f32(DType::F8E4M3, all.data(), conv.data(), 256);
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_definition(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(conv[c])) << c;
    } else {
      EXPECT_EQ(static_cast<double>(conv[c]), want) << "code " << c;
      EXPECT_EQ(std::signbit(conv[c]), std::signbit(want)) << "code " << c;
    }
  }
  EXPECT_EQ(dtype_size(DType::F8E4M3), 1u);
  EXPECT_STREQ(dtype_name(DType::F8E4M3), "F8_E4M3");
}

// f32 -> e4m3 (the quantizer of random FP8 weights): every finite code comes back to itself, any other value goes to
// a nearest code (checked against the definition; ties to the even mantissa), magnitudes past 448 saturate, NaN stays
// NaN.
TEST(Fp8Encode, NearestCodeWithTiesToEvenAndSaturation) {
  for (int c = 0; c < 256; ++c) {
    const float v = f8e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    EXPECT_EQ(f32_to_f8e4m3(v), c) << "code " << c;
  }
  std::mt19937 rng(41);
  std::uniform_real_distribution<float> mag(-12.f, 9.5f);
  for (int i = 0; i < 20000; ++i) {
    const float x = (rng() & 1 ? -1.f : 1.f) * std::exp2(mag(rng));
    const uint8_t got = f32_to_f8e4m3(x);
    double best = INFINITY;
    for (int c = 0; c < 256; ++c) {
      const double v = e4m3_definition(static_cast<uint8_t>(c));
      if (!std::isnan(v)) best = std::min(best, std::fabs(v - x));
    }
    const double err = std::fabs(e4m3_definition(got) - x);
    if (std::fabs(x) <= 448.f) {
      EXPECT_EQ(err, best) << x;
    } else {
      EXPECT_EQ(got & 0x7f, 0x7e) << x;  // 448 with the sign of x
    }
    EXPECT_EQ(got >> 7, x < 0 ? 1 : 0) << x;
  }
  EXPECT_EQ(f32_to_f8e4m3(1e9f), 0x7e);
  EXPECT_EQ(f32_to_f8e4m3(-464.f), 0xfe);         // a tie between 448 and 480 (not a value): 448
  EXPECT_EQ(f32_to_f8e4m3(std::ldexp(1.f, -10)), 0x00);  // half the smallest subnormal: tie to even (zero)
  EXPECT_EQ(f32_to_f8e4m3(3.f * std::ldexp(1.f, -10)), 0x02);  // 1.5 subnormal steps: tie to even (2)
  EXPECT_EQ(f32_to_f8e4m3(1.0625f), 0x38);  // between 1 (mantissa 0) and 1.125 (1): the even one, 1
  EXPECT_EQ(f32_to_f8e4m3(1.1875f), 0x3a);  // between 1.125 (1) and 1.25 (2): 1.25
  EXPECT_EQ(f32_to_f8e4m3(NAN) & 0x7f, 0x7f);
  EXPECT_EQ(f32_to_f8e4m3(-0.f), 0x80);
}

// ---- quantization_config ------------------------------------------------------------------------------

std::string text_config(const std::string& quant) {
  return R"({"model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1,
             "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8, "moe_intermediate_size": 8,
             "num_experts": 4, "num_experts_per_tok": 2)" +
         (quant.empty() ? std::string() : ", \"quantization_config\": " + quant) + "}";
}

TEST(Fp8Config, ParsesQwenFp8Section) {
  auto c = parse_model_config(text_config(
      R"({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128],
          "modules_to_not_convert": ["lm_head", "mlp.gate"]})"));
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_TRUE(c->fp8.has_value());
  EXPECT_EQ(c->fp8->block_rows, 128);
  EXPECT_EQ(c->fp8->block_cols, 128);
  EXPECT_EQ(c->fp8->modules_to_not_convert, (std::vector<std::string>{"lm_head", "mlp.gate"}));
  // Optional fields take transformers' defaults (block [128, 128], e4m3, dynamic).
  auto d = parse_model_config(text_config(R"({"quant_method": "fp8"})"));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  ASSERT_TRUE(d->fp8.has_value());
  EXPECT_EQ(d->fp8->block_rows, 128);
  EXPECT_TRUE(d->fp8->modules_to_not_convert.empty());
  auto none = parse_model_config(text_config("null"));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->fp8.has_value());
  EXPECT_FALSE(parse_model_config(text_config(""))->fp8.has_value());
}

TEST(Fp8Config, OtherQuantizationIsRefused) {
  for (const char* m : {"awq", "gptq", "compressed-tensors", "bitsandbytes", "fbgemm_fp8"}) {
    expect_error(parse_model_config(text_config(std::string(R"({"quant_method": ")") + m + "\"}")).status(),
                 ErrorCode::kUnsupported, {"quant_method", m, "fp8"});
  }
  expect_error(parse_model_config(text_config(R"({"quant_method": "fp8", "weight_block_size": [64, 64]})")).status(),
               ErrorCode::kUnsupported, {"weight_block_size", "[64,64]", "[128, 128]"});
  expect_error(parse_model_config(text_config(R"({"quant_method": "fp8", "weight_block_size": [128, 64]})")).status(),
               ErrorCode::kUnsupported, {"weight_block_size"});
  expect_error(parse_model_config(text_config(R"({"quant_method": "fp8", "weight_block_size": null})")).status(),
               ErrorCode::kUnsupported, {"weight_block_size", "per tensor"});
  expect_error(parse_model_config(text_config(R"({"quant_method": "fp8", "fmt": "e5m2"})")).status(),
               ErrorCode::kUnsupported, {"fmt", "e5m2"});
  expect_error(parse_model_config(text_config(R"({"quant_method": "fp8", "activation_scheme": "static"})")).status(),
               ErrorCode::kUnsupported, {"activation_scheme", "static"});
  expect_error(parse_model_config(text_config(R"({"quant_method": "fp8", "scale_fmt": "ue8m0"})")).status(),
               ErrorCode::kUnsupported, {"scale_fmt", "ue8m0"});
}

TEST(Fp8Config, MalformedSectionIsCorrupt) {
  expect_error(parse_model_config(text_config("[1]")).status(), ErrorCode::kCorrupt, {"quantization_config"});
  expect_error(parse_model_config(text_config(R"({"fmt": "e4m3"})")).status(), ErrorCode::kCorrupt, {"quant_method"});
  expect_error(parse_model_config(text_config(R"({"quant_method": 8})")).status(), ErrorCode::kCorrupt,
               {"quant_method", "string"});
  expect_error(parse_model_config(text_config(R"({"quant_method": "fp8", "weight_block_size": [128]})")).status(),
               ErrorCode::kCorrupt, {"weight_block_size", "two positive integers"});
  expect_error(parse_model_config(text_config(R"({"quant_method": "fp8", "weight_block_size": [0, 128]})")).status(),
               ErrorCode::kCorrupt, {"weight_block_size"});
  expect_error(
      parse_model_config(text_config(R"({"quant_method": "fp8", "modules_to_not_convert": "lm_head"})")).status(),
      ErrorCode::kCorrupt, {"modules_to_not_convert"});
  expect_error(parse_model_config(text_config(R"({"quant_method": "fp8", "modules_to_not_convert": [3]})")).status(),
               ErrorCode::kCorrupt, {"modules_to_not_convert"});
}

TEST(Fp8Config, ModulesToNotConvertMatchLikeTransformers) {
  Fp8Config c;
  c.modules_to_not_convert = {"lm_head", "mlp.gate", "model.visual", "model.layers.1.self_attn.o_proj",
                              "model\\.layers\\.[0-9]+\\.mlp\\.shared"};
  EXPECT_TRUE(c.not_converted("lm_head"));
  EXPECT_TRUE(c.not_converted("model.layers.7.mlp.gate"));           // suffix
  EXPECT_FALSE(c.not_converted("model.layers.7.mlp.gate_proj"));     // not a suffix, not a prefix
  EXPECT_TRUE(c.not_converted("model.visual.blocks.0.attn.qkv"));    // prefix
  EXPECT_TRUE(c.not_converted("model.layers.1.self_attn.o_proj"));
  EXPECT_FALSE(c.not_converted("model.layers.2.self_attn.o_proj"));
  EXPECT_TRUE(c.not_converted("model.layers.12.mlp.shared_expert"));  // regular expression at the start
  EXPECT_FALSE(c.not_converted("model.layers.12.mlp.experts.3.up_proj"));
  EXPECT_FALSE(Fp8Config{}.not_converted("lm_head"));
}

// ---- binding block scales ------------------------------------------------------------------------------

class Fp8Bind : public testing::TempDirTest {
 protected:
  // FP8 codes of a [rows, cols] weight: random finite bytes (no NaN codes).
  static Tensor codes(int64_t rows, int64_t cols, uint32_t seed) {
    Tensor t = Tensor::empty({rows, cols}, DType::F8E4M3);
    std::mt19937 rng(seed);
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint8_t c = static_cast<uint8_t>(rng());
      if ((c & 0x7f) == 0x7f) c ^= 0x01;
      t.data<uint8_t>()[i] = c;
    }
    return t;
  }
  static Tensor scales(int64_t r, int64_t c, DType dt, uint32_t seed) {
    Tensor t = Tensor::empty({r, c}, dt);
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(1e-4f, 2e-2f);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const float v = u(rng);
      if (dt == DType::F32) t.data<float>()[i] = v;
      if (dt == DType::BF16) t.data<uint16_t>()[i] = f32_to_bf16(v);
      if (dt == DType::F16) t.data<uint16_t>()[i] = f32_to_f16(v);
    }
    return t;
  }
  Result<SafeTensors> write_open(const std::vector<std::pair<std::string, Tensor>>& tensors) {
    const std::string f = path("w" + std::to_string(files_++) + ".safetensors");
    Status s = write_safetensors(f, tensors);
    if (!s.is_ok()) return s;
    return SafeTensors::open_file(f);
  }
  static Fp8Config config() {
    Fp8Config c;
    c.modules_to_not_convert = {"lm_head"};
    return c;
  }
  int files_ = 0;
};

TEST_F(Fp8Bind, DequantizesEveryBlockIncludingPartialEdges) {
  // [300, 200]: row blocks 128, 128, 44; column blocks 128, 72. [100, 96]: one partial block. [128, 256]:
  // exactly one row block and two full column blocks.
  struct Case {
    int64_t rows, cols;
    DType scale_dtype;
  };
  const Case cases[] = {{300, 200, DType::F32}, {100, 96, DType::BF16}, {128, 256, DType::F16}};
  std::vector<std::pair<std::string, Tensor>> tensors;
  int k = 0;
  for (const Case& c : cases) {
    const std::string name = "layer" + std::to_string(k) + ".proj.weight";
    tensors.emplace_back(name, codes(c.rows, c.cols, 10 + k));
    tensors.emplace_back(name + "_scale_inv", scales((c.rows + 127) / 128, (c.cols + 127) / 128, c.scale_dtype, 20 + k));
    ++k;
  }
  auto st = write_open(tensors);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  // Unbound FP8 tensors are refused (their values would be off by the scale).
  expect_error(st->get("layer0.proj.weight").status(), ErrorCode::kUnsupported, {"layer0.proj.weight", "scale"});
  const Fp8Config cfg = config();
  ASSERT_TRUE(st->bind_fp8_scales(&cfg).is_ok());
  for (size_t i = 0; i < tensors.size(); i += 2) {
    const Tensor& q = tensors[i].second;
    const Tensor& s = tensors[i + 1].second;
    auto v = st->get(tensors[i].first);
    ASSERT_TRUE(v.ok()) << v.status().to_string();
    EXPECT_EQ(v->dtype, DType::F8E4M3);
    EXPECT_EQ(v->scale.name, tensors[i + 1].first);
    EXPECT_EQ(v->scale.block_rows, 128);
    Tensor w = v->to_f32();
    ASSERT_EQ(w.shape(), q.shape());
    const int64_t rows = q.dim(0), cols = q.dim(1), sc = s.dim(1);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t b = (r / 128) * sc + c / 128;
        float scale = 0;
        if (s.dtype() == DType::F32) scale = s.data<float>()[b];
        if (s.dtype() == DType::BF16) scale = bf16_to_f32(s.data<uint16_t>()[b]);
        if (s.dtype() == DType::F16) scale = f16_to_f32(s.data<uint16_t>()[b]);
        const float want = static_cast<float>(e4m3_definition(q.data<uint8_t>()[r * cols + c])) * scale;
        ASSERT_EQ(bits(w.data<float>()[r * cols + c]), bits(want)) << tensors[i].first << " [" << r << ", " << c << "]";
      }
  }
}

TEST_F(Fp8Bind, BindingIsIdempotentAndLeavesOtherTensorsAlone) {
  auto st = write_open({{"a.weight", codes(4, 4, 1)},
                        {"a.weight_scale_inv", scales(1, 1, DType::F32, 2)},
                        {"norm.weight", Tensor::from_vector({4}, {1, 2, 3, 4})}});
  ASSERT_TRUE(st.ok());
  const Fp8Config cfg = config();
  ASSERT_TRUE(st->bind_fp8_scales(&cfg).is_ok());
  ASSERT_TRUE(st->bind_fp8_scales(&cfg).is_ok());
  auto n = st->get("norm.weight");
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->scale.data, nullptr);
  EXPECT_EQ(n->to_f32().data<float>()[3], 4.0f);
  // A checkpoint without FP8 tensors binds with or without a config.
  auto plain = write_open({{"norm.weight", Tensor::from_vector({2}, {1, 2})}});
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->bind_fp8_scales(nullptr).is_ok());
  EXPECT_TRUE(plain->bind_fp8_scales(&cfg).is_ok());
}

TEST_F(Fp8Bind, ErrorsNameTheTensor) {
  const Fp8Config cfg = config();
  auto bind = [&](const std::vector<std::pair<std::string, Tensor>>& t, const Fp8Config* c) {
    auto st = write_open(t);
    EXPECT_TRUE(st.ok()) << st.status().to_string();
    return st.ok() ? st->bind_fp8_scales(c) : st.status();
  };
  // FP8 weights but no quantization_config.
  expect_error(bind({{"a.weight", codes(4, 4, 1)}, {"a.weight_scale_inv", scales(1, 1, DType::F32, 1)}}, nullptr),
               ErrorCode::kUnsupported, {"'a.weight'", "F8_E4M3", "quantization_config"});
  // Missing scale.
  expect_error(bind({{"a.weight", codes(4, 4, 1)}}, &cfg), ErrorCode::kCorrupt, {"'a.weight'", "a.weight_scale_inv"});
  // Scale grid of the wrong shape: [200, 300] needs [2, 3].
  expect_error(bind({{"a.weight", codes(200, 300, 1)}, {"a.weight_scale_inv", scales(2, 2, DType::F32, 1)}}, &cfg),
               ErrorCode::kCorrupt, {"a.weight_scale_inv", "[2, 2]", "[2, 3]", "[200, 300]"});
  // Scale of a non-float dtype.
  expect_error(bind({{"a.weight", codes(4, 4, 1)}, {"a.weight_scale_inv", Tensor::empty({1, 1}, DType::I32)}}, &cfg),
               ErrorCode::kCorrupt, {"a.weight_scale_inv", "I32"});
  // Non-finite or negative scale.
  Tensor bad = scales(1, 2, DType::F32, 1);
  bad.data<float>()[1] = NAN;
  expect_error(bind({{"a.weight", codes(4, 200, 1)}, {"a.weight_scale_inv", bad}}, &cfg), ErrorCode::kCorrupt,
               {"a.weight_scale_inv", "(0, 1)"});
  bad.data<float>()[1] = -1.0f;
  expect_error(bind({{"a.weight", codes(4, 200, 1)}, {"a.weight_scale_inv", bad}}, &cfg), ErrorCode::kCorrupt,
               {"a.weight_scale_inv", "non-negative"});
  // A scale whose weight is bf16, or that has no weight.
  expect_error(bind({{"a.weight", Tensor::zeros({4, 4}, DType::BF16)}, {"a.weight_scale_inv", scales(1, 1, DType::F32, 1)}},
                    &cfg),
               ErrorCode::kCorrupt, {"a.weight_scale_inv", "BF16"});
  expect_error(bind({{"b.weight_scale_inv", scales(1, 1, DType::F32, 1)}}, &cfg), ErrorCode::kCorrupt,
               {"b.weight_scale_inv", "'b.weight'"});
  // An FP8 weight in a module the config keeps unquantized.
  expect_error(bind({{"lm_head.weight", codes(4, 4, 1)}, {"lm_head.weight_scale_inv", scales(1, 1, DType::F32, 1)}}, &cfg),
               ErrorCode::kCorrupt, {"'lm_head.weight'", "modules_to_not_convert", "'lm_head'"});
  // Fused 3-D expert tensors in FP8.
  Tensor fused = Tensor::empty({2, 4, 6}, DType::F8E4M3);
  std::memset(fused.raw(), 0, fused.nbytes());
  expect_error(bind({{"mlp.experts.gate_up_proj", fused}, {"mlp.experts.gate_up_proj_scale_inv", scales(2, 1, DType::F32, 1)}},
                    &cfg),
               ErrorCode::kUnsupported, {"mlp.experts.gate_up_proj", "[2, 4, 6]", "one tensor each"});
}

}  // namespace
}  // namespace zest::io
