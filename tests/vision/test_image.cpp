// Image decoding vs torchvision.io.decode_image(mode=RGB) (recorded by tools/make_vision_refs.py),
// and every malformed-input case giving a clear error without crashing.
#include <gtest/gtest.h>
#include <zlib.h>

#include <random>

#include "io/image.h"
#include "vision_test_util.h"

namespace zest {
namespace {

using vision_test::data_path;
using vision_test::read_bytes;
using vision_test::source_path;

// The checksum of make_vision_refs.py: two position-weighted byte sums mod 2^64.
std::pair<uint64_t, uint64_t> checksum(const std::vector<uint8_t>& b) {
  uint64_t s1 = 0, s2 = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    s1 += static_cast<uint64_t>(b[i]) * (i % 65521 + 1);
    s2 += static_cast<uint64_t>(b[i]) * b[i] * (i % 251 + 1);
  }
  return {s1, s2};
}

TEST(Image, DecodesEveryReferenceImageExactly) {
  const auto ref = vision_test::read_json(data_path("decode.json"));
  int checked = 0;
  for (const auto& [rel, e] : ref["images"].items()) {
    SCOPED_TRACE(rel);
    auto img = io::load_image(source_path(rel));
    ASSERT_TRUE(img.ok()) << img.status().to_string();
    EXPECT_EQ(img->width, e["width"].get<int64_t>());
    EXPECT_EQ(img->height, e["height"].get<int64_t>());
    const auto [s1, s2] = checksum(img->rgb);
    EXPECT_EQ(std::to_string(s1), e["checksum"][0].get<std::string>());
    EXPECT_EQ(std::to_string(s2), e["checksum"][1].get<std::string>());
    if (e.contains("rgb")) {
      const auto want = e["rgb"].get<std::vector<int>>();
      ASSERT_EQ(want.size(), img->rgb.size());
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(img->rgb[i], want[i]) << "byte " << i;
    }
    ++checked;
  }
  EXPECT_GE(checked, 26);
}

TEST(Image, DataUrlAndFileUrlMatchPath) {
  const std::string path = source_path("assets/images/chart_line_pew_pena_nieto.png");
  auto direct = io::load_image(path);
  ASSERT_TRUE(direct.ok());
  auto via_data = io::load_image("data:image/png;base64," + vision_test::base64_encode(read_bytes(path)));
  ASSERT_TRUE(via_data.ok()) << via_data.status().to_string();
  EXPECT_EQ(via_data->rgb, direct->rgb);
  auto via_file = io::load_image("file://" + path);
  ASSERT_TRUE(via_file.ok()) << via_file.status().to_string();
  EXPECT_EQ(via_file->rgb, direct->rgb);
}

TEST(Image, Base64RoundTripsRandomBytes) {
  std::mt19937 rng(5);
  for (size_t n : {0, 1, 2, 3, 4, 5, 100, 1001}) {
    std::vector<uint8_t> data(n);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    std::string text = vision_test::base64_encode(data);
    auto back = io::base64_decode(text);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, data);
    // Line breaks (MIME style) are skipped.
    for (size_t i = 76; i < text.size(); i += 77) text.insert(i, "\n");
    back = io::base64_decode(text);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, data);
  }
}

void expect_error(const Result<io::Image>& r, ErrorCode code) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status().to_string();
  EXPECT_FALSE(r.status().message().empty());
}

TEST(Image, TruncatedJpegIsCorrupt) {
  const auto bytes = read_bytes(source_path("assets/images/photo_lounge.jpg"));
  for (size_t keep : {size_t{4}, size_t{200}, bytes.size() / 2, bytes.size() - 10}) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + keep);
    expect_error(io::decode_image(cut), ErrorCode::kCorrupt);
  }
}

TEST(Image, TruncatedPngIsCorrupt) {
  const auto bytes = read_bytes(source_path("assets/images/chart_line_pew_china.png"));
  for (size_t keep : {size_t{8}, size_t{30}, bytes.size() / 2, bytes.size() - 5}) {
    std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + keep);
    expect_error(io::decode_image(cut), ErrorCode::kCorrupt);
  }
}

TEST(Image, TruncatedWebpIsCorrupt) {
  const auto bytes = read_bytes(data_path("conv_rgb.webp"));
  std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + bytes.size() / 2);
  expect_error(io::decode_image(cut), ErrorCode::kCorrupt);
}

TEST(Image, RandomBytesAndEmptyInputAreRejected) {
  std::mt19937 rng(11);
  std::vector<uint8_t> noise(4096);
  for (auto& b : noise) b = static_cast<uint8_t>(rng());
  noise[0] = 0x00;
  expect_error(io::decode_image(noise), ErrorCode::kInvalidArgument);
  expect_error(io::decode_image(std::vector<uint8_t>{}), ErrorCode::kInvalidArgument);
  // A valid signature followed by noise reaches the decoder, which must fail cleanly.
  noise[0] = 0xFF, noise[1] = 0xD8, noise[2] = 0xFF;
  expect_error(io::decode_image(noise), ErrorCode::kCorrupt);
  const uint8_t sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  std::copy(sig, sig + 8, noise.begin());
  expect_error(io::decode_image(noise), ErrorCode::kCorrupt);
}

