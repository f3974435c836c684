#include "io/npy.h"

#include <gtest/gtest.h>

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
using testing::write_bytes;

class NpyTest : public testing::TempDirTest {
 protected:
  // An .npy file: magic, version, little-endian header length, header text, data.
  static std::string npy_bytes(const std::string& header, const std::string& data, int major = 1) {
    std::string out = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
    const size_t n = header.size();
    const int len_bytes = major == 1 ? 2 : 4;
    for (int i = 0; i < len_bytes; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
    return out + header + data;
  }
  Status read_status(const std::string& bytes) {
    write_bytes(path("x.npy"), bytes);
    return read_npy(path("x.npy")).status();
  }
  static std::string f32_data(size_t n) { return std::string(4 * n, '\x01'); }
};

TEST_F(NpyTest, ReadsFilesWrittenByNumpy) {
  std::ifstream in(data_dir() + "/npy_expected.json");
  const json exp = json::parse(in);
  ASSERT_EQ(exp.size(), 7u);
  for (const auto& [name, e] : exp.items()) {
    SCOPED_TRACE(name);
    auto t = read_npy(data_dir() + "/" + name);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    EXPECT_EQ(t->shape(), e["shape"].get<std::vector<int64_t>>());
    const std::string descr = e["descr"];
    const json& vals = e["values"];
    ASSERT_EQ(t->numel(), static_cast<int64_t>(vals.size()));
    if (descr == "<f4" || descr == "<f2") {
      ASSERT_EQ(t->dtype(), DType::F32);
      // numpy's f2 -> f4 widening is exact, so the tolerance is 0.
      for (size_t i = 0; i < vals.size(); ++i) EXPECT_EQ(t->data<float>()[i], vals[i].get<float>()) << i;
    } else if (descr == "<i4") {
      ASSERT_EQ(t->dtype(), DType::I32);
      for (size_t i = 0; i < vals.size(); ++i) EXPECT_EQ(t->data<int32_t>()[i], vals[i].get<int32_t>()) << i;
    } else {
      ASSERT_EQ(t->dtype(), DType::I64);
      for (size_t i = 0; i < vals.size(); ++i) EXPECT_EQ(t->data<int64_t>()[i], vals[i].get<int64_t>()) << i;
    }
  }
}

TEST_F(NpyTest, WritesTheSameBytesAsNumpy) {
  for (const char* name : {"npy_f4.npy", "npy_i4.npy", "npy_i8.npy", "npy_scalar_f4.npy", "npy_empty_f4.npy"}) {
    SCOPED_TRACE(name);
    auto t = read_npy(data_dir() + "/" + name);
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    ASSERT_TRUE(write_npy(path("out.npy"), *t).is_ok());
    EXPECT_EQ(read_bytes(path("out.npy")), read_bytes(data_dir() + "/" + name));
  }
}

TEST_F(NpyTest, RoundTripsRandomArrays) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<int64_t> shape;
    const int nd = static_cast<int>(rng() % 4);
    for (int d = 0; d < nd; ++d) shape.push_back(1 + static_cast<int64_t>(rng() % 5));
    const DType dt = std::vector<DType>{DType::F32, DType::I32, DType::I64}[trial % 3];
    Tensor t = Tensor::empty(shape, dt);
    auto* bytes = static_cast<uint8_t*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<uint8_t>(rng());
    if (dt == DType::F32) {
      const std::vector<float> v = testing::random_floats(static_cast<size_t>(t.numel()), 1000 + trial);
      std::memcpy(t.raw(), v.data(), t.nbytes());
    }
    ASSERT_TRUE(write_npy(path("r.npy"), t).is_ok());
    auto back = read_npy(path("r.npy"));
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(back->dtype(), dt);
    EXPECT_EQ(back->shape(), shape);
    EXPECT_EQ(std::memcmp(back->raw(), t.raw(), t.nbytes()), 0);
    const std::string file = read_bytes(path("r.npy"));
    EXPECT_EQ((file.size() - t.nbytes()) % 64, 0u) << "numpy aligns the data to 64 bytes";
    EXPECT_EQ(file[file.size() - t.nbytes() - 1], '\n');
  }
}

TEST_F(NpyTest, WriteRejectsOtherDtypes) {
  expect_error(write_npy(path("b.npy"), Tensor::zeros({2}, DType::BF16)), ErrorCode::kInvalidArgument, {"BF16"});
  expect_error(write_npy(path("u.npy"), Tensor::zeros({2}, DType::U8)), ErrorCode::kInvalidArgument, {"U8"});
}

TEST_F(NpyTest, WriteToMissingDirectory) {
  expect_error(write_npy(path("no/dir/x.npy"), Tensor::zeros({2})), ErrorCode::kNotFound, {"no/dir/x.npy"});
}

