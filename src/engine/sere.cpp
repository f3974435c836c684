#include "engine/sere.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/timer.h"
#include "engine/chat_request.h"
#include "io/safetensors.h"
#include "kernels/sere_calibration.h"
#include "model/architecture.h"

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
  ZEST_RETURN_IF_ERROR(opts.params.validate(tc.num_layers));
  rt->spec_.similarity.resize(tc.num_layers);
  rt->spec_.params = opts.params;
  if (opts.params.enabled(tc.num_experts_per_tok)) {
    ZEST_ASSIGN_OR_RETURN(rt->spec_.similarity, load_sere_similarity(model, opts.similarity_file));
  }
  auto& rho = rt->spec_.params.layer_thresholds;  // resolved: one per layer
  if (rho.empty()) rho.assign(static_cast<size_t>(tc.num_layers), opts.params.threshold);
  // Protection is applied to the data both the host hook and the device kernel read (accel::protect_experts).
  if (!opts.protected_file.empty()) {
    ZEST_ASSIGN_OR_RETURN(const auto prot, load_protected_experts(opts.protected_file, model));
    for (int64_t l = 0; l < tc.num_layers; ++l) {
      if (rt->spec_.similarity[l].empty()) continue;
      ZEST_RETURN_IF_ERROR(accel::protect_experts(rt->spec_.similarity[l], tc.num_experts, prot[l], rho[l])
                               .with_context("SERE protected experts '" + opts.protected_file + "', layer " +
                                             std::to_string(l)));
    }
  }
  SereRuntime* self = rt.get();
  rt->hooks_.route = [self](int64_t layer, int32_t* ids, float* w, int64_t n, int64_t k,
                            const std::vector<uint8_t>& active) {
    if (self->spec_.similarity[layer].empty()) return;
    const accel::SereParams& p = self->spec_.params;
    auto r = accel::sere_reroute({ids, static_cast<size_t>(n * k)}, {w, static_cast<size_t>(n * k)}, n, k,
                                 {active.data(), active.size()}, self->spec_.similarity[layer], self->experts_,
                                 p.primary, p.rho(layer));
    if (!r.ok()) return;
    std::lock_guard<std::mutex> lock(self->stats_mu_);
    self->stats_[layer] += *r;
  };
  rt->hooks_.reroute = &rt->spec_;
  return rt;
}

const model::MoeHooks* SereRuntime::hooks(bool decode_only) const {
  if (opts_.params.primary <= 0) return nullptr;
  if (!decode_only && !opts_.prefill) return nullptr;
  return &hooks_;
}

std::vector<accel::RerouteCounts> SereRuntime::layer_stats() const {
  std::vector<accel::RerouteCounts> out;
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    out = stats_;
  }
  auto dev = decoder_->reroute_counts();
  if (!dev.ok()) return out;
  for (size_t l = 0; l < out.size() && l < dev->size() && l < device_base_.size(); ++l)
    out[l] += (*dev)[l] - device_base_[l];
  return out;
}

nlohmann::json SereRuntime::stats_json() const {
  nlohmann::json before = nlohmann::json::array(), after = nlohmann::json::array(), crit = nlohmann::json::array(),
                 share = nlohmann::json::array();
  int64_t steps = 0;
  const std::vector<accel::RerouteCounts> all = layer_stats();
  for (size_t l = 0; l < all.size(); ++l) {
    const accel::RerouteCounts& s = all[l];
    if (spec_.similarity[l].empty()) continue;
    const double n = static_cast<double>(std::max<int64_t>(s.steps, 1));
    before.push_back(static_cast<double>(s.distinct_before) / n);
    after.push_back(static_cast<double>(s.distinct_after) / n);
    crit.push_back(static_cast<double>(s.critical) / n);
    share.push_back(s.slots > 0 ? static_cast<double>(s.rerouted_slots) / static_cast<double>(s.slots) : 0.0);
    steps = std::max(steps, s.steps);
  }
  return {{"primary", opts_.params.primary},
          {"threshold", opts_.params.threshold},
          {"steps", steps},
          {"experts_per_layer_before", before},
          {"experts_per_layer_after", after},
          {"critical_per_layer", crit},
          {"rerouted_share_per_layer", share}};
}

