#include "engine/chat_request.h"

#include <algorithm>
#include <map>

#include "engine/vision_encode.h"
#include "io/image.h"

namespace zest::engine {
namespace {

using nlohmann::json;

// The value of `key`, or nullptr when it is absent or null (null means "not given" everywhere in the API).
const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::string quote(const std::string& name) { return "'" + name + "'"; }

Status expect_number(const json& body, const char* key, double lo, double hi, double& out) {
  const json* v = field(body, key);
  if (!v) return Status::ok();
  if (!v->is_number()) return invalid_argument(quote(key) + " must be a number");
  out = v->get<double>();
  if (!(out >= lo && out <= hi))
    return invalid_argument(quote(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return Status::ok();
}

// An integer in [lo, hi]; JSON numbers beyond int64 (unsigned or written with a fraction) are out of range.
Status expect_int(const json& body, const char* key, int64_t lo, int64_t hi, int64_t& out) {
  const json* v = field(body, key);
  if (!v) return Status::ok();
  if (!v->is_number_integer()) return invalid_argument(quote(key) + " must be an integer");
  const bool fits = v->is_number_unsigned() ? v->get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX) : true;
  if (fits) out = v->get<int64_t>();
  if (!fits || out < lo || out > hi)
    return invalid_argument(quote(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return Status::ok();
}

Status expect_bool(const json& obj, const char* key, const std::string& name, bool& out) {
  const json* v = field(obj, key);
  if (!v) return Status::ok();
  if (!v->is_boolean()) return invalid_argument(quote(name) + " must be a boolean");
  out = v->get<bool>();
  return Status::ok();
}

Status expect_string(const json& obj, const char* key) {
  const json* v = field(obj, key);
  if (v && !v->is_string()) return invalid_argument(quote(key) + " must be a string");
  return Status::ok();
}

bool is_image_part(const json& part) {
  auto it = part.find("type");
  return it != part.end() && it->is_string() && (*it == "image_url" || *it == "image");
}

// OpenAI (and vLLM) request fields zest does not implement, with the value that asks for nothing: such a
// field is accepted only with that value (or null), and refused by name otherwise, so that a client never
// gets something other than what it asked for without being told.
struct UnsupportedField {
  const char* name;
  bool (*neutral)(const json&);
};

bool is_false(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool is_true(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool is_zero(const json& v) { return v.is_number() && v.get<double>() == 0.0; }
bool is_one(const json& v) { return v.is_number() && v.get<double>() == 1.0; }
bool is_empty(const json& v) { return (v.is_array() || v.is_object()) && v.empty(); }
bool never(const json&) { return false; }
bool no_function_call(const json& v) { return v.is_string() && (v == "none" || v == "auto"); }
bool text_format(const json& v) {
  return v.is_object() && v.size() == 1 && v.contains("type") && v["type"].is_string() && v["type"] == "text";
}
bool text_modality(const json& v) { return v.is_array() && v.size() == 1 && v[0].is_string() && v[0] == "text"; }

constexpr UnsupportedField kUnsupported[] = {
    {"functions", is_empty},
    {"function_call", no_function_call},
    {"response_format", text_format},
    {"min_p", is_zero},
    {"best_of", is_one},
    {"use_beam_search", is_false},
    {"length_penalty", is_one},
    {"echo", is_false},
    {"include_stop_str_in_output", is_false},
    {"continue_final_message", is_false},
    {"add_generation_prompt", is_true},
    {"skip_special_tokens", is_true},
    {"spaces_between_special_tokens", is_true},
    {"chat_template", never},
    {"documents", never},
    {"guided_json", never},
    {"guided_regex", never},
    {"guided_choice", never},
    {"guided_grammar", never},
    {"structured_outputs", never},
    {"bad_words", is_empty},
    {"allowed_token_ids", never},
    {"truncate_prompt_tokens", never},
    {"modalities", text_modality},
    {"audio", never},
    {"prediction", never},
    {"web_search_options", never},
    {"reasoning_effort", never},
    {"store", is_false},
    {"kv_transfer_params", never},  // a disaggregated server (--role prefill|decode) takes it out before parsing
};

// The logits processing fields (see engine/sampler.h): penalties, logit_bias, min_tokens.
Status parse_logits_processing(const json& body, const ModelBundle& model, bool max_tokens_given, SamplingParams& sp) {
  ZEST_RETURN_IF_ERROR(expect_number(body, "presence_penalty", -2.0, 2.0, sp.presence_penalty));
  ZEST_RETURN_IF_ERROR(expect_number(body, "frequency_penalty", -2.0, 2.0, sp.frequency_penalty));
  ZEST_RETURN_IF_ERROR(expect_number(body, "repetition_penalty", 0.0, 10.0, sp.repetition_penalty));
  if (!(sp.repetition_penalty > 0.0)) return invalid_argument("'repetition_penalty' must be in (0, 10]");
  if (const json* lb = field(body, "logit_bias")) {
    const int64_t vocab = model.config.text.vocab_size;
    if (!lb->is_object())
      return invalid_argument("'logit_bias' must be an object mapping token ids (strings) to biases in [-100, 100]");
    std::map<int32_t, float> bias;  // distinct ids; a later spelling of the same id wins
    for (const auto& [key, v] : lb->items()) {
      int64_t id = -1;
      const bool digits = !key.empty() && key.size() <= 10 &&
                          std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (digits) id = std::stoll(key);
      if (!digits || id >= vocab)
        return invalid_argument("'logit_bias' key '" + key.substr(0, 32) + "' is not a token id in [0, " +
                                std::to_string(vocab) + ")");
      if (!v.is_number() || !(v.get<double>() >= -100.0 && v.get<double>() <= 100.0))
        return invalid_argument("'logit_bias' values must be numbers in [-100, 100] (token " + key + ")");
      bias[static_cast<int32_t>(id)] = static_cast<float>(v.get<double>());
    }
    sp.logit_bias.assign(bias.begin(), bias.end());
  }
  const int64_t max_min = max_tokens_given ? sp.max_tokens : INT32_MAX;
  ZEST_RETURN_IF_ERROR(expect_int(body, "min_tokens", 0, INT32_MAX, sp.min_tokens));
  if (sp.min_tokens > max_min)
    return invalid_argument("'min_tokens' = " + std::to_string(sp.min_tokens) + " is more than 'max_tokens' = " +
                            std::to_string(max_min));
  return Status::ok();
}

// The fields a chat request reads as its output constraint (engine/structured_output.h).
bool is_structured_field(const char* name) {
  const std::string n = name;
  return n == "response_format" || n == "guided_json" || n == "guided_choice";
}

Status refuse_unsupported(const json& body, bool structured) {
  for (const UnsupportedField& f : kUnsupported) {
    if (structured && is_structured_field(f.name)) continue;
    const json* v = field(body, f.name);
    if (v && !f.neutral(*v))
      return invalid_argument(quote(f.name) + " is not supported by zest (unsupported field '" + f.name +
                              "'); leave it out");
  }
  return Status::ok();
}

// An image part: {"type": "image_url", "image_url": {"url": string} or string} or {"type": "image", "image":
// string}, with a non-empty source.
Status check_image_part(const json& part, const std::string& at) {
  const json* src = nullptr;
  if (part["type"] == "image_url") {
    const json* u = field(part, "image_url");
    if (u && u->is_object()) {
      if (const json* detail = field(*u, "detail"); detail && !detail->is_string())
        return invalid_argument(at + ".image_url.detail must be a string");
      src = field(*u, "url");
    } else {
      src = u;
    }
    if (!src || !src->is_string() || src->get_ref<const std::string&>().empty())
      return invalid_argument(at + ".image_url must be {\"url\": \"data:image/...;base64,...\"} with a non-empty url");
  } else {
    src = field(part, "image");
    if (!src || !src->is_string() || src->get_ref<const std::string&>().empty())
      return invalid_argument(at + ".image must be a non-empty string (a data: URL)");
  }
  return Status::ok();
}

Status check_tool_calls(const json& calls, const std::string& at) {
  if (!calls.is_array()) return invalid_argument(at + " must be an array");
  for (size_t k = 0; k < calls.size(); ++k) {
    const json& c = calls[k];
    const std::string cw = at + "[" + std::to_string(k) + "]";
    if (!c.is_object()) return invalid_argument(cw + " must be an object");
    for (const char* key : {"id", "type"})
      if (const json* v = field(c, key); v && !v->is_string()) return invalid_argument(cw + "." + key + " must be a string");
    const json* fn = field(c, "function");
    if (!fn || !fn->is_object()) return invalid_argument(cw + ".function must be an object with name and arguments");
    const json* name = field(*fn, "name");
    if (!name || !name->is_string()) return invalid_argument(cw + ".function.name must be a string");
    const json* args = field(*fn, "arguments");
    if (!args || !(args->is_string() || args->is_object()))
      return invalid_argument(cw + ".function.arguments must be a JSON string or object");
  }
  return Status::ok();
}

Status check_messages(const json& messages, const ModelBundle& model, const RequestLimits& limits) {
  if (static_cast<int64_t>(messages.size()) > limits.max_messages)
    return invalid_argument("messages: " + std::to_string(messages.size()) + " messages are more than this server's "
                            "limit of " + std::to_string(limits.max_messages) + " (--max-messages)");
  static const char* kRoles[] = {"system", "user", "assistant", "tool"};
  int64_t parts = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return invalid_argument(where + " must be an object");
    const json* role_v = field(m, "role");
    if (!role_v || !role_v->is_string()) return invalid_argument(where + ".role must be a string");
    const std::string role = *role_v;
    if (std::none_of(std::begin(kRoles), std::end(kRoles), [&](const char* k) { return role == k; }))
      return invalid_argument(where + ".role '" + role + "' is not one of system, user, assistant, tool");
    for (const char* key : {"name", "tool_call_id", "reasoning_content"})
      if (const json* v = field(m, key); v && !v->is_string()) return invalid_argument(where + "." + key + " must be a string");
    bool has_tool_calls = false;
    if (const json* tc = field(m, "tool_calls")) {
      if (role != "assistant") return invalid_argument(where + ".tool_calls: only assistant messages have tool calls");
      ZEST_RETURN_IF_ERROR(check_tool_calls(*tc, where + ".tool_calls"));
      has_tool_calls = !tc->empty();
    }
    const json* c = field(m, "content");
    if (!c) {
      if (role == "assistant" && has_tool_calls) continue;
      return invalid_argument(where + ".content is missing");
    }
    if (c->is_string()) continue;
    if (!c->is_array()) return invalid_argument(where + ".content must be a string or an array of parts");
    parts += static_cast<int64_t>(c->size());
    if (parts > limits.max_parts)
      return invalid_argument("messages: more than this server's limit of " + std::to_string(limits.max_parts) +
                              " content parts (--max-content-parts)");
    for (size_t p = 0; p < c->size(); ++p) {
      const json& part = (*c)[p];
      const std::string pw = where + ".content[" + std::to_string(p) + "]";
      if (!part.is_object() || !field(part, "type") || !part["type"].is_string())
        return invalid_argument(pw + " must be an object with a string 'type'");
      const std::string type = part["type"];
      if (type == "text") {
        const json* t = field(part, "text");
        if (!t || !t->is_string()) return invalid_argument(pw + ".text must be a string");
      } else if (is_image_part(part)) {
        if (!model.vision) return invalid_argument(pw + ": this model takes no images (it has no vision tower)");
        if (role != "user") return invalid_argument(pw + ": images are only accepted in user messages");
        ZEST_RETURN_IF_ERROR(check_image_part(part, pw));
      } else {
        return invalid_argument(pw + ": unsupported part type '" + type + "' (text, image_url)");
      }
    }
  }
  return Status::ok();
}

// OpenAI's rule for function names.
bool valid_function_name(const std::string& n) {
  return !n.empty() && n.size() <= 64 && std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

// `tools` (function definitions), `tool_choice` and `parallel_tool_calls`.
Status parse_tools(const json& body, ChatRequest& r) {
  ZEST_RETURN_IF_ERROR(expect_bool(body, "parallel_tool_calls", "parallel_tool_calls", r.parallel_tool_calls));
  std::vector<std::string> names;
  if (const json* tools = field(body, "tools")) {
    if (!tools->is_array()) return invalid_argument("'tools' must be an array of {\"type\": \"function\", \"function\": {...}}");
    if (static_cast<int64_t>(tools->size()) > kMaxTools)
      return invalid_argument("'tools' holds " + std::to_string(tools->size()) + " tools; at most " +
                              std::to_string(kMaxTools) + " in one request");
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!t.is_object()) return invalid_argument(quote(at) + " must be an object {\"type\": \"function\", \"function\": {...}}");
      const json* type = field(t, "type");
      if (!type || !type->is_string() || *type != "function")
        return invalid_argument(quote(at + ".type") + " must be \"function\" (the only tool type zest knows)");
      const json* fn = field(t, "function");
      if (!fn || !fn->is_object())
        return invalid_argument(quote(at + ".function") + " must be an object with a \"name\"");
      const json* name = field(*fn, "name");
      if (!name || !name->is_string() || !valid_function_name(name->get_ref<const std::string&>()))
        return invalid_argument(quote(at + ".function.name") +
                                " must be a string of 1 to 64 letters, digits, underscores or dashes");
      if (std::find(names.begin(), names.end(), name->get<std::string>()) != names.end())
        return invalid_argument(quote(at + ".function.name") + " '" + name->get<std::string>() +
                                "' names an earlier tool too; tool names must be distinct");
      names.push_back(*name);
      if (const json* d = field(*fn, "description"); d && !d->is_string())
        return invalid_argument(quote(at + ".function.description") + " must be a string");
      if (const json* pr = field(*fn, "parameters"); pr && !pr->is_object())
        return invalid_argument(quote(at + ".function.parameters") + " must be a JSON schema object");
      if (const json* st = field(*fn, "strict"); st && !st->is_boolean())
        return invalid_argument(quote(at + ".function.strict") + " must be a boolean");
    }
    if (!tools->empty()) r.tools = nlohmann::ordered_json(*tools);
  }
  if (const json* tc = field(body, "tool_choice")) {
    std::string named;
    if (tc->is_string()) {
      r.tool_choice = *tc;
      if (r.tool_choice != "none" && r.tool_choice != "auto" && r.tool_choice != "required")
        return invalid_argument("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                                "\"function\": {\"name\": ...}}");
    } else if (tc->is_object()) {
      const json* type = field(*tc, "type");
      const json* fn = field(*tc, "function");
      const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
      if (!type || !type->is_string() || *type != "function" || !name || !name->is_string())
        return invalid_argument("'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                                "\"function\": {\"name\": ...}}");
      named = *name;
      r.tool_choice = "function";
    } else {
      return invalid_argument("'tool_choice' must be a string or an object");
    }
    if (r.tool_choice != "none" && r.tool_choice != "auto" && names.empty())
      return invalid_argument("'tool_choice' asks for a tool call but the request has no 'tools'");
    if (!named.empty() && std::find(names.begin(), names.end(), named) == names.end())
      return invalid_argument("'tool_choice' names the function '" + named.substr(0, 64) + "', which is not in 'tools'");
    // "required" and a named function are forced through structured output (parse_output_constraint).
    r.tool_choice_name = named;
  }
  return Status::ok();
}

// The output-constraint fields of a body (a copy of those only: the body may hold large images).
template <typename J>
grammar::Json structured_fields(const J& body) {
  grammar::Json out = grammar::Json::object();
  for (const char* key : {"response_format", "guided_json", "guided_choice"})
    if (auto it = body.find(key); it != body.end()) out[key] = grammar::Json(*it);
  return out;
}

// The URL of a validated image part.
const std::string& image_source(const json& part) {
  if (part["type"] == "image") return part["image"].get_ref<const std::string&>();
  const json& u = part["image_url"];
  return u.is_string() ? u.get_ref<const std::string&>() : u["url"].get_ref<const std::string&>();
}

}  // namespace

// The fields every generation request shares (chat and text completions), logprobs aside.
Status parse_generation_fields(const json& body, const ModelBundle& model, GenerationFields& r, bool structured) {
  ZEST_RETURN_IF_ERROR(expect_string(body, "model"));
  ZEST_RETURN_IF_ERROR(expect_string(body, "user"));
  ZEST_RETURN_IF_ERROR(expect_string(body, "service_tier"));
  if (const json* md = field(body, "metadata"); md && !md->is_object())
    return invalid_argument("'metadata' must be an object");
  ZEST_RETURN_IF_ERROR(refuse_unsupported(body, structured));
  SamplingParams& sp = r.sampling;
  const auto& g = model.generation;
  sp.temperature = g.temperature.value_or(1.0);
  sp.top_p = g.top_p.value_or(1.0);
  sp.top_k = g.top_k.value_or(0);
  ZEST_RETURN_IF_ERROR(expect_number(body, "temperature", 0.0, 100.0, sp.temperature));
  ZEST_RETURN_IF_ERROR(expect_number(body, "top_p", 0.0, 1.0, sp.top_p));
  if (sp.top_p <= 0.0) return invalid_argument("'top_p' must be in (0, 1]");
  ZEST_RETURN_IF_ERROR(expect_int(body, "top_k", -1, 1 << 30, sp.top_k));
  if (sp.top_k < 0) sp.top_k = 0;
  int64_t max_tokens = sp.max_tokens;
  ZEST_RETURN_IF_ERROR(expect_int(body, "max_tokens", 1, INT64_MAX, max_tokens));
  ZEST_RETURN_IF_ERROR(expect_int(body, "max_completion_tokens", 1, INT64_MAX, max_tokens));
  r.max_tokens_given = field(body, "max_tokens") || field(body, "max_completion_tokens");
  sp.max_tokens = max_tokens;
  if (const json* seed = field(body, "seed")) {
    if (!seed->is_number_integer()) return invalid_argument("'seed' must be an integer");
    sp.seed = seed->is_number_unsigned() ? seed->get<uint64_t>() : static_cast<uint64_t>(seed->get<int64_t>());
  }
  ZEST_RETURN_IF_ERROR(expect_int(body, "n", 1, kMaxChoices, r.n));
  if (const json* s = field(body, "stop")) {
    if (s->is_string()) {
      sp.stop.push_back(*s);
    } else if (s->is_array() && s->size() <= 16 &&
               std::all_of(s->begin(), s->end(), [](const json& e) { return e.is_string(); })) {
      for (const json& e : *s) sp.stop.push_back(e);
    } else {
      return invalid_argument("'stop' must be a string or an array of at most 16 strings");
    }
  }
  if (const json* ids = field(body, "stop_token_ids")) {
    const int64_t vocab = model.config.text.vocab_size;
    if (!ids->is_array() || ids->size() > 256)
      return invalid_argument("'stop_token_ids' must be an array of at most 256 token ids");
    for (const json& e : *ids) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= vocab)
        return invalid_argument("'stop_token_ids' must hold token ids in [0, " + std::to_string(vocab) + ")");
      sp.stop_token_ids.push_back(e.get<int32_t>());
    }
  }
  ZEST_RETURN_IF_ERROR(expect_bool(body, "ignore_eos", "ignore_eos", sp.ignore_eos));
  ZEST_RETURN_IF_ERROR(parse_logits_processing(body, model, r.max_tokens_given, sp));
  ZEST_RETURN_IF_ERROR(expect_bool(body, "return_tokens_as_token_ids", "return_tokens_as_token_ids",
                                   r.return_tokens_as_token_ids));
  ZEST_RETURN_IF_ERROR(expect_bool(body, "stream", "stream", r.stream));
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) return invalid_argument("'stream_options' must be an object");
    ZEST_RETURN_IF_ERROR(expect_bool(*so, "include_usage", "stream_options.include_usage", r.include_usage));
    bool continuous = false;
    ZEST_RETURN_IF_ERROR(
        expect_bool(*so, "continuous_usage_stats", "stream_options.continuous_usage_stats", continuous));
    if (continuous)
      return invalid_argument("'stream_options.continuous_usage_stats' is not supported by zest (unsupported field "
                              "'continuous_usage_stats'); leave it out");
  }
  ZEST_RETURN_IF_ERROR(expect_bool(body, "sere", "sere", r.sere));
  if (field(body, "prompt_logprobs")) {
    int64_t k = 0;
    ZEST_RETURN_IF_ERROR(expect_int(body, "prompt_logprobs", 0, model::kMaxTopLogprobs, k));
    if (r.stream)
      return invalid_argument("'prompt_logprobs' comes with the whole response, not with 'stream': true; leave one out");
    sp.prompt_logprobs = static_cast<int32_t>(k);
  }
  return Status::ok();
}

