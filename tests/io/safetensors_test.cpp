#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "io/io_test_util.h"

namespace zest::io {
namespace {

using nlohmann::json;
using testing::data_dir;
using testing::expect_error;
using testing::read_bytes;
using testing::safetensors_bytes;
using testing::write_bytes;

class SafeTensorsTest : public testing::TempDirTest {
 protected:
  // Writes a hand-made file and opens it.
  Result<SafeTensors> open_raw(const std::string& header, const std::string& data) {
    const std::string f = path("raw.safetensors");
    write_bytes(f, safetensors_bytes(header, data));
    return SafeTensors::open_file(f);
  }
  Status raw_status(const std::string& header, size_t data_bytes) {
    return open_raw(header, std::string(data_bytes, '\x11')).status();
  }
};

// Independent bf16 decode: the bf16 bits are the high half of an f32.
float bf16_bits_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Independent f16 decode in double arithmetic from the IEEE half layout (no inf/NaN inputs here).
float f16_bits_to_float(uint16_t h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 31, mant = h & 1023;
  const double mag = exp == 0 ? mant / 1024.0 * std::pow(2.0, -14) : (1.0 + mant / 1024.0) * std::pow(2.0, exp - 15);
  return static_cast<float>(sign ? -mag : mag);
}

TEST_F(SafeTensorsTest, RoundTripsEveryDtype) {
  std::mt19937 rng(7);
  const std::vector<float> f32 = testing::random_floats(6 * 5, 11, 3.0f);
  Tensor t_f32 = Tensor::from_vector({6, 5}, f32);

  // BF16 / F16 from random finite bit patterns (exponent field never all-ones).
  Tensor t_bf16 = Tensor::empty({4, 7}, DType::BF16);
  Tensor t_f16 = Tensor::empty({3, 3, 2}, DType::F16);
  for (int64_t i = 0; i < t_bf16.numel(); ++i) {
    uint16_t h = static_cast<uint16_t>(rng());
    if (((h >> 7) & 0xff) == 0xff) h &= 0xbfff;
    t_bf16.data<uint16_t>()[i] = h;
  }
  for (int64_t i = 0; i < t_f16.numel(); ++i) {
    uint16_t h = static_cast<uint16_t>(rng());
    if (((h >> 10) & 31) == 31) h &= 0xbfff;
    t_f16.data<uint16_t>()[i] = h;
  }
  Tensor t_i32 = Tensor::empty({9}, DType::I32);
  for (int64_t i = 0; i < 9; ++i) t_i32.data<int32_t>()[i] = static_cast<int32_t>(rng());
  Tensor t_i64 = Tensor::empty({2, 4}, DType::I64);
  for (int64_t i = 0; i < 8; ++i) t_i64.data<int64_t>()[i] = (static_cast<int64_t>(rng()) << 32) ^ rng();
  Tensor t_u8 = Tensor::empty({13}, DType::U8);
  for (int64_t i = 0; i < 13; ++i) t_u8.data<uint8_t>()[i] = static_cast<uint8_t>(rng());
  Tensor t_scalar = Tensor::from_vector({}, {2.5f});
  Tensor t_empty = Tensor::empty({0, 3}, DType::BF16);

  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"w.f32", t_f32}, {"w.bf16", t_bf16}, {"w.f16", t_f16}, {"w.i32", t_i32},
      {"w.i64", t_i64}, {"w.u8", t_u8},     {"scalar", t_scalar}, {"empty", t_empty}};
  const std::string file = path("all.safetensors");
  ASSERT_TRUE(write_safetensors(file, tensors, {{"format", "pt"}, {"note", "round trip"}}).is_ok());