// ---- malformed files ----

TEST_F(NpyTest, MissingFile) {
  expect_error(read_npy(path("none.npy")).status(), ErrorCode::kNotFound, {"none.npy"});
}

TEST_F(NpyTest, NoMagic) {
  expect_error(read_status("PK\x03\x04 this is a zip"), ErrorCode::kCorrupt, {"magic"});
  expect_error(read_status("\x93NUM"), ErrorCode::kCorrupt, {"magic"});
}

TEST_F(NpyTest, UnknownVersion) {
  expect_error(read_status(npy_bytes("{}", "", 3)), ErrorCode::kCorrupt, {"version 3.0"});
}

TEST_F(NpyTest, HeaderLengthPastEnd) {
  std::string b = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", f32_data(1));
  b[8] = '\xff';
  b[9] = '\x7f';
  expect_error(read_status(b), ErrorCode::kCorrupt, {"header length 32767", "past the end"});
}

TEST_F(NpyTest, HeaderNotADict) {
  expect_error(read_status(npy_bytes("descr=<f4", "")), ErrorCode::kCorrupt, {"malformed .npy header", "'{'"});
  expect_error(read_status(npy_bytes("{'descr': '<f4', 'shape': (1,", "")), ErrorCode::kCorrupt,
               {"malformed .npy header"});
  expect_error(read_status(npy_bytes("{'descr' '<f4'}", "")), ErrorCode::kCorrupt, {"expected ':'"});
}

TEST_F(NpyTest, MissingKey) {
  expect_error(read_status(npy_bytes("{'descr': '<f4', 'fortran_order': False, }", "")), ErrorCode::kCorrupt,
               {"no 'shape' key"});
}

TEST_F(NpyTest, ExtraKey) {
  expect_error(read_status(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 'y'}", f32_data(1))),
               ErrorCode::kCorrupt, {"keys other than"});
}

TEST_F(NpyTest, DuplicateKey) {
  expect_error(read_status(npy_bytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}", "")),
               ErrorCode::kCorrupt, {"'descr' appears twice"});
}

TEST_F(NpyTest, WrongValueTypes) {
  expect_error(read_status(npy_bytes("{'descr': (4,), 'fortran_order': False, 'shape': ()}", "")), ErrorCode::kCorrupt,
               {"'descr' is not a string"});
  expect_error(read_status(npy_bytes("{'descr': '<f4', 'fortran_order': 'no', 'shape': ()}", "")), ErrorCode::kCorrupt,
               {"'fortran_order'"});
  expect_error(read_status(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': '3'}", "")), ErrorCode::kCorrupt,
               {"'shape' is not a tuple"});
}

TEST_F(NpyTest, NegativeDimension) {
  expect_error(read_status(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}", "")),
               ErrorCode::kCorrupt, {"non-negative integer"});
}

TEST_F(NpyTest, HugeShape) {
  expect_error(read_status(npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", "")),
               ErrorCode::kCorrupt, {"overflows"});
}

TEST_F(NpyTest, FortranOrderUnsupported) {
  expect_error(read_status(npy_bytes("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", f32_data(4))),
               ErrorCode::kUnsupported, {"Fortran"});
}

TEST_F(NpyTest, OtherDtypesUnsupported) {
  expect_error(read_status(npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", std::string(8, 'a'))),
               ErrorCode::kUnsupported, {"'<f8'", "<f4"});
  expect_error(read_status(npy_bytes("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", f32_data(1))),
               ErrorCode::kUnsupported, {"'>f4'"});
}

TEST_F(NpyTest, TruncatedData) {
  expect_error(read_status(npy_bytes("{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }", std::string(40, 'a'))),
               ErrorCode::kCorrupt, {"holds 40 bytes", "needs 48", "truncated"});
}

TEST_F(NpyTest, TrailingData) {
  expect_error(read_status(npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", std::string(12, 'a'))),
               ErrorCode::kCorrupt, {"holds 12 bytes", "needs 8"});
}

TEST_F(NpyTest, Version2HeaderParses) {
  auto t = read_status(npy_bytes("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", std::string(8, 'a'), 2));
  EXPECT_TRUE(t.is_ok()) << t.to_string();
}

TEST_F(NpyTest, TruncatedFilesNeverCrash) {
  const std::string full = read_bytes(data_dir() + "/npy_f4_v2.npy");
  for (size_t n = 0; n < full.size(); ++n) {
    const Status s = read_status(full.substr(0, n));
    ASSERT_FALSE(s.is_ok()) << "a file cut to " << n << " bytes was accepted";
    EXPECT_EQ(s.code(), ErrorCode::kCorrupt) << s.to_string();
  }
}

}  // namespace
}  // namespace zest::io