Result<ChatRequest> parse_chat_request(const json& body, const ModelBundle& model, const RequestLimits& limits,
                                       int64_t mm_max_pixels) {
  if (!body.is_object()) return invalid_argument("the request body must be a JSON object");
  ChatRequest r;
  const json* messages = field(body, "messages");
  if (!messages || !messages->is_array() || messages->empty())
    return invalid_argument("'messages' must be a non-empty array");
  ZEST_RETURN_IF_ERROR(check_messages(*messages, model, limits));
  r.messages = *messages;
  ZEST_RETURN_IF_ERROR(parse_tools(body, r));

  ZEST_RETURN_IF_ERROR(parse_generation_fields(body, model, r, /*structured=*/true));
  ZEST_RETURN_IF_ERROR(parse_output_constraint(structured_fields(body), r.tools, r.tool_choice, r.tool_choice_name,
                                               r.parallel_tool_calls, r.constraint));
  // Compiled at once (no think block): every caller that runs r.sampling follows the constraint. The server compiles
  // it again once the prompt tells whether the model may think first, with the body's key order.
  if (r.constraint.active()) {
    ZEST_ASSIGN_OR_RETURN(r.sampling.grammar, output_grammar(model, r.constraint));
  }
  SamplingParams& sp = r.sampling;
  ZEST_RETURN_IF_ERROR(expect_bool(body, "logprobs", "logprobs", sp.logprobs));
  int64_t top_logprobs = 0;
  ZEST_RETURN_IF_ERROR(expect_int(body, "top_logprobs", 0, model::kMaxTopLogprobs, top_logprobs));
  if (top_logprobs > 0 && !sp.logprobs)
    return invalid_argument("'top_logprobs' needs 'logprobs': true");
  sp.top_logprobs = static_cast<int32_t>(top_logprobs);
  {
    const json* vp = field(body, "vision_prune");
    if (vp && !vp->is_object()) return invalid_argument("'vision_prune' must be an object");
    ZEST_ASSIGN_OR_RETURN(r.vision_prune, request_vision_prune(model, vp ? *vp : json()));
  }
  json mm_kwargs;
  if (const json* kw = field(body, "mm_processor_kwargs")) {
    if (!kw->is_object()) return invalid_argument("'mm_processor_kwargs' must be an object");
    mm_kwargs = *kw;
  }
  // A server ceiling below the model's max_pixels is also what images are resized to when the request
  // does not say: it bounds the vision tower's work per image.
  const int64_t ceiling = mm_max_pixels > 0 ? mm_max_pixels : model.preprocessor.max_pixels;
  if (model.vision && ceiling < model.preprocessor.max_pixels) {
    if (mm_kwargs.is_null()) mm_kwargs = json::object();
    if (!mm_kwargs.contains("max_pixels")) mm_kwargs["max_pixels"] = ceiling;
    if (!mm_kwargs.contains("min_pixels") && model.preprocessor.min_pixels > ceiling) mm_kwargs["min_pixels"] = ceiling;
  }
  ZEST_ASSIGN_OR_RETURN(r.pixels, request_pixel_budget(model, mm_kwargs, ceiling));
  if (const json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) return invalid_argument("'chat_template_kwargs' must be an object");
    for (const auto& [key, v] : kw->items())
      if (key != "enable_thinking" && key != "add_vision_id")
        return invalid_argument("'chat_template_kwargs' has the unsupported key '" + key +
                                "' (enable_thinking, add_vision_id)");
    ZEST_RETURN_IF_ERROR(
        expect_bool(*kw, "enable_thinking", "chat_template_kwargs.enable_thinking", r.enable_thinking));
    ZEST_RETURN_IF_ERROR(expect_bool(*kw, "add_vision_id", "chat_template_kwargs.add_vision_id", r.add_vision_id));
  }
  return r;
}

