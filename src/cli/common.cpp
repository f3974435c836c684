#include "cli/common.h"

#include <fstream>
#include <iostream>
#include <sstream>

#include "core/thread_pool.h"
#include "kernels/backend.h"

namespace zest::cli {

void add_model_args(CLI::App* app, ModelArgs& a) {
  app->add_option("--model", a.model, "Hugging Face model directory (config.json, *.safetensors, tokenizer)")
      ->required();
  app->add_option("--threads", a.threads, "CPU threads (0 = all cores)");
  app->add_option("--device", a.device, "cpu | cuda | auto")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
}

Result<std::shared_ptr<engine::ModelBundle>> load_model(const ModelArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  if (a.device == "cuda")
    return unsupported("--device cuda: the CUDA decoder path is not wired into the engine yet; use --device cpu");
  return engine::ModelBundle::load(a.model);
}

void add_request_args(CLI::App* app, RequestArgs& a) {
  app->add_option("--request", a.request_file, "OpenAI chat-completions request body (JSON file)");
  app->add_option("--prompt", a.prompt, "user message text");
  app->add_option("--system", a.system, "system message text (with --prompt)");
  app->add_option("--image", a.images, "image path or URL for --prompt (repeatable)");
}

Result<nlohmann::json> request_body(const RequestArgs& a) {
  using nlohmann::json;
  if (!a.request_file.empty()) {
    if (!a.prompt.empty() || !a.images.empty()) return invalid_argument("use either --request or --prompt/--image");
    std::ifstream f(a.request_file);
    if (!f) return not_found("cannot open request file '" + a.request_file + "'");
    std::stringstream ss;
    ss << f.rdbuf();
    json body = json::parse(ss.str(), nullptr, false);
    if (body.is_discarded()) return invalid_argument("request file '" + a.request_file + "' is not valid JSON");
    return body;
  }
  if (a.prompt.empty() && a.images.empty()) return invalid_argument("give --request FILE or --prompt TEXT");
  json content = json::array();
  for (const std::string& img : a.images) content.push_back({{"type", "image_url"}, {"image_url", {{"url", img}}}});
  if (!a.prompt.empty()) content.push_back({{"type", "text"}, {"text", a.prompt}});
  json messages = json::array();
  if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  messages.push_back({{"role", "user"}, {"content", content}});
  return json{{"messages", messages}};
}

int fail(const Status& st) {
  std::cerr << "error: " << st.message() << "\n";
  return 1;
}

}  // namespace zest::cli
