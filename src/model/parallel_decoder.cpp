#include "model/parallel_decoder.h"

#include <algorithm>
#include <thread>

namespace zest::model {
namespace {

// The storage of a parallel decoder's cache: one CPU cache per rank (its key/value heads) over the same block ids.
class RankKvStorage final : public KvStorage {
 public:
  std::vector<PagedKVCache> ranks;
};

}  // namespace

Result<std::unique_ptr<ParallelCpuDecoder>> ParallelCpuDecoder::create(const DecoderWeights& w, int world,
                                                                       bool expert_parallel) {
  ZEST_ASSIGN_OR_RETURN(ParallelPlan plan, plan_parallel(w.config, world, expert_parallel));
  std::unique_ptr<ParallelCpuDecoder> d(new ParallelCpuDecoder());
  d->config_ = w.config;
  d->group_ = std::make_unique<LocalGroup>(world);
  for (int r = 0; r < world; ++r) {
    ZEST_ASSIGN_OR_RETURN(ShardWeights s, shard_decoder_weights(w, plan, r));
    d->shards_.push_back(std::move(s));
    ZEST_ASSIGN_OR_RETURN(Qwen3TextModel m, Qwen3TextModel::from_weights(d->shards_.back().weights));
    d->ranks_.push_back(std::make_unique<Qwen3TextModel>(std::move(m)));
    if (world > 1) ZEST_RETURN_IF_ERROR(d->ranks_.back()->set_communicator(&d->group_->member(r)));
  }
  return d;
}

ParallelCpuDecoder::~ParallelCpuDecoder() = default;

Result<PagedKVCache> ParallelCpuDecoder::allocate_cache(int64_t num_blocks, int64_t block_size) const {
  if (num_blocks <= 0 || block_size <= 0) return invalid_argument("KV cache: need blocks and a block size");
  auto storage = std::make_shared<RankKvStorage>();
  for (const auto& m : ranks_) storage->ranks.push_back(m->make_cache(num_blocks, block_size));
  return PagedKVCache(num_blocks, block_size, std::move(storage));
}

Result<Tensor> ParallelCpuDecoder::forward(const ForwardBatch& batch, PagedKVCache& cache,
                                           const MoeHooks* hooks) const {
  auto* storage = dynamic_cast<RankKvStorage*>(cache.storage());
  if (!storage || storage->ranks.size() != ranks_.size())
    return invalid_argument("forward: the KV cache was not made by this parallel decoder (use its allocate_cache)");
  if (ranks_.size() == 1) return ranks_[0]->forward(batch, storage->ranks[0], hooks);
  std::vector<Result<Tensor>> out(ranks_.size(), Result<Tensor>(internal_error("rank did not run")));
  std::vector<std::thread> threads;
  for (size_t r = 1; r < ranks_.size(); ++r)
    threads.emplace_back([&, r] { out[r] = ranks_[r]->forward(batch, storage->ranks[r], hooks); });
  out[0] = ranks_[0]->forward(batch, storage->ranks[0], hooks);
  for (auto& t : threads) t.join();
  for (auto& o : out)
    if (!o.ok()) return o.status();
  return std::move(out[0]);
}

Status ParallelCpuDecoder::run_expert(int64_t layer, int64_t expert, const float* x, int64_t n, float* y) const {
  if (n < 0) return invalid_argument("run_expert: negative row count");
  const size_t out = static_cast<size_t>(n) * static_cast<size_t>(config_.hidden_size);
  std::fill(y, y + out, 0.f);
  std::vector<float> part(out);
  bool held = false;
  for (const auto& m : ranks_) {
    if (!m->holds_expert(layer, expert)) continue;  // another rank's (expert parallelism), or out of range
    ZEST_RETURN_IF_ERROR(m->run_expert(layer, expert, x, n, part.data()));
    held = true;
    for (size_t i = 0; i < out; ++i) y[i] += part[i];
  }
  if (!held) return ranks_[0]->run_expert(layer, expert, x, n, y);  // its error: no such MoE layer or expert
  return Status::ok();
}

}  // namespace zest::model
