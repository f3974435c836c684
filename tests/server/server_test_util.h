// Helpers of the server tests: fixture models, an in-process server on a free loopback port, an HTTP
// client for JSON and SSE, /metrics parsing, references through the engine directly, and RSS.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/timer.h"
#include "engine/chat_request.h"
#include "engine/engine.h"
#include "server/http.h"
#include "server/openai.h"
#include "server/server.h"

namespace zest::server::testing {

using nlohmann::json;

// Fixture models are loaded once per process.
inline std::shared_ptr<engine::ModelBundle> fixture_model(const std::string& name) {
  static std::map<std::string, std::shared_ptr<engine::ModelBundle>> cache;
  auto& m = cache[name];
  if (!m) {
    auto r = engine::ModelBundle::load((std::filesystem::path(ZEST_FIXTURES_DIR) / "models" / name).string());
    EXPECT_TRUE(r.ok()) << r.status().to_string();
    if (r.ok()) m = *r;
  }
  return m;
}

inline std::unique_ptr<Server> start_server(const std::string& model, ServerOptions opts) {
  opts.host = "127.0.0.1";
  opts.port = 0;
  auto m = fixture_model(model);
  if (!m) return nullptr;
  auto s = Server::start(m, opts);
  EXPECT_TRUE(s.ok()) << s.status().to_string();
  return s.ok() ? std::move(s).value() : nullptr;
}

inline std::unique_ptr<httplib::Client> client(const Server& s) {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", s.port());
  c->set_connection_timeout(30);
  c->set_read_timeout(120);
  c->set_write_timeout(30);
  return c;
}

// A one-message user request with greedy decoding.
inline json chat_body(const std::string& text, int64_t max_tokens) {
  return {{"messages", json::array({{{"role", "user"}, {"content", text}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

struct HttpReply {
  int status = 0;  // 0: no response (transport error, see `error`)
  httplib::Error error = httplib::Error::Success;
  std::string body;
  json j;          // parsed body (discarded when not JSON)
};

inline HttpReply post_json(httplib::Client& c, const std::string& body, const std::string& path = "/v1/chat/completions") {
  HttpReply r;
  auto res = c.Post(path.c_str(), body, "application/json");
  r.error = res.error();
  if (!res) return r;
  r.status = res->status;
  r.body = res->body;
  r.j = json::parse(r.body, nullptr, false);
  return r;
}

inline HttpReply get(httplib::Client& c, const std::string& path) {
  HttpReply r;
  auto res = c.Get(path.c_str());
  if (!res) return r;
  r.status = res->status;
  r.body = res->body;
  r.j = json::parse(r.body, nullptr, false);
  return r;
}

struct StreamReply {
  int status = 0;
  std::string content_type;
  std::vector<std::string> events;  // data fields in order ("[DONE]" included)
  std::string error_body;           // body of a non-200 answer
  bool transport_ok = false;
  httplib::Error error = httplib::Error::Success;
};

// POSTs a streaming request; `keep_going(events so far)` may return false to disconnect.
inline StreamReply post_stream(httplib::Client& c, const std::string& body,
                               std::function<bool(const std::vector<std::string>&)> keep_going = nullptr,
                               const std::string& path = "/v1/chat/completions") {
  StreamReply r;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.set_header("Content-Type", "application/json");
  req.body = body;
  SseReader sse;
  req.response_handler = [&](const httplib::Response& res) {
    r.status = res.status;
    r.content_type = res.get_header_value("Content-Type");
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (r.status != 200) {
      r.error_body.append(data, n);
      return true;
    }
    sse.feed(data, n, r.events);
    return keep_going ? keep_going(r.events) : true;
  };
  auto res = c.send(req);
  r.transport_ok = static_cast<bool>(res);
  r.error = res.error();
  return r;
}

// Samples of a Prometheus exposition: "name{labels}" -> value.
inline std::map<std::string, double> parse_metrics(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

inline std::map<std::string, double> metrics(httplib::Client& c) {
  auto res = c.Get("/metrics");
  EXPECT_TRUE(res) << "GET /metrics failed";
  return res ? parse_metrics(res->body) : std::map<std::string, double>{};
}

// Polls /metrics until `pred` holds or `timeout_s` passes; returns the last sample.
inline std::map<std::string, double> wait_metrics(httplib::Client& c,
                                                  const std::function<bool(std::map<std::string, double>&)>& pred,
                                                  double timeout_s = 60) {
  const double deadline = now_ms() + timeout_s * 1000;
  std::map<std::string, double> m = metrics(c);
  while (!pred(m) && now_ms() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    m = metrics(c);
  }
  return m;
}

inline bool idle(std::map<std::string, double>& m) {
  return m["zest_kv_blocks_used"] == 0 && m["zest_requests_running"] == 0 && m["zest_requests_waiting"] == 0;
}

inline double finished_total(std::map<std::string, double>& m) {
  double n = 0;
  for (const char* r : {"stop", "length", "abort", "error"})
    n += m[std::string("zest_requests_total{finish_reason=\"") + r + "\"}"];
  return n;
}

// The reference: the same body run straight through the engine on a fresh engine (no server).
inline engine::RequestOutput reference_output(const std::string& model, const json& body, int64_t* prompt_tokens = nullptr) {
  auto m = fixture_model(model);
  auto cr = engine::parse_chat_request(body, *m);
  EXPECT_TRUE(cr.ok()) << cr.status().to_string();
  if (!cr.ok()) return {};
  engine::PromptOptions po;
  auto prompt = engine::build_prompt(*m, *cr, po);
  EXPECT_TRUE(prompt.ok()) << prompt.status().to_string();
  if (!prompt.ok()) return {};
  if (prompt_tokens) *prompt_tokens = static_cast<int64_t>(prompt->ids.size());
  engine::Request req;
  req.prompt = std::move(prompt).value();
  req.sampling = cr->sampling;
  auto out = engine::generate_one(m, std::move(req));
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? *out : engine::RequestOutput{};
}

// A bare TCP client, for what an HTTP client library will not do: send part of a request and stall, hang
// up at a chosen moment, connect from another loopback address (127.0.0.2: a different client address).
class RawConnection {
 public:
  RawConnection(int port, const char* from_ip = nullptr) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (from_ip) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      ::inet_pton(AF_INET, from_ip, &local.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0) close();
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    if (fd_ >= 0 && ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) close();
  }
  ~RawConnection() { close(); }
  RawConnection(const RawConnection&) = delete;
  RawConnection& operator=(const RawConnection&) = delete;
  bool ok() const { return fd_ >= 0; }
  bool send(const std::string& data) {
    size_t off = 0;
    while (fd_ >= 0 && off < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return fd_ >= 0;
  }
  // Reads until the server closes the connection or `timeout_s` passes; true when it closed.
  bool read_until_closed(std::string& out, double timeout_s) {
    const double deadline = now_ms() + timeout_s * 1000;
    char buf[4096];
    while (fd_ >= 0 && now_ms() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;
      out.append(buf, static_cast<size_t>(n));
    }
    return false;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// An HTTP/1.1 POST of a JSON body to the chat endpoint, as raw bytes.
inline std::string raw_post(const std::string& body, const std::string& extra_headers = "") {
  return "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
         extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

struct StreamParts {
  std::vector<json> chunks;  // parsed data events before [DONE]
  bool done_last = false;    // "[DONE]" was the last event
  std::string content;       // concatenated content deltas
  std::string reasoning;     // concatenated reasoning_content deltas
};

inline StreamParts split_stream(const StreamReply& r) {
  StreamParts p;
  for (size_t i = 0; i < r.events.size(); ++i) {
    if (r.events[i] == "[DONE]") {
      p.done_last = i + 1 == r.events.size();
      continue;
    }
    json j = json::parse(r.events[i], nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.events[i];
    if (j.is_discarded()) continue;
    if (j.contains("choices") && !j["choices"].empty() && j["choices"][0]["delta"].contains("content"))
      p.content += j["choices"][0]["delta"]["content"].get<std::string>();
    if (j.contains("choices") && !j["choices"].empty() && j["choices"][0]["delta"].contains("reasoning_content"))
      p.reasoning += j["choices"][0]["delta"]["reasoning_content"].get<std::string>();
    p.chunks.push_back(std::move(j));
  }
  return p;
}

inline std::string base64(const std::string& in) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < in.size(); i += 3) {
    uint32_t v = static_cast<uint8_t>(in[i]) << 16;
    if (i + 1 < in.size()) v |= static_cast<uint8_t>(in[i + 1]) << 8;
    if (i + 2 < in.size()) v |= static_cast<uint8_t>(in[i + 2]);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += i + 1 < in.size() ? k[(v >> 6) & 63] : '=';
    out += i + 2 < in.size() ? k[v & 63] : '=';
  }
  return out;
}

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

inline std::string chart_data_url() {
  return "data:image/png;base64," +
         base64(read_file(std::string(ZEST_SOURCE_DIR) + "/assets/images/chart_line_pew_pena_nieto.png"));
}

// Resident set size of this process in bytes (/proc/self/statm).
inline int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

}  // namespace zest::server::testing
