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

namespace zest::io {

// One tensor inside a mapped file: dtype, shape and a pointer into the mapping (valid while the
// owning SafeTensors object lives).
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  int64_t numel() const;
  // Copies the tensor into a new CPU f32 Tensor (converting BF16/F16).
  Tensor to_f32() const;
};

class MappedFile;  // an mmap of one file (private)

// A set of tensors from one or more .safetensors files. Validates every header: JSON syntax,
// header length vs file size, dtype names, shape * dtype size == byte range, ranges inside the data
// section and non-overlapping (gaps are allowed), duplicate names across shards, index entries
// against shard contents. Missing files -> kNotFound, malformed ones -> kCorrupt, dtypes other than
// F32/BF16/F16/I32/I64/U8 -> kUnsupported; messages name the file and the tensor.
class SafeTensors {
 public:
  // Opens DIR/model.safetensors.index.json (sharded) or DIR/model.safetensors, or one file path.
  static Result<SafeTensors> open(const std::string& path);
  // Opens exactly one .safetensors file.
  static Result<SafeTensors> open_file(const std::string& file);

  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // The tensor, or kNotFound naming it.
  Result<TensorView> get(const std::string& name) const;
  // The tensor, checked against an expected shape (kCorrupt with both shapes in the message).
  Result<TensorView> get(const std::string& name, const std::vector<int64_t>& expected_shape) const;
  std::vector<std::string> names() const;
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
