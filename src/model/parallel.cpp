#include "model/parallel.h"

#include <string>

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

}  // namespace zest::model
