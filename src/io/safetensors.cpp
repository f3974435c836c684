#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

namespace zest::io {

namespace fs = std::filesystem;
using nlohmann::json;

// A read-only POSIX mmap of one whole file; unmapped when the last owner goes away.
class MappedFile {
 public:
  static Result<std::shared_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile() {
    if (data_ != nullptr) munmap(data_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return static_cast<const uint8_t*>(data_); }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull * 1000 * 1000;
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";
constexpr const char* kSupportedDTypes = "F32, BF16, F16, I32, I64, U8, F8_E4M3";
constexpr const char* kScaleSuffix = "_scale_inv";

Status file_error(const std::string& what, const std::string& path, int err) {
  std::string msg = what + " " + path + ": " + std::strerror(err);
  if (err == ENOENT) return not_found(msg);
  return internal_error(msg);
}

bool parse_dtype(const std::string& s, DType* out) {
  static const std::pair<const char*, DType> kTable[] = {
      {"F32", DType::F32}, {"BF16", DType::BF16}, {"F16", DType::F16},
      {"I32", DType::I32}, {"I64", DType::I64},   {"U8", DType::U8},  {"F8_E4M3", DType::F8E4M3},
  };
  for (const auto& [name, dt] : kTable) {
    if (s == name) {
      *out = dt;
      return true;
    }
  }
  return false;
}

// Reads a JSON integer >= 0 (rejects floats, booleans and negatives).
bool json_non_negative(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

// Parses one tensor entry of a header into a view whose data pointer is `data + begin`.
Status parse_entry(const std::string& name, const json& e, const uint8_t* data, uint64_t data_size,
                   TensorView* out, uint64_t* begin_out, uint64_t* end_out) {
  const std::string where = "tensor '" + name + "'";
  if (!e.is_object()) return corrupt(where + ": header entry is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!e.contains(key)) return corrupt(where + ": header entry has no \"" + std::string(key) + "\" field");
  }
  const json& jd = e["dtype"];
  if (!jd.is_string()) return corrupt(where + ": \"dtype\" must be a string, got " + jd.dump());
  const std::string dname = jd.get<std::string>();
  if (!parse_dtype(dname, &out->dtype)) {
    return unsupported(where + " has dtype " + dname + ", which zest does not load (supported: " +
                       kSupportedDTypes + ")");
  }
  const json& js = e["shape"];
  if (!js.is_array()) return corrupt(where + ": \"shape\" must be an array of integers, got " + js.dump());
  out->shape.clear();
  uint64_t numel = 1;
  for (const json& d : js) {
    if (!d.is_number_integer()) return corrupt(where + ": shape entry " + d.dump() + " is not an integer");
    if (d.get<int64_t>() < 0) return corrupt(where + ": shape " + js.dump() + " has a negative dimension");
    const uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, dim, &numel)) {
      return corrupt(where + ": shape " + js.dump() + " overflows 64-bit element counts");
    }
    out->shape.push_back(static_cast<int64_t>(dim));
  }
  const json& jo = e["data_offsets"];
  uint64_t begin = 0, end = 0;
  if (!jo.is_array() || jo.size() != 2 || !json_non_negative(jo[0], &begin) || !json_non_negative(jo[1], &end)) {
    return corrupt(where + ": \"data_offsets\" must be [begin, end] with non-negative integers, got " +
                   jo.dump());
  }
  if (end < begin) {
    return corrupt(where + ": data_offsets end " + std::to_string(end) + " is before begin " +
                   std::to_string(begin));
  }
  if (end > data_size) {
    return corrupt(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                   "] run past the end of the data section (" + std::to_string(data_size) +
                   " bytes); the file is truncated or the header is wrong");
  }
  uint64_t want = 0;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(dtype_size(out->dtype)), &want) ||
      want != end - begin) {
    return corrupt(where + ": byte range holds " + std::to_string(end - begin) + " bytes but shape " +
                   js.dump() + " of " + dname + " needs " + std::to_string(numel) + " x " +
                   std::to_string(dtype_size(out->dtype)) + " bytes");
  }
  out->name = name;
  out->data = data + begin;
  out->nbytes = static_cast<size_t>(end - begin);
  *begin_out = begin;
  *end_out = end;
  return Status::ok();
}

