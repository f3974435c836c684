#include "io/image.h"

#include <algorithm>
#include <cctype>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>

// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <png.h>

#if __has_include(<webp/decode.h>)
#include <webp/decode.h>
#define ZEST_HAVE_WEBP 1
#else
#define ZEST_HAVE_WEBP 0
#endif

namespace zest::io {

const char* image_format_name(ImageFormat f) {
  switch (f) {
    case ImageFormat::kJpeg: return "JPEG";
    case ImageFormat::kPng: return "PNG";
    case ImageFormat::kWebp: return "WebP";
    case ImageFormat::kUnknown: break;
  }
  return "unknown";
}

ImageFormat sniff_image_format(const uint8_t* d, size_t n) {
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return ImageFormat::kJpeg;
  static const uint8_t kPngSig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (n >= 8 && std::memcmp(d, kPngSig, 8) == 0) return ImageFormat::kPng;
  if (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0) return ImageFormat::kWebp;
  return ImageFormat::kUnknown;
}

namespace {

// Validates the header dimensions against the limits before pixels are allocated or decoded.
Status check_dimensions(int64_t w, int64_t h, const ImageLimits& lim, const char* fmt) {
  if (w <= 0 || h <= 0) {
    return invalid_argument(std::string(fmt) + " image has a zero size (" + std::to_string(w) + "x" +
                            std::to_string(h) + ")");
  }
  if (w * h > lim.max_pixels) {
    return out_of_range(std::string(fmt) + " image is " + std::to_string(w) + "x" + std::to_string(h) + " = " +
                        std::to_string(w * h) + " pixels, above the limit of " + std::to_string(lim.max_pixels) +
                        " pixels; send a smaller image");
  }
  const double aspect = static_cast<double>(std::max(w, h)) / static_cast<double>(std::min(w, h));
  if (aspect > lim.max_aspect_ratio) {
    return invalid_argument(std::string(fmt) + " image is " + std::to_string(w) + "x" + std::to_string(h) +
                            ": aspect ratio " + std::to_string(aspect) + " is above the limit of " +
                            std::to_string(lim.max_aspect_ratio));
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------- JPEG

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings are tolerated (as PIL does for corrupt-but-decodable data) except a premature end of
// data, which PIL and torchvision report as a truncated file.
void jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_fail(cinfo);
}

void jpeg_silent(j_common_ptr) {}

// Compresses rows of RGB into a JPEG in memory; errors come back through the same longjmp handler.
Status encode_jpeg_rows(const Image& img, int quality, std::vector<uint8_t>& out) {
  jpeg_compress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.mgr.output_message = jpeg_silent;
  err.message[0] = '\0';
  unsigned char* buf = nullptr;
  unsigned long len = 0;
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&cinfo);
    std::free(buf);
    return internal_error(std::string("JPEG encoding failed: ") + err.message);
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &buf, &len);
  cinfo.image_width = static_cast<JDIMENSION>(img.width);
  cinfo.image_height = static_cast<JDIMENSION>(img.height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(img.rgb.data()) + static_cast<size_t>(cinfo.next_scanline) * img.width * 3;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  out.assign(buf, buf + len);
  jpeg_destroy_compress(&cinfo);
  std::free(buf);
  return Status::ok();
}

Status decode_jpeg(const uint8_t* data, size_t size, const ImageLimits& lim, Image& img) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  std::vector<uint8_t> cmyk;
  Status limit_status;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.mgr.emit_message = jpeg_message;
  err.mgr.output_message = jpeg_silent;
  err.message[0] = '\0';
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return corrupt(std::string("JPEG data is corrupt or truncated: ") + err.message);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  limit_status = check_dimensions(cinfo.image_width, cinfo.image_height, lim, "JPEG");
  if (!limit_status.is_ok()) {
    jpeg_destroy_decompress(&cinfo);
    return limit_status;
  }
  const bool is_cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = is_cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  img.width = cinfo.output_width;
  img.height = cinfo.output_height;
  img.rgb.resize(static_cast<size_t>(img.width) * img.height * 3);
  if (is_cmyk) cmyk.resize(static_cast<size_t>(img.width) * 4);
  while (cinfo.output_scanline < cinfo.output_height) {
    const size_t y = cinfo.output_scanline;
    uint8_t* dst = img.rgb.data() + y * img.width * 3;
    JSAMPROW row = is_cmyk ? cmyk.data() : dst;
    jpeg_read_scanlines(&cinfo, &row, 1);
    if (is_cmyk) {
      // PIL's CMYK -> RGB: out = (255-K) - (C*(255-K) rounded /255); Adobe files store inverted inks.
      const bool inverted = cinfo.saw_Adobe_marker;
      for (int64_t x = 0; x < img.width; ++x) {
        const int k = inverted ? 255 - cmyk[x * 4 + 3] : cmyk[x * 4 + 3];
        const int nk = 255 - k;
        for (int c = 0; c < 3; ++c) {
          const int ink = inverted ? 255 - cmyk[x * 4 + c] : cmyk[x * 4 + c];
          const int t = ink * nk + 128;
          dst[x * 3 + c] = static_cast<uint8_t>(std::clamp(nk - (((t >> 8) + t) >> 8), 0, 255));
        }
      }
    }
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return Status::ok();
}

// ---------------------------------------------------------------------------------------- PNG

struct PngReader {
  const uint8_t* data;
  size_t size;
  size_t pos;
  char message[256];
};

void png_read_mem(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngReader*>(png_get_io_ptr(png));
  if (n > r->size - r->pos) png_error(png, "unexpected end of data (truncated file)");
  std::memcpy(out, r->data + r->pos, n);
  r->pos += n;
}

void png_fail(png_structp png, png_const_charp msg) {
  auto* r = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof(r->message), "%s", msg);
  png_longjmp(png, 1);
}

void png_warn(png_structp, png_const_charp) {}

Status decode_png(const uint8_t* data, size_t size, const ImageLimits& lim, Image& img) {
  PngReader reader{data, size, 0, {0}};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader, png_fail, png_warn);
  if (png == nullptr) return resource_exhausted("cannot allocate a PNG decoder");
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return resource_exhausted("cannot allocate a PNG decoder");
  }
  std::vector<uint8_t> raw;
  std::vector<png_bytep> rows;
  Status limit_status;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return corrupt(std::string("PNG data is corrupt or truncated: ") + reader.message);
  }
  png_set_read_fn(png, &reader, png_read_mem);
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
  png_read_info(png, info);
  const int64_t w = png_get_image_width(png, info);
  const int64_t h = png_get_image_height(png, info);
  limit_status = check_dimensions(w, h, lim, "PNG");
  if (!limit_status.is_ok()) {
    png_destroy_read_struct(&png, &info, nullptr);
    return limit_status;
  }
  const int color = png_get_color_type(png, info);
  const int depth = png_get_bit_depth(png, info);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (depth == 16) png_set_strip_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const int channels = png_get_channels(png, info);
  const size_t rowbytes = png_get_rowbytes(png, info);
  if (channels < 1 || channels > 4 || rowbytes != static_cast<size_t>(w) * channels) {
    png_error(png, "unexpected pixel layout after expansion");
  }
  raw.resize(rowbytes * h);
  rows.resize(h);
  for (int64_t y = 0; y < h; ++y) rows[y] = raw.data() + y * rowbytes;
  png_read_image(png, rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);

  img.width = w;
  img.height = h;
  img.rgb.resize(static_cast<size_t>(w) * h * 3);
  const size_t n = static_cast<size_t>(w) * h;
  uint8_t* out = img.rgb.data();
  const uint8_t* in = raw.data();
  if (channels == 3) {
    std::memcpy(out, in, n * 3);
  } else {
    // Gray (+alpha) is replicated; alpha is dropped without compositing, like PIL's convert("RGB").
    const bool gray = channels <= 2;
    for (size_t i = 0; i < n; ++i) {
      const uint8_t* p = in + i * channels;
      out[i * 3 + 0] = p[0];
      out[i * 3 + 1] = gray ? p[0] : p[1];
      out[i * 3 + 2] = gray ? p[0] : p[2];
    }
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------- WebP

Status decode_webp(const uint8_t* data, size_t size, const ImageLimits& lim, Image& img) {
#if ZEST_HAVE_WEBP
  WebPBitstreamFeatures features;
  if (WebPGetFeatures(data, size, &features) != VP8_STATUS_OK) {
    return corrupt("WebP header is corrupt or truncated");
  }
  ZEST_RETURN_IF_ERROR(check_dimensions(features.width, features.height, lim, "WebP"));
  if (features.has_animation) return unsupported("animated WebP images are not supported; send a still image");
  img.width = features.width;
  img.height = features.height;
  img.rgb.resize(static_cast<size_t>(img.width) * img.height * 3);
  if (WebPDecodeRGBInto(data, size, img.rgb.data(), img.rgb.size(), static_cast<int>(img.width * 3)) == nullptr) {
    return corrupt("WebP data is corrupt or truncated");
  }
  return Status::ok();
#else
  (void)img;
  (void)data;
  (void)size;
  (void)lim;
  return unsupported("this zest build has no WebP decoder (libwebp not found at build time); send JPEG or PNG");
#endif
}

int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;
  if (c == '/' || c == '_') return 63;
  return -1;
}

