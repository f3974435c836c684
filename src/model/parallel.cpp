#include "model/parallel.h"

#include <cstring>
#include <string>

#include "core/dtype.h"

namespace zest::model {

int ParallelPlan::owner_of_expert(int64_t e) const {
  if (!expert_parallel) return -1;
  for (const RankShard& r : ranks)
    if (e >= r.expert0 && e < r.expert0 + r.experts) return r.rank;
  return -1;
}

Result<ParallelPlan> plan_parallel(const io::TextConfig& cfg, int world, bool expert_parallel) {
  if (world < 1) return invalid_argument("the world size must be at least 1, got " + std::to_string(world));
  auto need = [&](int64_t n, const std::string& what) -> Status {
    if (n % world != 0)
      return invalid_argument(what + " (" + std::to_string(n) + ") do not split over " + std::to_string(world) +
                              " GPUs");
    return Status::ok();
  };
  ZEST_RETURN_IF_ERROR(need(cfg.num_heads, "the query heads"));
  const int64_t kv = cfg.num_kv_heads;
  if (kv % world != 0 && world % kv != 0)
    return invalid_argument("the key/value heads (" + std::to_string(kv) + ") neither split over nor replicate onto " +
                            std::to_string(world) + " GPUs");
  const bool moe = cfg.num_experts > 0;
  bool dense_layers = !moe;
  for (int64_t l = 0; moe && l < cfg.num_layers; ++l) dense_layers = dense_layers || !cfg.is_moe_layer(l);
  if (dense_layers) ZEST_RETURN_IF_ERROR(need(cfg.intermediate_size, "the MLP's intermediate columns"));
  if (moe && expert_parallel) ZEST_RETURN_IF_ERROR(need(cfg.num_experts, "the experts"));
  if (moe && !expert_parallel) ZEST_RETURN_IF_ERROR(need(cfg.moe_intermediate_size, "each expert's intermediate columns"));
  if (!moe && expert_parallel) return invalid_argument("expert parallelism needs a MoE model");

  ParallelPlan p;
  p.world = world;
  p.expert_parallel = moe && expert_parallel;
  const int64_t qh = cfg.num_heads / world;
  for (int r = 0; r < world; ++r) {
    RankShard s;
    s.rank = r;
    s.q_head0 = r * qh;
    s.q_heads = qh;
    if (kv % world == 0) {
      s.kv_heads = kv / world;
      s.kv_head0 = r * s.kv_heads;
    } else {  // world = kv * m: ranks r*... share one kv head; its query heads all read it (GQA groups stay whole)
      s.kv_heads = 1;
      s.kv_head0 = s.q_head0 / (cfg.num_heads / kv);
    }
    if (dense_layers) {
      s.inter = cfg.intermediate_size / world;
      s.inter0 = r * s.inter;
    }
    if (moe) {
      if (p.expert_parallel) {
        s.experts = cfg.num_experts / world;
        s.expert0 = r * s.experts;
        s.expert_inter = cfg.moe_intermediate_size;
      } else {
        s.experts = cfg.num_experts;
        s.expert_inter = cfg.moe_intermediate_size / world;
        s.expert_inter0 = r * s.expert_inter;
      }
    }
    p.ranks.push_back(s);
  }
  return p;
}

namespace {

// Rows [r0, r0 + n) of a 2-D (or, for fused experts, the first dimension of an N-D) tensor: a view.
Result<io::TensorView> slice_rows(const io::TensorView& t, int64_t r0, int64_t n) {
  io::TensorView v = t;
  if (t.data == nullptr || (r0 == 0 && n == t.shape[0])) return v;
  int64_t inner = 1;
  for (size_t d = 1; d < t.shape.size(); ++d) inner *= t.shape[d];
  const size_t es = dtype_size(t.dtype);
  v.shape[0] = n;
  v.data = static_cast<const uint8_t*>(t.data) + static_cast<size_t>(r0 * inner) * es;
  v.nbytes = static_cast<size_t>(n * inner) * es;
  if (t.scale.data) {
    const int64_t br = t.scale.block_rows;
    if (t.shape.size() != 2 || r0 % br != 0 || (n % br != 0 && r0 + n != t.shape[0]))
      return unsupported("FP8 tensor '" + t.name + "' would be cut off its " + std::to_string(br) + "-row scale blocks");
    v.scale.data = static_cast<const uint8_t*>(t.scale.data) +
                   static_cast<size_t>(r0 / br * t.scale.cols) * dtype_size(t.scale.dtype);
    v.scale.rows = (n + br - 1) / br;
  }
  return v;
}

// Columns [c0, c0 + n) of a 2-D tensor: a copy held by `owned`.
Result<io::TensorView> slice_cols(const io::TensorView& t, int64_t c0, int64_t n,
                                  std::vector<std::unique_ptr<uint8_t[]>>& owned) {
  io::TensorView v = t;
  if (t.data == nullptr || (c0 == 0 && n == t.shape[1])) return v;
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const size_t es = dtype_size(t.dtype);
  auto copy_grid = [&](const void* src, int64_t r, int64_t c, int64_t from, int64_t count, size_t e) {
    owned.push_back(std::make_unique<uint8_t[]>(static_cast<size_t>(r * count) * e));
    uint8_t* dst = owned.back().get();
    for (int64_t i = 0; i < r; ++i)
      std::memcpy(dst + static_cast<size_t>(i * count) * e,
                  static_cast<const uint8_t*>(src) + static_cast<size_t>(i * c + from) * e, static_cast<size_t>(count) * e);
    return static_cast<const void*>(dst);
  };
  if (t.scale.data) {
    const int64_t bc = t.scale.block_cols;
    if (c0 % bc != 0 || (n % bc != 0 && c0 + n != cols))
      return unsupported("FP8 tensor '" + t.name + "' would be cut off its " + std::to_string(bc) +
                         "-column scale blocks");
    const int64_t sc = (n + bc - 1) / bc;
    v.scale.data = copy_grid(t.scale.data, t.scale.rows, t.scale.cols, c0 / bc, sc, dtype_size(t.scale.dtype));
    v.scale.cols = sc;
  }
  v.data = copy_grid(t.data, rows, cols, c0, n, es);
  v.shape[1] = n;
  v.nbytes = static_cast<size_t>(rows * n) * es;
  return v;
}

// Fused input-major experts split by their intermediate columns [i0, i0 + n) (tensor-parallel experts): gate_up
// [E, H, 2I] keeps gate columns [i0, i0 + n) and up columns [I + i0, I + i0 + n) of every row; down [E, I, H] keeps
// rows [i0, i0 + n) of every expert. Copies held by `owned`; block-wise FP8 fused experts are refused (their
// scale blocks would need cutting across experts).
Result<io::TensorView> fused_gate_up_cols(const io::TensorView& t, int64_t i0, int64_t n,
                                          std::vector<std::unique_ptr<uint8_t[]>>& owned) {
  if (t.scale.data) return unsupported("block-wise FP8 fused experts ('" + t.name + "') split by columns");
  if (t.shape.size() != 3) return invalid_argument("fused gate_up '" + t.name + "' is not [experts, hidden, 2I]");
  const int64_t E = t.shape[0], H = t.shape[1], I = t.shape[2] / 2;
  if (i0 == 0 && n == I) return t;
  const size_t es = dtype_size(t.dtype);
  owned.push_back(std::make_unique<uint8_t[]>(static_cast<size_t>(E * H * 2 * n) * es));
  uint8_t* dst = owned.back().get();
  const auto* src = static_cast<const uint8_t*>(t.data);
  for (int64_t row = 0; row < E * H; ++row)
    for (int64_t part = 0; part < 2; ++part)
      std::memcpy(dst + static_cast<size_t>((row * 2 + part) * n) * es,
                  src + static_cast<size_t>(row * 2 * I + part * I + i0) * es, static_cast<size_t>(n) * es);
  io::TensorView v = t;
  v.data = dst;
  v.shape = {E, H, 2 * n};
  v.nbytes = static_cast<size_t>(E * H * 2 * n) * es;
  return v;
}

Result<io::TensorView> fused_down_rows(const io::TensorView& t, int64_t i0, int64_t n,
                                       std::vector<std::unique_ptr<uint8_t[]>>& owned) {
  if (t.scale.data) return unsupported("block-wise FP8 fused experts ('" + t.name + "') split by columns");
  if (t.shape.size() != 3) return invalid_argument("fused down '" + t.name + "' is not [experts, I, hidden]");
  const int64_t E = t.shape[0], I = t.shape[1], H = t.shape[2];
  if (i0 == 0 && n == I) return t;
  const size_t es = dtype_size(t.dtype);
  owned.push_back(std::make_unique<uint8_t[]>(static_cast<size_t>(E * n * H) * es));
  uint8_t* dst = owned.back().get();
  const auto* src = static_cast<const uint8_t*>(t.data);
  for (int64_t e = 0; e < E; ++e)
    std::memcpy(dst + static_cast<size_t>(e * n * H) * es, src + static_cast<size_t>((e * I + i0) * H) * es,
                static_cast<size_t>(n * H) * es);
  io::TensorView v = t;
  v.data = dst;
  v.shape = {E, n, H};
  v.nbytes = static_cast<size_t>(E * n * H) * es;
  return v;
}

}  // namespace

Result<ShardWeights> shard_decoder_weights(const DecoderWeights& w, const ParallelPlan& plan, int rank) {
  if (rank < 0 || rank >= static_cast<int>(plan.ranks.size()))
    return invalid_argument("rank " + std::to_string(rank) + " is not in a plan of " +
                            std::to_string(plan.ranks.size()) + " ranks");
  const RankShard& r = plan.ranks[static_cast<size_t>(rank)];
  ShardWeights out;
  DecoderWeights& s = out.weights;
  s = w;
  io::TextConfig& c = s.config;
  const int64_t D = c.head_dim;
  c.num_heads = r.q_heads;
  c.num_kv_heads = r.kv_heads;
  if (c.intermediate_size > 0) c.intermediate_size = r.inter;
  if (c.num_experts > 0 && !plan.expert_parallel) c.moe_intermediate_size = r.expert_inter;
  for (size_t l = 0; l < s.layers.size(); ++l) {
    DecoderLayerWeights& L = s.layers[l];
    const DecoderLayerWeights& src = w.layers[l];
    ZEST_ASSIGN_OR_RETURN(L.q, slice_rows(src.q, r.q_head0 * D, r.q_heads * D));
    ZEST_ASSIGN_OR_RETURN(L.k, slice_rows(src.k, r.kv_head0 * D, r.kv_heads * D));
    ZEST_ASSIGN_OR_RETURN(L.v, slice_rows(src.v, r.kv_head0 * D, r.kv_heads * D));
    ZEST_ASSIGN_OR_RETURN(L.o, slice_cols(src.o, r.q_head0 * D, r.q_heads * D, out.owned));
    if (!src.moe) {  // dense MLP: one entry each
      for (size_t i = 0; i < src.gate.size(); ++i) {
        ZEST_ASSIGN_OR_RETURN(L.gate[i], slice_rows(src.gate[i], r.inter0, r.inter));
        ZEST_ASSIGN_OR_RETURN(L.up[i], slice_rows(src.up[i], r.inter0, r.inter));
        ZEST_ASSIGN_OR_RETURN(L.down[i], slice_cols(src.down[i], r.inter0, r.inter, out.owned));
      }
      continue;
    }
    if (src.fused_gate_up.data && !plan.expert_parallel) {
      ZEST_ASSIGN_OR_RETURN(L.fused_gate_up, fused_gate_up_cols(src.fused_gate_up, r.expert_inter0, r.expert_inter,
                                                                out.owned));
      ZEST_ASSIGN_OR_RETURN(L.fused_down, fused_down_rows(src.fused_down, r.expert_inter0, r.expert_inter, out.owned));
      continue;
    }
    if (src.fused_gate_up.data) {
      ZEST_ASSIGN_OR_RETURN(L.fused_gate_up, slice_rows(src.fused_gate_up, r.expert0, r.experts));
      ZEST_ASSIGN_OR_RETURN(L.fused_down, slice_rows(src.fused_down, r.expert0, r.experts));
      L.fused_expert0 = src.fused_expert0 + r.expert0;
      continue;
    }
    for (size_t e = 0; e < src.gate.size(); ++e) {
      const int64_t ex = static_cast<int64_t>(e);
      if (plan.expert_parallel) {
        if (ex < r.expert0 || ex >= r.expert0 + r.experts)
          for (io::TensorView* t : {&L.gate[e], &L.up[e], &L.down[e]}) t->data = nullptr, t->nbytes = 0;
        continue;
      }
      ZEST_ASSIGN_OR_RETURN(L.gate[e], slice_rows(src.gate[e], r.expert_inter0, r.expert_inter));
      ZEST_ASSIGN_OR_RETURN(L.up[e], slice_rows(src.up[e], r.expert_inter0, r.expert_inter));
      ZEST_ASSIGN_OR_RETURN(L.down[e], slice_cols(src.down[e], r.expert_inter0, r.expert_inter, out.owned));
    }
  }
  return out;
}

// ---- in-process ranks ----

struct LocalGroup::Member final : Communicator {
  LocalGroup* group = nullptr;
  int r = 0;
  int rank() const override { return r; }
  int world() const override { return group->world_; }
  Status all_reduce_sum(float* data, int64_t n) override { return group->all_reduce(r, data, n); }
  Status broadcast(void* data, int64_t bytes, int root) override { return group->broadcast(r, data, bytes, root); }
};

LocalGroup::LocalGroup(int world)
    : world_(world < 1 ? 1 : world), ptrs_(world_), sizes_(world_), barrier_(world_) {
  for (int r = 0; r < world_; ++r) {
    auto m = std::make_unique<Member>();
    m->group = this;
    m->r = r;
    members_.push_back(std::move(m));
  }
}

LocalGroup::~LocalGroup() = default;

Communicator& LocalGroup::member(int rank) { return *members_.at(static_cast<size_t>(rank)); }

bool RankBarrier::meet() {
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) return false;
  const uint64_t gen = generation_;
  if (++arrived_ == world_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return true;
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  return generation_ != gen;
}

void RankBarrier::abort() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = true;
  cv_.notify_all();
}