// Parses and validates the header of a mapped file, adding its tensors and metadata.
Status parse_file(const MappedFile& f, std::map<std::string, TensorView>* tensors,
                  std::map<std::string, std::string>* metadata) {
  if (f.size() < 8) {
    return corrupt("file is " + std::to_string(f.size()) +
                   " bytes, shorter than the 8-byte header length of a safetensors file");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | f.data()[i];
  if (n > kMaxHeaderBytes) {
    return corrupt("header length " + std::to_string(n) + " bytes is absurd (limit " +
                   std::to_string(kMaxHeaderBytes) + "); this is not a safetensors file");
  }
  if (n > f.size() - 8) {
    return corrupt("header length " + std::to_string(n) + " bytes runs past the end of the file (" +
                   std::to_string(f.size()) + " bytes); the file is truncated");
  }
  const char* text = reinterpret_cast<const char*>(f.data() + 8);
  json header;
  try {
    header = json::parse(text, text + n);
  } catch (const json::parse_error& e) {
    return corrupt(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) return corrupt("header JSON is not an object but " + std::string(header.type_name()));

  const uint8_t* data = f.data() + 8 + n;
  const uint64_t data_size = f.size() - 8 - n;
  struct Range {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Range> ranges;
  std::map<std::string, TensorView> local;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return corrupt("\"__metadata__\" is not a JSON object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) return corrupt("\"__metadata__\" value of '" + mk + "' is not a string: " + mv.dump());
        metadata->emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    TensorView view;
    uint64_t begin = 0, end = 0;
    ZEST_RETURN_IF_ERROR(parse_entry(key, value, data, data_size, &view, &begin, &end));
    if (end > begin) ranges.push_back({begin, end, key});
    local.emplace(key, std::move(view));
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return corrupt("tensors '" + ranges[i - 1].name + "' [" + std::to_string(ranges[i - 1].begin) + ", " +
                     std::to_string(ranges[i - 1].end) + ") and '" + ranges[i].name + "' [" +
                     std::to_string(ranges[i].begin) + ", " + std::to_string(ranges[i].end) +
                     ") overlap in the data section");
    }
  }
  for (auto& [name, view] : local) {
    if (tensors->count(name) != 0) {
      return corrupt("duplicate tensor '" + name + "': it is also stored in another shard");
    }
    tensors->emplace(name, std::move(view));
  }
  return Status::ok();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return file_error("cannot open", path, errno);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return file_error("cannot read", path, errno);
  return text;
}

}  // namespace

Result<std::shared_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return file_error("cannot open", path, errno);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return file_error("cannot stat", path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + " is not a regular file");
  }
  std::shared_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return file_error("cannot mmap", path, err);
    }
    f->data_ = p;
  }
  ::close(fd);
  return f;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

namespace {

// Element i of a block-scale tensor as f32 (F32 / BF16 / F16; the mapping may be unaligned).
float scale_at(const BlockScale& s, int64_t i) {
  const auto* p = static_cast<const uint8_t*>(s.data);
  if (s.dtype == DType::F32) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return s.dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

}  // namespace

Tensor TensorView::to_f32() const {
  Tensor t = Tensor::empty(shape, DType::F32);
  const size_t n = static_cast<size_t>(numel());
  if (n == 0) return t;
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(dtype) == 0) {
    convert_to_f32(dtype, data, t.data<float>(), n);
  } else {
    std::vector<uint64_t> aligned((nbytes + 7) / 8);
    std::memcpy(aligned.data(), data, nbytes);
    convert_to_f32(dtype, aligned.data(), t.data<float>(), n);
  }
  if (dtype == DType::F8E4M3 && scale.data != nullptr && shape.size() == 2) {
    // w[r][c] = fp8[r][c] * scale[r / block_rows][c / block_cols], one f32 product each.
    const int64_t rows = shape[0], cols = shape[1];
    float* w = t.data<float>();
    std::vector<float> srow(static_cast<size_t>(scale.cols));
    for (int64_t br = 0; br < scale.rows; ++br) {
      for (int64_t bc = 0; bc < scale.cols; ++bc) srow[bc] = scale_at(scale, br * scale.cols + bc);
      const int64_t r1 = std::min(rows, (br + 1) * scale.block_rows);
      for (int64_t r = br * scale.block_rows; r < r1; ++r)
        for (int64_t c = 0; c < cols; ++c) w[r * cols + c] *= srow[c / scale.block_cols];
    }
  }
  return t;
}

Result<SafeTensors> SafeTensors::open_file(const std::string& file) {
  SafeTensors st;
  ZEST_ASSIGN_OR_RETURN(auto mapped, MappedFile::open(file));
  ZEST_RETURN_IF_ERROR(parse_file(*mapped, &st.tensors_, &st.metadata_).with_context(file));
  st.files_.push_back(std::move(mapped));
  return st;
}