std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::string shorten(const std::string& s) { return s.size() <= 80 ? s : s.substr(0, 77) + "..."; }

}  // namespace

namespace {

Result<std::pair<int64_t, int64_t>> jpeg_dimensions(const uint8_t* data, size_t size) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.mgr.emit_message = jpeg_message;
  err.mgr.output_message = jpeg_silent;
  err.message[0] = '\0';
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return corrupt(std::string("JPEG data is corrupt or truncated: ") + err.message);
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  const std::pair<int64_t, int64_t> wh{cinfo.image_width, cinfo.image_height};
  jpeg_destroy_decompress(&cinfo);
  return wh;
}

// A PNG starts with its signature and the IHDR chunk: length 13, "IHDR", width and height (big-endian).
Result<std::pair<int64_t, int64_t>> png_dimensions(const uint8_t* d, size_t size) {
  if (size < 24 || std::memcmp(d + 12, "IHDR", 4) != 0) return corrupt("PNG data is corrupt or truncated: no IHDR chunk");
  auto be32 = [](const uint8_t* p) {
    return (int64_t{p[0]} << 24) | (int64_t{p[1]} << 16) | (int64_t{p[2]} << 8) | int64_t{p[3]};
  };
  return std::pair<int64_t, int64_t>{be32(d + 16), be32(d + 20)};
}

}  // namespace

