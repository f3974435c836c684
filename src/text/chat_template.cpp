// Hand-written renderers of chat_template.qwen3.jinja and chat_template.qwen3-vl-instruct.jinja.
// Each step mirrors a statement of the template (as jinja2 with trim_blocks/lstrip_blocks runs it).
#include "text/chat_template.h"

#include "text/py_json.h"

namespace zest::text {
namespace {

using ojson = nlohmann::ordered_json;

struct Part {
  enum Kind { kText, kImage, kVideo, kNone } kind = kNone;  // as the VL template classifies it
  bool has_text = false;  // the part has a "text" key (what system/assistant parts print)
  std::string text;
};

struct ToolCall {
  std::string name;
  std::string arguments;  // raw string, or the object as tojson renders it
};

struct Message {
  std::string role;
  bool is_list = false;  // content was an array of parts
  std::string text;      // string content
  std::vector<Part> parts;
  bool has_reasoning = false;
  std::string reasoning;
  std::vector<ToolCall> tool_calls;

  // Jinja truthiness of `message.content`.
  bool content_truthy() const { return is_list ? !parts.empty() : !text.empty(); }
};

constexpr const char* kToolsHeader =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr const char* kToolsFooter =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";

std::string where(size_t i) { return "messages[" + std::to_string(i) + "]"; }

bool is_str_eq(const ojson& obj, const char* key, const char* value) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() && it->get_ref<const std::string&>() == value;
}

Status parse_part(const ojson& p, const std::string& at, Part& out) {
  if (!p.is_object()) return invalid_argument(at + " must be an object like {\"type\": \"text\", \"text\": ...}");
  if (p.contains("text")) {
    if (!p["text"].is_string()) return invalid_argument(at + ".text must be a string");
    out.has_text = true;
    out.text = p["text"].get<std::string>();
  }
  if (is_str_eq(p, "type", "image") || p.contains("image") || p.contains("image_url")) {
    out.kind = Part::kImage;
  } else if (is_str_eq(p, "type", "video") || p.contains("video")) {
    out.kind = Part::kVideo;
  } else if (out.has_text) {
    out.kind = Part::kText;
  }
  return Status::ok();
}

Status parse_tool_call(const ojson& tc, const std::string& at, ToolCall& out) {
  if (!tc.is_object()) return invalid_argument(at + " must be an object");
  const ojson* fn = &tc;
  // `{% if tool_call.function %}`: a non-empty function object replaces the call.
  if (auto it = tc.find("function"); it != tc.end() && !it->is_null() && !it->empty()) {
    if (!it->is_object()) return invalid_argument(at + ".function must be an object with name and arguments");
    fn = &*it;
  }
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string()) return invalid_argument(at + ": the tool call needs a string \"name\"");
  out.name = name->get<std::string>();
  auto args = fn->find("arguments");
  if (args == fn->end()) return invalid_argument(at + ": the tool call needs \"arguments\" (a JSON string or object)");
  out.arguments = args->is_string() ? args->get<std::string>() : py_json_dumps(*args);
  return Status::ok();
}