Result<std::vector<std::vector<float>>> load_sere_similarity(const ModelBundle& model, const std::string& file_opt) {
  const auto& tc = model.config.text;
  const std::string file = file_opt.empty() ? model.dir + "/sere_similarity.safetensors" : file_opt;
  auto st = io::SafeTensors::open_file(file);
  if (!st.ok())
    return st.status().with_context("SERE similarity '" + file + "' (make it with: zest calibrate-sere --model " +
                                    model.dir + ")");
  const auto& meta = st->metadata();
  auto it = meta.find("config_hash");
  if (it != meta.end() && it->second != sere_config_hash(model.config))
    return invalid_argument("SERE similarity '" + file + "' was calibrated for another model (config hash " +
                            it->second + ", this model " + sere_config_hash(model.config) + ")");
  std::vector<std::vector<float>> sim(tc.num_layers);
  for (int64_t l = 0; l < tc.num_layers; ++l) {
    if (!tc.is_moe_layer(l)) continue;
    auto v = st->get("layers." + std::to_string(l) + ".similarity", {tc.num_experts, tc.num_experts});
    if (!v.ok()) return v.status().with_context("SERE similarity '" + file + "'");
    Tensor t = v->to_f32();
    sim[l].assign(t.data<float>(), t.data<float>() + t.numel());
  }
  return sim;
}

namespace {

// Runs one prompt as a single sequence and returns the logits of every position [n, vocab].
Result<Tensor> prompt_logits(const model::TextDecoder& dec, model::PagedKVCache& cache, const Prompt& p,
                             const model::MoeHooks* hooks) {
  const int64_t n = static_cast<int64_t>(p.ids.size());
  std::vector<int32_t> table;
  ZEST_RETURN_IF_ERROR(cache.reserve(table, n));
  model::ForwardBatch b;
  b.tokens = p.ids;
  b.positions = p.positions;
  b.seqs.push_back({&table, 0, n, /*all_logits=*/true, /*reroute=*/true});
  attach_visual_rows(p, b);
  auto r = dec.forward(b, cache, hooks);
  cache.release(table);
  return r;
}

// log(sum_j exp(row[j])) in f64.
double log_sum_exp(const float* row, int64_t v) {
  const float mx = *std::max_element(row, row + v);
  double sum = 0;
  for (int64_t j = 0; j < v; ++j) sum += std::exp(static_cast<double>(row[j] - mx));
  return mx + std::log(sum);
}

// A teacher's next-token distributions: probabilities p [n, vocab] and per row sum_j p_j log p_j.
struct Teacher {
  std::vector<float> p;
  std::vector<double> neg_entropy;
};

Teacher make_teacher(const Tensor& logits) {
  const int64_t n = logits.dim(0), v = logits.dim(1);
  Teacher t;
  t.p.resize(static_cast<size_t>(n * v));
  t.neg_entropy.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits.data<float>() + i * v;
    const double lse = log_sum_exp(row, v);
    double h = 0;
    for (int64_t j = 0; j < v; ++j) {
      const double lp = row[j] - lse;
      t.p[i * v + j] = static_cast<float>(std::exp(lp));
      h += std::exp(lp) * lp;
    }
    t.neg_entropy[i] = h;
  }
  return t;
}

// Sum over rows of KL(teacher || softmax(student)) = sum_j p_j log p_j - sum_j p_j s_j + lse(s) sum_j p_j.
double kl_sum(const Teacher& teacher, const Tensor& student) {
  const int64_t n = student.dim(0), v = student.dim(1);
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float* s = student.data<float>() + i * v;
    const float* p = teacher.p.data() + i * v;
    double dot = 0, mass = 0;
    for (int64_t j = 0; j < v; ++j) {
      dot += static_cast<double>(p[j]) * s[j];
      mass += p[j];
    }
    kl += teacher.neg_entropy[i] - dot + log_sum_exp(s, v) * mass;
  }
  return kl;
}

}  // namespace