Result<ImageInfo> probe_image(const uint8_t* data, size_t size, const ImageLimits& limits) {
  if (data == nullptr || size == 0) return invalid_argument("image data is empty");
  ImageInfo info;
  info.format = sniff_image_format(data, size);
  std::pair<int64_t, int64_t> wh;
  switch (info.format) {
    case ImageFormat::kJpeg: {
      ZEST_ASSIGN_OR_RETURN(wh, jpeg_dimensions(data, size));
      break;
    }
    case ImageFormat::kPng: {
      ZEST_ASSIGN_OR_RETURN(wh, png_dimensions(data, size));
      break;
    }
    case ImageFormat::kWebp: {
#if ZEST_HAVE_WEBP
      WebPBitstreamFeatures features;
      if (WebPGetFeatures(data, size, &features) != VP8_STATUS_OK) return corrupt("WebP header is corrupt or truncated");
      wh = {features.width, features.height};
      break;
#else
      return unsupported("this zest build has no WebP decoder (libwebp not found at build time); send JPEG or PNG");
#endif
    }
    case ImageFormat::kUnknown:
      return invalid_argument("data is not a JPEG, PNG or WebP image (unrecognised signature)");
  }
  info.width = wh.first;
  info.height = wh.second;
  ZEST_RETURN_IF_ERROR(check_dimensions(info.width, info.height, limits, image_format_name(info.format)));
  return info;
}

Status decode_image_into(const uint8_t* data, size_t size, Image& out, const ImageLimits& limits) {
  if (data == nullptr || size == 0) return invalid_argument("image data is empty");
  Status st;
  switch (sniff_image_format(data, size)) {
    case ImageFormat::kJpeg: st = decode_jpeg(data, size, limits, out); break;
    case ImageFormat::kPng: st = decode_png(data, size, limits, out); break;
    case ImageFormat::kWebp: st = decode_webp(data, size, limits, out); break;
    case ImageFormat::kUnknown:
      return invalid_argument("data is not a JPEG, PNG or WebP image (unrecognised signature)");
  }
  if (!st.is_ok()) {
    out.width = out.height = 0;
    out.rgb.clear();
  }
  return st;
}

Result<Image> decode_image(const uint8_t* data, size_t size, const ImageLimits& limits) {
  Image img;
  ZEST_RETURN_IF_ERROR(decode_image_into(data, size, img, limits));
  return img;
}

namespace {

void png_write_mem(png_structp png, png_bytep data, png_size_t n) {
  auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}

void png_flush_mem(png_structp) {}

}  // namespace

