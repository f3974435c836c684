#include "model/parallel_decoder.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "model/qwen3.h"

namespace zest::model {
namespace {

// The storage of a parallel decoder's cache: one cache per rank (its key/value heads) over the same block ids.
class RankKvStorage final : public KvStorage {
 public:
  std::vector<PagedKVCache> ranks;
};

// The per-rank caches of a cache made by a parallel decoder of `world` ranks, or null.
std::vector<PagedKVCache>* rank_caches(PagedKVCache& cache, size_t world) {
  auto* storage = dynamic_cast<RankKvStorage*>(cache.storage());
  return storage && storage->ranks.size() == world ? &storage->ranks : nullptr;
}

constexpr const char* kForeignCache =
    "forward: the KV cache was not made by this parallel decoder (use its allocate_cache)";

}  // namespace

// Threads for ranks 1 .. n: run() hands every one the same job (its rank as the argument), runs rank 0's part on the
// caller's thread, and returns once all are done.
struct ParallelDecoder::Workers {
  explicit Workers(int n) {
    for (int r = 1; r <= n; ++r) threads.emplace_back([this, r] { loop(r); });
  }
  ~Workers() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    wake.notify_all();
    for (auto& t : threads) t.join();
  }
  void run(const std::function<void(int)>& fn) {
    {
      std::lock_guard<std::mutex> lock(mu);
      job = &fn;
      pending = static_cast<int>(threads.size());
      ++generation;
    }
    wake.notify_all();
    fn(0);
    std::unique_lock<std::mutex> lock(mu);
    done.wait(lock, [this] { return pending == 0; });
    job = nullptr;
  }
  void loop(int rank) {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* fn = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu);
        wake.wait(lock, [&] { return stop || generation != seen; });
        if (stop) return;
        seen = generation;
        fn = job;
      }
      (*fn)(rank);
      std::lock_guard<std::mutex> lock(mu);
      if (--pending == 0) done.notify_one();
    }
  }
  std::mutex mu;
  std::condition_variable wake, done;
  const std::function<void(int)>* job = nullptr;
  uint64_t generation = 0;
  int pending = 0;
  bool stop = false;
  std::vector<std::thread> threads;
};

Result<std::unique_ptr<ParallelDecoder>> ParallelDecoder::create(const DecoderWeights& w, int world,
                                                                 bool expert_parallel, const MakeRank& make_rank,
                                                                 std::unique_ptr<CommunicatorGroup> group) {
  ZEST_ASSIGN_OR_RETURN(ParallelPlan plan, plan_parallel(w.config, world, expert_parallel));
  if (world > 1 && (!group || group->world() != world))
    return invalid_argument("a parallel decoder of " + std::to_string(world) + " ranks needs a group of as many");
  std::unique_ptr<ParallelDecoder> d(new ParallelDecoder());
  d->config_ = w.config;
  d->plan_ = plan;
  d->group_ = std::move(group);
  d->shards_.reserve(world);  // the ranks' weights view the shards: no reallocation
  for (int r = 0; r < world; ++r) {
    ZEST_ASSIGN_OR_RETURN(ShardWeights s, shard_decoder_weights(w, plan, r));
    d->shards_.push_back(std::move(s));
    auto m = make_rank(d->shards_.back().weights, r);
    if (!m.ok()) return m.status().with_context("rank " + std::to_string(r));
    d->ranks_.push_back(std::move(m).value());
    if (world > 1) ZEST_RETURN_IF_ERROR(d->ranks_.back()->set_communicator(&d->group_->member(r)));
  }
  if (world > 1) d->workers_ = std::make_unique<Workers>(world - 1);
  return d;
}

Result<std::unique_ptr<ParallelDecoder>> ParallelDecoder::create_cpu(const DecoderWeights& w, int world,
                                                                     bool expert_parallel) {
  auto make = [](const DecoderWeights& shard, int) -> Result<std::unique_ptr<TextDecoder>> {
    ZEST_ASSIGN_OR_RETURN(Qwen3TextModel m, Qwen3TextModel::from_weights(shard));
    return std::unique_ptr<TextDecoder>(std::make_unique<Qwen3TextModel>(std::move(m)));
  };
  return create(w, world, expert_parallel, make, world > 1 ? std::make_unique<LocalGroup>(world) : nullptr);
}

ParallelDecoder::~ParallelDecoder() {
  workers_.reset();
  ranks_.clear();  // the decoders leave before their communicators
}

namespace {
Status broken_error() {
  return internal_error("the split decoder is unusable: a rank's GPU failed mid-step and its collectives were aborted "
                        "(restart zest)");
}
}  // namespace

