#include "server/disagg.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdio>

namespace zest::server {

using nlohmann::json;

const char* role_name(Role r) {
  switch (r) {
    case Role::kBoth: return "both";
    case Role::kPrefill: return "prefill";
    case Role::kDecode: return "decode";
  }
  return "both";
}

Result<Role> parse_role(const std::string& name) {
  for (Role r : {Role::kBoth, Role::kPrefill, Role::kDecode})
    if (name == role_name(r)) return r;
  return invalid_argument("--role must be both, prefill or decode, got '" + name + "'");
}

namespace {

json logprobs_json(const std::vector<engine::TokenLogprob>& v) {
  json out = json::array();
  for (const engine::TokenLogprob& lp : v) {
    json top = json::array();
    for (const auto& [id, p] : lp.top) top.push_back({id, p});
    out.push_back({{"token", lp.token}, {"logprob", lp.logprob}, {"rank", lp.rank}, {"top", std::move(top)}});
  }
  return out;
}

}  // namespace

json RemotePrefill::to_json() const {
  return {{"handle", handle.to_json()},
          {"cuda_ipc", cuda_ipc},
          {"kv",
           {{"tokens", kv.tokens},
            {"layers", kv.layers},
            {"kv_heads", kv.kv_heads},
            {"head_dim", kv.head_dim},
            {"dtype", dtype_name(kv.dtype)}}},
          {"prompt_token_ids", prompt_ids},
          {"rope_delta", rope_delta},
          {"first_tokens", first_tokens},
          {"first_logprobs", logprobs_json(first_logprobs)},
          {"prompt_logprobs", logprobs_json(prompt_logprobs)},
          {"cached_tokens", cached_tokens},
          {"visual_tokens_before", visual_tokens_before},
          {"visual_tokens_after", visual_tokens_after}};
}

namespace {

const std::string kWhere = "kv_transfer_params.";

Status get_int(const json& j, const char* key, int64_t lo, int64_t hi, int64_t& out, const std::string& at = kWhere) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer())
    return invalid_argument(at + key + " must be an integer");
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi)
    return invalid_argument(at + key + " = " + std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]");
  out = v;
  return Status::ok();
}

// One {"token", "logprob", "rank" (optional), "top": [[id, logprob], ...]} entry; `at` names it in errors.
Result<engine::TokenLogprob> logprob_from_json(const json& e, const std::string& at) {
  engine::TokenLogprob lp;
  int64_t tok = 0, rank = 0;
  if (!e.is_object()) return invalid_argument(at + " must be an object");
  ZEST_RETURN_IF_ERROR(get_int(e, "token", 0, INT32_MAX, tok, at));
  lp.token = static_cast<int32_t>(tok);
  if (e.contains("rank")) ZEST_RETURN_IF_ERROR(get_int(e, "rank", 0, INT32_MAX, rank, at));
  lp.rank = static_cast<int32_t>(rank);
  auto p = e.find("logprob");
  if (p == e.end() || !p->is_number()) return invalid_argument(at + "logprob must be a number");
  lp.logprob = p->get<float>();
  auto top = e.find("top");
  if (top == e.end() || !top->is_array() || top->size() > 20)  // OpenAI's (and zest's) top_logprobs limit
    return invalid_argument(at + "top must be an array of at most 20 pairs");
  for (const json& t : *top) {
    if (!t.is_array() || t.size() != 2 || !t[0].is_number_integer() || !t[1].is_number() || t[0].get<int64_t>() < 0 ||
        t[0].get<int64_t>() > INT32_MAX)
      return invalid_argument(at + "top must hold [token id, logprob] pairs");
    lp.top.emplace_back(static_cast<int32_t>(t[0].get<int64_t>()), t[1].get<float>());
  }
  return lp;
}

}  // namespace