  auto st = SafeTensors::open(file);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(st->names().size(), tensors.size());
  EXPECT_EQ(st->metadata().at("format"), "pt");
  EXPECT_EQ(st->metadata().at("note"), "round trip");
  for (const auto& [name, t] : tensors) {
    auto v = st->get(name);
    ASSERT_TRUE(v.ok()) << name;
    EXPECT_EQ(v->dtype, t.dtype()) << name;
    EXPECT_EQ(v->shape, t.shape()) << name;
    ASSERT_EQ(v->nbytes, t.nbytes()) << name;
    EXPECT_EQ(std::memcmp(v->data, t.raw(), t.nbytes()), 0) << name;

    // to_f32 against a plain per-dtype loop; every conversion here is exact, so tolerance 0.
    Tensor f = v->to_f32();
    ASSERT_EQ(f.dtype(), DType::F32);
    ASSERT_EQ(f.shape(), t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) {
      float want = 0;
      switch (t.dtype()) {
        case DType::F32: want = t.data<float>()[i]; break;
        case DType::BF16: want = bf16_bits_to_float(t.data<uint16_t>()[i]); break;
        case DType::F16: want = f16_bits_to_float(t.data<uint16_t>()[i]); break;
        case DType::I32: want = static_cast<float>(t.data<int32_t>()[i]); break;
        case DType::I64: want = static_cast<float>(t.data<int64_t>()[i]); break;
        case DType::U8: want = static_cast<float>(t.data<uint8_t>()[i]); break;
        case DType::F8E4M3: ADD_FAILURE() << "no FP8 tensor in this round trip"; break;
      }
      EXPECT_EQ(f.data<float>()[i], want) << name << "[" << i << "]";
    }
  }
}

TEST_F(SafeTensorsTest, WrittenFileFollowsTheFormat) {
  const std::vector<float> a = testing::random_floats(12, 3);
  const std::string file = path("fmt.safetensors");
  ASSERT_TRUE(write_safetensors(file, {{"b", Tensor::from_vector({3, 4}, a)}, {"a", Tensor::from_vector({2}, {1, 2})}},
                                {{"k", "v"}})
                  .is_ok());
  const std::string bytes = read_bytes(file);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ((8 + n) % 8, 0u) << "data section should start 8-byte aligned";
  ASSERT_EQ(bytes.size(), 8 + n + (12 + 2) * 4);
  const json h = json::parse(bytes.substr(8, n));
  EXPECT_EQ(h["__metadata__"]["k"], "v");
  EXPECT_EQ(h["b"]["dtype"], "F32");
  EXPECT_EQ(h["b"]["shape"], json({3, 4}));
  EXPECT_EQ(h["b"]["data_offsets"], json({0, 48}));
  EXPECT_EQ(h["a"]["data_offsets"], json({48, 56}));
  float first;
  std::memcpy(&first, bytes.data() + 8 + n, 4);
  EXPECT_EQ(first, a[0]);
}

TEST_F(SafeTensorsTest, ReadsFileWrittenByPythonSafetensors) {
  auto st = SafeTensors::open_file(data_dir() + "/st_all_dtypes.safetensors");
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  std::ifstream in(data_dir() + "/st_all_dtypes.json");
  const json exp = json::parse(in);
  EXPECT_EQ(st->names().size(), exp["tensors"].size());
  for (const auto& [k, v] : exp["metadata"].items()) EXPECT_EQ(st->metadata().at(k), v.get<std::string>());
  for (const auto& [name, e] : exp["tensors"].items()) {
    auto v = st->get(name);
    ASSERT_TRUE(v.ok()) << name;
    EXPECT_EQ(dtype_name(v->dtype), e["dtype"].get<std::string>()) << name;
    EXPECT_EQ(v->shape, e["shape"].get<std::vector<int64_t>>()) << name;
    const json& vals = e["values"];
    ASSERT_EQ(v->numel(), static_cast<int64_t>(vals.size())) << name;
    if (v->dtype == DType::I64 || v->dtype == DType::I32 || v->dtype == DType::U8) {
      for (size_t i = 0; i < vals.size(); ++i) {
        int64_t got = 0;
        if (v->dtype == DType::I64) got = static_cast<const int64_t*>(v->data)[i];
        if (v->dtype == DType::I32) got = static_cast<const int32_t*>(v->data)[i];
        if (v->dtype == DType::U8) got = static_cast<const uint8_t*>(v->data)[i];
        EXPECT_EQ(got, vals[i].get<int64_t>()) << name << "[" << i << "]";
      }
    } else {
      // torch's .float() of bf16/f16 is exact, so the tolerance is 0.
      Tensor f = v->to_f32();
      for (size_t i = 0; i < vals.size(); ++i) {
        EXPECT_EQ(f.data<float>()[i], vals[i].get<float>()) << name << "[" << i << "]";
      }
    }
  }
}

