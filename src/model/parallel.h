// How one model is split over the GPUs of one host (tensor parallel attention, expert parallel MoE): which query and
// key/value heads, which MLP columns and which experts each rank holds. The plan is data; the split math it implies
// (partial attention outputs and MLP/expert contributions summed over ranks by an all-reduce) is checked on the CPU
// in tests/model/parallel_test.cpp.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <memory>
#include <vector>

#include "core/status.h"
#include "io/config.h"
#include "model/decoder.h"

namespace zest::model {

// How a decoder is split (zest's --tensor-parallel / --expert-parallel, typed once at the command line): ranks, and
// whether the MoE layers place whole experts on ranks instead of splitting every expert's columns.
struct ParallelOptions {
  int tensor_parallel = 1;
  bool expert_parallel = false;
};

struct RankShard {
  int rank = 0;
  int64_t q_head0 = 0, q_heads = 0;    // query heads [q_head0, q_head0 + q_heads)
  int64_t kv_head0 = 0, kv_heads = 0;  // key/value heads it holds (one, replicated, when world > kv heads)
  int64_t inter0 = 0, inter = 0;       // dense MLP intermediate columns [inter0, inter0 + inter)
  int64_t expert0 = 0, experts = 0;    // expert parallel: its experts; tensor parallel experts: all of them
  int64_t expert_inter0 = 0, expert_inter = 0;  // each expert's intermediate columns it holds
};

struct ParallelPlan {
  int world = 1;
  bool expert_parallel = false;
  std::vector<RankShard> ranks;
  // The rank that holds expert e under expert parallelism (-1: every rank holds a slice of it).
  int owner_of_expert(int64_t e) const;
};

// The split of `cfg` over `world` ranks. Attention: query heads split evenly (world must divide them); key/value
// heads split when world divides them, else (world a multiple of them) each rank holds the one its query heads read,
// replicated. Dense MLP: intermediate columns split evenly. MoE: with `expert_parallel`, experts in contiguous ranges
// (world must divide them), each whole; without, every expert's intermediate columns split evenly. kInvalidArgument
// naming the size that does not divide; world 1 is the whole model on rank 0.
Result<ParallelPlan> plan_parallel(const io::TextConfig& cfg, int world, bool expert_parallel);

// One rank's decoder weights under a plan: the model's tensors cut to the rank's shard, for a decoder that runs
// today's layer on it (docs/architecture.md, Several GPUs). Row slices (q/k/v of its heads; gate/up rows of its MLP
// or expert columns; under expert parallelism its experts of a fused [E, ...] tensor) are views into the source;
// column slices (o_proj, down_proj) are copies held by `owned`. Under expert parallelism the per-expert tensors of
// experts it does not hold are empty (data null). The config is the shard's: num_heads, num_kv_heads,
// intermediate_size and (tensor-parallel experts) moe_intermediate_size; num_experts stays (the router is whole on
// every rank). Embeddings, norms, router and lm_head are the source's views.
struct ShardWeights {
  DecoderWeights weights;
  std::vector<std::unique_ptr<uint8_t[]>> owned;
};

// Fused input-major experts are cut by experts (expert parallelism, views) or by each expert's columns (copies).
// kInvalidArgument for a rank outside the plan; kUnsupported naming the tensor for a block-wise FP8 tensor cut off
// its scale blocks, or block-wise FP8 fused experts split by columns.
Result<ShardWeights> shard_decoder_weights(const DecoderWeights& w, const ParallelPlan& plan, int rank);

// The ranks of one parallel decoder summing their partial results (the all-reduces after the attention output
// projection and after the MLP/experts, docs/architecture.md).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // data[0, n) becomes the sum over the ranks of their data[0, n), added in rank order, so every rank holds the same
  // bits. Every rank calls it, with the same n, in the same order.
  virtual Status all_reduce_sum(float* data, int64_t n) = 0;
  // data[0, bytes) becomes rank root's. Every rank calls it, with the same bytes and root, in the same order.
  virtual Status broadcast(void* data, int64_t bytes, int root) = 0;
  // A communicator over GPUs: the all-reduce of n values (bf16 or f32) at `data` in the calling rank's device memory,
  // in place, queued on `stream` (a cudaStream_t; the caller's thread has the rank's device current) so that the
  // decoder's stream never waits for the host, and inside a CUDA graph too. Every rank calls it, with the same n and
  // type, in the same order. Communicators without it (reduces_on_device false) take the host form.
  virtual bool reduces_on_device() const { return false; }
  virtual Status all_reduce_sum_device(void* data, int64_t n, bool bf16, void* stream) {
    (void)data, (void)n, (void)bf16, (void)stream;
    return unsupported("this communicator sums host values only");
  }
  // Before a rank launches work on its GPU that holds collectives queued earlier (a CUDA graph's replay). A group that
  // gates its device collectives (GatedDeviceGroup) meets every rank here, so that a replay is launched only when
  // every rank launches its own (an error, and no launch, once the step was aborted); others return ok.
  virtual Status launch_gate() { return Status::ok(); }
};