Result<RemotePrefill> RemotePrefill::from_json(const json& j) {
  if (!j.is_object()) return invalid_argument("kv_transfer_params must be an object");
  RemotePrefill r;
  auto h = j.find("handle");
  if (h == j.end()) return invalid_argument(kWhere + "handle is missing");
  auto handle = transfer::Handle::from_json(*h);
  if (!handle.ok()) return handle.status().with_context(kWhere + "handle");
  r.handle = std::move(handle).value();
  auto kv = j.find("kv");
  if (kv == j.end() || !kv->is_object()) return invalid_argument(kWhere + "kv must be an object");
  const std::string at = kWhere + "kv.";
  constexpr int64_t kBig = int64_t{1} << 40;
  // Bounds that keep expected_bytes() (2 * layers * tokens * heads * head size * 4 < 2^59) from overflowing before
  // the geometry is compared with the model's.
  ZEST_RETURN_IF_ERROR(get_int(*kv, "tokens", 1, int64_t{1} << 24, r.kv.tokens, at));
  ZEST_RETURN_IF_ERROR(get_int(*kv, "layers", 1, 4096, r.kv.layers, at));
  ZEST_RETURN_IF_ERROR(get_int(*kv, "kv_heads", 1, 1024, r.kv.kv_heads, at));
  ZEST_RETURN_IF_ERROR(get_int(*kv, "head_dim", 1, 1024, r.kv.head_dim, at));
  auto dt = kv->find("dtype");
  if (dt == kv->end() || !dt->is_string()) return invalid_argument(at + "dtype must be a string");
  bool known = false;
  for (DType d : {DType::F32, DType::BF16, DType::F16})
    if (dt->get<std::string>() == dtype_name(d)) r.kv.dtype = d, known = true;
  if (!known) return invalid_argument(at + "dtype '" + dt->get<std::string>() + "' is not F32, BF16 or F16");
  auto ids = j.find("prompt_token_ids");
  if (ids == j.end() || !ids->is_array() || ids->empty())
    return invalid_argument(kWhere + "prompt_token_ids must be a non-empty array of token ids");
  r.prompt_ids.reserve(ids->size());
  for (const json& v : *ids) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      return invalid_argument(kWhere + "prompt_token_ids must hold token ids");
    r.prompt_ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  if (static_cast<int64_t>(r.prompt_ids.size()) != r.kv.tokens)
    return invalid_argument(kWhere + "kv.tokens (" + std::to_string(r.kv.tokens) + ") is not the prompt's " +
                            std::to_string(r.prompt_ids.size()) + " tokens");
  auto ipc = j.find("cuda_ipc");
  if (ipc != j.end() && !ipc->is_string()) return invalid_argument(kWhere + "cuda_ipc must be a string");
  if (ipc != j.end()) r.cuda_ipc = ipc->get<std::string>();
  if (!r.cuda_ipc.empty() && r.handle.bytes != 0)
    return invalid_argument(kWhere + "handle.bytes must be 0 when the K/V comes by cuda_ipc");
  if (r.cuda_ipc.empty() && r.handle.bytes != r.kv.expected_bytes())
    return invalid_argument(kWhere + "handle.bytes (" + std::to_string(r.handle.bytes) + ") is not the " +
                            std::to_string(r.kv.expected_bytes()) + " bytes of the K/V it describes");
  ZEST_RETURN_IF_ERROR(get_int(j, "rope_delta", -kBig, kBig, r.rope_delta));
  auto firsts = j.find("first_tokens");
  if (firsts == j.end() || !firsts->is_array() || firsts->empty() || firsts->size() > 128)
    return invalid_argument(kWhere + "first_tokens must be an array of 1 to 128 token ids");
  for (const json& v : *firsts) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      return invalid_argument(kWhere + "first_tokens must hold token ids");
    r.first_tokens.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  auto lps = j.find("first_logprobs");
  if (lps == j.end() || !lps->is_array() || (!lps->empty() && lps->size() != r.first_tokens.size()))
    return invalid_argument(kWhere + "first_logprobs must be an array with one entry per first token, or empty");
  for (size_t i = 0; i < lps->size(); ++i) {
    ZEST_ASSIGN_OR_RETURN(engine::TokenLogprob lp,
                          logprob_from_json((*lps)[i], kWhere + "first_logprobs[" + std::to_string(i) + "]."));
    if (lp.token != r.first_tokens[i])
      return invalid_argument(kWhere + "first_logprobs[" + std::to_string(i) + "].token is not first_tokens[" +
                              std::to_string(i) + "]");
    r.first_logprobs.push_back(std::move(lp));
  }
  // Optional (older prefill instances do not send it): one entry per prompt token from the second on, or none.
  auto plp = j.find("prompt_logprobs");
  if (plp != j.end()) {
    if (!plp->is_array() || (!plp->empty() && plp->size() + 1 != r.prompt_ids.size()))
      return invalid_argument(kWhere + "prompt_logprobs must be an array with one entry per prompt token after the "
                                       "first, or empty");
    for (size_t i = 0; i < plp->size(); ++i) {
      ZEST_ASSIGN_OR_RETURN(engine::TokenLogprob lp,
                            logprob_from_json((*plp)[i], kWhere + "prompt_logprobs[" + std::to_string(i) + "]."));
      if (lp.token != r.prompt_ids[i + 1])
        return invalid_argument(kWhere + "prompt_logprobs[" + std::to_string(i) + "].token is not prompt token " +
                                std::to_string(i + 1));
      r.prompt_logprobs.push_back(std::move(lp));
    }
  }
  ZEST_RETURN_IF_ERROR(get_int(j, "cached_tokens", 0, r.kv.tokens, r.cached_tokens));
  ZEST_RETURN_IF_ERROR(get_int(j, "visual_tokens_before", 0, kBig, r.visual_tokens_before));
  ZEST_RETURN_IF_ERROR(get_int(j, "visual_tokens_after", 0, kBig, r.visual_tokens_after));
  return r;
}

