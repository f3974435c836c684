// A decoder split over ranks (tensor-parallel attention, tensor- or expert-parallel MLP/experts): one decoder per rank
// on its shard (shard_decoder_weights), joined by a CommunicatorGroup's all-reduces, every step run by all ranks at
// once; the engine sees one TextDecoder (one scheduler, one block allocator; each rank keeps the K/V of its
// heads in its own storage under the same block tables); ranks 1 .. N-1 run on threads the decoder keeps. On the CPU (create_cpu) the ranks are Qwen3 models joined by
// a LocalGroup: they share the process's thread pool (their parallel loops take turns), so a split CPU decoder shows
// the split's math and placement, not a speed-up. On GPUs the ranks are CUDA decoders, one a GPU, joined by NCCL
// (backend/cuda.h, create_cuda_parallel_decoder).
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "model/parallel.h"

namespace zest::model {

class ParallelDecoder final : public TextDecoder {
 public:
  // Rank r's decoder on its shard's weights (views that outlive the decoder).
  using MakeRank = std::function<Result<std::unique_ptr<TextDecoder>>(const DecoderWeights& shard, int rank)>;
  // world >= 1 ranks of `w` (views that must outlive the decoder where the ranks read them: the CPU ranks; CUDA ranks
  // copy them to their GPUs when made) under plan_parallel(w.config, world,
  // expert_parallel), rank r made by make_rank and joined to group->member(r) (world > 1); the plan's errors (sizes
  // that do not split) as they are.
  static Result<std::unique_ptr<ParallelDecoder>> create(const DecoderWeights& w, int world, bool expert_parallel,
                                                         const MakeRank& make_rank,
                                                         std::unique_ptr<CommunicatorGroup> group);
  // The CPU ranks: Qwen3 models joined by a LocalGroup.
  static Result<std::unique_ptr<ParallelDecoder>> create_cpu(const DecoderWeights& w, int world, bool expert_parallel);
  ~ParallelDecoder() override;

  Backend backend() const override { return ranks_[0]->backend(); }
  const io::TextConfig& config() const override { return config_; }
  int world() const { return static_cast<int>(ranks_.size()); }
  Result<PagedKVCache> allocate_cache(int64_t num_blocks, int64_t block_size) const override;
  // Every rank runs the step on its storage; rank 0's logits (all ranks hold the same bits). MoE hooks (host
  // re-routing such as SERE's, calibration taps) are called by rank 0 once a layer; its re-routing is broadcast
  // (ranks that take no host hooks refuse them).
  Result<Tensor> forward(const ForwardBatch& batch, PagedKVCache& cache, const MoeHooks* hooks = nullptr) const override;
  // The same through every rank's forward_sample (device sampling on the GPU ranks); rank 0's summaries.
  Result<std::vector<SampleResult>> forward_sample(const ForwardBatch& batch, PagedKVCache& cache,
                                                   const MoeHooks* hooks,
                                                   const std::vector<SampleRow>& rows) const override;
  // Rank 0's counters (every rank re-routes the same tokens the same way).
  Result<std::vector<accel::RerouteCounts>> reroute_counts() const override { return ranks_[0]->reroute_counts(); }
  // The whole expert (SERE calibration on the host): the rank that holds it (expert parallel), or the sum of every
  // rank's output over its columns of it (tensor parallel experts).
  Status run_expert(int64_t layer, int64_t expert, const float* x, int64_t n, float* y) const override;
  // How long a rank whose step failed waits for the others to return (released from the host gates) before it takes
  // them for waiting on device collectives that will not run and aborts those (CommunicatorGroup::abort_device; the
  // decoder is unusable from then on). 10 s by default: longer than any layer's work between two collectives.
  void set_abort_grace(std::chrono::milliseconds grace) { abort_grace_ = grace; }
  // An error once a rank's device collectives were aborted (the decoder refuses every step from then on) or while a
  // rank reports one.
  Status health() const override;

 private:
  ParallelDecoder() = default;
  // fn(r) for every rank at once: rank 0 on the caller's thread, the others on the decoder's worker threads (one a
  // rank, kept for the decoder's life); the first error in time. A failed rank aborts the group (the others leave
  // their collectives), and its device collectives too if the others have not returned within the abort grace.
  Status on_ranks(const std::function<Status(int)>& fn) const;
  struct Workers;
  io::TextConfig config_;
  ParallelPlan plan_;
  std::unique_ptr<CommunicatorGroup> group_;
  std::vector<ShardWeights> shards_;
  std::vector<std::unique_ptr<TextDecoder>> ranks_;
  std::unique_ptr<Workers> workers_;
  std::chrono::milliseconds abort_grace_{10000};
};

}  // namespace zest::model