Status ParallelDecoder::health() const {
  if (group_ && group_->broken()) return broken_error();
  for (size_t r = 0; r < ranks_.size(); ++r)
    if (Status h = ranks_[r]->health(); !h.is_ok()) return h.with_context("rank " + std::to_string(r));
  return Status::ok();
}

Status ParallelDecoder::on_ranks(const std::function<Status(int)>& fn) const {
  if (!workers_) return fn(0);
  if (group_->broken()) return broken_error();
  std::mutex mu;
  std::condition_variable returned;
  int running = world();
  Status first = Status::ok();  // the first failure in time: the cause (the others abandoned collectives for it)
  workers_->run([&](int r) {
    Status s = fn(r);
    const bool failed = !s.is_ok();
    if (failed) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (first.is_ok()) first = std::move(s);
      }
      group_->abort();  // the other ranks stop waiting for this one in a collective
    }
    std::unique_lock<std::mutex> lock(mu);
    --running;
    returned.notify_all();
    // The others leave their host gates at once; one that does not return waits on its GPU for a collective this
    // rank queued and that will not run (its GPU failed): the device collectives are aborted.
    if (failed && !returned.wait_for(lock, abort_grace_, [&] { return running == 0; })) {
      lock.unlock();
      group_->abort_device();
    }
  });
  if (!first.is_ok()) group_->reset();  // every rank has returned: the next step meets afresh
  return first;
}

Result<PagedKVCache> ParallelDecoder::allocate_cache(int64_t num_blocks, int64_t block_size) const {
  if (num_blocks <= 0 || block_size <= 0) return invalid_argument("KV cache: need blocks and a block size");
  auto storage = std::make_shared<RankKvStorage>();
  for (const auto& m : ranks_) {
    ZEST_ASSIGN_OR_RETURN(PagedKVCache c, m->allocate_cache(num_blocks, block_size));
    storage->ranks.push_back(std::move(c));
  }
  return PagedKVCache(num_blocks, block_size, std::move(storage));
}

Result<Tensor> ParallelDecoder::forward(const ForwardBatch& batch, PagedKVCache& cache, const MoeHooks* hooks) const {
  std::vector<PagedKVCache>* caches = rank_caches(cache, ranks_.size());
  if (!caches) return invalid_argument(kForeignCache);
  Tensor out;
  ZEST_RETURN_IF_ERROR(on_ranks([&](int r) -> Status {
    auto l = ranks_[r]->forward(batch, (*caches)[r], hooks);
    if (!l.ok()) return l.status();
    if (r == 0) out = std::move(l).value();
    return Status::ok();
  }));
  return out;
}

Result<std::vector<SampleResult>> ParallelDecoder::forward_sample(const ForwardBatch& batch, PagedKVCache& cache,
                                                                  const MoeHooks* hooks,
                                                                  const std::vector<SampleRow>& rows) const {
  std::vector<PagedKVCache>* caches = rank_caches(cache, ranks_.size());
  if (!caches) return invalid_argument(kForeignCache);
  std::vector<SampleResult> out;
  ZEST_RETURN_IF_ERROR(on_ranks([&](int r) -> Status {
    auto l = ranks_[r]->forward_sample(batch, (*caches)[r], hooks, rows);
    if (!l.ok()) return l.status();
    if (r == 0) out = std::move(l).value();
    return Status::ok();
  }));
  return out;
}

Status ParallelDecoder::run_expert(int64_t layer, int64_t expert, const float* x, int64_t n, float* y) const {
  if (n < 0) return invalid_argument("run_expert: negative row count");
  if (layer < 0 || layer >= config_.num_layers || expert < 0 || expert >= config_.num_experts)
    return ranks_[0]->run_expert(layer, expert, x, n, y);  // its error: no such MoE layer or expert
  const int owner = plan_.owner_of_expert(expert);
  if (owner >= 0) return ranks_[owner]->run_expert(layer, expert, x, n, y);
  const size_t out = static_cast<size_t>(n) * static_cast<size_t>(config_.hidden_size);
  std::fill(y, y + out, 0.f);
  std::vector<float> part(out);
  for (const auto& m : ranks_) {  // tensor-parallel experts: every rank holds a slice of the expert's columns
    ZEST_RETURN_IF_ERROR(m->run_expert(layer, expert, x, n, part.data()));
    for (size_t i = 0; i < out; ++i) y[i] += part[i];
  }
  return Status::ok();
}

}  // namespace zest::model