Status parse_message(TemplateKind kind, const ojson& m, size_t i, Message& out) {
  const std::string at = where(i);
  if (!m.is_object()) return invalid_argument(at + " must be an object with \"role\" and \"content\"");
  auto role = m.find("role");
  if (role == m.end() || !role->is_string()) return invalid_argument(at + " needs a string \"role\"");
  out.role = role->get<std::string>();
  if (out.role != "system" && out.role != "user" && out.role != "assistant" && out.role != "tool") {
    return invalid_argument(at + ": unknown role \"" + out.role + "\" (expected system, user, assistant or tool)");
  }
  if (auto tcs = m.find("tool_calls"); tcs != m.end() && !tcs->is_null()) {
    if (out.role != "assistant") return invalid_argument(at + ": only assistant messages can have tool_calls");
    if (!tcs->is_array()) return invalid_argument(at + ".tool_calls must be an array");
    for (size_t k = 0; k < tcs->size(); ++k) {
      ToolCall tc;
      ZEST_RETURN_IF_ERROR(parse_tool_call((*tcs)[k], at + ".tool_calls[" + std::to_string(k) + "]", tc));
      out.tool_calls.push_back(std::move(tc));
    }
  }
  if (auto rc = m.find("reasoning_content"); rc != m.end() && !rc->is_null()) {
    if (!rc->is_string()) return invalid_argument(at + ".reasoning_content must be a string");
    out.has_reasoning = true;
    out.reasoning = rc->get<std::string>();
  }
  auto content = m.find("content");
  if (content == m.end() || content->is_null()) {
    if (out.role == "assistant" && !out.tool_calls.empty()) return Status::ok();  // renders as ""
    return invalid_argument(at + " (" + out.role + ") has no \"content\"");
  }
  if (content->is_string()) {
    out.text = content->get<std::string>();
    return Status::ok();
  }
  if (!content->is_array()) return invalid_argument(at + ".content must be a string or an array of parts");
  for (size_t k = 0; k < content->size(); ++k) {
    Part p;
    ZEST_RETURN_IF_ERROR(parse_part((*content)[k], at + ".content[" + std::to_string(k) + "]", p));
    out.parts.push_back(std::move(p));
  }
  out.is_list = true;
  if (kind == TemplateKind::kQwen3) {
    // The text-only template takes strings: join the text parts (as vLLM does).
    std::string joined;
    for (size_t k = 0; k < out.parts.size(); ++k) {
      const Part& p = out.parts[k];
      const std::string pat = at + ".content[" + std::to_string(k) + "]";
      if (p.kind == Part::kImage || p.kind == Part::kVideo) {
        return invalid_argument(pat + ": the Qwen3 chat template has no image or video input; use a Qwen3-VL model");
      }
      if (p.kind != Part::kText) return invalid_argument(pat + " is not a text part");
      if (k > 0) joined += '\n';
      joined += p.text;
    }
    out.text = std::move(joined);
    out.parts.clear();
    out.is_list = false;
  }
  return Status::ok();
}

std::string lstrip_nl(std::string_view s) {
  const size_t b = s.find_first_not_of('\n');
  return b == std::string_view::npos ? std::string() : std::string(s.substr(b));
}

std::string rstrip_nl(std::string_view s) {
  const size_t e = s.find_last_not_of('\n');
  return e == std::string_view::npos ? std::string() : std::string(s.substr(0, e + 1));
}

std::string strip_nl(std::string_view s) { return lstrip_nl(rstrip_nl(s)); }