namespace {

std::string hmac_hex(const std::string& secret, const std::string& text) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(text.data()),
       text.size(), mac, &n);
  static const char* k = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out += k[mac[i] >> 4];
    out += k[mac[i] & 15];
  }
  return out;
}

}  // namespace

json sign_params(json params, const std::string& secret) {
  params.erase("signature");
  params["signature"] = hmac_hex(secret, params.dump());  // keys sorted: one text per value
  return params;
}

Result<json> check_signature(json params, const std::string& secret) {
  if (!params.is_object()) return invalid_argument("kv_transfer_params must be an object");
  auto it = params.find("signature");
  if (it == params.end() || !it->is_string())
    return invalid_argument("kv_transfer_params.signature is missing: only params a prefill instance of this "
                            "deployment returned are accepted");
  const std::string got = it->get<std::string>();
  params.erase(it);
  const std::string want = hmac_hex(secret, params.dump());
  if (got.size() != want.size() || CRYPTO_memcmp(got.data(), want.data(), want.size()) != 0)
    return invalid_argument("kv_transfer_params.signature does not match: the params were changed, or the prefill "
                            "instance runs with another --kv-secret");
  return params;
}

Status check_geometry(const model::KvSnapshot& kv, const io::TextConfig& cfg) {
  if (kv.layers != cfg.num_layers || kv.kv_heads != cfg.num_kv_heads || kv.head_dim != cfg.head_dim)
    return invalid_argument("kv_transfer_params: the prefill instance's K/V (" + std::to_string(kv.layers) +
                            " layers, " + std::to_string(kv.kv_heads) + " kv heads of " + std::to_string(kv.head_dim) +
                            ") is not this model's (" + std::to_string(cfg.num_layers) + " layers, " +
                            std::to_string(cfg.num_kv_heads) + " kv heads of " + std::to_string(cfg.head_dim) +
                            "): the two instances must serve the same model");
  return Status::ok();
}

void transfer_metrics(const transfer::TransferStats& s, std::string& out) {
  auto one = [&](const char* name, const char* type, const char* help, double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.12g", v);
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + buf + "\n";
  };
  one("zest_kv_transfer_offers_total", "counter", "Prompt K/V offered to decode instances (prefill)", s.offered);
  one("zest_kv_transfer_released_total", "counter", "Offers released by their reader (prefill)", s.released);
  one("zest_kv_transfer_expired_total", "counter", "Offers dropped unread after --kv-hold-s (prefill)", s.expired);
  one("zest_kv_transfer_held", "gauge", "Offers waiting for their reader (prefill)", s.held);
  one("zest_kv_transfer_held_bytes", "gauge", "Bytes of the offers waiting for their reader (prefill)", s.held_bytes);
  one("zest_kv_transfer_reads_total", "counter", "Prompt K/V read from prefill instances (decode)", s.reads);
  one("zest_kv_transfer_read_bytes_total", "counter", "Bytes read from prefill instances (decode)", s.read_bytes);
  one("zest_kv_transfer_read_seconds_total", "counter", "Seconds spent reading prompt K/V (decode)", s.read_seconds);
  one("zest_kv_transfer_read_failures_total", "counter", "K/V reads that failed (decode)", s.failed_reads);
}

}  // namespace zest::server
