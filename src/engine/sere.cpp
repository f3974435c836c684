#include "engine/sere.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/timer.h"
#include "io/safetensors.h"
#include "kernels/sere_calibration.h"

namespace zest::engine {

std::string sere_config_hash(const io::ModelConfig& cfg) {
  const auto& t = cfg.text;
  std::ostringstream s;
  s << io::arch_name(cfg.arch) << '|' << t.num_layers << '|' << t.hidden_size << '|' << t.num_experts << '|'
    << t.num_experts_per_tok << '|' << t.moe_intermediate_size << '|' << t.vocab_size;
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  for (unsigned char c : s.str()) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

Result<std::unique_ptr<SereRuntime>> SereRuntime::create(const ModelBundle& model, const SereOptions& opts) {
  const auto& tc = model.config.text;
  if (!model.config.is_moe()) return invalid_argument("SERE needs an MoE model; this model is dense");
  auto rt = std::unique_ptr<SereRuntime>(new SereRuntime());
  rt->opts_ = opts;
  rt->experts_ = tc.num_experts;
  rt->decoder_ = &model.decoder();
  auto base = rt->decoder_->reroute_counts();
  if (!base.ok()) return base.status().with_context("SERE device counters");
  rt->device_base_ = std::move(base).value();
  rt->stats_.resize(tc.num_layers);
  rt->spec_.similarity.resize(tc.num_layers);
  rt->spec_.primary = opts.primary;
  if (!opts.layer_thresholds.empty() && static_cast<int64_t>(opts.layer_thresholds.size()) != tc.num_layers)
    return invalid_argument("per-layer SERE thresholds: expected " + std::to_string(tc.num_layers) + " values");
  if (opts.enabled() && opts.primary < tc.num_experts_per_tok) {
    const std::string file =
        opts.similarity_file.empty() ? model.dir + "/sere_similarity.safetensors" : opts.similarity_file;
    auto st = io::SafeTensors::open_file(file);
    if (!st.ok())
      return st.status().with_context("SERE similarity '" + file + "' (make it with: zest calibrate-sere --model " +
                                      model.dir + ")");
    const auto& meta = st->metadata();
    auto it = meta.find("config_hash");
    if (it != meta.end() && it->second != sere_config_hash(model.config))
      return invalid_argument("SERE similarity '" + file + "' was calibrated for another model (config hash " +
                              it->second + ", this model " + sere_config_hash(model.config) + ")");
    for (int64_t l = 0; l < tc.num_layers; ++l) {
      if (!tc.is_moe_layer(l)) continue;
      auto v = st->get("layers." + std::to_string(l) + ".similarity", {tc.num_experts, tc.num_experts});
      if (!v.ok()) return v.status().with_context("SERE similarity '" + file + "'");
      Tensor t = v->to_f32();
      rt->spec_.similarity[l].assign(t.data<float>(), t.data<float>() + t.numel());
    }
  }
  rt->spec_.thresholds = opts.layer_thresholds.empty() ? std::vector<float>(tc.num_layers, opts.threshold)
                                                        : opts.layer_thresholds;
  SereRuntime* self = rt.get();
  rt->hooks_.route = [self](int64_t layer, int32_t* ids, float* w, int64_t n, int64_t k,
                            const std::vector<uint8_t>& active) {
    if (self->spec_.similarity[layer].empty()) return;
    accel::RerouteParams p;
    p.primary = self->spec_.primary;
    p.threshold = self->spec_.thresholds[layer];
    auto r = accel::sere_reroute({ids, static_cast<size_t>(n * k)}, {w, static_cast<size_t>(n * k)}, n, k,
                                 {active.data(), active.size()}, self->spec_.similarity[layer], self->experts_, p);
    if (!r.ok()) return;
    std::lock_guard<std::mutex> lock(self->stats_mu_);
    SereLayerStats& s = self->stats_[layer];
    int64_t valid = 0;
    for (uint8_t a : active) valid += a;
    ++s.steps;
    s.distinct_before += r->distinct_before;
    s.distinct_after += r->distinct_after;
    s.critical += r->critical_experts;
    s.rerouted_slots += r->rerouted_slots;
    s.slots += static_cast<double>(valid * k);
  };
  rt->hooks_.reroute = &rt->spec_;
  return rt;
}

const model::MoeHooks* SereRuntime::hooks(bool decode_only) const {
  if (!opts_.enabled()) return nullptr;
  if (!decode_only && !opts_.prefill) return nullptr;
  return &hooks_;
}

std::vector<SereLayerStats> SereRuntime::layer_stats() const {
  std::vector<SereLayerStats> out;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    out = stats_;
  }
  auto dev = decoder_->reroute_counts();
  if (!dev.ok()) return out;
  for (size_t l = 0; l < out.size() && l < dev->size() && l < device_base_.size(); ++l) {
    const model::RerouteCounts& c = (*dev)[l];
    const model::RerouteCounts& z = device_base_[l];
    SereLayerStats& s = out[l];
    s.steps += c.steps - z.steps;
    s.distinct_before += static_cast<double>(c.distinct_before - z.distinct_before);
    s.distinct_after += static_cast<double>(c.distinct_after - z.distinct_after);
    s.critical += static_cast<double>(c.critical - z.critical);
    s.rerouted_slots += static_cast<double>(c.rerouted_slots - z.rerouted_slots);
    s.slots += static_cast<double>(c.slots - z.slots);
  }
  return out;
}

nlohmann::json SereRuntime::stats_json() const {
  nlohmann::json before = nlohmann::json::array(), after = nlohmann::json::array(), crit = nlohmann::json::array(),
                 share = nlohmann::json::array();
  int64_t steps = 0;
  const std::vector<SereLayerStats> all = layer_stats();
  for (size_t l = 0; l < all.size(); ++l) {
    const SereLayerStats& s = all[l];
    if (spec_.similarity[l].empty()) continue;
    const double n = std::max<int64_t>(s.steps, 1);
    before.push_back(s.distinct_before / n);
    after.push_back(s.distinct_after / n);
    crit.push_back(s.critical / n);
    share.push_back(s.slots > 0 ? s.rerouted_slots / s.slots : 0.0);
    steps = std::max(steps, s.steps);
  }
  return {{"primary", opts_.primary},
          {"threshold", opts_.threshold},
          {"steps", steps},
          {"experts_per_layer_before", before},
          {"experts_per_layer_after", after},
          {"critical_per_layer", crit},
          {"rerouted_share_per_layer", share}};
}

Result<std::string> calibrate_sere(const ModelBundle& model, const CalibrationOptions& opts) {
  const auto& tc = model.config.text;
  if (!model.config.is_moe()) return invalid_argument("calibrate-sere needs an MoE model; this model is dense");
  if (opts.text_files.empty()) return invalid_argument("give at least one calibration text file (--text)");
  std::vector<int32_t> tokens;
  for (const std::string& f : opts.text_files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return not_found("cannot open calibration text '" + f + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    const auto ids = model.tokenizer.encode(ss.str(), /*parse_special=*/false);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    if (static_cast<int64_t>(tokens.size()) >= opts.max_tokens) break;
  }
  if (static_cast<int64_t>(tokens.size()) > opts.max_tokens) tokens.resize(opts.max_tokens);
  if (tokens.size() < 2) return invalid_argument("the calibration text is too short (need at least 2 tokens)");

  const int64_t E = tc.num_experts, H = tc.hidden_size, L = tc.num_layers;
  // On a device backend (except for linear CKA, whose state lives on the host) the model runs on the device
  // and every expert of a layer runs there too, reduced to an [E, E] pair statistic per chunk. Otherwise
  // calibration runs every expert on the CPU decoder (a bundle loaded for another backend gets one here).
  const bool on_device = model.backend != model::Backend::kCpu && opts.metric != accel::SimilarityMetric::kLinearCka;
  std::unique_ptr<kernels::ExpertGram> gram;
  model::Qwen3TextModel cpu_model;
  if (on_device) {
    auto g = kernels::make_cuda_expert_gram(E, H, tc.moe_intermediate_size, opts.chunk_tokens);
    if (!g.ok()) return g.status().with_context("device SERE calibration");
    gram = std::move(g).value();
  } else if (model.backend != model::Backend::kCpu) {
    auto m = model::Qwen3TextModel::load(model.weights, model.config);
    if (!m.ok()) return m.status().with_context("CPU decoder for calibration");
    cpu_model = std::move(m).value();
  }
  const model::Qwen3TextModel& text = model.backend == model::Backend::kCpu ? model.text : cpu_model;
  const model::TextDecoder& dec = on_device ? model.decoder() : static_cast<const model::TextDecoder&>(text);
  std::vector<std::optional<accel::ExpertSimilarityAccumulator>> acc(L);
  std::vector<model::DeviceExpertWeights> dev_w(L);
  for (int64_t l = 0; l < L; ++l) {
    if (on_device) {
      auto w = dec.device_expert_weights(l);
      if (!w.ok()) continue;  // not an MoE layer
      dev_w[l] = *w;
    } else if (!text.is_moe_layer(l)) {
      continue;
    }
    auto a = accel::ExpertSimilarityAccumulator::create(E, H, opts.metric);
    if (!a.ok()) return a.status().with_context("layer " + std::to_string(l));
    acc[l] = std::move(a).value();
  }
  Status hook_status;
  model::MoeHooks hooks;
  std::vector<float> outs;
  std::vector<double> pair;
  const bool cosine = opts.metric == accel::SimilarityMetric::kCosine;
  hooks.moe_input = [&](int64_t layer, const float* x, int64_t n) {
    if (!acc[layer] || !hook_status.is_ok()) return;
    Status s;
    if (on_device) {
      s = gram->compute(dev_w[layer], x, n, cosine, pair);
      if (s.is_ok()) s = acc[layer]->add_gram(pair, n);
    } else {
      outs.resize(static_cast<size_t>(E * n * H));
      for (int64_t e = 0; e < E; ++e) text.run_expert(layer, e, x, n, outs.data() + e * n * H);
      s = acc[layer]->add_chunk(outs, n);
    }
    if (!s.is_ok()) hook_status = s.with_context("layer " + std::to_string(layer));
  };

  // The calibration text is one long sequence, fed in chunks (so attention sees real context).
  const int64_t n = static_cast<int64_t>(tokens.size());
  auto cache_r = dec.allocate_cache((n + 15) / 16, 16);
  if (!cache_r.ok()) return cache_r.status().with_context("KV cache for calibration");
  model::PagedKVCache cache = std::move(cache_r).value();
  std::vector<int32_t> table;
  ZEST_RETURN_IF_ERROR(cache.reserve(table, n));
  const double t0 = now_ms();
  for (int64_t start = 0; start < n; start += opts.chunk_tokens) {
    const int64_t len = std::min(opts.chunk_tokens, n - start);
    model::ForwardBatch b;
    b.tokens.assign(tokens.begin() + start, tokens.begin() + start + len);
    b.positions.resize(3 * len);
    for (int a = 0; a < 3; ++a)
      for (int64_t i = 0; i < len; ++i) b.positions[a * len + i] = static_cast<int32_t>(start + i);
    b.seqs.push_back({&table, start, len, false, false});
    auto r = dec.forward(b, cache, &hooks);
    if (!r.ok()) return r.status();
    ZEST_RETURN_IF_ERROR(hook_status);
    if (opts.progress) {
      const double frac = static_cast<double>(start + len) / n;
      const int bar = static_cast<int>(frac * 30);
      std::fprintf(stderr, "\rcalibrating [%s%s] %lld/%lld tokens %.1fs", std::string(bar, '#').c_str(),
                   std::string(30 - bar, '.').c_str(), static_cast<long long>(start + len),
                   static_cast<long long>(n), (now_ms() - t0) / 1000.0);
    }
  }
  if (opts.progress) std::fprintf(stderr, "\n");

  std::vector<std::pair<std::string, Tensor>> out;
  for (int64_t l = 0; l < L; ++l) {
    if (!acc[l]) continue;
    auto s = acc[l]->similarity();
    if (!s.ok()) return s.status().with_context("layer " + std::to_string(l));
    out.emplace_back("layers." + std::to_string(l) + ".similarity", Tensor::from_vector({E, E}, *s));
  }
  static const char* kMetric[] = {"frobenius", "cosine", "cka"};
  const std::string file = opts.out_file.empty() ? model.dir + "/sere_similarity.safetensors" : opts.out_file;
  ZEST_RETURN_IF_ERROR(io::write_safetensors(file, out,
                                             {{"metric", kMetric[static_cast<int>(opts.metric)]},
                                              {"tokens", std::to_string(n)},
                                              {"config_hash", sere_config_hash(model.config)}}));
  return file;
}

}  // namespace zest::engine
