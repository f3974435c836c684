// OpenAI chat-completions request bodies: validation, sampling parameters, and the prompt the decoder
// runs (chat template, tokens, images through the vision tower, M-RoPE positions).
//
// A prompt is built in two stages so that a server can refuse a request before spending work on it:
// plan_prompt reads the image bytes and their headers, renders and tokenizes the template and computes
// the prompt length from the image sizes (no pixel decoded); finish_prompt decodes and encodes the images.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "engine/model_bundle.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/structured_output.h"
#include "vision/preprocess.h"

namespace zest::engine {

// Bounds on a request's shape, checked by parse_chat_request.
struct RequestLimits {
  int64_t max_messages = 1024;
  int64_t max_parts = 4096;  // content parts over all messages
};

struct PromptOptions {
  bool allow_local_files = true;  // file:// URLs and plain paths (CLI yes; server only when enabled)
  int64_t max_images = 64;
  int64_t max_image_pixels = 64LL * 1000 * 1000;  // width * height of one image, from its header
  int64_t max_request_pixels = 0;                 // width * height summed over the images; 0 = no limit
  std::string base_dir;           // relative image paths resolve against this (empty = cwd)
  // Polled between images and before the vision tower: true stops the work (kResourceExhausted). Empty = never.
  std::function<bool()> cancelled;
};

// The most choices (`n`) one request may ask for.
constexpr int64_t kMaxChoices = 128;

// The sampling parameters of choice `index` of a request with n choices: choice i draws from seed + i when a seed
// is given (wrapping), from its own random seed otherwise.
SamplingParams choice_sampling(const SamplingParams& sp, int64_t index);

// The fields chat and text completions share: every one zest reads, type-checked.
struct GenerationFields {
  SamplingParams sampling;
  int64_t n = 1;                  // choices, each an engine request of its own (its own prefill)
  bool max_tokens_given = false;  // max_tokens / max_completion_tokens came with the request
  bool stream = false;
  bool include_usage = false;
  bool sere = true;
  bool return_tokens_as_token_ids = false;  // vLLM's: logprob tokens written as "token_id:N"
};

// Parses the shared fields (sampling parameters with the model's generation_config defaults, logits processing, n,
// stop, stream options, the refusal of unimplemented fields); logprobs, whose type differs between the two APIs, is
// the caller's. `structured`: the caller reads response_format, guided_json and guided_choice itself (chat), else
// they are refused unless they ask for plain text.
Status parse_generation_fields(const nlohmann::json& body, const ModelBundle& model, GenerationFields& out,
                               bool structured = false);

// A parsed chat request.
struct ChatRequest : GenerationFields {
  nlohmann::json messages;  // validated: roles, content strings or parts, tool calls
  accel::VisionPruneOptions vision_prune;  // the model's VisionZip options with the request's "vision_prune" applied
  vision::PixelBudget pixels;  // "mm_processor_kwargs" min_pixels / max_pixels (bounded by parse_chat_request's ceiling)
  bool enable_thinking = true;
  bool add_vision_id = false;
  // Function tools, validated, rendered by the chat template (null: none). The server replaces them (and the
  // messages, through template_messages) with the body's own key order (use_client_key_order), as transformers'
  // tojson keeps it.
  nlohmann::ordered_json tools;
  nlohmann::ordered_json template_messages;  // the messages in the client's key order, or null (then `messages`)
  std::string tool_choice = "auto";          // "auto", "none", "required" or "function" (named: tool_choice_name)
  std::string tool_choice_name;
  bool parallel_tool_calls = true;
  // Whether the output is parsed for tool calls: tools were given and tool_choice is not "none" (with "none" the
  // tools are still rendered, as vLLM does by default, and the output is plain content).
  bool parse_tool_calls() const { return !tools.is_null() && tool_choice != "none"; }
  // Structured output: response_format json_object / json_schema, guided_json, guided_choice, or the tool call a
  // "required" / named tool_choice forces (engine/structured_output.h). parse_chat_request compiles it into
  // sampling.grammar (no think block; properties in the order of the parsed body, which nlohmann::json sorts); the
  // server compiles it again after use_client_key_order, once the prompt tells whether the model may think first.
  OutputConstraint constraint;
};

// The most tools one request may define.
constexpr int64_t kMaxTools = 256;

// Takes `tools`, `messages` and the output constraint's schemas from the same body parsed with its key order kept (the
// body must be the one parse_chat_request validated).
void use_client_key_order(ChatRequest& r, const nlohmann::ordered_json& body);

// Parses and validates a request body. Every field zest reads is type-checked; fields of the OpenAI API
// that zest does not implement are refused when they ask for something ("'logprobs' is not supported"),
// other unknown fields pass. Errors are kInvalidArgument with the offending field quoted first
// ('field' ...) or as messages[i]... Sampling defaults come from the model's generation_config.
// `mm_max_pixels` bounds mm_processor_kwargs and, when below the model's preprocessor max_pixels, is the
// max_pixels of requests that do not set one (0 = the model's max_pixels).
Result<ChatRequest> parse_chat_request(const nlohmann::json& body, const ModelBundle& model,
                                       const RequestLimits& limits = {}, int64_t mm_max_pixels = 0);

// A parsed text-completions request (POST /v1/completions): the prompts as token ids (a string is tokenized with
// special-token strings parsed, as vLLM does; a token-id list is taken as it is), each with n choices. `logprobs` is
// an integer 0..20 there (the top count; null: none). Bounds: at most kMaxChoices prompts x n, token ids in
// [0, vocab), no empty prompt; `echo` and `suffix` are refused.
struct CompletionRequest : GenerationFields {
  std::vector<std::vector<int32_t>> prompts;
};
Result<CompletionRequest> parse_completion_request(const nlohmann::json& body, const ModelBundle& model);

// A text-only decoder prompt of the given token ids (positions 0..n-1 on every axis).
Prompt token_prompt(std::vector<int32_t> ids);

// The cheap first half of a prompt (see the file comment).
struct PromptPlan {
  std::vector<int32_t> ids;  // the tokenized template, one image-pad token per image
  std::vector<std::vector<uint8_t>> image_bytes;
  std::vector<int64_t> visual_tokens;  // merged tokens per image before pruning (from the header size)
  int64_t prompt_tokens = 0;           // prompt length without pruning
  int64_t min_prompt_tokens = 0;       // a lower bound of the length with the request's pruning
};
Result<PromptPlan> plan_prompt(const ModelBundle& model, const ChatRequest& req, const PromptOptions& opts);
// Decodes and encodes the plan's images into the decoder prompt.
Result<Prompt> finish_prompt(const ModelBundle& model, const ChatRequest& req, PromptPlan plan,
                             const PromptOptions& opts);
// plan_prompt + finish_prompt.
Result<Prompt> build_prompt(const ModelBundle& model, const ChatRequest& req, const PromptOptions& opts);

// Hands a whole prompt's visual rows to a one-sequence forward batch: host rows as mm_embeds/deepstack,
// rows the CUDA vision path left in device memory as one mm_device segment. mm_index is copied too.
void attach_visual_rows(const Prompt& p, model::ForwardBatch& b);

// M-RoPE position ids [3, n] for `ids` given each image's merged grid (rows, cols) in order of its
// image-pad run, and the rope delta for decode (Qwen3-VL get_rope_index).
void rope_positions(const std::vector<int32_t>& ids, int32_t image_token_id,
                    const std::vector<std::pair<int64_t, int64_t>>& merged_grids, std::vector<int32_t>& positions,
                    int64_t& rope_delta);

}  // namespace zest::engine