Result<SafeTensors> SafeTensors::open(const std::string& path) {
  std::error_code ec;
  std::string index_path;
  if (fs::is_directory(path, ec)) {
    const fs::path dir(path);
    if (fs::exists(dir / kIndexName, ec)) {
      index_path = (dir / kIndexName).string();
    } else if (fs::exists(dir / kSingleName, ec)) {
      return open_file((dir / kSingleName).string());
    } else {
      return not_found("no " + std::string(kIndexName) + " or " + kSingleName + " in " + path);
    }
  } else if (ends_with(path, ".json")) {
    index_path = path;
  } else {
    return open_file(path);
  }

  ZEST_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
  json index;
  try {
    index = json::parse(text);
  } catch (const json::parse_error& e) {
    return corrupt(index_path + ": not valid JSON: " + e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return corrupt(index_path + ": expected an object with a \"weight_map\" object (tensor name -> shard file)");
  }
  std::map<std::string, std::string> weight_map;
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) {
      return corrupt(index_path + ": weight_map entry '" + name + "' is not a file name: " + file.dump());
    }
    const std::string shard = file.get<std::string>();
    const fs::path sp(shard);
    if (shard.empty() || sp.is_absolute() ||
        std::any_of(sp.begin(), sp.end(), [](const fs::path& c) { return c == ".."; })) {
      return corrupt(index_path + ": weight_map entry '" + name + "' names shard '" + shard +
                     "', which is not a file inside the checkpoint directory");
    }
    weight_map.emplace(name, shard);
    shards.insert(shard);
  }
  if (weight_map.empty()) return corrupt(index_path + ": weight_map lists no tensors");

  const fs::path dir = fs::path(index_path).parent_path();
  SafeTensors st;
  std::map<std::string, std::string> origin;  // tensor name -> shard that stores it
  for (const std::string& shard : shards) {
    const std::string shard_path = (dir / shard).string();
    auto mapped = MappedFile::open(shard_path);
    if (!mapped.ok()) {
      return Status(mapped.status().code(),
                    index_path + " lists shard " + shard + ", which cannot be opened: " + mapped.status().message());
    }
    std::map<std::string, TensorView> shard_tensors;
    ZEST_RETURN_IF_ERROR(parse_file(**mapped, &shard_tensors, &st.metadata_).with_context(shard_path));
    for (auto& [name, view] : shard_tensors) {
      auto [first, inserted] = origin.emplace(name, shard);
      if (!inserted) {
        return corrupt("duplicate tensor '" + name + "': stored in both " + first->second + " and " + shard);
      }
      auto it = weight_map.find(name);
      if (it != weight_map.end() && it->second != shard) {
        return corrupt(shard_path + " stores tensor '" + name + "' but " + index_path + " maps it to " +
                       it->second);
      }
      st.tensors_.emplace(name, std::move(view));
    }
    st.files_.push_back(std::move(mapped).value());
  }
  for (const auto& [name, shard] : weight_map) {
    if (st.tensors_.count(name) == 0) {
      return corrupt(index_path + " maps tensor '" + name + "' to " + shard + ", which does not contain it");
    }
  }
  return st;
}

Result<TensorView> SafeTensors::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return not_found("tensor '" + name + "' is not in the checkpoint (" + std::to_string(tensors_.size()) +
                     " tensors); is this the right model?");
  }
  if (it->second.dtype == DType::F8E4M3 && it->second.scale.data == nullptr) {
    return unsupported("tensor '" + name + "' is F8_E4M3 without its block scale bound; FP8 checkpoints load " +
                       "through their config.json (quantization_config quant_method \"fp8\")");
  }
  return it->second;
}

Result<TensorView> SafeTensors::get(const std::string& name, const std::vector<int64_t>& expected_shape) const {
  ZEST_ASSIGN_OR_RETURN(TensorView v, get(name));
  if (v.shape != expected_shape) {
    return corrupt("tensor '" + name + "' has shape " + shape_to_string(v.shape) + " but the config implies " +
                   shape_to_string(expected_shape));
  }
  return v;
}