Result<CompletionRequest> parse_completion_request(const json& body, const ModelBundle& model) {
  if (!body.is_object()) return invalid_argument("the request body must be a JSON object");
  CompletionRequest r;
  const json* prompt = field(body, "prompt");
  if (!prompt) return invalid_argument("'prompt' is missing: a string, an array of strings, or token ids");
  const int64_t vocab = model.config.text.vocab_size;
  auto ids_of = [&](const json& arr, std::vector<int32_t>& out) -> Status {
    for (const json& e : arr) {
      bool ok = e.is_number_integer();
      if (ok && e.is_number_unsigned()) ok = e.get<uint64_t>() < static_cast<uint64_t>(vocab);
      else if (ok) ok = e.get<int64_t>() >= 0 && e.get<int64_t>() < vocab;
      if (!ok) return invalid_argument("'prompt' token ids must be integers in [0, " + std::to_string(vocab) + ")");
      out.push_back(static_cast<int32_t>(e.get<int64_t>()));
    }
    return Status::ok();
  };
  const std::string shape = "'prompt' must be a non-empty string, an array of strings, an array of token ids or an "
                            "array of token-id arrays";
  if (prompt->is_string()) {
    r.prompts.push_back(model.tokenizer.encode(prompt->get_ref<const std::string&>(), /*parse_special=*/true));
  } else if (prompt->is_array() && !prompt->empty()) {
    const json& first = (*prompt)[0];
    if (first.is_number()) {
      r.prompts.emplace_back();
      ZEST_RETURN_IF_ERROR(ids_of(*prompt, r.prompts.back()));
    } else {
      if (static_cast<int64_t>(prompt->size()) > kMaxChoices)
        return invalid_argument("'prompt' holds " + std::to_string(prompt->size()) + " prompts; at most " +
                                std::to_string(kMaxChoices) + " in one request");
      for (const json& p : *prompt) {
        if (p.is_string()) {
          r.prompts.push_back(model.tokenizer.encode(p.get_ref<const std::string&>(), /*parse_special=*/true));
        } else if (p.is_array()) {
          r.prompts.emplace_back();
          ZEST_RETURN_IF_ERROR(ids_of(p, r.prompts.back()));
        } else {
          return invalid_argument(shape);
        }
      }
    }
  } else {
    return invalid_argument(shape);
  }
  for (const auto& p : r.prompts)
    if (p.empty()) return invalid_argument("'prompt' must not be empty (a prompt without tokens)");
  if (const json* sfx = field(body, "suffix"); sfx && !(sfx->is_string() && sfx->get_ref<const std::string&>().empty()))
    return invalid_argument("'suffix' is not supported by zest (unsupported field 'suffix'); leave it out");
  ZEST_RETURN_IF_ERROR(parse_generation_fields(body, model, r));
  if (static_cast<int64_t>(r.prompts.size()) * r.n > kMaxChoices)
    return invalid_argument("'n' = " + std::to_string(r.n) + " for " + std::to_string(r.prompts.size()) +
                            " prompts is more than " + std::to_string(kMaxChoices) + " choices in one request");
  if (const json* lp = field(body, "logprobs")) {
    int64_t k = 0;
    ZEST_RETURN_IF_ERROR(expect_int(body, "logprobs", 0, model::kMaxTopLogprobs, k));
    r.sampling.logprobs = true;
    r.sampling.top_logprobs = static_cast<int32_t>(k);
    (void)lp;
  }
  return r;
}