void RankBarrier::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  aborted_ = false;
  arrived_ = 0;
  ++generation_;
}

namespace {
Status aborted_error() { return internal_error("collective abandoned: another rank of the parallel decoder failed"); }
}  // namespace

Status LocalGroup::all_reduce(int rank, float* data, int64_t n) {
  if (world_ == 1) return Status::ok();
  ptrs_[rank] = data;
  sizes_[rank] = n;
  if (!barrier_.meet()) return aborted_error();  // every rank's buffer is posted
  bool same = true;
  for (int64_t m : sizes_) same = same && m == n;
  std::vector<float> sum;
  if (same) {
    const float* first = static_cast<const float*>(ptrs_[0]);
    sum.assign(first, first + n);
    for (int q = 1; q < world_; ++q) {
      const float* other = static_cast<const float*>(ptrs_[q]);
      for (int64_t i = 0; i < n; ++i) sum[i] += other[i];
    }
  }
  if (!barrier_.meet()) return aborted_error();  // every rank has read every buffer
  if (!same) return internal_error("all-reduce: the ranks passed buffers of different sizes");
  std::memcpy(data, sum.data(), static_cast<size_t>(n) * sizeof(float));
  return Status::ok();
}

Status LocalGroup::broadcast(int rank, void* data, int64_t bytes, int root) {
  if (world_ == 1) return Status::ok();
  ptrs_[rank] = data;
  sizes_[rank] = bytes;
  if (!barrier_.meet()) return aborted_error();  // the root's buffer is posted
  bool same = root >= 0 && root < world_;
  for (int64_t m : sizes_) same = same && m == bytes;
  if (same && rank != root) std::memcpy(data, ptrs_[root], static_cast<size_t>(bytes));
  if (!barrier_.meet()) return aborted_error();  // every rank has copied it
  if (!same) return internal_error("broadcast: the ranks passed different sizes or a root outside the group");
  return Status::ok();
}