bool starts_with(const std::string& s, std::string_view p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, std::string_view p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

void render_tool_calls(const std::vector<ToolCall>& calls, bool content_truthy, std::string& out) {
  for (size_t k = 0; k < calls.size(); ++k) {
    if ((k == 0 && content_truthy) || k > 0) out += '\n';
    out += "<tool_call>\n{\"name\": \"";
    out += calls[k].name;
    out += "\", \"arguments\": ";
    out += calls[k].arguments;
    out += "}\n</tool_call>";
  }
}

void render_tools_preamble(const ojson& tools, std::string& out) {
  out += kToolsHeader;
  for (const auto& t : tools) {
    out += '\n';
    out += py_json_dumps(t);
  }
  out += kToolsFooter;
}

std::string render_qwen3(const std::vector<Message>& msgs, const ojson& tools, const ChatOptions& opts) {
  std::string out;
  const size_t n = msgs.size();
  const bool has_tools = !tools.empty();
  if (has_tools) {
    out += "<|im_start|>system\n";
    if (msgs[0].role == "system") out += msgs[0].text + "\n\n";
    render_tools_preamble(tools, out);
  } else if (msgs[0].role == "system") {
    out += "<|im_start|>system\n" + msgs[0].text + "<|im_end|>\n";
  }
  // The last user turn that is not a wrapped tool response.
  size_t last_query = n - 1;
  for (size_t r = n; r-- > 0;) {
    const Message& m = msgs[r];
    if (m.role == "user" && !(starts_with(m.text, "<tool_response>") && ends_with(m.text, "</tool_response>"))) {
      last_query = r;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const Message& m = msgs[i];
    const bool last = i + 1 == n;
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.text + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      std::string content = m.text;
      std::string reasoning;
      if (m.has_reasoning) {
        reasoning = m.reasoning;
      } else if (const size_t close = m.text.find("</think>"); close != std::string::npos) {
        content = lstrip_nl(std::string_view(m.text).substr(m.text.rfind("</think>") + 8));
        const std::string before = rstrip_nl(std::string_view(m.text).substr(0, close));
        const size_t open = before.rfind("<think>");
        reasoning = lstrip_nl(open == std::string::npos ? before : before.substr(open + 7));
      }
      if (i > last_query && (last || !reasoning.empty())) {
        out += "<|im_start|>assistant\n<think>\n" + strip_nl(reasoning) + "\n</think>\n\n" + lstrip_nl(content);
      } else {
        out += "<|im_start|>assistant\n" + content;
      }
      render_tool_calls(m.tool_calls, !content.empty(), out);
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.text + "\n</tool_response>";
      if (last || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (opts.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!opts.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

// Prints content the way the VL template prints system/assistant content: the string, or the
// "text" of each part.
void vl_plain(const Message& m, std::string& out) {
  if (!m.is_list) {
    out += m.text;
    return;
  }
  for (const Part& p : m.parts) {
    if (p.has_text) out += p.text;
  }
}

struct VisionCounters {
  int images = 0;
  int videos = 0;
};

// Prints user/tool content: the string, or text plus vision placeholders per part.
void vl_vision(const Message& m, bool add_vision_id, VisionCounters& count, std::string& out) {
  if (!m.is_list) {
    out += m.text;
    return;
  }
  for (const Part& p : m.parts) {
    if (p.kind == Part::kImage) {
      ++count.images;
      if (add_vision_id) out += "Picture " + std::to_string(count.images) + ": ";
      out += "<|vision_start|><|image_pad|><|vision_end|>";
    } else if (p.kind == Part::kVideo) {
      ++count.videos;
      if (add_vision_id) out += "Video " + std::to_string(count.videos) + ": ";
      out += "<|vision_start|><|video_pad|><|vision_end|>";
    } else if (p.kind == Part::kText) {
      out += p.text;
    }
  }
}

std::string render_qwen3vl(const std::vector<Message>& msgs, const ojson& tools, const ChatOptions& opts) {
  std::string out;
  const size_t n = msgs.size();
  if (!tools.empty()) {
    out += "<|im_start|>system\n";
    if (msgs[0].role == "system") {
      vl_plain(msgs[0], out);
      out += "\n\n";
    }
    render_tools_preamble(tools, out);
  } else if (msgs[0].role == "system") {
    out += "<|im_start|>system\n";
    vl_plain(msgs[0], out);
    out += "<|im_end|>\n";
  }
  VisionCounters count;
  for (size_t i = 0; i < n; ++i) {
    const Message& m = msgs[i];
    if (m.role == "user") {
      out += "<|im_start|>user\n";
      vl_vision(m, opts.add_vision_id, count, out);
      out += "<|im_end|>\n";
    } else if (m.role == "assistant") {
      out += "<|im_start|>assistant\n";
      vl_plain(m, out);
      render_tool_calls(m.tool_calls, m.content_truthy(), out);
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || msgs[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n";
      vl_vision(m, opts.add_vision_id, count, out);
      out += "\n</tool_response>";
      if (i + 1 == n || msgs[i + 1].role != "tool") out += "<|im_end|>\n";
    }
    // System messages after the first are not rendered by this template.
  }
  if (opts.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace

Result<std::string> render_chat_ordered(TemplateKind kind, const ojson& messages, const ChatOptions& opts) {
  if (!messages.is_array() || messages.empty()) {
    return invalid_argument("messages must be a non-empty array of {\"role\", \"content\"} objects");
  }
  if (!opts.tools.is_null() && !opts.tools.is_array()) return invalid_argument("tools must be an array");
  std::vector<Message> msgs(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) ZEST_RETURN_IF_ERROR(parse_message(kind, messages[i], i, msgs[i]));
  switch (kind) {
    case TemplateKind::kQwen3:
      return render_qwen3(msgs, opts.tools, opts);
    case TemplateKind::kQwen3VL:
      return render_qwen3vl(msgs, opts.tools, opts);
  }
  return invalid_argument("unknown chat template kind");
}

Result<std::string> render_chat(TemplateKind kind, const nlohmann::json& messages, const ChatOptions& opts) {
  return render_chat_ordered(kind, ojson(messages), opts);
}

}  // namespace zest::text