void use_client_key_order(ChatRequest& r, const nlohmann::ordered_json& body) {
  if (!body.is_object()) return;
  if (auto t = body.find("tools"); !r.tools.is_null() && t != body.end() && t->is_array()) r.tools = *t;
  if (r.constraint.active()) {
    OutputConstraint c;
    if (parse_output_constraint(structured_fields(body), r.tools, r.tool_choice, r.tool_choice_name,
                                r.parallel_tool_calls, c).is_ok())
      r.constraint = std::move(c);
  }
  if (auto m = body.find("messages"); m != body.end() && m->is_array() && m->size() == r.messages.size())
    r.template_messages = *m;
}

Prompt token_prompt(std::vector<int32_t> ids) {
  Prompt p;
  p.ids = std::move(ids);
  rope_positions(p.ids, -1, {}, p.positions, p.rope_delta);
  return p;
}

SamplingParams choice_sampling(const SamplingParams& sp, int64_t index) {
  SamplingParams c = sp;
  if (sp.seed) c.seed = *sp.seed + static_cast<uint64_t>(index);
  return c;
}

void rope_positions(const std::vector<int32_t>& ids, int32_t image_token_id,
                    const std::vector<std::pair<int64_t, int64_t>>& merged_grids, std::vector<int32_t>& positions,
                    int64_t& rope_delta) {
  const int64_t n = static_cast<int64_t>(ids.size());
  positions.assign(3 * n, 0);
  int64_t next = 0, i = 0, max_pos = -1;
  size_t img = 0;
  while (i < n) {
    if (ids[i] == image_token_id && img < merged_grids.size()) {
      // One image span: merged token (r, c) in raster order gets (next, next + r, next + c).
      const auto [rows, cols] = merged_grids[img++];
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c, ++i) {
          positions[i] = static_cast<int32_t>(next);
          positions[n + i] = static_cast<int32_t>(next + r);
          positions[2 * n + i] = static_cast<int32_t>(next + c);
        }
      max_pos = std::max(max_pos, next + std::max(rows, cols) - 1);
      next += std::max(rows, cols);
    } else {
      for (int a = 0; a < 3; ++a) positions[a * n + i] = static_cast<int32_t>(next);
      max_pos = std::max(max_pos, next);
      ++next;
      ++i;
    }
  }
  rope_delta = max_pos + 1 - n;
}