TEST_F(SafeTensorsTest, OpensDirectoryWithSingleFile) {
  const std::vector<float> a = testing::random_floats(4, 5);
  ASSERT_TRUE(write_safetensors(path("model.safetensors"), {{"x", Tensor::from_vector({4}, a)}}).is_ok());
  auto st = SafeTensors::open(dir_.string());
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  auto v = st->get("x", {4});
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(static_cast<const float*>(v->data)[3], a[3]);
}

TEST_F(SafeTensorsTest, GetReportsMissingTensorAndWrongShape) {
  ASSERT_TRUE(write_safetensors(path("m.safetensors"), {{"x", Tensor::from_vector({2, 3}, testing::random_floats(6, 1))}})
                  .is_ok());
  auto st = SafeTensors::open_file(path("m.safetensors"));
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->contains("x"));
  EXPECT_FALSE(st->contains("y"));
  expect_error(st->get("y").status(), ErrorCode::kNotFound, {"'y'"});
  expect_error(st->get("x", {3, 2}).status(), ErrorCode::kCorrupt, {"'x'", "[2, 3]", "[3, 2]"});
}

TEST_F(SafeTensorsTest, LoadsShardsThroughIndex) {
  std::vector<std::pair<std::string, std::vector<float>>> values;
  json weight_map = json::object();
  for (int s = 0; s < 3; ++s) {
    const std::string shard = "model-0000" + std::to_string(s + 1) + "-of-00003.safetensors";
    std::vector<std::pair<std::string, Tensor>> ts;
    for (int k = 0; k < 2; ++k) {
      const std::string name = "layers." + std::to_string(2 * s + k) + ".weight";
      values.emplace_back(name, testing::random_floats(6, 100 + 2 * s + k));
      Tensor t = Tensor::empty({2, 3}, DType::BF16);
      for (int i = 0; i < 6; ++i) t.data<uint16_t>()[i] = f32_to_bf16(values.back().second[i]);
      ts.emplace_back(name, t);
      weight_map[name] = shard;
    }
    ASSERT_TRUE(write_safetensors(path(shard), ts, {{"format", "pt"}, {"shard" + std::to_string(s), "yes"}}).is_ok());
  }
  write_bytes(path("model.safetensors.index.json"),
              json({{"metadata", {{"total_size", 72}}}, {"weight_map", weight_map}}).dump(1));

  for (const std::string& p : {dir_.string(), path("model.safetensors.index.json")}) {
    auto st = SafeTensors::open(p);
    ASSERT_TRUE(st.ok()) << st.status().to_string();
    EXPECT_EQ(st->names().size(), 6u);
    EXPECT_EQ(st->metadata().at("format"), "pt");
    for (int s = 0; s < 3; ++s) EXPECT_EQ(st->metadata().at("shard" + std::to_string(s)), "yes");
    for (const auto& [name, v] : values) {
      auto view = st->get(name, {2, 3});
      ASSERT_TRUE(view.ok()) << name;
      Tensor f = view->to_f32();
      // bf16 storage (8 significant bits): within half an ulp, at most |v| * 2^-8, of the f32 originals.
      for (int i = 0; i < 6; ++i) EXPECT_NEAR(f.data<float>()[i], v[i], std::fabs(v[i]) * 0x1p-8f) << name;
    }
  }
}

TEST_F(SafeTensorsTest, MisalignedDataStillConverts) {
  // A 13-byte header (no padding) puts the f32 data at file offset 21.
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const float vals[2] = {1.25f, -3.5f};
  std::string data(8, '\0');
  std::memcpy(data.data(), vals, 8);
  auto st = open_raw(header, data);
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  Tensor f = st->get("a")->to_f32();
  EXPECT_EQ(f.data<float>()[0], vals[0]);
  EXPECT_EQ(f.data<float>()[1], vals[1]);
}

TEST_F(SafeTensorsTest, GapsBetweenTensorsAreAllowed) {
  auto st = open_raw(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}})",
                     "\x01\x02gapx\x03\x04");
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  EXPECT_EQ(static_cast<const uint8_t*>(st->get("b")->data)[1], 4);
}

// ---- malformed single files: one test per problem, each checking the code and the message ----