// The communicators of one parallel decoder's ranks, owned together (LocalGroup; the NCCL group of the CUDA backend).
class CommunicatorGroup {
 public:
  virtual ~CommunicatorGroup() = default;
  virtual int world() const = 0;
  virtual Communicator& member(int rank) = 0;
  // A rank's step failed: the ranks blocked in a collective of this step (and those that reach one) return an error
  // instead of waiting for the failed rank forever; reset() (once every rank has returned from the step) makes the
  // group usable again. Groups that cannot do this leave both as no-ops.
  virtual void abort() {}
  virtual void reset() {}
  // A rank's GPU failed after its collectives were queued (they will never run): the other ranks' GPUs wait on theirs,
  // and their host threads on those GPUs. abort_device() aborts every member's queued device collectives (the NCCL
  // group: ncclCommAbort), which lets those GPUs go on; the group is broken() from then on (reset() does not mend it:
  // its device communicators are gone) and every collective returns an error. Groups without device collectives leave
  // it a no-op.
  virtual void abort_device() {}
  virtual bool broken() const { return false; }
};

// A meeting point of the ranks' host threads: meet() returns true once every rank has arrived, or false once the
// group is aborted (at once for a rank that arrives after the abort). reset() (when no rank waits) clears the abort.
class RankBarrier {
 public:
  explicit RankBarrier(int world) : world_(world < 1 ? 1 : world) {}
  bool meet();
  void abort();
  void reset();

 private:
  int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
};

// `world` ranks that are threads of one process (the CPU decoder's ranks): member(r) is rank r's communicator. Each
// all-reduce meets every rank at a barrier, so the ranks must run concurrently (abort() releases it). World 1 changes
// nothing.
class LocalGroup final : public CommunicatorGroup {
 public:
  explicit LocalGroup(int world);
  ~LocalGroup() override;
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;
  int world() const override { return world_; }
  Communicator& member(int rank) override;
  void abort() override { barrier_.abort(); }
  void reset() override { barrier_.reset(); }

 private:
  struct Member;
  Status all_reduce(int rank, float* data, int64_t n);
  Status broadcast(int rank, void* data, int64_t bytes, int root);
  int world_;
  std::vector<void*> ptrs_;
  std::vector<int64_t> sizes_;
  RankBarrier barrier_;
  std::vector<std::unique_ptr<Member>> members_;
};

// A group of device communicators (NCCL) made abortable: a collective queued on a GPU waits there for every rank's,
// so a rank that fails before queuing its own (an allocation, a launch, its inputs) would leave the others' streams
// waiting forever. Here each rank's host thread meets the others before it queues a collective, and queues it only
// when all of them are about to queue theirs; after abort() the ranks return an error instead, so every collective
// that reached a GPU is matched on every rank. Steps captured into a CUDA graph meet at capture, and at each replay's
// launch (launch_gate).
// Host collectives and everything else pass through to `inner`.
class GatedDeviceGroup final : public CommunicatorGroup {
 public:
  explicit GatedDeviceGroup(std::unique_ptr<CommunicatorGroup> inner);
  ~GatedDeviceGroup() override;
  int world() const override { return inner_->world(); }
  Communicator& member(int rank) override;
  void abort() override;
  void reset() override;
  void abort_device() override;
  bool broken() const override { return inner_->broken(); }

 private:
  struct Member;
  std::unique_ptr<CommunicatorGroup> inner_;
  RankBarrier barrier_;
  std::vector<std::unique_ptr<Member>> members_;
};

}  // namespace zest::model