Result<std::vector<uint8_t>> encode_png(const Image& img) {
  if (img.width <= 0 || img.height <= 0 || img.width > 0x7fffffff || img.height > 0x7fffffff)
    return invalid_argument("encode_png: image size " + std::to_string(img.width) + "x" + std::to_string(img.height) +
                            " is not positive");
  if (img.rgb.size() != static_cast<size_t>(img.width * img.height * 3))
    return invalid_argument("encode_png: rgb holds " + std::to_string(img.rgb.size()) + " bytes, expected " +
                            std::to_string(img.width * img.height * 3));
  PngReader err{nullptr, 0, 0, {}};  // only its message buffer is used
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &err, png_fail, png_warn);
  if (png == nullptr) return resource_exhausted("cannot allocate a PNG encoder");
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_write_struct(&png, nullptr);
    return resource_exhausted("cannot allocate a PNG encoder");
  }
  std::vector<uint8_t> out;
  std::vector<png_bytep> rows(static_cast<size_t>(img.height));
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return internal_error(std::string("PNG encoding failed: ") + err.message);
  }
  png_set_write_fn(png, &out, png_write_mem, png_flush_mem);
  png_set_IHDR(png, info, static_cast<png_uint_32>(img.width), static_cast<png_uint_32>(img.height), 8,
               PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  for (int64_t y = 0; y < img.height; ++y)
    rows[y] = const_cast<png_bytep>(img.rgb.data() + static_cast<size_t>(y * img.width * 3));
  png_set_rows(png, info, rows.data());
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

Result<std::vector<uint8_t>> encode_jpeg(const Image& img, int quality) {
  if (img.width <= 0 || img.height <= 0 || img.width > 65500 || img.height > 65500)
    return invalid_argument("encode_jpeg: image size " + std::to_string(img.width) + "x" +
                            std::to_string(img.height) + " is outside 1..65500");
  if (img.rgb.size() != static_cast<size_t>(img.width * img.height * 3))
    return invalid_argument("encode_jpeg: rgb holds " + std::to_string(img.rgb.size()) + " bytes, expected " +
                            std::to_string(img.width * img.height * 3));
  if (quality < 1 || quality > 100) return invalid_argument("encode_jpeg: quality must be in 1..100");
  std::vector<uint8_t> out;
  ZEST_RETURN_IF_ERROR(encode_jpeg_rows(img, quality, out));
  return out;
}

Result<std::vector<uint8_t>> base64_decode(std::string_view text) {
  std::vector<uint8_t> out;
  out.reserve(text.size() / 4 * 3 + 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t symbols = 0;
  bool padding = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      padding = true;
      continue;
    }
    const int v = base64_value(c);
    if (v < 0 || padding) {
      return invalid_argument("invalid base64: unexpected character at offset " + std::to_string(i));
    }
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    ++symbols;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>(acc >> bits));
      acc &= (1u << bits) - 1;
    }
  }
  if (symbols % 4 == 1) return invalid_argument("invalid base64: the data ends in the middle of a byte");
  return out;
}

Result<std::vector<uint8_t>> read_image_source(const std::string& source, size_t max_bytes) {
  if (source.empty()) return invalid_argument("image source is empty");
  if (source.rfind("data:", 0) == 0) {
    const size_t comma = source.find(',');
    if (comma == std::string::npos) return invalid_argument("data URL has no ',' separating header and data");
    const std::string header = source.substr(5, comma - 5);
    if (header.size() < 7 || header.compare(header.size() - 7, 7, ";base64") != 0) {
      return invalid_argument("data URL must be base64-encoded (data:image/<type>;base64,...), got header '" +
                              shorten(header) + "'");
    }
    ZEST_ASSIGN_OR_RETURN(auto bytes, base64_decode(std::string_view(source).substr(comma + 1)));
    if (bytes.empty()) return invalid_argument("data URL carries no data");
    return bytes;
  }
  if (source.rfind("http://", 0) == 0 || source.rfind("https://", 0) == 0) {
    return unsupported("remote image URLs are not fetched by zest; send the image as a data: URL (base64)");
  }
  std::string path = source;
  if (source.rfind("file://", 0) == 0) {
    path = percent_decode(std::string_view(source).substr(7));
    if (path.rfind("localhost/", 0) == 0) path = path.substr(9);
  }
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) return not_found("image file '" + shorten(path) + "' does not exist or cannot be read");
  const std::streamoff len = f.tellg();
  if (len < 0) return not_found("image file '" + shorten(path) + "' cannot be read");
  if (static_cast<uint64_t>(len) > max_bytes) {
    return out_of_range("image file '" + shorten(path) + "' is " + std::to_string(len) + " bytes, above the limit of " +
                        std::to_string(max_bytes));
  }
  std::vector<uint8_t> bytes(static_cast<size_t>(len));
  f.seekg(0);
  if (len > 0 && !f.read(reinterpret_cast<char*>(bytes.data()), len)) {
    return not_found("image file '" + shorten(path) + "' could not be read completely");
  }
  return bytes;
}

Result<Image> load_image(const std::string& source, const ImageLimits& limits) {
  ZEST_ASSIGN_OR_RETURN(auto bytes, read_image_source(source));
  auto img = decode_image(bytes, limits);
  if (!img.ok()) return img.status().with_context("image '" + shorten(source) + "'");
  return img;
}

}  // namespace zest::io
