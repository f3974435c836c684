#include "server/front.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <algorithm>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/timer.h"
#include "server/http.h"
#include "server/http_server.h"
#include "server/openai.h"

namespace zest::server {

using nlohmann::json;

namespace {

constexpr const char* kJson = "application/json";

// An upstream answer streamed to the client: the upstream request runs on its own thread and hands over its status
// and the pieces of its body; the client's side waits for them (and can cancel, closing the upstream connection).
struct Relay {
  std::mutex mu;
  std::condition_variable cv;
  bool has_status = false, done = false, cancelled = false, not_connected = false;
  int status = 0;
  std::string content_type, error;
  std::deque<std::string> pieces;
};

bool valid_url(const std::string& u) {
  return (u.rfind("http://", 0) == 0 && u.size() > 7) || (u.rfind("https://", 0) == 0 && u.size() > 8);
}

}  // namespace

struct Front::Impl {
  FrontOptions opts;
  std::unique_ptr<HttpServer> http;
  std::thread listener;
  int port = 0;
  std::atomic<uint64_t> next_prefill{0}, next_decode{0};
  std::atomic<int64_t> requests{0}, prefill_errors{0}, decode_errors{0}, unreachable{0};
  std::atomic<int64_t> prefill_us{0};  // time in the prefill step (prefill and K/V offer), summed

  const std::string& pick(const std::vector<std::string>& v, std::atomic<uint64_t>& next) {
    return v[next.fetch_add(1) % v.size()];
  }
  // The instances of `v` in the order to try them: from the round-robin pick on, each once (an instance that cannot
  // be connected to is skipped for the next).
  std::vector<std::string> order(const std::vector<std::string>& v, std::atomic<uint64_t>& next) {
    const size_t first = next.fetch_add(1) % v.size();
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i) out.push_back(v[(first + i) % v.size()]);
    return out;
  }
  // Nothing reached the instance (refused or timed-out connects): safe to send the request to another.
  static bool not_connected(httplib::Error e) {
    return e == httplib::Error::Connection || e == httplib::Error::ConnectionTimeout;
  }
  // POSTs to the first instance of `urls` that can be connected to; *used names it. An error Result when none.
  httplib::Result post_first(const std::vector<std::string>& urls, const std::string& path, const std::string& body,
                             std::string* used, std::string* failures) {
    httplib::Error last = httplib::Error::Connection;
    for (const std::string& u : urls) {
      httplib::Result r = client(u)->Post(path, body, kJson);
      *used = u;
      if (r || !not_connected(r.error())) return r;
      ++unreachable;
      last = r.error();
      *failures += (failures->empty() ? "" : "; ") + u + ": " + httplib::to_string(last);
    }
    return httplib::Result(nullptr, last);
  }
  std::unique_ptr<httplib::Client> client(const std::string& url) const {
    auto c = std::make_unique<httplib::Client>(url);
    c->set_connection_timeout(10);
    c->set_read_timeout(opts.upstream_timeout_s);
    c->set_write_timeout(opts.upstream_timeout_s);
    return c;
  }
  void reply(httplib::Response& res, int status, const std::string& message, const std::string& param = {}) {
    res.status = status;
    res.set_content(dump_json(error_body(status, message, param)), kJson);
  }
  // Reads a bounded JSON object body; false when it already answered with an error.
  bool read_body(const httplib::Request& req, httplib::Response& res, json& j) {
    if (static_cast<int64_t>(req.body.size()) > opts.max_body_bytes) {
      reply(res, 413, "the request body is larger than the front's limit of " + std::to_string(opts.max_body_bytes) +
                          " bytes");
      return false;
    }
    if (json_deeper_than(req.body, 64)) {
      reply(res, 400, "the request body nests arrays and objects deeper than 64 levels");
      return false;
    }
    try {
      j = json::parse(req.body);
    } catch (const json::exception& e) {
      reply(res, 400, std::string("the request body is not valid JSON: ") + e.what());
      return false;
    }
    if (!j.is_object()) {
      reply(res, 400, "the request body must be a JSON object");
      return false;
    }
    return true;
  }
  void chat(const httplib::Request& req, httplib::Response& res);
  void forward(const httplib::Request& req, httplib::Response& res);
  // Streams the decode step from the first of `urls` that can be connected to.
  void stream(const std::vector<std::string>& urls, const std::string& body, httplib::Response& res);
  // One instance; false (nothing answered) when it could not be connected to and another may be tried.
  bool stream_one(const std::string& url, const std::string& body, httplib::Response& res, bool last,
                  std::string& failures);
  std::string metrics() const;
};