Result<ProtectedExperts> rank_protected_experts(const ModelBundle& model, const std::vector<Prompt>& prompts,
                                                const ProtectOptions& opts) {
  const auto& tc = model.config.text;
  if (!model.config.is_moe()) return invalid_argument("sere-protect needs an MoE model; this model is dense");
  if (prompts.empty()) return invalid_argument("sere-protect: no calibration prompts");
  if (opts.per_layer < 0) return invalid_argument("sere-protect: --per-layer must be >= 0");
  ZEST_ASSIGN_OR_RETURN(const auto sim, load_sere_similarity(model, opts.similarity_file));
  const int64_t L = tc.num_layers, E = tc.num_experts;
  const model::TextDecoder& dec = model.decoder();
  int64_t longest = 0;
  ProtectedExperts out;
  for (const Prompt& p : prompts) {
    longest = std::max<int64_t>(longest, static_cast<int64_t>(p.ids.size()));
    out.tokens += static_cast<int64_t>(p.ids.size());
  }
  ZEST_ASSIGN_OR_RETURN(model::PagedKVCache cache, dec.allocate_cache((longest + 15) / 16, 16));

  // Teacher: unmodified routing; counts each expert's secondary-slot occurrences per layer.
  std::vector<std::vector<int64_t>> routed(L, std::vector<int64_t>(E, 0));
  model::MoeHooks count;
  count.route = [&](int64_t layer, int32_t* ids, float*, int64_t n, int64_t k, const std::vector<uint8_t>&) {
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 1; j < k; ++j)
        if (ids[t * k + j] >= 0 && ids[t * k + j] < E) ++routed[layer][ids[t * k + j]];
  };
  std::vector<Teacher> teacher;
  for (const Prompt& p : prompts) {
    ZEST_ASSIGN_OR_RETURN(Tensor logits, prompt_logits(dec, cache, p, &count));
    teacher.push_back(make_teacher(logits));
  }

  int64_t total = 0, done = 0;
  for (int64_t l = 0; l < L; ++l)
    if (!sim[l].empty()) total += std::count_if(routed[l].begin(), routed[l].end(), [](int64_t c) { return c > 0; });
  const double t0 = now_ms();
  out.kl.resize(L);
  out.experts.resize(L);
  for (int64_t l = 0; l < L; ++l) {
    if (sim[l].empty()) continue;
    out.kl[l].assign(E, 0.0);
    for (int32_t e = 0; e < E; ++e) {
      if (routed[l][e] == 0) continue;
      const float* row = sim[l].data() + static_cast<int64_t>(e) * E;
      int32_t sub = e == 0 ? 1 : 0;
      for (int32_t v = 0; v < E; ++v)
        if (v != e && row[v] > row[sub]) sub = v;
      model::MoeHooks force;
      force.route = [&](int64_t layer, int32_t* ids, float* w, int64_t n, int64_t k, const std::vector<uint8_t>&) {
        if (layer == l)
          accel::substitute_expert({ids, static_cast<size_t>(n * k)}, {w, static_cast<size_t>(n * k)}, n, k, E, e, sub,
                                   /*first_slot=*/1);
      };
      double kl = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        ZEST_ASSIGN_OR_RETURN(Tensor logits, prompt_logits(dec, cache, prompts[i], &force));
        kl += kl_sum(teacher[i], logits);
      }
      out.kl[l][e] = kl / static_cast<double>(out.tokens);
      if (opts.progress)
        std::fprintf(stderr, "\rranking experts: %lld/%lld (layer %lld) %.1fs", static_cast<long long>(++done),
                     static_cast<long long>(total), static_cast<long long>(l), (now_ms() - t0) / 1000.0);
    }
    std::vector<int32_t> order;
    for (int32_t e = 0; e < E; ++e)
      if (out.kl[l][e] > 0) order.push_back(e);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return out.kl[l][a] > out.kl[l][b]; });
    if (static_cast<int64_t>(order.size()) > opts.per_layer) order.resize(opts.per_layer);
    out.experts[l] = std::move(order);
  }
  if (opts.progress && total > 0) std::fprintf(stderr, "\n");
  return out;
}

Status write_protected_experts(const std::string& file, const ModelBundle& model, const ProtectedExperts& p) {
  nlohmann::json j = {{"format", "zest-sere-protected/1"},
                      {"config_hash", sere_config_hash(model.config)},
                      {"tokens", p.tokens},
                      {"protected", p.experts},
                      {"kl", p.kl}};
  std::ofstream f(file);
  if (!f) return not_found("cannot write '" + file + "'");
  f << j.dump(1) << "\n";
  return f ? Status::ok() : internal_error("writing '" + file + "' failed");
}