Result<PromptPlan> plan_prompt(const ModelBundle& model, const ChatRequest& req, const PromptOptions& opts) {
  // Images in message order.
  std::vector<std::string> sources;
  for (const json& m : req.messages) {
    const json* c = field(m, "content");
    if (!c || !c->is_array()) continue;
    for (const json& part : *c)
      if (is_image_part(part)) sources.push_back(image_source(part));
  }
  if (static_cast<int64_t>(sources.size()) > opts.max_images)
    return invalid_argument("too many images: " + std::to_string(sources.size()) + " (the limit is " +
                            std::to_string(opts.max_images) + ")");

  text::ChatOptions co;
  co.add_generation_prompt = true;
  co.enable_thinking = req.enable_thinking;
  co.add_vision_id = req.add_vision_id;
  co.tools = req.tools;
  ZEST_ASSIGN_OR_RETURN(std::string rendered,
                        req.template_messages.is_null()
                            ? text::render_chat(model.chat_template, req.messages, co)
                            : text::render_chat_ordered(model.chat_template, req.template_messages, co));
  PromptPlan plan;
  plan.ids = model.tokenizer.encode(rendered, /*parse_special=*/true);
  // The template writes one image-pad token per image; the same token typed in the text would be taken for an
  // image's place (and shift every image after it), so the count must be exact.
  const int32_t image_id = static_cast<int32_t>(model.config.image_token_id);
  const int64_t pads = std::count(plan.ids.begin(), plan.ids.end(), image_id);
  if (pads != static_cast<int64_t>(sources.size()))
    return invalid_argument("messages: the text contains image placeholder tokens (" +
                            model.tokenizer.decode({image_id}) + " or the like): the prompt has " +
                            std::to_string(pads) + " image placeholders for " + std::to_string(sources.size()) +
                            " images; remove special tokens from the text");

  // Image sizes from their headers: the pixel limits and the prompt length before any pixel is decoded.
  io::ImageLimits lim;
  lim.max_pixels = opts.max_image_pixels;
  int64_t request_pixels = 0, visual = 0;
  const int64_t unit = model.config.vision ? model.config.vision->patch_size * model.config.vision->spatial_merge_size
                                           : 1;
  for (size_t i = 0; i < sources.size(); ++i) {
    std::string src = sources[i];
    const bool is_data = src.rfind("data:", 0) == 0;
    if (!is_data && !opts.allow_local_files)
      return invalid_argument("image " + std::to_string(i) + ": only data: URLs are accepted here");
    if (!is_data && !opts.base_dir.empty()) {
      std::string path = src.rfind("file://", 0) == 0 ? src.substr(7) : src;
      if (!path.empty() && path[0] != '/' && path.find("://") == std::string::npos) src = opts.base_dir + "/" + path;
    }
    auto bytes = io::read_image_source(src);
    if (!bytes.ok()) return bytes.status().with_context("image " + std::to_string(i));
    auto info = io::probe_image(bytes->data(), bytes->size(), lim);
    if (!info.ok()) return info.status().with_context("image " + std::to_string(i));
    request_pixels += info->width * info->height;
    if (opts.max_request_pixels > 0 && request_pixels > opts.max_request_pixels)
      return invalid_argument("images: the request's images hold more than this server's limit of " +
                              std::to_string(opts.max_request_pixels) + " pixels (--max-request-pixels)");
    ZEST_ASSIGN_OR_RETURN(auto hw, vision::target_size(info->height, info->width, model.preprocessor, req.pixels));
    plan.visual_tokens.push_back(hw.first / unit * (hw.second / unit));
    visual += plan.visual_tokens.back();
    plan.image_bytes.push_back(std::move(bytes).value());
  }
  const int64_t text_tokens = static_cast<int64_t>(plan.ids.size()) - static_cast<int64_t>(sources.size());
  plan.prompt_tokens = text_tokens + visual;
  plan.min_prompt_tokens = plan.prompt_tokens;
  // VisionZip (the engine's settings, overridden by the request's) keeps about (1 - rate) of the visual
  // tokens, or `budget` of them, plus floors and contextual tokens: at least min(budget, visual), or
  // floor(visual * (1 - rate)) less one per image for the per-image rounding.
  const double rate = req.vision_prune.rate;
  const int64_t budget = req.vision_prune.budget;
  if (visual > 0 && (rate > 0.0 || budget >= 0)) {
    const int64_t kept = budget >= 0 ? std::min(budget, visual)
                                     : static_cast<int64_t>(static_cast<double>(visual) * (1.0 - rate)) -
                                           static_cast<int64_t>(sources.size());
    plan.min_prompt_tokens = text_tokens + std::max<int64_t>(kept, 0);
  }
  return plan;
}