void Front::Impl::chat(const httplib::Request& req, httplib::Response& res) {
  ++requests;
  json body;
  if (!read_body(req, res, body)) return;
  if (body.contains("kv_transfer_params"))
    return reply(res, 400, "'kv_transfer_params' is set by the front; leave it out", "kv_transfer_params");
  // Step 1: the prefill instance runs the prompt and the first token and offers the prompt's K/V.
  json first = body;
  first["kv_transfer_params"] = {{"do_remote_decode", true}};
  first["stream"] = false;
  first.erase("stream_options");
  std::string p_url, p_failures;
  const double t0 = now_ms();
  auto p = post_first(order(opts.prefill, next_prefill), req.path, dump_json(first), &p_url, &p_failures);
  prefill_us += static_cast<int64_t>((now_ms() - t0) * 1000);
  if (!p) {
    if (!not_connected(p.error())) ++unreachable;
    return reply(res, 502, "no prefill instance could be reached (" +
                               (p_failures.empty() ? p_url + ": " + httplib::to_string(p.error()) : p_failures) + ")");
  }
  if (p->status != 200) {
    ++prefill_errors;
    res.status = p->status;
    res.set_content(p->body, kJson);
    return;
  }
  json answer;
  try {
    answer = json::parse(p->body);
  } catch (const json::exception&) {
  }
  if (!answer.is_object() || !answer.contains("kv_transfer_params")) {
    ++prefill_errors;
    return reply(res, 502, "the prefill instance " + p_url + " answered without kv_transfer_params (is it started "
                           "with --role prefill?)");
  }
  // Step 2: the decode instance reads the K/V and generates; its answer goes to the client as it is.
  body["kv_transfer_params"] = std::move(answer["kv_transfer_params"]);
  const std::vector<std::string> decoders = order(opts.decode, next_decode);
  const bool streamed = body.value("stream", json(false)) == true;
  if (streamed) return stream(decoders, dump_json(body), res);
  std::string d_url, d_failures;
  auto d = post_first(decoders, req.path, dump_json(body), &d_url, &d_failures);
  if (!d) {
    if (!not_connected(d.error())) ++unreachable;
    return reply(res, 502, "no decode instance could be reached (" +
                               (d_failures.empty() ? d_url + ": " + httplib::to_string(d.error()) : d_failures) + ")");
  }
  if (d->status != 200) ++decode_errors;
  res.status = d->status;
  res.set_content(d->body, d->get_header_value("Content-Type").empty() ? kJson : d->get_header_value("Content-Type"));
}

void Front::Impl::stream(const std::vector<std::string>& urls, const std::string& body, httplib::Response& res) {
  std::string failures;
  for (size_t i = 0; i < urls.size(); ++i) {
    if (stream_one(urls[i], body, res, i + 1 == urls.size(), failures)) return;
  }
  reply(res, 502, "no decode instance could be reached (" + failures + ")");
}

bool Front::Impl::stream_one(const std::string& url, const std::string& body, httplib::Response& res, bool last,
                             std::string& failures) {
  auto relay = std::make_shared<Relay>();
  auto cli = std::shared_ptr<httplib::Client>(client(url));
  std::thread([relay, cli, body, path = std::string("/v1/chat/completions")] {
    httplib::Request up;
    up.method = "POST";
    up.path = path;
    up.headers = {{"Content-Type", kJson}};
    up.body = body;
    up.response_handler = [relay](const httplib::Response& r) {
      std::lock_guard<std::mutex> lock(relay->mu);
      relay->status = r.status;
      relay->content_type = r.get_header_value("Content-Type");
      relay->has_status = true;
      relay->cv.notify_all();
      return true;
    };
    up.content_receiver = [relay](const char* data, size_t n, uint64_t, uint64_t) {
      std::lock_guard<std::mutex> lock(relay->mu);
      if (relay->cancelled) return false;  // closes the upstream connection: the decode instance aborts
      relay->pieces.emplace_back(data, n);
      relay->cv.notify_all();
      return true;
    };
    auto r = cli->send(up);
    std::lock_guard<std::mutex> lock(relay->mu);
    if (!r && !relay->cancelled) {
      relay->error = httplib::to_string(r.error());
      relay->not_connected = not_connected(r.error());
    }
    relay->done = true;
    relay->cv.notify_all();
  }).detach();

  std::unique_lock<std::mutex> lock(relay->mu);
  relay->cv.wait(lock, [&] { return relay->has_status || relay->done; });
  if (!relay->has_status) {
    ++unreachable;
    failures += (failures.empty() ? "" : "; ") + url + ": " + relay->error;
    if (relay->not_connected && !last) return false;  // nothing reached it: the next instance gets the request
    lock.unlock();
    reply(res, 502, "the decode instance " + url + " failed before answering (" + relay->error + ")");
    return true;
  }
  if (relay->status != 200) {
    // An error answer is JSON: pass it whole with its status.
    ++decode_errors;
    relay->cv.wait(lock, [&] { return relay->done; });
    std::string all;
    for (const std::string& s : relay->pieces) all += s;
    res.status = relay->status;
    res.set_content(all, relay->content_type.empty() ? kJson : relay->content_type);
    return true;
  }
  const std::string type = relay->content_type.empty() ? "text/event-stream" : relay->content_type;
  lock.unlock();
  const auto timeout = std::chrono::seconds(opts.upstream_timeout_s);
  res.set_chunked_content_provider(type, [relay, timeout](size_t, httplib::DataSink& sink) {
    std::unique_lock<std::mutex> lk(relay->mu);
    if (!relay->cv.wait_for(lk, timeout, [&] { return !relay->pieces.empty() || relay->done; })) {
      relay->cancelled = true;
      return false;
    }
    while (!relay->pieces.empty()) {
      std::string piece = std::move(relay->pieces.front());
      relay->pieces.pop_front();
      lk.unlock();
      const bool ok = sink.write(piece.data(), piece.size());
      lk.lock();
      if (!ok) {
        relay->cancelled = true;  // the client is gone
        return false;
      }
    }
    if (relay->done) sink.done();
    return true;
  }, [relay](bool) {
    std::lock_guard<std::mutex> lk(relay->mu);
    relay->cancelled = true;
  });
  return true;
}