Status SafeTensors::bind_fp8_scales(const Fp8Config* fp8) {
  const size_t suffix = std::strlen(kScaleSuffix);
  // Every scale must belong to an FP8 weight.
  for (const auto& [name, view] : tensors_) {
    if (!ends_with(name, kScaleSuffix)) continue;
    const std::string weight = name.substr(0, name.size() - suffix);
    auto w = tensors_.find(weight);
    if (w == tensors_.end()) {
      return corrupt("block scale '" + name + "' has no weight '" + weight + "' in the checkpoint");
    }
    if (w->second.dtype != DType::F8E4M3) {
      return corrupt("block scale '" + name + "' belongs to '" + weight + "', which is stored as " +
                     dtype_name(w->second.dtype) + ", not F8_E4M3");
    }
  }
  for (auto& [name, view] : tensors_) {
    if (view.dtype != DType::F8E4M3) continue;
    if (fp8 == nullptr) {
      return unsupported("tensor '" + name + "' is stored as F8_E4M3 but config.json has no quantization_config " +
                         "(quant_method \"fp8\") saying how it is scaled");
    }
    if (view.shape.size() != 2) {
      return unsupported("tensor '" + name + "' is F8_E4M3 with shape " + shape_to_string(view.shape) +
                         "; zest loads block-quantized 2-D weights only (FP8 checkpoints store experts one " +
                         "tensor each, mlp.experts.N.{gate,up,down}_proj.weight, not fused 3-D tensors)");
    }
    const size_t dot = name.rfind('.');
    const std::string module = dot == std::string::npos ? name : name.substr(0, dot);
    if (fp8->not_converted(module)) {
      return corrupt("tensor '" + name + "' is stored as F8_E4M3 but quantization_config.modules_to_not_convert " +
                     "lists its module '" + module + "'");
    }
    const std::string sname = name + kScaleSuffix;
    auto it = tensors_.find(sname);
    if (it == tensors_.end()) {
      return corrupt("FP8 tensor '" + name + "' has no block scale '" + sname + "' in the checkpoint");
    }
    const TensorView& s = it->second;
    if (s.dtype != DType::F32 && s.dtype != DType::BF16 && s.dtype != DType::F16) {
      return corrupt("block scale '" + sname + "' has dtype " + dtype_name(s.dtype) + "; expected F32, BF16 or F16");
    }
    const int64_t rows = view.shape[0], cols = view.shape[1];
    const std::vector<int64_t> want = {(rows + fp8->block_rows - 1) / fp8->block_rows,
                                       (cols + fp8->block_cols - 1) / fp8->block_cols};
    if (s.shape != want) {
      return corrupt("block scale '" + sname + "' has shape " + shape_to_string(s.shape) + " but weight " +
                     shape_to_string(view.shape) + " in " + std::to_string(fp8->block_rows) + "x" +
                     std::to_string(fp8->block_cols) + " blocks needs " + shape_to_string(want));
    }
    BlockScale b;
    b.name = sname;
    b.dtype = s.dtype;
    b.data = s.data;
    b.rows = want[0];
    b.cols = want[1];
    b.block_rows = fp8->block_rows;
    b.block_cols = fp8->block_cols;
    for (int64_t i = 0; i < b.rows * b.cols; ++i) {
      const float v = scale_at(b, i);
      if (!std::isfinite(v) || v < 0) {
        return corrupt("block scale '" + sname + "' holds " + std::to_string(v) + " at block (" +
                       std::to_string(i / b.cols) + ", " + std::to_string(i % b.cols) +
                       "); scales must be finite and non-negative");
      }
    }
    view.scale = std::move(b);
  }
  return Status::ok();
}

std::vector<std::string> SafeTensors::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& kv : tensors_) out.push_back(kv.first);
  return out;
}

Status write_safetensors(const std::string& file, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__") {
      return invalid_argument("cannot write a tensor named '" + name + "' to " + file);
    }
    if (header.contains(name)) return invalid_argument("tensor '" + name + "' is given twice for " + file);
    if (t.device() != Device::CPU) {
      return invalid_argument("tensor '" + name + "' is on " + device_name(t.device()) + "; copy it to the CPU first");
    }
    if (t.raw() == nullptr && t.numel() != 0) return invalid_argument("tensor '" + name + "' has no storage");
    header[name] = {{"dtype", dtype_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  const std::string tmp = file + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return file_error("cannot create", tmp, errno);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  for (const auto& kv : tensors) {
    const Tensor& t = kv.second;
    if (ok && t.nbytes() > 0) ok = std::fwrite(t.raw(), 1, t.nbytes(), f) == t.nbytes();
  }
  const int write_err = errno;
  if (std::fclose(f) != 0) ok = false;
  if (!ok) {
    std::remove(tmp.c_str());
    return file_error("cannot write", tmp, write_err);
  }
  if (std::rename(tmp.c_str(), file.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return file_error("cannot rename " + tmp + " to", file, err);
  }
  return Status::ok();
}

}  // namespace zest::io