TEST_F(SafeTensorsTest, MissingFile) {
  expect_error(SafeTensors::open_file(path("nope.safetensors")).status(), ErrorCode::kNotFound, {"nope.safetensors"});
  expect_error(SafeTensors::open(path("nope.safetensors")).status(), ErrorCode::kNotFound, {"nope.safetensors"});
}

TEST_F(SafeTensorsTest, DirectoryWithoutCheckpoint) {
  expect_error(SafeTensors::open(dir_.string()).status(), ErrorCode::kNotFound,
               {"model.safetensors.index.json", "model.safetensors"});
}

TEST_F(SafeTensorsTest, FileShorterThanLengthPrefix) {
  write_bytes(path("short.safetensors"), std::string("\x05\x00\x00", 3));
  expect_error(SafeTensors::open_file(path("short.safetensors")).status(), ErrorCode::kCorrupt, {"3 bytes", "8-byte"});
  write_bytes(path("empty.safetensors"), "");
  expect_error(SafeTensors::open_file(path("empty.safetensors")).status(), ErrorCode::kCorrupt, {"0 bytes"});
}

TEST_F(SafeTensorsTest, HeaderLengthPastEndOfFile) {
  write_bytes(path("h.safetensors"), safetensors_bytes("{}", "", 1000));
  expect_error(SafeTensors::open_file(path("h.safetensors")).status(), ErrorCode::kCorrupt,
               {"header length 1000", "past the end"});
}

TEST_F(SafeTensorsTest, AbsurdHeaderLength) {
  write_bytes(path("h.safetensors"), safetensors_bytes("{}", "", 1ull << 40));
  expect_error(SafeTensors::open_file(path("h.safetensors")).status(), ErrorCode::kCorrupt, {"absurd"});
  write_bytes(path("h2.safetensors"), safetensors_bytes("{}", "", ~0ull));
  expect_error(SafeTensors::open_file(path("h2.safetensors")).status(), ErrorCode::kCorrupt, {"absurd"});
}

TEST_F(SafeTensorsTest, HeaderNotJson) {
  expect_error(raw_status(R"({"a": {"dtype": "F32", )", 0), ErrorCode::kCorrupt, {"not valid JSON"});
}

TEST_F(SafeTensorsTest, HeaderNotObject) {
  expect_error(raw_status("[1, 2, 3]", 0), ErrorCode::kCorrupt, {"not an object", "array"});
}

TEST_F(SafeTensorsTest, EntryNotObject) {
  expect_error(raw_status(R"({"a": 5})", 0), ErrorCode::kCorrupt, {"'a'", "not a JSON object"});
}

TEST_F(SafeTensorsTest, EntryWithoutDtype) {
  expect_error(raw_status(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), ErrorCode::kCorrupt, {"'a'", "\"dtype\""});
}

TEST_F(SafeTensorsTest, EntryWithoutShape) {
  expect_error(raw_status(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4), ErrorCode::kCorrupt, {"'a'", "\"shape\""});
}

TEST_F(SafeTensorsTest, EntryWithoutDataOffsets) {
  expect_error(raw_status(R"({"a":{"dtype":"F32","shape":[1]}})", 4), ErrorCode::kCorrupt, {"'a'", "\"data_offsets\""});
}