void Front::Impl::forward(const httplib::Request& req, httplib::Response& res) {
  const std::string& url = pick(opts.decode, next_decode);
  auto cli = client(url);
  httplib::Result r = req.method == "GET" ? cli->Get(req.path)
                                          : cli->Post(req.path, req.body, req.get_header_value("Content-Type").empty()
                                                                              ? kJson
                                                                              : req.get_header_value("Content-Type"));
  if (!r) return reply(res, 502, "the decode instance " + url + " cannot be reached (" + httplib::to_string(r.error()) + ")");
  res.status = r->status;
  res.set_content(r->body, r->get_header_value("Content-Type").empty() ? kJson : r->get_header_value("Content-Type"));
}

std::string Front::Impl::metrics() const {
  std::string out;
  auto one = [&](const char* name, const char* help, double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.12g", v);
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " counter\n" + name + " " + buf + "\n";
  };
  one("zest_front_requests_total", "Chat completions received by the front", static_cast<double>(requests.load()));
  one("zest_front_prefill_errors_total", "Chat completions a prefill instance answered with an error",
      static_cast<double>(prefill_errors.load()));
  one("zest_front_decode_errors_total", "Chat completions a decode instance answered with an error",
      static_cast<double>(decode_errors.load()));
  one("zest_front_unreachable_total", "Calls to an instance that could not be reached",
      static_cast<double>(unreachable.load()));
  one("zest_front_prefill_seconds_total", "Seconds spent in the prefill step (prefill, first token, K/V offer)",
      static_cast<double>(prefill_us.load()) * 1e-6);
  return out;
}

Front::Front(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Front::~Front() { stop(); }
int Front::port() const { return impl_->port; }

void Front::stop() {
  if (!impl_ || !impl_->http) return;
  impl_->http->stop();
  if (impl_->listener.joinable()) impl_->listener.join();
}

Result<std::unique_ptr<Front>> Front::start(FrontOptions opts) {
  if (opts.prefill.empty() || opts.decode.empty())
    return invalid_argument("zest front needs at least one --prefill and one --decode instance URL");
  for (const auto* list : {&opts.prefill, &opts.decode})
    for (const std::string& u : *list)
      if (!valid_url(u)) return invalid_argument("instance URL '" + u + "' must look like http://host:port");
  if (opts.port < 0 || opts.port > 65535) return invalid_argument("--port must be in [0, 65535]");
  if (opts.http_threads <= 0) return invalid_argument("--http-threads must be positive");
  if (opts.upstream_timeout_s <= 0) return invalid_argument("--upstream-timeout-s must be positive");
  std::signal(SIGPIPE, SIG_IGN);
  auto impl = std::make_unique<Impl>();
  impl->opts = opts;
  ConnectionLimits limits;
  limits.max_per_client = std::max(1, opts.http_threads - 16);
  impl->http = std::make_unique<HttpServer>(limits);
  impl->http->configure(opts.http_threads, static_cast<size_t>(opts.max_body_bytes));
  Impl* p = impl.get();
  impl->http->Post("/v1/chat/completions", [p](const httplib::Request& q, httplib::Response& r) { p->chat(q, r); });
  for (const char* path : {"/v1/completions", "/tokenize", "/detokenize"})
    impl->http->Post(path, [p](const httplib::Request& q, httplib::Response& r) { p->forward(q, r); });
  impl->http->Get("/v1/models", [p](const httplib::Request& q, httplib::Response& r) { p->forward(q, r); });
  impl->http->Get("/metrics", [p](const httplib::Request&, httplib::Response& r) {
    r.set_content(p->metrics(), "text/plain; version=0.0.4");
  });
  impl->http->Get("/health", [p](const httplib::Request&, httplib::Response& r) {
    std::string down;
    for (const auto* list : {&p->opts.prefill, &p->opts.decode})
      for (const std::string& u : *list) {
        auto c = p->client(u);
        c->set_read_timeout(5);
        auto h = c->Get("/health");
        if (!h || h->status != 200) down += (down.empty() ? "" : ", ") + u;
      }
    if (down.empty()) return r.set_content("{}", kJson);
    p->reply(r, 503, "instances not healthy: " + down);
  });
  ZEST_ASSIGN_OR_RETURN(impl->port, impl->http->bind(opts.host, opts.port));
  ZEST_RETURN_IF_ERROR(impl->http->listen_on(impl->listener));
  return std::unique_ptr<Front>(new Front(std::move(impl)));
}

}  // namespace zest::server
