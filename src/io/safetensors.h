// safetensors checkpoints: one file or shards with model.safetensors.index.json, memory-mapped.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "core/tensor.h"
#include "io/config.h"

namespace zest::io {

// The block scales of a block-quantized FP8 weight [rows, cols]: the companion tensor `name`
// ("<weight>_scale_inv", F32/BF16/F16, shape [ceil(rows / block_rows), ceil(cols / block_cols)]); the
// real weight is fp8 * scale of its block (blocks at the bottom and right edges may be partial).
struct BlockScale {
  std::string name;
  DType dtype = DType::F32;
  const void* data = nullptr;  // null: no scale bound
  int64_t rows = 0, cols = 0;  // the scale grid
  int64_t block_rows = 0, block_cols = 0;
};

// One tensor inside a mapped file: dtype, shape and a pointer into the mapping (valid while the
// owning SafeTensors object lives).
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  BlockScale scale;  // F8E4M3 weights of an FP8 checkpoint (SafeTensors::bind_fp8_scales)
  int64_t numel() const;
  // Copies the tensor into a new CPU f32 Tensor (converting BF16/F16/FP8; an FP8 tensor with a bound
  // block scale is dequantized: f32(fp8) * f32(scale), one f32 rounding, as transformers and vLLM do).
  Tensor to_f32() const;
};

class MappedFile;  // an mmap of one file (private)

// A set of tensors from one or more .safetensors files. Validates every header: JSON syntax,
// header length vs file size, dtype names, shape * dtype size == byte range, ranges inside the data
// section and non-overlapping (gaps are allowed), duplicate names across shards, index entries
// against shard contents. Missing files -> kNotFound, malformed ones -> kCorrupt, dtypes other than
// F32/BF16/F16/I32/I64/U8/F8_E4M3 -> kUnsupported; messages name the file and the tensor.
class SafeTensors {
 public:
  // Opens DIR/model.safetensors.index.json (sharded) or DIR/model.safetensors, or one file path.
  static Result<SafeTensors> open(const std::string& path);
  // Opens exactly one .safetensors file.
  static Result<SafeTensors> open_file(const std::string& file);

  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // The tensor, or kNotFound naming it; kUnsupported for an F8_E4M3 tensor whose block scale is not
  // bound (its checkpoint was not opened as an FP8 checkpoint).
  Result<TensorView> get(const std::string& name) const;
  // The tensor, checked against an expected shape (kCorrupt with both shapes in the message).
  Result<TensorView> get(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  std::vector<std::string> names() const;

  // Binds every F8_E4M3 tensor to its block scale "<name>_scale_inv" (fp8 = the checkpoint's quantization
  // config; nullptr when config.json has none). Errors name the tensor: FP8 weights without an FP8 config,
  // not 2-D (fused expert tensors) -> kUnsupported; FP8 weights in a module the config lists as not
  // converted, without their scale, a scale of the wrong dtype or shape, non-finite or negative, or a scale
  // whose weight is not F8_E4M3 -> kCorrupt.
  Status bind_fp8_scales(const Fp8Config* fp8);

  // String metadata of the file header ("__metadata__"), merged over shards.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::vector<std::shared_ptr<MappedFile>> files_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (CPU) and string metadata to one .safetensors file (header padded to 8 bytes; written to
// FILE.tmp, then renamed).
Status write_safetensors(const std::string& file, const std::vector<std::pair<std::string, Tensor>>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace zest::io
