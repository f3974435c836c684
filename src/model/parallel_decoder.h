// The CPU decoder split over ranks (tensor-parallel attention, tensor- or expert-parallel MLP/experts): one
// Qwen3TextModel per rank on its shard (shard_decoder_weights), run by one thread per rank and joined by a LocalGroup's
// all-reduces; the engine sees one TextDecoder (one scheduler, one block allocator; each rank keeps the K/V of its
// heads in its own storage under the same block tables). The math and placement of the CUDA ranks, on the CPU: the
// ranks share the process's thread pool (their parallel loops take turns), so a split CPU decoder is no faster than
// the whole one.
#pragma once
#include <memory>
#include <vector>

#include "model/parallel.h"
#include "model/qwen3.h"

namespace zest::model {

class ParallelCpuDecoder final : public TextDecoder {
 public:
  // world >= 1 ranks of `w` (views that must outlive the decoder) under plan_parallel(w.config, world,
  // expert_parallel); its errors (sizes that do not split) as they are.
  static Result<std::unique_ptr<ParallelCpuDecoder>> create(const DecoderWeights& w, int world, bool expert_parallel);
  ~ParallelCpuDecoder() override;

  Backend backend() const override { return Backend::kCpu; }
  const io::TextConfig& config() const override { return config_; }
  int world() const { return static_cast<int>(ranks_.size()); }
  Result<PagedKVCache> allocate_cache(int64_t num_blocks, int64_t block_size) const override;
  // Every rank runs the step on its storage; rank 0's logits (all ranks hold the same bits). MoE hooks (host
  // re-routing such as SERE's, calibration taps) are called by rank 0 once a layer; its re-routing is broadcast.
  Result<Tensor> forward(const ForwardBatch& batch, PagedKVCache& cache, const MoeHooks* hooks = nullptr) const override;
  // The whole expert (SERE calibration on the host): the rank that holds it (expert parallel), or the sum of every
  // rank's output over its columns of it (tensor parallel experts).
  Status run_expert(int64_t layer, int64_t expert, const float* x, int64_t n, float* y) const override;

 private:
  ParallelCpuDecoder() = default;
  io::TextConfig config_;
  std::unique_ptr<LocalGroup> group_;
  std::vector<ShardWeights> shards_;
  std::vector<std::unique_ptr<Qwen3TextModel>> ranks_;
};

}  // namespace zest::model