TEST_F(SafeTensorsTest, DtypeWrongType) {
  expect_error(raw_status(R"({"a":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4), ErrorCode::kCorrupt,
               {"'a'", "\"dtype\" must be a string"});
}

TEST_F(SafeTensorsTest, ShapeWrongType) {
  expect_error(raw_status(R"({"a":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", 4), ErrorCode::kCorrupt,
               {"'a'", "\"shape\" must be an array"});
  expect_error(raw_status(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4), ErrorCode::kCorrupt,
               {"'a'", "1.5", "not an integer"});
}

TEST_F(SafeTensorsTest, DataOffsetsWrongType) {
  expect_error(raw_status(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4), ErrorCode::kCorrupt,
               {"'a'", "[begin, end]"});
  expect_error(raw_status(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":["0","4"]}})", 4), ErrorCode::kCorrupt,
               {"'a'", "[begin, end]"});
  expect_error(raw_status(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4), ErrorCode::kCorrupt,
               {"'a'", "non-negative"});
}

TEST_F(SafeTensorsTest, NegativeDimension) {
  expect_error(raw_status(R"({"a":{"dtype":"F32","shape":[2,-1],"data_offsets":[0,4]}})", 4), ErrorCode::kCorrupt,
               {"'a'", "negative dimension"});
}

TEST_F(SafeTensorsTest, HugeShapeOverflows) {
  expect_error(raw_status(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4),
               ErrorCode::kCorrupt, {"'a'", "overflows"});
}

TEST_F(SafeTensorsTest, OffsetsPastDataSection) {
  expect_error(raw_status(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12), ErrorCode::kCorrupt,
               {"'a'", "past the end of the data section", "12 bytes"});
}

TEST_F(SafeTensorsTest, OffsetsEndBeforeBegin) {
  expect_error(raw_status(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8), ErrorCode::kCorrupt,
               {"'a'", "end 4 is before begin 8"});
}

TEST_F(SafeTensorsTest, ByteSizeDiffersFromShape) {
  expect_error(raw_status(R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", 8), ErrorCode::kCorrupt,
               {"'a'", "holds 8 bytes", "needs 3 x 2"});
}

TEST_F(SafeTensorsTest, OverlappingTensors) {
  expect_error(raw_status(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          12),
               ErrorCode::kCorrupt, {"'a'", "'b'", "overlap"});
}

TEST_F(SafeTensorsTest, UnsupportedDtype) {
  expect_error(raw_status(R"({"w":{"dtype":"F8_E5M2","shape":[4],"data_offsets":[0,4]}})", 4), ErrorCode::kUnsupported,
               {"'w'", "F8_E5M2", "BF16", "F8_E4M3"});
  expect_error(raw_status(R"({"d":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8), ErrorCode::kUnsupported,
               {"'d'", "F64"});
}

TEST_F(SafeTensorsTest, MalformedMetadata) {
  expect_error(raw_status(R"({"__metadata__": [1]})", 0), ErrorCode::kCorrupt, {"__metadata__", "not a JSON object"});
  expect_error(raw_status(R"({"__metadata__": {"format": 3}})", 0), ErrorCode::kCorrupt, {"format", "not a string"});
}

TEST_F(SafeTensorsTest, TruncatedFilesNeverCrash) {
  ASSERT_TRUE(write_safetensors(path("full.safetensors"), {{"a", Tensor::from_vector({3}, {1, 2, 3})},
                                                           {"b", Tensor::from_vector({2, 2}, {4, 5, 6, 7})}})
                  .is_ok());
  const std::string full = read_bytes(path("full.safetensors"));
  for (size_t n = 0; n < full.size(); ++n) {
    write_bytes(path("cut.safetensors"), full.substr(0, n));
    auto st = SafeTensors::open_file(path("cut.safetensors"));
    ASSERT_FALSE(st.ok()) << "a file cut to " << n << " of " << full.size() << " bytes was accepted";
    EXPECT_EQ(st.status().code(), ErrorCode::kCorrupt) << st.status().to_string();
  }
}

TEST_F(SafeTensorsTest, CorruptedHeaderBytesNeverCrash) {
  ASSERT_TRUE(write_safetensors(path("full.safetensors"), {{"a", Tensor::from_vector({3}, {1, 2, 3})},
                                                           {"b", Tensor::from_vector({2, 2}, {4, 5, 6, 7})}})
                  .is_ok());
  const std::string full = read_bytes(path("full.safetensors"));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(full[i]);
  std::mt19937 rng(42);
  int rejected = 0;
  for (int trial = 0; trial < 300; ++trial) {
    std::string bytes = full;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) bytes[rng() % (8 + header_len)] = static_cast<char>(rng());
    write_bytes(path("bad.safetensors"), bytes);
    auto st = SafeTensors::open_file(path("bad.safetensors"));
    if (!st.ok()) {
      ++rejected;
      EXPECT_FALSE(st.status().message().empty());
    } else {
      // Whatever was accepted must be readable in full.
      for (const std::string& name : st->names()) EXPECT_EQ(st->get(name)->to_f32().numel(), st->get(name)->numel());
    }
  }
  EXPECT_GT(rejected, 0);
}

// ---- sharded checkpoints ----

class ShardedTest : public SafeTensorsTest {
 protected:
  void SetUp() override {
    SafeTensorsTest::SetUp();
    ASSERT_TRUE(write_safetensors(path("s1.safetensors"), {{"a", Tensor::from_vector({2}, {1, 2})}}).is_ok());
    ASSERT_TRUE(write_safetensors(path("s2.safetensors"), {{"b", Tensor::from_vector({2}, {3, 4})}}).is_ok());
  }
  Status open_with_index(const std::string& index_text) {
    write_bytes(path("model.safetensors.index.json"), index_text);
    return SafeTensors::open(dir_.string()).status();
  }
};

TEST_F(ShardedTest, ValidIndexLoads) {
  EXPECT_TRUE(open_with_index(R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})").is_ok());
}

TEST_F(ShardedTest, IndexNotJson) {
  expect_error(open_with_index(R"({"weight_map":{"a":)"), ErrorCode::kCorrupt,
               {"model.safetensors.index.json", "not valid JSON"});
}

TEST_F(ShardedTest, IndexWithoutWeightMap) {
  expect_error(open_with_index(R"({"metadata":{}})"), ErrorCode::kCorrupt, {"index.json", "\"weight_map\""});
  expect_error(open_with_index(R"({"weight_map":[1]})"), ErrorCode::kCorrupt, {"\"weight_map\""});
  expect_error(open_with_index(R"({"weight_map":{}})"), ErrorCode::kCorrupt, {"no tensors"});
}

TEST_F(ShardedTest, IndexEntryNotAFileName) {
  expect_error(open_with_index(R"({"weight_map":{"a":1}})"), ErrorCode::kCorrupt, {"'a'", "not a file name"});
}

TEST_F(ShardedTest, IndexShardOutsideDirectory) {
  expect_error(open_with_index(R"({"weight_map":{"a":"../s1.safetensors"}})"), ErrorCode::kCorrupt,
               {"'a'", "../s1.safetensors", "inside the checkpoint directory"});
  expect_error(open_with_index(R"({"weight_map":{"a":"/etc/passwd"}})"), ErrorCode::kCorrupt, {"/etc/passwd"});
}

TEST_F(ShardedTest, IndexNamesMissingShard) {
  expect_error(open_with_index(R"({"weight_map":{"a":"s1.safetensors","b":"s9.safetensors"}})"), ErrorCode::kNotFound,
               {"s9.safetensors", "index.json"});
}

TEST_F(ShardedTest, IndexNamesTensorTheShardLacks) {
  expect_error(open_with_index(R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors","c":"s2.safetensors"}})"),
               ErrorCode::kCorrupt, {"'c'", "s2.safetensors", "does not contain it"});
}

TEST_F(ShardedTest, IndexMapsTensorToOtherShard) {
  expect_error(open_with_index(R"({"weight_map":{"a":"s2.safetensors","b":"s1.safetensors"}})"), ErrorCode::kCorrupt,
               {"'a'", "maps it to s2.safetensors"});
}

TEST_F(ShardedTest, DuplicateTensorAcrossShards) {
  ASSERT_TRUE(write_safetensors(path("s3.safetensors"), {{"a", Tensor::from_vector({2}, {9, 9})}}).is_ok());
  expect_error(open_with_index(R"({"weight_map":{"a":"s1.safetensors","b":"s3.safetensors"}})"), ErrorCode::kCorrupt,
               {"duplicate tensor 'a'", "s1.safetensors", "s3.safetensors"});
}

TEST_F(ShardedTest, CorruptShardNamesTheShard) {
  write_bytes(path("s2.safetensors"), "xx");
  expect_error(open_with_index(R"({"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})"), ErrorCode::kCorrupt,
               {"s2.safetensors", "8-byte"});
}

// ---- writer ----

TEST_F(SafeTensorsTest, WriterRejectsBadInput) {
  Tensor t = Tensor::from_vector({1}, {1});
  expect_error(write_safetensors(path("w.safetensors"), {{"x", t}, {"x", t}}), ErrorCode::kInvalidArgument, {"'x'", "twice"});
  expect_error(write_safetensors(path("w.safetensors"), {{"__metadata__", t}}), ErrorCode::kInvalidArgument,
               {"__metadata__"});
  expect_error(write_safetensors(path("no/such/dir/w.safetensors"), {{"x", t}}), ErrorCode::kNotFound, {"no/such/dir"});
  EXPECT_FALSE(std::filesystem::exists(path("w.safetensors")));
}

}  // namespace
}  // namespace zest::io