Result<Prompt> finish_prompt(const ModelBundle& model, const ChatRequest& req, PromptPlan plan,
                             const PromptOptions& opts) {
  Prompt p;
  std::vector<int32_t> ids = std::move(plan.ids);
  const int32_t image_id = static_cast<int32_t>(model.config.image_token_id);
  std::vector<std::pair<int64_t, int64_t>> grids;
  if (!plan.image_bytes.empty()) {
    io::ImageLimits lim;
    lim.max_pixels = opts.max_image_pixels;
    std::vector<io::Image> images;
    for (size_t i = 0; i < plan.image_bytes.size(); ++i) {
      if (opts.cancelled && opts.cancelled())
        return resource_exhausted("the request was cancelled before its images were decoded");
      auto img = io::decode_image(plan.image_bytes[i], lim);
      if (!img.ok()) return img.status().with_context("image " + std::to_string(i));
      std::vector<uint8_t>().swap(plan.image_bytes[i]);
      images.push_back(std::move(img).value());
    }
    EncodeOptions eo;
    eo.cancelled = opts.cancelled;
    ZEST_ASSIGN_OR_RETURN(EncodedImages enc,
                          encode_images(model, images, req.pixels, req.vision_prune, eo));
    p.images_encoded = static_cast<int64_t>(images.size()) - enc.cache_hits;
  // Expand each image's single pad token into its kept merged tokens.
    std::vector<int32_t> expanded;
    size_t img = 0;
    for (int32_t t : ids) {
      if (t == image_id && img < enc.kept.size()) {
        for (size_t k = 0; k < enc.kept[img].size(); ++k) {
          p.mm_index.push_back(static_cast<int64_t>(expanded.size()));
          p.mm_keys.push_back(enc.image_keys[img]);
          expanded.push_back(image_id);
        }
        p.visual_tokens_before.push_back(enc.merged_grids[img].first * enc.merged_grids[img].second);
        p.visual_tokens_after.push_back(static_cast<int64_t>(enc.kept[img].size()));
        ++img;
      } else {
        expanded.push_back(t);
      }
    }
    if (img != enc.kept.size())
      return invalid_argument("the prompt has fewer image placeholders than images");
    // Positions are computed on the unpruned layout, then the kept rows are gathered.
    std::vector<int32_t> full_ids;
    std::vector<int64_t> full_index;  // index in full layout of each expanded token
    img = 0;
    for (int32_t t : ids) {
      if (t == image_id && img < enc.kept.size()) {
        const int64_t base = static_cast<int64_t>(full_ids.size());
        const int64_t n_full = enc.merged_grids[img].first * enc.merged_grids[img].second;
        for (int64_t k = 0; k < n_full; ++k) full_ids.push_back(image_id);
        for (int64_t k : enc.kept[img]) full_index.push_back(base + k);
        ++img;
      } else {
        full_index.push_back(static_cast<int64_t>(full_ids.size()));
        full_ids.push_back(t);
      }
    }
    std::vector<int32_t> full_pos;
    int64_t delta_full = 0;
    rope_positions(full_ids, image_id, enc.merged_grids, full_pos, delta_full);
    const int64_t nf = static_cast<int64_t>(full_ids.size()), ne = static_cast<int64_t>(expanded.size());
    p.positions.assign(3 * ne, 0);
    int32_t max_pos = 0;
    for (int64_t i = 0; i < ne; ++i)
      for (int a = 0; a < 3; ++a) {
        p.positions[a * ne + i] = full_pos[a * nf + full_index[i]];
        max_pos = std::max(max_pos, p.positions[a * ne + i]);
      }
    // Decode continues after the largest position used, counted against the pruned cache length.
    p.rope_delta = max_pos + 1 - ne;
    p.ids = std::move(expanded);
    p.vision_preprocess_ms = enc.preprocess_ms;
    p.vision_tower_ms = enc.tower_ms;
    p.vision_select_ms = enc.select_ms;
    p.mm_embeds = enc.embeds;
    p.deepstack = enc.deepstack;
    return p;
  }
  p.ids = std::move(ids);
  rope_positions(p.ids, image_id, grids, p.positions, p.rope_delta);
  return p;
}

Result<Prompt> build_prompt(const ModelBundle& model, const ChatRequest& req, const PromptOptions& opts) {
  ZEST_ASSIGN_OR_RETURN(PromptPlan plan, plan_prompt(model, req, opts));
  return finish_prompt(model, req, std::move(plan), opts);
}

void attach_visual_rows(const Prompt& p, model::ForwardBatch& b) {
  b.mm_index = p.mm_index;
  if (p.mm_embeds.defined() && p.mm_embeds.device() != Device::CPU) {
    model::ForwardBatch::DeviceRows rows;
    rows.embeds = p.mm_embeds.raw();
    for (const Tensor& d : p.deepstack) rows.deepstack.push_back(d.raw());
    rows.rows = p.mm_embeds.dim(0);
    b.mm_device.push_back(std::move(rows));
  } else {
    b.mm_embeds = p.mm_embeds;
    b.deepstack = p.deepstack;
  }
}

}  // namespace zest::engine