// ---- device communicators behind a host gate ----

struct GatedDeviceGroup::Member final : Communicator {
  Communicator* inner = nullptr;
  RankBarrier* gate = nullptr;
  int rank() const override { return inner->rank(); }
  int world() const override { return inner->world(); }
  Status all_reduce_sum(float* data, int64_t n) override { return inner->all_reduce_sum(data, n); }
  Status broadcast(void* data, int64_t bytes, int root) override { return inner->broadcast(data, bytes, root); }
  bool reduces_on_device() const override { return inner->reduces_on_device(); }
  Status all_reduce_sum_device(void* data, int64_t n, bool bf16, void* stream) override {
    if (!gate->meet()) return aborted_error();  // every rank is about to queue this collective
    return inner->all_reduce_sum_device(data, n, bf16, stream);
  }
  Status launch_gate() override {
    if (!gate->meet()) return aborted_error();  // every rank is about to launch its replay
    return inner->launch_gate();
  }
};

GatedDeviceGroup::GatedDeviceGroup(std::unique_ptr<CommunicatorGroup> inner)
    : inner_(std::move(inner)), barrier_(inner_->world()) {
  for (int r = 0; r < inner_->world(); ++r) {
    auto m = std::make_unique<Member>();
    m->inner = &inner_->member(r);
    m->gate = &barrier_;
    members_.push_back(std::move(m));
  }
}

GatedDeviceGroup::~GatedDeviceGroup() = default;

Communicator& GatedDeviceGroup::member(int rank) { return *members_.at(static_cast<size_t>(rank)); }

void GatedDeviceGroup::abort() {
  barrier_.abort();
  inner_->abort();
}

void GatedDeviceGroup::reset() {
  inner_->reset();
  barrier_.reset();
}

void GatedDeviceGroup::abort_device() {
  barrier_.abort();
  inner_->abort_device();
}

}  // namespace zest::model
