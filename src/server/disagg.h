// Prefill/decode disaggregation (`zest serve --role prefill|decode`, `zest front`): what a prefill instance hands to
// a decode instance through the front, in the request field `kv_transfer_params` (vLLM's name for it).
//
// The front sends the client's request to a prefill instance with kv_transfer_params {"do_remote_decode": true}. That
// instance runs the vision tower, VisionZip and the prompt's prefill, samples the first token, copies the prompt's
// K/V out of its cache (its blocks are freed at once) and offers the bytes for a remote read (transfer::Offerer, UCX);
// its response carries kv_transfer_params = RemotePrefill::to_json(). The front sends the client's request again to
// a decode instance with those params; the decode instance reads the bytes (transfer::Reader: one-sided gets, then
// a release message), writes them into its own KV blocks and continues generation from the first token, streaming
// to the client. An offer nobody reads is dropped after --kv-hold-s, so a decode instance that dies leaks nothing.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "engine/request.h"
#include "io/config.h"
#include "transfer/kv_transfer.h"

namespace zest::server {

enum class Role { kBoth, kPrefill, kDecode };
// How the K/V moves: UCX reads of a host copy (any two hosts), or CUDA IPC of a device copy (two instances on one
// GPU: no copy through the host).
enum class KvTransfer { kUcx, kCudaIpc };
// "both", "prefill", "decode".
const char* role_name(Role r);
Result<Role> parse_role(const std::string& name);

// The state a decode instance continues from.
struct RemotePrefill {
  transfer::Handle handle;         // where the prompt's K/V bytes are offered (0 bytes with cuda_ipc: the offer only
                                   // keeps the device copy alive until the decode instance releases it)
  std::string cuda_ipc;            // --kv-transfer cuda-ipc: the CUDA IPC handle of the K/V in the prefill's GPU memory
  model::KvSnapshot kv;            // the bytes' geometry (bytes not set)
  std::vector<int32_t> prompt_ids; // the prompt as the prefill instance ran it (images expanded and pruned)
  int64_t rope_delta = 0;          // decode position = tokens in cache + rope_delta
  std::vector<int32_t> first_tokens;  // per choice (n), sampled by the prefill instance
  std::vector<engine::TokenLogprob> first_logprobs;  // per choice when the request asks for logprobs, else empty
  // When the request asks for prompt_logprobs: one per prompt token from the second on (computed by the prefill),
  // else empty.
  std::vector<engine::TokenLogprob> prompt_logprobs;
  int64_t cached_tokens = 0, visual_tokens_before = 0, visual_tokens_after = 0;  // for usage

  nlohmann::json to_json() const;
  // kInvalidArgument naming the field (as "kv_transfer_params.<field>") for anything missing or ill-typed.
  static Result<RemotePrefill> from_json(const nlohmann::json& j);
};

// The params are signed by the prefill instance (HMAC-SHA256 with the deployment's --kv-secret, in the field
// "signature") and checked by the decode instance before anything in them is used: the handle names a UCX worker
// address and a remote buffer, which a client must not be able to forge.
nlohmann::json sign_params(nlohmann::json params, const std::string& secret);
// kInvalidArgument when the signature is missing or does not match; the params without it otherwise.
Result<nlohmann::json> check_signature(nlohmann::json params, const std::string& secret);

// Whether the K/V geometry of a remote prefill fits this model's decoder (same layers, kv heads and head size);
// kInvalidArgument saying what differs (the prefill instance serves another model).
Status check_geometry(const model::KvSnapshot& kv, const io::TextConfig& cfg);

// The transfer agent's counters as Prometheus text (a MetricsProvider's body): offers made, released by their reader,
// expired unread, held now (and their bytes); reads done, their bytes and seconds, reads that failed.
void transfer_metrics(const transfer::TransferStats& s, std::string& out);

}  // namespace zest::server