// A PNG made of the signature, an IHDR for w x h (8-bit RGB) and the start of an IDAT chunk with no
// data: enough for the header checks, which must fire before any pixel is read.
std::vector<uint8_t> png_header_only(uint32_t w, uint32_t h) {
  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  auto put32 = [&](uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
  };
  put32(13);
  const size_t type_at = out.size();
  for (char c : std::string("IHDR")) out.push_back(static_cast<uint8_t>(c));
  put32(w);
  put32(h);
  for (uint8_t b : {8, 2, 0, 0, 0}) out.push_back(b);
  put32(static_cast<uint32_t>(crc32(0, out.data() + type_at, static_cast<uInt>(out.size() - type_at))));
  put32(1000);
  for (char c : std::string("IDAT")) out.push_back(static_cast<uint8_t>(c));
  return out;
}

TEST(Image, HeaderLimitsAreCheckedBeforeDecoding) {
  expect_error(io::decode_image(png_header_only(20000, 20000)), ErrorCode::kOutOfRange);
  expect_error(io::decode_image(png_header_only(4000, 10)), ErrorCode::kInvalidArgument);  // aspect 400
  expect_error(io::decode_image(png_header_only(0, 10)), ErrorCode::kCorrupt);  // libpng rejects width 0
  io::ImageLimits small;
  small.max_pixels = 1000;
  for (const char* rel : {"assets/images/photo_lounge.jpg", "tests/vision/data/conv_rgb.webp"}) {
    SCOPED_TRACE(rel);
    const auto bytes = read_bytes(source_path(rel));
    ASSERT_TRUE(io::decode_image(bytes).ok());
    if (std::string(rel).find("webp") != std::string::npos) small.max_pixels = 100;
    expect_error(io::decode_image(bytes, small), ErrorCode::kOutOfRange);
  }
}

// Encodes an RGB image as JPEG with libjpeg (used for shapes no bundled image has).
std::vector<uint8_t> encode_jpeg(int w, int h, std::mt19937& rng) {
  io::Image img;
  img.width = w;
  img.height = h;
  img.rgb.resize(static_cast<size_t>(w) * h * 3);
  for (auto& b : img.rgb) b = static_cast<uint8_t>(rng());
  auto jpeg = io::encode_jpeg(img);
  EXPECT_TRUE(jpeg.ok()) << jpeg.status().to_string();
  return jpeg.ok() ? *jpeg : std::vector<uint8_t>{};
}

TEST(Image, JpegAspectRatioAboveLimitIsRejected) {
  std::mt19937 rng(3);
  expect_error(io::decode_image(encode_jpeg(402, 2, rng)), ErrorCode::kInvalidArgument);
  auto ok = io::decode_image(encode_jpeg(400, 2, rng));  // exactly 200 is allowed
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->width, 400);
  EXPECT_EQ(ok->height, 2);
}

TEST(Image, BadSourcesGiveClearErrors) {
  expect_error(io::load_image("data:image/png;base64,@@@@"), ErrorCode::kInvalidArgument);
  expect_error(io::load_image("data:image/png;base64,QUJD"), ErrorCode::kInvalidArgument);  // "ABC": not an image
  expect_error(io::load_image("data:image/png;base64,"), ErrorCode::kInvalidArgument);
  expect_error(io::load_image("data:image/png,rawtext"), ErrorCode::kInvalidArgument);
  expect_error(io::load_image("data:image/png;base64"), ErrorCode::kInvalidArgument);
  expect_error(io::load_image(""), ErrorCode::kInvalidArgument);
  expect_error(io::load_image(source_path("assets/images/no_such_image.png")), ErrorCode::kNotFound);
  expect_error(io::load_image("file:///no/such/dir/x.jpg"), ErrorCode::kNotFound);
  expect_error(io::load_image("https://example.com/x.png"), ErrorCode::kUnsupported);
  auto big = io::read_image_source(source_path("assets/images/photo_lounge.jpg"), 100);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), ErrorCode::kOutOfRange);
}

// encode_jpeg: a smooth image survives a quality-100 round trip within a few levels (JPEG is lossy);
// wrong sizes and qualities are refused.
TEST(Image, EncodeJpegRoundTripAndBadInput) {
  io::Image img;
  img.width = 67;
  img.height = 41;
  img.rgb.resize(static_cast<size_t>(img.width) * img.height * 3);
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x)
      for (int c = 0; c < 3; ++c)
        img.rgb[(static_cast<size_t>(y) * img.width + x) * 3 + c] = static_cast<uint8_t>(20 + x + y + 30 * c);
  auto jpeg = io::encode_jpeg(img, 100);
  ASSERT_TRUE(jpeg.ok()) << jpeg.status().to_string();
  auto back = io::decode_image(*jpeg);
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  ASSERT_EQ(back->width, img.width);
  ASSERT_EQ(back->height, img.height);
  int max_err = 0;
  for (size_t i = 0; i < img.rgb.size(); ++i) max_err = std::max(max_err, std::abs(int(img.rgb[i]) - int(back->rgb[i])));
  EXPECT_LE(max_err, 8);  // chroma subsampling on a smooth ramp
  io::Image bad = img;
  bad.rgb.pop_back();
  EXPECT_FALSE(io::encode_jpeg(bad).ok());
  EXPECT_FALSE(io::encode_jpeg(img, 0).ok());
  EXPECT_FALSE(io::encode_jpeg(io::Image{}).ok());
}

}  // namespace
}  // namespace zest
