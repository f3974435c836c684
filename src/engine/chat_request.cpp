#include "engine/chat_request.h"

#include <algorithm>

#include "engine/vision_encode.h"
#include "io/image.h"

namespace zest::engine {
namespace {

using nlohmann::json;

Status expect_number(const json& body, const char* key, double lo, double hi, double& out) {
  if (!body.contains(key) || body[key].is_null()) return Status::ok();
  if (!body[key].is_number()) return invalid_argument(std::string("'") + key + "' must be a number");
  out = body[key].get<double>();
  if (!(out >= lo && out <= hi))
    return invalid_argument(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]");
  return Status::ok();
}

Status expect_int(const json& body, const char* key, int64_t lo, int64_t hi, int64_t& out) {
  if (!body.contains(key) || body[key].is_null()) return Status::ok();
  if (!body[key].is_number_integer()) return invalid_argument(std::string("'") + key + "' must be an integer");
  out = body[key].get<int64_t>();
  if (out < lo || out > hi)
    return invalid_argument(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]");
  return Status::ok();
}

// The URL of an image part, or an error naming the message and part.
Result<std::string> image_source(const json& part, size_t mi, size_t pi) {
  const std::string where = "messages[" + std::to_string(mi) + "].content[" + std::to_string(pi) + "]";
  if (part.contains("image_url")) {
    const json& u = part["image_url"];
    if (u.is_string()) return u.get<std::string>();
    if (u.is_object() && u.contains("url") && u["url"].is_string()) return u["url"].get<std::string>();
    return invalid_argument(where + ": image_url must be {\"url\": string}");
  }
  if (part.contains("image") && part["image"].is_string()) return part["image"].get<std::string>();
  return invalid_argument(where + ": image part without a url");
}

bool is_image_part(const json& part) {
  const std::string type = part.value("type", "");
  return type == "image_url" || type == "image";
}

}  // namespace

Result<ChatRequest> parse_chat_request(const json& body, const ModelBundle& model) {
  if (!body.is_object()) return invalid_argument("the request body must be a JSON object");
  ChatRequest r;
  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty())
    return invalid_argument("'messages' must be a non-empty array");
  r.messages = body["messages"];
  static const char* kRoles[] = {"system", "user", "assistant", "tool"};
  for (size_t i = 0; i < r.messages.size(); ++i) {
    const json& m = r.messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return invalid_argument(where + " must be an object");
    if (!m.contains("role") || !m["role"].is_string()) return invalid_argument(where + ".role must be a string");
    const std::string role = m["role"];
    if (std::none_of(std::begin(kRoles), std::end(kRoles), [&](const char* k) { return role == k; }))
      return invalid_argument(where + ".role '" + role + "' is not one of system, user, assistant, tool");
    const bool has_tool_calls = m.contains("tool_calls") && m["tool_calls"].is_array() && !m["tool_calls"].empty();
    if (!m.contains("content") || m["content"].is_null()) {
      if (role == "assistant" && has_tool_calls) continue;
      return invalid_argument(where + ".content is missing");
    }
    const json& c = m["content"];
    if (c.is_string()) continue;
    if (!c.is_array()) return invalid_argument(where + ".content must be a string or an array of parts");
    for (size_t p = 0; p < c.size(); ++p) {
      const json& part = c[p];
      const std::string pw = where + ".content[" + std::to_string(p) + "]";
      if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
        return invalid_argument(pw + " must be an object with a string 'type'");
      const std::string type = part["type"];
      if (type == "text") {
        if (!part.contains("text") || !part["text"].is_string()) return invalid_argument(pw + ".text must be a string");
      } else if (is_image_part(part)) {
        if (!model.vision) return invalid_argument(pw + ": this model takes no images (it has no vision tower)");
        if (role != "user") return invalid_argument(pw + ": images are only accepted in user messages");
      } else {
        return invalid_argument(pw + ": unsupported part type '" + type + "'");
      }
    }
  }

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
  int64_t max_tokens = 256;
  ZEST_RETURN_IF_ERROR(expect_int(body, "max_tokens", 1, int64_t{1} << 40, max_tokens));
  ZEST_RETURN_IF_ERROR(expect_int(body, "max_completion_tokens", 1, int64_t{1} << 40, max_tokens));
  sp.max_tokens = max_tokens;
  int64_t seed = -1;
  ZEST_RETURN_IF_ERROR(expect_int(body, "seed", INT64_MIN, INT64_MAX, seed));
  if (body.contains("seed") && !body["seed"].is_null()) sp.seed = static_cast<uint64_t>(seed);
  int64_t n = 1;
  ZEST_RETURN_IF_ERROR(expect_int(body, "n", 1, 1 << 20, n));
  if (n != 1) return invalid_argument("only n = 1 is supported");
  if (body.contains("stop") && !body["stop"].is_null()) {
    const json& s = body["stop"];
    if (s.is_string()) {
      sp.stop.push_back(s);
    } else if (s.is_array() && s.size() <= 16) {
      for (const json& e : s) {
        if (!e.is_string()) return invalid_argument("'stop' must be a string or an array of strings");
        sp.stop.push_back(e);
      }
    } else {
      return invalid_argument("'stop' must be a string or an array of at most 16 strings");
    }
  }
  if (body.contains("stop_token_ids") && body["stop_token_ids"].is_array())
    for (const json& e : body["stop_token_ids"]) {
      if (!e.is_number_integer()) return invalid_argument("'stop_token_ids' must be integers");
      sp.stop_token_ids.push_back(e.get<int32_t>());
    }
  if (body.contains("ignore_eos")) {
    if (!body["ignore_eos"].is_boolean()) return invalid_argument("'ignore_eos' must be a boolean");
    sp.ignore_eos = body["ignore_eos"];
  }
  if (body.contains("stream")) {
    if (!body["stream"].is_boolean()) return invalid_argument("'stream' must be a boolean");
    r.stream = body["stream"];
  }
  if (body.contains("stream_options") && body["stream_options"].is_object())
    r.include_usage = body["stream_options"].value("include_usage", false);
  if (body.contains("sere")) {
    if (!body["sere"].is_boolean()) return invalid_argument("'sere' must be a boolean");
    r.sere = body["sere"];
  }
  if (body.contains("vision_prune") && !body["vision_prune"].is_null()) {
    if (!body["vision_prune"].is_object()) return invalid_argument("'vision_prune' must be an object");
    r.vision_prune = body["vision_prune"];
  }
  if (body.contains("mm_processor_kwargs") && !body["mm_processor_kwargs"].is_null()) {
    if (!body["mm_processor_kwargs"].is_object()) return invalid_argument("'mm_processor_kwargs' must be an object");
    r.mm_processor_kwargs = body["mm_processor_kwargs"];
  }
  const json* kw = body.contains("chat_template_kwargs") && body["chat_template_kwargs"].is_object()
                       ? &body["chat_template_kwargs"] : nullptr;
  if (kw) {
    r.enable_thinking = kw->value("enable_thinking", true);
    r.add_vision_id = kw->value("add_vision_id", false);
  }
  return r;
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

Result<Prompt> build_prompt(const ModelBundle& model, const ChatRequest& req, const PromptOptions& opts) {
  // Images in message order.
  std::vector<std::string> sources;
  for (size_t mi = 0; mi < req.messages.size(); ++mi) {
    const json& c = req.messages[mi]["content"];
    if (!c.is_array()) continue;
    for (size_t pi = 0; pi < c.size(); ++pi)
      if (is_image_part(c[pi])) {
        ZEST_ASSIGN_OR_RETURN(std::string src, image_source(c[pi], mi, pi));
        sources.push_back(std::move(src));
      }
  }
  if (static_cast<int64_t>(sources.size()) > opts.max_images)
    return invalid_argument("too many images: " + std::to_string(sources.size()) + " (the limit is " +
                            std::to_string(opts.max_images) + ")");

  text::ChatOptions co;
  co.add_generation_prompt = true;
  co.enable_thinking = req.enable_thinking;
  co.add_vision_id = req.add_vision_id;
  ZEST_ASSIGN_OR_RETURN(std::string rendered, text::render_chat(model.chat_template, req.messages, co));
  std::vector<int32_t> ids = model.tokenizer.encode(rendered, /*parse_special=*/true);

  Prompt p;
  const int32_t image_id = static_cast<int32_t>(model.config.image_token_id);
  std::vector<std::pair<int64_t, int64_t>> grids;
  if (!sources.empty()) {
    std::vector<io::Image> images;
    for (size_t i = 0; i < sources.size(); ++i) {
      std::string src = sources[i];
      const bool is_data = src.rfind("data:", 0) == 0;
      if (!is_data && !opts.allow_local_files)
        return invalid_argument("image " + std::to_string(i) + ": only data: URLs are accepted here");
      if (!is_data && !opts.base_dir.empty()) {
        std::string path = src.rfind("file://", 0) == 0 ? src.substr(7) : src;
        if (!path.empty() && path[0] != '/' && path.find("://") == std::string::npos) src = opts.base_dir + "/" + path;
      }
      auto img = io::load_image(src);
      if (!img.ok()) return img.status().with_context("image " + std::to_string(i));
      images.push_back(std::move(img).value());
    }
    ZEST_ASSIGN_OR_RETURN(EncodedImages enc, encode_images(model, images, req.mm_processor_kwargs, req.vision_prune));
    // Expand each image's single pad token into its kept merged tokens.
    std::vector<int32_t> expanded;
    size_t img = 0;
    for (int32_t t : ids) {
      if (t == image_id && img < enc.kept.size()) {
        for (size_t k = 0; k < enc.kept[img].size(); ++k) {
          p.mm_index.push_back(static_cast<int64_t>(expanded.size()));
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

}  // namespace zest::engine