Result<std::vector<std::vector<int32_t>>> load_protected_experts(const std::string& file, const ModelBundle& model) {
  const auto& tc = model.config.text;
  std::ifstream f(file);
  if (!f) return not_found("cannot open SERE protected experts '" + file + "' (make it with: zest sere-protect)");
  std::stringstream ss;
  ss << f.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  const std::string what = "SERE protected experts '" + file + "'";
  if (j.is_discarded() || !j.is_object()) return invalid_argument(what + " is not a JSON object");
  if (j.contains("config_hash") && j["config_hash"] != sere_config_hash(model.config))
    return invalid_argument(what + " was made for another model (config hash " + j["config_hash"].dump() +
                            ", this model " + sere_config_hash(model.config) + ")");
  if (!j.contains("protected") || !j["protected"].is_array() ||
      static_cast<int64_t>(j["protected"].size()) != tc.num_layers)
    return invalid_argument(what + ": 'protected' must be a list of " + std::to_string(tc.num_layers) +
                            " lists (one per layer)");
  std::vector<std::vector<int32_t>> out(tc.num_layers);
  for (int64_t l = 0; l < tc.num_layers; ++l) {
    const nlohmann::json& ids = j["protected"][l];
    if (!ids.is_array()) return invalid_argument(what + ": layer " + std::to_string(l) + " is not a list");
    for (const nlohmann::json& e : ids) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= tc.num_experts)
        return invalid_argument(what + ": layer " + std::to_string(l) + " holds " + e.dump() +
                                ", not an expert id in [0, " + std::to_string(tc.num_experts) + ")");
      out[l].push_back(e.get<int32_t>());
    }
  }
  return out;
}

Result<std::vector<int32_t>> calibration_tokens(const ModelBundle& model, const std::vector<std::string>& files,
                                                int64_t max_tokens) {
  std::vector<int32_t> tokens;
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return not_found("cannot open calibration text '" + f + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    const auto ids = model.tokenizer.encode(ss.str(), /*parse_special=*/false);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    if (static_cast<int64_t>(tokens.size()) >= max_tokens) break;
  }
  if (static_cast<int64_t>(tokens.size()) > max_tokens) tokens.resize(static_cast<size_t>(max_tokens));
  return tokens;
}

Result<std::string> calibrate_sere(const ModelBundle& model, const CalibrationOptions& opts) {
  const auto& tc = model.config.text;
  if (!model.config.is_moe()) return invalid_argument("calibrate-sere needs an MoE model; this model is dense");
  if (opts.text_files.empty()) return invalid_argument("give at least one calibration text file (--text)");
  ZEST_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, calibration_tokens(model, opts.text_files, opts.max_tokens));
  if (tokens.size() < 2) return invalid_argument("the calibration text is too short (need at least 2 tokens)");

  const int64_t E = tc.num_experts, H = tc.hidden_size, L = tc.num_layers;
  // On a device backend (except for linear CKA, whose state lives on the host) the model runs on the device
  // and every expert of a layer runs there too, reduced to an [E, E] pair statistic per chunk. Otherwise
  // calibration runs every expert on the CPU decoder (a bundle loaded for another backend gets one here).
  const bool on_device = model.backend != model::Backend::kCpu && opts.metric != accel::SimilarityMetric::kLinearCka;
  std::unique_ptr<kernels::ExpertGram> gram;
  std::unique_ptr<model::TextDecoder> cpu_model;
  if (on_device) {
    auto g = kernels::make_cuda_expert_gram(E, H, tc.moe_intermediate_size, opts.chunk_tokens);
    if (!g.ok()) return g.status().with_context("device SERE calibration");
    gram = std::move(g).value();
  } else if (model.backend != model::Backend::kCpu) {
    auto m = model::architecture(model.config.arch).cpu_decoder(model.weights, model.config);
    if (!m.ok()) return m.status().with_context("CPU decoder for calibration");
    cpu_model = std::move(m).value();
  }
  const model::TextDecoder& text = cpu_model ? *cpu_model : model.decoder();
  const model::TextDecoder& dec = on_device ? model.decoder() : text;
  std::vector<std::optional<accel::ExpertSimilarityAccumulator>> acc(L);
  std::vector<kernels::DeviceExpertWeights> dev_w(L);
  for (int64_t l = 0; l < L; ++l) {
    if (on_device) {
      auto w = dec.device_expert_weights(l);
      if (!w.ok() && w.status().code() == ErrorCode::kUnsupported)
        return w.status().with_context("device SERE calibration");
      if (!w.ok()) continue;  // not an MoE layer
      dev_w[l] = {w->gate_up, w->down, w->experts, w->hidden, w->inter};
    } else if (!tc.is_moe_layer(l)) {
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
      for (int64_t e = 0; e < E && s.is_ok(); ++e) s = text.run_expert(layer, e, x, n, outs.data() + e * n * H);
      if (s.is_ok()) s = acc[layer]->add_chunk(outs, n);
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
