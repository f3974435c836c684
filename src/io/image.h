// Image input: JPEG / PNG / WebP decoding from memory to 8-bit RGB, and the image sources an
// OpenAI request can carry (data: URLs with base64, file:// URLs, plain paths).
//
// Conversion to RGB follows what transformers 5.17 does for Qwen3-VL when given a path, URL or
// base64 string (image_utils.load_image_as_tensor -> torchvision.io.decode_image(mode=RGB)):
// grayscale is replicated to three channels, palettes are expanded, alpha is dropped (not
// composited), 16-bit samples keep their high byte, and EXIF orientation is NOT applied.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace zest::io {

// An 8-bit RGB image, row-major, interleaved (HWC): pixel (y, x) channel c is rgb[(y*width+x)*3+c].
struct Image {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> rgb;
};

enum class ImageFormat { kUnknown, kJpeg, kPng, kWebp };
const char* image_format_name(ImageFormat f);

// Limits checked from the header before any pixel is decoded.
struct ImageLimits {
  int64_t max_pixels = 64LL * 1000 * 1000;  // width * height above this -> kOutOfRange
  double max_aspect_ratio = 200.0;           // max(w,h) / min(w,h) above this -> kInvalidArgument
};

// Detects the container format from the first bytes (magic numbers).
ImageFormat sniff_image_format(const uint8_t* data, size_t size);

// Format and size of an encoded image, read from its header alone (no pixel is decoded).
struct ImageInfo {
  ImageFormat format = ImageFormat::kUnknown;
  int64_t width = 0;
  int64_t height = 0;
};

// Reads the header of a JPEG, PNG or WebP held in memory, checking the dimensions against `limits`
// as decode_image would (the same errors), so callers can bound the work of a batch before decoding.
Result<ImageInfo> probe_image(const uint8_t* data, size_t size, const ImageLimits& limits = {});

// Decodes a JPEG, PNG or WebP held in memory. Errors: empty or unknown data -> kInvalidArgument;
// truncated or malformed data -> kCorrupt; zero size / aspect ratio -> kInvalidArgument;
// width*height over limits.max_pixels -> kOutOfRange; WebP without libwebp -> kUnsupported.
Result<Image> decode_image(const uint8_t* data, size_t size, const ImageLimits& limits = {});
// decode_image into an existing Image, reusing its buffer's capacity (no fresh pages when the
// caller keeps one Image per thread). On error `out` is left empty.
Status decode_image_into(const uint8_t* data, size_t size, Image& out, const ImageLimits& limits = {});
inline Result<Image> decode_image(const std::vector<uint8_t>& bytes, const ImageLimits& limits = {}) {
  return decode_image(bytes.data(), bytes.size(), limits);
}

// Encodes an RGB image as a baseline JPEG (libjpeg defaults, `quality` 1..100); for tests, benchmarks
// and debugging output.
Result<std::vector<uint8_t>> encode_jpeg(const Image& img, int quality = 75);

// Encodes an RGB image as an 8-bit PNG (plots, debugging output).
Result<std::vector<uint8_t>> encode_png(const Image& img);

// Standard base64 (RFC 4648, '+' '/'; '-' '_' also accepted; ASCII whitespace skipped; padding
// optional). Any other character or a dangling single symbol -> kInvalidArgument.
Result<std::vector<uint8_t>> base64_decode(std::string_view text);

// The raw bytes behind an image source: "data:image/<type>;base64,<data>", "file://<path>", or a
// plain filesystem path. http(s) URLs -> kUnsupported (zest does not fetch remote content).
// Files larger than max_bytes -> kOutOfRange.
Result<std::vector<uint8_t>> read_image_source(const std::string& source, size_t max_bytes = 256u << 20);

// read_image_source + decode_image.
Result<Image> load_image(const std::string& source, const ImageLimits& limits = {});

}  // namespace zest::io
